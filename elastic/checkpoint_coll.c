/*
 * checkpoint_coll.c: barrier-synchronized, fenced rank-0 checkpoints:
 * the collectives dcomm_checkpoint_save and dcomm_checkpoint_load.
 *
 * A checkpoint counts once it is committed: rank 0 writes the file, then
 * sets its record (checkpoint_file.h) under ckpt/commit/<hash of the directory>
 * in the job's store with a guarded write (in elastic mode: elastic/gen
 * still holds this generation and it is not revoked), then adds the record
 * to the directory's COMMITTED list; the same write sets ckpt/last (step,
 * generation, file), which dcomm-run status shows. A fenced rank 0 (its generation ended
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
#include <time.h>

#include "checkpoint_coll.h"
#include "checkpoint_file.h"
#include "dcomm_elastic.h"
#include "error.h"
#include "hash.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store.h"
#include "world.h"

/* The store key of a directory's commit record (its real path hashed, so
 * that "ckpt" and "./ckpt" name one record). */
static void commit_key(const char *dir, char *key, size_t n) {
  char real[PATH_MAX];
  const char *p = realpath(dir, real) ? real : dir;
  snprintf(key, n, DCOMM_KEY_CKPT_FMT, (unsigned long long)dcomm__hash64(0, p, strlen(p)));
}

/* The commit's transaction. On etcd, a try that found no member able to
 * answer (down, restarting, without a leader) is repeated for up to
 * DCOMM_RDZV_OUTAGE_TIMEOUT: the transaction puts the same values under
 * the same compares, so a repeat after an unseen success changes nothing,
 * and an outage that dcomm-run rides out (it pauses the workers) costs
 * the job no recovery. */
static int txn_through_outage(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int nc,
                              const struct dcomm_store_put *puts, int np, int *done) {
  double until = dcomm__now() + dcomm__param_double(DCOMM_P_RDZV_OUTAGE_TIMEOUT);
  int warned = 0;
  for (;;) {
    int rc = dcomm__store_txn(s, cmps, nc, puts, np, done);
    int unavailable = rc == DCOMM_EPEERLOST || rc == DCOMM_ETIMEDOUT || rc == DCOMM_EBACKEND;
    if (rc == 0 || !unavailable || strcmp(dcomm__store_kind(s), "etcd") != 0 || dcomm__now() >= until) return rc;
    if (!warned++)
      DCOMM_LOG(WARN, ELASTIC, "checkpoint commit: etcd does not answer (%s); trying again for up to %g s "
                "(DCOMM_RDZV_OUTAGE_TIMEOUT)", dcomm_last_error(), dcomm__param_double(DCOMM_P_RDZV_OUTAGE_TIMEOUT));
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
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
    snprintf(rkey, sizeof(rkey), DCOMM_KEY_REVOKE_FMT, w->generation);
    cmps[nc++] = (struct dcomm_store_cmp){DCOMM_KEY_GEN, DCOMM_STORE_EQUAL, g, (size_t)gl + 1};
    cmps[nc++] = (struct dcomm_store_cmp){rkey, DCOMM_STORE_ABSENT, NULL, 0};
  }
  /* ckpt/last, for dcomm-run status, in the same guarded write: a fenced
   * rank 0 can no more advertise its checkpoint than commit it. */
  char last[DCOMM_CKPT_REC_TEXT];
  int ll = snprintf(last, sizeof(last), DCOMM_CKPT_LAST_FMT, (unsigned long long)rec->step,
                    (long long)rec->generation, rec->name);
  struct dcomm_store_put puts[2] = {{key, text, (size_t)tl + 1}, {DCOMM_KEY_CKPT_LAST, last, (size_t)ll + 1}};
  int done = 0;
  DCOMM_CHECK(txn_through_outage(w->jstore, cmps, nc, puts, 2, &done));
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
  int rc = dcomm__store_get(w->jstore, key, 0.001, &val, &len);
  int found = rc == 0 && len > 0 && ((char *)val)[len - 1] == 0 && dcomm__ckpt_rec_parse(val, rec) == 0;
  free(val);
  return found;
}

/* Rank 0: write the file, commit it in the store (the fence), then in the
 * directory. *storage: the failure was the directory's (the file or the
 * list), not the store's. A failed write leaves no file behind and the
 * COMMITTED list as it was, so the last committed checkpoint stays the
 * one restored. */
static int write_and_commit(const char *dir, uint64_t step, const void *data, size_t len, int *storage) {
  struct dcomm_ckpt_rec rec;
  int keep = (int)dcomm__param_int(DCOMM_P_CHECKPOINT_KEEP);
  *storage = 0;
  int rc = dcomm__ckpt_write(dir, step, dcomm__w.generation, data, len, &rec);
  if (rc == 0) {
    DCOMM_CHECK(store_commit(dir, &rec)); /* the only failure that is not the directory's */
    rc = dcomm__ckpt_commit(dir, &rec, keep < 1 ? 1 : keep);
  }
  *storage = rc < 0;
  return rc;
}

int dcomm__checkpoint_save(const char *dir, uint64_t step, const void *data, size_t len, int *storage) {
  if (storage) *storage = 0;
  if (!dir || !*dir) return dcomm__err(DCOMM_EINVAL, "dcomm_checkpoint_save: no directory");
  DCOMM_CHECK(dcomm_barrier(NULL));
  int32_t out[2] = {0, 0}; /* outcome, storage */
  char detail[512] = "";
  if (dcomm_rank() == 0) {
    int st = 0;
    out[0] = write_and_commit(dir, step, data, len, &st);
    out[1] = out[0] < 0 && st;
    if (out[0] < 0) snprintf(detail, sizeof(detail), "%s", dcomm_last_error());
  }
  /* The broadcast of the outcome is the second barrier: nobody goes on
   * before the checkpoint is committed (or known to have failed). */
  DCOMM_CHECK(dcomm__control_bcast(out, sizeof(out), "checkpoint save"));
  if (out[0] >= 0) return 0;
  if (storage) *storage = out[1];
  return dcomm__err(out[0], "checkpoint of step %" PRIu64 " failed on rank 0%s%s", step, *detail ? ": " : "", detail);
}

int dcomm_checkpoint_save(const char *dir, uint64_t step, const void *data, size_t len) {
  return dcomm__checkpoint_save(dir, step, data, len, NULL);
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

