/*
 * etcd_client.c: the etcd v3 client of etcd_client.h over the 3.4 JSON
 * gateway. libcurl carries the HTTP (one reused easy handle for unary calls,
 * a private handle driven by a multi handle for each watch so that it can be
 * cancelled and bounded), jansson builds and parses the JSON, OpenSSL does
 * base64. The gateway's conventions (see docs/api-facts): keys and values
 * are standard base64, 64-bit integers travel as strings, zero values are
 * left out of answers, a stream is a sequence of '\n'-terminated JSON lines.
 */
#define _GNU_SOURCE
#include "config.h"
#include "etcd_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "store.h"

#ifdef DCOMM_HAVE_ETCD

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <time.h>

#include "log.h"
#include "sock.h"

#define DEFAULT_TIMEOUT 10.0
#define MAX_ENDPOINTS 64
#define MAX_URL 512 /* one endpoint's URL */
/* Largest unary answer or watch line accepted (a range can hold many keys). */
#define MAX_BODY ((size_t)256 << 20)
/* Error bodies are only read for their message. */
#define MAX_ERR_BODY ((size_t)64 << 10)
/* How often a watch looks at its cancel flag and deadline. */
#define WATCH_SLICE_MS 50

struct dcomm_etcd {
  pthread_mutex_t mu; /* serializes unary calls; guards cur, token, easy */
  char **urls;        /* "http://host:port", no trailing slash */
  int n, cur;
  double timeout;
  char *user, *password, *cacert, *cert, *key;
  char *token; /* NULL until authenticated */
  CURL *easy;
};

