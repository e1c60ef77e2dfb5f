/*
 * tcp_shm.c: the shared-memory links of the tcp backend. Two members of a
 * communicator on one host share one segment (a memfd, so nothing is ever
 * left in /dev/shm) holding a single-producer/single-consumer byte ring per
 * direction. The engine writes the same frames into a ring as it would
 * into a socket; the TCP link stays open beside it and carries only abort
 * frames, wake-ups and the end of file that tells a dead peer.
 *
 * Ring protocol: head (consumer) and tail (producer) count bytes forever
 * and sit on their own cache lines. Every frame header starts at a 64-byte
 * boundary and fills a 64-byte slot, so payloads are cache-line aligned and
 * never split an element across the wrap. The slot also says how much of
 * the payload was written with the header and ends with a stamp (its ring
 * position + 1) stored last: the consumer polls the slot it expects next,
 * not the tail, and takes a whole small frame with the header's cache line
 * and the payload's, never touching the producer's index. Each side keeps
 * the other's index as last read and reads it again only when that is not
 * enough. A side that finds nothing to do
 * raises its waiting flag, looks once more, then sleeps in poll() on the
 * socket; the other side, after publishing, clears the flag and sends a
 * TCP_F_WAKE frame on the socket (a Dekker pair of seq_cst operations, so
 * no wake-up is lost).
 */
#include "config.h"
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define SHM_MAGIC 0x44434d53484d3031ull /* "DCMSHM01" */
#define SHM_CTL_PAGE 4096
#define SLOT 64

/* One direction's shared indices, each on its own cache line. */
struct shm_ctl {
  _Alignas(64) _Atomic uint64_t tail; /* written by the producer */
  _Alignas(64) _Atomic uint64_t head; /* written by the consumer */
  _Alignas(64) atomic_int cons_wait;  /* consumer sleeps for data */
  _Alignas(64) atomic_int prod_wait;  /* producer sleeps for space */
};

struct shm_seg {
  uint64_t magic, nonce, ring;
  int32_t pid[2];      /* [0]: the connector's, [1]: the acceptor's */
  uint64_t probe_addr; /* where the connector holds cma_probe */
  int32_t cma;         /* the acceptor read cma_probe with process_vm_readv */
  _Alignas(64) struct shm_ctl ctl[2]; /* [0]: connector -> acceptor */
};

/* Read by the peer through process_vm_readv to learn whether it may. */
static const uint64_t cma_probe = SHM_MAGIC;

_Static_assert(sizeof(struct shm_seg) <= SHM_CTL_PAGE, "control block fits its page");

/* A frame header's slot in the ring. */
struct shm_slot {
  struct tcp_hdr h;
  uint64_t body;              /* payload bytes published with the header */
  _Atomic uint64_t stamp;     /* ring position + 1, stored last */
};
_Static_assert(sizeof(struct shm_slot) <= SLOT, "a header slot is one cache line");

struct tcp_shm {
  void *base;
  size_t map_len, size, mask;
  struct shm_ctl *tx, *rx;
  char *txbuf, *rxbuf;
  uint64_t head_seen; /* producer: the consumer's head as last read */
  uint64_t tail_seen; /* consumer: published up to here, as far as known */
  struct shm_seg *seg;
  int side;
  int fd;             /* the TCP link, for wake-ups */
};

void tcp_host_id(char *buf, size_t len) {
  char boot[64] = "", host[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof(boot), f)) boot[0] = 0;
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
  }
  if (gethostname(host, sizeof(host) - 1) < 0) host[0] = 0;
  host[sizeof(host) - 1] = 0;
  /* Without a boot id no two processes can prove they share a kernel. */
  if (!boot[0]) snprintf(buf, len, "pid-%ld/%s", (long)getpid(), host);
  else snprintf(buf, len, "%s/%s", boot, host);
}

size_t tcp_shm_ring_size(size_t want) {
  size_t r = 65536;
  while (r < want && r < ((size_t)1 << 28)) r <<= 1;
  return r;
}

