/*
 * store_server.c: the embedded TCP store that rank 0 (or the launcher) hosts.
 *
 * A listener thread accepts connections and starts one thread per
 * connection; one mutex guards the key map. A blocked GET/WAIT request
 * waits on its connection's own condition variable, registered under the
 * key it waits for in a table of waiters hashed by key: a write wakes only
 * the requests waiting for the keys it wrote, so n clients waiting while n
 * others publish cost O(n) wake-ups, not O(n^2). The wire format is
 * described in store_proto.h.
 *
 * Shutdown: dcomm__store_server_stop sets `stopping`, shuts down every
 * connection socket (which wakes a thread blocked in the handshake or in
 * recv), signals every connection's condition variable (which wakes
 * blocked GETs), and
 * writes the stop pipe (which wakes the listener and any socket wait that
 * uses it as abort descriptor). Then it joins every thread and frees all.
 *
 * Bounds on time: a connection gets DCOMM_STORE_HS_TIMEOUT for its
 * handshake; between requests it may stay idle indefinitely, but once a
 * request's first byte has arrived the rest of the frame must follow within
 * DCOMM_TIMEOUT seconds (at least 10), else the connection is dropped.
 *
 * Descriptor ownership: a connection thread closes its own socket, under the
 * mutex, and sets fd to -1, so that stop never shuts down a descriptor
 * number that has been closed and reused.
 */
#define _GNU_SOURCE
#include "config.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "error.h"
#include "hash.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "kvmap.h"
#include "store_proto.h"

/* Connections beyond this are closed at once rather than given a thread. */
#define MAX_CONNS 4096
#define CONN_STACK_SIZE (512 * 1024)
/* Buckets of the waiter table (a power of two). */
#define WAIT_BUCKETS 1024
/* Backlog of the listening socket: every rank of a large job connects at
 * once (the kernel caps it at net.core.somaxconn). */
#define LISTEN_BACKLOG 4096

/* ---- server state ---- */

struct conn {
  struct conn *next;
  struct dcomm_store_server *srv;
  int fd; /* -1 once the connection thread has closed it */
  int done;
  pthread_t th;
  /* While a request is blocked: the key it waits for, its place in the
   * waiter table, and what wakes it (CLOCK_MONOTONIC). */
  pthread_cond_t cv;
  const char *wkey;
  size_t wklen;
  struct conn *wnext, **wprev;
};

struct dcomm_store_server {
  int lfd, port;
  int stop_pipe[2]; /* written once by stop, never drained */
  int reap_pipe[2]; /* a finished connection thread pokes the listener */
  pthread_t listener;
  pthread_mutex_t mu;
  struct conn *waiters[WAIT_BUCKETS]; /* blocked requests by key hash */
  int stopping;
  int nconns;
  struct conn *conns;
  struct dcomm_kvmap map;
  char *job_id, *token;
};

/* Per-request scratch that the handlers fill and free. */
struct req {
  char *key;
  size_t klen;
  unsigned char *val, *val2;
  size_t vlen, vlen2;
};

static void req_free(struct req *r) {
  free(r->key);
  free(r->val);
  free(r->val2);
  memset(r, 0, sizeof(*r));
}

