/*
 * check_hostlist.c: the SLURM side of scheduler integration without a
 * cluster: the hostlist parser (pmix/hostlist.c) on every form SLURM
 * documents that dcomm supports (lists, ranges, zero padding, suffixes,
 * several bracket groups, white space) plus malformed and oversized input,
 * and dcomm__slurm_spec (pmix/slurm_env.c) on srun-like environments,
 * including missing and contradictory variables. Each test is forked, so it
 * may change the environment freely.
 */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "error.h"
#include "hostlist.h"
#include "slurm_env.h"

/* ---- hostlist ---- */

struct hl_case {
  const char *expr;
  const char *hosts[12]; /* expected expansion, NULL-terminated */
};

static const struct hl_case good[] = {
    {"node1", {"node1"}},
    {"node1,node2", {"node1", "node2"}},
    {"node[1-4]", {"node1", "node2", "node3", "node4"}},
    {"node[01-04,07],gpu3", {"node01", "node02", "node03", "node04", "node07", "gpu3"}},
    {"a[1-3]b", {"a1b", "a2b", "a3b"}},
    {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}},
    {"tux[0-3,5]", {"tux0", "tux1", "tux2", "tux3", "tux5"}},
    {"n[8-10]", {"n8", "n9", "n10"}},
    {"n[08-10]", {"n08", "n09", "n10"}},
    {"n[098-101]", {"n098", "n099", "n100", "n101"}},
    {"n[001-003]", {"n001", "n002", "n003"}},
    {"n[5]", {"n5"}},
    {"n[1,3,5]", {"n1", "n3", "n5"}},
    {"n[3,1]", {"n3", "n1"}},
    {"[1-3]", {"1", "2", "3"}},
    {"rack[0-1]_blade[0-1]", {"rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"}},
    {"n[1-2],m[3-4]x[5-6]", {"n1", "n2", "m3x5", "m3x6", "m4x5", "m4x6"}},
    {"a b\tc", {"a", "b", "c"}},
    {"a,,b,", {"a", "b"}},
    {" a , b ", {"a", "b"}},
    {"node-1.example.com,gpu_2", {"node-1.example.com", "gpu_2"}},
    {"linux[0-1],linux5", {"linux0", "linux1", "linux5"}},
    {"x[0-0]", {"x0"}},
    {"n[00-02]y", {"n00y", "n01y", "n02y"}},
};

START_TEST(test_expand_forms) {
  const struct hl_case *c = &good[_i];
  char **hosts = NULL;
  int n = -1, want = 0, cnt = -1;
  while (c->hosts[want]) want++;
  ck_assert_msg(dcomm__hostlist_expand(c->expr, &hosts, &n) == 0, "'%s': %s", c->expr, dcomm_last_error());
  ck_assert_msg(n == want, "'%s': %d hosts, expected %d", c->expr, n, want);
  for (int i = 0; i < n; i++) ck_assert_msg(!strcmp(hosts[i], c->hosts[i]), "'%s'[%d] = '%s', expected '%s'", c->expr, i, hosts[i], c->hosts[i]);
  char first[256];
  ck_assert_int_eq(dcomm__hostlist_first(c->expr, first, sizeof(first)), 0);
  ck_assert_str_eq(first, c->hosts[0]);
  ck_assert_int_eq(dcomm__hostlist_count(c->expr, &cnt), 0);
  ck_assert_int_eq(cnt, want);
  dcomm__hostlist_free(hosts, n);
}
END_TEST

static const char *const bad[] = {
    "node[1-",    "node[3-1]",  "[]",         "node[]",    "node[1-]",  "node[a]",   "node[1,]",
    "node]",      "node[[1]]",  "node[1-3",   "",          ",",         "  \t",      "node[1:3]",
    "node[-1]",   "node[ 1]",   "node[1,,2]", "a[1]]",     "node[",     "n[1-2]x]",  "n[1-2,b",
    "n[0-65536]", "a[1-300]b[1-300]",         "n[0-40000],m[0-40000]",  "n[1234567890123456789]",
    "n[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]x[1]", "bad\001name",
};

START_TEST(test_malformed) {
  const char *e = bad[_i];
  char **hosts = (char **)1;
  int n = -1;
  char first[256] = "x";
  ck_assert_msg(dcomm__hostlist_expand(e, &hosts, &n) == DCOMM_EINVAL, "'%s' was accepted", e);
  ck_assert_ptr_null(hosts);
  ck_assert_int_eq(n, 0);
  const char *msg = dcomm_last_error();
  ck_assert_msg(strstr(msg, "hostlist") != NULL, "message '%s' does not say hostlist", msg);
  ck_assert_int_eq(dcomm__hostlist_first(e, first, sizeof(first)), DCOMM_EINVAL);
  ck_assert_str_eq(first, "");
  ck_assert_int_eq(dcomm__hostlist_count(e, &n), DCOMM_EINVAL);
}
END_TEST