/* ---- small helpers ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc = CURLE_OK;

static void global_init(void) { g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *dup_or_null(const char *s) { return (s && *s) ? strdup(s) : NULL; }

static void sleep_s(double s) {
  if (!(s > 0)) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

struct buf {
  char *p;
  size_t len, cap, max;
  int overflow;
};

static int buf_append(struct buf *b, const void *data, size_t n) {
  if (b->len + n > b->max) {
    b->overflow = 1;
    return -1;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
  b->p[b->len] = 0;
  return 0;
}

static void buf_free(struct buf *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

/* Standard base64 with padding; *out is malloc'd and NUL-terminated. */
static int b64_encode(const void *data, size_t n, char **out) {
  if (n > (size_t)(INT32_MAX / 4) * 3 - 3) return dcomm__err(DCOMM_EINVAL, "etcd: value of %zu bytes too large", n);
  char *s = malloc(4 * ((n + 2) / 3) + 1);
  if (!s) return dcomm__err(DCOMM_ENOMEM, "etcd: out of memory encoding %zu bytes", n);
  int m = n ? EVP_EncodeBlock((unsigned char *)s, data, (int)n) : 0;
  s[m] = 0;
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
  unsigned char *p = malloc(n / 4 * 3 + 1);
  if (!p) return -2;
  int m = n ? EVP_DecodeBlock(p, (const unsigned char *)s, (int)n) : 0;
  if (m < 0 || (size_t)m < pad) {
    free(p);
    return -1;
  }
  m -= (int)pad;
  p[m] = 0;
  *out = p;
  *olen = (size_t)m;
  return 0;
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

/* ---- JSON building ---- */

/* Adds name: base64(data) to o; returns -1 on failure. */
static int jset_b64(json_t *o, const char *name, const void *data, size_t n) {
  char *s = NULL;
  if (b64_encode(data, n, &s) < 0) return -1;
  int rc = json_object_set_new(o, name, json_string(s));
  free(s);
  return rc;
}

static int jset_i64(json_t *o, const char *name, int64_t v) {
  char s[32];
  snprintf(s, sizeof(s), "%" PRId64, v);
  return json_object_set_new(o, name, json_string(s));
}

/* {"key":..,"value":..,"lease":..} for put requests. */
static json_t *put_obj(const char *key, const void *val, size_t len, int64_t lease) {
  json_t *o = json_object();
  if (!o) return NULL;
  int fail = jset_b64(o, "key", key, strlen(key));
  fail |= jset_b64(o, "value", val, len);
  if (lease) fail |= jset_i64(o, "lease", lease);
  if (fail) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* ---- JSON parsing (every answer is checked) ---- */

static int proto(const char *what, const char *fmt, const char *detail) {
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
static int j_i64(json_t *o, const char *name, int required, int64_t *out, const char *what) {
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

static int j_bool(json_t *o, const char *name, int *out, const char *what) {
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

static int j_kv(json_t *o, struct dcomm_etcd_kv *kv, const char *what) {
  memset(kv, 0, sizeof(*kv));
  if (!json_is_object(o)) return proto(what, "a key-value entry is not an object", NULL);
  void *k = NULL;
  int rc = j_b64(o, "key", 1, &k, &kv->klen, what);
  kv->key = k;
  if (rc == 0 && kv->klen == 0) rc = proto(what, "an entry has an empty key", NULL);
  if (rc == 0) rc = j_b64(o, "value", 0, &kv->val, &kv->vlen, what);
  if (rc == 0) rc = j_i64(o, "create_revision", 0, &kv->create_revision, what);
  if (rc == 0) rc = j_i64(o, "mod_revision", 0, &kv->mod_revision, what);
  if (rc == 0) rc = j_i64(o, "version", 0, &kv->version, what);
  if (rc == 0) rc = j_i64(o, "lease", 0, &kv->lease, what);
  if (rc < 0) dcomm__etcd_kv_clear(kv);
  return rc;
}

/* header.revision; required for calls whose revision the caller uses. */
static int j_header_rev(json_t *resp, int required, int64_t *rev, const char *what) {
  json_t *h = json_object_get(resp, "header");
  *rev = 0;
  if (!h) return required ? proto(what, "field 'header' is missing", NULL) : 0;
  if (!json_is_object(h)) return proto(what, "field 'header' is not an object", NULL);
  return j_i64(h, "revision", required, rev, what);
}

/* "kvs": missing = none; *kvs malloc'd (NULL when none). */
static int j_kvs(json_t *o, struct dcomm_etcd_kv **kvs, size_t *n, const char *what) {
  *kvs = NULL;
  *n = 0;
  json_t *a = json_object_get(o, "kvs");
  if (!a) return 0;
  if (!json_is_array(a)) return proto(what, "field 'kvs' is not an array", NULL);
  size_t m = json_array_size(a);
  if (m == 0) return 0;
  struct dcomm_etcd_kv *v = calloc(m, sizeof(*v));
  if (!v) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory for %zu keys", what, m);
  for (size_t i = 0; i < m; i++) {
    int rc = j_kv(json_array_get(a, i), &v[i], what);
    if (rc < 0) {
      dcomm__etcd_kvs_free(v, i);
      return rc;
    }
  }
  *kvs = v;
  *n = m;
  return 0;
}

/* ---- endpoints ---- */

static int parse_endpoints(struct dcomm_etcd *c, const char *list, int tls) {
  const char *p = list;
  while (*p) {
    while (*p == ' ' || *p == ',') p++;
    if (!*p) break;
    const char *e = p;
    while (*e && *e != ',') e++;
    size_t n = (size_t)(e - p);
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '/')) n--;
    if (c->n >= MAX_ENDPOINTS) return dcomm__err(DCOMM_EINVAL, "etcd: more than %d endpoints", MAX_ENDPOINTS);
    const char *scheme = tls ? "https://" : "http://";
    if (n >= 7 && strncmp(p, "http://", 7) == 0) scheme = "";
    else if (n >= 8 && strncmp(p, "https://", 8) == 0) scheme = "";
    else if (memmem(p, n, "://", 3))
      return dcomm__err(DCOMM_EINVAL, "etcd: endpoint '%.*s': only http:// and https:// are supported", (int)n, p);
    size_t hostlen = n - (*scheme ? 0 : (p[4] == 's' ? 8 : 7));
    if (hostlen == 0) return dcomm__err(DCOMM_EINVAL, "etcd: endpoint '%.*s' has no host", (int)n, p);
    if (n + 8 > MAX_URL) return dcomm__err(DCOMM_EINVAL, "etcd: endpoint '%.40s...' is too long", p);
    char *u = malloc(strlen(scheme) + n + 1);
    if (!u) return dcomm__err(DCOMM_ENOMEM, "etcd: out of memory");
    sprintf(u, "%s%.*s", scheme, (int)n, p);
    c->urls[c->n++] = u;
    p = e;
  }
  if (c->n == 0) return dcomm__err(DCOMM_EINVAL, "etcd: no endpoint in '%s'", list);
  return 0;
}

/* ---- one HTTP request ---- */

static size_t write_buf(char *ptr, size_t size, size_t nmemb, void *ud) {
  struct buf *b = ud;
  size_t n = size * nmemb;
  return buf_append(b, ptr, n) == 0 ? n : 0;
}

/* Options shared by unary calls and watches. headers are owned by caller. */
static struct curl_slist *make_headers(const char *token) {
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  struct curl_slist *t = h ? curl_slist_append(h, "Expect:") : NULL;
  if (!t) {
    curl_slist_free_all(h);
    return NULL;
  }
  h = t;
  if (token) {
    size_t n = strlen(token) + 32;
    char *line = malloc(n);
    if (!line) {
      curl_slist_free_all(h);
      return NULL;
    }
    snprintf(line, n, "Authorization: %s", token); /* raw token: no "Bearer" */
    t = curl_slist_append(h, line);
    free(line);
    if (!t) {
      curl_slist_free_all(h);
      return NULL;
    }
    h = t;
  }
  return h;
}

static void set_common(struct dcomm_etcd *c, CURL *h, const char *url, const char *body, size_t blen,
                       struct curl_slist *hdrs, char *errbuf) {
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_PROXY, ""); /* etcd is never reached through a proxy */
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  if (c->cacert) curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
  if (c->cert) curl_easy_setopt(h, CURLOPT_SSLCERT, c->cert);
  if (c->key) curl_easy_setopt(h, CURLOPT_SSLKEY, c->key);
  errbuf[0] = 0;
}

static long ms_of(double s) {
  if (!(s > 0.001)) return 1;
  if (s > 1e6) return 1000000000L;
  return (long)(s * 1000.0);
}

/* How a failed transfer is handled. */
enum fail_kind { F_RETRY, F_PROTO, F_TLS };

static enum fail_kind classify_curl(CURLcode cc) {
  switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
      return F_RETRY;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
      return F_TLS;
    default:
      return F_PROTO;
  }
}

/* An etcd error answer: {"error":"..","code":N,"message":".."} (unary) or
 * {"error":{"grpc_code":N,"message":".."}} (streams). Returns 0 when body
 * is such an answer. */
static int parse_error_body(json_t *j, int *code, char *msg, size_t mlen) {
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

static int is_auth_missing(int code, const char *msg) {
  return code == 16 || (code == 3 && strstr(msg, "user name is empty"));
}

/* Maps an etcd error that is neither retried nor answered by authenticating. */
static int map_etcd_error(const char *url, const char *what, long http, int code, const char *msg) {
  int err;
  switch (code) {
    case 3:
      err = strstr(msg, "authentication failed") ? DCOMM_EAUTH : DCOMM_EINVAL;
      break;
    case 5:
      err = DCOMM_ENOTFOUND;
      break;
    case 7:
    case 16:
      err = DCOMM_EAUTH;
      break;
    case 14:
      err = DCOMM_EPEERLOST;
      break;
    default:
      err = DCOMM_EBACKEND;
  }
  if (is_auth_missing(code, msg))
    return dcomm__err(DCOMM_EAUTH, "etcd %s: %s: authentication required or refused (%s; set DCOMM_ETCD_USER and "
                      "DCOMM_ETCD_PASSWORD)", url, what, msg);
  return dcomm__err(err, "etcd %s: %s: %s (gRPC code %d, HTTP %ld)", url, what, msg, code, http);
}

static int authenticate_locked(struct dcomm_etcd *c, double deadline);

enum call_flags { CALL_IDEMPOTENT = 1, CALL_NO_TOKEN = 2 };

/* One unary call with failover, under c->mu. *out: the answer object. */
static int call_locked(struct dcomm_etcd *c, const char *what, const char *path, json_t *req, double timeout,
                       int flags, json_t **out) {
  *out = NULL;
  if (!(timeout > 0)) timeout = c->timeout;
  char *body = json_dumps(req, JSON_COMPACT);
  if (!body) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory building the request", what);
  size_t blen = strlen(body);
  double start = dcomm__now(), deadline = start + timeout;
  int reauthed = 0, attempts = 0, tried_in_round = 0, rc = 0;
  int last_err = DCOMM_EPEERLOST;
  char last_msg[512] = "";
  double backoff = 0.05;
  struct buf resp = {.max = MAX_BODY};
  char errbuf[CURL_ERROR_SIZE];
  for (;;) {
    double left = deadline - dcomm__now();
    if (attempts > 0 && left <= 0) break;
    /* With several endpoints an attempt gets a slice of the timeout, so that
     * a member that stalls (a follower whose leader just died holds a
     * proposal until its own request timeout) does not use it all. A call
     * that must not be repeated once sent waits for its answer instead; only
     * its connection attempt is sliced. */
    double at = left, cat = left;
    if (c->n > 1) {
      double slice = timeout / 4 < 1.0 ? 1.0 : (timeout / 4 > 3.0 ? 3.0 : timeout / 4);
      if (cat > slice) cat = slice;
      if ((flags & CALL_IDEMPOTENT) && at > slice) at = slice;
    }
    int idx = c->cur;
    const char *base = c->urls[idx];
    char url[MAX_URL + 64];
    size_t bl = strlen(base), pl = strlen(path);
    if (bl + pl + 1 > sizeof(url)) {
      rc = dcomm__err(DCOMM_EINVAL, "etcd %s: endpoint URL too long", what);
      goto done;
    }
    memcpy(url, base, bl);
    memcpy(url + bl, path, pl + 1);
    struct curl_slist *hdrs = make_headers((flags & CALL_NO_TOKEN) ? NULL : c->token);
    if (!hdrs) {
      rc = dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
      goto done;
    }
    resp.len = 0;
    resp.overflow = 0;
    set_common(c, c->easy, url, body, blen, hdrs, errbuf);
    curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, write_buf);
    curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, &resp);
    curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, ms_of(at));
    curl_easy_setopt(c->easy, CURLOPT_CONNECTTIMEOUT_MS, ms_of(cat));
    CURLcode cc = curl_easy_perform(c->easy);
    curl_slist_free_all(hdrs);
    attempts++;
    tried_in_round++;
    long http = 0, sent = 0;
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_getinfo(c->easy, CURLINFO_REQUEST_SIZE, &sent);
    if (cc != CURLE_OK) {
      const char *detail = errbuf[0] ? errbuf : curl_easy_strerror(cc);
      if (resp.overflow) {
        rc = dcomm__err(DCOMM_EPROTO, "etcd %s: %s: answer larger than %zu bytes", base, what, MAX_BODY);
        goto done;
      }
      enum fail_kind k = classify_curl(cc);
      if (k == F_TLS) {
        rc = dcomm__err(DCOMM_EAUTH, "etcd %s: %s: TLS verification failed: %s", base, what, detail);
        goto done;
      }
      if (k == F_PROTO) {
        rc = dcomm__err(DCOMM_EPROTO, "etcd %s: %s: not a usable HTTP answer: %s", base, what, detail);
        goto done;
      }
      if (!(flags & CALL_IDEMPOTENT) && sent > 0) {
        rc = dcomm__err(DCOMM_EPEERLOST, "etcd %s: %s: the connection failed after the request was sent (%s); "
                        "its outcome is unknown", base, what, detail);
        goto done;
      }
      last_err = cc == CURLE_OPERATION_TIMEDOUT ? DCOMM_ETIMEDOUT : DCOMM_EPEERLOST;
      snprintf(last_msg, sizeof(last_msg), "%s: %s", base, detail);
    } else {
      json_error_t jerr;
      json_t *j = resp.len ? json_loadb(resp.p, resp.len, 0, &jerr) : NULL;
      int code = 0;
      char emsg[300];
      int is_err = j ? parse_error_body(j, &code, emsg, sizeof(emsg)) == 0 : 0;
      if (http == 200 && !is_err) {
        if (!j || !json_is_object(j)) {
          rc = dcomm__err(DCOMM_EPROTO, "etcd %s: %s: malformed answer: %s (%.60s%s)", base, what,
                          j ? "not a JSON object" : (resp.len ? jerr.text : "empty body"), resp.len ? resp.p : "",
                          resp.len > 60 ? "..." : "");
          json_decref(j);
          goto done;
        }
        *out = j;
        rc = 0;
        goto done;
      }
      json_decref(j);
      if (!is_err) {
        /* No etcd error object: a proxy, another server, or a crash page. */
        if (http == 503 || http == 502 || http == 504) {
          last_err = DCOMM_EPEERLOST;
          snprintf(last_msg, sizeof(last_msg), "%s: HTTP %ld", base, http);
          goto next;
        }
        rc = dcomm__err(http >= 500 ? DCOMM_EBACKEND : DCOMM_EPROTO,
                        "etcd %s: %s: HTTP %ld without an etcd error (%.60s%s)", base, what, http,
                        resp.len ? resp.p : "empty body", resp.len > 60 ? "..." : "");
        goto done;
      }
      if (code == 14) {
        last_err = DCOMM_EPEERLOST;
        snprintf(last_msg, sizeof(last_msg), "%s: %s", base, emsg);
        goto next;
      }
      if (!(flags & CALL_NO_TOKEN) && is_auth_missing(code, emsg) && c->user && !reauthed) {
        reauthed = 1;
        DCOMM_LOG(INFO, ETCD, "etcd %s: %s: token refused (%s); authenticating again", base, what, emsg);
        free(c->token);
        c->token = NULL;
        rc = authenticate_locked(c, deadline);
        if (rc < 0) goto done;
        continue; /* same endpoint (or the one authentication moved to) */
      }
      rc = map_etcd_error(base, what, http, code, emsg);
      goto done;
    }
  next:
    if (c->n > 1) {
      c->cur = (idx + 1) % c->n;
      DCOMM_LOG(INFO, ETCD, "etcd %s failed for %s (%s); trying %s", base, what, last_msg, c->urls[c->cur]);
    }
    if (tried_in_round >= c->n) {
      tried_in_round = 0;
      double l = deadline - dcomm__now();
      sleep_s(backoff < l ? backoff : l);
      backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
  }
  rc = dcomm__err(last_err, "etcd %s: no endpoint answered within %.3f s (%d attempts over %d endpoint%s; last: %s)",
                  what, timeout, attempts, c->n, c->n > 1 ? "s" : "", last_msg);
done:
  buf_free(&resp);
  free(body);
  return rc;
}

