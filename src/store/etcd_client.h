/*
 * etcd_client.h: a small etcd v3 client over the 3.4 JSON gateway (libcurl +
 * jansson), and the etcd-backed store built on it.
 *
 * A client holds a list of endpoints ("h1:p1,h2:p2", each optionally
 * "http://" or "https://"), optional credentials (user/password: the client
 * authenticates and re-authenticates once when the token is refused) and TLS
 * files. Every unary call is bounded by the client's timeout, failover
 * included: a request that cannot connect, times out or is answered
 * "unavailable" (gRPC code 14) moves on to the next endpoint, round robin,
 * until the timeout. A request that may already have been applied (a txn
 * whose answer was lost after it was sent) is not repeated: it fails with
 * DCOMM_EPEERLOST "outcome unknown". Every answer is checked: a missing
 * required field, a wrong type, truncated JSON or bad base64 is DCOMM_EPROTO
 * naming the call. etcd errors map to: unavailable -> DCOMM_EPEERLOST (after
 * retries), bad token / bad credentials / permission denied -> DCOMM_EAUTH,
 * not found (leases) -> DCOMM_ENOTFOUND, invalid argument -> DCOMM_EINVAL,
 * anything else -> DCOMM_EBACKEND. Proxies from the environment are ignored.
 *
 * A client may be used by several threads at once: unary calls are
 * serialized inside it; a watch runs on its own connection, so one thread
 * can watch while others put.
 *
 * Built without libcurl/jansson (no DCOMM_HAVE_ETCD) every call returns
 * DCOMM_ENOTSUP.
 */
#ifndef DCOMM_ETCD_CLIENT_H
#define DCOMM_ETCD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

struct dcomm_store;
struct dcomm_etcd;

struct dcomm_etcd_opts {
  double timeout;       /* seconds per call, failover included; <= 0: 10 */
  const char *user;     /* NULL or "": no authentication */
  const char *password;
  const char *cacert;   /* TLS: CA bundle to verify the servers (https://) */
  const char *cert;     /* TLS client certificate and key (PEM) */
  const char *key;
};

/* One key-value pair; key and val are malloc'd copies, each followed by a
 * NUL byte that is not counted (so string values can be used directly). */
struct dcomm_etcd_kv {
  char *key;
  size_t klen;
  void *val;
  size_t vlen;
  int64_t create_revision, mod_revision, version, lease;
};
void dcomm__etcd_kv_clear(struct dcomm_etcd_kv *kv);
void dcomm__etcd_kvs_free(struct dcomm_etcd_kv *kvs, size_t n);

/* 0 when libcurl, which the client opens at its first use, can be
 * opened here; else DCOMM_ENOTSUP saying why. dcomm-info reports it. */
int dcomm__etcd_available(void);
/* opts may be NULL (defaults). With a user, authenticates before returning. */
int dcomm__etcd_create(const char *endpoints, const struct dcomm_etcd_opts *opts, struct dcomm_etcd **out);
void dcomm__etcd_destroy(struct dcomm_etcd *c);
int dcomm__etcd_endpoint_count(const struct dcomm_etcd *c);
/* The endpoint the next request goes to first (its index; its URL in buf). */
int dcomm__etcd_current_endpoint(struct dcomm_etcd *c, char *buf, size_t len);

/* lease 0: none. *revision (may be NULL): the revision of the write. */
int dcomm__etcd_put(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                    int64_t *revision);
/* One key. Absent: DCOMM_ENOTFOUND (kv cleared, *revision still set).
 * timeout < 0: the client's. *revision (may be NULL): the store revision. */
int dcomm__etcd_get(struct dcomm_etcd *c, const char *key, double timeout, struct dcomm_etcd_kv *kv,
                    int64_t *revision);
/* Every key starting with prefix, in key order; *kvs is malloc'd (may be
 * NULL when *n is 0); free with dcomm__etcd_kvs_free. */
int dcomm__etcd_range_prefix(struct dcomm_etcd *c, const char *prefix, struct dcomm_etcd_kv **kvs, size_t *n,
                             int64_t *revision);
/* Deletes key (prefix != 0: every key starting with it); *deleted may be NULL. */
int dcomm__etcd_delete(struct dcomm_etcd *c, const char *key, int prefix, int64_t *deleted);

/* Transactions. Each sets *done to 1 when the write happened; *current (may
 * be NULL) then holds the value written and its revision, else the key as it
 * is now (current->key NULL: absent). */
/* Writes only if key does not exist (CREATE create_revision == 0). */
int dcomm__etcd_create_if_absent(struct dcomm_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                                 int *done, struct dcomm_etcd_kv *current);
/* Writes only if key's mod_revision equals mod_revision (0: absent). */
int dcomm__etcd_cas(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const void *val, size_t len,
                    int64_t lease, int *done, struct dcomm_etcd_kv *current);
