/*
 * store_file.c: the shared-file store behind file:// init, in the spirit of
 * torch's FileStore. Every rank opens the same file on a shared file system;
 * the file is an append-only log of records and each handle replays it into
 * an in-memory map, remembering the offset it has parsed so far.
 *
 * Record (all integers big-endian):
 *   u32 magic "DCFR", u8 op (1 set, 2 delete), u32 klen, u32 vlen,
 *   u32 check (FNV-1a over op, klen, vlen, key and value), key, value
 * A delete is a tombstone record with vlen 0.
 *
 * Locking: writers hold flock(LOCK_EX) and append each record with one
 * write(); readers replay under LOCK_SH, so a record is never seen half
 * written by a live writer. A partial record at the end of the file can thus
 * only be a torn write of a writer that died: readers ignore it and the next
 * writer cuts it off before appending. A complete record that fails its
 * checks is corruption: DCOMM_EPROTO.
 *
 * get/wait poll the file with a backoff from 1 ms doubling to 50 ms until
 * their timeout; add and compare_set read and write under one exclusive lock
 * so that they are atomic across processes.
 */
#define _GNU_SOURCE
#include "config.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "kvmap.h"
#include "log.h"
#include "param.h"
#include "sock.h"
#include "store_proto.h"

#define REC_MAGIC 0x44434652u /* "DCFR" */
#define REC_SET 1
#define REC_DEL 2
#define REC_HDR 17
#define POLL_MIN 0.001
#define POLL_MAX 0.050
#define LOCK_GRACE 1.0 /* seconds */

/* ---- the handle ---- */

struct file_store {
  struct dcomm_store base;
  pthread_mutex_t mu; /* one call at a time per handle */
  int fd;
  off_t off;          /* bytes of the file replayed into map */
  int torn;           /* the last replay stopped at a partial record */
  struct dcomm_kvmap map;
  char path[];
};

static uint32_t fnv32(uint32_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
  return h;
}

static uint32_t rec_check(const unsigned char *hdr, const void *key, size_t kl, const void *val, size_t vl) {
  uint32_t h = fnv32(2166136261u, hdr + 4, 9); /* op, klen, vlen */
  h = fnv32(h, key, kl);
  return fnv32(h, val, vl);
}

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* flock with a deadline, polling with backoff. Locks are held for a single
 * replay or append, so a little grace past the deadline keeps a probe
 * (timeout 0) or a short timeout from failing just because another rank
 * was writing at that instant. */
static int lock_file(struct file_store *fs, int op, double deadline) {
  double delay = POLL_MIN;
  if (deadline < dcomm__now() + LOCK_GRACE) deadline = dcomm__now() + LOCK_GRACE;
  for (;;) {
    if (flock(fs->fd, op | LOCK_NB) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return dcomm__err_sys(errno, "file store %s: flock", fs->path);
    double left = deadline - dcomm__now();
    if (left <= 0) return dcomm__err(DCOMM_ETIMEDOUT, "file store %s: the file stayed locked past the timeout", fs->path);
    sleep_s(delay < left ? delay : left);
    if (delay < POLL_MAX) delay = delay * 2 < POLL_MAX ? delay * 2 : POLL_MAX;
  }
}

static void unlock_file(struct file_store *fs) { flock(fs->fd, LOCK_UN); }

/* pread of exactly n bytes: 0, 1 when the file ends first, or an error. */
static int read_at(struct file_store *fs, void *buf, size_t n, off_t at) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fs->fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return dcomm__err_sys(errno, "file store %s: read", fs->path);
    if (r == 0) return 1;
    p += r;
    n -= (size_t)r;
    at += r;
  }
  return 0;
}

static int corrupt(struct file_store *fs, const char *why) {
  return dcomm__err(DCOMM_EPROTO, "file store %s: corrupt record at offset %lld: %s", fs->path, (long long)fs->off,
                    why);
}

