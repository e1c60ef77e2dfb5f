/*
 * tcp_listen.c: the listener of the tcp backend and the links it hands
 * over. One thread per process accepts every link that peers open to it,
 * whatever the communicator, runs the authenticated handshake, maps a
 * shared-memory segment the peer offers, and answers: the link is taken
 * (with or without shared memory) or refused. A taken link waits in the
 * parked list until its communicator's own thread adopts it (tcp_conn.c):
 * no other thread ever touches a communicator's links.
 *
 * Links are made when first needed, so two ranks may dial each other at
 * once. The rule that leaves one link: an incoming link from a lower rank
 * that this process is dialing, or has dialed, itself is refused; the
 * higher rank's link is the one both keep. The dialing list records who
 * dials whom (and who did, until the communicator is gone: a lower rank's
 * dial may arrive after the higher one's succeeded), under the same lock
 * as the parked list, so that the choice and the park are one step.
 *
 * Because the thread answers at any time, a rank dialing a peer never
 * waits for that peer to enter a dcomm call.
 */
#include "config.h"
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* How long the listener gives a connecting peer to complete the
 * handshake: a stranger that connects and says nothing holds it no
 * longer than this. */
#define TCP_HS_SERVER_S 5.0

struct tcp_dial {
  uint64_t comm_id;
  int peer, me;
};

static int grow(void **arr, int *cap, int have, size_t elem) {
  if (have < *cap) return 0;
  int nc = *cap ? 2 * *cap : 16;
  void *p = realloc(*arr, elem * (size_t)nc);
  if (!p) return -1;
  *arr = p;
  *cap = nc;
  return 0;
}

/* With links_lock held: takes the parked link of (comm_id, peer) (peer -1:
 * any of the comm's) into out. Links whose rank does not fit the comm are
 * dropped. 1 taken, 0 none. */
static int take_locked(struct tcp_ctx *ctx, uint64_t comm_id, int size, int me, int peer, struct tcp_parked *out) {
  for (int i = 0; i < ctx->nparked; i++) {
    struct tcp_parked *p = &ctx->parked[i];
    if (p->comm_id != comm_id || (peer >= 0 && (int)p->rank != peer)) continue;
    struct tcp_parked got = *p;
    ctx->parked[i] = ctx->parked[--ctx->nparked];
    if ((int)got.size != size || (int)got.rank >= size || (int)got.rank == me) {
      TCP_LOG(ctx, WARN, "refused a link claiming rank %u of %u of a communicator of %d", got.rank, got.size, size);
      close(got.fd);
      tcp_shm_free(got.shm);
      i--;
      continue;
    }
    *out = got;
    return 1;
  }
  return 0;
}

int tcp_parked_take(struct tcp_ctx *ctx, uint64_t comm_id, int size, int me, int peer, struct tcp_parked *out) {
  pthread_mutex_lock(&ctx->links_lock);
  int got = take_locked(ctx, comm_id, size, me, peer, out);
  pthread_mutex_unlock(&ctx->links_lock);
  return got;
}

int tcp_parked_wait(struct tcp_ctx *ctx, uint64_t comm_id, int size, int me, int peer, double until,
                    struct tcp_parked *out) {
  const struct dcomm_host *h = ctx->host;
  pthread_mutex_lock(&ctx->links_lock);
  int got;
  while (!(got = take_locked(ctx, comm_id, size, me, peer, out))) {
    double left = until - h->now();
    if (left <= 0) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)(left * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&ctx->links_cond, &ctx->links_lock, &ts);
  }
  pthread_mutex_unlock(&ctx->links_lock);
  return got;
}

int tcp_dial_begin(struct tcp_ctx *ctx, uint64_t comm_id, int size, int me, int peer, struct tcp_parked *out) {
  pthread_mutex_lock(&ctx->links_lock);
  int got = take_locked(ctx, comm_id, size, me, peer, out);
  if (!got) {
    if (grow((void **)&ctx->dialing, &ctx->cdialing, ctx->ndialing, sizeof(*ctx->dialing)) < 0) got = -1;
    else ctx->dialing[ctx->ndialing++] = (struct tcp_dial){comm_id, peer, me};
  }
  pthread_mutex_unlock(&ctx->links_lock);
  return got < 0 ? ctx->host->err(DCOMM_ENOMEM, "tcp: out of memory") : got;
}

void tcp_dial_end(struct tcp_ctx *ctx, uint64_t comm_id, int peer, int made) {
  if (made) return; /* the record stays: see the top of this file */
  pthread_mutex_lock(&ctx->links_lock);
  for (int i = 0; i < ctx->ndialing; i++)
    if (ctx->dialing[i].comm_id == comm_id && ctx->dialing[i].peer == peer) {
      ctx->dialing[i] = ctx->dialing[--ctx->ndialing];
      break;
    }
  pthread_mutex_unlock(&ctx->links_lock);
}

void tcp_parked_forget(struct tcp_ctx *ctx, uint64_t comm_id) {
  pthread_mutex_lock(&ctx->links_lock);
  for (int i = 0; i < ctx->nparked;) {
    struct tcp_parked *p = &ctx->parked[i];
    if (p->comm_id != comm_id) {
      i++;
      continue;
    }
    close(p->fd);
    tcp_shm_free(p->shm);
    ctx->parked[i] = ctx->parked[--ctx->nparked];
  }
  for (int i = 0; i < ctx->ndialing;) {
    if (ctx->dialing[i].comm_id == comm_id) ctx->dialing[i] = ctx->dialing[--ctx->ndialing];
    else i++;
  }
  pthread_mutex_unlock(&ctx->links_lock);
}

