/*
 * nccl_ops.c: the nccl backend's operations. post checks the arguments
 * (dtype, op, root, tag, and that every buffer it touches is device memory
 * of the communicator's GPU), enqueues the NCCL call(s) on the caller's
 * stream (the op's, else the one dcomm_set_stream gave, else the
 * communicator's own), and records a CUDA event after them;
 * test polls the event and the communicator's async error; wait polls test
 * until done or the op's deadline, and on the deadline aborts every NCCL
 * communicator of the process (a hung kernel can block the abort of any
 * other communicator on the device) and returns DCOMM_ETIMEDOUT.
 *
 * Mapping: all_reduce, reduce, broadcast, all_gather and reduce_scatter are
 * the NCCL collectives; gather, scatter, all_to_all and all_to_allv are
 * ncclSend/ncclRecv grouped in ncclGroupStart/End (all_to_allv skips empty
 * blocks, and cannot see a count that differs from the peer's: that hangs
 * until the deadline); barrier is an all_reduce of one int on a small
 * device buffer; send/recv are ncclSend/ncclRecv (no tags). NCCL has no
 * bitwise reductions: DCOMM_BAND, DCOMM_BOR and DCOMM_BXOR are
 * DCOMM_ENOTSUP.
 */
#include "nccl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"

static int map_dtype(dcomm_dtype_t dt, ncclDataType_t *out, size_t *es) {
  switch (dt) {
  case DCOMM_INT8: *out = ncclInt8, *es = 1; return 0;
  case DCOMM_UINT8: *out = ncclUint8, *es = 1; return 0;
  case DCOMM_INT32: *out = ncclInt32, *es = 4; return 0;
  case DCOMM_UINT32: *out = ncclUint32, *es = 4; return 0;
  case DCOMM_INT64: *out = ncclInt64, *es = 8; return 0;
  case DCOMM_UINT64: *out = ncclUint64, *es = 8; return 0;
  case DCOMM_FLOAT16: *out = ncclHalf, *es = 2; return 0;
  case DCOMM_BFLOAT16: *out = ncclBfloat16, *es = 2; return 0;
  case DCOMM_FLOAT32: *out = ncclFloat32, *es = 4; return 0;
  case DCOMM_FLOAT64: *out = ncclFloat64, *es = 8; return 0;
  default: return -1;
  }
}

static int map_op(dcomm_op_t op, ncclRedOp_t *out) {
  switch (op) {
  case DCOMM_SUM: *out = ncclSum; return 0;
  case DCOMM_PROD: *out = ncclProd; return 0;
  case DCOMM_MAX: *out = ncclMax; return 0;
  case DCOMM_MIN: *out = ncclMin; return 0;
  case DCOMM_AVG: *out = ncclAvg; return 0;
  default: return -1;
  }
}

/* The module does not link libdcomm, so it names the ops itself. */
static const char *op_text(dcomm_op_t op) {
  switch (op) {
  case DCOMM_SUM: return "sum";
  case DCOMM_PROD: return "prod";
  case DCOMM_MAX: return "max";
  case DCOMM_MIN: return "min";
  case DCOMM_AVG: return "avg";
  case DCOMM_BAND: return "band";
  case DCOMM_BOR: return "bor";
  case DCOMM_BXOR: return "bxor";
  default: return "op?";
  }
}

static int is_reduction(enum dcomm_coll c) {
  return c == DCOMM_COLL_ALL_REDUCE || c == DCOMM_COLL_REDUCE || c == DCOMM_COLL_REDUCE_SCATTER;
}

static int has_root(enum dcomm_coll c) {
  return c == DCOMM_COLL_REDUCE || c == DCOMM_COLL_BROADCAST || c == DCOMM_COLL_GATHER || c == DCOMM_COLL_SCATTER ||
         c == DCOMM_COLL_SEND || c == DCOMM_COLL_RECV;
}

/* Checks that p (bytes long, bytes > 0) is memory the communicator's GPU
 * can use: device memory of that GPU, or managed memory. */
