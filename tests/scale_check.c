/*
 * scale_check.c: every collective of the public API, with its result
 * checked, on a large world and on a sub-group of it (tests/scale.sh runs
 * it with 61 and 200 ranks under dcomm-run). Only dcomm.h is used.
 *
 *   scale_check [COUNT]        COUNT: elements per rank and op (default 1000)
 *   scale_check links [COUNT [THIRD]]  the links a rank makes: the
 *                              collectives that need O(log n) peers (all
 *                              but gather, scatter and all_to_all), small
 *                              and large, on the world and on sub-groups
 *                              of 8, 32 and THIRD odd ranks (default: all
 *                              of them); then the most descriptors any
 *                              rank holds
 *
 * Each rank prints nothing on success; a wrong element or a failed call
 * prints what and where on stderr and exits 1. Rank 0 prints
 *   scale_check ok: N ranks, group of G, COUNT elements
 *   scale_check links: N ranks, at most F descriptors in a rank
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "proc_fds.h"

static int me_world;

#define CALL(what, expr)                                                                                  \
  do {                                                                                                    \
    int rc_ = (expr);                                                                                     \
    if (rc_) {                                                                                            \
      fprintf(stderr, "scale_check: rank %d: %s: %s (%s)\n", me_world, what, dcomm_error_name(rc_),       \
              dcomm_last_error());                                                                        \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)

#define EXPECT(what, i, got, want)                                                                        \
  do {                                                                                                    \
    if ((got) != (want)) {                                                                                \
      fprintf(stderr, "scale_check: rank %d: %s: element %zu is %lld, expected %lld\n", me_world, what,  \
              (size_t)(i), (long long)(got), (long long)(want));                                          \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)

/* The value rank r contributes at element i (exact in int64). */
static int64_t val(int r, size_t i) { return (int64_t)r * 1000003 + (int64_t)i; }

/* sparse: only the collectives whose algorithms link O(log n) peers. */
static void check_group(dcomm_group_t g, size_t count, const char *label, int sparse) {
  int r = dcomm_group_rank(g), n = dcomm_group_size(g);
  char what[96];
  int64_t *a = malloc(sizeof(int64_t) * count * (size_t)n), *b = malloc(sizeof(int64_t) * count * (size_t)n);
  if (!a || !b) exit(1);

  /* all_reduce SUM */
  for (size_t i = 0; i < count; i++) a[i] = val(r, i);
  snprintf(what, sizeof(what), "all_reduce on %s", label);
  CALL(what, dcomm_all_reduce(a, count, DCOMM_INT64, DCOMM_SUM, g));
  int64_t rsum = (int64_t)n * (n - 1) / 2 * 1000003;
  for (size_t i = 0; i < count; i++) EXPECT(what, i, a[i], rsum + (int64_t)n * (int64_t)i);

  /* reduce MAX to the last rank */
  for (size_t i = 0; i < count; i++) a[i] = val(r, i);
  snprintf(what, sizeof(what), "reduce on %s", label);
  CALL(what, dcomm_reduce(a, count, DCOMM_INT64, DCOMM_MAX, n - 1, g));
  if (r == n - 1)
    for (size_t i = 0; i < count; i++) EXPECT(what, i, a[i], val(n - 1, i));

  /* broadcast from the middle rank */
  int root = n / 2;
  for (size_t i = 0; i < count; i++) a[i] = r == root ? val(root, i) : -1;
  snprintf(what, sizeof(what), "broadcast on %s", label);
  CALL(what, dcomm_broadcast(a, count, DCOMM_INT64, root, g));
  for (size_t i = 0; i < count; i++) EXPECT(what, i, a[i], val(root, i));

  /* all_gather */
  for (size_t i = 0; i < count; i++) a[i] = val(r, i);
  snprintf(what, sizeof(what), "all_gather on %s", label);
  CALL(what, dcomm_all_gather(a, b, count, DCOMM_INT64, g));
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) EXPECT(what, (size_t)q * count + i, b[(size_t)q * count + i], val(q, i));

  if (sparse) goto reduce_scatter;
  /* gather to rank 0 */
  snprintf(what, sizeof(what), "gather on %s", label);
  memset(b, 0, sizeof(int64_t) * count * (size_t)n);
  CALL(what, dcomm_gather(a, b, count, DCOMM_INT64, 0, g));
  if (r == 0)
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < count; i++) EXPECT(what, (size_t)q * count + i, b[(size_t)q * count + i], val(q, i));

  /* scatter from rank 0: block q holds val(q, i) */
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) b[(size_t)q * count + i] = val(q, i);
  snprintf(what, sizeof(what), "scatter on %s", label);
  CALL(what, dcomm_scatter(b, a, count, DCOMM_INT64, 0, g));
  for (size_t i = 0; i < count; i++) EXPECT(what, i, a[i], val(r, i));

reduce_scatter:
  /* reduce_scatter SUM: block q of every rank is val(q, i) */
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) b[(size_t)q * count + i] = val(q, i);
  snprintf(what, sizeof(what), "reduce_scatter on %s", label);
  CALL(what, dcomm_reduce_scatter(b, a, count, DCOMM_INT64, DCOMM_SUM, g));
  for (size_t i = 0; i < count; i++) EXPECT(what, i, a[i], (int64_t)n * val(r, i));
  if (sparse) goto send_recv;

  /* all_to_all: this rank's block for q is val(r * n + q, i) */
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) a[(size_t)q * count + i] = val(r * n + q, i);
  snprintf(what, sizeof(what), "all_to_all on %s", label);
  CALL(what, dcomm_all_to_all(a, b, count, DCOMM_INT64, g));
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) EXPECT(what, (size_t)q * count + i, b[(size_t)q * count + i], val(q * n + r, i));

