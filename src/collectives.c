/*
 * collectives.c: the public collective calls. Each one checks its arguments
 * (a bad call fails locally with DCOMM_EINVAL and a message, before any
 * byte moves), stamps the op with the group's sequence number and deadline,
 * and runs it through the backend's non-blocking table (post + wait).
 * dcomm_set_stream hands a GPU backend the user's stream.
 */
#include "config.h"
#include "world.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "log.h"
#include "reduce.h"
#include "sock.h"

int dcomm__run_op(struct dcomm_group *grp, struct dcomm_coll_args *a, const char *what) {
  void *req = NULL;
  if (a->coll != DCOMM_COLL_SEND && a->coll != DCOMM_COLL_RECV) a->seq = ++grp->seq;
  a->deadline = dcomm__now() + grp->timeout;
  int (*run)(void *, const struct dcomm_coll_args *) = DCOMM_BACKEND_OP(dcomm__w.be, run);
  int rc;
  if (run) {
    rc = run(grp->bcomm, a);
  } else {
    rc = dcomm__w.be->post(grp->bcomm, a, &req);
    if (rc == 0) rc = dcomm__w.be->wait(req);
  }
  if (rc < 0) {
    dcomm__err_ctx(rc, "%s on %s (rank %d of %d)", what, grp->label, grp->rank, grp->size);
    DCOMM_LOG(WARN, COLL, "%s", dcomm_last_error());
  }
  return rc;
}

/* Common checks; n_bufs_elems is the element count of the largest buffer. */
static int check(dcomm_group_t g, struct dcomm_group **grp, const char *what, size_t count, dcomm_dtype_t dt,
                 size_t per_rank_factor) {
  DCOMM_CHECK(dcomm__group_resolve(g, 1, grp));
  if (!dcomm__dtype_valid((int)dt)) return dcomm__err(DCOMM_EINVAL, "%s: invalid dtype %d", what, (int)dt);
  size_t es = dcomm_dtype_size(dt);
  if (count > SIZE_MAX / es / (per_rank_factor ? per_rank_factor : 1))
    return dcomm__err(DCOMM_EINVAL, "%s: count %zu overflows the address space", what, count);
  return 0;
}

static int check_root(const struct dcomm_group *grp, const char *what, const char *name, int root) {
  if (root < 0 || root >= grp->size)
    return dcomm__err(DCOMM_EINVAL, "%s: %s %d is not a rank of %s (size %d)", what, name, root, grp->label, grp->size);
  return 0;
}

static int check_op(const char *what, dcomm_op_t op) {
  if (!dcomm__op_valid((int)op)) return dcomm__err(DCOMM_EINVAL, "%s: invalid reduction op %d", what, (int)op);
  return 0;
}

static int need_buf(const char *what, const char *name, const void *p, size_t count) {
  if (count > 0 && !p) return dcomm__err(DCOMM_EINVAL, "%s: %s is NULL with count %zu", what, name, count);
  return 0;
}

