/*
 * check_coll.c: every collective x every dtype x every op on world sizes
 * 1-5 (real processes on loopback), against a serial reference, with
 * counts 0, 1, odd, large enough for the ring, and >= 16 MiB; both
 * all_reduce algorithms forced; point-to-point with tags out of order;
 * the matrix again with each transport of the tcp backend forced (shared
 * memory is the default on one host, and with single-copy reads for all
 * but small frames), a point-to-point message larger than a shared-memory
 * ring sent to a rank busy in a barrier, and the single-copy probe;
 * bitwise reductions on random bits and their refusal for floating
 * dtypes; all_to_allv with uneven blocks (zeros, gaps, out of order) on
 * 2-4 ranks over each transport, its argument checks, and mismatched
 * counts (DCOMM_EMISMATCH, not a hang).
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "dcomm.h"
#include "harness.h"
#include "reduce.h"
#include "tcp.h"

static const dcomm_dtype_t all_dtypes[] = {DCOMM_INT8,    DCOMM_UINT8,    DCOMM_INT32,   DCOMM_UINT32, DCOMM_INT64,
                                           DCOMM_UINT64,  DCOMM_FLOAT16,  DCOMM_BFLOAT16, DCOMM_FLOAT32, DCOMM_FLOAT64};
#define NDT (sizeof(all_dtypes) / sizeof(all_dtypes[0]))

static int is_int(dcomm_dtype_t dt) { return dt <= DCOMM_UINT64; }

/* Input of rank r at element k for op: small integers, exact in every
 * dtype, whose reductions never overflow int8. */
static double val(int r, size_t k, dcomm_op_t op) {
  if (op == DCOMM_PROD) return 1 + (double)((r + k) % 2);
  return 1 + (double)((r * 7 + k * 3) % 11);
}

static double ref_reduce(int n, size_t k, dcomm_op_t op, dcomm_dtype_t dt) {
  double acc = val(0, k, op);
  for (int r = 1; r < n; r++) {
    double v = val(r, k, op);
    if (op == DCOMM_PROD) acc *= v;
    else if (op == DCOMM_MAX) acc = v > acc ? v : acc;
    else if (op == DCOMM_MIN) acc = v < acc ? v : acc;
    else if (op == DCOMM_BAND) acc = (double)((unsigned)acc & (unsigned)v);
    else if (op == DCOMM_BOR) acc = (double)((unsigned)acc | (unsigned)v);
    else if (op == DCOMM_BXOR) acc = (double)((unsigned)acc ^ (unsigned)v);
    else acc += v;
  }
  if (op == DCOMM_AVG) acc = is_int(dt) ? trunc(acc / n) : acc / n;
  return acc;
}

static int close_enough(double got, double want, dcomm_dtype_t dt) {
  double tol = dt == DCOMM_FLOAT16 ? 1e-2 : dt == DCOMM_BFLOAT16 ? 1e-2 : dt == DCOMM_FLOAT32 ? 1e-6 : 0;
  return fabs(got - want) <= tol * fabs(want);
}

static void *xalloc(size_t n) { return calloc(n ? n : 1, 1); }

struct plan {
  const size_t *counts;
  int ncounts;
  int all_dtypes;
};

/* Checks buf[0..count) against f; reports the first difference. */
#define CHECK_ELEMS(buf, dt, count, expr, what)                                           \
  for (size_t k_ = 0; k_ < (count); k_++) {                                              \
    size_t k = k_;                                                                       \
    double want_ = (expr), got_ = bench_get((buf), (dt), k);                                   \
    MP_REQUIRE(close_enough(got_, want_, (dt)), "%s %s count %zu: element %zu is %g, want %g", what, \
               dcomm__dtype_name(dt), (size_t)(count), k, got_, want_);                  \
  }

static int run_reducing(int rank, int n, dcomm_dtype_t dt, dcomm_op_t op, size_t count) {
  size_t es = dcomm_dtype_size(dt);
  char *buf = xalloc(count * es), *big = xalloc(count * es * (size_t)n), *out = xalloc(count * es);
  /* all_reduce */
  for (size_t k = 0; k < count; k++) bench_put(buf, dt, k, val(rank, k, op));
  MP_OK(dcomm_all_reduce(buf, count, dt, op, NULL));
  CHECK_ELEMS(buf, dt, count, ref_reduce(n, k, op, dt), "all_reduce");
  /* reduce to a root that moves with the count */
  int root = (int)(count % (size_t)n);
  for (size_t k = 0; k < count; k++) bench_put(buf, dt, k, val(rank, k, op));
  MP_OK(dcomm_reduce(buf, count, dt, op, root, NULL));
  if (rank == root) {
    CHECK_ELEMS(buf, dt, count, ref_reduce(n, k, op, dt), "reduce");
  } else {
    CHECK_ELEMS(buf, dt, count, val(rank, k, op), "reduce (non-root unchanged)");
  }
  /* reduce_scatter: block b of rank r's input is val(r, b*count + k) */
  for (size_t k = 0; k < count * (size_t)n; k++) bench_put(big, dt, k, val(rank, k, op));
  MP_OK(dcomm_reduce_scatter(big, out, count, dt, op, NULL));
  CHECK_ELEMS(out, dt, count, ref_reduce(n, (size_t)rank * count + k, op, dt), "reduce_scatter");
  free(buf), free(big), free(out);
  return 0;
}

static double code(int from, int to, size_t k) { return 1 + (double)((from * 5 + to * 3 + k) % 13); }

