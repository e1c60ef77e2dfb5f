/*
 * slurm_env.c: reads the task environment srun sets (SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID, tasks per node, node lists, job and step
 * ids) into the slurm:// init facts, and detects PBS. See slurm_env.h.
 */
#include "config.h"
#include "slurm_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hostlist.h"
#include "param.h"

int dcomm__slurm_detect(void) {
  const char *v = getenv("SLURM_PROCID");
  return v && *v;
}

int dcomm__pbs_detect(void) {
  const char *v = getenv("PBS_JOBID");
  return v && *v;
}

/* First of the names that is set (non-empty); *which is its name. */
static const char *env_first(const char *const *names, const char **which) {
  for (int i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) {
      *which = names[i];
      return v;
    }
  }
  *which = names[0];
  return NULL;
}

/* A required integer in [lo, hi] from the first set of names. */
static int env_req(const char *const *names, long lo, long hi, long *out) {
  const char *which;
  const char *v = env_first(names, &which);
  long l;
  if (!v) return dcomm__err(DCOMM_EINVAL, "slurm://: %s is not set (not a task started by srun?)", which);
  if (dcomm__parse_long(v, &l) || l < lo || l > hi)
    return dcomm__err(DCOMM_EINVAL, "slurm://: %s='%s' is not an integer in [%ld, %ld]", which, v, lo, hi);
  *out = l;
  return 0;
}

/* Entry `node` of a tasks-per-node list ("4(x2),3,2"). 0, or DCOMM_EINVAL
 * naming var (malformed, or fewer entries than node + 1). */
static int tasks_per_node(const char *var, const char *v, long node, long *out) {
  const char *p = v;
  long seen = 0;
  for (;;) {
    char *end;
    long n = strtol(p, &end, 10), rep = 1;
    if (end == p || n < 1 || n > 1 << 24) goto bad;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') goto bad;
      rep = strtol(p + 2, &end, 10);
      if (end == p + 2 || rep < 1 || rep > 1 << 24 || *end != ')') goto bad;
      p = end + 1;
    }
    if (node < seen + rep) {
      *out = n;
      return 0;
    }
    seen += rep;
    if (*p == 0) break;
    if (*p != ',') goto bad;
    p++;
  }
  return dcomm__err(DCOMM_EINVAL, "slurm://: %s='%s' lists %ld nodes, but SLURM_NODEID is %ld", var, v, seen, node);
bad:
  return dcomm__err(DCOMM_EINVAL, "slurm://: %s='%s' is not a tasks-per-node list like '4(x2),3'", var, v);
}

/* The port both rank 0 and the others compute. */
static int store_port(int *port) {
  const char *v = dcomm__param_by_name("DCOMM_STORE_PORT");
  long l;
  if (v && *v && strcmp(v, "0") != 0) {
    if (dcomm__parse_long(v, &l) || l < 1 || l > 65535)
      return dcomm__err(DCOMM_EINVAL, "DCOMM_STORE_PORT='%s' is not a port number (1-65535)", v);
    *port = (int)l;
    return 0;
  }
  static const char *const job_names[] = {"SLURM_JOB_ID", "SLURM_JOBID", NULL};
  static const char *const step_names[] = {"SLURM_STEP_ID", "SLURM_STEPID", NULL};
  long job, step;
  DCOMM_CHECK(env_req(job_names, 0, 4294967295L, &job));
  DCOMM_CHECK(env_req(step_names, 0, 4294967295L, &step));
  unsigned long long h = (unsigned long long)job * 31ull + (unsigned long long)step;
  *port = 20000 + (int)(h % 20000ull);
  return 0;
}

int dcomm__slurm_spec(int *rank, int *size, int *local_rank, int *local_size, char *host, size_t hl, int *port) {
  static const char *const procid[] = {"SLURM_PROCID", NULL};
  static const char *const ntasks[] = {"SLURM_NTASKS", "SLURM_NPROCS", NULL};
  static const char *const localid[] = {"SLURM_LOCALID", NULL};
  static const char *const nodeid[] = {"SLURM_NODEID", NULL};
  long r = 0, n = 0, lr = 0, ls = 0, node = 0;
  const char *which, *v;

  DCOMM_CHECK(env_req(procid, 0, 1 << 24, &r));
  DCOMM_CHECK(env_req(ntasks, 1, 1 << 24, &n));
  if (r >= n) return dcomm__err(DCOMM_EINVAL, "slurm://: SLURM_PROCID=%ld is not below SLURM_NTASKS=%ld", r, n);
  DCOMM_CHECK(env_req(localid, 0, 1 << 24, &lr));
  if (getenv("SLURM_NODEID") && *getenv("SLURM_NODEID")) DCOMM_CHECK(env_req(nodeid, 0, 1 << 24, &node));

  if ((v = getenv("SLURM_NTASKS_PER_NODE")) && *v) {
    static const char *const tpn[] = {"SLURM_NTASKS_PER_NODE", NULL};
    DCOMM_CHECK(env_req(tpn, 1, 1 << 24, &ls));
    which = "SLURM_NTASKS_PER_NODE";
  } else {
    static const char *const tpn[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", NULL};
    v = env_first(tpn, &which);
    if (!v)
      return dcomm__err(DCOMM_EINVAL, "slurm://: neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set");
    DCOMM_CHECK(tasks_per_node(which, v, node, &ls));
  }
  if (ls > n)
    return dcomm__err(DCOMM_EINVAL, "slurm://: %s gives %ld tasks on this node, more than SLURM_NTASKS=%ld", which, ls,
                      n);
  if (lr >= ls)
    return dcomm__err(DCOMM_EINVAL, "slurm://: SLURM_LOCALID=%ld is not below %s's %ld tasks on this node", lr, which,
                      ls);

  static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL};
  const char *list = env_first(lists, &which);
  if (!list) return dcomm__err(DCOMM_EINVAL, "slurm://: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set");
  int rc = dcomm__hostlist_first(list, host, hl);
  if (rc < 0) return dcomm__err_ctx(rc, "slurm://: %s", which);
  /* Task 0 hosts the store on the first node: with another task layout it
   * would listen where nobody looks. */
  const char *me = getenv("SLURMD_NODENAME");
  if (r == 0 && me && *me && strcmp(me, host) != 0)
    return dcomm__err(DCOMM_EINVAL,
                      "slurm://: task 0 runs on SLURMD_NODENAME=%s, not on %s, the first node of %s (use a block "
                      "task distribution, or env:// / pmix://)",
                      me, host, which);
  DCOMM_CHECK(store_port(port));
  *rank = (int)r;
  *size = (int)n;
  *local_rank = (int)lr;
  *local_size = (int)ls;
  return 0;
}
