/*
 * nccl_split.c: the comm_split op of the nccl backend. dcomm_new_group and
 * dcomm_group_split are collective over the parent group, so every member
 * of the parent calls this: members of the new group with their color and
 * the new rank as key, the others with NCCL_SPLIT_NOCOLOR. ncclCommSplit
 * reuses the parent's bootstrap, so no unique id goes through the store.
 * Non-blocking like every communicator here: the parent is polled until
 * its part of the split is over, then the child until it is ready, both
 * bounded by the group's deadline. A split that does not finish in time
 * leaves the parent inside a collective that never ends: the parent is
 * marked broken, so its next operation fails instead of hanging.
 * DCOMM_ENOTSUP (NCCL older than 2.18, DCOMM_NCCL_SPLIT=0, the parent's
 * handle gone) makes the core create the communicator from a new unique id.
 */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"

#if DNCCL_BUILD_SPLIT
/* Starts the split on p's handle; NCCL writes the child's handle into
 * p->child_slot, possibly only once the parent's part is over (non-blocking
 * mode: see dnccl_await_child). 0 or an error. */
static int split_start(struct dnccl_comm *p, struct dnccl_comm *c, int color, int key) {
  const struct dcomm_host *h = p->ctx->host;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  if (c) cfg.commName = c->label;
  pthread_mutex_lock(&p->mu);
  int rc = dnccl_state_error(p, "ncclCommSplit");
  if (rc < 0 || !p->nc) { /* aborted since the caller looked */
    char why[DNCCL_WHY_LEN];
    snprintf(why, sizeof(why), "%s", p->why[0] ? p->why : "no NCCL handle");
    pthread_mutex_unlock(&p->mu);
    return h->err(DCOMM_ENOTSUP, "nccl backend: cannot split %s: %s", p->label, why);
  }
  (void)cudaSetDevice(p->dev);
  p->child_slot = NULL;
  ncclResult_t nr = ncclCommSplit(p->nc, c ? color : NCCL_SPLIT_NOCOLOR, key, &p->child_slot, &cfg);
  char text[640] = "";
  if (nr != ncclSuccess && nr != ncclInProgress) dnccl_result_text(p->nc, nr, text, sizeof(text));
  pthread_mutex_unlock(&p->mu);
  if (nr == ncclSuccess || nr == ncclInProgress) return 0;
  return dnccl_adopt(h, NULL, NULL, nr, text, "ncclCommSplit", p->label);
}

/* The child is ready: checks that NCCL ranked it as the spec says. */
static int check_placement(struct dnccl_comm *c) {
  int rank = -1, count = -1;
  pthread_mutex_lock(&c->mu);
  if (c->nc) {
    (void)ncclCommUserRank(c->nc, &rank);
    (void)ncclCommCount(c->nc, &count);
  }
  pthread_mutex_unlock(&c->mu);
  if (rank == c->rank && count == c->size) return 0;
  return c->ctx->host->err(DCOMM_EPROTO, "nccl backend: ncclCommSplit made %s rank %d of %d, but this rank is %d of %d",
                           c->label, rank, count, c->rank, c->size);
}
#endif

int dnccl_comm_split(void *parent, int color, const struct dcomm_comm_spec *spec, void **out) {
  struct dnccl_comm *p = parent;
  if (!out) return DCOMM_EINVAL;
  *out = NULL;
  if (!p) return DCOMM_EINVAL;
  struct dnccl_ctx *ctx = p->ctx;
  const struct dcomm_host *h = ctx->host;
  char why[256], vs[32];
  if (dnccl_split_check(color, spec, why, sizeof(why)) < 0)
    return h->err(DCOMM_EINVAL, "nccl backend: split of %s: %s", p->label, why);
  if (!ctx->split)
    return h->err(DCOMM_ENOTSUP, "nccl backend: split turned off (DCOMM_NCCL_SPLIT=0): a new communicator instead");
  if (!ctx->caps.split) {
    dnccl_version_text(ctx->version, vs, sizeof(vs));
    return h->err(DCOMM_ENOTSUP, "nccl backend: NCCL %s (built against %d) has no ncclCommSplit (needs 2.18)", vs,
                  NCCL_VERSION_CODE);
  }
  pthread_mutex_lock(&p->mu);
  int gone = !p->nc || p->aborted || p->failed;
  pthread_mutex_unlock(&p->mu);
  if (gone) return h->err(DCOMM_ENOTSUP, "nccl backend: cannot split %s: it was aborted or broke", p->label);
#if DNCCL_BUILD_SPLIT
  double t0 = h->now(), deadline = spec ? spec->deadline : h->now() + ctx->finalize_timeout;
  struct dnccl_comm *c = NULL;
  int rc = 0;
  if (spec && (rc = dnccl_comm_new(ctx, spec->comm_id, spec->rank, spec->size, spec->label, &c)) < 0) return rc;
  rc = split_start(p, c, color, spec ? spec->rank : 0);
  /* The parent's part (the exchange of colors over its bootstrap); the
   * child's handle exists once it is over. */
  ncclComm_t nc = NULL;
  if (rc == 0) rc = dnccl_await_child(p, deadline, "ncclCommSplit (parent)", &nc);
  if (rc == 0) rc = dnccl_poll_ready(p, deadline, "ncclCommSplit (parent)");
  if (rc == 0) rc = dnccl_adopt(h, c, nc, ncclSuccess, "", "ncclCommSplit", p->label);
  else if (nc) (void)ncclCommAbort(nc);
  if (rc == 0 && c) {
    char what[96];
    snprintf(what, sizeof(what), "ncclCommSplit (rank %d of %d)", c->rank, c->size);
    rc = dnccl_poll_ready(c, deadline, what);
    if (rc == 0) rc = check_placement(c);
  }
  if (rc == DCOMM_ETIMEDOUT) {
    pthread_mutex_lock(&p->mu);
    dnccl_mark_failed(p, DCOMM_ETIMEDOUT, "ncclCommSplit did not complete before its deadline (a member never called it)");
    pthread_mutex_unlock(&p->mu);
  }
  if (rc < 0) {
    if (c) {
      dnccl_comm_abort_one(c);
      dnccl_comm_free(c);
    }
    return rc;
  }
  if (!c) {
    DNCCL_LOG(h, DEBUG, "nccl backend: took part in a split of %s (no color), %.3f s", p->label, h->now() - t0);
    return 0;
  }
  pthread_mutex_lock(&c->mu);
  c->initializing = 0;
  pthread_mutex_unlock(&c->mu);
  DNCCL_LOG(h, INFO, "nccl backend: %s split from %s by ncclCommSplit: rank %d of %d, %.3f s", c->label, p->label,
            c->rank, c->size, h->now() - t0);
  *out = c;
  return 0;
#else
  return h->err(DCOMM_ENOTSUP, "nccl backend: built against NCCL %d, without ncclCommSplit", NCCL_VERSION_CODE);
#endif
}
