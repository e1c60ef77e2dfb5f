/*
 * store_server.c: the embedded TCP store that rank 0 (or the launcher) hosts:
 * its event loop, connections and deadlines; the commands it serves are
 * store_commands.c, the state both share store_server_conn.h.
 *
 * One thread runs an epoll loop over the listening socket, a stop pipe and
 * every client connection; no connection has a thread of its own, so a job
 * of thousands of ranks costs the server a descriptor and two small
 * buffers per client. Each connection is a small state machine: the
 * handshake of auth.h (challenge out, answer checked as its bytes arrive,
 * verdict out), then requests, each parsed from the connection's input
 * buffer once it is complete (lengths are checked as soon as they arrive,
 * before anything is buffered for them) and answered into its output
 * buffer, flushed without blocking. The wire format is in store_proto.h.
 *
 * A GET or WAIT whose key is missing blocks its connection: it is
 * registered under that key in a table of waiters hashed by key, and a
 * write wakes only the requests waiting for the keys it wrote (n clients
 * waiting while n others publish cost O(n) wake-ups, not O(n^2)). A woken
 * or timed-out request is evaluated again from its frame, still in the
 * input buffer. While a request is blocked or its answer is not flushed,
 * the connection is not read (a client sends one request at a time) but
 * its hang-up is still seen, which ends a blocked request at once.
 *
 * Bounds on time, kept in a heap of deadlines: the handshake must finish
 * within DCOMM_STORE_HS_TIMEOUT; between requests a client may stay idle
 * indefinitely, but once a request's first byte has arrived the rest must
 * follow within DCOMM_TIMEOUT (at least 10 s), and an answer must be taken
 * by the client within the same time, else the connection is dropped (so a
 * slow-loris client holds one descriptor for a bounded time). At most
 * DCOMM_STORE_MAX_CLIENTS connections are served; more are closed at
 * once. Refusals are logged at most once a second, with a count.
 *
 * Shutdown: dcomm__store_server_stop writes the stop pipe; the loop closes
 * every connection (ending blocked requests) and returns, and stop joins it.
 *
 * fork(): the loop holds its server's `busy` mutex whenever it is not
 * waiting in epoll_wait, and an atfork handler takes every running
 * server's before the fork, so a child (a DataLoader worker, a test's
 * process) never inherits a lock (the allocator's, OpenSSL's) that the loop
 * thread held mid-request. The child has no loop; it must not use the
 * server.
 */
#define _GNU_SOURCE
#include "config.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "error.h"
#include "kvmap.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store_proto.h"
#include "store_server_conn.h"

/* Backlog of the listening socket: every rank of a large job connects at
 * once (the kernel caps it at net.core.somaxconn). */
#define LISTEN_BACKLOG 4096
/* Per wake-up of the loop: connections accepted, bytes read from one
 * connection (others get their turn; epoll reports the rest again). */
#define ACCEPT_BATCH 256
#define READ_BATCH ((size_t)4 << 20)
/* Out of descriptors: accepting pauses this long instead of spinning. */
#define ACCEPT_PAUSE 0.1

/* ---- the deadline heap (a binary min-heap of connections) ---- */

static void heap_swap(struct dcomm_store_server *srv, size_t a, size_t b) {
  struct conn *t = srv->heap[a];
  srv->heap[a] = srv->heap[b];
  srv->heap[b] = t;
  srv->heap[a]->hpos = a;
  srv->heap[b]->hpos = b;
}

static double conn_deadline(const struct conn *c) {
  if (c->dead) return INFINITY;
  if (c->in_hs) return c->hs_dl;
  if (c->out_len > c->out_off) return c->out_dl;
  if (c->blocked) return c->block_dl;
  if (c->in_len > 0) return c->frame_dl;
  return INFINITY;
}

static double heap_key(const struct dcomm_store_server *srv, size_t i) { return conn_deadline(srv->heap[i]); }