/* Writes every page of both rings once, each byte it touches with the
 * value it holds. MAP_POPULATE fills this process's page tables, but where
 * the hypervisor shadows them (PVM and other shadow paging) its own entry
 * is made only at the first access to each page, an exit that cost about
 * 16 us a page on the AMD EPYC guests: without this, a link's whole first
 * pass through its rings (the first 1 MiB each way) ran at 4 us per KiB. It
 * runs before the link carries any frame (the creator before the peer
 * attaches, the attacher before it answers), so it races with nothing. */
static void touch_rings(void *base, size_t map_len) {
  long pg = sysconf(_SC_PAGESIZE);
  size_t step = pg > 0 ? (size_t)pg : 4096;
  volatile char *p = (volatile char *)base + SHM_CTL_PAGE;
  for (size_t off = 0; off < map_len - SHM_CTL_PAGE; off += step) p[off] = p[off];
}

static struct tcp_shm *wrap(void *base, size_t map_len, size_t ring, int side) {
  struct tcp_shm *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  struct shm_seg *g = base;
  s->base = base;
  s->map_len = map_len;
  s->size = ring;
  s->mask = ring - 1;
  s->tx = &g->ctl[side];
  s->rx = &g->ctl[1 - side];
  s->seg = g;
  s->side = side;
  s->txbuf = (char *)base + SHM_CTL_PAGE + (size_t)side * ring;
  s->rxbuf = (char *)base + SHM_CTL_PAGE + (size_t)(1 - side) * ring;
  s->fd = -1;
  return s;
}

int tcp_shm_create(size_t ring, struct tcp_shm **out, int *memfd, uint64_t *nonce, char *why, size_t wl) {
  size_t len = SHM_CTL_PAGE + 2 * ring;
  *out = NULL;
  *memfd = memfd_create("dcomm-link", MFD_CLOEXEC);
  if (*memfd < 0) {
    snprintf(why, wl, "memfd_create: %s", strerror(errno));
    return -1;
  }
  /* Reserve the pages now: a full tmpfs is an error here, not a SIGBUS later. */
  int rc = ftruncate(*memfd, (off_t)len);
  if (rc == 0) rc = posix_fallocate(*memfd, 0, (off_t)len) == 0 ? 0 : -1;
  void *base = rc == 0 ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, *memfd, 0) : MAP_FAILED;
  if (base == MAP_FAILED) {
    snprintf(why, wl, "cannot allocate a %zu-byte segment: %s", len, strerror(errno));
    close(*memfd);
    *memfd = -1;
    return -1;
  }
  touch_rings(base, len);
  struct shm_seg *g = base;
  if (getrandom(nonce, sizeof(*nonce), 0) != sizeof(*nonce)) *nonce = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)base;
  g->magic = SHM_MAGIC;
  g->nonce = *nonce;
  g->ring = ring;
  g->pid[0] = (int32_t)getpid();
  g->probe_addr = (uint64_t)(uintptr_t)&cma_probe;
  *out = wrap(base, len, ring, 0);
  if (!*out) {
    munmap(base, len);
    close(*memfd);
    *memfd = -1;
    snprintf(why, wl, "out of memory");
    return -1;
  }
  return 0;
}

