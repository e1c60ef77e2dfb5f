/*
 * run_rdzv.c: dcomm-run's etcd rendezvous (--rdzv-backend etcd), one agent
 * per node or pod. The agent
 *   - clears the keys of a finished or dead earlier job with the same id
 *     (no live agent left), guarded by a transaction so that it never
 *     wipes an agent that registered meanwhile;
 *   - agrees with the other agents on the job's token (rdzv/token) and its
 *     node range (rdzv/nnodes "min max": a different --nnodes is refused);
 *   - takes a node slot (rdzv/agents/n) and registers rdzv/agent/<slot>
 *     ("live nproc host pid pids=P,...") under a lease of DCOMM_RDZV_TTL seconds,
 *     renewed every third of it by a keepalive thread;
 *   - watches rdzv/agent/: when another node's record vanishes (its lease
 *     ended: the node died or lost etcd) and that node did not leave
 *     cleanly (rdzv/left/<slot>), it revokes the current generation, so the
 *     workers abort at once instead of waiting for a socket timeout.
 * The rounds themselves (who is in the next world) are elastic/rounds.c,
 * run by the workers over the etcd store; they read the records.
 * Self-fencing: the agent measures on CLOCK_MONOTONIC the time since it
 * sent its last renewal that etcd answered. Once that passes the TTL less
 * a margin (run_rdzv_fence_after), before the lease can expire on the
 * server (whose clock started later, when it received that renewal), the
 * agent SIGSTOPs its workers (keepalive thread or the main loop, whichever
 * looks first; a frozen agent looks first thing after SIGCONT): from then
 * on they run no instruction until etcd has said the lease is alive. The
 * agent keeps trying:
 *   - etcd answers and the lease is alive: nobody can have taken this node
 *     for dead (an etcd that was down or without a leader restores its
 *     leases with a fresh TTL when a leader takes over), so the workers get
 *     SIGCONT and the job goes on: a short etcd outage (a restart, a lost
 *     quorum) costs a pause, not the job;
 *   - etcd answers that the lease is gone: the others went on without this
 *     node; its workers are SIGKILLed and dcomm-run exits 1 (run_rdzv_lost);
 *   - no answer for DCOMM_RDZV_OUTAGE_TIMEOUT seconds: the same, without
 *     further etcd calls.
 * By the time the other nodes see this node's record gone, its workers are
 * stopped or dead; what they wrote while cut off is refused by the guarded
 * writes of rounds.c and checkpoint_coll.c.
 */
#include "config.h"
#include "run.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#include "auth.h"
#include "error.h"
#include "etcd_client.h"
#include "keys.h"
#include "param.h"
#include "sock.h"
#include "store.h"

struct run_rdzv {
  const struct run_opts *o;
  struct dcomm_etcd *kc, *wc; /* record client; watch client */
  struct dcomm_etcd *lc;      /* keepalive client: TTL/12 timeouts */
  struct dcomm_etcd *uc;      /* node record updates: TTL/3 timeouts */
  int healthy;                /* the last keepalive was answered */
  struct dcomm_store *wst;    /* the watch thread's store (revoke notices) */
  char ns[300];               /* "/dcomm/<job>/" */
  int slot;
  int64_t lease, ttl;
  int64_t watch_rev;
  pthread_t ka, watch;
  int ka_running, watch_running;
  int stop, cancel;
  pthread_mutex_t lock;
  int lost;
  char lost_why[256];
  pid_t *pids;   /* the workers to kill when fencing (under lock) */
  size_t npids;
  int64_t last_ok_ns; /* CLOCK_MONOTONIC when the last answered renewal was sent */
  int paused;         /* the workers are SIGSTOPped until etcd vouches for the lease (under lock) */
  double outage_max;  /* DCOMM_RDZV_OUTAGE_TIMEOUT: seconds without an answer before leaving */
  char host[128];
};

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Sends sig to every worker (under lock). */
static void signal_workers_locked(struct run_rdzv *r, int sig) {
  for (size_t i = 0; i < r->npids; i++) kill(r->pids[i], sig);
}

