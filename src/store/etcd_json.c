/*
 * etcd_json.c: the JSON side of the etcd client (etcd_client.h): it builds
 * the request objects and checks every answer field by field, so that a
 * missing required field, a wrong type or bad base64 is DCOMM_EPROTO naming
 * the call. The 3.4 JSON gateway's conventions (see docs/api-facts): keys
 * and values are standard base64 (done with OpenSSL), 64-bit integers
 * travel as strings, zero values are left out of answers. jansson builds and
 * parses the JSON.
 */
#define _GNU_SOURCE
#include "config.h"
#include "etcd_internal.h"

#include <stdlib.h>
#include <string.h>

/* The kv records every answer is decoded into (built with or without etcd:
 * the header's callers free them either way). */
void dcomm__etcd_kv_clear(struct dcomm_etcd_kv *kv) {
  if (!kv) return;
  free(kv->key);
  free(kv->val);
  memset(kv, 0, sizeof(*kv));
}

void dcomm__etcd_kvs_free(struct dcomm_etcd_kv *kvs, size_t n) {
  if (!kvs) return;
  for (size_t i = 0; i < n; i++) dcomm__etcd_kv_clear(&kvs[i]);
  free(kvs);
}

#ifdef DCOMM_HAVE_ETCD

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <nettle/base64.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* ---- base64 ---- */

/* Standard base64 with padding; *out is malloc'd and NUL-terminated. */
static int b64_encode(const void *data, size_t n, char **out) {
  if (n > (size_t)(INT32_MAX / 4) * 3 - 3) return dcomm__err(DCOMM_EINVAL, "etcd: value of %zu bytes too large", n);
  char *s = malloc(4 * ((n + 2) / 3) + 1);
  if (!s) return dcomm__err(DCOMM_ENOMEM, "etcd: out of memory encoding %zu bytes", n);
  base64_encode_raw(s, n, data);
  s[BASE64_ENCODE_RAW_LENGTH(n)] = 0;
  *out = s;
  return 0;
}

static int b64_char(unsigned char ch) {
  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '+' ||
         ch == '/';
}

/* Strict decoder: length a multiple of 4, only the alphabet, at most two
 * '=' at the very end. Returns 0 or -1 (invalid). *out is NUL-terminated. */
static int b64_decode(const char *s, size_t n, void **out, size_t *olen) {
  if (n % 4 != 0 || n / 4 * 3 > (size_t)INT32_MAX) return -1;
  size_t pad = 0;
  if (n >= 1 && s[n - 1] == '=') pad++;
  if (n >= 2 && s[n - 2] == '=') pad++;
  for (size_t i = 0; i < n - pad; i++)
    if (!b64_char((unsigned char)s[i])) return -1;
  unsigned char *p = malloc(BASE64_DECODE_LENGTH(n) + 1);
  if (!p) return -2;
  struct base64_decode_ctx ctx;
  size_t m = 0;
  base64_decode_init(&ctx);
  if (!base64_decode_update(&ctx, &m, p, n, s) || !base64_decode_final(&ctx) || m != n / 4 * 3 - pad) {
    free(p);
    return -1;
  }
  p[m] = 0;
  *out = p;
  *olen = m;
  return 0;
}

/* ---- JSON building ---- */

/* Adds name: base64(data) to o; returns -1 on failure. */
int etcd__jset_b64(json_t *o, const char *name, const void *data, size_t n) {
  char *s = NULL;
  if (b64_encode(data, n, &s) < 0) return -1;
  int rc = json_object_set_new(o, name, json_string(s));
  free(s);
  return rc;
}

int etcd__jset_i64(json_t *o, const char *name, int64_t v) {
  char s[32];
  snprintf(s, sizeof(s), "%" PRId64, v);
  return json_object_set_new(o, name, json_string(s));
}

