/*
 * tcp_algos.c: the collective algorithms of the tcp backend, each a
 * sequence of tcp_xfer steps:
 *   all_reduce      recursive doubling for small messages (latency); for
 *                   large ones (bandwidth) the ring reduce-scatter +
 *                   all-gather, or where the ring's steps are many and
 *                   small (many ranks) recursive halving + doubling (Rabenseifner:
 *                   2 log2 n steps instead of 2(n - 1), the same bytes);
 *                   small ones hierarchical when the members span several
 *                   hosts (host-local tree, doubling between the hosts'
 *                   leaders, host-local broadcast: tcp_topo.c's map);
 *                   every rank ends with bit-identical results;
 *   reduce          binomial tree into the root (receives reduce in place);
 *   broadcast       binomial tree from the root for small messages, a
 *                   pipelined chain (segments of DCOMM_TCP_CHUNK_SIZE
 *                   forwarded while the next one arrives) for large ones;
 *   all_gather      direct (pairwise) when every member shares the host,
 *                   else ring;
 *   reduce_scatter  ring that sums into two block-sized accumulators,
 *                   out of place (an in-place call works on a copy);
 *   gather / scatter / all_to_all: direct exchanges progressed together;
 *   all_to_allv     the same pairwise exchange with a block per pair from
 *                   the counts and displacements; an empty block still
 *                   goes as an empty frame, so a receiver that expects
 *                   data from it gets DCOMM_EMISMATCH, never a hang;
 *   barrier:        dissemination.
 */
#include "config.h"
#include "tcp.h"

#include <stdlib.h>
#include <string.h>

void *tcp_scratch(struct tcp_comm *c, size_t len) {
  if (len <= c->tmp_cap) return c->tmp;
  void *p = realloc(c->tmp, len);
  if (!p) return NULL;
  c->tmp = p;
  c->tmp_cap = len;
  return p;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* The members a tree or doubling algorithm runs over: index i is rank
 * m[i] of the communicator (m NULL: rank i), me this rank's index. The
 * whole communicator is one span; the hierarchical all_reduce runs the
 * same code over a host's members and over the hosts' leaders. */
struct span {
  const int *m;
  int n, me;
};

static int at(const struct span *s, int i) { return s->m ? s->m[i] : i; }

static struct span whole(const struct tcp_comm *c) { return (struct span){NULL, c->size, c->rank}; }

/* Element range of segment i when count elements are cut into n pieces. */
static void seg(size_t count, int n, int i, size_t *off, size_t *cnt) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, ui = (size_t)i;
  *off = ui * base + (ui < rem ? ui : rem);
  *cnt = base + (ui < rem ? 1 : 0);
}

/* Flags of a step: the receive reduces; the data sent was written by this
 * rank earlier in the same call (see tcp_xop.fwd). */
#define XF_REDUCE 1
#define XF_FWD 2

static int send1(struct tcp_comm *c, const struct dcomm_coll_args *a, int to, const void *buf, size_t len, int fwd) {
  struct tcp_xop op = {.peer = to, .is_send = 1, .sbuf = buf, .len = len, .fwd = fwd};
  return tcp_xfer(c, &op, 1, a);
}

/* A receive into buf; reducing, buf = acc (op) data when acc is given
 * (no copy of acc into buf first), else buf (op)= data. */
static int recv_acc(struct tcp_comm *c, const struct dcomm_coll_args *a, int from, void *buf, size_t len, int reduce,
                    const void *acc) {
  struct tcp_xop op = {.peer = from, .rbuf = buf, .len = len, .reduce = reduce, .racc = acc};
  return tcp_xfer(c, &op, 1, a);
}

static int recv1(struct tcp_comm *c, const struct dcomm_coll_args *a, int from, void *buf, size_t len, int reduce) {
  return recv_acc(c, a, from, buf, len, reduce, NULL);
}

