/*
 * store.c: the prefixing wrappers every caller goes through. They check the
 * arguments once for all implementations (key length, value bound, wait key
 * count), prepend the handle's prefix and resolve a negative timeout to the
 * handle's default before calling the implementation.
 */
#define _GNU_SOURCE
#include "config.h"
#include "store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "param.h"
#include "store_proto.h"

/* Writes prefix + key into out (DCOMM_STORE_PROTO_MAX_KEY + 1 bytes). */
static int full_key(const struct dcomm_store *s, const char *key, char *out) {
  if (!key) return dcomm__err(DCOMM_EINVAL, "store: key is NULL");
  size_t klen = strnlen(key, DCOMM_STORE_MAX_KEY + 1);
  if (klen == 0) return dcomm__err(DCOMM_EINVAL, "store: empty key");
  if (klen > DCOMM_STORE_MAX_KEY)
    return dcomm__err(DCOMM_EINVAL, "store: key longer than %d bytes", DCOMM_STORE_MAX_KEY);
  size_t plen = strlen(s->prefix);
  memcpy(out, s->prefix, plen);
  memcpy(out + plen, key, klen + 1);
  return 0;
}

static int check_handle(const struct dcomm_store *s) {
  if (!s || !s->ops) return dcomm__err(DCOMM_EINVAL, "store: NULL handle");
  return 0;
}

static int check_value(const void *val, size_t len, const char *what) {
  size_t max = dcomm__param_size(DCOMM_P_STORE_MAX_VALUE);
  if (len > 0 && !val) return dcomm__err(DCOMM_EINVAL, "store: %s is NULL but its length is %zu", what, len);
  if (len > max)
    return dcomm__err(DCOMM_EINVAL, "store: %s of %zu bytes exceeds DCOMM_STORE_MAX_VALUE (%zu)", what, len, max);
  return 0;
}

static int resolve_timeout(const struct dcomm_store *s, double timeout, double *out) {
  if (isnan(timeout)) return dcomm__err(DCOMM_EINVAL, "store: timeout is NaN");
  *out = timeout < 0 ? s->timeout : timeout;
  return 0;
}

int dcomm__store_set(struct dcomm_store *s, const char *key, const void *val, size_t len) {
  char k[DCOMM_STORE_PROTO_MAX_KEY + 1];
  DCOMM_CHECK(check_handle(s));
  DCOMM_CHECK(full_key(s, key, k));
  DCOMM_CHECK(check_value(val, len, "value"));
  return s->ops->set(s, k, val, len);
}

int dcomm__store_get(struct dcomm_store *s, const char *key, double timeout, void **val, size_t *len) {
  char k[DCOMM_STORE_PROTO_MAX_KEY + 1];
  DCOMM_CHECK(check_handle(s));
  if (!val || !len) return dcomm__err(DCOMM_EINVAL, "store get: NULL output argument");
  *val = NULL;
  *len = 0;
  DCOMM_CHECK(full_key(s, key, k));
  DCOMM_CHECK(resolve_timeout(s, timeout, &timeout));
  return s->ops->get(s, k, timeout, val, len);
}

int dcomm__store_get_stop(struct dcomm_store *s, const char *key, double timeout, dcomm_store_stop_fn stop, void *arg,
                          void **val, size_t *len) {
  if (!stop) return dcomm__store_get(s, key, timeout, val, len);
  DCOMM_CHECK(check_handle(s));
  DCOMM_CHECK(resolve_timeout(s, timeout, &timeout));
  double deadline = dcomm__now() + timeout;
  for (;;) {
    double left = deadline - dcomm__now();
    double slice = left < DCOMM_STORE_STOP_SLICE ? left : DCOMM_STORE_STOP_SLICE;
    int rc = dcomm__store_get(s, key, slice > 0.001 ? slice : 0.001, val, len);
    if (rc != DCOMM_ETIMEDOUT) return rc;
    if (dcomm__now() >= deadline)
      return dcomm__err(DCOMM_ETIMEDOUT, "store get: key '%s' not set within %.3f s", key,
                        timeout);
    DCOMM_CHECK(stop(arg));
  }
}

int dcomm__store_add(struct dcomm_store *s, const char *key, int64_t delta, int64_t *result) {
  char k[DCOMM_STORE_PROTO_MAX_KEY + 1];
  int64_t dummy;
  DCOMM_CHECK(check_handle(s));
  DCOMM_CHECK(full_key(s, key, k));
  return s->ops->add(s, k, delta, result ? result : &dummy);
}