static void abs_time(double deadline, struct timespec *ts) {
  /* Both clocks are CLOCK_MONOTONIC; the cap keeps the conversion finite. */
  double left = deadline - dcomm__now();
  if (left > 1e9) left = 1e9;
  clock_gettime(CLOCK_MONOTONIC, ts);
  if (left <= 0) return;
  double whole = floor(left);
  ts->tv_sec += (time_t)whole;
  ts->tv_nsec += (long)((left - whole) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static double frame_timeout(void) {
  double t = dcomm__param_double(DCOMM_P_TIMEOUT);
  return t < 10 ? 10 : t;
}

/* ---- responses ---- */

static int send_error(struct conn *c, int status, int closing, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sends an error answer. Returns 0 when the connection stays usable
 * (closing 0 and the answer went out), < 0 when it must be closed. */
static int send_error(struct conn *c, int status, int closing, const char *fmt, ...) {
  unsigned char buf[4 + 1 + 2 + DCOMM_STORE_MAX_ERRMSG + 1], *p = buf;
  char msg[DCOMM_STORE_MAX_ERRMSG + 1];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  size_t ml = strlen(msg);
  p = dcomm__store_put_u32(p, (uint32_t)(int32_t)status);
  p = dcomm__store_put_u8(p, (uint8_t)(closing != 0));
  uint16_t ml16 = htons((uint16_t)ml);
  memcpy(p, &ml16, 2);
  p += 2;
  memcpy(p, msg, ml);
  p += ml;
  /* A short deadline: the peer may already be gone (truncated frame). */
  int rc = dcomm__sock_send_all(c->fd, buf, (size_t)(p - buf), dcomm__now() + (closing ? 1.0 : frame_timeout()),
                                c->srv->stop_pipe[0]);
  if (closing) {
    DCOMM_LOG(WARN, STORE, "store server: closing a connection: %s", msg);
    return -1;
  }
  return rc < 0 ? rc : 0;
}

/* Status 0 followed by an optional fixed part and an optional payload. */
static int send_ok(struct conn *c, const unsigned char *fixed, size_t flen, const void *payload, size_t plen) {
  unsigned char head[4 + 16];
  double dl = dcomm__now() + frame_timeout();
  dcomm__store_put_u32(head, 0);
  if (flen) memcpy(head + 4, fixed, flen);
  DCOMM_CHECK(dcomm__sock_send_all(c->fd, head, 4 + flen, dl, c->srv->stop_pipe[0]));
  if (plen) DCOMM_CHECK(dcomm__sock_send_all(c->fd, payload, plen, dl, c->srv->stop_pipe[0]));
  return 0;
}

/* ---- request parsing ---- */

/* Turns a failed read in the middle of a frame into the right ending. */
static int read_failed(struct conn *c, int rc) {
  if (rc == DCOMM_EPEERLOST) return send_error(c, DCOMM_EPROTO, 1, "truncated frame");
  if (rc == DCOMM_ETIMEDOUT) return send_error(c, DCOMM_EPROTO, 1, "frame not completed in time");
  return rc; /* stop, or a socket failure: nothing to answer */
}

static int read_fixed(struct conn *c, void *buf, size_t n, double dl) {
  int rc = dcomm__sock_recv_all(c->fd, buf, n, dl, c->srv->stop_pipe[0]);
  return rc < 0 ? read_failed(c, rc) : 0;
}

static int read_u32(struct conn *c, uint32_t *v, double dl) {
  unsigned char b[4];
  DCOMM_CHECK(read_fixed(c, b, 4, dl));
  *v = dcomm__store_get_u32(b);
  return 0;
}

static int read_u64(struct conn *c, uint64_t *v, double dl) {
  unsigned char b[8];
  DCOMM_CHECK(read_fixed(c, b, 8, dl));
  *v = dcomm__store_get_u64(b);
  return 0;
}

/* str key: bounded before anything is allocated. */
static int read_key(struct conn *c, char **key, size_t *klen, double dl) {
  uint32_t n;
  DCOMM_CHECK(read_u32(c, &n, dl));
  if (n == 0 || n > DCOMM_STORE_PROTO_MAX_KEY)
    return send_error(c, DCOMM_EPROTO, 1, "key length %" PRIu32 " out of range 1..%d", n, DCOMM_STORE_PROTO_MAX_KEY);
  char *k = malloc((size_t)n + 1);
  if (!k) return send_error(c, DCOMM_ENOMEM, 1, "out of memory");
  int rc = read_fixed(c, k, n, dl);
  if (rc < 0) {
    free(k);
    return rc;
  }
  k[n] = 0;
  if (memchr(k, 0, n)) {
    free(k);
    return send_error(c, DCOMM_EPROTO, 1, "key contains a NUL byte");
  }
  *key = k;
  *klen = n;
  return 0;
}

/* str value: a length over DCOMM_STORE_MAX_VALUE is refused unread. */
static int read_value(struct conn *c, unsigned char **val, size_t *vlen, double dl) {
  uint32_t n;
  DCOMM_CHECK(read_u32(c, &n, dl));
  size_t max = dcomm__param_size(DCOMM_P_STORE_MAX_VALUE);
  if (n > max) return send_error(c, DCOMM_EINVAL, 1, "value of %" PRIu32 " bytes exceeds DCOMM_STORE_MAX_VALUE (%zu)", n, max);
  unsigned char *v = malloc(n ? n : 1);
  if (!v) return send_error(c, DCOMM_ENOMEM, 1, "out of memory");
  int rc = read_fixed(c, v, n, dl);
  if (rc < 0) {
    free(v);
    return rc;
  }
  *val = v;
  *vlen = n;
  return 0;
}

static unsigned char *dup_bytes(const unsigned char *p, size_t n) {
  unsigned char *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}

static struct conn **wait_bucket(struct dcomm_store_server *srv, const char *key, size_t klen) {
  return &srv->waiters[dcomm__hash64(0, key, klen) & (WAIT_BUCKETS - 1)];
}

/* Wakes the requests waiting for key (mutex held). */
static void wake_key(struct dcomm_store_server *srv, const char *key, size_t klen) {
  for (struct conn *w = *wait_bucket(srv, key, klen); w; w = w->wnext)
    if (w->wklen == klen && memcmp(w->wkey, key, klen) == 0) pthread_cond_signal(&w->cv);
}

/* Waits (mutex held) until key is written, the deadline, or stop. Returns 1
 * when the client has hung up meanwhile: a blocked request then ends early
 * instead of holding its thread until a possibly very long timeout. */
static int wait_a_while(struct conn *c, const char *key, size_t klen, double deadline) {
  struct dcomm_store_server *srv = c->srv;
  struct timespec ts;
  double until = deadline < dcomm__now() + 1.0 ? deadline : dcomm__now() + 1.0;
  abs_time(until, &ts);
  struct conn **b = wait_bucket(srv, key, klen);
  c->wkey = key;
  c->wklen = klen;
  c->wprev = b;
  c->wnext = *b;
  if (*b) (*b)->wprev = &c->wnext;
  *b = c;
  pthread_cond_timedwait(&c->cv, &srv->mu, &ts);
  *c->wprev = c->wnext;
  if (c->wnext) c->wnext->wprev = c->wprev;
  c->wnext = NULL;
  c->wprev = NULL;
  struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ---- command handlers: each reads the rest of its frame and answers ---- */

static int do_set(struct conn *c, struct req *r, double dl) {
  struct dcomm_store_server *srv = c->srv;
  DCOMM_CHECK(read_key(c, &r->key, &r->klen, dl));
  DCOMM_CHECK(read_value(c, &r->val, &r->vlen, dl));
  pthread_mutex_lock(&srv->mu);
  int rc = dcomm__kvmap_put(&srv->map, r->key, r->klen, r->val, r->vlen);
  if (rc == 0) r->val = NULL; /* the map owns it now */
  wake_key(srv, r->key, r->klen);
  pthread_mutex_unlock(&srv->mu);
  if (rc < 0) return send_error(c, DCOMM_ENOMEM, 0, "out of memory");
  return send_ok(c, NULL, 0, NULL, 0);
}

static int do_get(struct conn *c, struct req *r, double dl) {
  struct dcomm_store_server *srv = c->srv;
  uint64_t ms;
  DCOMM_CHECK(read_key(c, &r->key, &r->klen, dl));
  DCOMM_CHECK(read_u64(c, &ms, dl));
  double deadline = dcomm__now() + (double)ms / 1000.0;
  int gone = 0;
  struct dcomm_kv *e;
  pthread_mutex_lock(&srv->mu);
  while (!(e = dcomm__kvmap_find(&srv->map, r->key, r->klen)) && !srv->stopping && !gone && dcomm__now() < deadline)
    gone = wait_a_while(c, r->key, r->klen, deadline);
  if (e) {
    r->val = dup_bytes(e->val, e->vlen);
    r->vlen = e->vlen;
  }
  int stopping = srv->stopping;
  pthread_mutex_unlock(&srv->mu);
  if (stopping || gone) return -1;
  if (!e) return send_error(c, DCOMM_ETIMEDOUT, 0, "key '%.200s' not set within %.3f s", r->key, (double)ms / 1000.0);
  if (!r->val) return send_error(c, DCOMM_ENOMEM, 0, "out of memory");
  unsigned char f[4];
  dcomm__store_put_u32(f, (uint32_t)r->vlen);
  return send_ok(c, f, 4, r->val, r->vlen);
}

static int do_add(struct conn *c, struct req *r, double dl) {
  struct dcomm_store_server *srv = c->srv;
  uint64_t d;
  DCOMM_CHECK(read_key(c, &r->key, &r->klen, dl));
  DCOMM_CHECK(read_u64(c, &d, dl));
  int64_t delta = (int64_t)d, cur = 0, res;
  int rc = 0;
  pthread_mutex_lock(&srv->mu);
  struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, r->key, r->klen);
  if (e && dcomm__kv_parse_int64(e->val, e->vlen, &cur) < 0) rc = 1;
  else if (__builtin_add_overflow(cur, delta, &res)) rc = 2;
  else {
    char txt[32];
    int n = snprintf(txt, sizeof(txt), "%" PRId64, res);
    unsigned char *v = dup_bytes((unsigned char *)txt, (size_t)n);
    if (!v || dcomm__kvmap_put(&srv->map, r->key, r->klen, v, (size_t)n) < 0) {
      free(v);
      rc = 3;
    }
    wake_key(srv, r->key, r->klen);
  }
  pthread_mutex_unlock(&srv->mu);
  if (rc == 1) return send_error(c, DCOMM_EINVAL, 0, "add: the value of '%.200s' is not a decimal integer", r->key);
  if (rc == 2) return send_error(c, DCOMM_EINVAL, 0, "add: '%.200s' would overflow int64", r->key);
  if (rc == 3) return send_error(c, DCOMM_ENOMEM, 0, "out of memory");
  unsigned char f[8];
  dcomm__store_put_u64(f, (uint64_t)res);
  return send_ok(c, f, 8, NULL, 0);
}

static int do_cas(struct conn *c, struct req *r, double dl) {
  struct dcomm_store_server *srv = c->srv;
  unsigned char has;
  DCOMM_CHECK(read_key(c, &r->key, &r->klen, dl));
  DCOMM_CHECK(read_fixed(c, &has, 1, dl));
  if (has > 1) return send_error(c, DCOMM_EPROTO, 1, "compare_set: has_expected is %u", has);
  DCOMM_CHECK(read_value(c, &r->val, &r->vlen, dl));
  if (!has && r->vlen) return send_error(c, DCOMM_EPROTO, 1, "compare_set: expected bytes with has_expected 0");
  DCOMM_CHECK(read_value(c, &r->val2, &r->vlen2, dl));
  unsigned char *cur = NULL;
  size_t clen = 0;
  int present = 0, nomem = 0;
  pthread_mutex_lock(&srv->mu);
  struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, r->key, r->klen);
  int match = has ? (e && e->vlen == r->vlen && memcmp(e->val, r->val, r->vlen) == 0) : !e;
  if (match) {
    cur = dup_bytes(r->val2, r->vlen2);
    if (!cur || dcomm__kvmap_put(&srv->map, r->key, r->klen, r->val2, r->vlen2) < 0) nomem = 1;
    else r->val2 = NULL;
    clen = r->vlen2;
    present = 1;
    wake_key(srv, r->key, r->klen);
  } else if (e) {
    cur = dup_bytes(e->val, e->vlen);
    nomem = !cur;
    clen = e->vlen;
    present = 1;
  }
  pthread_mutex_unlock(&srv->mu);
  if (nomem) {
    free(cur);
    return send_error(c, DCOMM_ENOMEM, 0, "out of memory");
  }
  unsigned char f[5];
  dcomm__store_put_u32(dcomm__store_put_u8(f, (uint8_t)present), (uint32_t)clen);
  int rc = send_ok(c, f, 5, cur, clen);
  free(cur);
  return rc;
}

static int do_wait(struct conn *c, struct req *r, double dl) {
  struct dcomm_store_server *srv = c->srv;
  uint64_t ms;
  uint32_t n;
  DCOMM_CHECK(read_u64(c, &ms, dl));
  DCOMM_CHECK(read_u32(c, &n, dl));
  if (n > DCOMM_STORE_MAX_WAIT_KEYS)
    return send_error(c, DCOMM_EPROTO, 1, "wait: %" PRIu32 " keys (at most %d)", n, DCOMM_STORE_MAX_WAIT_KEYS);
  char **keys = calloc(n ? n : 1, sizeof(*keys));
  size_t *lens = calloc(n ? n : 1, sizeof(*lens));
  int rc = 0;
  if (!keys || !lens) rc = send_error(c, DCOMM_ENOMEM, 1, "out of memory");
  for (uint32_t i = 0; rc == 0 && i < n; i++) rc = read_key(c, &keys[i], &lens[i], dl);
  if (rc == 0) {
    double deadline = dcomm__now() + (double)ms / 1000.0;
    uint32_t have = 0;
    int gone = 0;
    pthread_mutex_lock(&srv->mu);
    for (;;) {
      /* Recheck every key on each wake-up: another client may delete one. */
      have = 0;
      while (have < n && dcomm__kvmap_find(&srv->map, keys[have], lens[have])) have++;
      if (have == n || srv->stopping || gone || dcomm__now() >= deadline) break;
      gone = wait_a_while(c, keys[have], lens[have], deadline);
    }
    int stopping = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    if (stopping || gone) rc = -1;
    else if (have < n)
      rc = send_error(c, DCOMM_ETIMEDOUT, 0, "wait: key '%.200s' not set within %.3f s", keys[have],
                      (double)ms / 1000.0);
    else rc = send_ok(c, NULL, 0, NULL, 0);
  }
  for (uint32_t i = 0; keys && i < n; i++) free(keys[i]);
  free(keys);
  free(lens);
  (void)r;
  return rc;
}

static const void *map_find(void *ctx, const char *key, size_t *len) {
  struct dcomm_kv *e = dcomm__kvmap_find(ctx, key, strlen(key));
  if (e) *len = e->vlen;
  return e ? e->val : NULL;
}

/* A txn's lists: keys and values in one set of arrays, compares first. */
struct txn_req {
  int ncmp, nput;
  unsigned char kind[DCOMM_STORE_TXN_MAX];
  char *key[2 * DCOMM_STORE_TXN_MAX];
  size_t klen[2 * DCOMM_STORE_TXN_MAX];
  unsigned char *val[2 * DCOMM_STORE_TXN_MAX];
  size_t vlen[2 * DCOMM_STORE_TXN_MAX];
};

static void txn_req_free(struct txn_req *t) {
  for (int i = 0; i < 2 * DCOMM_STORE_TXN_MAX; i++) {
    free(t->key[i]);
    free(t->val[i]);
  }
}

static int read_txn(struct conn *c, struct txn_req *t, double dl) {
  unsigned char n;
  DCOMM_CHECK(read_fixed(c, &n, 1, dl));
  if (n > DCOMM_STORE_TXN_MAX) return send_error(c, DCOMM_EPROTO, 1, "txn: %u compares (at most %d)", n, DCOMM_STORE_TXN_MAX);
  t->ncmp = n;
  for (int i = 0; i < t->ncmp; i++) {
    DCOMM_CHECK(read_fixed(c, &t->kind[i], 1, dl));
    if (t->kind[i] > DCOMM_STORE_EQUAL) return send_error(c, DCOMM_EPROTO, 1, "txn: compare kind %u", t->kind[i]);
    DCOMM_CHECK(read_key(c, &t->key[i], &t->klen[i], dl));
    DCOMM_CHECK(read_value(c, &t->val[i], &t->vlen[i], dl));
    if (t->kind[i] != DCOMM_STORE_EQUAL && t->vlen[i])
      return send_error(c, DCOMM_EPROTO, 1, "txn: compare %d of kind %u carries a value", i, t->kind[i]);
  }
  DCOMM_CHECK(read_fixed(c, &n, 1, dl));
  if (n < 1 || n > DCOMM_STORE_TXN_MAX) return send_error(c, DCOMM_EPROTO, 1, "txn: %u puts (1..%d)", n, DCOMM_STORE_TXN_MAX);
  t->nput = n;
  for (int i = DCOMM_STORE_TXN_MAX; i < DCOMM_STORE_TXN_MAX + t->nput; i++) {
    DCOMM_CHECK(read_key(c, &t->key[i], &t->klen[i], dl));
    DCOMM_CHECK(read_value(c, &t->val[i], &t->vlen[i], dl));
  }
  return 0;
}

static int do_txn(struct conn *c, double dl) {
  struct dcomm_store_server *srv = c->srv;
  struct txn_req t;
  memset(&t, 0, sizeof(t));
  int rc = read_txn(c, &t, dl);
  if (rc < 0) {
    txn_req_free(&t);
    return rc;
  }
  struct dcomm_store_cmp cmps[DCOMM_STORE_TXN_MAX];
  for (int i = 0; i < t.ncmp; i++)
    cmps[i] = (struct dcomm_store_cmp){t.key[i], t.kind[i], t.val[i], t.vlen[i]};
  unsigned char done = 0;
  int nomem = 0;
  pthread_mutex_lock(&srv->mu);
  if (dcomm__store_cmps_hold(cmps, t.ncmp, map_find, &srv->map)) {
    /* Copies first, so that either every put happens or none. */
    unsigned char *copy[DCOMM_STORE_TXN_MAX] = {0};
    for (int i = 0; i < t.nput && !nomem; i++) nomem = !(copy[i] = dup_bytes(t.val[DCOMM_STORE_TXN_MAX + i], t.vlen[DCOMM_STORE_TXN_MAX + i]));
    for (int i = 0; i < t.nput && !nomem; i++) {
      int k = DCOMM_STORE_TXN_MAX + i;
      if (dcomm__kvmap_put(&srv->map, t.key[k], t.klen[k], copy[i], t.vlen[k]) < 0) nomem = 1;
      else copy[i] = NULL;
      wake_key(srv, t.key[k], t.klen[k]);
    }
    for (int i = 0; i < t.nput; i++) free(copy[i]);
    done = !nomem;
  }
  pthread_mutex_unlock(&srv->mu);
  txn_req_free(&t);
  if (nomem) return send_error(c, DCOMM_ENOMEM, 0, "out of memory");
  return send_ok(c, &done, 1, NULL, 0);
}

static int do_del(struct conn *c, struct req *r, double dl) {
  struct dcomm_store_server *srv = c->srv;
  DCOMM_CHECK(read_key(c, &r->key, &r->klen, dl));
  pthread_mutex_lock(&srv->mu);
  unsigned char existed = (unsigned char)dcomm__kvmap_del(&srv->map, r->key, r->klen);
  pthread_mutex_unlock(&srv->mu);
  return send_ok(c, &existed, 1, NULL, 0);
}

/* Serves one request: 0 to go on, < 0 to close the connection. */
static int serve_one(struct conn *c) {
  unsigned char cmd;
  /* Between requests a client may stay idle for as long as it likes. */
  int rc = dcomm__sock_recv_all(c->fd, &cmd, 1, INFINITY, c->srv->stop_pipe[0]);
  if (rc < 0) return rc;
  double dl = dcomm__now() + frame_timeout();
  struct req r = {0};
  switch (cmd) {
    case DCOMM_STORE_CMD_SET: rc = do_set(c, &r, dl); break;
    case DCOMM_STORE_CMD_GET: rc = do_get(c, &r, dl); break;
    case DCOMM_STORE_CMD_ADD: rc = do_add(c, &r, dl); break;
    case DCOMM_STORE_CMD_CAS: rc = do_cas(c, &r, dl); break;
    case DCOMM_STORE_CMD_WAIT: rc = do_wait(c, &r, dl); break;
    case DCOMM_STORE_CMD_DEL: rc = do_del(c, &r, dl); break;
    case DCOMM_STORE_CMD_TXN: rc = do_txn(c, dl); break;
    default: rc = send_error(c, DCOMM_EPROTO, 1, "unknown command %u", cmd); break;
  }
  req_free(&r);
  return rc;
}

static void *conn_main(void *arg) {
  struct conn *c = arg;
  struct dcomm_store_server *srv = c->srv;
  struct dcomm_hs_peer peer;
  int rc = dcomm__hs_server(c->fd, srv->job_id, srv->token, dcomm__now() + DCOMM_STORE_HS_TIMEOUT, &peer);
  if (rc < 0) {
    DCOMM_LOG(WARN, STORE, "store server: refused a connection: %s", dcomm_last_error());
  } else if (peer.purpose != DCOMM_HS_STORE) {
    DCOMM_LOG(WARN, STORE, "store server: refused a connection with purpose %u (not a store client)", peer.purpose);
  } else {
    while (serve_one(c) == 0) {
    }
  }
  pthread_mutex_lock(&srv->mu);
  close(c->fd);
  c->fd = -1;
  c->done = 1;
  pthread_mutex_unlock(&srv->mu);
  char b = 1;
  ssize_t w = write(srv->reap_pipe[1], &b, 1); /* full pipe: a wake-up is pending anyway */
  (void)w;
  return NULL;
}

/* Joins finished connection threads so that they do not pile up. */
static void reap(struct dcomm_store_server *srv, int all) {
  struct conn *dead = NULL;
  pthread_mutex_lock(&srv->mu);
  for (struct conn **pp = &srv->conns; *pp;) {
    struct conn *c = *pp;
    if (all || c->done) {
      *pp = c->next;
      c->next = dead;
      dead = c;
      srv->nconns--;
    } else {
      pp = &c->next;
    }
  }
  pthread_mutex_unlock(&srv->mu);
  while (dead) {
    struct conn *c = dead;
    dead = c->next;
    pthread_join(c->th, NULL);
    pthread_cond_destroy(&c->cv);
    free(c);
  }
}

static void accept_one(struct dcomm_store_server *srv, pthread_attr_t *attr) {
  int fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      DCOMM_LOG(WARN, STORE, "store server: accept: %s", strerror(errno));
      struct timespec ts = {0, 100 * 1000 * 1000}; /* do not spin while out of descriptors */
      nanosleep(&ts, NULL);
    }
    return;
  }
  dcomm__sock_tune(fd, 0);
  struct conn *c = calloc(1, sizeof(*c));
  if (!c) {
    close(fd);
    return;
  }
  c->srv = srv;
  c->fd = fd;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_lock(&srv->mu);
  int refuse = srv->stopping || srv->nconns >= MAX_CONNS;
  if (!refuse && pthread_create(&c->th, attr, conn_main, c) != 0) refuse = 1;
  if (!refuse) {
    c->next = srv->conns;
    srv->conns = c;
    srv->nconns++;
  }
  int nconns = srv->nconns;
  pthread_mutex_unlock(&srv->mu);
  if (refuse) {
    DCOMM_LOG(WARN, STORE, "store server: dropping a connection (stopping, %d connections, or no thread)", nconns);
    close(fd);
    pthread_cond_destroy(&c->cv);
    free(c);
  }
}

