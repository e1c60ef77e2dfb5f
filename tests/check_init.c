/*
 * check_init.c: the init methods as torchrun users and scripts use them:
 * env:// with torchrun's variables, tcp:// and file:// URLs, clear
 * DCOMM_EINVAL errors naming the missing or contradictory variable, the
 * handshake refusing another job or a wrong token with DCOMM_EAUTH,
 * init / finalize life cycle rules, the nccl backend and
 * dcomm_set_stream answering clearly where they cannot work, and the
 * optional libraries (libcurl, libpmix) opened only by what uses them.
 */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm.h"
#include "dynlib.h"
#include "harness.h"
#include "init_method.h"
#include "log.h"

static void clear_env(void) {
  const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "DCOMM_INIT_METHOD", "DCOMM_AUTH_TOKEN", "DCOMM_JOB_ID", "DCOMM_TIMEOUT"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
}

static int port_for_env;

static int body_env(int rank, int n, void *arg) {
  char v[32];
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(v, sizeof(v), "%d", port_for_env);
  setenv("MASTER_PORT", v, 1);
  snprintf(v, sizeof(v), "%d", rank);
  setenv("RANK", v, 1);
  snprintf(v, sizeof(v), "%d", n);
  setenv("WORLD_SIZE", v, 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  MP_OK(dcomm_init(NULL, NULL));
  MP_REQUIRE(dcomm_rank() == rank && dcomm_world_size() == n, "rank %d size %d", dcomm_rank(), dcomm_world_size());
  MP_REQUIRE(dcomm_local_rank() == rank % 2 && dcomm_local_world_size() == 2, "local rank %d", dcomm_local_rank());
  MP_REQUIRE(strcmp(dcomm_backend_name(), "tcp") == 0, "backend %s", dcomm_backend_name());
  int32_t x = 1;
  MP_OK(dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL));
  MP_REQUIRE(x == n, "sum %d", x);
  MP_REQUIRE(dcomm_init(NULL, NULL) == DCOMM_EINVAL, "a second init must be refused");
  MP_OK(dcomm_finalize());
  MP_REQUIRE(dcomm_rank() == DCOMM_ENOTINIT, "rank after finalize");
  return 0;
}

START_TEST(test_env) {
  struct mp_result res;
  clear_env();
  port_for_env = mp_free_port();
  ck_assert_int_eq(mp_run_ex(4, body_env, NULL, 60, 1, &res), 0);
}
END_TEST

/* Each entry: environment to set, init URL, the word the error must name. */
struct bad_case {
  const char *env[6];
  const char *url;
  const char *word;
};

static const struct bad_case bad_cases[] = {
    {{"MASTER_PORT=29500", "RANK=0", "WORLD_SIZE=1"}, "env://", "MASTER_ADDR"},
    {{"MASTER_ADDR=127.0.0.1", "RANK=0", "WORLD_SIZE=1"}, "env://", "MASTER_PORT"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "WORLD_SIZE=2"}, "env://", "RANK"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "RANK=0"}, "env://", "WORLD_SIZE"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "RANK=2", "WORLD_SIZE=2"}, "env://", "rank 2"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=99999", "RANK=0", "WORLD_SIZE=2"}, "env://", "MASTER_PORT"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "RANK=x", "WORLD_SIZE=2"}, "env://", "RANK"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=3", "LOCAL_WORLD_SIZE=2"},
     "env://", "LOCAL_RANK"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=3"}, "env://",
     "LOCAL_WORLD_SIZE"},
    {{NULL}, "tcp://127.0.0.1?rank=0&world_size=1", "port"},
    {{NULL}, "tcp://127.0.0.1:29500?world_size=1", "rank"},
    {{NULL}, "tcp://127.0.0.1:29500?rank=0", "world_size"},
    {{NULL}, "tcp://127.0.0.1:29500?rank=0&world_size=zero", "world_size"},
    {{NULL}, "file://relative?rank=0&world_size=1", "file://"},
    {{NULL}, "udp://127.0.0.1:1", "unknown init method"},
    /* Some of torchrun's variables, not all: name the missing ones and dcomm-run. */
    {{"RANK=0", "WORLD_SIZE=2"}, NULL, "MASTER_ADDR, MASTER_PORT are not"},
    {{"RANK=0", "WORLD_SIZE=2"}, NULL, "dcomm-run"},
    {{"MASTER_PORT=29500"}, NULL, "dcomm-run"},
    {{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "WORLD_SIZE=2"}, NULL, "dcomm-run"},
    {{"DCOMM_TIMEOUT=abc"}, "tcp://127.0.0.1:29500?rank=0&world_size=1", "DCOMM_TIMEOUT"},
};