static int check_buf(struct dnccl_comm *c, const void *p, size_t bytes, const char *name, const char *what) {
  const struct dcomm_host *h = c->ctx->host;
  if (!bytes) return 0;
  if (!p) return h->err(DCOMM_EINVAL, "nccl backend: %s of %s is NULL with %zu bytes to move", name, what, bytes);
  struct cudaPointerAttributes at;
  memset(&at, 0, sizeof(at));
  cudaError_t e = cudaPointerGetAttributes(&at, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (e == cudaErrorInvalidValue) /* older CUDA: not known to CUDA at all */
      return h->err(DCOMM_EINVAL, "nccl backend needs device memory: buffer %p is host memory (%s of %s)", p, name, what);
    return h->err(DCOMM_EBACKEND, "nccl backend: cudaPointerGetAttributes(%p) failed: %s (%s of %s)", p,
                  cudaGetErrorString(e), name, what);
  }
  switch (at.type) {
  case cudaMemoryTypeDevice:
    if (at.device != c->dev)
      return h->err(DCOMM_EINVAL,
                    "nccl backend: buffer %p (%s of %s) is memory of CUDA device %d, but %s uses device %d", p, name,
                    what, at.device, c->label, c->dev);
    return 0;
  case cudaMemoryTypeManaged: return 0;
  case cudaMemoryTypeHost:
    return h->err(DCOMM_EINVAL, "nccl backend needs device memory: buffer %p is host memory (page-locked; %s of %s)", p,
                  name, what);
  default:
    return h->err(DCOMM_EINVAL, "nccl backend needs device memory: buffer %p is host memory (%s of %s)", p, name, what);
  }
}

/* The bytes an all_to_allv side spans: the end of its last non-empty block. */
static size_t vextent(const size_t *counts, const size_t *displs, int n, size_t es) {
  size_t end = 0;
  for (int j = 0; j < n; j++)
    if (counts[j] && (displs[j] + counts[j]) * es > end) end = (displs[j] + counts[j]) * es;
  return end;
}

/* Which buffers an op touches, and how large they are, on this rank. */
static int check_bufs(struct dnccl_comm *c, const struct dcomm_coll_args *a, const void *sb, void *rb, size_t bytes) {
  const char *what = dnccl_coll_name(a->coll);
  const char *sname = sb == rb ? "buf" : "sendbuf", *rname = sb == rb ? "buf" : "recvbuf";
  size_t all = bytes * (size_t)c->size;
  int root = a->root == c->rank;
  int rc = 0;
  switch (a->coll) {
  case DCOMM_COLL_ALL_REDUCE:
    if ((rc = check_buf(c, sb, bytes, sname, what)) == 0 && sb != rb) rc = check_buf(c, rb, bytes, rname, what);
    break;
  case DCOMM_COLL_REDUCE:
    rc = check_buf(c, sb, bytes, sname, what);
    if (rc == 0 && sb != rb && root) rc = check_buf(c, rb, bytes, rname, what);
    break;
  case DCOMM_COLL_BROADCAST:
    if (root) rc = check_buf(c, sb, bytes, sname, what);
    if (rc == 0 && (sb != rb || !root)) rc = check_buf(c, rb, bytes, rname, what);
    break;
  case DCOMM_COLL_ALL_GATHER:
    if ((rc = check_buf(c, sb, bytes, sname, what)) == 0) rc = check_buf(c, rb, all, rname, what);
    break;
  case DCOMM_COLL_GATHER:
    rc = check_buf(c, sb, bytes, sname, what);
    if (rc == 0 && root) rc = check_buf(c, rb, all, rname, what);
    break;
  case DCOMM_COLL_SCATTER:
    if (root) rc = check_buf(c, sb, all, sname, what);
    if (rc == 0) rc = check_buf(c, rb, bytes, rname, what);
    break;
  case DCOMM_COLL_REDUCE_SCATTER:
    if ((rc = check_buf(c, sb, all, sname, what)) == 0) rc = check_buf(c, rb, bytes, rname, what);
    break;
  case DCOMM_COLL_ALL_TO_ALL:
    if ((rc = check_buf(c, sb, all, sname, what)) == 0) rc = check_buf(c, rb, all, rname, what);
    break;
  case DCOMM_COLL_ALL_TO_ALLV: {
    size_t es = 1, se, re;
    ncclDataType_t unused;
    (void)map_dtype(a->dtype, &unused, &es);
    se = vextent(a->v->sendcounts, a->v->sdispls, c->size, es);
    re = vextent(a->v->recvcounts, a->v->rdispls, c->size, es);
    if ((rc = check_buf(c, sb, se, sname, what)) == 0) rc = check_buf(c, rb, re, rname, what);
    break;
  }
  case DCOMM_COLL_SEND: rc = check_buf(c, sb, bytes, "buf", what); break;
  case DCOMM_COLL_RECV: rc = check_buf(c, rb, bytes, "buf", what); break;
  default: break;
  }
  return rc;
}

