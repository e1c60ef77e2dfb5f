/*
 * round_state.h: what a recovery round reads from the store, and the guard
 * its writes carry (round_state.c): the members' tickets, the launchers'
 * node records, the job's current generation, and whether this member's
 * node is still in the job (fencing). Used by a round's leader
 * (round_lead.c) and by its members (rounds.c); the protocol is told at the
 * top of rounds.c.
 */
#ifndef DCOMM_ELASTIC_ROUND_STATE_H
#define DCOMM_ELASTIC_ROUND_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "keys.h"
#include "store.h"

#define DCOMM_MAX_SLOTS 1024 /* node slots a job may hand out */

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

/* What the launchers say: live nodes and the workers they run. */
struct launchers {
  int nodes;            /* agent slots whose record exists (0: no launcher) */
  long workers;         /* live workers of those nodes */
  int min_nodes, max_nodes; /* rdzv/nnodes; 0: not set */
  int live_slot[DCOMM_MAX_SLOTS]; /* 1: the slot's node is alive */
  char *pids[DCOMM_MAX_SLOTS];    /* its record's "P1,P2,..." list, or NULL: none */
};

/* Frees l's lists and empties it. */
void dcomm__round_launchers_clear(struct launchers *l);
/* Reads the launchers' records into l (empty or from an earlier call). */
void dcomm__round_read_launchers(struct dcomm_store *s, struct launchers *l);
/* 1 when slot's node record was there at the last read. */
int dcomm__round_slot_alive(const struct launchers *l, int slot);
/* Whether the holder of a ticket (node slot, pid) still runs, as its
 * launcher's record says: 0 only when the record lists its live workers'
 * pids and this one is not among them, or when the node's record is gone;
 * 1 otherwise (no launcher, a record without a list). */
int dcomm__round_holder_alive(const struct launchers *l, int slot, long pid);
/* Reads tickets 1..n of round gen at once (get_many), waiting up to wait
 * seconds for all: entry t-1 (ticket t) has .ticket == t when read, 0 when
 * absent or malformed. malloc'd (free it); NULL out of memory. */
struct joiner *dcomm__round_read_tickets(struct dcomm_store *s, long gen, int64_t n, double wait);
/* The job's current generation (elastic/gen) into g. */
void dcomm__round_read_gen(struct dcomm_store *s, struct gen_seen *g);
/* 1 when key exists. */
int dcomm__round_key_exists(struct dcomm_store *s, const char *key);
/* The compare that this member's node is still in the job (its launcher's
 * record exists; under the node's lease with etcd), in *cmp with its key in
 * key[n]: 1, or 0 when this member has no launcher slot. */
int dcomm__round_node_guard(char *key, size_t n, struct dcomm_store_cmp *cmp);
/* DCOMM_ENOTMEMBER (detail set) when this member's node is out of the
 * job, else 0. */
int dcomm__round_check_fenced(struct dcomm_store *s);

#endif
