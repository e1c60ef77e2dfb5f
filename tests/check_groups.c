/*
 * check_groups.c: sub-groups as users build them: overlapping new_group
 * lists, a list in reverse order, split by color and key, nested splits,
 * non-member handles, interleaved collectives on different groups, and the
 * argument checks; named groups created by their members alone; and, in
 * elastic mode, a sub-group held across a recovery that fails and is
 * retried: the retry works and the old handle is a non-member handle
 * (DCOMM_ENOTMEMBER), not a crash.
 */
#include "config.h"

#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm.h"
#include "dcomm_elastic.h"
#include "harness.h"

static int sum_world_ranks(dcomm_group_t g, int32_t *out) {
  int32_t v = dcomm_rank();
  int rc = dcomm_all_reduce(&v, 1, DCOMM_INT32, DCOMM_SUM, g);
  *out = v;
  return rc;
}

static int body_overlap(int rank, int n, void *arg) {
  int a_list[] = {0, 1, 2}, b_list[] = {1, 2, 3}, rev[] = {3, 2, 1, 0};
  dcomm_group_t a, b, r;
  MP_OK(dcomm_new_group(a_list, 3, &a));
  MP_OK(dcomm_new_group(b_list, 3, &b));
  MP_OK(dcomm_new_group(rev, 4, &r));
  int32_t s;
  if (rank <= 2) {
    MP_REQUIRE(dcomm_group_rank(a) == rank, "rank in a: %d", dcomm_group_rank(a));
    MP_OK(sum_world_ranks(a, &s));
    MP_REQUIRE(s == 3, "sum over a = %d", s);
  } else {
    MP_REQUIRE(dcomm_group_rank(a) == DCOMM_ENOTMEMBER, "non-member rank query");
    MP_REQUIRE(strstr(dcomm_last_error(), "dcomm_group_rank") && strstr(dcomm_last_error(), "dcomm_new_group([0, 1, 2])"),
               "ENOTMEMBER names the call and the group's creation: %s", dcomm_last_error());
    MP_REQUIRE(sum_world_ranks(a, &s) == DCOMM_ENOTMEMBER, "non-member collective");
    MP_REQUIRE(strstr(dcomm_last_error(), "dcomm_all_reduce: world rank 3 is not a member") &&
                   strstr(dcomm_last_error(), "created by dcomm_new_group([0, 1, 2])"),
               "ENOTMEMBER names the call and the group's creation: %s", dcomm_last_error());
    MP_REQUIRE(dcomm_group_size(a) == 3, "non-member size query");
  }
  if (rank >= 1) {
    MP_OK(sum_world_ranks(b, &s));
    MP_REQUIRE(s == 6, "sum over b = %d", s);
    MP_REQUIRE(dcomm_group_world_rank(b, 0) == 1, "world rank of b's rank 0");
  }
  /* reversed list: world rank 3 is group rank 0 and the broadcast root */
  MP_REQUIRE(dcomm_group_rank(r) == 3 - rank, "rank in reversed group %d", dcomm_group_rank(r));
  int32_t v = rank == 3 ? 4242 : -1;
  MP_OK(dcomm_broadcast(&v, 1, DCOMM_INT32, 0, r));
  MP_REQUIRE(v == 4242, "broadcast from group rank 0 gave %d", v);
  /* interleave the groups with the world */
  for (int it = 0; it < 30; it++) {
    if (rank <= 2) MP_OK(sum_world_ranks(a, &s));
    MP_OK(sum_world_ranks(NULL, &s));
    MP_REQUIRE(s == 6, "world sum %d", s);
    if (rank >= 1) MP_OK(sum_world_ranks(b, &s));
  }
  MP_OK(dcomm_group_free(a));
  MP_REQUIRE(dcomm_group_rank(a) == DCOMM_EINVAL, "freed handle must be refused");
  MP_OK(dcomm_group_free(b));
  MP_OK(dcomm_group_free(r));
  return 0;
}

START_TEST(test_overlap) { ck_assert_int_eq(mp_run(4, body_overlap, NULL, 60), 0); }
END_TEST