/* Parses the records appended since the last call (a lock is held). */
static int replay(struct file_store *fs) {
  struct stat st;
  if (fstat(fs->fd, &st) < 0) return dcomm__err_sys(errno, "file store %s: fstat", fs->path);
  if (st.st_size < fs->off)
    return dcomm__err(DCOMM_EPROTO, "file store %s: the file shrank below the %lld bytes already read (replaced?)",
                      fs->path, (long long)fs->off);
  size_t max = dcomm__param_size(DCOMM_P_STORE_MAX_VALUE);
  char key[DCOMM_STORE_PROTO_MAX_KEY + 1];
  fs->torn = 0;
  while (st.st_size > fs->off) {
    off_t left = st.st_size - fs->off;
    unsigned char h[REC_HDR];
    if (left < REC_HDR) break;
    int rc = read_at(fs, h, REC_HDR, fs->off);
    if (rc < 0) return rc;
    if (rc > 0) break;
    uint32_t magic = dcomm__store_get_u32(h), kl = dcomm__store_get_u32(h + 5), vl = dcomm__store_get_u32(h + 9);
    uint8_t op = h[4];
    if (magic != REC_MAGIC) return corrupt(fs, "bad magic");
    if (op != REC_SET && op != REC_DEL) return corrupt(fs, "unknown op");
    if (kl == 0 || kl > DCOMM_STORE_PROTO_MAX_KEY) return corrupt(fs, "key length out of range");
    if (vl > max || (op == REC_DEL && vl)) return corrupt(fs, "value length out of range");
    if (left - REC_HDR < (off_t)kl + (off_t)vl) break;
    unsigned char *val = malloc(vl ? vl : 1);
    if (!val) return dcomm__err(DCOMM_ENOMEM, "file store: out of memory for a %" PRIu32 "-byte value", vl);
    if ((rc = read_at(fs, key, kl, fs->off + REC_HDR)) == 0) rc = read_at(fs, val, vl, fs->off + REC_HDR + kl);
    if (rc != 0) {
      free(val);
      if (rc < 0) return rc;
      break;
    }
    key[kl] = 0;
    if (memchr(key, 0, kl) || rec_check(h, key, kl, val, vl) != dcomm__store_get_u32(h + 13)) {
      free(val);
      return corrupt(fs, memchr(key, 0, kl) ? "NUL in key" : "checksum mismatch");
    }
    if (op == REC_SET) {
      if (dcomm__kvmap_put(&fs->map, key, kl, val, vl) < 0) {
        free(val);
        return dcomm__err(DCOMM_ENOMEM, "file store: out of memory");
      }
    } else {
      free(val);
      dcomm__kvmap_del(&fs->map, key, kl);
    }
    fs->off += REC_HDR + (off_t)kl + (off_t)vl;
  }
  fs->torn = st.st_size > fs->off;
  return 0;
}

/* Brings the map up to date under a shared lock. */
static int refresh(struct file_store *fs, double deadline) {
  DCOMM_CHECK(lock_file(fs, LOCK_SH, deadline));
  int rc = replay(fs);
  unlock_file(fs);
  return rc;
}

/* Takes the exclusive lock and replays; a torn tail is cut off so that the
 * next record starts on a record boundary. On success the lock is held. */
static int begin_write(struct file_store *fs) {
  DCOMM_CHECK(lock_file(fs, LOCK_EX, dcomm__now() + fs->base.timeout));
  int rc = replay(fs);
  if (rc == 0 && fs->torn) {
    DCOMM_LOG(WARN, STORE, "file store %s: dropping a torn record at offset %lld", fs->path, (long long)fs->off);
    if (ftruncate(fs->fd, fs->off) < 0) rc = dcomm__err_sys(errno, "file store %s: ftruncate", fs->path);
    else fs->torn = 0;
  }
  if (rc < 0) unlock_file(fs);
  return rc;
}

/* Appends one record (exclusive lock held, file end == fs->off) and applies
 * it to the map. val may be NULL for a tombstone. */
static int append(struct file_store *fs, int op, const char *key, const void *val, size_t vl) {
  size_t kl = strlen(key), n = REC_HDR + kl + vl;
  unsigned char *rec = malloc(n);
  unsigned char *copy = op == REC_SET ? malloc(vl ? vl : 1) : NULL;
  if (!rec || (op == REC_SET && !copy)) {
    free(rec);
    free(copy);
    return dcomm__err(DCOMM_ENOMEM, "file store: out of memory");
  }
  unsigned char *p = dcomm__store_put_u32(rec, REC_MAGIC);
  p = dcomm__store_put_u8(p, (uint8_t)op);
  p = dcomm__store_put_u32(p, (uint32_t)kl);
  p = dcomm__store_put_u32(p, (uint32_t)vl);
  memcpy(rec + REC_HDR, key, kl);
  if (vl) memcpy(rec + REC_HDR + kl, val, vl);
  dcomm__store_put_u32(p, rec_check(rec, key, kl, val, vl));
  /* One write() normally; a short write is completed, and a failure rolls
   * the file back so that no torn record stays behind. */
  size_t done = 0;
  int rc = 0;
  while (done < n) {
    ssize_t w = write(fs->fd, rec + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      rc = dcomm__err_sys(w < 0 ? errno : EIO, "file store %s: write", fs->path);
      if (ftruncate(fs->fd, fs->off) < 0) DCOMM_LOG(WARN, STORE, "file store %s: cannot roll back a failed write", fs->path);
      break;
    }
    done += (size_t)w;
  }
  free(rec);
  if (rc == 0) {
    fs->off += (off_t)n;
    if (op == REC_SET) {
      if (vl) memcpy(copy, val, vl);
      if (dcomm__kvmap_put(&fs->map, key, kl, copy, vl) == 0) copy = NULL;
      else rc = dcomm__err(DCOMM_ENOMEM, "file store: out of memory");
    } else {
      dcomm__kvmap_del(&fs->map, key, kl);
    }
  }
  free(copy);
  return rc;
}

