/*
 * tcp_p2p.c: point-to-point messages of the tcp backend. A send is one
 * framed transfer (tcp_xfer); a receive first takes a message that arrived
 * before it was posted from its peer's queue of unexpected messages (FIFO
 * per peer and tag), else waits for it like a collective's data. The probe
 * op reads every link without an op of its own, queueing the unexpected
 * messages it finds until one with the probed tag is complete, spinning on
 * shared-memory links for DCOMM_SHM_SPIN before it sleeps in poll().
 */
#include "config.h"
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

int tcp_p2p_send(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  struct tcp_xop op = {.peer = a->root, .is_send = 1, .sbuf = a->recvbuf,
                       .len = a->count * dcomm_dtype_size(a->dtype)};
  return tcp_xfer(c, &op, 1, a);
}

int tcp_p2p_recv(struct tcp_comm *c, const struct dcomm_coll_args *a) {
  TCP_CHECK(tcp_broken(c));
  int rc = tcp_uq_take(c, a->root, a, a->recvbuf);
  if (rc) return rc < 0 ? rc : 0;
  struct tcp_xop op = {.peer = a->root, .rbuf = a->recvbuf, .len = a->count * dcomm_dtype_size(a->dtype)};
  return tcp_xfer(c, &op, 1, a);
}

/* ---- probe: waits for an unexpected message to be complete ---- */

/* Whether peer's link is worth reading for probe: not finalized, and not
 * held up by collective data this rank has yet to take (have_hdr). */
static int probe_readable(const struct tcp_peer *p) {
  return p->fd >= 0 && !p->departed && !(p->have_hdr && p->hdr.type == TCP_F_DATA);
}

/* Takes in what peer's link holds, without waiting: unexpected messages
 * into the queue, control frames as the engine does. A collective's data
 * stays where it is (the next collective reads it). */
static int probe_pull(struct tcp_comm *c, int peer, double deadline) {
  struct tcp_peer *p = &c->peers[peer];
  if (!probe_readable(p)) return 0;
  if (p->shm) TCP_CHECK(tcp_shm_drain(c, peer));
  for (;;) {
    if (!p->have_hdr) {
      int rc = tcp_read_hdr(c, peer);
      if (rc <= 0) return rc;
    }
    int rc = tcp_take_control(c, peer, deadline);
    if (rc <= 0 || p->departed) return rc < 0 ? rc : 0;
  }
}

/* The oldest queued message with tag from peer (any peer: oldest of all). */
static struct tcp_uq *probe_find(struct tcp_comm *c, int peer, int tag, int *src) {
  struct tcp_uq *best = NULL;
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank || (peer != DCOMM_ANY_SOURCE && r != peer)) continue;
    for (struct tcp_uq *q = c->peers[r].uq_head; q; q = q->next)
      if (q->hdr.root == tag) {
        if (!best || q->serial < best->serial) {
          best = q;
          *src = r;
        }
        break; /* FIFO per (peer, tag): only the first counts */
      }
  }
  return best;
}

/* One look at every link: 1 found, 0 not, < 0 error. Also notices the
 * probed peer's departure (any source: every peer gone). */
static int probe_look(struct tcp_comm *c, int peer, int tag, double deadline, int *src, size_t *nbytes) {
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) TCP_CHECK(probe_pull(c, r, deadline));
  struct tcp_uq *q = probe_find(c, peer, tag, src);
  if (q) {
    *nbytes = (size_t)q->hdr.len;
    return 1;
  }
  int alive = 0;
  for (int r = 0; r < c->size; r++)
    if (r != c->rank && (peer == DCOMM_ANY_SOURCE || r == peer)) alive += !c->peers[r].departed;
  if (!alive && c->size > 1) {
    if (peer != DCOMM_ANY_SOURCE)
      return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d (world rank %d) finalized while this rank probes for its "
                      "message (tag %d)", c->label, peer, tcp_world_of(c, peer), tag);
    return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: every other rank finalized while this rank probes for a message "
                    "(tag %d)", c->label, tag);
  }
  return 0;
}

static int probe_check(struct tcp_comm *c, void *arg) {
  (void)arg;
  return tcp_broken(c);
}

int tcp_p2p_probe(struct tcp_comm *c, int peer, int tag, double deadline, int *src, size_t *nbytes) {
  const struct dcomm_host *h = c->ctx->host;
  if (peer != DCOMM_ANY_SOURCE && (peer < 0 || peer >= c->size || peer == c->rank))
    return h->err(DCOMM_EINVAL, "tcp %s: cannot probe rank %d (rank %d of %d)", c->label, peer, c->rank, c->size);
  TCP_CHECK(tcp_broken(c));
  /* The links a probe reads: the peer's; for any source, every member's
   * (made once: an any-source probe links the whole communicator). */
  TCP_CHECK(tcp_links_adopt(c));
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank || (peer != DCOMM_ANY_SOURCE && r != peer) || c->peers[r].fd >= 0) continue;
    int rc = tcp_link(c, r, deadline, probe_check, NULL);
    if (rc < 0) return tcp_fail(c, rc, "%s", dcomm_last_error());
  }
  /* A message already queued is found without touching the links. */
  struct tcp_uq *q = probe_find(c, peer, tag, src);
  if (q) {
    *nbytes = (size_t)q->hdr.len;
    return 1;
  }
  TCP_CHECK(tcp_pf_reserve(c, 1 + c->size));
  struct pollfd *pf = c->pf;
  for (;;) {
    /* Look, and on shared-memory links keep looking for DCOMM_SHM_SPIN
     * before sleeping, as the engine does. */
    double t0 = h->now(), t;
    double pause_s = tcp_oversubscribed(c->ctx) ? 0 : TCP_PAUSE_SPIN;
    for (;;) {
      int rc = probe_look(c, peer, tag, deadline, src, nbytes);
      if (rc) return rc;
      t = h->now();
      if (t >= deadline || !c->nshm || t - t0 >= c->t.shm_spin) break;
      if (t - t0 >= pause_s) sched_yield();
      else tcp_cpu_relax();
    }
    if (t >= deadline) return 0;
    /* Sleep until a link has something, the comm is aborted, or the
     * deadline. Rings are armed first; one that already holds data is
     * read at once. */
    int np = 0, ready = 0;
    pf[np++] = (struct pollfd){.fd = c->abort_fd, .events = POLLIN};
    for (int r = 0; r < c->size; r++) {
      struct tcp_peer *p = &c->peers[r];
      if (r == c->rank || !probe_readable(p) || (p->shm && p->closed)) continue;
      if (p->shm) ready |= tcp_shm_arm_rx(p->shm);
      pf[np++] = (struct pollfd){.fd = p->fd, .events = POLLIN | POLLRDHUP};
    }
    if (ready) continue;
    double wait_s = deadline - h->now();
    int rc = poll(pf, (nfds_t)np, wait_s > 0 ? (int)(wait_s * 1000) + 1 : 0);
    if (rc < 0 && errno != EINTR) return tcp_fail(c, DCOMM_ESYSTEM, "tcp: poll: %s", strerror(errno));
    if (rc > 0 && (pf[0].revents & POLLIN)) {
      int err = atomic_load(&c->error);
      return tcp_fail(c, err ? err : DCOMM_EREVOKED, "tcp %s: communicator aborted", c->label);
    }
  }
}