static int authenticate_locked(struct dcomm_etcd *c, double deadline) {
  const char *what = "authenticate";
  json_t *req = json_pack("{s:s, s:s}", "name", c->user, "password", c->password ? c->password : "");
  if (!req) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
  json_t *resp = NULL;
  double left = deadline - dcomm__now();
  int rc = call_locked(c, what, "/v3/auth/authenticate", req, left > 0.001 ? left : 0.001,
                       CALL_IDEMPOTENT | CALL_NO_TOKEN, &resp);
  json_decref(req);
  if (rc < 0) {
    if (rc == DCOMM_EINVAL) rc = DCOMM_EAUTH; /* "authentication failed" is InvalidArgument */
    return dcomm__err_ctx(rc, "etcd: authenticating as '%s'", c->user);
  }
  json_t *t = json_object_get(resp, "token");
  if (!json_is_string(t) || json_string_length(t) == 0 || strpbrk(json_string_value(t), "\r\n")) {
    json_decref(resp);
    return proto(what, "field 'token' is missing or not a usable string", NULL);
  }
  free(c->token);
  c->token = strdup(json_string_value(t));
  json_decref(resp);
  if (!c->token) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
  DCOMM_LOG(INFO, ETCD, "authenticated to etcd as '%s'", c->user);
  return 0;
}

/* A unary call from a public function: locks, calls, consumes req. */
static int call(struct dcomm_etcd *c, const char *what, const char *path, json_t *req, double timeout, int flags,
                json_t **out) {
  *out = NULL;
  if (!req) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory building the request", what);
  pthread_mutex_lock(&c->mu);
  int rc = call_locked(c, what, path, req, timeout, flags, out);
  pthread_mutex_unlock(&c->mu);
  json_decref(req);
  return rc;
}

/* ---- client ---- */