int dcomm__store_compare_set(struct dcomm_store *s, const char *key, const void *expected, size_t elen,
                             const void *desired, size_t dlen, void **current, size_t *clen) {
  char k[DCOMM_STORE_PROTO_MAX_KEY + 1];
  void *cur = NULL;
  size_t cl = 0;
  DCOMM_CHECK(check_handle(s));
  if (current) *current = NULL;
  if (clen) *clen = 0;
  DCOMM_CHECK(full_key(s, key, k));
  /* expected NULL is the "key absent" case; a length with it is a caller bug. */
  if (!expected && elen)
    return dcomm__err(DCOMM_EINVAL, "store compare_set: expected is NULL (key absent) but elen is %zu", elen);
  if (expected) DCOMM_CHECK(check_value(expected, elen, "expected value"));
  DCOMM_CHECK(check_value(desired, dlen, "desired value"));
  int rc = s->ops->compare_set(s, k, expected, elen, desired, dlen, &cur, &cl);
  if (rc < 0) return rc;
  if (current) *current = cur;
  else free(cur);
  if (clen) *clen = cl;
  return 0;
}

/* One block holding n pointers and every key with s's prefix (free it);
 * what names the call in errors. */
static int prefixed_keys(const struct dcomm_store *s, const char *const *keys, int n, const char *what, char ***out) {
  size_t plen = strlen(s->prefix), total = (size_t)n * sizeof(char *);
  for (int i = 0; i < n; i++) {
    if (!keys[i]) return dcomm__err(DCOMM_EINVAL, "store %s: key %d is NULL", what, i);
    size_t kl = strnlen(keys[i], DCOMM_STORE_MAX_KEY + 1);
    if (kl == 0 || kl > DCOMM_STORE_MAX_KEY)
      return dcomm__err(DCOMM_EINVAL, "store %s: key %d is empty or longer than %d bytes", what, i,
                        DCOMM_STORE_MAX_KEY);
    total += plen + kl + 1;
  }
  char **full = malloc(total ? total : 1);
  if (!full) return dcomm__err(DCOMM_ENOMEM, "store %s: out of memory", what);
  char *p = (char *)(full + n);
  for (int i = 0; i < n; i++) {
    full[i] = p;
    size_t kl = strlen(keys[i]);
    memcpy(p, s->prefix, plen);
    memcpy(p + plen, keys[i], kl + 1);
    p += plen + kl + 1;
  }
  *out = full;
  return 0;
}

int dcomm__store_wait(struct dcomm_store *s, const char *const *keys, int n, double timeout) {
  DCOMM_CHECK(check_handle(s));
  if (n < 0 || n > DCOMM_STORE_MAX_WAIT_KEYS)
    return dcomm__err(DCOMM_EINVAL, "store wait: %d keys (at most %d)", n, DCOMM_STORE_MAX_WAIT_KEYS);
  if (n > 0 && !keys) return dcomm__err(DCOMM_EINVAL, "store wait: keys is NULL");
  if (n == 0) return 0;
  DCOMM_CHECK(resolve_timeout(s, timeout, &timeout));
  char **full;
  DCOMM_CHECK(prefixed_keys(s, keys, n, "wait", &full));
  int rc = s->ops->wait(s, (const char *const *)full, n, timeout);
  free(full);
  return rc;
}

/* get_many without the op (or a batch it refused as too large): one get
 * per key, each within what is left of the deadline. */
static int get_each(struct dcomm_store *s, const char *const *keys, int n, double deadline, void **vals, size_t *lens) {
  for (int i = 0; i < n; i++) {
    double left = deadline - dcomm__now();
    int rc = s->ops->get(s, keys[i], left > 0.001 ? left : 0.001, &vals[i], &lens[i]);
    if (rc == DCOMM_ETIMEDOUT) vals[i] = NULL, lens[i] = 0;
    else if (rc < 0) return rc;
  }
  return 0;
}

static void free_values(void **vals, size_t *lens, int n) {
  for (int i = 0; i < n; i++) {
    free(vals[i]);
    vals[i] = NULL;
    lens[i] = 0;
  }
}

