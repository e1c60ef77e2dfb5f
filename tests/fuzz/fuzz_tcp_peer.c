/*
 * fuzz_tcp_peer.c: fuzz target for what the tcp backend (plugins/tcp)
 * reads from a peer: the hello (and shared-memory offer) a connecting rank
 * sends after the authenticated handshake, and the frames (headers and
 * payloads) it sends during collectives. Each input gets a fresh tcp
 * backend context (its listener on loopback), driven through its ops
 * table with a host of this file's making, as rank 0 of a 2-rank world;
 * the fuzzer plays rank 1 from a thread: it connects, completes the real
 * handshake (src/util/auth.c) with the job's id and token, sends the
 * input's hello, then its frame stream, while rank 0 creates the
 * communicator and runs one collective (two with flag F_SECOND) under a
 * short deadline. Rank 0 must succeed or fail promptly, never crash, leak
 * memory or descriptors, or hang.
 *
 * Input: [0] the collective (modes[] below), [1] flags (F_*), [2] a signed
 * adjustment of the hello's length, [3..155) the hello (struct hello of
 * tcp_conn.c; zero-padded when short), then the stream rank 1 sends. With
 * F_SHM the fuzzer offers a real shared-memory segment (its pid, memfd,
 * nonce and ring size replace the hello's) and, when rank 0 maps it, puts
 * the stream into the ring as frames (a 40-byte header, then up to len
 * payload bytes each).
 *
 * Seeds: DCOMM_FUZZ_TCP_RECORD=DIR fuzz_tcp_peer writes one per
 * collective from real traffic (both ranks real backends in this process,
 * rank 1's link through a recording relay) and exits; make-seeds.sh runs
 * it.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "clock.h"
#include "dcomm.h"
#include "../proc_fds.h"
#include "error.h"
#include "fuzz_util.h"
#include "param.h"
#include "reduce.h"
#include "sock.h"
#include "tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define JOB "fuzz-job"
#define TOKEN "fuzz-token"
#define HOST_ID "fuzz-host"
#define COMM_ID 0x5eed0001ull
#define PEER_PURPOSE 2 /* DCOMM_HS_PEER */
#define OP_DEADLINE 0.1 /* seconds rank 0 gives each collective */

/* The hello of tcp_conn.c, as it goes on the wire (one architecture). */
struct fz_hello {
  uint64_t comm_id;
  uint32_t rank, size;
  int32_t shm_pid, shm_fd;
  uint64_t shm_nonce, shm_ring;
  char host[TCP_HOST_ID_LEN];
};
_Static_assert(sizeof(struct fz_hello) == 152, "the hello's wire size");
#define HDR_OFF 3
#define STREAM_OFF (HDR_OFF + sizeof(struct fz_hello))

enum { F_CHUNK = 1, F_RING = 2, F_SHM = 4, F_TCP = 8, F_SECOND = 16 };

struct mode {
  int coll;
  size_t count;
  int dtype, op, root, tag;
};
/* root: the root, or the peer of send/recv; tag 7 for p2p. PROBE: a probe
 * for rank 1's tag-7 message, then its receive. */
