/*
 * check_store.c: unit tests of the key-value store. The TCP tests run a real
 * embedded server on 127.0.0.1 (port 0) and talk to it through the client,
 * and through raw sockets for the handshake and garbage cases; the file tests
 * open one file through several handles, threads and processes as ranks
 * would. The same API checks run against both implementations.
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "dcomm.h"
#include "param.h"
#include "sock.h"
#include "store.h"
#include "store_proto.h"

#define JOB "job-check"
#define TOKEN "s3cret-token"

/* ---- shared helpers ---- */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

#define expect_value(s, key, want, wlen) expect_value_at(__LINE__, s, key, want, wlen)
static void expect_value_at(int line, struct dcomm_store *s, const char *key, const void *want, size_t wlen) {
  void *v = NULL;
  size_t n = 12345;
  int rc = dcomm__store_get(s, key, 3.0, &v, &n);
  ck_assert_msg(rc == 0, "line %d: get '%s' returned %d (%s)", line, key, rc, dcomm_last_error());
  ck_assert_msg(v != NULL, "line %d: get '%s' gave a NULL buffer", line, key);
  ck_assert_msg(n == wlen && (wlen == 0 || memcmp(v, want, wlen) == 0),
                "line %d: get '%s': wrong value (length %zu, expected %zu)", line, key, n, wlen);
  free(v);
}

#define expect_absent(s, key) expect_absent_at(__LINE__, s, key)
static void expect_absent_at(int line, struct dcomm_store *s, const char *key) {
  void *v = (void *)1;
  size_t n = 1;
  int rc = dcomm__store_get(s, key, 0, &v, &n);
  ck_assert_msg(rc == DCOMM_ETIMEDOUT, "line %d: get '%s' of an absent key returned %d", line, key, rc);
  ck_assert_msg(v == NULL && n == 0, "line %d: failed get left output set", line);
}