int dcomm__store_get_many(struct dcomm_store *s, const char *const *keys, int n, double timeout, void **vals,
                          size_t *lens) {
  DCOMM_CHECK(check_handle(s));
  if (n < 0 || (n > 0 && (!keys || !vals || !lens)))
    return dcomm__err(DCOMM_EINVAL, "store get_many: %d keys, or a NULL array", n);
  for (int i = 0; i < n; i++) vals[i] = NULL, lens[i] = 0;
  if (n == 0) return 0;
  DCOMM_CHECK(resolve_timeout(s, timeout, &timeout));
  char **full;
  DCOMM_CHECK(prefixed_keys(s, keys, n, "get_many", &full));
  double deadline = dcomm__now() + timeout;
  int rc = 0;
  for (int at = 0; rc == 0 && at < n; at += DCOMM_STORE_MAX_WAIT_KEYS) {
    int k = n - at < DCOMM_STORE_MAX_WAIT_KEYS ? n - at : DCOMM_STORE_MAX_WAIT_KEYS;
    double left = deadline - dcomm__now();
    rc = s->ops->get_many ? s->ops->get_many(s, (const char *const *)full + at, k, left > 0.001 ? left : 0.001,
                                             vals + at, lens + at)
                          : DCOMM_ENOTSUP;
    if (rc == DCOMM_ENOTSUP) rc = get_each(s, (const char *const *)full + at, k, deadline, vals + at, lens + at);
  }
  int missing = 0, first = -1;
  for (int i = 0; rc == 0 && i < n; i++)
    if (!vals[i] && missing++ == 0) first = i;
  if (rc < 0) free_values(vals, lens, n);
  else if (missing)
    rc = dcomm__err(DCOMM_ETIMEDOUT, "store get_many: %d of %d keys not set within %.3f s, the first '%s'", missing,
                    n, timeout, keys[first]);
  free(full);
  return rc;
}

int dcomm__store_get_numbered(struct dcomm_store *s, const char *prefix, int64_t first, int n, double timeout,
                              dcomm_store_stop_fn stop, void *arg, void **vals, size_t *lens) {
  if (!prefix || n < 0) return dcomm__err(DCOMM_EINVAL, "store get_many: no prefix, or %d keys", n);
  size_t each = strnlen(prefix, DCOMM_STORE_MAX_KEY) + 24;
  char **keys = malloc((size_t)n * (sizeof(char *) + each) + 1);
  if (!keys) return dcomm__err(DCOMM_ENOMEM, "store get_many: out of memory");
  char *names = (char *)(keys + n);
  for (int i = 0; i < n; i++) {
    keys[i] = names + (size_t)i * each;
    snprintf(keys[i], each, "%s%lld", prefix, (long long)(first + i));
  }
  int rc = dcomm__store_get_many_stop(s, (const char *const *)keys, n, timeout, stop, arg, vals, lens);
  free(keys);
  return rc;
}

int dcomm__store_get_many_stop(struct dcomm_store *s, const char *const *keys, int n, double timeout,
                               dcomm_store_stop_fn stop, void *arg, void **vals, size_t *lens) {
  if (!stop || n <= 0) return dcomm__store_get_many(s, keys, n, timeout, vals, lens);
  DCOMM_CHECK(check_handle(s));
  DCOMM_CHECK(resolve_timeout(s, timeout, &timeout));
  double deadline = dcomm__now() + timeout;
  /* Each slice asks again only for the keys still absent. */
  const char **ask = malloc((size_t)n * sizeof(*ask));
  int *at = malloc((size_t)n * sizeof(*at));
  void **v = malloc((size_t)n * sizeof(*v));
  size_t *l = malloc((size_t)n * sizeof(*l));
  int rc = ask && at && v && l ? 0 : dcomm__err(DCOMM_ENOMEM, "store get_many: out of memory");
  for (int i = 0; i < n; i++) vals[i] = NULL, lens[i] = 0;
  while (rc == 0) {
    int k = 0;
    for (int i = 0; i < n; i++)
      if (!vals[i]) ask[k] = keys[i], at[k++] = i;
    if (k == 0) break;
    double left = deadline - dcomm__now();
    double slice = left < DCOMM_STORE_STOP_SLICE ? left : DCOMM_STORE_STOP_SLICE;
    rc = dcomm__store_get_many(s, ask, k, slice > 0.001 ? slice : 0.001, v, l);
    if (rc == 0 || rc == DCOMM_ETIMEDOUT)
      for (int j = 0; j < k; j++) vals[at[j]] = v[j], lens[at[j]] = l[j];
    if (rc != DCOMM_ETIMEDOUT) continue;
    rc = 0;
    if (dcomm__now() >= deadline)
      rc = dcomm__err(DCOMM_ETIMEDOUT, "store get_many: %d of %d keys not set within %.3f s, the first '%s'", k, n,
                      timeout, ask[0]);
    else
      rc = stop(arg);
  }
  if (rc < 0 && rc != DCOMM_ETIMEDOUT) free_values(vals, lens, n);
  free(ask);
  free(at);
  free(v);
  free(l);
  return rc;
}

