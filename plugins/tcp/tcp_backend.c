/*
 * tcp_backend.c: the tcp backend's ops table (dcomm_backend_v1). Requests
 * go into a per-communicator FIFO; whoever waits runs them in order on its
 * own thread, and test() hands the queue to a worker thread so that posted
 * operations progress without a waiter. comm_abort may be called from any
 * thread: it records the reason and wakes the running operation through an
 * eventfd. A blocking call with nothing queued runs at once (run), with
 * no request allocated; so does probe.
 */
#include "config.h"
#include "tcp.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct tcp_req {
  struct tcp_req *next;
  struct tcp_comm *comm;
  struct dcomm_coll_args args;
  int done, rc;
  char errmsg[TCP_MAX_ABORT_MSG];
};

static size_t param_size(const struct dcomm_host *h, const char *name, size_t def) {
  size_t v;
  const char *s = h->param(name);
  return s && h->parse_size(s, &v) == 0 ? v : def;
}

/* Returns the index of word (length len) in names, or -1. */
static int pick(const char *word, size_t len, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) == len && !strncmp(word, names[i], len)) return i;
  return -1;
}

/* DCOMM_ALGO: "auto", "ring", "rd", "hier" and "rhd" name all_reduce algorithms;
 * "all_reduce=..." and "broadcast=..." set one collective's. */
static int parse_algo(struct tcp_tuning *t, const char *s) {
  static const char *const ar[] = {"auto", "ring", "rd", "hier", "rhd"}, *const bc[] = {"auto", "tree", "pipeline"};
  const int nar = (int)(sizeof(ar) / sizeof(*ar)), nbc = (int)(sizeof(bc) / sizeof(*bc));
  while (*s) {
    size_t len = strcspn(s, ",");
    const char *eq = memchr(s, '=', len);
    int v;
    if (!eq) {
      if ((v = pick(s, len, ar, nar)) < 0) return -1;
      t->algo = v;
    } else if ((size_t)(eq - s) == 10 && !strncmp(s, "all_reduce", 10)) {
      if ((v = pick(eq + 1, len - 11, ar, nar)) < 0) return -1;
      t->algo = v;
    } else if ((size_t)(eq - s) == 9 && !strncmp(s, "broadcast", 9)) {
      if ((v = pick(eq + 1, len - 10, bc, nbc)) < 0) return -1;
      t->bcast_algo = v;
    } else {
      return -1;
    }
    s += len;
    if (*s == ',') s++;
  }
  return 0;
}

/* The settings a communicator is created with (struct tcp_tuning), from
 * the variables, else the tuning file, else the defaults (host->param). */
static int tcp_read_tuning(const struct dcomm_host *host, struct tcp_tuning *t) {
  memset(t, 0, sizeof(*t));
  t->small = param_size(host, "DCOMM_TCP_SMALL_THRESHOLD", 262144);
  t->cma_min = param_size(host, "DCOMM_SHM_CMA_MIN", 16384);
  const char *fwd = host->param("DCOMM_SHM_CMA_FWD_MIN");
  t->cma_fwd_auto = !fwd || !*fwd || !strcmp(fwd, "auto");
  t->cma_fwd_min = TCP_CMA_FWD_FLOOR;
  if (!t->cma_fwd_auto && host->parse_size(fwd, &t->cma_fwd_min) != 0)
    return host->err(DCOMM_EINVAL, "DCOMM_SHM_CMA_FWD_MIN='%s' is neither auto nor a size (bytes, or with K, M, G)", fwd);
  const char *spin = host->param("DCOMM_SHM_SPIN");
  t->shm_spin = (spin && *spin ? strtol(spin, NULL, 10) : 50) * 1e-6;
  if (t->shm_spin < 0) t->shm_spin = 0;
  const char *algo = host->param("DCOMM_ALGO");
  if (algo && parse_algo(t, algo) < 0)
    return host->err(DCOMM_EINVAL,
                     "DCOMM_ALGO='%s' is not a comma-separated list of auto, ring, rd, hier, rhd, all_reduce=auto|ring|rd|hier|rhd, "
                     "broadcast=auto|tree|pipeline",
                     algo);
  return 0;
}