#define ok(call)                                                                   \
  do {                                                                             \
    int ok_rc_ = (call);                                                           \
    ck_assert_msg(ok_rc_ == 0, "%s returned %d (%s)", #call, ok_rc_, dcomm_last_error()); \
  } while (0)

static void set_max_value(const char *v) {
  setenv("DCOMM_STORE_MAX_VALUE", v, 1);
  ck_assert_int_eq(dcomm__params_load(), 0);
}

/* ---- API checks shared by both implementations (a and b: two ranks) ---- */

static void api_basic(struct dcomm_store *a, struct dcomm_store *b) {
  int64_t r = 0;
  int ex = -1;
  ok(dcomm__store_set(a, "k", "hello", 5));
  expect_value(b, "k", "hello", 5);
  const char bin[] = {'a', 0, 'b', 0, (char)0xff};
  ok(dcomm__store_set(a, "bin", bin, sizeof(bin)));
  expect_value(b, "bin", bin, sizeof(bin));
  ok(dcomm__store_set(a, "empty", "", 0));
  expect_value(b, "empty", "", 0);
  ok(dcomm__store_set(b, "k", "world!", 6));
  expect_value(a, "k", "world!", 6);
  /* A value far larger than any socket buffer. */
  size_t bigl = 3u << 20;
  unsigned char *big = malloc(bigl);
  for (size_t i = 0; i < bigl; i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
  ok(dcomm__store_set(a, "large", big, bigl));
  expect_value(b, "large", big, bigl);
  free(big);

  ok(dcomm__store_add(a, "cnt", 5, &r));
  ck_assert_int_eq(r, 5);
  expect_value(b, "cnt", "5", 1); /* kept as decimal text */
  ok(dcomm__store_add(b, "cnt", -7, &r));
  ck_assert_int_eq(r, -2);
  expect_value(a, "cnt", "-2", 2);
  ok(dcomm__store_add(a, "cnt", 0, &r));
  ck_assert_int_eq(r, -2);
  ok(dcomm__store_add(a, "cnt", 1, NULL));
  expect_value(b, "cnt", "-1", 2);
  ok(dcomm__store_set(a, "num", "12", 2));
  ok(dcomm__store_add(b, "num", 30, &r));
  ck_assert_int_eq(r, 42);
  /* A non-integer value is refused and left alone. */
  ck_assert_int_eq(dcomm__store_add(a, "k", 1, &r), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_add(a, "bin", 1, &r), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_add(a, "empty", 1, &r), DCOMM_EINVAL);
  expect_value(b, "k", "world!", 6);
  ok(dcomm__store_set(a, "big", "9223372036854775807", 19));
  ck_assert_int_eq(dcomm__store_add(b, "big", 1, &r), DCOMM_EINVAL);
  ok(dcomm__store_add(b, "big", -1, &r));
  ck_assert(r == INT64_MAX - 1);

  ok(dcomm__store_delete(a, "k", &ex));
  ck_assert_int_eq(ex, 1);
  ok(dcomm__store_delete(b, "k", &ex));
  ck_assert_int_eq(ex, 0);
  ok(dcomm__store_delete(b, "never", NULL));
  expect_absent(b, "k");
  expect_absent(a, "k");
  expect_value(a, "bin", bin, sizeof(bin)); /* other keys untouched */
  ok(dcomm__store_delete(a, "cnt", &ex));
  ck_assert_int_eq(ex, 1);
  ok(dcomm__store_add(b, "cnt", 3, &r)); /* absent counts as 0 */
  ck_assert_int_eq(r, 3);
}

static void expect_current(void *cur, size_t cl, const char *want) {
  ck_assert_msg(cur != NULL, "compare_set: current is NULL, expected '%s'", want);
  ck_assert_msg(cl == strlen(want) && memcmp(cur, want, cl) == 0, "compare_set: current is '%.*s', expected '%s'",
                (int)cl, (char *)cur, want);
  free(cur);
}

static void api_compare_set(struct dcomm_store *a, struct dcomm_store *b) {
  void *cur;
  size_t cl;
  /* Absent and expected NULL: created. */
  ok(dcomm__store_compare_set(a, "c", NULL, 0, "one", 3, &cur, &cl));
  expect_current(cur, cl, "one");
  expect_value(b, "c", "one", 3);
  /* Expected NULL but present: unchanged, current is the stored value. */
  ok(dcomm__store_compare_set(b, "c", NULL, 0, "two", 3, &cur, &cl));
  expect_current(cur, cl, "one");
  expect_value(a, "c", "one", 3);
  /* Match: swapped. */
  ok(dcomm__store_compare_set(b, "c", "one", 3, "three", 5, &cur, &cl));
  expect_current(cur, cl, "three");
  expect_value(a, "c", "three", 5);
  /* No match: unchanged. */
  ok(dcomm__store_compare_set(a, "c", "one", 3, "four", 4, &cur, &cl));
  expect_current(cur, cl, "three");
  expect_value(b, "c", "three", 5);
  /* Expected given but the key is absent: nothing created, no current. */
  cur = (void *)1;
  cl = 9;
  ok(dcomm__store_compare_set(a, "nokey", "x", 1, "y", 1, &cur, &cl));
  ck_assert_ptr_null(cur);
  ck_assert_int_eq(cl, 0);
  expect_absent(b, "nokey");
  /* An empty value is not "absent", in both directions. */
  ok(dcomm__store_set(a, "e", "", 0));
  ok(dcomm__store_compare_set(b, "e", NULL, 0, "x", 1, &cur, &cl));
  expect_current(cur, cl, "");
  expect_value(a, "e", "", 0);
  ok(dcomm__store_compare_set(b, "e", "", 0, "y", 1, &cur, &cl));
  expect_current(cur, cl, "y");
  expect_value(a, "e", "y", 1);
  ok(dcomm__store_compare_set(a, "e", "y", 1, "", 0, NULL, NULL));
  expect_value(b, "e", "", 0);
  ck_assert_int_eq(dcomm__store_compare_set(a, "e", NULL, 3, "z", 1, &cur, &cl), DCOMM_EINVAL);
  expect_value(b, "e", "", 0);
}

struct delayed_set {
  struct dcomm_store *s;
  double delay;
  const char *keys[4];
  int n, rc;
};

static void *delayed_set_main(void *arg) {
  struct delayed_set *d = arg;
  for (int i = 0; i < d->n; i++) {
    sleep_s(d->delay);
    int rc = dcomm__store_set(d->s, d->keys[i], "v", 1);
    if (rc < 0) d->rc = rc;
  }
  return NULL;
}

struct blocked_get {
  struct dcomm_store *s;
  const char *key;
  double timeout;
  int rc;
  void *val;
  size_t len;
  double elapsed;
};

static void *blocked_get_main(void *arg) {
  struct blocked_get *g = arg;
  double t0 = dcomm__now();
  g->rc = dcomm__store_get(g->s, g->key, g->timeout, &g->val, &g->len);
  g->elapsed = dcomm__now() - t0;
  return NULL;
}

static void api_wait(struct dcomm_store *a, struct dcomm_store *b) {
  const char *keys[] = {"w1", "w2", "w3"};
  struct delayed_set d = {.s = b, .delay = 0.1, .keys = {"w1", "w2", "w3"}, .n = 3};
  pthread_t th;
  double t0 = dcomm__now();
  ck_assert_int_eq(pthread_create(&th, NULL, delayed_set_main, &d), 0);
  int rc = dcomm__store_wait(a, keys, 3, 10.0);
  double el = dcomm__now() - t0;
  pthread_join(th, NULL);
  ck_assert_msg(rc == 0, "wait returned %d (%s)", rc, dcomm_last_error());
  ck_assert_int_eq(d.rc, 0);
  ck_assert_msg(el >= 0.25 && el < 5.0, "wait returned after %.3f s", el);
  /* One missing key: times out after about the timeout. */
  const char *some[] = {"w1", "missing", "w3"};
  t0 = dcomm__now();
  ck_assert_int_eq(dcomm__store_wait(a, some, 3, 0.4), DCOMM_ETIMEDOUT);
  el = dcomm__now() - t0;
  ck_assert_msg(el >= 0.35 && el < 3.0, "wait timed out after %.3f s", el);
  ok(dcomm__store_wait(a, keys, 0, 0));
  ck_assert_int_eq(dcomm__store_wait(a, keys, -1, 0), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_wait(a, keys, DCOMM_STORE_MAX_WAIT_KEYS + 1, 0), DCOMM_EINVAL);
  /* A deleted key no longer satisfies a wait. */
  ok(dcomm__store_delete(b, "w2", NULL));
  ck_assert_int_eq(dcomm__store_wait(a, keys, 3, 0.1), DCOMM_ETIMEDOUT);
}

static void api_get_timeout(struct dcomm_store *a) {
  void *v = (void *)1;
  size_t n = 1;
  double t0 = dcomm__now();
  ck_assert_int_eq(dcomm__store_get(a, "nobody-sets-this", 0.5, &v, &n), DCOMM_ETIMEDOUT);
  double el = dcomm__now() - t0;
  ck_assert_msg(el >= 0.45 && el < 3.0, "get timed out after %.3f s", el);
  ck_assert_ptr_null(v);
  /* timeout < 0: the handle's default (0.3 s for these handles). */
  t0 = dcomm__now();
  ck_assert_int_eq(dcomm__store_get(a, "nobody-sets-this", -1, &v, &n), DCOMM_ETIMEDOUT);
  el = dcomm__now() - t0;
  ck_assert_msg(el >= 0.25 && el < 3.0, "get with the default timeout returned after %.3f s", el);
  /* The handle still works after timeouts. */
  ok(dcomm__store_set(a, "after-timeout", "ok", 2));
  expect_value(a, "after-timeout", "ok", 2);
}

static void api_get_released(struct dcomm_store *a, struct dcomm_store *b) {
  struct blocked_get g = {.s = a, .key = "late", .timeout = 10.0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, blocked_get_main, &g), 0);
  sleep_s(0.3);
  ok(dcomm__store_set(b, "late", "arrived", 7));
  pthread_join(th, NULL);
  ck_assert_msg(g.rc == 0, "blocked get returned %d", g.rc);
  ck_assert_int_eq(g.len, 7);
  ck_assert_mem_eq(g.val, "arrived", 7);
  ck_assert_msg(g.elapsed >= 0.25 && g.elapsed < 5.0, "blocked get returned after %.3f s", g.elapsed);
  free(g.val);
}

static void api_validation(struct dcomm_store *a, struct dcomm_store *b) {
  void *v;
  size_t n;
  static char longkey[DCOMM_STORE_MAX_KEY + 2];
  char prefix[300];
  ck_assert_int_eq(dcomm__store_set(a, "", "x", 1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_set(a, NULL, "x", 1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_set(a, "k", NULL, 3), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_get(a, "k", 0, NULL, &n), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_get(a, "", 0, &v, &n), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_add(a, "", 1, NULL), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_delete(a, "", NULL), DCOMM_EINVAL);
  memset(longkey, 'k', DCOMM_STORE_MAX_KEY + 1);
  ck_assert_int_eq(dcomm__store_set(a, longkey, "x", 1), DCOMM_EINVAL);
  const char *keys[] = {"ok", longkey};
  ck_assert_int_eq(dcomm__store_wait(a, keys, 2, 0), DCOMM_EINVAL);
  /* The longest key under the longest prefix fits the wire bound. */
  memset(prefix, 'p', 256);
  prefix[256] = 0;
  ck_assert_int_eq(dcomm__store_set_prefix(a, prefix), DCOMM_EINVAL);
  prefix[255] = 0;
  ok(dcomm__store_set_prefix(a, prefix));
  ok(dcomm__store_set_prefix(b, prefix));
  longkey[DCOMM_STORE_MAX_KEY] = 0;
  ok(dcomm__store_set(a, longkey, "long", 4));
  expect_value(b, longkey, "long", 4);
  /* Prefixes separate namespaces. */
  ok(dcomm__store_set_prefix(a, "g0/"));
  ok(dcomm__store_set_prefix(b, "g1/"));
  ok(dcomm__store_set(a, "k", "zero", 4));
  ok(dcomm__store_set(b, "k", "one", 3));
  expect_value(a, "k", "zero", 4);
  expect_value(b, "k", "one", 3);
  ok(dcomm__store_set_prefix(b, ""));
  expect_value(b, "g0/k", "zero", 4);
  expect_value(b, "g1/k", "one", 3);
  expect_absent(b, "k");
  ok(dcomm__store_set_prefix(a, NULL));
  expect_value(a, "g0/k", "zero", 4);
}

static void api_max_value(struct dcomm_store *a, struct dcomm_store *b) {
  /* The caller set DCOMM_STORE_MAX_VALUE=1024 and reloaded the parameters. */
  char *big = malloc(1025);
  void *cur;
  size_t cl;
  for (int i = 0; i < 1025; i++) big[i] = (char)('a' + i % 26);
  ck_assert_int_eq(dcomm__store_set(a, "mv", big, 1025), DCOMM_EINVAL);
  expect_absent(b, "mv");
  ck_assert_int_eq(dcomm__store_compare_set(a, "mv", NULL, 0, big, 1025, &cur, &cl), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__store_compare_set(a, "mv", big, 1025, "x", 1, &cur, &cl), DCOMM_EINVAL);
  expect_absent(b, "mv");
  ok(dcomm__store_set(a, "mv", big, 1024));
  expect_value(b, "mv", big, 1024);
  free(big);
}

/* ---- guarded writes (txn), shared by both implementations ---- */

#define CMP(k, kind) {(k), (kind), NULL, 0}
#define CMPV(k, v) {(k), DCOMM_STORE_EQUAL, (v), sizeof(v) - 1}
#define PUT(k, v) {(k), (v), sizeof(v) - 1}

/* Runs one txn that must succeed as a call; done must be want. */
#define txn_ok(s, cmps, ncmp, puts, nput, want) txn_ok_at(__LINE__, s, cmps, ncmp, puts, nput, want)
static void txn_ok_at(int line, struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                      const struct dcomm_store_put *puts, int nput, int want) {
  int done = -1;
  int rc = dcomm__store_txn(s, cmps, ncmp, puts, nput, &done);
  ck_assert_msg(rc == 0, "line %d: txn returned %d (%s)", line, rc, dcomm_last_error());
  ck_assert_msg(done == want, "line %d: txn done is %d, expected %d", line, done, want);
}

/* A refused txn: DCOMM_EINVAL, *done 0 (when given), nothing written. */
#define txn_einval(s, cmps, ncmp, puts, nput) txn_einval_at(__LINE__, s, cmps, ncmp, puts, nput)
static void txn_einval_at(int line, struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                          const struct dcomm_store_put *puts, int nput) {
  int done = -1;
  int rc = dcomm__store_txn(s, cmps, ncmp, puts, nput, &done);
  ck_assert_msg(rc == DCOMM_EINVAL, "line %d: txn returned %d, expected DCOMM_EINVAL", line, rc);
  ck_assert_msg(done == 0, "line %d: a refused txn left done at %d", line, done);
}

static void api_txn_kinds(struct dcomm_store *a, struct dcomm_store *b) {
  /* ABSENT holds once; then it fails and the put does not happen. */
  struct dcomm_store_cmp absent[] = {CMP("tk", DCOMM_STORE_ABSENT)};
  struct dcomm_store_put one[] = {PUT("tk", "one")}, two[] = {PUT("tk", "two")};
  txn_ok(a, absent, 1, one, 1, 1);
  expect_value(b, "tk", "one", 3);
  txn_ok(b, absent, 1, two, 1, 0);
  expect_value(a, "tk", "one", 3);
  /* EXISTS holds on a present key, fails on an absent one. */
  struct dcomm_store_cmp exists[] = {CMP("tk", DCOMM_STORE_EXISTS)}, exists_not[] = {CMP("tk-none", DCOMM_STORE_EXISTS)};
  txn_ok(b, exists, 1, two, 1, 1);
  expect_value(a, "tk", "two", 3);
  struct dcomm_store_put three_and_new[] = {PUT("tk", "three"), PUT("tk-none", "made")};
  txn_ok(a, exists_not, 1, three_and_new, 2, 0);
  expect_value(b, "tk", "two", 3);
  expect_absent(b, "tk-none");
  /* EQUAL: exact bytes and exact length. */
  struct dcomm_store_cmp eq_miss[][1] = {{CMPV("tk", "one")}, {CMPV("tk", "tw")}, {CMPV("tk", "two!")},
                                         {CMPV("tk", "")},    {CMPV("tk", "TWO")}, {CMPV("tk-none", "two")}};
  for (size_t i = 0; i < sizeof(eq_miss) / sizeof(eq_miss[0]); i++) {
    txn_ok(a, eq_miss[i], 1, three_and_new, 2, 0);
    expect_value(b, "tk", "two", 3);
    expect_absent(b, "tk-none");
  }
  struct dcomm_store_cmp eq[] = {CMPV("tk", "two")};
  txn_ok(a, eq, 1, three_and_new, 2, 1);
  expect_value(b, "tk", "three", 5);
  expect_value(b, "tk-none", "made", 4);
  txn_ok(b, eq, 1, two, 1, 0); /* the value it compared against is gone */
  expect_value(a, "tk", "three", 5);
  /* Binary values with NUL bytes compare in full. */
  const char bin[] = {'g', 0, 'x', 0, (char)0xff};
  const char bin2[] = {'g', 0, 'y', 0, (char)0xff};
  ok(dcomm__store_set(a, "tbin", bin, sizeof(bin)));
  struct dcomm_store_cmp eq_bin2[] = {{"tbin", DCOMM_STORE_EQUAL, bin2, sizeof(bin2)}};
  struct dcomm_store_cmp eq_bin[] = {{"tbin", DCOMM_STORE_EQUAL, bin, sizeof(bin)}};
  struct dcomm_store_put mark[] = {PUT("tbin-ok", "1")};
  txn_ok(b, eq_bin2, 1, mark, 1, 0);
  expect_absent(a, "tbin-ok");
  txn_ok(b, eq_bin, 1, mark, 1, 1);
  expect_value(a, "tbin-ok", "1", 1);
  /* No compare at all: the puts just happen. */
  struct dcomm_store_put free_put[] = {PUT("tk-free", "x")};
  txn_ok(b, NULL, 0, free_put, 1, 1);
  expect_value(a, "tk-free", "x", 1);
  /* A deleted key is absent again: ABSENT holds, EXISTS fails. */
  ok(dcomm__store_delete(a, "tk", NULL));
  struct dcomm_store_put again[] = {PUT("tk", "again")};
  txn_ok(b, exists, 1, again, 1, 0);
  expect_absent(a, "tk");
  txn_ok(b, absent, 1, again, 1, 1);
  expect_value(a, "tk", "again", 5);
}

static void api_txn_all_or_nothing(struct dcomm_store *a, struct dcomm_store *b) {
  ok(dcomm__store_set(a, "gen", "5", 1));
  ok(dcomm__store_set(a, "node/0", "alive", 5));
  struct dcomm_store_cmp good[DCOMM_STORE_TXN_MAX] = {
      CMPV("gen", "5"),         CMP("node/0", DCOMM_STORE_EXISTS), CMP("plan/6", DCOMM_STORE_ABSENT),
      CMPV("node/0", "alive"),  CMP("n/4", DCOMM_STORE_ABSENT),    CMP("n/5", DCOMM_STORE_ABSENT),
      CMP("n/6", DCOMM_STORE_ABSENT), CMP("gen", DCOMM_STORE_EXISTS)};
  /* For each position, a compare there that fails. */
  const struct dcomm_store_cmp bad[DCOMM_STORE_TXN_MAX] = {
      CMPV("gen", "4"),         CMP("node/1", DCOMM_STORE_EXISTS), CMP("node/0", DCOMM_STORE_ABSENT),
      CMPV("node/0", "alivE"),  CMP("gen", DCOMM_STORE_ABSENT),    CMPV("gen", "55"),
      CMPV("gen", ""),          CMP("nothing", DCOMM_STORE_EXISTS)};
  struct dcomm_store_put puts[DCOMM_STORE_TXN_MAX] = {PUT("gen", "6"),   PUT("plan/6", "p6"), PUT("x/2", "v2"),
                                                      PUT("x/3", "v3"),  PUT("x/4", "v4"),    PUT("x/5", "v5"),
                                                      PUT("x/6", "v6"),  PUT("x/7", "v7")};
  for (int i = 0; i < DCOMM_STORE_TXN_MAX; i++) {
    struct dcomm_store_cmp c[DCOMM_STORE_TXN_MAX];
    memcpy(c, good, sizeof(c));
    c[i] = bad[i];
    txn_ok(b, c, DCOMM_STORE_TXN_MAX, puts, DCOMM_STORE_TXN_MAX, 0);
    /* Fewer compares, the failing one last: still nothing. */
    txn_ok(a, c, i + 1, puts, DCOMM_STORE_TXN_MAX, 0);
    expect_value(a, "gen", "5", 1);
    for (int j = 1; j < DCOMM_STORE_TXN_MAX; j++) expect_absent(a, puts[j].key);
  }
  /* Every compare holds: every put is visible, to both handles. */
  txn_ok(b, good, DCOMM_STORE_TXN_MAX, puts, DCOMM_STORE_TXN_MAX, 1);
  for (int j = 0; j < DCOMM_STORE_TXN_MAX; j++) {
    expect_value(a, puts[j].key, puts[j].val, puts[j].len);
    expect_value(b, puts[j].key, puts[j].val, puts[j].len);
  }
  expect_value(a, "node/0", "alive", 5); /* compared keys are left alone */
  /* The same txn again: gen moved on and plan/6 exists now. */
  struct dcomm_store_put later[] = {PUT("gen", "7"), PUT("plan/6", "late")};
  txn_ok(a, good, DCOMM_STORE_TXN_MAX, later, 2, 0);
  expect_value(b, "gen", "6", 1);
  expect_value(b, "plan/6", "p6", 2);
}

static void api_txn_prefix(struct dcomm_store *a, struct dcomm_store *b) {
  /* b, without a prefix, writes what a (prefix "job7/") sees as "gen". */
  ok(dcomm__store_set_prefix(a, "job7/"));
  ok(dcomm__store_set(b, "job7/gen", "3", 1));
  ok(dcomm__store_set(b, "gen", "999", 3));
  struct dcomm_store_cmp lead[] = {CMPV("gen", "3"), CMP("plan/4", DCOMM_STORE_ABSENT)};
  struct dcomm_store_put step[] = {PUT("gen", "4"), PUT("plan/4", "p4")};
  txn_ok(a, lead, 2, step, 2, 1);
  expect_value(b, "job7/gen", "4", 1);
  expect_value(b, "job7/plan/4", "p4", 2);
  expect_value(b, "gen", "999", 3); /* the unprefixed key is another key */
  expect_absent(b, "plan/4");
  expect_value(a, "gen", "4", 1);
  /* a's "gen" is job7/gen: the unprefixed value does not match it. */
  struct dcomm_store_cmp other[] = {CMPV("gen", "999")};
  struct dcomm_store_put px[] = {PUT("plan/x", "x")};
  txn_ok(a, other, 1, px, 1, 0);
  expect_absent(b, "job7/plan/x");
  expect_absent(b, "plan/x");
  /* plan/4 exists under job7/ only. */
  txn_ok(a, lead + 1, 1, px, 1, 0);
  expect_absent(b, "job7/plan/x");
  struct dcomm_store_put po[] = {PUT("plan/4", "o")};
  txn_ok(b, lead + 1, 1, po, 1, 1);
  expect_value(b, "plan/4", "o", 1);
  expect_value(a, "plan/4", "p4", 2);
  /* The other way round: b (prefix "job7/node/") sets a key that a, with
   * no prefix, compares on under its full name. */
  ok(dcomm__store_set_prefix(b, "job7/node/"));
  ok(dcomm__store_set(b, "3", "up", 2));
  ok(dcomm__store_set_prefix(a, ""));
  struct dcomm_store_cmp node_full[] = {CMP("job7/node/3", DCOMM_STORE_EXISTS), CMPV("job7/gen", "4")};
  struct dcomm_store_cmp node_bare[] = {CMP("3", DCOMM_STORE_EXISTS)};
  struct dcomm_store_put p5[] = {PUT("job7/gen", "5")};
  txn_ok(a, node_bare, 1, p5, 1, 0);
  expect_value(a, "job7/gen", "4", 1);
  txn_ok(a, node_full, 2, p5, 1, 1);
  expect_value(a, "job7/gen", "5", 1);
  /* b's own compare on "3" is job7/node/3; its put lands under its prefix. */
  struct dcomm_store_put bput[] = {PUT("3-seen", "y")};
  txn_ok(b, node_bare, 1, bput, 1, 1);
  expect_value(a, "job7/node/3-seen", "y", 1);
  expect_absent(a, "3-seen");
  ok(dcomm__store_set_prefix(b, ""));
}

static void api_txn_empty_value(struct dcomm_store *a, struct dcomm_store *b) {
  ok(dcomm__store_set(a, "ev", "", 0));
  /* EQUAL "" holds on an empty value, with or without a buffer. */
  struct dcomm_store_cmp eq_empty[] = {CMPV("ev", "")};
  struct dcomm_store_cmp eq_null[] = {{"ev", DCOMM_STORE_EQUAL, NULL, 0}};
  struct dcomm_store_put r1[] = {PUT("ev-r1", "1")}, r2[] = {PUT("ev-r2", "2")}, r3[] = {PUT("ev-r3", "3")};
  txn_ok(b, eq_empty, 1, r1, 1, 1);
  expect_value(a, "ev-r1", "1", 1);
  txn_ok(b, eq_null, 1, r2, 1, 1);
  expect_value(a, "ev-r2", "2", 1);
  /* ... but not on an absent key, which has no value at all. */
  struct dcomm_store_cmp eq_absent[] = {CMPV("ev-absent", "")};
  struct dcomm_store_cmp eq_absent_null[] = {{"ev-absent", DCOMM_STORE_EQUAL, NULL, 0}};
  txn_ok(b, eq_absent, 1, r3, 1, 0);
  txn_ok(b, eq_absent_null, 1, r3, 1, 0);
  expect_absent(a, "ev-r3");
  /* An empty value exists; it is not equal to a non-empty one. */
  struct dcomm_store_cmp ex[] = {CMP("ev", DCOMM_STORE_EXISTS)}, ab[] = {CMP("ev", DCOMM_STORE_ABSENT)};
  struct dcomm_store_cmp eq_x[] = {CMPV("ev", "x")};
  txn_ok(a, ab, 1, r3, 1, 0);
  txn_ok(a, eq_x, 1, r3, 1, 0);
  expect_absent(b, "ev-r3");
  txn_ok(a, ex, 1, r3, 1, 1);
  expect_value(b, "ev-r3", "3", 1);
  /* A txn can write an empty value, which then exists and equals "". */
  struct dcomm_store_cmp pe_absent[] = {CMP("pe", DCOMM_STORE_ABSENT)};
  struct dcomm_store_put pe[] = {{"pe", NULL, 0}}, pe_x[] = {PUT("pe", "x")};
  txn_ok(a, pe_absent, 1, pe, 1, 1);
  expect_value(b, "pe", "", 0);
  txn_ok(b, pe_absent, 1, pe_x, 1, 0);
  struct dcomm_store_cmp pe_eq[] = {CMPV("pe", ""), CMP("pe", DCOMM_STORE_EXISTS)};
  txn_ok(b, pe_eq, 2, pe_x, 1, 1);
  expect_value(a, "pe", "x", 1);
}

static void api_txn_validation(struct dcomm_store *a) {
  static const char *ck[DCOMM_STORE_TXN_MAX + 1] = {"v/c0", "v/c1", "v/c2", "v/c3", "v/c4",
                                                    "v/c5", "v/c6", "v/c7", "v/c8"};
  static const char *pk[DCOMM_STORE_TXN_MAX + 1] = {"v/p0", "v/p1", "v/p2", "v/p3", "v/p4",
                                                    "v/p5", "v/p6", "v/p7", "v/p8"};
  static char longkey[DCOMM_STORE_MAX_KEY + 2];
  memset(longkey, 'k', DCOMM_STORE_MAX_KEY + 1);
  struct dcomm_store_cmp c[DCOMM_STORE_TXN_MAX + 1];
  struct dcomm_store_put p[DCOMM_STORE_TXN_MAX + 1];
  for (int i = 0; i <= DCOMM_STORE_TXN_MAX; i++) {
    c[i] = (struct dcomm_store_cmp){ck[i], DCOMM_STORE_ABSENT, NULL, 0}; /* all hold */
    p[i] = (struct dcomm_store_put){pk[i], "x", 1};
  }
  /* Counts. */
  txn_einval(a, c, DCOMM_STORE_TXN_MAX + 1, p, 1);
  txn_einval(a, c, 200, p, 1);
  txn_einval(a, c, -1, p, 1);
  txn_einval(a, c, 1, p, 0);
  txn_einval(a, c, 0, p, 0);
  txn_einval(a, c, 1, p, -1);
  txn_einval(a, c, 1, p, DCOMM_STORE_TXN_MAX + 1);
  txn_einval(a, NULL, 1, p, 1);
  txn_einval(a, c, 1, NULL, 1);
  txn_einval(a, NULL, 0, NULL, 1);
  /* Kinds: out of range anywhere in the list. */
  int kinds[] = {3, 9, -1, 255};
  for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
    c[2].kind = kinds[k];
    txn_einval(a, c, 3, p, 2);
    txn_einval(a, c + 2, 1, p, 2);
  }
  c[2].kind = DCOMM_STORE_ABSENT;
  /* Keys and values. */
  c[1].key = "";
  txn_einval(a, c, 2, p, 1);
  c[1].key = NULL;
  txn_einval(a, c, 2, p, 1);
  c[1].key = longkey;
  txn_einval(a, c, 2, p, 1);
  c[1] = (struct dcomm_store_cmp){ck[1], DCOMM_STORE_EQUAL, NULL, 3};
  txn_einval(a, c, 2, p, 1);
  c[1] = (struct dcomm_store_cmp){ck[1], DCOMM_STORE_ABSENT, NULL, 0};
  p[1].key = "";
  txn_einval(a, c, 2, p, 2);
  p[1].key = NULL;
  txn_einval(a, c, 2, p, 2);
  p[1].key = longkey;
  txn_einval(a, c, 2, p, 2);
  p[1] = (struct dcomm_store_put){pk[1], NULL, 4};
  txn_einval(a, c, 2, p, 2);
  p[1] = (struct dcomm_store_put){pk[1], "x", 1};
  /* No done, no handle. */
  ck_assert_int_eq(dcomm__store_txn(a, c, 1, p, 1, NULL), DCOMM_EINVAL);
  int done = -1;
  ck_assert_int_eq(dcomm__store_txn(NULL, c, 1, p, 1, &done), DCOMM_EINVAL);
  for (int i = 0; i <= DCOMM_STORE_TXN_MAX; i++) expect_absent(a, pk[i]);
  /* The limits themselves are fine, and the handle still works. */
  txn_ok(a, c, DCOMM_STORE_TXN_MAX, p, DCOMM_STORE_TXN_MAX, 1);
  for (int i = 0; i < DCOMM_STORE_TXN_MAX; i++) expect_value(a, pk[i], "x", 1);
  expect_absent(a, pk[DCOMM_STORE_TXN_MAX]);
}

static void api_txn_max_value(struct dcomm_store *a, struct dcomm_store *b) {
  /* The caller set DCOMM_STORE_MAX_VALUE=1024: a put or a compared value
   * over it is refused before anything is written. */
  char *big = malloc(1025);
  for (int i = 0; i < 1025; i++) big[i] = (char)('a' + i % 26);
  struct dcomm_store_put bigput[] = {{"mv-txn", big, 1025}}, small[] = {PUT("mv-txn", "s")};
  struct dcomm_store_cmp bigcmp[] = {{"mv-txn-c", DCOMM_STORE_EQUAL, big, 1025}};
  txn_einval(a, NULL, 0, bigput, 1);
  txn_einval(a, bigcmp, 1, small, 1);
  expect_absent(b, "mv-txn");
  bigput[0].len = 1024;
  txn_ok(a, NULL, 0, bigput, 1, 1);
  expect_value(b, "mv-txn", big, 1024);
  bigcmp[0] = (struct dcomm_store_cmp){"mv-txn", DCOMM_STORE_EQUAL, big, 1024};
  txn_ok(b, bigcmp, 1, small, 1, 1);
  expect_value(a, "mv-txn", "s", 1);
  free(big);
}

static void api_txn_releases_get(struct dcomm_store *a, struct dcomm_store *b) {
  struct blocked_get g = {.s = a, .key = "txn-late", .timeout = 10.0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, blocked_get_main, &g), 0);
  sleep_s(0.2);
  /* A txn whose compare fails does not put the key, so the get goes on. */
  struct dcomm_store_cmp fails[] = {CMP("txn-nobody", DCOMM_STORE_EXISTS)};
  struct dcomm_store_put wrong[] = {PUT("txn-late", "wrong")};
  txn_ok(b, fails, 1, wrong, 1, 0);
  sleep_s(0.1);
  struct dcomm_store_cmp holds[] = {CMP("txn-late", DCOMM_STORE_ABSENT)};
  struct dcomm_store_put right[] = {PUT("txn-other", "o"), PUT("txn-late", "by-txn")};
  txn_ok(b, holds, 1, right, 2, 1);
  double t1 = dcomm__now();
  pthread_join(th, NULL);
  /* Woken by the txn itself, not by some periodic recheck. */
  double lag = dcomm__now() - t1;
  ck_assert_msg(g.rc == 0, "blocked get returned %d", g.rc);
  ck_assert_msg(g.len == 6 && memcmp(g.val, "by-txn", 6) == 0, "blocked get saw '%.*s'", (int)g.len, (char *)g.val);
  ck_assert_msg(g.elapsed >= 0.25 && g.elapsed < 5.0, "blocked get returned after %.3f s", g.elapsed);
  ck_assert_msg(lag < 0.5, "blocked get returned %.3f s after the txn that put its key", lag);
  free(g.val);
  expect_value(a, "txn-other", "o", 1);
}

/* ---- TCP store: fixture and raw-socket helpers ---- */

static struct dcomm_store_server *srv;
static int port;

static void server_setup(void) {
  int rc = dcomm__store_server_start("127.0.0.1", 0, JOB, TOKEN, &srv);
  ck_assert_msg(rc == 0, "server start: %s", dcomm_last_error());
  port = dcomm__store_server_port(srv);
  ck_assert_int_gt(port, 0);
}

static void server_teardown(void) {
  dcomm__store_server_stop(srv);
  srv = NULL;
}

static struct dcomm_store *client_t(double timeout) {
  struct dcomm_store *s = NULL;
  int rc = dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 5.0, timeout, &s);
  ck_assert_msg(rc == 0, "connect: %d (%s)", rc, dcomm_last_error());
  ck_assert_str_eq(s->ops->name, "tcp");
  return s;
}

