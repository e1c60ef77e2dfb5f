/*
 * store_conformance.c: the cases every store implementation must pass,
 * through the dcomm__store_* wrappers only (see store_conformance.h).
 * Handles a and b stand for two ranks on one store; "own handle" means one
 * more handle from the factory (its own connection, descriptor or client).
 */
#include "config.h"

#include "store_conformance.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "dcomm.h"
#include "param.h"
#include "store.h"
#include "store_proto.h"

/* ---- helpers ---- */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

struct dcomm_store *conf_open(const struct store_factory *f, const char *prefix, double timeout) {
  struct dcomm_store *s = NULL;
  int rc = f->open(timeout, &s);
  ck_assert_msg(rc == 0 && s, "%s store: open returned %d (%s)", f->name, rc, dcomm_last_error());
  ck_assert_str_eq(s->ops->name, f->name);
  if (prefix) ok(dcomm__store_set_prefix(s, prefix));
  return s;
}

void conf_set_max_value(const char *v) {
  setenv("DCOMM_STORE_MAX_VALUE", v, 1);
  ck_assert_int_eq(dcomm__params_load(), 0);
}

void conf_expect_value_at(const char *file, int line, struct dcomm_store *s, const char *key, const void *want,
                          size_t wlen) {
  void *v = NULL;
  size_t n = 12345;
  int rc = dcomm__store_get(s, key, 3.0, &v, &n);
  ck_assert_msg(rc == 0, "%s:%d: get '%.200s' returned %d (%s)", file, line, key, rc, dcomm_last_error());
  ck_assert_msg(v != NULL, "%s:%d: get '%.200s' gave a NULL buffer", file, line, key);
  ck_assert_msg(n == wlen && (wlen == 0 || memcmp(v, want, wlen) == 0),
                "%s:%d: get '%.200s': wrong value (length %zu, expected %zu)", file, line, key, n, wlen);
  free(v);
}

void conf_expect_absent_at(const char *file, int line, struct dcomm_store *s, const char *key) {
  void *v = (void *)1;
  size_t n = 1;
  int rc = dcomm__store_get(s, key, 0, &v, &n);
  ck_assert_msg(rc == DCOMM_ETIMEDOUT, "%s:%d: get '%.200s' of an absent key returned %d", file, line, key, rc);
  ck_assert_msg(v == NULL && n == 0, "%s:%d: failed get left output set", file, line);
}

void conf_txn_ok_at(const char *file, int line, struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                    const struct dcomm_store_put *puts, int nput, int want) {
  int done = -1;
  int rc = dcomm__store_txn(s, cmps, ncmp, puts, nput, &done);
  ck_assert_msg(rc == 0, "%s:%d: txn returned %d (%s)", file, line, rc, dcomm_last_error());
  ck_assert_msg(done == want, "%s:%d: txn done is %d, expected %d", file, line, done, want);
}

void conf_txn_einval_at(const char *file, int line, struct dcomm_store *s, const struct dcomm_store_cmp *cmps,
                        int ncmp, const struct dcomm_store_put *puts, int nput) {
  int done = -1;
  int rc = dcomm__store_txn(s, cmps, ncmp, puts, nput, &done);
  ck_assert_msg(rc == DCOMM_EINVAL, "%s:%d: txn returned %d, expected DCOMM_EINVAL", file, line, rc);
  ck_assert_msg(done == 0, "%s:%d: a refused txn left done at %d", file, line, done);
}

void *conf_blocked_get_main(void *arg) {
  struct conf_blocked_get *g = arg;
  double t0 = dcomm__now();
  g->rc = dcomm__store_get(g->s, g->key, g->timeout, &g->val, &g->len);
  g->elapsed = dcomm__now() - t0;
  return NULL;
}

static void expect_current(void *cur, size_t cl, const char *want) {
  ck_assert_msg(cur != NULL, "compare_set: current is NULL, expected '%s'", want);
  ck_assert_msg(cl == strlen(want) && memcmp(cur, want, cl) == 0, "compare_set: current is '%.*s', expected '%s'",
                (int)cl, (char *)cur, want);
  free(cur);
}

