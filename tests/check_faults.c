/*
 * check_faults.c: what users rely on when things go wrong. A rank killed
 * with SIGKILL in the middle of a large all_reduce (rank 0, which hosts the
 * store, included) makes every survivor return DCOMM_EPEERLOST within
 * seconds, not at the timeout; mismatched collectives give DCOMM_EMISMATCH
 * on every rank; a silent peer gives DCOMM_ETIMEDOUT at the group timeout;
 * comm_abort from another thread releases a blocked call; bad arguments
 * fail locally with DCOMM_EINVAL. The kill and abort cases run again with
 * each transport of the tcp backend forced (shared memory, the default on
 * one host, and TCP), a sender killed in the middle of a message larger
 * than the ring leaves its receiver with DCOMM_EPEERLOST (and nothing in
 * /dev/shm),
 * DCOMM_TRANSPORT=shm fails clearly where shared memory cannot be used, and
 * a peer that finalizes while the others wait for it is named as having
 * finalized, not as dead (also when its shared-memory ring was full).
 */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dcomm.h"
#include "harness.h"
#include "auth.h"
#include "world.h"
#include "sock.h"
#include "store.h"

static volatile double *shared_kill_time; /* written by the victim */

static void *killer(void *arg) {
  usleep((useconds_t)(intptr_t)arg);
  *shared_kill_time = mp_now();
  kill(getpid(), SIGKILL);
  return NULL;
}

static int victim_rank;