int tcp_shm_attach(int pid, int fd, uint64_t nonce, size_t ring, struct tcp_shm **out, char *why, size_t wl) {
  char path[64];
  size_t len = SHM_CTL_PAGE + 2 * ring;
  *out = NULL;
  if (ring < TCP_SHM_RING_MIN || (ring & (ring - 1)) || ring > ((size_t)1 << 28)) {
    snprintf(why, wl, "bad ring size %zu", ring);
    return -1;
  }
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
  int o = open(path, O_RDWR | O_CLOEXEC);
  if (o < 0) {
    snprintf(why, wl, "open %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  void *base = MAP_FAILED;
  if (fstat(o, &st) == 0 && (size_t)st.st_size == len)
    base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, o, 0);
  close(o);
  if (base == MAP_FAILED) {
    snprintf(why, wl, "cannot map %s", path);
    return -1;
  }
  struct shm_seg *g = base;
  /* Another pid namespace could show another process's file there. */
  if (g->magic != SHM_MAGIC || g->nonce != nonce || g->ring != ring) {
    munmap(base, len);
    snprintf(why, wl, "%s is not the peer's segment (another pid namespace?)", path);
    return -1;
  }
  *out = wrap(base, len, ring, 1);
  if (!*out) {
    munmap(base, len);
    snprintf(why, wl, "out of memory");
    return -1;
  }
  touch_rings(base, len);
  /* Before the answer goes back, so the connector sees both. Cross
   * memory attach is allowed both ways or neither (same user, same
   * ptrace policy), so one probe decides for the link. */
  g->pid[1] = (int32_t)getpid();
  uint64_t v = 0;
  struct iovec lo = {&v, sizeof(v)}, re = {(void *)(uintptr_t)g->probe_addr, sizeof(v)};
  g->cma = g->pid[0] == pid && process_vm_readv(pid, &lo, 1, &re, 1, 0) == (ssize_t)sizeof(v) && v == SHM_MAGIC;
  return 0;
}

int tcp_shm_cma_pid(const struct tcp_shm *s) { return s->seg->cma ? s->seg->pid[1 - s->side] : 0; }

void tcp_shm_set_fd(struct tcp_shm *s, int fd) { s->fd = fd; }

void tcp_shm_free(struct tcp_shm *s) {
  if (!s) return;
  munmap(s->base, s->map_len);
  free(s);
}

static void wake(struct tcp_shm *s, atomic_int *flag) {
  /* Pairs with the sleeper's store of the flag and re-check of the index. */
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(flag, memory_order_relaxed) && atomic_exchange(flag, 0)) {
    struct tcp_hdr h = {.magic = TCP_MAGIC, .type = TCP_F_WAKE};
    /* A full socket buffer already holds wake-ups the peer will read. */
    if (send(s->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */ }
  }
}

static void copy_in(struct tcp_shm *s, uint64_t pos, const void *src, size_t n) {
  size_t off = (size_t)(pos & s->mask), first = s->size - off;
  if (first >= n) {
    memcpy(s->txbuf + off, src, n);
  } else {
    memcpy(s->txbuf + off, src, first);
    memcpy(s->txbuf, (const char *)src + first, n - first);
  }
}

/* Free bytes for the producer, at least want if that many are free: the
 * consumer's head (a cache line it writes) is read again only when the
 * last value seen does not leave enough room. */
static size_t tx_space(struct tcp_shm *s, uint64_t tail, size_t want) {
  size_t space = s->size - (size_t)(tail - s->head_seen);
  if (space >= want) return space;
  s->head_seen = atomic_load_explicit(&s->tx->head, memory_order_acquire);
  return s->size - (size_t)(tail - s->head_seen);
}

static uint64_t slot_pos(uint64_t pos) { return (pos + SLOT - 1) & ~(uint64_t)(SLOT - 1); }

long tcp_shm_put_frame(struct tcp_shm *s, const struct tcp_hdr *h, const void *src, size_t len) {
  uint64_t tail = atomic_load_explicit(&s->tx->tail, memory_order_relaxed);
  size_t space = tx_space(s, tail, len + 2 * SLOT);
  if (space < 2 * SLOT) return -1;
  uint64_t at = slot_pos(tail), body = at + SLOT;
  size_t n = space - (size_t)(body - tail);
  if (n >= len) n = len;
  else n &= ~(size_t)(SLOT - 1); /* a partial payload never splits an element */
  if (n) copy_in(s, body, src, n);
  struct shm_slot *sl = (struct shm_slot *)(s->txbuf + (at & s->mask));
  memcpy(&sl->h, h, sizeof(*h));
  sl->body = n;
  /* The stamp publishes the header and n payload bytes; the tail, for
   * the sleeping consumer's check and for later payload, follows. */
  atomic_store_explicit(&sl->stamp, at + 1, memory_order_release);
  atomic_store_explicit(&s->tx->tail, body + n, memory_order_release);
  wake(s, &s->tx->cons_wait);
  return (long)n;
}

size_t tcp_shm_put(struct tcp_shm *s, const void *src, size_t len) {
  uint64_t tail = atomic_load_explicit(&s->tx->tail, memory_order_relaxed);
  size_t space = tx_space(s, tail, len);
  size_t n = len < space ? len : space;
  /* Partial writes end on a 64-byte boundary: no element is ever split. */
  if (n < len) n &= ~(size_t)(SLOT - 1);
  if (!n) return 0;
  copy_in(s, tail, src, n);
  atomic_store_explicit(&s->tx->tail, tail + n, memory_order_release);
  wake(s, &s->tx->cons_wait);
  return n;
}

int tcp_shm_fits(struct tcp_shm *s, size_t len) {
  return tx_space(s, atomic_load_explicit(&s->tx->tail, memory_order_relaxed), len + 2 * SLOT) >= len + 2 * SLOT;
}

int tcp_shm_get_hdr(struct tcp_shm *s, struct tcp_hdr *h) {
  uint64_t head = atomic_load_explicit(&s->rx->head, memory_order_relaxed), at = slot_pos(head);
  const struct shm_slot *sl = (const struct shm_slot *)(s->rxbuf + (at & s->mask));
  if (atomic_load_explicit(&sl->stamp, memory_order_acquire) != at + 1) return 0;
  memcpy(h, &sl->h, sizeof(*h));
  uint64_t known = at + SLOT + (sl->body < h->len ? sl->body : h->len);
  if (known > s->tail_seen) s->tail_seen = known;
  atomic_store_explicit(&s->rx->head, at + SLOT, memory_order_release);
  /* Always wake a producer waiting for room, even when a payload follows:
   * the producer may have written the header alone (no room for any of
   * the payload) and be asleep until the header's slot is free; waiting
   * for the payload's consumption then deadlocked both sides (a rare hang
   * of 4 ranks on 2 cores). wake() costs one load when nobody sleeps. */
  wake(s, &s->rx->prod_wait);
  return 1;
}

size_t tcp_shm_peek(struct tcp_shm *s, const void **p) {
  uint64_t head = atomic_load_explicit(&s->rx->head, memory_order_relaxed);
  if (s->tail_seen <= head) {
    /* The tail only adds to what is known: the producer stores it after
     * the stamp that published a header's first piece, so a tail read in
     * between lags behind what that stamp told, behind head even. Taken
     * as is, it made the bytes after the first piece (stale ones from the
     * ring's last lap) look published: a rare wrong element at byte 64 Ki
     * of large frames when the producer was preempted between the two. */
    uint64_t tail = atomic_load_explicit(&s->rx->tail, memory_order_acquire);
    if (tail > s->tail_seen) s->tail_seen = tail;
  }
  size_t off = (size_t)(head & s->mask), first = s->size - off;
  size_t avail = s->tail_seen > head ? (size_t)(s->tail_seen - head) : 0;
  *p = s->rxbuf + off;
  return avail < first ? avail : first;
}

void tcp_shm_consume(struct tcp_shm *s, size_t n) {
  uint64_t head = atomic_load_explicit(&s->rx->head, memory_order_relaxed);
  atomic_store_explicit(&s->rx->head, head + n, memory_order_release);
  wake(s, &s->rx->prod_wait);
}

size_t tcp_shm_get(struct tcp_shm *s, void *dst, size_t len) {
  size_t got = 0;
  while (got < len) {
    const void *src;
    size_t n = tcp_shm_peek(s, &src);
    if (!n) break;
    if (n > len - got) n = len - got;
    memcpy((char *)dst + got, src, n);
    tcp_shm_consume(s, n);
    got += n;
  }
  return got;
}

int tcp_shm_arm_rx(struct tcp_shm *s) {
  atomic_store(&s->rx->cons_wait, 1);
  return atomic_load(&s->rx->tail) != atomic_load_explicit(&s->rx->head, memory_order_relaxed);
}

int tcp_shm_arm_tx(struct tcp_shm *s) {
  atomic_store(&s->tx->prod_wait, 1);
  uint64_t used = atomic_load_explicit(&s->tx->tail, memory_order_relaxed) - atomic_load(&s->tx->head);
  return s->size - (size_t)used >= 2 * SLOT; /* room for any header or some data */
}
