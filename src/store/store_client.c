/*
 * store_client.c: the client side of the embedded TCP store ("tcp" ops).
 *
 * One connection per handle and one request in flight at a time (a mutex
 * serializes threads). Every socket wait is bounded: by the handle's timeout
 * for set/add/compare_set/delete, by the operation's own timeout for
 * get/wait, plus DCOMM_STORE_IO_SLACK seconds for the server's answer (the
 * server itself enforces the operation timeout and answers DCOMM_ETIMEDOUT).
 * Once the stream fails (lost connection, no answer in time, or the server
 * announced it closes) the handle is broken and every later call returns
 * DCOMM_EPEERLOST.
 */
#define _GNU_SOURCE
#include "config.h"
#include "store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "error.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store_proto.h"

/* Values up to this size travel in the same send as their request header. */
#define INLINE_VALUE 16384

struct tcp_store {
  struct dcomm_store base;
  pthread_mutex_t mu;
  int fd;
  int broken;
  /* Answer bytes received but not yet taken: one recv serves many small
   * fields (a get_many answer is three per key). Only whole answers are
   * ever sent, so it is empty between requests; a redial empties it. */
  unsigned char in[8192];
  size_t in_pos, in_len;
  char where[300]; /* "host:port", for messages */
  /* For dcomm__store_tcp_redial. */
  char host[256], job_id[256], token[256];
  int port;
};

static const struct dcomm_store_ops tcp_ops;

/* Converts a failed socket call into the handle's failure mode. */
static int io_failed(struct tcp_store *t, int rc) {
  t->broken = 1;
  if (rc == DCOMM_ETIMEDOUT)
    return dcomm__err(DCOMM_ETIMEDOUT, "store %s did not answer in time (connection dropped)", t->where);
  return dcomm__err_ctx(DCOMM_EPEERLOST, "lost the connection to the store %s", t->where);
}

static int check_usable(struct tcp_store *t) {
  if (t->broken || t->fd < 0)
    return dcomm__err(DCOMM_EPEERLOST, "the connection to the store %s was lost earlier", t->where);
  return 0;
}

/* A growable request buffer; the key bound keeps most frames on the stack. */
struct frame {
  unsigned char *p;
  size_t len, cap;
  unsigned char small[DCOMM_STORE_PROTO_MAX_KEY + 64 + INLINE_VALUE];
};

static void frame_init(struct frame *f) {
  f->p = f->small;
  f->len = 0;
  f->cap = sizeof(f->small);
}

static void frame_free(struct frame *f) {
  if (f->p != f->small) free(f->p);
}

static int frame_reserve(struct frame *f, size_t more) {
  if (f->len + more <= f->cap) return 0;
  size_t cap = (f->len + more) * 2;
  unsigned char *p = malloc(cap);
  if (!p) return dcomm__err(DCOMM_ENOMEM, "store: out of memory building a request");
  memcpy(p, f->p, f->len);
  frame_free(f);
  f->p = p;
  f->cap = cap;
  return 0;
}

/* The caller reserves room first (the initial capacity always holds a
 * command byte and the fixed fields of any request). */
static void frame_u8(struct frame *f, uint8_t v) {
  dcomm__store_put_u8(f->p + f->len, v);
  f->len += 1;
}

static void frame_u32(struct frame *f, uint32_t v) {
  dcomm__store_put_u32(f->p + f->len, v);
  f->len += 4;
}

static void frame_u64(struct frame *f, uint64_t v) {
  dcomm__store_put_u64(f->p + f->len, v);
  f->len += 8;
}

static void frame_bytes(struct frame *f, const void *b, size_t n) {
  if (n) memcpy(f->p + f->len, b, n);
  f->len += n;
}

static int frame_str(struct frame *f, const void *b, size_t n) {
  DCOMM_CHECK(frame_reserve(f, 4 + n));
  frame_u32(f, (uint32_t)n);
  frame_bytes(f, b, n);
  return 0;
}

static int frame_key(struct frame *f, const char *key) {
  size_t n = strlen(key);
  if (n == 0 || n > DCOMM_STORE_PROTO_MAX_KEY)
    return dcomm__err(DCOMM_EINVAL, "store: key of %zu bytes (1..%d)", n, DCOMM_STORE_PROTO_MAX_KEY);
  return frame_str(f, key, n);
}