/* Out of the job: its workers are killed at once (they are this process's
 * children, not reaped yet, so their pids cannot have been reused). */
static void set_lost(struct run_rdzv *r, const char *why) {
  pthread_mutex_lock(&r->lock);
  if (!r->lost) {
    r->lost = 1;
    snprintf(r->lost_why, sizeof(r->lost_why), "%s", why);
    signal_workers_locked(r, SIGKILL);
    run_log("fenced: %s; killed %zu worker%s", why, r->npids, r->npids == 1 ? "" : "s");
  }
  pthread_mutex_unlock(&r->lock);
}

/* The lease may expire on the server any moment now: the workers stop
 * until etcd says it is alive (resume_workers) or this node is out. */
static void pause_workers(struct run_rdzv *r, double since) {
  pthread_mutex_lock(&r->lock);
  if (!r->paused && !r->lost) {
    r->paused = 1;
    signal_workers_locked(r, SIGSTOP);
    run_log("etcd has not renewed this node's lease for %.1f s (TTL %lld s): paused %zu worker%s until etcd answers "
            "(they leave the job if it has not within DCOMM_RDZV_OUTAGE_TIMEOUT %g s)",
            since, (long long)r->ttl, r->npids, r->npids == 1 ? "" : "s", r->outage_max);
  }
  pthread_mutex_unlock(&r->lock);
}

static void resume_workers(struct run_rdzv *r, double outage) {
  pthread_mutex_lock(&r->lock);
  if (r->paused && !r->lost) {
    r->paused = 0;
    signal_workers_locked(r, SIGCONT);
    run_log("etcd answers again after %.1f s and this node's lease is alive: resumed %zu worker%s", outage, r->npids,
            r->npids == 1 ? "" : "s");
  }
  pthread_mutex_unlock(&r->lock);
}

static int64_t mono_ns(void) { return (int64_t)(dcomm__now() * 1e9); }

double run_rdzv_fence_after(double ttl) {
  double margin = ttl / 6.0;
  if (margin < 0.5) margin = 0.5;
  return ttl - margin;
}

int run_rdzv_check_fence(struct run_rdzv *r) {
  double since = (double)(mono_ns() - __atomic_load_n(&r->last_ok_ns, __ATOMIC_ACQUIRE)) / 1e9;
  double fence = run_rdzv_fence_after((double)r->ttl);
  if (!run_rdzv_lost(r, NULL, 0) && since > fence) {
    if (since > r->outage_max) {
      char why[256];
      snprintf(why, sizeof(why), "etcd has not answered for %.1f s (DCOMM_RDZV_OUTAGE_TIMEOUT %g s; TTL %lld s)",
               since, r->outage_max, (long long)r->ttl);
      set_lost(r, why);
    } else {
      pause_workers(r, since);
    }
  }
  return run_rdzv_lost(r, NULL, 0);
}

static void key_of(const struct run_rdzv *r, char *buf, size_t n, const char *fmt, long arg) {
  int off = snprintf(buf, n, "%s", r->ns);
  snprintf(buf + off, n - (size_t)off, fmt, arg);
}

#define AGENT_KEYS DCOMM_KEY_AGENT_PREFIX /* + slot: the node records */

/* The job's prefix of the node records. */
static void agents_prefix(const struct run_rdzv *r, char *buf, size_t n) { snprintf(buf, n, "%s" AGENT_KEYS, r->ns); }

/* ---- the lease ---- */

/* Renews every sixth of the TTL; a renewal that fails is tried again at
 * once (each try is bounded by a twelfth of the TTL: a try begun while the
 * network was down cannot succeed, its SYN is lost), so that a blip of
 * half the TTL is ridden out without fencing. */
