/*
 * tcp_shrink.c: comm_shrink of the tcp backend. The parent's links were
 * shut down by its abort (or are by its destroy), so nothing of them is
 * reused: the survivors make fresh links among themselves through
 * comm_create (the ring neighbours', the others when first used), on
 * the listener the context already has and with the addresses it already
 * holds. What this saves over a rebuild is the
 * backend's finalize and init (a new listener), the publication of the new
 * addresses and everyone's re-read of all of them in the store.
 *
 * ctx->addrs is indexed by world rank, and a shrink of the world renumbers
 * the world ranks. The core shrinks the world communicator first, then
 * the sub-groups (dcomm_plugin.h), and the world's shrink carries the
 * whole mapping: survivor j of the parent was world rank
 * parent->world_ranks[i] (i its old rank) and is spec->world_ranks[j]. So
 * that shrink, recognised as the one of the communicator whose numbering
 * the table follows (ctx->addrs_comm: the world, the first communicator
 * created), rewrites the table in the new numbering once, and hands the
 * role to the new world; every later shrink or comm_create indexes the
 * table with new world ranks, as it indexes it with the spec's. Keeping
 * the mapping in the context rather than in the spec leaves the ABI as it
 * is, and a comm_create after the recovery (dcomm_new_group) finds the
 * table right.
 *
 * DCOMM_TCP_SHRINK=0 says DCOMM_ENOTSUP (the core rebuilds instead);
 * DCOMM_TCP_SHRINK=fail:PREFIX, a test hook, fails the shrink of every
 * communicator whose label starts with PREFIX ("world", "group").
 */
#include "config.h"
#include "tcp.h"

#include <stdlib.h>
#include <string.h>

/* Checks the exclude list against the spec and marks the survivors. */
static int check_plan(struct tcp_comm *p, const int *exclude, int nexclude, const struct dcomm_comm_spec *spec,
                      char *keep) {
  const struct dcomm_host *h = p->ctx->host;
  memset(keep, 1, (size_t)p->size);
  for (int i = 0; i < nexclude; i++) {
    int r = exclude[i];
    if (r < 0 || r >= p->size || !keep[r] || r == p->rank)
      return h->err(DCOMM_EINVAL, "tcp %s: cannot exclude rank %d (rank %d of %d): %s", p->label, r, p->rank, p->size,
                    r < 0 || r >= p->size ? "not a rank of the communicator"
                    : r == p->rank        ? "the caller itself"
                                          : "listed twice");
    keep[r] = 0;
  }
  int below = 0;
  for (int i = 0; i < p->rank; i++) below += !keep[i];
  if (nexclude < 1 || spec->size != p->size - nexclude || spec->rank != p->rank - below)
    return h->err(DCOMM_EINVAL, "tcp %s: shrinking rank %d of %d by %d rank(s) does not give rank %d of %d", p->label,
                  p->rank, p->size, nexclude, spec->rank, spec->size);
  return 0;
}

/* The world's shrink: the address table in the new world numbering. */
static int renumber_addrs(struct tcp_comm *p, const char *keep, const struct dcomm_comm_spec *spec) {
  struct tcp_ctx *ctx = p->ctx;
  struct tcp_addr *na = calloc((size_t)spec->size, sizeof(*na));
  if (!na) return ctx->host->err(DCOMM_ENOMEM, "tcp: out of memory");
  for (int i = 0, j = 0; i < p->size; i++) {
    if (!keep[i]) continue;
    int to = spec->world_ranks[j++];
    if (to < 0 || to >= spec->size) {
      free(na);
      return ctx->host->err(DCOMM_EINVAL, "tcp %s: the shrunk world names world rank %d of %d", p->label, to,
                            spec->size);
    }
    na[to] = ctx->addrs[p->world_ranks[i]];
  }
  pthread_mutex_lock(&ctx->links_lock); /* a dial copies its entry under it */
  free(ctx->addrs);
  ctx->addrs = na;
  pthread_mutex_unlock(&ctx->links_lock);
  ctx->addrs_comm = spec->comm_id;
  tcp_cpus_forget(ctx);
  return 0;
}

int tcp_comm_shrink(void *vc, const int *exclude, int nexclude, const struct dcomm_comm_spec *spec, void **out) {
  struct tcp_comm *p = vc;
  struct tcp_ctx *ctx = p->ctx;
  const struct dcomm_host *h = ctx->host;
  *out = NULL;
  const char *mode = h->param("DCOMM_TCP_SHRINK");
  if (mode && !strcmp(mode, "0"))
    return h->err(DCOMM_ENOTSUP, "tcp %s: comm_shrink is off (DCOMM_TCP_SHRINK=0)", p->label);
  if (mode && !strncmp(mode, "fail:", 5) && spec->label && !strncmp(spec->label, mode + 5, strlen(mode + 5)))
    return h->err(DCOMM_EPROTO, "tcp %s: shrink failed on purpose (DCOMM_TCP_SHRINK=%s)", p->label, mode);
  char *keep = malloc((size_t)p->size);
  if (!keep) return h->err(DCOMM_ENOMEM, "tcp: out of memory");
  int rc = check_plan(p, exclude, nexclude, spec, keep);
  if (rc == 0 && p->id == ctx->addrs_comm) rc = renumber_addrs(p, keep, spec);
  free(keep);
  if (rc == 0) rc = dcomm__backend_tcp.comm_create(ctx, spec, out);
  if (rc == 0) TCP_LOG(ctx, INFO, "tcp %s: shrunk into %s without %d rank(s)", p->label, spec->label, nexclude);
  return rc;
}