static int body_kill(int rank, int n, void *arg) {
  size_t count = 16u << 20; /* 64 MiB of float32 */
  float *buf = malloc(count * sizeof(float));
  MP_REQUIRE(buf != NULL, "malloc");
  for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
  MP_OK(dcomm_barrier(NULL));
  if (rank == victim_rank) {
    pthread_t t;
    pthread_create(&t, NULL, killer, (void *)(intptr_t)100000);
  }
  int rc = 0;
  double t_err = 0;
  for (int it = 0; it < 200 && rc == 0; it++) {
    rc = dcomm_all_reduce(buf, count, DCOMM_FLOAT32, DCOMM_SUM, NULL);
    t_err = mp_now();
  }
  MP_REQUIRE(rank != victim_rank, "the victim survived");
  MP_REQUIRE(rc == DCOMM_EPEERLOST, "survivor got %s (%s), want DCOMM_EPEERLOST", dcomm_error_name(rc),
             dcomm_last_error());
  double lat = t_err - *shared_kill_time;
  fprintf(stderr, "[rank %d] error %.3f s after the kill: %s\n", rank, lat, dcomm_last_error());
  MP_REQUIRE(lat < 5.0, "survivor took %.2f s to notice the dead rank", lat);
  /* Later calls fail fast with the same class of error. */
  double t0 = mp_now();
  rc = dcomm_all_reduce(buf, 16, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  MP_REQUIRE(rc == DCOMM_EPEERLOST && mp_now() - t0 < 1.0, "later call: %s after %.2f s", dcomm_error_name(rc),
             mp_now() - t0);
  free(buf);
  return 0;
}

static void run_kill(int victim) {
  struct mp_result res;
  victim_rank = victim;
  *shared_kill_time = 0;
  setenv("DCOMM_TIMEOUT", "120", 1);
  mp_run_ex(4, body_kill, NULL, 100, 0, &res);
  unsetenv("DCOMM_TIMEOUT");
  ck_assert_int_eq(res.timed_out, 0);
  for (int r = 0; r < 4; r++) {
    if (r == victim) ck_assert_int_eq(res.exit_code[r], 128 + SIGKILL);
    else ck_assert_msg(res.exit_code[r] == 0, "survivor %d exited %d", r, res.exit_code[r]);
  }
}

START_TEST(test_kill_nonzero_rank) { run_kill(2); }
END_TEST

START_TEST(test_kill_rank0) { run_kill(0); }
END_TEST

/* Ranks calling different collectives all learn it, naming both calls. */
static int body_mismatch(int rank, int n, void *arg) {
  int kind = *(int *)arg;
  float buf[12] = {0};
  int rc;
  if (kind == 0) {
    rc = rank == n - 1 ? dcomm_broadcast(buf, 10, DCOMM_FLOAT32, 0, NULL)
                       : dcomm_all_reduce(buf, 10, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  } else {
    rc = dcomm_all_reduce(buf, rank == 1 ? 12 : 10, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  }
  MP_REQUIRE(rc == DCOMM_EMISMATCH, "got %s, want DCOMM_EMISMATCH", dcomm_error_name(rc));
  const char *msg = dcomm_last_error();
  if (kind == 0) MP_REQUIRE(strstr(msg, "broadcast") && strstr(msg, "all_reduce"), "message lacks both calls: %s", msg);
  else MP_REQUIRE(strstr(msg, "count 12") && strstr(msg, "count 10"), "message lacks both counts: %s", msg);
  return 0;
}

START_TEST(test_mismatch_kind) {
  int kind = 0;
  ck_assert_int_eq(mp_run(3, body_mismatch, &kind, 60), 0);
}
END_TEST

START_TEST(test_mismatch_count) {
  int kind = 1;
  ck_assert_int_eq(mp_run(3, body_mismatch, &kind, 60), 0);
}
END_TEST

/* A rank that never calls: the others time out at the group timeout. */
static int body_timeout(int rank, int n, void *arg) {
  float x = 1;
  MP_OK(dcomm_group_set_timeout(NULL, 1.0));
  if (rank == 1) {
    sleep(3);
    /* Its first call may still complete with the data the peer sent before
     * giving up; the communicator is broken for the next one. */
    int rc = dcomm_all_reduce(&x, 1, DCOMM_FLOAT32, DCOMM_SUM, NULL);
    if (rc == 0) rc = dcomm_barrier(NULL);
    MP_REQUIRE(rc == DCOMM_ETIMEDOUT, "the late rank got %s, want the peer's DCOMM_ETIMEDOUT", dcomm_error_name(rc));
    return 0;
  }
  double t0 = mp_now();
  int rc = dcomm_all_reduce(&x, 1, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  double dt = mp_now() - t0;
  MP_REQUIRE(rc == DCOMM_ETIMEDOUT, "got %s", dcomm_error_name(rc));
  MP_REQUIRE(dt > 0.9 && dt < 2.5, "timed out after %.2f s with a 1 s timeout", dt);
  return 0;
}

START_TEST(test_timeout) { ck_assert_int_eq(mp_run(2, body_timeout, NULL, 60), 0); }
END_TEST

/* comm_abort from another thread releases a blocked recv. */
static void *aborter(void *arg) {
  usleep(200000);
  dcomm__w.be->comm_abort(dcomm__w.world.bcomm, DCOMM_EREVOKED);
  return NULL;
}

static int body_abort(int rank, int n, void *arg) {
  int32_t v = 0;
  if (rank == 0) {
    pthread_t t;
    pthread_create(&t, NULL, aborter, NULL);
    double t0 = mp_now();
    int rc = dcomm_recv(&v, 1, DCOMM_INT32, 1, 0, NULL);
    pthread_join(t, NULL);
    MP_REQUIRE(rc == DCOMM_EREVOKED, "got %s", dcomm_error_name(rc));
    MP_REQUIRE(mp_now() - t0 < 2.0, "abort took %.2f s", mp_now() - t0);
    rc = dcomm_barrier(NULL);
    MP_REQUIRE(rc == DCOMM_EREVOKED, "later call got %s", dcomm_error_name(rc));
  } else {
    /* The peer learns of the abort through the link. */
    int rc = dcomm_recv(&v, 1, DCOMM_INT32, 0, 0, NULL);
    MP_REQUIRE(rc == DCOMM_EREVOKED, "peer got %s", dcomm_error_name(rc));
  }
  return 0;
}

START_TEST(test_abort_thread) { ck_assert_int_eq(mp_run(2, body_abort, NULL, 60), 0); }
END_TEST

/* The non-blocking table: post, then test until done (worker progress). */
static int body_async(int rank, int n, void *arg) {
  int32_t x[1000];
  for (int i = 0; i < 1000; i++) x[i] = rank + i;
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_REDUCE, .recvbuf = x, .count = 1000, .dtype = DCOMM_INT32,
                              .op = DCOMM_SUM, .seq = 1, .deadline = mp_now() + 30};
  void *req;
  MP_OK(dcomm__w.be->post(dcomm__w.world.bcomm, &a, &req));
  int done = 0, rc = 0, polls = 0;
  while (!done) {
    rc = dcomm__w.be->test(req, &done);
    polls++;
    if (!done) usleep(100);
  }
  MP_REQUIRE(rc == 0, "async all_reduce: %s", dcomm_error_name(rc));
  for (int i = 0; i < 1000; i++) MP_REQUIRE(x[i] == n * (n - 1) / 2 + n * i, "element %d = %d", i, x[i]);
  dcomm__w.world.seq = 1; /* keep the public sequence in step with the post */
  MP_OK(dcomm_barrier(NULL));
  return 0;
}

START_TEST(test_async) { ck_assert_int_eq(mp_run(3, body_async, NULL, 60), 0); }
END_TEST

/* A stranger on a rank's peer port (garbage, then a wrong job id) is
 * refused during the next communicator's set-up and changes nothing. */
static int stranger(const char *job) {
  void *val = NULL;
  size_t len = 0;
  /* Rank 0's entry of the world's address directory (tcp_conn.c). */
  if (dcomm__store_get(dcomm__w.store, "tcp/addr/all", 5, &val, &len) < 0) return -1;
  uint64_t off0;
  memcpy(&off0, val, sizeof(off0));
  char *entry = (char *)val + off0;
  char host[80];
  int port = 0;
  char *colon = strrchr(entry, ':');
  *colon = 0;
  snprintf(host, sizeof(host), "%s", entry);
  port = atoi(colon + 1);
  free(val);
  int fd;
  if (dcomm__sock_connect(host, port, mp_now() + 5, &fd) < 0) return -1;
  if (!job) {
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    if (write(fd, junk, sizeof(junk)) < 0) { /* the peer may already have hung up */ }
  } else {
    dcomm__hs_client(fd, job, "", 2, "x", 1, mp_now() + 5); /* refused */
  }
  return fd;
}

static int body_stranger(int rank, int n, void *arg) {
  int fds[2] = {-1, -1};
  if (rank == 1) {
    fds[0] = stranger(NULL);
    fds[1] = stranger("another-job");
    MP_REQUIRE(fds[0] >= 0 && fds[1] >= 0, "could not reach rank 0's peer port");
  }
  int both[] = {0, 1};
  dcomm_group_t g;
  MP_OK(dcomm_new_group(both, 2, &g));
  int32_t v = rank + 1;
  MP_OK(dcomm_all_reduce(&v, 1, DCOMM_INT32, DCOMM_SUM, g));
  MP_REQUIRE(v == 3, "sum %d", v);
  MP_OK(dcomm_group_free(g));
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0) close(fds[i]);
  return 0;
}

START_TEST(test_stranger) { ck_assert_int_eq(mp_run(2, body_stranger, NULL, 60), 0); }
END_TEST

static int body_badargs(int rank, int n, void *arg) {
  float x[4] = {0};
  MP_REQUIRE(dcomm_all_reduce(x, 4, (dcomm_dtype_t)99, DCOMM_SUM, NULL) == DCOMM_EINVAL, "bad dtype");
  MP_REQUIRE(dcomm_all_reduce(x, 4, DCOMM_FLOAT32, (dcomm_op_t)42, NULL) == DCOMM_EINVAL, "bad op");
  MP_REQUIRE(dcomm_all_reduce(NULL, 4, DCOMM_FLOAT32, DCOMM_SUM, NULL) == DCOMM_EINVAL, "NULL buffer");
  MP_REQUIRE(dcomm_broadcast(x, 4, DCOMM_FLOAT32, n, NULL) == DCOMM_EINVAL, "root out of range");
  MP_REQUIRE(strstr(dcomm_last_error(), "root") != NULL, "message should name the root: %s", dcomm_last_error());
  MP_REQUIRE(dcomm_reduce(x, 4, DCOMM_FLOAT32, DCOMM_SUM, -1, NULL) == DCOMM_EINVAL, "negative root");
  MP_REQUIRE(dcomm_send(x, 4, DCOMM_FLOAT32, rank, 0, NULL) == DCOMM_EINVAL, "send to self");
  MP_REQUIRE(dcomm_send(x, 4, DCOMM_FLOAT32, (rank + 1) % n, -3, NULL) == DCOMM_EINVAL, "negative tag");
  MP_REQUIRE(dcomm_all_gather(x, x, SIZE_MAX / 2, DCOMM_FLOAT32, NULL) == DCOMM_EINVAL, "overflowing count");
  MP_REQUIRE(dcomm_all_reduce(x, 4, DCOMM_FLOAT32, DCOMM_SUM, (dcomm_group_t)(uintptr_t)0x1234) == DCOMM_EINVAL,
             "stale group handle");
  /* none of that broke the world */
  x[0] = 1;
  MP_OK(dcomm_all_reduce(x, 1, DCOMM_FLOAT32, DCOMM_SUM, NULL));
  MP_REQUIRE(x[0] == n, "sum %g", x[0]);
  return 0;
}

START_TEST(test_badargs) { ck_assert_int_eq(mp_run(2, body_badargs, NULL, 60), 0); }
END_TEST

START_TEST(test_not_initialized) {
  float x = 0;
  ck_assert_int_eq(dcomm_all_reduce(&x, 1, DCOMM_FLOAT32, DCOMM_SUM, NULL), DCOMM_ENOTINIT);
  ck_assert_int_eq(dcomm_rank(), DCOMM_ENOTINIT);
  ck_assert_int_eq(dcomm_finalize(), DCOMM_ENOTINIT);
  ck_assert_int_eq(dcomm_barrier(NULL), DCOMM_ENOTINIT);
}
END_TEST

/* _i: 0 shm, 1 tcp; victim 1 of 4 in a 64 MiB all_reduce, then an abort. */
START_TEST(test_kill_transport) {
  const char *tr = _i ? "tcp" : "shm";
  setenv("DCOMM_TRANSPORT", tr, 1);
  run_kill(1);
  int failed = mp_run(2, body_abort, NULL, 60);
  unsetenv("DCOMM_TRANSPORT");
  ck_assert_msg(failed == 0, "abort with DCOMM_TRANSPORT=%s: %d ranks failed", tr, failed);
}
END_TEST

/* The sender dies while it writes a 64 MiB message into a 64 KiB ring:
 * the receiver, blocked in the middle of the message, gets EPEERLOST. */
static int body_kill_sender(int rank, int n, void *arg) {
  size_t count = 16u << 20;
  float *buf = calloc(count, sizeof(float));
  MP_REQUIRE(buf != NULL, "calloc");
  MP_OK(dcomm_barrier(NULL));
  if (rank == 1) {
    pthread_t t;
    pthread_create(&t, NULL, killer, (void *)(intptr_t)20000);
    for (;;) dcomm_send(buf, count, DCOMM_FLOAT32, 0, 1, NULL);
  }
  int rc = 0;
  for (int it = 0; it < 1000 && rc == 0; it++) rc = dcomm_recv(buf, count, DCOMM_FLOAT32, 1, 1, NULL);
  MP_REQUIRE(rc == DCOMM_EPEERLOST, "receiver got %s (%s), want DCOMM_EPEERLOST", dcomm_error_name(rc),
             dcomm_last_error());
  free(buf);
  return 0;
}

/* Entries of /dev/shm whose name mentions dcomm (other programs may use
 * /dev/shm meanwhile; the shared-memory links must never leave anything). */
static int dcomm_shm_files(void) {
  DIR *d = opendir("/dev/shm");
  int n = 0;
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, "dcomm")) n++;
  closedir(d);
  return n;
}

