/*
 * recovery.c: the generation protocol. After a failure in generation g
 * every survivor (and any joiner) registers for round g+1 in the store; the
 * first to register is the round's leader: it closes the round once as
 * many members joined as dcomm-run says are alive (elastic/alive; without
 * a launcher, when the settle window ends), and publishes the plan, the member ids in rank
 * order (survivors in their old order, then joiners), with a create-only
 * compare_set. Each member takes its rank from the plan, rebuilds the
 * world and every sub-group, and goes on.
 *
 * Keys (no prefix): elastic/gen, elastic/revoke/<g>, elastic/alive,
 * elastic/join/<g>/n, elastic/join/<g>/m/<ticket>, elastic/plan/<g>.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm_elastic.h"
#include "error.h"
#include "log.h"
#include "param.h"
#include "runtime.h"
#include "sock.h"
#include "store.h"

struct joiner {
  char id[40];
  int old_rank;
  long ticket;
};

static int cmp_joiner(const void *a, const void *b) {
  const struct joiner *x = a, *y = b;
  /* survivors first, by old rank; joiners (old rank -1) after, by ticket */
  if ((x->old_rank < 0) != (y->old_rank < 0)) return x->old_rank < 0 ? 1 : -1;
  if (x->old_rank != y->old_rank) return x->old_rank < y->old_rank ? -1 : 1;
  return x->ticket < y->ticket ? -1 : x->ticket > y->ticket;
}

static long get_long(struct dcomm_store *s, const char *key, long dflt) {
  void *val = NULL;
  size_t len = 0;
  long v = dflt;
  if (dcomm__store_get(s, key, 0.001, &val, &len) == 0 && len > 0 && len < 32) {
    char buf[32];
    memcpy(buf, val, len);
    buf[len] = 0;
    v = strtol(buf, NULL, 10);
  }
  free(val);
  return v;
}

/* The leader closes round gen and writes the plan. */
static int lead_round(struct dcomm_store *s, long gen) {
  char key[128];
  snprintf(key, sizeof(key), "elastic/join/%ld/n", gen);
  /* With a launcher, elastic/alive says how many members to wait for: the
   * round stays open until all of them joined (a slow survivor must not be
   * left out, or the job would split in two); the launcher lowers the count
   * when a member dies or hangs. Without one, the settle window closes it. */
  double settle = dcomm__param_double(DCOMM_P_ELASTIC_SETTLE);
  double until = dcomm__now() + settle;
  double hard = dcomm__now() + s->timeout;
  int64_t n = 0;
  for (;;) {
    DCOMM_CHECK(dcomm__store_add(s, key, 0, &n));
    if (get_long(s, "elastic/done", 0) > 0)
      return dcomm__err(DCOMM_ENOTMEMBER, "the job finished before this member was admitted");
    long alive = get_long(s, "elastic/alive", -1);
    if (alive > 0 && n >= alive) break;
    if (alive <= 0 && dcomm__now() >= until) break;
    if (dcomm__now() >= hard)
      return dcomm__err(DCOMM_ETIMEDOUT, "round %ld: only %lld of %ld members joined before the timeout", gen,
                        (long long)n, alive);
    usleep(5000);
  }
  struct joiner *js = calloc((size_t)n, sizeof(*js));
  if (!js) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  int k = 0;
  for (int64_t t = 1; t <= n; t++) {
    void *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "elastic/join/%ld/m/%lld", gen, (long long)t);
    if (dcomm__store_get(s, key, 2.0, &val, &len) < 0) continue; /* took a ticket, then died */
    char buf[96] = "";
    if (len < sizeof(buf)) memcpy(buf, val, len);
    free(val);
    if (sscanf(buf, "%39s %d", js[k].id, &js[k].old_rank) == 2) js[k++].ticket = (long)t;
  }
  qsort(js, (size_t)k, sizeof(*js), cmp_joiner);
  long max = dcomm__param_int(DCOMM_P_ELASTIC_MAX_WORLD);
  if (max > 0 && k > max) {
    DCOMM_LOG(INFO, ELASTIC, "round %ld: %d members, DCOMM_ELASTIC_MAX_WORLD=%ld admits %ld; the rest wait", gen, k, max, max);
    k = (int)max;
  }
  size_t cap = 32 + (size_t)k * 41;
  char *plan = malloc(cap);
  if (!plan) {
    free(js);
    return dcomm__err(DCOMM_ENOMEM, "out of memory");
  }
  size_t off = (size_t)snprintf(plan, cap, "%d\n", k);
  for (int i = 0; i < k; i++) off += (size_t)snprintf(plan + off, cap - off, "%s\n", js[i].id);
  free(js);
  void *cur = NULL;
  size_t clen = 0;
  snprintf(key, sizeof(key), "elastic/plan/%ld", gen);
  int rc = dcomm__store_compare_set(s, key, NULL, 0, plan, off + 1, &cur, &clen);
  free(cur);
  free(plan);
  if (rc < 0) return rc;
  char g[32];
  int gl = snprintf(g, sizeof(g), "%ld", gen);
  return dcomm__store_set(s, "elastic/gen", g, (size_t)gl + 1);
}

