/*
 * train_loop.c: dcomm_elastic_run, the high-level training loop: restore
 * the newest committed checkpoint, run steps, checkpoint every N steps
 * (admitting members that wait to join at a checkpoint; a directory that
 * refuses one stops the run or, by DCOMM_CHECKPOINT_ON_ERROR, is skipped
 * until it takes one again), and on a
 * recoverable error go through the generation transition, restore and
 * resume.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_coll.h"
#include "dcomm_elastic.h"
#include "error.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "rounds.h"
#include "sock.h"
#include "store.h"
#include "world.h"

/* Restores the newest checkpoint; *next is the step to run next. */
static int restore(const dcomm_elastic_config_t *cfg, uint64_t *next) {
  void *data = NULL;
  size_t len = 0;
  uint64_t step = 0;
  *next = 0;
  if (!cfg->checkpoint_dir) return cfg->load ? cfg->load(NULL, 0, 0, cfg->user) : 0;
  int rc = dcomm_checkpoint_load(cfg->checkpoint_dir, &data, &len, &step);
  if (rc == DCOMM_ENOTFOUND) return cfg->load ? cfg->load(NULL, 0, 0, cfg->user) : 0;
  if (rc < 0) return rc;
  rc = cfg->load ? cfg->load(data, len, step, cfg->user) : 0;
  free(data);
  *next = step + 1;
  /* At the default level: which checkpoint a run goes on from is what an
   * operator asks first; and a run that has nothing left to do says so. */
  if (rc == 0 && dcomm_rank() == 0) {
    DCOMM_LOG(WARN, ELASTIC, "restored the checkpoint of step %" PRIu64 " from %s: resuming at step %" PRIu64, step,
              cfg->checkpoint_dir, step + 1);
    if (step + 1 >= cfg->total_steps)
      DCOMM_LOG(WARN, ELASTIC, "the restored checkpoint (step %" PRIu64 ") is at or past the %" PRIu64 " steps asked "
                "for: no step is left to run (a checkpoint directory of an earlier, longer run?)", step,
                cfg->total_steps);
  }
  return rc;
}

/* DCOMM_CHECKPOINT_ON_ERROR: 1 skip, 0 stop, < 0 a bad value. */
static int skip_policy(void) {
  const char *m = dcomm__param_str(DCOMM_P_CHECKPOINT_ON_ERROR);
  if (!m || !*m || !strcmp(m, "stop")) return 0;
  if (!strcmp(m, "skip")) return 1;
  return dcomm__err(DCOMM_EINVAL, "DCOMM_CHECKPOINT_ON_ERROR='%s' is not stop or skip", m);
}

/* Checkpoints in a row that the directory refused (skip policy), for the
 * message when it takes them again. */
struct save_state {
  int skip;
  uint64_t failed, first_failed;
};

static int save(const dcomm_elastic_config_t *cfg, uint64_t step, struct save_state *ss) {
  void *data = NULL;
  size_t len = 0;
  int32_t ok = 1;
  if (dcomm_rank() == 0 && cfg->save && cfg->save(&data, &len, cfg->user) < 0) ok = 0;
  /* Every rank learns whether there is anything to commit. */
  int rc = dcomm__control_bcast(&ok, sizeof(ok), "checkpoint save callback");
  if (rc == 0 && !ok) {
    DCOMM_LOG(WARN, ELASTIC, "save callback failed at step %" PRIu64 ": checkpoint skipped", step);
    free(data);
    return 0;
  }
  int storage = 0;
  if (rc == 0) rc = dcomm__checkpoint_save(cfg->checkpoint_dir, step, data, len, &storage);
  free(data);
  if (rc == 0 && ss->failed) {
    if (dcomm_rank() == 0)
      DCOMM_LOG(WARN, ELASTIC, "checkpoints to %s work again: step %" PRIu64 " committed after %" PRIu64
                " skipped (the first at step %" PRIu64 ")", cfg->checkpoint_dir, step, ss->failed, ss->first_failed);
    ss->failed = 0;
  }
  if (rc == 0 || !storage) return rc;
  /* The directory refused the checkpoint: nothing of it was committed and
   * the earlier ones are as they were. */
  char why[1024];
  snprintf(why, sizeof(why), "%s", dcomm_last_error());
  if (!ss->skip)
    return dcomm__err(rc, "%s; the checkpoints committed before stay readable (DCOMM_CHECKPOINT_ON_ERROR=skip trains "
                          "on and tries again at the next checkpoint)", why);
  if (!ss->failed++) ss->first_failed = step;
  if (dcomm_rank() == 0)
    DCOMM_LOG(WARN, ELASTIC, "%s; training goes on without it (DCOMM_CHECKPOINT_ON_ERROR=skip): a failure now "
              "resumes from an earlier checkpoint", why);
  return 0;
}

/* Rank 0 looks for members waiting to join the next generation; the answer
 * is broadcast so that every rank takes the same decision. 1: grow now. */
static int joiners_waiting(int *grow) {
  int32_t n = 0;
  *grow = 0;
  if (!dcomm__w.elastic) return 0;
  long max = dcomm__param_int(DCOMM_P_ELASTIC_MAX_WORLD);
  if (max > 0 && dcomm__w.size >= max) return 0; /* full: joiners keep waiting */
  if (dcomm_rank() == 0) {
    char key[96];
    int64_t v = 0;
    snprintf(key, sizeof(key), DCOMM_KEY_JOIN_N_FMT, dcomm__w.generation + 1);
    if (dcomm__store_add(dcomm__w.jstore, key, 0, &v) == 0) n = (int32_t)v;
    /* Spare nodes above --nnodes MAX wait for a place: a generation is
     * never ended for joiners the next round could not admit. */
    if (n > 0 && !dcomm__rounds_admissible(dcomm__w.jstore, dcomm__w.generation, dcomm__w.size, (int64_t)n)) n = 0;
  }
  DCOMM_CHECK(dcomm__control_bcast(&n, sizeof(n), "joiner check"));
  *grow = n > 0;
  return 0;
}