static struct dcomm_store *client(void) { return client_t(0.3); }

/* A raw connection; with a job id it first runs the client handshake. */
static int raw_connect(const char *job, const char *token, uint32_t purpose, int *hs_rc) {
  int fd = -1;
  ok(dcomm__sock_connect("127.0.0.1", port, dcomm__now() + 5, &fd));
  if (job) {
    int rc = dcomm__hs_client(fd, job, token, purpose, NULL, 0, dcomm__now() + 5);
    if (hs_rc) *hs_rc = rc;
    else ck_assert_msg(rc == 0, "raw handshake: %s", dcomm_last_error());
  }
  return fd;
}

static int raw_store(void) { return raw_connect(JOB, TOKEN, DCOMM_HS_STORE, NULL); }

static void raw_send(int fd, const void *buf, size_t n) {
  ok(dcomm__sock_send_all(fd, buf, n, dcomm__now() + 5, -1));
}

/* Reads one answer's status (and error text); 1 when the server closed. */
static int raw_status(int fd, double timeout) {
  unsigned char b[4], h[3];
  char msg[DCOMM_STORE_MAX_ERRMSG + 1];
  double dl = dcomm__now() + timeout;
  int rc = dcomm__sock_recv_all(fd, b, 4, dl, -1);
  if (rc == DCOMM_EPEERLOST) return 1;
  ck_assert_msg(rc == 0, "no answer from the server: %s", dcomm_last_error());
  int32_t st = (int32_t)dcomm__store_get_u32(b);
  if (st < 0) {
    ok(dcomm__sock_recv_all(fd, h, 3, dl, -1));
    size_t ml = (size_t)h[1] << 8 | h[2];
    ck_assert_uint_le(ml, DCOMM_STORE_MAX_ERRMSG);
    ok(dcomm__sock_recv_all(fd, msg, ml, dl, -1));
  }
  return st;
}

