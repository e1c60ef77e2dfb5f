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

int dcomm__store_wait(struct dcomm_store *s, const char *const *keys, int n, double timeout) {
  DCOMM_CHECK(check_handle(s));
  if (n < 0 || n > DCOMM_STORE_MAX_WAIT_KEYS)
    return dcomm__err(DCOMM_EINVAL, "store wait: %d keys (at most %d)", n, DCOMM_STORE_MAX_WAIT_KEYS);
  if (n > 0 && !keys) return dcomm__err(DCOMM_EINVAL, "store wait: keys is NULL");
  if (n == 0) return 0;
  DCOMM_CHECK(resolve_timeout(s, timeout, &timeout));
  /* One block holds the pointer array and every prefixed key. */
  size_t plen = strlen(s->prefix), total = (size_t)n * sizeof(char *);
  for (int i = 0; i < n; i++) {
    if (!keys[i]) return dcomm__err(DCOMM_EINVAL, "store wait: key %d is NULL", i);
    size_t kl = strnlen(keys[i], DCOMM_STORE_MAX_KEY + 1);
    if (kl == 0 || kl > DCOMM_STORE_MAX_KEY)
      return dcomm__err(DCOMM_EINVAL, "store wait: key %d is empty or longer than %d bytes", i, DCOMM_STORE_MAX_KEY);
    total += plen + kl + 1;
  }
  char **full = malloc(total);
  if (!full) return dcomm__err(DCOMM_ENOMEM, "store wait: out of memory");
  char *p = (char *)(full + n);
  for (int i = 0; i < n; i++) {
    full[i] = p;
    size_t kl = strlen(keys[i]);
    memcpy(p, s->prefix, plen);
    memcpy(p + plen, keys[i], kl + 1);
    p += plen + kl + 1;
  }
  int rc = s->ops->wait(s, (const char *const *)full, n, timeout);
  free(full);
  return rc;
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

int dcomm__store_set_prefix(struct dcomm_store *s, const char *prefix) {
  DCOMM_CHECK(check_handle(s));
  if (!prefix) prefix = "";
  size_t n = strnlen(prefix, sizeof(s->prefix));
  if (n >= sizeof(s->prefix))
    return dcomm__err(DCOMM_EINVAL, "store: prefix longer than %zu bytes", sizeof(s->prefix) - 1);
  memcpy(s->prefix, prefix, n + 1);
  return 0;
}
