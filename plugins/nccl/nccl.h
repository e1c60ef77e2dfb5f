/*
 * nccl.h: internals of the nccl backend (GPU), built as the run-time
 * module dcomm_nccl.so. Layering:
 *   nccl_backend.c  the ops table, per-process init/describe, communicator
 *                   creation (ncclUniqueId through the store, non-blocking
 *                   init), destruction, and the process-wide abort;
 *   nccl_ops.c      post/test/wait: argument and buffer checks, the
 *                   mapping of every dcomm collective onto NCCL calls,
 *                   completion through CUDA events; the user's stream;
 *   nccl_shrink.c   comm_shrink: survivors of a failed communicator make a
 *                   smaller one with ncclCommShrink (NCCL_SHRINK_ABORT),
 *                   after a revoke has quiesced it;
 *   nccl_split.c    comm_split: sub-groups made from the parent's
 *                   communicator with ncclCommSplit;
 *   nccl_caps.c     what needs no GPU (version gating, shrink arguments,
 *                   result names, init failure text), unit-checked here.
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

/* First versions with ncclCommSplit, ncclCommShrink and ncclCommRevoke. */
#define DNCCL_SPLIT_VERSION NCCL_VERSION(2, 18, 0)
#define DNCCL_SHRINK_VERSION NCCL_VERSION(2, 27, 0)
#define DNCCL_REVOKE_VERSION NCCL_VERSION(2, 28, 7)
/* Aborting several communicators inside one group (so that no abort waits
 * on a kernel of another hung communicator) arrived in NCCL 2.22. */
#define DNCCL_GROUP_ABORT_VERSION NCCL_VERSION(2, 22, 0)

/* Build-time availability of the fault-tolerance calls (the header's
 * version); run-time availability is checked again in init (the loaded
 * libnccl may be older, its symbols are referenced weakly). */
#if NCCL_VERSION_CODE >= DNCCL_SPLIT_VERSION
#define DNCCL_BUILD_SPLIT 1
#else
#define DNCCL_BUILD_SPLIT 0
#endif
#if NCCL_VERSION_CODE >= DNCCL_SHRINK_VERSION
#define DNCCL_BUILD_SHRINK 1
#else
#define DNCCL_BUILD_SHRINK 0
#endif
#if NCCL_VERSION_CODE >= DNCCL_REVOKE_VERSION
#define DNCCL_BUILD_REVOKE 1
#else
#define DNCCL_BUILD_REVOKE 0
#endif

/* Referenced weakly in every file, so that the module still loads against
 * an older libnccl; init checks both the version and the symbol. */
#if DNCCL_BUILD_SPLIT
#pragma weak ncclCommSplit
#endif
#if DNCCL_BUILD_SHRINK
#pragma weak ncclCommShrink
#endif
#if DNCCL_BUILD_REVOKE
#pragma weak ncclCommRevoke
#endif

/* What the loaded NCCL can do for recovery. */
struct dnccl_caps {
  int split;       /* ncclCommSplit usable */
  int shrink;      /* ncclCommShrink usable */
  int revoke;      /* ncclCommRevoke usable */
  int group_abort; /* ncclCommAbort may be grouped */
};

/* Logs under the subsystem the host gave this backend ("nccl"). */