/* 1 when the server closes the connection within timeout (data discarded). */
static int raw_eof(int fd, double timeout) {
  double dl = dcomm__now() + timeout;
  char buf[512];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
    if (n > 0) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, dcomm__ms_until(dl)) == 0) return 0;
  }
}

/* A fresh authorized client still reads what was stored and can write. */
static void expect_server_serves(const char *key, const char *val) {
  struct dcomm_store *s = client();
  expect_value(s, key, val, strlen(val));
  ok(dcomm__store_set(s, "alive", "yes", 3));
  expect_value(s, "alive", "yes", 3);
  dcomm__store_close(s);
}

static size_t put_str(unsigned char *p, const void *b, uint32_t n) {
  dcomm__store_put_u32(p, n);
  memcpy(p + 4, b, n);
  return 4 + n;
}

/* ---- TCP tests ---- */

START_TEST(tcp_basic) {
  struct dcomm_store *a = client(), *b = client();
  api_basic(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_compare_set) {
  struct dcomm_store *a = client(), *b = client();
  api_compare_set(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_wait) {
  struct dcomm_store *a = client(), *b = client();
  api_wait(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_get_timeout) {
  struct dcomm_store *a = client();
  api_get_timeout(a);
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_get_released_by_other_client) {
  struct dcomm_store *a = client(), *b = client();
  api_get_released(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_validation_and_prefix) {
  struct dcomm_store *a = client(), *b = client();
  api_validation(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_max_value) {
  set_max_value("1024");
  struct dcomm_store *a = client(), *b = client();
  api_max_value(a, b);
  /* The server enforces the bound itself, without reading the value. */
  int fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "raw-big", 7);
  p = dcomm__store_put_u32(p, 2000);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EINVAL);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  expect_absent(b, "raw-big");
  api_txn_max_value(a, b);
  /* A txn value over the bound on the wire is refused unread as well. */
  fd = raw_store();
  p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_TXN);
  p = dcomm__store_put_u8(p, 0);
  p = dcomm__store_put_u8(p, 1);
  p += put_str(p, "raw-big-txn", 11);
  p = dcomm__store_put_u32(p, 2000);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EINVAL);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  expect_absent(b, "raw-big-txn");
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

struct adder {
  struct dcomm_store *shared; /* NULL: connect or open an own handle */
  const char *path;           /* file store path, or NULL for TCP */
  int iters, rc;
  int64_t *results;
};

static void *adder_main(void *arg) {
  struct adder *ad = arg;
  struct dcomm_store *s = ad->shared;
  int rc = 0;
  if (!s) {
    if (ad->path) rc = dcomm__store_file_open(ad->path, 10.0, &s);
    else rc = dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 5.0, 10.0, &s);
  }
  for (int i = 0; rc == 0 && i < ad->iters; i++) rc = dcomm__store_add(s, "counter", 1, &ad->results[i]);
  if (s && !ad->shared) dcomm__store_close(s);
  ad->rc = rc;
  return NULL;
}

static int cmp64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return (a > b) - (a < b);
}

