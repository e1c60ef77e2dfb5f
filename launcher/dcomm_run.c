/*
 * dcomm_run.c: dcomm-run, the launcher/agent of dcomm (torchrun's role).
 *
 * With the static backend it hosts the job's store (the embedded TCP
 * server, authenticated with a per-job random token) so that any worker,
 * rank 0 included, may die; with the etcd backend (run_rdzv.c) the store
 * is etcd and one agent runs per node, registered under a lease. It starts
 * N workers with torchrun's and dcomm's environment; prints their output
 * prefixed with their rank; watches their exits and heartbeats; and applies
 * the restart policy when one dies:
 *   shrink   the survivors recover among themselves (the elastic layer);
 *   replace  a new worker with DCOMM_ELASTIC_JOIN=1 joins the next generation;
 *   all      every worker is stopped, the store restarted, all N started again.
 *
 * Store keys it maintains (no prefix, decimal text):
 *   rdzv/agents/n         node slots taken (this agent took one)
 *   rdzv/agent/<slot>     "live nproc host pid pids=P,...": its live workers
 *   elastic/revoke/<g>    death notice for generation g (read from elastic/gen)
 *   rdzv/workers/<slot>   a line per live worker: rank, local rank, pid, member id
 * and it reads elastic/hb/<member-id>, the workers' heartbeats (their
 * CLOCK_MONOTONIC). "dcomm-run status" and "dcomm-run clean" are
 * run_status.c.
 *
 * One thread of control: a poll() loop over the output pipes and a signalfd
 * (SIGCHLD, SIGINT, SIGTERM, SIGHUP, blocked in every thread, the store
 * server's included, since they are blocked before it starts), with a 200 ms
 * tick for heartbeats and kill deadlines. The other parts: run_args.c (the
 * command line), run_proc.c (spawning and output), run.h.
 */
#include "config.h"
#include "run.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "error.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store.h"

#define TICK_S 0.2           /* heartbeat / deadline check period */
#define SIGNAL_GRACE_S 10.0  /* after forwarding a signal, then SIGKILL */
#define STOP_GRACE_S 5.0     /* after SIGTERM for a restart or a failure */
#define STARTUP_GRACE_S 10.0 /* a worker without any heartbeat yet */
#define STREAM_GRACE_S 2.0   /* pipes an exited worker left open (grandchildren) */
#define DRAIN_S 1.0          /* reading the last output before exit/restart */
#define STORE_TIMEOUT_S 10.0

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

static int live_count(const struct agent *a) {
  int n = 0;
  for (size_t i = 0; i < a->nw; i++) n += a->w[i]->running;
  return n;
}

static int done_count(const struct agent *a) {
  int n = 0;
  for (size_t i = 0; i < a->nw; i++) n += a->w[i]->done;
  return n;
}

static int dead_count(const struct agent *a) {
  int n = 0;
  for (size_t i = 0; i < a->nw; i++) n += a->w[i]->dead;
  return n;
}

/* Heartbeats are compared on CLOCK_MONOTONIC, which every process of one
 * host shares and no clock step moves. */
static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "host:port", "[v6]:port"; etcd: the endpoint list. */
static const char *endpoint(const struct agent *a) {
  static char buf[300];
  if (a->o.etcd) return a->o.endpoints;
  snprintf(buf, sizeof(buf), strchr(a->o.host, ':') ? "[%s]:%d" : "%s:%d", a->o.host, a->port);
  return buf;
}

static const char *signame(int sig) {
  static char buf[16];
  const char *n = sigabbrev_np(sig);
  if (!n) {
    snprintf(buf, sizeof(buf), "%d", sig);
    return buf;
  }
  snprintf(buf, sizeof(buf), "SIG%s", n);
  return buf;
}

/* ---- the store ---- */

static void store_warn(struct agent *a, const char *what) {
  if (a->store_warned) return;
  a->store_warned = 1;
  run_log("warning: store %s failed: %s", what, dcomm_last_error());
}

/* Once this node is out of the etcd job, its store calls are pointless. */
static int store_usable(struct agent *a) { return a->st && !(a->rdzv && run_rdzv_lost(a->rdzv, NULL, 0)); }

