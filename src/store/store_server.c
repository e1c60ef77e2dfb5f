/*
 * store_server.c: the embedded TCP store that rank 0 (or the launcher) hosts.
 *
 * One thread runs an epoll loop over the listening socket, a stop pipe and
 * every client connection; no connection has a thread of its own, so a job
 * of thousands of ranks costs the server a descriptor and two small
 * buffers per client. Each connection is a small state machine: the
 * handshake of auth.h (challenge out, answer checked as its bytes arrive,
 * verdict out), then requests, each parsed from the connection's input
 * buffer once it is complete (lengths are checked as soon as they arrive,
 * before anything is buffered for them) and answered into its output
 * buffer, flushed without blocking. The wire format is in store_proto.h.
 *
 * A GET or WAIT whose key is missing blocks its connection: it is
 * registered under that key in a table of waiters hashed by key, and a
 * write wakes only the requests waiting for the keys it wrote (n clients
 * waiting while n others publish cost O(n) wake-ups, not O(n^2)). A woken
 * or timed-out request is evaluated again from its frame, still in the
 * input buffer. While a request is blocked or its answer is not flushed,
 * the connection is not read (a client sends one request at a time) but
 * its hang-up is still seen, which ends a blocked request at once.
 *
 * Bounds on time, kept in a heap of deadlines: the handshake must finish
 * within DCOMM_STORE_HS_TIMEOUT; between requests a client may stay idle
 * indefinitely, but once a request's first byte has arrived the rest must
 * follow within DCOMM_TIMEOUT (at least 10 s), and an answer must be taken
 * by the client within the same time, else the connection is dropped (so a
 * slow-loris client holds one descriptor for a bounded time). At most
 * DCOMM_STORE_MAX_CLIENTS connections are served; more are closed at
 * once. Refusals are logged at most once a second, with a count.
 *
 * Shutdown: dcomm__store_server_stop writes the stop pipe; the loop closes
 * every connection (ending blocked requests) and returns, and stop joins it.
 *
 * fork(): the loop holds its server's `busy` mutex whenever it is not
 * waiting in epoll_wait, and an atfork handler takes every running
 * server's before the fork, so a child (a DataLoader worker, a test's
 * process) never inherits a lock (the allocator's, OpenSSL's) that the loop
 * thread held mid-request. The child has no loop; it must not use the
 * server.
 */
#define _GNU_SOURCE
#include "config.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "error.h"
#include "hash.h"
#include "kvmap.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store_proto.h"

/* Buckets of the waiter table (a power of two). */
#define WAIT_BUCKETS 1024
/* Backlog of the listening socket: every rank of a large job connects at
 * once (the kernel caps it at net.core.somaxconn). */
#define LISTEN_BACKLOG 4096
/* Per wake-up of the loop: connections accepted, bytes read from one
 * connection (others get their turn; epoll reports the rest again). */
#define ACCEPT_BATCH 256
#define READ_BATCH ((size_t)4 << 20)
/* Out of descriptors: accepting pauses this long instead of spinning. */
#define ACCEPT_PAUSE 0.1

/* What a parse step or a handler returns. */
enum {
  SV_CLOSE = -1, /* close the connection now */
  SV_OK = 0,     /* field read, go on */
  SV_NEED = 1,   /* the frame is not complete yet */
  SV_BLOCK = 2,  /* the request waits for a key */
  SV_DONE = 3,   /* the answer is queued (a closing error included) */
};

struct conn {
  int fd;
  int in_hs;   /* the handshake is not done */
  int closing; /* close once the output is flushed */
  int eof;     /* the client closed its side: serve what is in, then close */
  int dead;    /* closed; freed at the end of the loop pass */
  uint32_t events;
  unsigned char nonce[DCOMM_HS_NONCE_LEN];
  unsigned char *in, *out;
  size_t in_len, in_cap, out_len, out_off, out_cap;
  /* Deadlines (CLOCK_MONOTONIC seconds): the handshake, the frame whose
   * first byte is in, the answer being flushed, the blocked request. The
   * heap holds the one that applies (conn_deadline). */
  double hs_dl, frame_dl, out_dl, block_dl;
  size_t hpos; /* in the deadline heap, or SIZE_MAX */
  int blocked;
  /* While blocked: the key it waits for (in its frame), its place in the
   * waiter table; woken: its place in the ready list. */
  const char *wkey;
  size_t wklen;
  struct conn *wnext, **wprev;
  struct conn *rnext;
  int ready;
  struct conn *anext, **aprev; /* every connection */
};

struct dcomm_store_server {
  pthread_mutex_t busy; /* held by the loop except in epoll_wait */
  pthread_cond_t started_cv; /* start returns once the loop runs */
  int started;
  struct dcomm_store_server *reg_next; /* running servers (atfork) */
  int lfd, port, epfd;
  int stop_pipe[2]; /* written once by stop, never drained */
  pthread_t loop;
  struct conn *waiters[WAIT_BUCKETS];
  struct conn *ready, **ready_tail;
  struct conn *all, *graveyard;
  struct conn **heap;
  size_t nheap, heap_cap;
  int nconns, max_conns;
  int listen_paused;
  double listen_resume;
  double refusal_at; /* refusals logged at most once a second */
  long refusals_quiet;
  struct dcomm_kvmap map;
  char *job_id, *token;
  char tag_listen, tag_stop; /* epoll data of the listener and the pipe */
};

