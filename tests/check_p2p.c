/*
 * check_p2p.c: point-to-point probing and any-source receives on real
 * processes: dcomm_probe with and without waiting, per-peer FIFO order,
 * dcomm_recv_any from several senders, a size mismatch, a dead and an
 * aborting peer (an error, not a hang), the group's timeout, and two ranks
 * that send each other messages larger than a shared-memory ring and then
 * probe for them (the engine drains incoming messages while it sends),
 * over shared memory and over TCP, and a send over a link made on first
 * use that completes while its receiver is in no dcomm call.
 */
#include "config.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm.h"
#include "harness.h"

static int body_probe(int rank, int n, void *arg) {
  (void)n, (void)arg;
  int src = -7;
  size_t nb = 0;
  if (rank == 1) {
    /* Nothing sent yet: 0 at once with timeout 0, after it otherwise. */
    double t0 = mp_now();
    MP_REQUIRE(dcomm_probe(0, 5, NULL, 0, &src, &nb) == 0, "probe with nothing sent");
    MP_REQUIRE(dcomm_probe(DCOMM_ANY_SOURCE, 5, NULL, 0, &src, &nb) == 0, "any-source probe with nothing sent");
    MP_REQUIRE(mp_now() - t0 < 0.5, "timeout 0 took %.3f s", mp_now() - t0);
    t0 = mp_now();
    MP_REQUIRE(dcomm_probe(0, 5, NULL, 0.3, &src, &nb) == 0, "probe that times out");
    double dt = mp_now() - t0;
    MP_REQUIRE(dt >= 0.25 && dt < 3, "timeout of 0.3 s took %.3f s", dt);
    /* bad arguments */
    MP_REQUIRE(dcomm_probe(1, 5, NULL, 0, &src, &nb) == DCOMM_EINVAL, "probe of itself");
    MP_REQUIRE(dcomm_probe(2, 5, NULL, 0, &src, &nb) == DCOMM_EINVAL, "probe of a rank out of range");
    MP_REQUIRE(dcomm_probe(-2, 5, NULL, 0, &src, &nb) == DCOMM_EINVAL, "probe of rank -2");
    MP_REQUIRE(dcomm_probe(0, -1, NULL, 0, &src, &nb) == DCOMM_EINVAL, "negative tag");
    MP_REQUIRE(dcomm_probe(0, 5, NULL, -1, &src, &nb) == DCOMM_EINVAL, "negative timeout");
    MP_REQUIRE(dcomm_recv_any(NULL, 4, DCOMM_INT32, 5, NULL, &src) == DCOMM_EINVAL, "recv_any into NULL");
  }
  MP_OK(dcomm_barrier(NULL));
  if (rank == 0) {
    int32_t a[100], b[3] = {1, 2, 3}, c[5] = {4, 5, 6, 7, 8};
    for (int i = 0; i < 100; i++) a[i] = i * 3;
    MP_OK(dcomm_send(a, 100, DCOMM_INT32, 1, 5, NULL));
    MP_OK(dcomm_send(b, 3, DCOMM_INT32, 1, 7, NULL));
    MP_OK(dcomm_send(c, 5, DCOMM_INT32, 1, 7, NULL));
    MP_OK(dcomm_send(NULL, 0, DCOMM_INT32, 1, 8, NULL));
  } else {
    MP_REQUIRE(dcomm_probe(0, 6, NULL, 0, &src, &nb) == 0, "probe of a tag never sent");
    MP_REQUIRE(dcomm_probe(0, 5, NULL, 10, &src, &nb) == 1, "probe of tag 5");
    MP_REQUIRE(src == 0 && nb == 400, "probe gave src %d nbytes %zu", src, nb);
    /* Probing again finds the same message; the receive takes it. */
    src = -7;
    MP_REQUIRE(dcomm_probe(DCOMM_ANY_SOURCE, 5, NULL, 0, &src, &nb) == 1 && src == 0 && nb == 400, "probe again");
    int32_t a[100];
    MP_OK(dcomm_recv(a, 100, DCOMM_INT32, 0, 5, NULL));
    for (int i = 0; i < 100; i++) MP_REQUIRE(a[i] == i * 3, "a[%d] = %d", i, a[i]);
    MP_REQUIRE(dcomm_probe(0, 5, NULL, 0, &src, &nb) == 0, "tag 5 was taken");
    /* FIFO per (peer, tag): the 3-element message first. */
    MP_REQUIRE(dcomm_probe(0, 7, NULL, 10, &src, &nb) == 1 && nb == 12, "first tag 7 message: %zu bytes", nb);
    int32_t b[5] = {0};
    MP_OK(dcomm_recv(b, 3, DCOMM_INT32, 0, 7, NULL));
    MP_REQUIRE(b[0] == 1 && b[2] == 3, "first tag 7 message: %d %d", b[0], b[2]);
    MP_REQUIRE(dcomm_probe(0, 7, NULL, 10, &src, &nb) == 1 && nb == 20, "second tag 7 message: %zu bytes", nb);
    MP_OK(dcomm_recv(b, 5, DCOMM_INT32, 0, 7, NULL));
    MP_REQUIRE(b[0] == 4 && b[4] == 8, "second tag 7 message: %d %d", b[0], b[4]);
    MP_REQUIRE(dcomm_probe(DCOMM_ANY_SOURCE, 8, NULL, 10, &src, &nb) == 1 && src == 0 && nb == 0, "empty message");
    MP_OK(dcomm_recv(NULL, 0, DCOMM_INT32, 0, 8, NULL));
  }
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_probe) { ck_assert_int_eq(mp_run(2, body_probe, NULL, 60), 0); }
END_TEST