/* Sends to one peer while receiving from another (or the same), the
 * receive as recv_acc's. A send that completes alone (room in a
 * shared-memory ring) goes first and the receive follows as a step of its
 * own: the same bytes move, without a two-op wait (at 2 ranks, 64 B
 * all_gather 1.7-1.9 -> 1.4 us). */
static int exchange_acc(struct tcp_comm *c, const struct dcomm_coll_args *a, int to, const void *sbuf, size_t slen,
                        int from, void *rbuf, size_t rlen, int flags, const void *acc) {
  if (tcp_sends_now(c, to, slen, !!(flags & XF_FWD))) {
    TCP_CHECK(send1(c, a, to, sbuf, slen, !!(flags & XF_FWD)));
    return recv_acc(c, a, from, rbuf, rlen, !!(flags & XF_REDUCE), acc);
  }
  struct tcp_xop ops[2] = {{.peer = to, .is_send = 1, .sbuf = sbuf, .len = slen, .fwd = !!(flags & XF_FWD)},
                           {.peer = from, .rbuf = rbuf, .len = rlen, .reduce = !!(flags & XF_REDUCE), .racc = acc}};
  return tcp_xfer(c, ops, 2, a);
}

static int exchange(struct tcp_comm *c, const struct dcomm_coll_args *a, int to, const void *sbuf, size_t slen,
                    int from, void *rbuf, size_t rlen, int flags) {
  return exchange_acc(c, a, to, sbuf, slen, from, rbuf, rlen, flags, NULL);
}

static int oom(struct tcp_comm *c) { return tcp_fail(c, DCOMM_ENOMEM, "tcp %s: out of memory for scratch", c->label); }

static void finish_avg(struct tcp_comm *c, const struct dcomm_coll_args *a, void *buf, size_t count) {
  if (a->op == DCOMM_AVG) c->ctx->host->scale_div(buf, count, a->dtype, c->size);
}

/* The largest power of two p <= n (n >= 1), and k = log2 p. */
static int pow2_floor(int n, int *k) {
  int p = 1, l = 0;
  while (p * 2 <= n) p *= 2, l++;
  if (k) *k = l;
  return p;
}

/* Recursive doubling and halving run over p = pow2_floor(n) members: the
 * first 2(n - p) members pair up, the even one of a pair hands its buffer
 * to the odd one (fold_in) and gets the result back at the end
 * (fold_out). vr numbers the p members that take part (-1: folded in). */
struct fold {
  int p, rem, vr;
};

static int fold_in(struct tcp_comm *c, const struct dcomm_coll_args *a, const struct span *sp, struct fold *f) {
  size_t len = a->count * dcomm_dtype_size(a->dtype);
  int r = sp->me;
  f->p = pow2_floor(sp->n, NULL);
  f->rem = sp->n - f->p;
  f->vr = r < 2 * f->rem ? (r % 2 ? r / 2 : -1) : r - f->rem;
  if (r >= 2 * f->rem) return 0;
  if (r % 2 == 0) TCP_CHECK(send1(c, a, at(sp, r + 1), a->recvbuf, len, 1));
  else TCP_CHECK(recv1(c, a, at(sp, r - 1), a->recvbuf, len, 1));
  return 0;
}

static int fold_out(struct tcp_comm *c, const struct dcomm_coll_args *a, const struct span *sp, const struct fold *f) {
  size_t len = a->count * dcomm_dtype_size(a->dtype);
  int r = sp->me;
  if (r >= 2 * f->rem) return 0;
  if (r % 2 == 0) TCP_CHECK(recv1(c, a, at(sp, r + 1), a->recvbuf, len, 0));
  else TCP_CHECK(send1(c, a, at(sp, r - 1), a->recvbuf, len, 1));
  return 0;
}

/* The member of the span whose virtual rank is vpeer. */
static int fold_peer(const struct span *sp, const struct fold *f, int vpeer) {
  return at(sp, vpeer < f->rem ? vpeer * 2 + 1 : vpeer + f->rem);
}