static double frame_timeout(void) {
  double t = dcomm__param_double(DCOMM_P_TIMEOUT);
  return t < 10 ? 10 : t;
}

/* A refused or dropped connection: a warning, at most one a second. */
static void note_refusal(struct dcomm_store_server *srv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_refusal(struct dcomm_store_server *srv, const char *fmt, ...) {
  double now = dcomm__now();
  if (now - srv->refusal_at < 1.0) {
    srv->refusals_quiet++;
    return;
  }
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (srv->refusals_quiet)
    DCOMM_LOG(WARN, STORE, "store server: %s (and %ld more refused or dropped in the second before)", msg,
              srv->refusals_quiet);
  else
    DCOMM_LOG(WARN, STORE, "store server: %s", msg);
  srv->refusal_at = now;
  srv->refusals_quiet = 0;
}

/* ---- the deadline heap (a binary min-heap of connections) ---- */

static void heap_swap(struct dcomm_store_server *srv, size_t a, size_t b) {
  struct conn *t = srv->heap[a];
  srv->heap[a] = srv->heap[b];
  srv->heap[b] = t;
  srv->heap[a]->hpos = a;
  srv->heap[b]->hpos = b;
}

static double conn_deadline(const struct conn *c) {
  if (c->dead) return INFINITY;
  if (c->in_hs) return c->hs_dl;
  if (c->out_len > c->out_off) return c->out_dl;
  if (c->blocked) return c->block_dl;
  if (c->in_len > 0) return c->frame_dl;
  return INFINITY;
}

static double heap_key(const struct dcomm_store_server *srv, size_t i) { return conn_deadline(srv->heap[i]); }

static void heap_fix(struct dcomm_store_server *srv, size_t i) {
  while (i > 0 && heap_key(srv, (i - 1) / 2) > heap_key(srv, i)) {
    heap_swap(srv, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < srv->nheap && heap_key(srv, l) < heap_key(srv, m)) m = l;
    if (r < srv->nheap && heap_key(srv, r) < heap_key(srv, m)) m = r;
    if (m == i) return;
    heap_swap(srv, i, m);
    i = m;
  }
}

static void heap_remove(struct dcomm_store_server *srv, struct conn *c) {
  size_t i = c->hpos;
  if (i == SIZE_MAX) return;
  c->hpos = SIZE_MAX;
  if (i != --srv->nheap) {
    srv->heap[i] = srv->heap[srv->nheap];
    srv->heap[i]->hpos = i;
    heap_fix(srv, i);
  }
}

/* Puts c where its current deadline says (out of the heap when none). */
static int heap_update(struct dcomm_store_server *srv, struct conn *c) {
  if (conn_deadline(c) == INFINITY) {
    heap_remove(srv, c);
    return 0;
  }
  if (c->hpos == SIZE_MAX) {
    if (srv->nheap == srv->heap_cap) {
      size_t cap = srv->heap_cap ? 2 * srv->heap_cap : 64;
      struct conn **h = realloc(srv->heap, cap * sizeof(*h));
      if (!h) return -1;
      srv->heap = h;
      srv->heap_cap = cap;
    }
    c->hpos = srv->nheap;
    srv->heap[srv->nheap++] = c;
  }
  heap_fix(srv, c->hpos);
  return 0;
}

/* ---- waiters ---- */

static struct conn **wait_bucket(struct dcomm_store_server *srv, const char *key, size_t klen) {
  return &srv->waiters[dcomm__hash64(0, key, klen) & (WAIT_BUCKETS - 1)];
}

static void unwait(struct conn *c) {
  if (!c->wprev) return;
  *c->wprev = c->wnext;
  if (c->wnext) c->wnext->wprev = c->wprev;
  c->wnext = NULL;
  c->wprev = NULL;
}

static void wait_on(struct dcomm_store_server *srv, struct conn *c, const char *key, size_t klen) {
  unwait(c);
  struct conn **b = wait_bucket(srv, key, klen);
  c->wkey = key;
  c->wklen = klen;
  c->wprev = b;
  c->wnext = *b;
  if (*b) (*b)->wprev = &c->wnext;
  *b = c;
}

/* The requests waiting for key go to the ready list, served after the
 * request that wrote it. */
static void wake_key(struct dcomm_store_server *srv, const char *key, size_t klen) {
  for (struct conn *w = *wait_bucket(srv, key, klen), *next; w; w = next) {
    next = w->wnext;
    if (w->wklen != klen || memcmp(w->wkey, key, klen) != 0) continue;
    unwait(w);
    if (w->ready) continue;
    w->ready = 1;
    w->rnext = NULL;
    *srv->ready_tail = w;
    srv->ready_tail = &w->rnext;
  }
}

/* ---- answers ---- */

static int out_put(struct conn *c, const void *a, size_t al, const void *b, size_t bl) {
  size_t need = c->out_len + al + bl;
  if (need > c->out_cap) {
    size_t cap = c->out_cap ? c->out_cap : 256;
    while (cap < need) cap *= 2;
    unsigned char *o = realloc(c->out, cap);
    if (!o) return SV_CLOSE;
    c->out = o;
    c->out_cap = cap;
  }
  if (c->out_len == c->out_off) c->out_dl = dcomm__now() + (c->closing ? 1.0 : frame_timeout());
  if (al) memcpy(c->out + c->out_len, a, al);
  if (bl) memcpy(c->out + c->out_len + al, b, bl);
  c->out_len = need;
  return SV_DONE;
}

static int answer_err(struct conn *c, int status, int closing, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* An error answer; closing: the request was malformed, the stream cannot
 * be trusted any more and the connection ends after this answer. */
static int answer_err(struct conn *c, int status, int closing, const char *fmt, ...) {
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
  if (closing) {
    DCOMM_LOG(WARN, STORE, "store server: closing a connection: %s", msg);
    c->closing = 1;
  }
  return out_put(c, buf, (size_t)(p - buf), NULL, 0);
}

/* Status 0, an optional fixed part and an optional payload. */
static int answer_ok(struct conn *c, const void *fixed, size_t flen, const void *payload, size_t plen) {
  unsigned char head[4 + 16];
  dcomm__store_put_u32(head, 0);
  if (flen) memcpy(head + 4, fixed, flen);
  return out_put(c, head, 4 + flen, payload, plen);
}

/* ---- parsing a frame from the input buffer ---- */

struct rd {
  struct conn *c;
  const unsigned char *p;
  size_t len, off;
};

static int rd_take(struct rd *r, size_t n, const unsigned char **out) {
  if (r->len - r->off < n) return SV_NEED;
  *out = r->p + r->off;
  r->off += n;
  return SV_OK;
}

static int rd_u8(struct rd *r, uint8_t *v) {
  const unsigned char *p;
  if (rd_take(r, 1, &p)) return SV_NEED;
  *v = *p;
  return SV_OK;
}

static int rd_u32(struct rd *r, uint32_t *v) {
  const unsigned char *p;
  if (rd_take(r, 4, &p)) return SV_NEED;
  *v = dcomm__store_get_u32(p);
  return SV_OK;
}

static int rd_u64(struct rd *r, uint64_t *v) {
  const unsigned char *p;
  if (rd_take(r, 8, &p)) return SV_NEED;
  *v = dcomm__store_get_u64(p);
  return SV_OK;
}

#define RD(x)                        \
  do {                               \
    int rd_rc_ = (x);                \
    if (rd_rc_ != SV_OK) return rd_rc_; \
  } while (0)

/* str key: its length is checked before its bytes are waited for. */
static int rd_key(struct rd *r, const char **key, size_t *klen) {
  uint32_t n;
  RD(rd_u32(r, &n));
  if (n == 0 || n > DCOMM_STORE_PROTO_MAX_KEY)
    return answer_err(r->c, DCOMM_EPROTO, 1, "key length %" PRIu32 " out of range 1..%d", n, DCOMM_STORE_PROTO_MAX_KEY);
  const unsigned char *p;
  RD(rd_take(r, n, &p));
  if (memchr(p, 0, n)) return answer_err(r->c, DCOMM_EPROTO, 1, "key contains a NUL byte");
  *key = (const char *)p;
  *klen = n;
  return SV_OK;
}

/* str value: a length over DCOMM_STORE_MAX_VALUE is refused unread. */
static int rd_value(struct rd *r, const unsigned char **val, size_t *vlen) {
  uint32_t n;
  RD(rd_u32(r, &n));
  size_t max = dcomm__param_size(DCOMM_P_STORE_MAX_VALUE);
  if (n > max)
    return answer_err(r->c, DCOMM_EINVAL, 1, "value of %" PRIu32 " bytes exceeds DCOMM_STORE_MAX_VALUE (%zu)", n, max);
  RD(rd_take(r, n, val));
  *vlen = n;
  return SV_OK;
}

static unsigned char *dup_bytes(const void *p, size_t n) {
  unsigned char *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}

/* A key of a frame in a message (keys are not NUL-terminated there). */
#define KEYFMT "'%.*s'"
#define KEYARG(k, l) (int)((l) < 200 ? (l) : 200), (k)

/* ---- command handlers: each parses its frame and answers or blocks ---- */

static int do_set(struct dcomm_store_server *srv, struct rd *r) {
  const char *key;
  const unsigned char *val;
  size_t klen, vlen;
  RD(rd_key(r, &key, &klen));
  RD(rd_value(r, &val, &vlen));
  unsigned char *v = dup_bytes(val, vlen);
  if (!v || dcomm__kvmap_put(&srv->map, key, klen, v, vlen) < 0) {
    free(v);
    return answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
  }
  wake_key(srv, key, klen);
  return answer_ok(r->c, NULL, 0, NULL, 0);
}

/* When the request first parses completely: its deadline. */
static void start_block_clock(struct conn *c, uint64_t ms) {
  if (!c->blocked) c->block_dl = dcomm__now() + (double)ms / 1000.0;
}

static int do_get(struct dcomm_store_server *srv, struct rd *r) {
  const char *key;
  size_t klen;
  uint64_t ms;
  RD(rd_key(r, &key, &klen));
  RD(rd_u64(r, &ms));
  start_block_clock(r->c, ms);
  struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, key, klen);
  if (e) {
    unsigned char f[4];
    dcomm__store_put_u32(f, (uint32_t)e->vlen);
    return answer_ok(r->c, f, 4, e->val, e->vlen);
  }
  if (dcomm__now() >= r->c->block_dl)
    return answer_err(r->c, DCOMM_ETIMEDOUT, 0, "key " KEYFMT " not set within %.3f s", KEYARG(key, klen),
                      (double)ms / 1000.0);
  wait_on(srv, r->c, key, klen);
  return SV_BLOCK;
}

static int do_add(struct dcomm_store_server *srv, struct rd *r) {
  const char *key;
  size_t klen;
  uint64_t d;
  RD(rd_key(r, &key, &klen));
  RD(rd_u64(r, &d));
  int64_t delta = (int64_t)d, cur = 0, res;
  struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, key, klen);
  if (e && dcomm__kv_parse_int64(e->val, e->vlen, &cur) < 0)
    return answer_err(r->c, DCOMM_EINVAL, 0, "add: the value of " KEYFMT " is not a decimal integer", KEYARG(key, klen));
  if (__builtin_add_overflow(cur, delta, &res))
    return answer_err(r->c, DCOMM_EINVAL, 0, "add: " KEYFMT " would overflow int64", KEYARG(key, klen));
  char txt[32];
  int n = snprintf(txt, sizeof(txt), "%" PRId64, res);
  unsigned char *v = dup_bytes(txt, (size_t)n);
  if (!v || dcomm__kvmap_put(&srv->map, key, klen, v, (size_t)n) < 0) {
    free(v);
    return answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
  }
  wake_key(srv, key, klen);
  unsigned char f[8];
  dcomm__store_put_u64(f, (uint64_t)res);
  return answer_ok(r->c, f, 8, NULL, 0);
}