static int run_moving(int rank, int n, dcomm_dtype_t dt, size_t count) {
  size_t es = dcomm_dtype_size(dt);
  char *buf = xalloc(count * es), *all = xalloc(count * es * (size_t)n), *send = xalloc(count * es * (size_t)n);
  int root = (int)((count + 1) % (size_t)n);
  /* broadcast */
  for (size_t k = 0; k < count; k++) bench_put(buf, dt, k, rank == root ? code(root, 0, k) : 0);
  MP_OK(dcomm_broadcast(buf, count, dt, root, NULL));
  CHECK_ELEMS(buf, dt, count, code(root, 0, k), "broadcast");
  /* all_gather */
  for (size_t k = 0; k < count; k++) bench_put(buf, dt, k, code(rank, 1, k));
  memset(all, 0, count * es * (size_t)n);
  MP_OK(dcomm_all_gather(buf, all, count, dt, NULL));
  CHECK_ELEMS(all, dt, count * (size_t)n, code((int)(k / (count ? count : 1)), 1, k % (count ? count : 1)), "all_gather");
  /* gather */
  memset(all, 0, count * es * (size_t)n);
  MP_OK(dcomm_gather(buf, all, count, dt, root, NULL));
  if (rank == root) CHECK_ELEMS(all, dt, count * (size_t)n, code((int)(k / (count ? count : 1)), 1, k % (count ? count : 1)), "gather");
  /* scatter: block j of the root's buffer goes to rank j */
  for (size_t k = 0; k < count * (size_t)n; k++) bench_put(send, dt, k, code(root, (int)(k / (count ? count : 1)), k % (count ? count : 1)));
  memset(buf, 0, count * es);
  MP_OK(dcomm_scatter(rank == root ? send : NULL, buf, count, dt, root, NULL));
  CHECK_ELEMS(buf, dt, count, code(root, rank, k), "scatter");
  /* all_to_all: block j from rank r holds code(r, j, k) */
  for (size_t k = 0; k < count * (size_t)n; k++) bench_put(send, dt, k, code(rank, (int)(k / (count ? count : 1)), k % (count ? count : 1)));
  memset(all, 0, count * es * (size_t)n);
  MP_OK(dcomm_all_to_all(send, all, count, dt, NULL));
  CHECK_ELEMS(all, dt, count * (size_t)n, code((int)(k / (count ? count : 1)), rank, k % (count ? count : 1)), "all_to_all");
  MP_OK(dcomm_barrier(NULL));
  free(buf), free(all), free(send);
  return 0;
}

static int body_matrix(int rank, int n, void *arg) {
  const struct plan *p = arg;
  for (int ci = 0; ci < p->ncounts; ci++) {
    size_t count = p->counts[ci];
    for (size_t d = 0; d < NDT; d++) {
      dcomm_dtype_t dt = all_dtypes[d];
      if (!p->all_dtypes && dt != DCOMM_FLOAT32) continue;
      for (int op = 0; op < DCOMM_OP_COUNT; op++) {
        if (!p->all_dtypes && op != DCOMM_SUM) continue;
        if (!dcomm__op_dtype_ok(op, (int)dt)) continue; /* bitwise: integers only */
        if (run_reducing(rank, n, dt, (dcomm_op_t)op, count)) return 1;
      }
      if (run_moving(rank, n, dt, count)) return 1;
    }
  }
  return 0;
}

static const size_t small_counts[] = {0, 1, 37, 100003};
static const size_t big_counts[] = {(16u << 20) / 4 + 3}; /* > 16 MiB of float32, odd */

static void matrix(int n) {
  struct plan p = {small_counts, 4, 1};
  ck_assert_int_eq(mp_run(n, body_matrix, &p, 150), 0);
}

START_TEST(test_matrix_1) { matrix(1); }
END_TEST
START_TEST(test_matrix_2) { matrix(2); }
END_TEST
START_TEST(test_matrix_3) { matrix(3); }
END_TEST
START_TEST(test_matrix_4) { matrix(4); }
END_TEST
START_TEST(test_matrix_5) { matrix(5); }
END_TEST

START_TEST(test_large) {
  struct plan p = {big_counts, 1, 0};
  int n = 2 + _i; /* 2..5 */
  ck_assert_int_eq(mp_run(n, body_matrix, &p, 150), 0);
}
END_TEST

/* The reducing collectives at each count, every op, every third dtype. */
static int reducing_matrix(int rank, int n, const size_t *counts, size_t ncounts) {
  for (size_t i = 0; i < ncounts; i++)
    for (int op = 0; op < DCOMM_OP_COUNT; op++)
      for (size_t d = 0; d < NDT; d += 3)
        if (dcomm__op_dtype_ok(op, (int)all_dtypes[d]) && run_reducing(rank, n, all_dtypes[d], (dcomm_op_t)op, counts[i]))
          return 1;
  return 0;
}

/* Every flat all_reduce algorithm, forced, gives the same exact answers. */
static int body_algo(int rank, int n, void *arg) {
  const size_t counts[] = {1, 5, 4099, 300001};
  return reducing_matrix(rank, n, counts, 4);
}

/* all_reduce of count random float32 (seeded with seed + rank) leaves the
 * same bits on every rank; buf keeps the result. */