/* Waits for a forked child; it must have exited 0. */
static void reap_ok(pid_t kid, const char *what) {
  int st = 0;
  ck_assert_int_eq(waitpid(kid, &st, 0), kid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed (status %d)", what, st);
}

/* The factory of a case: the loop index is the factory's slot. */
#define MAX_FACTORIES 8
static const struct store_factory *factories[MAX_FACTORIES];
static int nfactories;
#define FACTORY (factories[_i])

/* ---- set, get, add, delete ---- */

START_TEST(conf_basic) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  size_t bigl = f->large_value ? f->large_value : 3u << 20;
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
  dcomm__store_close(a);
  dcomm__store_close(b);
  /* A handle opened once the others are closed sees the same state,
   * deletions included (the file store replays its whole history). */
  struct dcomm_store *c = conf_open(f, NULL, 0.3);
  expect_absent(c, "k");
  expect_value(c, "num", "42", 2);
  expect_value(c, "cnt", "3", 1);
  dcomm__store_close(c);
}
END_TEST

START_TEST(conf_compare_set) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

/* ---- wait, get timeouts, wake-ups ---- */

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

START_TEST(conf_wait) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

static void free_all(void **vals, int n) {
  for (int i = 0; i < n; i++) free(vals[i]);
}

static int stop_at_once(void *arg) {
  ++*(int *)arg;
  return DCOMM_EREVOKED;
}

START_TEST(conf_get_many) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
  /* Keys set one by one by another handle: one call waits for all. */
  const char *keys[] = {"m1", "m2", "m3"};
  void *vals[4];
  size_t lens[4];
  struct delayed_set d = {.s = b, .delay = 0.1, .keys = {"m1", "m2", "m3"}, .n = 3};
  pthread_t th;
  double t0 = dcomm__now();
  ck_assert_int_eq(pthread_create(&th, NULL, delayed_set_main, &d), 0);
  int rc = dcomm__store_get_many(a, keys, 3, 10.0, vals, lens);
  double el = dcomm__now() - t0;
  pthread_join(th, NULL);
  ck_assert_msg(rc == 0, "get_many returned %d (%s)", rc, dcomm_last_error());
  ck_assert_msg(el >= 0.25 && el < 5.0, "get_many returned after %.3f s", el);
  for (int i = 0; i < 3; i++) ck_assert_msg(lens[i] == 1 && !memcmp(vals[i], "v", 1), "value %d", i);
  free_all(vals, 3);
  /* Values in request order, an empty one included; a key missing at the
   * deadline: DCOMM_ETIMEDOUT naming it, the others read all the same. */
  ok(dcomm__store_set(b, "m2", "second", 6));
  ok(dcomm__store_set(b, "m0", "", 0));
  const char *some[] = {"m2", "missing", "m0", "m1"};
  t0 = dcomm__now();
  ck_assert_int_eq(dcomm__store_get_many(a, some, 4, 0.4, vals, lens), DCOMM_ETIMEDOUT);
  el = dcomm__now() - t0;
  ck_assert_msg(el >= 0.35 && el < 3.0, "get_many timed out after %.3f s", el);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "1 of 4 keys not set"));
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "'missing'"));
  ck_assert_msg(lens[0] == 6 && !memcmp(vals[0], "second", 6), "the first value");
  ck_assert_ptr_null(vals[1]);
  ck_assert_msg(vals[2] && lens[2] == 0, "an empty value is present with length 0");
  ck_assert_msg(lens[3] == 1 && !memcmp(vals[3], "v", 1), "the last value");
  free_all(vals, 4);
  /* Bad input. */
  ck_assert_int_eq(dcomm__store_get_many(a, keys, -1, 0, vals, lens), DCOMM_EINVAL);
  const char *bad[] = {"m1", NULL};
  ck_assert_int_eq(dcomm__store_get_many(a, bad, 2, 0, vals, lens), DCOMM_EINVAL);
  ok(dcomm__store_get_many(a, keys, 0, 0, vals, lens));
  /* Through a view: its prefix on every key. */
  struct dcomm_store *v;
  ok(dcomm__store_view(a, "vw/", &v));
  ok(dcomm__store_set(b, "vw/m1", "in-view", 7));
  ck_assert_int_eq(dcomm__store_get_many(v, keys, 1, 0.2, vals, lens), 0);
  ck_assert_msg(lens[0] == 7 && !memcmp(vals[0], "in-view", 7), "the view's value");
  free_all(vals, 1);
  dcomm__store_close(v);
  /* More keys than one request holds, each value its own. */
  int n = strcmp(f->name, "tcp") ? 40 : DCOMM_STORE_MAX_WAIT_KEYS + 5;
  char(*names)[16] = calloc((size_t)n, sizeof(*names));
  const char **many = calloc((size_t)n, sizeof(*many));
  void **mv = calloc((size_t)n, sizeof(*mv));
  size_t *ml = calloc((size_t)n, sizeof(*ml));
  for (int i = 0; i < n; i++) {
    snprintf(names[i], sizeof(names[i]), "k/%d", i);
    many[i] = names[i];
    ok(dcomm__store_set(b, names[i], names[i], strlen(names[i])));
  }
  ok(dcomm__store_get_many(a, many, n, 5.0, mv, ml));
  for (int i = 0; i < n; i++)
    ck_assert_msg(ml[i] == strlen(names[i]) && !memcmp(mv[i], names[i], ml[i]), "value %d of %d", i, n);
  free_all(mv, n);
  /* A stop function ends a wait for an absent key between slices. */
  int asked = 0;
  const char *gone[] = {"k/0", "never"};
  t0 = dcomm__now();
  rc = dcomm__store_get_many_stop(a, gone, 2, 30.0, stop_at_once, &asked, mv, ml);
  el = dcomm__now() - t0;
  ck_assert_int_eq(rc, DCOMM_EREVOKED);
  ck_assert_int_eq(asked, 1);
  ck_assert_msg(el < DCOMM_STORE_STOP_SLICE + 2.0, "the stop took %.3f s", el);
  ck_assert_msg(!mv[0] && !mv[1], "nothing is handed back on a stop");
  free(names);
  free(many);
  free(mv);
  free(ml);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

