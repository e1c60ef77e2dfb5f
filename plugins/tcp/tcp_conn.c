/*
 * tcp_conn.c: the links of the tcp backend's communicators. Each process
 * listens on one port (its listener thread: tcp_listen.c); the world's
 * ranks gather "ip:port", host identity and processors into one directory
 * through the store (host->store_allgather), once. A link opens with the
 * authenticated handshake, naming the communicator and the dialer's rank
 * there; when both ends are on one host the dialer offers a shared-memory
 * segment in that hello and the listener maps it (tcp_shm.c).
 *
 * Links are sparse: a communicator is created with the links to its ring
 * neighbours (which carry an abort around the whole ring), and an
 * operation that needs another peer dials it first (tcp_link): a rank
 * holds the links its algorithms use, O(log n) for every collective but
 * all_to_all, not n - 1. DCOMM_TCP_LINKS=eager makes every link at
 * creation instead. At the end, tcp_close_links says goodbye on every link
 * (a BYE frame after the data) and closes it without a reset.
 */
#include "config.h"
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Listen backlog: a rank of a large world may be connected to by many
 * peers at once (the kernel caps it at net.core.somaxconn). */
#define SOMAXCONN_WANTED 4096

/* This process's directory entry: "ip:port" NUL host-id NUL cpu-list NUL
 * (the list empty when it does not fit: see tcp_cpus.c). */
static int own_entry(struct tcp_ctx *ctx, char *val, size_t *len) {
  const struct dcomm_host *h = ctx->host;
  if (strchr(h->listen_ip, ':')) snprintf(val, 80, "[%s]:%d", h->listen_ip, ctx->port);
  else snprintf(val, 80, "%s:%d", h->listen_ip, ctx->port);
  size_t al = strlen(val) + 1, hl = strlen(ctx->host_id) + 1;
  memcpy(val + al, ctx->host_id, hl);
  char cpus[TCP_CPUS_LEN];
  (void)tcp_cpus_format(&ctx->cpus, cpus, sizeof(cpus));
  size_t cl = strlen(cpus) + 1;
  memcpy(val + al + hl, cpus, cl);
  *len = al + hl + cl;
  return 0;
}

/* Listens on one port for the links of every communicator; the address
 * goes into the world's directory when the first communicator loads it. */
int tcp_listen_and_publish(struct tcp_ctx *ctx) {
  const struct dcomm_host *h = ctx->host;
  TCP_CHECK(h->sock_listen(h->listen_ip, 0, SOMAXCONN_WANTED, &ctx->lfd, &ctx->port));
  char val[sizeof(struct tcp_addr)];
  size_t len;
  TCP_CHECK(own_entry(ctx, val, &len));
  TCP_LOG(ctx, INFO, "listening for peers on %s (host %s)", val, ctx->host_id);
  return 0;
}

/* Loads every world rank's address once (the world comm's creation), as
 * one directory gathered through the store: O(n) store requests for the
 * whole world, where fetching each rank's key would cost n per rank. */
static int load_addrs(struct tcp_ctx *ctx, double deadline) {
  const struct dcomm_host *h = ctx->host;
  if (ctx->addrs) return 0;
  char mine[sizeof(struct tcp_addr)];
  size_t mlen = 0;
  TCP_CHECK(own_entry(ctx, mine, &mlen));
  void *all = NULL;
  size_t alen = 0;
  double left = deadline - h->now();
  int rc = h->store_allgather(h->store, "tcp/addr", h->world_rank, h->world_size, mine, mlen,
                              left > 0 ? left : 0.001, &all, &alen);
  if (rc < 0) {
    char why[300]; /* which rank is missing (the store's message), copied before err rewrites it */
    snprintf(why, sizeof(why), "%s", dcomm_last_error());
    return h->err(rc, "tcp: the address directory of the world's %d ranks is not complete: %s (did every rank start?)",
                  h->world_size, why);
  }
  ctx->addrs = calloc((size_t)h->world_size, sizeof(*ctx->addrs));
  if (!ctx->addrs) {
    free(all);
    return h->err(DCOMM_ENOMEM, "tcp: out of memory");
  }
  const uint64_t *off = all;
  for (int r = 0; r < h->world_size; r++) {
    uint64_t a, b;
    memcpy(&a, off + r, sizeof(a));
    memcpy(&b, off + r + 1, sizeof(b));
    const char *val = (const char *)all + a;
    size_t len = (size_t)(b - a);
    size_t al = len ? strnlen(val, len) + 1 : 0;
    size_t hl = len > al ? strnlen(val + al, len - al) + 1 : 0, cl = len - al - hl;
    if (len == 0 || val[len - 1] || al > sizeof(ctx->addrs[r].addr) || hl > sizeof(ctx->addrs[r].host) ||
        cl > sizeof(ctx->addrs[r].cpus)) {
      free(all);
      free(ctx->addrs);
      ctx->addrs = NULL;
      return h->err(DCOMM_EPROTO, "tcp: malformed address for world rank %d in the store", r);
    }
    memcpy(ctx->addrs[r].addr, val, al);
    memcpy(ctx->addrs[r].host, val + al, hl);
    memcpy(ctx->addrs[r].cpus, val + al + hl, cl);
  }
  free(all);
  return 0;
}

