/*
 * elastic_sgd.c: the elastic demo. Deterministic data-parallel linear
 * regression on synthetic data: every step takes a fixed global batch,
 * split over whichever ranks are alive, all_reduces the gradient, runs one
 * extra collective on a sub-group (even / odd world ranks), and checkpoints
 * every K steps. Run it under dcomm-run; --kill-rank R --kill-at-step S
 * makes that rank SIGKILL itself once, to show the job going on
 * (several ranks, "1,3", die together, right after that step's all_reduce,
 * once all of them got there: they meet through files beside the
 * checkpoint folder;
 * --kill-in-save 1: inside rank 0's checkpoint save of that step;
 * --kill-in-recovery R: rank R of the rebuilt world dies during recovery).
 * The kills happen in the first life of the job only: generation 0 with
 * DCOMM_RESTART_COUNT unset or 0 (a batch script that reruns the job sets
 * it). --done-file F: rank 0 writes the final line to F when it finished.
 * --sleep-ms MS --pace-file F: sleep MS per step only while F exists (a
 * soak removes F to let the job run to its end at full speed).
 * --named-parity 1: the parity groups are made with dcomm_new_group_named
 * ("even", "odd"), each by its own members only.
 *
 *   dcomm-run --nproc-per-node 4 -- examples/elastic_sgd --steps 200 \
 *       --checkpoint-every 10 --checkpoint-dir /tmp/ckpt --kill-rank 2 --kill-at-step 57
 *
 * Because the batch is fixed and the reduction is in float64, the final
 * loss of a run with failures matches the failure-free run to ~1e-12.
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm.h"
#include "dcomm_elastic.h"

#define DIM 16
#define BATCH 240 /* samples per step, for any world size */

struct state {
  double w[DIM];
  double loss;
  uint64_t step;
};

struct app {
  struct state st;
  long steps; /* --steps */
  dcomm_group_t parity; /* even / odd world ranks of generation 0 */
  int has_parity;       /* a member that joined later has no such group */
  int named_parity;     /* made with dcomm_new_group_named on its members */
  double lr;
  int kill[16], nkill; /* --kill-rank A,B,...: the ranks that die at kill_at */
  long kill_at;
  int kill_in_save;     /* die inside the checkpoint save instead */
  int kill_in_recovery; /* this rank (of the new world) dies while recovering */
  int every;
  int sleep_ms; /* per step, to make room for a demo's SIGSTOP */
  const char *pace_file; /* if set, sleep_ms applies only while this file exists */
  int slow_rank, slow_ms; /* this rank computes slowly at the kill step */
  const char *done_file;  /* rank 0 writes the final line here when the job finished */
  const char *dir;        /* the checkpoint folder */
};

/* Sample i of the stream: features and target from a fixed generator. */
static double feature(uint64_t i, int d) {
  if (d == 0) return 1.0; /* the bias */
  uint64_t x = i * 6364136223846793005ull + (uint64_t)d * 1442695040888963407ull + 1;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (double)(x % 20001) / 10000.0 - 1.0;
}

static double target(uint64_t i) {
  double y = 0.5;
  for (int d = 0; d < DIM; d++) y += (d % 3 - 1) * 0.7 * feature(i, d) + 0.01 * d;
  return y;
}

/* The demo's failure injection: only the first incarnation of the job
 * (its first world, not a restart or a joiner) dies. */
static long first_generation = -1;
static int first_life(void) {
  const char *rc = getenv("DCOMM_RESTART_COUNT");
  return dcomm_generation() == first_generation && !dcomm_elastic_is_joiner() && (!rc || !strcmp(rc, "0"));
}

/* --kill-rank's comma-separated list, parsed once. */
static void parse_kill_list(struct app *a, const char *list) {
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", list);
  a->nkill = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && a->nkill < 16; t = strtok_r(NULL, ",", &save))
    a->kill[a->nkill++] = atoi(t);
}

static int marked(const struct app *a, int rank) {
  for (int i = 0; i < a->nkill; i++)
    if (a->kill[i] == rank) return 1;
  return 0;
}

/* Ranks that die together first meet outside dcomm: each leaves a file
 * beside the checkpoint folder and waits (10 s at most) for the files of
 * the others. A marked rank that died at once could break a collective
 * that another marked rank, slower, has not finished yet: that one would
 * then see the failure and live on instead of dying. */
static void meet_marked(const struct app *a, uint64_t step) {
  char path[4096];
  snprintf(path, sizeof(path), "%s.kill-%llu-%d", a->dir, (unsigned long long)step, dcomm_rank());
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
  for (int waited = 0; waited < 10000; waited++) {
    int all = 1;
    for (int i = 0; i < a->nkill && all; i++) {
      snprintf(path, sizeof(path), "%s.kill-%llu-%d", a->dir, (unsigned long long)step, a->kill[i]);
      all = access(path, F_OK) == 0;
    }
    if (all) return;
    usleep(1000);
  }
}

