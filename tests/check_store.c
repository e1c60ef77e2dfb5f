/*
 * check_store.c: unit tests of the embedded TCP store and of the file store.
 * Every case of the store conformance suite (store_conformance.c: set, get,
 * wait, add, compare_set, txn, delete, prefixes, views, timeouts, argument
 * errors, wake-ups, races) runs against both: the TCP cases on a real
 * embedded server on 127.0.0.1 (port 0) through clients, the file cases on
 * one file opened through several handles, threads and processes as ranks
 * would. What only one implementation has is tested here: the TCP
 * handshake, raw and garbage frames through raw sockets, server stop and
 * connect timeouts, slow clients, a burst of 10 000 connections and the
 * client limit; the file log's torn and corrupt records, its open
 * errors and the size of a failed txn's append.
 */
#include "config.h"

#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "dcomm.h"
#include "param.h"
#include "sock.h"
#include "store.h"
#include "store_conformance.h"
#include "store_proto.h"

#define JOB "job-check"
#define TOKEN "s3cret-token"

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* ---- TCP store: fixture and raw-socket helpers ---- */

static struct dcomm_store_server *srv;
static int port;

static void server_setup(void) {
  int rc = dcomm__store_server_start("127.0.0.1", 0, JOB, TOKEN, &srv);
  ck_assert_msg(rc == 0, "server start: %s", dcomm_last_error());
  port = dcomm__store_server_port(srv);
  ck_assert_int_gt(port, 0);
}

static void server_teardown(void) {
  dcomm__store_server_stop(srv);
  srv = NULL;
}

static struct dcomm_store *client_t(double timeout) {
  struct dcomm_store *s = NULL;
  int rc = dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 5.0, timeout, &s);
  ck_assert_msg(rc == 0, "connect: %d (%s)", rc, dcomm_last_error());
  ck_assert_str_eq(s->ops->name, "tcp");
  return s;
}

static struct dcomm_store *client(void) { return client_t(0.3); }

/* A raw connection; with a job id it first runs the client handshake. */
static int raw_connect(const char *job, const char *token, uint32_t purpose, int *hs_rc) {
  int fd = -1;
  ok(dcomm__sock_connect("127.0.0.1", port, dcomm__now() + 5, &fd));
  if (job) {
    int rc = dcomm__hs_client(fd, job, token, purpose, NULL, 0, dcomm__now() + 5);
    if (hs_rc) *hs_rc = rc;
    else ck_assert_msg(rc == 0, "raw handshake: %s", dcomm_last_error());
  }
  return fd;
}

static int raw_store(void) { return raw_connect(JOB, TOKEN, DCOMM_HS_STORE, NULL); }

static void raw_send(int fd, const void *buf, size_t n) {
  ok(dcomm__sock_send_all(fd, buf, n, dcomm__now() + 5, -1));
}

/* Reads one answer's status (and error text); 1 when the server closed. */
static int raw_status(int fd, double timeout) {
  unsigned char b[4], h[3];
  char msg[DCOMM_STORE_MAX_ERRMSG + 1];
  double dl = dcomm__now() + timeout;
  int rc = dcomm__sock_recv_all(fd, b, 4, dl, -1);
  if (rc == DCOMM_EPEERLOST) return 1;
  ck_assert_msg(rc == 0, "no answer from the server: %s", dcomm_last_error());
  int32_t st = (int32_t)dcomm__store_get_u32(b);
  if (st < 0) {
    ok(dcomm__sock_recv_all(fd, h, 3, dl, -1));
    size_t ml = (size_t)h[1] << 8 | h[2];
    ck_assert_uint_le(ml, DCOMM_STORE_MAX_ERRMSG);
    ok(dcomm__sock_recv_all(fd, msg, ml, dl, -1));
  }
  return st;
}

/* 1 when the server closes the connection within timeout (data discarded). */
static int raw_eof(int fd, double timeout) {
  double dl = dcomm__now() + timeout;
  char buf[512];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
    if (n > 0) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, dcomm__ms_until(dl)) == 0) return 0;
  }
}

/* A fresh authorized client still reads what was stored and can write. */
static void expect_server_serves(const char *key, const char *val) {
  struct dcomm_store *s = client();
  expect_value(s, key, val, strlen(val));
  ok(dcomm__store_set(s, "alive", "yes", 3));
  expect_value(s, "alive", "yes", 3);
  dcomm__store_close(s);
}

static size_t put_str(unsigned char *p, const void *b, uint32_t n) {
  dcomm__store_put_u32(p, n);
  memcpy(p + 4, b, n);
  return 4 + n;
}