static void store_set_text(struct agent *a, const char *key, const char *val) {
  if (!store_usable(a)) return;
  if (dcomm__store_set(a->st, key, val, strlen(val) + 1) < 0) store_warn(a, "set");
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
    if (!run_rdzv_lost(a->rdzv, NULL, 0) && run_rdzv_put(a->rdzv, key, v) < 0) store_warn(a, "update of the worker list");
  } else {
    store_set_text(a, key, v);
  }
  free(v);
}

/* This node's record, which the rounds' leaders read. */
static void set_alive(struct agent *a) {
  char pids[DCOMM_NODE_PIDS_TEXT];
  live_pids(a, pids, sizeof(pids));
  set_workers(a);
  if (a->rdzv) {
    if (run_rdzv_update(a->rdzv, live_count(a), pids) < 0) store_warn(a, "update of the node record");
    return;
  }
  char v[DCOMM_NODE_RECORD_MAX], key[64];
  if (dcomm__node_record_format(v, sizeof(v), live_count(a), a->o.nproc, "static", (long)getpid(), pids) < 0) return;
  snprintf(key, sizeof(key), DCOMM_KEY_AGENT_FMT, (long)a->slot);
  store_set_text(a, key, v);
}

/* Reads a short text value without waiting; 1 found, 0 absent, -1 error. */
static int store_peek(struct agent *a, const char *key, char *buf, size_t n) {
  if (!store_usable(a)) return -1;
  int rc = a->rdzv ? run_rdzv_peek(a->rdzv, key, buf, n) : dcomm__store_peek(a->st, key, buf, n);
  if (rc < 0) store_warn(a, "get");
  return rc < 0 ? -1 : rc;
}