START_TEST(test_kill_sender_shm) {
  struct mp_result res;
  int before = dcomm_shm_files();
  setenv("DCOMM_TRANSPORT", "shm", 1);
  setenv("DCOMM_SHM_RING_SIZE", "65536", 1);
  setenv("DCOMM_TIMEOUT", "60", 1);
  mp_run_ex(2, body_kill_sender, NULL, 90, 0, &res);
  unsetenv("DCOMM_TRANSPORT");
  unsetenv("DCOMM_SHM_RING_SIZE");
  unsetenv("DCOMM_TIMEOUT");
  ck_assert_int_eq(res.timed_out, 0);
  ck_assert_int_eq(res.exit_code[1], 128 + SIGKILL);
  ck_assert_msg(res.exit_code[0] == 0, "receiver exited %d", res.exit_code[0]);
  ck_assert_msg(dcomm_shm_files() <= before, "the killed rank left files in /dev/shm");
}
END_TEST

/* DCOMM_TRANSPORT=shm where it cannot work. kind 0: the peer forces tcp;
 * kind 1: rank 1 runs under another host name (a UTS namespace). */
static int body_shm_refused(int rank, int n, void *arg) {
  int kind = *(int *)arg;
  setenv("DCOMM_TIMEOUT", "20", 1);
  setenv("DCOMM_TRANSPORT", kind == 0 && rank == 1 ? "tcp" : "shm", 1);
  if (kind == 1 && rank == 1) {
    MP_REQUIRE(unshare(CLONE_NEWUTS) == 0, "unshare");
    MP_REQUIRE(sethostname("dcomm-other-host", 16) == 0, "sethostname");
  }
  int rc = dcomm_init("tcp", getenv("DCOMM_TEST_URL"));
  if (kind == 0 && rank == 1) {
    /* Its own links are fine; it learns that rank 0 left. */
    if (rc == 0) rc = dcomm_barrier(NULL);
    MP_REQUIRE(rc == DCOMM_EPEERLOST, "the tcp rank got %s", dcomm_error_name(rc));
    return 0;
  }
  MP_REQUIRE(rc == DCOMM_EINVAL, "got %s (%s), want DCOMM_EINVAL", dcomm_error_name(rc), dcomm_last_error());
  const char *msg = dcomm_last_error();
  MP_REQUIRE(strstr(msg, "DCOMM_TRANSPORT=shm"), "message does not name the setting: %s", msg);
  if (kind == 1) MP_REQUIRE(strstr(msg, "another host"), "message does not say why: %s", msg);
  return 0;
}