#define DNCCL_LOG(host, lvl, ...)                                               \
  do {                                                                          \
    const struct dcomm_host *dnccl__h = (host);                                 \
    if (dnccl__h && dnccl__h->log_enabled(DCOMM_LOG_##lvl, dnccl__h->log_subsys)) \
      dnccl__h->log(DCOMM_LOG_##lvl, dnccl__h->log_subsys, __VA_ARGS__);         \
  } while (0)

#define DNCCL_WHY_LEN 768

/* Per process (one per dcomm_init). */
struct dnccl_ctx {
  const struct dcomm_host *host;
  int dev, ndev;        /* the CUDA device used (local_rank % ndev), count */
  int version;          /* ncclGetVersion of the loaded library */
  int local_rank, local_size;
  struct dnccl_caps caps; /* from the version and the symbols found */
  int split;            /* DCOMM_NCCL_SPLIT: sub-groups by ncclCommSplit */
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
  cudaStream_t user_stream; /* dcomm_set_stream's, or NULL: ops run on stream */
  int *barrier_buf;   /* one int on the device for barrier */
  int aborted;        /* the reason (< 0) once aborted, else 0 */
  int revoked;        /* aborted by ncclCommRevoke: nc kept for a shrink */
  int initializing;   /* between ncclCommInitRankConfig/Shrink and ready */
  int failed;         /* first error that broke the comm (not an abort), else 0 */
  char why[DNCCL_WHY_LEN]; /* what aborted or broke it */
  int listed;         /* on the live list */
  /* Where ncclCommSplit / ncclCommShrink on this (parent) communicator
   * write the new handle: in non-blocking mode NCCL fills it only when the
   * parent's part completes, after the call returned, so it must outlive
   * the call (the parent does). */
  ncclComm_t child_slot;
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

/* How dnccl_abort_all stops the communicators. */
enum dnccl_stop {
  DNCCL_STOP_ABORT,  /* ncclCommAbort, grouped: the handles are gone */
  DNCCL_STOP_REVOKE  /* ncclCommRevoke where the loaded NCCL has it (the
                      * handles stay for comm_shrink), else abort */
};

/* nccl_caps.c */
void dnccl_version_text(int v, char *buf, size_t len);
/* Which calls exist: built (the header had them) and have (the loaded
 * library's symbol was found), for split, shrink and revoke. */
struct dnccl_syms {
  int built_split, have_split, built_shrink, have_shrink, built_revoke, have_revoke;
};
void dnccl_caps_compute(int version, const struct dnccl_syms *syms, struct dnccl_caps *out);
/* The symbols of this build and of the loaded library. */
struct dnccl_syms dnccl_syms_here(void);
/* Checks comm_split's arguments: color -1 with no spec, or color >= 0
 * with a spec whose rank is in range. 0, or DCOMM_EINVAL with why. */
int dnccl_split_check(int color, const struct dcomm_comm_spec *spec, char *why, size_t len);
const char *dnccl_result_name(ncclResult_t r);
/* Checks a shrink of a comm of size ranks, called by rank: exclude holds
 * nexclude distinct ranks of the comm, not rank itself, and leaves at
 * least one. sorted (nexclude ints) gets them in ascending order,
 * *new_rank the caller's rank afterwards. 0, or DCOMM_EINVAL with why. */
int dnccl_shrink_plan(int size, int rank, const int *exclude, int nexclude, int *sorted, int *new_rank, char *why,
                      size_t len);
/* "<result name>: <detail>", and for ncclInvalidUsage at init the cause
 * (two ranks of one communicator on one GPU) with this rank's device. */
void dnccl_init_failure_text(ncclResult_t r, const char *detail, int dev, const char *busid, int local_rank,
                             int local_size, int ndev, char *buf, size_t len);

/* nccl_backend.c */
const char *dnccl_coll_name(enum dcomm_coll c);
const char *dnccl_err_name(int code);
int dnccl_map_result(ncclResult_t r);
/* "<ncclGetErrorString>: <ncclGetLastError>" into buf. */
void dnccl_result_text(ncclComm_t nc, ncclResult_t r, char *buf, size_t len);
/* Records err/why as the comm's failure (first one wins); c->mu held. */
void dnccl_mark_failed(struct dnccl_comm *c, int err, const char *why);
/* Asks NCCL for c->nc's asynchronous error; on one, marks c failed
 * ("NCCL async error[ during <during>]: <text>") and returns its dcomm
 * code, else 0. c->mu held, c->nc set. */
int dnccl_async_failure(struct dnccl_comm *c, const char *during);
/* Returns c's aborted/failed state as an error (detail set), or 0; c->mu held. */
int dnccl_state_error(struct dnccl_comm *c, const char *what);
/* Waits until c's NCCL state leaves ncclInProgress (c->mu not held; it is
 * taken around each poll). 0: ncclSuccess. Else the abort reason, a mapped
 * NCCL error (c marked failed) or DCOMM_ETIMEDOUT, each with detail. */
int dnccl_poll_ready(struct dnccl_comm *c, double deadline, const char *what);
/* After ncclCommSplit / ncclCommShrink on p returned: waits (bounded by
 * deadline) until NCCL has written the new handle into p->child_slot, that
 * is until the parent's part is over, and returns it in *nc (NULL for a
 * rank that joins no communicator). Polls p's handle directly, whatever
 * dcomm's own state of p says (a shrink marks it aborted first). */
int dnccl_await_child(struct dnccl_comm *p, double deadline, const char *what, ncclComm_t *nc);
/* Marks every live communicator of the process aborted with reason (why
 * says what happened) and stops their NCCL handles as how says. */
int dnccl_abort_all(int reason, const char *why, enum dnccl_stop how);
/* The list of live communicators (nccl_abort.c): added once created,
 * removed when destroyed; count and drop a finalized context's. */
void dnccl_live_add(struct dnccl_comm *c);
void dnccl_live_remove(struct dnccl_comm *c);
int dnccl_live_count(const struct dnccl_ctx *ctx);
void dnccl_live_drop(const struct dnccl_ctx *ctx);
/* Waits until a revoked c leaves ncclInProgress (quiescent, or in an error
 * state a shrink with NCCL_SHRINK_ABORT still takes): 0; DCOMM_ENOTSUP
 * without a handle, DCOMM_ETIMEDOUT at the deadline. c->mu not held. */
int dnccl_wait_quiet(struct dnccl_comm *c, double deadline);
/* A new comm of ctx with its stream and barrier buffer, on the live list
 * and without an NCCL handle yet; comm_free undoes it. */
int dnccl_comm_new(struct dnccl_ctx *ctx, uint64_t id, int rank, int size, const char *label, struct dnccl_comm **out);
/* After an NCCL call that made nc for c from a parent (split, shrink; nr
 * its result, text the parent's error text): gives c the handle, or
 * aborts nc and returns the error, also when a process-wide abort came
 * first. c NULL (a rank that joins none): nc is dropped. */
int dnccl_adopt(const struct dcomm_host *h, struct dnccl_comm *c, ncclComm_t nc, ncclResult_t nr, const char *text,
                const char *call, const char *parent);
/* Frees c (taking it off the live list); its NCCL handle must be gone. */
void dnccl_comm_free(struct dnccl_comm *c);
/* Aborts c's own NCCL handle only (c->mu not held). */
void dnccl_comm_abort_one(struct dnccl_comm *c);
void dnccl_sleep_us(long us);

/* nccl_ops.c */
int dnccl_post(void *comm, const struct dcomm_coll_args *a, void **req);
int dnccl_test(void *req, int *done);
int dnccl_wait(void *req);
int dnccl_set_stream(void *comm, void *stream);

/* nccl_shrink.c */
int dnccl_comm_shrink(void *comm, const int *exclude, int nexclude, const struct dcomm_comm_spec *spec, void **out);

/* nccl_split.c */
int dnccl_comm_split(void *parent, int color, const struct dcomm_comm_spec *spec, void **out);

#endif