START_TEST(test_bad_input) {
  const struct bad_case *bc = &bad_cases[_i];
  clear_env();
  for (int k = 0; k < 6 && bc->env[k]; k++) putenv((char *)bc->env[k]);
  int rc = dcomm_init("tcp", bc->url);
  ck_assert_msg(rc == DCOMM_EINVAL, "case %d (%s): got %s", _i, bc->url ? bc->url : "(null)", dcomm_error_name(rc));
  ck_assert_msg(strstr(dcomm_last_error(), bc->word) != NULL, "case %d: message '%s' does not name '%s'", _i,
                dcomm_last_error(), bc->word);
  ck_assert_int_eq(dcomm_initialized(), 0);
}
END_TEST

static char file_path[256];

static int body_file(int rank, int n, void *arg) {
  char url[400];
  snprintf(url, sizeof(url), "file://%s?rank=%d&world_size=%d", file_path, rank, n);
  MP_OK(dcomm_init("tcp", url));
  double x = rank + 0.5;
  MP_OK(dcomm_all_reduce(&x, 1, DCOMM_FLOAT64, DCOMM_MAX, NULL));
  MP_REQUIRE(x == n - 0.5, "max %g", x);
  MP_OK(dcomm_finalize());
  return 0;
}

START_TEST(test_file) {
  struct mp_result res;
  clear_env();
  snprintf(file_path, sizeof(file_path), "/tmp/dcomm-file-store-%d", (int)getpid());
  unlink(file_path);
  ck_assert_int_eq(mp_run_ex(3, body_file, NULL, 60, 1, &res), 0);
  ck_assert_msg(access(file_path, F_OK) != 0, "the last rank to finalize removes the shared file");
}
END_TEST

/* Rank 1 presents another token (or job): it is refused with DCOMM_EAUTH. */
static int body_auth(int rank, int n, void *arg) {
  const char *var = arg;
  setenv(var, rank == 1 ? "intruder" : "the-real-one", 1);
  setenv("DCOMM_TIMEOUT", "3", 1);
  setenv("DCOMM_CONNECT_TIMEOUT", "3", 1);
  int rc = dcomm_init("tcp", getenv("DCOMM_TEST_URL"));
  if (rank == 1) {
    MP_REQUIRE(rc == DCOMM_EAUTH, "intruder got %s", dcomm_error_name(rc));
    return 0;
  }
  /* rank 0 waits for a peer that never gets in: a clear timeout */
  MP_REQUIRE(rc == DCOMM_ETIMEDOUT, "rank 0 got %s (%s)", dcomm_error_name(rc), dcomm_last_error());
  return 0;
}

START_TEST(test_auth_token) {
  struct mp_result res;
  clear_env();
  ck_assert_int_eq(mp_run_ex(2, body_auth, "DCOMM_AUTH_TOKEN", 60, 1, &res), 0);
}
END_TEST

START_TEST(test_auth_job) {
  struct mp_result res;
  clear_env();
  ck_assert_int_eq(mp_run_ex(2, body_auth, "DCOMM_JOB_ID", 60, 1, &res), 0);
}
END_TEST

/* The same token on every rank: init works and finalize / init again. */
static int body_reinit(int rank, int n, void *arg) {
  setenv("DCOMM_AUTH_TOKEN", "s3cret", 1);
  MP_OK(dcomm_init("tcp", getenv("DCOMM_TEST_URL")));
  MP_OK(dcomm_barrier(NULL));
  MP_OK(dcomm_finalize());
  MP_REQUIRE(dcomm_finalize() == DCOMM_ENOTINIT, "double finalize");
  return 0;
}