/* The conformance cases' TCP store: a client of the fixture's server. */
static int tcp_open(double timeout, struct dcomm_store **out) {
  return dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 5.0, timeout, out);
}

static const struct store_factory tcp_factory = {
    .name = "tcp",
    .open = tcp_open,
    .add_threads = 16,
    .add_shared = 4,
    .add_procs = 3,
    .add_iters = 150,
};

/* ---- TCP tests ---- */

/* Sends a raw frame and checks the server answers DCOMM_EPROTO and closes
 * the connection (half_close: the frame ends early, so the server may
 * instead see the end of input, status 1). */
static void expect_frame_refused(const unsigned char *f, size_t n, int half_close) {
  int fd = raw_store();
  raw_send(fd, f, n);
  if (half_close) shutdown(fd, SHUT_WR);
  int st = raw_status(fd, 5);
  ck_assert_msg(st == DCOMM_EPROTO || (half_close && st == 1), "malformed frame (command %u) answered %d", f[0], st);
  ck_assert_msg(raw_eof(fd, 5), "the server kept the connection of a malformed frame (command %u)", f[0]);
  close(fd);
}


START_TEST(tcp_max_value_wire) {
  conf_set_max_value("1024");
  struct dcomm_store *b = client();
  /* The server enforces the bound itself, without reading the value. */
  int fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "raw-big", 7);
  p = dcomm__store_put_u32(p, 2000);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EINVAL);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  expect_absent(b, "raw-big");
  /* A txn value over the bound on the wire is refused unread as well. */
  fd = raw_store();
  p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_TXN);
  p = dcomm__store_put_u8(p, 0);
  p = dcomm__store_put_u8(p, 1);
  p += put_str(p, "raw-big-txn", 11);
  p = dcomm__store_put_u32(p, 2000);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EINVAL);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  expect_absent(b, "raw-big-txn");
  dcomm__store_close(b);
}
END_TEST

/* MGET on the wire: its answer's layout, and key counts out of range
 * refused with the connection closed. */
START_TEST(tcp_mget_wire) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "mg", "xyz", 3));
  int fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_MGET);
  p = dcomm__store_put_u64(p, 50);
  p = dcomm__store_put_u32(p, 2);
  p += put_str(p, "mg", 2);
  p += put_str(p, "absent", 6);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), 0);
  unsigned char ans[4 + 5 + 3 + 5];
  ck_assert_int_eq(dcomm__sock_recv_all(fd, ans, sizeof(ans), dcomm__now() + 5, -1), 0);
  ck_assert_uint_eq(dcomm__store_get_u32(ans), 2);
  ck_assert_int_eq(ans[4], 1);
  ck_assert_uint_eq(dcomm__store_get_u32(ans + 5), 3);
  ck_assert_int_eq(memcmp(ans + 9, "xyz", 3), 0);
  ck_assert_int_eq(ans[12], 0); /* absent at the deadline */
  ck_assert_uint_eq(dcomm__store_get_u32(ans + 13), 0);
  close(fd);
  uint32_t counts[] = {0, DCOMM_STORE_MAX_WAIT_KEYS + 1};
  for (int i = 0; i < 2; i++) {
    p = f;
    p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_MGET);
    p = dcomm__store_put_u64(p, 50);
    p = dcomm__store_put_u32(p, counts[i]);
    expect_frame_refused(f, (size_t)(p - f), 0);
  }
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_txn_wire) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  /* A well-formed raw txn: status 0 then the done byte; the connection
   * stays usable for the next request. */
  int fd = raw_store();
  unsigned char f[256], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_TXN);
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, DCOMM_STORE_ABSENT);
  p += put_str(p, "raw-a", 5);
  p += put_str(p, "", 0);
  p = dcomm__store_put_u8(p, 1);
  p += put_str(p, "raw-a", 5);
  p += put_str(p, "va", 2);
  unsigned char done = 9;
  for (int i = 0; i < 2; i++) {
    raw_send(fd, f, (size_t)(p - f));
    ck_assert_int_eq(raw_status(fd, 5), 0);
    ok(dcomm__sock_recv_all(fd, &done, 1, dcomm__now() + 5, -1));
    ck_assert_msg(done == (i == 0), "raw txn %d: done %u", i, done); /* the second time raw-a exists */
  }
  close(fd);
  expect_value(a, "raw-a", "va", 2);
  /* Too many compares (200 and 9), kind 9 and kind 3 (after a good
   * compare), no puts, too many puts, an empty compare key. Each frame is
   * sent exactly up to the byte the server refuses. */
  unsigned char m[64];
  p = m;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_TXN);
  p = dcomm__store_put_u8(p, 200);
  expect_frame_refused(m, (size_t)(p - m), 0);
  m[1] = DCOMM_STORE_TXN_MAX + 1;
  expect_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, 9);
  expect_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 2);
  p = dcomm__store_put_u8(p, DCOMM_STORE_ABSENT);
  p += put_str(p, "raw-b", 5);
  p += put_str(p, "", 0);
  p = dcomm__store_put_u8(p, 3);
  expect_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 0);
  p = dcomm__store_put_u8(p, 0);
  expect_frame_refused(m, (size_t)(p - m), 0);
  m[2] = DCOMM_STORE_TXN_MAX + 1;
  expect_frame_refused(m, (size_t)(p - m), 0);
  p = m + 1;
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, DCOMM_STORE_EXISTS);
  p = dcomm__store_put_u32(p, 0);
  expect_frame_refused(m, (size_t)(p - m), 0);
  /* A truncated txn whose compares hold: its first put does not happen. */
  p = m + 1;
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u8(p, DCOMM_STORE_ABSENT);
  p += put_str(p, "raw-t", 5);
  p += put_str(p, "", 0);
  p = dcomm__store_put_u8(p, 2);
  p += put_str(p, "raw-t", 5);
  p += put_str(p, "ok", 2);
  p += put_str(p, "raw-t2", 6);
  p = dcomm__store_put_u32(p, 10); /* 10 value bytes promised, 3 sent */
  memcpy(p, "abc", 3);
  p += 3;
  expect_frame_refused(m, (size_t)(p - m), 1);
  expect_absent(a, "raw-t");
  expect_absent(a, "raw-t2");
  expect_absent(a, "raw-b");
  /* The client connected all along still works, and so does a new one. */
  expect_value(a, "keep", "intact", 6);
  struct dcomm_store_cmp c[] = {CMPV("keep", "intact")};
  struct dcomm_store_put pt[] = {PUT("after", "yes")};
  txn_ok(a, c, 1, pt, 1, 1);
  expect_server_serves("after", "yes");
  dcomm__store_close(a);
}
END_TEST

