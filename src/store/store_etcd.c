/*
 * store_etcd.c: the "etcd" implementation of the store interface (store.h)
 * on the etcd client of etcd_client.h. Every key lives under
 * "/dcomm/<job-id>/" (after the handle's own prefix from the wrappers).
 *
 *   set          put
 *   get          get; if absent, watch the key from the answer's revision + 1
 *                until a PUT arrives or the timeout passes (no polling, no
 *                race: a write between the two is in the watch's history)
 *   add          compare-and-swap loop on mod_revision over a decimal value
 *                (absent = 0: create-if-absent for the first write)
 *   compare_set  one txn: expected NULL -> create-if-absent, else compare
 *                VALUE equal; the failure branch returns the current value
 *   txn          one etcd txn: compares on create_revision / value
 *   wait         each key as get, under one deadline
 *   del          deleterange; "existed" from the deleted count
 *
 * The client is thread-safe and a watch runs on its own connection, so a
 * get blocked in one thread does not hold up a set from another thread on
 * the same handle.
 */
#define _GNU_SOURCE
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "etcd_client.h"
#include "store.h"

#ifdef DCOMM_HAVE_ETCD

#include <errno.h>

#include "log.h"
#include "sock.h"
#include "store_proto.h"

#define MAX_JOB_ID 200

struct etcd_store {
  struct dcomm_store base;
  struct dcomm_etcd *c;
  char ns[MAX_JOB_ID + 16]; /* "/dcomm/<job>/" */
  size_t nslen;
};

static const struct dcomm_store_ops etcd_ops;

/* Namespaced key, malloc'd. */
static int ns_key(struct etcd_store *e, const char *key, char **out) {
  size_t kl = strlen(key);
  char *k = malloc(e->nslen + kl + 1);
  if (!k) return dcomm__err(DCOMM_ENOMEM, "etcd store: out of memory");
  memcpy(k, e->ns, e->nslen);
  memcpy(k + e->nslen, key, kl + 1);
  *out = k;
  return 0;
}

static int etcd_set(struct dcomm_store *s, const char *key, const void *val, size_t len) {
  struct etcd_store *e = (struct etcd_store *)s;
  char *k = NULL;
  DCOMM_CHECK(ns_key(e, key, &k));
  int rc = dcomm__etcd_put(e->c, k, val, len, 0, NULL);
  free(k);
  return rc < 0 ? dcomm__err_ctx(rc, "etcd store set '%.200s'", key) : 0;
}

struct get_wait {
  const char *key;
  size_t klen;
  void *val;
  size_t vlen;
  int found, nomem;
};

static int get_event(const struct dcomm_etcd_event *ev, void *arg) {
  struct get_wait *g = arg;
  if (ev->type != DCOMM_ETCD_PUT || ev->klen != g->klen || memcmp(ev->key, g->key, g->klen) != 0) return 0;
  g->val = malloc(ev->vlen ? ev->vlen : 1);
  if (!g->val) {
    g->nomem = 1;
    return 1;
  }
  if (ev->vlen) memcpy(g->val, ev->val, ev->vlen);
  g->vlen = ev->vlen;
  g->found = 1;
  return 1;
}

/* Waits until the namespaced key k exists or deadline; val may be NULL. */
static int wait_key(struct etcd_store *e, const char *k, const char *key, double timeout, double deadline,
                    const char *op, void **val, size_t *len) {
  for (;;) {
    double left = deadline - dcomm__now();
    if (left < 0) left = 0;
    struct dcomm_etcd_kv kv;
    int64_t rev = 0;
    /* The read itself gets the usual I/O slack beyond the wait. */
    int rc = dcomm__etcd_get(e->c, k, left + DCOMM_STORE_IO_SLACK, &kv, &rev);
    if (rc == 0) {
      if (val) {
        *val = kv.val; /* already malloc'd and NUL-terminated */
        *len = kv.vlen;
        kv.val = NULL;
      }
      dcomm__etcd_kv_clear(&kv);
      return 0;
    }
    if (rc != DCOMM_ENOTFOUND) return dcomm__err_ctx(rc, "etcd store %s '%.200s'", op, key);
    left = deadline - dcomm__now();
    if (left <= 0)
      return dcomm__err(DCOMM_ETIMEDOUT, "etcd store %s: key '%.200s' not set within %.3f s", op, key, timeout);
    struct get_wait g = {.key = k, .klen = strlen(k)};
    rc = dcomm__etcd_watch(e->c, k, 0, rev + 1, left, get_event, &g, NULL);
    if (g.nomem) return dcomm__err(DCOMM_ENOMEM, "etcd store %s: out of memory", op);
    if (rc == 0 && g.found) {
      if (val) {
        *val = g.val;
        *len = g.vlen;
      } else {
        free(g.val);
      }
      return 0;
    }
    free(g.val);
    if (rc == DCOMM_ETIMEDOUT)
      return dcomm__err(DCOMM_ETIMEDOUT, "etcd store %s: key '%.200s' not set within %.3f s", op, key, timeout);
    if (rc != DCOMM_ENOTFOUND) return dcomm__err_ctx(rc < 0 ? rc : DCOMM_EPROTO, "etcd store %s '%.200s'", op, key);
    /* Compacted past rev + 1: read again. */
  }
}