START_TEST(test_token_ok) {
  struct mp_result res;
  clear_env();
  ck_assert_int_eq(mp_run_ex(3, body_reinit, NULL, 60, 1, &res), 0);
}
END_TEST

START_TEST(test_unknown_backend) {
  clear_env();
  int rc = dcomm_init("nosuch", "tcp://127.0.0.1:1?rank=0&world_size=1");
  ck_assert_int_eq(rc, DCOMM_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "nosuch"));
  rc = dcomm_init("../evil", "tcp://127.0.0.1:1?rank=0&world_size=1");
  ck_assert_int_eq(rc, DCOMM_EINVAL);
}
END_TEST

START_TEST(test_nccl_without_gpu) {
  clear_env();
  int port = mp_free_port();
  char url[128];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=0&world_size=1", port);
  int rc = dcomm_init("nccl", url);
  ck_assert_int_ne(rc, 0);
  const char *msg = dcomm_last_error();
  /* Either the module is not built, or it names the missing device. */
  ck_assert_msg(strstr(msg, "CUDA") || strstr(msg, "not built"), "unclear nccl error: %s", msg);
  fprintf(stderr, "nccl here: %s: %s\n", dcomm_error_name(rc), msg);
}
END_TEST

START_TEST(test_singleton_tcp) {
  clear_env();
  char url[128];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=0&world_size=1", mp_free_port());
  ck_assert_int_eq(dcomm_init(NULL, url), 0);
  ck_assert_int_eq(dcomm_world_size(), 1);
  float x[3] = {1, 2, 3};
  ck_assert_int_eq(dcomm_all_reduce(x, 3, DCOMM_FLOAT32, DCOMM_AVG, NULL), 0);
  ck_assert(x[2] == 3.0f);
  ck_assert_int_eq(dcomm_finalize(), 0);
  /* and again, on a new port */
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=0&world_size=1", mp_free_port());
  ck_assert_int_eq(dcomm_init(NULL, url), 0);
  ck_assert_int_eq(dcomm_finalize(), 0);
}
END_TEST

/* Whether a library whose file name contains name is mapped here. */
static int mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int found = 0;
  ck_assert_ptr_nonnull(f);
  while (!found && fgets(line, sizeof(line), f)) found = strstr(line, name) != NULL;
  fclose(f);
  return found;
}

/* libcurl and libpmix are opened by the features that use them, never by
 * a rank that uses neither; a library that cannot be opened, or lacks a
 * function, is a clear DCOMM_ENOTSUP. */
START_TEST(test_optional_libraries) {
  clear_env();
  char url[128];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=0&world_size=1", mp_free_port());
  ck_assert_int_eq(dcomm_init(NULL, url), 0);
  int32_t x = 1;
  ck_assert_int_eq(dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL), 0);
  ck_assert_int_eq(dcomm_finalize(), 0);
  ck_assert_msg(!mapped("libcurl"), "libcurl was loaded by a rank that does not use etcd");
  ck_assert_msg(!mapped("libpmix"), "libpmix was loaded by a rank that does not use PMIx");

  double (*cosine)(double) = NULL, (*nothing)(double) = NULL;
  const char *names[] = {"cos"}, *bad_names[] = {"cos", "dcomm_no_such_function"};
  void **slots[] = {(void **)&cosine}, **bad_slots[] = {(void **)&cosine, (void **)&nothing};
  struct dcomm_dynlib libm = {.soname = "libm.so.6", .feature = "a test", .install_hint = "none", .names = names,
                              .slots = slots, .n = 1};
  ck_assert_int_eq(dcomm__dynlib_load(&libm), 0);
  ck_assert_int_eq(dcomm__dynlib_load(&libm), 0); /* once loaded, loaded */
  ck_assert(cosine(0.0) == 1.0);
  struct dcomm_dynlib absent = {.soname = "libdcomm-no-such-library.so.7", .feature = "the frobnicator",
                                .install_hint = "install frob", .names = names, .slots = slots, .n = 1};
  ck_assert_int_eq(dcomm__dynlib_load(&absent), DCOMM_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "the frobnicator needs libdcomm-no-such-library.so.7"));
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "install frob"));
  ck_assert_int_eq(dcomm__dynlib_load(&absent), DCOMM_ENOTSUP); /* the same answer again */
  struct dcomm_dynlib lacking = {.soname = "libm.so.6", .feature = "a test", .install_hint = "none",
                                 .names = bad_names, .slots = bad_slots, .n = 2};
  ck_assert_int_eq(dcomm__dynlib_load(&lacking), DCOMM_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "dcomm_no_such_function"));
  ck_assert_ptr_null(nothing);
}
END_TEST

