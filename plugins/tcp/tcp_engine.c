/*
 * tcp_engine.c: the transfer engine of the tcp backend. tcp_xfer progresses
 * a set of framed sends and receives together under one poll(), so ring
 * and pairwise exchanges never deadlock on full socket buffers. A step's
 * peers without a link are dialed first (tcp_link). While it waits it also
 * watches every other link the communicator has (an epoll set, one
 * descriptor in that poll), so a linked peer that dies or aborts is
 * noticed at once, not at the timeout, and the abort it causes travels on
 * along the links (the ring neighbours' links connect every member). Any error breaks the communicator: an ABORT frame carrying the
 * error goes to every peer (which breaks theirs in turn), and every later
 * call fails fast with the same error.
 *
 * A link in shared memory (tcp_shm.c) carries the same frames in its rings;
 * its socket carries abort and wake-up frames and shows a dead peer by its
 * end of file. Waiting on such links spins for DCOMM_SHM_SPIN microseconds,
 * then raises the rings' waiting flags and sleeps in the same poll().
 *
 * Point-to-point send, receive and probe on top of it: tcp_p2p.c.
 */
#include "config.h"
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
static int use_cma(struct tcp_comm *c, const struct tcp_peer *p, int type, size_t len, int fwd) {
  size_t min = fwd ? c->t.cma_fwd_min : c->t.cma_min;
  if (!c->t.cma_min || type != TCP_F_DATA || len < min || !tcp_shm_cma_pid(p->shm)) return 0;
  if (!fwd || !c->t.cma_fwd_auto) return 1;
  c->cma_fwd_asked = 1; /* this call's time says something about the choice */
  return c->cma_fwd_now;
}

/* A single-copy send is complete once the peer's TCP_F_ACK arrives; it
 * queues behind the peer's data frames, which receives take first. */
static int await_ack(struct tcp_comm *c, struct tcp_xop *op, const struct dcomm_coll_args *a) {
  struct tcp_peer *p = &c->peers[op->peer];
  while (p->cma_acked < op->ticket) {
    if (p->departed)
      return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d (world rank %d) finalized before reading this rank's data",
                      c->label, op->peer, tcp_world_of(c, op->peer));
    int rc = tcp_read_hdr(c, op->peer);
    if (rc <= 0) return rc;
    rc = tcp_take_control(c, op->peer, a->deadline);
    if (rc <= 0) return rc; /* a data frame: a receive's */
  }
  op->done = sizeof(op->hdr) + op->len;
  op->complete = 1;
  return 0;
}

/* A socket send takes at most this much at a time. Over loopback, whole
 * 1 MiB payloads in one sendmsg made a 2-rank all_reduce of 2 MiB take
 * 780-840 us; 256 KiB pieces 415-420 (64 KiB: 750, too many calls). */
#define SOCK_PIECE ((size_t)262144)

static size_t piece(size_t n, size_t max) { return n < max ? n : max; }

static int progress_send_ring(struct tcp_comm *c, struct tcp_xop *op, const struct dcomm_coll_args *a) {
  struct tcp_peer *p = &c->peers[op->peer];
  /* A posted single-copy send may be acked already: the peer can read,
   * ack and exit before this rank looks; its ring still holds the ack. */
  if (op->cma) return await_ack(c, op, a);
  if (p->closed && (p->departed || p->bye_on_sock))
    return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d (world rank %d) finalized before reading this rank's data",
                    c->label, op->peer, tcp_world_of(c, op->peer));
  if (p->closed)
    return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: lost rank %d (world rank %d) while sending to it (its link closed)",
                    c->label, op->peer, tcp_world_of(c, op->peer));
  if (op->done == 0 && use_cma(c, p, op->hdr.type, op->len, op->fwd)) {
    uint64_t addr = (uint64_t)(uintptr_t)op->sbuf;
    if (!tcp_shm_fits(p->shm, sizeof(addr))) return 0;
    op->hdr.reserved = TCP_HF_CMA;
    tcp_shm_put_frame(p->shm, &op->hdr, &addr, sizeof(addr));
    op->cma = 1;
    op->ticket = ++p->cma_sent;
    op->done = sizeof(op->hdr);
    return await_ack(c, op, a);
  }
  size_t total = sizeof(op->hdr) + op->len;
  if (op->done == 0) {
    long n = tcp_shm_put_frame(p->shm, &op->hdr, op->sbuf, piece(op->len, TCP_SHM_PIECE));
    if (n < 0) return 0;
    op->done = sizeof(op->hdr) + (size_t)n;
    p->ring_mid = op->done < total;
  }
  while (op->done < total) {
    size_t n = tcp_shm_put(p->shm, (const char *)op->sbuf + (op->done - sizeof(op->hdr)), piece(total - op->done, TCP_SHM_PIECE));
    if (!n) return 0;
    op->done += n;
  }
  p->ring_mid = 0;
  op->complete = 1;
  return 0;
}