static int equal_on_all(int rank, int n, float *buf, size_t count, unsigned seed) {
  float *all = malloc(count * sizeof(float) * (size_t)n);
  MP_REQUIRE(all != NULL, "malloc");
  srand(seed + (unsigned)rank);
  for (size_t k = 0; k < count; k++) buf[k] = (float)rand() / (float)RAND_MAX - 0.5f;
  int rc = dcomm_all_reduce(buf, count, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  if (rc == 0) rc = dcomm_all_gather(buf, all, count, DCOMM_FLOAT32, NULL);
  for (int r = 1; r < n && rc == 0; r++)
    if (memcmp(all, all + (size_t)r * count, count * sizeof(float))) rc = r;
  free(all);
  MP_REQUIRE(rc == 0, "all_reduce/all_gather failed or rank %d's result differs from rank 0's", rc);
  return 0;
}

START_TEST(test_algo_forced) {
  const char *algo = _i % 2 ? "ring" : "rd";
  setenv("DCOMM_ALGO", algo, 1);
  ck_assert_int_eq(mp_run(3 + _i / 2, body_algo, NULL, 120), 0);
  unsetenv("DCOMM_ALGO");
}
END_TEST

/* Recursive halving + doubling, forced: exact answers and the same bits
 * on every rank, at a power of two and with 1 and 3 members folded in (5
 * and 7 ranks: blocks of uneven sizes, counts not divisible by 4). */
static int body_rhd(int rank, int n, void *arg) {
  const size_t counts[] = {7, 4099, 300001};
  if (reducing_matrix(rank, n, counts, 3)) return 1;
  float bits[30011];
  return equal_on_all(rank, n, bits, 30011, 7);
}

START_TEST(test_algo_rhd) {
  static const int sizes[] = {4, 5, 7};
  setenv("DCOMM_ALGO", "rhd", 1);
  ck_assert_int_eq(mp_run(sizes[_i], body_rhd, NULL, 120), 0);
  unsetenv("DCOMM_ALGO");
}
END_TEST

/* Each rank decides alone whether its large sends are single copies
 * (DCOMM_SHM_CMA_FWD_MIN=auto times its own calls), so in one exchange a
 * rank may send through the ring while its peer's data comes by single
 * copy: the ACK of that copy must not go into the ring inside the frame
 * being sent (it became payload, and the peer waited for it forever).
 * Odd ranks take the single copy from 1 MiB, even ranks never. */
static int body_mixed_copy(int rank, int n, void *arg) {
  (void)arg;
  setenv("DCOMM_SHM_CMA_FWD_MIN", rank % 2 ? "1M" : "1G", 1);
  setenv("DCOMM_ALGO", "rd", 1); /* whole-buffer exchanges with one partner */
  MP_OK(dcomm_init("tcp", getenv("DCOMM_TEST_URL")));
  const size_t counts[] = {300001};
  if (reducing_matrix(rank, n, counts, 1)) return 1;
  static float bits[600011];
  if (equal_on_all(rank, n, bits, 600011, 3)) return 1;
  return dcomm_finalize();
}

START_TEST(test_mixed_single_copy) {
  struct mp_result res;
  ck_assert_int_eq(mp_run_ex(2 + 2 * _i, body_mixed_copy, NULL, 120, 1, &res), 0);
}
END_TEST

/* Several hosts, made on this one with DCOMM_HOST_ID: all_reduce goes
 * hierarchical (each host reduces into its lowest rank, the hosts' leaders
 * exchange, each leader broadcasts), forced or chosen by itself; reduce
 * shares its tree. Layouts: 7 ranks on hosts of 3, 1, 2 and 1 members,
 * interleaved (4 leaders), and 6 ranks on hosts of 3, 2 and 1 (3
 * leaders: the doubling between leaders folds one in). */
static const int host_layouts[2][7] = {{0, 1, 0, 2, 0, 3, 2}, {0, 0, 1, 1, 0, 2, -1}};

static int body_hosts(int rank, int n, void *arg) {
  const int *layout = arg;
  char id[16];
  snprintf(id, sizeof(id), "h%d", layout[rank]);
  setenv("DCOMM_HOST_ID", id, 1);
  MP_OK(dcomm_init("tcp", getenv("DCOMM_TEST_URL")));
  const size_t counts[] = {1, 5, 4099, 30001};
  if (reducing_matrix(rank, n, counts, 4)) return 1;
  float bits[20011];
  if (equal_on_all(rank, n, bits, 20011, 99)) return 1;
  /* A sub-group without rank 0 (another leader for its host). */
  int members[7], m = 0;
  for (int r = 1; r < n; r++) members[m++] = r;
  dcomm_group_t g = NULL;
  MP_OK(dcomm_new_group(members, m, &g));
  if (rank > 0) {
    int64_t v[3] = {rank, 1, -rank}, want = (int64_t)n * (n - 1) / 2;
    MP_OK(dcomm_all_reduce(v, 3, DCOMM_INT64, DCOMM_SUM, g));
    MP_REQUIRE(v[0] == want && v[1] == m && v[2] == -want, "group all_reduce: %lld %lld %lld", (long long)v[0],
               (long long)v[1], (long long)v[2]);
  }
  return dcomm_finalize();
}

START_TEST(test_hosts) {
  const int *layout = host_layouts[_i / 2];
  int n = 0;
  while (n < 7 && layout[n] >= 0) n++;
  if (_i % 2) setenv("DCOMM_ALGO", "hier", 1);
  struct mp_result res;
  int failed = mp_run_ex(n, body_hosts, (void *)layout, 120, 1, &res);
  unsetenv("DCOMM_ALGO");
  ck_assert_int_eq(failed, 0);
}
END_TEST

/* Random float32 data: every rank ends with bit-identical results. */
static int body_identical(int rank, int n, void *arg) {
  size_t count = 200003;
  float *buf = malloc(count * sizeof(float));
  MP_REQUIRE(buf != NULL, "malloc");
  if (equal_on_all(rank, n, buf, count, 1234)) return 1;
  /* and they are close to the serial sum */
  for (size_t k = 0; k < count; k += 997) {
    double want = 0;
    for (int r = 0; r < n; r++) {
      srand(1234 + r);
      float v = 0;
      for (size_t j = 0; j <= k; j++) v = (float)rand() / (float)RAND_MAX - 0.5f;
      want += v;
    }
    MP_REQUIRE(fabs(buf[k] - want) < 1e-5, "element %zu: %g vs %g", k, buf[k], want);
    if (k > 20000) break;
  }
  free(buf);
  return 0;
}

/* Single-copy sends to a peer this rank does not receive from (the chain
 * broadcast's root, the ring's sender): the ACK and the WAKE that comes
 * with it may be taken while the engine looks at its watched links just
 * before sleeping, and the engine must then look again instead of
 * sleeping on a wake-up already consumed (a hang found in CI). Many short
 * collectives make that window come up; each must finish in time. */
static int body_wakeups(int rank, int n, void *arg) {
  size_t count = 4096; /* 16 KiB of float32: single copy from 4 KiB */
  float *buf = malloc(count * sizeof(float));
  MP_REQUIRE(buf != NULL, "malloc");
  double until = mp_now() + 4.0;
  for (int it = 0;; it++) {
    int root = it % n;
    for (size_t k = 0; k < count; k += 1024) buf[k] = rank == root ? (float)(it + k) : -1.0f;
    MP_OK(dcomm_broadcast(buf, count, DCOMM_FLOAT32, root, NULL));
    MP_REQUIRE(buf[count - 1024] == (float)(it + count - 1024), "broadcast %d: got %g", it, buf[count - 1024]);
    for (size_t k = 0; k < count; k++) buf[k] = 1.0f;
    MP_OK(dcomm_all_reduce(buf, count, DCOMM_FLOAT32, DCOMM_SUM, NULL));
    MP_REQUIRE(buf[7] == (float)n, "all_reduce %d: got %g", it, buf[7]);
    /* the ranks' clocks differ: they agree on whether to go on */
    int64_t more = mp_now() < until;
    MP_OK(dcomm_all_reduce(&more, 1, DCOMM_INT64, DCOMM_MIN, NULL));
    if (!more) break;
  }
  free(buf);
  return 0;
}

START_TEST(test_wakeups) {
  setenv("DCOMM_TRANSPORT", "shm", 1);
  setenv("DCOMM_SHM_CMA_MIN", "4096", 1);
  setenv("DCOMM_SHM_CMA_FWD_MIN", "4096", 1);
  setenv("DCOMM_ALGO", _i ? "ring,broadcast=pipeline" : "ring,broadcast=tree", 1);
  setenv("DCOMM_TCP_CHUNK_SIZE", "4096", 1); /* four pipeline segments */
  int failed = mp_run(4 + _i, body_wakeups, NULL, 60);
  unsetenv("DCOMM_TRANSPORT");
  unsetenv("DCOMM_SHM_CMA_MIN");
  unsetenv("DCOMM_SHM_CMA_FWD_MIN");
  unsetenv("DCOMM_ALGO");
  unsetenv("DCOMM_TCP_CHUNK_SIZE");
  ck_assert_int_eq(failed, 0);
}
END_TEST

START_TEST(test_identical) { ck_assert_int_eq(mp_run(3, body_identical, NULL, 60), 0); }
END_TEST

/* send/recv around a ring, and tags received out of order. */
static int body_p2p(int rank, int n, void *arg) {
  int32_t out[257], in[257];
  for (int i = 0; i < 257; i++) out[i] = rank * 1000 + i;
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  if (rank % 2 == 0) {
    MP_OK(dcomm_send(out, 257, DCOMM_INT32, right, 7, NULL));
    MP_OK(dcomm_recv(in, 257, DCOMM_INT32, left, 7, NULL));
  } else {
    MP_OK(dcomm_recv(in, 257, DCOMM_INT32, left, 7, NULL));
    MP_OK(dcomm_send(out, 257, DCOMM_INT32, right, 7, NULL));
  }
  for (int i = 0; i < 257; i++) MP_REQUIRE(in[i] == left * 1000 + i, "ring element %d is %d", i, in[i]);
  if (rank == 0) {
    int32_t a = 1, b = 2;
    MP_OK(dcomm_send(&a, 1, DCOMM_INT32, 1, 1, NULL));
    MP_OK(dcomm_send(&b, 1, DCOMM_INT32, 1, 2, NULL));
  } else if (rank == 1) {
    int32_t a = 0, b = 0;
    MP_OK(dcomm_recv(&b, 1, DCOMM_INT32, 0, 2, NULL));
    MP_OK(dcomm_recv(&a, 1, DCOMM_INT32, 0, 1, NULL));
    MP_REQUIRE(a == 1 && b == 2, "tags crossed: a=%d b=%d", a, b);
  }
  /* a collective after queued p2p traffic still lines up */
  int32_t x = rank;
  MP_OK(dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL));
  MP_REQUIRE(x == n * (n - 1) / 2, "sum %d", x);
  return 0;
}