/* The usual mistakes at rendezvous fail fast and name the fix. arg: 0
 * rank 1 is told another WORLD_SIZE; 1 rank 1 has a wrong MASTER_PORT;
 * 2 (3 ranks) rank 0 and rank 1 are told 2, rank 2 is told 3 (rank 1
 * starts 1 s late, so rank 2 has checked in before rank 0 heard from all of
 * its world: rank 0 and 1 must not make a world of 2); 3 (3 ranks) rank 1
 * is told 2, the others 3 (rank 2 agrees with rank 0, and still fails with
 * both values); 4 (3 ranks) rank 2 checks in, then stalls before building
 * the world (DCOMM_INIT_TEST_STALL_RANK): the others fail within about
 * DCOMM_CONNECT_TIMEOUT (not DCOMM_TIMEOUT), naming it. */
static const int mistake_ranks[] = {2, 2, 3, 3, 3};

static int mistake_size(int kind, int rank, int n) {
  if (kind == 0 && rank == 1) return n + 2;
  if (kind == 2) return rank == 2 ? 3 : 2;
  if (kind == 3) return rank == 1 ? 2 : 3;
  return n;
}

static int body_mistake(int rank, int n, void *arg) {
  int kind = *(int *)arg;
  char v[32];
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(v, sizeof(v), "%d", kind == 1 && rank == 1 ? mp_free_port() : port_for_env);
  setenv("MASTER_PORT", v, 1);
  snprintf(v, sizeof(v), "%d", rank);
  setenv("RANK", v, 1);
  snprintf(v, sizeof(v), "%d", mistake_size(kind, rank, n));
  setenv("WORLD_SIZE", v, 1);
  /* 2, 3: a disagreement fails at once, not at a timeout */
  setenv("DCOMM_CONNECT_TIMEOUT", kind == 2 || kind == 3 ? "10" : "2", 1);
  setenv("DCOMM_TIMEOUT", "60", 1);
  if (kind == 4) setenv("DCOMM_INIT_TEST_STALL_RANK", "2", 1);
  if (kind == 2 && rank == 1) usleep(1000000);
  double t0 = mp_now();
  int rc = dcomm_init("tcp", NULL);
  double took = mp_now() - t0;
  const char *msg = dcomm_last_error();
  fprintf(stderr, "[mistake %d, rank %d] %s after %.2f s: %s\n", kind, rank, dcomm_error_name(rc), took, msg);
  MP_REQUIRE(rc < 0, "init succeeded");
  MP_REQUIRE(took < (kind == 4 && rank == 2 ? 8 : kind == 2 || kind == 3 ? 4 : 6), "init failed only after %.1f s: %s",
             took, msg);
  if (kind == 2 || kind == 3) {
    MP_REQUIRE(rc == DCOMM_EINVAL && strstr(msg, "WORLD_SIZE disagrees") && strstr(msg, "told 2") &&
                   strstr(msg, "told 3"), "the disagreement is not named with both values: %s", msg);
  } else if (kind == 4) {
    MP_REQUIRE(rank == 2 || (rc == DCOMM_ETIMEDOUT && strstr(msg, "world rank 2") &&
                             strstr(msg, "DCOMM_CONNECT_TIMEOUT")), "the stalled rank is not named: %s", msg);
  } else if (kind == 0) {
    MP_REQUIRE(rc == DCOMM_EINVAL && strstr(msg, "WORLD_SIZE disagrees") && strstr(msg, "told 2") &&
                   strstr(msg, "told 4"), "the disagreement is not named with both values: %s", msg);
  } else if (rank == 1) {
    MP_REQUIRE(strstr(msg, "MASTER_PORT") && strstr(msg, "DCOMM_CONNECT_TIMEOUT"), "wrong port: %s", msg);
  } else {
    MP_REQUIRE(rc == DCOMM_ETIMEDOUT && strstr(msg, "world rank 1 never reached the store") &&
                   strstr(msg, "MASTER_PORT") && strstr(msg, "DCOMM_CONNECT_TIMEOUT"), "rank 0: %s", msg);
  }
  return 0;
}