/* A reducing receive's bytes [off, off + len) of rbuf: combined with src,
 * which holds the peer's data for them. */
static void reduce_part(struct tcp_comm *c, const struct tcp_xop *op, size_t off, const void *src, size_t len,
                        const struct dcomm_coll_args *a) {
  const struct dcomm_host *h = c->ctx->host;
  size_t n = len / dcomm_dtype_size(a->dtype);
  char *dst = (char *)op->rbuf + off;
  if (op->racc) h->reduce3(dst, (const char *)op->racc + off, src, n, a->dtype, a->op);
  else h->reduce(dst, src, n, a->dtype, a->op);
}

/* Payload of a single-copy frame, read from the sender's buffer, then the
 * ack. A plain receive reads what is left in one call (each
 * process_vm_readv has a fixed cost: on a PVM guest, 256 KiB pieces made a
 * 2 MiB broadcast 1.5x slower than one read); a reduction goes through a
 * chunk-sized stage, one chunk per call, so that it reduces from cache. */
static int progress_recv_cma(struct tcp_comm *c, struct tcp_xop *op, const struct dcomm_coll_args *a) {
  struct tcp_peer *p = &c->peers[op->peer];
  if (!op->cma) {
    const void *src;
    if (tcp_shm_peek(p->shm, &src) < sizeof(op->raddr)) /* published with the header */
      return p->closed ? tcp_lost_msg(c, op->peer, " in the middle of a message") : 0;
    memcpy(&op->raddr, src, sizeof(op->raddr));
    tcp_shm_consume(p->shm, sizeof(op->raddr));
    op->cma = 1;
  }
  if (op->done < op->len) {
    size_t n = op->len - op->done, chunk = c->ctx->chunk;
    if (op->reduce && n > chunk) n = chunk;
    if (op->reduce && !c->cma_stage && !(c->cma_stage = malloc(chunk)))
      return tcp_fail(c, DCOMM_ENOMEM, "tcp: out of memory for staging buffers");
    struct iovec lo = {op->reduce ? c->cma_stage : (char *)op->rbuf + op->done, n};
    struct iovec re = {(void *)(uintptr_t)(op->raddr + op->done), n};
    ssize_t got = process_vm_readv(tcp_shm_cma_pid(p->shm), &lo, 1, &re, 1, 0);
    if (got != (ssize_t)n) {
      int e = got < 0 ? errno : EFAULT;
      /* The buffer of a live member of the collective is mapped until it
       * acks: a failure means the peer died (its memory goes before its
       * links close) or left the collective with an error. Its abort
       * frame, if it sent one, tells which. */
      for (double until = c->ctx->host->now() + 0.2; e != EPERM && !p->closed && c->ctx->host->now() < until;) {
        struct pollfd pf = {.fd = p->fd, .events = POLLIN | POLLRDHUP};
        if (poll(&pf, 1, 20) > 0) TCP_CHECK(tcp_shm_drain(c, op->peer));
      }
      if (e == EPERM)
        return tcp_fail(c, DCOMM_ESYSTEM, "tcp %s: reading rank %d's (world rank %d) data with process_vm_readv: %s "
                        "(DCOMM_SHM_CMA_MIN=0 turns single copy off)", c->label, op->peer, tcp_world_of(c, op->peer), strerror(e));
      return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d's (world rank %d) data vanished while this rank read it (%s): "
                      "it died or left the collective", c->label, op->peer, tcp_world_of(c, op->peer), strerror(e));
    }
    if (op->reduce) reduce_part(c, op, op->done, c->cma_stage, n, a);
    op->done += n;
    op->reduced = op->done;
    if (op->done < op->len) return 0;
  }
  /* The ACK is a frame of its own in this rank's ring to the peer: while a
   * send of this step to the same peer is inside its frame there (the
   * sender chose the single copy, this rank the rings: each side decides
   * its own sends), it waits for that frame's end, which the peer's
   * receive makes room for. Written in the middle, it became payload. */
  if (p->ring_mid) return 0;
  struct tcp_hdr ack = {.magic = TCP_MAGIC, .type = TCP_F_ACK};
  if (tcp_shm_put_frame(p->shm, &ack, NULL, 0) < 0) return 0; /* no room yet: again later */
  p->have_hdr = 0;
  p->hgot = 0;
  op->complete = 1;
  return 0;
}