static int tcp_init(const struct dcomm_host *host, void **out) {
  struct tcp_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return host->err(DCOMM_ENOMEM, "tcp: out of memory");
  ctx->host = host;
  ctx->lfd = ctx->stop_fd = -1;
  ctx->chunk = param_size(host, "DCOMM_TCP_CHUNK_SIZE", 262144);
  ctx->chunk = (ctx->chunk + 63) & ~(size_t)63; /* whole elements of any dtype */
  if (ctx->chunk < 4096) ctx->chunk = 4096;
  ctx->bufsize = param_size(host, "DCOMM_TCP_BUFSIZE", 4194304);
  const char *cm = host->param("DCOMM_CHECK_MISMATCH");
  if (!cm || host->parse_bool(cm, &ctx->check_mismatch) != 0) ctx->check_mismatch = 1;
  struct tcp_tuning t;
  int rc = tcp_read_tuning(host, &t); /* a bad value fails dcomm_init, not a later group */
  if (rc < 0) {
    free(ctx);
    return rc;
  }
  const char *tr = host->param("DCOMM_TRANSPORT");
  if (tr && !strcmp(tr, "shm")) ctx->transport = TCP_TR_SHM;
  else if (tr && !strcmp(tr, "tcp")) ctx->transport = TCP_TR_TCP;
  else if (tr && *tr && strcmp(tr, "auto")) {
    free(ctx);
    return host->err(DCOMM_EINVAL, "DCOMM_TRANSPORT='%s' is not auto, shm or tcp", tr);
  }
  ctx->shm_ring = tcp_shm_ring_size(param_size(host, "DCOMM_SHM_RING_SIZE", 1048576));
  ctx->shm_budget = param_size(host, "DCOMM_SHM_HOST_BUDGET", (size_t)1 << 28);
  tcp_cpus_own(ctx);
  const char *hid = host->param("DCOMM_HOST_ID");
  if (hid && *hid) snprintf(ctx->host_id, sizeof(ctx->host_id), "id:%s", hid);
  else tcp_host_id(ctx->host_id, sizeof(ctx->host_id));
  const char *links = host->param("DCOMM_TCP_LINKS");
  if (links && *links && strcmp(links, "lazy") && strcmp(links, "eager")) {
    free(ctx);
    return host->err(DCOMM_EINVAL, "DCOMM_TCP_LINKS='%s' is not lazy or eager", links);
  }
  ctx->eager_all = links && !strcmp(links, "eager");
  pthread_mutex_init(&ctx->links_lock, NULL);
  pthread_cond_init(&ctx->links_cond, NULL);
  rc = tcp_listen_and_publish(ctx);
  if (rc == 0) rc = tcp_listener_start(ctx);
  if (rc < 0) {
    if (ctx->lfd >= 0) close(ctx->lfd);
    pthread_mutex_destroy(&ctx->links_lock);
    pthread_cond_destroy(&ctx->links_cond);
    free(ctx);
    return rc;
  }
  *out = ctx;
  return 0;
}

static int tcp_finalize(void *vctx) {
  struct tcp_ctx *ctx = vctx;
  tcp_listener_stop(ctx);
  if (ctx->lfd >= 0) close(ctx->lfd);
  pthread_mutex_destroy(&ctx->links_lock);
  pthread_cond_destroy(&ctx->links_cond);
  free(ctx->addrs);
  free(ctx);
  return 0;
}

static void comm_free(struct tcp_comm *c) {
  if (c->peers) {
    /* Links peers made to this rank and it never used get their goodbye
     * too (a peer reading their end without one would take it for a
     * death). */
    if (!atomic_load(&c->error)) (void)tcp_links_adopt(c);
    tcp_close_links(c);
    free(c->peers);
  }
  tcp_parked_forget(c->ctx, c->id);
  if (c->abort_fd >= 0) close(c->abort_fd);
  if (c->epfd >= 0) close(c->epfd);
  free(c->ep_on);
  free(c->woff);
  free(c->stage[0]);
  free(c->stage[1]);
  free(c->tmp);
  free(c->cma_stage);
  tcp_topo_free(&c->topo);
  free(c->world_ranks);
  free(c->recv_mark);
  free(c->pf);
  free(c->pf_who);
  pthread_mutex_destroy(&c->qlock);
  pthread_cond_destroy(&c->qcond);
  free(c);
}