/* Recursive doubling over a span, in place in recvbuf; non-powers of two
 * fold the extra members in first. */
static int rd_span(struct tcp_comm *c, const struct dcomm_coll_args *a, const struct span *sp) {
  const struct dcomm_host *h = c->ctx->host;
  size_t len = a->count * dcomm_dtype_size(a->dtype);
  char *buf = a->recvbuf;
  char *tmp = tcp_scratch(c, len ? len : 1);
  if (!tmp) return oom(c);
  struct fold f;
  TCP_CHECK(fold_in(c, a, sp, &f));
  if (f.vr >= 0) {
    for (int mask = 1; mask < f.p; mask <<= 1) {
      int peer = fold_peer(sp, &f, f.vr ^ mask);
      if (tcp_sends_now(c, peer, len, 1)) {
        /* The whole buffer is in the ring before anything arrives in it:
         * reduce the partner's data straight from the ring. */
        TCP_CHECK(send1(c, a, peer, buf, len, 1));
        TCP_CHECK(recv1(c, a, peer, buf, len, 1));
        continue;
      }
      TCP_CHECK(exchange(c, a, peer, buf, len, peer, tmp, len, XF_FWD));
      /* Every op is commutative, so both partners compute the same bits. */
      h->reduce(buf, tmp, a->count, a->dtype, a->op);
    }
  }
  return fold_out(c, a, sp, &f);
}

static int allreduce_rd(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  struct span all = whole(c);
  TCP_CHECK(rd_span(c, a, &all));
  finish_avg(c, a, a->recvbuf, a->count);
  return 0;
}

/* Elements [*off, *off + *cnt) of blocks [lo, hi) when count elements are
 * cut into n blocks. */
static void blocks(size_t count, int n, int lo, int hi, size_t *off, size_t *cnt) {
  size_t o2, c2;
  seg(count, n, lo, off, cnt);
  seg(count, n, hi - 1, &o2, &c2);
  *cnt = o2 + c2 - *off;
}

/* Recursive halving + doubling (Rabenseifner) over p = 2^k members: p
 * blocks; at each halving step a member keeps half of its blocks,
 * reducing the partner's copy of them in, and sends the other half, until
 * it owns block vr alone; then doubling steps gather the blocks back. Each
 * block is reduced by one member, so every rank ends with the same bits.
 * The members past p fold in first and get the result last, as in rd. */
static int allreduce_rhd(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t es = dcomm_dtype_size(a->dtype);
  struct span all = whole(c);
  char *buf = a->recvbuf;
  struct fold f;
  TCP_CHECK(fold_in(c, a, &all, &f));
  int p = f.p, vr = f.vr;
  if (vr >= 0) {
    int lo = 0, hi = p;
    for (int mask = p / 2; mask >= 1; mask >>= 1) {
      int peer = fold_peer(&all, &f, vr ^ mask), mid = lo + (hi - lo) / 2;
      int klo = vr & mask ? mid : lo, khi = vr & mask ? hi : mid, slo = vr & mask ? lo : mid, shi = vr & mask ? mid : hi;
      size_t ko, kc, so, sc;
      blocks(a->count, p, klo, khi, &ko, &kc);
      blocks(a->count, p, slo, shi, &so, &sc);
      TCP_CHECK(exchange(c, a, peer, buf + so * es, sc * es, peer, buf + ko * es, kc * es, XF_REDUCE | XF_FWD));
      lo = klo;
      hi = khi;
    }
    size_t oo, oc;
    seg(a->count, p, vr, &oo, &oc);
    finish_avg(c, a, buf + oo * es, oc);
    for (int mask = 1; mask < p; mask <<= 1) {
      int peer = fold_peer(&all, &f, vr ^ mask), w = hi - lo;
      int plo = vr & mask ? lo - w : hi;
      size_t mo, mc, po, pc;
      blocks(a->count, p, lo, hi, &mo, &mc);
      blocks(a->count, p, plo, plo + w, &po, &pc);
      TCP_CHECK(exchange(c, a, peer, buf + mo * es, mc * es, peer, buf + po * es, pc * es, XF_FWD));
      if (vr & mask) lo = plo;
      else hi = plo + w;
    }
  }
  return fold_out(c, a, &all, &f);
}