static int store_start(struct agent *a) {
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

static void store_stop(struct agent *a) {
  if (a->st) dcomm__store_close(a->st);
  a->st = NULL;
  if (a->srv) dcomm__store_server_stop(a->srv);
  a->srv = NULL;
}

/* ---- workers ---- */

static void kill_all(struct agent *a, int sig) {
  for (size_t i = 0; i < a->nw; i++)
    if (a->w[i]->running) kill(a->w[i]->pid, sig);
}

/* Sends sig to every live worker and enters a teardown phase. */
static void begin_teardown(struct agent *a, enum phase ph, double grace, int sig) {
  a->phase = ph;
  a->kill_deadline = dcomm__now() + grace;
  a->hard_killed = 0;
  for (size_t i = 0; i < a->nw; i++)
    if (a->w[i]->running) a->w[i]->agent_stop = 1;
  kill_all(a, sig);
}

static void fail_job(struct agent *a, const char *reason) {
  snprintf(a->fail_reason, sizeof(a->fail_reason), "%s", reason);
  int live = live_count(a);
  if (live) run_log("%s; stopping the %d remaining worker%s", reason, live, live == 1 ? "" : "s");
  begin_teardown(a, PH_FAIL, STOP_GRACE_S, SIGTERM);
}

static struct run_worker *spawn_one(struct agent *a, int rank, int local_rank, int join) {
  if (a->nw == a->capw) {
    size_t ncap = a->capw ? a->capw * 2 : 16;
    struct run_worker **nv = realloc(a->w, ncap * sizeof(*nv));
    if (!nv) {
      run_log("cannot start worker %d: out of memory", rank);
      return NULL;
    }
    a->w = nv;
    a->capw = ncap;
  }
  struct run_worker *w = malloc(sizeof(*w));
  if (!w) {
    run_log("cannot start worker %d: out of memory", rank);
    return NULL;
  }
  struct run_env e = {.etcd = a->o.etcd ? a->o.endpoints : NULL,
                      .slot = a->slot,
                      .addr = a->o.host,
                      .port = a->port,
                      .app_port = a->app_port,
                      .token = a->token,
                      .job_id = a->o.job_id,
                      .world = a->o.nproc,
                      .local_rank = local_rank,
                      .restart_count = a->restarts,
                      .max_restarts = a->o.max_restarts,
                      .cpu = run_bind_cpu(a->o.bind, a->o.nproc, local_rank)};
  if (run_spawn(w, rank, join, &e, a->o.argv, &a->child_mask) < 0) {
    free(w);
    return NULL;
  }
  w->local_rank = local_rank;
  a->w[a->nw++] = w;
  return w;
}

static void free_workers(struct agent *a) {
  for (size_t i = 0; i < a->nw; i++) {
    struct run_worker *w = a->w[i];
    for (int k = 0; k < 2; k++) run_stream_close(&w->s[k], w->rank, a->o.quiet_prefix);
    free(w);
  }
  a->nw = 0;
}

/* Starts ranks 0..N-1 of a launch; a failed start fails the job. */
static void spawn_all(struct agent *a) {
  a->next_rank = a->o.nproc;
  a->hb_seen = 0;
  for (int r = 0; r < a->o.nproc; r++) {
    if (!spawn_one(a, r, r, 0)) {
      set_alive(a);
      fail_job(a, "could not start every worker");
      return;
    }
  }
  set_alive(a);
}

/* Policy all, once every worker is gone: a fresh store, N new workers. */
static void restart_all(struct agent *a) {
  free_workers(a);
  store_stop(a);
  int rc = -1;
  for (double until = dcomm__now() + STOP_GRACE_S;;) {
    if ((rc = store_start(a)) == 0 || dcomm__now() >= until) break;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (rc < 0) {
    char msg[1600];
    snprintf(msg, sizeof(msg), "cannot restart the store on %s: %s", endpoint(a), dcomm_last_error());
    fail_job(a, msg);
    return;
  }
  a->phase = PH_RUN;
  spawn_all(a);
  if (a->phase == PH_RUN)
    run_log("restart %d of %d: started %d workers (store restarted on %s)", a->restarts, a->o.max_restarts,
            a->o.nproc, endpoint(a));
}

static void apply_policy(struct agent *a, struct run_worker *w) {
  char msg[256];
  int live = live_count(a), any_done = done_count(a) > 0;
  if (any_done) a->late_deaths++;
  switch (a->o.policy) {
    case RUN_SHRINK:
      if (!any_done && live < a->o.min_nproc) {
        if (live == 0) snprintf(msg, sizeof(msg), "every worker died");
        else snprintf(msg, sizeof(msg), "only %d worker%s left, fewer than --min-nproc %d", live,
                      live == 1 ? "" : "s", a->o.min_nproc);
        fail_job(a, msg);
      }
      break;
    case RUN_REPLACE:
      if (any_done) {
        run_log("worker %d is not replaced: the job is finishing (a worker already exited 0)", w->rank);
      } else if (a->restarts < a->o.max_restarts) {
        a->restarts++;
        int rank = a->next_rank++;
        struct run_worker *nw = spawn_one(a, rank, w->local_rank, 1);
        if (!nw) {
          fail_job(a, "could not start a replacement worker");
          return;
        }
        run_log("started worker %d (pid %d) to replace worker %d (restart %d of %d)", rank, (int)nw->pid, w->rank,
                a->restarts, a->o.max_restarts);
      } else {
        snprintf(msg, sizeof(msg), "worker %d died and no restarts are left (--max-restarts %d)", w->rank,
                 a->o.max_restarts);
        fail_job(a, msg);
      }
      break;
    case RUN_ALL:
      if (a->restarts < a->o.max_restarts) {
        a->restarts++;
        run_log("restarting all %d workers (restart %d of %d)", a->o.nproc, a->restarts, a->o.max_restarts);
        begin_teardown(a, PH_RESTART, STOP_GRACE_S, SIGTERM);
      } else {
        snprintf(msg, sizeof(msg), "worker %d died and no restarts are left (--max-restarts %d)", w->rank,
                 a->o.max_restarts);
        fail_job(a, msg);
      }
      break;
  }
}

static void on_worker_exit(struct agent *a, struct run_worker *w, int status) {
  w->running = 0;
  w->status = status;
  w->exit_t = dcomm__now();
  /* Its last lines first, so that they come before the death notice. */
  for (int k = 0; k < 2; k++) run_stream_pump(&w->s[k], w->rank, a->o.quiet_prefix);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) w->done = 1;
  else w->dead = 1;
  char desc[128], why[300];
  run_describe_status(status, desc, sizeof(desc));
  if (a->phase == PH_RUN && a->rdzv && run_rdzv_lost(a->rdzv, why, sizeof(why))) {
    char msg[400]; /* fenced: the worker died by this agent's own hand */
    snprintf(msg, sizeof(msg), "this node left the job: %s", why);
    fail_job(a, msg);
  }
  if (a->phase != PH_RUN || w->agent_stop) {
    if (w->dead) run_log("worker %d (pid %d) stopped (%s)", w->rank, (int)w->pid, desc);
    return;
  }
  if (w->dead) {
    char gen[32], notice[256];
    long g = 0;
    if (store_peek(a, DCOMM_KEY_GEN, gen, sizeof(gen)) == 1) {
      char *end;
      g = strtol(gen, &end, 10);
      if (end == gen) g = 0;
    }
    snprintf(notice, sizeof(notice), "worker %d (pid %d) %s", w->rank, (int)w->pid, desc);
    if (store_usable(a) && dcomm__post_revoke(a->st, g, notice) < 0) store_warn(a, "revoke");
    run_log("worker %d (pid %d) died (%s); generation %ld revoked", w->rank, (int)w->pid, desc, g);
    apply_policy(a, w);
  }
  /* After the policy: with replace, survivors never see the transient N-1. */
  if (a->phase == PH_RUN) set_alive(a);
}

static void reap(struct agent *a) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    for (size_t i = 0; i < a->nw; i++)
      if (a->w[i]->running && a->w[i]->pid == pid) {
        on_worker_exit(a, a->w[i], status);
        break;
      }
  }
}

