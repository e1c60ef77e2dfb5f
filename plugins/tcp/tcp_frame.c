/*
 * tcp_frame.c: the frames of the tcp backend's engine. Reading a frame
 * header and payload from a peer's socket or shared-memory ring (with the
 * deadline and abort checks), breaking a communicator on a failure (an
 * ABORT frame to every peer), taking in control frames (ABORT, BYE, WAKE,
 * unexpected point-to-point messages) that arrive while an operation waits,
 * and checking each header against the collective the receiver is in
 * (DCOMM_EMISMATCH names both calls). tcp_engine.c progresses the
 * transfers built on them.
 */
#include "config.h"
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *const coll_names[DCOMM_COLL_COUNT] = {
    "none", "all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter",
    "reduce_scatter", "all_to_all", "barrier", "send", "recv", "all_to_allv"};

const char *tcp_coll_name(int c) { return c >= 0 && c < DCOMM_COLL_COUNT ? coll_names[c] : "unknown"; }

int tcp_world_of(const struct tcp_comm *c, int r) { return c->world_ranks[r]; }

int tcp_fail(struct tcp_comm *c, int err, const char *fmt, ...) {
  int expected = 0;
  pthread_mutex_lock(&c->qlock);
  if (atomic_compare_exchange_strong(&c->error, &expected, err)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
    va_end(ap);
  }
  err = atomic_load(&c->error);
  char msg[TCP_MAX_ABORT_MSG];
  memcpy(msg, c->errmsg, sizeof(msg));
  pthread_mutex_unlock(&c->qlock);
  /* Tell every peer, once, so that ranks not linked to the failure learn. */
  if (!c->abort_sent) {
    c->abort_sent = 1;
    for (int i = 0; i < c->size; i++) {
      struct tcp_peer *p = &c->peers[i];
      if (i == c->rank || p->fd < 0) continue;
      if (!p->closed && !p->mid_send) {
        struct tcp_hdr h = {.magic = TCP_MAGIC, .type = TCP_F_ABORT, .root = err, .len = strlen(msg)};
        struct iovec iov[2] = {{&h, sizeof(h)}, {msg, h.len}};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
        if (sendmsg(p->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */ }
      }
      shutdown(p->fd, SHUT_WR);
    }
  }
  return c->ctx->host->err(err, "%s", msg);
}

/* Reads exactly len bytes from the socket (used for short tails: ABORT
 * messages, queued p2p payloads) bounded by the deadline and the abort
 * descriptor. */
static int read_sock_full(struct tcp_comm *c, int peer, void *buf, size_t len, double deadline) {
  struct tcp_peer *p = &c->peers[peer];
  char *b = buf;
  while (len > 0) {
    ssize_t n = recv(p->fd, b, len, MSG_DONTWAIT);
    if (n > 0) {
      b += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      p->closed = 1;
      return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d (world rank %d) closed its link in the middle of a message",
                      c->label, peer, tcp_world_of(c, peer));
    }
    struct pollfd pf[2] = {{.fd = p->fd, .events = POLLIN}, {.fd = c->abort_fd, .events = POLLIN}};
    double left = deadline - c->ctx->host->now();
    if (left <= 0)
      return tcp_fail(c, DCOMM_ETIMEDOUT, "tcp %s: timed out reading from rank %d", c->label, peer);
    poll(pf, 2, (int)(left * 1000) + 1);
    if (pf[1].revents & POLLIN) return tcp_fail(c, DCOMM_EREVOKED, "tcp %s: communicator aborted", c->label);
  }
  return 0;
}

int tcp_lost_msg(struct tcp_comm *c, int peer, const char *what) {
  struct tcp_peer *p = &c->peers[peer];
  if (p->departed || p->bye_on_sock) return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: rank %d (world rank %d) has finalized", c->label, peer, tcp_world_of(c, peer));
  return tcp_fail(c, DCOMM_EPEERLOST, "tcp %s: lost rank %d (world rank %d): its link closed%s (the process died or aborted)",
                  c->label, peer, tcp_world_of(c, peer), what);
}