#define PROBE DCOMM_COLL_COUNT
static const struct mode modes[] = {
    {DCOMM_COLL_ALL_REDUCE, 16, DCOMM_FLOAT32, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_ALL_REDUCE, 3000, DCOMM_FLOAT32, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_BROADCAST, 64, DCOMM_INT32, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_BROADCAST, 64, DCOMM_INT32, DCOMM_SUM, 1, 0},
    {DCOMM_COLL_BROADCAST, 3000, DCOMM_INT32, DCOMM_SUM, 1, 0},
    {DCOMM_COLL_RECV, 32, DCOMM_UINT8, DCOMM_SUM, 1, 7},
    {DCOMM_COLL_SEND, 32, DCOMM_UINT8, DCOMM_SUM, 1, 7},
    {DCOMM_COLL_BARRIER, 0, DCOMM_UINT8, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_ALL_GATHER, 8, DCOMM_FLOAT32, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_REDUCE, 16, DCOMM_FLOAT64, DCOMM_MAX, 0, 0},
    {DCOMM_COLL_REDUCE, 16, DCOMM_FLOAT64, DCOMM_MAX, 1, 0},
    {DCOMM_COLL_REDUCE_SCATTER, 8, DCOMM_INT32, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_ALL_TO_ALL, 4, DCOMM_INT32, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_GATHER, 4, DCOMM_INT32, DCOMM_SUM, 0, 0},
    {DCOMM_COLL_SCATTER, 4, DCOMM_INT32, DCOMM_SUM, 1, 0},
    {DCOMM_COLL_ALL_TO_ALLV, 0, DCOMM_INT32, DCOMM_SUM, 0, 0},
    {PROBE, 24, DCOMM_UINT8, DCOMM_SUM, 1, 7},
};
#define NMODES (sizeof(modes) / sizeof(modes[0]))
static const size_t v_counts[2] = {3, 3}, v_displs[2] = {0, 3};
static const struct dcomm_vlayout vlayout = {v_counts, v_displs, v_counts, v_displs};

/* ---- the host: the core's services, a directory of this file's making ---- */

static int cur_flags;
static char relay_addr[80]; /* recording: where rank 1 finds rank 0 */
static atomic_int peer_final;  /* fuzzing: rank 1 made its one link (or failed to) */

static int host_log_enabled(int level, int subsys) {
  (void)level;
  (void)subsys;
  return 0;
}
static void host_log(int level, int subsys, const char *fmt, ...) {
  (void)level;
  (void)subsys;
  (void)fmt;
}
static int host_err(int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return dcomm__err(code, "%s", msg);
}
static const char *host_param(const char *name) {
  if (!strcmp(name, "DCOMM_TCP_CHUNK_SIZE")) return cur_flags & F_CHUNK ? "4096" : NULL;
  if (!strcmp(name, "DCOMM_ALGO")) return cur_flags & F_RING ? "ring,broadcast=pipeline" : NULL;
  if (!strcmp(name, "DCOMM_TRANSPORT")) return cur_flags & F_TCP ? "tcp" : NULL;
  if (!strcmp(name, "DCOMM_SHM_SPIN")) return "0";
  return NULL;
}
static int host_store_set(void *s, const char *key, const void *val, size_t len) {
  (void)s, (void)key, (void)val, (void)len;
  return dcomm__err(DCOMM_ENOTSUP, "fuzz host: no store");
}
static int host_store_get(void *s, const char *key, double timeout, void **val, size_t *len) {
  (void)s, (void)key, (void)timeout, (void)val, (void)len;
  return dcomm__err(DCOMM_ENOTSUP, "fuzz host: no store");
}
/* The directory: this rank's own entry, the other's made up (rank 1 is
 * never connected to by rank 0; rank 1 reaches rank 0 through the relay). */
