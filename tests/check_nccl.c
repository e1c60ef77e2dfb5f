/*
 * check_nccl.c: what the nccl backend decides without a GPU, against the
 * real plugin code and the NCCL library installed here: the version
 * gating of ncclCommSplit / ncclCommShrink / ncclCommRevoke (build and run
 * time), the argument checks and fall-back answers of the comm_shrink and
 * comm_split ops, the
 * optional-op lookup of the backend table (no probe op), the message for
 * two ranks of one communicator on one GPU (ncclInvalidUsage), and what
 * post refuses up front (bitwise ops, a bad all_to_allv). Built only when
 * configure found NCCL; nothing here needs a CUDA device.
 */
#include "config.h"

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../plugins/nccl/nccl.h"

extern const struct dcomm_backend_v1 dcomm_backend_v1;

/* ---- a minimal host: errors are kept for the assertions ---- */

static char last_err[2048];

static double t_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static int t_log_enabled(int level, int subsys) {
  (void)level, (void)subsys;
  return 0;
}
static void t_log(int level, int subsys, const char *fmt, ...) { (void)level, (void)subsys, (void)fmt; }
static int t_err(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_err, sizeof(last_err), fmt, ap);
  va_end(ap);
  return code;
}

static struct dcomm_host host = {.size = sizeof(struct dcomm_host), .now = t_now, .log_enabled = t_log_enabled,
                                 .log = t_log, .err = t_err};

/* ---- version gating ---- */

START_TEST(test_version_constants) {
  /* The encodings NCCL uses, and the first versions with each call. */
  ck_assert_int_eq(NCCL_VERSION(2, 27, 0), 22700);
  ck_assert_int_eq(DNCCL_SPLIT_VERSION, 21800);
  ck_assert_int_eq(DNCCL_SHRINK_VERSION, 22700);
  ck_assert_int_eq(DNCCL_REVOKE_VERSION, 22807);
  ck_assert_int_eq(DNCCL_GROUP_ABORT_VERSION, 22200);
  /* Built against the header found by configure (2.28.9 here). */
  ck_assert_int_eq(DNCCL_BUILD_SPLIT, NCCL_VERSION_CODE >= 21800);
  ck_assert_int_eq(DNCCL_BUILD_SHRINK, NCCL_VERSION_CODE >= 22700);
  ck_assert_int_eq(DNCCL_BUILD_REVOKE, NCCL_VERSION_CODE >= 22807);
  char vs[32];
  dnccl_version_text(22809, vs, sizeof(vs));
  ck_assert_str_eq(vs, "2.28.9");
  dnccl_version_text(2804, vs, sizeof(vs)); /* before 2.9: X*1000 + Y*100 + Z */
  ck_assert_str_eq(vs, "2.8.4");
}
END_TEST

struct caps_case {
  int version;
  struct dnccl_syms syms;
  int split, shrink, revoke, group_abort;
};

#define ALL_SYMS {1, 1, 1, 1, 1, 1}
static const struct caps_case caps_cases[] = {
    {22809, ALL_SYMS, 1, 1, 1, 1},           /* 2.28.9: everything */
    {22807, ALL_SYMS, 1, 1, 1, 1},           /* first with revoke */
    {22806, ALL_SYMS, 1, 1, 0, 1},           /* a 2.28 before revoke */
    {22700, ALL_SYMS, 1, 1, 0, 1},           /* first with shrink */
    {22609, ALL_SYMS, 1, 0, 0, 1},           /* an older library loaded at run time */
    {22199, ALL_SYMS, 1, 0, 0, 0},           /* before grouped aborts */
    {21800, ALL_SYMS, 1, 0, 0, 0},           /* first with split */
    {21703, ALL_SYMS, 0, 0, 0, 0},           /* before split */
    {2804, ALL_SYMS, 0, 0, 0, 0},            /* old encoding */
    {22809, {1, 0, 1, 0, 1, 0}, 0, 0, 0, 1}, /* new version number, symbols missing */
    {22809, {0, 1, 0, 1, 0, 1}, 0, 0, 0, 1}, /* built against an old header */
    {22809, {1, 1, 1, 0, 1, 1}, 1, 0, 1, 1}, /* one symbol missing: only that call */
};