send_recv:
  /* send / recv around the ring */
  int right = (r + 1) % n, left = (r + n - 1) % n;
  for (size_t i = 0; i < count; i++) a[i] = val(r, i);
  snprintf(what, sizeof(what), "send/recv on %s", label);
  if (r % 2 == 0) {
    CALL(what, dcomm_send(a, count, DCOMM_INT64, right, 7, g));
    CALL(what, dcomm_recv(b, count, DCOMM_INT64, left, 7, g));
  } else {
    CALL(what, dcomm_recv(b, count, DCOMM_INT64, left, 7, g));
    CALL(what, dcomm_send(a, count, DCOMM_INT64, right, 7, g));
  }
  for (size_t i = 0; i < count; i++) EXPECT(what, i, b[i], val(left, i));

  snprintf(what, sizeof(what), "barrier on %s", label);
  CALL(what, dcomm_barrier(g));
  free(a);
  free(b);
}

/* A large all_reduce (the ring, or halving + doubling from 8 members) and
 * broadcast (the chain), checked. */
static void check_large(dcomm_group_t g, const char *label) {
  size_t count = 40000; /* 320 KB: above DCOMM_TCP_SMALL_THRESHOLD */
  int r = dcomm_group_rank(g), n = dcomm_group_size(g);
  int64_t *a = malloc(sizeof(int64_t) * count);
  if (!a) exit(1);
  char what[96];
  for (size_t i = 0; i < count; i++) a[i] = val(r, i);
  snprintf(what, sizeof(what), "large all_reduce on %s", label);
  CALL(what, dcomm_all_reduce(a, count, DCOMM_INT64, DCOMM_SUM, g));
  for (size_t i = 0; i < count; i++) EXPECT(what, i, a[i], (int64_t)n * (n - 1) / 2 * 1000003 + (int64_t)n * (int64_t)i);
  for (size_t i = 0; i < count; i++) a[i] = r == 1 % n ? val(7, i) : 0;
  snprintf(what, sizeof(what), "large broadcast on %s", label);
  CALL(what, dcomm_broadcast(a, count, DCOMM_INT64, 1 % n, g));
  for (size_t i = 0; i < count; i++) EXPECT(what, i, a[i], val(7, i));
  free(a);
}

/* Runs on the world and on groups of the first 8 and 32 ranks and of
 * third odd ranks (all alive at once), then reports the most descriptors a
 * rank holds. */
static void links_mode(size_t count, int third) {
  int n = dcomm_world_size();
  int sizes[3] = {8, 32, third > 0 && third <= n / 2 ? third : n / 2};
  dcomm_group_t g[3] = {NULL, NULL, NULL};
  int *members = malloc(sizeof(int) * (size_t)n);
  if (!members) exit(1);
  check_group(NULL, count, "the world", 1);
  check_large(NULL, "the world");
  for (int k = 0; k < 3; k++) {
    if (sizes[k] < 2 || sizes[k] > n) continue;
    int in = 0;
    for (int i = 0; i < sizes[k]; i++) {
      members[i] = k == 2 ? 2 * i + 1 : i;
      in |= members[i] == me_world;
    }
    CALL("new_group", dcomm_new_group(members, sizes[k], &g[k]));
    if (!in) continue;
    char label[32];
    snprintf(label, sizeof(label), "a group of %d", sizes[k]);
    check_group(g[k], count, label, 1);
    check_large(g[k], label);
  }
  CALL("barrier", dcomm_barrier(NULL));
  int64_t fds = proc_open_fds();
  CALL("all_reduce of the descriptor counts", dcomm_all_reduce(&fds, 1, DCOMM_INT64, DCOMM_MAX, NULL));
  for (int k = 0; k < 3; k++)
    if (g[k]) CALL("group_free", dcomm_group_free(g[k]));
  free(members);
  if (me_world == 0) printf("scale_check links: %d ranks, at most %lld descriptors in a rank\n", n, (long long)fds);
}

int main(int argc, char **argv) {
  int links = argc > 1 && !strcmp(argv[1], "links");
  if (links) argc--, argv++;
  size_t count = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1000;
  if (count == 0) count = 1;
  CALL("dcomm_init", dcomm_init(NULL, NULL));
  me_world = dcomm_rank();
  int n = dcomm_world_size();
  if (links) {
    links_mode(count, argc > 2 ? atoi(argv[2]) : 0);
    CALL("dcomm_finalize", dcomm_finalize());
    return 0;
  }
  check_group(NULL, count, "the world", 0);
  /* A sub-group of the odd ranks (every rank takes part in creating it). */
  int no = n / 2;
  int *odd = malloc(sizeof(int) * (size_t)(no ? no : 1));
  if (!odd) return 1;
  for (int i = 0; i < no; i++) odd[i] = 2 * i + 1;
  dcomm_group_t g = NULL;
  if (no > 1) {
    CALL("new_group", dcomm_new_group(odd, no, &g));
    if (me_world % 2 == 1) check_group(g, count, "the odd ranks", 0);
    CALL("group_free", dcomm_group_free(g));
  }
  free(odd);
  CALL("barrier at the end", dcomm_barrier(NULL));
  if (me_world == 0) printf("scale_check ok: %d ranks, group of %d, %zu elements\n", n, no, count);
  CALL("dcomm_finalize", dcomm_finalize());
  return 0;
}