/* Ranks 1..n-1 each send 3 messages to rank 0, which takes them with
 * recv_any: every message once, each sender's in order. */
static int body_any(int rank, int n, void *arg) {
  (void)arg;
  const int per = 3;
  if (rank > 0) {
    for (int i = 0; i < per; i++) {
      int32_t v[2] = {rank, i};
      MP_OK(dcomm_send(v, 2, DCOMM_INT32, 0, 3, NULL));
    }
  } else {
    int next[8] = {0};
    for (int k = 0; k < (n - 1) * per; k++) {
      int32_t v[2] = {-1, -1};
      int src = -1;
      MP_OK(dcomm_recv_any(v, 2, DCOMM_INT32, 3, NULL, &src));
      MP_REQUIRE(src >= 1 && src < n && v[0] == src, "message %d: src %d carries rank %d", k, src, v[0]);
      MP_REQUIRE(v[1] == next[src], "from rank %d: message %d, expected %d", src, v[1], next[src]);
      next[src]++;
    }
    for (int r = 1; r < n; r++) MP_REQUIRE(next[r] == per, "rank %d: %d messages", r, next[r]);
    int src;
    size_t nb;
    MP_REQUIRE(dcomm_probe(DCOMM_ANY_SOURCE, 3, NULL, 0, &src, &nb) == 0, "nothing left");
  }
  /* A sub-group: group ranks, not world ranks. */
  int members[] = {2, 0, 1};
  dcomm_group_t g;
  MP_OK(dcomm_new_group(members, 3, &g));
  if (rank <= 2) {
    int gr = dcomm_group_rank(g);
    if (gr != 0) {
      int32_t v = gr * 10;
      MP_OK(dcomm_send(&v, 1, DCOMM_INT32, 0, 4, g));
    } else {
      for (int k = 0; k < 2; k++) {
        int32_t v = -1;
        int src = -1;
        MP_OK(dcomm_recv_any(&v, 1, DCOMM_INT32, 4, g, &src));
        MP_REQUIRE((src == 1 || src == 2) && v == src * 10, "group rank %d sent %d", src, v);
      }
    }
  }
  MP_OK(dcomm_group_free(g));
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_any) { ck_assert_int_eq(mp_run(4, body_any, NULL, 60), 0); }
END_TEST

static int body_mismatch(int rank, int n, void *arg) {
  (void)n, (void)arg;
  int32_t v[8] = {0};
  if (rank == 1) {
    MP_OK(dcomm_send(v, 4, DCOMM_INT32, 0, 2, NULL));
    /* rank 0's error breaks the world: the barrier fails, not hangs */
    MP_REQUIRE(dcomm_barrier(NULL) < 0, "barrier after the peer's mismatch");
    return 0;
  }
  int src = -1;
  int rc = dcomm_recv_any(v, 8, DCOMM_INT32, 2, NULL, &src);
  MP_REQUIRE(rc == DCOMM_EMISMATCH, "recv_any of 8 for 4 elements gave %s", dcomm_error_name(rc));
  MP_REQUIRE(strstr(dcomm_last_error(), "mismatched") && strstr(dcomm_last_error(), "recv_any"), "message: %s",
             dcomm_last_error());
  return 0;
}

