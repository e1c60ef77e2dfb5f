/*
 * run_agent_store.c: the job's store as a dcomm-run agent uses it: with the
 * static backend it hosts the embedded store server and takes a node slot;
 * with either backend it publishes this node's record (live workers and
 * their pids) and worker list, and reads keys without waiting. A link
 * to the store it hosts that broke (a request outlived its bound while
 * this process was starved or stopped) connects again and the call is
 * tried once more; a failed call is warned about once; once this node is
 * out of an etcd job the store is left alone.
 */
#include "config.h"
#include "run_agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "keys.h"
#include "sock.h"
#include "store.h"

#define STORE_TIMEOUT_S 10.0

void agent_store_warn(struct agent *a, const char *what) {
  if (a->store_warned) return;
  a->store_warned = 1;
  run_log("warning: store %s failed: %s", what, dcomm_last_error());
}

int agent_store_mend(struct agent *a, int rc) {
  if (rc != DCOMM_EPEERLOST && rc != DCOMM_ETIMEDOUT) return 0;
  if (a->rdzv || !a->st || strcmp(dcomm__store_kind(a->st), "tcp") != 0) return 0;
  if (dcomm__store_tcp_redial(a->st, STORE_TIMEOUT_S) < 0) return 0;
  run_log("the link to the store broke (%s); connected again", dcomm_last_error());
  return 1;
}

/* Once this node is out of the etcd job, its store calls are pointless. */
int agent_store_usable(struct agent *a) { return a->st && !(a->rdzv && run_rdzv_lost(a->rdzv, NULL, 0)); }

static void store_set_text(struct agent *a, const char *key, const char *val) {
  if (!agent_store_usable(a)) return;
  int rc = dcomm__store_set(a->st, key, val, strlen(val) + 1);
  if (rc < 0 && agent_store_mend(a, rc)) rc = dcomm__store_set(a->st, key, val, strlen(val) + 1);
  if (rc < 0) agent_store_warn(a, "set");
}

/* " pids=P1,P2,..." of the workers not reaped yet: a round's leader
 * counts a joined member only while its pid is listed. */
static void live_pids(const struct agent *a, char *buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, " pids=");
  int any = 0;
  for (size_t i = 0; i < a->nw && off < n; i++)
    if (a->w[i]->running) off += (size_t)snprintf(buf + off, n - off, "%s%d", any++ ? "," : "", (int)a->w[i]->pid);
  if (!any) snprintf(buf, n, " pids=-");
  if (off >= n) buf[0] = 0; /* too many to list: no list, so nobody is judged by one cut short */
}

/* rdzv/workers/<slot>: a line per live worker (launch rank, local rank,
 * pid, member id), which dcomm-run status and a round's leader (naming
 * members that never joined) read. Written with the node record. */
static void set_workers(struct agent *a) {
  size_t cap = 64 + 80 * (a->nw + 1), off = 0;
  char *v = malloc(cap), key[64];
  if (!v) return;
  v[0] = 0;
  for (size_t i = 0; i < a->nw; i++)
    if (a->w[i]->running)
      off += (size_t)snprintf(v + off, cap - off, DCOMM_WORKER_LINE_FMT, a->w[i]->rank, a->w[i]->local_rank,
                              (long)a->w[i]->pid, a->w[i]->member);
  snprintf(key, sizeof(key), DCOMM_KEY_WORKERS_FMT, (long)a->slot);
  if (a->rdzv) {
    if (!run_rdzv_lost(a->rdzv, NULL, 0) && run_rdzv_put(a->rdzv, key, v) < 0) agent_store_warn(a, "update of the worker list");
  } else {
    store_set_text(a, key, v);
  }
  free(v);
}

/* This node's record, which the rounds' leaders read. */
void agent_set_alive(struct agent *a) {
  char pids[DCOMM_NODE_PIDS_TEXT];
  live_pids(a, pids, sizeof(pids));
  set_workers(a);
  if (a->rdzv) {
    if (run_rdzv_update(a->rdzv, agent_live_count(a), pids) < 0) agent_store_warn(a, "update of the node record");
    return;
  }
  char v[DCOMM_NODE_RECORD_MAX], key[64];
  if (dcomm__node_record_format(v, sizeof(v), agent_live_count(a), a->o.nproc, "static", (long)getpid(), pids) < 0) return;
  snprintf(key, sizeof(key), DCOMM_KEY_AGENT_FMT, (long)a->slot);
  store_set_text(a, key, v);
}