/* gather, scatter and all_to_all as one group of sends and receives. */
static ncclResult_t grouped(struct dnccl_comm *c, enum dcomm_coll coll, const void *sb, void *rb, size_t n,
                            size_t es, ncclDataType_t dt, int root, const struct dcomm_vlayout *v, cudaStream_t s) {
  const char *sp = sb;
  char *rp = rb;
  size_t chunk = n * es;
  ncclResult_t first = ncclGroupStart();
  if (first != ncclSuccess) return first;
#define DNCCL_G(call)                                                           \
  do {                                                                          \
    if (first == ncclSuccess) {                                                 \
      ncclResult_t g_ = (call);                                                 \
      if (g_ != ncclSuccess && g_ != ncclInProgress) first = g_;                \
    }                                                                           \
  } while (0)
  switch (coll) {
  case DCOMM_COLL_GATHER:
    DNCCL_G(ncclSend(sb, n, dt, root, c->nc, s));
    if (c->rank == root)
      for (int p = 0; p < c->size; p++) DNCCL_G(ncclRecv(rp + (size_t)p * chunk, n, dt, p, c->nc, s));
    break;
  case DCOMM_COLL_SCATTER:
    if (c->rank == root)
      for (int p = 0; p < c->size; p++) DNCCL_G(ncclSend(sp + (size_t)p * chunk, n, dt, p, c->nc, s));
    DNCCL_G(ncclRecv(rb, n, dt, root, c->nc, s));
    break;
  case DCOMM_COLL_ALL_TO_ALL:
    for (int p = 0; p < c->size; p++) {
      DNCCL_G(ncclSend(sp + (size_t)p * chunk, n, dt, p, c->nc, s));
      DNCCL_G(ncclRecv(rp + (size_t)p * chunk, n, dt, p, c->nc, s));
    }
    break;
  case DCOMM_COLL_ALL_TO_ALLV: /* empty blocks are left out, on both sides */
    for (int p = 0; p < c->size; p++) {
      if (v->sendcounts[p]) DNCCL_G(ncclSend(sp + v->sdispls[p] * es, v->sendcounts[p], dt, p, c->nc, s));
      if (v->recvcounts[p]) DNCCL_G(ncclRecv(rp + v->rdispls[p] * es, v->recvcounts[p], dt, p, c->nc, s));
    }
    break;
  default: first = ncclInvalidArgument; break;
  }
#undef DNCCL_G
  ncclResult_t e = ncclGroupEnd(); /* always closes the group, even after an error */
  return first != ncclSuccess ? first : e;
}