/* An ABORT header arrived from peer: read its message, break the comm. */
static int abort_from(struct tcp_comm *c, int peer, const struct tcp_hdr *h) {
  char msg[TCP_MAX_ABORT_MSG] = "";
  size_t ml = h->len < sizeof(msg) - 1 ? h->len : sizeof(msg) - 1;
  int err = h->root;
  if (err >= 0 || err < -100) err = DCOMM_EPEERLOST;
  if (read_sock_full(c, peer, msg, ml, c->ctx->host->now() + 1.0) == 0) msg[ml] = 0;
  return tcp_fail(c, err, "tcp %s: rank %d (world rank %d) aborted the communicator: %s", c->label, peer,
                  tcp_world_of(c, peer), msg);
}

/* Reads what the socket of a shared-memory link holds: wake-ups (dropped),
 * an ABORT (breaks the comm), a BYE that found the ring full (noted for
 * when the ring is empty) or the end of file (sets closed). */
int tcp_shm_drain(struct tcp_comm *c, int peer) {
  struct tcp_peer *p = &c->peers[peer];
  while (!p->closed) {
    ssize_t n = recv(p->fd, (char *)&p->shdr + p->sgot, sizeof(p->shdr) - p->sgot, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n <= 0) {
      p->closed = 1;
      return 0;
    }
    p->sgot += (size_t)n;
    if (p->sgot < sizeof(p->shdr)) continue;
    p->sgot = 0;
    if (p->shdr.magic != TCP_MAGIC)
      return tcp_fail(c, DCOMM_EPROTO, "tcp %s: garbage on the link from rank %d (world rank %d)", c->label, peer,
                      tcp_world_of(c, peer));
    if (p->shdr.type == TCP_F_ABORT) return abort_from(c, peer, &p->shdr);
    if (p->shdr.type == TCP_F_BYE) { /* finalized with its ring full: the last frame */
      p->bye_on_sock = 1;
      continue;
    }
    if (p->shdr.type != TCP_F_WAKE)
      return tcp_fail(c, DCOMM_EPROTO, "tcp %s: unexpected frame type %d on the socket of rank %d's shared-memory link",
                      c->label, p->shdr.type, peer);
  }
  return 0;
}

/* read_hdr for a shared-memory link: the ring, then the closed socket. */
static int read_ring_hdr(struct tcp_comm *c, int peer) {
  struct tcp_peer *p = &c->peers[peer];
  if (p->have_hdr) return 1;
  if (tcp_shm_get_hdr(p->shm, &p->hdr)) {
    if (p->hdr.magic != TCP_MAGIC)
      return tcp_fail(c, DCOMM_EPROTO, "tcp %s: garbage in the ring from rank %d (world rank %d)", c->label, peer,
                      tcp_world_of(c, peer));
    p->hgot = sizeof(p->hdr);
    p->have_hdr = 1;
    return 1;
  }
  /* The peer wrote everything before its socket closed: empty is final. */
  return p->closed ? tcp_lost_msg(c, peer, "") : 0;
}

/* Reads what has arrived of the payload of peer's unexpected message in
 * progress (p->rx_uq), without waiting: 1 complete (queued), 0 not yet,
 * < 0 the link broke. */
