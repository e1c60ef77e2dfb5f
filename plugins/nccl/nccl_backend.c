/*
 * nccl_backend.c: the nccl backend's ops table (the module's one exported
 * symbol, dcomm_backend_v1) and its life cycle: per-process init (CUDA
 * device, NCCL version and capabilities), describe, communicator creation
 * (rank 0's ncclUniqueId through the store, non-blocking init bounded by
 * the deadline), destruction (finalize + destroy when healthy, abort
 * otherwise) and async error queries. The process-wide stop of every live
 * NCCL communicator is nccl_abort.c.
 *
 * Without a GPU every path fails with a message naming what is missing;
 * nothing pretends to succeed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr, RTLD_NODELETE */
#endif

#include "nccl.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dcomm.h"

extern const struct dcomm_backend_v1 dcomm_backend_v1 __attribute__((visibility("default")));

/* ---- small helpers ---- */

void dnccl_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

static void cuda_text(cudaError_t e, char *buf, size_t len) {
  snprintf(buf, len, "%s [%s, %d]", cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
}

const char *dnccl_coll_name(enum dcomm_coll c) {
  static const char *const names[DCOMM_COLL_COUNT] = {
      [DCOMM_COLL_NONE] = "none",           [DCOMM_COLL_ALL_REDUCE] = "all_reduce",
      [DCOMM_COLL_REDUCE] = "reduce",       [DCOMM_COLL_BROADCAST] = "broadcast",
      [DCOMM_COLL_ALL_GATHER] = "all_gather", [DCOMM_COLL_GATHER] = "gather",
      [DCOMM_COLL_SCATTER] = "scatter",     [DCOMM_COLL_REDUCE_SCATTER] = "reduce_scatter",
      [DCOMM_COLL_ALL_TO_ALL] = "all_to_all", [DCOMM_COLL_BARRIER] = "barrier",
      [DCOMM_COLL_SEND] = "send",           [DCOMM_COLL_RECV] = "recv",
      [DCOMM_COLL_ALL_TO_ALLV] = "all_to_allv"};
  return (unsigned)c < DCOMM_COLL_COUNT ? names[c] : "unknown op";
}

int dnccl_map_result(ncclResult_t r) {
  switch (r) {
  case ncclSuccess:
  case ncclInProgress: return 0;
  case ncclRemoteError: return DCOMM_EPEERLOST;
  default: return DCOMM_EBACKEND;
  }
}

void dnccl_result_text(ncclComm_t nc, ncclResult_t r, char *buf, size_t len) {
  const char *last = ncclGetLastError(nc);
  snprintf(buf, len, "%s, %s (%s)", dnccl_result_name(r), ncclGetErrorString(r),
           last && *last ? last : "ncclGetLastError: no detail");
}

void dnccl_mark_failed(struct dnccl_comm *c, int err, const char *why) {
  if (c->failed || c->aborted) return;
  c->failed = err;
  snprintf(c->why, sizeof(c->why), "%s", why);
}

int dnccl_async_failure(struct dnccl_comm *c, const char *during) {
  ncclResult_t st = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError(c->nc, &st);
  if (q != ncclSuccess) st = q;
  if (st == ncclSuccess || st == ncclInProgress) return 0;
  char text[512], why[DNCCL_WHY_LEN];
  dnccl_result_text(c->nc, st, text, sizeof(text));
  snprintf(why, sizeof(why), "NCCL async error%s%s: %s", during ? " during " : "", during ? during : "", text);
  int rc = dnccl_map_result(st);
  dnccl_mark_failed(c, rc, why);
  return rc;
}

int dnccl_state_error(struct dnccl_comm *c, const char *what) {
  const struct dcomm_host *h = c->ctx->host;
  if (c->aborted)
    return h->err(c->aborted, "nccl backend: %s failed: the NCCL communicator was aborted (%s)", what, c->why);
  if (c->failed)
    return h->err(c->failed, "nccl backend: %s failed: the NCCL communicator is broken (%s)", what, c->why);
  if (!c->nc)
    return h->err(DCOMM_EBACKEND, "nccl backend: %s on %s: no NCCL communicator", what, c->label);
  return 0;
}

int dnccl_poll_ready(struct dnccl_comm *c, double deadline, const char *what) {
  const struct dcomm_host *h = c->ctx->host;
  long us = 20;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    int rc = dnccl_state_error(c, what);
    if (rc < 0) {
      pthread_mutex_unlock(&c->mu);
      return rc;
    }
    ncclResult_t st = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(c->nc, &st);
    if (q != ncclSuccess) st = q;
    if (st == ncclSuccess) {
      pthread_mutex_unlock(&c->mu);
      return 0;
    }
    if (st != ncclInProgress) {
      char text[512], why[DNCCL_WHY_LEN];
      int err = dnccl_map_result(st);
      if (c->initializing) {
        const char *last = ncclGetLastError(c->nc);
        struct dnccl_ctx *x = c->ctx;
        dnccl_init_failure_text(st, last, c->dev, x->busid, x->local_rank, x->local_size, x->ndev, text, sizeof(text));
        if (st == ncclInvalidUsage) err = DCOMM_EINVAL; /* a set-up error, not a broken peer */
      } else {
        dnccl_result_text(c->nc, st, text, sizeof(text));
      }
      snprintf(why, sizeof(why), "NCCL error during %s: %s", what, text);
      dnccl_mark_failed(c, err, why);
      pthread_mutex_unlock(&c->mu);
      return h->err(err, "nccl backend: %s failed: %s", what, why);
    }
    pthread_mutex_unlock(&c->mu);
    if (deadline > 0 && h->now() >= deadline)
      return h->err(DCOMM_ETIMEDOUT, "nccl backend: %s did not complete before its deadline", what);
    dnccl_sleep_us(us);
    if (us < 1000) us *= 2;
  }
}