static void check_refused_cannot_write(const char *job, const char *token, uint32_t purpose, int want_rc) {
  struct dcomm_store *s = (void *)1;
  int rc = dcomm__store_tcp_connect("127.0.0.1", port, job, token, 2.0, 1.0, &s);
  if (purpose == DCOMM_HS_STORE) {
    ck_assert_msg(rc == want_rc, "connect returned %d, expected %d", rc, want_rc);
    ck_assert_ptr_null(s);
  } else if (rc == 0) {
    dcomm__store_close(s);
  }
  /* A raw peer that ignores the refusal and sends a request anyway. */
  int hs = 0;
  int fd = raw_connect(job, token, purpose, &hs);
  ck_assert_int_eq(hs, want_rc);
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "intruder", 8);
  p += put_str(p, "evil", 4);
  send(fd, f, (size_t)(p - f), MSG_NOSIGNAL); /* may fail: the server hangs up */
  ck_assert_msg(raw_eof(fd, 5), "the server did not close a refused connection");
  close(fd);
  struct dcomm_store *good = client();
  expect_absent(good, "intruder");
  dcomm__store_close(good);
}

START_TEST(tcp_job_mismatch) { check_refused_cannot_write("another-job", TOKEN, DCOMM_HS_STORE, DCOMM_EAUTH); }
END_TEST

START_TEST(tcp_wrong_token) {
  check_refused_cannot_write(JOB, "wrong-token", DCOMM_HS_STORE, DCOMM_EAUTH);
  check_refused_cannot_write(JOB, NULL, DCOMM_HS_STORE, DCOMM_EAUTH);
}
END_TEST

START_TEST(tcp_wrong_purpose) {
  /* A peer-link handshake passes authentication but is not a store
   * client: its verdict says so (DCOMM_EPROTO), and nothing it sends counts. */
  check_refused_cannot_write(JOB, TOKEN, DCOMM_HS_PEER, DCOMM_EPROTO);
}
END_TEST

