/*
 * dcomm.h: the public C API of libdcomm, a fault-tolerant collective
 * communication runtime following the torch.distributed model: one world
 * process group, sub-groups, and the collectives over a pluggable backend.
 *
 * Every call returns 0 on success or a negative DCOMM_E* code; after an
 * error, dcomm_last_error() gives a sentence that says which call and which
 * peer failed (thread-local).
 */
#ifndef DCOMM_H
#define DCOMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DCOMM_API __attribute__((visibility("default")))
#else
#define DCOMM_API
#endif

#define DCOMM_VERSION_MAJOR 0
#define DCOMM_VERSION_MINOR 1
#define DCOMM_VERSION_PATCH 0

/* Error codes: 0 is success, failures are negative. The one table of
 * them: X(name, value, message); dcomm_strerror and dcomm_error_name are
 * generated from it (as libuv's UV_ERRNO_MAP). */
#define DCOMM_ERRNO_MAP(X)                                                            \
  X(SUCCESS, 0, "success")                                                            \
  X(EINVAL, -1, "invalid argument") /* bad argument or configuration */               \
  X(ENOTINIT, -2, "dcomm is not initialized") /* dcomm_init has not run, or finalize has */ \
  X(ETIMEDOUT, -3, "operation timed out") /* the operation's timeout expired */       \
  X(EPEERLOST, -4, "a peer was lost") /* a peer died or its connection broke */       \
  X(EREVOKED, -5, "communicator revoked") /* revoked / aborted */                     \
  X(EMISMATCH, -6, "ranks called mismatched collectives")                             \
  X(ENOTSUP, -7, "operation not supported") /* by this backend or build */            \
  X(EAUTH, -8, "authentication failed") /* handshake refused: wrong job or token */   \
  X(EBACKEND, -9, "backend failure") /* internal backend failure (e.g. NCCL) */       \
  X(ESYSTEM, -10, "system call failed") /* an operating-system call failed */         \
  X(ENOMEM, -11, "out of memory")                                                     \
  X(ENOTMEMBER, -12, "not a member of the group")                                     \
  X(EPROTO, -13, "protocol error") /* malformed message on the wire */                \
  X(ENOTFOUND, -14, "not found") /* no such key / item */

enum dcomm_errno {
#define DCOMM_ERRNO_ENUM(name, value, msg) DCOMM_##name = (value),
  DCOMM_ERRNO_MAP(DCOMM_ERRNO_ENUM)
#undef DCOMM_ERRNO_ENUM
};

/* A process group. NULL means the world group. */
typedef struct dcomm_group *dcomm_group_t;

typedef enum {
  DCOMM_INT8,
  DCOMM_UINT8,
  DCOMM_INT32,
  DCOMM_UINT32,
  DCOMM_INT64,
  DCOMM_UINT64,
  DCOMM_FLOAT16,
  DCOMM_BFLOAT16,
  DCOMM_FLOAT32,
  DCOMM_FLOAT64,
  DCOMM_DTYPE_COUNT
} dcomm_dtype_t;

/* DCOMM_BAND, DCOMM_BOR and DCOMM_BXOR (bitwise and, or, xor) take the
 * integer dtypes only (DCOMM_INT8 .. DCOMM_UINT64); with a floating dtype
 * a reduction fails with DCOMM_EINVAL before any byte moves. */
typedef enum {
  DCOMM_SUM,
  DCOMM_PROD,
  DCOMM_MAX,
  DCOMM_MIN,
  DCOMM_AVG,
  DCOMM_BAND,
  DCOMM_BOR,
  DCOMM_BXOR,
  DCOMM_OP_COUNT
} dcomm_op_t;

/* Set-up and tear-down. backend NULL: DCOMM_BACKEND (default "tcp");
 * init_method NULL: DCOMM_INIT_METHOD, else detected from the environment
 * (env:// when MASTER_ADDR is set). */
DCOMM_API int dcomm_init(const char *backend, const char *init_method);
DCOMM_API int dcomm_finalize(void);
DCOMM_API int dcomm_initialized(void);

DCOMM_API int dcomm_rank(void);
DCOMM_API int dcomm_world_size(void);
DCOMM_API int dcomm_local_rank(void);
DCOMM_API int dcomm_local_world_size(void);
DCOMM_API const char *dcomm_backend_name(void);

/* Groups. dcomm_new_group is collective over the world: every rank calls it
 * with the same list; non-members get a handle on which dcomm_group_rank and
 * every collective return DCOMM_ENOTMEMBER. dcomm_group_split is collective
 * over the parent; a negative color gives a non-member handle. */
