/*
 * round_state.c: the store reads a recovery round's leader and members
 * share (round_state.h): tickets, the launchers' node records, the current
 * generation, the fencing guard.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "param.h"
#include "round_state.h"

void dcomm__round_launchers_clear(struct launchers *l) {
  for (int i = 0; i < DCOMM_MAX_SLOTS; i++) free(l->pids[i]);
  memset(l, 0, sizeof(*l));
}

int dcomm__round_slot_alive(const struct launchers *l, int slot) {
  return slot > 0 && slot < DCOMM_MAX_SLOTS && l->live_slot[slot];
}

void dcomm__round_read_launchers(struct dcomm_store *s, struct launchers *l) {
  dcomm__round_launchers_clear(l);
  long slots = dcomm__store_peek_long(s, DCOMM_KEY_AGENTS_N, 0);
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

int dcomm__round_holder_alive(const struct launchers *l, int slot, long pid) {
  /* A node whose record is gone is out of the job (its lease ended; its
   * agent fenced itself): none of its members counts, survivor or not. */
  if (l->nodes > 0 && slot > 0 && slot < DCOMM_MAX_SLOTS && !l->live_slot[slot]) return 0;
  if (slot <= 0 || slot >= DCOMM_MAX_SLOTS || pid <= 0 || !l->pids[slot]) return 1;
  return dcomm__node_record_has_pid(l->pids[slot], pid);
}

struct joiner *dcomm__round_read_tickets(struct dcomm_store *s, long gen, int64_t n, double wait) {
  size_t m = n > 0 ? (size_t)n : 0;
  struct joiner *js = calloc(m ? m : 1, sizeof(*js));
  void **vals = calloc(m ? m : 1, sizeof(*vals));
  size_t *lens = calloc(m ? m : 1, sizeof(*lens));
  if (!js || !vals || !lens) {
    free(js);
    js = NULL;
    m = 0;
  }
  char prefix[64];
  snprintf(prefix, sizeof(prefix), DCOMM_KEY_TICKETS_FMT, gen);
  /* Absent at the deadline (a member took a ticket, then died) or any
   * failure: those entries stay unread. */
  if (m) (void)dcomm__store_get_numbered(s, prefix, 1, (int)m, wait, NULL, NULL, vals, lens);
  for (size_t i = 0; i < m; i++) {
    if (vals[i] && dcomm__ticket_parse(vals[i], lens[i], &js[i].t) == 0) js[i].ticket = (long)(i + 1);
    else memset(&js[i], 0, sizeof(js[i]));
    free(vals[i]);
  }
  free(vals);
  free(lens);
  return js;
}

void dcomm__round_read_gen(struct dcomm_store *s, struct gen_seen *g) {
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

int dcomm__round_key_exists(struct dcomm_store *s, const char *key) {
  void *val = NULL;
  size_t len = 0;
  int found = dcomm__store_get(s, key, 0.001, &val, &len) == 0;
  free(val);
  return found;
}

int dcomm__round_node_guard(char *key, size_t n, struct dcomm_store_cmp *cmp) {
  long slot = dcomm__param_int(DCOMM_P_AGENT_SLOT);
  if (slot <= 0) return 0;
  snprintf(key, n, DCOMM_KEY_AGENT_FMT, slot);
  *cmp = (struct dcomm_store_cmp){key, DCOMM_STORE_EXISTS, NULL, 0};
  return 1;
}

int dcomm__round_check_fenced(struct dcomm_store *s) {
  char key[64];
  struct dcomm_store_cmp cmp;
  if (!dcomm__round_node_guard(key, sizeof(key), &cmp) || dcomm__store_peek_long(s, DCOMM_KEY_AGENTS_N, 0) <= 0 || dcomm__round_key_exists(s, key)) return 0;
  return dcomm__err(DCOMM_ENOTMEMBER, "fenced: this member's node (slot %ld) is no longer in the job (its record %s "
                    "is gone: the node's lease ended while it was cut off or frozen)",
                    (long)dcomm__param_int(DCOMM_P_AGENT_SLOT), key);
}
