/*
 * run_heartbeat.c: whether a dcomm-run agent's workers are alive. Each
 * worker's watcher thread writes its heartbeat (elastic/hb/<member-id>,
 * CLOCK_MONOTONIC) to the job's store; a worker whose heartbeat is older
 * than DCOMM_HEARTBEAT_TIMEOUT is hung (SIGSTOPped, blocked, its watcher
 * stuck) and is killed, unless the run queue shows it starved for a
 * processor (then up to ten timeouts), or the store itself is what is
 * silent (etcd not renewing the lease or not taking writes): heartbeats
 * then count from its return.
 */
#include "config.h"
#include "run_agent.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "keys.h"
#include "param.h"

#define STARTUP_GRACE_S 10.0 /* a worker without any heartbeat yet */

/* A late heartbeat (or a first heartbeat late after the start) from a
 * worker that spent at least this share of the time waiting for a
 * processor is the host's overload, not a hang ... */
#define STARVED_SHARE 0.25
/* ... until it is this many times the limit old. */
#define STARVED_MAX_TIMEOUTS 10

/* What a worker's silence of age s is, for the log. */
static const char *silence(char *buf, size_t n, int first, double age) {
  if (first) snprintf(buf, n, "it has sent no heartbeat in the %.1f s since its start", age);
  else snprintf(buf, n, "its last heartbeat is %.1f s old", age);
  return buf;
}

/* 1 when worker w, silent for age s, is hung: past limit (the heartbeat
 * timeout; first: the start-up grace, no heartbeat yet). A worker frozen
 * by SIGSTOP, blocked, or whose watcher thread is stuck does not wait in
 * the run queue; one that 100 processes on 2 cores starve does (or four
 * interpreters importing torch under a sanitizer). The run-queue wait is
 * sampled from half a second before the limit on. */
static int worker_hung(struct agent *a, struct run_worker *w, double age, double now, double limit, int first) {
  if (age <= limit - 0.5) {
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
    if (w->starved && !w->starved_logged && age > limit) {
      char what[96];
      run_log("worker %d (pid %d): %s, but it (or this agent, which carries its heartbeats) waited for a processor "
              "%.0f%% of the last %.1f s: the host is overloaded, the worker is not hung; it is killed if still "
              "silent at %.0f s",
              w->rank, (int)w->pid, silence(what, sizeof(what), first, age), 100.0 * waited / span, span,
              STARVED_MAX_TIMEOUTS * limit);
      w->starved_logged = 1;
    }
    w->late_t = now;
    w->late_wait = wait;
    w->late_own_wait = own;
  }
  if (age <= limit) return 0;
  if (!known || stopped || w->starved == 0) return 1;
  return w->starved > 0 && age > STARVED_MAX_TIMEOUTS * limit;
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

/* Every worker's heartbeat key, read at once: one request per tick for
 * the whole node (1024 workers on 2 cores, one request each, kept this
 * agent from its loop for 13 s). vals[i] is "" for an absent key and for
 * a worker not checked. -1 on a store error. */
#define HB_VAL 64
static int read_heartbeats(struct agent *a, char *vals) {
  char (*keys)[96] = malloc(a->nw * sizeof(*keys));
  const char **kp = malloc(a->nw * sizeof(*kp));
  int *at = malloc(a->nw * sizeof(*at)), n = 0, rc = -1;
  if (keys && kp && at) {
    for (size_t i = 0; i < a->nw; i++) {
      vals[i * HB_VAL] = 0;
      struct run_worker *w = a->w[i];
      if (!w->running || w->hung || w->agent_stop) continue;
      snprintf(keys[n], sizeof(keys[n]), DCOMM_KEY_HB_FMT, w->member);
      kp[n] = keys[n];
      at[n++] = (int)i;
    }
    char *got = malloc((size_t)(n ? n : 1) * HB_VAL);
    if (got && (rc = agent_store_peek_many(a, kp, n, got, HB_VAL)) == 0)
      for (int k = 0; k < n; k++) memcpy(vals + (size_t)at[k] * HB_VAL, got + (size_t)k * HB_VAL, HB_VAL);
    free(got);
  }
  free(keys);
  free(kp);
  free(at);
  return rc;
}

void agent_heartbeat_check(struct agent *a) {
  double now = dcomm__now(), wall = agent_clock();
  if (a->rdzv && (a->etcd_silent || !run_rdzv_healthy(a->rdzv))) return; /* etcd, not the workers, is silent */
  char *hbs = malloc(a->nw * HB_VAL + 1);
  if (!hbs || read_heartbeats(a, hbs) < 0) {
    free(hbs);
    return;
  }
  for (size_t i = 0; i < a->nw && a->phase == PH_RUN; i++) {
    struct run_worker *w = a->w[i];
    if (!w->running || w->hung || w->agent_stop) continue;
    const char *val = hbs + i * HB_VAL;
    int found = val[0] != 0;
    if (found) {
      char *end;
      double t = strtod(val, &end);
      if (end == val) continue;
      a->hb_seen = 1;
      /* While this agent was frozen, it could not take the heartbeats (it
       * hosts the store): they count from its return. */
      double age = wall - (t > a->resumed_at ? t : a->resumed_at);
      if (worker_hung(a, w, age, now, a->hb_timeout, 0)) {
        if (etcd_unwritable(a)) break;
        run_log("worker %d (pid %d) is hung: its last heartbeat is %.1f s old (DCOMM_HEARTBEAT_TIMEOUT %g s)%s; "
                "killing it",
                w->rank, (int)w->pid, age, a->hb_timeout, w->starved > 0 ? " although it waits for a processor" : "");
        w->hung = 1;
        kill(w->pid, SIGKILL);
      }
    } else if (a->hb_seen && worker_hung(a, w, now - w->spawn_t, now, STARTUP_GRACE_S, 1)) {
      if (etcd_unwritable(a)) break;
      run_log("worker %d (pid %d) is hung: no heartbeat %.0f s after its start while the other workers send "
              "theirs%s; killing it",
              w->rank, (int)w->pid, now - w->spawn_t, w->starved > 0 ? " although it waits for a processor" : "");
      w->hung = 1;
      kill(w->pid, SIGKILL);
    }
  }
  free(hbs);
}

double agent_heartbeat_timeout(void) {
  double v = dcomm__param_double(DCOMM_P_HEARTBEAT_TIMEOUT);
  if (!(v > 0)) {
    run_log("warning: DCOMM_HEARTBEAT_TIMEOUT must be more than 0 seconds; using 3");
    v = 3.0;
  }
  return v;
}