/* Runs nthreads adders (the first nshared on one shared handle) and checks
 * that every add saw a distinct value. */
static void run_adders(struct dcomm_store *shared, const char *fpath, int nthreads, int nshared, int iters) {
  pthread_t th[32];
  struct adder ad[32];
  int64_t *res = calloc((size_t)(nthreads * iters), sizeof(*res));
  for (int i = 0; i < nthreads; i++) {
    ad[i] = (struct adder){.shared = i < nshared ? shared : NULL, .path = fpath, .iters = iters, .results = res + i * iters};
    ck_assert_int_eq(pthread_create(&th[i], NULL, adder_main, &ad[i]), 0);
  }
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < nthreads; i++) ck_assert_msg(ad[i].rc == 0, "adder %d failed with %d", i, ad[i].rc);
  int total = nthreads * iters;
  qsort(res, (size_t)total, sizeof(*res), cmp64);
  for (int i = 1; i < total; i++) ck_assert_msg(res[i] != res[i - 1], "two adds returned %lld", (long long)res[i]);
  free(res);
}

/* The counter is exact, both as add's result and as the stored text. */
static void expect_counter(struct dcomm_store *s, int64_t want) {
  int64_t final = -1;
  ok(dcomm__store_add(s, "counter", 0, &final));
  ck_assert_int_eq(final, want);
  char txt[32];
  snprintf(txt, sizeof(txt), "%lld", (long long)want);
  expect_value(s, "counter", txt, strlen(txt));
}

/* The fencing race: every racer reads elastic/gen, then (all having read
 * the same value) tries "compare EQUAL what I read, put gen+1 and
 * plan/<gen+1>". Rounds are separated by barriers, so in each round all
 * racers start from the same value and exactly one may win. */
#define RACERS 8
#define RACE_ROUNDS 30

struct racer {
  struct dcomm_store *shared; /* NULL: connect or open an own handle */
  const char *path;           /* file store path, or NULL for TCP */
  pthread_barrier_t *bar;
  int id, rc;
  long read_gen[RACE_ROUNDS];
  int won[RACE_ROUNDS];
};

/* The guarded step from the value v (n bytes) read for elastic/gen: 1 won,
 * 0 lost, < 0 error; *g is the generation that was read. */
static int race_try(struct dcomm_store *s, int id, const void *v, size_t n, long *g) {
  char txt[32], next[32], pkey[64], me[32];
  snprintf(txt, sizeof(txt), "%.*s", (int)(n < 31 ? n : 31), (const char *)v);
  *g = strtol(txt, NULL, 10);
  int nl = snprintf(next, sizeof(next), "%ld", *g + 1);
  snprintf(pkey, sizeof(pkey), "elastic/plan/%ld", *g + 1);
  int ml = snprintf(me, sizeof(me), "racer %d", id);
  struct dcomm_store_cmp c = {"elastic/gen", DCOMM_STORE_EQUAL, v, n};
  struct dcomm_store_put p[2] = {{"elastic/gen", next, (size_t)nl}, {pkey, me, (size_t)ml}};
  int done = -1;
  int rc = dcomm__store_txn(s, &c, 1, p, 2, &done);
  return rc < 0 ? rc : done;
}

static void *racer_main(void *arg) {
  struct racer *r = arg;
  struct dcomm_store *s = r->shared;
  int rc = 0;
  if (!s) {
    if (r->path) rc = dcomm__store_file_open(r->path, 10.0, &s);
    else rc = dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 5.0, 10.0, &s);
  }
  for (int i = 0; i < RACE_ROUNDS; i++) {
    /* Even after a failure every barrier is passed, so no one hangs. */
    pthread_barrier_wait(r->bar);
    void *v = NULL;
    size_t n = 0;
    if (rc == 0) rc = dcomm__store_get(s, "elastic/gen", 5.0, &v, &n);
    pthread_barrier_wait(r->bar); /* everyone has read before anyone writes */
    if (rc == 0) {
      int won = race_try(s, r->id, v, n, &r->read_gen[i]);
      if (won < 0) rc = won;
      else r->won[i] = won;
    }
    free(v);
  }
  if (s && !r->shared) dcomm__store_close(s);
  r->rc = rc;
  return NULL;
}

/* Watches the race from its own handle: whenever elastic/gen is k > 0,
 * elastic/plan/k, written by the same txn, must already be there. */
struct observer {
  const char *path;
  volatile int stop;
  int rc, looks, torn;
  long torn_gen;
};

static void *observer_main(void *arg) {
  struct observer *o = arg;
  struct dcomm_store *s = NULL;
  int rc = o->path ? dcomm__store_file_open(o->path, 10.0, &s)
                   : dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 5.0, 10.0, &s);
  while (rc == 0 && !o->stop) {
    void *v = NULL, *pv = NULL;
    size_t n = 0, pn = 0;
    rc = dcomm__store_get(s, "elastic/gen", 5.0, &v, &n);
    if (rc < 0) break;
    char txt[32], pkey[64];
    snprintf(txt, sizeof(txt), "%.*s", (int)(n < 31 ? n : 31), (char *)v);
    free(v);
    long k = strtol(txt, NULL, 10);
    if (k <= 0) continue;
    snprintf(pkey, sizeof(pkey), "elastic/plan/%ld", k);
    int prc = dcomm__store_get(s, pkey, 0, &pv, &pn);
    free(pv);
    if (prc == DCOMM_ETIMEDOUT) {
      if (!o->torn++) o->torn_gen = k;
    } else if (prc < 0) {
      rc = prc;
    }
    o->looks++;
  }
  if (s) dcomm__store_close(s);
  o->rc = rc;
  return NULL;
}

/* Runs RACERS racers (the first nshared on one shared handle) for
 * RACE_ROUNDS rounds from elastic/gen = "0" and checks one winner a round,
 * whose plan is the one stored. */