int dcomm__store_txn(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                     const struct dcomm_store_put *puts, int nput, int *done) {
  DCOMM_CHECK(check_handle(s));
  if (!done) return dcomm__err(DCOMM_EINVAL, "store txn: NULL output argument");
  *done = 0;
  if (ncmp < 0 || ncmp > DCOMM_STORE_TXN_MAX || nput < 1 || nput > DCOMM_STORE_TXN_MAX || (ncmp && !cmps) || !puts)
    return dcomm__err(DCOMM_EINVAL, "store txn: %d compares and %d puts (0..%d compares, 1..%d puts)", ncmp, nput,
                      DCOMM_STORE_TXN_MAX, DCOMM_STORE_TXN_MAX);
  if (!s->ops->txn) return dcomm__err(DCOMM_ENOTSUP, "store txn: the %s store has no guarded writes", s->ops->name);
  /* One block for the prefixed keys of both lists. */
  char(*keys)[DCOMM_STORE_PROTO_MAX_KEY + 1] = malloc((size_t)(ncmp + nput) * sizeof(*keys));
  struct dcomm_store_cmp c[DCOMM_STORE_TXN_MAX];
  struct dcomm_store_put p[DCOMM_STORE_TXN_MAX];
  if (!keys) return dcomm__err(DCOMM_ENOMEM, "store txn: out of memory");
  int rc = 0;
  for (int i = 0; rc == 0 && i < ncmp; i++) {
    c[i] = cmps[i];
    if (c[i].kind < DCOMM_STORE_ABSENT || c[i].kind > DCOMM_STORE_EQUAL)
      rc = dcomm__err(DCOMM_EINVAL, "store txn: compare %d has kind %d", i, c[i].kind);
    else if (c[i].kind == DCOMM_STORE_EQUAL) rc = check_value(c[i].val, c[i].len, "compared value");
    else c[i].val = NULL, c[i].len = 0;
    if (rc == 0) rc = full_key(s, cmps[i].key, keys[i]);
    c[i].key = keys[i];
  }
  for (int i = 0; rc == 0 && i < nput; i++) {
    p[i] = puts[i];
    rc = check_value(p[i].val, p[i].len, "value");
    if (rc == 0) rc = full_key(s, puts[i].key, keys[ncmp + i]);
    p[i].key = keys[ncmp + i];
  }
  /* etcd refuses a txn that puts one key twice; so do the others. */
  for (int i = 0; rc == 0 && i < nput; i++)
    for (int j = 0; rc == 0 && j < i; j++)
      if (!strcmp(p[i].key, p[j].key)) rc = dcomm__err(DCOMM_EINVAL, "store txn: key '%.200s' is put twice", p[i].key);
  if (rc == 0) rc = s->ops->txn(s, c, ncmp, p, nput, done);
  free(keys);
  return rc;
}

int dcomm__store_cmps_hold(const struct dcomm_store_cmp *cmps, int ncmp, dcomm_store_find_fn find, void *ctx) {
  for (int i = 0; i < ncmp; i++) {
    size_t len = 0;
    const void *v = find(ctx, cmps[i].key, &len);
    int ok = cmps[i].kind == DCOMM_STORE_ABSENT   ? !v
             : cmps[i].kind == DCOMM_STORE_EXISTS ? v != NULL
                                                  : v && len == cmps[i].len && (!len || !memcmp(v, cmps[i].val, len));
    if (!ok) return 0;
  }
  return 1;
}

int dcomm__store_delete(struct dcomm_store *s, const char *key, int *existed) {
  char k[DCOMM_STORE_PROTO_MAX_KEY + 1];
  int dummy;
  DCOMM_CHECK(check_handle(s));
  if (existed) *existed = 0;
  DCOMM_CHECK(full_key(s, key, k));
  return s->ops->del(s, k, existed ? existed : &dummy);
}