static int etcd_get(struct dcomm_store *s, const char *key, double timeout, void **val, size_t *len) {
  struct etcd_store *e = (struct etcd_store *)s;
  char *k = NULL;
  DCOMM_CHECK(ns_key(e, key, &k));
  int rc = wait_key(e, k, key, timeout, dcomm__now() + timeout, "get", val, len);
  free(k);
  return rc;
}

static int parse_int64(const void *v, size_t n, int64_t *out) {
  char buf[32];
  if (n == 0 || n >= sizeof(buf)) return -1;
  memcpy(buf, v, n);
  buf[n] = 0;
  size_t i = (buf[0] == '-' || buf[0] == '+') ? 1 : 0;
  if (!buf[i]) return -1;
  for (size_t j = i; j < n; j++)
    if (buf[j] < '0' || buf[j] > '9') return -1;
  errno = 0;
  long long x = strtoll(buf, NULL, 10);
  if (errno) return -1;
  *out = (int64_t)x;
  return 0;
}

static int etcd_add(struct dcomm_store *s, const char *key, int64_t delta, int64_t *result) {
  struct etcd_store *e = (struct etcd_store *)s;
  char *k = NULL;
  DCOMM_CHECK(ns_key(e, key, &k));
  double deadline = dcomm__now() + (s->timeout > 0 ? s->timeout : 10.0);
  struct dcomm_etcd_kv kv;
  int rc = dcomm__etcd_get(e->c, k, -1, &kv, NULL);
  int tries = 0;
  for (;;) {
    int absent = rc == DCOMM_ENOTFOUND;
    if (rc < 0 && !absent) {
      rc = dcomm__err_ctx(rc, "etcd store add '%.200s'", key);
      break;
    }
    int64_t cur = 0, res;
    if (!absent && parse_int64(kv.val, kv.vlen, &cur) < 0) {
      rc = dcomm__err(DCOMM_EINVAL, "etcd store add: the value of '%.200s' is not a decimal integer", key);
      dcomm__etcd_kv_clear(&kv);
      break;
    }
    if (__builtin_add_overflow(cur, delta, &res)) {
      rc = dcomm__err(DCOMM_EINVAL, "etcd store add: '%.200s' would overflow int64", key);
      dcomm__etcd_kv_clear(&kv);
      break;
    }
    char txt[32];
    int n = snprintf(txt, sizeof(txt), "%" PRId64, res);
    int done = 0;
    struct dcomm_etcd_kv now;
    if (absent) rc = dcomm__etcd_create_if_absent(e->c, k, txt, (size_t)n, 0, &done, &now);
    else rc = dcomm__etcd_cas(e->c, k, kv.mod_revision, txt, (size_t)n, 0, &done, &now);
    dcomm__etcd_kv_clear(&kv);
    if (rc < 0) {
      rc = dcomm__err_ctx(rc, "etcd store add '%.200s'", key);
      break;
    }
    if (done) {
      dcomm__etcd_kv_clear(&now);
      *result = res;
      rc = 0;
      break;
    }
    /* Lost the race: the failure branch told us the value to build on. */
    kv = now;
    rc = kv.key ? 0 : DCOMM_ENOTFOUND;
    if (++tries > 8 && dcomm__now() > deadline) {
      dcomm__etcd_kv_clear(&kv);
      rc = dcomm__err(DCOMM_ETIMEDOUT, "etcd store add '%.200s': %d conflicting writers in a row, gave up after the "
                      "timeout", key, tries);
      break;
    }
  }
  free(k);
  return rc;
}

static int etcd_compare_set(struct dcomm_store *s, const char *key, const void *expected, size_t elen,
                            const void *desired, size_t dlen, void **current, size_t *clen) {
  struct etcd_store *e = (struct etcd_store *)s;
  *current = NULL;
  *clen = 0;
  char *k = NULL;
  DCOMM_CHECK(ns_key(e, key, &k));
  int done = 0;
  struct dcomm_etcd_kv now;
  int rc = expected ? dcomm__etcd_cas_value(e->c, k, expected, elen, desired, dlen, &done, &now)
                    : dcomm__etcd_create_if_absent(e->c, k, desired, dlen, 0, &done, &now);
  free(k);
  if (rc < 0) return dcomm__err_ctx(rc, "etcd store compare_set '%.200s'", key);
  if (now.key) { /* written (the desired value) or present (its value) */
    *current = now.val;
    *clen = now.vlen;
    now.val = NULL;
  }
  dcomm__etcd_kv_clear(&now);
  return 0;
}