/* Enqueues the op; c->mu held. */
static ncclResult_t enqueue(struct dnccl_comm *c, const struct dcomm_coll_args *a, const void *sb, void *rb,
                            size_t es, ncclDataType_t dt, ncclRedOp_t op, cudaStream_t s) {
  size_t n = a->count;
  switch (a->coll) {
  case DCOMM_COLL_ALL_REDUCE: return ncclAllReduce(sb, rb, n, dt, op, c->nc, s);
  case DCOMM_COLL_REDUCE: return ncclReduce(sb, rb, n, dt, op, a->root, c->nc, s);
  case DCOMM_COLL_BROADCAST: return ncclBroadcast(sb, rb, n, dt, a->root, c->nc, s);
  case DCOMM_COLL_ALL_GATHER: return ncclAllGather(sb, rb, n, dt, c->nc, s);
  case DCOMM_COLL_REDUCE_SCATTER: return ncclReduceScatter(sb, rb, n, dt, op, c->nc, s);
  case DCOMM_COLL_GATHER:
  case DCOMM_COLL_SCATTER:
  case DCOMM_COLL_ALL_TO_ALL:
  case DCOMM_COLL_ALL_TO_ALLV: return grouped(c, a->coll, sb, rb, n, es, dt, a->root, a->v, s);
  case DCOMM_COLL_BARRIER: return ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclInt32, ncclSum, c->nc, s);
  case DCOMM_COLL_SEND: return ncclSend(sb, n, dt, a->root, c->nc, s);
  case DCOMM_COLL_RECV: return ncclRecv(rb, n, dt, a->root, c->nc, s);
  default: return ncclInvalidArgument;
  }
}

static void req_free(struct dnccl_req *r) {
  if (r->ev) (void)cudaEventDestroy(r->ev);
  free(r);
}