static void maybe_die(struct app *a, uint64_t step, const char *where) {
  if ((long)step == a->kill_at && first_life() && marked(a, dcomm_rank())) {
    if (a->dir && !a->kill_in_save && a->nkill > 1) meet_marked(a, step);
    fprintf(stderr, "rank %d: killing myself at step %llu (%s)\n", dcomm_rank(), (unsigned long long)step, where);
    raise(SIGKILL);
  }
}

static int step_fn(uint64_t step, void *user) {
  struct app *a = user;
  int rank = dcomm_rank(), size = dcomm_world_size();
  /* Several ranks marked die together: after the step's world all_reduce,
   * which every rank reaches, so none of them is still finishing the step
   * before when the first death revokes the generation; and only once all
   * of them finished it (meet_marked). */
  int together = a->nkill > 1;
  if (!a->kill_in_save && !together) maybe_die(a, step, "--kill-rank");
  if (a->sleep_ms > 0 && (!a->pace_file || access(a->pace_file, F_OK) == 0)) usleep((useconds_t)a->sleep_ms * 1000);
  if (a->slow_rank == rank && (long)step == a->kill_at && first_life()) usleep((useconds_t)a->slow_ms * 1000);
  /* This rank's share of the step's batch. */
  int lo = BATCH * rank / size, hi = BATCH * (rank + 1) / size;
  double g[DIM + 2] = {0}; /* gradient, loss sum, sample count */
  for (int s = lo; s < hi; s++) {
    uint64_t i = step * BATCH + (uint64_t)s;
    double pred = 0;
    for (int d = 0; d < DIM; d++) pred += a->st.w[d] * feature(i, d);
    double err = pred - target(i);
    for (int d = 0; d < DIM; d++) g[d] += 2 * err * feature(i, d);
    g[DIM] += err * err;
    g[DIM + 1] += 1;
  }
  int rc = dcomm_all_reduce(g, DIM + 2, DCOMM_FLOAT64, DCOMM_SUM, NULL);
  if (rc < 0) return rc;
  if (!a->kill_in_save && together) maybe_die(a, step, "--kill-rank, together");
  if (g[DIM + 1] != BATCH) {
    fprintf(stderr, "rank %d: the batch was not covered (%g samples)\n", rank, g[DIM + 1]);
    return DCOMM_EINVAL;
  }
  /* The extra sub-group collective: each parity group counts its samples,
   * checked against the shares of the members the group says it has. */
  double mine = hi - lo;
  if (a->has_parity && dcomm_group_rank(a->parity) >= 0) {
    rc = dcomm_all_reduce(&mine, 1, DCOMM_FLOAT64, DCOMM_SUM, a->parity);
    if (rc < 0) return rc;
    double want = 0;
    for (int i = 0; i < dcomm_group_size(a->parity); i++) {
      int r = dcomm_group_world_rank(a->parity, i);
      want += BATCH * (r + 1) / size - BATCH * r / size;
    }
    if (mine != want) {
      fprintf(stderr, "rank %d: the parity group counted %g samples, its members hold %g\n", rank, mine, want);
      return DCOMM_EINVAL;
    }
  }
  for (int d = 0; d < DIM; d++) a->st.w[d] -= a->lr * g[d] / BATCH;
  a->st.loss = g[DIM] / BATCH;
  a->st.step = step;
  if (rank == 0 && (step % 10 == 0))
    printf("step=%llu world=%d generation=%ld loss=%.12g\n", (unsigned long long)step, size, dcomm_generation(),
           a->st.loss);
  return 0;
}

static int save_fn(void **data, size_t *len, void *user) {
  struct app *a = user;
  if (a->kill_in_save) maybe_die(a, a->st.step, "--kill-in-save");
  *data = malloc(sizeof(a->st));
  if (!*data) return DCOMM_ENOMEM;
  memcpy(*data, &a->st, sizeof(a->st));
  *len = sizeof(a->st);
  return 0;
}

static int load_fn(const void *data, size_t len, uint64_t step, void *user) {
  struct app *a = user;
  if (!data) {
    memset(&a->st, 0, sizeof(a->st));
    return 0;
  }
  if (len != sizeof(a->st)) return DCOMM_EINVAL;
  memcpy(&a->st, data, len);
  if (dcomm_rank() == 0 && step + 1 >= (uint64_t)a->steps)
    fprintf(stderr, "elastic_sgd: warning: the checkpoint restored from the directory is of step %llu, at or past the "
            "%ld steps asked for (--steps): nothing is left to run\n", (unsigned long long)step, a->steps);
  return 0;
}

static void changed(const struct dcomm_membership_change *c, void *user) {
  struct app *a = user;
  if (c->generation == first_generation + 1 && a->kill_in_recovery == dcomm_rank() && !dcomm_elastic_is_joiner()) {
    fprintf(stderr, "rank %d: killing myself during recovery (--kill-in-recovery)\n", dcomm_rank());
    raise(SIGKILL);
  }
  if (dcomm_rank() == 0)
    printf("%s: world %d -> %d, generation %ld, in %.3f s, resuming at step %llu (%s)\n",
           c->error ? "recovered" : "scaled up", c->old_world_size, c->new_world_size, c->generation,
           c->recovery_seconds, (unsigned long long)c->resume_step,
           c->error ? dcomm_error_name(c->error) : "members joined at a checkpoint");
  fflush(stdout);
}