/* A heartbeat holds the writer's CLOCK_MONOTONIC, which another host
 * cannot compare with its own clock; so a member is judged by whether its
 * heartbeat still changes: gone once the value stayed the same for longer
 * than the heartbeat timeout of this process's clock. */
struct hb_watch {
  char id[40], last[64];
  double since; /* when last changed, here */
};

/* 1 if the member's heartbeat (written by its watcher thread, which runs
 * even while its main thread is busy) stopped changing. */
static int member_gone(struct dcomm_store *s, struct hb_watch *hw, const char *id) {
  char key[96];
  double now = dcomm__now();
  if (strcmp(hw->id, id) != 0) {
    snprintf(hw->id, sizeof(hw->id), "%s", id);
    hw->last[0] = 0;
    hw->since = now;
  }
  snprintf(key, sizeof(key), "elastic/hb/%s", id);
  void *val = NULL;
  size_t len = 0;
  if (dcomm__store_get(s, key, 0.001, &val, &len) < 0) return 0; /* no heartbeats: cannot tell */
  char buf[64] = "";
  if (len < sizeof(buf)) memcpy(buf, val, len);
  free(val);
  if (strcmp(buf, hw->last) != 0) {
    memcpy(hw->last, buf, sizeof(buf));
    hw->since = now;
    return 0;
  }
  return now - hw->since > dcomm__param_double(DCOMM_P_HEARTBEAT_TIMEOUT) + 1.0;
}

/* Waits for the plan of round gen: 0 with the plan, 1 if the round's
 * leader died before publishing it, or an error. */
static int wait_plan(struct dcomm_store *s, long gen, void **val, size_t *len) {
  char key[128], lkey[128];
  snprintf(key, sizeof(key), "elastic/plan/%ld", gen);
  snprintf(lkey, sizeof(lkey), "elastic/join/%ld/m/1", gen);
  double deadline = dcomm__now() + s->timeout;
  struct hb_watch hw = {.since = 0};
  for (;;) {
    int rc = dcomm__store_get(s, key, 1.0, val, len);
    if (rc != DCOMM_ETIMEDOUT) return rc;
    if (dcomm__now() >= deadline) return rc;
    if (get_long(s, "elastic/done", 0) > 0)
      return dcomm__err(DCOMM_ENOTMEMBER, "the job finished before this member was admitted");
    void *lv = NULL;
    size_t ll = 0;
    char leader[96] = "";
    if (dcomm__store_get(s, lkey, 0.001, &lv, &ll) == 0 && ll < sizeof(leader)) memcpy(leader, lv, ll);
    free(lv);
    char id[40] = "";
    if (sscanf(leader, "%39s", id) == 1 && member_gone(s, &hw, id)) {
      DCOMM_LOG(WARN, ELASTIC, "the leader of round %ld (%s) is gone: moving to the next round", gen, id);
      return 1;
    }
  }
}

/* Registers for round gen and waits for its plan. *rank = -1: not in it. */
static int join_round(struct dcomm_world *w, long gen, int old_rank, int *rank, int *size) {
  struct dcomm_store *s = w->store;
  char key[128], me[96];
  int64_t ticket = 0;
  snprintf(key, sizeof(key), "elastic/join/%ld/n", gen);
  DCOMM_CHECK(dcomm__store_add(s, key, 1, &ticket));
  int ml = snprintf(me, sizeof(me), "%s %d", w->member_id, old_rank);
  snprintf(key, sizeof(key), "elastic/join/%ld/m/%lld", gen, (long long)ticket);
  DCOMM_CHECK(dcomm__store_set(s, key, me, (size_t)ml + 1));
  if (ticket == 1) {
    DCOMM_LOG(INFO, ELASTIC, "leading round %ld", gen);
    DCOMM_CHECK(lead_round(s, gen));
  }
  void *val = NULL;
  size_t len = 0;
  int rc = wait_plan(s, gen, &val, &len);
  if (rc == 1) { /* the leader is gone: the round is abandoned */
    *rank = -1;
    *size = 0;
    return 0;
  }
  if (rc < 0) return dcomm__err_ctx(rc, "waiting for the plan of generation %ld", gen);
  char *plan = val;
  if (!len || plan[len - 1]) {
    free(val);
    return dcomm__err(DCOMM_EPROTO, "malformed plan for generation %ld", gen);
  }
  char *save = NULL, *line = strtok_r(plan, "\n", &save);
  int n = line ? atoi(line) : 0;
  *rank = -1;
  *size = n;
  for (int i = 0; i < n && (line = strtok_r(NULL, "\n", &save)); i++)
    if (!strcmp(line, w->member_id)) *rank = i;
  free(val);
  return 0;
}