/* Maps the peer's shared-memory offer when this process allows shared
 * memory and the peer is on this host; NULL otherwise (logged). */
static struct tcp_shm *take_offer(struct tcp_ctx *ctx, const struct tcp_hello *hi) {
  if (hi->shm_fd < 0) return NULL;
  struct tcp_shm *shm = NULL;
  char why[300] = "this rank's DCOMM_TRANSPORT is tcp";
  char host[TCP_HOST_ID_LEN];
  memcpy(host, hi->host, sizeof(host));
  host[sizeof(host) - 1] = 0;
  if (ctx->transport != TCP_TR_TCP) {
    if (strcmp(host, ctx->host_id)) snprintf(why, sizeof(why), "it is on another host (%s, not %s)", host, ctx->host_id);
    else tcp_shm_attach(hi->shm_pid, hi->shm_fd, hi->shm_nonce, (size_t)hi->shm_ring, &shm, why, sizeof(why));
  }
  if (!shm) TCP_LOG(ctx, INFO, "declined shared memory offered by world rank %u's link: %s", hi->rank, why);
  return shm;
}

/* One accepted connection: handshake, offer, the choice, the answer. */
static void serve(struct tcp_ctx *ctx, int s) {
  const struct dcomm_host *h = ctx->host;
  uint32_t purpose = 0;
  struct tcp_hello hi;
  size_t hl = sizeof(hi);
  int rc = h->hs_server(s, h->now() + TCP_HS_SERVER_S, &purpose, &hi, &hl);
  if (rc < 0 || purpose != 2 /* DCOMM_HS_PEER */ || hl != sizeof(hi)) {
    TCP_LOG(ctx, WARN, "refused a connection on the peer port (handshake failed or not a peer)");
    close(s);
    return;
  }
  struct tcp_shm *shm = take_offer(ctx, &hi);
  int refuse = 0;
  pthread_mutex_lock(&ctx->links_lock);
  for (int i = 0; i < ctx->ndialing; i++) {
    const struct tcp_dial *d = &ctx->dialing[i];
    if (d->comm_id == hi.comm_id && d->peer == (int)hi.rank && (int)hi.rank < d->me) refuse = 1;
  }
  for (int i = 0; i < ctx->nparked && !refuse; i++) /* a second link for one pair */
    if (ctx->parked[i].comm_id == hi.comm_id && ctx->parked[i].rank == hi.rank) refuse = 1;
  if (!refuse && grow((void **)&ctx->parked, &ctx->cparked, ctx->nparked, sizeof(*ctx->parked)) < 0) refuse = 1;
  /* The answer goes out before the link is parked: once parked, its
   * communicator may send on it, and the dialer reads the answer first. */
  struct tcp_link_answer ans = {refuse ? TCP_REFUSE_MAGIC : TCP_MAGIC, !refuse && shm};
  int sent = send(s, &ans, sizeof(ans), MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof(ans);
  if (!refuse && sent) {
    ctx->parked[ctx->nparked++] = (struct tcp_parked){s, hi.comm_id, hi.rank, hi.size, shm};
    atomic_fetch_add(&ctx->park_serial, 1);
    pthread_cond_broadcast(&ctx->links_cond);
  }
  pthread_mutex_unlock(&ctx->links_lock);
  if (refuse || !sent) {
    if (!sent) TCP_LOG(ctx, INFO, "world rank %u's link closed during its handshake", hi.rank);
    tcp_shm_free(shm);
    close(s);
  }
}

static void *listener_main(void *arg) {
  struct tcp_ctx *ctx = arg;
  for (;;) {
    struct pollfd pf[2] = {{.fd = ctx->lfd, .events = POLLIN}, {.fd = ctx->stop_fd, .events = POLLIN}};
    int n = poll(pf, 2, -1);
    if (n < 0 && errno != EINTR) break;
    if (pf[1].revents) break;
    if (!(pf[0].revents & POLLIN)) continue;
    int s = accept4(ctx->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s >= 0) serve(ctx, s);
  }
  return NULL;
}

int tcp_listener_start(struct tcp_ctx *ctx) {
  const struct dcomm_host *h = ctx->host;
  ctx->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ctx->stop_fd < 0) return h->err(DCOMM_ESYSTEM, "tcp: eventfd: %s", strerror(errno));
  int rc = pthread_create(&ctx->listener, NULL, listener_main, ctx);
  if (rc) {
    close(ctx->stop_fd);
    ctx->stop_fd = -1;
    return h->err(DCOMM_ESYSTEM, "tcp: cannot start the listener thread: %s", strerror(rc));
  }
  ctx->listener_on = 1;
  return 0;
}

void tcp_listener_stop(struct tcp_ctx *ctx) {
  if (ctx->listener_on) {
    uint64_t one = 1;
    if (write(ctx->stop_fd, &one, sizeof(one)) < 0) { /* the thread still stops at its next wake */ }
    pthread_join(ctx->listener, NULL);
    ctx->listener_on = 0;
  }
  if (ctx->stop_fd >= 0) close(ctx->stop_fd);
  ctx->stop_fd = -1;
  for (int i = 0; i < ctx->nparked; i++) {
    close(ctx->parked[i].fd);
    tcp_shm_free(ctx->parked[i].shm);
  }
  free(ctx->parked);
  free(ctx->dialing);
  ctx->parked = NULL;
  ctx->dialing = NULL;
  ctx->nparked = ctx->cparked = ctx->ndialing = ctx->cdialing = 0;
}
