/*
 * gpu_coll.c: the GPU check of the nccl backend, through the public API
 * only (dcomm.h) with cudaMalloc'd buffers. tests/gpu/run.sh builds and runs
 * it on a machine with a GPU:
 *   gpu_coll                 world of 1: tcp://127.0.0.1:$GPU_COLL_PORT
 *   RANK=.. WORLD_SIZE=.. LOCAL_RANK=.. MASTER_ADDR=.. MASTER_PORT=.. gpu_coll
 *                            one process per GPU through env://
 *   gpu_coll --count-devices prints the number of CUDA devices (0 if none)
 * Every collective is checked against expected values copied back with
 * cudaMemcpy; then host buffers and tags are checked to fail cleanly,
 * sub-groups are built, a checkpoint is saved and loaded (its host values
 * go through the store), latency and bandwidth are measured, and a timeout
 * forces an abort followed by finalize and a new init (timed). The last
 * line is "[rank R] GPU checks: N passed, M failed"; exit 0 when M is 0.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "dcomm.h"
#include "dcomm_elastic.h"
#include "gpu_harness.h"

static int me, np = 1;
int gpu_side_by_side(int me, int np, char *why, size_t wl); /* gpu_nccl_ref.c */
static int multi;      /* launched through env:// */
static int base_port;  /* the store port of the first init */

/* rc as text, with the library's sentence when it failed. */
static const char *rctext(int rc) {
  static char buf[1400];
  if (rc == 0) return "0";
  snprintf(buf, sizeof(buf), "%s (%s)", dcomm_error_name(rc), dcomm_last_error());
  return buf;
}

static void *dalloc(size_t bytes) {
  void *p = NULL;
  gpu_cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}

