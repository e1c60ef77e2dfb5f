/*
 * tcp_cma.c: whether a single copy (process_vm_readv, "CMA") of data the
 * sender wrote earlier in a collective pays on this machine, measured once
 * per process. For such data the rings cost two copies, but they run in
 * parallel on the two processes and from cache-sized pieces; the single
 * copy is one copy done by the reader, through the kernel, which pins the
 * sender's pages first. Where the kernel copies at memory speed (bare
 * metal) the single copy wins; under a hypervisor that makes pinning dear
 * it ran at a third of memcpy's rate and made a 64 MiB all_reduce 2.3x
 * slower than the rings. So, unless DCOMM_SHM_CMA_FWD_MIN gives a size,
 * the first forwarded send large enough asks here: the reader's own loop
 * (process_vm_readv of chunk-sized pieces into one chunk) is timed against
 * memcpy doing the same, best of three each, on 4 MiB (about 1-2 ms).
 */
#include "config.h"
#include "tcp.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The single copy is chosen when the kernel copies at least this share of
 * memcpy's rate: the rings' second copy overlaps on the other process, so
 * the single copy must come near memcpy to save anything. */
#define CMA_PAYS_SHARE 0.75
#define CMA_PROBE_BYTES ((size_t)4 << 20)
#define CMA_PROBE_PIECE ((size_t)256 << 10)

static pthread_once_t measured = PTHREAD_ONCE_INIT;
static double kernel_gbps, memcpy_gbps;
static int pays;
static atomic_int told;

static double mono(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Seconds for one pass over src in pieces into dst, by memcpy or by the
 * kernel; a negative value when process_vm_readv failed. */
static double one_pass(char *src, char *dst, int kernel) {
  pid_t self = getpid();
  double t = mono();
  for (size_t off = 0; off < CMA_PROBE_BYTES; off += CMA_PROBE_PIECE) {
    if (!kernel) {
      memcpy(dst, src + off, CMA_PROBE_PIECE);
      continue;
    }
    struct iovec lo = {dst, CMA_PROBE_PIECE}, re = {src + off, CMA_PROBE_PIECE};
    if (process_vm_readv(self, &lo, 1, &re, 1, 0) != (ssize_t)CMA_PROBE_PIECE) return -1;
  }
  __asm__ volatile("" ::"r"(dst) : "memory"); /* the copies are used */
  return mono() - t;
}

static void measure(void) {
  char *src = malloc(CMA_PROBE_BYTES), *dst = malloc(CMA_PROBE_PIECE);
  if (src && dst) {
    memset(src, 1, CMA_PROBE_BYTES);
    memset(dst, 0, CMA_PROBE_PIECE);
    double best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 3 && best[1] > 0; rep++)
      for (int k = 0; k < 2; k++) {
        double t = one_pass(src, dst, k);
        if (t < 0) best[1] = -1;
        else if (t < best[k]) best[k] = t;
      }
    if (best[1] > 0 && best[0] > 0) {
      memcpy_gbps = (double)CMA_PROBE_BYTES / best[0] / 1e9;
      kernel_gbps = (double)CMA_PROBE_BYTES / best[1] / 1e9;
      pays = kernel_gbps >= CMA_PAYS_SHARE * memcpy_gbps;
    }
  }
  free(src);
  free(dst);
}

int tcp_cma_fwd_pays(const struct tcp_ctx *ctx) {
  pthread_once(&measured, measure);
  if (!atomic_exchange(&told, 1))
    TCP_LOG(ctx, INFO,
            "single copy of forwarded data: %s (process_vm_readv %.2f GB/s, memcpy %.2f GB/s, 4 MiB in 256 KiB "
            "pieces; the single copy needs %.0f%% of memcpy's rate; DCOMM_SHM_CMA_FWD_MIN sets a size instead)",
            pays ? "on" : "off", kernel_gbps, memcpy_gbps, CMA_PAYS_SHARE * 100);
  return pays;
}
