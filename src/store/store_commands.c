/*
 * store_commands.c: the embedded store server's commands. The waiter
 * table (a blocked GET or WAIT waits under its key; a write wakes only the
 * requests waiting for the keys it wrote), the answers queued on a
 * connection's output, the parsing of a frame from its input buffer
 * (lengths checked as soon as they arrive, before anything is buffered for
 * them), the handlers of SET, GET, ADD, CAS, WAIT, DEL, TXN and MGET, and the
 * handshake's verdict. The wire format is store_proto.h; the event loop
 * that calls in here is store_server.c.
 */
#include "config.h"
#include "store.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "clock.h"
#include "error.h"
#include "hash.h"
#include "kvmap.h"
#include "log.h"
#include "param.h"
#include "store_proto.h"
#include "store_server_conn.h"

/* ---- bounds and refusals (the loop applies them too) ---- */

double dcomm__sv_frame_timeout(void) {
  double t = dcomm__param_double(DCOMM_P_TIMEOUT);
  return t < 10 ? 10 : t;
}

/* A refused or dropped connection: a warning, at most one a second. */
void dcomm__sv_note_refusal(struct dcomm_store_server *srv, const char *fmt, ...) {
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

/* ---- waiters ---- */

static struct conn **wait_bucket(struct dcomm_store_server *srv, const char *key, size_t klen) {
  return &srv->waiters[dcomm__hash64(0, key, klen) & (WAIT_BUCKETS - 1)];
}

void dcomm__sv_unwait(struct conn *c) {
  if (!c->wprev) return;
  *c->wprev = c->wnext;
  if (c->wnext) c->wnext->wprev = c->wprev;
  c->wnext = NULL;
  c->wprev = NULL;
}

static void wait_on(struct dcomm_store_server *srv, struct conn *c, const char *key, size_t klen) {
  dcomm__sv_unwait(c);
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
    dcomm__sv_unwait(w);
    if (w->ready) continue;
    w->ready = 1;
    w->rnext = NULL;
    *srv->ready_tail = w;
    srv->ready_tail = &w->rnext;
  }
}

/* ---- answers ---- */

int dcomm__sv_out_put(struct conn *c, const void *a, size_t al, const void *b, size_t bl) {
  size_t need = c->out_len + al + bl;
  if (need > c->out_cap) {
    size_t cap = c->out_cap ? c->out_cap : 256;
    while (cap < need) cap *= 2;
    unsigned char *o = realloc(c->out, cap);
    if (!o) return SV_CLOSE;
    c->out = o;
    c->out_cap = cap;
  }
  if (c->out_len == c->out_off) c->out_dl = dcomm__now() + (c->closing ? 1.0 : dcomm__sv_frame_timeout());
  if (al) memcpy(c->out + c->out_len, a, al);
  if (bl) memcpy(c->out + c->out_len + al, b, bl);
  c->out_len = need;
  return SV_DONE;
}

/* An error answer; closing: the request was malformed, the stream cannot
 * be trusted any more and the connection ends after this answer. */
int dcomm__sv_answer_err(struct conn *c, int status, int closing, const char *fmt, ...) {
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
  return dcomm__sv_out_put(c, buf, (size_t)(p - buf), NULL, 0);
}

/* Status 0, an optional fixed part and an optional payload. */
static int answer_ok(struct conn *c, const void *fixed, size_t flen, const void *payload, size_t plen) {
  unsigned char head[4 + 16];
  dcomm__store_put_u32(head, 0);
  if (flen) memcpy(head + 4, fixed, flen);
  return dcomm__sv_out_put(c, head, 4 + flen, payload, plen);
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
    return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "key length %" PRIu32 " out of range 1..%d", n, DCOMM_STORE_PROTO_MAX_KEY);
  const unsigned char *p;
  RD(rd_take(r, n, &p));
  if (memchr(p, 0, n)) return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "key contains a NUL byte");
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
    return dcomm__sv_answer_err(r->c, DCOMM_EINVAL, 1, "value of %" PRIu32 " bytes exceeds DCOMM_STORE_MAX_VALUE (%zu)", n, max);
  RD(rd_take(r, n, val));
  *vlen = n;
  return SV_OK;
}

static unsigned char *dup_bytes(const void *p, size_t n) {
  unsigned char *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}

/* key = a copy of val, and the requests waiting for key are woken: 0, or
 * -1 out of memory (the map unchanged). */