/* Payload of a receive from a ring: reductions read straight from it. */
static int progress_recv_ring(struct tcp_comm *c, struct tcp_xop *op, const struct dcomm_coll_args *a) {
  struct tcp_peer *p = &c->peers[op->peer];
  if (p->hdr.reserved & TCP_HF_CMA) return progress_recv_cma(c, op, a);
  size_t es = op->reduce ? dcomm_dtype_size(a->dtype) : 1;
  while (op->done < op->len) {
    const void *src;
    size_t n = tcp_shm_peek(p->shm, &src);
    if (n > op->len - op->done) n = op->len - op->done;
    n -= n % es; /* a partial element waits for the rest */
    if (!n) {
      if (p->closed)
        return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: the link from rank %d (world rank %d) closed in the middle of its data (it died or aborted)",
                        c->label, op->peer, tcp_world_of(c, op->peer));
      return 0;
    }
    if (op->reduce) reduce_part(c, op, op->done, src, n, a);
    else memcpy((char *)op->rbuf + op->done, src, n);
    tcp_shm_consume(p->shm, n);
    op->done += n;
    op->reduced = op->done;
  }
  p->have_hdr = 0;
  p->hgot = 0;
  op->complete = 1;
  return 0;
}

static int progress_send(struct tcp_comm *c, struct tcp_xop *op, const struct dcomm_coll_args *a) {
  struct tcp_peer *p = &c->peers[op->peer];
  if (p->shm) return progress_send_ring(c, op, a);
  size_t total = sizeof(op->hdr) + op->len;
  while (op->done < total) {
    struct iovec iov[2];
    int k = 0;
    if (op->done < sizeof(op->hdr)) {
      iov[k++] = (struct iovec){(char *)&op->hdr + op->done, sizeof(op->hdr) - op->done};
      if (op->len) iov[k++] = (struct iovec){(void *)(uintptr_t)op->sbuf, piece(op->len, SOCK_PIECE)};
    } else {
      iov[k++] = (struct iovec){(char *)(uintptr_t)op->sbuf + (op->done - sizeof(op->hdr)), piece(total - op->done, SOCK_PIECE)};
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t n = sendmsg(p->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      op->done += (size_t)n;
      p->mid_send = op->done < total;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    /* The peer is gone; its ABORT, if it sent one, explains why. */
    if (!p->have_hdr && tcp_read_hdr(c, op->peer) == 1) {
      int rc = tcp_take_control(c, op->peer, c->ctx->host->now() + 1.0);
      if (rc < 0) return rc;
    }
    p->closed = 1;
    if (p->departed)
      return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d (world rank %d) finalized before reading this rank's data",
                      c->label, op->peer, tcp_world_of(c, op->peer));
    return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: lost rank %d (world rank %d) while sending to it (%s)", c->label,
                    op->peer, tcp_world_of(c, op->peer), n < 0 ? strerror(errno) : "closed");
  }
  op->complete = 1;
  return 0;
}