int dcomm_all_reduce(void *buf, size_t count, dcomm_dtype_t dt, dcomm_op_t op, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(check(g, &grp, "all_reduce", count, dt, 1));
  DCOMM_CHECK(check_op("all_reduce", op));
  DCOMM_CHECK(need_buf("all_reduce", "buf", buf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_REDUCE, .recvbuf = buf, .count = count, .dtype = dt, .op = op};
  return dcomm__run_op(grp, &a, "all_reduce");
}

int dcomm_reduce(void *buf, size_t count, dcomm_dtype_t dt, dcomm_op_t op, int root, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(check(g, &grp, "reduce", count, dt, 1));
  DCOMM_CHECK(check_op("reduce", op));
  DCOMM_CHECK(check_root(grp, "reduce", "root", root));
  DCOMM_CHECK(need_buf("reduce", "buf", buf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_REDUCE, .recvbuf = buf, .count = count, .dtype = dt, .op = op,
                              .root = root};
  return dcomm__run_op(grp, &a, "reduce");
}

int dcomm_broadcast(void *buf, size_t count, dcomm_dtype_t dt, int root, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(check(g, &grp, "broadcast", count, dt, 1));
  DCOMM_CHECK(check_root(grp, "broadcast", "root", root));
  DCOMM_CHECK(need_buf("broadcast", "buf", buf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_BROADCAST, .recvbuf = buf, .count = count, .dtype = dt, .root = root};
  return dcomm__run_op(grp, &a, "broadcast");
}

int dcomm_all_gather(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  DCOMM_CHECK(check(g, &grp, "all_gather", count, dt, (size_t)grp->size));
  DCOMM_CHECK(need_buf("all_gather", "sendbuf", sendbuf, count));
  DCOMM_CHECK(need_buf("all_gather", "recvbuf", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_GATHER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                              .dtype = dt};
  return dcomm__run_op(grp, &a, "all_gather");
}

int dcomm_gather(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, int root, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  DCOMM_CHECK(check(g, &grp, "gather", count, dt, (size_t)grp->size));
  DCOMM_CHECK(check_root(grp, "gather", "root", root));
  DCOMM_CHECK(need_buf("gather", "sendbuf", sendbuf, count));
  if (grp->rank == root) DCOMM_CHECK(need_buf("gather", "recvbuf (at the root)", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_GATHER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                              .dtype = dt, .root = root};
  return dcomm__run_op(grp, &a, "gather");
}

int dcomm_scatter(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, int root, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  DCOMM_CHECK(check(g, &grp, "scatter", count, dt, (size_t)grp->size));
  DCOMM_CHECK(check_root(grp, "scatter", "root", root));
  if (grp->rank == root) DCOMM_CHECK(need_buf("scatter", "sendbuf (at the root)", sendbuf, count));
  DCOMM_CHECK(need_buf("scatter", "recvbuf", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                              .dtype = dt, .root = root};
  return dcomm__run_op(grp, &a, "scatter");
}

int dcomm_reduce_scatter(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, dcomm_op_t op,
                         dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  DCOMM_CHECK(check(g, &grp, "reduce_scatter", count, dt, (size_t)grp->size));
  DCOMM_CHECK(check_op("reduce_scatter", op));
  DCOMM_CHECK(need_buf("reduce_scatter", "sendbuf", sendbuf, count));
  DCOMM_CHECK(need_buf("reduce_scatter", "recvbuf", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                              .count = count, .dtype = dt, .op = op};
  return dcomm__run_op(grp, &a, "reduce_scatter");
}

int dcomm_all_to_all(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  DCOMM_CHECK(check(g, &grp, "all_to_all", count, dt, (size_t)grp->size));
  DCOMM_CHECK(need_buf("all_to_all", "sendbuf", sendbuf, count));
  DCOMM_CHECK(need_buf("all_to_all", "recvbuf", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_TO_ALL, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                              .dtype = dt};
  return dcomm__run_op(grp, &a, "all_to_all");
}

static int p2p(enum dcomm_coll coll, const char *what, void *buf, size_t count, dcomm_dtype_t dt, int peer, int tag,
               dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(check(g, &grp, what, count, dt, 1));
  DCOMM_CHECK(check_root(grp, what, "peer", peer));
  if (peer == grp->rank) return dcomm__err(DCOMM_EINVAL, "%s: peer %d is this rank itself", what, peer);
  if (tag < 0) return dcomm__err(DCOMM_EINVAL, "%s: tag %d is negative", what, tag);
  DCOMM_CHECK(need_buf(what, "buf", buf, count));
  struct dcomm_coll_args a = {.coll = coll, .sendbuf = buf, .recvbuf = buf, .count = count, .dtype = dt,
                              .root = peer, .tag = tag};
  return dcomm__run_op(grp, &a, what);
}

int dcomm_send(const void *buf, size_t count, dcomm_dtype_t dt, int peer, int tag, dcomm_group_t g) {
  return p2p(DCOMM_COLL_SEND, "send", (void *)(uintptr_t)buf, count, dt, peer, tag, g);
}

int dcomm_recv(void *buf, size_t count, dcomm_dtype_t dt, int peer, int tag, dcomm_group_t g) {
  return p2p(DCOMM_COLL_RECV, "recv", buf, count, dt, peer, tag, g);
}

typedef int (*probe_fn)(void *, int, int, double, int *, size_t *);

static int need_probe(const char *what, probe_fn *probe) {
  *probe = DCOMM_BACKEND_OP(dcomm__w.be, probe);
  if (!*probe)
    return dcomm__err(DCOMM_ENOTSUP, "%s: the %s backend cannot probe for point-to-point messages (no probe op)", what,
                      dcomm__w.be->name);
  return 0;
}

static int probe_failed(struct dcomm_group *grp, int rc, const char *what) {
  dcomm__err_ctx(rc, "%s on %s (rank %d of %d)", what, grp->label, grp->rank, grp->size);
  DCOMM_LOG(WARN, COLL, "%s", dcomm_last_error());
  return rc;
}

int dcomm_probe(int peer, int tag, dcomm_group_t g, double timeout, int *src, size_t *nbytes) {
  struct dcomm_group *grp;
  probe_fn probe;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  if (peer != DCOMM_ANY_SOURCE) {
    DCOMM_CHECK(check_root(grp, "probe", "peer", peer));
    if (peer == grp->rank) return dcomm__err(DCOMM_EINVAL, "probe: peer %d is this rank itself", peer);
  }
  if (tag < 0) return dcomm__err(DCOMM_EINVAL, "probe: tag %d is negative", tag);
  if (!(timeout >= 0) || isinf(timeout))
    return dcomm__err(DCOMM_EINVAL, "probe: timeout must be 0 or more seconds and finite, got %g", timeout);
  DCOMM_CHECK(need_probe("probe", &probe));
  int s = -1;
  size_t nb = 0;
  int rc = probe(grp->bcomm, peer, tag, dcomm__now() + timeout, &s, &nb);
  if (rc < 0) return probe_failed(grp, rc, "probe");
  if (rc > 0) {
    if (src) *src = s;
    if (nbytes) *nbytes = nb;
    return 1;
  }
  return 0;
}

int dcomm_recv_any(void *buf, size_t count, dcomm_dtype_t dt, int tag, dcomm_group_t g, int *src) {
  struct dcomm_group *grp;
  probe_fn probe;
  DCOMM_CHECK(check(g, &grp, "recv_any", count, dt, 1));
  if (tag < 0) return dcomm__err(DCOMM_EINVAL, "recv_any: tag %d is negative", tag);
  if (grp->size < 2) return dcomm__err(DCOMM_EINVAL, "recv_any: %s has no other member to receive from", grp->label);
  DCOMM_CHECK(need_buf("recv_any", "buf", buf, count));
  DCOMM_CHECK(need_probe("recv_any", &probe));
  int s = -1;
  size_t nb = 0;
  int rc = probe(grp->bcomm, DCOMM_ANY_SOURCE, tag, dcomm__now() + grp->timeout, &s, &nb);
  if (rc < 0) return probe_failed(grp, rc, "recv_any");
  if (rc == 0) {
    dcomm__err(DCOMM_ETIMEDOUT, "recv_any on %s (rank %d of %d): no message with tag %d from any member within %g s "
               "(the group's timeout)", grp->label, grp->rank, grp->size, tag, grp->timeout);
    DCOMM_LOG(WARN, COLL, "%s", dcomm_last_error());
    return DCOMM_ETIMEDOUT;
  }
  /* The message is queued in full: this recv takes it at once, and
   * reports a size or dtype mismatch as dcomm_recv does. */
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_RECV, .sendbuf = buf, .recvbuf = buf, .count = count, .dtype = dt,
                              .root = s, .tag = tag};
  rc = dcomm__run_op(grp, &a, "recv_any");
  if (rc == 0 && src) *src = s;
  return rc;
}

int dcomm_barrier(dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_BARRIER, .dtype = DCOMM_UINT8};
  return dcomm__run_op(grp, &a, "barrier");
}

int dcomm_set_stream(dcomm_group_t g, void *cuda_stream) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, 1, &grp));
  int (*set)(void *, void *) = DCOMM_BACKEND_OP(dcomm__w.be, comm_set_stream);
  if (!set) return dcomm__err(DCOMM_ENOTSUP, "dcomm_set_stream: the %s backend has no streams", dcomm__w.be->name);
  int rc = set(grp->bcomm, cuda_stream);
  if (rc < 0) return dcomm__err_ctx(rc, "dcomm_set_stream on %s", grp->label);
  return 0;
}