int dcomm__etcd_create(const char *endpoints, const struct dcomm_etcd_opts *opts, struct dcomm_etcd **out) {
  if (!out) return dcomm__err(DCOMM_EINVAL, "etcd: NULL output argument");
  *out = NULL;
  if (!endpoints || !*endpoints) return dcomm__err(DCOMM_EINVAL, "etcd: empty endpoint list");
  struct dcomm_etcd_opts none = {0};
  if (!opts) opts = &none;
  if (isnan(opts->timeout)) return dcomm__err(DCOMM_EINVAL, "etcd: timeout is NaN");
  pthread_once(&g_once, global_init);
  if (g_init_rc != CURLE_OK)
    return dcomm__err(DCOMM_EBACKEND, "etcd: curl_global_init failed: %s", curl_easy_strerror(g_init_rc));
  struct dcomm_etcd *c = calloc(1, sizeof(*c));
  if (!c) return dcomm__err(DCOMM_ENOMEM, "etcd: out of memory");
  pthread_mutex_init(&c->mu, NULL);
  c->timeout = opts->timeout > 0 ? opts->timeout : DEFAULT_TIMEOUT;
  c->urls = calloc(MAX_ENDPOINTS, sizeof(char *));
  c->user = dup_or_null(opts->user);
  c->password = opts->password ? strdup(opts->password) : NULL;
  c->cacert = dup_or_null(opts->cacert);
  c->cert = dup_or_null(opts->cert);
  c->key = dup_or_null(opts->key);
  c->easy = curl_easy_init();
  int rc = 0;
  if (!c->urls || !c->easy || (opts->user && *opts->user && !c->user) || (opts->password && !c->password) ||
      (opts->cacert && *opts->cacert && !c->cacert) || (opts->cert && *opts->cert && !c->cert) ||
      (opts->key && *opts->key && !c->key))
    rc = dcomm__err(DCOMM_ENOMEM, "etcd: out of memory");
  if (rc == 0 && (c->cert != NULL) != (c->key != NULL))
    rc = dcomm__err(DCOMM_EINVAL, "etcd: a TLS client certificate needs its key and the other way round");
  if (rc == 0) rc = parse_endpoints(c, endpoints, c->cacert || c->cert);
  if (rc == 0 && c->user) {
    pthread_mutex_lock(&c->mu);
    rc = authenticate_locked(c, dcomm__now() + c->timeout);
    pthread_mutex_unlock(&c->mu);
  }
  if (rc < 0) {
    dcomm__etcd_destroy(c);
    return rc;
  }
  DCOMM_LOG(INFO, ETCD, "etcd client for %s (%d endpoint%s, timeout %.3f s%s)", endpoints, c->n,
            c->n > 1 ? "s" : "", c->timeout, c->user ? ", authenticated" : "");
  *out = c;
  return 0;
}

void dcomm__etcd_destroy(struct dcomm_etcd *c) {
  if (!c) return;
  if (c->easy) curl_easy_cleanup(c->easy);
  if (c->urls)
    for (int i = 0; i < c->n; i++) free(c->urls[i]);
  free(c->urls);
  free(c->user);
  if (c->password) {
    memset(c->password, 0, strlen(c->password));
    free(c->password);
  }
  free(c->cacert);
  free(c->cert);
  free(c->key);
  free(c->token);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

int dcomm__etcd_endpoint_count(const struct dcomm_etcd *c) { return c ? c->n : 0; }

int dcomm__etcd_current_endpoint(struct dcomm_etcd *c, char *buf, size_t len) {
  if (!c) return dcomm__err(DCOMM_EINVAL, "etcd: NULL client");
  pthread_mutex_lock(&c->mu);
  int idx = c->cur;
  if (buf && len) snprintf(buf, len, "%s", c->urls[idx]);
  pthread_mutex_unlock(&c->mu);
  return idx;
}

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
  DCOMM_CHECK(call(c, what, "/v3/kv/put", put_obj(key, val, len, lease), -1, CALL_IDEMPOTENT, &resp));
  int64_t rev;
  int rc = j_header_rev(resp, 1, &rev, what);
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
  if (req && jset_b64(req, "key", key, strlen(key))) {
    json_decref(req);
    req = NULL;
  }
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/kv/range", req, timeout, CALL_IDEMPOTENT, &resp));
  int64_t rev;
  struct dcomm_etcd_kv *kvs = NULL;
  size_t n = 0;
  int rc = j_header_rev(resp, 1, &rev, what);
  if (rc == 0) rc = j_kvs(resp, &kvs, &n, what);
  json_decref(resp);
  if (rc < 0) return rc;
  if (revision) *revision = rev;
  if (n == 0) return dcomm__err(DCOMM_ENOTFOUND, "etcd get: key '%.200s' not found", key);
  if (n > 1 || kvs[0].klen != strlen(key) || memcmp(kvs[0].key, key, kvs[0].klen) != 0) {
    dcomm__etcd_kvs_free(kvs, n);
    return proto(what, "the answer holds other keys than the one asked for", NULL);
  }
  if (kv) *kv = kvs[0];
  else dcomm__etcd_kv_clear(&kvs[0]);
  free(kvs);
  return 0;
}

/* {"key":..,"range_end":..} for a prefix (or one key when !prefix). */
static json_t *range_obj(const char *key, int prefix) {
  json_t *o = json_object();
  if (!o) return NULL;
  size_t n = strlen(key);
  int fail;
  if (prefix && n == 0) {
    fail = jset_b64(o, "key", "", 1) | jset_b64(o, "range_end", "", 1); /* "\0".."\0": everything */
  } else {
    fail = jset_b64(o, "key", key, n);
    if (prefix) {
      char *e = NULL;
      size_t el = 0;
      fail |= prefix_end(key, n, &e, &el) < 0 ? -1 : jset_b64(o, "range_end", e, el);
      free(e);
    }
  }
  if (fail) {
    json_decref(o);
    return NULL;
  }
  return o;
}

int dcomm__etcd_range_prefix(struct dcomm_etcd *c, const char *prefix, struct dcomm_etcd_kv **kvs, size_t *n,
                             int64_t *revision) {
  const char *what = "range";
  if (!c || !prefix || !kvs || !n) return dcomm__err(DCOMM_EINVAL, "etcd range: NULL argument");
  *kvs = NULL;
  *n = 0;
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/kv/range", range_obj(prefix, 1), -1, CALL_IDEMPOTENT, &resp));
  int64_t rev;
  int rc = j_header_rev(resp, 1, &rev, what);
  if (rc == 0) rc = j_kvs(resp, kvs, n, what);
  json_decref(resp);
  if (rc == 0 && revision) *revision = rev;
  return rc;
}

