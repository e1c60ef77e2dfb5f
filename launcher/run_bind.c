/*
 * run_bind.c: which processor dcomm-run binds a worker to (--bind-to). Like
 * mpirun's default, "auto" binds each worker to a processor of its own when
 * every worker of this node gets one, and binds nobody when they do not fit
 * (binding would then stack workers on processors the scheduler could have
 * balanced). Unbound ranks that spin on shared-memory rings can be put on
 * one processor by the scheduler and take turns, which multiplies small
 * message latency; bound ones never share.
 */
#include "config.h"
#include "run.h"

#include <sched.h>

int run_bind_cpu(enum run_bind mode, int nproc, int local_rank) {
  cpu_set_t allowed;
  if (mode == RUN_BIND_NONE || local_rank < 0) return -1;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  int n = CPU_COUNT(&allowed);
  if (n <= 0 || (mode == RUN_BIND_AUTO && nproc > n)) return -1;
  int want = local_rank % n; /* --bind-to core with more workers than processors: round robin */
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &allowed) && want-- == 0) return cpu;
  return -1;
}