/* Sends the frame, then a value that was too large to copy into it. */
static int send_request(struct tcp_store *t, const struct frame *f, const void *tail, size_t tlen, double dl) {
  int rc = dcomm__sock_send_all(t->fd, f->p, f->len, dl, -1);
  if (rc == 0 && tlen) rc = dcomm__sock_send_all(t->fd, tail, tlen, dl, -1);
  return rc < 0 ? io_failed(t, rc) : 0;
}

static int recv_fixed(struct tcp_store *t, void *buf, size_t n, double dl) {
  unsigned char *p = buf;
  while (n > 0) {
    if (t->in_pos == t->in_len) {
      int rc;
      if (n >= sizeof(t->in)) { /* a large value: straight to its buffer */
        rc = dcomm__sock_recv_all(t->fd, p, n, dl, -1);
        return rc < 0 ? io_failed(t, rc) : 0;
      }
      t->in_pos = t->in_len = 0;
      if ((rc = dcomm__sock_recv_some(t->fd, t->in, sizeof(t->in), dl, -1, &t->in_len)) < 0) return io_failed(t, rc);
    }
    size_t k = t->in_len - t->in_pos < n ? t->in_len - t->in_pos : n;
    memcpy(p, t->in + t->in_pos, k);
    t->in_pos += k;
    p += k;
    n -= k;
  }
  return 0;
}

static int is_known_error(int status) {
  switch (status) {
#define X(name, value, msg) \
  case DCOMM_##name:         \
    return (value) < 0;
    DCOMM_ERRNO_MAP(X)
#undef X
  }
  return 0;
}

/* Reads the status; a server error becomes the return value with its text. */
static int recv_status(struct tcp_store *t, const char *op, double dl) {
  unsigned char b[4];
  DCOMM_CHECK(recv_fixed(t, b, 4, dl));
  int32_t status = (int32_t)dcomm__store_get_u32(b);
  if (status == 0) return 0;
  if (!is_known_error(status)) {
    t->broken = 1;
    return dcomm__err(DCOMM_EPROTO, "store %s: unknown status %d in the answer to %s", t->where, (int)status, op);
  }
  unsigned char h[3];
  char msg[DCOMM_STORE_MAX_ERRMSG + 1];
  DCOMM_CHECK(recv_fixed(t, h, 3, dl));
  uint16_t ml;
  memcpy(&ml, h + 1, 2);
  ml = ntohs(ml);
  if (ml > DCOMM_STORE_MAX_ERRMSG) {
    t->broken = 1;
    return dcomm__err(DCOMM_EPROTO, "store %s: oversized error message", t->where);
  }
  DCOMM_CHECK(recv_fixed(t, msg, ml, dl));
  msg[ml] = 0;
  if (h[0]) t->broken = 1; /* the server drops the connection after this */
  return dcomm__err(status, "store %s: %s: %s", t->where, op, msg);
}

/* str payload: bounded by DCOMM_STORE_MAX_VALUE; *out is malloc'd. */
static int recv_value(struct tcp_store *t, void **out, size_t *len, double dl) {
  unsigned char b[4];
  DCOMM_CHECK(recv_fixed(t, b, 4, dl));
  uint32_t n = dcomm__store_get_u32(b);
  size_t max = dcomm__param_size(DCOMM_P_STORE_MAX_VALUE);
  if (n > max) {
    t->broken = 1;
    return dcomm__err(DCOMM_EPROTO, "store %s: answer of %u bytes exceeds DCOMM_STORE_MAX_VALUE (%zu)", t->where,
                      (unsigned)n, max);
  }
  void *v = malloc(n ? n : 1);
  if (!v) {
    t->broken = 1; /* the unread payload leaves the stream unusable */
    return dcomm__err(DCOMM_ENOMEM, "store: out of memory for a %u-byte value", (unsigned)n);
  }
  int rc = recv_fixed(t, v, n, dl);
  if (rc < 0) {
    free(v);
    return rc;
  }
  *out = v;
  *len = n;
  return 0;
}

static double io_deadline(double op_timeout) {
  if (!(op_timeout >= 0)) op_timeout = 0;
  return dcomm__now() + op_timeout + DCOMM_STORE_IO_SLACK;
}

/* ---- ops ---- */

/* A request's frame starts with its command; the handle's lock is held
 * from here to request_end, whatever the outcome. */
static int request_begin(struct tcp_store *t, struct frame *f, uint8_t cmd) {
  frame_init(f);
  pthread_mutex_lock(&t->mu);
  DCOMM_CHECK(check_usable(t));
  frame_u8(f, cmd);
  return 0;
}

/* Sends the request (and a value too large to copy into it), reads the
 * answer's status; what follows the status is the op's to read. */