static void heap_fix(struct dcomm_store_server *srv, size_t i) {
  while (i > 0 && heap_key(srv, (i - 1) / 2) > heap_key(srv, i)) {
    heap_swap(srv, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < srv->nheap && heap_key(srv, l) < heap_key(srv, m)) m = l;
    if (r < srv->nheap && heap_key(srv, r) < heap_key(srv, m)) m = r;
    if (m == i) return;
    heap_swap(srv, i, m);
    i = m;
  }
}

static void heap_remove(struct dcomm_store_server *srv, struct conn *c) {
  size_t i = c->hpos;
  if (i == SIZE_MAX) return;
  c->hpos = SIZE_MAX;
  if (i != --srv->nheap) {
    srv->heap[i] = srv->heap[srv->nheap];
    srv->heap[i]->hpos = i;
    heap_fix(srv, i);
  }
}

/* Puts c where its current deadline says (out of the heap when none). */
static int heap_update(struct dcomm_store_server *srv, struct conn *c) {
  if (conn_deadline(c) == INFINITY) {
    heap_remove(srv, c);
    return 0;
  }
  if (c->hpos == SIZE_MAX) {
    if (srv->nheap == srv->heap_cap) {
      size_t cap = srv->heap_cap ? 2 * srv->heap_cap : 64;
      struct conn **h = realloc(srv->heap, cap * sizeof(*h));
      if (!h) return -1;
      srv->heap = h;
      srv->heap_cap = cap;
    }
    c->hpos = srv->nheap;
    srv->heap[srv->nheap++] = c;
  }
  heap_fix(srv, c->hpos);
  return 0;
}

/* ---- connections ---- */

static void conn_close(struct dcomm_store_server *srv, struct conn *c) {
  if (c->dead) return;
  c->dead = 1;
  dcomm__sv_unwait(c);
  heap_remove(srv, c);
  epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  c->fd = -1;
  *c->aprev = c->anext;
  if (c->anext) c->anext->aprev = c->aprev;
  c->anext = srv->graveyard; /* freed after the loop pass: the ready list may name it */
  srv->graveyard = c;
  srv->nconns--;
}

/* Sends what the output holds; SV_OK, or SV_CLOSE when the client is gone. */
static int conn_flush(struct conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->out_off += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return SV_OK;
    return SV_CLOSE;
  }
  c->out_off = c->out_len = 0;
  if (c->out_cap > 65536) { /* an idle client keeps no large buffer */
    free(c->out);
    c->out = NULL;
    c->out_cap = 0;
  }
  return c->closing ? SV_CLOSE : SV_OK;
}

/* Serves what the input holds (each answer flushed before the next
 * request), and sets what to watch. */
static void conn_run(struct dcomm_store_server *srv, struct conn *c) {
  if (c->dead) return;
  int rc = conn_flush(c);
  while (rc == SV_OK && !c->closing && c->out_off == c->out_len && c->in_len > 0) {
    rc = c->in_hs ? dcomm__sv_serve_hs(srv, c) : dcomm__sv_serve_frame(srv, c);
    if (rc == SV_DONE) rc = conn_flush(c);
  }
  if (rc == SV_CLOSE) {
    conn_close(srv, c);
    return;
  }
  if (c->eof) { /* what the client sent before its end is served */
    if (c->in_hs) dcomm__sv_note_refusal(srv, "refused a connection: the client closed it during the handshake");
    else if (c->in_len > 0 && !c->blocked && !c->closing)
      DCOMM_LOG(WARN, STORE, "store server: closing a connection: truncated frame (%zu bytes)", c->in_len);
    conn_close(srv, c);
    return;
  }
  if (c->in_len == 0 && c->in_cap > 65536) {
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
  int pending = c->out_off < c->out_len;
  uint32_t ev = EPOLLRDHUP | (pending ? EPOLLOUT : 0) | (!pending && !c->blocked && !c->closing ? EPOLLIN : 0);
  if (ev != c->events) {
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &e) < 0) {
      conn_close(srv, c);
      return;
    }
    c->events = ev;
  }
  if (heap_update(srv, c) < 0) conn_close(srv, c);
}