START_TEST(tcp_garbage_cmd) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  int fd = raw_store();
  unsigned char junk[] = {0xee, 0x01, 0x02, 0x03, 0xff, 0x00, 0x41};
  raw_send(fd, junk, sizeof(junk));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  /* cmd 0 and a bad compare_set flag too. */
  fd = raw_store();
  raw_send(fd, "\0", 1);
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_CAS);
  p += put_str(p, "keep", 4);
  p = dcomm__store_put_u8(p, 7);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  /* The old client still works, and so does a new one. */
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_oversized_lengths) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  uint32_t bad[] = {0xffffffffu, DCOMM_STORE_PROTO_MAX_KEY + 1, 0};
  for (int i = 0; i < 3; i++) {
    int fd = raw_store();
    unsigned char f[16], *p = f;
    p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_GET);
    p = dcomm__store_put_u32(p, bad[i]);
    raw_send(fd, f, (size_t)(p - f));
    ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
    ck_assert(raw_eof(fd, 5));
    close(fd);
  }
  /* Too many wait keys, and a key with a NUL byte. */
  int fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_WAIT);
  p = dcomm__store_put_u64(p, 1000);
  p = dcomm__store_put_u32(p, DCOMM_STORE_MAX_WAIT_KEYS + 1);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  fd = raw_store();
  p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "ke\0p", 4);
  p += put_str(p, "x", 1);
  raw_send(fd, f, (size_t)(p - f));
  ck_assert_int_eq(raw_status(fd, 5), DCOMM_EPROTO);
  close(fd);
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_truncated_frame) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  int fd = raw_store();
  unsigned char f[64], *p = f;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "truncated", 9);
  p = dcomm__store_put_u32(p, 10); /* a 10-byte value, of which 3 come */
  memcpy(p, "abc", 3);
  p += 3;
  raw_send(fd, f, (size_t)(p - f));
  shutdown(fd, SHUT_WR);
  int st = raw_status(fd, 5);
  ck_assert_msg(st == DCOMM_EPROTO || st == 1, "truncated frame answered %d", st);
  ck_assert(raw_eof(fd, 5));
  close(fd);
  expect_absent(a, "truncated");
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_garbage_before_handshake) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  int fd = raw_connect(NULL, NULL, 0, NULL);
  unsigned char junk[200];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (unsigned char)(i * 37 + 11);
  send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
  ck_assert_msg(raw_eof(fd, 5), "the server kept a connection with a garbage handshake");
  close(fd);
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

/* Slow clients hold a descriptor for a bounded time and delay nobody: a
 * silent connection and one that trickles its handshake a byte every
 * 0.5 s are dropped at the handshake timeout; an authenticated client
 * that trickles a request frame is dropped at the frame timeout
 * (DCOMM_TIMEOUT, at least 10 s) with an error answer, its frame unserved. */
START_TEST(tcp_slow_clients) {
  setenv("DCOMM_TIMEOUT", "1", 1); /* the frame timeout is then its floor, 10 s */
  dcomm__params_load();
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  enum { SILENT, HS_TRICKLE, FRAME_TRICKLE, N };
  static const char *const what[N] = {"a silent connection", "a handshake trickled", "a request frame trickled"};
  int fd[N];
  double t0[N], gone[N] = {0, 0, 0};
  t0[SILENT] = dcomm__now();
  fd[SILENT] = raw_connect(NULL, NULL, 0, NULL);
  t0[HS_TRICKLE] = dcomm__now();
  fd[HS_TRICKLE] = raw_connect(NULL, NULL, 0, NULL);
  fd[FRAME_TRICKLE] = raw_store();
  t0[FRAME_TRICKLE] = dcomm__now();
  /* A well-formed head that announces a 255-byte job id, then zeros; a
   * SET of "slow" announcing 1000 bytes of value, then zeros. */
  unsigned char hs[64] = {0x44, 0x43, 0x48, 0x53, 0, 0, 0, 1, 0, 0, 0, 1, 0, 255, 0, 0};
  unsigned char fr[64], *p = fr;
  p = dcomm__store_put_u8(p, DCOMM_STORE_CMD_SET);
  p += put_str(p, "slow", 4);
  dcomm__store_put_u32(p, 1000);
  const unsigned char *bytes[N] = {NULL, hs, fr};
  size_t sent[N] = {0, 0, 0};
  int open = N;
  while (open > 0 && dcomm__now() - t0[SILENT] < DCOMM_STORE_HS_TIMEOUT + 6) {
    for (int i = 0; i < N; i++) {
      if (gone[i]) continue;
      if (raw_eof(fd[i], 0)) {
        gone[i] = dcomm__now();
        open--;
      } else if (bytes[i] && sent[i] < 64) {
        send(fd[i], bytes[i] + sent[i]++, 1, MSG_NOSIGNAL);
      }
    }
    double t1 = dcomm__now();
    expect_server_serves("keep", "intact");
    ck_assert_msg(dcomm__now() - t1 < 2.0, "slow clients delayed other clients (%.2f s)", dcomm__now() - t1);
    sleep_s(0.5);
  }
  for (int i = 0; i < N; i++) {
    ck_assert_msg(gone[i] > 0, "the server never dropped %s", what[i]);
    double el = gone[i] - t0[i], lo = i == FRAME_TRICKLE ? 10.0 : DCOMM_STORE_HS_TIMEOUT;
    ck_assert_msg(el >= lo - 1 && el < lo + 5, "%s was dropped after %.1f s (expected about %.0f)", what[i], el, lo);
    close(fd[i]);
  }
  expect_absent(a, "slow");
  expect_value(a, "keep", "intact", 6);
  dcomm__store_close(a);
}
END_TEST

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  int n = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static int connect_raw_now(int port_) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port_)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* 10 000 connection attempts in bursts of 500 open at once (a third closed
 * at once, a third sending an HTTP request instead of a handshake, a third
 * silent until the burst ends): the job's own client is served between
 * bursts, the server (a thread of this process) starts no thread for them,
 * and every one of their descriptors is closed afterwards. */
