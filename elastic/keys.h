/*
 * keys.h: the store key schema of a job and the node record format, shared
 * by the library's elastic layer and the dcomm-run launcher (one place, so
 * the two sides cannot drift apart), with the few store helpers both use.
 *
 * Keys (no prefix, under the job's namespace):
 *   elastic/gen              the job's current generation ("%ld", NUL included)
 *   elastic/first            the generation of the job's first rendezvous world
 *   elastic/done             set when the job finished: joiners give up
 *   elastic/revoke/<g>       generation g is over; the value says why (create-only)
 *   elastic/hb/<member-id>   a worker's heartbeat (its CLOCK_MONOTONIC, "%.3f")
 *   elastic/join/<g>/n       tickets taken in round g (a counter)
 *   elastic/join/<g>/m/<t>   ticket t: DCOMM_TICKET_FMT
 *   elastic/plan/<g>         the plan of round g: "<n>\n" then n member ids, or "0\n" (abandoned)
 *   rdzv/agents/n            node slots taken (a counter)
 *   rdzv/agent/<slot>        the node record of a launcher (DCOMM_NODE_RECORD_FMT)
 *   rdzv/workers/<slot>      a launcher's workers, one line each: DCOMM_WORKER_LINE_FMT
 *   rdzv/left/<slot>         the node left (etcd backend): "1" when it finished,
 *                            else why it left ("stopped by SIGTERM")
 *   rdzv/nnodes              "min max" node range (etcd backend)
 *   rdzv/token               the job's token (etcd backend)
 *   ckpt/commit/<hash>       a checkpoint directory's commit record
 *   ckpt/last                the job's last committed checkpoint: DCOMM_CKPT_LAST_FMT
 *                            (written in the same guarded write as the record)
 */
#ifndef DCOMM_ELASTIC_KEYS_H
#define DCOMM_ELASTIC_KEYS_H

#include <stddef.h>

struct dcomm_store;

#define DCOMM_KEY_GEN "elastic/gen"
#define DCOMM_KEY_FIRST "elastic/first"
#define DCOMM_KEY_DONE "elastic/done"
#define DCOMM_KEY_REVOKE_FMT "elastic/revoke/%ld"
#define DCOMM_KEY_HB_FMT "elastic/hb/%s"
#define DCOMM_KEY_JOIN_N_FMT "elastic/join/%ld/n"
#define DCOMM_KEY_TICKETS_FMT "elastic/join/%ld/m/" /* then the ticket number */
#define DCOMM_KEY_TICKET_FMT DCOMM_KEY_TICKETS_FMT "%lld"
#define DCOMM_KEY_PLAN_FMT "elastic/plan/%ld"
#define DCOMM_KEY_AGENTS_N "rdzv/agents/n"
#define DCOMM_KEY_AGENT_PREFIX "rdzv/agent/"
#define DCOMM_KEY_AGENT_FMT "rdzv/agent/%ld"
#define DCOMM_KEY_LEFT_FMT "rdzv/left/%ld"
#define DCOMM_KEY_WORKERS_FMT "rdzv/workers/%ld"
/* An agent writes it (under its lease) to learn whether etcd takes writes. */
#define DCOMM_KEY_PROBE_FMT "rdzv/probe/%ld"
#define DCOMM_KEY_CKPT_LAST "ckpt/last"
/* ckpt/last: step, generation, file name. */
#define DCOMM_CKPT_LAST_FMT "%llu %lld %s"
/* A line of rdzv/workers/<slot>: launch rank, local rank, pid, member id. */
#define DCOMM_WORKER_LINE_FMT "%d %d %ld %s\n"
#define DCOMM_KEY_NNODES "rdzv/nnodes"
#define DCOMM_KEY_TOKEN "rdzv/token"
#define DCOMM_KEY_CKPT_FMT "ckpt/commit/%016llx"

/* A ticket: member id, old rank, node slot, local rank, pid, old
 * generation, old world size (-1 for a joiner's rank, generation, size). */
#define DCOMM_TICKET_FMT "%s %d %ld %d %ld %ld %d"
struct dcomm_ticket {
  char id[40];
  int old_rank;
  int slot, local_rank; /* its launcher's node slot (0: none) and local rank */
  long pid;             /* its process id (0: not given) */
  long old_gen;         /* the generation it was a member of (-1: joiner) */
  int old_size;         /* that generation's size (-1: joiner) */
};
/* Reads a ticket record (len bytes, NUL-terminated or not) into t: 0, or
 * -1 when malformed (at least the id and old rank must be there; the
 * rest default to 0, and old generation and size to -1). */
int dcomm__ticket_parse(const void *val, size_t len, struct dcomm_ticket *t);
/* One line of rdzv/workers/<slot> (DCOMM_WORKER_LINE_FMT, without its
 * newline): 0, or -1 when malformed. */
int dcomm__worker_line_parse(const char *line, int *rank, int *local_rank, long *pid, char id[40]);
/* ckpt/last (DCOMM_CKPT_LAST_FMT): 0, or -1 when malformed; the file name
 * is cut to n - 1 bytes. */
int dcomm__ckpt_last_parse(const char *text, unsigned long long *step, long long *gen, char *name, size_t n);

/* A node record: live workers, workers per node, host, the launcher's pid,
 * then " pids=P1,P2,..." (its live workers), " pids=-" (none) or nothing
 * (too many to list: nobody is judged by a list cut short). */
#define DCOMM_NODE_PIDS_TEXT 1024 /* room for the " pids=..." part */
#define DCOMM_NODE_RECORD_MAX (256 + DCOMM_NODE_PIDS_TEXT)
int dcomm__node_record_format(char *buf, size_t n, int live, int nproc, const char *host, long pid, const char *pids);
/* The live count of a record, and its pid list ("P1,P2,..." up to a space
 * or the end) in *pids, or NULL when it has none. 0, or -1 when malformed. */
int dcomm__node_record_parse(const char *rec, long *live, const char **pids);
/* Whether pid is in a record's pid list. */
int dcomm__node_record_has_pid(const char *pids, long pid);

/* A short value now, NUL-terminated in buf: 1 found (cut to n - 1 bytes if
 * longer), 0 absent, < 0 a store error. */
int dcomm__store_peek(struct dcomm_store *s, const char *key, char *buf, size_t n);
/* A decimal value now, or dflt when absent or malformed. */
long dcomm__store_peek_long(struct dcomm_store *s, const char *key, long dflt);
/* Posts the revoke notice of generation gen, create-only: the first reason
 * stays. 0 or a store error. */
int dcomm__post_revoke(struct dcomm_store *s, long gen, const char *why);

#endif
