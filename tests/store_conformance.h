/*
 * store_conformance.h: the conformance suite of the store interface
 * (src/store/store.h). Every case runs against any implementation through a
 * store factory: a suite describes how to open one more handle on "the
 * store under test", and store_conformance_add registers every case for it
 * in one of its TCases, whose fixtures give each case a fresh, empty store
 * (a new TCP server, a new file, a new etcd job namespace). check_store runs
 * the cases on the TCP store and the file store, check_etcd on the etcd
 * store; what only one implementation has (wire frames, torn file records,
 * etcd leases and watches) stays in that suite.
 *
 * The helpers below (expect_value, txn_ok, ...) are shared with the suites'
 * own tests.
 */
#ifndef DCOMM_TEST_STORE_CONFORMANCE_H
#define DCOMM_TEST_STORE_CONFORMANCE_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

struct store_factory {
  /* The implementation's ops name ("tcp", "file", "etcd"): every handle
   * the factory opens is checked to be one. */
  const char *name;
  /* Opens one more handle on the store under test (its own connection,
   * descriptor or client), whose default get/wait timeout is timeout.
   * Called in the test process (after the TCase's fixtures ran), from its
   * threads and from processes it forks. Returns 0 or a DCOMM_E* code. */
  int (*open)(double timeout, struct dcomm_store **out);
  /* Size of the "far larger than any socket buffer" value that every store
   * must hold; 0 means 3 MiB. */
  size_t large_value;
  /* The concurrent add: add_threads threads (the first add_shared of them
   * on one shared handle, the others on their own) and add_procs processes
   * with a handle each, add_iters adds each. */
  int add_threads, add_shared, add_procs, add_iters;
};

/* Adds every conformance case to tc, run against f (which must live until
 * the runner is done). Each case is a loop test of one iteration whose
 * index selects f, so one TCase can hold the cases of one factory and
 * several TCases can each have their own. */
void store_conformance_add(TCase *tc, const struct store_factory *f);
/* How many cases store_conformance_add adds. */
int store_conformance_count(void);

/* ---- helpers, for the cases and for implementation-specific tests ---- */

/* Opens a handle through f; fails the test if it cannot. prefix may be
 * NULL (none). */
struct dcomm_store *conf_open(const struct store_factory *f, const char *prefix, double timeout);

/* Sets DCOMM_STORE_MAX_VALUE and reloads the parameters (test process only). */
void conf_set_max_value(const char *v);

#define ok(call)                                                                                         \
  do {                                                                                                   \
    int ok_rc_ = (call);                                                                                 \
    ck_assert_msg(ok_rc_ == 0, "%s returned %d (%s)", #call, ok_rc_, dcomm_last_error());               \
  } while (0)

/* get (3 s) must give exactly want. */
#define expect_value(s, key, want, wlen) conf_expect_value_at(__FILE__, __LINE__, s, key, want, wlen)
void conf_expect_value_at(const char *file, int line, struct dcomm_store *s, const char *key, const void *want,
                          size_t wlen);
/* get (timeout 0) must time out and leave its outputs cleared. */
#define expect_absent(s, key) conf_expect_absent_at(__FILE__, __LINE__, s, key)
void conf_expect_absent_at(const char *file, int line, struct dcomm_store *s, const char *key);

/* Guarded-write literals: a compare without a value, an EQUAL compare on a
 * string literal, a put of a string literal. */
#define CMP(k, kind) {(k), (kind), NULL, 0}
#define CMPV(k, v) {(k), DCOMM_STORE_EQUAL, (v), sizeof(v) - 1}
#define PUT(k, v) {(k), (v), sizeof(v) - 1}

/* A txn that must succeed as a call, with *done == want. */
#define txn_ok(s, cmps, ncmp, puts, nput, want) conf_txn_ok_at(__FILE__, __LINE__, s, cmps, ncmp, puts, nput, want)
void conf_txn_ok_at(const char *file, int line, struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                    const struct dcomm_store_put *puts, int nput, int want);
/* A refused txn: DCOMM_EINVAL and *done 0. */
#define txn_einval(s, cmps, ncmp, puts, nput) conf_txn_einval_at(__FILE__, __LINE__, s, cmps, ncmp, puts, nput)
void conf_txn_einval_at(const char *file, int line, struct dcomm_store *s, const struct dcomm_store_cmp *cmps,
                        int ncmp, const struct dcomm_store_put *puts, int nput);

/* A get run in a thread: pthread_create(&th, NULL, conf_blocked_get_main, &g). */
struct conf_blocked_get {
  struct dcomm_store *s;
  const char *key;
  double timeout;
  int rc;
  void *val; /* malloc'd on success */
  size_t len;
  double elapsed;
};
void *conf_blocked_get_main(void *arg);

#endif