static int progress_recv(struct tcp_comm *c, struct tcp_xop *op, const struct dcomm_coll_args *a) {
  struct tcp_peer *p = &c->peers[op->peer];
  while (!op->hdr_ok) {
    int rc = tcp_read_hdr(c, op->peer);
    if (a->coll == DCOMM_COLL_RECV && rc >= 0 && p->uq_head) {
      /* The message may have been queued meanwhile: its payload started
       * arriving during an earlier op and was completed just now. */
      int t = tcp_uq_take(c, op->peer, a, op->rbuf);
      if (t < 0) return t;
      if (t) {
        op->done = op->len;
        op->complete = 1;
        return 0;
      }
    }
    if (rc <= 0) return rc;
    int want = a->coll == DCOMM_COLL_RECV ? TCP_F_P2P : TCP_F_DATA;
    if (p->hdr.type == want && !(want == TCP_F_P2P && p->hdr.root != a->tag)) {
      TCP_CHECK(tcp_check_hdr(c, op->peer, op, a));
      op->hdr_ok = 1;
      break;
    }
    if (p->hdr.type == TCP_F_DATA) {
      /* Collective data while this rank waits in recv (or the reverse). */
      TCP_CHECK(tcp_check_hdr(c, op->peer, op, a));
    }
    rc = tcp_take_control(c, op->peer, a->deadline);
    if (rc < 0) return rc;
    if (p->departed)
      return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d (world rank %d) finalized while this rank waits for its data",
                      c->label, op->peer, tcp_world_of(c, op->peer));
  }
  if (p->shm) return progress_recv_ring(c, op, a);
  size_t chunk = c->ctx->chunk;
  while (op->done < op->len) {
    char *dst;
    size_t want;
    if (op->reduce) {
      size_t in_stage = op->done - op->reduced;
      want = op->len - op->done;
      if (want > chunk - in_stage) want = chunk - in_stage;
      dst = (char *)c->stage[op->stage_idx] + in_stage;
    } else {
      want = op->len - op->done;
      dst = (char *)op->rbuf + op->done;
    }
    ssize_t n = recv(p->fd, dst, want, MSG_DONTWAIT);
    if (n > 0) {
      op->done += (size_t)n;
      if (op->reduce && (op->done - op->reduced == chunk || op->done == op->len)) {
        reduce_part(c, op, op->reduced, c->stage[op->stage_idx], op->done - op->reduced, a);
        op->reduced = op->done;
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    p->closed = 1;
    return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: the link from rank %d (world rank %d) closed in the middle of its data (%s; it died or aborted)", c->label,
                    op->peer, tcp_world_of(c, op->peer), n < 0 ? strerror(errno) : "link closed");
  }
  p->have_hdr = 0;
  p->hgot = 0;
  op->complete = 1;
  return 0;
}

/* A link we are not reading from became readable or hung up. Data that
 * belongs to a later step or a later collective is left in place; data of
 * this collective's sequence number that does not match this rank's call
 * is a mismatch, found here even when no rank reads from that link. */
/* Stops watching peer until the next step (watch_off), noted in woff. */
static void hold_back(struct tcp_comm *c, int peer) {
  if (!c->peers[peer].watch_off && c->nwoff < c->size) c->woff[c->nwoff++] = peer;
  c->peers[peer].watch_off = 1;
}

static int watch_peer(struct tcp_comm *c, int peer, const struct dcomm_coll_args *a) {
  struct tcp_peer *p = &c->peers[peer];
  if (p->shm) TCP_CHECK(tcp_shm_drain(c, peer));
  for (;;) {
    if (p->have_hdr) {
      const struct tcp_hdr *h = &p->hdr;
      if (c->ctx->check_mismatch && a->coll != DCOMM_COLL_SEND && a->coll != DCOMM_COLL_RECV && h->type == TCP_F_DATA &&
          (h->seq < a->seq || (h->seq == a->seq && !tcp_sig_matches(h, a))))
        return tcp_mismatch(c, peer, a);
      hold_back(c, peer);
      return 0;
    }
    int rc = tcp_read_hdr(c, peer);
    if (rc <= 0) return rc;
    rc = tcp_take_control(c, peer, a->deadline);
    if (rc < 0) return rc;
    if (p->departed) {
      hold_back(c, peer);
      return 0;
    }
  }
}