/* Reads what the socket has (a bounded amount): SV_OK (the end of the
 * stream sets eof), or SV_CLOSE when the socket failed. */
static int conn_read(struct conn *c) {
  size_t got = 0;
  while (got < READ_BATCH) {
    if (c->in_cap - c->in_len < 4096) {
      size_t cap = c->in_cap ? 2 * c->in_cap : 16384;
      unsigned char *in = realloc(c->in, cap);
      if (!in) return SV_CLOSE;
      c->in = in;
      c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n > 0) {
      if (c->in_len == 0) c->frame_dl = dcomm__now() + dcomm__sv_frame_timeout();
      c->in_len += (size_t)n;
      got += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return SV_OK;
    if (n < 0) return SV_CLOSE;
    c->eof = 1; /* conn_run serves what came before, then closes */
    return SV_OK;
  }
  return SV_OK;
}

static void conn_event(struct dcomm_store_server *srv, struct conn *c, uint32_t ev) {
  if (c->dead) return; /* closed earlier in this batch */
  if ((ev & EPOLLOUT) && conn_flush(c) == SV_CLOSE) {
    conn_close(srv, c);
    return;
  }
  if (ev & EPOLLIN) {
    if (conn_read(c) == SV_CLOSE) {
      conn_close(srv, c);
      return;
    }
  } else if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    /* Hung up while blocked or while its answer waits: nobody to serve. */
    conn_close(srv, c);
    return;
  }
  conn_run(srv, c);
}

static void on_deadline(struct dcomm_store_server *srv, struct conn *c) {
  if (c->in_hs) {
    dcomm__sv_note_refusal(srv, "refused a connection: handshake not completed within %.0f s", DCOMM_STORE_HS_TIMEOUT);
    conn_close(srv, c);
  } else if (c->out_off < c->out_len) {
    if (!c->closing) DCOMM_LOG(WARN, STORE, "store server: closing a connection whose client does not take its answer");
    conn_close(srv, c);
  } else if (c->blocked) {
    conn_run(srv, c); /* the request answers that it timed out */
  } else if (c->in_len > 0) {
    dcomm__sv_answer_err(c, DCOMM_EPROTO, 1, "frame not completed in time");
    conn_run(srv, c);
  } else {
    heap_remove(srv, c);
  }
}

static void accept_some(struct dcomm_store_server *srv) {
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        dcomm__sv_note_refusal(srv, "accept: %s (accepting again in %.1f s)", strerror(errno), ACCEPT_PAUSE);
        epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->lfd, NULL);
        srv->listen_paused = 1;
        srv->listen_resume = dcomm__now() + ACCEPT_PAUSE;
      }
      return;
    }
    if (srv->nconns >= srv->max_conns) {
      dcomm__sv_note_refusal(srv, "dropping a connection: %d clients already (DCOMM_STORE_MAX_CLIENTS)", srv->nconns);
      close(fd);
      continue;
    }
    dcomm__sock_tune(fd, 0);
    struct conn *c = calloc(1, sizeof(*c));
    unsigned char ch[DCOMM_HS_MAX_MSG];
    size_t chl = c ? dcomm__hs_challenge(c->nonce, ch) : 0;
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (!chl || epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
      dcomm__sv_note_refusal(srv, "dropping a connection: %s", c ? "no random bytes or epoll_ctl failed" : "out of memory");
      close(fd);
      free(c);
      continue;
    }
    c->fd = fd;
    c->events = e.events;
    c->in_hs = 1;
    c->hpos = SIZE_MAX;
    c->hs_dl = dcomm__now() + DCOMM_STORE_HS_TIMEOUT;
    c->anext = srv->all;
    c->aprev = &srv->all;
    if (srv->all) srv->all->aprev = &c->anext;
    srv->all = c;
    srv->nconns++;
    if (dcomm__sv_out_put(c, ch, chl, NULL, 0) == SV_CLOSE) {
      conn_close(srv, c);
      continue;
    }
    conn_run(srv, c);
  }
}