static void up(void *d, const void *h, size_t n) {
  gpu_cuda_check(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
static void down(void *h, const void *d, size_t n) {
  gpu_cuda_check(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

static int close_to(double a, double b) {
  double d = a > b ? a - b : b - a, m = b < 0 ? -b : b;
  return d <= 1e-3 * (m > 1 ? m : 1);
}

/* Number of elements of got (float32) that differ from want; notes the first. */
static size_t mismatches(const float *got, const float *want, size_t n, char *note, size_t len) {
  size_t bad = 0;
  note[0] = 0;
  for (size_t i = 0; i < n; i++)
    if (!close_to(got[i], want[i])) {
      if (!bad++) snprintf(note, len, "; first at %zu: got %g, want %g", i, (double)got[i], (double)want[i]);
    }
  return bad;
}

static const char *const dt_names[DCOMM_DTYPE_COUNT] = {"int8",  "uint8",   "int32",    "uint32",  "int64",
                                                        "uint64", "float16", "bfloat16", "float32", "float64"};
static const char *const op_names[DCOMM_OP_COUNT] = {"sum", "prod", "max", "min", "avg", "band", "bor", "bxor"};

/* ---- the checks ---- */

static double v_of(int p, size_t i) { return 1 + (double)((p + (int)i) % 3); }

static void check_dtypes(void) {
  const size_t n = 257;
  for (int dt = 0; dt < DCOMM_DTYPE_COUNT; dt++) {
    size_t es = dcomm_dtype_size((dcomm_dtype_t)dt), bad = 0;
    unsigned char *h = malloc(n * es);
    void *d = dalloc(n * es);
    for (size_t i = 0; i < n; i++) bench_put(h, (dcomm_dtype_t)dt, i, v_of(me, i));
    up(d, h, n * es);
    int rc = dcomm_all_reduce(d, n, (dcomm_dtype_t)dt, DCOMM_SUM, NULL);
    down(h, d, n * es);
    char note[128] = "";
    for (size_t i = 0; i < n; i++) {
      double want = 0, got = bench_get(h, (dcomm_dtype_t)dt, i);
      for (int p = 0; p < np; p++) want += v_of(p, i);
      if (!close_to(got, want) && !bad++) snprintf(note, sizeof(note), "; first at %zu: got %g, want %g", i, got, want);
    }
    gpu_result(rc == 0 && bad == 0, "all_reduce sum %-8s count %zu: rc %s, %zu wrong%s", dt_names[dt], n, rctext(rc),
               bad, note);
    cudaFree(d);
    free(h);
  }
}

static void check_ops(void) {
  const size_t n = 100;
  float h[100], want[100];
  char note[128];
  float *d = dalloc(sizeof(h));
  for (int op = 0; op <= DCOMM_AVG; op++) { /* the arithmetic ops; NCCL has no bitwise ones */
    for (size_t i = 0; i < n; i++) {
      h[i] = (float)v_of(me, i);
      double w = op == DCOMM_PROD ? 1 : op == DCOMM_MIN ? 1e9 : op == DCOMM_MAX ? -1e9 : 0;
      for (int p = 0; p < np; p++) {
        double v = v_of(p, i);
        if (op == DCOMM_SUM || op == DCOMM_AVG) w += v;
        else if (op == DCOMM_PROD) w *= v;
        else if (op == DCOMM_MAX) w = v > w ? v : w;
        else w = v < w ? v : w;
      }
      want[i] = (float)(op == DCOMM_AVG ? w / np : w);
    }
    up(d, h, sizeof(h));
    int rc = dcomm_all_reduce(d, n, DCOMM_FLOAT32, (dcomm_op_t)op, NULL);
    down(h, d, sizeof(h));
    size_t bad = mismatches(h, want, n, note, sizeof(note));
    gpu_result(rc == 0 && bad == 0, "all_reduce float32 %-4s: rc %s, %zu wrong%s", op_names[op], rctext(rc), bad, note);
  }
  for (int op = DCOMM_BAND; op <= DCOMM_BXOR; op++) {
    int rc = dcomm_all_reduce(d, n, DCOMM_INT32, (dcomm_op_t)op, NULL);
    gpu_result(rc == DCOMM_ENOTSUP, "all_reduce int32 %-4s is refused: rc %s", op_names[op], rctext(rc));
  }
  /* reduce to the last rank */
  int root = np - 1;
  for (size_t i = 0; i < n; i++) {
    h[i] = (float)v_of(me, i);
    want[i] = 0;
    for (int p = 0; p < np; p++) want[i] += (float)v_of(p, i);
  }
  up(d, h, sizeof(h));
  int rc = dcomm_reduce(d, n, DCOMM_FLOAT32, DCOMM_SUM, root, NULL);
  down(h, d, sizeof(h));
  size_t bad = me == root ? mismatches(h, want, n, note, sizeof(note)) : 0;
  if (me != root) note[0] = 0;
  gpu_result(rc == 0 && bad == 0, "reduce sum to root %d: rc %s, %zu wrong%s", root, rctext(rc), bad, note);
  cudaFree(d);
}

static void check_broadcast(void) {
  const size_t n = 1000;
  float *h = malloc(n * 4), *want = malloc(n * 4);
  char note[128];
  float *d = dalloc(n * 4);
  int roots[2] = {0, np - 1};
  for (int k = 0; k < (np > 1 ? 2 : 1); k++) {
    int root = roots[k];
    for (size_t i = 0; i < n; i++) {
      want[i] = (float)(1000 + i + (size_t)root);
      h[i] = me == root ? want[i] : -1.0f;
    }
    up(d, h, n * 4);
    int rc = dcomm_broadcast(d, n, DCOMM_FLOAT32, root, NULL);
    down(h, d, n * 4);
    size_t bad = mismatches(h, want, n, note, sizeof(note));
    gpu_result(rc == 0 && bad == 0, "broadcast from root %d: rc %s, %zu wrong%s", root, rctext(rc), bad, note);
  }
  cudaFree(d);
  free(h);
  free(want);
}

static void check_gathers(void) {
  const size_t c = 64, all = c * (size_t)np;
  float *hs = malloc(all * 4), *hr = malloc(all * 4), *want = malloc(all * 4);
  float *ds = dalloc(all * 4), *dr = dalloc(all * 4);
  char note[128];
  int rc;
  size_t bad;

  /* all_gather */
  for (size_t i = 0; i < c; i++) hs[i] = (float)(me * 100 + (int)i);
  for (size_t j = 0; j < all; j++) want[j] = (float)((int)(j / c) * 100 + (int)(j % c));
  up(ds, hs, c * 4);
  gpu_cuda_check(cudaMemset(dr, 0, all * 4), "cudaMemset");
  rc = dcomm_all_gather(ds, dr, c, DCOMM_FLOAT32, NULL);
  down(hr, dr, all * 4);
  bad = mismatches(hr, want, all, note, sizeof(note));
  gpu_result(rc == 0 && bad == 0, "all_gather count %zu: rc %s, %zu wrong%s", c, rctext(rc), bad, note);

  /* gather to rank 0; non-roots pass no receive buffer */
  gpu_cuda_check(cudaMemset(dr, 0, all * 4), "cudaMemset");
  rc = dcomm_gather(ds, me == 0 ? dr : NULL, c, DCOMM_FLOAT32, 0, NULL);
  down(hr, dr, all * 4);
  bad = me == 0 ? mismatches(hr, want, all, note, sizeof(note)) : 0;
  if (me) note[0] = 0;
  gpu_result(rc == 0 && bad == 0, "gather to root 0: rc %s, %zu wrong%s", rctext(rc), bad, note);

  /* scatter from the last rank; non-roots pass no send buffer */
  int root = np - 1;
  for (size_t j = 0; j < all; j++) hs[j] = (float)((int)(j / c) * 100 + (int)(j % c));
  for (size_t i = 0; i < c; i++) want[i] = (float)(me * 100 + (int)i);
  up(ds, hs, all * 4);
  gpu_cuda_check(cudaMemset(dr, 0, all * 4), "cudaMemset");
  rc = dcomm_scatter(me == root ? ds : NULL, dr, c, DCOMM_FLOAT32, root, NULL);
  down(hr, dr, c * 4);
  bad = mismatches(hr, want, c, note, sizeof(note));
  gpu_result(rc == 0 && bad == 0, "scatter from root %d: rc %s, %zu wrong%s", root, rctext(rc), bad, note);

  /* reduce_scatter: send[j] = me + j; rank r gets sum_p (p + r*c + i) */
  for (size_t j = 0; j < all; j++) hs[j] = (float)(me + (int)j);
  for (size_t i = 0; i < c; i++) want[i] = (float)(np * (np - 1) / 2 + np * (me * (int)c + (int)i));
  up(ds, hs, all * 4);
  gpu_cuda_check(cudaMemset(dr, 0, all * 4), "cudaMemset");
  rc = dcomm_reduce_scatter(ds, dr, c, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  down(hr, dr, c * 4);
  bad = mismatches(hr, want, c, note, sizeof(note));
  gpu_result(rc == 0 && bad == 0, "reduce_scatter sum count %zu: rc %s, %zu wrong%s", c, rctext(rc), bad, note);

  /* all_to_all: block p of rank r goes to rank p's block r */
  for (size_t j = 0; j < all; j++) hs[j] = (float)(me * 10000 + (int)(j / c) * 100 + (int)(j % c));
  for (size_t j = 0; j < all; j++) want[j] = (float)((int)(j / c) * 10000 + me * 100 + (int)(j % c));
  up(ds, hs, all * 4);
  gpu_cuda_check(cudaMemset(dr, 0, all * 4), "cudaMemset");
  rc = dcomm_all_to_all(ds, dr, c, DCOMM_FLOAT32, NULL);
  down(hr, dr, all * 4);
  bad = mismatches(hr, want, all, note, sizeof(note));
  gpu_result(rc == 0 && bad == 0, "all_to_all count %zu: rc %s, %zu wrong%s", c, rctext(rc), bad, note);

  /* all_to_allv: rank r sends (r + p) % 3 elements to rank p (one more
   * to itself), packed in rank order; rank p expects as many from r */
  {
    size_t sc[64], sd[64], rcn[64], rd[64], so = 0, ro = 0;
    for (int p = 0; p < np && p < 64; p++) {
      sc[p] = (size_t)((me + p) % 3 + (p == me)), sd[p] = so, so += sc[p];
      rcn[p] = (size_t)((p + me) % 3 + (p == me)), rd[p] = ro, ro += rcn[p];
    }
    for (int p = 0; p < np; p++)
      for (size_t k = 0; k < sc[p]; k++) hs[sd[p] + k] = (float)(me * 10000 + p * 100 + (int)k);
    for (int p = 0; p < np; p++)
      for (size_t k = 0; k < rcn[p]; k++) want[rd[p] + k] = (float)(p * 10000 + me * 100 + (int)k);
    up(ds, hs, so * 4 + 4);
    gpu_cuda_check(cudaMemset(dr, 0, all * 4), "cudaMemset");
    rc = so <= all && ro <= all && np <= 64 ? dcomm_all_to_allv(ds, sc, sd, dr, rcn, rd, DCOMM_FLOAT32, NULL) : DCOMM_EINVAL;
    down(hr, dr, ro * 4 + 4);
    bad = mismatches(hr, want, ro, note, sizeof(note));
    gpu_result(rc == 0 && bad == 0, "all_to_allv uneven: rc %s, %zu wrong%s", rctext(rc), bad, note);
  }

  cudaFree(ds);
  cudaFree(dr);
  free(hs);
  free(hr);
  free(want);
}

static void check_barrier_p2p(void) {
  int rc = 0;
  for (int k = 0; k < 3 && rc == 0; k++) rc = dcomm_barrier(NULL);
  gpu_result(rc == 0, "barrier x3: rc %s", rctext(rc));

  if (np < 2) {
    printf("[rank %d] skip send/recv and tags: world of 1 (a rank cannot send to itself)\n", me);
    return;
  }
  const size_t n = 4096;
  int partner = me % 2 == 0 ? me + 1 : me - 1;
  if (partner >= np) {
    printf("[rank %d] skip send/recv: no partner (odd world size)\n", me);
    return;
  }
  float *h = malloc(n * 4), *want = malloc(n * 4);
  float *d = dalloc(n * 4);
  char note[128];
  for (size_t i = 0; i < n; i++) h[i] = (float)(me * 1000 + (int)i);
  for (size_t i = 0; i < n; i++) want[i] = (float)(partner * 1000 + (int)i);
  float *dsend = dalloc(n * 4);
  up(dsend, h, n * 4);
  int rc1, rc2;
  if (me % 2 == 0) {
    rc1 = dcomm_send(dsend, n, DCOMM_FLOAT32, partner, 0, NULL);
    rc2 = dcomm_recv(d, n, DCOMM_FLOAT32, partner, 0, NULL);
  } else {
    rc2 = dcomm_recv(d, n, DCOMM_FLOAT32, partner, 0, NULL);
    rc1 = dcomm_send(dsend, n, DCOMM_FLOAT32, partner, 0, NULL);
  }
  down(h, d, n * 4);
  size_t bad = mismatches(h, want, n, note, sizeof(note));
  gpu_result(rc1 == 0 && rc2 == 0 && bad == 0, "send/recv with rank %d: send rc %s, recv rc %s, %zu wrong%s", partner,
             rctext(rc1), rctext(rc2), bad, note);
  rc = dcomm_send(dsend, n, DCOMM_FLOAT32, partner, 5, NULL);
  gpu_result(rc == DCOMM_ENOTSUP, "send with tag 5 is refused: rc %s", rctext(rc));
  cudaFree(d);
  cudaFree(dsend);
  free(h);
  free(want);
}

static void check_bad_buffers(void) {
  float *h = malloc(64 * 4);
  for (int i = 0; i < 64; i++) h[i] = 1;
  int rc = dcomm_all_reduce(h, 64, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  gpu_result(rc == DCOMM_EINVAL && strstr(dcomm_last_error(), "host memory"),
             "all_reduce on malloc'd memory is refused: rc %s", rctext(rc));
  free(h);
  void *pinned = NULL;
  gpu_cuda_check(cudaMallocHost(&pinned, 256), "cudaMallocHost");
  rc = dcomm_broadcast(pinned, 64, DCOMM_FLOAT32, 0, NULL);
  gpu_result(rc == DCOMM_EINVAL && strstr(dcomm_last_error(), "host memory"),
             "broadcast on cudaMallocHost memory is refused: rc %s", rctext(rc));
  cudaFreeHost(pinned);
  rc = dcomm_all_reduce(NULL, 0, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  gpu_result(rc == 0, "all_reduce of count 0: rc %s", rctext(rc));
}

static void check_groups(void) {
  int *ranks = malloc(sizeof(int) * (size_t)np);
  for (int i = 0; i < np; i++) ranks[i] = np - 1 - i; /* reversed */
  dcomm_group_t g = NULL;
  double t0 = gpu_now();
  int rc = dcomm_new_group(ranks, np, &g);
  double t_new = gpu_now() - t0;
  int grank = rc == 0 ? dcomm_group_rank(g) : -1;
  gpu_result(rc == 0 && grank == np - 1 - me, "new_group (reversed world): rc %s, group rank %d, %.3f s", rctext(rc),
             grank, t_new);
  if (rc == 0) {
    int *d = dalloc(4), v = grank + 1;
    up(d, &v, 4);
    rc = dcomm_all_reduce(d, 1, DCOMM_INT32, DCOMM_SUM, g);
    down(&v, d, 4);
    gpu_result(rc == 0 && v == np * (np + 1) / 2, "all_reduce on the new group: rc %s, got %d want %d", rctext(rc), v,
               np * (np + 1) / 2);
    cudaFree(d);
    rc = dcomm_group_free(g);
    gpu_result(rc == 0, "group_free: rc %s", rctext(rc));
  }
  free(ranks);

  /* A group that leaves the last rank out: it takes part in the split
   * (NCCL_SPLIT_NOCOLOR) and is told it is no member. */
  if (np >= 2) {
    int *sub = malloc(sizeof(int) * (size_t)(np - 1));
    for (int i = 0; i < np - 1; i++) sub[i] = i;
    dcomm_group_t h = NULL;
    rc = dcomm_new_group(sub, np - 1, &h);
    gpu_result(rc == 0, "new_group of ranks 0..%d: rc %s", np - 2, rctext(rc));
    if (rc == 0) {
      int *d = dalloc(4), v = 1;
      up(d, &v, 4);
      rc = dcomm_all_reduce(d, 1, DCOMM_INT32, DCOMM_SUM, h);
      down(&v, d, 4);
      if (me < np - 1)
        gpu_result(rc == 0 && v == np - 1, "all_reduce on it: rc %s, got %d want %d", rctext(rc), v, np - 1);
      else
        gpu_result(rc == DCOMM_ENOTMEMBER, "the rank left out gets DCOMM_ENOTMEMBER: rc %s", rctext(rc));
      cudaFree(d);
      dcomm_group_free(h);
    }
    free(sub);
    /* the world still works after splits with a rank left out */
    int *d = dalloc(4), v = 1;
    up(d, &v, 4);
    rc = dcomm_all_reduce(d, 1, DCOMM_INT32, DCOMM_SUM, NULL);
    down(&v, d, 4);
    gpu_result(rc == 0 && v == np, "world all_reduce after the splits: rc %s, got %d want %d", rctext(rc), v, np);
    cudaFree(d);
  }

  /* split by parity; the core exchanges colors with an all_gather through
   * the backend, so this fails if that exchange uses host memory */
  dcomm_group_t s = NULL;
  rc = dcomm_group_split(NULL, me % 2, me, &s);
  gpu_result(rc == 0, "group_split by parity: rc %s", rctext(rc));
  if (rc == 0) {
    int want = 0;
    for (int p = me % 2; p < np; p += 2) want += p;
    int *d = dalloc(4), v = me;
    up(d, &v, 4);
    rc = dcomm_all_reduce(d, 1, DCOMM_INT32, DCOMM_SUM, s);
    down(&v, d, 4);
    gpu_result(rc == 0 && v == want, "all_reduce on the split group: rc %s, got %d want %d", rctext(rc), v, want);
    cudaFree(d);
    dcomm_group_free(s);
  }
}

static void figures(void) {
  float *d = dalloc(64u << 20);
  gpu_cuda_check(cudaMemset(d, 0, 64u << 20), "cudaMemset");
  int rc = 0, iters = 200;
  for (int i = 0; i < 10 && rc == 0; i++) rc = dcomm_all_reduce(d, 1, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  double t0 = gpu_now();
  for (int i = 0; i < iters && rc == 0; i++) rc = dcomm_all_reduce(d, 1, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  double lat = (gpu_now() - t0) / iters;
  gpu_result(rc == 0, "latency loop: rc %s", rctext(rc));
  if (rc == 0 && me == 0) gpu_figure("all_reduce 4 B: %.1f us per call (%d ranks, %d calls)", lat * 1e6, np, iters);
  t0 = gpu_now();
  for (int i = 0; i < iters && rc == 0; i++) rc = dcomm_barrier(NULL);
  if (rc == 0 && me == 0) gpu_figure("barrier: %.1f us per call", (gpu_now() - t0) / iters * 1e6);
  size_t n = (64u << 20) / 4;
  iters = 20;
  for (int i = 0; i < 3 && rc == 0; i++) rc = dcomm_all_reduce(d, n, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  t0 = gpu_now();
  for (int i = 0; i < iters && rc == 0; i++) rc = dcomm_all_reduce(d, n, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  double per = (gpu_now() - t0) / iters, algbw = (double)(n * 4) / per / 1e9;
  gpu_result(rc == 0, "bandwidth loop: rc %s", rctext(rc));
  if (rc == 0 && me == 0)
    gpu_figure("all_reduce 64 MiB: %.3f ms per call, algbw %.1f GB/s, busbw %.1f GB/s", per * 1e3, algbw,
               np > 1 ? algbw * 2.0 * (np - 1) / np : algbw);
  cudaFree(d);
}

static int do_init(int port) {
  char method[128];
  if (multi) {
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    setenv("MASTER_PORT", p, 1);
    snprintf(method, sizeof(method), "env://");
  } else {
    snprintf(method, sizeof(method), "tcp://127.0.0.1:%d?rank=0&world_size=1", port);
  }
  return dcomm_init("nccl", method);
}

/* A timeout far below the op's run time forces the backend to abort; the
 * world is then finalized and initialized again. */
static void abort_cycle(void) {
  size_t n = (256u << 20) / 4; /* 256 MiB per rank */
  float *ds = dalloc(n * 4), *dr = dalloc(n * 4 * (size_t)np);
  gpu_cuda_check(cudaMemset(ds, 1, n * 4), "cudaMemset");
  int rc = dcomm_group_set_timeout(NULL, 1e-6);
  gpu_result(rc == 0, "set a 1 us timeout on the world: rc %s", rctext(rc));
  double t0 = gpu_now();
  rc = dcomm_all_gather(ds, dr, n, DCOMM_FLOAT32, NULL);
  double t_to = gpu_now() - t0;
  gpu_result(rc == DCOMM_ETIMEDOUT, "all_gather of 256 MiB under a 1 us timeout times out: rc %s, %.3f s", rctext(rc),
             t_to);
  t0 = gpu_now();
  rc = dcomm_barrier(NULL);
  double t_later = gpu_now() - t0;
  gpu_result(rc < 0 && t_later < 1.0, "a later barrier fails at once: rc %s, %.3f s", rctext(rc), t_later);
  gpu_result(rc == DCOMM_EREVOKED, "... with DCOMM_EREVOKED: rc %s", rctext(rc));
  cudaFree(ds);
  cudaFree(dr);
  t0 = gpu_now();
  rc = dcomm_finalize();
  double t_fin = gpu_now() - t0;
  gpu_result(rc == 0, "finalize after the abort: rc %s, %.3f s", rctext(rc), t_fin);
  t0 = gpu_now();
  rc = do_init(base_port + 1);
  double t_init = gpu_now() - t0;
  gpu_result(rc == 0, "init again (store port %d): rc %s, %.3f s", base_port + 1, rctext(rc), t_init);
  if (rc != 0) return;
  int *d = dalloc(4), v = me + 1;
  up(d, &v, 4);
  rc = dcomm_all_reduce(d, 1, DCOMM_INT32, DCOMM_SUM, NULL);
  down(&v, d, 4);
  gpu_result(rc == 0 && v == np * (np + 1) / 2, "all_reduce after the new init: rc %s, got %d want %d", rctext(rc), v,
             np * (np + 1) / 2);
  cudaFree(d);
  if (me == 0)
    gpu_figure("abort cycle: timeout+abort %.1f ms, later op %.3f ms, finalize %.1f ms, new init %.1f ms", t_to * 1e3,
               t_later * 1e3, t_fin * 1e3, t_init * 1e3);
}

/* Checkpoints with a device-memory-only backend: rank 0's outcome and the
 * header go through the store, every rank reads the file itself. */
static void check_checkpoint(void) {
  char dir[512];
  const char *top = getenv("GPU_CKPT_DIR"); /* run.sh: its log folder */
  snprintf(dir, sizeof(dir), "%s/ckpt.%d", top && *top ? top : "/tmp", base_port);
  double payload[4] = {1.5, -2.25, 1e300, (double)np};
  int rc = dcomm_checkpoint_save(dir, 7, payload, sizeof(payload));
  gpu_result(rc == 0, "checkpoint_save of step 7 with the nccl world: rc %s", rctext(rc));
  void *data = NULL;
  size_t len = 0;
  uint64_t step = 0;
  rc = dcomm_checkpoint_load(dir, &data, &len, &step);
  gpu_result(rc == 0 && step == 7 && len == sizeof(payload) && data && !memcmp(data, payload, sizeof(payload)),
             "checkpoint_load gives every rank rank 0's step 7 and payload: rc %s, step %llu, %zu bytes", rctext(rc),
             (unsigned long long)step, len);
  free(data);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && !strcmp(argv[1], "--count-devices")) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      fprintf(stderr, "cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
      n = 0;
    }
    printf("%d\n", n);
    return 0;
  }
  const char *ws = getenv("WORLD_SIZE");
  multi = ws && atoi(ws) > 1 && getenv("MASTER_ADDR");
  if (multi) {
    me = getenv("RANK") ? atoi(getenv("RANK")) : 0;
    np = atoi(ws);
    base_port = getenv("MASTER_PORT") ? atoi(getenv("MASTER_PORT")) : 29500;
  } else {
    base_port = getenv("GPU_COLL_PORT") ? atoi(getenv("GPU_COLL_PORT")) : 29531;
  }
  gpu_set_rank(me);
  double t0 = gpu_now();
  int rc = do_init(base_port);
  double t_init = gpu_now() - t0;
  gpu_result(rc == 0, "dcomm_init(\"nccl\", %s): rc %s, %.3f s", multi ? "env://" : "tcp://127.0.0.1", rctext(rc),
             t_init);
  if (rc != 0) gpu_finish();
  const char *bn = dcomm_backend_name();
  gpu_result(bn && !strcmp(bn, "nccl") && dcomm_rank() == me && dcomm_world_size() == np,
             "backend %s, rank %d of %d, local rank %d", bn ? bn : "(null)", dcomm_rank(), dcomm_world_size(),
             dcomm_local_rank());
  if (me == 0) gpu_figure("init of a world of %d: %.3f s", np, t_init);

  check_dtypes();
  check_ops();
  check_broadcast();
  check_gathers();
  check_barrier_p2p();
  check_bad_buffers();
  check_groups();
  check_checkpoint();
  figures();
  char why[512] = "";
  rc = gpu_side_by_side(me, np, why, sizeof(why));
  gpu_result(rc == 0, "dcomm all_reduce beside NCCL's own, 8 B to 256 MiB%s%s", rc ? ": " : " (figure rows)", why);
  abort_cycle();
  if (dcomm_initialized()) {
    rc = dcomm_finalize();
    gpu_result(rc == 0, "final dcomm_finalize: rc %s", rctext(rc));
  }
  gpu_finish();
  return 0;
}