static void *keepalive_main(void *arg) {
  struct run_rdzv *r = arg;
  double period = (double)r->ttl / 6.0;
  if (period < 0.2) period = 0.2;
  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    double next = dcomm__now() + period;
    while (dcomm__now() < next && !__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE))
      if (run_rdzv_check_fence(r)) return NULL;
      else sleep_s(0.05);
    if (__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) break;
    int64_t left = 0, sent = mono_ns();
    int rc = dcomm__etcd_lease_keepalive(r->lc, r->lease, &left);
    __atomic_store_n(&r->healthy, rc == 0 && left > 0, __ATOMIC_RELEASE);
    if (rc == 0 && left > 0) {
      double outage = (double)(sent - __atomic_load_n(&r->last_ok_ns, __ATOMIC_ACQUIRE)) / 1e9;
      __atomic_store_n(&r->last_ok_ns, sent, __ATOMIC_RELEASE);
      resume_workers(r, outage);
    } else if (rc < 0 && rc != DCOMM_ENOTFOUND) {
      if (run_rdzv_check_fence(r)) break;
      sleep_s(0.05);
      continue;
    } else if (rc == DCOMM_ENOTFOUND || (rc == 0 && left <= 0)) {
      set_lost(r, "its etcd lease expired (the other nodes have gone on without this one)");
      break;
    }
    if (run_rdzv_check_fence(r)) break;
  }
  return NULL;
}

/* ---- the watch on the other nodes ---- */

static int slot_of(const struct run_rdzv *r, const char *key, size_t klen) {
  size_t pl = strlen(r->ns) + strlen(AGENT_KEYS);
  if (klen <= pl) return -1;
  char *end;
  long s = strtol(key + pl, &end, 10);
  return *end || s <= 0 ? -1 : (int)s;
}

/* A node's record vanished: revoke the generation unless it left cleanly
 * or the job is over. */
static void node_gone(struct run_rdzv *r, int slot) {
  char key[64], buf[64], notice[128];
  snprintf(key, sizeof(key), DCOMM_KEY_LEFT_FMT, (long)slot);
  int left = dcomm__store_peek(r->wst, key, buf, sizeof(buf)) == 1;
  if (left && !strcmp(buf, "1")) return; /* it finished */
  if (dcomm__store_peek(r->wst, DCOMM_KEY_DONE, notice, sizeof(notice)) == 1) return;
  long gen = dcomm__store_peek_long(r->wst, DCOMM_KEY_GEN, -1);
  if (gen < 0) {
    run_log("node slot %d is gone before the first world formed", slot);
    return;
  }
  if (left) snprintf(notice, sizeof(notice), "node slot %d left the job (%s)", slot, buf);
  else snprintf(notice, sizeof(notice), "node slot %d lost its etcd lease", slot);
  if (dcomm__post_revoke(r->wst, gen, notice) < 0)
    run_log("warning: cannot post the revoke notice for node slot %d: %s", slot, dcomm_last_error());
  else run_log("%s; generation %ld revoked", notice, gen);
}

static int watch_event(const struct dcomm_etcd_event *ev, void *arg) {
  struct run_rdzv *r = arg;
  if (ev->mod_revision > r->watch_rev) r->watch_rev = ev->mod_revision;
  if (ev->type != DCOMM_ETCD_DELETE) return 0;
  int slot = slot_of(r, ev->key, ev->klen);
  if (slot == r->slot) {
    if (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) set_lost(r, "its own node record was removed from etcd");
    return 0;
  }
  if (slot > 0) node_gone(r, slot);
  return 0;
}

static void *watch_main(void *arg) {
  struct run_rdzv *r = arg;
  char prefix[400];
  agents_prefix(r, prefix, sizeof(prefix));
  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    int rc = dcomm__etcd_watch(r->wc, prefix, 1, r->watch_rev + 1, -1, watch_event, r, &r->cancel);
    if (rc == DCOMM_EREVOKED || __atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) break;
    if (rc == DCOMM_ENOTFOUND) { /* compacted: start again from now */
      struct dcomm_etcd_kv *kvs = NULL;
      size_t n = 0;
      int64_t rev = 0;
      if (dcomm__etcd_range_prefix(r->wc, prefix, &kvs, &n, &rev) == 0) r->watch_rev = rev;
      dcomm__etcd_kvs_free(kvs, n);
    }
    sleep_s(0.2);
  }
  return NULL;
}

