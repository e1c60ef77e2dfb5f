/*
 * scale_probe.c: the probe of the scale benchmark (tests/perf/scale-bench.sh).
 * Run it under dcomm-run (or any launcher) with many ranks; it uses only
 * the public API (dcomm.h). Each rank times, in order:
 *   init     dcomm_init
 *   first    the first barrier of the world
 *   ar8      an 8-byte float all_reduce
 *   ar1m     a 1 MiB float all_reduce (result checked)
 *   group    dcomm_new_group of the even ranks, and a barrier on it
 * and then counts its open descriptors (/proc/self/fd) and its resident
 * memory (VmRSS). Rank 0 prints the slowest rank's time of each phase and
 * the largest descriptor count and RSS:
 *   scale ranks=N init=S first=S ar8=S ar1m=S group=S fds=N rss_kib=N
 * Exit status 0 when every phase succeeded and the sums were right.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dcomm.h"
#include "../proc_fds.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  if (!f) return -1;
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, "VmRSS:", 6) == 0) v = strtol(line + 6, NULL, 10);
  fclose(f);
  return v;
}

static int fail(const char *what, int rc) {
  fprintf(stderr, "scale_probe: %s: %s (%s)\n", what, dcomm_error_name(rc), dcomm_last_error());
  return 1;
}

int main(void) {
  enum { T_INIT, T_FIRST, T_AR8, T_AR1M, T_GROUP, T_N };
  double t[T_N + 2];
  double t0 = now();
  int rc = dcomm_init(NULL, NULL);
  if (rc) return fail("dcomm_init", rc);
  t[T_INIT] = now() - t0;
  int me = dcomm_rank(), n = dcomm_world_size();

  t0 = now();
  if ((rc = dcomm_barrier(NULL))) return fail("barrier", rc);
  t[T_FIRST] = now() - t0;

  float small[2] = {1.0f, (float)me};
  t0 = now();
  if ((rc = dcomm_all_reduce(small, 2, DCOMM_FLOAT32, DCOMM_SUM, NULL))) return fail("all_reduce 8 B", rc);
  t[T_AR8] = now() - t0;
  if (small[0] != (float)n) return fail("all_reduce 8 B gave a wrong sum", 0);

  size_t count = (1u << 20) / sizeof(float);
  float *big = malloc(count * sizeof(float));
  if (!big) return 1;
  for (size_t i = 0; i < count; i++) big[i] = 1.0f;
  t0 = now();
  if ((rc = dcomm_all_reduce(big, count, DCOMM_FLOAT32, DCOMM_SUM, NULL))) return fail("all_reduce 1 MiB", rc);
  t[T_AR1M] = now() - t0;
  for (size_t i = 0; i < count; i += 4096)
    if (big[i] != (float)n) return fail("all_reduce 1 MiB gave a wrong sum", 0);
  free(big);

  int ne = (n + 1) / 2;
  int *even = malloc(sizeof(int) * (size_t)ne);
  if (!even) return 1;
  for (int i = 0; i < ne; i++) even[i] = 2 * i;
  dcomm_group_t g;
  t0 = now();
  if ((rc = dcomm_new_group(even, ne, &g))) return fail("new_group", rc);
  if (me % 2 == 0 && (rc = dcomm_barrier(g))) return fail("barrier on the even ranks", rc);
  t[T_GROUP] = now() - t0;
  free(even);

  t[T_N] = proc_open_fds();
  t[T_N + 1] = (double)rss_kib();
  if ((rc = dcomm_all_reduce(t, T_N + 2, DCOMM_FLOAT64, DCOMM_MAX, NULL))) return fail("all_reduce of the times", rc);
  if (me == 0)
    printf("scale ranks=%d init=%.3f first=%.3f ar8=%.4f ar1m=%.4f group=%.3f fds=%.0f rss_kib=%.0f\n", n, t[T_INIT],
           t[T_FIRST], t[T_AR8], t[T_AR1M], t[T_GROUP], t[T_N], t[T_N + 1]);
  dcomm_group_free(g);
  rc = dcomm_finalize();
  return rc ? fail("dcomm_finalize", rc) : 0;
}