/* Values that total more than one answer may hold are read all the same. */
START_TEST(conf_get_many_large) {
  conf_set_max_value("1024");
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3);
  char big[1000];
  const char *keys[] = {"big/0", "big/1", "big/2"};
  for (int i = 0; i < 3; i++) {
    memset(big, 'x' + i, sizeof(big));
    ok(dcomm__store_set(a, keys[i], big, sizeof(big)));
  }
  void *vals[3];
  size_t lens[3];
  ok(dcomm__store_get_many(a, keys, 3, 1.0, vals, lens));
  for (int i = 0; i < 3; i++) {
    memset(big, 'x' + i, sizeof(big));
    ck_assert_msg(lens[i] == sizeof(big) && !memcmp(vals[i], big, sizeof(big)), "value %d", i);
  }
  free_all(vals, 3);
  dcomm__store_close(a);
}
END_TEST

START_TEST(conf_get_timeout) {
  struct dcomm_store *a = conf_open(FACTORY, NULL, 0.3);
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
  dcomm__store_close(a);
}
END_TEST

START_TEST(conf_get_released) {
  const struct store_factory *f = FACTORY;
  /* By a set from another process, on a handle of its own. */
  pid_t kid = fork();
  ck_assert_int_ge(kid, 0);
  if (kid == 0) {
    sleep_s(0.6);
    struct dcomm_store *c = NULL;
    if (f->open(5.0, &c) < 0) _exit(2);
    int rc = dcomm__store_set(c, "late-proc", "here", 4);
    dcomm__store_close(c);
    _exit(rc < 0 ? 3 : 0);
  }
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
  double t0 = dcomm__now();
  void *v = NULL;
  size_t n = 0;
  ok(dcomm__store_get(a, "late-proc", 10.0, &v, &n));
  double el = dcomm__now() - t0;
  ck_assert(n == 4 && memcmp(v, "here", 4) == 0);
  free(v);
  ck_assert_msg(el > 0.3 && el < 5.0, "get blocked on a process's set returned after %.3f s", el);
  reap_ok(kid, "the setting process");
  /* By a set on another handle, from another thread. */
  struct conf_blocked_get g = {.s = a, .key = "late", .timeout = 10.0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, conf_blocked_get_main, &g), 0);
  sleep_s(0.3);
  ok(dcomm__store_set(b, "late", "arrived", 7));
  pthread_join(th, NULL);
  ck_assert_msg(g.rc == 0, "blocked get returned %d", g.rc);
  ck_assert_int_eq(g.len, 7);
  ck_assert_mem_eq(g.val, "arrived", 7);
  ck_assert_msg(g.elapsed >= 0.25 && g.elapsed < 5.0, "blocked get returned after %.3f s", g.elapsed);
  free(g.val);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

/* ---- argument errors, prefixes, views, the value bound ---- */

