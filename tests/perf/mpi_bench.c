/*
 * mpi_bench.c: the MPI twin of dcomm-bench (tools/dcomm_bench.c), used by
 * tests/perf/compare-mpi.sh to put dcomm's tcp backend next to Open MPI on
 * the same machine. Same flags, same measurement, same output:
 *
 *   size count type time_us algbw_GBps busbw_GBps errors
 *
 * size is the per-rank buffer in bytes as nccl-tests define it, time the
 * average per iteration of the slowest rank (MPI_MAX of the per-rank
 * times), busbw uses nccl-tests' factors, errors counts wrong elements
 * after one checked run against the same integer-valued input pattern.
 * The calls: MPI_Allreduce (MPI_IN_PLACE, as dcomm_all_reduce is in place),
 * MPI_Allgather, MPI_Bcast (root 0), MPI_Reduce_scatter_block, MPI_Alltoall,
 * MPI_Barrier; -g splits MPI_COMM_WORLD with MPI_Comm_split.
 * float16 and bfloat16 have no MPI datatype and are refused.
 *
 * The options, the pattern, the loop and the rows are dcomm-bench's own
 * (tools/bench_util.c, which calls no dcomm function):
 *   mpicc -O2 -Itools tests/perf/mpi_bench.c tools/bench_util.c -lm -o tests/perf/mpi_bench
 *   mpirun --allow-run-as-root --oversubscribe -np 4 tests/perf/mpi_bench -o all_reduce -b 8 -e 64M -f 4
 *
 * Exit status: 0 success, 1 an MPI call failed or a result was wrong,
 * 2 a usage error.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "bench_util.h"

static void die(const char *what, int rc) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0, rank = -1;
  MPI_Error_string(rc, msg, &len);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "mpi_bench: rank %d: %s failed: %s\n", rank, what, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

#define CHECK(call)                              \
  do {                                           \
    int rc__ = (call);                           \
    if (rc__ != MPI_SUCCESS) die(#call, rc__);   \
  } while (0)

/* MPI has no datatype for float16 and bfloat16. */
static MPI_Datatype mpi_type(dcomm_dtype_t dt) {
  switch (dt) {
    case DCOMM_INT8: return MPI_INT8_T;
    case DCOMM_UINT8: return MPI_UINT8_T;
    case DCOMM_INT32: return MPI_INT32_T;
    case DCOMM_UINT32: return MPI_UINT32_T;
    case DCOMM_INT64: return MPI_INT64_T;
    case DCOMM_UINT64: return MPI_UINT64_T;
    case DCOMM_FLOAT32: return MPI_FLOAT;
    case DCOMM_FLOAT64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}

/* --- the communication bench_loop measures --- */

struct comm {
  MPI_Comm g;
  MPI_Datatype mdt;
};

static int coll(const struct bench_run *x, const struct comm *m) {
  int c = (int)x->count; /* main keeps every count below INT_MAX */
  switch (x->op) {
    case OP_ALL_REDUCE: return MPI_Allreduce(MPI_IN_PLACE, x->rbuf, c, m->mdt, MPI_SUM, m->g);
    case OP_ALL_GATHER: return MPI_Allgather(x->sbuf, c, m->mdt, x->rbuf, c, m->mdt, m->g);
    case OP_BROADCAST: return MPI_Bcast(x->rbuf, c, m->mdt, 0, m->g);
    case OP_REDUCE_SCATTER: return MPI_Reduce_scatter_block(x->sbuf, x->rbuf, c, m->mdt, MPI_SUM, m->g);
    case OP_ALL_TO_ALL: return MPI_Alltoall(x->sbuf, c, m->mdt, x->rbuf, c, m->mdt, m->g);
    case OP_BARRIER: return MPI_Barrier(m->g);
    default: return MPI_ERR_ARG;
  }
}

static void run_once(void *ctx, const struct bench_run *x) {
  int rc = coll(x, ctx);
  if (rc != MPI_SUCCESS) die("run_once(&x)", rc);
}

static int64_t sum_world(void *ctx, int64_t v) {
  (void)ctx;
  CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  return v;
}

static double max_world(void *ctx, double v) {
  (void)ctx;
  CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return v;
}

static void barrier_world(void *ctx) {
  (void)ctx;
  CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

int main(int argc, char **argv) {
  struct bench_prog prog = {
      .name = "mpi_bench",
      .dtypes = "int8 uint8 int32 uint32 int64 uint64 float32 (default) float64",
      .run_hint = "Run it under mpirun, e.g.\n"
                  "  mpirun --allow-run-as-root --oversubscribe -np 4 tests/perf/mpi_bench -o all_reduce -b 8 -e 64M -f 4\n",
      .rank_env = -1}; /* the rank mpirun gives, for usage errors before MPI_Init */
  const char *re = getenv("OMPI_COMM_WORLD_RANK");
  if (!re || !*re) re = getenv("PMI_RANK");
  if (re && *re) prog.rank_env = atoi(re);
  struct bench_opts o;
  bench_parse_args(&prog, argc, argv, &o);
  dcomm_dtype_t dt = bench_dtypes[o.dti].dt;
  size_t es = bench_dtypes[o.dti].size;
  if (mpi_type(dt) == MPI_DATATYPE_NULL) bench_usage_error("MPI has no datatype for %s", bench_dtypes[o.dti].name);

  CHECK(MPI_Init(&argc, &argv));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int wrank, wsize;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  int G = o.group ? (int)o.group : wsize;
  if (G > wsize || wsize % G) {
    if (wrank == 0) fprintf(stderr, "mpi_bench: -g %d must divide the world size %d\n", G, wsize);
    MPI_Finalize();
    return 2;
  }
  struct bench_run x = {.op = o.op, .dt = dt, .es = es};
  struct comm m = {.g = MPI_COMM_WORLD, .mdt = mpi_type(dt)};
  if (G != wsize) {
    CHECK(MPI_Comm_split(MPI_COMM_WORLD, wrank / G, wrank, &m.g));
    MPI_Comm_set_errhandler(m.g, MPI_ERRORS_RETURN);
  }
  MPI_Comm_rank(m.g, &x.grank);
  MPI_Comm_size(m.g, &x.gsize);

  /* Buffers for the largest size. */
  size_t maxcount, sbytes, rbytes;
  bench_buffer_bytes(&o, es, x.gsize, &maxcount, &sbytes, &rbytes);
  if (maxcount > INT_MAX) {
    if (wrank == 0) fprintf(stderr, "mpi_bench: -e %zu needs a count above INT_MAX\n", o.maxb);
    MPI_Finalize();
    return 2;
  }
  x.sbuf = malloc(sbytes ? sbytes : 1);
  x.rbuf = malloc(rbytes ? rbytes : 1);
  if (!x.sbuf || !x.rbuf) {
    fprintf(stderr, "mpi_bench: rank %d: cannot allocate %zu + %zu bytes\n", wrank, sbytes, rbytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }

  if (wrank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(lib, &len);
    char *nl = strchr(lib, '\n');
    if (nl) *nl = 0;
    nl = strchr(lib, ',');
    if (nl) *nl = 0;
    printf("# mpi_bench (%s)\n", lib);
    bench_print_config(&o, wsize, x.gsize);
    bench_print_columns();
  }

  const struct bench_comm comm = {.run_once = run_once, .sum_world = sum_world, .max_world = max_world,
                                  .barrier_world = barrier_world, .ctx = &m};
  uint64_t total_errors = bench_loop(&o, &x, &comm, wrank == 0);
  if (m.g != MPI_COMM_WORLD) MPI_Comm_free(&m.g);
  free(x.sbuf);
  free(x.rbuf);
  MPI_Finalize();
  return total_errors ? 1 : 0;
}
