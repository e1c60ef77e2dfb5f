/*
 * tcp_conn.c: the links of the tcp backend. Each process listens on one
 * port and publishes "ip:port" in the store; a communicator is a full mesh
 * in which the higher rank connects to the lower one and opens with the
 * authenticated handshake, naming the communicator and its rank. A link for
 * a communicator this process has not created yet is parked until it is.
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

struct hello {
  uint64_t comm_id;
  uint32_t rank, size;
};

int tcp_listen_and_publish(struct tcp_ctx *ctx) {
  const struct dcomm_host *h = ctx->host;
  TCP_CHECK(h->sock_listen(h->listen_ip, 0, 1024, &ctx->lfd, &ctx->port));
  char key[64], val[80];
  snprintf(key, sizeof(key), "tcp/addr/%d", h->world_rank);
  if (strchr(h->listen_ip, ':')) snprintf(val, sizeof(val), "[%s]:%d", h->listen_ip, ctx->port);
  else snprintf(val, sizeof(val), "%s:%d", h->listen_ip, ctx->port);
  TCP_LOG(ctx, INFO, "listening for peers on %s", val);
  return h->store_set(h->store, key, val, strlen(val) + 1);
}

/* Loads every world rank's address once (the world comm's creation). */
static int load_addrs(struct tcp_ctx *ctx, double deadline) {
  const struct dcomm_host *h = ctx->host;
  if (ctx->addrs) return 0;
  ctx->addrs = calloc((size_t)h->world_size, sizeof(*ctx->addrs));
  if (!ctx->addrs) return h->err(DCOMM_ENOMEM, "tcp: out of memory");
  for (int r = 0; r < h->world_size; r++) {
    char key[64];
    void *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "tcp/addr/%d", r);
    double left = deadline - h->now();
    int rc = h->store_get(h->store, key, left > 0 ? left : 0.001, &val, &len);
    if (rc < 0) {
      free(ctx->addrs);
      ctx->addrs = NULL;
      return h->err(rc, "tcp: world rank %d never published its address (%s)", r,
                    rc == DCOMM_ETIMEDOUT ? "timed out; did it start?" : "store error");
    }
    if (len == 0 || len > sizeof(ctx->addrs[r]) || ((char *)val)[len - 1]) {
      free(val);
      return h->err(DCOMM_EPROTO, "tcp: malformed address for world rank %d in the store", r);
    }
    memcpy(ctx->addrs[r], val, len);
    free(val);
  }
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

static int park(struct tcp_ctx *ctx, int fd, const struct hello *hi) {
  if (ctx->nparked == ctx->cparked) {
    int nc = ctx->cparked ? 2 * ctx->cparked : 16;
    void *p = realloc(ctx->parked, sizeof(*ctx->parked) * (size_t)nc);
    if (!p) return DCOMM_ENOMEM;
    ctx->parked = p;
    ctx->cparked = nc;
  }
  ctx->parked[ctx->nparked++] = (struct tcp_parked){fd, hi->comm_id, hi->rank, hi->size};
  return 0;
}

static void adopt(struct tcp_comm *c, int peer, int fd) {
  c->ctx->host->sock_tune(fd, c->ctx->bufsize);
  c->peers[peer].fd = fd;
}

/* Takes parked links that belong to c. Returns how many were adopted. */
static int unpark(struct tcp_ctx *ctx, struct tcp_comm *c) {
  int got = 0;
  for (int i = 0; i < ctx->nparked;) {
    struct tcp_parked *p = &ctx->parked[i];
    if (p->comm_id == c->id && (int)p->size == c->size && (int)p->rank > c->rank && (int)p->rank < c->size &&
        c->peers[p->rank].fd < 0) {
      adopt(c, (int)p->rank, p->fd);
      got++;
      ctx->parked[i] = ctx->parked[--ctx->nparked];
    } else {
      i++;
    }
  }
  return got;
}

void tcp_close_parked(struct tcp_ctx *ctx) {
  for (int i = 0; i < ctx->nparked; i++) close(ctx->parked[i].fd);
  free(ctx->parked);
  ctx->parked = NULL;
  ctx->nparked = ctx->cparked = 0;
}

/* Accepts one link and runs the handshake; -1 in *fd when refused. */
static int accept_one(struct tcp_ctx *ctx, double deadline, int *fd, struct hello *hi) {
  const struct dcomm_host *h = ctx->host;
  *fd = -1;
  struct pollfd p = {.fd = ctx->lfd, .events = POLLIN};
  double left = deadline - h->now();
  if (left <= 0) return DCOMM_ETIMEDOUT;
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
  return 0;
}

int tcp_connect_mesh(struct tcp_ctx *ctx, struct tcp_comm *c, double deadline) {
  const struct dcomm_host *h = ctx->host;
  TCP_CHECK(load_addrs(ctx, deadline));
  /* Connect to every lower rank. */
  for (int j = 0; j < c->rank; j++) {
    char host[80];
    int port, fd;
    int w = c->world_ranks[j];
    if (split_addr(ctx->addrs[w], host, sizeof(host), &port) < 0)
      return h->err(DCOMM_EPROTO, "tcp: bad address '%s' for world rank %d", ctx->addrs[w], w);
    int rc = h->sock_connect(host, port, deadline, &fd);
    if (rc < 0) return h->err(rc, "tcp %s: cannot connect to rank %d (world rank %d at %s)", c->label, j, w, ctx->addrs[w]);
    struct hello hi = {c->id, (uint32_t)c->rank, (uint32_t)c->size};
    rc = h->hs_client(fd, 2 /* DCOMM_HS_PEER */, &hi, sizeof(hi), deadline);
    if (rc < 0) {
      close(fd);
      return h->err(rc, "tcp %s: handshake with rank %d (world rank %d) failed", c->label, j, w);
    }
    adopt(c, j, fd);
  }
  /* Accept every higher rank (some may already be parked). */
  int need = c->size - 1 - c->rank;
  need -= unpark(ctx, c);
  while (need > 0) {
    int fd;
    struct hello hi;
    int rc = accept_one(ctx, deadline, &fd, &hi);
    if (rc == DCOMM_ETIMEDOUT || (rc == 0 && fd < 0 && h->now() >= deadline)) {
      for (int j = c->rank + 1; j < c->size; j++)
        if (c->peers[j].fd < 0)
          return h->err(DCOMM_ETIMEDOUT, "tcp %s: rank %d (world rank %d) never connected before the timeout",
                        c->label, j, c->world_ranks[j]);
      return h->err(DCOMM_ETIMEDOUT, "tcp %s: timed out connecting", c->label);
    }
    if (rc < 0) return rc;
    if (fd < 0) continue;
    if (hi.comm_id == c->id && (int)hi.size == c->size && (int)hi.rank > c->rank && (int)hi.rank < c->size &&
        c->peers[hi.rank].fd < 0) {
      adopt(c, (int)hi.rank, fd);
      need--;
    } else if (hi.comm_id == c->id) {
      TCP_LOG(ctx, WARN, "tcp %s: refused a link claiming rank %u of %u", c->label, hi.rank, hi.size);
      close(fd);
    } else if (park(ctx, fd, &hi) < 0) {
      close(fd);
    }
  }
  return 0;
}