static void run_race(struct dcomm_store *shared, const char *fpath, int nshared) {
  pthread_t th[RACERS];
  struct racer *r = calloc(RACERS, sizeof(*r));
  pthread_barrier_t bar;
  ck_assert_int_eq(pthread_barrier_init(&bar, NULL, RACERS), 0);
  ok(dcomm__store_set(shared, "elastic/gen", "0", 1));
  struct observer obs = {.path = fpath};
  pthread_t oth;
  ck_assert_int_eq(pthread_create(&oth, NULL, observer_main, &obs), 0);
  for (int i = 0; i < RACERS; i++) {
    r[i] = (struct racer){.shared = i < nshared ? shared : NULL, .path = fpath, .bar = &bar, .id = i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, racer_main, &r[i]), 0);
  }
  for (int i = 0; i < RACERS; i++) pthread_join(th[i], NULL);
  obs.stop = 1;
  pthread_join(oth, NULL);
  pthread_barrier_destroy(&bar);
  for (int i = 0; i < RACERS; i++) ck_assert_msg(r[i].rc == 0, "racer %d failed with %d", i, r[i].rc);
  ck_assert_msg(obs.rc == 0, "the observer failed with %d", obs.rc);
  ck_assert_msg(!obs.torn, "%d times a txn was seen half done (elastic/gen %ld without its plan)", obs.torn,
                obs.torn_gen);
  for (int k = 0; k < RACE_ROUNDS; k++) {
    int wins = 0, winner = -1;
    for (int i = 0; i < RACERS; i++) {
      ck_assert_msg(r[i].read_gen[k] == k, "round %d: racer %d read gen %ld", k, i, r[i].read_gen[k]);
      ck_assert_msg(r[i].won[k] == 0 || r[i].won[k] == 1, "round %d: racer %d: done %d", k, i, r[i].won[k]);
      if (r[i].won[k]) wins++, winner = i;
    }
    ck_assert_msg(wins == 1, "round %d: %d racers won the same generation", k, wins);
    char pkey[64], want[32];
    snprintf(pkey, sizeof(pkey), "elastic/plan/%d", k + 1);
    snprintf(want, sizeof(want), "racer %d", winner);
    expect_value(shared, pkey, want, strlen(want)); /* no loser's plan over it */
  }
  char final[32];
  snprintf(final, sizeof(final), "%d", RACE_ROUNDS);
  expect_value(shared, "elastic/gen", final, strlen(final));
  snprintf(final, sizeof(final), "elastic/plan/%d", RACE_ROUNDS + 1);
  expect_absent(shared, final);
  free(r);
}

START_TEST(tcp_concurrent_add) {
  struct dcomm_store *s = client_t(10.0);
  run_adders(s, NULL, 16, 4, 150);
  expect_counter(s, 16 * 150);
  dcomm__store_close(s);
}
END_TEST

START_TEST(tcp_txn_kinds) {
  struct dcomm_store *a = client(), *b = client();
  api_txn_kinds(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_txn_all_or_nothing) {
  struct dcomm_store *a = client(), *b = client();
  api_txn_all_or_nothing(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_txn_prefix) {
  struct dcomm_store *a = client(), *b = client();
  api_txn_prefix(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_txn_empty_value) {
  struct dcomm_store *a = client(), *b = client();
  api_txn_empty_value(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_txn_validation) {
  struct dcomm_store *a = client();
  api_txn_validation(a);
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_txn_releases_get) {
  struct dcomm_store *a = client(), *b = client();
  api_txn_releases_get(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(tcp_txn_race) {
  struct dcomm_store *s = client_t(10.0);
  run_race(s, NULL, 2);
  dcomm__store_close(s);
}
END_TEST

/* Sends a raw frame and checks the server answers DCOMM_EPROTO and closes. */
static void expect_txn_frame_refused(const unsigned char *f, size_t n, int half_close) {
  int fd = raw_store();
  raw_send(fd, f, n);
  if (half_close) shutdown(fd, SHUT_WR);
  int st = raw_status(fd, 5);
  ck_assert_msg(st == DCOMM_EPROTO || (half_close && st == 1), "malformed txn frame answered %d", st);
  ck_assert_msg(raw_eof(fd, 5), "the server kept the connection of a malformed txn frame");
  close(fd);
}

START_TEST(tcp_txn_wire) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  /* A well-formed raw txn: status 0 then the done byte; the connection
   * stays usable for the next request. */
  int fd = raw_store();
  unsigned char f[256], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_TXN);
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, DCOMM_STORE_ABSENT);
  p += put_str(p, "raw-a", 5);
  p += put_str(p, "", 0);
  p = dcomm__store_put_u8(p, 1);
  p += put_str(p, "raw-a", 5);
  p += put_str(p, "va", 2);
  unsigned char done = 9;
  for (int i = 0; i < 2; i++) {
    raw_send(fd, f, (size_t)(p - f));
    ck_assert_int_eq(raw_status(fd, 5), 0);
    ok(dcomm__sock_recv_all(fd, &done, 1, dcomm__now() + 5, -1));
    ck_assert_msg(done == (i == 0), "raw txn %d: done %u", i, done); /* the second time raw-a exists */
  }
  close(fd);
  expect_value(a, "raw-a", "va", 2);
  /* Too many compares (200 and 9), kind 9 and kind 3 (after a good
   * compare), no puts, too many puts, an empty compare key. Each frame is
   * sent exactly up to the byte the server refuses. */
  unsigned char m[64];
  p = m;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_TXN);
  p = dcomm__store_put_u8(p, 200);
  expect_txn_frame_refused(m, (size_t)(p - m), 0);
  m[1] = DCOMM_STORE_TXN_MAX + 1;
  expect_txn_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, 9);
  expect_txn_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 2);
  p = dcomm__store_put_u8(p, DCOMM_STORE_ABSENT);
  p += put_str(p, "raw-b", 5);
  p += put_str(p, "", 0);
  p = dcomm__store_put_u8(p, 3);
  expect_txn_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 0);
  p = dcomm__store_put_u8(p, 0);
  expect_txn_frame_refused(m, (size_t)(p - m), 0);
  m[2] = DCOMM_STORE_TXN_MAX + 1;
  expect_txn_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, DCOMM_STORE_EXISTS);
  p = dcomm__store_put_u32(p, 0);
  expect_txn_frame_refused(m, (size_t)(p - m), 0);
  /* A truncated txn whose compares hold: its first put does not happen. */
  p = m + 1;
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, DCOMM_STORE_ABSENT);
  p += put_str(p, "raw-t", 5);
  p += put_str(p, "", 0);
  p = dcomm__store_put_u8(p, 2);
  p += put_str(p, "raw-t", 5);
  p += put_str(p, "ok", 2);
  p += put_str(p, "raw-t2", 6);
  p = dcomm__store_put_u32(p, 10); /* 10 value bytes promised, 3 sent */
  memcpy(p, "abc", 3);
  p += 3;
  expect_txn_frame_refused(m, (size_t)(p - m), 1);
  expect_absent(a, "raw-t");
  expect_absent(a, "raw-t2");
  expect_absent(a, "raw-b");
  /* The client connected all along still works, and so does a new one. */
  expect_value(a, "keep", "intact", 6);
  struct dcomm_store_cmp c[] = {CMPV("keep", "intact")};
  struct dcomm_store_put pt[] = {PUT("after", "yes")};
  txn_ok(a, c, 1, pt, 1, 1);
  expect_server_serves("after", "yes");
  dcomm__store_close(a);
}
END_TEST

static void check_refused_cannot_write(const char *job, const char *token, uint32_t purpose, int want_rc) {
  struct dcomm_store *s = (void *)1;
  int rc = dcomm__store_tcp_connect("127.0.0.1", port, job, token, 2.0, 1.0, &s);
  if (purpose == DCOMM_HS_STORE) {
    ck_assert_msg(rc == want_rc, "connect returned %d, expected %d", rc, want_rc);
    ck_assert_ptr_null(s);
  } else if (rc == 0) {
    dcomm__store_close(s);
  }
  /* A raw peer that ignores the refusal and sends a request anyway. */
  int hs = 0;
  int fd = raw_connect(job, token, purpose, &hs);
  ck_assert_int_eq(hs, want_rc);
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "intruder", 8);
  p += put_str(p, "evil", 4);
  send(fd, f, (size_t)(p - f), MSG_NOSIGNAL); /* may fail: the server hangs up */
  ck_assert_msg(raw_eof(fd, 5), "the server did not close a refused connection");
  close(fd);
  struct dcomm_store *good = client();
  expect_absent(good, "intruder");
  dcomm__store_close(good);
}

START_TEST(tcp_job_mismatch) { check_refused_cannot_write("another-job", TOKEN, DCOMM_HS_STORE, DCOMM_EAUTH); }
END_TEST

START_TEST(tcp_wrong_token) {
  check_refused_cannot_write(JOB, "wrong-token", DCOMM_HS_STORE, DCOMM_EAUTH);
  check_refused_cannot_write(JOB, NULL, DCOMM_HS_STORE, DCOMM_EAUTH);
}
END_TEST

START_TEST(tcp_wrong_purpose) {
  /* A peer-link handshake passes authentication but is not a store client. */
  check_refused_cannot_write(JOB, TOKEN, DCOMM_HS_PEER, 0);
}
END_TEST