/* {"key":..,"value":..,"lease":..} for put requests. */
json_t *etcd__put_obj(const char *key, const void *val, size_t len, int64_t lease) {
  json_t *o = json_object();
  if (!o) return NULL;
  int fail = etcd__jset_b64(o, "key", key, strlen(key));
  fail |= etcd__jset_b64(o, "value", val, len);
  if (lease) fail |= etcd__jset_i64(o, "lease", lease);
  if (fail) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* Prefix range end: the prefix with its last byte below 0xff incremented and
 * what follows dropped; "\0" (every key) when there is none. */
static int prefix_end(const char *prefix, size_t n, char **out, size_t *olen) {
  char *e = malloc(n + 1);
  if (!e) return dcomm__err(DCOMM_ENOMEM, "etcd: out of memory");
  memcpy(e, prefix, n);
  size_t i = n;
  while (i > 0 && (unsigned char)e[i - 1] == 0xff) i--;
  if (i == 0) {
    e[0] = 0;
    *olen = 1;
  } else {
    e[i - 1] = (char)((unsigned char)e[i - 1] + 1);
    *olen = i;
  }
  *out = e;
  return 0;
}

/* {"key":..,"range_end":..} for a prefix (or one key when !prefix). */
json_t *etcd__range_obj(const char *key, int prefix) {
  json_t *o = json_object();
  if (!o) return NULL;
  size_t n = strlen(key);
  int fail;
  if (prefix && n == 0) {
    fail = etcd__jset_b64(o, "key", "", 1) | etcd__jset_b64(o, "range_end", "", 1); /* "\0".."\0": everything */
  } else {
    fail = etcd__jset_b64(o, "key", key, n);
    if (prefix) {
      char *e = NULL;
      size_t el = 0;
      fail |= prefix_end(key, n, &e, &el) < 0 ? -1 : etcd__jset_b64(o, "range_end", e, el);
      free(e);
    }
  }
  if (fail) {
    json_decref(o);
    return NULL;
  }
  return o;
}

json_t *etcd__cmp_i64(const char *target, const char *field, int64_t v) {
  json_t *o = json_pack("{s:s, s:s}", "target", target, "result", "EQUAL");
  if (o && etcd__jset_i64(o, field, v)) {
    json_decref(o);
    o = NULL;
  }
  return o;
}

/* ---- JSON parsing (every answer is checked) ---- */

int etcd__proto(const char *what, const char *fmt, const char *detail) {
  return dcomm__err(DCOMM_EPROTO, "etcd %s: malformed answer: %s%s", what, fmt, detail ? detail : "");
}

static int parse_i64_str(const char *s, int64_t *out) {
  size_t i = (s[0] == '-') ? 1 : 0;
  if (!s[i] || strlen(s) > 20) return -1;
  for (size_t j = i; s[j]; j++)
    if (s[j] < '0' || s[j] > '9') return -1;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno) return -1;
  *out = (int64_t)v;
  return 0;
}

/* An int64 field: a decimal string (the gateway's way) or a JSON integer.
 * Missing: 0, or an error when required. */
int etcd__j_i64(json_t *o, const char *name, int required, int64_t *out, const char *what) {
  json_t *v = json_object_get(o, name);
  *out = 0;
  if (!v) {
    if (required) return dcomm__err(DCOMM_EPROTO, "etcd %s: malformed answer: field '%s' is missing", what, name);
    return 0;
  }
  if (json_is_integer(v)) {
    *out = (int64_t)json_integer_value(v);
    return 0;
  }
  if (json_is_string(v) && parse_i64_str(json_string_value(v), out) == 0) return 0;
  return dcomm__err(DCOMM_EPROTO, "etcd %s: malformed answer: field '%s' is not a 64-bit integer", what, name);
}

int etcd__j_bool(json_t *o, const char *name, int *out, const char *what) {
  json_t *v = json_object_get(o, name);
  *out = 0;
  if (!v) return 0;
  if (!json_is_boolean(v))
    return dcomm__err(DCOMM_EPROTO, "etcd %s: malformed answer: field '%s' is not a boolean", what, name);
  *out = json_is_true(v);
  return 0;
}