static int body_split(int rank, int n, void *arg) {
  dcomm_group_t half, quarter, none;
  /* colors by parity, keys reversed: the highest world rank comes first */
  MP_OK(dcomm_group_split(NULL, rank % 2, -rank, &half));
  int members = (n + 1 - rank % 2) / 2;
  MP_REQUIRE(dcomm_group_size(half) == members, "half size %d", dcomm_group_size(half));
  int expect_rank = 0;
  for (int r = rank + 2; r < n; r += 2) expect_rank++;
  MP_REQUIRE(dcomm_group_rank(half) == expect_rank, "half rank %d, want %d", dcomm_group_rank(half), expect_rank);
  int32_t s, want = 0;
  for (int r = rank % 2; r < n; r += 2) want += r;
  MP_OK(sum_world_ranks(half, &s));
  MP_REQUIRE(s == want, "half sum %d want %d", s, want);
  /* nested split of the split */
  MP_OK(dcomm_group_split(half, dcomm_group_rank(half) / 2, 0, &quarter));
  MP_REQUIRE(dcomm_group_size(quarter) >= 1 && dcomm_group_size(quarter) <= 2, "quarter size");
  int32_t q = 1;
  MP_OK(dcomm_all_reduce(&q, 1, DCOMM_INT32, DCOMM_SUM, quarter));
  MP_REQUIRE(q == dcomm_group_size(quarter), "quarter count %d", q);
  /* color -1: a non-member handle */
  MP_OK(dcomm_group_split(NULL, rank == 0 ? -1 : 5, 0, &none));
  if (rank == 0) {
    MP_REQUIRE(dcomm_group_rank(none) == DCOMM_ENOTMEMBER, "color -1 must not be a member");
    int32_t v = 0;
    MP_REQUIRE(dcomm_barrier(none) == DCOMM_ENOTMEMBER && dcomm_all_reduce(&v, 1, DCOMM_INT32, DCOMM_SUM, none) ==
                                                              DCOMM_ENOTMEMBER, "color -1: collectives refused");
    MP_REQUIRE(strstr(dcomm_last_error(), "dcomm_all_reduce") &&
                   strstr(dcomm_last_error(), "dcomm_group_split(world, color -1)"),
               "ENOTMEMBER names the call and the split color: %s", dcomm_last_error());
  } else {
    MP_OK(sum_world_ranks(none, &s));
    MP_REQUIRE(s == n * (n - 1) / 2, "split without rank 0: %d", s);
  }
  MP_OK(dcomm_group_free(quarter));
  MP_OK(dcomm_group_free(half));
  MP_OK(dcomm_group_free(none));
  return 0;
}

START_TEST(test_split) { ck_assert_int_eq(mp_run(5, body_split, NULL, 60), 0); }
END_TEST

static int body_badgroups(int rank, int n, void *arg) {
  dcomm_group_t g;
  int dup[] = {0, 0}, out[] = {0, 7};
  MP_REQUIRE(dcomm_new_group(dup, 2, &g) == DCOMM_EINVAL, "duplicate ranks");
  MP_REQUIRE(strstr(dcomm_last_error(), "twice") != NULL, "message: %s", dcomm_last_error());
  /* A failed creation does not hand back the world (NULL). */
  float x = 1;
  MP_REQUIRE(g != NULL && dcomm_all_reduce(&x, 1, DCOMM_FLOAT32, DCOMM_SUM, g) == DCOMM_EINVAL,
             "the handle of a failed new_group must be refused");
  MP_REQUIRE(dcomm_new_group(out, 2, &g) == DCOMM_EINVAL, "rank out of range");
  MP_REQUIRE(dcomm_new_group(out, 0, &g) == DCOMM_EINVAL, "empty group");
  MP_REQUIRE(dcomm_group_free(NULL) == DCOMM_EINVAL, "world cannot be freed");
  MP_REQUIRE(dcomm_group_set_timeout(NULL, -1) == DCOMM_EINVAL, "negative timeout");
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_badgroups) { ck_assert_int_eq(mp_run(2, body_badgroups, NULL, 60), 0); }
END_TEST

/* The tcp backend reads its settings when each communicator is created
 * (dcomm-bench --tune compares values in one job this way): a bad
 * DCOMM_ALGO set after dcomm_init fails the next group's creation, naming
 * it, and the group after it is fixed works. */