/* Reads a short text value without waiting; 1 found, 0 absent, -1 error. */
int agent_store_peek(struct agent *a, const char *key, char *buf, size_t n) {
  if (!agent_store_usable(a)) return -1;
  int rc = a->rdzv ? run_rdzv_peek(a->rdzv, key, buf, n) : dcomm__store_peek(a->st, key, buf, n);
  if (rc < 0 && agent_store_mend(a, rc)) rc = dcomm__store_peek(a->st, key, buf, n);
  if (rc < 0) agent_store_warn(a, "get");
  return rc < 0 ? -1 : rc;
}

static int peek_many_once(struct agent *a, const char *const *keys, int n, char *bufs, size_t sz) {
  if (a->rdzv) { /* etcd: this node's workers only, one read each */
    for (int i = 0; i < n; i++) {
      int rc = run_rdzv_peek(a->rdzv, keys[i], bufs + (size_t)i * sz, sz);
      if (rc < 0) return rc;
      if (rc == 0) bufs[(size_t)i * sz] = 0;
    }
    return 0;
  }
  void **vals = calloc((size_t)n + 1, sizeof(void *));
  size_t *lens = calloc((size_t)n + 1, sizeof(size_t));
  int rc = vals && lens ? dcomm__store_get_many(a->st, keys, n, 0, vals, lens)
                        : dcomm__err(DCOMM_ENOMEM, "out of memory reading %d keys", n);
  if (rc == DCOMM_ETIMEDOUT) rc = 0; /* some absent: their vals are NULL */
  for (int i = 0; vals && lens && i < n; i++) {
    size_t l = vals[i] ? (lens[i] < sz ? lens[i] : sz - 1) : 0;
    if (rc == 0 && l) memcpy(bufs + (size_t)i * sz, vals[i], l);
    if (rc == 0) bufs[(size_t)i * sz + l] = 0;
    free(vals[i]);
  }
  free(vals);
  free(lens);
  return rc;
}

int agent_store_peek_many(struct agent *a, const char *const *keys, int n, char *bufs, size_t sz) {
  if (!agent_store_usable(a)) return -1;
  if (n <= 0) return 0;
  int rc = peek_many_once(a, keys, n, bufs, sz);
  if (rc < 0 && agent_store_mend(a, rc)) rc = peek_many_once(a, keys, n, bufs, sz);
  if (rc < 0) agent_store_warn(a, "get");
  return rc < 0 ? -1 : 0;
}

int agent_store_start(struct agent *a) {
  int rc = dcomm__store_server_start(a->o.host, a->port, a->o.job_id, a->token, &a->srv);
  if (rc < 0) return rc;
  a->port = dcomm__store_server_port(a->srv);
  /* A port that was free a moment ago, as torchrun hands its workers: a
   * torch program's env:// rendezvous listens there on rank 0. */
  int lfd = -1;
  if (dcomm__sock_listen(a->o.host, 0, 1, &lfd, &a->app_port) == 0) close(lfd);
  else a->app_port = a->port;
  rc = dcomm__store_tcp_connect(a->o.host, a->port, a->o.job_id, a->token, STORE_TIMEOUT_S, STORE_TIMEOUT_S,
                                &a->st);
  if (rc == 0) rc = dcomm__store_set_prefix(a->st, "");
  int64_t slot = 0;
  if (rc == 0) rc = dcomm__store_add(a->st, DCOMM_KEY_AGENTS_N, 1, &slot);
  a->slot = (int)slot;
  if (rc < 0) {
    if (a->st) dcomm__store_close(a->st);
    a->st = NULL;
    dcomm__store_server_stop(a->srv);
    a->srv = NULL;
  }
  a->store_warned = 0;
  return rc;
}

void agent_store_stop(struct agent *a) {
  if (a->st) dcomm__store_close(a->st);
  a->st = NULL;
  if (a->srv) dcomm__store_server_stop(a->srv);
  a->srv = NULL;
}
