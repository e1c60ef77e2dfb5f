/*
 * tests/perf/wait_cpu.c: how much CPU a rank burns while it waits. Every
 * rank but the last enters a barrier at once; the last one sleeps 2 s
 * first. Each waiting rank prints the CPU time (user + system, getrusage)
 * its barrier cost against the wall time it waited. Public API only; run it
 * under dcomm-run, e.g.
 *   cc -O2 -I include tests/perf/wait_cpu.c -L .libs -ldcomm -Wl,-rpath,$PWD/.libs -o /tmp/wait_cpu
 *   ./dcomm-run --nproc-per-node 4 -- /tmp/wait_cpu
 */
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "dcomm.h"

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
  int rc = dcomm_init(NULL, NULL);
  if (rc) {
    fprintf(stderr, "wait_cpu: dcomm_init: %s\n", dcomm_last_error());
    return 1;
  }
  int r = dcomm_rank(), n = dcomm_world_size();
  if (dcomm_barrier(NULL)) return 1;
  if (r == n - 1) sleep(2);
  double c0 = cpu_s(), w0 = wall_s();
  if (dcomm_barrier(NULL)) return 1;
  double c1 = cpu_s(), w1 = wall_s();
  if (r != n - 1)
    printf("rank %d: waited %.3f s in the barrier, used %.1f ms of CPU (%.2f%% of a core)\n", r, w1 - w0,
           (c1 - c0) * 1e3, 100 * (c1 - c0) / (w1 - w0));
  dcomm_finalize();
  return 0;
}