static int host_allgather(void *s, const char *prefix, int rank, int n, const void *mine, size_t len, double timeout,
                          void **all, size_t *alllen) {
  (void)s, (void)prefix, (void)timeout;
  if (n != 2) return dcomm__err(DCOMM_EINVAL, "fuzz host: a world of 2");
  char other[160];
  size_t ol = (size_t)snprintf(other, sizeof(other), "%s", rank == 0 ? "127.0.0.1:9" : relay_addr) + 1;
  ol += (size_t)snprintf(other + ol, sizeof(other) - ol, "%s", HOST_ID) + 1;
  size_t total = 3 * sizeof(uint64_t) + len + ol;
  char *b = malloc(total);
  if (!b) abort();
  uint64_t off[3];
  off[0] = 3 * sizeof(uint64_t);
  off[1] = off[0] + (rank == 0 ? len : ol);
  off[2] = off[1] + (rank == 0 ? ol : len);
  memcpy(b, off, sizeof(off));
  memcpy(b + off[0], rank == 0 ? mine : other, rank == 0 ? len : ol);
  memcpy(b + off[1], rank == 0 ? other : mine, rank == 0 ? ol : len);
  *all = b;
  *alllen = total;
  return 0;
}
static int host_hs_server(int fd, double deadline, uint32_t *purpose, void *hello, size_t *hello_len) {
  struct dcomm_hs_peer peer;
  DCOMM_CHECK(dcomm__hs_server(fd, JOB, TOKEN, deadline, &peer));
  *purpose = peer.purpose;
  size_t n = peer.hello_len < *hello_len ? peer.hello_len : *hello_len;
  memcpy(hello, peer.hello, n);
  *hello_len = n;
  return 0;
}
static int host_hs_client(int fd, uint32_t purpose, const void *hello, size_t hello_len, double deadline) {
  return dcomm__hs_client(fd, JOB, TOKEN, purpose, hello, hello_len, deadline);
}
/* Rank 0's wait for links ends once the fuzzer's one link was made. */
static int host_cancelled(void) {
  return atomic_load(&peer_final) ? dcomm__err(DCOMM_EPEERLOST, "fuzz: rank 1 has no other link to offer") : 0;
}

static void host_fill(struct dcomm_host *h, int rank) {
  memset(h, 0, sizeof(*h));
  h->size = sizeof(*h);
  h->world_rank = rank;
  h->world_size = 2;
  h->local_rank = rank;
  h->local_size = 2;
  h->job_id = JOB;
  h->auth_token = TOKEN;
  h->listen_ip = "127.0.0.1";
  h->now = dcomm__now;
  h->log_enabled = host_log_enabled;
  h->log = host_log;
  h->err = host_err;
  h->param = host_param;
  h->parse_size = dcomm__parse_size;
  h->parse_bool = dcomm__parse_bool;
  h->store_set = host_store_set;
  h->store_get = host_store_get;
  h->store_allgather = host_allgather;
  h->creation_cancelled = host_cancelled;
  h->reduce = dcomm__reduce;
  h->reduce3 = dcomm__reduce3;
  h->scale_div = dcomm__scale_div;
  h->dtype_name = dcomm__dtype_name;
  h->op_name = dcomm__op_name;
  h->sock_listen = dcomm__sock_listen;
  h->sock_connect = dcomm__sock_connect;
  h->sock_tune = dcomm__sock_tune;
  h->hs_server = host_hs_server;
  h->hs_client = host_hs_client;
}

static const struct dcomm_backend_v1 *be = &dcomm__backend_tcp;

static struct tcp_ctx *ctx_open(const struct dcomm_host *h) {
  void *ctx;
  if (be->init(h, &ctx) < 0) {
    fprintf(stderr, "fuzz: tcp init: %s\n", dcomm_last_error());
    abort();
  }
  struct tcp_ctx *c = ctx;
  snprintf(c->host_id, sizeof(c->host_id), "%s", HOST_ID); /* seeds work on any machine */
  return c;
}

/* ---- one collective, as either rank runs it ---- */

struct bufs {
  char *send, *recv;
};

