/*
 * tcp_conn.c: the links of the tcp backend. Each process listens on one
 * port; the world's ranks gather "ip:port" and host identity into one
 * directory through the store (host->store_allgather). A communicator is a
 * full mesh in which the higher rank connects to the lower one and opens
 * with the authenticated handshake, naming the communicator and its rank.
 * A link for a communicator this process has not created yet is parked
 * until it is. When both ends of a link are on one host, the connecting side offers a shared-memory segment in
 * its hello, and the accepting side maps it and answers yes or no
 * (tcp_shm.c). At the end, tcp_close_links says goodbye on every link (a
 * BYE frame after the data) and closes it without a reset.
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

struct hello {
  uint64_t comm_id;
  uint32_t rank, size;
  /* Shared-memory offer: shm_fd < 0 when none. */
  int32_t shm_pid, shm_fd;
  uint64_t shm_nonce, shm_ring;
  char host[TCP_HOST_ID_LEN];
};

/* The accepting side's answer to an offer. */
struct shm_answer {
  uint32_t magic;
  int32_t ok;
};

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

static int park(struct tcp_ctx *ctx, int fd, const struct hello *hi, struct tcp_shm *shm) {
  if (ctx->nparked == ctx->cparked) {
    int nc = ctx->cparked ? 2 * ctx->cparked : 16;
    void *p = realloc(ctx->parked, sizeof(*ctx->parked) * (size_t)nc);
    if (!p) return DCOMM_ENOMEM;
    ctx->parked = p;
    ctx->cparked = nc;
  }
  ctx->parked[ctx->nparked++] = (struct tcp_parked){fd, hi->comm_id, hi->rank, hi->size, shm};
  return 0;
}

static void adopt(struct tcp_comm *c, int peer, int fd, struct tcp_shm *shm) {
  c->ctx->host->sock_tune(fd, c->ctx->bufsize);
  c->peers[peer].fd = fd;
  c->peers[peer].shm = shm;
  if (shm) tcp_shm_set_fd(shm, fd);
}

/* Takes parked links that belong to c. Returns how many were adopted. */
static int unpark(struct tcp_ctx *ctx, struct tcp_comm *c) {
  int got = 0;
  for (int i = 0; i < ctx->nparked;) {
    struct tcp_parked *p = &ctx->parked[i];
    if (p->comm_id == c->id && (int)p->size == c->size && (int)p->rank > c->rank && (int)p->rank < c->size &&
        c->peers[p->rank].fd < 0) {
      adopt(c, (int)p->rank, p->fd, p->shm);
      got++;
      ctx->parked[i] = ctx->parked[--ctx->nparked];
    } else {
      i++;
    }
  }
  return got;
}

void tcp_close_parked(struct tcp_ctx *ctx) {
  for (int i = 0; i < ctx->nparked; i++) {
    close(ctx->parked[i].fd);
    tcp_shm_free(ctx->parked[i].shm);
  }
  free(ctx->parked);
  ctx->parked = NULL;
  ctx->nparked = ctx->cparked = 0;
}

/* The accepting side of a shared-memory offer: map the segment when this
 * process allows shared memory and the peer is on this host; answer. */