int dcomm__etcd_delete(struct dcomm_etcd *c, const char *key, int prefix, int64_t *deleted) {
  const char *what = "delete";
  if (deleted) *deleted = 0;
  if (!c || !key || (!prefix && !*key)) return dcomm__err(DCOMM_EINVAL, "etcd delete: NULL client or empty key");
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/kv/deleterange", range_obj(key, prefix), -1, CALL_IDEMPOTENT, &resp));
  int64_t d = 0;
  int rc = j_i64(resp, "deleted", 0, &d, what);
  json_decref(resp);
  if (rc == 0 && d < 0) rc = proto(what, "negative 'deleted' count", NULL);
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
  if (cmp && jset_b64(cmp, "key", key, strlen(key)) == 0) {
    json_t *get = json_object();
    if (get && jset_b64(get, "key", key, strlen(key))) {
      json_decref(get);
      get = NULL;
    }
    req = json_pack("{s:[o], s:[{s:o}], s:[{s:o}]}", "compare", cmp, "success", "request_put",
                    put_obj(key, val, len, lease), "failure", "request_range", get);
    cmp = NULL; /* json_pack's "o" took it, even on failure */
  }
  json_decref(cmp);
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/kv/txn", req, -1, 0, &resp));
  int ok = 0;
  int64_t rev = 0;
  rc = j_bool(resp, "succeeded", &ok, what);
  if (rc == 0) rc = j_header_rev(resp, 1, &rev, what);
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
      rc = proto(what, "a failed transaction did not return its range answer", NULL);
    } else {
      struct dcomm_etcd_kv *kvs = NULL;
      size_t n = 0;
      rc = j_kvs(rr, &kvs, &n, what);
      if (rc == 0 && (n > 1 || (n == 1 && (kvs[0].klen != strlen(key) || memcmp(kvs[0].key, key, kvs[0].klen)))))
        rc = proto(what, "the range answer holds other keys than the one asked for", NULL);
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

static json_t *cmp_i64(const char *target, const char *field, int64_t v) {
  json_t *o = json_pack("{s:s, s:s}", "target", target, "result", "EQUAL");
  if (o && jset_i64(o, field, v)) {
    json_decref(o);
    o = NULL;
  }
  return o;
}

int dcomm__etcd_create_if_absent(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                                 int *done, struct dcomm_etcd_kv *current) {
  return txn_put_if(c, "txn create-if-absent", key, cmp_i64("CREATE", "create_revision", 0), val, len, lease, done,
                    current);
}

int dcomm__etcd_cas(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const void *val, size_t len,
                    int64_t lease, int *done, struct dcomm_etcd_kv *current) {
  if (mod_revision < 0) return dcomm__err(DCOMM_EINVAL, "etcd cas: negative mod_revision");
  return txn_put_if(c, "txn compare-and-swap", key, cmp_i64("MOD", "mod_revision", mod_revision), val, len, lease,
                    done, current);
}

/* if (key's mod_revision == mod_revision) ops, nothing otherwise; *done
 * says which. Consumes ops (an array of request objects, NULL when
 * building it failed). */
static int txn_ops_if_mod(struct dcomm_etcd *c, const char *what, const char *key, int64_t mod_revision, json_t *ops,
                          int *done) {
  json_t *cmp = cmp_i64("MOD", "mod_revision", mod_revision);
  json_t *req = NULL;
  if (ops && cmp && jset_b64(cmp, "key", key, strlen(key)) == 0) {
    req = json_pack("{s:[o], s:o}", "compare", cmp, "success", ops);
    cmp = ops = NULL; /* json_pack's "o" took them, even on failure */
  }
  json_decref(cmp);
  json_decref(ops);
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/kv/txn", req, -1, 0, &resp));
  int ok = 0;
  int rc = j_bool(resp, "succeeded", &ok, what);
  json_decref(resp);
  if (rc == 0 && done) *done = ok;
  return rc;
}

/* The request_put objects of puts, as an array (NULL: building failed). */
static json_t *put_ops(const struct dcomm_etcd_put *puts, size_t n) {
  json_t *ops = json_array();
  for (size_t i = 0; i < n && ops; i++) {
    json_t *po = put_obj(puts[i].key, puts[i].val, puts[i].len, puts[i].lease);
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
    if (o && jset_b64(o, "value", m->val, m->len)) {
      json_decref(o);
      o = NULL;
    }
  } else {
    o = cmp_i64("CREATE", "create_revision", 0);
    if (o && m->kind == DCOMM_STORE_EXISTS && json_object_set_new(o, "result", json_string("GREATER"))) {
      json_decref(o);
      o = NULL;
    }
  }
  if (o && jset_b64(o, "key", m->key, strlen(m->key))) {
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
  json_t *cl = json_array(), *ops = put_ops(puts, nput), *req = NULL;
  for (size_t i = 0; i < ncmp && cl; i++)
    if (json_array_append_new(cl, cmp_obj(&cmps[i])) != 0) {
      json_decref(cl);
      cl = NULL;
    }
  if (cl && ops) {
    req = json_pack("{s:o, s:o}", "compare", cl, "success", ops);
    cl = ops = NULL; /* json_pack's "o" took them, even on failure */
  }
  json_decref(cl);
  json_decref(ops);
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/kv/txn", req, -1, 0, &resp));
  int ok = 0;
  int rc = j_bool(resp, "succeeded", &ok, what);
  json_decref(resp);
  if (rc == 0 && done) *done = ok;
  return rc;
}

int dcomm__etcd_delete_prefix_if(struct dcomm_etcd *c, const char *prefix, const char *key, int64_t mod_revision,
                                 int *done) {
  const char *what = "txn delete-if";
  if (done) *done = 0;
  DCOMM_CHECK(check_key(c, key, what));
  if (!prefix || !*prefix) return dcomm__err(DCOMM_EINVAL, "etcd %s: empty prefix", what);
  json_t *ops = json_pack("[{s:o}]", "request_delete_range", range_obj(prefix, 1));
  return txn_ops_if_mod(c, what, key, mod_revision, ops, done);
}

int dcomm__etcd_cas_value(struct dcomm_etcd *c, const char *key, const void *expected, size_t elen, const void *val,
                          size_t len, int *done, struct dcomm_etcd_kv *current) {
  if (elen && !expected) return dcomm__err(DCOMM_EINVAL, "etcd cas: NULL expected value of %zu bytes", elen);
  /* A VALUE compare on an absent key fails, as it should. */
  json_t *cmp = json_pack("{s:s, s:s}", "target", "VALUE", "result", "EQUAL");
  if (cmp && jset_b64(cmp, "value", expected, elen)) {
    json_decref(cmp);
    cmp = NULL;
  }
  return txn_put_if(c, "txn compare-value", key, cmp, val, len, 0, done, current);
}

/* ---- leases ---- */

int dcomm__etcd_lease_grant(struct dcomm_etcd *c, int64_t ttl, int64_t *id, int64_t *granted_ttl) {
  const char *what = "lease grant";
  if (!c || !id || ttl <= 0) return dcomm__err(DCOMM_EINVAL, "etcd lease grant: NULL argument or TTL <= 0");
  *id = 0;
  json_t *req = json_object();
  if (req && jset_i64(req, "TTL", ttl)) {
    json_decref(req);
    req = NULL;
  }
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/lease/grant", req, -1, CALL_IDEMPOTENT, &resp));
  int64_t lid = 0, t = 0;
  int rc = j_i64(resp, "ID", 1, &lid, what);
  if (rc == 0) rc = j_i64(resp, "TTL", 0, &t, what);
  json_t *err = json_object_get(resp, "error");
  if (rc == 0 && json_is_string(err) && json_string_length(err))
    rc = dcomm__err(DCOMM_EBACKEND, "etcd lease grant: %s", json_string_value(err));
  if (rc == 0 && (lid == 0 || t <= 0)) rc = proto(what, "no lease ID or TTL in the answer", NULL);
  json_decref(resp);
  if (rc < 0) return rc;
  *id = lid;
  if (granted_ttl) *granted_ttl = t;
  return 0;
}

int dcomm__etcd_lease_keepalive(struct dcomm_etcd *c, int64_t id, int64_t *ttl) {
  const char *what = "lease keepalive";
  if (ttl) *ttl = 0;
  if (!c || id == 0) return dcomm__err(DCOMM_EINVAL, "etcd lease keepalive: NULL client or lease 0");
  json_t *req = json_object();
  if (req && jset_i64(req, "ID", id)) {
    json_decref(req);
    req = NULL;
  }
  /* A stream on the gateway: one request object in, one line out. */
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/lease/keepalive", req, -1, CALL_IDEMPOTENT, &resp));
  json_t *r = json_object_get(resp, "result");
  int64_t t = 0, rid = 0;
  int rc = json_is_object(r) ? 0 : proto(what, "field 'result' is missing or not an object", NULL);
  if (rc == 0) rc = j_i64(r, "ID", 0, &rid, what);
  if (rc == 0) rc = j_i64(r, "TTL", 0, &t, what);
  json_decref(resp);
  if (rc < 0) return rc;
  if (rid != 0 && rid != id) return proto(what, "the answer is about another lease", NULL);
  if (t <= 0) return dcomm__err(DCOMM_ENOTFOUND, "etcd lease keepalive: lease %" PRId64 " is gone (expired or revoked)", id);
  if (ttl) *ttl = t;
  return 0;
}

int dcomm__etcd_lease_revoke(struct dcomm_etcd *c, int64_t id) {
  const char *what = "lease revoke";
  if (!c || id == 0) return dcomm__err(DCOMM_EINVAL, "etcd lease revoke: NULL client or lease 0");
  json_t *req = json_object();
  if (req && jset_i64(req, "ID", id)) {
    json_decref(req);
    req = NULL;
  }
  json_t *resp;
  DCOMM_CHECK(call(c, what, "/v3/lease/revoke", req, -1, CALL_IDEMPOTENT, &resp));
  json_decref(resp);
  return 0;
}

/* ---- watch ---- */

struct wstate {
  const char *what;
  const char *url;
  dcomm_etcd_watch_fn fn;
  void *arg;
  CURL *h;
  /* per attempt */
  long http;
  int checked_status;
  struct buf line, errbody;
  size_t scanned;
  int created;
  int stream_code; /* an error line's gRPC code (0: none) */
  char stream_msg[300];
  /* outcome */
  int done; /* fn asked to stop */
  int rc;   /* < 0: a final error found while reading */
  int64_t next_rev;
};

static int watch_proto(struct wstate *ws, const char *msg, const char *line, size_t len) {
  ws->rc = dcomm__err(DCOMM_EPROTO, "etcd %s: %s: malformed stream line: %s (%.80s%s)", ws->url, ws->what, msg,
                      line, len > 80 ? "..." : "");
  return -1;
}

static int watch_event(struct wstate *ws, json_t *e, const char *line, size_t len) {
  if (!json_is_object(e)) return watch_proto(ws, "an event is not an object", line, len);
  json_t *t = json_object_get(e, "type");
  int type = DCOMM_ETCD_PUT; /* PUT is the zero value: left out */
  if (t) {
    if (!json_is_string(t)) return watch_proto(ws, "event type is not a string", line, len);
    if (strcmp(json_string_value(t), "DELETE") == 0) type = DCOMM_ETCD_DELETE;
    else if (strcmp(json_string_value(t), "PUT") != 0) return watch_proto(ws, "unknown event type", line, len);
  }
  struct dcomm_etcd_kv kv;
  int rc = j_kv(json_object_get(e, "kv"), &kv, ws->what);
  if (rc < 0) {
    ws->rc = dcomm__err_ctx(rc, "etcd %s: %s: event", ws->url, ws->what);
    return -1;
  }
  if (kv.mod_revision <= 0) {
    dcomm__etcd_kv_clear(&kv);
    return watch_proto(ws, "event without mod_revision", line, len);
  }
  struct dcomm_etcd_event ev = {type,        kv.key,           kv.klen,    kv.val,  kv.vlen,
                                kv.mod_revision, kv.create_revision, kv.version, kv.lease};
  if (kv.mod_revision + 1 > ws->next_rev) ws->next_rev = kv.mod_revision + 1;
  int stop = ws->fn(&ev, ws->arg);
  dcomm__etcd_kv_clear(&kv);
  if (stop) {
    ws->done = 1;
    return -1;
  }
  return 0;
}

/* One '\n'-terminated line of the stream. -1: stop reading. */
static int watch_line(struct wstate *ws, const char *s, size_t len) {
  while (len && (s[len - 1] == '\r' || s[len - 1] == ' ')) len--;
  if (!len) return 0;
  json_error_t jerr;
  json_t *j = json_loadb(s, len, 0, &jerr);
  if (!j) return watch_proto(ws, jerr.text, s, len);
  int ret = 0;
  if (!json_is_object(j)) {
    ret = watch_proto(ws, "not a JSON object", s, len);
    goto out;
  }
  int code;
  char msg[300];
  if (json_object_get(j, "error")) {
    if (parse_error_body(j, &code, msg, sizeof(msg)) < 0) {
      ret = watch_proto(ws, "unreadable error", s, len);
    } else {
      ws->stream_code = code ? code : 2;
      snprintf(ws->stream_msg, sizeof(ws->stream_msg), "%s", msg);
      ret = -1;
    }
    goto out;
  }
  json_t *r = json_object_get(j, "result");
  if (!json_is_object(r)) {
    ret = watch_proto(ws, "field 'result' is missing or not an object", s, len);
    goto out;
  }
  int created = 0, canceled = 0;
  int64_t hrev = 0, compact = 0;
  if (j_bool(r, "created", &created, ws->what) < 0 || j_bool(r, "canceled", &canceled, ws->what) < 0 ||
      j_header_rev(r, 0, &hrev, ws->what) < 0 || j_i64(r, "compact_revision", 0, &compact, ws->what) < 0) {
    ws->rc = dcomm__err_ctx(DCOMM_EPROTO, "etcd %s: %s", ws->url, ws->what);
    ret = -1;
    goto out;
  }
  if (!ws->created && !created) {
    ret = watch_proto(ws, "the first answer is not 'created'", s, len);
    goto out;
  }
  if (created) ws->created = 1;
  if (canceled) {
    if (compact > 0) {
      struct dcomm_etcd_event ev = {DCOMM_ETCD_COMPACTED, "", 0, "", 0, compact, 0, 0, 0};
      ws->fn(&ev, ws->arg);
      ws->rc = dcomm__err(DCOMM_ENOTFOUND, "etcd %s: %s from revision %" PRId64 ": compacted up to revision %" PRId64
                          "; read again and watch from the new revision", ws->url, ws->what, ws->next_rev, compact);
    } else {
      json_t *why = json_object_get(r, "cancel_reason");
      const char *reason = json_is_string(why) ? json_string_value(why) : "(no reason)";
      if (strstr(reason, "Unauthenticated")) {
        ws->stream_code = 16;
      } else if (strstr(reason, "user name is empty")) {
        ws->stream_code = 3;
      } else if (strstr(reason, "PermissionDenied") || strstr(reason, "permission denied")) {
        ws->stream_code = 7;
      } else {
        ws->rc = dcomm__err(DCOMM_EBACKEND, "etcd %s: %s: etcd cancelled the watch: %s", ws->url, ws->what, reason);
      }
      snprintf(ws->stream_msg, sizeof(ws->stream_msg), "%s", reason);
    }
    ret = -1;
    goto out;
  }
  json_t *evs = json_object_get(r, "events");
  if (evs) {
    if (!json_is_array(evs)) {
      ret = watch_proto(ws, "field 'events' is not an array", s, len);
      goto out;
    }
    for (size_t i = 0; i < json_array_size(evs); i++)
      if (watch_event(ws, json_array_get(evs, i), s, len) < 0) {
        ret = -1;
        goto out;
      }
  } else if (!created && hrev > 0 && hrev + 1 > ws->next_rev) {
    ws->next_rev = hrev + 1; /* progress notification: nothing up to hrev */
  }
out:
  json_decref(j);
  return ret;
}

static size_t watch_write(char *ptr, size_t size, size_t nmemb, void *ud) {
  struct wstate *ws = ud;
  size_t n = size * nmemb;
  if (!ws->checked_status) {
    curl_easy_getinfo(ws->h, CURLINFO_RESPONSE_CODE, &ws->http);
    ws->checked_status = 1;
  }
  if (ws->http != 200) {
    if (ws->errbody.len + n <= ws->errbody.max) buf_append(&ws->errbody, ptr, n);
    return n;
  }
  if (buf_append(&ws->line, ptr, n) < 0) {
    ws->rc = ws->line.overflow
                 ? dcomm__err(DCOMM_EPROTO, "etcd %s: %s: stream line longer than %zu bytes", ws->url, ws->what, MAX_BODY)
                 : dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", ws->what);
    return 0;
  }
  size_t start = 0;
  for (size_t i = ws->scanned; i < ws->line.len; i++) {
    if (ws->line.p[i] != '\n') continue;
    int r = watch_line(ws, ws->line.p + start, i - start);
    start = i + 1;
    if (r < 0) return 0; /* aborts the transfer: the outcome is in ws */
  }
  memmove(ws->line.p, ws->line.p + start, ws->line.len - start);
  ws->line.len -= start;
  ws->line.p[ws->line.len] = 0;
  ws->scanned = ws->line.len;
  return n;
}

void dcomm__etcd_watch_cancel(int *cancel) {
  if (cancel) __atomic_store_n(cancel, 1, __ATOMIC_RELEASE);
}

static int cancelled(const int *cancel) { return cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE); }

int dcomm__etcd_watch(struct dcomm_etcd *c, const char *key, int prefix, int64_t start_revision, double timeout,
                      dcomm_etcd_watch_fn fn, void *arg, const int *cancel) {
  const char *what = "watch";
  if (!c || !key || (!prefix && !*key) || !fn) return dcomm__err(DCOMM_EINVAL, "etcd watch: NULL argument or empty key");
  if (isnan(timeout) || start_revision < 0) return dcomm__err(DCOMM_EINVAL, "etcd watch: NaN timeout or bad revision");
  double deadline = timeout < 0 ? INFINITY : dcomm__now() + timeout;
  struct wstate ws = {.what = what, .fn = fn, .arg = arg, .next_rev = start_revision};
  ws.line.max = MAX_BODY;
  ws.errbody.max = MAX_ERR_BODY;
  CURL *h = curl_easy_init();
  CURLM *m = curl_multi_init();
  int rc = 0, fails = 0, tried_in_round = 0, reauthed = 0;
  double backoff = 0.05;
  char last_msg[512] = "";
  char errbuf[CURL_ERROR_SIZE];
  if (!h || !m) {
    rc = dcomm__err(DCOMM_ENOMEM, "etcd watch: out of memory");
    goto out;
  }
  ws.h = h;
  for (;;) {
    /* The request: from the next revision not yet delivered. */
    json_t *cr = range_obj(key, prefix);
    if (cr && ws.next_rev > 0 && jset_i64(cr, "start_revision", ws.next_rev)) {
      json_decref(cr);
      cr = NULL;
    }
    if (cr && json_object_set_new(cr, "progress_notify", json_true())) {
      json_decref(cr);
      cr = NULL;
    }
    json_t *req = cr ? json_pack("{s:o}", "create_request", cr) : NULL;
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    pthread_mutex_lock(&c->mu);
    int idx = c->cur;
    char url[MAX_URL + 64];
    size_t bl = strlen(c->urls[idx]); /* at most MAX_URL */
    memcpy(url, c->urls[idx], bl);
    memcpy(url + bl, "/v3/watch", sizeof("/v3/watch"));
    char *token = c->token ? strdup(c->token) : NULL;
    int need_token = c->token != NULL;
    pthread_mutex_unlock(&c->mu);
    struct curl_slist *hdrs = make_headers(token);
    if (!body || !hdrs || (need_token && !token)) {
      free(body);
      free(token);
      curl_slist_free_all(hdrs);
      rc = dcomm__err(DCOMM_ENOMEM, "etcd watch: out of memory");
      goto out;
    }
    ws.url = c->urls[idx];
    ws.http = 0;
    ws.checked_status = 0;
    ws.line.len = 0;
    ws.errbody.len = 0;
    ws.scanned = 0;
    ws.created = 0;
    ws.stream_code = 0;
    set_common(c, h, url, body, strlen(body), hdrs, errbuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &ws);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 0L); /* a stream: bounded below */
    double left = deadline - dcomm__now();
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, ms_of(left < c->timeout ? left : c->timeout));
    curl_multi_add_handle(m, h);
    double attempt_start = dcomm__now();
    int64_t rev_before = ws.next_rev;
    int running = 1, stopped_by_us = 0;
    CURLcode cc = CURLE_OK;
    while (running) {
      CURLMcode mc = curl_multi_perform(m, &running);
      if (mc != CURLM_OK) {
        cc = CURLE_FAILED_INIT;
        snprintf(errbuf, sizeof(errbuf), "curl_multi_perform: %s", curl_multi_strerror(mc));
        break;
      }
      if (!running || ws.done || ws.rc) break;
      if (cancelled(cancel) || dcomm__now() >= deadline) {
        stopped_by_us = 1;
        break;
      }
      double l = deadline - dcomm__now();
      int ms = l * 1000 < WATCH_SLICE_MS ? (int)(l * 1000) + 1 : WATCH_SLICE_MS;
      curl_multi_poll(m, NULL, 0, ms, NULL);
    }
    if (!running) {
      int q;
      CURLMsg *msg;
      while ((msg = curl_multi_info_read(m, &q)))
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == h) cc = msg->data.result;
    }
    curl_multi_remove_handle(m, h);
    curl_slist_free_all(hdrs);
    free(body);
    /* Progress: events delivered, or a stream that stayed up a while. */
    int progressed = ws.created && (ws.next_rev != rev_before || dcomm__now() - attempt_start > 2.0);
    /* Outcomes, most final first. */
    if (ws.done) {
      rc = 0;
      free(token);
      goto out;
    }
    if (ws.rc) {
      rc = ws.rc;
      free(token);
      goto out;
    }
    if (stopped_by_us || cancelled(cancel) || dcomm__now() >= deadline) {
      if (cancelled(cancel))
        rc = dcomm__err(DCOMM_EREVOKED, "etcd watch on '%.200s': cancelled", key);
      else
        rc = dcomm__err(DCOMM_ETIMEDOUT, "etcd watch on '%.200s': nothing within %.3f s%s%.400s%s", key, timeout,
                        last_msg[0] ? " (last failure: " : "", last_msg, last_msg[0] ? ")" : "");
      free(token);
      goto out;
    }
    int code = ws.stream_code;
    char emsg[300];
    snprintf(emsg, sizeof(emsg), "%s", ws.stream_msg);
    if (ws.http != 0 && ws.http != 200) {
      json_error_t jerr;
      json_t *j = ws.errbody.len ? json_loadb(ws.errbody.p, ws.errbody.len, 0, &jerr) : NULL;
      if (!j || parse_error_body(j, &code, emsg, sizeof(emsg)) < 0) {
        code = (ws.http == 503 || ws.http == 502 || ws.http == 504) ? 14 : -1;
        snprintf(emsg, sizeof(emsg), "HTTP %ld without an etcd error (%.60s)", ws.http,
                 ws.errbody.len ? ws.errbody.p : "empty body");
      }
      json_decref(j);
      if (code == -1) {
        rc = dcomm__err(ws.http >= 500 ? DCOMM_EBACKEND : DCOMM_EPROTO, "etcd %s: %s: %s", ws.url, what, emsg);
        free(token);
        goto out;
      }
    }
    if (code && code != 14) {
      if (is_auth_missing(code, emsg) && c->user && !reauthed) {
        reauthed = 1;
        DCOMM_LOG(INFO, ETCD, "etcd %s: watch: token refused (%s); authenticating again", ws.url, emsg);
        pthread_mutex_lock(&c->mu);
        /* Another thread may have renewed it already. */
        if (!c->token || !token || strcmp(c->token, token) == 0) {
          free(c->token);
          c->token = NULL;
          rc = authenticate_locked(c, dcomm__now() + c->timeout);
        }
        pthread_mutex_unlock(&c->mu);
        free(token);
        if (rc < 0) goto out;
        continue;
      }
      rc = map_etcd_error(ws.url, what, ws.http ? ws.http : 200, code, emsg);
      free(token);
      goto out;
    }
    free(token);
    if (code == 14) {
      snprintf(last_msg, sizeof(last_msg), "%s: %s", ws.url, emsg);
    } else if (cc == CURLE_OK && ws.line.len > 0) {
      rc = dcomm__err(DCOMM_EPROTO, "etcd %s: %s: the stream ended in the middle of a line (%.60s)", ws.url, what,
                      ws.line.p);
      goto out;
    } else if (cc != CURLE_OK && classify_curl(cc) != F_RETRY) {
      rc = dcomm__err(classify_curl(cc) == F_TLS ? DCOMM_EAUTH : DCOMM_EPROTO, "etcd %s: %s: %s", ws.url, what,
                      errbuf[0] ? errbuf : curl_easy_strerror(cc));
      goto out;
    } else {
      snprintf(last_msg, sizeof(last_msg), "%s: %s%s", ws.url,
               cc == CURLE_OK ? "the stream ended" : (errbuf[0] ? errbuf : curl_easy_strerror(cc)),
               ws.line.len ? " (cut in the middle of a line)" : "");
    }
    /* Lost or refused: resume on the next endpoint. */
    if (progressed) fails = 0, tried_in_round = 0, backoff = 0.05;
    fails++;
    tried_in_round++;
    if (fails > 2 * c->n + 1) {
      rc = dcomm__err(DCOMM_EPEERLOST, "etcd %s on '%.200s': no endpoint kept the stream (%d attempts; last: %s)", what,
                      key, fails, last_msg);
      goto out;
    }
    pthread_mutex_lock(&c->mu);
    if (c->cur == idx && c->n > 1) c->cur = (idx + 1) % c->n;
    DCOMM_LOG(INFO, ETCD, "etcd watch on '%.200s' lost (%s); resuming from revision %" PRId64 " on %s", key, last_msg,
              ws.next_rev, c->urls[c->cur]);
    pthread_mutex_unlock(&c->mu);
    if (tried_in_round >= c->n) {
      tried_in_round = 0;
      double until = dcomm__now() + backoff;
      while (dcomm__now() < until && dcomm__now() < deadline && !cancelled(cancel)) sleep_s(0.01);
      backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
  }