static int do_cas(struct dcomm_store_server *srv, struct rd *r) {
  const char *key;
  const unsigned char *want, *desired;
  size_t klen, wlen, dlen;
  uint8_t has;
  RD(rd_key(r, &key, &klen));
  RD(rd_u8(r, &has));
  if (has > 1) return answer_err(r->c, DCOMM_EPROTO, 1, "compare_set: has_expected is %u", has);
  RD(rd_value(r, &want, &wlen));
  if (!has && wlen) return answer_err(r->c, DCOMM_EPROTO, 1, "compare_set: expected bytes with has_expected 0");
  RD(rd_value(r, &desired, &dlen));
  struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, key, klen);
  int match = has ? (e && e->vlen == wlen && memcmp(e->val, want, wlen) == 0) : !e;
  const unsigned char *cur = NULL;
  size_t clen = 0;
  if (match) {
    unsigned char *v = dup_bytes(desired, dlen);
    if (!v || dcomm__kvmap_put(&srv->map, key, klen, v, dlen) < 0) {
      free(v);
      return answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
    }
    wake_key(srv, key, klen);
    cur = desired;
    clen = dlen;
  } else if (e) {
    cur = e->val;
    clen = e->vlen;
  }
  unsigned char f[5];
  dcomm__store_put_u32(dcomm__store_put_u8(f, (uint8_t)(match || e)), (uint32_t)clen);
  return answer_ok(r->c, f, 5, cur, clen);
}

