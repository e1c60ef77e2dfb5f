/*
 * rounds.c: the recovery rounds, the agreement on who is in the next
 * generation (generation.c drives the transition). After a failure in generation g
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
#include "rounds.h"
#include "sock.h"
#include "store.h"
#include "world.h"

#define DCOMM_MAX_SLOTS 1024 /* node slots a job may hand out */
#define MAX_EMPTY_ROUNDS 4 /* abandoned rounds (or whose leader died) in a row before recovery fails */

/* A member of a round: its ticket record and the ticket's number. */
struct joiner {
  struct dcomm_ticket t;
  long ticket;
};

/* The job's current generation as read (elastic/gen): its raw bytes, for a
 * guard that it has not moved since. */
struct gen_seen {
  int present;
  long gen;
  char raw[32];
  size_t len;
};

static int cmp_joiner(const void *a, const void *b) {
  const struct joiner *x = a, *y = b;
  /* survivors first, by old rank; joiners (old rank -1) after, by node
   * slot and local rank (so a node's ranks are contiguous), then ticket */
  if ((x->t.old_rank < 0) != (y->t.old_rank < 0)) return x->t.old_rank < 0 ? 1 : -1;
  if (x->t.old_rank != y->t.old_rank) return x->t.old_rank < y->t.old_rank ? -1 : 1;
  if (x->t.slot != y->t.slot) return x->t.slot < y->t.slot ? -1 : 1;
  if (x->t.local_rank != y->t.local_rank) return x->t.local_rank < y->t.local_rank ? -1 : 1;
  return x->ticket < y->ticket ? -1 : x->ticket > y->ticket;
}

#define get_long dcomm__store_peek_long

/* What the launchers say: live nodes and the workers they run. */
struct launchers {
  int nodes;            /* agent slots whose record exists (0: no launcher) */
  long workers;         /* live workers of those nodes */
  int min_nodes, max_nodes; /* rdzv/nnodes; 0: not set */
  int live_slot[DCOMM_MAX_SLOTS]; /* 1: the slot's node is alive */
  char *pids[DCOMM_MAX_SLOTS];    /* its record's "P1,P2,..." list, or NULL: none */
};

static void launchers_clear(struct launchers *l) {
  for (int i = 0; i < DCOMM_MAX_SLOTS; i++) free(l->pids[i]);
  memset(l, 0, sizeof(*l));
}

static int slot_alive(const struct launchers *l, int slot) {
  return slot > 0 && slot < DCOMM_MAX_SLOTS && l->live_slot[slot];
}

/* l is empty or from an earlier call. */
static void read_launchers(struct dcomm_store *s, struct launchers *l) {
  launchers_clear(l);
  long slots = get_long(s, DCOMM_KEY_AGENTS_N, 0);
  if (slots >= DCOMM_MAX_SLOTS) slots = DCOMM_MAX_SLOTS - 1;
  char key[64], buf[DCOMM_NODE_RECORD_MAX];
  for (long i = 1; i <= slots; i++) {
    long live = 0;
    snprintf(key, sizeof(key), DCOMM_KEY_AGENT_FMT, i);
    const char *pids = NULL;
    if (dcomm__store_peek(s, key, buf, sizeof(buf)) == 1 && dcomm__node_record_parse(buf, &live, &pids) == 0) {
      l->nodes++;
      l->workers += live;
      l->live_slot[i] = 1;
      if (pids) l->pids[i] = strdup(pids); /* out of memory: no list, nobody judged */
    }
  }
  if (dcomm__store_peek(s, DCOMM_KEY_NNODES, buf, sizeof(buf)) == 1 && sscanf(buf, "%d %d", &l->min_nodes, &l->max_nodes) != 2)
    l->min_nodes = l->max_nodes = 0;
}

/* Whether the holder of a ticket (node slot, pid) still runs, as its
 * launcher's record (read by read_launchers) says: 0 only when the record
 * lists its live workers' pids and this one is not among them, or when the
 * node's record is gone; 1 otherwise (no launcher, a record without a
 * list). */
