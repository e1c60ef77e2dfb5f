/*
 * run_agent.h: the state of one dcomm-run agent (struct agent), shared by
 * its main loop (dcomm_run.c), its store and node records
 * (run_agent_store.c) and its judgement of the workers' heartbeats
 * (run_heartbeat.c). Private to dcomm-run.
 */
#ifndef DCOMM_RUN_AGENT_H
#define DCOMM_RUN_AGENT_H

#include <signal.h>
#include <time.h>

#include "run.h"

enum phase {
  PH_RUN,     /* workers running; deaths go through the policy */
  PH_RESTART, /* policy all: stopping every worker, then restart */
  PH_FAIL,    /* the job failed: stopping the rest, then exit 1 */
  PH_SIGNAL,  /* a signal was forwarded: waiting, then exit 128+sig */
};

struct agent {
  struct run_opts o;
  struct run_worker **w;
  size_t nw, capw;
  int next_rank;
  int restarts;
  int late_deaths; /* workers that died after another had already exited 0 */
  struct dcomm_store_server *srv;
  struct dcomm_store *st;
  struct run_rdzv *rdzv; /* etcd backend */
  int slot;              /* this node's slot */
  int port; /* the store's actual port */
  int app_port; /* MASTER_PORT: free for the program's own store (torch's) */
  char token[33];
  int sfd;
  sigset_t child_mask;
  enum phase phase;
  double kill_deadline;
  int hard_killed;
  int sig;
  int hb_seen; /* some worker of this launch has sent a heartbeat */
  double hb_timeout;
  double last_tick;   /* when tick last ran (a long gap: this agent was frozen) */
  double resumed_at;  /* CLOCK_MONOTONIC when it came back; heartbeats count from there */
  int etcd_silent;    /* etcd did not renew the lease or take a write (heartbeats count from its return) */
  int store_warned;
  double t0;
  char fail_reason[512];
};

static inline int agent_live_count(const struct agent *a) {
  int n = 0;
  for (size_t i = 0; i < a->nw; i++) n += a->w[i]->running;
  return n;
}

/* Heartbeats are compared on CLOCK_MONOTONIC, which every process of one
 * host shares and no clock step moves. */
static inline double agent_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- run_agent_store.c: the job's store as the agent uses it ---- */

/* The first failure of a store call, once, as a warning. */
void agent_store_warn(struct agent *a, const char *what);
/* After a call on a->st failed with rc: a broken tcp link connects again
 * (1: try the call once more), else 0. */
int agent_store_mend(struct agent *a, int rc);
/* 0 once this node is out of the etcd job (its store calls are pointless). */
int agent_store_usable(struct agent *a);
/* Publishes this node's record and its worker list (rdzv/agent/<slot>,
 * rdzv/workers/<slot>), which the rounds' leaders and dcomm-run status read. */
void agent_set_alive(struct agent *a);
/* Reads a short text value without waiting; 1 found, 0 absent, -1 error. */
int agent_store_peek(struct agent *a, const char *key, char *buf, size_t n);
/* The same for n keys at once (one request per 1024 keys on the store
 * this agent hosts): bufs[i] (each of size sz) holds key i's value, ""
 * when absent. 0, or -1 on a store error. */
int agent_store_peek_many(struct agent *a, const char *const *keys, int n, char *bufs, size_t sz);
/* The static backend: starts the embedded store server, connects to it and
 * takes a node slot; < 0 on error (dcomm_last_error). */
int agent_store_start(struct agent *a);
void agent_store_stop(struct agent *a);

/* ---- run_heartbeat.c: are the workers alive? ---- */

/* Kills (SIGKILL, marked hung) every worker whose heartbeat is older than
 * DCOMM_HEARTBEAT_TIMEOUT, unless it is starved for a processor, or etcd,
 * not the worker, is silent. */
void agent_heartbeat_check(struct agent *a);
/* DCOMM_HEARTBEAT_TIMEOUT, checked (> 0). */
double agent_heartbeat_timeout(void);

#endif