START_TEST(test_p2p) { ck_assert_int_eq(mp_run(4, body_p2p, NULL, 60), 0); }
END_TEST

/* barrier blocks until the last rank arrives. */
static int body_barrier(int rank, int n, void *arg) {
  double t0 = mp_now();
  if (rank == n - 1) usleep(300000);
  MP_OK(dcomm_barrier(NULL));
  MP_REQUIRE(mp_now() - t0 >= 0.25, "rank %d left the barrier after %.3f s, before the late rank arrived", rank,
             mp_now() - t0);
  return 0;
}

START_TEST(test_barrier) { ck_assert_int_eq(mp_run(5, body_barrier, NULL, 60), 0); }
END_TEST

/* A send larger than the ring to a rank that first sits in a barrier: the
 * barrier queues it instead of deadlocking (as the socket buffers do). */
static int body_big_p2p(int rank, int n, void *arg) {
  size_t count = 1u << 18; /* 1 MiB of int32, 16 rings of 64 KiB */
  int32_t *buf = malloc(count * sizeof(int32_t));
  MP_REQUIRE(buf != NULL, "malloc");
  for (size_t i = 0; i < count; i++) buf[i] = rank == 0 ? (int32_t)(i * 3 + 1) : 0;
  if (rank == 0) MP_OK(dcomm_send(buf, count, DCOMM_INT32, 1, 5, NULL));
  MP_OK(dcomm_barrier(NULL));
  if (rank == 1) {
    MP_OK(dcomm_recv(buf, count, DCOMM_INT32, 0, 5, NULL));
    for (size_t i = 0; i < count; i++) MP_REQUIRE(buf[i] == (int32_t)(i * 3 + 1), "element %zu is %d", i, buf[i]);
  }
  int32_t x = 1;
  MP_OK(dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL));
  MP_REQUIRE(x == n, "sum %d", x);
  free(buf);
  return 0;
}

/* reduce_scatter whose output is the rank's own block of its input. */
static int body_rs_inplace(int rank, int n, void *arg) {
  size_t count = 70001;
  int32_t *buf = malloc(count * (size_t)n * sizeof(int32_t));
  MP_REQUIRE(buf != NULL, "malloc");
  for (size_t k = 0; k < count * (size_t)n; k++) buf[k] = (int32_t)(rank + 1) * (int32_t)(k % 1000);
  int32_t *out = buf + (size_t)rank * count;
  MP_OK(dcomm_reduce_scatter(buf, out, count, DCOMM_INT32, DCOMM_SUM, NULL));
  for (size_t k = 0; k < count; k++) {
    int32_t want = (int32_t)(n * (n + 1) / 2) * (int32_t)(((size_t)rank * count + k) % 1000);
    MP_REQUIRE(out[k] == want, "element %zu is %d, want %d", k, out[k], want);
  }
  free(buf);
  return 0;
}

/* _i / 2: 0 tcp, 1 shm (forced) through the rings alone, 2 shm with
 * single-copy reads of every payload from 4 KiB;
 * _i % 2: 3 ranks, or 4 ranks with the pipelined broadcast forced even
 * for tiny messages. */