static int run_mode(void *comm, const struct mode *m, int rank, uint64_t seq, struct bufs *b, double deadline) {
  for (size_t i = 0; i < 2 * 3000 * 8; i++) b->send[i] = (char)(i * 7 + rank);
  struct dcomm_coll_args a = {.coll = m->coll, .count = m->count, .dtype = m->dtype, .op = m->op, .root = m->root,
                              .tag = m->tag, .seq = seq, .deadline = deadline};
  switch (m->coll) {
    case DCOMM_COLL_ALL_REDUCE:
    case DCOMM_COLL_REDUCE:
    case DCOMM_COLL_BROADCAST:
      memcpy(b->recv, b->send, 2 * 3000 * 8);
      a.recvbuf = b->recv;
      break;
    case DCOMM_COLL_RECV:
    case DCOMM_COLL_SEND:
    case PROBE:
      /* rank 1 plays the other side: rank 0 receives from 1, sends to 1 */
      a.coll = (m->coll == DCOMM_COLL_SEND) == (rank == 0) ? DCOMM_COLL_SEND : DCOMM_COLL_RECV;
      a.root = 1 - rank;
      a.seq = 0;
      a.recvbuf = a.coll == DCOMM_COLL_SEND ? b->send : b->recv;
      if (a.coll == DCOMM_COLL_RECV && m->coll == PROBE) {
        int src = -1;
        size_t nbytes = 0;
        int rc = be->probe(comm, DCOMM_ANY_SOURCE, m->tag, deadline, &src, &nbytes);
        if (rc <= 0) return rc;
        if (src != 1) abort(); /* the only peer */
        if (nbytes != m->count) return 0; /* its size differs: a receive of it would fail */
      }
      break;
    case DCOMM_COLL_ALL_TO_ALLV:
      a.v = &vlayout;
      a.sendbuf = b->send;
      a.recvbuf = b->recv;
      break;
    default:
      a.sendbuf = b->send;
      a.recvbuf = b->recv;
      break;
  }
  return be->run(comm, &a);
}

/* ---- rank 1, played by the fuzzer ---- */

struct peer {
  pthread_t th;
  int port, flags;
  const uint8_t *hello, *stream;
  size_t hello_len, slen;
};

/* A connection that closes at once: wakes rank 0's accept loop, which
 * then asks host_cancelled. */
static void poke(int port) {
  /* One try: once rank 0 is done its listener is gone (refused at once). */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0) abort();
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) { /* rank 0 no longer listens */ }
  close(fd);
}

static int read_answer(int fd, double until) {
  uint32_t ans[2];
  size_t got = 0;
  while (got < sizeof(ans) && dcomm__now() < until) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 20) <= 0) continue;
    ssize_t n = recv(fd, (char *)ans + got, sizeof(ans) - got, MSG_DONTWAIT);
    if (n <= 0) return 0;
    got += (size_t)n;
  }
  return got == sizeof(ans) && ans[0] == TCP_MAGIC && ans[1] == 1;
}

static void send_sock(int fd, const uint8_t *p, size_t n, double until) {
  size_t off = 0;
  char sink[4096];
  while (off < n && dcomm__now() < until) {
    struct pollfd pf = {.fd = fd, .events = POLLIN | POLLOUT};
    if (poll(&pf, 1, 20) <= 0) continue;
    if (pf.revents & POLLIN) (void)recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (pf.revents & POLLOUT) {
      ssize_t w = send(fd, p + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0 && errno != EAGAIN && errno != EINTR) return;
      if (w > 0) off += (size_t)w;
    }
    if (pf.revents & (POLLERR | POLLHUP)) return;
  }
}

/* The stream as ring frames: a header, then up to len payload bytes. */
static void send_ring(struct tcp_shm *shm, const uint8_t *p, size_t n, double until) {
  size_t off = 0;
  while (off + sizeof(struct tcp_hdr) <= n && dcomm__now() < until) {
    struct tcp_hdr h;
    memcpy(&h, p + off, sizeof(h));
    off += sizeof(h);
    size_t len = h.len < n - off ? (size_t)h.len : n - off;
    long put;
    while ((put = tcp_shm_put_frame(shm, &h, p + off, len)) < 0 && dcomm__now() < until) usleep(200);
    if (put < 0) return;
    size_t done = (size_t)put;
    while (done < len && dcomm__now() < until) {
      size_t k = tcp_shm_put(shm, p + off + done, len - done);
      if (!k) usleep(200);
      done += k;
    }
    off += len;
  }
}