START_TEST(tcp_connection_burst) {
  struct dcomm_store *a = client();
  ok(dcomm__store_set(a, "keep", "intact", 6));
  int threads0 = count_dir("/proc/self/task"), fds0 = count_dir("/proc/self/fd"), threads_max = threads0;
  enum { ROUNDS = 20, PER = 500 };
  static const char http[] = "GET / HTTP/1.1\r\nHost: store\r\n\r\n";
  double t0 = dcomm__now();
  int made = 0;
  for (int r = 0; r < ROUNDS; r++) {
    int fds[PER];
    for (int i = 0; i < PER; i++) {
      fds[i] = connect_raw_now(port);
      if (fds[i] < 0) continue;
      made++;
      if (i % 3 == 0) {
        close(fds[i]);
        fds[i] = -1;
      } else if (i % 3 == 1) {
        send(fds[i], http, sizeof(http) - 1, MSG_NOSIGNAL);
      }
    }
    int th = count_dir("/proc/self/task");
    if (th > threads_max) threads_max = th;
    char v[16];
    snprintf(v, sizeof(v), "%d", r);
    ok(dcomm__store_set(a, "round", v, strlen(v)));
    expect_value(a, "round", v, strlen(v));
    for (int i = 0; i < PER; i++)
      if (fds[i] >= 0) close(fds[i]);
  }
  double burst_s = dcomm__now() - t0;
  int fds_now = -1;
  for (double dl = dcomm__now() + 5; dcomm__now() < dl; sleep_s(0.05))
    if ((fds_now = count_dir("/proc/self/fd")) <= fds0) break;
  printf("burst: %d connections in %.2f s; threads %d -> at most %d; descriptors %d -> %d after %.2f s\n", made, burst_s,
         threads0, threads_max, fds0, fds_now, dcomm__now() - t0 - burst_s);
  ck_assert_int_ge(made, ROUNDS * PER * 9 / 10);
  ck_assert_msg(threads_max <= threads0, "the server started threads for the burst: %d -> %d", threads0, threads_max);
  ck_assert_msg(fds_now <= fds0, "descriptors of the burst left open: %d, %d before", fds_now, fds0);
  expect_value(a, "keep", "intact", 6);
  expect_server_serves("keep", "intact");
  dcomm__store_close(a);
}
END_TEST

/* DCOMM_STORE_MAX_CLIENTS: connections beyond it are closed as they come;
 * a freed place is taken again. */
START_TEST(tcp_max_clients) {
  setenv("DCOMM_STORE_MAX_CLIENTS", "8", 1);
  dcomm__params_load();
  struct dcomm_store_server *small = NULL;
  ok(dcomm__store_server_start("127.0.0.1", 0, JOB, TOKEN, &small));
  int keep_port = port;
  port = dcomm__store_server_port(small);
  struct dcomm_store *c[8];
  for (int i = 0; i < 8; i++) c[i] = client();
  ok(dcomm__store_set(c[0], "k", "v", 1));
  int extra = connect_raw_now(port);
  ck_assert_int_ge(extra, 0);
  ck_assert_msg(raw_eof(extra, 3), "a ninth connection was not closed");
  close(extra);
  struct dcomm_store *refused = NULL;
  ck_assert_int_lt(dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 1.0, 0.3, &refused), 0);
  dcomm__store_close(c[7]);
  struct dcomm_store *again = NULL;
  int rc = -1;
  for (double dl = dcomm__now() + 3; rc != 0 && dcomm__now() < dl; sleep_s(0.05))
    rc = dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 1.0, 0.3, &again);
  ck_assert_msg(rc == 0, "the freed place was not taken again: %s", dcomm_last_error());
  expect_value(again, "k", "v", 1);
  dcomm__store_close(again);
  for (int i = 0; i < 7; i++) dcomm__store_close(c[i]);
  dcomm__store_server_stop(small);
  port = keep_port;
  unsetenv("DCOMM_STORE_MAX_CLIENTS");
  dcomm__params_load();
}
END_TEST