static int request_send(struct tcp_store *t, const struct frame *f, const void *tail, size_t tlen, const char *op,
                        double dl) {
  DCOMM_CHECK(send_request(t, f, tail, tlen, dl));
  return recv_status(t, op, dl);
}

static int request_end(struct tcp_store *t, struct frame *f, int rc) {
  pthread_mutex_unlock(&t->mu);
  frame_free(f);
  return rc;
}

static int tcp_set(struct dcomm_store *s, const char *key, const void *val, size_t len) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  int rc, inl = len <= INLINE_VALUE;
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_SET)) < 0 || (rc = frame_key(&f, key)) < 0) goto out;
  if (inl) rc = frame_str(&f, val, len);
  else if ((rc = frame_reserve(&f, 4)) == 0) frame_u32(&f, (uint32_t)len);
  if (rc == 0) rc = request_send(t, &f, inl ? NULL : val, inl ? 0 : len, "set", io_deadline(t->base.timeout));
out:
  return request_end(t, &f, rc);
}

static int tcp_get(struct dcomm_store *s, const char *key, double timeout, void **val, size_t *len) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  int rc;
  double dl = io_deadline(timeout);
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_GET)) < 0 || (rc = frame_key(&f, key)) < 0 ||
      (rc = frame_reserve(&f, 8)) < 0)
    goto out;
  frame_u64(&f, dcomm__store_timeout_ms(timeout));
  if ((rc = request_send(t, &f, NULL, 0, "get", dl)) == 0) rc = recv_value(t, val, len, dl);
out:
  return request_end(t, &f, rc);
}

static int tcp_add(struct dcomm_store *s, const char *key, int64_t delta, int64_t *result) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  unsigned char b[8];
  int rc;
  double dl = io_deadline(t->base.timeout);
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_ADD)) < 0 || (rc = frame_key(&f, key)) < 0 ||
      (rc = frame_reserve(&f, 8)) < 0)
    goto out;
  frame_u64(&f, (uint64_t)delta);
  if ((rc = request_send(t, &f, NULL, 0, "add", dl)) < 0 || (rc = recv_fixed(t, b, 8, dl)) < 0) goto out;
  *result = (int64_t)dcomm__store_get_u64(b);
out:
  return request_end(t, &f, rc);
}

static int tcp_compare_set(struct dcomm_store *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current, size_t *clen) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  unsigned char present;
  void *v = NULL;
  size_t n = 0;
  int rc;
  double dl = io_deadline(t->base.timeout);
  *current = NULL;
  *clen = 0;
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_CAS)) < 0 || (rc = frame_key(&f, key)) < 0 ||
      (rc = frame_reserve(&f, 1)) < 0)
    goto out;
  frame_u8(&f, expected ? 1 : 0);
  if ((rc = frame_str(&f, expected, expected ? elen : 0)) < 0 || (rc = frame_str(&f, desired, dlen)) < 0 ||
      (rc = request_send(t, &f, NULL, 0, "compare_set", dl)) < 0 || (rc = recv_fixed(t, &present, 1, dl)) < 0 ||
      (rc = recv_value(t, &v, &n, dl)) < 0)
    goto out;
  if (present) {
    *current = v;
    *clen = n;
  } else {
    free(v); /* key absent: *current stays NULL */
  }
out:
  return request_end(t, &f, rc);
}

/* The key list of WAIT and MGET: deadline in ms, count, keys; n is
 * checked against min..DCOMM_STORE_MAX_WAIT_KEYS first. */
static int frame_key_list(struct frame *f, const char *op, int min, const char *const *keys, int n, double timeout) {
  if (n < min || n > DCOMM_STORE_MAX_WAIT_KEYS)
    return dcomm__err(DCOMM_EINVAL, "store %s: %d keys (%d to %d)", op, n, min, DCOMM_STORE_MAX_WAIT_KEYS);
  frame_u64(f, dcomm__store_timeout_ms(timeout));
  frame_u32(f, (uint32_t)n);
  for (int i = 0; i < n; i++) DCOMM_CHECK(frame_key(f, keys[i]));
  return 0;
}

static int tcp_wait(struct dcomm_store *s, const char *const *keys, int n, double timeout) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  int rc;
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_WAIT)) == 0 && (rc = frame_key_list(&f, "wait", 0, keys, n, timeout)) == 0)
    rc = request_send(t, &f, NULL, 0, "wait", io_deadline(timeout));
  return request_end(t, &f, rc);
}

/* The answer to MGET: u32 n, then per key u8 present, str value; values
 * read so far are freed by the caller on an error. */