static int body_settings_at_creation(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  dcomm_group_t g = NULL;
  int all[] = {0, 1};
  setenv("DCOMM_ALGO", "fastest", 1);
  MP_REQUIRE(dcomm_new_group(all, 2, &g) == DCOMM_EINVAL, "a group created with DCOMM_ALGO=fastest");
  MP_REQUIRE(strstr(dcomm_last_error(), "DCOMM_ALGO='fastest'") != NULL, "message: %s", dcomm_last_error());
  setenv("DCOMM_ALGO", "all_reduce=ring", 1);
  MP_OK(dcomm_new_group(all, 2, &g));
  float x[64];
  for (int i = 0; i < 64; i++) x[i] = (float)(rank + i);
  MP_OK(dcomm_all_reduce(x, 64, DCOMM_FLOAT32, DCOMM_SUM, g));
  for (int i = 0; i < 64; i++) MP_REQUIRE(x[i] == (float)(1 + 2 * i), "element %d: %g", i, (double)x[i]);
  MP_OK(dcomm_group_free(g));
  unsetenv("DCOMM_ALGO");
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_settings_at_creation) { ck_assert_int_eq(mp_run(2, body_settings_at_creation, NULL, 60), 0); }
END_TEST

/* dcomm_new_group_named at world 3: "a" on ranks 0,1 and "b" on ranks
 * 1,2, each created by its members only (rank 2 never calls "a", rank 0
 * never "b"); a non-member's call returns at once; a second live group of
 * the same name and ranks is refused, other names or orders are not. */
static int body_named(int rank, int n, void *arg) {
  (void)n, (void)arg;
  int a_list[] = {0, 1}, b_list[] = {1, 2}, ba_list[] = {1, 0};
  dcomm_group_t a = NULL, b = NULL, c = NULL, ra = NULL, out = NULL;
  int32_t s;
  if (rank <= 1) {
    MP_OK(dcomm_new_group_named("a", a_list, 2, &a));
    MP_REQUIRE(dcomm_group_rank(a) == rank, "rank in a: %d", dcomm_group_rank(a));
    MP_OK(sum_world_ranks(a, &s));
    MP_REQUIRE(s == 1, "sum over a = %d", s);
  }
  if (rank >= 1) {
    MP_OK(dcomm_new_group_named("b", b_list, 2, &b));
    MP_REQUIRE(dcomm_group_rank(b) == rank - 1, "rank in b: %d", dcomm_group_rank(b));
    MP_OK(sum_world_ranks(b, &s));
    MP_REQUIRE(s == 3, "sum over b = %d", s);
  }
  /* A non-member gets its handle without any communication. */
  double t0 = mp_now();
  if (rank == 2) MP_OK(dcomm_new_group_named("a", a_list, 2, &out));
  if (rank == 0) MP_OK(dcomm_new_group_named("b", b_list, 2, &out));
  if (rank != 1) {
    MP_REQUIRE(mp_now() - t0 < 0.5, "a non-member's new_group_named took %.3f s", mp_now() - t0);
    MP_REQUIRE(dcomm_group_rank(out) == DCOMM_ENOTMEMBER, "non-member rank query");
    MP_REQUIRE(dcomm_group_size(out) == 2, "non-member size query");
    MP_REQUIRE(sum_world_ranks(out, &s) == DCOMM_ENOTMEMBER, "non-member collective");
    MP_REQUIRE(strstr(dcomm_last_error(), "dcomm_all_reduce") && strstr(dcomm_last_error(), "dcomm_new_group_named(\""),
               "ENOTMEMBER names the call and the group's creation: %s", dcomm_last_error());
    MP_OK(dcomm_group_free(out));
  }
  /* Same name and ranks while the first lives: refused, naming it. */
  if (rank <= 1) {
    MP_REQUIRE(dcomm_new_group_named("a", a_list, 2, &out) == DCOMM_EINVAL, "duplicate name and ranks");
    MP_REQUIRE(strstr(dcomm_last_error(), "\"a\"") != NULL, "message: %s", dcomm_last_error());
    float x = 1;
    MP_REQUIRE(out != NULL && dcomm_all_reduce(&x, 1, DCOMM_FLOAT32, DCOMM_SUM, out) == DCOMM_EINVAL,
               "the handle of a refused creation");
    /* Same ranks, another name; same name, another order: new groups. */
    MP_OK(dcomm_new_group_named("c", a_list, 2, &c));
    MP_OK(dcomm_new_group_named("a", ba_list, 2, &ra));
    MP_REQUIRE(dcomm_group_rank(ra) == 1 - rank, "rank in reversed a: %d", dcomm_group_rank(ra));
    int32_t v = rank == 1 ? 77 : -1;
    MP_OK(dcomm_broadcast(&v, 1, DCOMM_INT32, 0, ra));
    MP_REQUIRE(v == 77, "broadcast over reversed a gave %d", v);
  }
  /* Interleaved collectives; rank 1 is in every group. */
  for (int it = 0; it < 20; it++) {
    if (rank <= 1) {
      MP_OK(sum_world_ranks(a, &s));
      MP_REQUIRE(s == 1, "a: %d", s);
      MP_OK(sum_world_ranks(c, &s));
      MP_REQUIRE(s == 1, "c: %d", s);
    }
    if (rank >= 1) {
      MP_OK(sum_world_ranks(b, &s));
      MP_REQUIRE(s == 3, "b: %d", s);
    }
  }
  /* Freed, the name and ranks can be used again. */
  if (rank <= 1) {
    MP_OK(dcomm_group_free(a));
    MP_OK(dcomm_new_group_named("a", a_list, 2, &a));
    MP_OK(sum_world_ranks(a, &s));
    MP_REQUIRE(s == 1, "a again: %d", s);
    MP_OK(dcomm_group_free(a));
    MP_OK(dcomm_group_free(c));
    MP_OK(dcomm_group_free(ra));
  }
  if (rank >= 1) MP_OK(dcomm_group_free(b));
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_named) { ck_assert_int_eq(mp_run(3, body_named, NULL, 60), 0); }
END_TEST