START_TEST(tcp_stop_with_blocked_get) {
  struct dcomm_store *a = client_t(30.0), *idle = client();
  struct conf_blocked_get g = {.s = a, .key = "never", .timeout = 30.0};
  int silent = raw_connect(NULL, NULL, 0, NULL);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, conf_blocked_get_main, &g), 0);
  sleep_s(0.3);
  double t0 = dcomm__now();
  dcomm__store_server_stop(srv);
  srv = NULL;
  double stop_s = dcomm__now() - t0;
  pthread_join(th, NULL);
  ck_assert_msg(stop_s < 3.0, "stop took %.2f s", stop_s);
  ck_assert_msg(g.rc == DCOMM_EPEERLOST, "blocked get returned %d", g.rc);
  ck_assert_msg(g.elapsed < 5.0, "blocked get returned after %.2f s", g.elapsed);
  ck_assert_ptr_null(g.val);
  /* A handle whose server is gone keeps failing fast. */
  ck_assert_int_eq(dcomm__store_set(idle, "x", "y", 1), DCOMM_EPEERLOST);
  ck_assert_int_eq(dcomm__store_set(a, "x", "y", 1), DCOMM_EPEERLOST);
  ck_assert(raw_eof(silent, 2));
  close(silent);
  dcomm__store_close(a);
  dcomm__store_close(idle);
}
END_TEST

/* A broken handle (its server went away) connects again in place once a
 * server listens on the same port: the watcher's heartbeats survive a
 * store that was frozen longer than a request's bound. */
START_TEST(tcp_redial) {
  struct dcomm_store *a = client_t(5.0);
  ok(dcomm__store_set(a, "k", "1", 2));
  ck_assert_int_eq(dcomm__store_tcp_redial(a, 2.0), 0); /* not broken: nothing to do */
  dcomm__store_server_stop(srv);
  srv = NULL;
  ck_assert_int_eq(dcomm__store_set(a, "k", "2", 2), DCOMM_EPEERLOST);
  ck_assert_int_lt(dcomm__store_tcp_redial(a, 0.5), 0); /* nobody listens */
  ck_assert_int_eq(dcomm__store_set(a, "k", "2", 2), DCOMM_EPEERLOST);
  int rc = dcomm__store_server_start("127.0.0.1", port, JOB, TOKEN, &srv);
  ck_assert_msg(rc == 0, "server restart on port %d: %s", port, dcomm_last_error());
  ck_assert_msg(dcomm__store_tcp_redial(a, 2.0) == 0, "redial: %s", dcomm_last_error());
  ok(dcomm__store_set(a, "k", "3", 2));
  void *v = NULL;
  size_t len = 0;
  ok(dcomm__store_get(a, "k", 1.0, &v, &len));
  ck_assert_str_eq(v, "3");
  free(v);
  dcomm__store_close(a);
}
END_TEST

START_TEST(tcp_connect_timeout_and_local_ip) {
  struct dcomm_store *a = client();
  char ip[64];
  ok(dcomm__store_tcp_local_ip(a, ip, sizeof(ip)));
  ck_assert_str_eq(ip, "127.0.0.1");
  dcomm__store_close(a);
  /* Once the server is gone, connecting gives up after connect_timeout. */
  int p = port;
  server_teardown();
  struct dcomm_store *s = (void *)1;
  double t0 = dcomm__now();
  ck_assert_int_eq(dcomm__store_tcp_connect("127.0.0.1", p, JOB, TOKEN, 0.3, 1.0, &s), DCOMM_ETIMEDOUT);
  double el = dcomm__now() - t0;
  /* dcomm__sock_connect stops retrying when its next backoff would pass the
   * deadline, so it may give up somewhat before connect_timeout. */
  ck_assert_msg(el >= 0.1 && el < 3.0, "connect gave up after %.2f s", el);
  ck_assert_ptr_null(s);
  ck_assert_int_eq(dcomm__store_tcp_connect("127.0.0.1", 0, JOB, TOKEN, 0.3, 1.0, &s), DCOMM_EINVAL);
}
END_TEST