static int etcd_txn(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                    const struct dcomm_store_put *puts, int nput, int *done) {
  struct etcd_store *e = (struct etcd_store *)s;
  struct dcomm_etcd_cmp c[DCOMM_STORE_TXN_MAX];
  struct dcomm_etcd_put p[DCOMM_STORE_TXN_MAX];
  char *keys[2 * DCOMM_STORE_TXN_MAX] = {0};
  int rc = 0;
  for (int i = 0; i < ncmp && rc == 0; i++) {
    rc = ns_key(e, cmps[i].key, &keys[i]);
    c[i] = (struct dcomm_etcd_cmp){keys[i], cmps[i].kind, cmps[i].val, cmps[i].len};
  }
  for (int i = 0; i < nput && rc == 0; i++) {
    rc = ns_key(e, puts[i].key, &keys[ncmp + i]);
    p[i] = (struct dcomm_etcd_put){keys[ncmp + i], puts[i].val, puts[i].len, 0};
  }
  if (rc == 0) rc = dcomm__etcd_txn(e->c, c, (size_t)ncmp, p, (size_t)nput, done);
  for (int i = 0; i < ncmp + nput; i++) free(keys[i]);
  if (rc < 0) return dcomm__err_ctx(rc, "etcd store txn on '%.200s'", puts[0].key);
  return 0;
}

static int etcd_wait(struct dcomm_store *s, const char *const *keys, int n, double timeout) {
  struct etcd_store *e = (struct etcd_store *)s;
  double deadline = dcomm__now() + timeout;
  for (int i = 0; i < n; i++) {
    char *k = NULL;
    DCOMM_CHECK(ns_key(e, keys[i], &k));
    int rc = wait_key(e, k, keys[i], timeout, deadline, "wait", NULL, NULL);
    free(k);
    if (rc < 0) return rc;
  }
  return 0;
}

static int etcd_del(struct dcomm_store *s, const char *key, int *existed) {
  struct etcd_store *e = (struct etcd_store *)s;
  char *k = NULL;
  DCOMM_CHECK(ns_key(e, key, &k));
  int64_t deleted = 0;
  int rc = dcomm__etcd_delete(e->c, k, 0, &deleted);
  free(k);
  if (rc < 0) return dcomm__err_ctx(rc, "etcd store delete '%.200s'", key);
  *existed = deleted > 0;
  return 0;
}

static void etcd_close(struct dcomm_store *s) {
  struct etcd_store *e = (struct etcd_store *)s;
  dcomm__etcd_destroy(e->c);
  free(e);
}

static const struct dcomm_store_ops etcd_ops = {
    .name = "etcd",
    .set = etcd_set,
    .get = etcd_get,
    .add = etcd_add,
    .compare_set = etcd_compare_set,
    .txn = etcd_txn,
    .wait = etcd_wait,
    .del = etcd_del,
    .close = etcd_close,
};

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

int dcomm__store_etcd_open(const char *endpoints, const char *job_id, double timeout, struct dcomm_store **out) {
  if (!out) return dcomm__err(DCOMM_EINVAL, "etcd store: NULL output argument");
  *out = NULL;
  if (!endpoints || !*endpoints) return dcomm__err(DCOMM_EINVAL, "etcd store: no endpoints");
  if (!job_id || !*job_id) return dcomm__err(DCOMM_EINVAL, "etcd store: empty job id");
  if (strlen(job_id) > MAX_JOB_ID) return dcomm__err(DCOMM_EINVAL, "etcd store: job id longer than %d bytes", MAX_JOB_ID);
  if (strchr(job_id, '/')) return dcomm__err(DCOMM_EINVAL, "etcd store: job id '%s' contains '/'", job_id);
  if (!(timeout >= 0)) return dcomm__err(DCOMM_EINVAL, "etcd store: negative or NaN timeout");
  struct etcd_store *e = calloc(1, sizeof(*e));
  if (!e) return dcomm__err(DCOMM_ENOMEM, "etcd store: out of memory");
  e->base.ops = &etcd_ops;
  e->base.timeout = timeout;
  e->nslen = (size_t)snprintf(e->ns, sizeof(e->ns), "/dcomm/%s/", job_id);
  struct dcomm_etcd_opts o = {
      .timeout = timeout,
      .user = env("DCOMM_ETCD_USER"),
      .password = env("DCOMM_ETCD_PASSWORD"),
      .cacert = env("DCOMM_ETCD_CACERT"),
      .cert = env("DCOMM_ETCD_CERT"),
      .key = env("DCOMM_ETCD_KEY"),
  };
  int rc = dcomm__etcd_create(endpoints, &o, &e->c);
  if (rc == 0) {
    /* Reachable (and allowed to read our namespace)? */
    rc = dcomm__etcd_get(e->c, e->ns, -1, NULL, NULL);
    if (rc == DCOMM_ENOTFOUND) rc = 0;
  }
  if (rc < 0) {
    rc = dcomm__err_ctx(rc, "etcd store at %.300s", endpoints);
    dcomm__etcd_destroy(e->c);
    free(e);
    return rc;
  }
  DCOMM_LOG(INFO, ETCD, "store on etcd %s under %s", endpoints, e->ns);
  *out = &e->base;
  return 0;
}

#else /* !DCOMM_HAVE_ETCD */

int dcomm__store_etcd_open(const char *endpoints, const char *job_id, double timeout, struct dcomm_store **out) {
  if (out) *out = NULL;
  return dcomm__err(DCOMM_ENOTSUP, "etcd store: dcomm was built without libcurl/jansson");
}

#endif
