/*
 * rounds.c: the recovery rounds, the agreement on who is in the next
 * generation (generation.c drives the transition): a member's side, taking
 * a ticket and waiting for the plan. The leader's side is round_lead.c,
 * the store reads both make round_state.c. After a failure in generation g
 * every survivor (and any joiner) registers for round g+1 in the store; the
 * first to register is the round's leader. It closes the round when the
 * launchers say every live member has joined, or, without a launcher, when
 * the settle window ends; then it publishes the plan, the member ids in
 * rank order (survivors in their old order, then joiners by node slot and
 * local rank), with a create-only compare_set. Each member takes its rank
 * from the plan, rebuilds the world and every sub-group, and goes on.
 * The first round of a job formed by rendezvous (no elastic/gen yet) is
 * the same with only joiners, and stays open DCOMM_ELASTIC_SETTLE longer
 * for more nodes, up to the maximum.
 *
 * Fencing: at most one world per generation, and only a successor of the
 * job's current one. The plan, elastic/gen and elastic/first are written in
 * one guarded txn: elastic/gen must still hold the generation the leader
 * read (absent for a job's first world), that generation must be revoked
 * (elastic/revoke/<g>: it is over), the plan must not exist, and the
 * leader's node record must still exist (with etcd it lives under the
 * node's lease). Ticket records are guarded by the node record too. A
 * process that was frozen or cut off while the job went on therefore fails
 * every write that would let it form a world; once it has missed a
 * generation it comes back only as a joiner (old rank -1), and a ticket of
 * a node whose record is gone never counts. Without launchers (settle
 * window), a round also needs a majority of the previous generation's
 * members (or DCOMM_ELASTIC_MIN_WORLD of them, when set), so the two halves
 * of a partition cannot both go on.
 *
 * Keys (no prefix): elastic/gen, elastic/revoke/<g>, elastic/join/<g>/n,
 * elastic/join/<g>/m/<ticket> ("member-id old-rank slot local-rank pid
 * old-generation old-size"; old rank, generation and size -1 for a joiner),
 * elastic/plan/<g>; written by the launchers (dcomm-run, one per node):
 * rdzv/agents/n (slots taken), rdzv/agent/<slot> ("live nproc host pid
 * pids=P,...": its workers not reaped yet; gone with the node: an etcd
 * lease) and rdzv/nnodes ("min max"). A ticket counts only while its
 * holder's pid is in its node's list: a member that registered and then
 * died must not stand in for one still on its way.
 */
#include "config.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm_elastic.h"
#include "error.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "round_lead.h"
#include "round_state.h"
#include "rounds.h"
#include "sock.h"
#include "store.h"
#include "world.h"

#define MAX_EMPTY_ROUNDS 4 /* abandoned rounds (or whose leader died) in a row before recovery fails */

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
  snprintf(key, sizeof(key), DCOMM_KEY_HB_FMT, id);
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
  snprintf(key, sizeof(key), DCOMM_KEY_PLAN_FMT, gen);
  snprintf(lkey, sizeof(lkey), DCOMM_KEY_TICKET_FMT, gen, 1LL);
  /* The leader, who came first, gives up on the round at its timeout and
   * says so; the margin lets its word arrive before this wait ends. */
  double deadline = dcomm__now() + s->timeout + 2.0;
  struct hb_watch hw = {.since = 0};
  for (;;) {
    int rc = dcomm__store_get(s, key, 1.0, val, len);
    if (rc != DCOMM_ETIMEDOUT) return rc;
    if (dcomm__now() >= deadline) return rc;
    if (dcomm__store_peek_long(s, DCOMM_KEY_DONE, 0) > 0)
      return dcomm__err(DCOMM_ENOTMEMBER, "the job finished before this member was admitted");
    void *lv = NULL;
    size_t ll = 0;
    char leader[160] = "";
    if (dcomm__store_get(s, lkey, 0.001, &lv, &ll) == 0 && ll < sizeof(leader)) memcpy(leader, lv, ll);
    free(lv);
    char id[40] = "";
    if (sscanf(leader, "%39s", id) == 1 && member_gone(s, &hw, id)) {
      DCOMM_LOG(WARN, ELASTIC, "the leader of round %ld (%s) is gone: moving to the next round", gen, id);
      return 1;
    }
  }
}

/* Registers for round gen and waits for its plan. *rank = -1: not in it;
 * else the plan's member ids in rank order go to *ids (*size entries,
 * the caller frees them). */