START_TEST(test_rendezvous_mistakes) {
  struct mp_result res;
  int kind = _i;
  clear_env();
  port_for_env = mp_free_port();
  ck_assert_int_eq(mp_run_ex(mistake_ranks[kind], body_mistake, &kind, 30, 1, &res), 0);
  unsetenv("DCOMM_CONNECT_TIMEOUT");
}
END_TEST

/* Runs a recv that times out with stderr in a file; returns 1 if what was
 * logged has a line with level and "recv on world". */
static int recv_logged(const char *level) {
  FILE *cap = tmpfile();
  if (!cap) return -1;
  fflush(stderr);
  int saved = dup(2);
  dup2(fileno(cap), 2);
  int32_t x;
  int rc = dcomm_recv(&x, 1, DCOMM_INT32, 0, 7, NULL);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char buf[4096] = "";
  size_t n = (size_t)pread(fileno(cap), buf, sizeof(buf) - 1, 0);
  buf[n < sizeof(buf) ? n : 0] = 0;
  fclose(cap);
  if (rc != DCOMM_ETIMEDOUT) return -1;
  for (char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (strstr(l, level) && strstr(l, "recv on world") && (!strchr(l, '\n') || strstr(l, "recv on world") < strchr(l, '\n')))
      return 1;
  return 0;
}

/* An error returned to the caller is not also printed at the default
 * level (warn); it is in the log at info. */
static int body_quiet(int rank, int n, void *arg) {
  (void)n, (void)arg;
  if (rank == 0) {
    usleep(1500000);
    return 0;
  }
  MP_OK(dcomm_group_set_timeout(NULL, 0.3));
  unsetenv("DCOMM_LOG_SUBSYS");
  setenv("DCOMM_LOG_LEVEL", "warn", 1);
  dcomm__log_setup();
  int r = recv_logged("WARN");
  MP_REQUIRE(r == 0, "a recv that timed out was logged at WARN (or did not time out): %d", r);
  setenv("DCOMM_LOG_LEVEL", "info", 1);
  dcomm__log_setup();
  r = recv_logged("INFO");
  MP_REQUIRE(r == 1, "a recv that timed out is not in the log at INFO: %d", r);
  return 0;
}

START_TEST(test_returned_errors_quiet) {
  clear_env();
  ck_assert_int_eq(mp_run(2, body_quiet, NULL, 60), 0);
}
END_TEST

/* Every init method of the table dcomm-info prints is one dcomm_init
 * dispatches (never "unknown"); pmix:// and etcd:// follow the build. */
START_TEST(test_method_table) {
  int n = 0, pmix = -1, etcd = -1;
  for (const struct dcomm_init_method_info *m; (m = dcomm__init_method_info(n)); n++) {
    clear_env();
    setenv("DCOMM_CONNECT_TIMEOUT", "0.2", 1);
    setenv("DCOMM_TIMEOUT", "0.5", 1);
    if (!strcmp(m->scheme, "pmix://")) pmix = m->built;
    if (!strcmp(m->scheme, "etcd://")) etcd = m->built;
    struct dcomm_init_spec spec;
    int rc = dcomm__init_spec_parse(m->scheme, &spec);
    const char *msg = rc < 0 ? dcomm_last_error() : "";
    ck_assert_msg(!strstr(msg, "unknown init method"), "%s: %s", m->scheme, msg);
    ck_assert_msg(m->built == !strstr(msg, "built without"), "%s (built %d): %s", m->scheme, m->built, msg);
    if (rc == 0) ck_assert_int_eq((int)spec.kind, (int)m->kind);
  }
  ck_assert_int_ge(n, 6);
#ifdef DCOMM_HAVE_PMIX
  ck_assert_int_eq(pmix, 1);
#else
  ck_assert_int_eq(pmix, 0);
#endif
#ifdef DCOMM_HAVE_ETCD
  ck_assert_int_eq(etcd, 1);
#else
  ck_assert_int_eq(etcd, 0);
#endif
  unsetenv("DCOMM_CONNECT_TIMEOUT");
  unsetenv("DCOMM_TIMEOUT");
}
END_TEST

/* Started alone with nothing set (no launcher, no variables): a world of
 * one, as an MPI singleton, twice in a row. */
START_TEST(test_singleton_noenv) {
  clear_env();
  unsetenv("PMIX_NAMESPACE");
  unsetenv("SLURM_PROCID");
  unsetenv("PBS_JOBID");
  for (int round = 0; round < 2; round++) {
    ck_assert_msg(dcomm_init(NULL, NULL) == 0, "round %d: %s", round, dcomm_last_error());
    ck_assert_int_eq(dcomm_rank(), 0);
    ck_assert_int_eq(dcomm_world_size(), 1);
    ck_assert_int_eq(dcomm_local_world_size(), 1);
    int32_t x[2] = {3, 4};
    ck_assert_int_eq(dcomm_all_reduce(x, 2, DCOMM_INT32, DCOMM_SUM, NULL), 0);
    ck_assert(x[0] == 3 && x[1] == 4);
    ck_assert_int_eq(dcomm_barrier(NULL), 0);
    ck_assert_int_eq(dcomm_finalize(), 0);
  }
}
END_TEST

/* dcomm_set_stream is for GPU backends: tcp says so, and the usual handle
 * checks apply before any backend is asked. */
START_TEST(test_set_stream_tcp) {
  clear_env();
  int dummy;
  ck_assert_int_eq(dcomm_set_stream(NULL, &dummy), DCOMM_ENOTINIT);
  char url[128];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=0&world_size=1", mp_free_port());
  ck_assert_int_eq(dcomm_init("tcp", url), 0);
  ck_assert_int_eq(dcomm_set_stream(NULL, &dummy), DCOMM_ENOTSUP);
  ck_assert_msg(strstr(dcomm_last_error(), "tcp backend has no streams"), "%s", dcomm_last_error());
  ck_assert_int_eq(dcomm_set_stream((dcomm_group_t)&dummy, NULL), DCOMM_EINVAL);
  float x = 2;
  ck_assert_int_eq(dcomm_all_reduce(&x, 1, DCOMM_FLOAT32, DCOMM_SUM, NULL), 0); /* still usable */
  ck_assert_int_eq(dcomm_finalize(), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("init");
  TCase *tc = tcase_create("init");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_env);
  tcase_add_loop_test(tc, test_bad_input, 0, (int)(sizeof(bad_cases) / sizeof(bad_cases[0])));
  tcase_add_test(tc, test_file);
  tcase_add_test(tc, test_auth_token);
  tcase_add_test(tc, test_auth_job);
  tcase_add_test(tc, test_token_ok);
  tcase_add_test(tc, test_unknown_backend);
  tcase_add_test(tc, test_nccl_without_gpu);
  tcase_add_test(tc, test_singleton_tcp);
  tcase_add_test(tc, test_optional_libraries);
  tcase_add_test(tc, test_singleton_noenv);
  tcase_add_test(tc, test_method_table);
  tcase_add_test(tc, test_returned_errors_quiet);
  tcase_add_loop_test(tc, test_rendezvous_mistakes, 0, 5);
  tcase_add_test(tc, test_set_stream_tcp);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
