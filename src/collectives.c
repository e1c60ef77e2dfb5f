/*
 * collectives.c: the public collective calls. Each one checks its arguments
 * (a bad call fails locally with DCOMM_EINVAL and a message, before any
 * byte moves), stamps the op with the group's sequence number and deadline,
 * and runs it through the backend's non-blocking table (post + wait).
 * dcomm_set_stream hands a GPU backend the user's stream. A failed call's
 * sentence goes to the caller (dcomm_last_error) and to the log at INFO
 * only: WARN is kept for what the caller cannot see.
 */
#include "config.h"
#include "world.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
    DCOMM_LOG(INFO, COLL, "%s", dcomm_last_error());
  }
  return rc;
}

/* Common checks; n_bufs_elems is the element count of the largest buffer. */
static int check(dcomm_group_t g, struct dcomm_group **grp, const char *what, size_t count, dcomm_dtype_t dt,
                 size_t per_rank_factor) {
  DCOMM_CHECK(dcomm__group_resolve(g, what, grp));
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

static int check_op(const char *what, dcomm_op_t op, dcomm_dtype_t dt) {
  if (!dcomm__op_valid((int)op)) return dcomm__err(DCOMM_EINVAL, "%s: invalid reduction op %d", what, (int)op);
  if (!dcomm__op_dtype_ok((int)op, (int)dt))
    return dcomm__err(DCOMM_EINVAL, "%s: op %s is not defined for dtype %s (bitwise ops take integer dtypes only)",
                      what, dcomm__op_name((int)op), dcomm__dtype_name((int)dt));
  return 0;
}

static int need_buf(const char *what, const char *name, const void *p, size_t count) {
  if (count > 0 && !p) return dcomm__err(DCOMM_EINVAL, "%s: %s is NULL with count %zu", what, name, count);
  return 0;
}

int dcomm_all_reduce(void *buf, size_t count, dcomm_dtype_t dt, dcomm_op_t op, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(check(g, &grp, "all_reduce", count, dt, 1));
  DCOMM_CHECK(check_op("all_reduce", op, dt));
  DCOMM_CHECK(need_buf("all_reduce", "buf", buf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_REDUCE, .recvbuf = buf, .count = count, .dtype = dt, .op = op};
  return dcomm__run_op(grp, &a, "all_reduce");
}

int dcomm_reduce(void *buf, size_t count, dcomm_dtype_t dt, dcomm_op_t op, int root, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(check(g, &grp, "reduce", count, dt, 1));
  DCOMM_CHECK(check_op("reduce", op, dt));
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
  DCOMM_CHECK(dcomm__group_resolve(g, "all_gather", &grp));
  DCOMM_CHECK(check(g, &grp, "all_gather", count, dt, (size_t)grp->size));
  DCOMM_CHECK(need_buf("all_gather", "sendbuf", sendbuf, count));
  DCOMM_CHECK(need_buf("all_gather", "recvbuf", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_GATHER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                              .dtype = dt};
  return dcomm__run_op(grp, &a, "all_gather");
}

int dcomm_gather(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, int root, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, "gather", &grp));
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
  DCOMM_CHECK(dcomm__group_resolve(g, "scatter", &grp));
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
  DCOMM_CHECK(dcomm__group_resolve(g, "reduce_scatter", &grp));
  DCOMM_CHECK(check(g, &grp, "reduce_scatter", count, dt, (size_t)grp->size));
  DCOMM_CHECK(check_op("reduce_scatter", op, dt));
  DCOMM_CHECK(need_buf("reduce_scatter", "sendbuf", sendbuf, count));
  DCOMM_CHECK(need_buf("reduce_scatter", "recvbuf", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                              .count = count, .dtype = dt, .op = op};
  return dcomm__run_op(grp, &a, "reduce_scatter");
}

int dcomm_all_to_all(const void *sendbuf, void *recvbuf, size_t count, dcomm_dtype_t dt, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, "all_to_all", &grp));
  DCOMM_CHECK(check(g, &grp, "all_to_all", count, dt, (size_t)grp->size));
  DCOMM_CHECK(need_buf("all_to_all", "sendbuf", sendbuf, count));
  DCOMM_CHECK(need_buf("all_to_all", "recvbuf", recvbuf, count));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_TO_ALL, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                              .dtype = dt};
  return dcomm__run_op(grp, &a, "all_to_all");
}