/* Why a scale-up ends the generation: the revoke notice that the first
 * member to recover posts says so (dcomm_elastic_recover writes its last
 * error into it). */
#define SCALE_UP_WHY "scale-up: admitting members that wait to join"

/* Whether this generation was revoked for a scale-up. The members that
 * learn it move on to the next generation at once and revoke this one, so
 * a member still inside the checkpoint's or the joiner check's broadcast
 * sees its communicator aborted: that is the scale-up, not a failure. */
static int revoked_for_scale_up(int rc) {
  char key[64], why[512];
  if (rc != DCOMM_EREVOKED || !dcomm__w.elastic) return 0;
  snprintf(key, sizeof(key), DCOMM_KEY_REVOKE_FMT, dcomm__w.generation);
  return dcomm__store_peek(dcomm__w.jstore, key, why, sizeof(why)) == 1 && strstr(why, SCALE_UP_WHY) != NULL;
}

/* The error a run ends with when it has used DCOMM_ELASTIC_MAX_RECOVERIES:
 * the failure's own message, and why it was not repaired. */
static int gave_up(int rc, long max_rec) {
  char why[512];
  snprintf(why, sizeof(why), "%s", dcomm_last_error());
  return dcomm__err(rc, "%s; not recovered: this run has recovered %ld times, the most DCOMM_ELASTIC_MAX_RECOVERIES "
                        "allows (raise it for a long job)",
                    why, max_rec);
}

int dcomm_elastic_run(const dcomm_elastic_config_t *cfg) {
  if (!cfg || cfg->size < sizeof(*cfg) || cfg->version != 1 || !cfg->step)
    return dcomm__err(DCOMM_EINVAL, "dcomm_elastic_run: config missing, of another version, or without a step callback");
  if (cfg->checkpoint_every && !cfg->checkpoint_dir)
    return dcomm__err(DCOMM_EINVAL, "dcomm_elastic_run: checkpoint_every without checkpoint_dir");
  long max_rec = dcomm__param_int(DCOMM_P_ELASTIC_MAX_RECOVERIES);
  struct save_state ss = {.skip = skip_policy()};
  if (ss.skip < 0) return ss.skip;
  uint64_t step;
  int rc = restore(cfg, &step);
  for (long recoveries = 0;;) {
    int grow = 0;
    while (rc == 0 && step < cfg->total_steps && !grow) {
      rc = cfg->step(step, cfg->user);
      if (rc == 0 && cfg->checkpoint_every && ((step + 1) % cfg->checkpoint_every == 0 || step + 1 == cfg->total_steps)) {
        rc = save(cfg, step, &ss);
        /* Scale up at a checkpoint: joiners enter the next generation. */
        if (rc == 0 && step + 1 < cfg->total_steps) rc = joiners_waiting(&grow);
      }
      if (rc == 0) step++;
    }
    if (rc == 0 && !grow) {
      /* Tell members still waiting to join that there is nothing to join. */
      if (dcomm__w.elastic && dcomm_rank() == 0) dcomm__store_set(dcomm__w.jstore, DCOMM_KEY_DONE, "1", 2);
      return 0;
    }
    if (!grow && revoked_for_scale_up(rc)) grow = 1;
    if (grow) {
      dcomm__err(0, SCALE_UP_WHY);
    } else if (!dcomm_elastic_recoverable(rc) || !dcomm__w.elastic) {
      return rc;
    } else if (recoveries >= max_rec) {
      return gave_up(rc, max_rec);
    }
    if (!grow) recoveries++;
    double t0 = dcomm__now();
    struct dcomm_membership_change ch = {.old_world_size = dcomm__w.size, .old_rank = dcomm__w.rank, .error = rc};
    if (grow) DCOMM_LOG(INFO, ELASTIC, "members wait to join: moving to the next generation at step %" PRIu64, step);
    else DCOMM_LOG(WARN, ELASTIC, "failure detected at step %" PRIu64 ": %s", step, dcomm_last_error());
    int err;
    for (;;) { /* another member may fail during the recovery itself */
      err = dcomm_elastic_recover();
      if (err == 0) err = restore(cfg, &step);
      if (err == 0 || !dcomm_elastic_recoverable(err) || recoveries >= max_rec) break;
      recoveries++;
      DCOMM_LOG(WARN, ELASTIC, "recovery failed (%s): trying again", dcomm_last_error());
    }
    if (err < 0) return dcomm_elastic_recoverable(err) && recoveries >= max_rec ? gave_up(err, max_rec) : err;
    ch.new_world_size = dcomm__w.size;
    ch.new_rank = dcomm__w.rank;
    ch.generation = dcomm__w.generation;
    ch.recovery_seconds = dcomm__now() - t0;
    ch.resume_step = step;
    DCOMM_LOG(INFO, ELASTIC, "recovered in %.3f s: world %d -> %d, generation %ld, resuming at step %" PRIu64,
              ch.recovery_seconds, ch.old_world_size, ch.new_world_size, ch.generation, step);
    if (cfg->on_membership_change) cfg->on_membership_change(&ch, cfg->user);
    rc = 0;
  }
}
