/*
 * fuzz_store_client.c: fuzz target for the TCP store client's reading of
 * answers (src/store/store_client.c) and of the server's side of the
 * handshake (src/util/auth.c). A loopback thread plays the server: with
 * the first byte even it completes the handshake, then answers every
 * request with the rest of the input; odd, the rest of the input is all it
 * sends, handshake included. The client runs one of each call (set, get,
 * add, compare_set, wait, txn, get_many, delete); each must return (a value or an
 * error with a message) within its timeout, never crash or hang.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "clock.h"
#include "dcomm.h"
#include "fuzz_util.h"
#include "param.h"
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define JOB "fuzz-job"
#define TOKEN "fuzz-token"

struct script {
  const uint8_t *data;
  size_t size;
  int raw;
};

static void serve(int fd, void *arg) {
  struct script *s = arg;
  struct dcomm_hs_peer peer;
  if (!s->raw && dcomm__hs_server(fd, JOB, TOKEN, dcomm__now() + 5, &peer) < 0) return;
  fuzz_write_all(fd, s->data, s->size);
  shutdown(fd, SHUT_WR);
  fuzz_drain(fd, 5.0); /* until the client closes */
}

static void check_err(int rc) {
  if (rc < 0 && !*dcomm_last_error()) abort(); /* every failure says why */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 20) return 0;
  struct script s = {data + 1, size - 1, data[0] & 1};
  int port;
  struct fuzz_peer *p = fuzz_peer_start(serve, &s, 1, &port);
  struct dcomm_store *st = NULL;
  double t0 = dcomm__now();
  int rc = dcomm__store_tcp_connect("127.0.0.1", port, JOB, TOKEN, 2.0, 2.0, &st);
  check_err(rc);
  if (rc == 0) {
    void *v = NULL, *cur = NULL;
    size_t vl = 0, cl = 0;
    int64_t sum;
    int existed, done;
    const char *keys[2] = {"a", "b"};
    struct dcomm_store_cmp cmp = {.kind = DCOMM_STORE_EXISTS, .key = "a"};
    struct dcomm_store_put put = {.key = "c", .val = "1", .len = 1};
    check_err(dcomm__store_set(st, "a", "x", 1));
    rc = dcomm__store_get(st, "a", 1.0, &v, &vl);
    check_err(rc);
    if (rc == 0 && vl > dcomm__param_size(DCOMM_P_STORE_MAX_VALUE)) abort();
    check_err(dcomm__store_add(st, "n", 1, &sum));
    rc = dcomm__store_compare_set(st, "a", "x", 1, "y", 1, &cur, &cl);
    check_err(rc);
    check_err(dcomm__store_wait(st, keys, 2, 1.0));
    check_err(dcomm__store_txn(st, &cmp, 1, &put, 1, &done));
    void *many[2];
    size_t lens[2];
    rc = dcomm__store_get_many(st, keys, 2, 1.0, many, lens);
    check_err(rc);
    for (int i = 0; i < 2 && (rc == 0 || rc == DCOMM_ETIMEDOUT); i++) {
      if (rc == 0 && !many[i]) abort(); /* 0 means every value is there */
      if (many[i] && lens[i] > dcomm__param_size(DCOMM_P_STORE_MAX_VALUE)) abort();
      free(many[i]);
    }
    check_err(dcomm__store_delete(st, "a", &existed));
    free(v);
    free(cur);
    dcomm__store_close(st);
  }
  /* Eight calls with 2 s of slack each at most. */
  fuzz_check_bound(t0, 24.0, "store client calls against a garbled server");
  fuzz_peer_join(p);
  return 0;
}