static int fill_uq(struct tcp_comm *c, int peer) {
  struct tcp_peer *p = &c->peers[peer];
  struct tcp_uq *q = p->rx_uq;
  while (p->rx_got < q->hdr.len) {
    if (p->rx_got == q->cap) {
      size_t cap = q->cap * 2 < q->hdr.len ? q->cap * 2 : (size_t)q->hdr.len;
      void *d = realloc(q->data, cap);
      if (!d) return tcp_fail(c, DCOMM_ENOMEM, "tcp %s: out of memory queueing a message from rank %d", c->label, peer);
      q->data = d;
      q->cap = cap;
    }
    char *dst = (char *)q->data + p->rx_got;
    size_t want = q->cap - p->rx_got;
    if (p->shm) {
      size_t n = tcp_shm_get(p->shm, dst, want);
      if (n) {
        p->rx_got += n;
        continue;
      }
      return p->closed ? tcp_lost_msg(c, peer, " in the middle of a message") : 0;
    }
    ssize_t n = recv(p->fd, dst, want, MSG_DONTWAIT);
    if (n > 0) {
      p->rx_got += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    p->closed = 1;
    return tcp_lost_msg(c, peer, " in the middle of a message");
  }
  q->serial = ++c->uq_serial;
  if (p->uq_tail) p->uq_tail->next = q;
  else p->uq_head = q;
  p->uq_tail = q;
  p->rx_uq = NULL;
  p->rx_got = 0;
  return 1;
}

/* Reads what is missing of the peer's next header (after the rest of an
 * unexpected message in progress). 1: complete, 0: would block, <0:
 * error (EOF included). */
int tcp_read_hdr(struct tcp_comm *c, int peer) {
  struct tcp_peer *p = &c->peers[peer];
  if (p->rx_uq) {
    int rc = fill_uq(c, peer);
    if (rc <= 0) return rc;
  }
  if (p->shm) return read_ring_hdr(c, peer);
  while (!p->have_hdr) {
    ssize_t n = recv(p->fd, (char *)&p->hdr + p->hgot, sizeof(p->hdr) - p->hgot, MSG_DONTWAIT);
    if (n > 0) {
      p->hgot += (size_t)n;
      if (p->hgot == sizeof(p->hdr)) {
        if (p->hdr.magic != TCP_MAGIC)
          return tcp_fail(c, DCOMM_EPROTO, "tcp %s: garbage on the link from rank %d (world rank %d)", c->label, peer,
                          tcp_world_of(c, peer));
        p->have_hdr = 1;
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    p->closed = 1;
    return tcp_lost_msg(c, peer, p->hgot ? " in the middle of a header" : "");
  }
  return 1;
}

/* Handles a complete header that is not the data the caller waits for:
 * ABORT breaks the comm with the sender's error, BYE marks the peer gone,
 * P2P is queued (its payload read as it arrives). Returns 1 if consumed,
 * 0 if it is data to keep, <0 error. */
int tcp_take_control(struct tcp_comm *c, int peer, double deadline) {
  (void)deadline;
  struct tcp_peer *p = &c->peers[peer];
  struct tcp_hdr *h = &p->hdr;
  if (h->type == TCP_F_ABORT) {
    p->have_hdr = 0;
    p->hgot = 0;
    return abort_from(c, peer, h);
  }
  if (h->type == TCP_F_BYE) {
    p->departed = 1;
    p->have_hdr = 0;
    p->hgot = 0;
    return 1;
  }
  if (h->type == TCP_F_ACK) { /* the peer has read a single-copy send */
    p->cma_acked++;
    p->have_hdr = 0;
    p->hgot = 0;
    return 1;
  }
  if (h->type == TCP_F_P2P) {
    if (h->len > MAX_UNEXPECTED)
      return tcp_fail(c, DCOMM_EPROTO, "tcp %s: rank %d sent an oversized message (%llu bytes)", c->label, peer,
                      (unsigned long long)h->len);
    struct tcp_uq *q = calloc(1, sizeof(*q));
    if (q) {
      q->cap = h->len < UQ_FIRST_CAP ? (size_t)h->len : UQ_FIRST_CAP;
      q->data = malloc(q->cap ? q->cap : 1);
    }
    if (!q || !q->data) {
      if (q) free(q);
      return tcp_fail(c, DCOMM_ENOMEM, "tcp %s: out of memory queueing a message from rank %d", c->label, peer);
    }
    q->hdr = *h;
    p->have_hdr = 0;
    p->hgot = 0;
    /* Read as it comes (tcp_read_hdr continues it): waiting here for the
     * whole payload would deadlock two ranks that send each other
     * messages larger than what the link buffers. */
    p->rx_uq = q;
    p->rx_got = 0;
    int rc = fill_uq(c, peer);
    return rc < 0 ? rc : 1;
  }
  if (h->type == TCP_F_DATA) return 0;
  return tcp_fail(c, DCOMM_EPROTO, "tcp %s: unknown frame type %d from rank %d", c->label, h->type, peer);
}

void tcp_describe_args(char *buf, size_t len, const struct dcomm_host *h, int coll, uint64_t seq, uint64_t count,
                          int dtype, int op, int root) {
  if (coll == DCOMM_COLL_BARRIER)
    snprintf(buf, len, "barrier(seq %llu)", (unsigned long long)seq);
  else if (coll == DCOMM_COLL_ALL_TO_ALLV) /* count differs per pair of ranks */
    snprintf(buf, len, "all_to_allv(seq %llu, %s)", (unsigned long long)seq, h->dtype_name(dtype));
  else if (coll == DCOMM_COLL_SEND || coll == DCOMM_COLL_RECV)
    snprintf(buf, len, "%s(count %llu, %s, tag %d)", tcp_coll_name(coll), (unsigned long long)count, h->dtype_name(dtype),
             root);
  else {
    int reducing = coll == DCOMM_COLL_ALL_REDUCE || coll == DCOMM_COLL_REDUCE || coll == DCOMM_COLL_REDUCE_SCATTER;
    int rooted = coll == DCOMM_COLL_REDUCE || coll == DCOMM_COLL_BROADCAST || coll == DCOMM_COLL_GATHER ||
                 coll == DCOMM_COLL_SCATTER;
    char opbuf[32] = "", rootbuf[32] = "";
    if (reducing) snprintf(opbuf, sizeof(opbuf), ", op %s", h->op_name(op));
    if (rooted) snprintf(rootbuf, sizeof(rootbuf), ", root %d", root);
    snprintf(buf, len, "%s(seq %llu, count %llu, %s%s%s)", tcp_coll_name(coll), (unsigned long long)seq,
             (unsigned long long)count, h->dtype_name(dtype), opbuf, rootbuf);
  }
}

/* An all_to_allv frame's count is that pair's block (tcp_check_hdr). */
int tcp_sig_matches(const struct tcp_hdr *h, const struct dcomm_coll_args *a) {
  int mine_coll = a->coll == DCOMM_COLL_RECV ? DCOMM_COLL_SEND : (int)a->coll;
  int count_ok = a->coll == DCOMM_COLL_ALL_TO_ALLV || h->count == a->count;
  return h->coll == mine_coll && h->seq == a->seq && count_ok && h->dtype == (uint8_t)a->dtype &&
         h->op == (uint8_t)a->op && h->root == (a->coll == DCOMM_COLL_RECV ? a->tag : a->root);
}

int tcp_mismatch(struct tcp_comm *c, int peer, const struct dcomm_coll_args *a) {
  const struct tcp_hdr *h = &c->peers[peer].hdr;
  const struct dcomm_host *host = c->ctx->host;
  char theirs[160], mine[160];
  tcp_describe_args(theirs, sizeof(theirs), host, h->coll, h->seq, h->count, h->dtype, h->op, h->root);
  tcp_describe_args(mine, sizeof(mine), host, (int)a->coll, a->seq, a->count, (int)a->dtype, (int)a->op,
                a->coll == DCOMM_COLL_RECV ? a->tag : a->root);
  return tcp_fail(c, DCOMM_EMISMATCH, "tcp %s: mismatched calls: rank %d (world rank %d) called %s but rank %d called %s",
                  c->label, peer, tcp_world_of(c, peer), theirs, c->rank, mine);
}

/* Checks a DATA/P2P header against what this rank called. */
int tcp_check_hdr(struct tcp_comm *c, int peer, const struct tcp_xop *op, const struct dcomm_coll_args *a) {
  const struct tcp_hdr *h = &c->peers[peer].hdr;
  int sig_ok = !(c->ctx->check_mismatch || a->coll == DCOMM_COLL_RECV) || tcp_sig_matches(h, a);
  if (sig_ok && h->len != op->len && a->coll == DCOMM_COLL_ALL_TO_ALLV && h->coll == DCOMM_COLL_ALL_TO_ALLV &&
      h->dtype == (uint8_t)a->dtype) {
    size_t es = dcomm_dtype_size(a->dtype);
    return tcp_fail(c, DCOMM_EMISMATCH,
                    "tcp %s: mismatched all_to_allv counts: rank %d (world rank %d) sends %llu %s elements to rank "
                    "%d, but rank %d expects %zu from it (recvcounts[%d])",
                    c->label, peer, tcp_world_of(c, peer), (unsigned long long)(h->len / es),
                    c->ctx->host->dtype_name(a->dtype), c->rank, c->rank, op->len / es, peer);
  }
  return sig_ok && h->len == op->len ? 0 : tcp_mismatch(c, peer, a);
}

/* Frees the unexpected point-to-point messages queued on a peer. */
void tcp_peer_free_queue(struct tcp_peer *p) {
  if (p->rx_uq) {
    free(p->rx_uq->data);
    free(p->rx_uq);
    p->rx_uq = NULL;
  }
  while (p->uq_head) {
    struct tcp_uq *q = p->uq_head;
    p->uq_head = q->next;
    free(q->data);
    free(q);
  }
  p->uq_tail = NULL;
}
