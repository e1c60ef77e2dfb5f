/*
 * auth.c: challenge/response handshake with HMAC-SHA256 (Nettle); the
 * challenge's nonce comes from the kernel (getrandom).
 */
#include "config.h"
#include "auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "error.h"
#include "sock.h"

#define HS_MAGIC 0x44434853u /* "DCHS" */
#define HS_VERSION 1
#define NONCE_LEN DCOMM_HS_NONCE_LEN
#define MAC_LEN 32

struct hs_challenge {
  uint32_t magic, version;
  unsigned char nonce[NONCE_LEN];
};

struct hs_answer_head {
  uint32_t magic, version, purpose;
  uint16_t job_len, hello_len;
};

struct hs_verdict {
  int32_t status;
  uint16_t msg_len, pad;
};

_Static_assert(sizeof(struct hs_answer_head) + DCOMM_HS_MAX_JOB + DCOMM_HS_MAX_HELLO + MAC_LEN <= DCOMM_HS_MAX_MSG &&
                   sizeof(struct hs_challenge) <= DCOMM_HS_MAX_MSG &&
                   sizeof(struct hs_verdict) + DCOMM_HS_MAX_VERDICT_MSG <= DCOMM_HS_MAX_MSG,
               "DCOMM_HS_MAX_MSG holds every handshake message");

static void compute_mac(const char *token, const unsigned char *nonce, uint32_t purpose, const char *job,
                        size_t job_len, const void *hello, size_t hello_len, unsigned char out[MAC_LEN]) {
  memset(out, 0, MAC_LEN);
  if (!token || !*token) return;
  unsigned char msg[16 + NONCE_LEN + 4 + DCOMM_HS_MAX_JOB + DCOMM_HS_MAX_HELLO];
  size_t n = 0;
  memcpy(msg, "dcomm-hs1", 9);
  n = 9;
  memcpy(msg + n, nonce, NONCE_LEN);
  n += NONCE_LEN;
  uint32_t p = htonl(purpose);
  memcpy(msg + n, &p, 4);
  n += 4;
  memcpy(msg + n, job, job_len);
  n += job_len;
  if (hello_len) memcpy(msg + n, hello, hello_len);
  n += hello_len;
  struct hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, strlen(token), (const uint8_t *)token);
  hmac_sha256_update(&ctx, n, msg);
  hmac_sha256_digest(&ctx, MAC_LEN, out);
}

int dcomm__random_bytes(void *p, size_t n) {
  ssize_t got;
  do got = getrandom(p, n, 0);
  while (got < 0 && errno == EINTR);
  return got == (ssize_t)n ? 0 : -1;
}

size_t dcomm__hs_challenge(unsigned char nonce[DCOMM_HS_NONCE_LEN], unsigned char *out) {
  struct hs_challenge ch = {.magic = htonl(HS_MAGIC), .version = htonl(HS_VERSION)};
  if (dcomm__random_bytes(ch.nonce, NONCE_LEN) < 0) return 0;
  memcpy(nonce, ch.nonce, NONCE_LEN);
  memcpy(out, &ch, sizeof(ch));
  return sizeof(ch);
}

size_t dcomm__hs_verdict(int status, const char *msg, unsigned char *out) {
  size_t ml = strlen(msg);
  if (ml > DCOMM_HS_MAX_VERDICT_MSG) ml = DCOMM_HS_MAX_VERDICT_MSG;
  struct hs_verdict v = {.status = (int32_t)htonl((uint32_t)status), .msg_len = htons((uint16_t)ml)};
  memcpy(out, &v, sizeof(v));
  memcpy(out + sizeof(v), msg, ml);
  return sizeof(v) + ml;
}

int dcomm__hs_answer(const unsigned char *buf, size_t len, const unsigned char nonce[DCOMM_HS_NONCE_LEN],
                     const char *job_id, const char *token, struct dcomm_hs_peer *peer, size_t *need,
                     const char **refusal) {
  struct hs_answer_head h;
  *refusal = NULL;
  *need = sizeof(h);
  if (len < sizeof(h)) return 0;
  memcpy(&h, buf, sizeof(h));
  if (ntohl(h.magic) != HS_MAGIC || ntohl(h.version) != HS_VERSION)
    return dcomm__err(DCOMM_EPROTO, "handshake: not a dcomm peer (bad magic or version)");
  size_t job_len = ntohs(h.job_len), hello_len = ntohs(h.hello_len);
  if (job_len > DCOMM_HS_MAX_JOB || hello_len > DCOMM_HS_MAX_HELLO)
    return dcomm__err(DCOMM_EPROTO, "handshake: oversized job id (%zu) or hello (%zu)", job_len, hello_len);
  *need = sizeof(h) + job_len + hello_len + MAC_LEN;
  if (len < *need) return 0;
  char job[DCOMM_HS_MAX_JOB + 1];
  const unsigned char *p = buf + sizeof(h);
  memcpy(job, p, job_len);
  job[job_len] = 0;
  memcpy(peer->hello, p + job_len, hello_len);
  const unsigned char *mac = p + job_len + hello_len;
  unsigned char want[MAC_LEN];
  peer->purpose = ntohl(h.purpose);
  peer->hello_len = (uint16_t)hello_len;
  if (strlen(job) != job_len || strcmp(job, job_id) != 0) {
    *refusal = "job id mismatch";
    return dcomm__err(DCOMM_EAUTH, "handshake: peer belongs to job '%s', this is job '%s'", job, job_id);
  }
  compute_mac(token, nonce, peer->purpose, job, job_len, peer->hello, hello_len, want);
  if (!memeql_sec(mac, want, MAC_LEN)) {
    *refusal = "bad auth token";
    return dcomm__err(DCOMM_EAUTH, "handshake: peer did not prove DCOMM_AUTH_TOKEN");
  }
  return 1;
}

