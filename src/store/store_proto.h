/*
 * store_proto.h: the wire protocol of the embedded TCP store, shared by
 * store_server.c and store_client.c (and the tests that speak it raw).
 *
 * A connection opens with the handshake of auth.h (purpose DCOMM_HS_STORE).
 * After it the client sends one request and waits for its response, again
 * and again. All integers are big-endian (network byte order); "str" is a
 * u32 length followed by that many bytes, no terminator.
 *
 * Requests: u8 cmd, then the fields of that command.
 *   SET  (1)  str key, str value
 *   GET  (2)  str key, u64 timeout_ms          waits until key exists
 *   ADD  (3)  str key, i64 delta               value kept as decimal text
 *   CAS  (4)  str key, u8 has_expected, str expected, str desired
 *             has_expected 0 means "key absent" (expected must then be
 *             empty), which is distinct from has_expected 1 with an empty
 *             expected value.
 *   WAIT (5)  u64 timeout_ms, u32 nkeys, nkeys x str key
 *   DEL  (6)  str key
 *   TXN  (7)  u8 ncmp, ncmp x (u8 kind, str key, str value), u8 nput,
 *             nput x (str key, str value)   kind: enum dcomm_store_cmp_kind
 *             (value empty unless EQUAL); 0..DCOMM_STORE_TXN_MAX compares,
 *             1..DCOMM_STORE_TXN_MAX puts; the puts happen only if every
 *             compare holds, all under one lock
 *   MGET (8)  u64 timeout_ms, u32 nkeys, nkeys x str key
 *             1..DCOMM_STORE_MAX_WAIT_KEYS keys; waits until every key
 *             exists or the timeout passes, then answers all at once
 *
 * Response: i32 status, then
 *   status < 0 (a DCOMM_E* code): u8 closing, u16 msg_len, msg. closing 1
 *     means the server drops the connection after this answer (the request
 *     was malformed, so the stream cannot be trusted any more).
 *   status 0: SET, WAIT: nothing; GET: str value; ADD: i64 result;
 *     CAS: u8 present, str current (present 0: the key is absent, current
 *     empty); DEL: u8 existed; TXN: u8 done; MGET: u32 nkeys, then per
 *     key in request order u8 present, str value (present 0: the key was
 *     still absent at the timeout, value empty). An MGET whose values
 *     total more than DCOMM_STORE_MAX_VALUE is refused with DCOMM_EINVAL
 *     (the connection stays usable).
 *
 * Bounds, checked by the server before it allocates anything: a key is
 * 1..DCOMM_STORE_PROTO_MAX_KEY bytes without NUL (the prefix plus a key of at
 * most DCOMM_STORE_MAX_KEY), a value at most DCOMM_STORE_MAX_VALUE bytes (a
 * larger one is DCOMM_EINVAL), WAIT and MGET at most DCOMM_STORE_MAX_WAIT_KEYS keys,
 * an error message at most DCOMM_STORE_MAX_ERRMSG bytes. A bad cmd, an
 * oversized length or a truncated frame is DCOMM_EPROTO and ends the
 * connection.
 */
#ifndef DCOMM_STORE_PROTO_H
#define DCOMM_STORE_PROTO_H

#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>

#include "store.h"

enum dcomm_store_cmd {
  DCOMM_STORE_CMD_SET = 1,
  DCOMM_STORE_CMD_GET = 2,
  DCOMM_STORE_CMD_ADD = 3,
  DCOMM_STORE_CMD_CAS = 4,
  DCOMM_STORE_CMD_WAIT = 5,
  DCOMM_STORE_CMD_DEL = 6,
  DCOMM_STORE_CMD_TXN = 7,
  DCOMM_STORE_CMD_MGET = 8,
};

/* A key on the wire carries the handle's prefix (at most 255 bytes). */
#define DCOMM_STORE_PROTO_MAX_KEY (DCOMM_STORE_MAX_KEY + 255)
#define DCOMM_STORE_MAX_WAIT_KEYS 1024
#define DCOMM_STORE_MAX_ERRMSG 255
/* Seconds the server gives a client to complete the handshake. */
#define DCOMM_STORE_HS_TIMEOUT 10.0
/* Seconds a client waits for an answer beyond the operation's own timeout. */
#define DCOMM_STORE_IO_SLACK 5.0

/* Encoding helpers: each writes or reads a big-endian field at p. */
static inline unsigned char *dcomm__store_put_u8(unsigned char *p, uint8_t v) {
  *p = v;
  return p + 1;
}

static inline unsigned char *dcomm__store_put_u32(unsigned char *p, uint32_t v) {
  v = htonl(v);
  memcpy(p, &v, 4);
  return p + 4;
}

static inline unsigned char *dcomm__store_put_u64(unsigned char *p, uint64_t v) {
  p = dcomm__store_put_u32(p, (uint32_t)(v >> 32));
  return dcomm__store_put_u32(p, (uint32_t)v);
}

static inline uint32_t dcomm__store_get_u32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return ntohl(v);
}

static inline uint64_t dcomm__store_get_u64(const unsigned char *p) {
  return ((uint64_t)dcomm__store_get_u32(p) << 32) | dcomm__store_get_u32(p + 4);
}

/* Seconds to wire milliseconds, rounded up so that a short positive timeout
 * does not become a non-blocking probe; huge or infinite values saturate. */
static inline uint64_t dcomm__store_timeout_ms(double seconds) {
  if (!(seconds > 0)) return 0;
  double ms = seconds * 1000.0;
  if (ms >= 18446744073709549568.0) return UINT64_MAX;
  uint64_t v = (uint64_t)ms;
  return (double)v < ms ? v + 1 : v;
}

#endif