void dcomm__store_close(struct dcomm_store *s) {
  if (s && s->ops && s->ops->close) s->ops->close(s);
}

void dcomm__store_interrupt(struct dcomm_store *s) {
  if (s && s->ops && s->ops->interrupt) s->ops->interrupt(s);
}

int dcomm__store_set_prefix(struct dcomm_store *s, const char *prefix) {
  DCOMM_CHECK(check_handle(s));
  if (!prefix) prefix = "";
  size_t n = strnlen(prefix, sizeof(s->prefix));
  if (n >= sizeof(s->prefix))
    return dcomm__err(DCOMM_EINVAL, "store: prefix longer than %zu bytes", sizeof(s->prefix) - 1);
  memcpy(s->prefix, prefix, n + 1);
  return 0;
}

/* ---- views ---- */

/* The wrappers have already put the view's prefix on every key, so a
 * view's ops hand them to the base's ops unchanged. */
struct store_view {
  struct dcomm_store base;
  struct dcomm_store *of;
};

#define OF(s) (((struct store_view *)(s))->of)
static int view_set(struct dcomm_store *s, const char *key, const void *val, size_t len) {
  return OF(s)->ops->set(OF(s), key, val, len);
}
static int view_get(struct dcomm_store *s, const char *key, double timeout, void **val, size_t *len) {
  return OF(s)->ops->get(OF(s), key, timeout, val, len);
}
static int view_add(struct dcomm_store *s, const char *key, int64_t delta, int64_t *result) {
  return OF(s)->ops->add(OF(s), key, delta, result);
}
static int view_compare_set(struct dcomm_store *s, const char *key, const void *expected, size_t elen,
                            const void *desired, size_t dlen, void **current, size_t *clen) {
  return OF(s)->ops->compare_set(OF(s), key, expected, elen, desired, dlen, current, clen);
}
static int view_txn(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                    const struct dcomm_store_put *puts, int nput, int *done) {
  if (!OF(s)->ops->txn) return dcomm__err(DCOMM_ENOTSUP, "store txn: the %s store has no guarded writes", OF(s)->ops->name);
  return OF(s)->ops->txn(OF(s), cmps, ncmp, puts, nput, done);
}
static int view_wait(struct dcomm_store *s, const char *const *keys, int n, double timeout) {
  return OF(s)->ops->wait(OF(s), keys, n, timeout);
}
static int view_get_many(struct dcomm_store *s, const char *const *keys, int n, double timeout, void **vals,
                         size_t *lens) {
  if (!OF(s)->ops->get_many) return DCOMM_ENOTSUP; /* the caller reads them one by one */
  return OF(s)->ops->get_many(OF(s), keys, n, timeout, vals, lens);
}
static int view_del(struct dcomm_store *s, const char *key, int *existed) {
  return OF(s)->ops->del(OF(s), key, existed);
}
static void view_close(struct dcomm_store *s) { free(s); }
#undef OF

static const struct dcomm_store_ops view_ops = {
    .name = "view",
    .set = view_set,
    .get = view_get,
    .add = view_add,
    .compare_set = view_compare_set,
    .txn = view_txn,
    .wait = view_wait,
    .get_many = view_get_many,
    .del = view_del,
    .close = view_close,
};

const char *dcomm__store_kind(const struct dcomm_store *s) {
  if (s && s->ops == &view_ops) s = ((const struct store_view *)s)->of;
  return s ? s->ops->name : "none";
}

int dcomm__store_view(struct dcomm_store *base, const char *prefix, struct dcomm_store **out) {
  if (!out) return dcomm__err(DCOMM_EINVAL, "store view: NULL output argument");
  *out = NULL;
  DCOMM_CHECK(check_handle(base));
  struct store_view *v = calloc(1, sizeof(*v));
  if (!v) return dcomm__err(DCOMM_ENOMEM, "store view: out of memory");
  v->base.ops = &view_ops;
  v->base.timeout = base->timeout;
  v->of = base->ops == &view_ops ? ((struct store_view *)base)->of : base;
  int rc = dcomm__store_set_prefix(&v->base, prefix);
  if (rc < 0) {
    free(v);
    return rc;
  }
  *out = &v->base;
  return 0;
}