static int holder_alive(const struct launchers *l, int slot, long pid) {
  /* A node whose record is gone is out of the job (its lease ended; its
   * agent fenced itself): none of its members counts, survivor or not. */
  if (l->nodes > 0 && slot > 0 && slot < DCOMM_MAX_SLOTS && !l->live_slot[slot]) return 0;
  if (slot <= 0 || slot >= DCOMM_MAX_SLOTS || pid <= 0 || !l->pids[slot]) return 1;
  return dcomm__node_record_has_pid(l->pids[slot], pid);
}

/* Reads ticket t of round gen into j: 1 read, 0 absent or malformed. */
static int read_ticket(struct dcomm_store *s, long gen, int64_t t, double wait, struct joiner *j) {
  char key[128];
  void *val = NULL;
  size_t len = 0;
  snprintf(key, sizeof(key), DCOMM_KEY_TICKET_FMT, gen, (long long)t);
  if (dcomm__store_get(s, key, wait, &val, &len) < 0) return 0; /* took a ticket, then died */
  memset(j, 0, sizeof(*j));
  int bad = dcomm__ticket_parse(val, len, &j->t) < 0;
  free(val);
  if (bad) return 0;
  j->ticket = (long)t;
  return 1;
}

/* Tickets 1..n whose holders still run (see holder_alive). */
static int64_t live_tickets(struct dcomm_store *s, const struct launchers *l, long gen, int64_t n) {
  int64_t live = 0;
  for (int64_t t = 1; t <= n; t++) {
    struct joiner j;
    /* A ticket taken but not yet written counts: its holder is at work. */
    if (!read_ticket(s, gen, t, 0.001, &j) || holder_alive(l, j.t.slot, j.t.pid)) live++;
  }
  return live;
}

/* With a maximum node count, only members of the first max_nodes nodes
 * (in plan order: the survivors' nodes come first) are admitted; members
 * of other nodes wait for a later round. Returns the new count. */
static int admit_nodes(struct joiner *js, int k, int max_nodes, long gen) {
  if (max_nodes <= 0) return k;
  int nodes[DCOMM_MAX_SLOTS], nn = 0, out = 0;
  for (int i = 0; i < k; i++) {
    int known = js[i].t.slot <= 0;
    for (int j = 0; j < nn && !known; j++) known = nodes[j] == js[i].t.slot;
    if (!known) {
      if (nn >= max_nodes) continue;
      nodes[nn++] = js[i].t.slot;
    }
    js[out++] = js[i];
  }
  if (out < k) DCOMM_LOG(INFO, ELASTIC, "round %ld: %d nodes admitted (the maximum); %d members wait", gen, nn, k - out);
  return out;
}

static void read_gen(struct dcomm_store *s, struct gen_seen *g) {
  void *val = NULL;
  size_t len = 0;
  memset(g, 0, sizeof(*g));
  g->gen = -1;
  if (dcomm__store_get(s, DCOMM_KEY_GEN, 0.001, &val, &len) == 0 && len < sizeof(g->raw)) {
    memcpy(g->raw, val, len);
    g->len = len;
    g->present = 1;
    char txt[sizeof(g->raw) + 1];
    memcpy(txt, val, len);
    txt[len] = 0;
    g->gen = strtol(txt, NULL, 10);
  }
  free(val);
}

static int key_exists(struct dcomm_store *s, const char *key) {
  void *val = NULL;
  size_t len = 0;
  int found = dcomm__store_get(s, key, 0.001, &val, &len) == 0;
  free(val);
  return found;
}

/* The compare that this member's node is still in the job: its launcher's
 * record exists (under the node's lease with etcd). 0: no launcher slot. */