static int tcp_comm_create(void *vctx, const struct dcomm_comm_spec *spec, void **out) {
  struct tcp_ctx *ctx = vctx;
  const struct dcomm_host *h = ctx->host;
  struct tcp_tuning t;
  int trc = tcp_read_tuning(h, &t);
  if (trc < 0) return trc;
  struct tcp_comm *c = calloc(1, sizeof(*c));
  if (!c) return h->err(DCOMM_ENOMEM, "tcp: out of memory");
  pthread_mutex_init(&c->qlock, NULL);
  pthread_cond_init(&c->qcond, NULL);
  c->ctx = ctx;
  c->t = t;
  c->id = spec->comm_id;
  c->rank = spec->rank;
  c->size = spec->size;
  snprintf(c->label, sizeof(c->label), "%s", spec->label ? spec->label : "comm");
  c->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  c->epfd = epoll_create1(EPOLL_CLOEXEC);
  c->peers = calloc((size_t)spec->size, sizeof(*c->peers));
  c->world_ranks = malloc(sizeof(int) * (size_t)spec->size);
  c->recv_mark = calloc((size_t)spec->size, 1);
  c->ep_on = calloc((size_t)spec->size, 1);
  c->woff = malloc(sizeof(int) * (size_t)spec->size);
  if (c->abort_fd < 0 || c->epfd < 0 || !c->peers || !c->world_ranks || !c->recv_mark || !c->ep_on || !c->woff) {
    comm_free(c);
    return h->err(DCOMM_ENOMEM, "tcp: cannot allocate a communicator");
  }
  memcpy(c->world_ranks, spec->world_ranks, sizeof(int) * (size_t)spec->size);
  for (int i = 0; i < spec->size; i++) c->peers[i].fd = -1;
  int rc = tcp_links_open(ctx, c, spec->deadline);
  if (rc < 0) {
    atomic_store(&c->error, rc); /* no goodbyes on half-made links */
    comm_free(c);
    return rc;
  }
  TCP_LOG(ctx, INFO, "tcp %s: connected rank %d of %d", c->label, c->rank, c->size);
  *out = c;
  return 0;
}

static void stop_worker(struct tcp_comm *c) {
  pthread_mutex_lock(&c->qlock);
  int started = c->worker_started;
  c->worker_stop = 1;
  pthread_cond_broadcast(&c->qcond);
  pthread_mutex_unlock(&c->qlock);
  if (started) pthread_join(c->worker, NULL);
}

static int tcp_comm_destroy(void *vc) {
  struct tcp_comm *c = vc;
  stop_worker(c);
  while (c->qhead) { /* posted but never waited for */
    struct tcp_req *r = c->qhead;
    c->qhead = r->next;
    free(r);
  }
  comm_free(c);
  return 0;
}

static int tcp_comm_abort(void *vc, int reason) {
  struct tcp_comm *c = vc;
  int expected = 0;
  if (reason >= 0) reason = DCOMM_EREVOKED;
  pthread_mutex_lock(&c->qlock);
  if (atomic_compare_exchange_strong(&c->error, &expected, reason))
    snprintf(c->errmsg, sizeof(c->errmsg), "tcp %s: communicator aborted (%s)", c->label,
             reason == DCOMM_EPEERLOST ? "a peer was lost" : "revoked");
  pthread_mutex_unlock(&c->qlock);
  uint64_t one = 1;
  if (write(c->abort_fd, &one, sizeof(one)) < 0) { /* already signalled */ }
  return 0;
}

/* Runs the queue head; called with qlock held, returns with it held. */
static void run_head(struct tcp_comm *c) {
  struct tcp_req *r = c->qhead;
  c->qhead = r->next;
  if (!c->qhead) c->qtail = NULL;
  c->executing = 1;
  pthread_mutex_unlock(&c->qlock);
  r->rc = tcp_run_coll(c, &r->args);
  if (r->rc < 0) {
    /* The error detail is thread-local: carry it to the waiter's thread. */
    snprintf(r->errmsg, sizeof(r->errmsg), "%s", dcomm_last_error());
  }
  pthread_mutex_lock(&c->qlock);
  c->executing = 0;
  r->done = 1;
  pthread_cond_broadcast(&c->qcond);
}