START_TEST(conf_validation_and_prefix) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(conf_view) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, "base/", 0.3), *b = conf_open(f, NULL, 0.3);
  struct dcomm_store *v = (void *)1, *vv = NULL;
  int64_t r = 0;
  int ex = -1;
  void *cur;
  size_t cl;
  /* Argument errors; a refused view leaves *out NULL. */
  char prefix[300];
  memset(prefix, 'p', 256);
  prefix[256] = 0;
  ck_assert_int_eq(dcomm__store_view(a, prefix, &v), DCOMM_EINVAL);
  ck_assert_ptr_null(v);
  v = (void *)1;
  ck_assert_int_eq(dcomm__store_view(NULL, "x/", &v), DCOMM_EINVAL);
  ck_assert_ptr_null(v);
  ck_assert_int_eq(dcomm__store_view(a, "x/", NULL), DCOMM_EINVAL);
  /* A view puts its own prefix on keys, not stacked on the base's. */
  ok(dcomm__store_view(a, "job/", &v));
  ok(dcomm__store_set(v, "k", "via-view", 8));
  expect_value(b, "job/k", "via-view", 8);
  expect_absent(b, "base/job/k");
  expect_absent(a, "k");
  /* The base's prefix changing later does not move the view. */
  ok(dcomm__store_set_prefix(a, "other/"));
  expect_value(v, "k", "via-view", 8);
  /* Its default timeout is the base's. */
  void *val = (void *)1;
  size_t n = 1;
  double t0 = dcomm__now();
  ck_assert_int_eq(dcomm__store_get(v, "nobody-sets-this", -1, &val, &n), DCOMM_ETIMEDOUT);
  double el = dcomm__now() - t0;
  ck_assert_msg(el >= 0.25 && el < 3.0, "get through a view with the default timeout returned after %.3f s", el);
  ck_assert_ptr_null(val);
  /* Every operation goes through it, under its prefix. */
  ok(dcomm__store_add(v, "n", 2, &r));
  ck_assert_int_eq(r, 2);
  expect_value(b, "job/n", "2", 1);
  ok(dcomm__store_compare_set(v, "c", NULL, 0, "x", 1, &cur, &cl));
  expect_current(cur, cl, "x");
  expect_value(b, "job/c", "x", 1);
  struct dcomm_store_cmp cx[] = {CMPV("c", "x"), CMP("t", DCOMM_STORE_ABSENT)};
  struct dcomm_store_put py[] = {PUT("c", "y"), PUT("t", "1")};
  txn_ok(v, cx, 2, py, 2, 1);
  expect_value(b, "job/c", "y", 1);
  expect_value(b, "job/t", "1", 1);
  txn_ok(v, cx, 2, py, 2, 0);
  const char *keys[] = {"k", "n", "t"}, *missing[] = {"k", "missing"};
  ok(dcomm__store_wait(v, keys, 3, 1.0));
  ck_assert_int_eq(dcomm__store_wait(v, missing, 2, 0.1), DCOMM_ETIMEDOUT);
  ok(dcomm__store_delete(v, "t", &ex));
  ck_assert_int_eq(ex, 1);
  expect_absent(b, "job/t");
  ck_assert_int_eq(dcomm__store_set(v, "", "x", 1), DCOMM_EINVAL);
  /* A get blocked in a view is released by a set from another handle. */
  struct conf_blocked_get g = {.s = v, .key = "late", .timeout = 10.0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, conf_blocked_get_main, &g), 0);
  sleep_s(0.3);
  ok(dcomm__store_set(b, "job/late", "arrived", 7));
  pthread_join(th, NULL);
  ck_assert_msg(g.rc == 0 && g.len == 7 && memcmp(g.val, "arrived", 7) == 0, "blocked get through a view: %d", g.rc);
  free(g.val);
  /* A view of a view: the same link, its own prefix only. */
  ok(dcomm__store_view(v, "deep/", &vv));
  ok(dcomm__store_set(vv, "d", "1", 1));
  expect_value(b, "deep/d", "1", 1);
  expect_absent(b, "job/deep/d");
  /* Closing the views leaves the base open and working. */
  dcomm__store_close(vv);
  dcomm__store_close(v);
  ok(dcomm__store_set(a, "after", "1", 1));
  expect_value(b, "other/after", "1", 1);
  expect_value(a, "after", "1", 1);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