static void *listener_main(void *arg) {
  struct dcomm_store_server *srv = arg;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, CONN_STACK_SIZE);
  for (;;) {
    struct pollfd p[3] = {{.fd = srv->lfd, .events = POLLIN},
                          {.fd = srv->stop_pipe[0], .events = POLLIN},
                          {.fd = srv->reap_pipe[0], .events = POLLIN}};
    int n = poll(p, 3, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      DCOMM_LOG(ERROR, STORE, "store server: poll: %s", strerror(errno));
      break;
    }
    if (p[1].revents) break;
    if (p[2].revents) {
      char buf[256];
      while (read(srv->reap_pipe[0], buf, sizeof(buf)) > 0) {
      }
      reap(srv, 0);
    }
    if (p[0].revents & POLLIN) accept_one(srv, &attr);
  }
  pthread_attr_destroy(&attr);
  return NULL;
}

/* ---- public entry points ---- */

static void free_server(struct dcomm_store_server *srv) {
  if (srv->lfd >= 0) close(srv->lfd);
  for (int i = 0; i < 2; i++) {
    if (srv->stop_pipe[i] >= 0) close(srv->stop_pipe[i]);
    if (srv->reap_pipe[i] >= 0) close(srv->reap_pipe[i]);
  }
  dcomm__kvmap_free(&srv->map);
  free(srv->job_id);
  free(srv->token);
  free(srv);
}