/* Joins rounds from gen on until a plan includes this member. */
static int join_from(struct dcomm_world *w, long gen, int old_rank) {
  int rank, size;
  for (int tries = 0; tries < 64; tries++, gen++) {
    DCOMM_CHECK(join_round(w, gen, old_rank, &rank, &size));
    if (rank >= 0) {
      int min = (int)dcomm__param_int(DCOMM_P_ELASTIC_MIN_WORLD);
      if (size < min)
        return dcomm__err(DCOMM_EPEERLOST, "generation %ld has %d members, fewer than DCOMM_ELASTIC_MIN_WORLD=%d", gen,
                          size, min);
      __atomic_store_n(&w->generation, gen, __ATOMIC_RELEASE);
      w->rank = rank;
      w->size = size;
      if (w->local_size > size) w->local_size = size; /* local_rank stays: it names this process's slot */
      return 0;
    }
    DCOMM_LOG(INFO, ELASTIC, "not in the plan of generation %ld: waiting for the next", gen);
  }
  return dcomm__err(DCOMM_ETIMEDOUT, "never admitted to a generation");
}

int dcomm__elastic_join(struct dcomm_world *w) {
  DCOMM_CHECK(dcomm__store_set_prefix(w->store, ""));
  long gen = get_long(w->store, "elastic/gen", 0);
  DCOMM_LOG(INFO, ELASTIC, "joining the job after generation %ld", gen);
  return join_from(w, gen + 1, -1);
}

static int post_revoke(struct dcomm_world *w, long gen, const char *why) {
  char key[64];
  snprintf(key, sizeof(key), "elastic/revoke/%ld", gen);
  void *cur = NULL;
  size_t clen = 0;
  int rc = dcomm__store_compare_set(w->store, key, NULL, 0, why, strlen(why) + 1, &cur, &clen);
  free(cur);
  return rc;
}

int dcomm_elastic_recover(void) {
  struct dcomm_world *w = &dcomm__w;
  if (!w->initialized) return dcomm__err(DCOMM_ENOTINIT, "dcomm_elastic_recover: not initialized");
  if (!w->elastic) return dcomm__err(DCOMM_ENOTSUP, "dcomm_elastic_recover: not in elastic mode (DCOMM_ELASTIC=1, set by dcomm-run)");
  char why[512];
  snprintf(why, sizeof(why), "rank %d: %s", w->rank, dcomm_last_error());
  long gen = w->generation;
  int old_rank = w->rank, old_size = w->size;
  double t0 = dcomm__now();
  DCOMM_CHECK(dcomm__store_set_prefix(w->store, ""));
  DCOMM_CHECK(post_revoke(w, gen, why));
  /* Nothing of generation gen is used again: abort and release it all. */
  dcomm__world_release(w, 1);
  char(*old_members)[40] = w->members; /* NULL after a failed attempt */
  if (!old_members) old_size = 0;       /* then the groups cannot be mapped */
  w->members = NULL;
  int rc = join_from(w, gen + 1, old_rank);
  if (rc == 0) rc = dcomm__world_build(w);
  /* A member left out of a plan missed a generation: the others rebuilt
   * their groups without it, so it comes back like a joiner, with none. */
  if (rc == 0) rc = w->generation == gen + 1 && old_members ? dcomm__groups_rebuild(old_members, old_size)
                                             : dcomm__groups_rebuild(old_members, 0);
  free(old_members);
  if (rc < 0) return dcomm__err_ctx(rc, "recovery from generation %ld", gen);
  DCOMM_LOG(INFO, ELASTIC, "generation %ld: rank %d of %d (was %d of %d), rebuilt in %.3f s", w->generation, w->rank,
            w->size, old_rank, old_size, dcomm__now() - t0);
  return 0;
}

long dcomm_generation(void) { return dcomm__w.initialized ? dcomm__w.generation : DCOMM_ENOTINIT; }
int dcomm_elastic_enabled(void) { return dcomm__w.initialized && dcomm__w.elastic; }
const char *dcomm_member_id(void) { return dcomm__w.initialized ? dcomm__w.member_id : NULL; }
int dcomm_elastic_recoverable(int err) {
  return err == DCOMM_EPEERLOST || err == DCOMM_EREVOKED || err == DCOMM_ETIMEDOUT;
}