/* Serves the requests that writes woke, until none is left. */
static void run_ready(struct dcomm_store_server *srv) {
  while (srv->ready) {
    struct conn *c = srv->ready;
    srv->ready = c->rnext;
    if (!srv->ready) srv->ready_tail = &srv->ready;
    c->ready = 0;
    if (!c->dead) conn_run(srv, c);
  }
}

static void bury(struct dcomm_store_server *srv) {
  while (srv->graveyard) {
    struct conn *c = srv->graveyard;
    srv->graveyard = c->anext;
    free(c->in);
    free(c->out);
    free(c);
  }
}

static void *loop_main(void *arg) {
  struct dcomm_store_server *srv = arg;
  struct epoll_event evs[128];
  pthread_mutex_lock(&srv->busy);
  srv->started = 1;
  pthread_cond_signal(&srv->started_cv);
  for (;;) {
    double now = dcomm__now();
    while (srv->nheap && conn_deadline(srv->heap[0]) <= now) on_deadline(srv, srv->heap[0]);
    run_ready(srv);
    bury(srv);
    if (srv->listen_paused && now >= srv->listen_resume) {
      struct epoll_event e = {.events = EPOLLIN, .data.ptr = &srv->tag_listen};
      if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &e) == 0) srv->listen_paused = 0;
      else srv->listen_resume = now + ACCEPT_PAUSE;
    }
    double next = srv->nheap ? conn_deadline(srv->heap[0]) : INFINITY;
    if (srv->listen_paused && srv->listen_resume < next) next = srv->listen_resume;
    int ms = -1;
    if (next < INFINITY) {
      double w = ceil((next - now) * 1000.0);
      ms = w < 0 ? 0 : w > 3600e3 ? 3600000 : (int)w;
    }
    pthread_mutex_unlock(&srv->busy);
    int n = epoll_wait(srv->epfd, evs, 128, ms);
    pthread_mutex_lock(&srv->busy);
    if (n < 0) {
      if (errno == EINTR) continue;
      DCOMM_LOG(ERROR, STORE, "store server: epoll_wait: %s", strerror(errno));
      break;
    }
    int stop = 0;
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &srv->tag_stop) stop = 1;
      else if (p == &srv->tag_listen) accept_some(srv);
      else conn_event(srv, p, evs[i].events);
    }
    if (stop) break;
    run_ready(srv);
  }
  while (srv->all) conn_close(srv, srv->all);
  bury(srv);
  pthread_mutex_unlock(&srv->busy);
  return NULL;
}

/* ---- fork safety: the running servers, quiet across a fork ---- */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dcomm_store_server *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) {
  pthread_mutex_lock(&registry_mu);
  for (struct dcomm_store_server *s = registry; s; s = s->reg_next) pthread_mutex_lock(&s->busy);
}

static void fork_parent(void) {
  for (struct dcomm_store_server *s = registry; s; s = s->reg_next) pthread_mutex_unlock(&s->busy);
  pthread_mutex_unlock(&registry_mu);
}

static void fork_child(void) {
  /* The mutexes were taken by this thread before the fork: ours to release. */
  fork_parent();
}

