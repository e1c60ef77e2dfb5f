/*
 * pmix_coll.c: the end-to-end program of the scheduler tests
 * (tests/pmix_mpirun.sh, tests/slurm_cluster.sh), written against the
 * public API only. It initializes through pmix:// (default), through
 * detection (argument "auto": dcomm_init(NULL, NULL)) or through the URL
 * given, checks its identity against the launcher's variables when they
 * are set (Open MPI's OMPI_COMM_WORLD_*, srun's SLURM_*), runs all_reduce,
 * broadcast, all_gather and barrier with checked results, and prints
 * "rank R ok". Any failure prints one line to stderr and exits 1.
 * Usage: pmix_coll [auto | URL [ROUNDS]]; ROUNDS > 1 repeats init, the
 * collectives and finalize in one process (the line comes at the end).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"

static int rank_ = -1;

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "rank %d FAIL: ", rank_);                                  \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    return 1;                                                                  \
  } while (0)

#define OK(call)                                                               \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != 0) FAIL("%s: %s: %s", #call, dcomm_error_name(rc_), dcomm_last_error()); \
  } while (0)

/* An identity the launcher announced must be what dcomm found. */
static int check_var(const char *var, int got, const char *what) {
  const char *v = getenv(var);
  if (!v || !*v) return 0;
  if (atoi(v) != got) {
    fprintf(stderr, "rank %d FAIL: %s is %d but %s=%s\n", rank_, what, got, var, v);
    return 1;
  }
  return 0;
}

static int round_(const char *method);

int main(int argc, char **argv) {
  const char *method = argc > 1 ? argv[1] : "pmix://";
  int rounds = argc > 2 ? atoi(argv[2]) : 1;
  if (!strcmp(method, "auto")) method = NULL;
  if (rounds < 1) rounds = 1;
  for (int r = 0; r < rounds; r++)
    if (round_(method)) return 1;
  printf("rank %d ok\n", rank_);
  return 0;
}

/* One init .. finalize; 0 on success. */
static int round_(const char *method) {
  int rc = dcomm_init(NULL, method);
  if (rc != 0) {
    fprintf(stderr, "FAIL: dcomm_init(NULL, %s): %s: %s\n", method ? method : "NULL", dcomm_error_name(rc),
            dcomm_last_error());
    return 1;
  }
  int rank = rank_ = dcomm_rank(), size = dcomm_world_size();
  int lrank = dcomm_local_rank(), lsize = dcomm_local_world_size();
  if (size < 1 || rank < 0 || rank >= size) FAIL("rank %d / size %d", rank, size);
  if (lsize < 1 || lsize > size || lrank < 0 || lrank >= lsize) FAIL("local rank %d / local size %d", lrank, lsize);
  int bad = check_var("OMPI_COMM_WORLD_RANK", rank, "rank") + check_var("OMPI_COMM_WORLD_SIZE", size, "world size") +
            check_var("OMPI_COMM_WORLD_LOCAL_RANK", lrank, "local rank") +
            check_var("OMPI_COMM_WORLD_LOCAL_SIZE", lsize, "local world size") +
            check_var("SLURM_PROCID", rank, "rank") + check_var("SLURM_NTASKS", size, "world size") +
            check_var("SLURM_LOCALID", lrank, "local rank");
  if (bad) return 1;

  /* all_reduce: int64 sum over 1000 elements, float max */
  enum { N = 1000 };
  int64_t s[N];
  for (int i = 0; i < N; i++) s[i] = rank + i;
  OK(dcomm_all_reduce(s, N, DCOMM_INT64, DCOMM_SUM, NULL));
  for (int i = 0; i < N; i++) {
    int64_t want = (int64_t)size * i + (int64_t)size * (size - 1) / 2;
    if (s[i] != want) FAIL("all_reduce sum [%d] = %lld, expected %lld", i, (long long)s[i], (long long)want);
  }
  float f[4] = {(float)rank, (float)-rank, 0.5f * (float)rank, 1.0f};
  OK(dcomm_all_reduce(f, 4, DCOMM_FLOAT32, DCOMM_MAX, NULL));
  if (f[0] != (float)(size - 1) || f[1] != 0.0f || f[2] != 0.5f * (float)(size - 1) || f[3] != 1.0f)
    FAIL("all_reduce max = %g %g %g %g", f[0], f[1], f[2], f[3]);

  /* broadcast from the last rank */
  int root = size - 1;
  int32_t b[N];
  for (int i = 0; i < N; i++) b[i] = rank == root ? root * 100000 + i : -1;
  OK(dcomm_broadcast(b, N, DCOMM_INT32, root, NULL));
  for (int i = 0; i < N; i++)
    if (b[i] != root * 100000 + i) FAIL("broadcast [%d] = %d, expected %d", i, b[i], root * 100000 + i);

  /* all_gather of three values per rank */
  int32_t mine[3] = {rank, rank * 2, rank * 3};
  int32_t *all = malloc(sizeof(int32_t) * 3 * (size_t)size);
  if (!all) FAIL("out of memory");
  OK(dcomm_all_gather(mine, all, 3, DCOMM_INT32, NULL));
  for (int r = 0; r < size; r++)
    for (int k = 0; k < 3; k++)
      if (all[r * 3 + k] != r * (k + 1)) {
        int got = all[r * 3 + k];
        free(all);
        FAIL("all_gather [%d][%d] = %d, expected %d", r, k, got, r * (k + 1));
      }
  free(all);

  OK(dcomm_barrier(NULL));
  OK(dcomm_finalize());
  return 0;
}
