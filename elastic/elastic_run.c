/*
 * elastic_run.c: barrier-synchronized, fenced rank-0 checkpoints and the
 * high-level training loop dcomm_elastic_run (step, save and load
 * callbacks; recovery and restore on failure).
 *
 * A checkpoint counts once it is committed: rank 0 writes the file, then
 * sets its record (checkpoint.h) under ckpt/commit/<hash of the directory>
 * in the job's store with a guarded write (in elastic mode: elastic/gen
 * still holds this generation and it is not revoked), then adds the record
 * to the directory's COMMITTED list. A fenced rank 0 (its generation ended
 * while it was frozen or cut off) fails the guarded write, so its file is
 * never restored. Restore reads the store's record and the directory's
 * list, never "the newest file".
 */
#include "config.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "dcomm_elastic.h"
#include "error.h"
#include "log.h"
#include "param.h"
#include "runtime.h"
#include "sock.h"
#include "store.h"

/* The store key of a directory's commit record (its real path hashed, so
 * that "ckpt" and "./ckpt" name one record). */
static void commit_key(const char *dir, char *key, size_t n) {
  char real[PATH_MAX];
  const char *p = realpath(dir, real) ? real : dir;
  snprintf(key, n, "ckpt/commit/%016llx", (unsigned long long)dcomm__hash64(0, p, strlen(p)));
}

/* Sets the record in the job's store, guarded by this generation's
 * authority: DCOMM_EREVOKED when this process was fenced. */
static int store_commit(const char *dir, const struct dcomm_ckpt_rec *rec) {
  struct dcomm_world *w = &dcomm__w;
  char key[64], text[DCOMM_CKPT_REC_TEXT], g[32], rkey[64];
  int tl = dcomm__ckpt_rec_format(rec, text, sizeof(text));
  if (tl < 0) return tl;
  commit_key(dir, key, sizeof(key));
  struct dcomm_store_cmp cmps[2];
  int nc = 0;
  if (w->elastic) {
    int gl = snprintf(g, sizeof(g), "%ld", w->generation);
    snprintf(rkey, sizeof(rkey), "elastic/revoke/%ld", w->generation);
    cmps[nc++] = (struct dcomm_store_cmp){"elastic/gen", DCOMM_STORE_EQUAL, g, (size_t)gl + 1};
    cmps[nc++] = (struct dcomm_store_cmp){rkey, DCOMM_STORE_ABSENT, NULL, 0};
  }
  struct dcomm_store_put put = {key, text, (size_t)tl + 1};
  int done = 0;
  DCOMM_CHECK(dcomm__store_set_prefix(w->store, ""));
  int rc = dcomm__store_txn(w->store, cmps, nc, &put, 1, &done);
  int prc = dcomm__world_prefix(w);
  if (rc < 0) return rc;
  if (prc < 0) return prc;
  if (!done)
    return dcomm__err(DCOMM_EREVOKED, "fenced: generation %ld is over (revoked, or the job moved on while this "
                      "process was frozen or cut off), so %s/%s is not committed and will never be restored",
                      w->generation, dir, rec->name);
  return 0;
}

/* The store's record for dir: 1 found, 0 none. */
static int store_record(const char *dir, struct dcomm_ckpt_rec *rec) {
  struct dcomm_world *w = &dcomm__w;
  char key[64];
  void *val = NULL;
  size_t len = 0;
  commit_key(dir, key, sizeof(key));
  if (dcomm__store_set_prefix(w->store, "") < 0) return 0;
  int rc = dcomm__store_get(w->store, key, 0.001, &val, &len);
  dcomm__world_prefix(w);
  int found = rc == 0 && len > 0 && ((char *)val)[len - 1] == 0 && dcomm__ckpt_rec_parse(val, rec) == 0;
  free(val);
  return found;
}

/* Rank 0: write the file, commit it in the store (the fence), then in the
 * directory. */
static int write_and_commit(const char *dir, uint64_t step, const void *data, size_t len) {
  struct dcomm_ckpt_rec rec;
  int keep = (int)dcomm__param_int(DCOMM_P_CHECKPOINT_KEEP);
  DCOMM_CHECK(dcomm__ckpt_write(dir, step, dcomm__w.generation, data, len, &rec));
  DCOMM_CHECK(store_commit(dir, &rec));
  return dcomm__ckpt_commit(dir, &rec, keep < 1 ? 1 : keep);
}

int dcomm_checkpoint_save(const char *dir, uint64_t step, const void *data, size_t len) {
  if (!dir || !*dir) return dcomm__err(DCOMM_EINVAL, "dcomm_checkpoint_save: no directory");
  DCOMM_CHECK(dcomm_barrier(NULL));
  int32_t rc = 0;
  char detail[512] = "";
  if (dcomm_rank() == 0) {
    rc = write_and_commit(dir, step, data, len);
    if (rc < 0) snprintf(detail, sizeof(detail), "%s", dcomm_last_error());
  }
  /* The broadcast of the outcome is the second barrier: nobody goes on
   * before the checkpoint is committed (or known to have failed). */
  DCOMM_CHECK(dcomm__control_bcast(&rc, sizeof(rc), "checkpoint save"));
  if (rc < 0) return dcomm__err(rc, "checkpoint of step %" PRIu64 " failed on rank 0%s%s", step, *detail ? ": " : "", detail);
  return 0;
}

/* What rank 0 found: the outcome, the step, the payload's length and the
 * file's name in the directory. */
struct ckpt_head {
  int64_t rc, step, len;
  char name[1024]; /* as long as dcomm_ckpt_info.path */
};

/* Without a broadcast of host memory, each rank reads the file rank 0
 * chose from the (shared) directory itself; the CRCs vouch for it. */