static int node_guard(char *key, size_t n, struct dcomm_store_cmp *cmp) {
  long slot = dcomm__param_int(DCOMM_P_AGENT_SLOT);
  if (slot <= 0) return 0;
  snprintf(key, n, DCOMM_KEY_AGENT_FMT, slot);
  *cmp = (struct dcomm_store_cmp){key, DCOMM_STORE_EXISTS, NULL, 0};
  return 1;
}

/* DCOMM_ENOTMEMBER when this member's node is out of the job. */
static int check_not_fenced(struct dcomm_store *s) {
  char key[64];
  struct dcomm_store_cmp cmp;
  if (!node_guard(key, sizeof(key), &cmp) || get_long(s, DCOMM_KEY_AGENTS_N, 0) <= 0 || key_exists(s, key)) return 0;
  return dcomm__err(DCOMM_ENOTMEMBER, "fenced: this member's node (slot %ld) is no longer in the job (its record %s "
                    "is gone: the node's lease ended while it was cut off or frozen)",
                    (long)dcomm__param_int(DCOMM_P_AGENT_SLOT), key);
}

/* Without launchers: whether the tickets hold enough members of the
 * generation before (L): more than half of it, or DCOMM_ELASTIC_MIN_WORLD
 * when that is set. Two halves of a partition cannot both have it. */
static int quorum_reached(struct dcomm_store *s, long gen, int64_t n, const struct gen_seen *L, int *have, int *of) {
  *have = 0;
  *of = 0;
  if (!L->present) return 1; /* the first world: nothing to split */
  for (int64_t t = 1; t <= n; t++) {
    struct joiner j;
    if (!read_ticket(s, gen, t, 0.001, &j) || j.t.old_rank < 0 || j.t.old_gen != L->gen) continue;
    (*have)++;
    if (j.t.old_size > *of) *of = j.t.old_size;
  }
  if (*of <= 0) return 1; /* only joiners (or old tickets without sizes): nothing to compare with */
  long min = dcomm__param_int(DCOMM_P_ELASTIC_MIN_WORLD);
  return min > 0 ? *have >= min : 2 * *have > *of;
}

/* The live workers of the launchers' records (l) without a ticket in
 * round gen: "member <id> (node slot S, host H, pid P), ..." in buf, from
 * the launchers' worker lists (rdzv/workers/<slot>); empty when every one
 * joined or nothing tells. */
static void missing_members(struct dcomm_store *s, const struct launchers *l, long gen, int64_t n, char *buf,
                            size_t cap) {
  size_t off = 0;
  buf[0] = 0;
  long *have = calloc((size_t)n + 1, sizeof(*have));
  int *have_slot = calloc((size_t)n + 1, sizeof(*have_slot));
  int64_t nh = 0;
  for (int64_t t = 1; t <= n && have && have_slot; t++) {
    struct joiner j;
    if (read_ticket(s, gen, t, 0.001, &j)) {
      have[nh] = j.t.pid;
      have_slot[nh++] = j.t.slot;
    }
  }
  char key[64], rec[DCOMM_NODE_RECORD_MAX], host[128], list[4096];
  for (int slot = 1; slot < DCOMM_MAX_SLOTS && have && have_slot; slot++) {
    if (!l->live_slot[slot]) continue;
    snprintf(key, sizeof(key), DCOMM_KEY_AGENT_FMT, (long)slot);
    host[0] = 0;
    if (dcomm__store_peek(s, key, rec, sizeof(rec)) == 1) sscanf(rec, "%*d %*d %127s", host);
    snprintf(key, sizeof(key), DCOMM_KEY_WORKERS_FMT, (long)slot);
    if (dcomm__store_peek(s, key, list, sizeof(list)) != 1) continue;
    char *save = NULL;
    for (char *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      int rank = 0, lr = 0;
      long pid = 0;
      char id[40];
      if (dcomm__worker_line_parse(line, &rank, &lr, &pid, id) < 0) continue;
      if (l->pids[slot] && !dcomm__node_record_has_pid(l->pids[slot], pid)) continue; /* not running */
      int joined = 0;
      for (int64_t i = 0; i < nh && !joined; i++) joined = have[i] == pid && have_slot[i] == slot;
      if (joined || off + 1 >= cap) continue;
      int k = snprintf(buf + off, cap - off, "%smember %s (node slot %d, host %s, pid %ld)", off ? ", " : "", id,
                       slot, *host ? host : "?", pid);
      if (k > 0) off += (size_t)k < cap - off ? (size_t)k : cap - off - 1;
    }
  }
  free(have);
  free(have_slot);
}

