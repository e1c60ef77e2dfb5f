/*
 * dcomm_bench.c: dcomm-bench, the collective bandwidth benchmark of dcomm,
 * in the style of nccl-tests. For each message size from -b to -e (times
 * -f each step) it runs one collective -w times to warm up and -n times
 * timed, and rank 0 prints one row:
 *
 *   size count type time_us algbw_GBps busbw_GBps errors
 *
 * size is the bytes of the per-rank buffer as nccl-tests define it (the
 * whole buffer for all_reduce and broadcast, the gathered output for
 * all_gather, the input for reduce_scatter and all_to_all), count is the
 * count passed to the call, time is the average per iteration of the
 * slowest rank, algbw = size / time and busbw = algbw times nccl-tests'
 * factor for the op. errors is the number of wrong elements over all ranks
 * after one checked run against a reference computed locally from the
 * deterministic, integer-valued input pattern (so sums are exact).
 *
 * It uses only the public API (dcomm.h) and the C library, and joins the
 * job through dcomm_init(NULL, NULL), e.g. under dcomm-run. With the nccl
 * backend (DCOMM_BACKEND=nccl), whose collectives take device memory only,
 * the buffers are device memory of the rank's GPU (bench_cuda.c loads the
 * CUDA runtime at run time); the pattern is copied in and the checked
 * result out, outside the timed loop.
 *
 *   ./dcomm-run --nproc-per-node 4 -- ./dcomm-bench -o all_reduce -b 8 -e 64M -f 4
 *
 * dcomm-bench --tune FILE measures the settings that depend on the machine
 * and writes them as a tuning file (bench_tune.c).
 *
 * Exit status: 0 success, 1 a dcomm call failed or a result was wrong,
 * 2 a usage error. See dcomm-bench(1).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cuda.h"
#include "bench_tune.h"
#include "bench_util.h"
#include "dcomm.h"

/* Device memory (nccl): a scratch for the world reductions of the loop. */
static int on_device;
static void *dscratch;

static void die(const char *what, int rc) {
  char who[32] = "";
  int r = dcomm_rank(); /* < 0 before dcomm_init has succeeded: the launcher's RANK */
  const char *re = getenv("RANK");
  if (r >= 0) snprintf(who, sizeof(who), "rank %d: ", r);
  else if (re && *re) snprintf(who, sizeof(who), "RANK %.16s: ", re);
  fprintf(stderr, "dcomm-bench: %s%s failed: %s (%s)\n", who, what, dcomm_last_error(), dcomm_error_name(rc));
  exit(1);
}