static int put_copy(struct dcomm_store_server *srv, const char *key, size_t klen, const void *val, size_t vlen) {
  unsigned char *v = dup_bytes(val, vlen);
  if (!v || dcomm__kvmap_put(&srv->map, key, klen, v, vlen) < 0) {
    free(v);
    return -1;
  }
  wake_key(srv, key, klen);
  return 0;
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
  if (put_copy(srv, key, klen, val, vlen) < 0) return dcomm__sv_answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
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
    return dcomm__sv_answer_err(r->c, DCOMM_ETIMEDOUT, 0, "key " KEYFMT " not set within %.3f s", KEYARG(key, klen),
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
    return dcomm__sv_answer_err(r->c, DCOMM_EINVAL, 0, "add: the value of " KEYFMT " is not a decimal integer", KEYARG(key, klen));
  if (__builtin_add_overflow(cur, delta, &res))
    return dcomm__sv_answer_err(r->c, DCOMM_EINVAL, 0, "add: " KEYFMT " would overflow int64", KEYARG(key, klen));
  char txt[32];
  int n = snprintf(txt, sizeof(txt), "%" PRId64, res);
  if (put_copy(srv, key, klen, txt, (size_t)n) < 0) return dcomm__sv_answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
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
  if (has > 1) return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "compare_set: has_expected is %u", has);
  RD(rd_value(r, &want, &wlen));
  if (!has && wlen) return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "compare_set: expected bytes with has_expected 0");
  RD(rd_value(r, &desired, &dlen));
  struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, key, klen);
  int match = has ? (e && e->vlen == wlen && memcmp(e->val, want, wlen) == 0) : !e;
  const unsigned char *cur = NULL;
  size_t clen = 0;
  if (match) {
    if (put_copy(srv, key, klen, desired, dlen) < 0)
      return dcomm__sv_answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
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

/* The key list shared by WAIT and MGET: deadline, count (min..max) and
 * keys, read in full before anything is looked up; *start is where the
 * keys begin, so that each wake-up walks them again. */
static int rd_key_list(struct rd *r, const char *op, uint32_t min, uint64_t *ms, uint32_t *n, size_t *start) {
  RD(rd_u64(r, ms));
  RD(rd_u32(r, n));
  if (*n < min || *n > DCOMM_STORE_MAX_WAIT_KEYS)
    return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "%s: %" PRIu32 " keys (%" PRIu32 " to %d)", op, *n, min,
                                DCOMM_STORE_MAX_WAIT_KEYS);
  *start = r->off;
  for (uint32_t i = 0; i < *n; i++) {
    const char *k;
    size_t kl;
    RD(rd_key(r, &k, &kl));
  }
  start_block_clock(r->c, *ms);
  return SV_OK;
}

/* Walks the n keys from start (another client may have deleted one since
 * the last wake-up) and blocks the connection on the first absent one,
 * unless no_block.  SV_OK when none blocked; *absent names the first key
 * still absent (NULL if none), *bytes sums the present values' lengths. */
static int walk_key_list(struct dcomm_store_server *srv, struct rd *r, size_t start, uint32_t n, int no_block,
                         const char **absent, size_t *absent_len, size_t *bytes) {
  struct rd again = {r->c, r->p, r->len, start};
  *absent = NULL;
  *absent_len = 0;
  *bytes = 0;
  for (uint32_t i = 0; i < n; i++) {
    const char *k;
    size_t kl;
    RD(rd_key(&again, &k, &kl));
    struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, k, kl);
    if (e) {
      *bytes += e->vlen;
      continue;
    }
    if (!no_block) {
      wait_on(srv, r->c, k, kl);
      return SV_BLOCK;
    }
    if (!*absent) {
      *absent = k;
      *absent_len = kl;
    }
  }
  return SV_OK;
}

static int do_wait(struct dcomm_store_server *srv, struct rd *r) {
  uint64_t ms;
  uint32_t n;
  size_t start, klen, bytes;
  const char *k;
  RD(rd_key_list(r, "wait", 0, &ms, &n, &start));
  RD(walk_key_list(srv, r, start, n, dcomm__now() >= r->c->block_dl, &k, &klen, &bytes));
  if (k)
    return dcomm__sv_answer_err(r->c, DCOMM_ETIMEDOUT, 0, "wait: key " KEYFMT " not set within %.3f s", KEYARG(k, klen),
                                (double)ms / 1000.0);
  return answer_ok(r->c, NULL, 0, NULL, 0);
}

/* MGET: waits until every key exists or the request's deadline, then
 * answers every value at once, present 0 for the keys still absent then;
 * the answer is bounded by DCOMM_STORE_MAX_VALUE in all. */