static void fill_hdr(struct tcp_hdr *h, const struct dcomm_coll_args *a, size_t len) {
  memset(h, 0, sizeof(*h));
  h->magic = TCP_MAGIC;
  h->type = a->coll == DCOMM_COLL_SEND ? TCP_F_P2P : TCP_F_DATA;
  h->coll = (uint8_t)a->coll;
  h->dtype = (uint8_t)a->dtype;
  h->op = (uint8_t)a->op;
  h->root = a->coll == DCOMM_COLL_SEND ? a->tag : a->root;
  h->seq = a->seq;
  /* all_to_allv: the block's count, which differs per pair of ranks */
  h->count = a->coll == DCOMM_COLL_ALL_TO_ALLV ? len / dcomm_dtype_size(a->dtype) : a->count;
  h->len = len;
}

int tcp_broken(struct tcp_comm *c) {
  int err = atomic_load(&c->error);
  if (!err) return 0;
  return tcp_fail(c, err, "unused");
}

/* The watched set. Every open link of the communicator is in one epoll
 * set, which the engine's poll sees as one descriptor beside its ops': a
 * pass costs the step's ops, not the group's size. A link leaves the set
 * when it closes, its peer finalizes, or it holds data for a later step
 * (watch_off, reset at the next step through the woff list); a link that a
 * receive of the step reads stays in it and is left to its op. */
static int want_watch(const struct tcp_comm *c, int r) {
  const struct tcp_peer *p = &c->peers[r];
  return r != c->rank && p->fd >= 0 && !p->closed && !p->departed && !p->watch_off;
}

/* Brings peer r's registration in line with want_watch (a link is removed,
 * not masked: epoll reports a hang-up whatever the mask). */
static int ep_sync(struct tcp_comm *c, int r) {
  int want = want_watch(c, r);
  if (want == c->ep_on[r]) return 0;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = (uint32_t)r};
  if (epoll_ctl(c->epfd, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c->peers[r].fd, &ev) < 0 && want)
    return tcp_fail(c, DCOMM_ESYSTEM, "tcp %s: epoll_ctl: %s", c->label, strerror(errno));
  c->ep_on[r] = (char)want;
  return 0;
}

/* Before a step's first poll: the links held back in the last step come
 * back (the first step registers every link). */
static int ep_begin(struct tcp_comm *c) {
  if (!c->ep_init) {
    for (int r = 0; r < c->size; r++) TCP_CHECK(ep_sync(c, r));
    c->ep_init = 1;
  }
  for (int i = 0; i < c->nwoff; i++) {
    int r = c->woff[i];
    c->peers[r].watch_off = 0;
    TCP_CHECK(ep_sync(c, r));
  }
  c->nwoff = 0;
  return 0;
}

/* Makes room for need entries in the comm's poll set: one for the abort
 * descriptor, one per op and one per watched link, as many as the
 * communicator has (no cap below the process's descriptor limit). */
int tcp_pf_reserve(struct tcp_comm *c, int need) {
  if (need <= c->pf_cap) return 0;
  struct pollfd *pf = realloc(c->pf, sizeof(*pf) * (size_t)need);
  if (pf) c->pf = pf;
  int *who = pf ? realloc(c->pf_who, sizeof(*who) * (size_t)need) : NULL;
  if (who) c->pf_who = who;
  if (!pf || !who) return tcp_fail(c, DCOMM_ENOMEM, "tcp: out of memory for the poll set");
  c->pf_cap = need;
  return 0;
}

/* Progresses one op: 1 if it moved or completed, 0 if not, <0 error. */
static int step_op(struct tcp_comm *c, struct tcp_xop *op, const struct dcomm_coll_args *a, int *left) {
  size_t before = op->done;
  int hdr = op->hdr_ok;
  TCP_CHECK(op->is_send ? progress_send(c, op, a) : progress_recv(c, op, a));
  if (op->complete) {
    (*left)--;
    return 1;
  }
  return op->done != before || op->hdr_ok != hdr;
}