static int join_round(struct dcomm_world *w, long gen, int old_rank, long old_gen, int old_size, int *rank,
                      int *size, char (**ids)[40]) {
  struct dcomm_store *s = w->jstore;
  char key[128], me[200], nkey[64];
  int64_t ticket = 0;
  DCOMM_CHECK(dcomm__round_check_fenced(s));
  snprintf(key, sizeof(key), DCOMM_KEY_JOIN_N_FMT, gen);
  long die = dcomm__param_int(DCOMM_P_ELASTIC_TEST_DIE_AFTER_TICKET);
  if (die >= 0 && old_rank == die) usleep(300000); /* test hook: not the leader */
  DCOMM_CHECK(dcomm__store_add(s, key, 1, &ticket));
  int ml = snprintf(me, sizeof(me), DCOMM_TICKET_FMT, w->member_id, old_rank,
                    (long)dcomm__param_int(DCOMM_P_AGENT_SLOT), w->local_rank, (long)getpid(), old_gen, old_size);
  snprintf(key, sizeof(key), DCOMM_KEY_TICKET_FMT, gen, (long long)ticket);
  struct dcomm_store_cmp guard;
  int ng = dcomm__round_node_guard(nkey, sizeof(nkey), &guard);
  struct dcomm_store_put put = {key, me, (size_t)ml + 1};
  int done = 0;
  DCOMM_CHECK(dcomm__store_txn(s, &guard, ng, &put, 1, &done));
  if (!done) return dcomm__round_check_fenced(s) < 0 ? DCOMM_ENOTMEMBER : dcomm__err(DCOMM_ENOTMEMBER, "fenced: this member's "
                                                                           "node left the job while it registered");
  if (die >= 0 && old_rank == die) {
    DCOMM_LOG(WARN, ELASTIC, "DCOMM_ELASTIC_TEST_DIE_AFTER_TICKET=%ld: dying after taking ticket %lld", die,
              (long long)ticket);
    raise(SIGKILL);
  }
  if (ticket == 1) {
    DCOMM_LOG(INFO, ELASTIC, "leading round %ld", gen);
    int lr = dcomm__round_lead(s, gen);
    if (lr < 0) return lr;
    if (lr == 2) dcomm__round_abandon(s, gen); /* superseded: nobody waits for a plan that cannot come */
    if (lr == 1 || lr == 2) { /* abandoned: on to the next round */
      *rank = -1;
      *size = 0;
      return 0;
    }
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
  rc = dcomm__plan_parse(val, len, w->member_id, rank, size, ids);
  free(val);
  return rc < 0 ? dcomm__err_ctx(rc, "the plan of generation %ld", gen) : 0;
}

int dcomm__plan_parse(char *plan, size_t len, const char *me, int *rank, int *size, char (**ids)[40]) {
  *rank = -1;
  *size = 0;
  *ids = NULL;
  if (!len || plan[len - 1]) return dcomm__err(DCOMM_EPROTO, "malformed plan");
  size_t lines = 0; /* a plan lists at most this many ids: a count beyond is a short plan */
  for (size_t k = 0; k < len; k++) lines += plan[k] == '\n';
  char *save = NULL, *line = strtok_r(plan, "\n", &save);
  int n = line ? atoi(line) : 0, i = 0;
  *size = n;
  if (n <= 0) return 0;
  if ((size_t)n > lines) return 0; /* fewer ids than it says: a short plan, not usable (nothing allocated) */
  *ids = calloc((size_t)n, sizeof(**ids));
  if (!*ids) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  for (; i < n && (line = strtok_r(NULL, "\n", &save)); i++) {
    if (!strcmp(line, me)) *rank = i;
    snprintf((*ids)[i], sizeof((*ids)[i]), "%s", line);
  }
  if (i < n) *rank = -1; /* a short plan: not usable */
  if (*rank < 0) {
    free(*ids);
    *ids = NULL;
  }
  return 0;
}

/* Joins rounds from gen on until a plan includes this member; its member
 * ids go to *plan (w->size entries, the caller frees them) if not NULL.
 * *missed (if not NULL) says whether a generation was formed without this
 * member on the way (rounds abandoned or whose leader died do not count). */
int dcomm__rounds_join(struct dcomm_world *w, long gen, int old_rank, int old_size, char (**plan)[40], int *missed) {
  int rank, size, empty = 0;
  long old_gen = old_rank >= 0 ? gen - 1 : -1;
  if (missed) *missed = 0;
  for (int tries = 0; tries < 64; tries++, gen++) {
    char(*ids)[40] = NULL;
    DCOMM_CHECK(join_round(w, gen, old_rank, old_gen, old_rank >= 0 ? old_size : -1, &rank, &size, &ids));
    if (rank < 0 && size > 0) {
      /* A generation formed without this member: it is no longer one of
       * the survivors of old_gen, and may only come back as a joiner. */
      if (missed) *missed = 1;
      old_rank = -1;
      old_gen = -1;
    }
    /* Rounds that formed nothing in a row: someone never comes. */
    empty = rank < 0 && size == 0 ? empty + 1 : 0;
    if (empty >= MAX_EMPTY_ROUNDS)
      return dcomm__err(DCOMM_ETIMEDOUT, "%d rounds in a row formed no generation (up to generation %ld): a live member "
                        "never joined within the timeout", empty, gen);
    if (rank >= 0) {
      int min = (int)dcomm__param_int(DCOMM_P_ELASTIC_MIN_WORLD);
      if (plan) *plan = ids;
      else free(ids);
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

/* The node slots of generation gen's members (its plan and the tickets of
 * its round): world_slots[slot] = 1; *nodes: how many. 0, or -1 when it
 * cannot tell (no plan: a world not formed by rounds). */
static int world_nodes(struct dcomm_store *s, long gen, char *world_slots, int *nodes) {
  char key[64];
  void *val = NULL;
  size_t len = 0;
  *nodes = 0;
  snprintf(key, sizeof(key), DCOMM_KEY_PLAN_FMT, gen);
  if (dcomm__store_get(s, key, 0.001, &val, &len) < 0) return -1;
  char *plan = val;
  if (!len || plan[len - 1]) {
    free(val);
    return -1;
  }
  snprintf(key, sizeof(key), DCOMM_KEY_JOIN_N_FMT, gen);
  int64_t n = dcomm__store_peek_long(s, key, 0);
  struct joiner *js = dcomm__round_read_tickets(s, gen, n, 0.001);
  for (int64_t i = 0; js && i < n; i++) {
    const struct joiner *j = &js[i];
    if (!j->ticket || j->t.slot <= 0 || j->t.slot >= DCOMM_MAX_SLOTS || world_slots[j->t.slot]) continue;
    /* a member of the plan? ids are whole lines */
    size_t il = strlen(j->t.id);
    int in = 0;
    for (char *p = strstr(plan, j->t.id); p && !in; p = strstr(p + 1, j->t.id))
      in = (p == plan || p[-1] == '\n') && p[il] == '\n';
    if (in) {
      world_slots[j->t.slot] = 1;
      ++*nodes;
    }
  }
  free(js);
  free(val);
  return 0;
}

int dcomm__rounds_admissible(struct dcomm_store *s, long gen, int size, int64_t n) {
  char buf[DCOMM_NODE_RECORD_MAX];
  int min_nodes = 0, max_nodes = 0;
  if (dcomm__store_peek(s, DCOMM_KEY_NNODES, buf, sizeof(buf)) != 1 || sscanf(buf, "%d %d", &min_nodes, &max_nodes) != 2 ||
      max_nodes <= 0)
    return 1; /* no node range (static backend, no launcher) */
  /* The largest world: MAX nodes of the nodes' nproc. */
  long nproc = 0, slots = dcomm__store_peek_long(s, DCOMM_KEY_AGENTS_N, 0);
  char key[64];
  if (slots >= DCOMM_MAX_SLOTS) slots = DCOMM_MAX_SLOTS - 1;
  for (long i = 1; i <= slots; i++) {
    long np = 0;
    snprintf(key, sizeof(key), DCOMM_KEY_AGENT_FMT, i);
    if (dcomm__store_peek(s, key, buf, sizeof(buf)) == 1 && sscanf(buf, "%*d %ld", &np) == 1 && np > nproc) nproc = np;
  }
  if (nproc > 0 && (long)size >= (long)max_nodes * nproc) {
    DCOMM_LOG(DEBUG, ELASTIC, "members wait to join, but the world of %d is full (--nnodes max %d x %ld)", size,
              max_nodes, nproc);
    return 0;
  }
  /* Joiners on the world's own nodes (replacements) can come in; joiners
   * of another node only while the world spans fewer than MAX nodes. */
  static long cached_gen = -2;
  static char slots_in[DCOMM_MAX_SLOTS];
  static int nodes_in;
  if (cached_gen != gen) {
    memset(slots_in, 0, sizeof(slots_in));
    if (world_nodes(s, gen, slots_in, &nodes_in) < 0) return 1;
    cached_gen = gen;
  }
  if (nodes_in < max_nodes) return 1;
  struct joiner *js = dcomm__round_read_tickets(s, gen + 1, n, 0.001);
  int replaces = 0;
  for (int64_t i = 0; js && i < n && !replaces; i++)
    replaces = js[i].ticket && js[i].t.slot > 0 && js[i].t.slot < DCOMM_MAX_SLOTS && slots_in[js[i].t.slot];
  free(js);
  if (replaces) return 1;
  DCOMM_LOG(DEBUG, ELASTIC, "members of a spare node wait to join; the world spans the maximum of %d nodes already",
            max_nodes);
  return 0;
}