START_TEST(test_transport) {
  static const size_t counts[] = {0, 1, 37, 100003, (4u << 20) / 4 + 5};
  struct plan p = {counts, 5, 0};
  const char *tr = _i / 2 ? "shm" : "tcp";
  setenv("DCOMM_TRANSPORT", tr, 1);
  if (_i / 2 == 1) setenv("DCOMM_SHM_CMA_MIN", "0", 1);
  if (_i / 2 == 2) {
    setenv("DCOMM_SHM_CMA_MIN", "4096", 1);
    setenv("DCOMM_SHM_CMA_FWD_MIN", "4096", 1);
  }
  setenv("DCOMM_SHM_RING_SIZE", "65536", 1); /* many wraps per message */
  int n = 3 + _i % 2;
  if (n == 4) setenv("DCOMM_ALGO", "broadcast=pipeline", 1);
  int failed = mp_run(n, body_matrix, &p, 120);
  if (!failed) failed = mp_run(n, body_p2p, NULL, 60);
  if (!failed) failed = mp_run(n, body_big_p2p, NULL, 60);
  if (!failed) failed = mp_run(n, body_identical, NULL, 60);
  if (!failed) failed = mp_run(n, body_rs_inplace, NULL, 60);
  unsetenv("DCOMM_TRANSPORT");
  unsetenv("DCOMM_SHM_RING_SIZE");
  unsetenv("DCOMM_ALGO");
  unsetenv("DCOMM_SHM_CMA_MIN");
  unsetenv("DCOMM_SHM_CMA_FWD_MIN");
  ck_assert_msg(failed == 0, "DCOMM_TRANSPORT=%s%s on %d ranks: %d ranks failed", tr, _i / 2 == 2 ? " (single copy)" : "",
                n, failed);
}
END_TEST

/* A process of the same user attaching a link's segment finds that the
 * two may read each other's memory, and names the creator's pid: what
 * the single-copy path above relies on (without it, it falls back to the
 * rings and would be tested no more). */
