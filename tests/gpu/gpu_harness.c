/*
 * gpu_harness.c: the helpers of gpu_harness.h.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "gpu_harness.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int rank, passed, failed;

void gpu_set_rank(int r) { rank = r; }

double gpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void gpu_result(int ok, const char *fmt, ...) {
  va_list ap;
  printf("[rank %d] %s ", rank, ok ? "ok  " : "FAIL");
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
  if (ok) passed++;
  else failed++;
}

void gpu_figure(const char *fmt, ...) {
  va_list ap;
  printf("[rank %d] figure: ", rank);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

void gpu_finish(void) {
  printf("[rank %d] GPU checks: %d passed, %d failed\n", rank, passed, failed);
  fflush(stdout);
  exit(failed ? 1 : 0);
}

void gpu_cuda_check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  gpu_result(0, "%s: %s", what, cudaGetErrorString(e));
  gpu_finish();
}