/* A late heartbeat from a worker that spent at least this share of the time
 * waiting for a processor is the host's overload, not a hang ... */
#define STARVED_SHARE 0.25
/* ... until it is this many heartbeat timeouts old. */
#define STARVED_MAX_TIMEOUTS 10

/* 1 when worker w, whose last heartbeat is age s old, is hung. A worker
 * frozen by SIGSTOP, blocked, or whose watcher thread is stuck does not wait
 * in the run queue; one that 100 processes on 2 cores starve does. The
 * run-queue wait is sampled from half a second before the timeout on. */
static int late_worker_hung(struct agent *a, struct run_worker *w, double age, double now) {
  if (age <= a->hb_timeout - 0.5) {
    w->late_t = 0;
    w->starved = w->starved_logged = 0;
    return 0;
  }
  unsigned long long wait = 0, own = 0;
  int stopped = 0, own_stopped;
  int known = run_proc_sched(w->pid, &wait, &stopped) == 0;
  if (run_proc_sched(getpid(), &own, &own_stopped) < 0) own = 0;
  if (w->late_t == 0) {
    w->late_t = now;
    w->late_wait = wait;
    w->late_own_wait = own;
    w->starved = -1; /* judged half a second from now */
  } else if (known && now - w->late_t >= 0.5) {
    double span = now - w->late_t;
    double waited = wait > w->late_wait ? (double)(wait - w->late_wait) / 1e9 : 0.0;
    /* The heartbeat goes through this agent's store server: its own wait
     * for a processor delays it as much. */
    double own_waited = own > w->late_own_wait ? (double)(own - w->late_own_wait) / 1e9 : 0.0;
    if (own_waited > waited) waited = own_waited;
    w->starved = waited >= STARVED_SHARE * span;
    if (w->starved && !w->starved_logged && age > a->hb_timeout) {
      run_log("worker %d (pid %d): its last heartbeat is %.1f s old, but it (or this agent, which carries its "
              "heartbeats) waited for a processor %.0f%% of the last %.1f s: the host is overloaded, the worker is "
              "not hung; it is killed if still silent at %.0f s",
              w->rank, (int)w->pid, age, 100.0 * waited / span, span, STARVED_MAX_TIMEOUTS * a->hb_timeout);
      w->starved_logged = 1;
    }
    w->late_t = now;
    w->late_wait = wait;
    w->late_own_wait = own;
  }
  if (age <= a->hb_timeout) return 0;
  if (!known || stopped || w->starved == 0) return 1;
  return w->starved > 0 && age > STARVED_MAX_TIMEOUTS * a->hb_timeout;
}

/* 1 when etcd does not take writes: then no worker can write its
 * heartbeat, and their ages count from etcd's return (tick). */
static int etcd_unwritable(struct agent *a) {
  if (!a->rdzv || run_rdzv_write_probe(a->rdzv) == 0) return 0;
  if (!a->etcd_silent)
    run_log("etcd renews this node's lease but does not take writes (%s): the workers' heartbeats count from its "
            "return", dcomm_last_error());
  a->etcd_silent = 1;
  return 1;
}