START_TEST(tcp_garbage_cmd) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  int fd = raw_store();
  unsigned char junk[] = {0xee, 0x01, 0x02, 0x03, 0xff, 0x00, 0x41};
  raw_send(fd, junk, sizeof(junk));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  /* cmd 0 and a bad compare_set flag too. */
  fd = raw_store();
  raw_send(fd, "\0", 1);
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_CAS);
  p += put_str(p, "keep", 4);
  p = dcomm__store_put_u8(p, 7);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  /* The old client still works, and so does a new one. */
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_oversized_lengths) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  uint32_t bad[] = {0xffffffffu, DCOMM_STORE_PROTO_MAX_KEY + 1, 0};
  for (int i = 0; i < 3; i++) {
    int fd = raw_store();
    unsigned char f[16], *p = f;
    p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_GET);
    p = dcomm__store_put_u32(p, bad[i]);
    raw_send(fd, f, (size_t)(p - f));
    ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
    ck_assert(raw_eof(fd, 5));
    close(fd);
  }
  /* Too many wait keys, and a key with a NUL byte. */
  int fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_WAIT);
  p = dcomm__store_put_u64(p, 1000);
  p = dcomm__store_put_u32(p, DCOMM_STORE_MAX_WAIT_KEYS + 1);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  fd = raw_store();
  p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "ke\0p", 4);
  p += put_str(p, "x", 1);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_truncated_frame) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  int fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "truncated", 9);
  p = dcomm__store_put_u32(p, 10); /* a 10-byte value, of which 3 come */
  memcpy(p, "abc", 3);
  p += 3;
  raw_send(fd, f, (size_t)(p - f));
  shutdown(fd, SHUT_WR);
  int st = raw_status(fd, 5);
  ck_assert_msg(st == DCOMM_EPROTO || st == 1, "truncated frame answered %d", st);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  expect_absent(a, "truncated");
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_garbage_before_handshake) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  int fd = raw_connect(NULL, NULL, 0, NULL);
  unsigned char junk[200];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (unsigned char)(i * 37 + 11);
  send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
  ck_assert_msg(raw_eof(fd, 5), "the server kept a connection with a garbage handshake");
  close(fd);
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_silent_connection) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  double t0 = dcomm__now();
  int fd = raw_connect(NULL, NULL, 0, NULL);
  /* Others are served while the silent one sits in its handshake. */
  double t1 = dcomm__now();
  expect_server_serves("keep", "intact");
  ck_assert_msg(dcomm__now() - t1 < 2.0, "a silent connection delayed other clients");
  ck_assert_msg(raw_eof(fd, DCOMM_STORE_HS_TIMEOUT + 5), "the server never dropped a silent connection");
  double el = dcomm__now() - t0;
  ck_assert_msg(el >= DCOMM_STORE_HS_TIMEOUT - 1 && el < DCOMM_STORE_HS_TIMEOUT + 5, "dropped after %.1f s", el);
  close(fd);
  expect_value(a, "keep", "intact", 6);
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_stop_with_blocked_get) {
  struct dcomm_store *a = client_t(30.0), *idle = client();
  struct blocked_get g = {.s = a, .key = "never", .timeout = 30.0};
  int silent = raw_connect(NULL, NULL, 0, NULL);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, blocked_get_main, &g), 0);
  sleep_s(0.3);
  double t0 = dcomm__now();
  dcomm__store_server_stop(srv);
  srv = NULL;
  double stop_s = dcomm__now() - t0;
  pthread_join(th, NULL);
  ck_assert_msg(stop_s < 3.0, "stop took %.2f s", stop_s);
  ck_assert_msg(g.rc == DCOMM_EPEERLOST, "blocked get returned %d", g.rc);
  ck_assert_msg(g.elapsed < 5.0, "blocked get returned after %.2f s", g.elapsed);
  ck_assert_ptr_null(g.val);
  /* A handle whose server is gone keeps failing fast. */
  ck_assert_int_eq(dcomm__store_set(idle, "x", "y", 1), DCOMM_EPEERLOST);
  ck_assert_int_eq(dcomm__store_set(a, "x", "y", 1), DCOMM_EPEERLOST);
  ck_assert(raw_eof(silent, 2));
  close(silent);
  dcomm__store_close(a);
  dcomm__store_close(idle);
}
END_TEST

START_TEST(tcp_connect_timeout_and_local_ip) {
  struct dcomm_store *a = client();
  char ip[64];
  ok(dcomm__store_tcp_local_ip(a, ip, sizeof(ip)));
  ck_assert_str_eq(ip, "127.0.0.1");
  dcomm__store_close(a);
  /* Once the server is gone, connecting gives up after connect_timeout. */
  int p = port;
  server_teardown();
  struct dcomm_store *s = (void *)1;
  double t0 = dcomm__now();
  ck_assert_int_eq(dcomm__store_tcp_connect("127.0.0.1", p, JOB, TOKEN, 0.3, 1.0, &s), DCOMM_ETIMEDOUT);
  double el = dcomm__now() - t0;
  /* dcomm__sock_connect stops retrying when its next backoff would pass the
   * deadline, so it may give up somewhat before connect_timeout. */
  ck_assert_msg(el >= 0.1 && el < 3.0, "connect gave up after %.2f s", el);
  ck_assert_ptr_null(s);
  ck_assert_int_eq(dcomm__store_tcp_connect("127.0.0.1", 0, JOB, TOKEN, 0.3, 1.0, &s), DCOMM_EINVAL);
}
END_TEST

/* ---- file store ---- */

static char dir[64], path[128];

static void file_setup(void) {
  snprintf(dir, sizeof(dir), "/tmp/dcomm_check_store.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/store", dir);
}

static void file_teardown(void) {
  unlink(path);
  rmdir(dir);
}

static struct dcomm_store *fopen_t(double timeout) {
  struct dcomm_store *s = NULL;
  int rc = dcomm__store_file_open(path, timeout, &s);
  ck_assert_msg(rc == 0, "file open: %d (%s)", rc, dcomm_last_error());
  ck_assert_str_eq(s->ops->name, "file");
  return s;
}

static struct dcomm_store *fopen_h(void) { return fopen_t(0.3); }

START_TEST(file_basic) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_basic(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
  /* A handle opened later replays the whole history, tombstones included. */
  struct dcomm_store *c = fopen_h();
  expect_absent(c, "k");
  expect_value(c, "num", "42", 2);
  expect_value(c, "cnt", "3", 1);
  dcomm__store_close(c);
}
END_TEST

START_TEST(file_compare_set) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_compare_set(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_wait) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_wait(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_get_timeout) {
  struct dcomm_store *a = fopen_h();
  api_get_timeout(a);
  dcomm__store_close(a);
}
END_TEST

START_TEST(file_get_released_by_other_handle) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_get_released(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_validation_and_prefix) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_validation(a, b);
  char ip[64];
  ck_assert_int_eq(dcomm__store_tcp_local_ip(a, ip, sizeof(ip)), DCOMM_EINVAL);
  dcomm__store_close(a);
  dcomm__store_close(b);
  struct dcomm_store *s = (void *)1;
  ck_assert_int_eq(dcomm__store_file_open("", 1.0, &s), DCOMM_EINVAL);
  ck_assert_ptr_null(s);
  ck_assert_int_ne(dcomm__store_file_open("/nonexistent-dir/x/store", 1.0, &s), 0);
}
END_TEST

START_TEST(file_max_value) {
  set_max_value("1024");
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_max_value(a, b);
  api_txn_max_value(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_concurrent_add) {
  /* Three processes and eight threads (two sharing a handle) add at once. */
  struct dcomm_store *s = fopen_t(10.0);
  pid_t kids[3];
  for (int k = 0; k < 3; k++) {
    kids[k] = fork();
    ck_assert_int_ge(kids[k], 0);
    if (kids[k] == 0) {
      struct dcomm_store *c = NULL;
      int rc = dcomm__store_file_open(path, 10.0, &c);
      for (int i = 0; rc == 0 && i < 100; i++) rc = dcomm__store_add(c, "counter", 1, NULL);
      if (c) dcomm__store_close(c);
      _exit(rc == 0 ? 0 : 1);
    }
  }
  run_adders(s, path, 8, 2, 100);
  for (int k = 0; k < 3; k++) {
    int st = 0;
    ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed", k);
  }
  expect_counter(s, 8 * 100 + 3 * 100);
  dcomm__store_close(s);
}
END_TEST

static void append_raw(const void *b, size_t n) {
  int fd = open(path, O_WRONLY | O_APPEND);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, b, n), (ssize_t)n);
  close(fd);
}

static off_t file_size(void) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  return st.st_size;
}

START_TEST(file_txn_kinds) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_txn_kinds(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_txn_all_or_nothing) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_txn_all_or_nothing(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
  /* A handle opened later replays the txn's records. */
  struct dcomm_store *c = fopen_h();
  expect_value(c, "gen", "6", 1);
  expect_value(c, "plan/6", "p6", 2);
  expect_value(c, "x/7", "v7", 2);
  dcomm__store_close(c);
}
END_TEST

START_TEST(file_txn_prefix) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_txn_prefix(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_txn_empty_value) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_txn_empty_value(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_txn_validation) {
  struct dcomm_store *a = fopen_h();
  api_txn_validation(a);
  dcomm__store_close(a);
}
END_TEST