#define CHECK(call)                        \
  do {                                     \
    int rc__ = (call);                     \
    if (rc__ < 0) die(#call, rc__);        \
  } while (0)

/* --- the communication bench_loop measures (ctx: the group) --- */

static int coll(const struct bench_run *x, dcomm_group_t g) {
  void *sb = x->dsbuf ? x->dsbuf : x->sbuf, *rb = x->drbuf ? x->drbuf : x->rbuf;
  switch (x->op) {
    case OP_ALL_REDUCE: return dcomm_all_reduce(rb, x->count, x->dt, DCOMM_SUM, g);
    case OP_ALL_GATHER: return dcomm_all_gather(sb, rb, x->count, x->dt, g);
    case OP_BROADCAST: return dcomm_broadcast(rb, x->count, x->dt, 0, g);
    case OP_REDUCE_SCATTER: return dcomm_reduce_scatter(sb, rb, x->count, x->dt, DCOMM_SUM, g);
    case OP_ALL_TO_ALL: return dcomm_all_to_all(sb, rb, x->count, x->dt, g);
    case OP_BARRIER: return dcomm_barrier(g);
    default: return DCOMM_EINVAL;
  }
}

static void run_once(void *ctx, const struct bench_run *x) {
  int rc = coll(x, ctx);
  if (rc < 0) die("run_once(&x)", rc);
}

/* An all_reduce of n 8-byte values over the world, through the device
 * scratch when the buffers must be device memory. */
static void world_reduce(void *v, size_t n, dcomm_dtype_t dt, dcomm_op_t op) {
  if (!on_device) {
    CHECK(dcomm_all_reduce(v, n, dt, op, NULL));
    return;
  }
  if (bench_cuda_put(dscratch, v, n * 8) < 0) die("copying to the device", DCOMM_EBACKEND);
  CHECK(dcomm_all_reduce(dscratch, n, dt, op, NULL));
  if (bench_cuda_get(v, dscratch, n * 8) < 0) die("copying from the device", DCOMM_EBACKEND);
}

static int64_t sum_world(void *ctx, int64_t v) {
  (void)ctx;
  world_reduce(&v, 1, DCOMM_INT64, DCOMM_SUM);
  return v;
}

static double max_world(void *ctx, double v) {
  (void)ctx;
  world_reduce(&v, 1, DCOMM_FLOAT64, DCOMM_MAX);
  return v;
}

static void upload(void *ctx, const struct bench_run *x) {
  (void)ctx;
  size_t sb, rb;
  bench_run_bytes(x, &sb, &rb);
  if (bench_cuda_put(x->dsbuf, x->sbuf, sb) < 0 || bench_cuda_put(x->drbuf, x->rbuf, rb) < 0)
    die("copying the input to the device", DCOMM_EBACKEND);
}

static void download(void *ctx, const struct bench_run *x) {
  (void)ctx;
  size_t sb, rb;
  bench_run_bytes(x, &sb, &rb);
  if (bench_cuda_get(x->rbuf, x->drbuf, rb) < 0) die("copying the result from the device", DCOMM_EBACKEND);
}

static void barrier_world(void *ctx) {
  (void)ctx;
  CHECK(dcomm_barrier(NULL));
}

int main(int argc, char **argv) {
  struct bench_prog prog = {
      .name = "dcomm-bench",
      .dtypes = "int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 (default) float64",
      .run_hint = "Run it under a launcher that sets the env:// variables, e.g.\n"
                  "  dcomm-run --nproc-per-node 4 -- dcomm-bench -o all_reduce -b 8 -e 64M -f 4\n",
      .rank_env = -1};
  const char *re = getenv("RANK");
  if (re && *re) prog.rank_env = atoi(re);
  if (argc >= 2 && !strcmp(argv[1], "--tune")) return bench_tune(argc - 1, argv + 1);
  struct bench_opts o;
  bench_parse_args(&prog, argc, argv, &o);
  const char *ws = getenv("WORLD_SIZE");
  if (ws && atoi(ws) > 0 && o.group && (o.group > atoi(ws) || atoi(ws) % o.group)) {
    if (prog.rank_env <= 0) fprintf(stderr, "dcomm-bench: -g %ld must divide the world size %s\n", o.group, ws);
    return 2;
  }
  dcomm_dtype_t dt = bench_dtypes[o.dti].dt;
  size_t es = dcomm_dtype_size(dt);

  /* Wall-clock (one clock for every rank of a host) around dcomm_init. */
  struct timespec t_in, t_out;
  clock_gettime(CLOCK_REALTIME, &t_in);
  CHECK(dcomm_init(NULL, NULL));
  clock_gettime(CLOCK_REALTIME, &t_out);
  double t_enter = (double)t_in.tv_sec + t_in.tv_nsec * 1e-9, t_exit = (double)t_out.tv_sec + t_out.tv_nsec * 1e-9;
  double init_t[3] = {t_exit - t_enter, -t_enter, t_exit}; /* max of each: slowest, first entry, last exit */
  on_device = !strcmp(dcomm_backend_name(), "nccl"); /* its collectives take device memory only */
  if (on_device) {
    char why[256];
    if (bench_cuda_open(dcomm_local_rank(), why, sizeof(why)) < 0 || !(dscratch = bench_cuda_alloc(64))) {
      fprintf(stderr, "dcomm-bench: rank %d: the nccl backend needs device buffers: %s\n", dcomm_rank(),
              dscratch ? why : "cudaMalloc failed");
      dcomm_finalize();
      return 1;
    }
  }
  world_reduce(init_t, 3, DCOMM_FLOAT64, DCOMM_MAX);
  int wrank = dcomm_rank(), wsize = dcomm_world_size();
  int G = o.group ? (int)o.group : wsize;
  if (G > wsize || wsize % G) {
    if (wrank == 0)
      fprintf(stderr, "dcomm-bench: -g %d must divide the world size %d\n", G, wsize);
    dcomm_finalize();
    return 2;
  }
  struct bench_run x = {.op = o.op, .dt = dt, .es = es};
  dcomm_group_t g = NULL;
  if (G != wsize) CHECK(dcomm_group_split(NULL, wrank / G, wrank, &g));
  x.grank = dcomm_group_rank(g);
  x.gsize = dcomm_group_size(g);
  if (x.grank < 0) die("dcomm_group_rank", x.grank);

  /* Buffers for the largest size. */
  size_t maxcount, sbytes, rbytes;
  bench_buffer_bytes(&o, es, x.gsize, &maxcount, &sbytes, &rbytes);
  x.sbuf = malloc(sbytes ? sbytes : 1);
  x.rbuf = malloc(rbytes ? rbytes : 1);
  if (on_device) {
    x.dsbuf = bench_cuda_alloc(sbytes);
    x.drbuf = bench_cuda_alloc(rbytes);
  }
  if (!x.sbuf || !x.rbuf || (on_device && (!x.dsbuf || !x.drbuf))) {
    fprintf(stderr, "dcomm-bench: rank %d: cannot allocate %zu + %zu bytes%s\n", wrank, sbytes, rbytes,
            on_device ? " (host and device)" : "");
    return 1;
  }

  if (wrank == 0) {
    const char *algo = getenv("DCOMM_ALGO"), *thr = getenv("DCOMM_TCP_SMALL_THRESHOLD"), *tr = getenv("DCOMM_TRANSPORT");
    printf("# dcomm-bench (dcomm %s, backend %s)\n", dcomm_version_string(), dcomm_backend_name());
    bench_print_config(&o, wsize, x.gsize);
    if ((algo && *algo) || (thr && *thr) || (tr && *tr))
      printf("# DCOMM_ALGO=%s DCOMM_TCP_SMALL_THRESHOLD=%s DCOMM_TRANSPORT=%s\n", algo ? algo : "", thr ? thr : "",
             tr ? tr : "");
    printf("# dcomm_init: slowest rank %.1f ms; first call to last return %.1f ms\n", init_t[0] * 1e3,
           (init_t[2] + init_t[1]) * 1e3);
    bench_print_columns();
  }

  const struct bench_comm comm = {run_once, sum_world, max_world, barrier_world, g, on_device ? upload : NULL,
                                  on_device ? download : NULL};
  uint64_t total_errors = bench_loop(&o, &x, &comm, wrank == 0);
  if (g) CHECK(dcomm_group_free(g));
  free(x.sbuf);
  free(x.rbuf);
  if (on_device) {
    bench_cuda_free(x.dsbuf);
    bench_cuda_free(x.drbuf);
    bench_cuda_free(dscratch);
  }
  CHECK(dcomm_finalize());
  return total_errors ? 1 : 0;
}
