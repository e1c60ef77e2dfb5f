/*
 * gpu_nccl_ref.c: dcomm's all_reduce next to NCCL's own, in the same run on
 * the same GPUs, for tests/gpu/run.sh (linked into gpu_coll). The ranks of
 * the dcomm world also make a plain NCCL communicator (rank 0's unique id
 * travels by a dcomm broadcast of device memory) and time, per size, the
 * same float32 sum three ways: dcomm_all_reduce (blocking: it returns once
 * the op completed), ncclAllReduce with a stream synchronize after each
 * call (the same contract), and ncclAllReduce calls back to back with one
 * synchronize at the end (how nccl-tests times). busbw uses nccl-tests'
 * factor 2(n-1)/n; bw_ratio is dcomm's busbw over NCCL's with the same
 * contract (sync). Rank 0 prints one "figure:" row per size.
 */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "dcomm.h"
#include "gpu_harness.h"

/* 0, or -1 with why. */
static int make_ref(int me, int np, ncclComm_t *nc, char *why, size_t wl) {
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  if (me == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    snprintf(why, wl, "ncclGetUniqueId failed");
    return -1;
  }
  void *d = NULL;
  if (cudaMalloc(&d, sizeof(id)) != cudaSuccess) {
    snprintf(why, wl, "cudaMalloc failed");
    return -1;
  }
  int rc = cudaMemcpy(d, &id, sizeof(id), cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
  if (rc == 0) rc = dcomm_broadcast(d, sizeof(id), DCOMM_UINT8, 0, NULL);
  if (rc == 0) rc = cudaMemcpy(&id, d, sizeof(id), cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
  cudaFree(d);
  if (rc != 0) {
    snprintf(why, wl, "passing the unique id: %s", dcomm_last_error());
    return -1;
  }
  ncclResult_t r = ncclCommInitRank(nc, np, id, me);
  if (r != ncclSuccess) {
    snprintf(why, wl, "ncclCommInitRank: %s", ncclGetErrorString(r));
    return -1;
  }
  return 0;
}

int gpu_side_by_side(int me, int np, char *why, size_t wl) {
  ncclComm_t nc = NULL;
  if (make_ref(me, np, &nc, why, wl) < 0) return -1;
  const size_t maxb = (size_t)256 << 20;
  float *buf = NULL;
  cudaStream_t s = NULL;
  if (cudaMalloc((void **)&buf, maxb) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess ||
      cudaMemset(buf, 0, maxb) != cudaSuccess) {
    snprintf(why, wl, "CUDA set-up of the side-by-side run failed");
    if (buf) cudaFree(buf);
    ncclCommDestroy(nc);
    return -1;
  }
  double factor = np > 1 ? 2.0 * (np - 1) / np : 1.0;
  if (me == 0)
    printf("figure: %12s %12s %12s %12s %11s %11s %11s %7s\n", "size", "dcomm_us", "nccl_sync_us", "nccl_async_us",
           "dcomm_busbw", "sync_busbw", "async_busbw", "bw_ratio");
  int rc = 0;
  for (size_t bytes = 8; bytes <= maxb && rc == 0; bytes *= 8) {
    size_t n = bytes / 4;
    int iters = bytes >= ((size_t)64 << 20) ? 10 : 50, warm = 5;
    for (int i = 0; i < warm && rc == 0; i++) rc = dcomm_all_reduce(buf, n, DCOMM_FLOAT32, DCOMM_SUM, NULL);
    double t0 = gpu_now();
    for (int i = 0; i < iters && rc == 0; i++) rc = dcomm_all_reduce(buf, n, DCOMM_FLOAT32, DCOMM_SUM, NULL);
    double td = (gpu_now() - t0) / iters;
    if (rc != 0) {
      snprintf(why, wl, "dcomm_all_reduce of %zu bytes: %s", bytes, dcomm_last_error());
      break;
    }
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < warm && r == ncclSuccess; i++) r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, nc, s);
    cudaStreamSynchronize(s);
    t0 = gpu_now();
    for (int i = 0; i < iters && r == ncclSuccess; i++) {
      r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, nc, s);
      cudaStreamSynchronize(s);
    }
    double ts = (gpu_now() - t0) / iters;
    t0 = gpu_now();
    for (int i = 0; i < iters && r == ncclSuccess; i++) r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, nc, s);
    cudaStreamSynchronize(s);
    double ta = (gpu_now() - t0) / iters;
    if (r != ncclSuccess) {
      snprintf(why, wl, "ncclAllReduce of %zu bytes: %s", bytes, ncclGetErrorString(r));
      rc = -1;
      break;
    }
    if (me == 0)
      printf("figure: %12zu %12.2f %12.2f %12.2f %11.3f %11.3f %11.3f %7.2f\n", bytes, td * 1e6, ts * 1e6, ta * 1e6,
             bytes / td / 1e9 * factor, bytes / ts / 1e9 * factor, bytes / ta / 1e9 * factor, ts / td);
  }
  cudaStreamDestroy(s);
  cudaFree(buf);
  ncclCommDestroy(nc);
  return rc;
}
