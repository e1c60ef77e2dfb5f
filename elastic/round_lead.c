/*
 * round_lead.c: the leader of a recovery round (round_lead.h). It keeps
 * the round open until the launchers' records say every live member has
 * joined (or, without launchers, until the settle window ends and a
 * majority of the last generation is in), orders the members (survivors
 * by old rank, then joiners by node slot and local rank), admits at most
 * the maximum nodes and world, and writes the plan in one guarded txn
 * (see the fencing rules at the top of rounds.c).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "param.h"
#include "round_lead.h"
#include "round_state.h"
#include "sock.h"

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

/* Tickets 1..n whose holders still run (see holder_alive). */
static int64_t live_tickets(struct dcomm_store *s, const struct launchers *l, long gen, int64_t n) {
  int64_t live = 0;
  struct joiner *js = dcomm__round_read_tickets(s, gen, n, 0.001);
  /* A ticket taken but not yet written counts: its holder is at work. */
  for (int64_t i = 0; js && i < n; i++)
    if (!js[i].ticket || dcomm__round_holder_alive(l, js[i].t.slot, js[i].t.pid)) live++;
  free(js);
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

/* Without launchers: whether the tickets hold enough members of the
 * generation before (L): more than half of it, or DCOMM_ELASTIC_MIN_WORLD
 * when that is set. Two halves of a partition cannot both have it. */
static int quorum_reached(struct dcomm_store *s, long gen, int64_t n, const struct gen_seen *L, int *have, int *of) {
  *have = 0;
  *of = 0;
  if (!L->present) return 1; /* the first world: nothing to split */
  struct joiner *js = dcomm__round_read_tickets(s, gen, n, 0.001);
  for (int64_t i = 0; js && i < n; i++) {
    const struct joiner *j = &js[i];
    if (!j->ticket || j->t.old_rank < 0 || j->t.old_gen != L->gen) continue;
    (*have)++;
    if (j->t.old_size > *of) *of = j->t.old_size;
  }
  free(js);
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
  struct joiner *js = have && have_slot ? dcomm__round_read_tickets(s, gen, n, 0.001) : NULL;
  for (int64_t i = 0; js && i < n; i++)
    if (js[i].ticket) {
      have[nh] = js[i].t.pid;
      have_slot[nh++] = js[i].t.slot;
    }
  free(js);
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

void dcomm__round_abandon(struct dcomm_store *s, long gen) {
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
  dcomm__round_read_gen(s, &L);
  int first = !L.present; /* the job's first world */
  double full_since = 0;  /* first round: min nodes, all joined */
  int64_t n = 0;
  int warned = 0;
  char rkey[64];
  for (;;) {
    DCOMM_CHECK(dcomm__store_add(s, key, 0, &n));
    if (dcomm__store_peek_long(s, DCOMM_KEY_DONE, 0) > 0)
      return dcomm__err(DCOMM_ENOTMEMBER, "the job finished before this member was admitted");
    dcomm__round_read_gen(s, &L);
    first = !L.present;
    if (L.present && L.gen >= gen) return 2; /* a later round formed a world: this one is superseded */
    /* The current generation must be over before its successor forms: a
     * member that missed a generation (cut off, frozen) waits here as a
     * joiner until the world it missed revokes itself or takes it in. */
    snprintf(rkey, sizeof(rkey), DCOMM_KEY_REVOKE_FMT, L.gen);
    if (!first && !dcomm__round_key_exists(s, rkey)) {
      if (dcomm__now() >= hard) {
        DCOMM_LOG(WARN, ELASTIC, "round %ld: generation %ld is still running; this round waits for it to end", gen,
                  L.gen);
        dcomm__round_abandon(s, gen);
        return 1;
      }
      until = dcomm__now() + settle;
      usleep(20000);
      continue;
    }
    dcomm__round_read_launchers(s, l);
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
      dcomm__round_abandon(s, gen);
      return 1;
    }
    usleep(5000);
  }
  if (n < 1) n = 1; /* the leader holds ticket 1 */
  /* A ticket taken is written at once: 2 s for the last ones to come. */
  struct joiner *js = dcomm__round_read_tickets(s, gen, n, 2.0);
  if (!js) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  int k = 0;
  for (int64_t i = 0; i < n; i++) {
    struct joiner *j = &js[k];
    if (!js[i].ticket) continue;
    int64_t t = js[i].ticket;
    *j = js[i];
    /* A joiner whose node is gone died with it; a survivor may still be
     * alive, its launcher merely slower to be seen: it is kept. A holder
     * its launcher no longer runs is dead. */
    if (l->nodes > 0 && j->t.old_rank < 0 && j->t.slot > 0 && !dcomm__round_slot_alive(l, j->t.slot)) continue;
    if (l->nodes > 0 && !dcomm__round_holder_alive(l, j->t.slot, j->t.pid)) {
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
  nc += dcomm__round_node_guard(nkey, sizeof(nkey), &cmps[nc]);
  struct dcomm_store_put puts[3] = {{key, plan, off + 1}, {DCOMM_KEY_GEN, g, (size_t)gl + 1}, {DCOMM_KEY_FIRST, g, (size_t)gl + 1}};
  int done = 0;
  int rc = dcomm__store_txn(s, cmps, nc, puts, first ? 3 : 2, &done);
  free(plan);
  if (rc < 0) return rc;
  if (!done) {
    DCOMM_CHECK(dcomm__round_check_fenced(s));
    DCOMM_LOG(WARN, ELASTIC, "round %ld: the job moved on while the round was led (elastic/gen no longer %ld): "
              "this plan is void", gen, L.gen);
    return dcomm__round_key_exists(s, key) ? 0 : 2;
  }
  return 0;
}

int dcomm__round_lead(struct dcomm_store *s, long gen) {
  struct launchers *l = calloc(1, sizeof(*l)); /* 12 KiB: not on the stack */
  if (!l) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  int rc = lead_round_with(s, gen, l);
  dcomm__round_launchers_clear(l);
  free(l);
  return rc;
}