static void atfork_init(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static void registry_add(struct dcomm_store_server *srv) {
  pthread_once(&atfork_once, atfork_init);
  pthread_mutex_lock(&registry_mu);
  srv->reg_next = registry;
  registry = srv;
  pthread_mutex_unlock(&registry_mu);
}

static void registry_remove(struct dcomm_store_server *srv) {
  pthread_mutex_lock(&registry_mu);
  for (struct dcomm_store_server **pp = &registry; *pp; pp = &(*pp)->reg_next)
    if (*pp == srv) {
      *pp = srv->reg_next;
      break;
    }
  pthread_mutex_unlock(&registry_mu);
}

/* ---- public entry points ---- */

static void free_server(struct dcomm_store_server *srv) {
  if (srv->lfd >= 0) close(srv->lfd);
  if (srv->epfd >= 0) close(srv->epfd);
  for (int i = 0; i < 2; i++)
    if (srv->stop_pipe[i] >= 0) close(srv->stop_pipe[i]);
  dcomm__kvmap_free(&srv->map);
  free(srv->heap);
  free(srv->job_id);
  free(srv->token);
  free(srv);
}

int dcomm__store_server_start(const char *host, int port, const char *job_id, const char *token,
                              struct dcomm_store_server **out) {
  if (!out) return dcomm__err(DCOMM_EINVAL, "store server: NULL output argument");
  *out = NULL;
  if (!job_id) return dcomm__err(DCOMM_EINVAL, "store server: NULL job id");
  if (strlen(job_id) > DCOMM_HS_MAX_JOB)
    return dcomm__err(DCOMM_EINVAL, "store server: job id longer than %d bytes", DCOMM_HS_MAX_JOB);
  long max = dcomm__param_int(DCOMM_P_STORE_MAX_CLIENTS);
  if (max < 1 || max > INT32_MAX)
    return dcomm__err(DCOMM_EINVAL, "DCOMM_STORE_MAX_CLIENTS=%ld: expected 1..%d", max, INT32_MAX);
  struct dcomm_store_server *srv = calloc(1, sizeof(*srv));
  if (!srv) return dcomm__err(DCOMM_ENOMEM, "store server: out of memory");
  srv->lfd = srv->epfd = srv->stop_pipe[0] = srv->stop_pipe[1] = -1;
  srv->max_conns = (int)max;
  srv->ready_tail = &srv->ready;
  srv->refusal_at = -INFINITY;
  srv->job_id = strdup(job_id);
  srv->token = strdup(token ? token : "");
  if (!srv->job_id || !srv->token) {
    free_server(srv);
    return dcomm__err(DCOMM_ENOMEM, "store server: out of memory");
  }
  if (pipe2(srv->stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0 || (srv->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
    int e = errno;
    free_server(srv);
    return dcomm__err_sys(e, "store server: pipe or epoll_create1");
  }
  int rc = dcomm__sock_listen(host, port, LISTEN_BACKLOG, &srv->lfd, &srv->port);
  if (rc < 0) {
    free_server(srv);
    return rc;
  }
  struct epoll_event el = {.events = EPOLLIN, .data.ptr = &srv->tag_listen};
  struct epoll_event es = {.events = EPOLLIN, .data.ptr = &srv->tag_stop};
  if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &el) < 0 ||
      epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->stop_pipe[0], &es) < 0) {
    int e = errno;
    free_server(srv);
    return dcomm__err_sys(e, "store server: epoll_ctl");
  }
  pthread_mutex_init(&srv->busy, NULL);
  pthread_cond_init(&srv->started_cv, NULL);
  registry_add(srv);
  if ((rc = pthread_create(&srv->loop, NULL, loop_main, srv)) != 0) {
    registry_remove(srv);
    pthread_cond_destroy(&srv->started_cv);
    pthread_mutex_destroy(&srv->busy);
    free_server(srv);
    return dcomm__err_sys(rc, "store server: pthread_create");
  }
  /* Until the new thread is in its loop, a fork could copy a lock that
   * its start-up (the allocator's) holds: a caller may fork right away. */
  pthread_mutex_lock(&srv->busy);
  while (!srv->started) pthread_cond_wait(&srv->started_cv, &srv->busy);
  pthread_mutex_unlock(&srv->busy);
  DCOMM_LOG(INFO, STORE, "store server listening on %s:%d", host && *host ? host : "*", srv->port);
  *out = srv;
  return 0;
}

int dcomm__store_server_port(const struct dcomm_store_server *srv) { return srv ? srv->port : -1; }

void dcomm__store_server_stop(struct dcomm_store_server *srv) {
  if (!srv) return;
  char b = 1;
  ssize_t w = write(srv->stop_pipe[1], &b, 1);
  (void)w;
  pthread_join(srv->loop, NULL);
  registry_remove(srv);
  pthread_cond_destroy(&srv->started_cv);
  pthread_mutex_destroy(&srv->busy);
  DCOMM_LOG(INFO, STORE, "store server on port %d stopped", srv->port);
  free_server(srv);
}
