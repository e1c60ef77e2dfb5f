/*
 * nccl.h: internals of the nccl backend (GPU), built as the run-time
 * module dcomm_nccl.so. Layering:
 *   nccl_backend.c  the ops table, per-process init/describe, communicator
 *                   creation (ncclUniqueId through the store, non-blocking
 *                   init), destruction, and the process-wide abort;
 *   nccl_ops.c      post/test/wait: argument and buffer checks, the
 *                   mapping of every dcomm collective onto NCCL calls, and
 *                   completion through CUDA events.
 * Only dcomm_plugin.h and dcomm.h are included from the core; everything
 * else of the core comes through struct dcomm_host.
 *
 * Locking: one process-wide mutex guards the list of live communicators;
 * each communicator has a mutex that guards its ncclComm_t. Lock order is
 * list, then communicator. The NCCL handle is used only under the
 * communicator's mutex, so comm_abort from another thread never frees it
 * under a running call.
 */
#ifndef DCOMM_NCCL_H
#define DCOMM_NCCL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dcomm_plugin.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the nccl backend needs NCCL >= 2.14 (non-blocking communicators, ncclConfig_t)"
#endif

/* Build-time availability of the fault-tolerance calls; run-time
 * availability is checked again in init (the loaded libnccl may be older). */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define DNCCL_BUILD_SHRINK 1
#else
#define DNCCL_BUILD_SHRINK 0
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
#define DNCCL_BUILD_REVOKE 1
#else
#define DNCCL_BUILD_REVOKE 0
#endif

/* Aborting several communicators inside one group (so that no abort waits
 * on a kernel of another hung communicator) arrived in NCCL 2.22. */
#define DNCCL_GROUP_ABORT_VERSION NCCL_VERSION(2, 22, 0)

/* Log levels and subsystem number as the core defines them (log.h). */
#define DNCCL_LOG_ERROR 0
#define DNCCL_LOG_WARN 1
#define DNCCL_LOG_INFO 2
#define DNCCL_LOG_DEBUG 3
#define DNCCL_SUBSYS 7 /* "nccl" */

#define DNCCL_LOG(host, lvl, ...)                                               \
  do {                                                                          \
    const struct dcomm_host *dnccl__h = (host);                                 \
    if (dnccl__h && dnccl__h->log_enabled(DNCCL_LOG_##lvl, DNCCL_SUBSYS))       \
      dnccl__h->log(DNCCL_LOG_##lvl, DNCCL_SUBSYS, __VA_ARGS__);                \
  } while (0)

#define DNCCL_WHY_LEN 768

/* Per process (one per dcomm_init). */
struct dnccl_ctx {
  const struct dcomm_host *host;
  int dev, ndev;        /* the CUDA device used (local_rank % ndev), count */
  int version;          /* ncclGetVersion of the loaded library */
  int can_shrink;       /* ncclCommShrink usable (>= 2.27, built and loaded) */
  int can_revoke;       /* ncclCommRevoke usable (>= 2.28.7, built and loaded) */
  int group_abort;      /* ncclCommAbort may be grouped (>= 2.22) */
  double finalize_timeout; /* bound on ncclCommFinalize (DCOMM_TIMEOUT) */
  char devname[256];
  char busid[32];
};

/* One communicator. */
struct dnccl_comm {
  struct dnccl_ctx *ctx;
  uint64_t id;
  int rank, size;
  int dev;
  char label[48];
  pthread_mutex_t mu; /* guards nc, aborted, failed, why */
  ncclComm_t nc;      /* NULL before init and once aborted/released */
  cudaStream_t stream; /* our own stream (blocking: ordered after the legacy default stream) */
  int *barrier_buf;   /* one int on the device for barrier */
  int aborted;        /* the reason (< 0) once aborted, else 0 */
  int failed;         /* first error that broke the comm (not an abort), else 0 */
  char why[DNCCL_WHY_LEN]; /* what aborted or broke it */
  int listed;         /* on the live list */
  struct dnccl_comm *next;
};

/* One posted operation. */
struct dnccl_req {
  struct dnccl_comm *c;
  cudaEvent_t ev;     /* recorded after the NCCL call; NULL: nothing was enqueued */
  double deadline;    /* absolute, host->now() clock; <= 0: none */
  double posted;
  enum dcomm_coll coll;
  size_t count;
};

/* nccl_backend.c */
const char *dnccl_coll_name(enum dcomm_coll c);
const char *dnccl_err_name(int code);
int dnccl_map_result(ncclResult_t r);
/* "<ncclGetErrorString>: <ncclGetLastError>" into buf. */
void dnccl_result_text(ncclComm_t nc, ncclResult_t r, char *buf, size_t len);
/* Records err/why as the comm's failure (first one wins); c->mu held. */
void dnccl_mark_failed(struct dnccl_comm *c, int err, const char *why);
/* Returns c's aborted/failed state as an error (detail set), or 0; c->mu held. */
int dnccl_state_error(struct dnccl_comm *c, const char *what);
/* Waits until c's NCCL state leaves ncclInProgress (c->mu not held; it is
 * taken around each poll). 0: ncclSuccess. Else the abort reason, a mapped
 * NCCL error (c marked failed) or DCOMM_ETIMEDOUT, each with detail. */
int dnccl_poll_ready(struct dnccl_comm *c, double deadline, const char *what);
/* Marks every live communicator of the process aborted with reason (why
 * says what happened) and aborts their NCCL handles together. */
int dnccl_abort_all(int reason, const char *why);
void dnccl_sleep_us(long us);

/* nccl_ops.c */
int dnccl_post(void *comm, const struct dcomm_coll_args *a, void **req);
int dnccl_test(void *req, int *done);
int dnccl_wait(void *req);

#endif