static int do_wait(struct dcomm_store_server *srv, struct rd *r) {
  uint64_t ms;
  uint32_t n;
  RD(rd_u64(r, &ms));
  RD(rd_u32(r, &n));
  if (n > DCOMM_STORE_MAX_WAIT_KEYS)
    return answer_err(r->c, DCOMM_EPROTO, 1, "wait: %" PRIu32 " keys (at most %d)", n, DCOMM_STORE_MAX_WAIT_KEYS);
  /* The whole frame first: its first missing key is then looked up. */
  size_t start = r->off;
  for (uint32_t i = 0; i < n; i++) {
    const char *k;
    size_t kl;
    RD(rd_key(r, &k, &kl));
  }
  start_block_clock(r->c, ms);
  /* Every key again on each wake-up: another client may delete one. */
  struct rd again = {r->c, r->p, r->len, start};
  for (uint32_t i = 0; i < n; i++) {
    const char *k;
    size_t kl;
    RD(rd_key(&again, &k, &kl));
    if (dcomm__kvmap_find(&srv->map, k, kl)) continue;
    if (dcomm__now() >= r->c->block_dl)
      return answer_err(r->c, DCOMM_ETIMEDOUT, 0, "wait: key " KEYFMT " not set within %.3f s", KEYARG(k, kl),
                        (double)ms / 1000.0);
    wait_on(srv, r->c, k, kl);
    return SV_BLOCK;
  }
  return answer_ok(r->c, NULL, 0, NULL, 0);
}

static const void *map_find(void *ctx, const char *key, size_t *len) {
  struct dcomm_kv *e = dcomm__kvmap_find(ctx, key, strlen(key));
  if (e) *len = e->vlen;
  return e ? e->val : NULL;
}

/* A txn's compares and puts, keys copied to C strings for the compares. */
struct txn_req {
  int ncmp, nput;
  unsigned char kind[DCOMM_STORE_TXN_MAX];
  const char *key[2 * DCOMM_STORE_TXN_MAX];
  size_t klen[2 * DCOMM_STORE_TXN_MAX];
  const unsigned char *val[2 * DCOMM_STORE_TXN_MAX];
  size_t vlen[2 * DCOMM_STORE_TXN_MAX];
};

