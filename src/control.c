/*
 * control.c: the runtime's own agreements over the world (checkpoint
 * outcomes, step numbers, whether joiners wait): small host values that
 * world rank 0 decides and every rank must learn. They go through the
 * backend's broadcast when its collectives take host memory (tcp), and
 * through the store when they take device memory only (nccl), so that
 * dcomm_elastic_run and the checkpoint calls work with every backend.
 * The store path polls in short slices and looks at the world's
 * communicator in between, so a revoked world fails at once instead of
 * waiting out the timeout. DCOMM_CONTROL_PATH forces either path.
 */
#include "config.h"
#include "world.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store.h"

/* Slice of a store wait between looks at the world's communicator. */
#define CONTROL_SLICE 0.05

int dcomm__control_via_store(void) {
  const char *m = dcomm__param_str(DCOMM_P_CONTROL_PATH);
  if (m && !strcmp(m, "store")) return 1;
  if (m && !strcmp(m, "backend")) return 0;
  if (m && *m && strcmp(m, "auto"))
    return dcomm__err(DCOMM_EINVAL, "DCOMM_CONTROL_PATH='%s' is not auto, backend or store", m);
  int (*host_buffers)(void *) = DCOMM_BACKEND_OP(dcomm__w.be, host_buffers);
  return host_buffers && !host_buffers(dcomm__w.be_ctx);
}

/* A non-root's wait for rank 0's value under key. */
static int control_get(struct dcomm_world *w, const char *key, const char *what, void **val, size_t *len) {
  double timeout = w->world.timeout, deadline = dcomm__now() + timeout;
  for (;;) {
    double left = deadline - dcomm__now();
    int rc = dcomm__store_get(w->store, key, left < CONTROL_SLICE ? (left > 0 ? left : 0.001) : CONTROL_SLICE, val, len);
    if (rc == 0) return 0;
    if (rc != DCOMM_ETIMEDOUT) return dcomm__err_ctx(rc, "%s: waiting for rank 0's value", what);
    int broken = w->world.bcomm ? w->be->async_error(w->world.bcomm) : 0;
    if (broken < 0) return dcomm__err_ctx(broken, "%s: the world broke while waiting for rank 0", what);
    if (dcomm__now() >= deadline)
      return dcomm__err(DCOMM_ETIMEDOUT, "%s: rank 0's value did not come within %g s", what, timeout);
  }
}

int dcomm__control_bcast(void *buf, size_t len, const char *what) {
  struct dcomm_world *w = &dcomm__w;
  int via = dcomm__control_via_store();
  if (via < 0) return via;
  if (!via) return dcomm_broadcast(buf, len, DCOMM_UINT8, 0, NULL);
  static int told;
  if (!told++)
    DCOMM_LOG(INFO, ELASTIC, "control values from rank 0 go through the store (%s)",
              strcmp(dcomm__param_str(DCOMM_P_CONTROL_PATH), "store") ? "the backend takes device memory only"
                                                                       : "DCOMM_CONTROL_PATH=store");
  uint64_t seq = w->control_seq++;
  if (w->size == 1) return 0;
  char key[64], nkey[72];
  snprintf(key, sizeof(key), "control/%" PRIu64, seq);
  snprintf(nkey, sizeof(nkey), "control/%" PRIu64 "/n", seq);
  if (w->rank == 0) return dcomm__store_set(w->store, key, buf, len);
  void *val = NULL;
  size_t got = 0;
  DCOMM_CHECK(control_get(w, key, what, &val, &got));
  if (got != len) {
    free(val);
    return dcomm__err(DCOMM_EMISMATCH, "%s: rank 0 sent %zu bytes where this rank expects %zu (mismatched calls)", what,
                      got, len);
  }
  memcpy(buf, val, len);
  free(val);
  /* The last reader removes the value. */
  int64_t n = 0;
  if (dcomm__store_add(w->store, nkey, 1, &n) == 0 && n == w->size - 1) {
    dcomm__store_delete(w->store, key, NULL);
    dcomm__store_delete(w->store, nkey, NULL);
  }
  return 0;
}
