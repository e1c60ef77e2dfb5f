/*
 * etcd_kv.c: the key-value calls of the etcd client (etcd_client.h): put,
 * get, range and delete, and the transactions the etcd store is built on
 * (create-if-absent, compare-and-swap on a revision or on a value,
 * conditional multi-key puts and prefix deletes). Puts and deletes may be
 * repeated on another endpoint after a failure; a transaction is sent at
 * most once (see etcd_http.c). Also the freeing of the key-value entries
 * these calls return.
 */
#define _GNU_SOURCE
#include "config.h"
#include "etcd_internal.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "store.h"

#ifdef DCOMM_HAVE_ETCD

#include <jansson.h>

/* ---- KV ---- */

static int check_key(struct dcomm_etcd *c, const char *key, const char *what) {
  if (!c) return dcomm__err(DCOMM_EINVAL, "etcd %s: NULL client", what);
  if (!key || !*key) return dcomm__err(DCOMM_EINVAL, "etcd %s: empty key", what);
  return 0;
}

int dcomm__etcd_put(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                    int64_t *revision) {
  const char *what = "put";
  DCOMM_CHECK(check_key(c, key, what));
  if (len && !val) return dcomm__err(DCOMM_EINVAL, "etcd put: NULL value of %zu bytes", len);
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/kv/put", etcd__put_obj(key, val, len, lease), -1, CALL_IDEMPOTENT, &resp));
  int64_t rev;
  int rc = etcd__j_header_rev(resp, 1, &rev, what);
  json_decref(resp);
  if (rc == 0 && revision) *revision = rev;
  return rc;
}

int dcomm__etcd_get(struct dcomm_etcd *c, const char *key, double timeout, struct dcomm_etcd_kv *kv,
                    int64_t *revision) {
  const char *what = "get";
  if (kv) memset(kv, 0, sizeof(*kv));
  if (revision) *revision = 0;
  DCOMM_CHECK(check_key(c, key, what));
  json_t *req = json_object();
  if (req && etcd__jset_b64(req, "key", key, strlen(key))) {
    json_decref(req);
    req = NULL;
  }
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/kv/range", req, timeout, CALL_IDEMPOTENT, &resp));
  int64_t rev;
  struct dcomm_etcd_kv *kvs = NULL;
  size_t n = 0;
  int rc = etcd__j_header_rev(resp, 1, &rev, what);
  if (rc == 0) rc = etcd__j_kvs(resp, &kvs, &n, what);
  json_decref(resp);
  if (rc < 0) return rc;
  if (revision) *revision = rev;
  if (n == 0) return dcomm__err(DCOMM_ENOTFOUND, "etcd get: key '%.200s' not found", key);
  if (n > 1 || kvs[0].klen != strlen(key) || memcmp(kvs[0].key, key, kvs[0].klen) != 0) {
    dcomm__etcd_kvs_free(kvs, n);
    return etcd__proto(what, "the answer holds other keys than the one asked for", NULL);
  }
  if (kv) *kv = kvs[0];
  else dcomm__etcd_kv_clear(&kvs[0]);
  free(kvs);
  return 0;
}

int dcomm__etcd_range_prefix(struct dcomm_etcd *c, const char *prefix, struct dcomm_etcd_kv **kvs, size_t *n,
                             int64_t *revision) {
  const char *what = "range";
  if (!c || !prefix || !kvs || !n) return dcomm__err(DCOMM_EINVAL, "etcd range: NULL argument");
  *kvs = NULL;
  *n = 0;
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/kv/range", etcd__range_obj(prefix, 1), -1, CALL_IDEMPOTENT, &resp));
  int64_t rev;
  int rc = etcd__j_header_rev(resp, 1, &rev, what);
  if (rc == 0) rc = etcd__j_kvs(resp, kvs, n, what);
  json_decref(resp);
  if (rc == 0 && revision) *revision = rev;
  return rc;
}

int dcomm__etcd_delete(struct dcomm_etcd *c, const char *key, int prefix, int64_t *deleted) {
  const char *what = "delete";
  if (deleted) *deleted = 0;
  if (!c || !key || (!prefix && !*key)) return dcomm__err(DCOMM_EINVAL, "etcd delete: NULL client or empty key");
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/kv/deleterange", etcd__range_obj(key, prefix), -1, CALL_IDEMPOTENT, &resp));
  int64_t d = 0;
  int rc = etcd__j_i64(resp, "deleted", 0, &d, what);
  json_decref(resp);
  if (rc == 0 && d < 0) rc = etcd__proto(what, "negative 'deleted' count", NULL);
  if (rc == 0 && deleted) *deleted = d;
  return rc;
}