static int rd_txn(struct rd *r, struct txn_req *t) {
  uint8_t n;
  RD(rd_u8(r, &n));
  if (n > DCOMM_STORE_TXN_MAX)
    return answer_err(r->c, DCOMM_EPROTO, 1, "txn: %u compares (at most %d)", n, DCOMM_STORE_TXN_MAX);
  t->ncmp = n;
  for (int i = 0; i < t->ncmp; i++) {
    RD(rd_u8(r, &t->kind[i]));
    if (t->kind[i] > DCOMM_STORE_EQUAL) return answer_err(r->c, DCOMM_EPROTO, 1, "txn: compare kind %u", t->kind[i]);
    RD(rd_key(r, &t->key[i], &t->klen[i]));
    RD(rd_value(r, &t->val[i], &t->vlen[i]));
    if (t->kind[i] != DCOMM_STORE_EQUAL && t->vlen[i])
      return answer_err(r->c, DCOMM_EPROTO, 1, "txn: compare %d of kind %u carries a value", i, t->kind[i]);
  }
  RD(rd_u8(r, &n));
  if (n < 1 || n > DCOMM_STORE_TXN_MAX)
    return answer_err(r->c, DCOMM_EPROTO, 1, "txn: %u puts (1..%d)", n, DCOMM_STORE_TXN_MAX);
  t->nput = n;
  for (int i = DCOMM_STORE_TXN_MAX; i < DCOMM_STORE_TXN_MAX + t->nput; i++) {
    RD(rd_key(r, &t->key[i], &t->klen[i]));
    RD(rd_value(r, &t->val[i], &t->vlen[i]));
  }
  return SV_OK;
}

static int do_txn(struct dcomm_store_server *srv, struct rd *r) {
  struct txn_req t;
  memset(&t, 0, sizeof(t));
  RD(rd_txn(r, &t));
  struct dcomm_store_cmp cmps[DCOMM_STORE_TXN_MAX];
  char *ckey[DCOMM_STORE_TXN_MAX] = {0};
  unsigned char *copy[DCOMM_STORE_TXN_MAX] = {0};
  int nomem = 0;
  for (int i = 0; i < t.ncmp && !nomem; i++) {
    nomem = !(ckey[i] = malloc(t.klen[i] + 1));
    if (nomem) break;
    memcpy(ckey[i], t.key[i], t.klen[i]);
    ckey[i][t.klen[i]] = 0;
    cmps[i] = (struct dcomm_store_cmp){ckey[i], t.kind[i], t.val[i], t.vlen[i]};
  }
  unsigned char done = 0;
  if (!nomem && dcomm__store_cmps_hold(cmps, t.ncmp, map_find, &srv->map)) {
    /* Copies first, so that either every put happens or none. */
    for (int i = 0; i < t.nput && !nomem; i++)
      nomem = !(copy[i] = dup_bytes(t.val[DCOMM_STORE_TXN_MAX + i], t.vlen[DCOMM_STORE_TXN_MAX + i]));
    for (int i = 0; i < t.nput && !nomem; i++) {
      int k = DCOMM_STORE_TXN_MAX + i;
      if (dcomm__kvmap_put(&srv->map, t.key[k], t.klen[k], copy[i], t.vlen[k]) < 0) nomem = 1;
      else copy[i] = NULL;
      wake_key(srv, t.key[k], t.klen[k]);
    }
    done = !nomem;
  }
  for (int i = 0; i < DCOMM_STORE_TXN_MAX; i++) {
    free(ckey[i]);
    free(copy[i]);
  }
  if (nomem) return answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
  return answer_ok(r->c, &done, 1, NULL, 0);
}

static int do_del(struct dcomm_store_server *srv, struct rd *r) {
  const char *key;
  size_t klen;
  RD(rd_key(r, &key, &klen));
  unsigned char existed = (unsigned char)dcomm__kvmap_del(&srv->map, key, klen);
  return answer_ok(r->c, &existed, 1, NULL, 0);
}

/* Drops the first n bytes of the input (a served frame or handshake);
 * what follows already started its frame's clock. */
static void in_consume(struct conn *c, size_t n) {
  c->in_len -= n;
  if (c->in_len) memmove(c->in, c->in + n, c->in_len);
  c->frame_dl = dcomm__now() + frame_timeout();
}

/* The request at the head of the input buffer: SV_NEED, SV_BLOCK, SV_DONE
 * (its frame consumed unless the connection is closing) or SV_CLOSE. */