START_TEST(test_mismatch) { ck_assert_int_eq(mp_run(2, body_mismatch, NULL, 60), 0); }
END_TEST

/* _i 0: the peer dies (probe of it); 1: it dies (recv_any); 2: it aborts
 * the world after a timeout of its own (any-source probe). */
static int body_dead(int rank, int n, void *arg) {
  (void)n;
  int mode = *(int *)arg;
  MP_OK(dcomm_barrier(NULL));
  if (rank == 1) {
    if (mode < 2) _exit(0); /* no finalize: the links just close */
    MP_OK(dcomm_group_set_timeout(NULL, 0.3));
    int32_t v;
    MP_REQUIRE(dcomm_recv(&v, 1, DCOMM_INT32, 0, 1, NULL) == DCOMM_ETIMEDOUT, "recv that nobody serves");
    return 0;
  }
  double t0 = mp_now();
  int src;
  size_t nb;
  int32_t v;
  int rc = mode == 0   ? dcomm_probe(1, 1, NULL, 20, &src, &nb)
           : mode == 1 ? dcomm_recv_any(&v, 1, DCOMM_INT32, 1, NULL, &src)
                       : dcomm_probe(DCOMM_ANY_SOURCE, 1, NULL, 20, &src, &nb);
  double dt = mp_now() - t0;
  MP_REQUIRE(rc < 0, "mode %d: %d", mode, rc);
  MP_REQUIRE(mode == 2 || rc == DCOMM_EPEERLOST, "mode %d: %s", mode, dcomm_error_name(rc));
  MP_REQUIRE(dt < 8, "mode %d: the error took %.2f s", mode, dt);
  return 0;
}

START_TEST(test_dead) {
  int mode = _i;
  ck_assert_int_eq(mp_run(2, body_dead, &mode, 60), 0);
}
END_TEST

static int body_timeout(int rank, int n, void *arg) {
  (void)n, (void)arg;
  if (rank == 0) {
    MP_OK(dcomm_group_set_timeout(NULL, 0.4));
    int32_t v;
    int src;
    double t0 = mp_now();
    int rc = dcomm_recv_any(&v, 1, DCOMM_INT32, 9, NULL, &src);
    double dt = mp_now() - t0;
    MP_REQUIRE(rc == DCOMM_ETIMEDOUT, "recv_any with nothing sent: %s", dcomm_error_name(rc));
    MP_REQUIRE(strstr(dcomm_last_error(), "recv_any") && strstr(dcomm_last_error(), "tag 9"), "message: %s",
               dcomm_last_error());
    MP_REQUIRE(dt >= 0.35 && dt < 4, "took %.2f s", dt);
    MP_OK(dcomm_group_set_timeout(NULL, 30));
  }
  /* nothing was consumed: the world still works */
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_timeout) { ck_assert_int_eq(mp_run(2, body_timeout, NULL, 60), 0); }
END_TEST

/* The pattern of a torch backend's single thread: send, then a probe loop
 * for the reply, on both ranks at once, with messages larger than a
 * shared-memory ring (1 MiB) and than the socket buffers. */