static int split_addr(const char *addr, char *host, size_t hl, int *port) {
  const char *colon = strrchr(addr, ':');
  if (!colon) return DCOMM_EPROTO;
  size_t n = (size_t)(colon - addr);
  if (addr[0] == '[' && n >= 2) addr++, n -= 2;
  if (n >= hl) return DCOMM_EPROTO;
  memcpy(host, addr, n);
  host[n] = 0;
  *port = atoi(colon + 1);
  return 0;
}

static const char *const transport_names[] = {"auto", "shm", "tcp"};

/* The ring size of c's shared-memory links: DCOMM_SHM_RING_SIZE, lowered
 * so that the k(k-1) rings of c's k members on this host stay within
 * DCOMM_SHM_HOST_BUDGET (never below TCP_SHM_RING_MIN): a host's shared
 * memory then stays flat as ranks per host grow (up to 64 members at the
 * default budget, 64 KiB rings), where fixed rings grow with k squared. */
static size_t ring_for(struct tcp_ctx *ctx, const struct tcp_comm *c) {
  size_t k = (size_t)c->topo.nlocal; /* members on this host (tcp_topo.c) */
  size_t ring = ctx->shm_ring;
  if (k > 1) {
    size_t fit = ctx->shm_budget / (k * (k - 1));
    while (ring > TCP_SHM_RING_MIN && ring > fit) ring >>= 1;
  }
  return ring;
}

/* Puts a link in place (the comm's own thread only). With
 * DCOMM_TRANSPORT=shm a link without shared memory is an error. */
static int adopt(struct tcp_comm *c, int peer, int fd, struct tcp_shm *shm) {
  struct tcp_ctx *ctx = c->ctx;
  struct tcp_peer *p = &c->peers[peer];
  ctx->host->sock_tune(fd, ctx->bufsize);
  p->fd = fd;
  p->shm = shm;
  if (shm) {
    tcp_shm_set_fd(shm, fd);
    c->nshm++;
  }
  c->nlinks++;
  /* A link made after the engine's first step joins its watched set at
   * the next step's start (ep_begin takes the woff list). */
  if (c->ep_init && !p->watch_off) {
    c->woff[c->nwoff++] = peer;
    p->watch_off = 1;
  }
  if (!shm && ctx->transport == TCP_TR_SHM)
    return ctx->host->err(DCOMM_EINVAL,
                          "tcp %s: DCOMM_TRANSPORT=shm, but the link with rank %d (world rank %d) could not use shared "
                          "memory (its DCOMM_TRANSPORT is tcp, or the segment could not be created or mapped: see the "
                          "info log)",
                          c->label, peer, c->world_ranks[peer]);
  return 0;
}

/* A parked link taken for c: adopted, or closed if c has one already. */
static int place(struct tcp_comm *c, const struct tcp_parked *pk) {
  if (c->peers[pk->rank].fd >= 0) {
    close(pk->fd);
    tcp_shm_free(pk->shm);
    return 0;
  }
  return adopt(c, (int)pk->rank, pk->fd, pk->shm);
}

int tcp_links_adopt(struct tcp_comm *c) {
  unsigned serial = atomic_load(&c->ctx->park_serial);
  if (serial == c->park_seen) return 0;
  c->park_seen = serial;
  struct tcp_parked pk;
  while (tcp_parked_take(c->ctx, c->id, c->size, c->rank, -1, &pk)) TCP_CHECK(place(c, &pk));
  return 0;
}

/* Waits between looks at most this long, so that check runs. */
#define LINK_SLICE 0.1

static double until(double deadline, double slice, const struct dcomm_host *h) {
  double t = h->now() + slice;
  return t < deadline ? t : deadline;
}

/* Reads the listener's answer, looking at check between waits. */
static int read_answer(struct tcp_comm *c, int fd, double deadline, tcp_link_check check, void *arg,
                       struct tcp_link_answer *ans) {
  const struct dcomm_host *h = c->ctx->host;
  size_t got = 0;
  while (got < sizeof(*ans)) {
    ssize_t n = recv(fd, (char *)ans + got, sizeof(*ans) - got, MSG_DONTWAIT);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return DCOMM_EPEERLOST;
    if (h->now() >= deadline) return DCOMM_ETIMEDOUT;
    if (check) TCP_CHECK(check(c, arg));
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, (int)((until(deadline, LINK_SLICE, h) - h->now()) * 1000) + 1);
  }
  return ans->magic == TCP_MAGIC || ans->magic == TCP_REFUSE_MAGIC ? 0 : DCOMM_EPROTO;
}