static int serve_frame(struct dcomm_store_server *srv, struct conn *c) {
  struct rd r = {c, c->in, c->in_len, 0};
  uint8_t cmd;
  RD(rd_u8(&r, &cmd));
  int rc;
  switch (cmd) {
    case DCOMM_STORE_CMD_SET: rc = do_set(srv, &r); break;
    case DCOMM_STORE_CMD_GET: rc = do_get(srv, &r); break;
    case DCOMM_STORE_CMD_ADD: rc = do_add(srv, &r); break;
    case DCOMM_STORE_CMD_CAS: rc = do_cas(srv, &r); break;
    case DCOMM_STORE_CMD_WAIT: rc = do_wait(srv, &r); break;
    case DCOMM_STORE_CMD_DEL: rc = do_del(srv, &r); break;
    case DCOMM_STORE_CMD_TXN: rc = do_txn(srv, &r); break;
    default: rc = answer_err(c, DCOMM_EPROTO, 1, "unknown command %u", cmd); break;
  }
  c->blocked = rc == SV_BLOCK;
  if (rc != SV_BLOCK) unwait(c);
  if (rc == SV_DONE && !c->closing) in_consume(c, r.off);
  return rc;
}

/* The handshake answer at the head of the input buffer. */
static int serve_hs(struct dcomm_store_server *srv, struct conn *c) {
  struct dcomm_hs_peer peer;
  size_t need = 0;
  const char *refusal = NULL;
  unsigned char v[DCOMM_HS_MAX_MSG];
  int rc = dcomm__hs_answer(c->in, c->in_len, c->nonce, srv->job_id, srv->token, &peer, &need, &refusal);
  if (rc == 0) return SV_NEED;
  if (rc < 0) {
    note_refusal(srv, "refused a connection: %s", dcomm_last_error());
    if (!refusal) return SV_CLOSE;
    c->closing = 1;
    return out_put(c, v, dcomm__hs_verdict(DCOMM_EAUTH, refusal, v), NULL, 0);
  }
  if (peer.purpose != DCOMM_HS_STORE) {
    note_refusal(srv, "refused a connection with purpose %u (not a store client)", peer.purpose);
    c->closing = 1;
    return out_put(c, v, dcomm__hs_verdict(DCOMM_EPROTO, "not a store client", v), NULL, 0);
  }
  c->in_hs = 0;
  in_consume(c, need);
  return out_put(c, v, dcomm__hs_verdict(0, "", v), NULL, 0);
}

/* ---- connections ---- */

static void conn_close(struct dcomm_store_server *srv, struct conn *c) {
  if (c->dead) return;
  c->dead = 1;
  unwait(c);
  heap_remove(srv, c);
  epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  c->fd = -1;
  *c->aprev = c->anext;
  if (c->anext) c->anext->aprev = c->aprev;
  c->anext = srv->graveyard; /* freed after the loop pass: the ready list may name it */
  srv->graveyard = c;
  srv->nconns--;
}

/* Sends what the output holds; SV_OK, or SV_CLOSE when the client is gone. */
static int conn_flush(struct conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->out_off += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return SV_OK;
    return SV_CLOSE;
  }
  c->out_off = c->out_len = 0;
  if (c->out_cap > 65536) { /* an idle client keeps no large buffer */
    free(c->out);
    c->out = NULL;
    c->out_cap = 0;
  }
  return c->closing ? SV_CLOSE : SV_OK;
}

/* Serves what the input holds (each answer flushed before the next
 * request), and sets what to watch. */
static void conn_run(struct dcomm_store_server *srv, struct conn *c) {
  if (c->dead) return;
  int rc = conn_flush(c);
  while (rc == SV_OK && !c->closing && c->out_off == c->out_len && c->in_len > 0) {
    rc = c->in_hs ? serve_hs(srv, c) : serve_frame(srv, c);
    if (rc == SV_DONE) rc = conn_flush(c);
  }
  if (rc == SV_CLOSE) {
    conn_close(srv, c);
    return;
  }
  if (c->eof) { /* what the client sent before its end is served */
    if (c->in_hs) note_refusal(srv, "refused a connection: the client closed it during the handshake");
    else if (c->in_len > 0 && !c->blocked && !c->closing)
      DCOMM_LOG(WARN, STORE, "store server: closing a connection: truncated frame (%zu bytes)", c->in_len);
    conn_close(srv, c);
    return;
  }
  if (c->in_len == 0 && c->in_cap > 65536) {
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
  int pending = c->out_off < c->out_len;
  uint32_t ev = EPOLLRDHUP | (pending ? EPOLLOUT : 0) | (!pending && !c->blocked && !c->closing ? EPOLLIN : 0);
  if (ev != c->events) {
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &e) < 0) {
      conn_close(srv, c);
      return;
    }
    c->events = ev;
  }
  if (heap_update(srv, c) < 0) conn_close(srv, c);
}

/* Reads what the socket has (a bounded amount): SV_OK (the end of the
 * stream sets eof), or SV_CLOSE when the socket failed. */
static int conn_read(struct conn *c) {
  size_t got = 0;
  while (got < READ_BATCH) {
    if (c->in_cap - c->in_len < 4096) {
      size_t cap = c->in_cap ? 2 * c->in_cap : 16384;
      unsigned char *in = realloc(c->in, cap);
      if (!in) return SV_CLOSE;
      c->in = in;
      c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n > 0) {
      if (c->in_len == 0) c->frame_dl = dcomm__now() + frame_timeout();
      c->in_len += (size_t)n;
      got += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return SV_OK;
    if (n < 0) return SV_CLOSE;
    c->eof = 1; /* conn_run serves what came before, then closes */
    return SV_OK;
  }
  return SV_OK;
}

static void conn_event(struct dcomm_store_server *srv, struct conn *c, uint32_t ev) {
  if (c->dead) return; /* closed earlier in this batch */
  if ((ev & EPOLLOUT) && conn_flush(c) == SV_CLOSE) {
    conn_close(srv, c);
    return;
  }
  if (ev & EPOLLIN) {
    if (conn_read(c) == SV_CLOSE) {
      conn_close(srv, c);
      return;
    }
  } else if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    /* Hung up while blocked or while its answer waits: nobody to serve. */
    conn_close(srv, c);
    return;
  }
  conn_run(srv, c);
}