/* ---- set-up ---- */

static int etcd_opts_from_params(struct dcomm_etcd_opts *eo, double timeout) {
  memset(eo, 0, sizeof(*eo));
  eo->timeout = timeout;
  eo->user = dcomm__param_str(DCOMM_P_ETCD_USER);
  eo->password = dcomm__param_str(DCOMM_P_ETCD_PASSWORD);
  eo->cacert = dcomm__param_str(DCOMM_P_ETCD_CACERT);
  eo->cert = dcomm__param_str(DCOMM_P_ETCD_CERT);
  eo->key = dcomm__param_str(DCOMM_P_ETCD_KEY);
  return 0;
}

/* The earlier job with this id is over (no agent alive): its keys go, in
 * a transaction on the slot counter. The counter is read before the
 * records and registration bumps it together with its record (register),
 * so an agent that registers meanwhile either shows up in the range or
 * makes the transaction fail: it is never wiped. */
static int clear_stale(struct run_rdzv *r, const char *done_msg) {
  char prefix[400], nkey[400];
  agents_prefix(r, prefix, sizeof(prefix));
  snprintf(nkey, sizeof(nkey), "%s" DCOMM_KEY_AGENTS_N, r->ns);
  for (int tries = 0; tries < 8; tries++) {
    struct dcomm_etcd_kv *kvs = NULL, kv;
    size_t n = 0;
    int rc = dcomm__etcd_get(r->kc, nkey, -1, &kv, NULL);
    if (rc == DCOMM_ENOTFOUND) return 0; /* nothing there */
    if (rc < 0) return rc;
    int64_t mod = kv.mod_revision;
    dcomm__etcd_kv_clear(&kv);
    DCOMM_CHECK(dcomm__etcd_range_prefix(r->kc, prefix, &kvs, &n, NULL));
    dcomm__etcd_kvs_free(kvs, n);
    if (n > 0) return 0; /* a live job: join it */
    int done = 0;
    DCOMM_CHECK(dcomm__etcd_delete_prefix_if(r->kc, r->ns, nkey, mod, &done));
    if (done) {
      run_log(done_msg, r->o->job_id);
      return 0;
    }
  }
  return dcomm__err(DCOMM_EBACKEND, "etcd rendezvous: the job's keys keep changing while no agent is registered");
}

static int record_text(const struct run_rdzv *r, int live, const char *pids, char *val, size_t n) {
  return dcomm__node_record_format(val, n, live, r->o->nproc, r->host, (long)getpid(), pids);
}

/* Takes the next node slot and writes its record under the lease, in one
 * transaction. */
static int take_slot(struct run_rdzv *r) {
  char nkey[400], rkey[400], num[32], val[DCOMM_NODE_RECORD_MAX];
  snprintf(nkey, sizeof(nkey), "%s" DCOMM_KEY_AGENTS_N, r->ns);
  for (int tries = 0; tries < 64; tries++) {
    struct dcomm_etcd_kv kv;
    int64_t mod = 0, cur = 0;
    int rc = dcomm__etcd_get(r->kc, nkey, -1, &kv, NULL);
    if (rc == 0) {
      mod = kv.mod_revision;
      cur = strtoll(kv.val, NULL, 10);
      dcomm__etcd_kv_clear(&kv);
    } else if (rc != DCOMM_ENOTFOUND) {
      return rc;
    }
    int nl = snprintf(num, sizeof(num), "%lld", (long long)(cur + 1));
    key_of(r, rkey, sizeof(rkey), AGENT_KEYS "%ld", (long)(cur + 1));
    int vl = record_text(r, r->o->nproc, "", val, sizeof(val)); /* its workers start at once */
    struct dcomm_etcd_put puts[2] = {{nkey, num, (size_t)nl, 0}, {rkey, val, (size_t)vl, r->lease}};
    int done = 0;
    DCOMM_CHECK(dcomm__etcd_puts_if(r->kc, nkey, mod, puts, 2, &done));
    if (done) {
      r->slot = (int)(cur + 1);
      return 0;
    }
  }
  return dcomm__err(DCOMM_EBACKEND, "etcd rendezvous: could not take a node slot (too much contention)");
}