/* ---- transactions ---- */

/* if (compare) put(key, val) else range(key). Consumes cmp. */
static int txn_put_if(struct dcomm_etcd *c, const char *what, const char *key, json_t *cmp, const void *val,
                      size_t len, int64_t lease, int *done, struct dcomm_etcd_kv *current) {
  if (done) *done = 0;
  if (current) memset(current, 0, sizeof(*current));
  int rc = check_key(c, key, what);
  if (rc == 0 && len && !val) rc = dcomm__err(DCOMM_EINVAL, "etcd %s: NULL value of %zu bytes", what, len);
  if (rc < 0) {
    json_decref(cmp);
    return rc;
  }
  json_t *req = NULL;
  if (cmp && etcd__jset_b64(cmp, "key", key, strlen(key)) == 0) {
    json_t *get = json_object();
    if (get && etcd__jset_b64(get, "key", key, strlen(key))) {
      json_decref(get);
      get = NULL;
    }
    req = json_pack("{s:[o], s:[{s:o}], s:[{s:o}]}", "compare", cmp, "success", "request_put",
                    etcd__put_obj(key, val, len, lease), "failure", "request_range", get);
    cmp = NULL; /* json_pack's "o" took it, even on failure */
  }
  json_decref(cmp);
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/kv/txn", req, -1, 0, &resp));
  int ok = 0;
  int64_t rev = 0;
  rc = etcd__j_bool(resp, "succeeded", &ok, what);
  if (rc == 0) rc = etcd__j_header_rev(resp, 1, &rev, what);
  if (rc == 0 && ok && current) {
    current->klen = strlen(key);
    current->key = strdup(key);
    current->val = malloc(len + 1);
    if (!current->key || !current->val) {
      rc = dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
    } else {
      if (len) memcpy(current->val, val, len);
      ((char *)current->val)[len] = 0;
      current->vlen = len;
      current->mod_revision = rev;
      current->lease = lease;
    }
  } else if (rc == 0 && !ok) {
    /* Failure branch: responses[0].response_range holds the key as it is. */
    json_t *rs = json_object_get(resp, "responses");
    json_t *r0 = json_is_array(rs) && json_array_size(rs) == 1 ? json_array_get(rs, 0) : NULL;
    json_t *rr = json_is_object(r0) ? json_object_get(r0, "response_range") : NULL;
    if (!json_is_object(rr)) {
      rc = etcd__proto(what, "a failed transaction did not return its range answer", NULL);
    } else {
      struct dcomm_etcd_kv *kvs = NULL;
      size_t n = 0;
      rc = etcd__j_kvs(rr, &kvs, &n, what);
      if (rc == 0 && (n > 1 || (n == 1 && (kvs[0].klen != strlen(key) || memcmp(kvs[0].key, key, kvs[0].klen)))))
        rc = etcd__proto(what, "the range answer holds other keys than the one asked for", NULL);
      if (rc == 0 && n == 1 && current) {
        *current = kvs[0];
        memset(&kvs[0], 0, sizeof(kvs[0]));
      }
      dcomm__etcd_kvs_free(kvs, n);
    }
  }
  json_decref(resp);
  if (rc < 0) {
    if (current) dcomm__etcd_kv_clear(current);
    return rc;
  }
  if (done) *done = ok;
  return 0;
}

int dcomm__etcd_create_if_absent(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                                 int *done, struct dcomm_etcd_kv *current) {
  return txn_put_if(c, "txn create-if-absent", key, etcd__cmp_i64("CREATE", "create_revision", 0), val, len, lease,
                    done, current);
}

int dcomm__etcd_cas(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const void *val, size_t len,
                    int64_t lease, int *done, struct dcomm_etcd_kv *current) {
  if (mod_revision < 0) return dcomm__err(DCOMM_EINVAL, "etcd cas: negative mod_revision");
  return txn_put_if(c, "txn compare-and-swap", key, etcd__cmp_i64("MOD", "mod_revision", mod_revision), val, len, lease,
                    done, current);
}

/* Sends {compare: cl, success: ops} and reads whether it succeeded into
 * *done. Consumes cl and ops (NULL when building them failed). */