START_TEST(test_messages) {
  char **hosts;
  int n;
  ck_assert_int_eq(dcomm__hostlist_expand("node[3-1]", &hosts, &n), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "node[3-1]"));
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "below"));
  ck_assert_int_eq(dcomm__hostlist_expand("node[1-", &hosts, &n), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "unterminated"));
  ck_assert_int_eq(dcomm__hostlist_expand("[]", &hosts, &n), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "empty"));
  ck_assert_int_eq(dcomm__hostlist_expand("a]", &hosts, &n), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "']' without '['"));
  ck_assert_int_eq(dcomm__hostlist_expand("n[0-99999]", &hosts, &n), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "65536"));
  ck_assert_int_eq(dcomm__hostlist_expand(NULL, &hosts, &n), DCOMM_EINVAL);
}
END_TEST

/* The bound itself is allowed; one more host is not. */
START_TEST(test_bounds) {
  char **hosts;
  int n;
  ck_assert_int_eq(dcomm__hostlist_expand("n[0-65535]", &hosts, &n), 0);
  ck_assert_int_eq(n, 65536);
  ck_assert_str_eq(hosts[0], "n0");
  ck_assert_str_eq(hosts[65535], "n65535");
  dcomm__hostlist_free(hosts, n);
  ck_assert_int_eq(dcomm__hostlist_expand("a[1-256]b[1-256]", &hosts, &n), 0);
  ck_assert_int_eq(n, 65536);
  ck_assert_str_eq(hosts[257], "a2b2");
  dcomm__hostlist_free(hosts, n);
  ck_assert_int_eq(dcomm__hostlist_expand("n[0-65535],x", &hosts, &n), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__hostlist_count("a[1-256]b[1-257]", &n), DCOMM_EINVAL);
}
END_TEST

/* Names must fit: the caller's buffer, and 255 bytes for expand. */
START_TEST(test_long_names) {
  char small[6], name[400], **hosts;
  int n;
  ck_assert_int_eq(dcomm__hostlist_first("node1", small, sizeof(small)), 0);
  ck_assert_str_eq(small, "node1");
  ck_assert_int_eq(dcomm__hostlist_first("node10", small, sizeof(small)), DCOMM_EINVAL);
  ck_assert_str_eq(small, "");
  ck_assert_int_eq(dcomm__hostlist_first("node[1-2]0", small, sizeof(small)), DCOMM_EINVAL);
  memset(name, 'h', 300);
  name[300] = 0;
  ck_assert_int_eq(dcomm__hostlist_expand(name, &hosts, &n), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "longer"));
  name[255] = 0;
  ck_assert_int_eq(dcomm__hostlist_expand(name, &hosts, &n), 0);
  ck_assert_int_eq(n, 1);
  ck_assert_uint_eq(strlen(hosts[0]), 255);
  dcomm__hostlist_free(hosts, n);
}
END_TEST

/* ---- dcomm__slurm_spec ---- */