/* Takes the value of key if present, else creates it with val. */
static int agree(struct run_rdzv *r, const char *what, const char *key, const char *val, char *out, size_t n) {
  char k[400];
  snprintf(k, sizeof(k), "%s%s", r->ns, key);
  int done = 0;
  struct dcomm_etcd_kv cur;
  DCOMM_CHECK(dcomm__etcd_create_if_absent(r->kc, k, val, strlen(val), 0, &done, &cur));
  if (!cur.key) return dcomm__err(DCOMM_EPROTO, "etcd rendezvous: %s vanished while being agreed on", what);
  snprintf(out, n, "%.*s", (int)(cur.vlen < n ? cur.vlen : n - 1), (const char *)cur.val);
  dcomm__etcd_kv_clear(&cur);
  return 0;
}

/* Keeps the pids of " pids=P1,P2,..." for fencing. */
static void keep_pids(struct run_rdzv *r, const char *text) {
  const char *p = strstr(text, "pids=");
  size_t cap = 0, n = 0;
  pid_t *v = NULL;
  for (p = p ? p + 5 : ""; *p;) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p) break;
    if (x > 0) {
      if (n == cap) {
        pid_t *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof(*v));
        if (!nv) break;
        v = nv;
      }
      v[n++] = (pid_t)x;
    }
    p = *end == ',' ? end + 1 : end;
  }
  pthread_mutex_lock(&r->lock);
  free(r->pids);
  r->pids = v;
  r->npids = n;
  if (r->paused) signal_workers_locked(r, SIGSTOP); /* one started meanwhile waits with the others */
  pthread_mutex_unlock(&r->lock);
}

int run_rdzv_update(struct run_rdzv *r, int live, const char *pids) {
  char key[400], val[DCOMM_NODE_RECORD_MAX];
  keep_pids(r, pids);
  key_of(r, key, sizeof(key), AGENT_KEYS "%ld", r->slot);
  int n = record_text(r, live, pids, val, sizeof(val));
  if (run_rdzv_lost(r, NULL, 0)) return 0;
  return dcomm__etcd_put(r->uc, key, val, (size_t)n, r->lease, NULL);
}

