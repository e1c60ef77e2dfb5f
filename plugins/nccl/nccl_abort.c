/*
 * nccl_abort.c: the process-wide stop of the nccl backend. Every NCCL
 * communicator between its creation and its destruction is on one list;
 * dnccl_abort_all marks them all (so pending ops return promptly) and then
 * stops them: ncclCommRevoke (the handle stays, for a shrink) when the core
 * asks through comm_abort and the loaded NCCL has it, else ncclCommAbort,
 * grouped when NCCL can abort several together (after a timeout, at a
 * generation's revoke, or at finalize for communicators never destroyed).
 * (Waiting until a revoked handle is quiescent, dnccl_wait_quiet, is with
 * the other polls in nccl_backend.c.)
 */
#include "nccl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "dcomm.h"

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dnccl_comm *live_head;

/* Revokes nc (the handle stays for a shrink); 0 or the NCCL error, after
 * which the caller aborts it. */
static ncclResult_t revoke_one(ncclComm_t nc) {
#if DNCCL_BUILD_REVOKE
  ncclResult_t r = ncclCommRevoke(nc, NCCL_REVOKE_DEFAULT);
  return r == ncclInProgress ? ncclSuccess : r;
#else
  (void)nc;
  return ncclInvalidUsage;
#endif
}

int dnccl_abort_all(int reason, const char *why, enum dnccl_stop how) {
  if (reason >= 0) reason = DCOMM_EREVOKED;
  pthread_mutex_lock(&live_mu);
  int n = 0;
  for (struct dnccl_comm *c = live_head; c; c = c->next) n++;
  ncclComm_t *ncs = n ? calloc((size_t)n, sizeof(*ncs)) : NULL;
  struct dnccl_ctx *ctx = live_head ? live_head->ctx : NULL;
  const struct dcomm_host *h = ctx ? ctx->host : NULL;
  int revoke = how == DNCCL_STOP_REVOKE && ctx && ctx->caps.revoke;
  int k = 0, single = 0, revoked = 0;
  ncclResult_t first = ncclSuccess;
  double t0 = h ? h->now() : 0;
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  if (ctx) (void)cudaSetDevice(ctx->dev);
  /* Mark first, so every pending op returns promptly; stop after. */
  for (struct dnccl_comm *c = live_head; c; c = c->next) {
    pthread_mutex_lock(&c->mu);
    if (!c->aborted) {
      c->aborted = reason;
      snprintf(c->why, sizeof(c->why), "%s", why);
    }
    if (c->nc && revoke && !c->revoked && !c->initializing) {
      /* Local and asynchronous: in-flight kernels stop, the handle stays. */
      ncclResult_t r = revoke_one(c->nc);
      if (r == ncclSuccess) {
        c->revoked = 1;
        revoked++;
      } else if (h) {
        DNCCL_LOG(h, WARN, "nccl backend: ncclCommRevoke of %s failed (%s): aborting it", c->label,
                  dnccl_result_name(r));
      }
    }
    if (c->nc && (!revoke || !c->revoked)) { /* an abort also ends earlier revokes */
      if (ncs) {
        ncs[k++] = c->nc;
      } else { /* out of memory: abort one by one */
        ncclResult_t r = ncclCommAbort(c->nc);
        if (r != ncclSuccess && first == ncclSuccess) first = r;
        single++;
      }
      c->nc = NULL;
      c->revoked = 0;
    }
    pthread_mutex_unlock(&c->mu);
  }
  if (k > 0) {
    if (k > 1 && ctx->caps.group_abort) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) first = r;
      for (int i = 0; i < k; i++) {
        r = ncclCommAbort(ncs[i]);
        if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
      }
      r = ncclGroupEnd();
      if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
    } else {
      for (int i = 0; i < k; i++) {
        ncclResult_t r = ncclCommAbort(ncs[i]);
        if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
      }
    }
  }
  if (prev >= 0) (void)cudaSetDevice(prev);
  if (h && (k + single) > 0)
    DNCCL_LOG(h, WARN, "nccl backend: aborted %d NCCL communicator(s) of this process%s in %.3f s (%s): %s", k + single,
              k > 1 && ctx->caps.group_abort ? " together" : "", h->now() - t0, dnccl_err_name(reason), why);
  if (h && revoked > 0)
    DNCCL_LOG(h, WARN, "nccl backend: revoked %d NCCL communicator(s) of this process in %.3f s (%s): %s", revoked,
              h->now() - t0, dnccl_err_name(reason), why);
  pthread_mutex_unlock(&live_mu);
  free(ncs);
  if (first != ncclSuccess && h)
    return h->err(DCOMM_EBACKEND, "nccl backend: ncclCommAbort failed: %s", ncclGetErrorString(first));
  return 0;
}

void dnccl_live_add(struct dnccl_comm *c) {
  pthread_mutex_lock(&live_mu);
  c->next = live_head;
  live_head = c;
  c->listed = 1;
  pthread_mutex_unlock(&live_mu);
}

void dnccl_live_remove(struct dnccl_comm *c) {
  pthread_mutex_lock(&live_mu);
  for (struct dnccl_comm **p = &live_head; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  c->listed = 0;
  c->next = NULL;
  pthread_mutex_unlock(&live_mu);
}

int dnccl_live_count(const struct dnccl_ctx *ctx) {
  int left = 0;
  pthread_mutex_lock(&live_mu);
  for (struct dnccl_comm *c = live_head; c; c = c->next) left += c->ctx == ctx;
  pthread_mutex_unlock(&live_mu);
  return left;
}

void dnccl_live_drop(const struct dnccl_ctx *ctx) {
  pthread_mutex_lock(&live_mu);
  for (struct dnccl_comm **p = &live_head; *p;) {
    if ((*p)->ctx == ctx) {
      (*p)->listed = 0;
      *p = (*p)->next;
    } else {
      p = &(*p)->next;
    }
  }
  pthread_mutex_unlock(&live_mu);
}