static int recv_many(struct tcp_store *t, int n, void **vals, size_t *lens, double dl) {
  unsigned char b[4];
  DCOMM_CHECK(recv_fixed(t, b, 4, dl));
  if (dcomm__store_get_u32(b) != (uint32_t)n) {
    t->broken = 1;
    return dcomm__err(DCOMM_EPROTO, "store %s: get_many answered %u values for %d keys", t->where,
                      (unsigned)dcomm__store_get_u32(b), n);
  }
  for (int i = 0; i < n; i++) {
    uint8_t present;
    DCOMM_CHECK(recv_fixed(t, &present, 1, dl));
    DCOMM_CHECK(recv_value(t, &vals[i], &lens[i], dl));
    if (present > 1 || (!present && lens[i])) {
      t->broken = 1;
      return dcomm__err(DCOMM_EPROTO, "store %s: get_many answered a malformed entry %d", t->where, i);
    }
    if (!present) {
      free(vals[i]);
      vals[i] = NULL;
    }
  }
  return 0;
}

static int tcp_get_many(struct dcomm_store *s, const char *const *keys, int n, double timeout, void **vals,
                        size_t *lens) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  int rc;
  double dl = io_deadline(timeout);
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_MGET)) < 0 || (rc = frame_key_list(&f, "get_many", 1, keys, n, timeout)) < 0)
    goto out;
  if ((rc = request_send(t, &f, NULL, 0, "get_many", dl)) == 0) rc = recv_many(t, n, vals, lens, dl);
  if (rc < 0)
    for (int i = 0; i < n; i++) {
      free(vals[i]);
      vals[i] = NULL;
    }
out:
  return request_end(t, &f, rc);
}

static int tcp_txn(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                   const struct dcomm_store_put *puts, int nput, int *done) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  unsigned char b;
  int rc;
  double dl = io_deadline(t->base.timeout);
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_TXN)) < 0) goto out;
  frame_u8(&f, (uint8_t)ncmp);
  for (int i = 0; i < ncmp; i++) {
    if ((rc = frame_reserve(&f, 1)) < 0) goto out;
    frame_u8(&f, (uint8_t)cmps[i].kind);
    if ((rc = frame_key(&f, cmps[i].key)) < 0 || (rc = frame_str(&f, cmps[i].val, cmps[i].len)) < 0) goto out;
  }
  if ((rc = frame_reserve(&f, 1)) < 0) goto out;
  frame_u8(&f, (uint8_t)nput);
  for (int i = 0; i < nput; i++)
    if ((rc = frame_key(&f, puts[i].key)) < 0 || (rc = frame_str(&f, puts[i].val, puts[i].len)) < 0) goto out;
  if ((rc = request_send(t, &f, NULL, 0, "txn", dl)) < 0 || (rc = recv_fixed(t, &b, 1, dl)) < 0) goto out;
  *done = b != 0;
out:
  return request_end(t, &f, rc);
}

static int tcp_del(struct dcomm_store *s, const char *key, int *existed) {
  struct tcp_store *t = (struct tcp_store *)s;
  struct frame f;
  unsigned char b;
  int rc;
  double dl = io_deadline(t->base.timeout);
  if ((rc = request_begin(t, &f, DCOMM_STORE_CMD_DEL)) < 0 || (rc = frame_key(&f, key)) < 0 ||
      (rc = request_send(t, &f, NULL, 0, "delete", dl)) < 0 || (rc = recv_fixed(t, &b, 1, dl)) < 0)
    goto out;
  *existed = b != 0;
out:
  return request_end(t, &f, rc);
}

static void tcp_close(struct dcomm_store *s) {
  struct tcp_store *t = (struct tcp_store *)s;
  if (t->fd >= 0) close(t->fd);
  memset(t->token, 0, sizeof(t->token));
  pthread_mutex_destroy(&t->mu);
  free(t);
}

/* Without the handle's lock, which the blocked caller holds: the
 * descriptor only changes in close. The blocked call sees its connection
 * end and fails; the handle is marked broken then. */
static void tcp_interrupt(struct dcomm_store *s) {
  struct tcp_store *t = (struct tcp_store *)s;
  if (t->fd >= 0) shutdown(t->fd, SHUT_RDWR);
}

static const struct dcomm_store_ops tcp_ops = {
    .name = "tcp",
    .set = tcp_set,
    .get = tcp_get,
    .add = tcp_add,
    .compare_set = tcp_compare_set,
    .wait = tcp_wait,
    .get_many = tcp_get_many,
    .txn = tcp_txn,
    .del = tcp_del,
    .close = tcp_close,
    .interrupt = tcp_interrupt,
};