out:
  if (m) curl_multi_cleanup(m);
  if (h) curl_easy_cleanup(h);
  buf_free(&ws.line);
  buf_free(&ws.errbody);
  return rc;
}

#else /* !DCOMM_HAVE_ETCD */

#define NOTSUP() dcomm__err(DCOMM_ENOTSUP, "etcd: dcomm was built without libcurl/jansson")

void dcomm__etcd_kv_clear(struct dcomm_etcd_kv *kv) {
  if (kv) {
    free(kv->key);
    free(kv->val);
    memset(kv, 0, sizeof(*kv));
  }
}
void dcomm__etcd_kvs_free(struct dcomm_etcd_kv *kvs, size_t n) {
  for (size_t i = 0; kvs && i < n; i++) dcomm__etcd_kv_clear(&kvs[i]);
  free(kvs);
}
int dcomm__etcd_create(const char *endpoints, const struct dcomm_etcd_opts *opts, struct dcomm_etcd **out) {
  if (out) *out = NULL;
  return NOTSUP();
}
void dcomm__etcd_destroy(struct dcomm_etcd *c) {}
int dcomm__etcd_endpoint_count(const struct dcomm_etcd *c) { return 0; }
int dcomm__etcd_current_endpoint(struct dcomm_etcd *c, char *buf, size_t len) { return NOTSUP(); }
int dcomm__etcd_put(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                    int64_t *revision) {
  return NOTSUP();
}
int dcomm__etcd_get(struct dcomm_etcd *c, const char *key, double timeout, struct dcomm_etcd_kv *kv,
                    int64_t *revision) {
  return NOTSUP();
}
int dcomm__etcd_range_prefix(struct dcomm_etcd *c, const char *prefix, struct dcomm_etcd_kv **kvs, size_t *n,
                             int64_t *revision) {
  return NOTSUP();
}
int dcomm__etcd_delete(struct dcomm_etcd *c, const char *key, int prefix, int64_t *deleted) { return NOTSUP(); }
int dcomm__etcd_create_if_absent(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                                 int *done, struct dcomm_etcd_kv *current) {
  return NOTSUP();
}
int dcomm__etcd_cas(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const void *val, size_t len,
                    int64_t lease, int *done, struct dcomm_etcd_kv *current) {
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
  return NOTSUP();
}
int dcomm__etcd_lease_grant(struct dcomm_etcd *c, int64_t ttl, int64_t *id, int64_t *granted_ttl) { return NOTSUP(); }
int dcomm__etcd_lease_keepalive(struct dcomm_etcd *c, int64_t id, int64_t *ttl) { return NOTSUP(); }
int dcomm__etcd_lease_revoke(struct dcomm_etcd *c, int64_t id) { return NOTSUP(); }
int dcomm__etcd_watch(struct dcomm_etcd *c, const char *key, int prefix, int64_t start_revision, double timeout,
                      dcomm_etcd_watch_fn fn, void *arg, const int *cancel) {
  return NOTSUP();
}
void dcomm__etcd_watch_cancel(int *cancel) {
  if (cancel) *cancel = 1;
}

#endif