/* Polls the rings of the pending shared-memory ops (no system call)
 * until they stall for DCOMM_SHM_SPIN (1: time to sleep) or for at most
 * 2 ms while they still move (0: look at the sockets, do not sleep). A
 * rank that finds nothing pauses for TCP_PAUSE_SPIN, since a sched_yield costs
 * more than a small message's latency, then yields, so that the rank it
 * waits for runs if the scheduler put both on one processor. With more
 * ranks on the host than processors it yields at once (spinning with
 * pause alone was slower at 4 ranks on 2 cores). */
/* A single-copy send waits while its reader copies: the stall allowed
 * before sleeping grows by the copy's time at this (low) rate, as waking
 * a sleeping process costs tens of microseconds in a virtual machine. */
#define CMA_SPIN_RATE 1e9
static int spin_rings(struct tcp_comm *c, struct tcp_xop *ops, int n, const struct dcomm_coll_args *a, int *left) {
  const struct dcomm_host *h = c->ctx->host;
  double t0 = h->now(), last = t0;
  double pause_s = tcp_oversubscribed(c->ctx) ? 0 : TCP_PAUSE_SPIN, stall = c->t.shm_spin;
  for (int i = 0; i < n && c->t.shm_spin > 0; i++) /* DCOMM_SHM_SPIN=0: sleep at once */
    if (!ops[i].complete && ops[i].is_send && ops[i].cma) {
      double copying = c->t.shm_spin + (double)ops[i].len / CMA_SPIN_RATE;
      if (copying > stall) stall = copying;
    }
  for (;;) {
    int moved = 0, any = 0;
    for (int i = 0; i < n; i++) {
      if (ops[i].complete || !c->peers[ops[i].peer].shm) continue;
      any = 1;
      int rc = step_op(c, &ops[i], a, left);
      if (rc < 0) return rc;
      moved |= rc;
    }
    if (!any || !*left || atomic_load_explicit(&c->error, memory_order_relaxed)) return 1;
    double t = h->now();
    if (moved) last = t;
    else if (t - last >= stall) return 1;
    if (t - t0 > 0.002) return 0;
    if (moved) continue;
    if (t - last >= pause_s) sched_yield();
    else tcp_cpu_relax();
  }
}

/* Before sleeping: raises the waiting flags of every ring this call waits
 * on or watches. 0: sleep; 1: something arrived meanwhile. */
static int arm_rings(struct tcp_comm *c, struct tcp_xop *ops, int n, const struct dcomm_coll_args *a) {
  int ready = 0;
  for (int i = 0; i < n; i++) {
    struct tcp_peer *p = &c->peers[ops[i].peer];
    if (ops[i].complete || !p->shm || p->closed) continue;
    /* A single-copy send waits for its ack, which comes in the rx ring; a
     * single-copy receive that has read everything waits for room for its
     * ack in the tx ring (progress_recv_cma found none). */
    int wants_room = ops[i].is_send ? !ops[i].cma : ops[i].cma && ops[i].done >= ops[i].len;
    ready |= wants_room ? tcp_shm_arm_tx(p->shm) : tcp_shm_arm_rx(p->shm);
  }
  for (int r = 0; r < c->size; r++) {
    struct tcp_peer *p = &c->peers[r];
    if (!p->shm || c->recv_mark[r] || p->closed || p->departed || p->watch_off) continue;
    /* A watched ring: what is already there is looked at now, and the
     * engine looks again before sleeping. The ring may be a send op's
     * (a single-copy send to a peer this step does not receive from):
     * watch_peer then takes the op's ACK, and with it the WAKE its peer
     * sent on the socket, so sleeping now would wait for a wake-up that
     * was already consumed (seen as a rare hang of the ring all_reduce
     * and chain broadcast with single copy). */
    if (tcp_shm_arm_rx(p->shm)) {
      TCP_CHECK(watch_peer(c, r, a));
      ready = 1;
    }
  }
  return ready;
}

/* The watched set has something: looks at the links it names (a bounded
 * batch; the rest stay ready for the next pass) and takes them out of the
 * set where watch_peer said so. */