START_TEST(test_caps) {
  const struct caps_case *k = &caps_cases[_i];
  struct dnccl_caps c;
  memset(&c, 0x55, sizeof(c));
  dnccl_caps_compute(k->version, &k->syms, &c);
  ck_assert_msg(c.split == k->split && c.shrink == k->shrink && c.revoke == k->revoke && c.group_abort == k->group_abort,
                "case %d (version %d): split %d shrink %d revoke %d group_abort %d", _i, k->version, c.split, c.shrink,
                c.revoke, c.group_abort);
}
END_TEST

/* The library installed here, as init sees it. */
START_TEST(test_caps_loaded_library) {
  int ver = 0;
  ck_assert_int_eq(ncclGetVersion(&ver), ncclSuccess);
  struct dnccl_syms y = dnccl_syms_here();
  struct dnccl_caps c;
  dnccl_caps_compute(ver, &y, &c);
  fprintf(stderr, "loaded NCCL %d: split %d, shrink %d, revoke %d, group abort %d\n", ver, c.split, c.shrink, c.revoke,
          c.group_abort);
  ck_assert_int_eq(c.split, ver >= 21800 && NCCL_VERSION_CODE >= 21800);
  ck_assert_int_eq(c.shrink, ver >= 22700 && NCCL_VERSION_CODE >= 22700);
  ck_assert_int_eq(c.revoke, ver >= 22807 && NCCL_VERSION_CODE >= 22807);
}
END_TEST

/* ---- shrink arguments ---- */

struct plan_case {
  int size, rank, n;
  int ex[4];
  int rc, new_rank;
  const char *word; /* in the reason when rc < 0 */
};

static const struct plan_case plan_cases[] = {
    {4, 1, 1, {3}, 0, 1, NULL},
    {4, 3, 1, {0}, 0, 2, NULL},
    {8, 5, 3, {7, 0, 2}, 0, 3, NULL},   /* unsorted */
    {4, 1, 1, {1}, DCOMM_EINVAL, -1, "excludes itself"},
    {4, 0, 2, {2, 2}, DCOMM_EINVAL, -1, "twice"},
    {4, 0, 1, {4}, DCOMM_EINVAL, -1, "not a rank"},
    {4, 0, 1, {-1}, DCOMM_EINVAL, -1, "not a rank"},
    {4, 0, 0, {0}, DCOMM_EINVAL, -1, "no rank"},
    {2, 0, 2, {0, 1}, DCOMM_EINVAL, -1, "leaves none"},
};

START_TEST(test_shrink_plan) {
  const struct plan_case *k = &plan_cases[_i];
  int sorted[4] = {-9, -9, -9, -9}, nr = -7, ex[4];
  memcpy(ex, k->ex, sizeof(ex));
  char why[256] = "";
  int rc = dnccl_shrink_plan(k->size, k->rank, ex, k->n, sorted, &nr, why, sizeof(why));
  ck_assert_msg(rc == k->rc, "case %d: rc %d (%s)", _i, rc, why);
  if (rc == 0) {
    ck_assert_msg(nr == k->new_rank, "case %d: new rank %d, want %d", _i, nr, k->new_rank);
    for (int i = 1; i < k->n; i++) ck_assert_msg(sorted[i - 1] < sorted[i], "case %d: not sorted", _i);
    /* the caller's list is left as it was (NCCL sorts its own copy) */
    ck_assert_msg(!memcmp(ex, k->ex, sizeof(ex)), "case %d: the exclude list was changed", _i);
  } else {
    ck_assert_msg(strstr(why, k->word), "case %d: reason '%s' does not say '%s'", _i, why, k->word);
  }
}
END_TEST

/* A communicator as comm_create leaves it, without a device: these checks
 * all come before any CUDA or NCCL call. */
static struct dnccl_ctx ctx;
static struct dnccl_comm comm;