int dnccl_await_child(struct dnccl_comm *p, double deadline, const char *what, ncclComm_t *nc) {
  const struct dcomm_host *h = p->ctx->host;
  long us = 20;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    ncclComm_t got = __atomic_load_n(&p->child_slot, __ATOMIC_ACQUIRE);
    ncclResult_t st = ncclInProgress;
    if (!got && p->nc) {
      ncclResult_t q = ncclCommGetAsyncError(p->nc, &st);
      if (q != ncclSuccess) st = q;
      got = __atomic_load_n(&p->child_slot, __ATOMIC_ACQUIRE);
    }
    if (got || st == ncclSuccess || !p->nc) {
      pthread_mutex_unlock(&p->mu);
      *nc = got;
      return 0;
    }
    if (st != ncclInProgress) {
      char text[512];
      dnccl_result_text(p->nc, st, text, sizeof(text));
      pthread_mutex_unlock(&p->mu);
      return h->err(dnccl_map_result(st), "nccl backend: %s on %s failed: %s", what, p->label, text);
    }
    pthread_mutex_unlock(&p->mu);
    if (deadline > 0 && h->now() >= deadline)
      return h->err(DCOMM_ETIMEDOUT, "nccl backend: %s on %s did not complete before its deadline", what, p->label);
    dnccl_sleep_us(us);
    if (us < 1000) us *= 2;
  }
}