static int body_badnamed(int rank, int n, void *arg) {
  (void)rank, (void)n, (void)arg;
  dcomm_group_t g;
  int ok[] = {0, 1}, dup[] = {1, 1}, out[] = {0, 7};
  char longname[200];
  memset(longname, 'x', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = 0;
  MP_REQUIRE(dcomm_new_group_named(NULL, ok, 2, &g) == DCOMM_EINVAL, "NULL name");
  MP_REQUIRE(dcomm_new_group_named("", ok, 2, &g) == DCOMM_EINVAL, "empty name");
  MP_REQUIRE(dcomm_new_group_named(longname, ok, 2, &g) == DCOMM_EINVAL, "name of 199 bytes");
  MP_REQUIRE(strstr(dcomm_last_error(), "at most") != NULL, "message: %s", dcomm_last_error());
  MP_REQUIRE(dcomm_new_group_named("d", dup, 2, &g) == DCOMM_EINVAL, "duplicate ranks");
  MP_REQUIRE(strstr(dcomm_last_error(), "twice") && strstr(dcomm_last_error(), "\"d\""), "message: %s",
             dcomm_last_error());
  MP_REQUIRE(dcomm_new_group_named("d", out, 2, &g) == DCOMM_EINVAL, "rank out of range");
  MP_REQUIRE(dcomm_new_group_named("d", ok, 0, &g) == DCOMM_EINVAL, "empty group");
  MP_REQUIRE(dcomm_new_group_named("d", NULL, 2, &g) == DCOMM_EINVAL, "NULL ranks");
  MP_REQUIRE(dcomm_new_group_named("d", ok, 2, NULL) == DCOMM_EINVAL, "NULL handle");
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_badnamed) { ck_assert_int_eq(mp_run(2, body_badnamed, NULL, 60), 0); }
END_TEST

/* Elastic mode, no launcher, 4 ranks with an even/odd split: rank 3
 * SIGKILLs itself; in the first recovery rank 2 SIGKILLs itself after the
 * plan (DCOMM_ELASTIC_TEST_DIE_BEFORE_BUILD), so ranks 0 and 1 fail to
 * build it (DCOMM_TIMEOUT) and call dcomm_elastic_recover() again, as
 * dcomm_elastic_run does. That retry must give them a world of 2. arg 1
 * (DCOMM_ELASTIC_SHRINK=0, the rebuild path): the split's mapping went
 * with the failed attempt, so it is a non-member handle: DCOMM_ENOTMEMBER,
 * size 0, no crash. arg 0 (tcp's default, shrink in place): the failed
 * attempt had already renumbered the groups to its plan, so the retry maps
 * them on: each survivor's parity group is itself alone. */
static int body_retry(int rank, int n, void *arg) {
  int rebuild = *(int *)arg;
  (void)n;
  dcomm_group_t parity;
  MP_OK(dcomm_group_split(NULL, rank % 2, 0, &parity));
  MP_OK(dcomm_barrier(parity));
  int rc = dcomm_barrier(NULL);
  if (rank == 3) kill(getpid(), SIGKILL);
  int32_t x = 1;
  /* A rank still in the barrier's last round when rank 3 dies sees the
   * loss there (every link of the world is watched while it waits). */
  if (rc == 0) rc = dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL);
  MP_REQUIRE(dcomm_elastic_recoverable(rc), "barrier or all_reduce after the kill: %s", dcomm_error_name(rc));
  int tries = 0;
  for (rc = -1; rc < 0 && tries < 4; tries++) {
    rc = dcomm_elastic_recover();
    fprintf(stderr, "[rank %d] recovery %d: %s %s\n", rank, tries + 1, dcomm_error_name(rc), rc ? dcomm_last_error() : "");
    MP_REQUIRE(rc == 0 || dcomm_elastic_recoverable(rc), "recovery failed unrecoverably: %s", dcomm_error_name(rc));
  }
  MP_REQUIRE(rc == 0, "no recovery succeeded in %d tries", tries);
  MP_REQUIRE(tries >= 2, "the first recovery did not fail (the test hook did not act)");
  MP_REQUIRE(dcomm_world_size() == 2, "world of %d after the retry", dcomm_world_size());
  x = 1;
  MP_OK(dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL));
  MP_REQUIRE(x == 2, "sum %d on the new world", x);
  rc = dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, parity);
  if (rebuild) {
    MP_REQUIRE(rc == DCOMM_ENOTMEMBER, "a collective on the old split returned %s, want DCOMM_ENOTMEMBER",
               dcomm_error_name(rc));
    MP_REQUIRE(dcomm_group_size(parity) == 0, "the old split has size %d", dcomm_group_size(parity));
  } else {
    MP_REQUIRE(rc == 0 && x == 2, "a collective on the mapped split: %s, %d", dcomm_error_name(rc), x);
    MP_REQUIRE(dcomm_group_size(parity) == 1 && dcomm_group_rank(parity) == 0, "the mapped split: size %d rank %d",
               dcomm_group_size(parity), dcomm_group_rank(parity));
  }
  MP_OK(dcomm_group_free(parity));
  return 0;
}