static void *peer_main(void *arg) {
  struct peer *p = arg;
  double t0 = dcomm__now();
  int fd;
  if (dcomm__sock_connect("127.0.0.1", p->port, t0 + 2, &fd) < 0) {
    atomic_store(&peer_final, 1);
    poke(p->port);
    return NULL;
  }
  uint8_t hello[DCOMM_HS_MAX_HELLO];
  memset(hello, 0, sizeof(hello));
  memcpy(hello, p->hello, p->hello_len < sizeof(hello) ? p->hello_len : sizeof(hello));
  struct tcp_shm *shm = NULL;
  int memfd = -1;
  if (p->flags & F_SHM) {
    uint64_t nonce;
    char why[160];
    if (tcp_shm_create(TCP_SHM_RING_MIN, &shm, &memfd, &nonce, why, sizeof(why)) == 0) {
      struct fz_hello h;
      memcpy(&h, hello, sizeof(h));
      h.shm_pid = (int32_t)getpid();
      h.shm_fd = memfd;
      h.shm_nonce = nonce;
      h.shm_ring = TCP_SHM_RING_MIN;
      memcpy(hello, &h, sizeof(h));
    }
  }
  int rc = dcomm__hs_client(fd, JOB, TOKEN, PEER_PURPOSE, hello, p->hello_len, t0 + 2);
  if (rc == 0 && shm && !read_answer(fd, dcomm__now() + 1)) {
    tcp_shm_free(shm);
    shm = NULL;
  }
  if (memfd >= 0) close(memfd);
  atomic_store(&peer_final, 1);
  poke(p->port);
  if (rc == 0) {
    if (shm) {
      tcp_shm_set_fd(shm, fd);
      send_ring(shm, p->stream, p->slen, dcomm__now() + 1);
    } else {
      send_sock(fd, p->stream, p->slen, dcomm__now() + 1);
    }
    shutdown(fd, SHUT_WR);
    fuzz_drain(fd, 3.0); /* until rank 0 closes the link */
  }
  close(fd);
  tcp_shm_free(shm);
  return NULL;
}

/* ---- descriptors: none may stay behind an input ---- */

static struct bufs bufs;

static void setup(void) {
  setenv("DCOMM_LOG_LEVEL", "error", 1);
  bufs.send = calloc(2 * 3000 * 8, 1);
  bufs.recv = calloc(2 * 3000 * 8, 1);
  if (!bufs.send || !bufs.recv) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready, base_fds;
  if (!ready) {
    setup();
    ready = 1;
  }
  if (size < 3 || size > 65536) return 0;
  const struct mode *m = &modes[data[0] % NMODES];
  cur_flags = data[1];
  int hl = (int)sizeof(struct fz_hello) + (int8_t)data[2];
  struct peer p = {.flags = cur_flags, .hello = data + HDR_OFF, .hello_len = (size_t)hl};
  uint8_t hello[sizeof(struct fz_hello) + 128];
  memset(hello, 0, sizeof(hello));
  memcpy(hello, data + HDR_OFF, size - HDR_OFF < sizeof(hello) ? size - HDR_OFF : sizeof(hello));
  p.hello = hello;
  p.stream = size > STREAM_OFF ? data + STREAM_OFF : data;
  p.slen = size > STREAM_OFF ? size - STREAM_OFF : 0;

  double t0 = dcomm__now();
  struct dcomm_host host;
  host_fill(&host, 0);
  struct tcp_ctx *ctx = ctx_open(&host);
  atomic_store(&peer_final, 0);
  p.port = ctx->port;
  if (pthread_create(&p.th, NULL, peer_main, &p) != 0) abort();
  int world[2] = {0, 1};
  struct dcomm_comm_spec spec = {.comm_id = COMM_ID, .rank = 0, .size = 2, .world_ranks = world,
                                 .deadline = dcomm__now() + 2.0, .label = "fuzz"};
  void *comm = NULL;
  if (be->comm_create(ctx, &spec, &comm) == 0) {
    int rc = run_mode(comm, m, 0, 1, &bufs, dcomm__now() + OP_DEADLINE);
    if (rc >= 0 && (cur_flags & F_SECOND)) run_mode(comm, &modes[0], 0, 2, &bufs, dcomm__now() + OP_DEADLINE);
    be->comm_destroy(comm);
  }
  be->finalize(ctx);
  pthread_join(p.th, NULL);
  fuzz_check_bound(t0, 4.0, "one exchange with a fuzzed peer");
  int fds = proc_open_fds();
  if (!base_fds) base_fds = fds;
  if (fds > base_fds + 4) {
    fprintf(stderr, "fuzz: %d descriptors open after the input, %d after the first (a leak)\n", fds, base_fds);
    abort();
  }
  return 0;
}

