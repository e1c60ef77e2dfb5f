/*
 * fuzz_init_method.c: fuzz target for init-method URLs and the launcher
 * environment they read (src/init/init_method.c, pmix/slurm_env.c): the
 * input is NUL-separated fields, the URL first, then values for
 * torchrun's, SLURM's and dcomm-run's variables in the order of `vars`
 * (a missing field leaves the variable unset). A parse must either fail
 * with an error message or give a spec whose numbers are in range.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "fuzz_util.h"
#include "init_method.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const vars[] = {
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID",
    "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURMD_NODENAME",
    "DCOMM_STORE_PORT", "DCOMM_AGENT_STORE", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_NODELIST",
    "SLURM_JOBID", "SLURM_STEPID"};
#define NVARS ((int)(sizeof(vars) / sizeof(vars[0])))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 8192) return 0;
  char *f[NVARS + 1];
  int n = fuzz_fields(data, size, f, NVARS + 1);
  for (int i = 0; i < NVARS; i++) {
    if (i + 1 < n) setenv(vars[i], f[i + 1], 1);
    else unsetenv(vars[i]);
  }
  struct dcomm_init_spec spec;
  /* An empty URL means "detect from the environment". */
  int rc = dcomm__init_spec_parse(f[0], &spec);
  if (rc < 0) {
    if (!*dcomm_last_error()) abort(); /* every refusal says why */
  } else if (spec.kind != DCOMM_IM_PMIX) { /* pmix:// learns its numbers from the server later */
    if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size) abort();
    if (spec.local_size < 1 || spec.local_rank < 0 || spec.local_rank >= spec.local_size) abort();
    if (spec.port < 0 || spec.port > 65535) abort();
    if (!memchr(spec.host, 0, sizeof(spec.host)) || !memchr(spec.path, 0, sizeof(spec.path))) abort();
  }
  fuzz_fields_free(f, n);
  return 0;
}
