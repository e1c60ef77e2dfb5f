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
 * command line), run_proc.c (spawning and output), run_agent_store.c (the
 * store and this node's records), run_heartbeat.c (hung workers),
 * run_rdzv.c (the etcd rendezvous), run.h and run_agent.h.
 */
#include "config.h"
#include "run_agent.h"

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


#include "auth.h"
#include "error.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store.h"

#define TICK_S 0.2           /* heartbeat / deadline check period */
#define SIGNAL_GRACE_S 10.0  /* after forwarding a signal, then SIGKILL */
#define STOP_GRACE_S 5.0     /* after SIGTERM for a restart or a failure */
#define STREAM_GRACE_S 2.0   /* pipes an exited worker left open (grandchildren) */
#define DRAIN_S 1.0          /* reading the last output before exit/restart */

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
  int live = agent_live_count(a);
  /* A fenced node's workers were SIGKILLed at the fence (run_rdzv.c). */
  if (live && a->rdzv && run_rdzv_lost(a->rdzv, NULL, 0)) live = 0;
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
      agent_set_alive(a);
      fail_job(a, "could not start every worker");
      return;
    }
  }
  agent_set_alive(a);
}

/* Policy all, once every worker is gone: a fresh store, N new workers. */
static void restart_all(struct agent *a) {
  free_workers(a);
  agent_store_stop(a);
  int rc = -1;
  for (double until = dcomm__now() + STOP_GRACE_S;;) {
    if ((rc = agent_store_start(a)) == 0 || dcomm__now() >= until) break;
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
  int live = agent_live_count(a), any_done = done_count(a) > 0;
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
    if (agent_store_peek(a, DCOMM_KEY_GEN, gen, sizeof(gen)) == 1) {
      char *end;
      g = strtol(gen, &end, 10);
      if (end == gen) g = 0;
    }
    snprintf(notice, sizeof(notice), "worker %d (pid %d) %s", w->rank, (int)w->pid, desc);
    int rrc = agent_store_usable(a) ? dcomm__post_revoke(a->st, g, notice) : 0;
    if (rrc < 0 && agent_store_mend(a, rrc)) rrc = dcomm__post_revoke(a->st, g, notice);
    if (rrc < 0) agent_store_warn(a, "revoke");
    run_log("worker %d (pid %d) died (%s); generation %ld revoked", w->rank, (int)w->pid, desc, g);
    apply_policy(a, w);
  }
  /* After the policy: with replace, survivors never see the transient N-1. */
  if (a->phase == PH_RUN) agent_set_alive(a);
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

static void tick(struct agent *a) {
  double now = dcomm__now();
  if (a->last_tick > 0 && now - a->last_tick > 1.0 + 5 * TICK_S) {
    a->resumed_at = agent_clock();
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
      a->resumed_at = agent_clock();
    }
  }
  if (a->phase != PH_RUN && !a->hard_killed && now >= a->kill_deadline) {
    int live = agent_live_count(a);
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
  if (a->phase == PH_RUN) agent_heartbeat_check(a);
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
  int live = agent_live_count(a);
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

/* What the start message says about OMP_NUM_THREADS (run_omp_one). */
static const char *omp_note(const struct agent *a) {
  return run_omp_one(a->o.nproc) ? "; OMP_NUM_THREADS=1 for each, set it to change that" : "";
}

/* DCOMM_HEARTBEAT_TIMEOUT; the registry has warned about a malformed value. */
static int run_job(struct agent *a) {
  if (a->o.etcd) {
    if (run_rdzv_open(&a->o, &a->rdzv, &a->st, a->token, &a->slot) < 0) {
      run_log("etcd rendezvous at %s failed: %s", endpoint(a), dcomm_last_error());
      return 1;
    }
    run_log("node slot %d of job %s (etcd %s, --nnodes %d:%d): starting %d worker%s of '%s' (policy %s%s)", a->slot,
            a->o.job_id, endpoint(a), a->o.min_nodes, a->o.max_nodes, a->o.nproc, a->o.nproc == 1 ? "" : "s",
            a->o.argv[0], run_policy_name(a->o.policy), omp_note(a));
  } else {
    int rc = agent_store_start(a);
    if (rc < 0) {
      run_log("cannot host the store on %s: %s", endpoint(a), dcomm_last_error());
      return 1;
    }
    run_log("starting %d worker%s of '%s' (endpoint %s, job id %s, policy %s, max restarts %d%s)", a->o.nproc,
            a->o.nproc == 1 ? "" : "s", a->o.argv[0], endpoint(a), a->o.job_id, run_policy_name(a->o.policy),
            a->o.max_restarts, omp_note(a));
  }
  a->phase = PH_RUN;
  spawn_all(a);
  double next_tick = dcomm__now() + TICK_S;
  for (;;) {
    if (agent_live_count(a) == 0) {
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
  a.hb_timeout = agent_heartbeat_timeout();
  a.port = a.o.port;

  unsigned char r[16]; /* the etcd backend replaces it by the job's */
  if (dcomm__random_bytes(r, sizeof(r)) < 0) {
    run_log("getrandom failed (%s); cannot make the job's token", strerror(errno));
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
  agent_store_stop(&a);
  run_rdzv_close(a.rdzv, code == 0 ? RUN_LEAVE_FINISHED : a.phase == PH_SIGNAL ? RUN_LEAVE_STOPPED : RUN_LEAVE_FAILED);
  close(a.sfd);
  return code;
}
