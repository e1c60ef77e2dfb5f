/*
 * etcd_internal.h: private to the etcd client files (etcd_http.c,
 * etcd_json.c, etcd_kv.c, etcd_lease.c, etcd_watch.c), which together
 * implement etcd_client.h; nothing else includes it. It holds the client's
 * structure, the byte buffer and limits they share, and the helpers one of
 * those files provides to the others, each named etcd__*. Everything else
 * stays static in the file that uses it.
 */
#ifndef DCOMM_ETCD_INTERNAL_H
#define DCOMM_ETCD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "etcd_client.h"

#ifdef DCOMM_HAVE_ETCD

#include "curl_api.h"
#include <jansson.h>
#include <pthread.h>

#define MAX_URL 512 /* one endpoint's URL */
/* Largest unary answer or watch line accepted (a range can hold many keys). */
#define MAX_BODY ((size_t)256 << 20)

struct dcomm_etcd {
  pthread_mutex_t mu; /* serializes unary calls; guards cur, token, easy */
  char **urls;        /* "http://host:port", no trailing slash */
  int n, cur;
  double timeout;
  char *user, *password, *cacert, *cert, *key;
  char *token; /* NULL until authenticated */
  CURL *easy;
};

/* ---- etcd_http.c: buffers, requests, errors, unary calls ---- */

/* A NUL-terminated byte buffer that grows up to max bytes. */
struct buf {
  char *p;
  size_t len, cap, max;
  int overflow;
};

/* Appends n bytes; -1 past max (overflow set) or out of memory. */
int etcd__buf_append(struct buf *b, const void *data, size_t n);
void etcd__buf_free(struct buf *b);
/* Sleeps s seconds (nothing when s <= 0), resuming after signals. */
void etcd__sleep_s(double s);

/* The request headers (with the token when not NULL); NULL: out of memory.
 * The caller frees them with curl_slist_free_all. */
struct curl_slist *etcd__make_headers(const char *token);
/* The curl options shared by unary calls and watches; errbuf holds
 * CURL_ERROR_SIZE bytes. */
void etcd__set_common(struct dcomm_etcd *c, CURL *h, const char *url, const char *body, size_t blen,
                      struct curl_slist *hdrs, char *errbuf);
/* Seconds as curl milliseconds: at least 1, at most 10^9. */
long etcd__ms_of(double s);

/* How a failed transfer is handled. */
enum fail_kind { F_RETRY, F_PROTO, F_TLS };
enum fail_kind etcd__classify_curl(CURLcode cc);

/* Whether an etcd error (gRPC code and message) asks for a token. */
int etcd__is_auth_missing(int code, const char *msg);
/* Maps an etcd error that is neither retried nor answered by authenticating. */
int etcd__map_etcd_error(const char *url, const char *what, long http, int code, const char *msg);
/* Gets a token for c->user before deadline; the caller holds c->mu. */
int etcd__authenticate_locked(struct dcomm_etcd *c, double deadline);

/* CALL_IDEMPOTENT: may be sent again after a failure that followed sending
 * it; CALL_NO_TOKEN: sent without the token (authentication itself). */
enum call_flags { CALL_IDEMPOTENT = 1, CALL_NO_TOKEN = 2 };
/* One unary call with failover: locks c->mu and consumes req (NULL: out of
 * memory building it). timeout <= 0: the client's. *out: the answer. */
int etcd__call(struct dcomm_etcd *c, const char *what, const char *path, json_t *req, double timeout, int flags,
               json_t **out);

/* ---- etcd_json.c: building requests, checking answers ---- */

/* name: base64(data), name: "<decimal>" (the gateway's int64); -1 on failure. */
int etcd__jset_b64(json_t *o, const char *name, const void *data, size_t n);
int etcd__jset_i64(json_t *o, const char *name, int64_t v);
/* {"key":..,"value":..,"lease":..} for put requests; NULL on failure. */
json_t *etcd__put_obj(const char *key, const void *val, size_t len, int64_t lease);
/* {"key":..,"range_end":..} for a prefix (or one key when !prefix). */
json_t *etcd__range_obj(const char *key, int prefix);
/* A compare {"target":target,"result":"EQUAL",field:v} without its key. */
json_t *etcd__cmp_i64(const char *target, const char *field, int64_t v);

/* DCOMM_EPROTO "etcd <what>: malformed answer: <fmt><detail>". */
int etcd__proto(const char *what, const char *fmt, const char *detail);
/* Answer fields, each checked; what names the call in errors. A missing
 * optional field is 0 / false / none. */
int etcd__j_i64(json_t *o, const char *name, int required, int64_t *out, const char *what);
int etcd__j_bool(json_t *o, const char *name, int *out, const char *what);
int etcd__j_kv(json_t *o, struct dcomm_etcd_kv *kv, const char *what);
int etcd__j_header_rev(json_t *resp, int required, int64_t *rev, const char *what);
int etcd__j_kvs(json_t *o, struct dcomm_etcd_kv **kvs, size_t *n, const char *what);
/* An etcd error answer (unary or stream form): 0 with its gRPC code and
 * message, -1 when j is no such answer. */
int etcd__parse_error_body(json_t *j, int *code, char *msg, size_t mlen);

#else /* !DCOMM_HAVE_ETCD */

/* What every call of a build without libcurl/jansson returns. */
#define NOTSUP() dcomm__err(DCOMM_ENOTSUP, "etcd: dcomm was built without libcurl/jansson")

#endif

#endif