static void usage(void) {
  fprintf(stderr,
          "usage: elastic_sgd --steps N --checkpoint-every K --checkpoint-dir DIR [--lr X]\n"
          "                   [--kill-rank R[,R...] --kill-at-step S [--kill-in-save 1]] [--kill-in-recovery R]\n"
          "                   [--sleep-ms MS [--pace-file F]] [--slow-rank R --slow-ms MS] [--done-file FILE] [--named-parity 1]\n");
  exit(2);
}

int main(int argc, char **argv) {
  struct app a = {.lr = 0.05, .kill_at = -1, .kill_in_recovery = -1, .slow_rank = -1};
  long steps = 100;
  const char *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage();
    if (!strcmp(argv[i], "--steps")) steps = atol(argv[++i]);
    else if (!strcmp(argv[i], "--checkpoint-every")) a.every = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--checkpoint-dir")) dir = argv[++i];
    else if (!strcmp(argv[i], "--lr")) a.lr = atof(argv[++i]);
    else if (!strcmp(argv[i], "--sleep-ms")) a.sleep_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--pace-file")) a.pace_file = argv[++i];
    else if (!strcmp(argv[i], "--slow-rank")) a.slow_rank = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--slow-ms")) a.slow_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--kill-rank")) parse_kill_list(&a, argv[++i]);
    else if (!strcmp(argv[i], "--kill-in-save")) a.kill_in_save = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--kill-in-recovery")) a.kill_in_recovery = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--kill-at-step")) a.kill_at = atol(argv[++i]);
    else if (!strcmp(argv[i], "--done-file")) a.done_file = argv[++i];
    else if (!strcmp(argv[i], "--named-parity")) a.named_parity = atoi(argv[++i]);
    else usage();
  }
  if (steps <= 0 || (a.every > 0 && !dir)) usage();
  a.dir = dir;
  setvbuf(stdout, NULL, _IOLBF, 0);
  int rc = dcomm_init(NULL, NULL);
  if (rc == DCOMM_ENOTMEMBER) { /* a joiner the job finished without */
    fprintf(stderr, "elastic_sgd: %s\n", dcomm_last_error());
    return 0;
  }
  if (rc < 0) {
    fprintf(stderr, "elastic_sgd: dcomm_init: %s: %s\n", dcomm_error_name(rc), dcomm_last_error());
    return 1;
  }
  /* The sub-group lives across generations: recovery rebuilds it from its
   * members' ids, shrinking it when members die. A joiner was not there
   * when it was made, so it is not in it. */
  first_generation = dcomm_generation();
  if (!dcomm_elastic_is_joiner()) {
    if (a.named_parity) {
      /* Only this rank's own parity group, as torch creates a group's
       * backend on its members alone. */
      int list[64], n = 0;
      for (int r = dcomm_rank() % 2; r < dcomm_world_size() && n < 64; r += 2) list[n++] = r;
      rc = dcomm_new_group_named(dcomm_rank() % 2 ? "odd" : "even", list, n, &a.parity);
    } else {
      rc = dcomm_group_split(NULL, dcomm_rank() % 2, 0, &a.parity);
    }
    if (rc < 0) {
      fprintf(stderr, "elastic_sgd: parity group: %s\n", dcomm_last_error());
      return 1;
    }
    a.has_parity = 1;
  }
  dcomm_elastic_config_t cfg = DCOMM_ELASTIC_CONFIG_INIT;
  a.steps = steps;
  cfg.total_steps = (uint64_t)steps;
  cfg.checkpoint_every = (uint64_t)a.every;
  cfg.checkpoint_dir = dir;
  cfg.step = step_fn;
  cfg.save = save_fn;
  cfg.load = load_fn;
  cfg.on_membership_change = changed;
  cfg.user = &a;
  rc = dcomm_elastic_run(&cfg);
  if (rc < 0) {
    fprintf(stderr, "elastic_sgd: rank %d: %s: %s\n", dcomm_rank(), dcomm_error_name(rc), dcomm_last_error());
    dcomm_finalize();
    return 1;
  }
  if (dcomm_rank() == 0) {
    char line[160];
    snprintf(line, sizeof(line), "final step=%llu world=%d generation=%ld loss=%.12g\n",
             (unsigned long long)a.st.step + 1, dcomm_world_size(), dcomm_generation(), a.st.loss);
    fputs(line, stdout);
    /* A batch script that reruns the job stops when this file exists. */
    FILE *f = a.done_file ? fopen(a.done_file, "w") : NULL;
    if (f) {
      fputs(line, f);
      fclose(f);
    } else if (a.done_file) {
      fprintf(stderr, "elastic_sgd: cannot write %s\n", a.done_file);
    }
  }
  dcomm_finalize();
  return 0;
}