static void *worker_main(void *arg) {
  struct tcp_comm *c = arg;
  pthread_mutex_lock(&c->qlock);
  while (!c->worker_stop) {
    if (c->qhead && !c->executing) run_head(c);
    else pthread_cond_wait(&c->qcond, &c->qlock);
  }
  pthread_mutex_unlock(&c->qlock);
  return NULL;
}

static int tcp_post(void *vc, const struct dcomm_coll_args *a, void **out) {
  struct tcp_comm *c = vc;
  struct tcp_req *r = calloc(1, sizeof(*r));
  if (!r) return c->ctx->host->err(DCOMM_ENOMEM, "tcp: out of memory");
  r->comm = c;
  r->args = *a;
  pthread_mutex_lock(&c->qlock);
  if (c->qtail) c->qtail->next = r;
  else c->qhead = r;
  c->qtail = r;
  pthread_cond_broadcast(&c->qcond);
  pthread_mutex_unlock(&c->qlock);
  *out = r;
  return 0;
}

static int finish(struct tcp_req *r) {
  int rc = r->rc;
  if (rc < 0) r->comm->ctx->host->err(rc, "%s", r->errmsg);
  free(r);
  return rc;
}

static int tcp_wait(void *vr) {
  struct tcp_req *r = vr;
  struct tcp_comm *c = r->comm;
  pthread_mutex_lock(&c->qlock);
  while (!r->done) {
    if (c->qhead && !c->executing && !c->worker_started) run_head(c);
    else pthread_cond_wait(&c->qcond, &c->qlock);
  }
  pthread_mutex_unlock(&c->qlock);
  return finish(r);
}

/* post + wait without a request: runs on the caller's thread when nothing
 * is queued or running (the usual blocking call), else queues behind it. */
static int tcp_run(void *vc, const struct dcomm_coll_args *a) {
  struct tcp_comm *c = vc;
  pthread_mutex_lock(&c->qlock);
  if (c->qhead || c->executing) {
    pthread_mutex_unlock(&c->qlock);
    void *r;
    TCP_CHECK(tcp_post(c, a, &r));
    return tcp_wait(r);
  }
  c->executing = 1;
  pthread_mutex_unlock(&c->qlock);
  int rc = tcp_run_coll(c, a);
  pthread_mutex_lock(&c->qlock);
  c->executing = 0;
  pthread_cond_broadcast(&c->qcond); /* ops posted meanwhile may run now */
  pthread_mutex_unlock(&c->qlock);
  return rc;
}

/* The probe op, on the caller's thread like run: ops queued or running
 * before it (none from the core's blocking calls) finish first. */
static int tcp_probe(void *vc, int peer, int tag, double deadline, int *src, size_t *nbytes) {
  struct tcp_comm *c = vc;
  pthread_mutex_lock(&c->qlock);
  while (c->qhead || c->executing) {
    if (c->qhead && !c->executing && !c->worker_started) run_head(c);
    else pthread_cond_wait(&c->qcond, &c->qlock);
  }
  c->executing = 1;
  pthread_mutex_unlock(&c->qlock);
  int rc = tcp_p2p_probe(c, peer, tag, deadline, src, nbytes);
  pthread_mutex_lock(&c->qlock);
  c->executing = 0;
  pthread_cond_broadcast(&c->qcond);
  pthread_mutex_unlock(&c->qlock);
  return rc;
}

static int tcp_test(void *vr, int *done) {
  struct tcp_req *r = vr;
  struct tcp_comm *c = r->comm;
  pthread_mutex_lock(&c->qlock);
  *done = r->done;
  if (!r->done && !c->worker_started) {
    if (pthread_create(&c->worker, NULL, worker_main, c) == 0) c->worker_started = 1;
  }
  pthread_mutex_unlock(&c->qlock);
  return *done ? finish(r) : 0;
}

static int tcp_async_error(void *vc) {
  struct tcp_comm *c = vc;
  return atomic_load(&c->error);
}

static int tcp_describe(void *ctx, char *buf, size_t len) {
  snprintf(buf, len, "tcp: sockets and shared memory, ring / recursive doubling / trees, built in");
  return 0;
}

