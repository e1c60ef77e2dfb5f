/*
 * dcomm_plugin.h: the backend ABI. A backend (plugins/tcp built in,
 * plugins/nccl as a run-time module) is one versioned ops table,
 * struct dcomm_backend_v1; the core calls it only through this table and
 * offers its services (logging, errors, the store, reduction kernels,
 * sockets and the handshake) through struct dcomm_host. A plugin includes
 * this header and dcomm.h, nothing else of the core.
 *
 * A module exports one symbol, "dcomm_backend_v1", of type
 * const struct dcomm_backend_v1; the loader checks size and abi_version.
 */
#ifndef DCOMM_PLUGIN_H
#define DCOMM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "dcomm.h"

#define DCOMM_BACKEND_ABI_VERSION 1

/* Log levels of host->log (the core's own, too). A backend logs under its
 * own subsystem, host->log_subsys, named after it: DCOMM_LOG_SUBSYS=tcp. */
enum dcomm_log_level { DCOMM_LOG_ERROR = 0, DCOMM_LOG_WARN, DCOMM_LOG_INFO, DCOMM_LOG_DEBUG };

/* A DCOMM_* parameter a backend declares: dcomm-info -e lists it with the
 * core's, and host->param returns its default while the variable is unset.
 * type: "str", "int", "size", "bool" or "double" (the backend parses the
 * value with the host's parsers). */
struct dcomm_backend_param {
  const char *name; /* "DCOMM_..." */
  const char *type;
  const char *def;
  const char *help;
};

enum dcomm_coll {
  DCOMM_COLL_NONE = 0,
  DCOMM_COLL_ALL_REDUCE,
  DCOMM_COLL_REDUCE,
  DCOMM_COLL_BROADCAST,
  DCOMM_COLL_ALL_GATHER,
  DCOMM_COLL_GATHER,
  DCOMM_COLL_SCATTER,
  DCOMM_COLL_REDUCE_SCATTER,
  DCOMM_COLL_ALL_TO_ALL,
  DCOMM_COLL_BARRIER,
  DCOMM_COLL_SEND,
  DCOMM_COLL_RECV,
  DCOMM_COLL_ALL_TO_ALLV,
  DCOMM_COLL_COUNT
};

/* The blocks of an all_to_allv, one entry per rank of the comm, in
 * elements: this rank sends sendcounts[j] elements from sendbuf +
 * sdispls[j] to rank j and receives recvcounts[j] from rank j at recvbuf
 * + rdispls[j]. The core has checked that every block fits in size_t
 * bytes and that receive blocks do not overlap each other or a send
 * block; whether recvcounts[j] equals rank j's sendcounts[this rank] is
 * for the backend to find out (DCOMM_EMISMATCH). */
struct dcomm_vlayout {
  const size_t *sendcounts, *sdispls;
  const size_t *recvcounts, *rdispls;
};

/* One operation as the core hands it to a backend. */
struct dcomm_coll_args {
  enum dcomm_coll coll;
  const void *sendbuf; /* in-place ops (all_reduce, reduce, broadcast): NULL */
  void *recvbuf;       /* all_reduce/reduce/broadcast/send: the buffer */
  size_t count;        /* elements per rank, as in the public API */
  dcomm_dtype_t dtype;
  dcomm_op_t op;
  int root;            /* root, or peer for send/recv (rank in the comm) */
  int tag;             /* send/recv tag */
  uint64_t seq;        /* collective sequence number in this comm (p2p: 0) */
  double deadline;     /* absolute time on host->now()'s clock */
  void *stream;        /* backend queue (a cudaStream_t for nccl), or NULL */
  /* DCOMM_COLL_ALL_TO_ALLV: the blocks (count is 0); else NULL. Valid
   * until the op completes. */
  const struct dcomm_vlayout *v;
};

/* What a new communicator is made of. */
struct dcomm_comm_spec {
  uint64_t comm_id;       /* unique in this job and generation */
  int rank, size;         /* this process's rank in the comm, comm size */
  const int *world_ranks; /* world rank of each comm rank */
  double deadline;        /* for the creation itself */
  const char *label;      /* "world", "group 3", ... for messages */
};