static int run_txn(struct dcomm_etcd *c, const char *what, json_t *cl, json_t *ops, int *done) {
  json_t *req = NULL;
  if (cl && ops) {
    req = json_pack("{s:o, s:o}", "compare", cl, "success", ops);
    cl = ops = NULL; /* json_pack's "o" took them, even on failure */
  }
  json_decref(cl);
  json_decref(ops);
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/kv/txn", req, -1, 0, &resp));
  int ok = 0;
  int rc = etcd__j_bool(resp, "succeeded", &ok, what);
  json_decref(resp);
  if (rc == 0 && done) *done = ok;
  return rc;
}

/* if (key's mod_revision == mod_revision) ops, nothing otherwise; *done
 * says which. Consumes ops (an array of request objects, NULL when
 * building it failed). */
static int txn_ops_if_mod(struct dcomm_etcd *c, const char *what, const char *key, int64_t mod_revision, json_t *ops,
                          int *done) {
  json_t *cmp = etcd__cmp_i64("MOD", "mod_revision", mod_revision), *cl = json_array();
  if (cmp && etcd__jset_b64(cmp, "key", key, strlen(key)) != 0) {
    json_decref(cmp);
    cmp = NULL;
  }
  if (cl && (!cmp || json_array_append_new(cl, cmp) != 0)) {
    json_decref(cl);
    cl = NULL;
  }
  return run_txn(c, what, cl, ops, done);
}

/* The request_put objects of puts, as an array (NULL: building failed). */
static json_t *put_ops(const struct dcomm_etcd_put *puts, size_t n) {
  json_t *ops = json_array();
  for (size_t i = 0; i < n && ops; i++) {
    json_t *po = etcd__put_obj(puts[i].key, puts[i].val, puts[i].len, puts[i].lease);
    if (!po || json_array_append_new(ops, json_pack("{s:o}", "request_put", po)) != 0) {
      json_decref(ops);
      ops = NULL;
    }
  }
  return ops;
}

static int check_puts(struct dcomm_etcd *c, const struct dcomm_etcd_put *puts, size_t n, const char *what) {
  if (!puts || n == 0) return dcomm__err(DCOMM_EINVAL, "etcd %s: no puts", what);
  for (size_t i = 0; i < n; i++) {
    DCOMM_CHECK(check_key(c, puts[i].key, what));
    if (puts[i].len && !puts[i].val) return dcomm__err(DCOMM_EINVAL, "etcd %s: NULL value", what);
  }
  return 0;
}

int dcomm__etcd_puts_if(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const struct dcomm_etcd_put *puts,
                        size_t n, int *done) {
  const char *what = "txn puts-if";
  if (done) *done = 0;
  DCOMM_CHECK(check_key(c, key, what));
  DCOMM_CHECK(check_puts(c, puts, n, what));
  return txn_ops_if_mod(c, what, key, mod_revision, put_ops(puts, n), done);
}

/* One compare object of dcomm__etcd_txn. */
static json_t *cmp_obj(const struct dcomm_etcd_cmp *m) {
  json_t *o;
  if (m->kind == DCOMM_STORE_EQUAL) {
    o = json_pack("{s:s, s:s}", "target", "VALUE", "result", "EQUAL");
    if (o && etcd__jset_b64(o, "value", m->val, m->len)) {
      json_decref(o);
      o = NULL;
    }
  } else {
    o = etcd__cmp_i64("CREATE", "create_revision", 0);
    if (o && m->kind == DCOMM_STORE_EXISTS && json_object_set_new(o, "result", json_string("GREATER"))) {
      json_decref(o);
      o = NULL;
    }
  }
  if (o && etcd__jset_b64(o, "key", m->key, strlen(m->key))) {
    json_decref(o);
    o = NULL;
  }
  return o;
}

int dcomm__etcd_txn(struct dcomm_etcd *c, const struct dcomm_etcd_cmp *cmps, size_t ncmp,
                    const struct dcomm_etcd_put *puts, size_t nput, int *done) {
  const char *what = "txn";
  if (done) *done = 0;
  DCOMM_CHECK(check_puts(c, puts, nput, what));
  for (size_t i = 0; i < ncmp; i++) {
    DCOMM_CHECK(check_key(c, cmps[i].key, what));
    if (cmps[i].kind < DCOMM_STORE_ABSENT || cmps[i].kind > DCOMM_STORE_EQUAL || (cmps[i].len && !cmps[i].val))
      return dcomm__err(DCOMM_EINVAL, "etcd %s: compare %zu is malformed", what, i);
  }
  json_t *cl = json_array();
  for (size_t i = 0; i < ncmp && cl; i++)
    if (json_array_append_new(cl, cmp_obj(&cmps[i])) != 0) {
      json_decref(cl);
      cl = NULL;
    }
  return run_txn(c, what, cl, put_ops(puts, nput), done);
}