/* ---- seeds: both ranks real, rank 1's bytes recorded ---- */

struct relay {
  pthread_t th;
  int lfd, to_port;
  char *rec;
  size_t len, cap;
};

/* Forwards one connection to rank 0, keeping what rank 1 sent. */
static void *relay_main(void *arg) {
  struct relay *r = arg;
  struct pollfd lp = {.fd = r->lfd, .events = POLLIN};
  if (poll(&lp, 1, 5000) <= 0) abort(); /* rank 1 never came */
  int a = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC), b;
  if (a < 0 || dcomm__sock_connect("127.0.0.1", r->to_port, dcomm__now() + 5, &b) < 0) abort();
  int open_a = 1, open_b = 1;
  char buf[65536];
  while (open_a || open_b) {
    struct pollfd pf[2] = {{.fd = open_a ? a : -1, .events = POLLIN}, {.fd = open_b ? b : -1, .events = POLLIN}};
    if (poll(pf, 2, 5000) <= 0) break;
    if (pf[0].revents) {
      ssize_t n = recv(a, buf, sizeof(buf), 0);
      if (n <= 0) {
        open_a = 0;
        shutdown(b, SHUT_WR);
      } else {
        if (r->len + (size_t)n > r->cap) {
          r->cap = 2 * (r->len + (size_t)n);
          r->rec = realloc(r->rec, r->cap);
          if (!r->rec) abort();
        }
        memcpy(r->rec + r->len, buf, (size_t)n);
        r->len += (size_t)n;
        fuzz_write_all(b, buf, (size_t)n);
      }
    }
    if (pf[1].revents) {
      ssize_t n = recv(b, buf, sizeof(buf), 0);
      if (n <= 0) {
        open_b = 0;
        shutdown(a, SHUT_WR);
      } else {
        fuzz_write_all(a, buf, (size_t)n);
      }
    }
  }
  close(a);
  close(b);
  return NULL;
}

struct rank1 {
  pthread_t th;
  const struct mode *m;
  int rc;
};

static void *rank1_main(void *arg) {
  struct rank1 *r = arg;
  struct dcomm_host h;
  host_fill(&h, 1);
  struct tcp_ctx *ctx = ctx_open(&h);
  int world[2] = {0, 1};
  struct dcomm_comm_spec spec = {.comm_id = COMM_ID, .rank = 1, .size = 2, .world_ranks = world,
                                 .deadline = dcomm__now() + 5, .label = "rank1"};
  void *comm;
  struct bufs b = {calloc(2 * 3000 * 8, 1), calloc(2 * 3000 * 8, 1)};
  r->rc = be->comm_create(ctx, &spec, &comm);
  if (r->rc == 0) {
    r->rc = run_mode(comm, r->m, 1, 1, &b, dcomm__now() + 5);
    if (r->rc >= 0 && (cur_flags & F_SECOND)) r->rc = run_mode(comm, &modes[0], 1, 2, &b, dcomm__now() + 5);
    be->comm_destroy(comm);
  }
  be->finalize(ctx);
  free(b.send);
  free(b.recv);
  return NULL;
}