/* A block of an all_to_allv, in bytes from its buffer's start. */
struct vblock {
  size_t off, len;
  int rank;
};

static int vblock_cmp(const void *x, const void *y) {
  const struct vblock *a = x, *b = y;
  return a->off < b->off ? -1 : a->off > b->off ? 1 : a->rank - b->rank;
}

/* Checks one side's counts and displacements and fills b[0..n) with its
 * non-empty blocks in bytes (*nb of them); *extent: end of the last one. */
static int vside(const char *side, const size_t *counts, const char *dname, const size_t *displs, int n, size_t es,
                 struct vblock *b, int *nb, size_t *extent) {
  *nb = 0;
  *extent = 0;
  for (int j = 0; j < n; j++) {
    if (displs[j] > SIZE_MAX - counts[j] || displs[j] + counts[j] > SIZE_MAX / es)
      return dcomm__err(DCOMM_EINVAL, "all_to_allv: %s[%d] %zu + %s[%d] %zu elements overflow the address space",
                        dname, j, displs[j], side, j, counts[j]);
    if (!counts[j]) continue;
    b[*nb] = (struct vblock){.off = displs[j] * es, .len = counts[j] * es, .rank = j};
    if (b[*nb].off + b[*nb].len > *extent) *extent = b[*nb].off + b[*nb].len;
    (*nb)++;
  }
  return 0;
}

/* Whether the byte range [p, p + len) overlaps any of the sorted,
 * disjoint blocks rb[0..nr) of buffer base; its rank in *who. */
static int hits_blocks(const char *p, size_t len, const char *base, const struct vblock *rb, int nr, int *who) {
  int lo = 0, hi = nr; /* the first block that ends after p */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (base + rb[mid].off + rb[mid].len <= p) lo = mid + 1;
    else hi = mid;
  }
  if (lo < nr && base + rb[lo].off < p + len) {
    *who = rb[lo].rank;
    return 1;
  }
  return 0;
}

/*
 * all_to_allv's checks, all before any byte moves: the four arrays, each
 * block's end in bytes, the buffers of non-empty blocks, receive blocks
 * that overlap each other, and send blocks that overlap a receive block
 * (the exchange would overwrite data not yet sent).
 */