static void comm_setup(int rank, int size, int can_shrink) {
  memset(&ctx, 0, sizeof(ctx));
  memset(&comm, 0, sizeof(comm));
  ctx.host = &host;
  ctx.version = 22809;
  ctx.caps.shrink = can_shrink;
  ctx.caps.split = 1;
  ctx.split = 1;
  comm.ctx = &ctx;
  comm.rank = rank;
  comm.size = size;
  snprintf(comm.label, sizeof(comm.label), "world");
  pthread_mutex_init(&comm.mu, NULL);
  last_err[0] = 0;
}

START_TEST(test_shrink_op) {
  const struct dcomm_backend_v1 *be = &dcomm_backend_v1;
  int (*shrink)(void *, const int *, int, const struct dcomm_comm_spec *, void **) = DCOMM_BACKEND_OP(be, comm_shrink);
  ck_assert_ptr_nonnull(shrink);
  ck_assert_ptr_nonnull(DCOMM_BACKEND_OP(be, comm_set_stream));
  /* No point-to-point probe: dcomm_probe / dcomm_recv_any say ENOTSUP. */
  ck_assert_ptr_null(DCOMM_BACKEND_OP(be, probe));
  void *out = (void *)&out;
  int ex3 = 3, ex1 = 1;
  struct dcomm_comm_spec spec = {.comm_id = 7, .rank = 1, .size = 3, .deadline = t_now() + 5, .label = "world"};

  ck_assert_int_eq(shrink(NULL, &ex3, 1, &spec, &out), DCOMM_EINVAL);
  ck_assert_ptr_null(out);
  comm_setup(1, 4, 1);
  ck_assert_int_eq(shrink(&comm, &ex3, 1, &spec, NULL), DCOMM_EINVAL);
  ck_assert_int_eq(shrink(&comm, &ex3, 1, NULL, &out), DCOMM_EINVAL);

  /* an excluded rank must not call it */
  ck_assert_int_eq(shrink(&comm, &ex1, 1, &spec, &out), DCOMM_EINVAL);
  ck_assert_msg(strstr(last_err, "excludes itself"), "%s", last_err);

  /* the core's renumbering must agree with NCCL's */
  struct dcomm_comm_spec wrong = spec;
  wrong.rank = 0;
  ck_assert_int_eq(shrink(&comm, &ex3, 1, &wrong, &out), DCOMM_EINVAL);
  ck_assert_msg(strstr(last_err, "spec says rank 0 of 3"), "%s", last_err);
  wrong = spec;
  wrong.size = 4;
  ck_assert_int_eq(shrink(&comm, &ex3, 1, &wrong, &out), DCOMM_EINVAL);

  /* NCCL without ncclCommShrink: the caller falls back to a re-init */
  comm_setup(1, 4, 0);
  ctx.version = 22609;
  ck_assert_int_eq(shrink(&comm, &ex3, 1, &spec, &out), DCOMM_ENOTSUP);
  ck_assert_msg(strstr(last_err, "2.26.9") && strstr(last_err, "needs 2.27") && strstr(last_err, "re-create"), "%s",
                last_err);

  /* a handle already aborted (the timeout watchdog) cannot be shrunk */
  comm_setup(1, 4, 1);
  comm.aborted = DCOMM_EREVOKED;
  snprintf(comm.why, sizeof(comm.why), "all_reduce on world timed out");
  ck_assert_int_eq(shrink(&comm, &ex3, 1, &spec, &out), DCOMM_ENOTSUP);
  ck_assert_msg(strstr(last_err, "already aborted") && strstr(last_err, "timed out"), "%s", last_err);
  ck_assert_ptr_null(out);
}
END_TEST

/* comm_split: every refusal comes before any CUDA or NCCL call, and the
 * ones that mean "create it instead" are DCOMM_ENOTSUP. */
