/*
 * host.c: the services the core offers to backends (struct dcomm_host):
 * logging, errors, parameters, the store, reduction kernels, sockets and
 * the connection handshake, filled in for each generation's world.
 */
#include "config.h"
#include "world.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "error.h"
#include "log.h"
#include "param.h"
#include "reduce.h"
#include "sock.h"
#include "store.h"

static void host_log(int level, int subsys, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  dcomm__log(level, subsys, "%s", msg);
}

static int host_err(int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return dcomm__err(code, "%s", msg);
}

static int host_store_set(void *s, const char *key, const void *val, size_t len) {
  return dcomm__store_set(s, key, val, len);
}

/* A backend's store waits (a communicator's creation) end once the
 * generation they build is revoked: a member that died after the plan was
 * made never publishes, and the others must not wait out DCOMM_TIMEOUT. */
static int generation_revoked(void *unused) {
  (void)unused;
  long gen = __atomic_load_n(&dcomm__w.generation, __ATOMIC_ACQUIRE);
  if (__atomic_load_n(&dcomm__w.revoked, __ATOMIC_ACQUIRE) != gen + 1) return 0;
  return dcomm__err(DCOMM_EREVOKED, "generation %ld was revoked while its communicators were being created", gen);
}

static int host_cancelled(void) { return generation_revoked(NULL); }

/* dcomm__sock_connect in slices, so that a peer that died after publishing
 * its address does not hold the creation until its deadline. */
static int host_sock_connect(const char *host, int port, double deadline, int *fd) {
  for (;;) {
    double slice = dcomm__now() + DCOMM_STORE_STOP_SLICE;
    int rc = dcomm__sock_connect(host, port, slice < deadline ? slice : deadline, fd);
    if (rc != DCOMM_ETIMEDOUT || dcomm__now() >= deadline) return rc;
    DCOMM_CHECK(generation_revoked(NULL));
  }
}

static int host_store_get(void *s, const char *key, double timeout, void **val, size_t *len) {
  return dcomm__store_get_stop(s, key, timeout, generation_revoked, NULL, val, len);
}

static int host_store_allgather(void *s, const char *prefix, int rank, int n, const void *mine, size_t len,
                                double timeout, void **all, size_t *alllen) {
  return dcomm__store_allgather_stop(s, prefix, rank, n, mine, len, timeout, generation_revoked, NULL, all, alllen);
}

static int host_hs_server(int fd, double deadline, uint32_t *purpose, void *hello, size_t *hello_len) {
  struct dcomm_hs_peer peer;
  DCOMM_CHECK(dcomm__hs_server(fd, dcomm__w.job_id, dcomm__w.token, deadline, &peer));
  *purpose = peer.purpose;
  size_t n = peer.hello_len < *hello_len ? peer.hello_len : *hello_len;
  memcpy(hello, peer.hello, n);
  *hello_len = n;
  return 0;
}

/* A core parameter, else the variable, else the loaded backend's declared
 * default. */
static const char *host_param(const char *name) {
  const char *v = dcomm__param_by_name(name);
  if (v) return v;
  return dcomm__backend_param_default(dcomm__w.be, name);
}

static int host_hs_client(int fd, uint32_t purpose, const void *hello, size_t hello_len, double deadline) {
  return dcomm__hs_client(fd, dcomm__w.job_id, dcomm__w.token, purpose, hello, hello_len, deadline);
}

/* The part of the host that changes with the generation. A shrink keeps
 * the backend context, which holds a pointer to w->host, so this is all it
 * updates (no other field is touched while the backend runs). */
void dcomm__host_identity(struct dcomm_world *w) {
  struct dcomm_host *h = &w->host;
  h->world_rank = w->rank;
  h->world_size = w->size;
  h->local_rank = w->local_rank;
  h->local_size = w->local_size;
}

void dcomm__host_fill(struct dcomm_world *w) {
  struct dcomm_host *h = &w->host;
  memset(h, 0, sizeof(*h));
  h->size = sizeof(*h);
  dcomm__host_identity(w);
  h->job_id = w->job_id;
  h->auth_token = w->token;
  h->listen_ip = w->listen_ip;
  h->store = w->store;
  h->now = dcomm__now;
  h->log_enabled = dcomm__log_enabled;
  h->log = host_log;
  h->err = host_err;
  h->param = host_param;
  h->parse_size = dcomm__parse_size;
  h->parse_bool = dcomm__parse_bool;
  h->store_set = host_store_set;
  h->store_get = host_store_get;
  h->store_allgather = host_store_allgather;
  h->creation_cancelled = host_cancelled;
  h->reduce = dcomm__reduce;
  h->reduce3 = dcomm__reduce3;
  h->scale_div = dcomm__scale_div;
  h->dtype_name = dcomm__dtype_name;
  h->op_name = dcomm__op_name;
  h->sock_listen = dcomm__sock_listen;
  h->sock_connect = host_sock_connect;
  h->sock_tune = dcomm__sock_tune;
  h->hs_server = host_hs_server;
  h->hs_client = host_hs_client;
  h->log_subsys = dcomm__log_subsys(w->be->name);
}