static void txn_max_value(struct dcomm_store *a, struct dcomm_store *b) {
  /* DCOMM_STORE_MAX_VALUE=1024: a put or a compared value over it is
   * refused before anything is written. */
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

START_TEST(conf_max_value) {
  conf_set_max_value("1024");
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  txn_max_value(a, b);
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

/* ---- concurrent adds: threads (some sharing a handle) and processes ---- */

struct adder {
  const struct store_factory *f;
  struct dcomm_store *shared; /* NULL: an own handle */
  int iters, rc;
  int64_t *results;
};

static void *adder_main(void *arg) {
  struct adder *ad = arg;
  struct dcomm_store *s = ad->shared;
  int rc = s ? 0 : ad->f->open(10.0, &s);
  for (int i = 0; rc == 0 && i < ad->iters; i++) rc = dcomm__store_add(s, "counter", 1, &ad->results[i]);
  if (s && !ad->shared) dcomm__store_close(s);
  ad->rc = rc;
  return NULL;
}

static int cmp64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return (a > b) - (a < b);
}

START_TEST(conf_concurrent_add) {
  const struct store_factory *f = FACTORY;
  const int nth = f->add_threads, nproc = f->add_procs, iters = f->add_iters;
  const int total = (nth + nproc) * iters;
  ck_assert_int_le(nth, 32);
  ck_assert_int_gt(total, 0);
  int64_t *res = calloc((size_t)total, sizeof(*res));
  /* The processes first (no thread of this test is running yet); each
   * reports every add's result through the pipe. */
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t kids[16];
  ck_assert_int_le(nproc, 16);
  for (int k = 0; k < nproc; k++) {
    kids[k] = fork();
    ck_assert_int_ge(kids[k], 0);
    if (kids[k] == 0) {
      close(fds[0]);
      struct dcomm_store *c = NULL;
      int rc = f->open(10.0, &c);
      for (int i = 0; rc == 0 && i < iters; i++) {
        int64_t r = 0;
        rc = dcomm__store_add(c, "counter", 1, &r);
        if (rc == 0 && write(fds[1], &r, sizeof(r)) != (ssize_t)sizeof(r)) rc = -1;
      }
      if (rc < 0) fprintf(stderr, "adder process %d: %d (%s)\n", k, rc, dcomm_last_error());
      if (c) dcomm__store_close(c);
      _exit(rc == 0 ? 0 : 1);
    }
  }
  close(fds[1]);
  struct dcomm_store *shared = conf_open(f, NULL, 10.0);
  pthread_t th[32];
  struct adder ad[32];
  for (int i = 0; i < nth; i++) {
    ad[i] = (struct adder){.f = f, .shared = i < f->add_shared ? shared : NULL, .iters = iters,
                           .results = res + i * iters};
    ck_assert_int_eq(pthread_create(&th[i], NULL, adder_main, &ad[i]), 0);
  }
  for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < nth; i++) ck_assert_msg(ad[i].rc == 0, "adder thread %d failed with %d", i, ad[i].rc);
  int got = nth * iters;
  int64_t r;
  while (got < total && read(fds[0], &r, sizeof(r)) == (ssize_t)sizeof(r)) res[got++] = r;
  close(fds[0]);
  for (int k = 0; k < nproc; k++) reap_ok(kids[k], "an adder process");
  ck_assert_int_eq(got, total);
  /* Every add saw a distinct value, 1 .. total. */
  qsort(res, (size_t)total, sizeof(*res), cmp64);
  for (int i = 0; i < total; i++)
    ck_assert_msg(res[i] == i + 1, "the adds did not return 1 .. %d: %lld where %d belongs", total,
                  (long long)res[i], i + 1);
  free(res);
  /* The counter is exact, both as add's result and as the stored text. */
  int64_t final = -1;
  ok(dcomm__store_add(shared, "counter", 0, &final));
  ck_assert_int_eq(final, total);
  char txt[32];
  snprintf(txt, sizeof(txt), "%d", total);
  expect_value(shared, "counter", txt, strlen(txt));
  dcomm__store_close(shared);
}
END_TEST

/* ---- all-gather: n members, each its own handle and thread ---- */

struct gatherer {
  const struct store_factory *f;
  int rank, n, rc;
  void *all;
  size_t len;
};