START_TEST(test_split_op) {
  int (*split)(void *, int, const struct dcomm_comm_spec *, void **) = DCOMM_BACKEND_OP(&dcomm_backend_v1, comm_split);
  ck_assert_ptr_nonnull(split);
  void *out = (void *)&out;
  struct dcomm_comm_spec spec = {.comm_id = 9, .rank = 1, .size = 2, .deadline = t_now() + 5, .label = "group 9"};
  ck_assert_int_eq(split(NULL, 0, &spec, &out), DCOMM_EINVAL);
  ck_assert_ptr_null(out);
  comm_setup(0, 4, 1);
  ck_assert_int_eq(split(&comm, 0, &spec, NULL), DCOMM_EINVAL);

  /* color and spec go together; the rank must fit the size */
  ck_assert_int_eq(split(&comm, 0, NULL, &out), DCOMM_EINVAL);
  ck_assert_msg(strstr(last_err, "without a spec"), "%s", last_err);
  ck_assert_int_eq(split(&comm, -1, &spec, &out), DCOMM_EINVAL);
  ck_assert_msg(strstr(last_err, "a spec with color -1"), "%s", last_err);
  ck_assert_int_eq(split(&comm, -2, NULL, &out), DCOMM_EINVAL);
  struct dcomm_comm_spec bad = spec;
  bad.rank = 2;
  ck_assert_int_eq(split(&comm, 3, &bad, &out), DCOMM_EINVAL);
  ck_assert_msg(strstr(last_err, "rank 2 is not in a communicator of size 2"), "%s", last_err);

  /* turned off, too old, or the parent is gone: the core creates instead */
  comm_setup(0, 4, 1);
  ctx.split = 0;
  ck_assert_int_eq(split(&comm, 0, &spec, &out), DCOMM_ENOTSUP);
  ck_assert_msg(strstr(last_err, "DCOMM_NCCL_SPLIT=0"), "%s", last_err);
  comm_setup(0, 4, 1);
  ctx.caps.split = 0;
  ctx.version = 21703;
  ck_assert_int_eq(split(&comm, -1, NULL, &out), DCOMM_ENOTSUP);
  ck_assert_msg(strstr(last_err, "2.17.3") && strstr(last_err, "needs 2.18"), "%s", last_err);
  comm_setup(0, 4, 1); /* comm.nc is NULL: released or aborted */
  ck_assert_int_eq(split(&comm, 0, &spec, &out), DCOMM_ENOTSUP);
  ck_assert_msg(strstr(last_err, "aborted or broke"), "%s", last_err);
  comm.aborted = DCOMM_EREVOKED;
  ck_assert_int_eq(split(&comm, -1, NULL, &out), DCOMM_ENOTSUP);
  ck_assert_ptr_null(out);
}
END_TEST

/* A table from an older module (shorter size) reads as "not supported". */
START_TEST(test_optional_op_lookup) {
  struct dcomm_backend_v1 t = dcomm_backend_v1;
  ck_assert_ptr_nonnull(DCOMM_BACKEND_OP(&t, comm_set_stream));
  t.size = offsetof(struct dcomm_backend_v1, comm_set_stream);
  ck_assert_ptr_nonnull(DCOMM_BACKEND_OP(&t, comm_shrink));
  ck_assert_ptr_null(DCOMM_BACKEND_OP(&t, comm_set_stream));
  t.size = offsetof(struct dcomm_backend_v1, comm_shrink);
  ck_assert_ptr_null(DCOMM_BACKEND_OP(&t, comm_shrink));
  t = dcomm_backend_v1;
  ck_assert_ptr_nonnull(DCOMM_BACKEND_OP(&t, comm_split));
  t.size = offsetof(struct dcomm_backend_v1, comm_split); /* a module from before comm_split */
  ck_assert_ptr_null(DCOMM_BACKEND_OP(&t, comm_split));
}
END_TEST

START_TEST(test_set_stream_args) {
  ck_assert_int_eq(dcomm_backend_v1.comm_set_stream(NULL, NULL), DCOMM_EINVAL);
  comm_setup(0, 2, 1);
  comm.user_stream = (cudaStream_t)&comm; /* as if one had been set */
  ck_assert_int_eq(dcomm_backend_v1.comm_set_stream(&comm, NULL), 0);
  ck_assert_ptr_null(comm.user_stream);
}
END_TEST

/* post refuses what NCCL cannot do before any CUDA or NCCL call (the
 * handle below is a stand-in that nothing may use): the bitwise
 * reductions, and an all_to_allv whose block to itself disagrees. */
