/*
 * etcd_http.c: the HTTP side of the etcd client (etcd_client.h): creating
 * and destroying a client, its endpoint list, authentication, and the one
 * unary call every request goes through. libcurl carries the HTTP, on one
 * easy handle per client that the client's mutex serializes. A call is
 * bounded by its timeout, failover included: it moves on to the next
 * endpoint, round robin, when one cannot connect, times out or answers
 * "unavailable", authenticates again once when the token is refused, and
 * is not sent twice unless it is idempotent. The request options, TLS
 * files and error mapping here are shared with the watch (etcd_watch.c).
 */
#define _GNU_SOURCE
#include "config.h"
#include "etcd_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#ifdef DCOMM_HAVE_ETCD

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <time.h>

#include "clock.h"
#include "log.h"

#define DEFAULT_TIMEOUT 10.0
#define MAX_ENDPOINTS 64

/* ---- small helpers ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc = CURLE_OK;

static void global_init(void) { g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *dup_or_null(const char *s) { return (s && *s) ? strdup(s) : NULL; }

void etcd__sleep_s(double s) {
  if (!(s > 0)) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

int etcd__buf_append(struct buf *b, const void *data, size_t n) {
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

void etcd__buf_free(struct buf *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
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
  return etcd__buf_append(b, ptr, n) == 0 ? n : 0;
}

/* Options shared by unary calls and watches. headers are owned by caller. */
struct curl_slist *etcd__make_headers(const char *token) {
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

void etcd__set_common(struct dcomm_etcd *c, CURL *h, const char *url, const char *body, size_t blen,
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

long etcd__ms_of(double s) {
  if (!(s > 0.001)) return 1;
  if (s > 1e6) return 1000000000L;
  return (long)(s * 1000.0);
}

enum fail_kind etcd__classify_curl(CURLcode cc) {
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

int etcd__is_auth_missing(int code, const char *msg) {
  return code == 16 || (code == 3 && strstr(msg, "user name is empty"));
}

/* Maps an etcd error that is neither retried nor answered by authenticating. */
int etcd__map_etcd_error(const char *url, const char *what, long http, int code, const char *msg) {
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
  if (etcd__is_auth_missing(code, msg))
    return dcomm__err(DCOMM_EAUTH, "etcd %s: %s: authentication required or refused (%s; set DCOMM_ETCD_USER and "
                      "DCOMM_ETCD_PASSWORD)", url, what, msg);
  return dcomm__err(err, "etcd %s: %s: %s (gRPC code %d, HTTP %ld)", url, what, msg, code, http);
}

/* One unary call with failover, under c->mu. *out: the answer object. */
static int call_locked(struct dcomm_etcd *c, const char *what, const char *path, json_t *req, double timeout,
                       int flags, json_t **out) {
  *out = NULL;
  if (!(timeout > 0)) timeout = c->timeout;
  char *body = json_dumps(req, JSON_COMPACT);
  if (!body) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory building the request", what);
  size_t blen = strlen(body);
  double start = dcomm__now(), deadline = start + timeout;
  int reauthed = 0, attempts = 0, tried_in_round = 0, rounds = 0, rc = 0;
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
     * its connection attempt is sliced. The first pass over the endpoints
     * gives each at most 1 s (a healthy member answers in milliseconds; a
     * heartbeat held 3 s by a stalled member reads as a hung worker), later
     * passes up to 3 s, so that a slow but working cluster still answers. */
    double at = left, cat = left;
    if (c->n > 1) {
      double slice = timeout / 4 < 1.0 ? 1.0 : (timeout / 4 > 3.0 ? 3.0 : timeout / 4);
      if (rounds == 0 && slice > 1.0) slice = 1.0;
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
    struct curl_slist *hdrs = etcd__make_headers((flags & CALL_NO_TOKEN) ? NULL : c->token);
    if (!hdrs) {
      rc = dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
      goto done;
    }
    resp.len = 0;
    resp.overflow = 0;
    etcd__set_common(c, c->easy, url, body, blen, hdrs, errbuf);
    curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, write_buf);
    curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, &resp);
    curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, etcd__ms_of(at));
    curl_easy_setopt(c->easy, CURLOPT_CONNECTTIMEOUT_MS, etcd__ms_of(cat));
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
      enum fail_kind k = etcd__classify_curl(cc);
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
      int is_err = j ? etcd__parse_error_body(j, &code, emsg, sizeof(emsg)) == 0 : 0;
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
      if (!(flags & CALL_NO_TOKEN) && etcd__is_auth_missing(code, emsg) && c->user && !reauthed) {
        reauthed = 1;
        DCOMM_LOG(INFO, ETCD, "etcd %s: %s: token refused (%s); authenticating again", base, what, emsg);
        free(c->token);
        c->token = NULL;
        rc = etcd__authenticate_locked(c, deadline);
        if (rc < 0) goto done;
        continue; /* same endpoint (or the one authentication moved to) */
      }
      rc = etcd__map_etcd_error(base, what, http, code, emsg);
      goto done;
    }
  next:
    if (c->n > 1) {
      c->cur = (idx + 1) % c->n;
      DCOMM_LOG(INFO, ETCD, "etcd %s failed for %s (%s); trying %s", base, what, last_msg, c->urls[c->cur]);
    }
    if (tried_in_round >= c->n) {
      tried_in_round = 0;
      rounds++;
      double l = deadline - dcomm__now();
      etcd__sleep_s(backoff < l ? backoff : l);
      backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
  }
  rc = dcomm__err(last_err, "etcd %s: no endpoint answered within %.3f s (%d attempts over %d endpoint%s; last: %s)",
                  what, timeout, attempts, c->n, c->n > 1 ? "s" : "", last_msg);
done:
  etcd__buf_free(&resp);
  free(body);
  return rc;
}

int etcd__authenticate_locked(struct dcomm_etcd *c, double deadline) {
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
    return etcd__proto(what, "field 'token' is missing or not a usable string", NULL);
  }
  free(c->token);
  c->token = strdup(json_string_value(t));
  json_decref(resp);
  if (!c->token) return dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", what);
  DCOMM_LOG(INFO, ETCD, "authenticated to etcd as '%s'", c->user);
  return 0;
}

/* A unary call from a public function: locks, calls, consumes req. */
int etcd__call(struct dcomm_etcd *c, const char *what, const char *path, json_t *req, double timeout, int flags,
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
  DCOMM_CHECK(etcd__curl_load());
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
    rc = etcd__authenticate_locked(c, dcomm__now() + c->timeout);
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

int dcomm__etcd_available(void) { return etcd__curl_load(); }

#else /* !DCOMM_HAVE_ETCD */

int dcomm__etcd_available(void) { return NOTSUP(); }

int dcomm__etcd_create(const char *endpoints, const struct dcomm_etcd_opts *opts, struct dcomm_etcd **out) {
  (void)endpoints, (void)opts;
  if (out) *out = NULL;
  return NOTSUP();
}
void dcomm__etcd_destroy(struct dcomm_etcd *c) { (void)c; }
int dcomm__etcd_endpoint_count(const struct dcomm_etcd *c) {
  (void)c;
  return 0;
}
int dcomm__etcd_current_endpoint(struct dcomm_etcd *c, char *buf, size_t len) {
  (void)c, (void)buf, (void)len;
  return NOTSUP();
}

#endif