int dcomm__store_server_start(const char *host, int port, const char *job_id, const char *token,
                              struct dcomm_store_server **out) {
  if (!out) return dcomm__err(DCOMM_EINVAL, "store server: NULL output argument");
  *out = NULL;
  if (!job_id) return dcomm__err(DCOMM_EINVAL, "store server: NULL job id");
  if (strlen(job_id) > DCOMM_HS_MAX_JOB)
    return dcomm__err(DCOMM_EINVAL, "store server: job id longer than %d bytes", DCOMM_HS_MAX_JOB);
  struct dcomm_store_server *srv = calloc(1, sizeof(*srv));
  if (!srv) return dcomm__err(DCOMM_ENOMEM, "store server: out of memory");
  srv->lfd = srv->stop_pipe[0] = srv->stop_pipe[1] = srv->reap_pipe[0] = srv->reap_pipe[1] = -1;
  srv->job_id = strdup(job_id);
  srv->token = strdup(token ? token : "");
  if (!srv->job_id || !srv->token) {
    free_server(srv);
    return dcomm__err(DCOMM_ENOMEM, "store server: out of memory");
  }
  if (pipe2(srv->stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0 || pipe2(srv->reap_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
    int e = errno;
    free_server(srv);
    return dcomm__err_sys(e, "store server: pipe");
  }
  int rc = dcomm__sock_listen(host, port, LISTEN_BACKLOG, &srv->lfd, &srv->port);
  if (rc < 0) {
    free_server(srv);
    return rc;
  }
  pthread_mutex_init(&srv->mu, NULL);
  if ((rc = pthread_create(&srv->listener, NULL, listener_main, srv)) != 0) {
    pthread_mutex_destroy(&srv->mu);
    free_server(srv);
    return dcomm__err_sys(rc, "store server: pthread_create");
  }
  DCOMM_LOG(INFO, STORE, "store server listening on %s:%d", host && *host ? host : "*", srv->port);
  *out = srv;
  return 0;
}

int dcomm__store_server_port(const struct dcomm_store_server *srv) { return srv ? srv->port : -1; }

void dcomm__store_server_stop(struct dcomm_store_server *srv) {
  if (!srv) return;
  pthread_mutex_lock(&srv->mu);
  srv->stopping = 1;
  for (struct conn *c = srv->conns; c; c = c->next) {
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
    pthread_cond_signal(&c->cv);
  }
  pthread_mutex_unlock(&srv->mu);
  char b = 1;
  ssize_t w = write(srv->stop_pipe[1], &b, 1);
  (void)w;
  pthread_join(srv->listener, NULL);
  /* The listener is gone, so no connection can be added any more. */
  reap(srv, 1);
  pthread_mutex_destroy(&srv->mu);
  DCOMM_LOG(INFO, STORE, "store server on port %d stopped", srv->port);
  free_server(srv);
}