/* Ring: reduce-scatter so that rank r owns segment r+1, then all-gather. */
static int allreduce_ring(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t es = dcomm_dtype_size(a->dtype);
  int n = c->size, r = c->rank, right = mod(r + 1, n), left = mod(r - 1, n);
  char *buf = a->recvbuf;
  for (int s = 0; s < n - 1; s++) {
    size_t so, sc, ro, rc;
    seg(a->count, n, mod(r - s, n), &so, &sc);
    seg(a->count, n, mod(r - s - 1, n), &ro, &rc);
    /* Every step counts as forwarded: the in-place buffer is usually
     * fresh from the caller (gradients), and single copies of it measured
     * slower than the rings below DCOMM_SHM_CMA_FWD_MIN. */
    TCP_CHECK(exchange(c, a, right, buf + so * es, sc * es, left, buf + ro * es, rc * es, XF_REDUCE | XF_FWD));
  }
  size_t oo, oc;
  seg(a->count, n, mod(r + 1, n), &oo, &oc);
  finish_avg(c, a, buf + oo * es, oc);
  for (int s = 0; s < n - 1; s++) {
    size_t so, sc, ro, rc;
    seg(a->count, n, mod(r + 1 - s, n), &so, &sc);
    seg(a->count, n, mod(r - s, n), &ro, &rc);
    TCP_CHECK(exchange(c, a, right, buf + so * es, sc * es, left, buf + ro * es, rc * es, XF_FWD));
  }
  return 0;
}

/* Binomial tree over a span into its member of index root (in place in
 * its recvbuf); the others leave their recvbuf as it was. */
static int reduce_tree_span(struct tcp_comm *c, const struct dcomm_coll_args *a, const struct span *sp, int root) {
  size_t len = a->count * dcomm_dtype_size(a->dtype);
  int n = sp->n, vr = mod(sp->me - root, n);
  char *acc = a->recvbuf; /* the root accumulates in place */
  int copied = 0;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      return send1(c, a, at(sp, mod(vr - mask + root, n)), copied ? acc : a->recvbuf, len, copied);
    }
    if (vr + mask < n) {
      const void *from = NULL;
      if (vr != 0 && !copied) { /* a non-root leaves its buffer as it was: the first sum goes to scratch */
        acc = tcp_scratch(c, len ? len : 1);
        if (!acc) return oom(c);
        from = a->recvbuf;
        copied = 1;
      }
      TCP_CHECK(recv_acc(c, a, at(sp, mod(vr + mask + root, n)), acc, len, 1, from));
    }
  }
  return 0;
}

static int reduce_tree(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  struct span all = whole(c);
  TCP_CHECK(reduce_tree_span(c, a, &all, a->root));
  if (c->rank == a->root) finish_avg(c, a, a->recvbuf, a->count);
  return 0;
}

/* Binomial tree over a span from its member of index root. */
static int bcast_tree_span(struct tcp_comm *c, const struct dcomm_coll_args *a, const struct span *sp, int root) {
  size_t len = a->count * dcomm_dtype_size(a->dtype);
  int n = sp->n, vr = mod(sp->me - root, n), mask = 1;
  while (mask < n) {
    if (vr & mask) {
      TCP_CHECK(recv1(c, a, at(sp, mod(vr - mask + root, n)), a->recvbuf, len, 0));
      break;
    }
    mask <<= 1;
  }
  struct tcp_xop ops[32];
  int k = 0;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n)
      ops[k++] = (struct tcp_xop){.peer = at(sp, mod(vr + mask + root, n)), .is_send = 1, .sbuf = a->recvbuf, .len = len, .fwd = vr != 0};
  return k ? tcp_xfer(c, ops, k, a) : 0;
}

