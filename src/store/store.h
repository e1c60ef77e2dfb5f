/*
 * store.h: the key-value store every rendezvous goes through. One interface,
 * several implementations (embedded TCP store, shared file, later etcd and
 * PMIx). Keys are strings; values are bytes. Every call is bounded by the
 * store's timeout. A store handle may be shared by threads (calls are
 * serialized inside each implementation).
 *
 * Keys are namespaced: the dcomm__store_* wrappers prepend the handle's
 * prefix (e.g. "g0/"), so one server can hold several generations or jobs.
 */
#ifndef DCOMM_STORE_H
#define DCOMM_STORE_H

#include <stddef.h>
#include <stdint.h>

#define DCOMM_STORE_MAX_KEY 4096

struct dcomm_store;

/* A guarded write (txn): every compare must hold, then every put happens,
 * atomically. This is how a member proves it still holds authority (its
 * generation is the current one, its node's record still exists) at the
 * moment it changes shared state: a process frozen or cut off while the job
 * went on fails the compare instead of writing. */
#define DCOMM_STORE_TXN_MAX 8 /* compares, and puts, per txn */
enum dcomm_store_cmp_kind {
  DCOMM_STORE_ABSENT = 0, /* the key does not exist */
  DCOMM_STORE_EXISTS = 1, /* the key exists, any value */
  DCOMM_STORE_EQUAL = 2,  /* the key exists with exactly this value */
};
struct dcomm_store_cmp {
  const char *key;
  int kind;
  const void *val; /* DCOMM_STORE_EQUAL only */
  size_t len;
};
struct dcomm_store_put {
  const char *key;
  const void *val;
  size_t len;
};

struct dcomm_store_ops {
  const char *name;
  int (*set)(struct dcomm_store *s, const char *key, const void *val, size_t len);
  /* Waits until key exists (up to timeout seconds); *val is malloc'd. */
  int (*get)(struct dcomm_store *s, const char *key, double timeout, void **val, size_t *len);
  /* Atomically adds delta to the decimal integer at key (absent = 0). */
  int (*add)(struct dcomm_store *s, const char *key, int64_t delta, int64_t *result);
  /* If key's value equals expected (expected NULL: key absent), sets it to
   * desired. Either way *current (malloc'd) is the value after the call. */
  int (*compare_set)(struct dcomm_store *s, const char *key, const void *expected, size_t elen, const void *desired,
                     size_t dlen, void **current, size_t *clen);
  /* Waits until every key exists. */
  int (*wait)(struct dcomm_store *s, const char *const *keys, int n, double timeout);
  /* If every compare holds, writes every put; *done says whether it did.
   * Keys are full (prefixed); at most DCOMM_STORE_TXN_MAX of each. */
  int (*txn)(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp, const struct dcomm_store_put *puts,
             int nput, int *done);
  /* Optional: waits until every key exists or the timeout (at most
   * DCOMM_STORE_MAX_WAIT_KEYS keys), then fills vals[i] (malloc'd) and
   * lens[i]; vals[i] stays NULL for a key still absent. 0 even then;
   * DCOMM_ENOTSUP: the caller reads them one by one instead (the values
   * exceed what one answer may hold). NULL: always one by one. */
  int (*get_many)(struct dcomm_store *s, const char *const *keys, int n, double timeout, void **vals, size_t *lens);
  /* Deletes key; *existed tells whether it was there (may be NULL). */
  int (*del)(struct dcomm_store *s, const char *key, int *existed);
  void (*close)(struct dcomm_store *s);
  /* Optional, callable from any thread: a call blocked on this handle in
   * another thread returns at once with an error; afterwards the handle
   * is only good for close. NULL: calls run to their timeout. */
  void (*interrupt)(struct dcomm_store *s);
};

struct dcomm_store {
  const struct dcomm_store_ops *ops;
  double timeout; /* default seconds for get/wait */
  char prefix[256];
};

/* Prefixing wrappers: what the rest of dcomm calls. timeout < 0: s->timeout. */
int dcomm__store_set(struct dcomm_store *s, const char *key, const void *val, size_t len);
int dcomm__store_get(struct dcomm_store *s, const char *key, double timeout, void **val, size_t *len);
int dcomm__store_add(struct dcomm_store *s, const char *key, int64_t delta, int64_t *result);
int dcomm__store_compare_set(struct dcomm_store *s, const char *key, const void *expected, size_t elen,
                             const void *desired, size_t dlen, void **current, size_t *clen);
int dcomm__store_wait(struct dcomm_store *s, const char *const *keys, int n, double timeout);
/* The values of n keys (any n), read in one request per
 * DCOMM_STORE_MAX_WAIT_KEYS where the store can: waits until every key
 * exists, within timeout for all. 0: vals[i] (free each) and lens[i] for
 * every key. DCOMM_ETIMEDOUT: some were still absent, their vals[i] NULL,
 * the others filled (free them too). Any other error: nothing filled. */