static int do_open(struct run_rdzv *r, struct dcomm_store **st, char token[33], int *slot) {
  const struct run_opts *o = r->o;
  double timeout = dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT);
  struct dcomm_etcd_opts eo;
  etcd_opts_from_params(&eo, timeout);
  DCOMM_CHECK(dcomm__etcd_create(o->endpoints, &eo, &r->kc));
  DCOMM_CHECK(dcomm__etcd_create(o->endpoints, &eo, &r->wc));
  int64_t ttl = dcomm__param_int(DCOMM_P_RDZV_TTL);
  if (ttl < 2) ttl = 2;
  /* A renewal must give up well inside the TTL, or a lost lease would be
   * noticed late; and so must the agent's own store calls. */
  double quick = (double)ttl / 12.0;
  if (quick < 0.2) quick = 0.2;
  struct dcomm_etcd_opts lo = eo;
  lo.timeout = quick;
  DCOMM_CHECK(dcomm__etcd_create(o->endpoints, &lo, &r->lc));
  lo.timeout = (double)ttl / 3.0;
  DCOMM_CHECK(dcomm__etcd_create(o->endpoints, &lo, &r->uc));
  DCOMM_CHECK(clear_stale(r, "cleared the keys an earlier job with id '%s' left in etcd (no agent of it is alive)"));
  int64_t granted_at = mono_ns();
  DCOMM_CHECK(dcomm__etcd_lease_grant(r->kc, ttl, &r->lease, &r->ttl));
  if (r->ttl <= 0) r->ttl = ttl;
  r->outage_max = dcomm__param_double(DCOMM_P_RDZV_OUTAGE_TIMEOUT);
  r->last_ok_ns = granted_at;
  r->healthy = 1;
  /* Registered first: from here on, nobody takes the job for a dead one. */
  DCOMM_CHECK(take_slot(r));
  *slot = r->slot;
  /* The job's token, made by the first agent (etcd's own access control
   * guards it), and its node range. */
  unsigned char rb[16];
  char mine[33], cfg[64], want[64];
  if (dcomm__random_bytes(rb, sizeof(rb)) < 0) return dcomm__err(DCOMM_ESYSTEM, "getrandom failed: %s", strerror(errno));
  for (int i = 0; i < 16; i++) snprintf(mine + 2 * i, 3, "%02x", rb[i]);
  DCOMM_CHECK(agree(r, "the job token", DCOMM_KEY_TOKEN, mine, token, 33));
  snprintf(want, sizeof(want), "%d %d", o->min_nodes, o->max_nodes);
  DCOMM_CHECK(agree(r, "the node range", DCOMM_KEY_NNODES, want, cfg, sizeof(cfg)));
  if (strcmp(cfg, want)) {
    int a = 0, b = 0;
    sscanf(cfg, "%d %d", &a, &b);
    return dcomm__err(DCOMM_EINVAL, "job '%s' runs with --nnodes %d:%d; this agent was given %d:%d", o->job_id, a, b,
                      o->min_nodes, o->max_nodes);
  }
  DCOMM_CHECK(dcomm__store_etcd_open(o->endpoints, o->job_id, (double)ttl, st));
  DCOMM_CHECK(dcomm__store_set_prefix(*st, ""));
  DCOMM_CHECK(dcomm__store_etcd_open(o->endpoints, o->job_id, timeout, &r->wst));
  DCOMM_CHECK(dcomm__store_set_prefix(r->wst, ""));
  /* Watch from the registration on: a node that dies from now is seen. */
  struct dcomm_etcd_kv *kvs = NULL;
  size_t n = 0;
  char prefix[400];
  agents_prefix(r, prefix, sizeof(prefix));
  DCOMM_CHECK(dcomm__etcd_range_prefix(r->kc, prefix, &kvs, &n, &r->watch_rev));
  dcomm__etcd_kvs_free(kvs, n);
  if (pthread_create(&r->ka, NULL, keepalive_main, r) != 0)
    return dcomm__err(DCOMM_ESYSTEM, "cannot start the lease keepalive thread");
  r->ka_running = 1;
  if (pthread_create(&r->watch, NULL, watch_main, r) != 0)
    return dcomm__err(DCOMM_ESYSTEM, "cannot start the rendezvous watch thread");
  r->watch_running = 1;
  return 0;
}

int run_rdzv_open(const struct run_opts *o, struct run_rdzv **out, struct dcomm_store **st, char token[33],
                  int *slot) {
  *out = NULL;
  *st = NULL;
  struct run_rdzv *r = calloc(1, sizeof(*r));
  if (!r) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  r->o = o;
  pthread_mutex_init(&r->lock, NULL);
  snprintf(r->ns, sizeof(r->ns), "/dcomm/%s/", o->job_id);
  if (gethostname(r->host, sizeof(r->host)) != 0) snprintf(r->host, sizeof(r->host), "unknown");
  r->host[strcspn(r->host, " \t\n")] = 0;
  int rc = do_open(r, st, token, slot);
  if (rc < 0) {
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", dcomm_last_error());
    if (*st) dcomm__store_close(*st);
    *st = NULL;
    run_rdzv_close(r, 0);
    return dcomm__err(rc, "%s", msg);
  }
  *out = r;
  return 0;
}

int run_rdzv_lost(struct run_rdzv *r, char *why, size_t n) {
  pthread_mutex_lock(&r->lock);
  int lost = r->lost;
  if (lost && why) snprintf(why, n, "%s", r->lost_why);
  pthread_mutex_unlock(&r->lock);
  return lost;
}

int run_rdzv_healthy(struct run_rdzv *r) {
  return __atomic_load_n(&r->healthy, __ATOMIC_ACQUIRE) && !run_rdzv_lost(r, NULL, 0);
}