static int watch_ready(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  struct epoll_event ev[64];
  int k = epoll_wait(c->epfd, ev, 64, 0);
  if (k < 0 && errno != EINTR) return tcp_fail(c, DCOMM_ESYSTEM, "tcp %s: epoll_wait: %s", c->label, strerror(errno));
  for (int i = 0; i < k; i++) {
    int r = (int)ev[i].data.u32;
    if (r < 0 || r >= c->size || !c->ep_on[r]) continue;
    /* A link that closed or finished outside the engine (a probe) leaves
     * the set; one that a receive of this step reads is its op's. */
    if (want_watch(c, r) && !c->recv_mark[r]) TCP_CHECK(watch_peer(c, r, a));
    TCP_CHECK(ep_sync(c, r));
  }
  return 0;
}

/* While a link is being made: the comm still breaks on an abort, and the
 * links it has are watched (a dead or aborting peer anywhere). */
static int link_check(struct tcp_comm *c, void *arg) {
  const struct dcomm_coll_args *a = arg;
  TCP_CHECK(tcp_broken(c));
  memset(c->recv_mark, 0, (size_t)c->size);
  TCP_CHECK(ep_begin(c));
  return watch_ready(c, a);
}

/* The links of a step's ops: those the listener parked are adopted, the
 * missing ones dialed (a failure breaks the comm, as any other). */
static int links_for(struct tcp_comm *c, const struct tcp_xop *ops, int n, const struct dcomm_coll_args *a) {
  TCP_CHECK(tcp_links_adopt(c));
  for (int i = 0; i < n; i++) {
    if (c->peers[ops[i].peer].fd >= 0) continue;
    int rc = tcp_link(c, ops[i].peer, a->deadline, link_check, (void *)a);
    if (rc < 0) return tcp_fail(c, rc, "%s", dcomm_last_error());
  }
  return 0;
}

int tcp_xfer(struct tcp_comm *c, struct tcp_xop *ops, int n, const struct dcomm_coll_args *a) {
  const struct dcomm_host *h = c->ctx->host;
  TCP_CHECK(tcp_broken(c));
  TCP_CHECK(links_for(c, ops, n, a));
  int stages = 0;
  for (int i = 0; i < n; i++) {
    struct tcp_xop *op = &ops[i];
    op->done = op->reduced = 0;
    op->complete = op->hdr_ok = op->cma = 0;
    if (op->is_send) fill_hdr(&op->hdr, a, op->len);
    if (!op->is_send && op->reduce && !c->peers[op->peer].shm) {
      if (stages == 2) return h->err(DCOMM_EBACKEND, "tcp: more than two reducing receives in one step");
      op->stage_idx = stages++;
      if (!c->stage[op->stage_idx] && !(c->stage[op->stage_idx] = malloc(c->ctx->chunk)))
        return tcp_fail(c, DCOMM_ENOMEM, "tcp: out of memory for staging buffers");
    }
  }
  int left = n;
  int began = 0; /* ep_begin ran: only once this step needs to poll */
  /* First pass without waiting: small messages usually complete here. */
  for (int i = 0; i < n; i++) {
    TCP_CHECK(ops[i].is_send ? progress_send(c, &ops[i], a) : progress_recv(c, &ops[i], a));
    if (ops[i].complete) left--;
  }
  TCP_CHECK(tcp_pf_reserve(c, 2 + n));
  struct pollfd *pf = c->pf;
  int *who = c->pf_who; /* >= 0: op index; -1: the watched set */
  double active = h->now(); /* when a socket last had something */
  int polled_empty = 0;
  while (left > 0) {
    char *recv_peer = c->recv_mark;
    memset(recv_peer, 0, (size_t)c->size);
    for (int i = 0; i < n; i++)
      if (!ops[i].complete && !ops[i].is_send) recv_peer[ops[i].peer] = 1;
    if (!began) {
      TCP_CHECK(ep_begin(c));
      began = 1;
    }
    int may_sleep = 1;
    if (c->nshm) {
      int rc = spin_rings(c, ops, n, a, &left);
      if (rc < 0) return rc;
      if (!left) break;
      may_sleep = rc == 1 && !arm_rings(c, ops, n, a);
    } else if (h->now() - active < c->t.shm_spin) {
      /* Sockets only: look without sleeping for DCOMM_SHM_SPIN first, as
       * a sleeping process on another processor takes tens of
       * microseconds to wake up, far more than a small message. */
      may_sleep = 0;
      if (polled_empty && tcp_oversubscribed(c->ctx)) sched_yield();
    }
    int np = 0;
    pf[np] = (struct pollfd){.fd = c->abort_fd, .events = POLLIN};
    who[np++] = n;
    for (int i = 0; i < n; i++) {
      struct tcp_peer *p = &c->peers[ops[i].peer];
      if (ops[i].complete || (p->shm && p->closed)) continue;
      /* A shm link's socket only brings wake-ups, aborts and its end. */
      short ev = p->shm ? POLLIN : ops[i].is_send ? POLLOUT : POLLIN;
      pf[np] = (struct pollfd){.fd = p->fd, .events = ev};
      who[np++] = i;
    }
    pf[np] = (struct pollfd){.fd = c->epfd, .events = POLLIN};
    who[np++] = -1;
    double wait_s = a->deadline - h->now();
    if (wait_s <= 0) {
      for (int i = 0; i < n; i++)
        if (!ops[i].complete)
          return tcp_fail(c, DCOMM_ETIMEDOUT, "tcp %s: timed out %s rank %d (world rank %d) in %s", c->label,
                          ops[i].is_send ? "sending to" : "waiting for data from", ops[i].peer,
                          tcp_world_of(c, ops[i].peer), tcp_coll_name(a->coll));
    }
    int rc = poll(pf, (nfds_t)np, may_sleep && wait_s > 0 ? (int)(wait_s * 1000) + 1 : 0);
    if (rc < 0 && errno != EINTR) return tcp_fail(c, DCOMM_ESYSTEM, "tcp: poll: %s", strerror(errno));
    polled_empty = rc <= 0;
    if (rc <= 0) continue;
    active = h->now();
    if (pf[0].revents & POLLIN) {
      int err = atomic_load(&c->error);
      return tcp_fail(c, err ? err : DCOMM_EREVOKED, "tcp %s: communicator aborted", c->label);
    }
    for (int k = 1; k < np; k++) {
      if (!pf[k].revents) continue;
      if (who[k] >= 0) {
        struct tcp_xop *op = &ops[who[k]];
        if (op->complete) continue;
        if (c->peers[op->peer].shm) TCP_CHECK(tcp_shm_drain(c, op->peer));
        TCP_CHECK(step_op(c, op, a, &left));
      } else {
        TCP_CHECK(watch_ready(c, a));
      }
    }
  }
  return 0;
}