static unsigned char *dup_bytes(const unsigned char *p, size_t n) {
  unsigned char *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}

/* ---- ops ---- */

static int file_set(struct dcomm_store *s, const char *key, const void *val, size_t len) {
  struct file_store *fs = (struct file_store *)s;
  pthread_mutex_lock(&fs->mu);
  int rc = begin_write(fs);
  if (rc == 0) {
    rc = append(fs, REC_SET, key, val, len);
    unlock_file(fs);
  }
  pthread_mutex_unlock(&fs->mu);
  return rc;
}

/* Polls until every key is in the map (1: found) or the deadline passes. */
static int poll_keys(struct file_store *fs, const char *const *keys, int n, double timeout, const char *op) {
  double deadline = dcomm__now() + timeout, delay = POLL_MIN;
  int have = 0;
  for (;;) {
    DCOMM_CHECK(refresh(fs, deadline));
    while (have < n && dcomm__kvmap_find(&fs->map, keys[have], strlen(keys[have]))) have++;
    if (have == n) return 0;
    double left = deadline - dcomm__now();
    if (left <= 0)
      return dcomm__err(DCOMM_ETIMEDOUT, "file store %s: %s: key '%.200s' not set within %.3f s", fs->path, op,
                        keys[have], timeout);
    sleep_s(delay < left ? delay : left);
    if (delay < POLL_MAX) delay = delay * 2 < POLL_MAX ? delay * 2 : POLL_MAX;
    /* A key seen once could have been deleted since; recheck them all. */
    have = 0;
  }
}

static int file_get(struct dcomm_store *s, const char *key, double timeout, void **val, size_t *len) {
  struct file_store *fs = (struct file_store *)s;
  pthread_mutex_lock(&fs->mu);
  int rc = poll_keys(fs, &key, 1, timeout, "get");
  if (rc == 0) {
    struct dcomm_kv *e = dcomm__kvmap_find(&fs->map, key, strlen(key));
    *val = dup_bytes(e->val, e->vlen);
    *len = e->vlen;
    if (!*val) rc = dcomm__err(DCOMM_ENOMEM, "file store: out of memory");
  }
  pthread_mutex_unlock(&fs->mu);
  return rc;
}

static int file_add(struct dcomm_store *s, const char *key, int64_t delta, int64_t *result) {
  struct file_store *fs = (struct file_store *)s;
  pthread_mutex_lock(&fs->mu);
  int rc = begin_write(fs);
  if (rc == 0) {
    struct dcomm_kv *e = dcomm__kvmap_find(&fs->map, key, strlen(key));
    int64_t cur = 0, res = 0;
    if (e && dcomm__kv_parse_int64(e->val, e->vlen, &cur) < 0)
      rc = dcomm__err(DCOMM_EINVAL, "file store add: the value of '%.200s' is not a decimal integer", key);
    else if (__builtin_add_overflow(cur, delta, &res))
      rc = dcomm__err(DCOMM_EINVAL, "file store add: '%.200s' would overflow int64", key);
    else {
      char txt[32];
      int n = snprintf(txt, sizeof(txt), "%" PRId64, res);
      rc = append(fs, REC_SET, key, txt, (size_t)n);
      if (rc == 0) *result = res;
    }
    unlock_file(fs);
  }
  pthread_mutex_unlock(&fs->mu);
  return rc;
}