/* Whether this process may create a UTS namespace (root, or a user ns). */
static int can_unshare_uts(void) {
  pid_t p = fork();
  if (p == 0) _exit(unshare(CLONE_NEWUTS) == 0 ? 0 : 1);
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

START_TEST(test_shm_refused) {
  struct mp_result res;
  int kind = _i;
  if (kind == 1 && !can_unshare_uts()) {
    fprintf(stderr, "test_shm_refused: no UTS namespace here (not root); the other-host case is not run\n");
    return;
  }
  ck_assert_int_eq(mp_run_ex(2, body_shm_refused, &kind, 60, 1, &res), 0);
}
END_TEST

/* A peer that calls dcomm_finalize while the others still wait in a
 * collective or a receive: they get DCOMM_EPEERLOST, soon, saying that
 * world rank 1 finalized (not that it died). _i 0-3: bit 0 the transport
 * (shm, tcp), bit 1 the call (all_reduce, recv); 4: over shared memory,
 * rank 1 fills its 64 KiB ring to rank 0 with a message rank 0 never
 * receives, then finalizes (its goodbye cannot go in the ring), and rank
 * 0 calls all_reduce after that. */
static int body_peer_finalized(int rank, int n, void *arg) {
  int kind = *(int *)arg;
  (void)n;
  MP_OK(dcomm_barrier(NULL));
  float x[64] = {0};
  if (rank == 1) {
    if (kind == 4) {
      static float fill[16352]; /* with its header, exactly the ring */
      MP_OK(dcomm_send(fill, 16352, DCOMM_FLOAT32, 0, 9, NULL));
    } else {
      usleep(300000); /* the others are waiting by now */
    }
    MP_OK(dcomm_finalize());
    return 0;
  }
  if (kind == 4) usleep(500000); /* rank 1 is gone by now */
  double t0 = mp_now();
  int rc = kind & 2 ? dcomm_recv(x, 64, DCOMM_FLOAT32, 1, 5, NULL)
                    : dcomm_all_reduce(x, 64, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  double took = mp_now() - t0;
  const char *msg = dcomm_last_error();
  fprintf(stderr, "[rank %d] %s after %.2f s: %s\n", rank, dcomm_error_name(rc), took, msg);
  MP_REQUIRE(rc == DCOMM_EPEERLOST, "got %s, want DCOMM_EPEERLOST", dcomm_error_name(rc));
  MP_REQUIRE(took < 5.0, "the error came after %.2f s", took);
  MP_REQUIRE(strstr(msg, "world rank 1") && strstr(msg, "finalized") && !strstr(msg, "died or aborted"),
             "the message does not say that world rank 1 finalized: %s", msg);
  return 0;
}

START_TEST(test_peer_finalized) {
  struct mp_result res;
  int kind = _i;
  setenv("DCOMM_TRANSPORT", kind & 1 ? "tcp" : "shm", 1);
  setenv("DCOMM_TIMEOUT", "30", 1);
  if (kind == 4) {
    setenv("DCOMM_SHM_RING_SIZE", "65536", 1);
    setenv("DCOMM_SHM_CMA_MIN", "0", 1); /* the message goes through the ring */
  }
  mp_run_ex(kind & 2 || kind == 4 ? 2 : 3, body_peer_finalized, &kind, 40, 0, &res);
  unsetenv("DCOMM_TRANSPORT");
  unsetenv("DCOMM_TIMEOUT");
  unsetenv("DCOMM_SHM_RING_SIZE");
  unsetenv("DCOMM_SHM_CMA_MIN");
  ck_assert_int_eq(res.timed_out, 0);
  ck_assert_msg(res.failed == 0, "kind %d: %d ranks failed", kind, res.failed);
}
END_TEST

int main(void) {
  shared_kill_time = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  Suite *s = suite_create("faults");
  TCase *tc = tcase_create("faults");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_kill_nonzero_rank);
  tcase_add_test(tc, test_kill_rank0);
  tcase_add_test(tc, test_mismatch_kind);
  tcase_add_test(tc, test_mismatch_count);
  tcase_add_test(tc, test_timeout);
  tcase_add_test(tc, test_abort_thread);
  tcase_add_test(tc, test_async);
  tcase_add_test(tc, test_badargs);
  tcase_add_test(tc, test_stranger);
  tcase_add_test(tc, test_not_initialized);
  tcase_add_loop_test(tc, test_kill_transport, 0, 2);
  tcase_add_test(tc, test_kill_sender_shm);
  tcase_add_loop_test(tc, test_shm_refused, 0, 2);
  tcase_add_loop_test(tc, test_peer_finalized, 0, 5);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
