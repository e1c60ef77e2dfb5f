/*
 * check_shm_ring.c: white-box tests of the shared-memory ring of the tcp
 * backend. plugins/tcp/tcp_shm.c is compiled into this program, so a test
 * can leave the ring's shared indices where a producer preempted between
 * two of its stores leaves them, a moment no black-box run can pick:
 *   - a frame's first piece is published by its header's stamp and the
 *     tail follows; a consumer that read the tail in between must not take
 *     the bytes after the first piece (stale ones of the ring's last lap);
 *   - a producer thread and a consumer thread move frames of many sizes
 *     through a small ring (many wraps, partial pieces) and every byte
 *     arrives in order (run under ThreadSanitizer by scripts/test.sh).
 * Both ends are mapped in this one process (the segment's memfd opened
 * again through /proc/self); no socket is needed, the wake-ups go nowhere.
 */
#include "../plugins/tcp/tcp_shm.c"

#include <check.h>
#include <pthread.h>

/* A segment with both of its ends: prod writes into the ring cons reads. */
static void ring_pair(size_t ring, struct tcp_shm **prod, struct tcp_shm **cons) {
  int memfd = -1;
  uint64_t nonce = 0;
  char why[160] = "";
  ck_assert_msg(tcp_shm_create(ring, prod, &memfd, &nonce, why, sizeof(why)) == 0, "create: %s", why);
  ck_assert_msg(tcp_shm_attach((int)getpid(), memfd, nonce, ring, cons, why, sizeof(why)) == 0, "attach: %s", why);
  close(memfd);
}

static unsigned char pattern(uint64_t frame, size_t i) { return (unsigned char)(frame * 131u + i * 7u + (i >> 8)); }

/* The producer publishes a header and its first piece, and is preempted
 * before it stores the tail: the consumer takes that piece, then must see
 * nothing more until the next piece is really there. */
START_TEST(test_tail_behind_stamp) {
  const size_t ring = 4 * TCP_SHM_PIECE, piece = TCP_SHM_PIECE, len = 3 * TCP_SHM_PIECE;
  struct tcp_shm *prod, *cons;
  ring_pair(ring, &prod, &cons);
  unsigned char *data = malloc(len), *got = malloc(len);
  ck_assert_ptr_nonnull(data);
  ck_assert_ptr_nonnull(got);
  for (size_t i = 0; i < len; i++) data[i] = pattern(1, i);
  memset(prod->txbuf, 0xEE, ring); /* what an earlier lap left in the ring */

  struct tcp_hdr h = {.magic = TCP_MAGIC, .type = TCP_F_DATA, .len = len};
  uint64_t before = atomic_load(&prod->tx->tail);
  ck_assert_int_eq(tcp_shm_put_frame(prod, &h, data, piece), (long)piece);
  uint64_t after = atomic_load(&prod->tx->tail);
  atomic_store(&prod->tx->tail, before); /* the tail's store not done yet */

  struct tcp_hdr rh;
  ck_assert_int_eq(tcp_shm_get_hdr(cons, &rh), 1);
  ck_assert_uint_eq(rh.len, len);
  size_t got_n = 0;
  for (;;) {
    const void *src;
    size_t n = tcp_shm_peek(cons, &src);
    if (!n) break;
    ck_assert_msg(got_n + n <= piece, "the consumer took %zu bytes; only the first piece (%zu) was published", got_n + n,
                  piece);
    memcpy(got + got_n, src, n);
    tcp_shm_consume(cons, n);
    got_n += n;
  }
  ck_assert_uint_eq(got_n, piece);
  ck_assert_msg(memcmp(got, data, piece) == 0, "the first piece arrived changed");

  atomic_store(&prod->tx->tail, after); /* the producer runs again */
  const void *src;
  ck_assert_uint_eq(tcp_shm_peek(cons, &src), 0);
  ck_assert_uint_eq(tcp_shm_put(prod, data + piece, piece), piece);
  size_t n = tcp_shm_peek(cons, &src);
  ck_assert_uint_eq(n, piece);
  ck_assert_msg(memcmp(src, data + piece, piece) == 0, "the second piece arrived changed");
  tcp_shm_consume(cons, n);
  tcp_shm_free(prod);
  tcp_shm_free(cons);
  free(data);
  free(got);
}
END_TEST

/* Two threads, frames of sizes around the piece and the ring, through a
 * 64 KiB ring: headers and payloads arrive whole, in order, unchanged. */
#define SOAK_FRAMES 3000
struct soak {
  struct tcp_shm *prod, *cons;
  size_t max;
  int bad;
};

static size_t soak_len(uint64_t f, size_t max) { return (size_t)((f * 2654435761u) % max); }

static void *soak_producer(void *arg) {
  struct soak *s = arg;
  unsigned char *buf = malloc(s->max);
  for (uint64_t f = 0; buf && f < SOAK_FRAMES; f++) {
    size_t len = soak_len(f, s->max), done = 0;
    for (size_t i = 0; i < len; i++) buf[i] = pattern(f, i);
    struct tcp_hdr h = {.magic = TCP_MAGIC, .type = TCP_F_DATA, .seq = f, .len = len};
    long n;
    while ((n = tcp_shm_put_frame(s->prod, &h, buf, len < TCP_SHM_PIECE ? len : TCP_SHM_PIECE)) < 0) sched_yield();
    done = (size_t)n;
    while (done < len) {
      size_t want = len - done < TCP_SHM_PIECE ? len - done : TCP_SHM_PIECE, k = tcp_shm_put(s->prod, buf + done, want);
      if (!k) sched_yield();
      done += k;
    }
  }
  free(buf);
  return NULL;
}

static void *soak_consumer(void *arg) {
  struct soak *s = arg;
  for (uint64_t f = 0; f < SOAK_FRAMES && !s->bad; f++) {
    struct tcp_hdr h;
    while (!tcp_shm_get_hdr(s->cons, &h)) sched_yield();
    if (h.magic != TCP_MAGIC || h.seq != f || h.len != soak_len(f, s->max)) {
      s->bad = 1;
      break;
    }
    for (size_t off = 0; off < h.len && !s->bad;) {
      const void *src;
      size_t n = tcp_shm_peek(s->cons, &src);
      if (!n) {
        sched_yield();
        continue;
      }
      if (n > h.len - off) n = h.len - off;
      for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)src)[i] != pattern(f, off + i)) s->bad = 2;
      tcp_shm_consume(s->cons, n);
      off += n;
    }
  }
  return NULL;
}

START_TEST(test_threads_soak) {
  struct soak s = {.max = 3 * TCP_SHM_PIECE + 4099};
  ring_pair(TCP_SHM_RING_MIN, &s.prod, &s.cons);
  pthread_t p, c;
  ck_assert_int_eq(pthread_create(&c, NULL, soak_consumer, &s), 0);
  ck_assert_int_eq(pthread_create(&p, NULL, soak_producer, &s), 0);
  pthread_join(c, NULL);
  ck_assert_msg(!s.bad, "a frame arrived %s", s.bad == 1 ? "with a wrong header" : "with wrong bytes");
  pthread_join(p, NULL);
  tcp_shm_free(s.prod);
  tcp_shm_free(s.cons);
}
END_TEST

int main(void) {
  Suite *s = suite_create("shm_ring");
  TCase *tc = tcase_create("ring");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_tail_behind_stamp);
  tcase_add_test(tc, test_threads_soak);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