/* A leader that gives up on its round publishes an empty plan ("0"): the
 * members waiting for it, and those that come later, move on to the next
 * round at once instead of waiting out the timeout there, and know that no
 * generation was formed without them. */
static void abandon_round(struct dcomm_store *s, long gen) {
  char key[64];
  void *cur = NULL;
  size_t clen = 0;
  snprintf(key, sizeof(key), DCOMM_KEY_PLAN_FMT, gen);
  if (dcomm__store_compare_set(s, key, NULL, 0, "0\n", 3, &cur, &clen) == 0)
    DCOMM_LOG(WARN, ELASTIC, "round %ld abandoned: everyone moves to the next round", gen);
  free(cur);
}

/* The leader closes round gen and writes the plan; 1: it gave up on the
 * round at the timeout and abandoned it. l holds the launchers' records. */
static int lead_round_with(struct dcomm_store *s, long gen, struct launchers *l) {
  char key[128];
  snprintf(key, sizeof(key), DCOMM_KEY_JOIN_N_FMT, gen);
  /* With launchers, their records say how many members to wait for: the
   * round stays open until all of them joined (a slow survivor must not be
   * left out, or the job would split in two); a launcher lowers its count
   * when a member dies or hangs, and a dead node's record disappears with
   * its lease. Without one, the settle window closes the round. */
  double settle = dcomm__param_double(DCOMM_P_ELASTIC_SETTLE);
  double until = dcomm__now() + settle;
  double hard = dcomm__now() + s->timeout;
  struct gen_seen L;
  read_gen(s, &L);
  int first = !L.present; /* the job's first world */
  double full_since = 0;  /* first round: min nodes, all joined */
  int64_t n = 0;
  int warned = 0;
  char rkey[64];
  for (;;) {
    DCOMM_CHECK(dcomm__store_add(s, key, 0, &n));
    if (get_long(s, DCOMM_KEY_DONE, 0) > 0)
      return dcomm__err(DCOMM_ENOTMEMBER, "the job finished before this member was admitted");
    read_gen(s, &L);
    first = !L.present;
    if (L.present && L.gen >= gen) return 2; /* a later round formed a world: this one is superseded */
    /* The current generation must be over before its successor forms: a
     * member that missed a generation (cut off, frozen) waits here as a
     * joiner until the world it missed revokes itself or takes it in. */
    snprintf(rkey, sizeof(rkey), DCOMM_KEY_REVOKE_FMT, L.gen);
    if (!first && !key_exists(s, rkey)) {
      if (dcomm__now() >= hard) {
        DCOMM_LOG(WARN, ELASTIC, "round %ld: generation %ld is still running; this round waits for it to end", gen,
                  L.gen);
        abandon_round(s, gen);
        return 1;
      }
      until = dcomm__now() + settle;
      usleep(20000);
      continue;
    }
    read_launchers(s, l);
    if (l->nodes > 0) {
      /* Enough tickets: do their holders still run? */
      int ready = n >= l->workers && l->nodes >= l->min_nodes && live_tickets(s, l, gen, n) >= l->workers;
      if (ready && (!first || (l->max_nodes > 0 && l->nodes >= l->max_nodes))) break;
      if (ready && !full_since) full_since = dcomm__now();
      if (!ready) full_since = 0;
      if (ready && dcomm__now() - full_since >= settle) break;
    } else if (dcomm__now() >= until) {
      int have = 0, of = 0;
      if (quorum_reached(s, gen, n, &L, &have, &of)) break;
      if (!warned++)
        DCOMM_LOG(WARN, ELASTIC, "round %ld: %d of the %d members of generation %ld joined; the round waits for more than "
                  "half of them (DCOMM_ELASTIC_MIN_WORLD lowers that), so that two halves of a partition cannot both "
                  "go on", gen, have, of, L.gen);
    }
    if (dcomm__now() >= hard) {
      if (l->nodes > 0 && l->nodes < l->min_nodes)
        DCOMM_LOG(WARN, ELASTIC, "round %ld: %d node%s alive, fewer than the minimum %d, until the timeout", gen,
                  l->nodes, l->nodes == 1 ? "" : "s", l->min_nodes);
      else {
        char missing[1024];
        missing_members(s, l, gen, n, missing, sizeof(missing));
        DCOMM_LOG(WARN, ELASTIC, "round %ld: only %lld of %ld members joined before the timeout%s%s", gen,
                  (long long)n, l->workers, *missing ? "; missing: " : "", missing);
      }
      abandon_round(s, gen);
      return 1;
    }
    usleep(5000);
  }
  if (n < 1) n = 1; /* the leader holds ticket 1 */
  struct joiner *js = calloc((size_t)n, sizeof(*js));
  if (!js) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  int k = 0;
  for (int64_t t = 1; t <= n; t++) {
    struct joiner *j = &js[k];
    if (!read_ticket(s, gen, t, 2.0, j)) continue;
    /* A joiner whose node is gone died with it; a survivor may still be
     * alive, its launcher merely slower to be seen: it is kept. A holder
     * its launcher no longer runs is dead. */
    if (l->nodes > 0 && j->t.old_rank < 0 && j->t.slot > 0 && !slot_alive(l, j->t.slot)) continue;
    if (l->nodes > 0 && !holder_alive(l, j->t.slot, j->t.pid)) {
      DCOMM_LOG(INFO, ELASTIC, "round %ld: ticket %lld's member (pid %ld on node slot %d) died after joining", gen,
                (long long)t, j->t.pid, j->t.slot);
      continue;
    }
    k++;
  }
  qsort(js, (size_t)k, sizeof(*js), cmp_joiner);
  k = admit_nodes(js, k, l->max_nodes, gen);
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
  for (int i = 0; i < k; i++) off += (size_t)snprintf(plan + off, cap - off, "%s\n", js[i].t.id);
  free(js);
  char g[32], nkey[64];
  int gl = snprintf(g, sizeof(g), "%ld", gen);
  snprintf(key, sizeof(key), DCOMM_KEY_PLAN_FMT, gen);
  /* One guarded write: the generation the round follows is still the
   * current one and is over, the plan is new, this node is in the job. */
  struct dcomm_store_cmp cmps[4];
  int nc = 0;
  if (first) cmps[nc++] = (struct dcomm_store_cmp){DCOMM_KEY_GEN, DCOMM_STORE_ABSENT, NULL, 0};
  else {
    cmps[nc++] = (struct dcomm_store_cmp){DCOMM_KEY_GEN, DCOMM_STORE_EQUAL, L.raw, L.len};
    cmps[nc++] = (struct dcomm_store_cmp){rkey, DCOMM_STORE_EXISTS, NULL, 0};
  }
  cmps[nc++] = (struct dcomm_store_cmp){key, DCOMM_STORE_ABSENT, NULL, 0};
  nc += node_guard(nkey, sizeof(nkey), &cmps[nc]);
  struct dcomm_store_put puts[3] = {{key, plan, off + 1}, {DCOMM_KEY_GEN, g, (size_t)gl + 1}, {DCOMM_KEY_FIRST, g, (size_t)gl + 1}};
  int done = 0;
  int rc = dcomm__store_txn(s, cmps, nc, puts, first ? 3 : 2, &done);
  free(plan);
  if (rc < 0) return rc;
  if (!done) {
    DCOMM_CHECK(check_not_fenced(s));
    DCOMM_LOG(WARN, ELASTIC, "round %ld: the job moved on while the round was led (elastic/gen no longer %ld): "
              "this plan is void", gen, L.gen);
    return key_exists(s, key) ? 0 : 2;
  }
  return 0;
}