START_TEST(test_failed_recovery_retry) {
  struct mp_result res;
  int rebuild = _i;
  const char *env[][2] = {{"DCOMM_ELASTIC", "1"},           {"DCOMM_ELASTIC_SETTLE", "0.5"},
                          {"DCOMM_TIMEOUT", "3"},           {"DCOMM_HEARTBEAT_TIMEOUT", "2"},
                          {"DCOMM_ELASTIC_MIN_WORLD", "2"}, {"DCOMM_ELASTIC_TEST_DIE_BEFORE_BUILD", "2"},
                          {"DCOMM_ELASTIC_SHRINK", rebuild ? "0" : "1"}};
  for (size_t i = 0; i < sizeof(env) / sizeof(env[0]); i++) setenv(env[i][0], env[i][1], 1);
  mp_run_ex(4, body_retry, &rebuild, 60, 0, &res);
  for (size_t i = 0; i < sizeof(env) / sizeof(env[0]); i++) unsetenv(env[i][0]);
  ck_assert_int_eq(res.timed_out, 0);
  ck_assert_int_eq(res.exit_code[3], 128 + SIGKILL);
  ck_assert_int_eq(res.exit_code[2], 128 + SIGKILL);
  ck_assert_msg(res.exit_code[0] == 0 && res.exit_code[1] == 0, "survivors exited %d, %d", res.exit_code[0],
                res.exit_code[1]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("groups");
  TCase *tc = tcase_create("groups");
  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, test_overlap);
  tcase_add_test(tc, test_split);
  tcase_add_test(tc, test_badgroups);
  tcase_add_test(tc, test_settings_at_creation);
  tcase_add_test(tc, test_named);
  tcase_add_test(tc, test_badnamed);
  tcase_add_loop_test(tc, test_failed_recovery_retry, 0, 2);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