/* ---- file store ---- */

static char dir[64], path[128];

static void file_setup(void) {
  snprintf(dir, sizeof(dir), "/tmp/dcomm_check_store.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/store", dir);
}

static void file_teardown(void) {
  unlink(path);
  rmdir(dir);
}

static struct dcomm_store *fopen_t(double timeout) {
  struct dcomm_store *s = NULL;
  int rc = dcomm__store_file_open(path, timeout, &s);
  ck_assert_msg(rc == 0, "file open: %d (%s)", rc, dcomm_last_error());
  ck_assert_str_eq(s->ops->name, "file");
  return s;
}

static struct dcomm_store *fopen_h(void) { return fopen_t(0.3); }

/* The conformance cases' file store: one more handle on the fixture's file. */
static int file_open(double timeout, struct dcomm_store **out) { return dcomm__store_file_open(path, timeout, out); }

static const struct store_factory file_factory = {
    .name = "file",
    .open = file_open,
    .add_threads = 8,
    .add_shared = 2,
    .add_procs = 3,
    .add_iters = 100,
};

START_TEST(file_open_errors) {
  struct dcomm_store *a = fopen_h();
  char ip[64];
  ck_assert_int_eq(dcomm__store_tcp_local_ip(a, ip, sizeof(ip)), DCOMM_EINVAL);
  dcomm__store_close(a);
  struct dcomm_store *s = (void *)1;
  ck_assert_int_eq(dcomm__store_file_open("", 1.0, &s), DCOMM_EINVAL);
  ck_assert_ptr_null(s);
  ck_assert_int_ne(dcomm__store_file_open("/nonexistent-dir/x/store", 1.0, &s), 0);
}
END_TEST

static void append_raw(const void *b, size_t n) {
  int fd = open(path, O_WRONLY | O_APPEND);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, b, n), (ssize_t)n);
  close(fd);
}

static off_t file_size(void) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  return st.st_size;
}

START_TEST(file_txn_failed_appends_nothing) {
  struct dcomm_store *a = fopen_h();
  ok(dcomm__store_set(a, "gen", "1", 1));
  off_t before = file_size();
  struct dcomm_store_cmp stale[] = {CMP("node", DCOMM_STORE_ABSENT), CMPV("gen", "0")};
  struct dcomm_store_put p[] = {PUT("gen", "1"), PUT("plan/1", "p")};
  txn_ok(a, stale, 2, p, 2, 0);
  ck_assert_int_eq(file_size(), before); /* not even a partial record */
  int done = -1;
  stale[1].kind = 7;
  ck_assert_int_eq(dcomm__store_txn(a, stale, 2, p, 2, &done), DCOMM_EINVAL);
  ck_assert_int_eq(file_size(), before);
  dcomm__store_close(a);
}
END_TEST

START_TEST(file_torn_record) {
  struct dcomm_store *a = fopen_h();
  ok(dcomm__store_set(a, "k1", "v1", 2));
  off_t good = file_size();
  dcomm__store_close(a);
  /* A writer died after the first part of a record: a valid-looking header
   * promising 3 key and 10 value bytes, and only 4 of them. */
  unsigned char rec[64], *p = rec;
  p = dcomm__store_put_u32(p, 0x44434652u);
  p = dcomm__store_put_u8(p, 1);
  p = dcomm__store_put_u32(p, 3);
  p = dcomm__store_put_u32(p, 10);
  p = dcomm__store_put_u32(p, 0);
  memcpy(p, "k2\0v", 4);
  p += 4;
  append_raw(rec, (size_t)(p - rec));
  struct dcomm_store *b = fopen_h();
  expect_value(b, "k1", "v1", 2);
  /* The next write cuts the torn tail off and lands on a record boundary. */
  ok(dcomm__store_set(b, "k3", "v3", 2));
  struct dcomm_store *c = fopen_h();
  expect_value(c, "k1", "v1", 2);
  expect_value(c, "k3", "v3", 2);
  dcomm__store_close(c);
  /* A torn header (fewer bytes than a header) is ignored as well. */
  append_raw(rec, 7);
  c = fopen_h();
  expect_value(c, "k3", "v3", 2);
  ok(dcomm__store_add(c, "n", 2, NULL));
  dcomm__store_close(c);
  c = fopen_h();
  expect_value(c, "n", "2", 1);
  expect_value(b, "n", "2", 1);
  ck_assert_int_gt(file_size(), good);
  dcomm__store_close(c);
  dcomm__store_close(b);
}
END_TEST