static void heartbeat_check(struct agent *a) {
  double now = dcomm__now(), wall = wall_now();
  if (a->rdzv && (a->etcd_silent || !run_rdzv_healthy(a->rdzv))) return; /* etcd, not the workers, is silent */
  for (size_t i = 0; i < a->nw && a->phase == PH_RUN; i++) {
    struct run_worker *w = a->w[i];
    if (!w->running || w->hung || w->agent_stop) continue;
    char key[96], val[64];
    snprintf(key, sizeof(key), DCOMM_KEY_HB_FMT, w->member);
    int found = store_peek(a, key, val, sizeof(val));
    if (found < 0) return;
    if (found) {
      char *end;
      double t = strtod(val, &end);
      if (end == val) continue;
      a->hb_seen = 1;
      /* While this agent was frozen, it could not take the heartbeats (it
       * hosts the store): they count from its return. */
      double age = wall - (t > a->resumed_at ? t : a->resumed_at);
      if (late_worker_hung(a, w, age, now)) {
        if (etcd_unwritable(a)) return;
        run_log("worker %d (pid %d) is hung: its last heartbeat is %.1f s old (DCOMM_HEARTBEAT_TIMEOUT %g s)%s; "
                "killing it",
                w->rank, (int)w->pid, age, a->hb_timeout, w->starved > 0 ? " although it waits for a processor" : "");
        w->hung = 1;
        kill(w->pid, SIGKILL);
      }
    } else if (a->hb_seen && now - w->spawn_t > STARTUP_GRACE_S) {
      if (etcd_unwritable(a)) return;
      run_log("worker %d (pid %d) is hung: no heartbeat %.0f s after its start while the other workers send "
              "theirs; killing it",
              w->rank, (int)w->pid, STARTUP_GRACE_S);
      w->hung = 1;
      kill(w->pid, SIGKILL);
    }
  }
}

static void tick(struct agent *a) {
  double now = dcomm__now();
  if (a->last_tick > 0 && now - a->last_tick > 1.0 + 5 * TICK_S) {
    a->resumed_at = wall_now();
    run_log("dcomm-run did not run for %.1f s (stopped or starved); the workers' heartbeats are judged from now",
            now - a->last_tick);
  }
  a->last_tick = now;
  if (a->rdzv) {
    run_rdzv_check_fence(a->rdzv);
    /* After an etcd outage (the workers may have been paused, and their
     * heartbeats could not be written) heartbeats count from its end: when
     * etcd renews the lease and takes a write again. */
    if (!run_rdzv_healthy(a->rdzv)) a->etcd_silent = 1;
    else if (a->etcd_silent && run_rdzv_write_probe(a->rdzv) == 0) {
      a->etcd_silent = 0;
      a->resumed_at = wall_now();
    }
  }
  if (a->phase != PH_RUN && !a->hard_killed && now >= a->kill_deadline) {
    int live = live_count(a);
    if (live) {
      run_log("%d worker%s still alive after the grace period; killing %s", live, live == 1 ? "" : "s",
              live == 1 ? "it" : "them");
      kill_all(a, SIGKILL);
    }
    a->hard_killed = 1;
  }
  char why[300];
  if (a->phase == PH_RUN && a->rdzv && run_rdzv_lost(a->rdzv, why, sizeof(why))) {
    char msg[400];
    snprintf(msg, sizeof(msg), "this node left the job: %s", why);
    fail_job(a, msg);
  }
  if (a->phase == PH_RUN) heartbeat_check(a);
  for (size_t i = 0; i < a->nw; i++) {
    struct run_worker *w = a->w[i];
    if (!w->running && now - w->exit_t > STREAM_GRACE_S)
      for (int k = 0; k < 2; k++) run_stream_close(&w->s[k], w->rank, a->o.quiet_prefix);
  }
}

static void on_signal(struct agent *a, int sig) {
  if (a->phase == PH_SIGNAL) {
    if ((sig == SIGINT || sig == SIGTERM) && !a->hard_killed) {
      run_log("second %s: killing the workers", signame(sig));
      kill_all(a, SIGKILL);
      a->hard_killed = 1;
    } else if (!a->hard_killed) {
      kill_all(a, sig);
    }
    return;
  }
  a->sig = sig;
  int live = live_count(a);
  run_log("received %s; forwarding it to %d worker%s", signame(sig), live, live == 1 ? "" : "s");
  /* An orderly stop (a pod deletion): the other nodes learn that this node
   * leaves, and go on without it at once. */
  if (a->rdzv && a->phase == PH_RUN && !run_rdzv_lost(a->rdzv, NULL, 0)) {
    char why[64];
    snprintf(why, sizeof(why), "stopped by %s", signame(sig));
    run_rdzv_leave(a->rdzv, why);
  }
  begin_teardown(a, PH_SIGNAL, SIGNAL_GRACE_S, sig);
}