static void on_deadline(struct dcomm_store_server *srv, struct conn *c) {
  if (c->in_hs) {
    note_refusal(srv, "refused a connection: handshake not completed within %.0f s", DCOMM_STORE_HS_TIMEOUT);
    conn_close(srv, c);
  } else if (c->out_off < c->out_len) {
    if (!c->closing) DCOMM_LOG(WARN, STORE, "store server: closing a connection whose client does not take its answer");
    conn_close(srv, c);
  } else if (c->blocked) {
    conn_run(srv, c); /* the request answers that it timed out */
  } else if (c->in_len > 0) {
    answer_err(c, DCOMM_EPROTO, 1, "frame not completed in time");
    conn_run(srv, c);
  } else {
    heap_remove(srv, c);
  }
}

static void accept_some(struct dcomm_store_server *srv) {
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        note_refusal(srv, "accept: %s (accepting again in %.1f s)", strerror(errno), ACCEPT_PAUSE);
        epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->lfd, NULL);
        srv->listen_paused = 1;
        srv->listen_resume = dcomm__now() + ACCEPT_PAUSE;
      }
      return;
    }
    if (srv->nconns >= srv->max_conns) {
      note_refusal(srv, "dropping a connection: %d clients already (DCOMM_STORE_MAX_CLIENTS)", srv->nconns);
      close(fd);
      continue;
    }
    dcomm__sock_tune(fd, 0);
    struct conn *c = calloc(1, sizeof(*c));
    unsigned char ch[DCOMM_HS_MAX_MSG];
    size_t chl = c ? dcomm__hs_challenge(c->nonce, ch) : 0;
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (!chl || epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
      note_refusal(srv, "dropping a connection: %s", c ? "no random bytes or epoll_ctl failed" : "out of memory");
      close(fd);
      free(c);
      continue;
    }
    c->fd = fd;
    c->events = e.events;
    c->in_hs = 1;
    c->hpos = SIZE_MAX;
    c->hs_dl = dcomm__now() + DCOMM_STORE_HS_TIMEOUT;
    c->anext = srv->all;
    c->aprev = &srv->all;
    if (srv->all) srv->all->aprev = &c->anext;
    srv->all = c;
    srv->nconns++;
    if (out_put(c, ch, chl, NULL, 0) == SV_CLOSE) {
      conn_close(srv, c);
      continue;
    }
    conn_run(srv, c);
  }
}

/* Serves the requests that writes woke, until none is left. */
static void run_ready(struct dcomm_store_server *srv) {
  while (srv->ready) {
    struct conn *c = srv->ready;
    srv->ready = c->rnext;
    if (!srv->ready) srv->ready_tail = &srv->ready;
    c->ready = 0;
    if (!c->dead) conn_run(srv, c);
  }
}

static void bury(struct dcomm_store_server *srv) {
  while (srv->graveyard) {
    struct conn *c = srv->graveyard;
    srv->graveyard = c->anext;
    free(c->in);
    free(c->out);
    free(c);
  }
}

static void *loop_main(void *arg) {
  struct dcomm_store_server *srv = arg;
  struct epoll_event evs[128];
  pthread_mutex_lock(&srv->busy);
  srv->started = 1;
  pthread_cond_signal(&srv->started_cv);
  for (;;) {
    double now = dcomm__now();
    while (srv->nheap && conn_deadline(srv->heap[0]) <= now) on_deadline(srv, srv->heap[0]);
    run_ready(srv);
    bury(srv);
    if (srv->listen_paused && now >= srv->listen_resume) {
      struct epoll_event e = {.events = EPOLLIN, .data.ptr = &srv->tag_listen};
      if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &e) == 0) srv->listen_paused = 0;
      else srv->listen_resume = now + ACCEPT_PAUSE;
    }
    double next = srv->nheap ? conn_deadline(srv->heap[0]) : INFINITY;
    if (srv->listen_paused && srv->listen_resume < next) next = srv->listen_resume;
    int ms = -1;
    if (next < INFINITY) {
      double w = ceil((next - now) * 1000.0);
      ms = w < 0 ? 0 : w > 3600e3 ? 3600000 : (int)w;
    }
    pthread_mutex_unlock(&srv->busy);
    int n = epoll_wait(srv->epfd, evs, 128, ms);
    pthread_mutex_lock(&srv->busy);
    if (n < 0) {
      if (errno == EINTR) continue;
      DCOMM_LOG(ERROR, STORE, "store server: epoll_wait: %s", strerror(errno));
      break;
    }
    int stop = 0;
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &srv->tag_stop) stop = 1;
      else if (p == &srv->tag_listen) accept_some(srv);
      else conn_event(srv, p, evs[i].events);
    }
    if (stop) break;
    run_ready(srv);
  }
  while (srv->all) conn_close(srv, srv->all);
  bury(srv);
  pthread_mutex_unlock(&srv->busy);
  return NULL;
}

