/*
 * selfloop.c: a trivial out-of-tree dcomm backend, built by
 * tests/plugin_oot.sh against the installed dcomm_plugin.h alone: one-rank
 * communicators whose all_reduce and broadcast leave the data as they are
 * and whose barrier returns at once. It logs each collective through the
 * host, so the test can tell that this module ran them. SELFLOOP_SIZE
 * (compiler define) sets the table size it declares: the full table, the
 * mandatory part only, or too short (the loader must refuse it).
 */
#include <stdlib.h>
#include <string.h>

#include <dcomm_plugin.h>

static const struct dcomm_host *host;

struct req {
  int rc;
};

static int sl_init(const struct dcomm_host *h, void **ctx) {
  host = h;
  *ctx = (void *)h;
  return 0;
}
static int sl_finalize(void *ctx) {
  (void)ctx;
  return 0;
}
static int sl_comm_create(void *ctx, const struct dcomm_comm_spec *spec, void **comm) {
  (void)ctx;
  if (spec->size != 1) return host->err(DCOMM_ENOTSUP, "selfloop: only one-rank communicators (asked for %d)", spec->size);
  *comm = malloc(1);
  return *comm ? 0 : DCOMM_ENOMEM;
}
static int sl_comm_destroy(void *comm) {
  free(comm);
  return 0;
}
static int sl_comm_abort(void *comm, int reason) {
  (void)comm, (void)reason;
  return 0;
}
static int sl_post(void *comm, const struct dcomm_coll_args *a, void **req) {
  (void)comm;
  struct req *r = malloc(sizeof(*r));
  if (!r) return DCOMM_ENOMEM;
  r->rc = 0;
  switch (a->coll) {
    case DCOMM_COLL_ALL_REDUCE:
    case DCOMM_COLL_BROADCAST:
    case DCOMM_COLL_BARRIER:
      host->log(DCOMM_LOG_INFO, host->log_subsys, "selfloop ran collective %d on %zu elements", (int)a->coll, a->count);
      break;
    default:
      r->rc = host->err(DCOMM_ENOTSUP, "selfloop: collective %d is not supported", (int)a->coll);
  }
  *req = r;
  return 0;
}
static int sl_test(void *req, int *done) {
  int rc = ((struct req *)req)->rc;
  free(req);
  *done = 1;
  return rc;
}
static int sl_wait(void *req) {
  int done;
  return sl_test(req, &done);
}
static int sl_async_error(void *comm) {
  (void)comm;
  return 0;
}
static int sl_describe(void *ctx, char *buf, size_t len) {
  (void)ctx;
  strncpy(buf, "selfloop: one-rank test backend", len - 1);
  buf[len - 1] = 0;
  return 0;
}

static const struct dcomm_backend_param sl_params[] = {
    {"DCOMM_SELFLOOP_NOTE", "str", "none", "A parameter the selfloop test backend declares."},
    {NULL, NULL, NULL, NULL},
};

#ifndef SELFLOOP_SIZE
#define SELFLOOP_SIZE sizeof(struct dcomm_backend_v1)
#endif

__attribute__((visibility("default"))) const struct dcomm_backend_v1 dcomm_backend_v1 = {
    .size = SELFLOOP_SIZE,
    .abi_version = DCOMM_BACKEND_ABI_VERSION,
    .name = "selfloop",
    .init = sl_init,
    .finalize = sl_finalize,
    .comm_create = sl_comm_create,
    .comm_destroy = sl_comm_destroy,
    .comm_abort = sl_comm_abort,
    .post = sl_post,
    .test = sl_test,
    .wait = sl_wait,
    .async_error = sl_async_error,
    .describe = sl_describe,
    .params = sl_params,
};