static int do_mget(struct dcomm_store_server *srv, struct rd *r) {
  uint64_t ms;
  uint32_t n;
  size_t start, klen, bytes;
  const char *k;
  RD(rd_key_list(r, "get_many", 1, &ms, &n, &start));
  RD(walk_key_list(srv, r, start, n, dcomm__now() >= r->c->block_dl, &k, &klen, &bytes));
  size_t max = dcomm__param_size(DCOMM_P_STORE_MAX_VALUE);
  if (bytes > max)
    return dcomm__sv_answer_err(r->c, DCOMM_ENOTSUP, 0,
                                "get_many: the %" PRIu32 " values total %zu bytes, more than one answer holds (DCOMM_STORE_MAX_VALUE %zu); read them one by one",
                                n, bytes, max);
  unsigned char f[5];
  dcomm__store_put_u32(f, n);
  int rc = answer_ok(r->c, f, 4, NULL, 0);
  struct rd again = {r->c, r->p, r->len, start};
  for (uint32_t i = 0; rc == SV_DONE && i < n; i++) {
    RD(rd_key(&again, &k, &klen));
    struct dcomm_kv *e = dcomm__kvmap_find(&srv->map, k, klen);
    dcomm__store_put_u32(dcomm__store_put_u8(f, e != NULL), e ? (uint32_t)e->vlen : 0);
    rc = dcomm__sv_out_put(r->c, f, 5, e ? e->val : NULL, e ? e->vlen : 0);
  }
  return rc;
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
    return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "txn: %u compares (at most %d)", n, DCOMM_STORE_TXN_MAX);
  t->ncmp = n;
  for (int i = 0; i < t->ncmp; i++) {
    RD(rd_u8(r, &t->kind[i]));
    if (t->kind[i] > DCOMM_STORE_EQUAL) return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "txn: compare kind %u", t->kind[i]);
    RD(rd_key(r, &t->key[i], &t->klen[i]));
    RD(rd_value(r, &t->val[i], &t->vlen[i]));
    if (t->kind[i] != DCOMM_STORE_EQUAL && t->vlen[i])
      return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "txn: compare %d of kind %u carries a value", i, t->kind[i]);
  }
  RD(rd_u8(r, &n));
  if (n < 1 || n > DCOMM_STORE_TXN_MAX)
    return dcomm__sv_answer_err(r->c, DCOMM_EPROTO, 1, "txn: %u puts (1..%d)", n, DCOMM_STORE_TXN_MAX);
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
  if (nomem) return dcomm__sv_answer_err(r->c, DCOMM_ENOMEM, 0, "out of memory");
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
  c->frame_dl = dcomm__now() + dcomm__sv_frame_timeout();
}

/* The request at the head of the input buffer: SV_NEED, SV_BLOCK, SV_DONE
 * (its frame consumed unless the connection is closing) or SV_CLOSE. */
int dcomm__sv_serve_frame(struct dcomm_store_server *srv, struct conn *c) {
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
    case DCOMM_STORE_CMD_MGET: rc = do_mget(srv, &r); break;
    default: rc = dcomm__sv_answer_err(c, DCOMM_EPROTO, 1, "unknown command %u", cmd); break;
  }
  c->blocked = rc == SV_BLOCK;
  if (rc != SV_BLOCK) dcomm__sv_unwait(c);
  if (rc == SV_DONE && !c->closing) in_consume(c, r.off);
  return rc;
}

/* The handshake answer at the head of the input buffer. */
int dcomm__sv_serve_hs(struct dcomm_store_server *srv, struct conn *c) {
  struct dcomm_hs_peer peer;
  size_t need = 0;
  const char *refusal = NULL;
  unsigned char v[DCOMM_HS_MAX_MSG];
  int rc = dcomm__hs_answer(c->in, c->in_len, c->nonce, srv->job_id, srv->token, &peer, &need, &refusal);
  if (rc == 0) return SV_NEED;
  if (rc < 0) {
    dcomm__sv_note_refusal(srv, "refused a connection: %s", dcomm_last_error());
    if (!refusal) return SV_CLOSE;
    c->closing = 1;
    return dcomm__sv_out_put(c, v, dcomm__hs_verdict(DCOMM_EAUTH, refusal, v), NULL, 0);
  }
  if (peer.purpose != DCOMM_HS_STORE) {
    dcomm__sv_note_refusal(srv, "refused a connection with purpose %u (not a store client)", peer.purpose);
    c->closing = 1;
    return dcomm__sv_out_put(c, v, dcomm__hs_verdict(DCOMM_EPROTO, "not a store client", v), NULL, 0);
  }
  c->in_hs = 0;
  in_consume(c, need);
  return dcomm__sv_out_put(c, v, dcomm__hs_verdict(0, "", v), NULL, 0);
}