int dnccl_post(void *comm, const struct dcomm_coll_args *a, void **out) {
  struct dnccl_comm *c = comm;
  const struct dcomm_host *h = c->ctx->host;
  const char *what = dnccl_coll_name(a->coll);
  char ct[256];
  *out = NULL;
  pthread_mutex_lock(&c->mu);
  int rc = dnccl_state_error(c, what);
  pthread_mutex_unlock(&c->mu);
  if (rc < 0) return rc;

  if (a->coll <= DCOMM_COLL_NONE || a->coll >= DCOMM_COLL_COUNT)
    return h->err(DCOMM_ENOTSUP, "nccl backend: operation %d is not supported", (int)a->coll);
  if ((a->coll == DCOMM_COLL_SEND || a->coll == DCOMM_COLL_RECV) && a->tag != 0)
    return h->err(DCOMM_ENOTSUP, "nccl backend: %s with tag %d is not supported: NCCL point-to-point has no tags (use tag 0)",
                  what, a->tag);
  ncclDataType_t dt = ncclInt32;
  size_t es = 4;
  if (a->coll != DCOMM_COLL_BARRIER && map_dtype(a->dtype, &dt, &es) < 0)
    return h->err(DCOMM_EINVAL, "nccl backend: %s: dtype %d has no NCCL type", what, (int)a->dtype);
  ncclRedOp_t op = ncclSum;
  if (is_reduction(a->coll) && (a->op == DCOMM_BAND || a->op == DCOMM_BOR || a->op == DCOMM_BXOR))
    return h->err(DCOMM_ENOTSUP,
                  "nccl backend: %s with op %s is not supported: NCCL has no bitwise reductions (band, bor, bxor); "
                  "use the tcp backend for them",
                  what, op_text(a->op));
  if (is_reduction(a->coll) && map_op(a->op, &op) < 0)
    return h->err(DCOMM_EINVAL, "nccl backend: %s: reduction op %d has no NCCL op", what, (int)a->op);
  if (has_root(a->coll) && (a->root < 0 || a->root >= c->size))
    return h->err(DCOMM_EINVAL, "nccl backend: %s: %s %d is not a rank of %s (size %d)", what,
                  a->coll == DCOMM_COLL_SEND || a->coll == DCOMM_COLL_RECV ? "peer" : "root", a->root, c->label,
                  c->size);
  if (a->count > SIZE_MAX / es / (size_t)c->size)
    return h->err(DCOMM_EINVAL, "nccl backend: %s: count %zu overflows", what, a->count);
  int vempty = 1; /* all_to_allv: no block to move on this rank */
  if (a->coll == DCOMM_COLL_ALL_TO_ALLV) {
    if (!a->v) return h->err(DCOMM_EINVAL, "nccl backend: %s without its counts", what);
    if (a->v->sendcounts[c->rank] != a->v->recvcounts[c->rank])
      return h->err(DCOMM_EMISMATCH,
                    "nccl backend: mismatched all_to_allv counts: rank %d sends %zu elements to itself "
                    "(sendcounts[%d]) but expects %zu (recvcounts[%d])",
                    c->rank, a->v->sendcounts[c->rank], c->rank, a->v->recvcounts[c->rank], c->rank);
    for (int p = 0; p < c->size && vempty; p++) vempty = !a->v->sendcounts[p] && !a->v->recvcounts[p];
  }

  /* In-place ops (all_reduce, reduce, broadcast) come with sendbuf NULL;
   * send comes with the buffer in both. */
  const void *sb = a->sendbuf;
  void *rb = a->recvbuf;
  if (!sb && (a->coll == DCOMM_COLL_ALL_REDUCE || a->coll == DCOMM_COLL_REDUCE || a->coll == DCOMM_COLL_BROADCAST ||
              a->coll == DCOMM_COLL_SEND))
    sb = rb;
  size_t bytes = a->count * es;
  int nothing = a->coll == DCOMM_COLL_ALL_TO_ALLV ? vempty : a->count == 0 && a->coll != DCOMM_COLL_BARRIER;
  if (!nothing) {
    (void)cudaSetDevice(c->dev);
    if ((rc = check_bufs(c, a, sb, rb, bytes)) < 0) return rc;
  }

  struct dnccl_req *r = calloc(1, sizeof(*r));
  if (!r) return h->err(DCOMM_ENOMEM, "nccl backend: out of memory");
  r->c = c;
  r->coll = a->coll;
  r->count = a->count;
  r->deadline = a->deadline;
  r->posted = h->now();
  if (nothing) { /* every rank has count 0 (all_to_allv: this rank has no block): no NCCL call at all */
    *out = r;
    return 0;
  }
  cudaError_t ce = cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    r->ev = NULL;
    req_free(r);
    snprintf(ct, sizeof(ct), "%s", cudaGetErrorString(ce));
    return h->err(DCOMM_EBACKEND, "nccl backend: %s: cudaEventCreate failed: %s", what, ct);
  }
  pthread_mutex_lock(&c->mu);
  if ((rc = dnccl_state_error(c, what)) < 0) { /* aborted since the first check */
    pthread_mutex_unlock(&c->mu);
    req_free(r);
    return rc;
  }
  /* The op's own stream, else the user's (dcomm_set_stream), else ours. */
  cudaStream_t s = a->stream ? (cudaStream_t)a->stream : c->user_stream ? c->user_stream : c->stream;
  ncclResult_t nr = enqueue(c, a, sb, rb, es, dt, op, s);
  if (nr != ncclSuccess && nr != ncclInProgress) {
    char text[512], why[DNCCL_WHY_LEN];
    dnccl_result_text(c->nc, nr, text, sizeof(text));
    snprintf(why, sizeof(why), "NCCL %s failed: %s", what, text);
    int err = dnccl_map_result(nr);
    dnccl_mark_failed(c, err, why);
    pthread_mutex_unlock(&c->mu);
    req_free(r);
    return h->err(err, "nccl backend: %s failed: %s", what, why);
  }
  pthread_mutex_unlock(&c->mu);
  if (nr == ncclInProgress) { /* non-blocking: enqueued in the background */
    rc = dnccl_poll_ready(c, a->deadline, what);
    if (rc == DCOMM_ETIMEDOUT) {
      char why[DNCCL_WHY_LEN];
      snprintf(why, sizeof(why), "enqueueing %s on %s timed out", what, c->label);
      dnccl_abort_all(DCOMM_EREVOKED, why, DNCCL_STOP_ABORT);
      rc = h->err(DCOMM_ETIMEDOUT,
                  "nccl backend: %s could not be enqueued before its deadline; every NCCL communicator of this "
                  "process was aborted",
                  what);
    }
    if (rc < 0) {
      req_free(r);
      return rc;
    }
  }
  ce = cudaEventRecord(r->ev, s);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    char why[DNCCL_WHY_LEN];
    snprintf(why, sizeof(why), "cudaEventRecord after %s failed: %s", what, cudaGetErrorString(ce));
    pthread_mutex_lock(&c->mu);
    dnccl_mark_failed(c, DCOMM_EBACKEND, why);
    pthread_mutex_unlock(&c->mu);
    req_free(r);
    return h->err(DCOMM_EBACKEND, "nccl backend: %s: %s", what, why);
  }
  *out = r;
  return 0;
}