int run_rdzv_put(struct run_rdzv *r, const char *key, const char *val) {
  char k[600];
  snprintf(k, sizeof(k), "%s%s", r->ns, key);
  return dcomm__etcd_put(r->uc, k, val, strlen(val) + 1, r->lease, NULL);
}

int run_rdzv_peek(struct run_rdzv *r, const char *key, char *buf, size_t n) {
  char k[600];
  snprintf(k, sizeof(k), "%s%s", r->ns, key);
  struct dcomm_etcd_kv kv;
  int rc = dcomm__etcd_get(r->uc, k, -1, &kv, NULL);
  if (rc == DCOMM_ENOTFOUND) return 0;
  if (rc < 0) return rc;
  size_t len = kv.vlen < n ? kv.vlen : n - 1;
  if (len) memcpy(buf, kv.val, len);
  buf[len] = 0;
  dcomm__etcd_kv_clear(&kv);
  return 1;
}

int run_rdzv_write_probe(struct run_rdzv *r) {
  char key[64];
  snprintf(key, sizeof(key), DCOMM_KEY_PROBE_FMT, (long)r->slot);
  return run_rdzv_put(r, key, "1");
}

void run_rdzv_leave(struct run_rdzv *r, const char *why) {
  char key[400];
  key_of(r, key, sizeof(key), DCOMM_KEY_LEFT_FMT, r->slot);
  if (dcomm__etcd_put(r->uc, key, why, strlen(why) + 1, 0, NULL) < 0) return;
  long gen = dcomm__store_peek_long(r->wst, DCOMM_KEY_GEN, -1);
  char notice[128];
  snprintf(notice, sizeof(notice), "node slot %d left the job (%s)", r->slot, why);
  if (gen >= 0 && dcomm__post_revoke(r->wst, gen, notice) == 0)
    run_log("this node leaves the job (%s); generation %ld revoked", why, gen);
}

void run_rdzv_close(struct run_rdzv *r, enum run_leave how) {
  if (!r) return;
  __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
  if (r->watch_running) {
    dcomm__etcd_watch_cancel(&r->cancel);
    pthread_join(r->watch, NULL);
  }
  if (r->ka_running) pthread_join(r->ka, NULL);
  /* A fenced agent leaves etcd alone: its lease is gone or going, and etcd
   * may be out of reach (the calls would wait out their timeouts). */
  int lost = run_rdzv_lost(r, NULL, 0);
  /* A node whose members were never admitted (a spare above --nnodes MAX)
   * also ends with the job. */
  char dbuf[8];
  int job_done = !lost && r->wst && dcomm__store_peek(r->wst, DCOMM_KEY_DONE, dbuf, sizeof(dbuf)) == 1;
  if (r->kc && r->slot > 0 && how == RUN_LEAVE_FINISHED && !lost) {
    /* Leaving cleanly: the others must not take it for a failure. */
    char key[400];
    key_of(r, key, sizeof(key), DCOMM_KEY_LEFT_FMT, r->slot);
    dcomm__etcd_put(r->kc, key, "1", 1, 0, NULL);
  }
  if (r->lc && r->lease && !lost) dcomm__etcd_lease_revoke(r->lc, r->lease);
  /* The last node of a job that finished removes the job's keys (its token
   * among them); with another node still registered, that one will. */
  if (r->kc && r->slot > 0 && (how == RUN_LEAVE_FINISHED || job_done) && !lost &&
      clear_stale(r, "removed the keys of job '%s' from etcd (the job finished)") < 0)
    run_log("warning: cannot remove the finished job's keys from etcd: %s", dcomm_last_error());
  if (r->wst) dcomm__store_close(r->wst);
  dcomm__etcd_destroy(r->wc);
  dcomm__etcd_destroy(r->lc);
  dcomm__etcd_destroy(r->uc);
  dcomm__etcd_destroy(r->kc);
  pthread_mutex_destroy(&r->lock);
  free(r->pids);
  free(r);
}