START_TEST(test_cma_probe) {
  struct tcp_shm *mine;
  int memfd;
  uint64_t nonce;
  char why[200];
  ck_assert_msg(tcp_shm_create(65536, &mine, &memfd, &nonce, why, sizeof(why)) == 0, "create: %s", why);
  pid_t parent = getpid(), kid = fork();
  if (kid == 0) {
    struct tcp_shm *theirs;
    if (tcp_shm_attach(parent, memfd, nonce, 65536, &theirs, why, sizeof(why)) != 0) _exit(2);
    _exit(tcp_shm_cma_pid(theirs) == parent ? 0 : 3);
  }
  int st;
  ck_assert_int_eq(waitpid(kid, &st, 0), kid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: attach or probe failed (status %d)", st);
  ck_assert_int_eq(tcp_shm_cma_pid(mine), kid);
  close(memfd);
  tcp_shm_free(mine);
}
END_TEST

/* ---- which ranks share this rank's processors (tcp_cpus.c) ---- */

static int no_log(int level, int subsys) {
  (void)level;
  (void)subsys;
  return 0;
}

/* A host of world_size ranks, this one on processors "mine", the others'
 * lists in cpus[] ("" for a rank that published none), every rank on this
 * host except those whose cpus entry is NULL (another host). */
static int sharing_decision(const char *mine, const char **cpus, int n) {
  struct dcomm_host h = {.size = sizeof(h), .world_size = n, .log_enabled = no_log};
  struct tcp_ctx ctx = {.host = &h};
  struct tcp_addr addrs[8];
  memset(addrs, 0, sizeof(addrs));
  snprintf(ctx.host_id, sizeof(ctx.host_id), "host-a");
  ck_assert_int_eq(tcp_cpus_parse(mine, &ctx.cpus), 0);
  for (int r = 0; r < n; r++) {
    snprintf(addrs[r].host, sizeof(addrs[r].host), "%s", cpus[r] ? "host-a" : "host-b");
    snprintf(addrs[r].cpus, sizeof(addrs[r].cpus), "%s", cpus[r] ? cpus[r] : "0-63");
  }
  ctx.addrs = addrs;
  return tcp_oversubscribed(&ctx);
}

/* A launcher that binds every rank to a processor of its own (dcomm-run's
 * and mpirun's default) is not oversubscription: each rank has one
 * processor and no one to share it with, and spins before it yields
 * (yielding at once cost 1.2 us per wait on a virtual machine). Two ranks
 * bound to one processor, or more unbound ranks than processors, are. */
START_TEST(test_cpu_sharing) {
  ck_assert_int_eq(sharing_decision("0", (const char *[]){"0", "1"}, 2), 0);
  ck_assert_int_eq(sharing_decision("0", (const char *[]){"0", "1", "0", "1"}, 4), 1);
  ck_assert_int_eq(sharing_decision("0-1", (const char *[]){"0-1", "0-1"}, 2), 0);
  ck_assert_int_eq(sharing_decision("0-1", (const char *[]){"0-1", "0-1", "0-1"}, 3), 1);
  ck_assert_int_eq(sharing_decision("0", (const char *[]){"0", "0"}, 2), 1);
  /* ranks of another host share nothing; one that published nothing shares */
  ck_assert_int_eq(sharing_decision("0", (const char *[]){"0", NULL, NULL}, 3), 0);
  ck_assert_int_eq(sharing_decision("0", (const char *[]){"0", ""}, 2), 1);
  /* the list's text both ways, and what does not parse */
  cpu_set_t set, back;
  CPU_ZERO(&set);
  for (int c = 0; c < 4; c++) CPU_SET(c, &set);
  CPU_SET(8, &set);
  CPU_SET(10, &set);
  CPU_SET(11, &set);
  char buf[TCP_CPUS_LEN];
  ck_assert_int_eq(tcp_cpus_format(&set, buf, sizeof(buf)), 0);
  ck_assert_str_eq(buf, "0-3,8,10-11");
  ck_assert_int_eq(tcp_cpus_parse(buf, &back), 0);
  ck_assert(CPU_EQUAL(&set, &back));
  CPU_ZERO(&set);
  for (int c = 0; c < 200; c += 2) CPU_SET(c, &set);
  ck_assert_int_eq(tcp_cpus_format(&set, buf, sizeof(buf)), -1);
  ck_assert_str_eq(buf, "");
  const char *bad[] = {"", "x", "3-1", "1,", "-1", "1-", "99999"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
    ck_assert_msg(tcp_cpus_parse(bad[i], &back) == -1, "'%s' parsed", bad[i]);
}
END_TEST

/* ---- bitwise reductions ---- */

/* Element k of rank r: random-looking bits over the whole width. */
static uint64_t bits(int r, size_t k) {
  uint64_t x = ((uint64_t)r + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)k + 7) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  return x * 0x94d049bb133111ebull;
}

static uint64_t bits_ref(int n, size_t k, dcomm_op_t op) {
  uint64_t acc = bits(0, k);
  for (int r = 1; r < n; r++)
    acc = op == DCOMM_BAND ? acc & bits(r, k) : op == DCOMM_BOR ? acc | bits(r, k) : acc ^ bits(r, k);
  return acc;
}

/* Element k of buf as its dtype's bits (little-endian: the low bytes). */
static void put_bits(void *buf, size_t es, size_t k, uint64_t v) { memcpy((char *)buf + k * es, &v, es); }
static int same_bits(const void *buf, size_t es, size_t k, uint64_t v) { return memcmp((const char *)buf + k * es, &v, es) == 0; }

#define CHECK_BITS(buf, es, count, expr, what)                                                                  \
  for (size_t k = 0; k < (count); k++)                                                                          \
    MP_REQUIRE(same_bits((buf), (es), k, (expr)), "%s %s %s count %zu: element %zu wrong", what,               \
               dcomm__dtype_name(dt), dcomm__op_name(op), (size_t)(count), k);

/* all_reduce (both algorithms: small and ring-sized counts), reduce and
 * reduce_scatter with each bitwise op on each integer dtype; then each
 * call with a floating dtype fails locally and leaves the buffer alone. */
static int body_bitwise(int rank, int n, void *arg) {
  static const size_t counts[] = {1, 37, 100003};
  (void)arg;
  for (int dti = 0; dti <= DCOMM_UINT64; dti++) {
    dcomm_dtype_t dt = (dcomm_dtype_t)dti;
    size_t es = dcomm_dtype_size(dt);
    for (int op = DCOMM_BAND; op <= DCOMM_BXOR; op++) {
      for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        size_t count = counts[ci];
        char *buf = xalloc(count * es), *big = xalloc(count * es * (size_t)n), *out = xalloc(count * es);
        for (size_t k = 0; k < count; k++) put_bits(buf, es, k, bits(rank, k));
        MP_OK(dcomm_all_reduce(buf, count, dt, (dcomm_op_t)op, NULL));
        CHECK_BITS(buf, es, count, bits_ref(n, k, (dcomm_op_t)op), "all_reduce");
        int root = (int)((ci + (size_t)op) % (size_t)n);
        for (size_t k = 0; k < count; k++) put_bits(buf, es, k, bits(rank, k));
        MP_OK(dcomm_reduce(buf, count, dt, (dcomm_op_t)op, root, NULL));
        if (rank == root) CHECK_BITS(buf, es, count, bits_ref(n, k, (dcomm_op_t)op), "reduce");
        for (size_t k = 0; k < count * (size_t)n; k++) put_bits(big, es, k, bits(rank, k));
        MP_OK(dcomm_reduce_scatter(big, out, count, dt, (dcomm_op_t)op, NULL));
        CHECK_BITS(out, es, count, bits_ref(n, (size_t)rank * count + k, (dcomm_op_t)op), "reduce_scatter");
        free(buf), free(big), free(out);
      }
    }
  }
  for (int dti = DCOMM_FLOAT16; dti < DCOMM_DTYPE_COUNT; dti++) {
    dcomm_dtype_t dt = (dcomm_dtype_t)dti;
    for (int op = DCOMM_BAND; op <= DCOMM_BXOR; op++) {
      double x[4] = {1, 2, 3, 4}, y[4 * 8];
      memset(y, 0, sizeof(y));
      int rc = dcomm_all_reduce(x, 2, dt, (dcomm_op_t)op, NULL);
      MP_REQUIRE(rc == DCOMM_EINVAL, "all_reduce %s %s gave %d", dcomm__dtype_name(dt), dcomm__op_name(op), rc);
      MP_REQUIRE(strstr(dcomm_last_error(), dcomm__op_name(op)) && strstr(dcomm_last_error(), dcomm__dtype_name(dt)),
                 "message does not name op and dtype: %s", dcomm_last_error());
      MP_REQUIRE(x[0] == 1 && x[1] == 2, "a refused all_reduce changed the buffer");
      MP_REQUIRE(dcomm_reduce(x, 2, dt, (dcomm_op_t)op, 0, NULL) == DCOMM_EINVAL, "reduce %s", dcomm__dtype_name(dt));
      MP_REQUIRE(dcomm_reduce_scatter(y, x, 1, dt, (dcomm_op_t)op, NULL) == DCOMM_EINVAL, "reduce_scatter %s",
                 dcomm__dtype_name(dt));
      MP_REQUIRE(x[0] == 1 && x[1] == 2, "a refused reduce changed the buffer");
    }
  }
  /* nothing moved: the group is still in step */
  int32_t one = 1;
  MP_OK(dcomm_all_reduce(&one, 1, DCOMM_INT32, DCOMM_SUM, NULL));
  MP_REQUIRE(one == n, "sum after the refused calls: %d", one);
  return 0;
}

/* _i: 0 default transport (shared memory, single copy for large
 * frames), 1 tcp forced. */
START_TEST(test_bitwise) {
  if (_i == 1) setenv("DCOMM_TRANSPORT", "tcp", 1);
  int failed = mp_run(3, body_bitwise, NULL, 120);
  unsetenv("DCOMM_TRANSPORT");
  ck_assert_msg(failed == 0, "bitwise reductions on 3 ranks (%s): %d ranks failed", _i ? "tcp" : "default", failed);
}
END_TEST

/* ---- all_to_allv ---- */

/* Elements rank i sends rank j: uneven, with zeros (and one pair large
 * enough to wrap a shared-memory ring many times when big is set). */
static size_t vcount(int i, int j, int n, int big) {
  if ((i * 3 + j * 5 + n) % 5 == 0) return 0;
  if (big && i == 0 && j == n - 1) return 70001;
  return (size_t)((i * 7 + j * 3 + n) % 13) + 1;
}