DCOMM_API int dcomm_new_group(const int *world_ranks, int n, dcomm_group_t *group);
DCOMM_API int dcomm_group_split(dcomm_group_t parent, int color, int key, dcomm_group_t *group);
/* Collective over the listed members only (torch.distributed creates a
 * group's backend on its members alone): a caller not in world_ranks gets
 * a non-member handle at once. name tells groups with the same members
 * apart; a second live group of the same name and ranks is refused. */
DCOMM_API int dcomm_new_group_named(const char *name, const int *world_ranks, int n, dcomm_group_t *group);
DCOMM_API int dcomm_group_rank(dcomm_group_t g);
DCOMM_API int dcomm_group_size(dcomm_group_t g);
DCOMM_API int dcomm_group_world_rank(dcomm_group_t g, int group_rank);
DCOMM_API int dcomm_group_free(dcomm_group_t g);
/* Per-group operation timeout in seconds (default DCOMM_TIMEOUT). */
DCOMM_API int dcomm_group_set_timeout(dcomm_group_t g, double seconds);

/* Collectives. root / peer are ranks inside the group. */
DCOMM_API int dcomm_all_reduce(void *buf, size_t count, dcomm_dtype_t dt, dcomm_op_t op, dcomm_group_t g);
DCOMM_API int dcomm_reduce(void *buf, size_t count, dcomm_dtype_t dt, dcomm_op_t op, int root, dcomm_group_t g);
DCOMM_API int dcomm_broadcast(void *buf, size_t count, dcomm_dtype_t dt, int root, dcomm_group_t g);
DCOMM_API int dcomm_all_gather(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, dcomm_group_t g);
DCOMM_API int dcomm_gather(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, int root, dcomm_group_t g);
DCOMM_API int dcomm_scatter(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, int root, dcomm_group_t g);
DCOMM_API int dcomm_reduce_scatter(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, dcomm_op_t op,
                                   dcomm_group_t g);
DCOMM_API int dcomm_all_to_all(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, dcomm_group_t g);
/* Uneven all_to_all (as MPI_Alltoallv): counts and displacements in
 * elements, one entry per group rank; rank i's sendcounts[j] must equal
 * rank j's recvcounts[i] (else DCOMM_EMISMATCH). */
DCOMM_API int dcomm_all_to_allv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                                const size_t *recvcounts, const size_t *rdispls, dcomm_dtype_t dt, dcomm_group_t g);
DCOMM_API int dcomm_send(const void *buf, size_t count, dcomm_dtype_t dt, int peer, int tag, dcomm_group_t g);
DCOMM_API int dcomm_recv(void *buf, size_t count, dcomm_dtype_t dt, int peer, int tag, dcomm_group_t g);
/* Any member, for dcomm_probe's peer. */
#define DCOMM_ANY_SOURCE (-1)
/* Waits up to timeout seconds (0: not at all) for a message with tag from
 * peer (a group rank or DCOMM_ANY_SOURCE) to be fully there: 1 and its
 * sender and payload bytes, which a dcomm_recv from *src then takes at
 * once; 0 if none came; a negative DCOMM_E* on failure. */
DCOMM_API int dcomm_probe(int peer, int tag, dcomm_group_t g, double timeout, int *src, size_t *nbytes);
/* dcomm_recv from whichever member's message with tag comes first; *src
 * (may be NULL) is its group rank. */
DCOMM_API int dcomm_recv_any(void *buf, size_t count, dcomm_dtype_t dt, int tag, dcomm_group_t g, int *src);
DCOMM_API int dcomm_barrier(dcomm_group_t g);
/* GPU backends: later collectives of this rank on g are enqueued on
 * cuda_stream (a cudaStream_t of this rank's GPU, passed as void * so this
 * header needs no CUDA), ordered after the work already on it; each call
 * still returns once its op completed. NULL: the backend's own stream
 * again. DCOMM_ENOTSUP on a backend without streams (tcp). */
DCOMM_API int dcomm_set_stream(dcomm_group_t g, void *cuda_stream);

/* Errors. */
DCOMM_API const char *dcomm_strerror(int err);
DCOMM_API const char *dcomm_error_name(int err);
DCOMM_API const char *dcomm_last_error(void);

DCOMM_API size_t dcomm_dtype_size(dcomm_dtype_t dt);
DCOMM_API const char *dcomm_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* DCOMM_H */