/* Writes only if key exists with exactly the value expected. */
int dcomm__etcd_cas_value(struct dcomm_etcd *c, const char *key, const void *expected, size_t elen, const void *val,
                          size_t len, int *done, struct dcomm_etcd_kv *current);

/* Writes every put (one transaction) only if key's mod_revision equals
 * mod_revision (0: key absent); *done says whether it did. */
struct dcomm_etcd_put {
  const char *key;
  const void *val;
  size_t len;
  int64_t lease; /* 0: none */
};
int dcomm__etcd_puts_if(struct dcomm_etcd *c, const char *key, int64_t mod_revision, const struct dcomm_etcd_put *puts,
                        size_t n, int *done);
/* Writes every put (one transaction) only if every compare holds; kind is
 * an enum dcomm_store_cmp_kind (store.h): ABSENT (create_revision == 0),
 * EXISTS (create_revision > 0; a key under a lease exists only while the
 * lease does) or EQUAL (value). *done says whether it wrote. */
struct dcomm_etcd_cmp {
  const char *key;
  int kind;
  const void *val;
  size_t len;
};
int dcomm__etcd_txn(struct dcomm_etcd *c, const struct dcomm_etcd_cmp *cmps, size_t ncmp,
                    const struct dcomm_etcd_put *puts, size_t nput, int *done);
/* Deletes every key starting with prefix only if key's mod_revision
 * equals mod_revision (0: key absent). */
int dcomm__etcd_delete_prefix_if(struct dcomm_etcd *c, const char *prefix, const char *key, int64_t mod_revision,
                                 int *done);

/* Leases. ttl in seconds (etcd's minimum is about 2). keepalive renews once;
 * a lease that is gone (expired or revoked) is DCOMM_ENOTFOUND. */
int dcomm__etcd_lease_grant(struct dcomm_etcd *c, int64_t ttl, int64_t *id, int64_t *granted_ttl);
int dcomm__etcd_lease_keepalive(struct dcomm_etcd *c, int64_t id, int64_t *ttl);
int dcomm__etcd_lease_revoke(struct dcomm_etcd *c, int64_t id);

/* Watch. */
enum dcomm_etcd_event_type { DCOMM_ETCD_PUT = 0, DCOMM_ETCD_DELETE = 1, DCOMM_ETCD_COMPACTED = 2 };
struct dcomm_etcd_event {
  int type;           /* DCOMM_ETCD_PUT / DELETE; COMPACTED: see below */
  const char *key;    /* NUL-terminated; valid during the callback only */
  size_t klen;
  const void *val;    /* PUT: the new value (NUL-terminated); DELETE: empty */
  size_t vlen;
  int64_t mod_revision; /* COMPACTED: the compact revision */
  int64_t create_revision, version, lease;
};
/* Returns 0 to go on, non-zero to end the watch (dcomm__etcd_watch then
 * returns 0). */
typedef int (*dcomm_etcd_watch_fn)(const struct dcomm_etcd_event *ev, void *arg);

/* Streams the events on key (prefix != 0: every key starting with it) from
 * start_revision (0: from now) to fn, in order, until fn asks to stop (0),
 * timeout seconds pass (DCOMM_ETIMEDOUT; timeout < 0: no limit), *cancel
 * becomes non-zero (DCOMM_EREVOKED; cancel may be NULL; see
 * dcomm__etcd_watch_cancel; noticed within about 50 ms), or an error. A
 * broken stream is resumed on the next endpoint from the last revision seen.
 * When start_revision was compacted away, fn gets one DCOMM_ETCD_COMPACTED
 * event and the call returns DCOMM_ENOTFOUND: read the keys again with a
 * range and watch from that answer's revision + 1. */
int dcomm__etcd_watch(struct dcomm_etcd *c, const char *key, int prefix, int64_t start_revision, double timeout,
                      dcomm_etcd_watch_fn fn, void *arg, const int *cancel);
/* Sets *cancel so that a watch given it returns (safe from any thread). */
void dcomm__etcd_watch_cancel(int *cancel);

/* The etcd store: every key lives under "/dcomm/<job_id>/". timeout: the
 * store's default (get/wait) and the bound of every etcd request. TLS and
 * credentials come from DCOMM_ETCD_USER, DCOMM_ETCD_PASSWORD,
 * DCOMM_ETCD_CACERT, DCOMM_ETCD_CERT and DCOMM_ETCD_KEY. Checks that etcd
 * answers before returning. */
int dcomm__store_etcd_open(const char *endpoints, const char *job_id, double timeout, struct dcomm_store **out);

#endif