static int body_cross(int rank, int n, void *arg) {
  (void)n;
  size_t bytes = *(size_t *)arg, cnt = bytes / 4;
  int32_t *out = malloc(bytes), *in = malloc(bytes);
  MP_REQUIRE(out && in, "out of memory");
  int peer = 1 - rank;
  for (int it = 0; it < 3; it++) {
    for (size_t k = 0; k < cnt; k++) out[k] = (int32_t)(k * 7 + (size_t)rank * 1000003 + (size_t)it);
    double t0 = mp_now();
    MP_OK(dcomm_send(out, cnt, DCOMM_INT32, peer, 11, NULL));
    int src = -1, got = 0;
    size_t nb = 0;
    while (!got) {
      got = dcomm_probe(DCOMM_ANY_SOURCE, 11, NULL, 0.05, &src, &nb);
      MP_REQUIRE(got >= 0, "probe: %s", dcomm_error_name(got));
      MP_REQUIRE(mp_now() - t0 < 20, "iteration %d: no message after 20 s", it);
    }
    MP_REQUIRE(src == peer && nb == bytes, "probe gave src %d nbytes %zu", src, nb);
    MP_OK(dcomm_recv(in, cnt, DCOMM_INT32, peer, 11, NULL));
    for (size_t k = 0; k < cnt; k++)
      MP_REQUIRE(in[k] == (int32_t)(k * 7 + (size_t)peer * 1000003 + (size_t)it), "it %d: in[%zu] = %d", it, k, in[k]);
  }
  free(out);
  free(in);
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

/* _i: 0 shared memory (4 MiB), 1 shared memory (16 MiB), 2 TCP (4 MiB),
 * 3 TCP (16 MiB, more than the socket buffers). */
START_TEST(test_cross) {
  size_t bytes = (_i % 2 ? 16 : 4) << 20;
  setenv("DCOMM_TRANSPORT", _i < 2 ? "shm" : "tcp", 1);
  int failed = mp_run(2, body_cross, &bytes, 60);
  unsetenv("DCOMM_TRANSPORT");
  ck_assert_msg(failed == 0, "case %d: %d ranks failed", _i, failed);
}
END_TEST

/* A send to a peer this rank has no link with yet (not a ring
 * neighbour): the link is dialed and a small message goes out at once,
 * while the receiver is not in any dcomm call (its listener thread takes
 * the link). Rank 0 sends to rank 3 (a lower rank dials a higher one),
 * rank 4 to rank 1 (the other way); each sender then leaves a file, which
 * the receiver waits for before it calls dcomm_recv: a send that needed
 * the receiver in a call would leave no file, and the receiver fails. */
struct lazy_arg {
  char dir[64];
};

static int body_lazy(int rank, int n, void *arg) {
  (void)n;
  const struct lazy_arg *la = arg;
  int to = rank == 0 ? 3 : rank == 4 ? 1 : -1, from = rank == 3 ? 0 : rank == 1 ? 4 : -1;
  int32_t buf[256];
  char path[128];
  if (to >= 0) {
    for (int k = 0; k < 256; k++) buf[k] = rank * 1000 + k;
    MP_OK(dcomm_send(buf, 256, DCOMM_INT32, to, 5, NULL));
    snprintf(path, sizeof(path), "%s/sent-%d", la->dir, rank);
    FILE *f = fopen(path, "w");
    MP_REQUIRE(f && fclose(f) == 0, "cannot write %s", path);
  }
  if (from >= 0) {
    snprintf(path, sizeof(path), "%s/sent-%d", la->dir, from);
    double t0 = mp_now();
    while (access(path, F_OK) != 0) {
      MP_REQUIRE(mp_now() - t0 < 20, "rank %d's send to rank %d did not return while rank %d was outside dcomm",
                 from, rank, rank);
      usleep(10000);
    }
    MP_OK(dcomm_recv(buf, 256, DCOMM_INT32, from, 5, NULL));
    for (int k = 0; k < 256; k++) MP_REQUIRE(buf[k] == from * 1000 + k, "buf[%d] = %d", k, buf[k]);
  }
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

/* _i: 0 shared memory, 1 TCP. */
START_TEST(test_lazy) {
  struct lazy_arg la;
  snprintf(la.dir, sizeof(la.dir), "/tmp/dcomm-lazy-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(la.dir));
  setenv("DCOMM_TRANSPORT", _i == 0 ? "shm" : "tcp", 1);
  int failed = mp_run(6, body_lazy, &la, 60);
  unsetenv("DCOMM_TRANSPORT");
  char path[128];
  for (int r = 0; r < 6; r++) {
    snprintf(path, sizeof(path), "%s/sent-%d", la.dir, r);
    unlink(path);
  }
  rmdir(la.dir);
  ck_assert_msg(failed == 0, "case %d: %d ranks failed", _i, failed);
}
END_TEST

int main(void) {
  Suite *s = suite_create("p2p");
  TCase *tc = tcase_create("p2p");
  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, test_probe);
  tcase_add_test(tc, test_any);
  tcase_add_test(tc, test_mismatch);
  tcase_add_loop_test(tc, test_dead, 0, 3);
  tcase_add_test(tc, test_timeout);
  tcase_add_loop_test(tc, test_cross, 0, 4);
  tcase_add_loop_test(tc, test_lazy, 0, 2);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