static void clear_slurm(void) {
  const char *vars[] = {"SLURM_PROCID",          "SLURM_NTASKS",        "SLURM_NPROCS",         "SLURM_LOCALID",
                        "SLURM_NODEID",          "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
                        "SLURM_TASKS_PER_NODE",  "SLURM_JOB_NODELIST",  "SLURM_STEP_NODELIST",  "SLURM_NODELIST",
                        "SLURM_JOB_ID",          "SLURM_JOBID",         "SLURM_STEP_ID",        "SLURM_STEPID",
                        "SLURMD_NODENAME",       "DCOMM_STORE_PORT",    "PBS_JOBID"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
}

/* A consistent srun task environment: task `rank` of 8 on 2 nodes. */
static void set_task(int rank) {
  char v[16];
  clear_slurm();
  snprintf(v, sizeof(v), "%d", rank);
  setenv("SLURM_PROCID", v, 1);
  setenv("SLURM_NTASKS", "8", 1);
  snprintf(v, sizeof(v), "%d", rank % 4);
  setenv("SLURM_LOCALID", v, 1);
  snprintf(v, sizeof(v), "%d", rank / 4);
  setenv("SLURM_NODEID", v, 1);
  setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  setenv("SLURM_JOB_NODELIST", "node[07-08]", 1);
  setenv("SLURM_JOB_ID", "1234", 1);
  setenv("SLURM_STEP_ID", "5", 1);
  setenv("SLURMD_NODENAME", rank < 4 ? "node07" : "node08", 1);
}

struct spec {
  int rank, size, lrank, lsize, port;
  char host[256];
};

static int spec(struct spec *s) {
  memset(s, 0, sizeof(*s));
  return dcomm__slurm_spec(&s->rank, &s->size, &s->lrank, &s->lsize, s->host, sizeof(s->host), &s->port);
}

START_TEST(test_slurm_detect) {
  clear_slurm();
  ck_assert_int_eq(dcomm__slurm_detect(), 0);
  ck_assert_int_eq(dcomm__pbs_detect(), 0);
  setenv("SLURM_PROCID", "0", 1);
  ck_assert_int_eq(dcomm__slurm_detect(), 1);
  setenv("PBS_JOBID", "12.server", 1);
  ck_assert_int_eq(dcomm__pbs_detect(), 1);
}
END_TEST

START_TEST(test_slurm_spec) {
  struct spec s;
  set_task(6);
  ck_assert_msg(spec(&s) == 0, "%s", dcomm_last_error());
  ck_assert_int_eq(s.rank, 6);
  ck_assert_int_eq(s.size, 8);
  ck_assert_int_eq(s.lrank, 2);
  ck_assert_int_eq(s.lsize, 4);
  ck_assert_str_eq(s.host, "node07");
  ck_assert_int_eq(s.port, 20000 + (1234 * 31 + 5) % 20000);
  /* rank 0 on the first node */
  set_task(0);
  ck_assert_msg(spec(&s) == 0, "%s", dcomm_last_error());
  ck_assert_int_eq(s.rank, 0);
  ck_assert_str_eq(s.host, "node07");
  /* the step's node list wins over the job's */
  setenv("SLURM_STEP_NODELIST", "node07", 1);
  setenv("SLURM_JOB_NODELIST", "node[01-08]", 1);
  ck_assert_int_eq(spec(&s), 0);
  ck_assert_str_eq(s.host, "node07");
  /* DCOMM_STORE_PORT overrides the derived port; ids are then not needed */
  setenv("DCOMM_STORE_PORT", "29400", 1);
  unsetenv("SLURM_JOB_ID");
  unsetenv("SLURM_STEP_ID");
  ck_assert_int_eq(spec(&s), 0);
  ck_assert_int_eq(s.port, 29400);
}
END_TEST

/* Older and alternative spellings srun also sets. */
START_TEST(test_slurm_variants) {
  struct spec s;
  clear_slurm();
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NPROCS", "5", 1);
  setenv("SLURM_LOCALID", "0", 1);
  setenv("SLURM_NODEID", "2", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2),1", 1);
  setenv("SLURM_NODELIST", "rack[1-2]-n[01-02]", 1);
  setenv("SLURM_JOBID", "4000000000", 1);
  setenv("SLURM_STEPID", "0", 1);
  ck_assert_msg(spec(&s) == 0, "%s", dcomm_last_error());
  ck_assert_int_eq(s.size, 5);
  ck_assert_int_eq(s.lsize, 1);
  ck_assert_str_eq(s.host, "rack1-n01");
  ck_assert_int_eq(s.port, (int)(20000 + (4000000000ull * 31) % 20000));
  /* SLURM_NTASKS_PER_NODE (from --ntasks-per-node) wins */
  setenv("SLURM_NTASKS_PER_NODE", "3", 1);
  ck_assert_int_eq(spec(&s), 0);
  ck_assert_int_eq(s.lsize, 3);
  /* the first entry without SLURM_NODEID */
  unsetenv("SLURM_NTASKS_PER_NODE");
  unsetenv("SLURM_NODEID");
  ck_assert_int_eq(spec(&s), 0);
  ck_assert_int_eq(s.lsize, 2);
  /* one task */
  clear_slurm();
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
  setenv("SLURM_LOCALID", "0", 1);
  setenv("SLURM_TASKS_PER_NODE", "1", 1);
  setenv("SLURM_JOB_NODELIST", "vm", 1);
  setenv("SLURM_JOB_ID", "7", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  ck_assert_int_eq(spec(&s), 0);
  ck_assert_str_eq(s.host, "vm");
  ck_assert_int_eq(s.port, 20000 + 7 * 31);
}
END_TEST

/* Each: variable to set (NAME=VALUE, or NAME= to unset) over set_task(rank),
 * and the word the error must contain. */
struct slurm_bad {
  int rank;
  const char *set[3];
  const char *word;
};

static const struct slurm_bad slurm_bad[] = {
    {1, {"SLURM_PROCID="}, "SLURM_PROCID"},
    {1, {"SLURM_NTASKS="}, "SLURM_NTASKS"},
    {1, {"SLURM_LOCALID="}, "SLURM_LOCALID"},
    {1, {"SLURM_TASKS_PER_NODE="}, "SLURM_TASKS_PER_NODE"},
    {1, {"SLURM_JOB_NODELIST="}, "SLURM_JOB_NODELIST"},
    {1, {"SLURM_JOB_ID="}, "SLURM_JOB_ID"},
    {1, {"SLURM_STEP_ID="}, "SLURM_STEP_ID"},
    {1, {"SLURM_PROCID=8"}, "SLURM_PROCID"},
    {1, {"SLURM_PROCID=-1"}, "SLURM_PROCID"},
    {1, {"SLURM_PROCID=one"}, "SLURM_PROCID"},
    {1, {"SLURM_NTASKS=0"}, "SLURM_NTASKS"},
    {1, {"SLURM_LOCALID=4"}, "SLURM_LOCALID"},
    {1, {"SLURM_TASKS_PER_NODE=4(2)"}, "SLURM_TASKS_PER_NODE"},
    {1, {"SLURM_TASKS_PER_NODE=4(x2"}, "SLURM_TASKS_PER_NODE"},
    {1, {"SLURM_TASKS_PER_NODE=x"}, "SLURM_TASKS_PER_NODE"},
    {1, {"SLURM_TASKS_PER_NODE=16"}, "SLURM_NTASKS"},
    {1, {"SLURM_NODEID=2"}, "SLURM_NODEID"},
    {1, {"SLURM_NODEID=x"}, "SLURM_NODEID"},
    {1, {"SLURM_NTASKS_PER_NODE=0"}, "SLURM_NTASKS_PER_NODE"},
    {3, {"SLURM_NTASKS_PER_NODE=2"}, "SLURM_LOCALID"},
    {1, {"SLURM_JOB_NODELIST=node[3-1]"}, "SLURM_JOB_NODELIST"},
    {1, {"SLURM_STEP_NODELIST=node[1-"}, "SLURM_STEP_NODELIST"},
    {1, {"SLURM_JOB_ID=abc"}, "SLURM_JOB_ID"},
    {1, {"DCOMM_STORE_PORT=70000"}, "DCOMM_STORE_PORT"},
    {1, {"DCOMM_STORE_PORT=x"}, "DCOMM_STORE_PORT"},
    {0, {"SLURMD_NODENAME=node08"}, "SLURMD_NODENAME"},
};

START_TEST(test_slurm_bad) {
  const struct slurm_bad *c = &slurm_bad[_i];
  struct spec s;
  set_task(c->rank);
  for (int i = 0; i < 3 && c->set[i]; i++) {
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", c->set[i]);
    char *eq = strchr(buf, '=');
    *eq = 0;
    if (eq[1]) setenv(buf, eq + 1, 1);
    else unsetenv(buf);
  }
  ck_assert_msg(spec(&s) == DCOMM_EINVAL, "case %d (%s) was accepted", _i, c->set[0]);
  ck_assert_msg(strstr(dcomm_last_error(), c->word) != NULL, "case %d: '%s' does not name %s", _i, dcomm_last_error(),
                c->word);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hostlist");
  TCase *tc = tcase_create("hostlist");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_expand_forms, 0, (int)(sizeof(good) / sizeof(good[0])));
  tcase_add_loop_test(tc, test_malformed, 0, (int)(sizeof(bad) / sizeof(bad[0])));
  tcase_add_test(tc, test_messages);
  tcase_add_test(tc, test_bounds);
  tcase_add_test(tc, test_long_names);
  suite_add_tcase(s, tc);
  TCase *ts = tcase_create("slurm_env");
  tcase_set_timeout(ts, 30);
  tcase_add_test(ts, test_slurm_detect);
  tcase_add_test(ts, test_slurm_spec);
  tcase_add_test(ts, test_slurm_variants);
  tcase_add_loop_test(ts, test_slurm_bad, 0, (int)(sizeof(slurm_bad) / sizeof(slurm_bad[0])));
  suite_add_tcase(s, ts);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