/* Reads every signal queued on the signalfd; returns 1 if SIGCHLD was one. */
static int read_signals(struct agent *a) {
  int chld = 0;
  struct signalfd_siginfo si;
  while (read(a->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
    if (si.ssi_signo == SIGCHLD) chld = 1;
    else on_signal(a, (int)si.ssi_signo);
  }
  return chld;
}

/* One poll() round over the signalfd (if with_signals) and the open streams. */
static void poll_once(struct agent *a, int timeout_ms, int with_signals) {
  size_t cap = 1 + 2 * a->nw;
  struct pollfd *p = calloc(cap, sizeof(*p));
  struct run_stream **sp = calloc(cap, sizeof(*sp));
  int *rk = calloc(cap, sizeof(*rk));
  if (!p || !sp || !rk) {
    free(p);
    free(sp);
    free(rk);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    return;
  }
  size_t n = 0;
  if (with_signals) p[n++] = (struct pollfd){.fd = a->sfd, .events = POLLIN};
  for (size_t i = 0; i < a->nw; i++)
    for (int k = 0; k < 2; k++)
      if (a->w[i]->s[k].fd >= 0) {
        sp[n] = &a->w[i]->s[k];
        rk[n] = a->w[i]->rank;
        p[n++] = (struct pollfd){.fd = a->w[i]->s[k].fd, .events = POLLIN};
      }
  int rc = poll(p, n, timeout_ms);
  if (rc > 0) {
    int chld = 0;
    for (size_t i = 0; i < n; i++) {
      if (!p[i].revents) continue;
      if (with_signals && i == 0) chld = read_signals(a);
      else run_stream_pump(sp[i], rk[i], a->o.quiet_prefix);
    }
    if (chld) reap(a);
  }
  free(p);
  free(sp);
  free(rk);
}

static int open_streams(const struct agent *a) {
  int n = 0;
  for (size_t i = 0; i < a->nw; i++) n += (a->w[i]->s[0].fd >= 0) + (a->w[i]->s[1].fd >= 0);
  return n;
}

/* The last output of exited workers, for at most DRAIN_S. */
static void drain(struct agent *a) {
  double until = dcomm__now() + DRAIN_S;
  while (open_streams(a) && dcomm__now() < until) poll_once(a, dcomm__ms_until(until), 0);
  for (size_t i = 0; i < a->nw; i++)
    for (int k = 0; k < 2; k++) run_stream_close(&a->w[i]->s[k], a->w[i]->rank, a->o.quiet_prefix);
}

/* DCOMM_HEARTBEAT_TIMEOUT; the registry has warned about a malformed value. */
static double heartbeat_timeout(void) {
  double v = dcomm__param_double(DCOMM_P_HEARTBEAT_TIMEOUT);
  if (!(v > 0)) {
    run_log("warning: DCOMM_HEARTBEAT_TIMEOUT must be more than 0 seconds; using 3");
    v = 3.0;
  }
  return v;
}

static int run_job(struct agent *a) {
  if (a->o.etcd) {
    if (run_rdzv_open(&a->o, &a->rdzv, &a->st, a->token, &a->slot) < 0) {
      run_log("etcd rendezvous at %s failed: %s", endpoint(a), dcomm_last_error());
      return 1;
    }
    run_log("node slot %d of job %s (etcd %s, --nnodes %d:%d): starting %d worker%s of '%s' (policy %s)", a->slot,
            a->o.job_id, endpoint(a), a->o.min_nodes, a->o.max_nodes, a->o.nproc, a->o.nproc == 1 ? "" : "s",
            a->o.argv[0], run_policy_name(a->o.policy));
  } else {
    int rc = store_start(a);
    if (rc < 0) {
      run_log("cannot host the store on %s: %s", endpoint(a), dcomm_last_error());
      return 1;
    }
    run_log("starting %d worker%s of '%s' (endpoint %s, job id %s, policy %s, max restarts %d)", a->o.nproc,
            a->o.nproc == 1 ? "" : "s", a->o.argv[0], endpoint(a), a->o.job_id, run_policy_name(a->o.policy),
            a->o.max_restarts);
  }
  a->phase = PH_RUN;
  spawn_all(a);
  double next_tick = dcomm__now() + TICK_S;
  for (;;) {
    if (live_count(a) == 0) {
      if (a->phase != PH_RESTART) break;
      drain(a);
      restart_all(a);
      continue;
    }
    poll_once(a, dcomm__ms_until(next_tick), 1);
    if (dcomm__now() >= next_tick) {
      tick(a);
      next_tick = dcomm__now() + TICK_S;
    }
  }
  drain(a);
  double el = dcomm__now() - a->t0;
  int done = done_count(a), dead = dead_count(a);
  switch (a->phase) {
    case PH_SIGNAL:
      run_log("stopped by %s after %.2f s", signame(a->sig), el);
      return 128 + a->sig;
    case PH_FAIL:
    case PH_RESTART:
      run_log("job failed: %s (after %.2f s)", a->fail_reason, el);
      return 1;
    case PH_RUN:
      break;
  }
  if (done > 0 && a->late_deaths) {
    run_log("job failed: %d worker%s died after the job had started to finish (after %.2f s)", a->late_deaths,
            a->late_deaths == 1 ? "" : "s", el);
    return 1;
  }
  if (done > 0) {
    if (dead) run_log("job finished: %d worker%s exited 0, %d died (after %.2f s)", done, done == 1 ? "" : "s", dead,
                      el);
    else run_log("job finished: %d worker%s exited 0 (after %.2f s)", done, done == 1 ? "" : "s", el);
    return 0;
  }
  run_log("job failed: no worker exited 0 (after %.2f s)", el);
  return 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "status")) return run_status_main(argc - 1, argv + 1);
  if (argc > 1 && !strcmp(argv[1], "clean")) return run_clean_main(argc - 1, argv + 1);
  struct agent a;
  memset(&a, 0, sizeof(a));
  a.sfd = -1;
  a.t0 = dcomm__now();
  int code = 0;
  if (run_parse_args(argc, argv, &a.o, &code) != 0) return code;
  dcomm__log_setup();
  if (dcomm__params_load() < 0) run_log("warning: %s (using the default)", dcomm_last_error());
  a.hb_timeout = heartbeat_timeout();
  a.port = a.o.port;

  unsigned char r[16]; /* the etcd backend replaces it by the job's */
  if (RAND_bytes(r, sizeof(r)) != 1) {
    run_log("RAND_bytes failed; cannot make the job's token");
    return 1;
  }
  for (int i = 0; i < 16; i++) snprintf(a.token + 2 * i, 3, "%02x", r[i]);
  /* The operator's own token (static backend), so that dcomm-run status can
   * prove it too; etcd jobs agree on theirs in etcd. */
  const char *own = dcomm__param_str(DCOMM_P_AUTH_TOKEN);
  if (!a.o.etcd && own && *own) {
    if (strlen(own) < sizeof(a.token)) snprintf(a.token, sizeof(a.token), "%s", own);
    else run_log("warning: DCOMM_AUTH_TOKEN is longer than %zu characters; using a random token", sizeof(a.token) - 1);
  }

  /* Blocked before the store server's threads exist, so they inherit it.
   * A stop signal ignored at start (nohup, a background job's SIGINT) stays
   * ignored, for the agent and, through exec, for the workers. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  const int stop_sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) {
    struct sigaction old;
    if (sigaction(stop_sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&set, stop_sigs[i]);
  }
  if (sigprocmask(SIG_BLOCK, &set, &a.child_mask) < 0 ||
      (a.sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
    run_log("signalfd: %s", strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  code = run_job(&a);

  /* Nothing may outlive us: kill and reap whatever is left. */
  kill_all(&a, SIGKILL);
  for (size_t i = 0; i < a.nw; i++)
    if (a.w[i]->running) {
      int st;
      while (waitpid(a.w[i]->pid, &st, 0) < 0 && errno == EINTR) {
      }
      a.w[i]->running = 0;
    }
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  free_workers(&a);
  free(a.w);
  store_stop(&a);
  run_rdzv_close(a.rdzv, code == 0 ? RUN_LEAVE_FINISHED : a.phase == PH_SIGNAL ? RUN_LEAVE_STOPPED : RUN_LEAVE_FAILED);
  close(a.sfd);
  return code;
}
