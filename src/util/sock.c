/*
 * sock.c: deadline-bounded TCP helpers shared by the store, the handshake and
 * the tcp backend's connection set-up.
 */
#include "config.h"
#include "sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

int dcomm__sock_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return dcomm__err_sys(errno, "fcntl(O_NONBLOCK)");
  return 0;
}

void dcomm__sock_tune(int fd, size_t bufsize) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (bufsize > 0 && bufsize < INT_MAX) {
    int b = (int)bufsize;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
  }
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res) {
  struct addrinfo hints;
  char portstr[16];
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  snprintf(portstr, sizeof(portstr), "%d", port);
  int rc = getaddrinfo(host && *host ? host : NULL, portstr, &hints, res);
  if (rc != 0) return dcomm__err(DCOMM_EINVAL, "cannot resolve '%s': %s", host ? host : "*", gai_strerror(rc));
  return 0;
}

int dcomm__sock_listen(const char *host, int port, int backlog, int *fd, int *bound_port) {
  struct addrinfo *res, *ai;
  int err = 0;
  if (port < 0 || port > 65535) return dcomm__err(DCOMM_EINVAL, "port %d out of range", port);
  DCOMM_CHECK(resolve(host, port, 1, &res));
  for (ai = res; ai; ai = ai->ai_next) {
    int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (s < 0) { err = errno; continue; }
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, backlog) == 0) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof(ss);
      getsockname(s, (struct sockaddr *)&ss, &sl);
      if (bound_port)
        *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                       : ((struct sockaddr_in *)&ss)->sin_port);
      freeaddrinfo(res);
      dcomm__sock_nonblock(s);
      *fd = s;
      return 0;
    }
    err = errno;
    close(s);
  }
  freeaddrinfo(res);
  return dcomm__err(DCOMM_ESYSTEM, "cannot listen on %s:%d: %s",
                    host && *host ? host : "*", port, strerror(err));
}

/* One non-blocking connect attempt bounded by deadline: 0, or errno. */
static int connect_once(const struct addrinfo *ai, double deadline, int *out) {
  int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return errno;
  if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0) { *out = s; return 0; }
  if (errno != EINPROGRESS) { int e = errno; close(s); return e; }
  struct pollfd p = {.fd = s, .events = POLLOUT};
  int n = poll(&p, 1, dcomm__ms_until(deadline));
  if (n <= 0) { close(s); return n == 0 ? ETIMEDOUT : errno; }
  int soerr = 0;
  socklen_t sl = sizeof(soerr);
  getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl);
  if (soerr) { close(s); return soerr; }
  *out = s;
  return 0;
}

int dcomm__sock_connect(const char *host, int port, double deadline, int *fd) {
  struct addrinfo *res;
  int err = ETIMEDOUT;
  double backoff = 0.01;
  unsigned seed = (unsigned)getpid() ^ (unsigned)(uint64_t)(dcomm__now() * 1e6);
  DCOMM_CHECK(resolve(host, port, 0, &res));
  for (;;) {
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
      err = connect_once(ai, deadline, fd);
      if (err == 0) { freeaddrinfo(res); return 0; }
    }
    /* Jitter (0.5-1.5 x the backoff): the ranks of a large job that all
     * found a listener's backlog full do not come back in step. */
    double pause = backoff * (0.5 + (double)(rand_r(&seed) % 1000) / 1000.0);
    if (dcomm__now() + pause >= deadline) break;
    struct timespec ts = {0, (long)(pause * 1e9)};
    nanosleep(&ts, NULL);
    if (backoff < 0.2) backoff *= 2;
  }
  freeaddrinfo(res);
  if (err == ETIMEDOUT || err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH)
    return dcomm__err(DCOMM_ETIMEDOUT, "cannot connect to %s:%d before the timeout (last error: %s)", host, port,
                      strerror(err));
  return dcomm__err(DCOMM_ESYSTEM, "connect to %s:%d: %s", host, port, strerror(err));
}

/* Waits for events on fd or abort_fd: 0 ready, or an error code. */
static int wait_fd(int fd, short events, double deadline, int abort_fd) {
  struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = abort_fd, .events = POLLIN}};
  for (;;) {
    int n = poll(p, abort_fd >= 0 ? 2 : 1, dcomm__ms_until(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return dcomm__err_sys(errno, "poll");
    if (abort_fd >= 0 && (p[1].revents & POLLIN)) return dcomm__err(DCOMM_EREVOKED, "operation aborted");
    if (n == 0) {
      if (dcomm__now() >= deadline) return dcomm__err(DCOMM_ETIMEDOUT, "socket operation timed out");
      continue;
    }
    return 0;
  }
}

int dcomm__sock_accept(int lfd, double deadline, int abort_fd, int *fd) {
  for (;;) {
    int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s >= 0) { *fd = s; return 0; }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      return dcomm__err_sys(errno, "accept");
    DCOMM_CHECK(wait_fd(lfd, POLLIN, deadline, abort_fd));
  }
}

int dcomm__sock_send_all(int fd, const void *buf, size_t len, double deadline, int abort_fd) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) { p += n; len -= (size_t)n; continue; }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      DCOMM_CHECK(wait_fd(fd, POLLOUT, deadline, abort_fd));
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
      return dcomm__err(DCOMM_EPEERLOST, "connection closed by peer while sending");
    return dcomm__err_sys(errno, "send");
  }
  return 0;
}

int dcomm__sock_recv_some(int fd, void *buf, size_t cap, double deadline, int abort_fd, size_t *got) {
  for (;;) {
    ssize_t n = recv(fd, buf, cap, 0);
    if (n > 0) {
      *got = (size_t)n;
      return 0;
    }
    if (n == 0) return dcomm__err(DCOMM_EPEERLOST, "connection closed by peer");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      DCOMM_CHECK(wait_fd(fd, POLLIN, deadline, abort_fd));
      continue;
    }
    if (errno == ECONNRESET) return dcomm__err(DCOMM_EPEERLOST, "connection reset by peer");
    return dcomm__err_sys(errno, "recv");
  }
}

int dcomm__sock_recv_all(int fd, void *buf, size_t len, double deadline, int abort_fd) {
  char *p = buf;
  while (len > 0) {
    size_t n;
    DCOMM_CHECK(dcomm__sock_recv_some(fd, p, len, deadline, abort_fd, &n));
    p += n;
    len -= n;
  }
  return 0;
}

int dcomm__sock_local_ip(int fd, char *buf, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) return dcomm__err_sys(errno, "getsockname");
  const void *a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                           : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
  if (!inet_ntop(ss.ss_family, a, buf, (socklen_t)len)) return dcomm__err_sys(errno, "inet_ntop");
  return 0;
}

int dcomm__sock_route_ip(const char *host, int port, char *buf, size_t len) {
  struct addrinfo *res;
  DCOMM_CHECK(resolve(host, port, 0, &res));
  int rc = dcomm__err(DCOMM_EINVAL, "no route to '%s'", host);
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    /* connect() on a datagram socket only picks the route: nothing is sent */
    int s = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0) rc = dcomm__sock_local_ip(s, buf, len);
    close(s);
    if (rc == 0) break;
  }
  freeaddrinfo(res);
  return rc;
}