int dnccl_wait_quiet(struct dnccl_comm *c, double deadline) {
  const struct dcomm_host *h = c->ctx->host;
  long us = 20;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    if (!c->nc) {
      pthread_mutex_unlock(&c->mu);
      return h->err(DCOMM_ENOTSUP, "nccl backend: %s has no NCCL handle any more (aborted: %s)", c->label, c->why);
    }
    ncclResult_t st = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(c->nc, &st);
    if (q != ncclSuccess) st = q;
    pthread_mutex_unlock(&c->mu);
    if (st != ncclInProgress) {
      /* An error state is fine too: a shrink with NCCL_SHRINK_ABORT takes it. */
      if (st != ncclSuccess)
        DNCCL_LOG(h, INFO, "nccl backend: %s is in state %s after ncclCommRevoke", c->label, dnccl_result_name(st));
      return 0;
    }
    if (deadline > 0 && h->now() >= deadline)
      return h->err(DCOMM_ETIMEDOUT, "nccl backend: %s was still not quiescent after ncclCommRevoke at its deadline",
                    c->label);
    dnccl_sleep_us(us);
    if (us < 1000) us *= 2;
  }
}

/* ---- module pinning ---- */

/* libcudart and libnccl keep threads and exit handlers; unloading them
 * (the loader dlcloses a backend after a failed init or at finalize) and
 * loading them again is not safe, so the module pins itself once. */
static void pin_once(void) {
  Dl_info info;
  if (dladdr((const void *)&dcomm_backend_v1, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

static void pin_module(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, pin_once);
}

/* ---- init / finalize / describe ---- */

static int be_init(const struct dcomm_host *host, void **out) {
  if (!out) return DCOMM_EINVAL;
  *out = NULL;
  if (!host || host->size < sizeof(struct dcomm_host)) return DCOMM_EINVAL;
  pin_module();
  int ver = 0;
  char vs[32], ct[256];
  ncclResult_t nr = ncclGetVersion(&ver);
  if (nr != ncclSuccess) return host->err(DCOMM_EBACKEND, "nccl backend: ncclGetVersion failed: %s", ncclGetErrorString(nr));
  dnccl_version_text(ver, vs, sizeof(vs));
  if (ver < NCCL_VERSION(2, 14, 0))
    return host->err(DCOMM_ENOTSUP, "nccl backend: the loaded NCCL %s is older than 2.14 (no non-blocking communicators)",
                     vs);
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_text(ce, ct, sizeof(ct));
    return host->err(DCOMM_ENOTSUP, "nccl backend: no CUDA device (cudaGetDeviceCount: %s)", ct);
  }
  if (ndev <= 0) return host->err(DCOMM_ENOTSUP, "nccl backend: no CUDA device (cudaGetDeviceCount found none)");

  struct dnccl_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return host->err(DCOMM_ENOMEM, "nccl backend: out of memory");
  ctx->host = host;
  ctx->ndev = ndev;
  ctx->version = ver;
  ctx->local_rank = host->local_rank > 0 ? host->local_rank : 0;
  ctx->local_size = host->local_size > 0 ? host->local_size : 1;
  ctx->dev = ctx->local_rank % ndev;
  if ((ce = cudaSetDevice(ctx->dev)) != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_text(ce, ct, sizeof(ct));
    int dev = ctx->dev;
    free(ctx);
    return host->err(DCOMM_EBACKEND, "nccl backend: cudaSetDevice(%d) failed: %s", dev, ct);
  }
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, ctx->dev) == cudaSuccess) snprintf(ctx->devname, sizeof(ctx->devname), "%s", prop.name);
  else snprintf(ctx->devname, sizeof(ctx->devname), "unknown device");
  if (cudaDeviceGetPCIBusId(ctx->busid, (int)sizeof(ctx->busid), ctx->dev) != cudaSuccess)
    snprintf(ctx->busid, sizeof(ctx->busid), "?");
  (void)cudaGetLastError();
  struct dnccl_syms syms = dnccl_syms_here();
  dnccl_caps_compute(ver, &syms, &ctx->caps);
  const char *sp = host->param ? host->param("DCOMM_NCCL_SPLIT") : NULL;
  if (!sp || !host->parse_bool || host->parse_bool(sp, &ctx->split) != 0) ctx->split = 1;
  const char *t = host->param ? host->param("DCOMM_TIMEOUT") : NULL;
  char *end = NULL;
  ctx->finalize_timeout = t ? strtod(t, &end) : 0;
  if (!t || end == t || !(ctx->finalize_timeout > 0)) ctx->finalize_timeout = 300;

  if (host->local_size > ndev)
    DNCCL_LOG(host, WARN,
              "nccl backend: %d local ranks share %d CUDA device(s); two ranks of one communicator on one GPU fail "
              "(NCCL: duplicate GPU)",
              host->local_size, ndev);
  const char *blk = getenv("NCCL_COMM_BLOCKING");
  if (blk && atoi(blk) != 0)
    DNCCL_LOG(host, WARN, "nccl backend: NCCL_COMM_BLOCKING=%s makes NCCL calls blocking: an abort cannot interrupt them",
              blk);
  DNCCL_LOG(host, INFO, "nccl backend: NCCL %s, CUDA device %d of %d (%s, %s), split %s, shrink %s, revoke %s, group abort %s",
            vs, ctx->dev, ndev, ctx->devname, ctx->busid, ctx->caps.split && ctx->split ? "yes" : "no",
            ctx->caps.shrink ? "yes" : "no", ctx->caps.revoke ? "yes" : "no", ctx->caps.group_abort ? "yes" : "no");
  *out = ctx;
  return 0;
}

