/*
 * sock.h: TCP socket helpers with deadlines. Every blocking helper takes an
 * absolute deadline on the monotonic clock (dcomm__now() + seconds) and an
 * optional abort descriptor (-1: none) whose readability cancels the wait
 * with DCOMM_EREVOKED. Sockets are non-blocking throughout.
 */
#ifndef DCOMM_SOCK_H
#define DCOMM_SOCK_H

#include <stddef.h>

#include "clock.h" /* the deadlines' clock */

/* Listens on host:port (host NULL or "" = any address, port 0 = any port). */
int dcomm__sock_listen(const char *host, int port, int backlog, int *fd, int *bound_port);
/* Connects, retrying refused/unreachable attempts until the deadline. */
int dcomm__sock_connect(const char *host, int port, double deadline, int *fd);
/* Accepts one connection before the deadline. */
int dcomm__sock_accept(int lfd, double deadline, int abort_fd, int *fd);

int dcomm__sock_send_all(int fd, const void *buf, size_t len, double deadline, int abort_fd);
/* Returns DCOMM_EPEERLOST on EOF or reset. */
int dcomm__sock_recv_all(int fd, void *buf, size_t len, double deadline, int abort_fd);
/* Between 1 and cap bytes, as many as one recv gives once some arrived. */
int dcomm__sock_recv_some(int fd, void *buf, size_t cap, double deadline, int abort_fd, size_t *got);

int dcomm__sock_nonblock(int fd);
void dcomm__sock_tune(int fd, size_t bufsize); /* TCP_NODELAY and buffer sizes */
/* Numeric local address of a connected socket, e.g. "127.0.0.1". */
int dcomm__sock_local_ip(int fd, char *buf, size_t len);
/* The local address this host would use to reach host:port (no packet is
 * sent), for servers that are not a dcomm store (etcd). */
int dcomm__sock_route_ip(const char *host, int port, char *buf, size_t len);

#endif
