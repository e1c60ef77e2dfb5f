/*
 * fuzz_util.h: what the libFuzzer targets under tests/fuzz share: turning
 * the fuzzer's bytes into C strings and NUL-separated fields, a loopback
 * "peer" thread that plays the other end of a socket with the fuzzer's
 * bytes, and the check that reports a hang as a crash. Each target is one
 * fuzz_<name>.c file with LLVMFuzzerTestOneInput; tests/fuzz/run.sh runs
 * them.
 */
#ifndef DCOMM_FUZZ_UTIL_H
#define DCOMM_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* A malloc'd NUL-terminated copy of data (embedded NULs end the string). */
char *fuzz_cstr(const uint8_t *data, size_t size);

/* Splits data at NUL bytes into at most max malloc'd strings (the rest of
 * the input goes to the last one); returns how many; free with
 * fuzz_fields_free. */
int fuzz_fields(const uint8_t *data, size_t size, char **out, int max);
void fuzz_fields_free(char **f, int n);

/* The other end of one loopback connection, played from the fuzzer's bytes
 * by a thread: fuzz_peer_start listens on 127.0.0.1 (an ephemeral port it
 * returns in *port) and, for each of up to `conns` connections, calls
 * serve(fd, arg); fuzz_peer_join stops it (after the connection being
 * served) and waits for it. */
struct fuzz_peer;
typedef void (*fuzz_serve_fn)(int fd, void *arg);
struct fuzz_peer *fuzz_peer_start(fuzz_serve_fn serve, void *arg, int conns, int *port);
void fuzz_peer_join(struct fuzz_peer *p);

/* Writes all of buf to fd (blocking, EPIPE ignored); 0 or -1. */
int fuzz_write_all(int fd, const void *buf, size_t len);
/* Reads and drops what fd sends until end of file or `seconds` pass. */
void fuzz_drain(int fd, double seconds);
/* The same, but also ends once nothing came for `idle` seconds; 1 when it
 * ended at end of file. */
int fuzz_drain_idle(int fd, double seconds, double idle);

/* Aborts (a finding for libFuzzer) when a call the target made took more
 * than `limit` seconds: the code under test promised a bound. */
void fuzz_check_bound(double started, double limit, const char *what);
double fuzz_now(void);

#endif