/* shm_copy: also a copy of the seed that offers shared memory (F_SHM),
 * its stream going into the ring. */
static void record_one(const char *dir, unsigned mi, int flags, const char *name, int shm_copy) {
  cur_flags = flags;
  struct relay rl = {.lfd = -1};
  int rport;
  if (dcomm__sock_listen("127.0.0.1", 0, 4, &rl.lfd, &rport) < 0) abort();
  snprintf(relay_addr, sizeof(relay_addr), "127.0.0.1:%d", rport);
  struct dcomm_host host;
  host_fill(&host, 0);
  struct tcp_ctx *ctx = ctx_open(&host);
  rl.to_port = ctx->port;
  if (pthread_create(&rl.th, NULL, relay_main, &rl) != 0) abort();
  struct rank1 r1 = {.m = &modes[mi]};
  if (pthread_create(&r1.th, NULL, rank1_main, &r1) != 0) abort();
  int world[2] = {0, 1};
  struct dcomm_comm_spec spec = {.comm_id = COMM_ID, .rank = 0, .size = 2, .world_ranks = world,
                                 .deadline = dcomm__now() + 5, .label = "rank0"};
  void *comm;
  int rc = be->comm_create(ctx, &spec, &comm);
  if (rc == 0) {
    rc = run_mode(comm, &modes[mi], 0, 1, &bufs, dcomm__now() + 5);
    if (rc >= 0 && (flags & F_SECOND)) rc = run_mode(comm, &modes[0], 0, 2, &bufs, dcomm__now() + 5);
    be->comm_destroy(comm);
  }
  pthread_join(r1.th, NULL);
  be->finalize(ctx);
  pthread_join(rl.th, NULL);
  close(rl.lfd);
  if (rc < 0 || r1.rc < 0) {
    fprintf(stderr, "fuzz: recording %s failed: %s\n", name, dcomm_last_error());
    exit(1);
  }
  /* c2s: the handshake answer (head, job id, hello, MAC), then frames. */
  const uint8_t *c = (const uint8_t *)rl.rec;
  if (rl.len < 16) abort();
  size_t jl = (size_t)c[12] << 8 | c[13], hl = (size_t)c[14] << 8 | c[15];
  size_t fr = 16 + jl + hl + 32;
  if (hl != sizeof(struct fz_hello) || rl.len < fr) abort();
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  uint8_t head[3] = {(uint8_t)mi, (uint8_t)flags, 0};
  fwrite(head, 1, 3, f);
  fwrite(c + 16 + jl, 1, hl, f);
  fwrite(c + fr, 1, rl.len - fr, f);
  fclose(f);
  if (shm_copy) {
    snprintf(path, sizeof(path), "%s/%s-shm", dir, name);
    if (!(f = fopen(path, "wb"))) abort();
    head[1] = (uint8_t)((flags & ~F_TCP) | F_SHM);
    fwrite(head, 1, 3, f);
    fwrite(c + 16 + jl, 1, hl, f);
    fwrite(c + fr, 1, rl.len - fr, f);
    fclose(f);
  }
  free(rl.rec);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *dir = getenv("DCOMM_FUZZ_TCP_RECORD");
  if (!dir) return 0;
  setup();
  char name[64];
  for (unsigned mi = 0; mi < NMODES; mi++) {
    snprintf(name, sizeof(name), "m%02u", mi);
    record_one(dir, mi, F_TCP, name, mi == 0 || mi == 3 || mi == 5 || mi == 9);
  }
  record_one(dir, 1, F_TCP | F_CHUNK | F_RING, "m01-ring-chunks", 0);
  record_one(dir, 4, F_TCP | F_CHUNK | F_RING, "m04-pipeline", 0);
  record_one(dir, 0, F_TCP | F_SECOND, "m00-twice", 0);
  record_one(dir, 5, F_TCP | F_SECOND, "m05-then-allreduce", 0);
  exit(0);
}