START_TEST(test_post_refusals) {
  comm_setup(1, 3, 1);
  comm.nc = (ncclComm_t)(uintptr_t)0x1;
  void *req = (void *)&req;
  int32_t x[4] = {0};
  for (int op = DCOMM_BAND; op <= DCOMM_BXOR; op++) {
    static const char *const names[] = {"band", "bor", "bxor"};
    enum dcomm_coll colls[] = {DCOMM_COLL_ALL_REDUCE, DCOMM_COLL_REDUCE, DCOMM_COLL_REDUCE_SCATTER};
    for (int k = 0; k < 3; k++) {
      struct dcomm_coll_args a = {.coll = colls[k], .sendbuf = x, .recvbuf = x, .count = 1, .dtype = DCOMM_INT32,
                                  .op = (dcomm_op_t)op, .deadline = t_now() + 5};
      last_err[0] = 0;
      ck_assert_int_eq(dnccl_post(&comm, &a, &req), DCOMM_ENOTSUP);
      ck_assert_msg(strstr(last_err, names[op - DCOMM_BAND]) && strstr(last_err, "no bitwise reductions"), "%s",
                    last_err);
      ck_assert_ptr_null(req);
    }
  }
  size_t sc[3] = {1, 2, 3}, rc[3] = {1, 1, 1}, d[3] = {0, 1, 3};
  struct dcomm_vlayout v = {.sendcounts = sc, .sdispls = d, .recvcounts = rc, .rdispls = d};
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_TO_ALLV, .sendbuf = x, .recvbuf = x, .dtype = DCOMM_INT32,
                              .deadline = t_now() + 5, .v = &v};
  ck_assert_int_eq(dnccl_post(&comm, &a, &req), DCOMM_EMISMATCH);
  ck_assert_msg(strstr(last_err, "sends 2 elements to itself") && strstr(last_err, "expects 1"), "%s", last_err);
  a.v = NULL;
  ck_assert_int_eq(dnccl_post(&comm, &a, &req), DCOMM_EINVAL);
  ck_assert_str_eq(dnccl_coll_name(DCOMM_COLL_ALL_TO_ALLV), "all_to_allv");
  comm.nc = NULL;
}
END_TEST

/* ---- two ranks of one communicator on one GPU ---- */

START_TEST(test_duplicate_gpu_text) {
  char buf[640];
  dnccl_init_failure_text(ncclInvalidUsage, "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000", 0,
                          "0000:01:00.0", 1, 2, 1, buf, sizeof(buf));
  ck_assert_msg(strstr(buf, "ncclInvalidUsage") && strstr(buf, "Duplicate GPU") &&
                    strstr(buf, "cause: two ranks of one communicator on one GPU") && strstr(buf, "0000:01:00.0") &&
                    strstr(buf, "local rank 1 of 2") && strstr(buf, "1 CUDA device(s)"),
                "%s", buf);
  /* ncclInvalidUsage without NCCL's text: only a likely cause */
  dnccl_init_failure_text(ncclInvalidUsage, NULL, 0, "?", 0, 2, 1, buf, sizeof(buf));
  ck_assert_msg(strstr(buf, "ncclInvalidUsage: no detail") && strstr(buf, "a likely cause"), "%s", buf);
  /* any other failure is reported as it is */
  dnccl_init_failure_text(ncclSystemError, "socket connect failed", 0, "?", 0, 2, 1, buf, sizeof(buf));
  ck_assert_str_eq(buf, "ncclSystemError: socket connect failed");
  ck_assert_str_eq(dnccl_result_name(ncclRemoteError), "ncclRemoteError");
}
END_TEST

int main(void) {
  Suite *s = suite_create("nccl");
  TCase *tc = tcase_create("nccl");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_version_constants);
  tcase_add_loop_test(tc, test_caps, 0, (int)(sizeof(caps_cases) / sizeof(caps_cases[0])));
  tcase_add_test(tc, test_caps_loaded_library);
  tcase_add_loop_test(tc, test_shrink_plan, 0, (int)(sizeof(plan_cases) / sizeof(plan_cases[0])));
  tcase_add_test(tc, test_shrink_op);
  tcase_add_test(tc, test_split_op);
  tcase_add_test(tc, test_optional_op_lookup);
  tcase_add_test(tc, test_set_stream_args);
  tcase_add_test(tc, test_duplicate_gpu_text);
  tcase_add_test(tc, test_post_refusals);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