static int check_vlayout(const struct dcomm_group *grp, const void *sendbuf, const struct dcomm_vlayout *v,
                         const void *recvbuf, dcomm_dtype_t dt) {
  const char *names[4] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
  const size_t *arrays[4] = {v->sendcounts, v->sdispls, v->recvcounts, v->rdispls};
  for (int i = 0; i < 4; i++)
    if (!arrays[i]) return dcomm__err(DCOMM_EINVAL, "all_to_allv: %s is NULL", names[i]);
  int n = grp->size, ns, nr, rc;
  size_t es = dcomm_dtype_size(dt), sext, rext;
  struct vblock *sb = malloc(2 * (size_t)n * sizeof(*sb)), *rb = sb + n;
  if (!sb) return dcomm__err(DCOMM_ENOMEM, "all_to_allv: out of memory checking %d blocks", n);
  if ((rc = vside("sendcounts", v->sendcounts, "sdispls", v->sdispls, n, es, sb, &ns, &sext)) < 0 ||
      (rc = vside("recvcounts", v->recvcounts, "rdispls", v->rdispls, n, es, rb, &nr, &rext)) < 0)
    goto out;
  if (ns && !sendbuf) {
    rc = dcomm__err(DCOMM_EINVAL, "all_to_allv: sendbuf is NULL with %zu elements to send to rank %d",
                    v->sendcounts[sb[0].rank], sb[0].rank);
    goto out;
  }
  if (nr && !recvbuf) {
    rc = dcomm__err(DCOMM_EINVAL, "all_to_allv: recvbuf is NULL with %zu elements to receive from rank %d",
                    v->recvcounts[rb[0].rank], rb[0].rank);
    goto out;
  }
  if ((ns && (uintptr_t)sendbuf > UINTPTR_MAX - sext) || (nr && (uintptr_t)recvbuf > UINTPTR_MAX - rext)) {
    rc = dcomm__err(DCOMM_EINVAL, "all_to_allv: the %s blocks run past the end of the address space",
                    ns && (uintptr_t)sendbuf > UINTPTR_MAX - sext ? "send" : "receive");
    goto out;
  }
  qsort(rb, (size_t)nr, sizeof(*rb), vblock_cmp);
  for (int i = 1; i < nr; i++)
    if (rb[i].off < rb[i - 1].off + rb[i - 1].len) {
      int a = rb[i - 1].rank, b = rb[i].rank;
      rc = dcomm__err(DCOMM_EINVAL,
                      "all_to_allv: the receive blocks of ranks %d (rdispls %zu, %zu elements) and %d (rdispls %zu, "
                      "%zu elements) overlap",
                      a, v->rdispls[a], v->recvcounts[a], b, v->rdispls[b], v->recvcounts[b]);
      goto out;
    }
  for (int i = 0; i < ns && nr; i++) {
    int who;
    if (hits_blocks((const char *)sendbuf + sb[i].off, sb[i].len, recvbuf, rb, nr, &who)) {
      int j = sb[i].rank;
      rc = dcomm__err(DCOMM_EINVAL,
                      "all_to_allv: the send block for rank %d (sdispls %zu, %zu elements) overlaps the receive "
                      "block from rank %d (rdispls %zu, %zu elements); all_to_allv does not work in place",
                      j, v->sdispls[j], v->sendcounts[j], who, v->rdispls[who], v->recvcounts[who]);
      goto out;
    }
  }
out:
  free(sb);
  return rc;
}

int dcomm_all_to_allv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                      const size_t *recvcounts, const size_t *rdispls, dcomm_dtype_t dt, dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(check(g, &grp, "all_to_allv", 0, dt, 1));
  struct dcomm_vlayout v = {.sendcounts = sendcounts, .sdispls = sdispls, .recvcounts = recvcounts,
                            .rdispls = rdispls};
  DCOMM_CHECK(check_vlayout(grp, sendbuf, &v, recvbuf, dt));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_TO_ALLV, .sendbuf = sendbuf, .recvbuf = recvbuf, .dtype = dt,
                              .v = &v};
  return dcomm__run_op(grp, &a, "all_to_allv");
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
  DCOMM_LOG(INFO, COLL, "%s", dcomm_last_error());
  return rc;
}

int dcomm_probe(int peer, int tag, dcomm_group_t g, double timeout, int *src, size_t *nbytes) {
  struct dcomm_group *grp;
  probe_fn probe;
  DCOMM_CHECK(dcomm__group_resolve(g, "probe", &grp));
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
    DCOMM_LOG(INFO, COLL, "%s", dcomm_last_error());
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
  DCOMM_CHECK(dcomm__group_resolve(g, "barrier", &grp));
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_BARRIER, .dtype = DCOMM_UINT8};
  return dcomm__run_op(grp, &a, "barrier");
}

int dcomm_set_stream(dcomm_group_t g, void *cuda_stream) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, "set_stream", &grp));
  int (*set)(void *, void *) = DCOMM_BACKEND_OP(dcomm__w.be, comm_set_stream);
  if (!set) return dcomm__err(DCOMM_ENOTSUP, "dcomm_set_stream: the %s backend has no streams", dcomm__w.be->name);
  int rc = set(grp->bcomm, cuda_stream);
  if (rc < 0) return dcomm__err_ctx(rc, "dcomm_set_stream on %s", grp->label);
  return 0;
}