static int be_finalize(void *vctx) {
  struct dnccl_ctx *ctx = vctx;
  if (!ctx) return 0;
  int left = dnccl_live_count(ctx);
  if (left) {
    /* The core destroys every communicator first; these were leaked. */
    DNCCL_LOG(ctx->host, WARN, "nccl backend: finalize with %d live communicator(s): aborting them", left);
    dnccl_abort_all(DCOMM_EREVOKED, "the nccl backend was finalized while the communicator was live", DNCCL_STOP_ABORT);
    dnccl_live_drop(ctx);
  }
  free(ctx);
  return 0;
}

static int be_describe(void *vctx, char *buf, size_t len) {
  struct dnccl_ctx *ctx = vctx;
  if (!buf || !len) return DCOMM_EINVAL;
  pin_module();
  int ver = 0;
  char vs[32] = "?";
  if (ncclGetVersion(&ver) == ncclSuccess) dnccl_version_text(ver, vs, sizeof(vs));
  if (ctx) {
    snprintf(buf, len, "nccl %s, %d CUDA device(s), using device %d (%s, %s); split %s, shrink %s, revoke %s", vs,
             ctx->ndev, ctx->dev, ctx->devname, ctx->busid, ctx->caps.split && ctx->split ? "yes" : "no",
             ctx->caps.shrink ? "yes" : "no", ctx->caps.revoke ? "yes" : "no");
    return 0;
  }
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(buf, len, "nccl %s, no CUDA device (%s)", vs, cudaGetErrorString(ce));
  } else if (ndev <= 0) {
    snprintf(buf, len, "nccl %s, no CUDA device (none found)", vs);
  } else {
    snprintf(buf, len, "nccl %s, %d CUDA device(s)", vs, ndev);
  }
  return 0;
}

/* ---- communicators ---- */

