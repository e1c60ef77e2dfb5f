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

#define DCOMM_HS_NONCE_LEN 16
/* Largest handshake message on the wire: the challenge, the answer, the
 * verdict (whose text is at most DCOMM_HS_MAX_VERDICT_MSG bytes). */
#define DCOMM_HS_MAX_VERDICT_MSG 64
#define DCOMM_HS_MAX_MSG (16 + DCOMM_HS_MAX_JOB + DCOMM_HS_MAX_HELLO + 32)

/* The accepting side in pieces, for a server that never blocks
 * (store_server.c): the challenge to send (its length; 0 when no random
 * bytes could be had), then the answer checked as its bytes arrive:
 * 0 and *need (the bytes the answer takes, once its head is in) while
 * incomplete, 1 accepted (the answer is *need bytes), < 0 malformed
 * (DCOMM_EPROTO) or refused (DCOMM_EAUTH; *refusal is then the verdict's
 * text). The verdict's bytes go out last. */
/* n bytes (at most 256) from the kernel's random source (getrandom:
 * never short once it is seeded): 0, or -1 with errno set. */
int dcomm__random_bytes(void *p, size_t n);
size_t dcomm__hs_challenge(unsigned char nonce[DCOMM_HS_NONCE_LEN], unsigned char *out);
int dcomm__hs_answer(const unsigned char *buf, size_t len, const unsigned char nonce[DCOMM_HS_NONCE_LEN],
                     const char *job_id, const char *token, struct dcomm_hs_peer *peer, size_t *need,
                     const char **refusal);
size_t dcomm__hs_verdict(int status, const char *msg, unsigned char *out);

/* Both sides, blocking until the deadline. token may be NULL or "" (no
 * proof required, but job ids must still match). */
int dcomm__hs_server(int fd, const char *job_id, const char *token, double deadline, struct dcomm_hs_peer *peer);
int dcomm__hs_client(int fd, const char *job_id, const char *token, uint32_t purpose, const void *hello,
                     size_t hello_len, double deadline);

#endif
