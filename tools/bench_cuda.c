/*
 * bench_cuda.c: device memory for dcomm-bench when the backend takes device
 * memory only (nccl). libcudart is opened at run time with dlopen, so
 * neither dcomm-bench nor libdcomm needs CUDA to build or to run on a CPU
 * machine. Only the few runtime calls the benchmark needs are resolved.
 */
#include "bench_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cudaMemcpyKind values of the CUDA runtime API. */
#define H2D 1
#define D2H 2

static struct {
  void *lib;
  int (*get_count)(int *);
  int (*set_device)(int);
  int (*malloc_)(void **, size_t);
  int (*free_)(void *);
  int (*memcpy_)(void *, const void *, size_t, int);
  const char *(*err_string)(int);
} cu;

static const char *err_text(int e) { return cu.err_string ? cu.err_string(e) : "unknown CUDA error"; }

int bench_cuda_open(int local_rank, char *why, size_t wl) {
  const char *home = getenv("CUDA_HOME");
  char path[512];
  const char *names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", NULL, "/usr/local/cuda/lib64/libcudart.so"};
  if (home && *home) {
    snprintf(path, sizeof(path), "%s/lib64/libcudart.so", home);
    names[3] = path;
  }
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !cu.lib; i++)
    if (names[i]) cu.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!cu.lib) {
    snprintf(why, wl, "cannot load the CUDA runtime (libcudart.so; set CUDA_HOME or LD_LIBRARY_PATH)");
    return -1;
  }
  *(void **)&cu.get_count = dlsym(cu.lib, "cudaGetDeviceCount");
  *(void **)&cu.set_device = dlsym(cu.lib, "cudaSetDevice");
  *(void **)&cu.malloc_ = dlsym(cu.lib, "cudaMalloc");
  *(void **)&cu.free_ = dlsym(cu.lib, "cudaFree");
  *(void **)&cu.memcpy_ = dlsym(cu.lib, "cudaMemcpy");
  *(void **)&cu.err_string = dlsym(cu.lib, "cudaGetErrorString");
  if (!cu.get_count || !cu.set_device || !cu.malloc_ || !cu.free_ || !cu.memcpy_) {
    snprintf(why, wl, "the CUDA runtime lacks cudaMalloc/cudaMemcpy/...");
    return -1;
  }
  int n = 0, e = cu.get_count(&n);
  if (e != 0 || n <= 0) {
    snprintf(why, wl, "no CUDA device (cudaGetDeviceCount: %s)", e ? err_text(e) : "none found");
    return -1;
  }
  /* The nccl backend uses device local_rank % count: the same one. */
  if ((e = cu.set_device((local_rank > 0 ? local_rank : 0) % n)) != 0) {
    snprintf(why, wl, "cudaSetDevice: %s", err_text(e));
    return -1;
  }
  return 0;
}

void *bench_cuda_alloc(size_t n) {
  void *p = NULL;
  return cu.malloc_(&p, n ? n : 1) == 0 ? p : NULL;
}

void bench_cuda_free(void *p) {
  if (p) cu.free_(p);
}

int bench_cuda_put(void *dev, const void *host, size_t n) { return n && cu.memcpy_(dev, host, n, H2D) ? -1 : 0; }

int bench_cuda_get(void *host, const void *dev, size_t n) { return n && cu.memcpy_(host, dev, n, D2H) ? -1 : 0; }