int dnccl_test(void *req, int *done) {
  struct dnccl_req *r = req;
  struct dnccl_comm *c = r->c;
  const struct dcomm_host *h = c->ctx->host;
  const char *what = dnccl_coll_name(r->coll);
  int rc = 0, fin = 0;
  *done = 0;
  pthread_mutex_lock(&c->mu);
  if (c->aborted || c->failed || !c->nc) {
    rc = dnccl_state_error(c, what);
    fin = 1;
  } else if ((rc = dnccl_async_failure(c, what)) != 0) {
    rc = h->err(rc, "nccl backend: %s failed: %s", what, c->why);
    fin = 1;
  } else if (!r->ev) {
    fin = 1;
  } else {
    cudaError_t e = cudaEventQuery(r->ev);
    if (e == cudaSuccess) {
      fin = 1;
    } else if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      char why[DNCCL_WHY_LEN];
      snprintf(why, sizeof(why), "CUDA error while waiting for %s: %s [%s]", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
      dnccl_mark_failed(c, DCOMM_EBACKEND, why);
      rc = h->err(DCOMM_EBACKEND, "nccl backend: %s failed: %s", what, why);
      fin = 1;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (fin) {
    *done = 1;
    req_free(r);
  }
  return rc;
}

int dnccl_wait(void *req) {
  struct dnccl_req *r = req;
  struct dnccl_comm *c = r->c;
  const struct dcomm_host *h = c->ctx->host;
  long us = 0;
  for (int polls = 0;; polls++) {
    int done = 0;
    int rc = dnccl_test(r, &done);
    if (done) return rc; /* r is freed */
    if (r->deadline > 0 && h->now() >= r->deadline) break;
    if (polls < 64) { /* short ops finish within microseconds */
      sched_yield();
    } else {
      us = us ? (us < 1000 ? us * 2 : 1000) : 20;
      dnccl_sleep_us(us);
    }
  }
  const char *what = dnccl_coll_name(r->coll);
  double waited = h->now() - r->posted;
  size_t count = r->count;
  char why[DNCCL_WHY_LEN];
  snprintf(why, sizeof(why), "%s on %s timed out after %.3f s, so every NCCL communicator of this process was aborted",
           what, c->label, waited);
  dnccl_abort_all(DCOMM_EREVOKED, why, DNCCL_STOP_ABORT);
  req_free(r);
  return h->err(DCOMM_ETIMEDOUT,
                "nccl backend: %s (count %zu) timed out after %.3f s; every NCCL communicator of this process was "
                "aborted",
                what, count, waited);
}

int dnccl_set_stream(void *comm, void *stream) {
  struct dnccl_comm *c = comm;
  if (!c) return DCOMM_EINVAL;
  const struct dcomm_host *h = c->ctx->host;
#if CUDART_VERSION >= 12080 /* cudaStreamGetDevice */
  if (stream) {
    /* A stream of another GPU would make every op fail later, far from
     * the cause; refuse it here. */
    int dev = -1;
    cudaError_t e = cudaStreamGetDevice((cudaStream_t)stream, &dev);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return h->err(DCOMM_EINVAL, "nccl backend: %p is not a usable CUDA stream (cudaStreamGetDevice: %s)", stream,
                    cudaGetErrorString(e));
    }
    if (dev != c->dev)
      return h->err(DCOMM_EINVAL, "nccl backend: the stream belongs to CUDA device %d, but %s uses device %d", dev,
                    c->label, c->dev);
  }
#endif
  pthread_mutex_lock(&c->mu);
  c->user_stream = (cudaStream_t)stream;
  pthread_mutex_unlock(&c->mu);
  DNCCL_LOG(h, DEBUG, "nccl backend: %s: ops now run on %s", c->label, stream ? "the caller's stream" : "its own stream");
  return 0;
}