static int read_named(const char *dir, const struct ckpt_head *head, void **buf) {
  char path[2200];
  snprintf(path, sizeof(path), "%s/%s", dir, head->name);
  struct dcomm_ckpt_info info;
  size_t l = 0;
  int rc = dcomm__ckpt_read_file(path, buf, &l, &info);
  if (rc < 0)
    return dcomm__err_ctx(rc, "checkpoint %s, which rank 0 loaded, cannot be read here (the checkpoint directory must "
                              "be shared by every rank when the backend takes device memory only)", path);
  if (info.step != (uint64_t)head->step || l != (size_t)head->len) {
    free(*buf);
    *buf = NULL;
    return dcomm__err(DCOMM_EPROTO, "checkpoint %s holds step %" PRIu64 " (%zu bytes) here, but step %" PRId64
                      " (%" PRId64 " bytes) on rank 0", path, info.step, l, head->step, head->len);
  }
  return 0;
}

int dcomm_checkpoint_load(const char *dir, void **data, size_t *len, uint64_t *step) {
  if (!dir || !data || !len || !step) return dcomm__err(DCOMM_EINVAL, "dcomm_checkpoint_load: NULL argument");
  *data = NULL;
  *len = 0;
  int via_store = dcomm__control_via_store();
  if (via_store < 0) return via_store;
  struct ckpt_head head;
  memset(&head, 0, sizeof(head));
  void *buf = NULL;
  if (dcomm_rank() == 0) {
    struct dcomm_ckpt_info info;
    size_t l = 0;
    struct dcomm_ckpt_rec rec;
    int have = store_record(dir, &rec);
    int rc = dcomm__ckpt_read_committed(dir, have ? &rec : NULL, &buf, &l, &info);
    head.rc = rc;
    if (rc == 0) {
      head.step = (int64_t)info.step;
      head.len = (int64_t)l;
      const char *base = strrchr(info.path, '/');
      snprintf(head.name, sizeof(head.name), "%s", base ? base + 1 : info.path);
    }
  }
  DCOMM_CHECK(dcomm__control_bcast(&head, sizeof(head), "checkpoint load"));
  if (head.rc < 0) {
    free(buf);
    return dcomm__err((int)head.rc, "no valid checkpoint in %s", dir);
  }
  size_t l = (size_t)head.len;
  if (l == 0) { /* empty payload: NULL on every rank, as on rank 0 */
    free(buf);
    *step = (uint64_t)head.step;
    return 0;
  }
  int rc = 0;
  if (via_store) {
    if (dcomm_rank() != 0) rc = read_named(dir, &head, &buf);
  } else {
    if (dcomm_rank() != 0 && !(buf = malloc(l))) return dcomm__err(DCOMM_ENOMEM, "out of memory for a %zu-byte checkpoint", l);
    rc = dcomm_broadcast(buf, l, DCOMM_UINT8, 0, NULL);
  }
  if (rc < 0) {
    free(buf);
    return rc;
  }
  *data = buf;
  *len = l;
  *step = (uint64_t)head.step;
  return 0;
}

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
  return rc;
}

static int save(const dcomm_elastic_config_t *cfg, uint64_t step) {
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
  if (rc == 0) rc = dcomm_checkpoint_save(cfg->checkpoint_dir, step, data, len);
  free(data);
  return rc;
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
    snprintf(key, sizeof(key), "elastic/join/%ld/n", dcomm__w.generation + 1);
    /* The world store carries this generation's prefix; the join keys have none. */
    if (dcomm__store_set_prefix(dcomm__w.store, "") == 0 && dcomm__store_add(dcomm__w.store, key, 0, &v) == 0) n = (int32_t)v;
    dcomm__world_prefix(&dcomm__w);
  }
  DCOMM_CHECK(dcomm__control_bcast(&n, sizeof(n), "joiner check"));
  *grow = n > 0;
  return 0;
}

int dcomm_elastic_run(const dcomm_elastic_config_t *cfg) {
  if (!cfg || cfg->size < sizeof(*cfg) || cfg->version != 1 || !cfg->step)
    return dcomm__err(DCOMM_EINVAL, "dcomm_elastic_run: config missing, of another version, or without a step callback");
  if (cfg->checkpoint_every && !cfg->checkpoint_dir)
    return dcomm__err(DCOMM_EINVAL, "dcomm_elastic_run: checkpoint_every without checkpoint_dir");
  long max_rec = dcomm__param_int(DCOMM_P_ELASTIC_MAX_RECOVERIES);
  uint64_t step;
  int rc = restore(cfg, &step);
  for (long recoveries = 0;;) {
    int grow = 0;
    while (rc == 0 && step < cfg->total_steps && !grow) {
      rc = cfg->step(step, cfg->user);
      if (rc == 0 && cfg->checkpoint_every && ((step + 1) % cfg->checkpoint_every == 0 || step + 1 == cfg->total_steps)) {
        rc = save(cfg, step);
        /* Scale up at a checkpoint: joiners enter the next generation. */
        if (rc == 0 && step + 1 < cfg->total_steps) rc = joiners_waiting(&grow);
      }
      if (rc == 0) step++;
    }
    if (rc == 0 && !grow) {
      /* Tell members still waiting to join that there is nothing to join. */
      if (dcomm__w.elastic && dcomm_rank() == 0 && dcomm__store_set_prefix(dcomm__w.store, "") == 0) {
        dcomm__store_set(dcomm__w.store, "elastic/done", "1", 2);
        dcomm__world_prefix(&dcomm__w);
      }
      return 0;
    }
    if (grow) {
      dcomm__err(0, "admitting members that wait to join");
    } else if (!dcomm_elastic_recoverable(rc) || !dcomm__w.elastic || recoveries >= max_rec) {
      return rc;
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
    if (err < 0) return err;
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