int dcomm__hs_server(int fd, const char *job_id, const char *token, double deadline, struct dcomm_hs_peer *peer) {
  unsigned char nonce[NONCE_LEN], buf[DCOMM_HS_MAX_MSG], out[DCOMM_HS_MAX_MSG];
  size_t n = dcomm__hs_challenge(nonce, buf);
  if (!n) return dcomm__err(DCOMM_ESYSTEM, "getrandom failed: %s", strerror(errno));
  DCOMM_CHECK(dcomm__sock_send_all(fd, buf, n, deadline, -1));
  /* Exactly the answer's bytes: what follows on the socket is the caller's. */
  size_t have = 0, need = 0;
  const char *refusal;
  int rc;
  while ((rc = dcomm__hs_answer(buf, have, nonce, job_id, token, peer, &need, &refusal)) == 0) {
    DCOMM_CHECK(dcomm__sock_recv_all(fd, buf + have, need - have, deadline, -1));
    have = need;
  }
  if (refusal) { /* the verdict first; the caller gets the reason */
    char why[512];
    snprintf(why, sizeof(why), "%s", dcomm_last_error());
    n = dcomm__hs_verdict(DCOMM_EAUTH, refusal, out);
    dcomm__sock_send_all(fd, out, n, deadline, -1);
    return dcomm__err(DCOMM_EAUTH, "%s", why);
  }
  if (rc < 0) return rc;
  n = dcomm__hs_verdict(0, "", out);
  return dcomm__sock_send_all(fd, out, n, deadline, -1);
}

int dcomm__hs_client(int fd, const char *job_id, const char *token, uint32_t purpose, const void *hello,
                     size_t hello_len, double deadline) {
  size_t job_len = strlen(job_id);
  if (job_len > DCOMM_HS_MAX_JOB || hello_len > DCOMM_HS_MAX_HELLO)
    return dcomm__err(DCOMM_EINVAL, "handshake: job id or hello too long");
  struct hs_challenge ch;
  DCOMM_CHECK(dcomm__sock_recv_all(fd, &ch, sizeof(ch), deadline, -1));
  if (ntohl(ch.magic) != HS_MAGIC || ntohl(ch.version) != HS_VERSION)
    return dcomm__err(DCOMM_EPROTO, "handshake: the server is not a dcomm endpoint");
  struct hs_answer_head h = {.magic = htonl(HS_MAGIC), .version = htonl(HS_VERSION), .purpose = htonl(purpose),
                             .job_len = htons((uint16_t)job_len), .hello_len = htons((uint16_t)hello_len)};
  unsigned char mac[MAC_LEN];
  compute_mac(token, ch.nonce, purpose, job_id, job_len, hello, hello_len, mac);
  DCOMM_CHECK(dcomm__sock_send_all(fd, &h, sizeof(h), deadline, -1));
  DCOMM_CHECK(dcomm__sock_send_all(fd, job_id, job_len, deadline, -1));
  if (hello_len) DCOMM_CHECK(dcomm__sock_send_all(fd, hello, hello_len, deadline, -1));
  DCOMM_CHECK(dcomm__sock_send_all(fd, mac, MAC_LEN, deadline, -1));
  struct hs_verdict v;
  DCOMM_CHECK(dcomm__sock_recv_all(fd, &v, sizeof(v), deadline, -1));
  int status = (int32_t)ntohl((uint32_t)v.status);
  size_t ml = ntohs(v.msg_len);
  char msg[256] = "";
  if (ml >= sizeof(msg)) return dcomm__err(DCOMM_EPROTO, "handshake: oversized verdict");
  DCOMM_CHECK(dcomm__sock_recv_all(fd, msg, ml, deadline, -1));
  msg[ml] = 0;
  if (status != 0)
    return dcomm__err(status == DCOMM_EAUTH ? DCOMM_EAUTH : DCOMM_EPROTO, "handshake refused by the server: %s", msg);
  return 0;
}