/* Services of the core, valid from init to finalize. */
struct dcomm_host {
  size_t size;
  int world_rank, world_size, local_rank, local_size;
  const char *job_id, *auth_token, *listen_ip; /* listen_ip: interface to bind */
  void *store; /* the job's store, already prefixed for this generation */
  double (*now)(void);
  int (*log_enabled)(int level, int subsys);
  void (*log)(int level, int subsys, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
  int (*err)(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
  const char *(*param)(const char *name); /* raw value of a DCOMM_* variable or its default */
  int (*parse_size)(const char *s, size_t *out); /* the core's parsers: 0 or DCOMM_EINVAL */
  int (*parse_bool)(const char *s, int *out);
  int (*store_set)(void *store, const char *key, const void *val, size_t len);
  int (*store_get)(void *store, const char *key, double timeout, void **val, size_t *len);
  void (*reduce)(void *dst, const void *src, size_t count, dcomm_dtype_t dt, dcomm_op_t op);
  void (*scale_div)(void *buf, size_t count, dcomm_dtype_t dt, int n);
  const char *(*dtype_name)(int dt);
  const char *(*op_name)(int op);
  int (*sock_listen)(const char *host, int port, int backlog, int *fd, int *bound_port);
  int (*sock_connect)(const char *host, int port, double deadline, int *fd);
  void (*sock_tune)(int fd, size_t bufsize);
  int (*hs_server)(int fd, double deadline, uint32_t *purpose, void *hello, size_t *hello_len);
  int (*hs_client)(int fd, uint32_t purpose, const void *hello, size_t hello_len, double deadline);
  int log_subsys; /* the subsystem id of this backend's log lines */
  /* Added after the first release: present when size covers it. An
   * all-gather through the store among n members in O(n) store requests:
   * every member calls it with the same prefix, unique to the exchange,
   * and its own value; *all (free()d by the caller) is n + 1 uint64_t
   * offsets followed by the values, member r's being the bytes
   * [off[r], off[r+1]) of *all. */
  int (*store_allgather)(void *store, const char *prefix, int rank, int n, const void *mine, size_t len,
                         double timeout, void **all, size_t *alllen);
  /* Added later (present when size covers it): 0 while the generation whose
   * communicators are being created stands; once it was revoked, a DCOMM
   * error (message set) that a creation waiting for its peers should return
   * instead of waiting out its deadline. store_get, store_allgather and
   * sock_connect already end their waits by it. */
  int (*creation_cancelled)(void);
  /* Added later (present when size covers it): reduce out of place,
   * dst[i] = a[i] (op) b[i]; dst may be a, not b. */
  void (*reduce3)(void *dst, const void *a, const void *b, size_t count, dcomm_dtype_t dt, dcomm_op_t op);
};

struct dcomm_backend_v1 {
  size_t size;     /* sizeof(struct dcomm_backend_v1) */
  int abi_version; /* DCOMM_BACKEND_ABI_VERSION */
  const char *name;
  /* Per process. A backend that cannot run here (no GPU) fails with a
   * message naming what is missing. */
  int (*init)(const struct dcomm_host *host, void **ctx);
  int (*finalize)(void *ctx);
  /* Collective over the members of spec; every member calls it. */
  int (*comm_create)(void *ctx, const struct dcomm_comm_spec *spec, void **comm);
  /* Release; must also work on a comm that failed or was aborted. */
  int (*comm_destroy)(void *comm);
  /* Callable from any thread: every pending and later op on comm returns
   * reason (DCOMM_EREVOKED or DCOMM_EPEERLOST) promptly. */
  int (*comm_abort)(void *comm, int reason);
  /* Non-blocking form: post returns a request; test sets *done and, once
   * done, returns the op's result and frees the request; wait blocks until
   * done or the op's deadline and frees the request. */
  int (*post)(void *comm, const struct dcomm_coll_args *a, void **req);
  int (*test)(void *req, int *done);
  int (*wait)(void *req);
  /* 0, or the error that broke comm asynchronously. */
  int (*async_error)(void *comm);
  /* One line for dcomm-info (device, version); optional. */
  int (*describe)(void *ctx_or_null, char *buf, size_t len);

  /* ---- optional ops (NULL: not supported); reach them through
   * DCOMM_BACKEND_OP so that a shorter table reads as NULL ---- */

  /* Survivors of comm (healthy, broken, or after comm_abort) make a smaller
   * communicator without a new rendezvous. Every rank of comm that is not
   * in exclude_ranks (ranks of comm; nexclude >= 1; any order; never the
   * caller) calls it with the same list; excluded ranks do not call it.
   * spec describes the result as comm_create would get it: size is
   * comm's size - nexclude, rank the caller's rank among the survivors in
   * their old order, deadline bounds the call. On success *out_comm is
   * the new communicator; comm is aborted and must still be released with
   * comm_destroy. DCOMM_ENOTSUP: not possible here (the library lacks it,
   * or comm's handle is already gone) — fall back to comm_destroy +
   * comm_create; any other error: the same fallback after the others
   * are told. When the elastic layer renumbers the world it shrinks the
   * world's communicator first, then the sub-groups in creation order;
   * spec->world_ranks are in the new numbering (the tcp backend renumbers
   * its address table on the world's shrink). */
  int (*comm_shrink)(void *comm, const int *exclude_ranks, int nexclude, const struct dcomm_comm_spec *spec,
                     void **out_comm);
  /* Later ops on comm posted without a stream run on stream (a
   * cudaStream_t for nccl; NULL: the backend's own queue again). */
  int (*comm_set_stream)(void *comm, void *stream);
  /* Blocking form of post + wait, for a backend that can run an op on the
   * caller's thread without allocating a request. */
  int (*run)(void *comm, const struct dcomm_coll_args *a);
  /* A communicator for some members of parent made from parent's own
   * connections (ncclCommSplit) instead of a new rendezvous. Collective
   * over every member of parent: each passes its color (>= 0) and the spec
   * of its new communicator, or color -1 and spec NULL to join none (then
   * *comm is NULL). Members of one color form one communicator, ranked by
   * spec->rank. DCOMM_ENOTSUP: not possible here (the library, a setting,
   * or parent's handle is gone); the core then calls comm_create on the
   * members. A rank whose peers took the other path gets an error by the
   * deadline, never a hang. */
  int (*comm_split)(void *parent, int color, const struct dcomm_comm_spec *spec, void **comm);
  /* 0: collectives take device memory only (the core then sends its own
   * host values through the store); NULL or 1: host memory is fine. */
  int (*host_buffers)(void *ctx);
  /* The backend's own parameters, ended by an entry whose name is NULL. */
  const struct dcomm_backend_param *params;
  /* Point-to-point probe: progresses comm's incoming links until a
   * message with tag from peer (a rank of comm, or DCOMM_ANY_SOURCE: the
   * oldest such message of any peer) is fully received and waiting for a
   * receive, or until deadline (absolute, host->now()'s clock; one already
   * past: look without waiting). 1: found, *src (comm rank) and *nbytes
   * (payload bytes) set, and the next receive from *src with tag takes
   * exactly that message; 0: none by the deadline (comm stays healthy);
   * < 0: an error (a lost peer, an abort). Same thread rules as run. */
  int (*probe)(void *comm, int peer, int tag, double deadline, int *src, size_t *nbytes);
};

/* The smallest table the loader accepts: every op up to describe; the
 * optional ops after it may be left out by an older backend. */
#define DCOMM_BACKEND_V1_MIN_SIZE offsetof(struct dcomm_backend_v1, comm_shrink)

/* An optional op of table be, or NULL when be's table is too short for it. */
#define DCOMM_BACKEND_OP(be, op)                                                                          \
  ((be)->size >= offsetof(struct dcomm_backend_v1, op) + sizeof((be)->op) ? (be)->op : NULL)

/* A service of host h added after the first release, or NULL when the core
 * that loaded the backend is older than it. */
#define DCOMM_HOST_SERVICE(h, svc) \
  ((h)->size >= offsetof(struct dcomm_host, svc) + sizeof((h)->svc) ? (h)->svc : NULL)

#endif
