/*
 * gpu_harness.h: what the GPU check programs of tests/gpu share (compiled
 * with gpu_harness.c into each of them by tests/gpu/run.sh and
 * tests/nccl_module.sh): the monotonic clock, one line per check with a
 * pass/fail count, figures, the summary line run.sh tallies, and a CUDA
 * call that must succeed. Needs the CUDA runtime, not libdcomm (gpu_shrink
 * drives the backend module without the library).
 *
 * Every line starts with "[rank R] " (R from gpu_set_rank, 0 until then);
 * the summary, the last line of a program, is
 *   [rank R] GPU checks: N passed, M failed
 */
#ifndef DCOMM_TEST_GPU_HARNESS_H
#define DCOMM_TEST_GPU_HARNESS_H

#include <cuda_runtime_api.h>

/* The rank printed at the start of every line. */
void gpu_set_rank(int rank);

/* Seconds on CLOCK_MONOTONIC. */
double gpu_now(void);

/* One check: "[rank R] ok   <text>" or "[rank R] FAIL <text>", flushed,
 * and counted. */
void gpu_result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A measurement: "[rank R] figure: <text>". */
void gpu_figure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints the summary line and exits: 0 when no check failed, else 1. */
void gpu_finish(void) __attribute__((noreturn));

/* A CUDA call that must succeed: on an error, a failed check
 * "<what>: <CUDA's error string>" and gpu_finish. */
void gpu_cuda_check(cudaError_t e, const char *what);

#endif