/* A rank that takes longer than this to answer a handshake is stuck. */
#define TCP_HS_CLIENT_S 10.0

/* Dials peer j: connect, handshake, hello with a shared-memory offer when
 * j is on this host, the listener's answer. *refused: j dials this rank
 * too and its link wins (wait for it). */
static int dial(struct tcp_comm *c, int j, double deadline, tcp_link_check check, void *arg, struct tcp_parked *out,
                int *refused) {
  struct tcp_ctx *ctx = c->ctx;
  const struct dcomm_host *h = ctx->host;
  int w = c->world_ranks[j];
  char host[80];
  int port, fd = -1, rc;
  /* A copy: a shrink of the world may renumber the table meanwhile. */
  struct tcp_addr at;
  pthread_mutex_lock(&ctx->links_lock);
  at = ctx->addrs[w];
  pthread_mutex_unlock(&ctx->links_lock);
  if (split_addr(at.addr, host, sizeof(host), &port) < 0)
    return h->err(DCOMM_EPROTO, "tcp: bad address '%s' for world rank %d", at.addr, w);
  struct tcp_hello hi = {.comm_id = c->id, .rank = (uint32_t)c->rank, .size = (uint32_t)c->size, .shm_fd = -1};
  snprintf(hi.host, sizeof(hi.host), "%s", ctx->host_id);
  struct tcp_shm *shm = NULL;
  int memfd = -1;
  if (ctx->transport != TCP_TR_TCP && strcmp(at.host, ctx->host_id) == 0) {
    uint64_t nonce;
    char why[160] = "";
    if (tcp_shm_create(c->ring, &shm, &memfd, &nonce, why, sizeof(why)) == 0) {
      hi.shm_pid = (int32_t)getpid();
      hi.shm_fd = memfd;
      hi.shm_nonce = nonce;
      hi.shm_ring = c->ring;
    } else {
      TCP_LOG(ctx, WARN, "tcp %s: no shared memory for the link to rank %d: %s", c->label, j, why);
    }
  }
  /* Connect in slices: a check between them notices an abort. */
  for (;;) {
    rc = h->sock_connect(host, port, until(deadline, 4 * LINK_SLICE, h), &fd);
    if (rc != DCOMM_ETIMEDOUT || h->now() >= deadline) break;
    if (check && (rc = check(c, arg)) < 0) break;
  }
  if (rc < 0) {
    if (memfd >= 0) close(memfd);
    tcp_shm_free(shm);
    if (rc == DCOMM_EREVOKED || atomic_load(&c->error)) return rc;
    return h->err(rc, "tcp %s: cannot connect to rank %d (world rank %d at %s)", c->label, j, w, at.addr);
  }
  rc = h->hs_client(fd, 2 /* DCOMM_HS_PEER */, &hi, sizeof(hi), until(deadline, TCP_HS_CLIENT_S, h));
  struct tcp_link_answer ans = {0, 0};
  if (rc == 0) rc = read_answer(c, fd, until(deadline, TCP_HS_CLIENT_S, h), check, arg, &ans);
  if (memfd >= 0) close(memfd); /* mapped by now, or never will be */
  if (rc < 0 || ans.magic == TCP_REFUSE_MAGIC) {
    close(fd);
    tcp_shm_free(shm);
    if (rc == 0) *refused = 1;
    else if (rc != DCOMM_EREVOKED && !atomic_load(&c->error)) /* else check's own error */
      rc = h->err(rc, "tcp %s: handshake with rank %d (world rank %d at %s) failed", c->label, j, w, at.addr);
    return rc;
  }
  if (shm && !ans.shm) {
    TCP_LOG(ctx, INFO, "tcp %s: rank %d declined shared memory; using TCP", c->label, j);
    tcp_shm_free(shm);
    shm = NULL;
  }
  *out = (struct tcp_parked){fd, c->id, (uint32_t)j, (uint32_t)c->size, shm};
  return 0;
}

/* Waits for peer j to dial this rank. */
static int await(struct tcp_comm *c, int j, double deadline, tcp_link_check check, void *arg) {
  const struct dcomm_host *h = c->ctx->host;
  struct tcp_parked pk;
  for (;;) {
    if (tcp_parked_wait(c->ctx, c->id, c->size, c->rank, j, until(deadline, LINK_SLICE, h), &pk)) return place(c, &pk);
    if (h->now() >= deadline)
      return h->err(DCOMM_ETIMEDOUT, "tcp %s: rank %d (world rank %d) never connected before the timeout", c->label, j,
                    c->world_ranks[j]);
    if (check) TCP_CHECK(check(c, arg));
  }
}