static int file_compare_set(struct dcomm_store *s, const char *key, const void *expected, size_t elen,
                            const void *desired, size_t dlen, void **current, size_t *clen) {
  struct file_store *fs = (struct file_store *)s;
  *current = NULL;
  *clen = 0;
  pthread_mutex_lock(&fs->mu);
  int rc = begin_write(fs);
  if (rc == 0) {
    size_t kl = strlen(key);
    struct dcomm_kv *e = dcomm__kvmap_find(&fs->map, key, kl);
    int match = expected ? (e && e->vlen == elen && memcmp(e->val, expected, elen) == 0) : !e;
    if (match) rc = append(fs, REC_SET, key, desired, dlen);
    e = dcomm__kvmap_find(&fs->map, key, kl);
    if (rc == 0 && e) {
      /* Absent and not created (expected given): *current stays NULL. */
      *current = dup_bytes(e->val, e->vlen);
      *clen = e->vlen;
      if (!*current) rc = dcomm__err(DCOMM_ENOMEM, "file store: out of memory");
    }
    unlock_file(fs);
  }
  pthread_mutex_unlock(&fs->mu);
  return rc;
}

static const void *map_find(void *ctx, const char *key, size_t *len) {
  struct dcomm_kv *e = dcomm__kvmap_find(ctx, key, strlen(key));
  if (e) *len = e->vlen;
  return e ? e->val : NULL;
}

/* The compares and the appends happen under one exclusive lock; a process
 * that dies between two appends of one txn leaves the first puts in place. */
static int file_txn(struct dcomm_store *s, const struct dcomm_store_cmp *cmps, int ncmp,
                    const struct dcomm_store_put *puts, int nput, int *done) {
  struct file_store *fs = (struct file_store *)s;
  pthread_mutex_lock(&fs->mu);
  int rc = begin_write(fs);
  if (rc == 0) {
    if (dcomm__store_cmps_hold(cmps, ncmp, map_find, &fs->map)) {
      for (int i = 0; i < nput && rc == 0; i++) rc = append(fs, REC_SET, puts[i].key, puts[i].val, puts[i].len);
      *done = rc == 0;
    }
    unlock_file(fs);
  }
  pthread_mutex_unlock(&fs->mu);
  return rc;
}

static int file_wait(struct dcomm_store *s, const char *const *keys, int n, double timeout) {
  struct file_store *fs = (struct file_store *)s;
  pthread_mutex_lock(&fs->mu);
  int rc = poll_keys(fs, keys, n, timeout, "wait");
  pthread_mutex_unlock(&fs->mu);
  return rc;
}

static int file_del(struct dcomm_store *s, const char *key, int *existed) {
  struct file_store *fs = (struct file_store *)s;
  pthread_mutex_lock(&fs->mu);
  int rc = begin_write(fs);
  if (rc == 0) {
    *existed = dcomm__kvmap_find(&fs->map, key, strlen(key)) != NULL;
    if (*existed) rc = append(fs, REC_DEL, key, NULL, 0);
    unlock_file(fs);
  }
  pthread_mutex_unlock(&fs->mu);
  return rc;
}

static void file_close(struct dcomm_store *s) {
  struct file_store *fs = (struct file_store *)s;
  if (fs->fd >= 0) close(fs->fd);
  dcomm__kvmap_free(&fs->map);
  pthread_mutex_destroy(&fs->mu);
  free(fs);
}

static const struct dcomm_store_ops file_ops = {
    .name = "file",
    .set = file_set,
    .get = file_get,
    .add = file_add,
    .compare_set = file_compare_set,
    .txn = file_txn,
    .wait = file_wait,
    .del = file_del,
    .close = file_close,
};

int dcomm__store_file_open(const char *path, double timeout, struct dcomm_store **out) {
  if (!out) return dcomm__err(DCOMM_EINVAL, "file store: NULL output argument");
  *out = NULL;
  if (!path || !*path) return dcomm__err(DCOMM_EINVAL, "file store: empty path");
  if (!(timeout >= 0)) return dcomm__err(DCOMM_EINVAL, "file store: negative or NaN timeout");
  size_t pl = strlen(path);
  struct file_store *fs = calloc(1, sizeof(*fs) + pl + 1);
  if (!fs) return dcomm__err(DCOMM_ENOMEM, "file store: out of memory");
  memcpy(fs->path, path, pl + 1);
  fs->base.ops = &file_ops;
  fs->base.timeout = timeout;
  pthread_mutex_init(&fs->mu, NULL);
  fs->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fs->fd < 0) {
    int e = errno;
    file_close(&fs->base);
    return dcomm__err_sys(e, "file store: cannot open %s", path);
  }
  /* Replaying once now reports a corrupt file at open, not at first use. */
  int rc = refresh(fs, dcomm__now() + timeout);
  if (rc < 0) {
    file_close(&fs->base);
    return rc;
  }
  DCOMM_LOG(INFO, STORE, "file store %s opened (%lld bytes of records)", path, (long long)fs->off);
  *out = &fs->base;
  return 0;
}
