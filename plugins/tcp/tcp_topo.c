/*
 * tcp_topo.c: where a communicator's members sit. From the host identity
 * each member published in the world's directory (tcp_conn.c), a
 * communicator learns how many hosts it spans, which members share this
 * rank's host and which member leads each host (its lowest rank). The
 * hierarchical all_reduce (tcp_algos.c) runs its host-local phases over
 * the first list and the exchange between hosts over the second, so the
 * bytes that cross hosts do not grow with the ranks per host.
 *
 * Cost: one sort of the members by (host, rank), O(n log n) at creation
 * (tcp_links_open builds it before the links, whose shared-memory ring
 * size depends on the members on this host); memory: this host's members
 * and one leader per host.
 */
#include "config.h"
#include "tcp.h"

#include <stdlib.h>
#include <string.h>

struct member {
  const char *host;
  int rank;
};

static int by_host_rank(const void *x, const void *y) {
  const struct member *a = x, *b = y;
  int d = strcmp(a->host, b->host);
  return d ? d : (a->rank > b->rank) - (a->rank < b->rank);
}

static int by_value(const void *x, const void *y) {
  int a = *(const int *)x, b = *(const int *)y;
  return (a > b) - (a < b);
}

void tcp_topo_free(struct tcp_topo *t) {
  free(t->local);
  free(t->leaders);
  memset(t, 0, sizeof(*t));
}

int tcp_topo_build(struct tcp_comm *c) {
  struct tcp_ctx *ctx = c->ctx;
  struct tcp_topo *t = &c->topo;
  int n = c->size;
  struct member *m = malloc(sizeof(*m) * (size_t)n);
  t->local = malloc(sizeof(int) * (size_t)n);
  t->leaders = malloc(sizeof(int) * (size_t)n);
  if (!m || !t->local || !t->leaders) {
    free(m);
    tcp_topo_free(t);
    return ctx->host->err(DCOMM_ENOMEM, "tcp %s: out of memory for the host map", c->label);
  }
  for (int j = 0; j < n; j++)
    m[j] = (struct member){j == c->rank ? ctx->host_id : ctx->addrs[c->world_ranks[j]].host, j};
  qsort(m, (size_t)n, sizeof(*m), by_host_rank);
  t->nhosts = t->nlocal = 0;
  for (int j = 0; j < n; j++) {
    if (j == 0 || strcmp(m[j].host, m[j - 1].host)) t->leaders[t->nhosts++] = m[j].rank;
    if (!strcmp(m[j].host, ctx->host_id)) t->local[t->nlocal++] = m[j].rank; /* ascending: sorted by rank within a host */
  }
  free(m);
  int *p = realloc(t->local, sizeof(int) * (size_t)t->nlocal); /* n ints each were room for the worst case */
  if (p) t->local = p;
  if ((p = realloc(t->leaders, sizeof(int) * (size_t)t->nhosts))) t->leaders = p;
  qsort(t->leaders, (size_t)t->nhosts, sizeof(int), by_value);
  t->local_me = t->leader_me = -1;
  for (int i = 0; i < t->nlocal; i++)
    if (t->local[i] == c->rank) t->local_me = i;
  for (int i = 0; i < t->nhosts; i++)
    if (t->leaders[i] == c->rank) t->leader_me = i;
  TCP_LOG(ctx, INFO, "tcp %s: %d members on %d host%s, %d on this one (led by rank %d)", c->label, n, t->nhosts,
          t->nhosts == 1 ? "" : "s", t->nlocal, t->local[0]);
  return 0;
}
