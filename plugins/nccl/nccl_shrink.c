/*
 * nccl_shrink.c: the comm_shrink op of the nccl backend. When the elastic
 * layer knows which ranks of a failed communicator survived, each survivor
 * turns the old NCCL communicator into a smaller one with ncclCommShrink
 * and NCCL_SHRINK_ABORT (ongoing operations of the parent are ended
 * first), instead of aborting it and running a new ncclCommInitRankConfig
 * with a fresh unique id through the store. The parent may be healthy,
 * broken (an NCCL error) or revoked by comm_abort (ncclCommRevoke, NCCL >=
 * 2.28.7: then this first waits until it is quiescent). It is not possible
 * once the parent's handle was aborted (the watchdog's timeout abort, or
 * comm_abort with an NCCL older than 2.28.7), nor with an NCCL older than
 * 2.27: DCOMM_ENOTSUP tells the caller to fall back to a full re-init.
 */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"

#if DNCCL_BUILD_SHRINK
/* Runs the shrink on p's handle into c (both set up); 0 or an error. */
static int shrink_into(struct dnccl_comm *p, struct dnccl_comm *c, int *sorted, int n, double deadline) {
  const struct dcomm_host *h = p->ctx->host;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = c->label;
  pthread_mutex_lock(&p->mu);
  if (!p->nc) {
    pthread_mutex_unlock(&p->mu);
    return h->err(DCOMM_ENOTSUP, "nccl backend: cannot shrink %s: its NCCL communicator was aborted meanwhile (%s)",
                  p->label, p->why);
  }
  (void)cudaSetDevice(p->dev);
  /* NCCL sorts the list in place: it gets our copy. */
  /* The new handle goes into the parent's slot: in non-blocking mode
   * NCCL may write it only once the parent's part is over. */
  p->child_slot = NULL;
  ncclResult_t nr = ncclCommShrink(p->nc, sorted, n, &p->child_slot, &cfg, NCCL_SHRINK_ABORT);
  /* The parent's ops are over either way: it is only aborted from here. */
  if (!p->aborted) {
    p->aborted = DCOMM_EREVOKED;
    snprintf(p->why, sizeof(p->why), "shrunk into %s (ncclCommShrink)", c->label);
  }
  char text[640] = "";
  if (nr != ncclSuccess && nr != ncclInProgress) dnccl_result_text(p->nc, nr, text, sizeof(text));
  pthread_mutex_unlock(&p->mu);
  ncclComm_t nc = NULL;
  if (nr == ncclSuccess || nr == ncclInProgress) {
    int rc = dnccl_await_child(p, deadline, "ncclCommShrink", &nc);
    if (rc < 0) return rc;
    if (!nc) return h->err(DCOMM_EBACKEND, "nccl backend: ncclCommShrink of %s gave no communicator", p->label);
  }
  int rc = dnccl_adopt(h, c, nc, nr, text, "ncclCommShrink", p->label);
  if (rc < 0) return rc;
  char what[96];
  snprintf(what, sizeof(what), "ncclCommShrink (rank %d of %d)", c->rank, c->size);
  return dnccl_poll_ready(c, deadline, what);
}
#endif

int dnccl_comm_shrink(void *comm, const int *exclude, int nexclude, const struct dcomm_comm_spec *spec, void **out) {
  struct dnccl_comm *p = comm;
  if (!out) return DCOMM_EINVAL;
  *out = NULL;
  if (!p) return DCOMM_EINVAL;
  struct dnccl_ctx *ctx = p->ctx;
  const struct dcomm_host *h = ctx->host;
  if (!spec) return h->err(DCOMM_EINVAL, "nccl backend: shrink of %s without a spec for the result", p->label);
  char why[DNCCL_WHY_LEN], vs[32];
  int *sorted = malloc(sizeof(int) * (size_t)(nexclude > 0 ? nexclude : 1));
  if (!sorted) return h->err(DCOMM_ENOMEM, "nccl backend: out of memory");
  int new_rank = -1;
  int rc = dnccl_shrink_plan(p->size, p->rank, exclude, nexclude, sorted, &new_rank, why, sizeof(why));
  if (rc < 0) {
    free(sorted);
    return h->err(rc, "nccl backend: cannot shrink %s (rank %d of %d): %s", p->label, p->rank, p->size, why);
  }
  if (spec->size != p->size - nexclude || spec->rank != new_rank) {
    free(sorted);
    return h->err(DCOMM_EINVAL,
                  "nccl backend: shrinking %s (rank %d of %d) by %d rank(s) gives rank %d of %d, but the spec says "
                  "rank %d of %d",
                  p->label, p->rank, p->size, nexclude, new_rank, p->size - nexclude, spec->rank, spec->size);
  }
  if (!ctx->caps.shrink) {
    free(sorted);
    dnccl_version_text(ctx->version, vs, sizeof(vs));
    return h->err(DCOMM_ENOTSUP,
                  "nccl backend: NCCL %s (built against %d) has no usable ncclCommShrink (needs 2.27): re-create the "
                  "communicator instead",
                  vs, NCCL_VERSION_CODE);
  }
  pthread_mutex_lock(&p->mu);
  int gone = !p->nc, revoked = p->revoked;
  snprintf(why, sizeof(why), "%s", p->why);
  pthread_mutex_unlock(&p->mu);
  if (gone) {
    free(sorted);
    return h->err(DCOMM_ENOTSUP,
                  "nccl backend: cannot shrink %s: its NCCL communicator was already aborted (%s); re-create it "
                  "instead",
                  p->label, why[0] ? why : "released");
  }
#if DNCCL_BUILD_SHRINK
  double t0 = h->now();
  if (revoked && (rc = dnccl_wait_quiet(p, spec->deadline)) < 0) {
    free(sorted);
    return rc;
  }
  struct dnccl_comm *c;
  if ((rc = dnccl_comm_new(ctx, spec->comm_id, spec->rank, spec->size, spec->label, &c)) < 0) {
    free(sorted);
    return rc;
  }
  pthread_mutex_lock(&p->mu);
  c->user_stream = p->user_stream; /* the user's stream carries over */
  pthread_mutex_unlock(&p->mu);
  rc = shrink_into(p, c, sorted, nexclude, spec->deadline);
  free(sorted);
  if (rc < 0) {
    dnccl_comm_abort_one(c);
    dnccl_comm_free(c);
    return rc;
  }
  pthread_mutex_lock(&c->mu);
  c->initializing = 0;
  pthread_mutex_unlock(&c->mu);
  DNCCL_LOG(h, INFO, "nccl backend: %s shrunk by %d rank(s) into %s: rank %d of %d, %.3f s%s", p->label, nexclude,
            c->label, c->rank, c->size, h->now() - t0, revoked ? " (after ncclCommRevoke)" : "");
  *out = c;
  return 0;
#else
  (void)revoked;
  free(sorted);
  return h->err(DCOMM_ENOTSUP, "nccl backend: built against NCCL %d, without ncclCommShrink", NCCL_VERSION_CODE);
#endif
}