/* ---- fork safety: the running servers, quiet across a fork ---- */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dcomm_store_server *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) {
  pthread_mutex_lock(&registry_mu);
  for (struct dcomm_store_server *s = registry; s; s = s->reg_next) pthread_mutex_lock(&s->busy);
}

static void fork_parent(void) {
  for (struct dcomm_store_server *s = registry; s; s = s->reg_next) pthread_mutex_unlock(&s->busy);
  pthread_mutex_unlock(&registry_mu);
}

static void fork_child(void) {
  /* The mutexes were taken by this thread before the fork: ours to release. */
  fork_parent();
}

static void atfork_init(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static void registry_add(struct dcomm_store_server *srv) {
  pthread_once(&atfork_once, atfork_init);
  pthread_mutex_lock(&registry_mu);
  srv->reg_next = registry;
  registry = srv;
  pthread_mutex_unlock(&registry_mu);
}

static void registry_remove(struct dcomm_store_server *srv) {
  pthread_mutex_lock(&registry_mu);
  for (struct dcomm_store_server **pp = &registry; *pp; pp = &(*pp)->reg_next)
    if (*pp == srv) {
      *pp = srv->reg_next;
      break;
    }
  pthread_mutex_unlock(&registry_mu);
}

/* ---- public entry points ---- */

static void free_server(struct dcomm_store_server *srv) {
  if (srv->lfd >= 0) close(srv->lfd);
  if (srv->epfd >= 0) close(srv->epfd);
  for (int i = 0; i < 2; i++)
    if (srv->stop_pipe[i] >= 0) close(srv->stop_pipe[i]);
  dcomm__kvmap_free(&srv->map);
  free(srv->heap);
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
  long max = dcomm__param_int(DCOMM_P_STORE_MAX_CLIENTS);
  if (max < 1 || max > INT32_MAX)
    return dcomm__err(DCOMM_EINVAL, "DCOMM_STORE_MAX_CLIENTS=%ld: expected 1..%d", max, INT32_MAX);
  struct dcomm_store_server *srv = calloc(1, sizeof(*srv));
  if (!srv) return dcomm__err(DCOMM_ENOMEM, "store server: out of memory");
  srv->lfd = srv->epfd = srv->stop_pipe[0] = srv->stop_pipe[1] = -1;
  srv->max_conns = (int)max;
  srv->ready_tail = &srv->ready;
  srv->refusal_at = -INFINITY;
  srv->job_id = strdup(job_id);
  srv->token = strdup(token ? token : "");
  if (!srv->job_id || !srv->token) {
    free_server(srv);
    return dcomm__err(DCOMM_ENOMEM, "store server: out of memory");
  }
  if (pipe2(srv->stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0 || (srv->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
    int e = errno;
    free_server(srv);
    return dcomm__err_sys(e, "store server: pipe or epoll_create1");
  }
  int rc = dcomm__sock_listen(host, port, LISTEN_BACKLOG, &srv->lfd, &srv->port);
  if (rc < 0) {
    free_server(srv);
    return rc;
  }
  struct epoll_event el = {.events = EPOLLIN, .data.ptr = &srv->tag_listen};
  struct epoll_event es = {.events = EPOLLIN, .data.ptr = &srv->tag_stop};
  if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &el) < 0 ||
      epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->stop_pipe[0], &es) < 0) {
    int e = errno;
    free_server(srv);
    return dcomm__err_sys(e, "store server: epoll_ctl");
  }
  pthread_mutex_init(&srv->busy, NULL);
  pthread_cond_init(&srv->started_cv, NULL);
  registry_add(srv);
  if ((rc = pthread_create(&srv->loop, NULL, loop_main, srv)) != 0) {
    registry_remove(srv);
    pthread_cond_destroy(&srv->started_cv);
    pthread_mutex_destroy(&srv->busy);
    free_server(srv);
    return dcomm__err_sys(rc, "store server: pthread_create");
  }
  /* Until the new thread is in its loop, a fork could copy a lock that
   * its start-up (the allocator's) holds: a caller may fork right away. */
  pthread_mutex_lock(&srv->busy);
  while (!srv->started) pthread_cond_wait(&srv->started_cv, &srv->busy);
  pthread_mutex_unlock(&srv->busy);
  DCOMM_LOG(INFO, STORE, "store server listening on %s:%d", host && *host ? host : "*", srv->port);
  *out = srv;
  return 0;
}

int dcomm__store_server_port(const struct dcomm_store_server *srv) { return srv ? srv->port : -1; }

void dcomm__store_server_stop(struct dcomm_store_server *srv) {
  if (!srv) return;
  char b = 1;
  ssize_t w = write(srv->stop_pipe[1], &b, 1);
  (void)w;
  pthread_join(srv->loop, NULL);
  registry_remove(srv);
  pthread_cond_destroy(&srv->started_cv);
  pthread_mutex_destroy(&srv->busy);
  DCOMM_LOG(INFO, STORE, "store server on port %d stopped", srv->port);
  free_server(srv);
}