int tcp_uq_take(struct tcp_comm *c, int peer, const struct dcomm_coll_args *a, void *buf) {
  struct tcp_peer *p = &c->peers[peer];
  size_t len = a->count * dcomm_dtype_size(a->dtype);
  for (struct tcp_uq **pp = &p->uq_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
    struct tcp_uq *q = *pp;
    if (q->hdr.root != a->tag) continue;
    if (q->hdr.len != len || q->hdr.count != a->count || q->hdr.dtype != (uint8_t)a->dtype) {
      char theirs[160], mine[160];
      tcp_describe_args(theirs, sizeof(theirs), c->ctx->host, DCOMM_COLL_SEND, 0, q->hdr.count, q->hdr.dtype, 0, q->hdr.root);
      tcp_describe_args(mine, sizeof(mine), c->ctx->host, DCOMM_COLL_RECV, 0, a->count, (int)a->dtype, 0, a->tag);
      return tcp_fail(c, DCOMM_EMISMATCH, "tcp %s: mismatched calls: rank %d called %s but rank %d called %s", c->label,
                      peer, theirs, c->rank, mine);
    }
    if (len) memcpy(buf, q->data, len);
    *pp = q->next;
    if (p->uq_tail == q) p->uq_tail = prev;
    free(q->data);
    free(q);
    return 1;
  }
  return 0;
}

int tcp_sends_now(struct tcp_comm *c, int peer, size_t len, int fwd) {
  struct tcp_peer *p = &c->peers[peer];
  return p->shm && !p->closed && !use_cma(c, p, TCP_F_DATA, len, fwd) && tcp_shm_fits(p->shm, len);
}