void dnccl_comm_free(struct dnccl_comm *c) {
  if (c->listed) dnccl_live_remove(c);
  (void)cudaSetDevice(c->dev);
  if (c->barrier_buf) (void)cudaFree(c->barrier_buf);
  if (c->stream) (void)cudaStreamDestroy(c->stream);
  (void)cudaGetLastError();
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void dnccl_comm_abort_one(struct dnccl_comm *c) {
  pthread_mutex_lock(&c->mu);
  if (c->nc) {
    (void)ncclCommAbort(c->nc);
    c->nc = NULL;
  }
  pthread_mutex_unlock(&c->mu);
}

static int get_uid(struct dnccl_ctx *ctx, const struct dcomm_comm_spec *spec, ncclUniqueId *uid) {
  const struct dcomm_host *h = ctx->host;
  char key[64];
  snprintf(key, sizeof(key), "nccl/%016llx/uid", (unsigned long long)spec->comm_id);
  if (spec->rank == 0) {
    ncclResult_t nr = ncclGetUniqueId(uid);
    if (nr != ncclSuccess) {
      char text[512];
      dnccl_result_text(NULL, nr, text, sizeof(text));
      return h->err(dnccl_map_result(nr), "nccl backend: ncclGetUniqueId for %s failed: %s", spec->label, text);
    }
    if (spec->size == 1) return 0;
    return h->store_set(h->store, key, uid, sizeof(*uid));
  }
  double left = spec->deadline - h->now();
  void *val = NULL;
  size_t len = 0;
  int rc = h->store_get(h->store, key, left > 0 ? left : 0.001, &val, &len);
  if (rc < 0) return rc;
  if (len != sizeof(*uid)) {
    free(val);
    return h->err(DCOMM_EPROTO, "nccl backend: store key %s holds %zu bytes, not an ncclUniqueId (%zu)", key, len,
                  sizeof(*uid));
  }
  memcpy(uid, val, sizeof(*uid));
  free(val);
  return 0;
}

int dnccl_comm_new(struct dnccl_ctx *ctx, uint64_t id, int rank, int size, const char *label, struct dnccl_comm **out) {
  const struct dcomm_host *h = ctx->host;
  char ct[256];
  *out = NULL;
  cudaError_t ce = cudaSetDevice(ctx->dev);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_text(ce, ct, sizeof(ct));
    return h->err(DCOMM_EBACKEND, "nccl backend: cudaSetDevice(%d) failed: %s", ctx->dev, ct);
  }
  struct dnccl_comm *c = calloc(1, sizeof(*c));
  if (!c) return h->err(DCOMM_ENOMEM, "nccl backend: out of memory");
  c->ctx = ctx;
  c->id = id;
  c->rank = rank;
  c->size = size;
  c->dev = ctx->dev;
  snprintf(c->label, sizeof(c->label), "%s", label ? label : "communicator");
  pthread_mutex_init(&c->mu, NULL);
  /* A blocking stream: ops of the public API (which carries no stream)
   * are ordered after the caller's work on the legacy default stream. */
  if ((ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamDefault)) != cudaSuccess ||
      (ce = cudaMalloc((void **)&c->barrier_buf, sizeof(int))) != cudaSuccess ||
      (ce = cudaMemset(c->barrier_buf, 0, sizeof(int))) != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_text(ce, ct, sizeof(ct));
    dnccl_comm_free(c);
    return h->err(DCOMM_EBACKEND, "nccl backend: CUDA set-up of %s failed: %s", label, ct);
  }
  c->initializing = 1;
  dnccl_live_add(c); /* from here a process-wide abort covers the init too */
  *out = c;
  return 0;
}