static void *gatherer_main(void *arg) {
  struct gatherer *g = arg;
  struct dcomm_store *s = NULL;
  int rc = g->f->open(10.0, &s);
  /* Member r's value: r + 1 bytes of 'a' + r (member 0's is one byte). */
  char mine[32];
  memset(mine, 'a' + g->rank, sizeof(mine));
  if (rc == 0) rc = dcomm__store_allgather(s, "ag/x", g->rank, g->n, mine, (size_t)g->rank + 1, 10.0, &g->all, &g->len);
  if (s) dcomm__store_close(s);
  g->rc = rc;
  return NULL;
}

START_TEST(conf_allgather) {
  const struct store_factory *f = FACTORY;
  enum { N = 12 };
  pthread_t th[N];
  struct gatherer g[N];
  /* Started last-first: member 0 waits for the others' values. */
  for (int i = N - 1; i >= 0; i--) {
    g[i] = (struct gatherer){.f = f, .rank = i, .n = N};
    ck_assert_int_eq(pthread_create(&th[i], NULL, gatherer_main, &g[i]), 0);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    ck_assert_msg(g[i].rc == 0, "member %d: %d (%s)", i, g[i].rc, dcomm_last_error());
    /* Every member has the same gathered value, in rank order. */
    ck_assert_uint_eq(g[i].len, g[0].len);
    ck_assert_int_eq(memcmp(g[i].all, g[0].all, g[0].len), 0);
  }
  const uint64_t *off = g[0].all;
  for (int r = 0; r < N; r++) {
    ck_assert_uint_eq(off[r + 1] - off[r], (uint64_t)r + 1);
    for (int k = 0; k <= r; k++) ck_assert_int_eq(((const char *)g[0].all)[off[r] + (uint64_t)k], 'a' + r);
  }
  ck_assert_uint_eq(off[N], g[0].len);
  for (int i = 0; i < N; i++) free(g[i].all);
  /* Member 0 removed the per-member keys; the gathered value stays. */
  struct dcomm_store *s = conf_open(f, NULL, 0.2);
  expect_absent(s, "ag/x/3");
  void *v = NULL;
  size_t vl = 0;
  ok(dcomm__store_get(s, "ag/x/all", 0.2, &v, &vl));
  ck_assert_uint_eq(vl, g[0].len);
  free(v);
  /* A member that never comes: the others time out with its name. */
  void *all = NULL;
  size_t len = 0;
  int rc = dcomm__store_allgather(s, "ag/y", 0, 2, "z", 1, 0.3, &all, &len);
  ck_assert_int_eq(rc, DCOMM_ETIMEDOUT);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "member 1 of 2 never published"));
  rc = dcomm__store_allgather(s, "ag/z", 1, 2, "z", 1, 0.3, &all, &len);
  ck_assert_int_eq(rc, DCOMM_ETIMEDOUT);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "member 0 of 2 never published"));
  /* A malformed gathered value is refused, not indexed. */
  ok(dcomm__store_set(s, "ag/w/all", "\x01\x02\x03", 3));
  rc = dcomm__store_allgather(s, "ag/w", 1, 2, "z", 1, 0.3, &all, &len);
  ck_assert_int_eq(rc, DCOMM_EPROTO);
  ck_assert_ptr_null(all);
  dcomm__store_close(s);
}
END_TEST

/* ---- guarded writes (txn) ---- */

START_TEST(conf_txn_kinds) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(conf_txn_all_or_nothing) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
  /* A handle opened later sees the txn's writes (the file store replays
   * its records). */
  struct dcomm_store *c = conf_open(f, NULL, 0.3);
  expect_value(c, "gen", "6", 1);
  expect_value(c, "plan/6", "p6", 2);
  expect_value(c, "x/7", "v7", 2);
  dcomm__store_close(c);
}
END_TEST

START_TEST(conf_txn_prefix) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(conf_txn_empty_value) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

START_TEST(conf_txn_validation) {
  struct dcomm_store *a = conf_open(FACTORY, NULL, 0.3);
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
  int kinds[] = {3, 5, 9, -1, 255};
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
  dcomm__store_close(a);
}
END_TEST

START_TEST(conf_txn_releases_get) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *a = conf_open(f, NULL, 0.3), *b = conf_open(f, NULL, 0.3);
  struct conf_blocked_get g = {.s = a, .key = "txn-late", .timeout = 10.0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, conf_blocked_get_main, &g), 0);
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
  dcomm__store_close(a);
  dcomm__store_close(b);
}
END_TEST

/* ---- the fencing race: one winner per generation ---- */

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

