/*
 * fuzz_store_server.c: fuzz target for the embedded TCP store server's
 * parsing (src/store/store_server.c, the protocol of store_proto.h and the
 * handshake of src/util/auth.c). Each input gets a fresh server on
 * loopback. The first byte picks the mode: even, the target completes the
 * handshake as a client of the job would and the rest of the input is the
 * request stream; odd, the rest is sent from the first byte on, as a
 * stranger would. The target then ends its side (shutdown), reads the
 * answers until the server is quiet, and stops the server, which must end
 * promptly whatever state the input left it in.
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
#include "sock.h"
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define JOB "fuzz-job"
#define TOKEN "fuzz-token"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    setenv("DCOMM_LOG_LEVEL", "error", 1); /* refused connections are warnings */
    ready = 1;
  }
  if (size < 1 || size > 1 << 20) return 0;
  int raw = data[0] & 1;
  struct dcomm_store_server *srv;
  if (dcomm__store_server_start("127.0.0.1", 0, JOB, TOKEN, &srv) < 0) abort();
  int fd;
  double t0 = dcomm__now();
  if (dcomm__sock_connect("127.0.0.1", dcomm__store_server_port(srv), t0 + 5, &fd) < 0) abort();
  int ok = raw || dcomm__hs_client(fd, JOB, TOKEN, DCOMM_HS_STORE, NULL, 0, t0 + 5) == 0;
  if (!raw && !ok) abort(); /* the job's own client is always let in */
  fuzz_write_all(fd, data + 1, size - 1);
  shutdown(fd, SHUT_WR);
  /* Answers come at once; a GET or WAIT of a key nobody writes may wait
   * (it notices the hang-up within a second): stop reading once the
   * server is quiet, then stop the server, which must end every
   * connection promptly whatever state the input left it in. */
  fuzz_drain_idle(fd, 4.0, 0.05);
  close(fd);
  double t1 = dcomm__now();
  dcomm__store_server_stop(srv);
  fuzz_check_bound(t1, 3.0, "stopping the store server");
  return 0;
}