int dcomm__store_get_many(struct dcomm_store *s, const char *const *keys, int n, double timeout, void **vals,
                          size_t *lens);
/* Guarded write (see struct dcomm_store_cmp): keys get the prefix; *done
 * (not NULL) is 1 when the puts happened, 0 when a compare failed. */
int dcomm__store_txn(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                     const struct dcomm_store_put *puts, int nput, int *done);
/* The compares of a txn, evaluated against a lookup (the server and the
 * file store share it): 1 when all hold. find returns the value or NULL. */
typedef const void *(*dcomm_store_find_fn)(void *ctx, const char *key, size_t *len);
int dcomm__store_cmps_hold(const struct dcomm_store_cmp *cmps, int ncmp, dcomm_store_find_fn find, void *ctx);
int dcomm__store_delete(struct dcomm_store *s, const char *key, int *existed);
/* An all-gather of one value per member among n members through the store,
 * in O(n) requests (store_gather.c): *all (freed by the caller) holds n + 1
 * uint64_t offsets, then the values; member r's is [off[r], off[r+1]).
 * Every member calls it with the same prefix, unique to this exchange. */
int dcomm__store_allgather(struct dcomm_store *s, const char *prefix, int rank, int n, const void *mine, size_t len,
                           double timeout, void **all, size_t *alllen);
/* Waits that end early: stop(arg) is asked between slices of at most
 * DCOMM_STORE_STOP_SLICE s and ends the wait with the error it returns (< 0;
 * 0: go on). The core uses it so that the waits of a generation that was
 * revoked while it was being built end at once, not at their timeout. */
#define DCOMM_STORE_STOP_SLICE 0.5
typedef int (*dcomm_store_stop_fn)(void *arg);
int dcomm__store_get_stop(struct dcomm_store *s, const char *key, double timeout, dcomm_store_stop_fn stop, void *arg,
                          void **val, size_t *len);
int dcomm__store_get_many_stop(struct dcomm_store *s, const char *const *keys, int n, double timeout,
                               dcomm_store_stop_fn stop, void *arg, void **vals, size_t *lens);
/* get_many of the keys prefix<first>, prefix<first + 1>, ... (n keys,
 * decimal numbers): one value per rank, ticket or member. stop may be
 * NULL. */
int dcomm__store_get_numbered(struct dcomm_store *s, const char *prefix, int64_t first, int n, double timeout,
                              dcomm_store_stop_fn stop, void *arg, void **vals, size_t *lens);
int dcomm__store_allgather_stop(struct dcomm_store *s, const char *prefix, int rank, int n, const void *mine,
                                size_t len, double timeout, dcomm_store_stop_fn stop, void *arg, void **all,
                                size_t *alllen);
void dcomm__store_close(struct dcomm_store *s);
/* Ends a call blocked on s in another thread where the implementation can
 * (the TCP client); s is then only good for close. */
void dcomm__store_interrupt(struct dcomm_store *s);
/* Sets the prefix ("" for none); at most 255 bytes. */
int dcomm__store_set_prefix(struct dcomm_store *s, const char *prefix);
/* A fixed view of base's link under its own prefix: calls through it go to
 * base's implementation (same connection, same lock) with the view's
 * prefix, whatever base's prefix is now. Closing the view leaves base
 * open; base must outlive it. */
int dcomm__store_view(struct dcomm_store *base, const char *prefix, struct dcomm_store **out);
/* The kind of store behind s (a view's base): "tcp", "file" or "etcd". */
const char *dcomm__store_kind(const struct dcomm_store *s);

/* Embedded TCP store server: a thread that serves clients until stopped.
 * host NULL: all addresses; port 0: any (see dcomm__store_server_port). */
struct dcomm_store_server;
int dcomm__store_server_start(const char *host, int port, const char *job_id, const char *token,
                              struct dcomm_store_server **out);
int dcomm__store_server_port(const struct dcomm_store_server *srv);
void dcomm__store_server_stop(struct dcomm_store_server *srv);

/* TCP store client: connects (retrying until connect_timeout) and performs
 * the handshake. Its socket's local address tells which interface reaches
 * the server: dcomm__store_tcp_local_ip. */
int dcomm__store_tcp_connect(const char *host, int port, const char *job_id, const char *token,
                             double connect_timeout, double timeout, struct dcomm_store **out);
int dcomm__store_tcp_local_ip(struct dcomm_store *s, char *buf, size_t len);
/* A tcp handle whose stream failed (broken) connects again in place, within
 * timeout (connect and handshake each); 0 also when it was not broken.
 * The watcher's link uses it: a store frozen longer than a request's
 * bound (a SIGSTOPped dcomm-run) must not end a worker's heartbeats. */
int dcomm__store_tcp_redial(struct dcomm_store *s, double timeout);

/* Shared-file store (file:// init): every rank opens the same path on a
 * shared file system. */
int dcomm__store_file_open(const char *path, double timeout, struct dcomm_store **out);

#endif