/* The layouts: blocks in reverse rank order with gaps of j + 1 elements
 * in front of each; *total is the buffer's length in elements. */
static void vlayout(const size_t *counts, int n, size_t *displs, size_t *total) {
  size_t off = 0;
  for (int j = n - 1; j >= 0; j--) {
    off += (size_t)j + 1;
    displs[j] = off;
    off += counts[j];
  }
  *total = off + 3;
}

static int run_alltoallv(int rank, int n, dcomm_dtype_t dt, int big) {
  size_t es = dcomm_dtype_size(dt), sc[8], sd[8], rc[8], rd[8], stot, rtot;
  for (int j = 0; j < n; j++) sc[j] = vcount(rank, j, n, big), rc[j] = vcount(j, rank, n, big);
  vlayout(sc, n, sd, &stot);
  vlayout(rc, n, rd, &rtot);
  char *send = xalloc(stot * es), *recv = xalloc(rtot * es), *mark = xalloc(es);
  bench_put(mark, dt, 0, 99);
  for (size_t k = 0; k < stot; k++) bench_put(send, dt, k, 77);
  for (int j = 0; j < n; j++)
    for (size_t k = 0; k < sc[j]; k++) bench_put(send, dt, sd[j] + k, code(rank, j, k));
  for (size_t k = 0; k < rtot; k++) memcpy(recv + k * es, mark, es);
  MP_OK(dcomm_all_to_allv(send, sc, sd, recv, rc, rd, dt, NULL));
  /* every block from its sender, every gap untouched */
  char *in_block = xalloc(rtot);
  for (int j = 0; j < n; j++) {
    for (size_t k = 0; k < rc[j]; k++) {
      double got = bench_get(recv, dt, rd[j] + k);
      MP_REQUIRE(got == code(j, rank, k), "all_to_allv %s on %d ranks: element %zu from rank %d is %g, want %g",
                 dcomm__dtype_name(dt), n, k, j, got, code(j, rank, k));
    }
    memset(in_block + rd[j], 1, rc[j]);
  }
  for (size_t k = 0; k < rtot; k++)
    MP_REQUIRE(in_block[k] || !memcmp(recv + k * es, mark, es), "all_to_allv %s: gap element %zu was written",
               dcomm__dtype_name(dt), k);
  free(send), free(recv), free(mark), free(in_block);
  return 0;
}

static int body_alltoallv(int rank, int n, void *arg) {
  (void)arg;
  for (size_t d = 0; d < NDT; d++)
    if (run_alltoallv(rank, n, all_dtypes[d], 0)) return 1;
  /* one large block (wraps the 64 KiB rings; single copy where allowed) */
  if (run_alltoallv(rank, n, DCOMM_FLOAT64, 1) || run_alltoallv(rank, n, DCOMM_INT8, 1)) return 1;
  /* every count zero, and buffers NULL */
  size_t z[8] = {0}, zd[8] = {0};
  MP_OK(dcomm_all_to_allv(NULL, z, zd, NULL, z, zd, DCOMM_INT32, NULL));
  int32_t x = 1;
  MP_OK(dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL));
  MP_REQUIRE(x == n, "sum after all_to_allv: %d", x);
  return 0;
}

/* _i % 3: 2, 3 or 4 ranks; _i / 3: 0 default transport, 1 tcp forced, 2
 * shared memory with single-copy reads from 4 KiB. */
START_TEST(test_alltoallv) {
  int n = 2 + _i % 3, tr = _i / 3;
  if (tr == 1) setenv("DCOMM_TRANSPORT", "tcp", 1);
  if (tr == 2) {
    setenv("DCOMM_TRANSPORT", "shm", 1);
    setenv("DCOMM_SHM_CMA_MIN", "4096", 1);
    setenv("DCOMM_SHM_CMA_FWD_MIN", "4096", 1);
  }
  setenv("DCOMM_SHM_RING_SIZE", "65536", 1);
  int failed = mp_run(n, body_alltoallv, NULL, 120);
  unsetenv("DCOMM_TRANSPORT");
  unsetenv("DCOMM_SHM_CMA_MIN");
  unsetenv("DCOMM_SHM_CMA_FWD_MIN");
  unsetenv("DCOMM_SHM_RING_SIZE");
  ck_assert_msg(failed == 0, "all_to_allv on %d ranks (transport %s): %d ranks failed", n,
                tr == 0 ? "default" : tr == 1 ? "tcp" : "shm single copy", failed);
}
END_TEST

#define EXPECT_EINVAL(call, text)                                                                     \
  do {                                                                                                \
    int rc_ = (call);                                                                                 \
    MP_REQUIRE(rc_ == DCOMM_EINVAL, "%s gave %d, want DCOMM_EINVAL", #call, rc_);                    \
    MP_REQUIRE(strstr(dcomm_last_error(), text), "%s: message lacks \"%s\": %s", #call, text, dcomm_last_error()); \
  } while (0)

/* Bad arguments fail on the calling rank before any byte moves (every
 * rank makes the same bad calls, and the group stays in step). */
static int body_alltoallv_args(int rank, int n, void *arg) {
  (void)arg, (void)rank;
  int32_t sb[16] = {0}, rb[16];
  size_t c1[4] = {1, 1, 1, 1}, d[4] = {0, 1, 2, 3}, dsame[4] = {0, 0, 0, 0};
  size_t huge[4] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX}, big[4] = {SIZE_MAX / 2, 0, 0, 0};
  memset(rb, 0x5a, sizeof(rb));
  EXPECT_EINVAL(dcomm_all_to_allv(sb, NULL, d, rb, c1, d, DCOMM_INT32, NULL), "sendcounts is NULL");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, NULL, rb, c1, d, DCOMM_INT32, NULL), "sdispls is NULL");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, d, rb, NULL, d, DCOMM_INT32, NULL), "recvcounts is NULL");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, d, rb, c1, NULL, DCOMM_INT32, NULL), "rdispls is NULL");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, d, rb, c1, huge, DCOMM_INT32, NULL), "overflow");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, big, rb, c1, d, DCOMM_INT32, NULL), "overflow");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, huge, d, rb, c1, d, DCOMM_INT32, NULL), "overflow");
  EXPECT_EINVAL(dcomm_all_to_allv(NULL, c1, d, rb, c1, d, DCOMM_INT32, NULL), "sendbuf is NULL");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, d, NULL, c1, d, DCOMM_INT32, NULL), "recvbuf is NULL");
  EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, d, rb, c1, d, DCOMM_DTYPE_COUNT, NULL), "dtype");
  if (n > 1) {
    EXPECT_EINVAL(dcomm_all_to_allv(sb, c1, d, rb, c1, dsame, DCOMM_INT32, NULL), "overlap");
    size_t c2[4] = {2, 2, 2, 2}, d2[4] = {0, 3, 6, 9};
    d2[n - 1] = 1; /* [1, 3) overlaps block 0 at [0, 2) */
    EXPECT_EINVAL(dcomm_all_to_allv(sb, c2, d, rb, c2, d2, DCOMM_INT32, NULL), "overlap");
  }
  /* in place: a send block inside a receive block */
  EXPECT_EINVAL(dcomm_all_to_allv(rb, c1, d, rb, c1, d, DCOMM_INT32, NULL), "in place");
  for (size_t k = 0; k < 16; k++) MP_REQUIRE(rb[k] == 0x5a5a5a5a, "a refused call wrote element %zu", k);
  int32_t x = 1;
  MP_OK(dcomm_all_reduce(&x, 1, DCOMM_INT32, DCOMM_SUM, NULL));
  MP_REQUIRE(x == n, "sum after the refused calls: %d", x);
  return 0;
}