/* Every racer reads elastic/gen, then (all having read the same value)
 * tries "compare EQUAL what I read, put gen+1 and plan/<gen+1>". Rounds are
 * separated by barriers, so in each round exactly one may win. */
#define RACERS 8
#define RACE_SHARED 2 /* racers on one shared handle; the others on their own */
#define RACE_ROUNDS 30

struct racer {
  const struct store_factory *f;
  struct dcomm_store *shared; /* NULL: an own handle */
  pthread_barrier_t *bar;
  int id, rc;
  long read_gen[RACE_ROUNDS];
  int won[RACE_ROUNDS];
};

static void *racer_main(void *arg) {
  struct racer *r = arg;
  struct dcomm_store *s = r->shared;
  int rc = s ? 0 : r->f->open(10.0, &s);
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
  if (rc < 0) fprintf(stderr, "racer %d: %s\n", r->id, dcomm_last_error());
  if (s && !r->shared) dcomm__store_close(s);
  r->rc = rc;
  return NULL;
}

/* Watches the race from its own handle: whenever elastic/gen is k > 0,
 * elastic/plan/k, written by the same txn, must already be there. */
struct observer {
  const struct store_factory *f;
  int stop; /* set by the main thread: __atomic accesses */
  int rc, looks, torn;
  long torn_gen;
};

static void *observer_main(void *arg) {
  struct observer *o = arg;
  struct dcomm_store *s = NULL;
  int rc = o->f->open(10.0, &s);
  while (rc == 0 && !__atomic_load_n(&o->stop, __ATOMIC_ACQUIRE)) {
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

START_TEST(conf_txn_race) {
  const struct store_factory *f = FACTORY;
  struct dcomm_store *shared = conf_open(f, NULL, 10.0);
  pthread_t th[RACERS];
  struct racer *r = calloc(RACERS, sizeof(*r));
  pthread_barrier_t bar;
  ck_assert_int_eq(pthread_barrier_init(&bar, NULL, RACERS), 0);
  ok(dcomm__store_set(shared, "elastic/gen", "0", 1));
  struct observer obs = {.f = f};
  pthread_t oth;
  ck_assert_int_eq(pthread_create(&oth, NULL, observer_main, &obs), 0);
  for (int i = 0; i < RACERS; i++) {
    r[i] = (struct racer){.f = f, .shared = i < RACE_SHARED ? shared : NULL, .bar = &bar, .id = i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, racer_main, &r[i]), 0);
  }
  for (int i = 0; i < RACERS; i++) pthread_join(th[i], NULL);
  __atomic_store_n(&obs.stop, 1, __ATOMIC_RELEASE);
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
  dcomm__store_close(shared);
}
END_TEST

#define RACE_PROCS 4
#define RACE_TARGET 60

struct race_win {
  long gen;
  int id;
};

START_TEST(conf_txn_race_processes) {
  /* Processes race freely, without rounds, from gen 0 to RACE_TARGET:
   * each generation is won exactly once, and its plan is the winner's. */
  const struct store_factory *f = FACTORY;
  struct dcomm_store *s = conf_open(f, NULL, 10.0);
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
      int rc = f->open(10.0, &c);
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
      if (rc < 0) fprintf(stderr, "racer process %d: %d (%s)\n", k, rc, dcomm_last_error());
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
  for (int k = 0; k < RACE_PROCS; k++) reap_ok(kids[k], "a racer process");
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

/* ---- registration ---- */

#define CASES                                                                                               \
  conf_basic, conf_compare_set, conf_wait, conf_get_many, conf_get_many_large, conf_get_timeout, conf_get_released, conf_validation_and_prefix, \
      conf_view, conf_max_value, conf_concurrent_add, conf_allgather, conf_txn_kinds, conf_txn_all_or_nothing,               \
      conf_txn_prefix, conf_txn_empty_value, conf_txn_validation, conf_txn_releases_get, conf_txn_race,      \
      conf_txn_race_processes

int store_conformance_count(void) {
  const TTest *cases[] = {CASES};
  return (int)(sizeof(cases) / sizeof(cases[0]));
}

void store_conformance_add(TCase *tc, const struct store_factory *f) {
  const TTest *cases[] = {CASES};
  if (nfactories == MAX_FACTORIES) {
    fprintf(stderr, "store_conformance_add: more than %d factories\n", MAX_FACTORIES);
    abort();
  }
  int k = nfactories++;
  factories[k] = f;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) tcase_add_loop_test(tc, cases[i], k, k + 1);
}
