/*
 * fuzz_util.c: helpers shared by the fuzz targets (see fuzz_util.h).
 */
#include "config.h"

#include "fuzz_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

char *fuzz_cstr(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  memcpy(s, data, size);
  s[size] = 0;
  return s;
}

int fuzz_fields(const uint8_t *data, size_t size, char **out, int max) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i < size && n < max - 1; i++) {
    if (data[i] == 0) {
      out[n++] = fuzz_cstr(data + start, i - start);
      start = i + 1;
    }
  }
  out[n++] = fuzz_cstr(data + start, size - start);
  return n;
}

void fuzz_fields_free(char **f, int n) {
  for (int i = 0; i < n; i++) free(f[i]);
}

double fuzz_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fuzz_check_bound(double started, double limit, const char *what) {
  double took = fuzz_now() - started;
  if (took > limit) {
    fprintf(stderr, "fuzz: %s took %.2f s, beyond its %.2f s bound (a hang)\n", what, took, limit);
    abort();
  }
}

int fuzz_write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      if (poll(&pf, 1, 2000) <= 0) return -1;
      continue;
    }
    if (w <= 0) return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

int fuzz_drain_idle(int fd, double seconds, double idle) {
  double end = fuzz_now() + seconds;
  char buf[4096];
  for (;;) {
    double left = end - fuzz_now();
    if (left <= 0) return 0;
    if (idle > 0 && idle < left) left = idle;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int r = poll(&pf, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    ssize_t got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return 1;
  }
}

void fuzz_drain(int fd, double seconds) { (void)fuzz_drain_idle(fd, seconds, 0); }

struct fuzz_peer {
  pthread_t th;
  int lfd, conns;
  volatile int stop;
  fuzz_serve_fn serve;
  void *arg;
};

static void *peer_main(void *a) {
  struct fuzz_peer *p = a;
  for (int i = 0; i < p->conns && !p->stop; i++) {
    struct pollfd pf = {.fd = p->lfd, .events = POLLIN};
    if (poll(&pf, 1, 5000) <= 0 || p->stop) break; /* the client is done: nothing more to serve */
    int fd = accept(p->lfd, NULL, NULL);
    if (fd < 0) break;
    p->serve(fd, p->arg);
    close(fd);
  }
  return NULL;
}

struct fuzz_peer *fuzz_peer_start(fuzz_serve_fn serve, void *arg, int conns, int *port) {
  struct fuzz_peer *p = calloc(1, sizeof(*p));
  if (!p) abort();
  p->serve = serve;
  p->arg = arg;
  p->conns = conns;
  p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(p->lfd, 16) < 0 ||
      getsockname(p->lfd, (struct sockaddr *)&sa, &sl) < 0) {
    perror("fuzz peer: listen on loopback");
    abort();
  }
  *port = ntohs(sa.sin_port);
  if (pthread_create(&p->th, NULL, peer_main, p) != 0) abort();
  return p;
}

void fuzz_peer_join(struct fuzz_peer *p) {
  p->stop = 1;
  shutdown(p->lfd, SHUT_RDWR); /* wakes the thread's poll on the listener */
  pthread_join(p->th, NULL);
  close(p->lfd);
  free(p);
}