/* A base64 field; missing: empty (or an error when required). */
static int j_b64(json_t *o, const char *name, int required, void **out, size_t *len, const char *what) {
  json_t *v = json_object_get(o, name);
  *out = NULL;
  *len = 0;
  if (!v) {
    if (required) return dcomm__err(DCOMM_EPROTO, "etcd %s: malformed answer: field '%s' is missing", what, name);
    *out = calloc(1, 1);
    return *out ? 0 : dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
  }
  if (!json_is_string(v))
    return dcomm__err(DCOMM_EPROTO, "etcd %s: malformed answer: field '%s' is not a string", what, name);
  int rc = b64_decode(json_string_value(v), json_string_length(v), out, len);
  if (rc == -2) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
  if (rc < 0) return dcomm__err(DCOMM_EPROTO, "etcd %s: malformed answer: field '%s' is not base64", what, name);
  return 0;
}

int etcd__j_kv(json_t *o, struct dcomm_etcd_kv *kv, const char *what) {
  memset(kv, 0, sizeof(*kv));
  if (!json_is_object(o)) return etcd__proto(what, "a key-value entry is not an object", NULL);
  void *k = NULL;
  int rc = j_b64(o, "key", 1, &k, &kv->klen, what);
  kv->key = k;
  if (rc == 0 && kv->klen == 0) rc = etcd__proto(what, "an entry has an empty key", NULL);
  if (rc == 0) rc = j_b64(o, "value", 0, &kv->val, &kv->vlen, what);
  if (rc == 0) rc = etcd__j_i64(o, "create_revision", 0, &kv->create_revision, what);
  if (rc == 0) rc = etcd__j_i64(o, "mod_revision", 0, &kv->mod_revision, what);
  if (rc == 0) rc = etcd__j_i64(o, "version", 0, &kv->version, what);
  if (rc == 0) rc = etcd__j_i64(o, "lease", 0, &kv->lease, what);
  if (rc < 0) dcomm__etcd_kv_clear(kv);
  return rc;
}

/* header.revision; required for calls whose revision the caller uses. */
int etcd__j_header_rev(json_t *resp, int required, int64_t *rev, const char *what) {
  json_t *h = json_object_get(resp, "header");
  *rev = 0;
  if (!h) return required ? etcd__proto(what, "field 'header' is missing", NULL) : 0;
  if (!json_is_object(h)) return etcd__proto(what, "field 'header' is not an object", NULL);
  return etcd__j_i64(h, "revision", required, rev, what);
}

/* "kvs": missing = none; *kvs malloc'd (NULL when none). */
int etcd__j_kvs(json_t *o, struct dcomm_etcd_kv **kvs, size_t *n, const char *what) {
  *kvs = NULL;
  *n = 0;
  json_t *a = json_object_get(o, "kvs");
  if (!a) return 0;
  if (!json_is_array(a)) return etcd__proto(what, "field 'kvs' is not an array", NULL);
  size_t m = json_array_size(a);
  if (m == 0) return 0;
  struct dcomm_etcd_kv *v = calloc(m, sizeof(*v));
  if (!v) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory for %zu keys", what, m);
  for (size_t i = 0; i < m; i++) {
    int rc = etcd__j_kv(json_array_get(a, i), &v[i], what);
    if (rc < 0) {
      dcomm__etcd_kvs_free(v, i);
      return rc;
    }
  }
  *kvs = v;
  *n = m;
  return 0;
}

/* An etcd error answer: {"error":"..","code":N,"message":".."} (unary) or
 * {"error":{"grpc_code":N,"message":".."}} (streams). Returns 0 when body
 * is such an answer. */
int etcd__parse_error_body(json_t *j, int *code, char *msg, size_t mlen) {
  if (!json_is_object(j)) return -1;
  json_t *e = json_object_get(j, "error");
  json_t *cd = json_object_get(j, "code");
  json_t *m = json_object_get(j, "message");
  if (json_is_object(e)) {
    cd = json_object_get(e, "grpc_code");
    m = json_object_get(e, "message");
  } else if (json_is_string(e) && !json_is_string(m)) {
    m = e;
  } else if (!e && !cd) {
    return -1;
  }
  if (!json_is_integer(cd)) return -1;
  *code = (int)json_integer_value(cd);
  snprintf(msg, mlen, "%s", json_is_string(m) ? json_string_value(m) : "(no message)");
  return 0;
}

#endif /* DCOMM_HAVE_ETCD */