static int lead_round(struct dcomm_store *s, long gen) {
  struct launchers *l = calloc(1, sizeof(*l)); /* 12 KiB: not on the stack */
  if (!l) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  int rc = lead_round_with(s, gen, l);
  launchers_clear(l);
  free(l);
  return rc;
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
    if (get_long(s, DCOMM_KEY_DONE, 0) > 0)
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
  DCOMM_CHECK(check_not_fenced(s));
  snprintf(key, sizeof(key), DCOMM_KEY_JOIN_N_FMT, gen);
  long die = dcomm__param_int(DCOMM_P_ELASTIC_TEST_DIE_AFTER_TICKET);
  if (die >= 0 && old_rank == die) usleep(300000); /* test hook: not the leader */
  DCOMM_CHECK(dcomm__store_add(s, key, 1, &ticket));
  int ml = snprintf(me, sizeof(me), DCOMM_TICKET_FMT, w->member_id, old_rank,
                    (long)dcomm__param_int(DCOMM_P_AGENT_SLOT), w->local_rank, (long)getpid(), old_gen, old_size);
  snprintf(key, sizeof(key), DCOMM_KEY_TICKET_FMT, gen, (long long)ticket);
  struct dcomm_store_cmp guard;
  int ng = node_guard(nkey, sizeof(nkey), &guard);
  struct dcomm_store_put put = {key, me, (size_t)ml + 1};
  int done = 0;
  DCOMM_CHECK(dcomm__store_txn(s, &guard, ng, &put, 1, &done));
  if (!done) return check_not_fenced(s) < 0 ? DCOMM_ENOTMEMBER : dcomm__err(DCOMM_ENOTMEMBER, "fenced: this member's "
                                                                           "node left the job while it registered");
  if (die >= 0 && old_rank == die) {
    DCOMM_LOG(WARN, ELASTIC, "DCOMM_ELASTIC_TEST_DIE_AFTER_TICKET=%ld: dying after taking ticket %lld", die,
              (long long)ticket);
    raise(SIGKILL);
  }
  if (ticket == 1) {
    DCOMM_LOG(INFO, ELASTIC, "leading round %ld", gen);
    int lr = lead_round(s, gen);
    if (lr < 0) return lr;
    if (lr == 2) abandon_round(s, gen); /* superseded: nobody waits for a plan that cannot come */
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
  int64_t n = get_long(s, key, 0);
  for (int64_t t = 1; t <= n; t++) {
    struct joiner j;
    if (!read_ticket(s, gen, t, 0.001, &j) || j.t.slot <= 0 || j.t.slot >= DCOMM_MAX_SLOTS) continue;
    /* a member of the plan? ids are whole lines */
    size_t il = strlen(j.t.id);
    int in = 0;
    for (char *p = strstr(plan, j.t.id); p && !in; p = strstr(p + 1, j.t.id))
      in = (p == plan || p[-1] == '\n') && p[il] == '\n';
    if (in && !world_slots[j.t.slot]) {
      world_slots[j.t.slot] = 1;
      ++*nodes;
    }
  }
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
  long nproc = 0, slots = get_long(s, DCOMM_KEY_AGENTS_N, 0);
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
  for (int64_t t = 1; t <= n; t++) {
    struct joiner j;
    if (!read_ticket(s, gen + 1, t, 0.001, &j)) continue;
    if (j.t.slot > 0 && j.t.slot < DCOMM_MAX_SLOTS && slots_in[j.t.slot]) return 1;
  }
  DCOMM_LOG(DEBUG, ELASTIC, "members of a spare node wait to join; the world spans the maximum of %d nodes already",
            max_nodes);
  return 0;
}