START_TEST(file_txn_releases_get) {
  struct dcomm_store *a = fopen_h(), *b = fopen_h();
  api_txn_releases_get(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_txn_failed_appends_nothing) {
  struct dcomm_store *a = fopen_h();
  ok(dcomm__store_set(a, "gen", "1", 1));
  off_t before = file_size();
  struct dcomm_store_cmp stale[] = {CMP("node", DCOMM_STORE_ABSENT), CMPV("gen", "0")};
  struct dcomm_store_put p[] = {PUT("gen", "1"), PUT("plan/1", "p")};
  txn_ok(a, stale, 2, p, 2, 0);
  ck_assert_int_eq(file_size(), before); /* not even a partial record */
  int done = -1;
  stale[1].kind = 7;
  ck_assert_int_eq(dcomm__store_txn(a, stale, 2, p, 2, &done), DCOMM_EINVAL);
  ck_assert_int_eq(file_size(), before);
  dcomm__store_close(a);
}
END_TEST

START_TEST(file_txn_race) {
  struct dcomm_store *s = fopen_t(10.0);
  run_race(s, path, 2);
  dcomm__store_close(s);
}
END_TEST

#define RACE_PROCS 4
#define RACE_TARGET 60

struct race_win {
  long gen;
  int id;
};

START_TEST(file_txn_race_processes) {
  /* Processes race freely, without rounds, from gen 0 to RACE_TARGET:
   * each generation is won exactly once, and its plan is the winner's. */
  struct dcomm_store *s = fopen_t(10.0);
  ok(dcomm__store_set(s, "elastic/gen", "0", 1));
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t kids[RACE_PROCS];
  for (int k = 0; k < RACE_PROCS; k++) {
    kids[k] = fork();
    ck_assert_int_ge(kids[k], 0);
    if (kids[k] == 0) {
      close(fds[0]);
      struct dcomm_store *c = NULL;
      int rc = dcomm__store_file_open(path, 10.0, &c);
      double deadline = dcomm__now() + 8.0;
      while (rc == 0) {
        void *v = NULL;
        size_t n = 0;
        long g = -1;
        rc = dcomm__store_get(c, "elastic/gen", 5.0, &v, &n);
        if (rc < 0) break;
        char txt[32];
        snprintf(txt, sizeof(txt), "%.*s", (int)(n < 31 ? n : 31), (char *)v);
        if (strtol(txt, NULL, 10) >= RACE_TARGET) {
          free(v);
          break;
        }
        int won = race_try(c, 100 + k, v, n, &g);
        free(v);
        if (won < 0) rc = won;
        struct race_win w = {g, 100 + k};
        if (won == 1 && write(fds[1], &w, sizeof(w)) != (ssize_t)sizeof(w)) rc = -1;
        if (dcomm__now() > deadline) rc = -2;
      }
      if (c) dcomm__store_close(c);
      _exit(rc == 0 ? 0 : 1);
    }
  }
  close(fds[1]);
  int owner[RACE_TARGET], wins = 0;
  for (int g = 0; g < RACE_TARGET; g++) owner[g] = -1;
  struct race_win w;
  while (read(fds[0], &w, sizeof(w)) == (ssize_t)sizeof(w)) {
    ck_assert_msg(w.gen >= 0 && w.gen < RACE_TARGET, "a racer won generation %ld", w.gen);
    ck_assert_msg(owner[w.gen] < 0, "generation %ld won by racers %d and %d", w.gen, owner[w.gen], w.id);
    owner[w.gen] = w.id;
    wins++;
  }
  close(fds[0]);
  for (int k = 0; k < RACE_PROCS; k++) {
    int st = 0;
    ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "racer process %d failed", k);
  }
  ck_assert_int_eq(wins, RACE_TARGET);
  for (int g = 0; g < RACE_TARGET; g++) {
    char pkey[64], want[32];
    snprintf(pkey, sizeof(pkey), "elastic/plan/%d", g + 1);
    snprintf(want, sizeof(want), "racer %d", owner[g]);
    expect_value(s, pkey, want, strlen(want));
  }
  char final[16];
  snprintf(final, sizeof(final), "%d", RACE_TARGET);
  expect_value(s, "elastic/gen", final, strlen(final));
  dcomm__store_close(s);
}
END_TEST

START_TEST(file_torn_record) {
  struct dcomm_store *a = fopen_h();
  ok(dcomm__store_set(a, "k1", "v1", 2));
  off_t good = file_size();
  dcomm__store_close(a);
  /* A writer died after the first part of a record: a valid-looking header
   * promising 3 key and 10 value bytes, and only 4 of them. */
  unsigned char rec[64], *p = rec;
  p = dcomm__store_put_u32(p, 0x44434652u);
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u32(p, 3);
  p = dcomm__store_put_u32(p, 10);
  p = dcomm__store_put_u32(p, 0);
  memcpy(p, "k2\0v", 4);
  p += 4;
  append_raw(rec, (size_t)(p - rec));
  struct dcomm_store *b = fopen_h();
  expect_value(b, "k1", "v1", 2);
  /* The next write cuts the torn tail off and lands on a record boundary. */
  ok(dcomm__store_set(b, "k3", "v3", 2));
  struct dcomm_store *c = fopen_h();
  expect_value(c, "k1", "v1", 2);
  expect_value(c, "k3", "v3", 2);
  dcomm__store_close(c);
  /* A torn header (fewer bytes than a header) is ignored as well. */
  append_raw(rec, 7);
  c = fopen_h();
  expect_value(c, "k3", "v3", 2);
  ok(dcomm__store_add(c, "n", 2, NULL));
  dcomm__store_close(c);
  c = fopen_h();
  expect_value(c, "n", "2", 1);
  expect_value(b, "n", "2", 1);
  ck_assert_int_gt(file_size(), good);
  dcomm__store_close(c);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_corrupt_record) {
  struct dcomm_store *a = fopen_h();
  ok(dcomm__store_set(a, "k1", "value-1", 7));
  off_t end = file_size();
  ok(dcomm__store_set(a, "k2", "value-2", 7));
  dcomm__store_close(a);
  /* Flip a byte inside the second record's value: the checksum catches it. */
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, "X", 1, file_size() - 2), 1);
  close(fd);
  struct dcomm_store *s = (void *)1;
  ck_assert_int_eq(dcomm__store_file_open(path, 1.0, &s), DCOMM_EPROTO);
  ck_assert_ptr_null(s);
  /* Complete garbage after good records is corrupt too, not torn. */
  ck_assert_int_eq(truncate(path, end), 0);
  unsigned char junk[64];
  memset(junk, 0x5a, sizeof(junk));
  append_raw(junk, sizeof(junk));
  ck_assert_int_eq(dcomm__store_file_open(path, 1.0, &s), DCOMM_EPROTO);
  /* A handle that was fine before sees the corruption on its next read. */
  ck_assert_int_eq(truncate(path, end), 0);
  a = fopen_h();
  expect_value(a, "k1", "value-1", 7);
  append_raw(junk, sizeof(junk));
  void *v = NULL;
  size_t n = 0;
  ck_assert_int_eq(dcomm__store_get(a, "k2", 0.2, &v, &n), DCOMM_EPROTO);
  dcomm__store_close(a);
}
END_TEST

/* ---- suite ---- */

static Suite *store_suite(void) {
  Suite *s = suite_create("store");
  TCase *tc = tcase_create("tcp");
  tcase_add_checked_fixture(tc, server_setup, server_teardown);
  tcase_set_timeout(tc, 10);
  tcase_add_test(tc, tcp_basic);
  tcase_add_test(tc, tcp_compare_set);
  tcase_add_test(tc, tcp_wait);
  tcase_add_test(tc, tcp_get_timeout);
  tcase_add_test(tc, tcp_get_released_by_other_client);
  tcase_add_test(tc, tcp_validation_and_prefix);
  tcase_add_test(tc, tcp_max_value);
  tcase_add_test(tc, tcp_concurrent_add);
  tcase_add_test(tc, tcp_job_mismatch);
  tcase_add_test(tc, tcp_wrong_token);
  tcase_add_test(tc, tcp_wrong_purpose);
  tcase_add_test(tc, tcp_garbage_cmd);
  tcase_add_test(tc, tcp_oversized_lengths);
  tcase_add_test(tc, tcp_truncated_frame);
  tcase_add_test(tc, tcp_garbage_before_handshake);
  tcase_add_test(tc, tcp_stop_with_blocked_get);
  tcase_add_test(tc, tcp_connect_timeout_and_local_ip);
  tcase_add_test(tc, tcp_txn_kinds);
  tcase_add_test(tc, tcp_txn_all_or_nothing);
  tcase_add_test(tc, tcp_txn_prefix);
  tcase_add_test(tc, tcp_txn_empty_value);
  tcase_add_test(tc, tcp_txn_validation);
  tcase_add_test(tc, tcp_txn_releases_get);
  tcase_add_test(tc, tcp_txn_race);
  tcase_add_test(tc, tcp_txn_wire);
  suite_add_tcase(s, tc);

  /* Waits out the server's handshake deadline, hence its own time limit. */
  TCase *ts = tcase_create("tcp-slow");
  tcase_add_checked_fixture(ts, server_setup, server_teardown);
  tcase_set_timeout(ts, DCOMM_STORE_HS_TIMEOUT + 10);
  tcase_add_test(ts, tcp_silent_connection);
  suite_add_tcase(s, ts);

  TCase *tf = tcase_create("file");
  tcase_add_checked_fixture(tf, file_setup, file_teardown);
  tcase_set_timeout(tf, 10);
  tcase_add_test(tf, file_basic);
  tcase_add_test(tf, file_compare_set);
  tcase_add_test(tf, file_wait);
  tcase_add_test(tf, file_get_timeout);
  tcase_add_test(tf, file_get_released_by_other_handle);
  tcase_add_test(tf, file_validation_and_prefix);
  tcase_add_test(tf, file_max_value);
  tcase_add_test(tf, file_concurrent_add);
  tcase_add_test(tf, file_torn_record);
  tcase_add_test(tf, file_corrupt_record);
  tcase_add_test(tf, file_txn_kinds);
  tcase_add_test(tf, file_txn_all_or_nothing);
  tcase_add_test(tf, file_txn_prefix);
  tcase_add_test(tf, file_txn_empty_value);
  tcase_add_test(tf, file_txn_validation);
  tcase_add_test(tf, file_txn_releases_get);
  tcase_add_test(tf, file_txn_failed_appends_nothing);
  tcase_add_test(tf, file_txn_race);
  tcase_add_test(tf, file_txn_race_processes);
  suite_add_tcase(s, tf);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(store_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed != 0;
}