static int bcast_tree(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  struct span all = whole(c);
  return bcast_tree_span(c, a, &all, a->root);
}

/* Hierarchical: the members of each host reduce into its leader (through
 * shared memory), the leaders all-reduce by recursive doubling across
 * hosts, and each leader broadcasts the result on its host. Per host one
 * rank's data crosses hosts, whatever the ranks per host (recursive
 * doubling over all ranks sends each rank's whole buffer across hosts
 * log2(hosts) times). Every rank ends with its leader's bits, and the
 * leaders' are identical (commutative ops, as in rd). */
static int allreduce_hier(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  const struct tcp_topo *t = &c->topo;
  struct span local = {t->local, t->nlocal, t->local_me}, leaders = {t->leaders, t->nhosts, t->leader_me};
  TCP_CHECK(reduce_tree_span(c, a, &local, 0));
  if (local.me == 0) {
    TCP_CHECK(rd_span(c, a, &leaders));
    finish_avg(c, a, a->recvbuf, a->count);
  }
  return bcast_tree_span(c, a, &local, 0);
}

/* Hierarchy pays where a host holds several members and there are
 * several hosts; with one member per host or one host it is rd. */
static int spans_hosts(const struct tcp_comm *c) { return c->topo.nhosts > 1 && c->topo.nhosts < c->size; }

/* Recursive halving + doubling replaces the ring for a large all_reduce
 * where the ring is bound by its steps, not its bytes: it takes 2 log2 p
 * steps (plus 2 when n is not a power of two: the members past p fold in,
 * and those pairs move the whole buffer twice more) against the ring's
 * 2(n - 1), for the same bytes. It is chosen when the ring takes at least
 * twice its steps and each ring step would move less than half a ring
 * piece, bytes / n < TCP_SHM_PIECE / 2: there each ring step is one small
 * message that costs its wake-up. Where ring steps are larger the ring's
 * pipeline won (one 2-core host, fastest of 2-3: 8 ranks at 512 KiB,
 * 64 KiB a step, 744 us against 1534; 32 ranks at 2 MiB 13.7 ms against
 * 16.2) and below it the halving (32 ranks at 512 KiB, 16 KiB a step,
 * 12.1 ms against 7.1; 1024 ranks at 1 MiB 26.5 s against 9.8). */
#define RHD_MAX_STEP_BYTES (TCP_SHM_PIECE / 2)
static int rhd_pays(int n, size_t bytes) {
  int k, p = pow2_floor(n, &k);
  int rhd = 2 * k + (p < n ? 2 : 0);
  return 2 * (n - 1) >= 2 * rhd && bytes / (size_t)n < RHD_MAX_STEP_BYTES;
}

static int allreduce(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t bytes = a->count * dcomm_dtype_size(a->dtype);
  if (c->size == 1) return 0;
  int algo = c->t.algo;
  if (algo == TCP_AR_AUTO)
    algo = (bytes <= c->t.small || a->count < (size_t)c->size) ? TCP_AR_RD : rhd_pays(c->size, bytes) ? TCP_AR_RHD : TCP_AR_RING;
  if ((algo == TCP_AR_RING || algo == TCP_AR_RHD) && a->count < (size_t)c->size) algo = TCP_AR_RD;
  if (c->t.algo == TCP_AR_AUTO && algo == TCP_AR_RD && spans_hosts(c)) algo = TCP_AR_HIER;
  if (algo == TCP_AR_HIER) return allreduce_hier(c, a);
  if (algo == TCP_AR_RHD) return allreduce_rhd(c, a);
  return algo == TCP_AR_RING ? allreduce_ring(c, a) : allreduce_rd(c, a);
}

/* Chain root -> root+1 -> ...: at step t a rank receives segment t from
 * its parent while it sends segment t-1 to its child. */