START_TEST(test_alltoallv_args) { ck_assert_int_eq(mp_run(1 + 2 * _i, body_alltoallv_args, NULL, 60), 0); }
END_TEST

/*
 * Counts that disagree: _i 0 rank 0 sends 5 elements to rank 1, which
 * expects 3; _i 1 rank 0 sends nothing to rank 1, which expects 4 (an
 * empty block still goes as a frame); _i 2 rank 2 sends itself 2 but
 * expects 3. The ranks involved get DCOMM_EMISMATCH well within the
 * timeout (the rank that notices breaks the group and tells the others;
 * a rank whose blocks all matched gets it from this call or its next),
 * and the noticing rank's message names both counts.
 */
static int body_alltoallv_mismatch(int rank, int n, void *arg) {
  int kind = *(const int *)arg;
  MP_OK(dcomm_group_set_timeout(NULL, 20));
  size_t sc[4], sd[4], rc[4], rd[4];
  int32_t sb[64], rb[64];
  for (int j = 0; j < n; j++) sc[j] = rc[j] = 3, sd[j] = rd[j] = (size_t)j * 16;
  for (int k = 0; k < 64; k++) sb[k] = rank * 100 + k;
  const char *want = NULL;
  if (kind == 0) {
    if (rank == 0) sc[1] = 5;
    if (rank == 1) want = "sends 5 int32 elements to rank 1, but rank 1 expects 3";
  } else if (kind == 1) {
    if (rank == 0) sc[1] = 0;
    if (rank == 1) rc[0] = 4, want = "sends 0 int32 elements to rank 1, but rank 1 expects 4";
  } else if (rank == 2) {
    sc[2] = 2;
    want = "sends 2 int32 elements to itself (sendcounts[2]) but expects 3";
  }
  double t0 = mp_now();
  int r = dcomm_all_to_allv(sb, sc, sd, rb, rc, rd, DCOMM_INT32, NULL);
  int involved = kind == 2 || rank < 2;
  if (!involved && r == 0) {
    /* rank 2's own blocks all matched and may have gone through before
     * the abort came; its next call fails */
    r = dcomm_barrier(NULL);
  }
  MP_REQUIRE(r == DCOMM_EMISMATCH, "rank %d got %d (%s), want DCOMM_EMISMATCH", rank, r, dcomm_error_name(r));
  MP_REQUIRE(mp_now() - t0 < 10, "the mismatch took %.1f s to report", mp_now() - t0);
  if (want) MP_REQUIRE(strstr(dcomm_last_error(), want), "message lacks \"%s\": %s", want, dcomm_last_error());
  return 0;
}

START_TEST(test_alltoallv_mismatch) {
  int kind = _i % 3;
  if (_i / 3) setenv("DCOMM_TRANSPORT", "tcp", 1);
  int failed = mp_run(3, body_alltoallv_mismatch, &kind, 60);
  unsetenv("DCOMM_TRANSPORT");
  ck_assert_msg(failed == 0, "mismatch kind %d (%s): %d ranks failed", kind, _i / 3 ? "tcp" : "default", failed);
}
END_TEST

int main(void) {
  Suite *s = suite_create("coll");
  TCase *tc = tcase_create("matrix");
  tcase_set_timeout(tc, 200);
  tcase_add_test(tc, test_matrix_1);
  tcase_add_test(tc, test_matrix_2);
  tcase_add_test(tc, test_matrix_3);
  tcase_add_test(tc, test_matrix_4);
  tcase_add_test(tc, test_matrix_5);
  tcase_add_loop_test(tc, test_large, 0, 4);
  tcase_add_loop_test(tc, test_algo_forced, 0, 4);
  tcase_add_loop_test(tc, test_algo_rhd, 0, 3);
  tcase_add_loop_test(tc, test_mixed_single_copy, 0, 2);
  tcase_add_loop_test(tc, test_hosts, 0, 4);
  tcase_add_test(tc, test_identical);
  tcase_add_test(tc, test_p2p);
  tcase_add_test(tc, test_barrier);
  tcase_add_loop_test(tc, test_transport, 0, 6);
  tcase_add_test(tc, test_cma_probe);
  tcase_add_test(tc, test_cpu_sharing);
  suite_add_tcase(s, tc);
  tc = tcase_create("wakeups");
  tcase_set_timeout(tc, 150);
  tcase_add_loop_test(tc, test_wakeups, 0, 2);
  suite_add_tcase(s, tc);
  tc = tcase_create("bitwise_alltoallv");
  tcase_set_timeout(tc, 200);
  tcase_add_loop_test(tc, test_bitwise, 0, 2);
  tcase_add_loop_test(tc, test_alltoallv, 0, 9);
  tcase_add_loop_test(tc, test_alltoallv_args, 0, 2);
  tcase_add_loop_test(tc, test_alltoallv_mismatch, 0, 6);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