/* The backend's own parameters (dcomm-info -e lists them; dcomm(7)). */
static const struct dcomm_backend_param tcp_params[] = {
    {"DCOMM_TCP_CHUNK_SIZE", "size", "262144",
     "Bytes of incoming data the tcp backend reduces at a time while the rest still arrives (ring and tree reductions over TCP); also the segment size of the pipelined broadcast."},
    {"DCOMM_TCP_SMALL_THRESHOLD", "size", "262144",
     "all_reduce messages up to this many bytes use recursive doubling, larger ones the ring; broadcasts: binomial tree, larger ones a pipelined chain."},
    {"DCOMM_ALGO", "str", "auto",
     "Force tcp algorithms, comma-separated: auto, ring, rd, hier or rhd (all_reduce; also all_reduce=...), broadcast=auto|tree|pipeline."},
    {"DCOMM_HOST_ID", "str", "",
     "This process's host identity for the tcp backend (default: the kernel's boot id and the host name). Members with equal ids are one host: they link through shared memory, and hierarchical collectives reduce among them first. Set it to split one machine into several hosts (containers that must not share memory, tests)."},
    {"DCOMM_TCP_LINKS", "str", "lazy",
     "When the tcp backend makes a communicator's links: lazy (its ring neighbours' at creation, every other one when an operation first needs it: O(log n) links per rank for every collective but all_to_all) or eager (every link at creation, n - 1 per rank)."},
    {"DCOMM_TRANSPORT", "str", "auto",
     "tcp backend links between members on one host: auto (shared memory when both ends are on one host, else TCP), shm (shared memory only; fails if a member is elsewhere) or tcp."},
    {"DCOMM_SHM_RING_SIZE", "size", "1048576",
     "Bytes of each direction's ring of a shared-memory link (rounded up to a power of two, 64 KiB to 256 MiB)."},
    {"DCOMM_SHM_HOST_BUDGET", "size", "268435456",
     "Shared memory the rings of one communicator may take on one host in all: with k members there, each link's rings are at most budget / (k(k-1)) bytes per direction (a power of two, at least 64 KiB, at most DCOMM_SHM_RING_SIZE)."},
    {"DCOMM_SHM_SPIN", "int", "50",
     "Microseconds a waiting rank polls shared-memory rings (or, with no shared-memory link, its sockets) before it sleeps in poll() until woken."},
    {"DCOMM_SHM_CMA_MIN", "size", "16384",
     "Collective payloads of at least this many bytes on a shared-memory link are copied once, by the receiver from the sender's buffer (process_vm_readv); 0: always through the rings."},
    {"DCOMM_SHM_CMA_FWD_MIN", "str", "auto",
     "The same as DCOMM_SHM_CMA_MIN for data the sender wrote earlier in the same collective (partial sums, forwarded blocks); "
     "auto: from 1 MiB where the comm's own first calls of each collective and size class, timed both ways, say it is faster."},
    {"DCOMM_TCP_BUFSIZE", "size", "4194304",
     "Socket send/receive buffer size (bytes) for peer connections; 0 keeps the kernel default."},
    {"DCOMM_TCP_SHRINK", "str", "1",
     "tcp backend comm_shrink: 1 (a new communicator among the survivors on the kept listener), 0 (not supported: recovery rebuilds), or fail:PREFIX (a test hook: shrinks of communicators whose label starts with PREFIX fail with DCOMM_EPROTO)."},
    {NULL, NULL, NULL, NULL},
};

const struct dcomm_backend_v1 dcomm__backend_tcp = {
    .size = sizeof(struct dcomm_backend_v1),
    .abi_version = DCOMM_BACKEND_ABI_VERSION,
    .name = "tcp",
    .init = tcp_init,
    .finalize = tcp_finalize,
    .comm_create = tcp_comm_create,
    .comm_destroy = tcp_comm_destroy,
    .comm_abort = tcp_comm_abort,
    .post = tcp_post,
    .test = tcp_test,
    .wait = tcp_wait,
    .async_error = tcp_async_error,
    .describe = tcp_describe,
    .comm_shrink = tcp_comm_shrink,
    .run = tcp_run,
    .params = tcp_params,
    .probe = tcp_probe,
};