static int bcast_pipeline(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t len = a->count * dcomm_dtype_size(a->dtype), seg = c->ctx->chunk;
  int n = c->size, vr = mod(c->rank - a->root, n);
  int parent = vr > 0 ? mod(c->rank - 1, n) : -1, child = vr + 1 < n ? mod(c->rank + 1, n) : -1;
  size_t nseg = (len + seg - 1) / seg;
  char *buf = a->recvbuf;
  for (size_t t = 0; t <= nseg; t++) {
    struct tcp_xop ops[2];
    int k = 0;
    if (parent >= 0 && t < nseg)
      ops[k++] = (struct tcp_xop){.peer = parent, .rbuf = buf + t * seg, .len = t + 1 < nseg ? seg : len - t * seg};
    size_t st = parent >= 0 ? t - 1 : t; /* the root sends segment t at step t */
    if (child >= 0 && (parent < 0 || t > 0) && st < nseg)
      ops[k++] = (struct tcp_xop){.peer = child, .is_send = 1, .sbuf = buf + st * seg,
                                  .len = st + 1 < nseg ? seg : len - st * seg, .fwd = parent >= 0};
    if (k) TCP_CHECK(tcp_xfer(c, ops, k, a));
  }
  return 0;
}

static int broadcast(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t len = a->count * dcomm_dtype_size(a->dtype);
  if (c->size == 1) return 0;
  int algo = c->t.bcast_algo;
  if (algo == TCP_BCAST_AUTO) algo = c->size > 2 && len > c->t.small ? TCP_BCAST_PIPELINE : TCP_BCAST_TREE;
  return algo == TCP_BCAST_PIPELINE && len > 0 ? bcast_pipeline(c, a) : bcast_tree(c, a);
}

/* Ring all-gather over blocks of blen bytes already placed at block r;
 * the first step sends own (block r, or an untouched copy of it). */
static int ring_gather_blocks(struct tcp_comm *c, const struct dcomm_coll_args *a, char *out, const void *own,
                              size_t blen) {
  int n = c->size, r = c->rank;
  for (int s = 0; s < n - 1; s++) {
    int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    const void *src = s == 0 ? own : out + (size_t)sb * blen;
    TCP_CHECK(exchange(c, a, mod(r + 1, n), src, blen, mod(r - 1, n), out + (size_t)rb * blen, blen, s ? XF_FWD : 0));
  }
  return 0;
}

/* Every rank sends block "to" of its input (at in + to * stride) to each
 * other rank and receives their blocks into out, all progressed together;
 * its own block is copied locally. */
static int pairwise(struct tcp_comm *c, const struct dcomm_coll_args *a, const char *in, size_t stride, char *out,
                    size_t blen) {
  int n = c->size, r = c->rank;
  if (n == 2) { /* one peer: an exchange */
    const char *own = in + (size_t)r * stride;
    if (out + (size_t)r * blen != own) memmove(out + (size_t)r * blen, own, blen);
    return exchange(c, a, 1 - r, in + (size_t)(1 - r) * stride, blen, 1 - r, out + (size_t)(1 - r) * blen, blen, 0);
  }
  struct tcp_xop *ops = calloc((size_t)(2 * n), sizeof(*ops));
  if (!ops) return oom(c);
  int k = 0;
  for (int s = 1; s < n; s++) {
    int to = mod(r + s, n), from = mod(r - s, n);
    ops[k++] = (struct tcp_xop){.peer = to, .is_send = 1, .sbuf = in + (size_t)to * stride, .len = blen};
    ops[k++] = (struct tcp_xop){.peer = from, .rbuf = out + (size_t)from * blen, .len = blen};
  }
  const char *own = in + (size_t)r * stride;
  if (out + (size_t)r * blen != own) memmove(out + (size_t)r * blen, own, blen);
  int rc = tcp_xfer(c, ops, k, a);
  free(ops);
  return rc;
}

