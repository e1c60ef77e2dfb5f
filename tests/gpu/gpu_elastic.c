/*
 * gpu_elastic.c: a kill-one-rank recovery of the nccl backend through the
 * whole elastic layer, for tests/gpu/run.sh (one process per GPU under
 * dcomm-run, DCOMM_BACKEND=nccl). dcomm_elastic_run drives 60 steps with a
 * checkpoint every 5; each step all_reduces a device buffer on the world
 * and on a sub-group (split by parity), and checks both sums against the
 * current sizes, so a rebuilt communicator that lost or kept a rank wrongly
 * fails the step (a non-recoverable error ends the run). Rank KILL_RANK
 * SIGKILLs itself at step 23 of generation 0; the survivors recover
 * (ncclCommShrink when DCOMM_ELASTIC_SHRINK allows it), restore the
 * checkpoint through the store (the nccl backend takes device memory only)
 * and finish. Rank 0 prints "final step=S world=W generation=G sum=X".
 *   gpu_elastic CKPT_DIR KILL_RANK   (KILL_RANK -1: no failure)
 */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "dcomm_elastic.h"

#define N 1024

struct state {
  uint64_t step;
  double sum; /* of every world all_reduce result so far */
};

struct app {
  struct state st;
  int kill_rank;
  float *d, h[N];
  dcomm_group_t parity;
};

/* Sum of value over the members of g: each puts 1 + its parity. */
static int reduce_check(struct app *a, dcomm_group_t g, float each, float want) {
  for (int i = 0; i < N; i++) a->h[i] = each;
  if (cudaMemcpy(a->d, a->h, sizeof(a->h), cudaMemcpyHostToDevice) != cudaSuccess) return DCOMM_EBACKEND;
  int rc = dcomm_all_reduce(a->d, N, DCOMM_FLOAT32, DCOMM_SUM, g);
  if (rc < 0) return rc;
  if (cudaMemcpy(a->h, a->d, sizeof(a->h), cudaMemcpyDeviceToHost) != cudaSuccess) return DCOMM_EBACKEND;
  for (int i = 0; i < N; i++)
    if (a->h[i] != want) {
      fprintf(stderr, "gpu_elastic: rank %d: element %d is %g, want %g\n", dcomm_rank(), i, a->h[i], want);
      return DCOMM_EPROTO; /* not recoverable: the run ends */
    }
  return 0;
}

static int step_fn(uint64_t step, void *user) {
  struct app *a = user;
  if (step == 23 && dcomm_generation() == 0 && dcomm_rank() == a->kill_rank) {
    fprintf(stderr, "gpu_elastic: rank %d: SIGKILL at step 23\n", a->kill_rank);
    raise(SIGKILL);
  }
  int np = dcomm_world_size();
  int rc = reduce_check(a, NULL, 1.0f, (float)np);
  if (rc < 0) return rc;
  if (dcomm_group_rank(a->parity) >= 0) {
    rc = reduce_check(a, a->parity, 1.0f, (float)dcomm_group_size(a->parity));
    if (rc < 0) return rc;
  }
  a->st.sum += np;
  a->st.step = step;
  return 0;
}

static int save_fn(void **data, size_t *len, void *user) {
  struct app *a = user;
  if (!(*data = malloc(sizeof(a->st)))) return DCOMM_ENOMEM;
  memcpy(*data, &a->st, sizeof(a->st));
  *len = sizeof(a->st);
  return 0;
}

static int load_fn(const void *data, size_t len, uint64_t step, void *user) {
  struct app *a = user;
  (void)step;
  if (!data) {
    memset(&a->st, 0, sizeof(a->st));
    return 0;
  }
  if (len != sizeof(a->st)) return DCOMM_EINVAL;
  memcpy(&a->st, data, len);
  return 0;
}

static void changed(const struct dcomm_membership_change *c, void *user) {
  (void)user;
  if (dcomm_rank() == 0)
    printf("recovered: world %d -> %d, generation %ld, in %.3f s, resuming at step %llu (%s)\n", c->old_world_size,
           c->new_world_size, c->generation, c->recovery_seconds, (unsigned long long)c->resume_step,
           dcomm_error_name(c->error));
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: gpu_elastic CKPT_DIR KILL_RANK\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct app a = {.kill_rank = atoi(argv[2])};
  int rc = dcomm_init("nccl", NULL);
  if (rc < 0) {
    fprintf(stderr, "gpu_elastic: dcomm_init: %s: %s\n", dcomm_error_name(rc), dcomm_last_error());
    return 1;
  }
  if (cudaMalloc((void **)&a.d, sizeof(a.h)) != cudaSuccess) {
    fprintf(stderr, "gpu_elastic: cudaMalloc failed\n");
    return 1;
  }
  if ((rc = dcomm_group_split(NULL, dcomm_rank() % 2, 0, &a.parity)) < 0) {
    fprintf(stderr, "gpu_elastic: split: %s\n", dcomm_last_error());
    return 1;
  }
  dcomm_elastic_config_t cfg = DCOMM_ELASTIC_CONFIG_INIT;
  cfg.total_steps = 60;
  cfg.checkpoint_every = 5;
  cfg.checkpoint_dir = argv[1];
  cfg.step = step_fn;
  cfg.save = save_fn;
  cfg.load = load_fn;
  cfg.on_membership_change = changed;
  cfg.user = &a;
  rc = dcomm_elastic_run(&cfg);
  if (rc < 0) {
    fprintf(stderr, "gpu_elastic: rank %d: %s: %s\n", dcomm_rank(), dcomm_error_name(rc), dcomm_last_error());
    dcomm_finalize();
    return 1;
  }
  if (dcomm_rank() == 0)
    printf("final step=%llu world=%d generation=%ld sum=%.0f\n", (unsigned long long)a.st.step + 1, dcomm_world_size(),
           dcomm_generation(), a.st.sum);
  cudaFree(a.d);
  dcomm_finalize();
  return 0;
}