int dcomm__etcd_delete_prefix_if(struct dcomm_etcd *c, const char *prefix, const char *key, int64_t mod_revision,
                                 int *done) {
  const char *what = "txn delete-if";
  if (done) *done = 0;
  DCOMM_CHECK(check_key(c, key, what));
  if (!prefix || !*prefix) return dcomm__err(DCOMM_EINVAL, "etcd %s: empty prefix", what);
  json_t *ops = json_pack("[{s:o}]", "request_delete_range", etcd__range_obj(prefix, 1));
  return txn_ops_if_mod(c, what, key, mod_revision, ops, done);
}

int dcomm__etcd_cas_value(struct dcomm_etcd *c, const char *key, const void *expected, size_t elen, const void *val,
                          size_t len, int *done, struct dcomm_etcd_kv *current) {
  if (elen && !expected) return dcomm__err(DCOMM_EINVAL, "etcd cas: NULL expected value of %zu bytes", elen);
  /* A VALUE compare on an absent key fails, as it should. */
  json_t *cmp = json_pack("{s:s, s:s}", "target", "VALUE", "result", "EQUAL");
  if (cmp && etcd__jset_b64(cmp, "value", expected, elen)) {
    json_decref(cmp);
    cmp = NULL;
  }
  return txn_put_if(c, "txn compare-value", key, cmp, val, len, 0, done, current);
}

#else /* !DCOMM_HAVE_ETCD */

int dcomm__etcd_put(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                    int64_t *revision) {
  (void)c, (void)key, (void)val, (void)len, (void)lease, (void)revision;
  return NOTSUP();
}
int dcomm__etcd_get(struct dcomm_etcd *c, const char *key, double timeout, struct dcomm_etcd_kv *kv,
                    int64_t *revision) {
  (void)c, (void)key, (void)timeout, (void)kv, (void)revision;
  return NOTSUP();
}
int dcomm__etcd_range_prefix(struct dcomm_etcd *c, const char *prefix, struct dcomm_etcd_kv **kvs, size_t *n,
                             int64_t *revision) {
  (void)c, (void)prefix, (void)kvs, (void)n, (void)revision;
  return NOTSUP();
}
int dcomm__etcd_delete(struct dcomm_etcd *c, const char *key, int prefix, int64_t *deleted) {
  (void)c, (void)key, (void)prefix, (void)deleted;
  return NOTSUP();
}
int dcomm__etcd_create_if_absent(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                                 int *done, struct dcomm_etcd_kv *current) {
  (void)c, (void)key, (void)val, (void)len, (void)lease, (void)done, (void)current;
  return NOTSUP();
}
int dcomm__etcd_cas(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const void *val, size_t len,
                    int64_t lease, int *done, struct dcomm_etcd_kv *current) {
  (void)c, (void)key, (void)mod_revision, (void)val, (void)len, (void)lease, (void)done, (void)current;
  return NOTSUP();
}
int dcomm__etcd_puts_if(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const struct dcomm_etcd_put *puts,
                        size_t n, int *done) {
  (void)c, (void)key, (void)mod_revision, (void)puts, (void)n, (void)done;
  return NOTSUP();
}
int dcomm__etcd_txn(struct dcomm_etcd *c, const struct dcomm_etcd_cmp *cmps, size_t ncmp,
                    const struct dcomm_etcd_put *puts, size_t nput, int *done) {
  (void)c, (void)cmps, (void)ncmp, (void)puts, (void)nput, (void)done;
  return NOTSUP();
}
int dcomm__etcd_delete_prefix_if(struct dcomm_etcd *c, const char *prefix, const char *key, int64_t mod_revision,
                                 int *done) {
  (void)c, (void)prefix, (void)key, (void)mod_revision, (void)done;
  return NOTSUP();
}
int dcomm__etcd_cas_value(struct dcomm_etcd *c, const char *key, const void *expected, size_t elen, const void *val,
                          size_t len, int *done, struct dcomm_etcd_kv *current) {
  (void)c, (void)key, (void)expected, (void)elen, (void)val, (void)len, (void)done, (void)current;
  return NOTSUP();
}

#endif