int dnccl_adopt(const struct dcomm_host *h, struct dnccl_comm *c, ncclComm_t nc, ncclResult_t nr, const char *text,
                const char *call, const char *parent) {
  if (nr != ncclSuccess && nr != ncclInProgress) {
    if (nc) (void)ncclCommAbort(nc);
    int err = nr == ncclInvalidUsage || nr == ncclInvalidArgument ? DCOMM_EINVAL : dnccl_map_result(nr);
    return h->err(err, "nccl backend: %s of %s failed: %s", call, parent, text);
  }
  if (!c) {
    if (nc) (void)ncclCommAbort(nc); /* a rank that joins none keeps none */
    return 0;
  }
  pthread_mutex_lock(&c->mu);
  if (c->aborted) { /* a process-wide abort came in between */
    pthread_mutex_unlock(&c->mu);
    if (nc) (void)ncclCommAbort(nc);
    pthread_mutex_lock(&c->mu);
    int rc = dnccl_state_error(c, call);
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  c->nc = nc;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* Collectives take device memory only (the seeds' first pitfall). */
static int be_host_buffers(void *ctx) {
  (void)ctx;
  return 0;
}

static int be_comm_create(void *vctx, const struct dcomm_comm_spec *spec, void **out) {
  struct dnccl_ctx *ctx = vctx;
  const struct dcomm_host *h = ctx->host;
  *out = NULL;
  if (spec->size < 1 || spec->rank < 0 || spec->rank >= spec->size)
    return h->err(DCOMM_EINVAL, "nccl backend: rank %d is not in a communicator of size %d", spec->rank, spec->size);
  double t0 = h->now();
  cudaError_t ce = cudaSetDevice(ctx->dev);
  if (ce != cudaSuccess) {
    char ct[256];
    (void)cudaGetLastError();
    cuda_text(ce, ct, sizeof(ct));
    return h->err(DCOMM_EBACKEND, "nccl backend: cudaSetDevice(%d) failed: %s", ctx->dev, ct);
  }
  ncclUniqueId uid;
  int rc = get_uid(ctx, spec, &uid);
  if (rc < 0) return rc;
  struct dnccl_comm *c;
  if ((rc = dnccl_comm_new(ctx, spec->comm_id, spec->rank, spec->size, spec->label, &c)) < 0) return rc;

  pthread_mutex_lock(&c->mu);
  if (c->aborted) { /* a process-wide abort came first */
    rc = dnccl_state_error(c, "NCCL communicator init");
    pthread_mutex_unlock(&c->mu);
    dnccl_comm_free(c);
    return rc;
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = c->label;
  ncclResult_t nr = ncclCommInitRankConfig(&c->nc, spec->size, uid, spec->rank, &cfg);
  if (nr != ncclSuccess && nr != ncclInProgress) {
    char text[640];
    dnccl_init_failure_text(nr, ncclGetLastError(c->nc), c->dev, ctx->busid, ctx->local_rank, ctx->local_size,
                            ctx->ndev, text, sizeof(text));
    if (c->nc) (void)ncclCommAbort(c->nc);
    c->nc = NULL;
    pthread_mutex_unlock(&c->mu);
    dnccl_comm_free(c);
    return h->err(nr == ncclInvalidUsage ? DCOMM_EINVAL : dnccl_map_result(nr),
                  "nccl backend: ncclCommInitRankConfig for %s (rank %d of %d) failed: %s", spec->label, spec->rank,
                  spec->size, text);
  }
  pthread_mutex_unlock(&c->mu);

  char what[96];
  snprintf(what, sizeof(what), "NCCL communicator init (rank %d of %d)", c->rank, c->size);
  rc = dnccl_poll_ready(c, spec->deadline, what);
  if (rc < 0) {
    /* Only this handle: an init has no kernels in flight to hang others. */
    dnccl_comm_abort_one(c);
    dnccl_comm_free(c);
    return rc;
  }
  pthread_mutex_lock(&c->mu);
  c->initializing = 0;
  pthread_mutex_unlock(&c->mu);
  DNCCL_LOG(h, INFO, "nccl backend: %s ready: rank %d of %d on CUDA device %d, %.3f s", c->label, c->rank, c->size,
            c->dev, h->now() - t0);
  *out = c;
  return 0;
}

static int be_comm_destroy(void *comm) {
  struct dnccl_comm *c = comm;
  if (!c) return 0;
  const struct dcomm_host *h = c->ctx->host;
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  int healthy = c->nc && !c->aborted && !c->failed;
  ncclResult_t fr = ncclSuccess;
  if (healthy) {
    (void)cudaSetDevice(c->dev);
    fr = ncclCommFinalize(c->nc);
    if (fr != ncclSuccess && fr != ncclInProgress) {
      char text[512], why[DNCCL_WHY_LEN];
      dnccl_result_text(c->nc, fr, text, sizeof(text));
      snprintf(why, sizeof(why), "ncclCommFinalize failed: %s", text);
      dnccl_mark_failed(c, dnccl_map_result(fr), why);
      rc = h->err(c->failed, "nccl backend: destroying %s: %s", c->label, why);
    }
  }
  pthread_mutex_unlock(&c->mu);
  /* Still listed while finalizing, so a process-wide abort covers it. */
  if (healthy && rc == 0) rc = dnccl_poll_ready(c, h->now() + c->ctx->finalize_timeout, "ncclCommFinalize");
  dnccl_live_remove(c);
  pthread_mutex_lock(&c->mu);
  if (c->nc) {
    if (rc == 0 && !c->aborted && !c->failed) {
      ncclResult_t dr = ncclCommDestroy(c->nc);
      if (dr != ncclSuccess) rc = h->err(DCOMM_EBACKEND, "nccl backend: ncclCommDestroy of %s failed: %s", c->label,
                                         ncclGetErrorString(dr));
    } else {
      /* Broken, aborted elsewhere, or finalize failed: abort, never destroy. */
      (void)ncclCommAbort(c->nc);
    }
    c->nc = NULL;
  }
  pthread_mutex_unlock(&c->mu);
  if (rc < 0) DNCCL_LOG(h, WARN, "nccl backend: %s released after an error: %s", c->label,
                           c->why[0] ? c->why : "see the previous message");
  dnccl_comm_free(c);
  return rc;
}

static int be_comm_abort(void *comm, int reason) {
  struct dnccl_comm *c = comm;
  if (reason >= 0) reason = DCOMM_EREVOKED;
  char why[256];
  snprintf(why, sizeof(why), "%s requested on %s; every NCCL communicator of this process was aborted",
           dnccl_err_name(reason), c ? c->label : "a communicator");
  /* Revoke where possible: the elastic layer may shrink these next. */
  return dnccl_abort_all(reason, why, DNCCL_STOP_REVOKE);
}

static int be_async_error(void *comm) {
  struct dnccl_comm *c = comm;
  if (!c) return 0;
  const struct dcomm_host *h = c->ctx->host;
  pthread_mutex_lock(&c->mu);
  int rc = c->aborted ? c->aborted : c->failed;
  if (!rc && c->nc) rc = dnccl_async_failure(c, NULL);
  char why[DNCCL_WHY_LEN];
  snprintf(why, sizeof(why), "%s", c->why);
  pthread_mutex_unlock(&c->mu);
  if (rc) return h->err(rc, "nccl backend: %s (rank %d of %d): %s", c->label, c->rank, c->size, why);
  return 0;
}

/* The backend's own parameters (dcomm-info -e lists them; dcomm(7)). */
static const struct dcomm_backend_param dnccl_params[] = {
    {"DCOMM_NCCL_SPLIT", "bool", "1",
     "nccl backend: make sub-groups from the parent group's communicator with ncclCommSplit (NCCL >= 2.18); 0: a new communicator from a unique id through the store."},
    {NULL, NULL, NULL, NULL},
};

__attribute__((visibility("default"))) const struct dcomm_backend_v1 dcomm_backend_v1 = {
    .size = sizeof(struct dcomm_backend_v1),
    .abi_version = DCOMM_BACKEND_ABI_VERSION,
    .name = "nccl",
    .init = be_init,
    .finalize = be_finalize,
    .comm_create = be_comm_create,
    .comm_destroy = be_comm_destroy,
    .comm_abort = be_comm_abort,
    .post = dnccl_post,
    .test = dnccl_test,
    .wait = dnccl_wait,
    .async_error = be_async_error,
    .describe = be_describe,
    .comm_shrink = dnccl_comm_shrink,
    .comm_set_stream = dnccl_set_stream,
    .comm_split = dnccl_comm_split,
    .host_buffers = be_host_buffers,
    .params = dnccl_params,
    .probe = NULL, /* no point-to-point probe: dcomm_probe says DCOMM_ENOTSUP */
};