/* A few members, all on one host: each sends its input to all the others
 * at once. Every block is then read from its owner's input, which nobody
 * writes, rather than forwarded from a block the forwarder has just
 * written (for a single copy, lines the reader must fetch from the
 * writer's cache: twice the time of the ring on two ranks). Elsewhere the
 * ring, whose first step also sends from the input, and which links each
 * rank to two peers only. The choice reads the host map, which every
 * member has alike (the links a rank has made so far differ). */
#define PAIRWISE_GATHER_MAX 8
static int all_gather(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t blen = a->count * dcomm_dtype_size(a->dtype);
  int n = c->size, r = c->rank;
  char *out = a->recvbuf;
  if (n == 1 || c->topo.nhosts > 1 || n > PAIRWISE_GATHER_MAX) {
    if (out + (size_t)r * blen != a->sendbuf) memmove(out + (size_t)r * blen, a->sendbuf, blen);
    return ring_gather_blocks(c, a, out, a->sendbuf, blen);
  }
  return pairwise(c, a, a->sendbuf, 0, out, blen);
}

/* Builds the op list of a direct exchange: root sends/receives all blocks. */
static int direct(struct tcp_comm *c, const struct dcomm_coll_args *a, int gather) {
  size_t blen = a->count * dcomm_dtype_size(a->dtype);
  int n = c->size, r = c->rank;
  if (r != a->root) {
    if (gather) return send1(c, a, a->root, a->sendbuf, blen, 0);
    return recv1(c, a, a->root, a->recvbuf, blen, 0);
  }
  struct tcp_xop *ops = calloc((size_t)n, sizeof(*ops));
  if (!ops) return oom(c);
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (i == r) continue;
    if (gather) ops[k++] = (struct tcp_xop){.peer = i, .rbuf = (char *)a->recvbuf + (size_t)i * blen, .len = blen};
    else ops[k++] = (struct tcp_xop){.peer = i, .is_send = 1, .sbuf = (const char *)a->sendbuf + (size_t)i * blen, .len = blen};
  }
  if (gather) memmove((char *)a->recvbuf + (size_t)r * blen, a->sendbuf, blen);
  else memmove(a->recvbuf, (const char *)a->sendbuf + (size_t)r * blen, blen);
  int rc = tcp_xfer(c, ops, k, a);
  free(ops);
  return rc;
}

static int overlaps(const void *a, size_t al, const void *b, size_t bl) {
  return (const char *)a < (const char *)b + bl && (const char *)b < (const char *)a + al;
}

/* Ring: at step s a rank sends the partial sum of block r-s-1 and sums
 * its own contribution to block r-s-2 with the one received into an
 * accumulator (out of place: the input is never copied); the last step
 * sums block r straight into recvbuf. */
static int reduce_scatter(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t es = dcomm_dtype_size(a->dtype), blen = a->count * es;
  int n = c->size, r = c->rank;
  if (n == 1) {
    memmove(a->recvbuf, a->sendbuf, blen);
    return 0;
  }
  size_t total = blen * (size_t)n;
  const char *in = a->sendbuf;
  char *tmp;
  if (overlaps(a->recvbuf, blen, in, total)) { /* in place: work on a copy */
    tmp = tcp_scratch(c, total + 2 * blen + 1);
    if (!tmp) return oom(c);
    memcpy(tmp + 2 * blen, in, total);
    in = tmp + 2 * blen;
  } else {
    tmp = tcp_scratch(c, 2 * blen + 1);
    if (!tmp) return oom(c);
  }
  const char *prev = NULL;
  for (int s = 0; s < n - 1; s++) {
    int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
    const char *src = s == 0 ? in + (size_t)sb * blen : prev;
    char *acc = s == n - 2 ? (char *)a->recvbuf : tmp + (size_t)(s % 2) * blen;
    TCP_CHECK(exchange_acc(c, a, mod(r + 1, n), src, blen, mod(r - 1, n), acc, blen, XF_REDUCE | (s ? XF_FWD : 0),
                           in + (size_t)rb * blen));
    prev = acc;
  }
  finish_avg(c, a, a->recvbuf, a->count);
  return 0;
}