int tcp_link(struct tcp_comm *c, int j, double deadline, tcp_link_check check, void *arg) {
  if (c->peers[j].fd >= 0) return 0;
  struct tcp_parked pk;
  int rc = tcp_dial_begin(c->ctx, c->id, c->size, c->rank, j, &pk);
  if (rc < 0) return rc;
  if (rc == 1) return place(c, &pk);
  int refused = 0;
  rc = dial(c, j, deadline, check, arg, &pk, &refused);
  tcp_dial_end(c->ctx, c->id, j, rc == 0 && !refused);
  if (rc < 0) return rc;
  return refused ? await(c, j, deadline, check, arg) : place(c, &pk);
}

/* A creation stops waiting when its generation is revoked. */
static int creation_check(struct tcp_comm *c, void *arg) {
  (void)arg;
  int (*cancelled)(void) = DCOMM_HOST_SERVICE(c->ctx->host, creation_cancelled);
  int rc = cancelled ? cancelled() : 0;
  if (rc < 0) return c->ctx->host->err(rc, "tcp %s: stopped making the communicator's links", c->label);
  return 0;
}

int tcp_links_open(struct tcp_ctx *ctx, struct tcp_comm *c, double deadline) {
  const struct dcomm_host *h = ctx->host;
  if (!ctx->addrs) ctx->addrs_comm = c->id; /* the first comm, the world's, loads the table */
  TCP_CHECK(load_addrs(ctx, deadline));
  TCP_CHECK(tcp_topo_build(c));
  c->ring = ctx->transport != TCP_TR_TCP ? ring_for(ctx, c) : 0;
  /* Forced shared memory needs every member on this host: every member
   * reads the same directory, so all of them fail here. */
  for (int j = 0; j < c->size && ctx->transport == TCP_TR_SHM; j++) {
    const char *peer_host = ctx->addrs[c->world_ranks[j]].host;
    if (strcmp(peer_host, ctx->host_id))
      return h->err(DCOMM_EINVAL,
                    "tcp %s: DCOMM_TRANSPORT=shm, but rank %d (world rank %d) is on another host (host id %s; this "
                    "one is %s): shared memory needs every member on one host",
                    c->label, j, c->world_ranks[j], peer_host, ctx->host_id);
  }
  /* The lower rank of a pair is dialed, the higher one waited for, so
   * that creation never dials both ways. */
  int prev = (c->rank + c->size - 1) % c->size, next = (c->rank + 1) % c->size;
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < c->size; j++) {
      if (j == c->rank || (!ctx->eager_all && j != prev && j != next) || (pass == 0) != (j < c->rank)) continue;
      TCP_CHECK(pass == 0 ? tcp_link(c, j, deadline, creation_check, NULL) : await(c, j, deadline, creation_check, NULL));
    }
  TCP_LOG(ctx, INFO,
          "tcp %s: %d link%s made at creation, %d in shared memory (DCOMM_TRANSPORT=%s; rings of %zu bytes); "
          "%s",
          c->label, c->nlinks, c->nlinks == 1 ? "" : "s", c->nshm, transport_names[ctx->transport], c->ring,
          ctx->eager_all ? "DCOMM_TCP_LINKS=eager" : "the others when first used");
  return 0;
}
void tcp_close_links(struct tcp_comm *c) {
  int clean = atomic_load(&c->error) == 0;
  for (int i = 0; i < c->size; i++) {
    struct tcp_peer *p = &c->peers[i];
    if (p->fd < 0) continue;
    if (clean && !p->closed && !p->mid_send) {
      struct tcp_hdr h = {.magic = TCP_MAGIC, .type = TCP_F_BYE};
      /* In order after the data, in the ring when there is one; a full ring
       * (data the peer has not read yet) sends it on the link's socket,
       * which the peer reads to its end once the ring is empty. */
      if (p->shm) {
        if (tcp_shm_put_frame(p->shm, &h, NULL, 0) < 0 && send(p->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
          /* best effort */
        }
      } else if (send(p->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */ }
    }
    shutdown(p->fd, SHUT_WR);
    /* Empty the receive queue so close() sends FIN, not a reset that could
     * destroy what the peer has yet to read. */
    char sink[4096];
    while (recv(p->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    close(p->fd);
    p->fd = -1;
    tcp_shm_free(p->shm);
    p->shm = NULL;
    tcp_peer_free_queue(p);
  }
}
