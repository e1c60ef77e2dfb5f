/*
 * watcher.c: the heartbeat and revoke watcher. One thread per process, with its own
 * store link, that every DCOMM_HEARTBEAT_INTERVAL writes this member's
 * heartbeat (dcomm-run kills a worker whose heartbeat stops: a SIGSTOPped
 * or hung process) and waits for the revoke notice of the current
 * generation. The notice comes from the launcher (a worker exited) or from
 * any rank whose call failed; on it, every communicator of the generation
 * is aborted so no survivor stays blocked, whichever link it waits on.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "elastic.h"
#include "error.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store.h"
#include "world.h"

static void abort_generation(struct dcomm_world *w, long gen, const char *why) {
  pthread_mutex_lock(&w->lock);
  if (w->generation == gen && w->initialized) {
    if (strstr(why, "scale-up: ")) /* not a failure: members wait to join (train_loop.c) */
      DCOMM_LOG(INFO, ELASTIC, "scale-up: generation %ld ends to admit members that wait to join", gen);
    else DCOMM_LOG(WARN, ELASTIC, "generation %ld revoked (%s): aborting its communicators", gen, why);
    /* Also ends the waits of communicators still being built (host.c). */
    __atomic_store_n(&w->revoked, gen + 1, __ATOMIC_RELEASE);
    dcomm__world_abort_locked(w);
  }
  pthread_mutex_unlock(&w->lock);
}

/* The launcher's PMIx server said a process is gone: revoke the
 * generation (create-only: the first notice stays). */
static void post_lost_hint(struct dcomm_world *w, long gen) {
  int r = __atomic_load_n(&w->lost_hint, __ATOMIC_RELAXED) - 1;
  char why[96];
  if (r >= 0) snprintf(why, sizeof(why), "the PMIx server reports rank %d lost", r);
  else snprintf(why, sizeof(why), "the PMIx server reports a lost process");
  if (dcomm__post_revoke(w->estore, gen, why) < 0)
    DCOMM_LOG(WARN, ELASTIC, "cannot post the PMIx loss notice: %s", dcomm_last_error());
}

/* Sleeps for s seconds, or less once the watcher is told to stop. */
static void nap(struct dcomm_world *w, double s) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  double t = (double)until.tv_sec + (double)until.tv_nsec * 1e-9 + s;
  until.tv_sec = (time_t)t;
  until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
  pthread_mutex_lock(&w->nap_mu);
  while (!__atomic_load_n(&w->watcher_stop, __ATOMIC_ACQUIRE) &&
         pthread_cond_clockwait(&w->nap_cv, &w->nap_mu, CLOCK_MONOTONIC, &until) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&w->nap_mu);
}

static void *watcher_main(void *arg) {
  struct dcomm_world *w = arg;
  double interval = dcomm__param_double(DCOMM_P_HEARTBEAT_INTERVAL);
  long acted = -1; /* last generation whose revoke was acted on */
  if (interval < 0.05) interval = 0.05;
  char hbkey[128];
  snprintf(hbkey, sizeof(hbkey), DCOMM_KEY_HB_FMT, w->member_id);
  while (!__atomic_load_n(&w->watcher_stop, __ATOMIC_ACQUIRE)) {
    char hb[64]; /* CLOCK_MONOTONIC: shared by the processes of one host */
    int n = snprintf(hb, sizeof(hb), "%.3f", dcomm__now());
    if (dcomm__store_set(w->estore, hbkey, hb, (size_t)n + 1) < 0) {
      /* A tcp link dropped after a request outlived its bound (the store's
       * host was frozen): connect again, or try at the next beat. */
      if (!strcmp(dcomm__store_kind(w->estore), "tcp")) (void)dcomm__store_tcp_redial(w->estore, interval);
      nap(w, interval);
      continue;
    }
    long gen = __atomic_load_n(&w->generation, __ATOMIC_ACQUIRE);
    if (__atomic_exchange_n(&w->lost_hint_set, 0, __ATOMIC_ACQ_REL)) post_lost_hint(w, gen);
    if (gen == acted) {
      nap(w, interval);
      continue;
    }
    char key[64];
    snprintf(key, sizeof(key), DCOMM_KEY_REVOKE_FMT, gen);
    void *val = NULL;
    size_t len = 0;
    /* The blocking get doubles as the heartbeat sleep. */
    int rc = dcomm__store_get(w->estore, key, interval, &val, &len);
    if (rc == 0) {
      abort_generation(w, gen, len && ((char *)val)[len - 1] == 0 ? (char *)val : "notice");
      acted = gen;
    } else if (rc != DCOMM_ETIMEDOUT) {
      nap(w, interval);
    }
    free(val);
  }
  return NULL;
}

int dcomm__elastic_start(struct dcomm_world *w) {
  if (w->watcher_running) return 0;
  w->watcher_stop = 0;
  if (pthread_create(&w->watcher, NULL, watcher_main, w) != 0)
    return dcomm__err(DCOMM_ESYSTEM, "cannot start the elastic watcher thread");
  w->watcher_running = 1;
  return 0;
}

void dcomm__elastic_stop(struct dcomm_world *w) {
  if (!w->watcher_running) return;
  pthread_mutex_lock(&w->nap_mu);
  __atomic_store_n(&w->watcher_stop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&w->nap_cv);
  pthread_mutex_unlock(&w->nap_mu);
  /* Its blocking get (a heartbeat interval) ends now where the store can
   * end it, so that dcomm_finalize returns promptly. */
  dcomm__store_interrupt(w->estore);
  pthread_join(w->watcher, NULL);
  w->watcher_running = 0;
}