static struct tcp_shm *answer_offer(struct tcp_ctx *ctx, int fd, const struct hello *hi) {
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
  struct shm_answer ans = {TCP_MAGIC, shm != NULL};
  if (send(fd, &ans, sizeof(ans), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(ans)) {
    tcp_shm_free(shm);
    return NULL;
  }
  if (!shm) TCP_LOG(ctx, INFO, "declined shared memory offered by world rank %u's link: %s", hi->rank, why);
  return shm;
}

/* Accepts one link and runs the handshake; -1 in *fd when refused. */
static int accept_one(struct tcp_ctx *ctx, double deadline, int *fd, struct hello *hi, struct tcp_shm **shm) {
  const struct dcomm_host *h = ctx->host;
  *fd = -1;
  *shm = NULL;
  struct pollfd p = {.fd = ctx->lfd, .events = POLLIN};
  double left = deadline - h->now();
  if (left <= 0) return DCOMM_ETIMEDOUT;
  if (left > 0.5) left = 0.5; /* the caller looks for a cancelled creation between waits */
  int n = poll(&p, 1, (int)(left * 1000) + 1);
  if (n < 0 && errno != EINTR) return h->err(DCOMM_ESYSTEM, "tcp: poll on the listener: %s", strerror(errno));
  if (n <= 0) return 0;
  int s = accept4(ctx->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (s < 0) return 0;
  uint32_t purpose = 0;
  struct hello buf;
  size_t hl = sizeof(buf);
  double hs_deadline = h->now() + 10.0;
  if (hs_deadline > deadline) hs_deadline = deadline;
  int rc = h->hs_server(s, hs_deadline, &purpose, &buf, &hl);
  if (rc < 0 || purpose != 2 /* DCOMM_HS_PEER */ || hl != sizeof(buf)) {
    TCP_LOG(ctx, WARN, "refused a connection on the peer port (handshake failed or not a peer)");
    close(s);
    return 0;
  }
  *fd = s;
  *hi = buf;
  *shm = answer_offer(ctx, s, &buf);
  return 0;
}

/* Reads the answer to a shared-memory offer within the deadline. */
static int read_answer(int fd, double deadline, const struct dcomm_host *h, struct shm_answer *ans) {
  size_t got = 0;
  while (got < sizeof(*ans)) {
    ssize_t n = recv(fd, (char *)ans + got, sizeof(*ans) - got, MSG_DONTWAIT);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return DCOMM_EPEERLOST;
    double left = deadline - h->now();
    if (left <= 0) return DCOMM_ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, (int)(left * 1000) + 1);
  }
  return ans->magic == TCP_MAGIC ? 0 : DCOMM_EPROTO;
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

int tcp_connect_mesh(struct tcp_ctx *ctx, struct tcp_comm *c, double deadline) {
  const struct dcomm_host *h = ctx->host;
  if (!ctx->addrs) ctx->addrs_comm = c->id; /* the first comm, the world's, loads the table */
  TCP_CHECK(load_addrs(ctx, deadline));
  TCP_CHECK(tcp_topo_build(c));
  size_t ring = ctx->transport != TCP_TR_TCP ? ring_for(ctx, c) : 0;
  /* Connect to every lower rank. */
  for (int j = 0; j < c->rank; j++) {
    char host[80];
    int port, fd;
    int w = c->world_ranks[j];
    if (split_addr(ctx->addrs[w].addr, host, sizeof(host), &port) < 0)
      return h->err(DCOMM_EPROTO, "tcp: bad address '%s' for world rank %d", ctx->addrs[w].addr, w);
    int same = strcmp(ctx->addrs[w].host, ctx->host_id) == 0;
    struct hello hi = {.comm_id = c->id, .rank = (uint32_t)c->rank, .size = (uint32_t)c->size, .shm_fd = -1};
    snprintf(hi.host, sizeof(hi.host), "%s", ctx->host_id);
    struct tcp_shm *shm = NULL;
    int memfd = -1;
    char why[160] = "";
    if (same && ctx->transport != TCP_TR_TCP) {
      uint64_t nonce;
      if (tcp_shm_create(ring, &shm, &memfd, &nonce, why, sizeof(why)) == 0) {
        hi.shm_pid = (int32_t)getpid();
        hi.shm_fd = memfd;
        hi.shm_nonce = nonce;
        hi.shm_ring = ring;
      } else {
        TCP_LOG(ctx, WARN, "tcp %s: no shared memory for the link to rank %d: %s", c->label, j, why);
      }
    }
    int rc = h->sock_connect(host, port, deadline, &fd);
    if (rc < 0) {
      if (memfd >= 0) close(memfd);
      tcp_shm_free(shm);
      return h->err(rc, "tcp %s: cannot connect to rank %d (world rank %d at %s)", c->label, j, w, ctx->addrs[w].addr);
    }
    rc = h->hs_client(fd, 2 /* DCOMM_HS_PEER */, &hi, sizeof(hi), deadline);
    struct shm_answer ans = {0, 0};
    if (rc == 0 && shm) rc = read_answer(fd, deadline, h, &ans);
    if (memfd >= 0) close(memfd); /* mapped by now, or never will be */
    if (rc < 0) {
      close(fd);
      tcp_shm_free(shm);
      return h->err(rc, "tcp %s: handshake with rank %d (world rank %d) failed", c->label, j, w);
    }
    if (shm && !ans.ok) {
      TCP_LOG(ctx, INFO, "tcp %s: rank %d declined shared memory; using TCP", c->label, j);
      tcp_shm_free(shm);
      shm = NULL;
    }
    adopt(c, j, fd, shm);
  }
  /* Accept every higher rank (some may already be parked). */
  int need = c->size - 1 - c->rank;
  need -= unpark(ctx, c);
  while (need > 0) {
    int fd;
    struct hello hi;
    struct tcp_shm *shm;
    int rc = accept_one(ctx, deadline, &fd, &hi, &shm);
    if (rc == DCOMM_ETIMEDOUT || (rc == 0 && fd < 0 && h->now() >= deadline)) {
      for (int j = c->rank + 1; j < c->size; j++)
        if (c->peers[j].fd < 0)
          return h->err(DCOMM_ETIMEDOUT, "tcp %s: rank %d (world rank %d) never connected before the timeout",
                        c->label, j, c->world_ranks[j]);
      return h->err(DCOMM_ETIMEDOUT, "tcp %s: timed out connecting", c->label);
    }
    if (rc < 0) return rc;
    if (fd < 0) {
      int (*cancelled)(void) = DCOMM_HOST_SERVICE(h, creation_cancelled);
      if (cancelled && (rc = cancelled()) < 0)
        return h->err(rc, "tcp %s: stopped waiting for %d more rank%s to connect", c->label, need,
                      need == 1 ? "" : "s");
      continue;
    }
    if (hi.comm_id == c->id && (int)hi.size == c->size && (int)hi.rank > c->rank && (int)hi.rank < c->size &&
        c->peers[hi.rank].fd < 0) {
      adopt(c, (int)hi.rank, fd, shm);
      need--;
    } else if (hi.comm_id == c->id) {
      TCP_LOG(ctx, WARN, "tcp %s: refused a link claiming rank %u of %u", c->label, hi.rank, hi.size);
      close(fd);
      tcp_shm_free(shm);
    } else if (park(ctx, fd, &hi, shm) < 0) {
      close(fd);
      tcp_shm_free(shm);
    }
  }
  /* Every member builds the whole mesh first, so that with a forced shm
   * transport all of them fail here, none at the timeout. */
  int nshm = 0;
  for (int j = 0; j < c->size; j++) {
    if (j == c->rank) continue;
    const char *peer_host = ctx->addrs[c->world_ranks[j]].host;
    if (c->peers[j].shm) nshm++;
    else if (ctx->transport == TCP_TR_SHM && strcmp(peer_host, ctx->host_id))
      return h->err(DCOMM_EINVAL,
                    "tcp %s: DCOMM_TRANSPORT=shm, but rank %d (world rank %d) is on another host (host id %s; this "
                    "one is %s): shared memory needs every member on one host",
                    c->label, j, c->world_ranks[j], peer_host, ctx->host_id);
    else if (ctx->transport == TCP_TR_SHM)
      return h->err(DCOMM_EINVAL,
                    "tcp %s: DCOMM_TRANSPORT=shm, but the link with rank %d (world rank %d) could not use shared "
                    "memory (its DCOMM_TRANSPORT is tcp, or the segment could not be created or mapped: see the "
                    "info log)",
                    c->label, j, c->world_ranks[j]);
  }
  c->nshm = nshm;
  TCP_LOG(ctx, INFO, "tcp %s: %d of %d links in shared memory (DCOMM_TRANSPORT=%s; this rank's rings: %zu bytes)",
          c->label, nshm, c->size - 1, transport_names[ctx->transport], ring);
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
