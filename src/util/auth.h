/*
 * auth.h: the handshake that opens every dcomm connection (store clients and
 * peer links). The accepting side sends a random challenge; the connecting
 * side answers with the job id, a purpose, a small hello payload and
 * HMAC-SHA256(token, challenge | purpose | job | hello). A stranger, another
 * job's process or a wrong token is refused with DCOMM_EAUTH before it can
 * change anything; malformed input gives DCOMM_EPROTO.
 */
#ifndef DCOMM_AUTH_H
#define DCOMM_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define DCOMM_HS_MAX_JOB 255
#define DCOMM_HS_MAX_HELLO 256

enum dcomm_hs_purpose { DCOMM_HS_STORE = 1, DCOMM_HS_PEER = 2 };

struct dcomm_hs_peer {
  uint32_t purpose;
  uint16_t hello_len;
  unsigned char hello[DCOMM_HS_MAX_HELLO];
};

/* token may be NULL or "" (no proof required, but job ids must still match). */
int dcomm__hs_server(int fd, const char *job_id, const char *token, double deadline, struct dcomm_hs_peer *peer);
int dcomm__hs_client(int fd, const char *job_id, const char *token, uint32_t purpose, const void *hello,
                     size_t hello_len, double deadline);

#endif