START_TEST(file_corrupt_record) {
  struct dcomm_store *a = fopen_h();
  ok(dcomm__store_set(a, "k1", "value-1", 7));
  off_t end = file_size();
  ok(dcomm__store_set(a, "k2", "value-2", 7));
  dcomm__store_close(a);
  /* Flip a byte inside the second record's value: the checksum catches it. */
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, "X", 1, file_size() - 2), 1);
  close(fd);
  struct dcomm_store *s = (void *)1;
  ck_assert_int_eq(dcomm__store_file_open(path, 1.0, &s), DCOMM_EPROTO);
  ck_assert_ptr_null(s);
  /* Complete garbage after good records is corrupt too, not torn. */
  ck_assert_int_eq(truncate(path, end), 0);
  unsigned char junk[64];
  memset(junk, 0x5a, sizeof(junk));
  append_raw(junk, sizeof(junk));
  ck_assert_int_eq(dcomm__store_file_open(path, 1.0, &s), DCOMM_EPROTO);
  /* A handle that was fine before sees the corruption on its next read. */
  ck_assert_int_eq(truncate(path, end), 0);
  a = fopen_h();
  expect_value(a, "k1", "value-1", 7);
  append_raw(junk, sizeof(junk));
  void *v = NULL;
  size_t n = 0;
  ck_assert_int_eq(dcomm__store_get(a, "k2", 0.2, &v, &n), DCOMM_EPROTO);
  dcomm__store_close(a);
}
END_TEST

/* ---- suite ---- */

static Suite *store_suite(void) {
  Suite *s = suite_create("store");
  /* The conformance cases, on a fresh server each. */
  TCase *tcc = tcase_create("conformance-tcp");
  tcase_add_checked_fixture(tcc, server_setup, server_teardown);
  tcase_set_timeout(tcc, 10);
  store_conformance_add(tcc, &tcp_factory);
  suite_add_tcase(s, tcc);

  TCase *tc = tcase_create("tcp");
  tcase_add_checked_fixture(tc, server_setup, server_teardown);
  tcase_set_timeout(tc, 10);
  tcase_add_test(tc, tcp_max_value_wire);
  tcase_add_test(tc, tcp_job_mismatch);
  tcase_add_test(tc, tcp_wrong_token);
  tcase_add_test(tc, tcp_wrong_purpose);
  tcase_add_test(tc, tcp_garbage_cmd);
  tcase_add_test(tc, tcp_oversized_lengths);
  tcase_add_test(tc, tcp_truncated_frame);
  tcase_add_test(tc, tcp_garbage_before_handshake);
  tcase_add_test(tc, tcp_stop_with_blocked_get);
  tcase_add_test(tc, tcp_redial);
  tcase_add_test(tc, tcp_connect_timeout_and_local_ip);
  tcase_add_test(tc, tcp_txn_wire);
  tcase_add_test(tc, tcp_mget_wire);
  tcase_add_test(tc, tcp_max_clients);
  suite_add_tcase(s, tc);

  /* Waits out the server's handshake deadline, hence its own time limit. */
  TCase *ts = tcase_create("tcp-slow");
  tcase_add_checked_fixture(ts, server_setup, server_teardown);
  tcase_set_timeout(ts, DCOMM_STORE_HS_TIMEOUT + 10);
  tcase_add_test(ts, tcp_slow_clients);
  tcase_add_test(ts, tcp_connection_burst);
  suite_add_tcase(s, ts);

  /* The conformance cases, on a fresh file each. */
  TCase *tfc = tcase_create("conformance-file");
  tcase_add_checked_fixture(tfc, file_setup, file_teardown);
  tcase_set_timeout(tfc, 10);
  store_conformance_add(tfc, &file_factory);
  suite_add_tcase(s, tfc);

  TCase *tf = tcase_create("file");
  tcase_add_checked_fixture(tf, file_setup, file_teardown);
  tcase_set_timeout(tf, 10);
  tcase_add_test(tf, file_open_errors);
  tcase_add_test(tf, file_torn_record);
  tcase_add_test(tf, file_corrupt_record);
  tcase_add_test(tf, file_txn_failed_appends_nothing);
  suite_add_tcase(s, tf);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(store_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists every test */
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed != 0;
}
