/*
 * bench_cuda.h: dcomm-bench's device memory (bench_cuda.c), for backends
 * that take device memory only. The CUDA runtime is loaded at run time.
 */
#ifndef DCOMM_BENCH_CUDA_H
#define DCOMM_BENCH_CUDA_H

#include <stddef.h>

/* Loads libcudart and selects device local_rank % count, as the nccl
 * backend does. 0, or -1 with why. */
int bench_cuda_open(int local_rank, char *why, size_t wl);
void *bench_cuda_alloc(size_t n); /* NULL on failure */
void bench_cuda_free(void *p);
/* Synchronous copies; 0 or -1. */
int bench_cuda_put(void *dev, const void *host, size_t n);
int bench_cuda_get(void *host, const void *dev, size_t n);

#endif