/* Connects to t's server and runs the handshake: connecting by deadline,
 * the handshake within hs_s after that (or by deadline, if later). */
static int dial(struct tcp_store *t, double deadline, double hs_s, int *fd) {
  int rc = dcomm__sock_connect(t->host, t->port, deadline, fd);
  if (rc < 0) return rc;
  dcomm__sock_tune(*fd, 0);
  double hs_deadline = dcomm__now() + hs_s;
  if (hs_deadline < deadline) hs_deadline = deadline;
  rc = dcomm__hs_client(*fd, t->job_id, t->token[0] ? t->token : NULL, DCOMM_HS_STORE, NULL, 0, hs_deadline);
  if (rc == DCOMM_EPEERLOST) rc = dcomm__err_ctx(rc, "store %s closed the connection during the handshake", t->where);
  if (rc < 0) {
    close(*fd);
    *fd = -1;
  }
  return rc;
}

int dcomm__store_tcp_redial(struct dcomm_store *s, double timeout) {
  if (!s || s->ops != &tcp_ops) return dcomm__err(DCOMM_ENOTSUP, "store redial: not a tcp store handle");
  struct tcp_store *t = (struct tcp_store *)s;
  pthread_mutex_lock(&t->mu);
  int rc = 0;
  if (t->broken && t->fd >= 0) {
    int nfd = -1;
    rc = dial(t, dcomm__now() + timeout, timeout, &nfd);
    if (rc == 0) {
      /* The new connection takes the old one's descriptor number, which
       * tcp_interrupt may read without the lock. */
      if (dup2(nfd, t->fd) < 0) rc = dcomm__err(DCOMM_ESYSTEM, "store redial: dup2: %s", strerror(errno));
      else t->broken = 0, t->in_pos = t->in_len = 0;
      close(nfd);
    }
    if (rc == 0) DCOMM_LOG(INFO, STORE, "connected to the store at %s again", t->where);
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int dcomm__store_tcp_connect(const char *host, int port, const char *job_id, const char *token,
                             double connect_timeout, double timeout, struct dcomm_store **out) {
  if (!out) return dcomm__err(DCOMM_EINVAL, "store connect: NULL output argument");
  *out = NULL;
  if (!host || !*host || !job_id) return dcomm__err(DCOMM_EINVAL, "store connect: NULL host or job id");
  if (port <= 0 || port > 65535) return dcomm__err(DCOMM_EINVAL, "store connect: port %d out of range", port);
  if (!(connect_timeout >= 0) || !(timeout >= 0))
    return dcomm__err(DCOMM_EINVAL, "store connect: negative or NaN timeout");
  struct tcp_store *t = calloc(1, sizeof(*t));
  if (!t) return dcomm__err(DCOMM_ENOMEM, "store connect: out of memory");
  t->base.ops = &tcp_ops;
  t->base.timeout = timeout;
  t->fd = -1;
  snprintf(t->where, sizeof(t->where), "%s:%d", host, port);
  snprintf(t->host, sizeof(t->host), "%s", host);
  snprintf(t->job_id, sizeof(t->job_id), "%s", job_id);
  snprintf(t->token, sizeof(t->token), "%s", token ? token : "");
  t->port = port;
  pthread_mutex_init(&t->mu, NULL);
  /* The server allows DCOMM_STORE_HS_TIMEOUT for the handshake; so do we,
   * even when connecting used up most of connect_timeout. */
  int rc = dial(t, dcomm__now() + connect_timeout, DCOMM_STORE_HS_TIMEOUT, &t->fd);
  if (rc < 0) {
    tcp_close(&t->base);
    return rc;
  }
  DCOMM_LOG(INFO, STORE, "connected to the store at %s", t->where);
  *out = &t->base;
  return 0;
}

int dcomm__store_tcp_local_ip(struct dcomm_store *s, char *buf, size_t len) {
  if (!s || s->ops != &tcp_ops || !buf || !len)
    return dcomm__err(DCOMM_EINVAL, "store local ip: not a tcp store handle");
  struct tcp_store *t = (struct tcp_store *)s;
  pthread_mutex_lock(&t->mu);
  int rc = t->fd >= 0 ? dcomm__sock_local_ip(t->fd, buf, len)
                      : dcomm__err(DCOMM_EPEERLOST, "store %s: no connection", t->where);
  pthread_mutex_unlock(&t->mu);
  return rc;
}