static int all_to_all(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  size_t blen = a->count * dcomm_dtype_size(a->dtype);
  return pairwise(c, a, a->sendbuf, blen, a->recvbuf, blen);
}

/* Every pair exchanges one frame each way, empty blocks included: the
 * receiver checks each frame's length against its recvcounts entry. */
static int all_to_allv(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  const struct dcomm_vlayout *v = a->v;
  size_t es = dcomm_dtype_size(a->dtype);
  int n = c->size, r = c->rank;
  if (!v) return c->ctx->host->err(DCOMM_EINVAL, "tcp %s: all_to_allv without its counts", c->label);
  if (v->sendcounts[r] != v->recvcounts[r])
    return tcp_fail(c, DCOMM_EMISMATCH,
                    "tcp %s: mismatched all_to_allv counts: rank %d sends %zu %s elements to itself "
                    "(sendcounts[%d]) but expects %zu (recvcounts[%d])",
                    c->label, r, v->sendcounts[r], c->ctx->host->dtype_name(a->dtype), r, v->recvcounts[r], r);
  const char *in = a->sendbuf;
  char *out = a->recvbuf;
  if (v->recvcounts[r]) memmove(out + v->rdispls[r] * es, in + v->sdispls[r] * es, v->recvcounts[r] * es);
  if (n == 1) return 0;
  struct tcp_xop *ops = calloc((size_t)(2 * n), sizeof(*ops));
  if (!ops) return oom(c);
  int k = 0;
  for (int s = 1; s < n; s++) {
    int to = mod(r + s, n), from = mod(r - s, n);
    size_t sl = v->sendcounts[to] * es, rl = v->recvcounts[from] * es;
    ops[k++] = (struct tcp_xop){.peer = to, .is_send = 1, .sbuf = sl ? in + v->sdispls[to] * es : NULL, .len = sl};
    ops[k++] = (struct tcp_xop){.peer = from, .rbuf = rl ? out + v->rdispls[from] * es : NULL, .len = rl};
  }
  int rc = tcp_xfer(c, ops, k, a);
  free(ops);
  return rc;
}

static int barrier(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  int n = c->size, r = c->rank;
  for (int d = 1; d < n; d <<= 1) TCP_CHECK(exchange(c, a, mod(r + d, n), NULL, 0, mod(r - d, n), NULL, 0, 0));
  return 0;
}

static int run_coll(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  switch (a->coll) {
    case DCOMM_COLL_ALL_REDUCE: return allreduce(c, a);
    case DCOMM_COLL_REDUCE: return c->size == 1 ? 0 : reduce_tree(c, a);
    case DCOMM_COLL_BROADCAST: return broadcast(c, a);
    case DCOMM_COLL_ALL_GATHER: return all_gather(c, a);
    case DCOMM_COLL_GATHER: return direct(c, a, 1);
    case DCOMM_COLL_SCATTER: return direct(c, a, 0);
    case DCOMM_COLL_REDUCE_SCATTER: return reduce_scatter(c, a);
    case DCOMM_COLL_ALL_TO_ALL: return all_to_all(c, a);
    case DCOMM_COLL_ALL_TO_ALLV: return all_to_allv(c, a);
    case DCOMM_COLL_BARRIER: return barrier(c, a);
    case DCOMM_COLL_SEND: return tcp_p2p_send(c, a);
    case DCOMM_COLL_RECV: return tcp_p2p_recv(c, a);
    default: return c->ctx->host->err(DCOMM_ENOTSUP, "tcp: collective %d is not supported", (int)a->coll);
  }
}

int tcp_run_coll(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  struct tcp_cma_call k;
  int timed = tcp_cma_fwd_begin(c, a, &k);
  int rc = run_coll(c, a);
  if (timed) tcp_cma_fwd_end(c, &k, rc);
  return rc;
}
