/*
 * fuzz_etcd_client.c: fuzz target for the etcd client's reading of answers
 * (src/store/etcd_http.c, etcd_json.c, etcd_kv.c, etcd_lease.c and the
 * watch stream of etcd_watch.c). A loopback thread plays etcd: every HTTP
 * request it receives gets the rest of the input as its whole answer
 * (status line, headers, body: chunked bodies let the fuzzer split watch
 * events across chunks), then the connection closes. The first byte picks
 * the call. Each call must end within its timeout with a result or an
 * error carrying a message, never crash, hang or leak.
 */
#include "config.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "dcomm.h"
#include "etcd_client.h"
#include "fuzz_util.h"
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CALL_TIMEOUT 0.25

struct script {
  const uint8_t *data;
  size_t size;
};

/* Reads one HTTP request (headers and a Content-Length body) within 1 s. */
static void read_request(int fd) {
  char buf[65536];
  size_t got = 0, need = 0;
  double end = fuzz_now() + 1.0;
  while (got < sizeof(buf) - 1 && fuzz_now() < end) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 100) <= 0) continue;
    ssize_t r = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
    if (r <= 0) return;
    got += (size_t)r;
    buf[got] = 0;
    char *eoh = strstr(buf, "\r\n\r\n");
    if (!eoh) continue;
    if (!need) {
      char *cl = strcasestr(buf, "content-length:");
      need = (size_t)(eoh + 4 - buf) + (cl && cl < eoh ? strtoul(cl + 15, NULL, 10) : 0);
    }
    if (got >= need) return;
  }
}

static void serve(int fd, void *arg) {
  struct script *s = arg;
  read_request(fd);
  fuzz_write_all(fd, s->data, s->size);
  shutdown(fd, SHUT_WR);
  fuzz_drain(fd, 0.5); /* until the client closes */
}

static int on_event(const struct dcomm_etcd_event *ev, void *arg) {
  int *n = arg;
  if (ev->key && strlen(ev->key) > ev->klen) abort(); /* the key is NUL-terminated at klen */
  return ++*n >= 64;
}

static void check_err(int rc) {
  if (rc < 0 && !*dcomm_last_error()) abort(); /* every failure says why */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    setenv("DCOMM_LOG_LEVEL", "error", 1);
    ready = 1;
  }
  if (size < 1 || size > 1 << 20) return 0;
  int op = data[0] % 13;
  struct script s = {data + 1, size - 1};
  int port;
  /* Enough connections for the retries a call makes within its timeout. */
  struct fuzz_peer *p = fuzz_peer_start(serve, &s, 1000, &port);
  char ep[64];
  snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", port);
  struct dcomm_etcd_opts o = {.timeout = CALL_TIMEOUT};
  if (op == 12) { /* authentication answers */
    o.user = "fuzz";
    o.password = "pw";
  }
  struct dcomm_etcd *c = NULL;
  double t0 = dcomm__now();
  int rc = dcomm__etcd_create(ep, &o, &c);
  check_err(rc);
  if (rc == 0) {
    struct dcomm_etcd_kv kv = {0}, *kvs = NULL;
    size_t n = 0;
    int64_t rev = 0, id = 0, ttl = 0;
    int done = 0, events = 0;
    struct dcomm_etcd_put put = {.key = "k", .val = "v", .len = 1};
    struct dcomm_etcd_cmp cmp = {.key = "k", .kind = DCOMM_STORE_EQUAL, .val = "v", .len = 1};
    switch (op) {
      case 0: rc = dcomm__etcd_get(c, "k", CALL_TIMEOUT, &kv, &rev); break;
      case 1:
        rc = dcomm__etcd_range_prefix(c, "k", &kvs, &n, &rev);
        if (rc == 0 && n && !kvs) abort();
        break;
      case 2: rc = dcomm__etcd_put(c, "k", "v", 1, 0, &rev); break;
      case 3: rc = dcomm__etcd_delete(c, "k", 1, &rev); break;
      case 4: rc = dcomm__etcd_create_if_absent(c, "k", "v", 1, 0, &done, &kv); break;
      case 5: rc = dcomm__etcd_cas(c, "k", 3, "v", 1, 0, &done, &kv); break;
      case 6: rc = dcomm__etcd_cas_value(c, "k", "v", 1, "w", 1, &done, &kv); break;
      case 7: rc = dcomm__etcd_txn(c, &cmp, 1, &put, 1, &done); break;
      case 8: rc = dcomm__etcd_lease_grant(c, 5, &id, &ttl); break;
      case 9: rc = dcomm__etcd_lease_keepalive(c, 42, &ttl); break;
      case 10: rc = dcomm__etcd_lease_revoke(c, 42); break;
      default: rc = dcomm__etcd_watch(c, "k", 1, 0, CALL_TIMEOUT, on_event, &events, NULL); break;
    }
    check_err(rc);
    dcomm__etcd_kv_clear(&kv);
    dcomm__etcd_kvs_free(kvs, n);
    dcomm__etcd_destroy(c);
  }
  /* A call retries within its timeout; a watch may resume once more. */
  fuzz_check_bound(t0, 10 * CALL_TIMEOUT + 2.0, "an etcd call against a garbled server");
  fuzz_peer_join(p);
  return 0;
}
