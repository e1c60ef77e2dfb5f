/*
 * checkpoint_file.c: crash-safe checkpoint files (see checkpoint_file.h
 * for the format): writing one, reading and validating one. Which files
 * count (commit records, COMMITTED, pruning) is checkpoint_commit.c.
 *
 * dcomm__ckpt_write:
 *   1. write header + payload to <dir>/.ckpt-<step>.tmp.<pid>
 *   2. fsync the temp file, close it
 *   3. rename it to <dir>/ckpt-<step>-g<generation>.dcp
 *   4. fsync the directory, so that the rename itself is durable
 * dcomm__ckpt_commit (after the job's store accepted the record):
 *   5. under flock(<dir>/.commit.lock): read COMMITTED, add the record,
 *      write it through a temp file, fsync, rename, fsync the directory
 *   6. prune: delete ckpt-*.dcp files no record names, and temp files
 * A crash before 5 leaves a file no record names, which readers never
 * read; a crash after 5 leaves the new record in force. Readers still
 * check everything (magic, version, header CRC, length against the file
 * size, payload CRC, and that the header is the one the record describes),
 * since files can be damaged by other means, and fall back to the previous
 * record.
 *
 * Only one writer per directory at a time is legitimate (rank 0 of the
 * current generation); a fenced writer of an older generation may still
 * write a file, under another name, but never a record.
 */
#include "config.h"
#include "checkpoint_file.h"

#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

#include "error.h"
#include "log.h"
#include "param.h"

#define IO_CHUNK ((size_t)1 << 30) /* largest single read/write/crc32 call */

/* ---- little-endian serialization ---- */

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

struct ckpt_header {
  uint32_t version, header_crc;
  uint64_t step;
  int64_t generation;
  uint64_t payload_len;
  uint32_t payload_crc, reserved;
};

/* Field offsets in the on-disk header. */
enum { OFF_MAGIC = 0, OFF_VERSION = 8, OFF_HCRC = 12, OFF_STEP = 16, OFF_GEN = 24, OFF_LEN = 32, OFF_PCRC = 40, OFF_RSV = 44 };

static uint32_t crc_buf(const void *data, uint64_t len) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const unsigned char *p = data;
  while (len > 0) {
    uInt n = (uInt)(len > IO_CHUNK ? IO_CHUNK : len);
    crc = crc32(crc, p, n);
    p += n;
    len -= n;
  }
  return (uint32_t)crc;
}

/* CRC of the serialized header with the header_crc field taken as zero. */
static uint32_t header_crc_of(const unsigned char *raw) {
  unsigned char tmp[DCOMM_CKPT_HEADER_SIZE];
  memcpy(tmp, raw, sizeof(tmp));
  put_u32(tmp + OFF_HCRC, 0);
  return crc_buf(tmp, sizeof(tmp));
}

static void header_encode(unsigned char *raw, const struct ckpt_header *h) {
  memcpy(raw + OFF_MAGIC, DCOMM_CKPT_MAGIC, 8);
  put_u32(raw + OFF_VERSION, h->version);
  put_u32(raw + OFF_HCRC, 0);
  put_u64(raw + OFF_STEP, h->step);
  put_u64(raw + OFF_GEN, (uint64_t)h->generation);
  put_u64(raw + OFF_LEN, h->payload_len);
  put_u32(raw + OFF_PCRC, h->payload_crc);
  put_u32(raw + OFF_RSV, h->reserved);
  put_u32(raw + OFF_HCRC, header_crc_of(raw));
}

static void header_decode(const unsigned char *raw, struct ckpt_header *h) {
  h->version = get_u32(raw + OFF_VERSION);
  h->header_crc = get_u32(raw + OFF_HCRC);
  h->step = get_u64(raw + OFF_STEP);
  h->generation = (int64_t)get_u64(raw + OFF_GEN);
  h->payload_len = get_u64(raw + OFF_LEN);
  h->payload_crc = get_u32(raw + OFF_PCRC);
  h->reserved = get_u32(raw + OFF_RSV);
}

/* ---- I/O helpers: retry on EINTR and short transfers ---- */

/* 0 or -errno. */
int dcomm__ckpt_write_all(int fd, const void *buf, size_t len) {
  const unsigned char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len > IO_CHUNK ? IO_CHUNK : len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO; /* write() making no progress: treat as I/O error */
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Reads up to len bytes, stopping early only at end of file; *got is the
 * number read. 0 or -errno. */
int dcomm__ckpt_read_full(int fd, void *buf, size_t len, size_t *got) {
  unsigned char *p = buf;
  *got = 0;
  while (len > 0) {
    ssize_t n = read(fd, p, len > IO_CHUNK ? IO_CHUNK : len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    p += n;
    len -= (size_t)n;
    *got += (size_t)n;
  }
  return 0;
}

int dcomm__ckpt_fsync(int fd) {
  int rc;
  do rc = fsync(fd);
  while (rc < 0 && errno == EINTR);
  return rc;
}

int dcomm__ckpt_join_path(char *buf, size_t cap, const char *dir, const char *name) {
  size_t dl = strlen(dir);
  const char *sep = (dl > 0 && dir[dl - 1] == '/') ? "" : "/";
  int n = snprintf(buf, cap, "%s%s%s", dir, sep, name);
  if (n < 0 || (size_t)n >= cap) return dcomm__err(DCOMM_EINVAL, "checkpoint: path %s/%s is too long", dir, name);
  return 0;
}

/* mkdir -p dir (mode 0755 before umask). */
static int mkdir_p(const char *dir) {
  char buf[PATH_MAX];
  size_t len = strlen(dir);
  if (len >= sizeof(buf)) return dcomm__err(DCOMM_EINVAL, "checkpoint: directory name too long (%zu bytes)", len);
  memcpy(buf, dir, len + 1);
  for (size_t i = 1; i <= len; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    if (buf[i - 1] == '/') continue; /* "//" or trailing slash */
    char c = buf[i];
    buf[i] = 0;
    if (mkdir(buf, 0755) < 0 && errno != EEXIST) {
      int e = errno;
      buf[i] = c;
      return dcomm__err_sys(e, "checkpoint: mkdir %.*s (creating %s)", (int)i, dir, dir);
    }
    buf[i] = c;
  }
  return 0;
}

/* DCOMM_CHECKPOINT_TEST_DIE_FILE: the chaos soak's "checkpoint write killed
 * midway". The file is taken (unlinked) by exactly one writer, which dies
 * with only the header of its temp file written. */
static void die_if_asked(const char *dir, const char *tmp_name) {
  const char *f = dcomm__param_str(DCOMM_P_CHECKPOINT_TEST_DIE_FILE);
  if (!f || !*f || unlink(f) < 0) return;
  DCOMM_LOG(WARN, ELASTIC, "DCOMM_CHECKPOINT_TEST_DIE_FILE=%s: dying halfway through %s/%s", f, dir, tmp_name);
  raise(SIGKILL);
}

int dcomm__ckpt_write(const char *dir, uint64_t step, int64_t generation, const void *data, size_t len,
                      struct dcomm_ckpt_rec *rec) {
  if (!dir || !*dir) return dcomm__err(DCOMM_EINVAL, "checkpoint write: empty directory name");
  if (len > 0 && !data) return dcomm__err(DCOMM_EINVAL, "checkpoint write: data is NULL but len is %zu", len);
  if ((uint64_t)len > DCOMM_CKPT_MAX_PAYLOAD)
    return dcomm__err(DCOMM_EINVAL, "checkpoint write: payload of %zu bytes exceeds the %llu-byte limit", len,
                      (unsigned long long)DCOMM_CKPT_MAX_PAYLOAD);

  DCOMM_CHECK(mkdir_p(dir));
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return dcomm__err_sys(errno, "checkpoint write: open directory %s", dir);

  char final_name[64], tmp_name[96];
  snprintf(final_name, sizeof(final_name), "ckpt-%012llu-g%lld.dcp", (unsigned long long)step, (long long)generation);
  snprintf(tmp_name, sizeof(tmp_name), ".ckpt-%012llu.tmp.%ld", (unsigned long long)step, (long)getpid());

  struct ckpt_header h = {.version = DCOMM_CKPT_VERSION,
                          .step = step,
                          .generation = generation,
                          .payload_len = (uint64_t)len,
                          .payload_crc = crc_buf(data, (uint64_t)len),
                          .reserved = 0};
  unsigned char raw[DCOMM_CKPT_HEADER_SIZE];
  header_encode(raw, &h);

  int rc = 0, e;
  int fd = openat(dfd, tmp_name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = dcomm__err_sys(errno, "checkpoint write: create temp file %s/%s", dir, tmp_name);
    close(dfd);
    return rc;
  }
  e = dcomm__ckpt_write_all(fd, raw, sizeof(raw));
  if (e >= 0) die_if_asked(dir, tmp_name);
  if (e < 0 || (len > 0 && (e = dcomm__ckpt_write_all(fd, data, len)) < 0)) {
    rc = dcomm__err_sys(-e, "checkpoint write: write %s/%s (%zu payload bytes)", dir, tmp_name, len);
    goto fail_fd;
  }
  if (dcomm__ckpt_fsync(fd) < 0) {
    rc = dcomm__err_sys(errno, "checkpoint write: fsync %s/%s", dir, tmp_name);
    goto fail_fd;
  }
  /* After a successful fsync the data is safe; EINTR from close on Linux
   * still releases the descriptor. */
  if (close(fd) < 0 && errno != EINTR) {
    rc = dcomm__err_sys(errno, "checkpoint write: close %s/%s", dir, tmp_name);
    goto fail_tmp;
  }
  if (renameat(dfd, tmp_name, dfd, final_name) < 0) {
    rc = dcomm__err_sys(errno, "checkpoint write: rename %s/%s to %s", dir, tmp_name, final_name);
    goto fail_tmp;
  }
  /* Some file systems refuse fsync on a directory (EINVAL); the rename is as
   * durable there as it can be made. */
  if (dcomm__ckpt_fsync(dfd) < 0 && errno != EINVAL && errno != ENOTSUP) {
    /* The new file is in place but may not survive a power loss; report it,
     * as the caller must not assume the checkpoint is durable. */
    rc = dcomm__err_sys(errno, "checkpoint write: fsync directory %s after renaming %s", dir, final_name);
    close(dfd);
    return rc;
  }
  DCOMM_LOG(INFO, ELASTIC, "checkpoint: wrote step %llu (generation %lld, %zu bytes) to %s/%s",
            (unsigned long long)step, (long long)generation, len, dir, final_name);
  close(dfd);
  if (rec) {
    memset(rec, 0, sizeof(*rec));
    rec->step = step;
    rec->generation = generation;
    rec->len = (uint64_t)len;
    rec->header_crc = get_u32(raw + OFF_HCRC);
    rec->payload_crc = h.payload_crc;
    snprintf(rec->name, sizeof(rec->name), "%s", final_name);
  }
  return 0;

fail_fd:
  close(fd);
fail_tmp:
  unlinkat(dfd, tmp_name, 0);
  close(dfd);
  return rc;
}

/* ---- read ---- */

int dcomm__ckpt_read_file(const char *path, void **data, size_t *len, struct dcomm_ckpt_info *info) {
  if (!data || !len) return dcomm__err(DCOMM_EINVAL, "checkpoint read: data and len must not be NULL");
  *data = NULL;
  *len = 0;
  if (!path || !*path) return dcomm__err(DCOMM_EINVAL, "checkpoint read: empty path");
  if (info && strlen(path) >= sizeof(info->path))
    return dcomm__err(DCOMM_EINVAL, "checkpoint read: path too long (%zu bytes): %.100s...", strlen(path), path);

  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return dcomm__err(DCOMM_ENOTFOUND, "checkpoint %s: does not exist", path);
    return dcomm__err_sys(errno, "checkpoint %s: open", path);
  }
  int rc = 0, e;
  unsigned char *buf = NULL;
  struct stat st;
  if (fstat(fd, &st) < 0) {
    rc = dcomm__err_sys(errno, "checkpoint %s: fstat", path);
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: not a regular file", path);
    goto out;
  }
  uint64_t fsize = (uint64_t)st.st_size;
  if (fsize < DCOMM_CKPT_HEADER_SIZE) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: torn: %llu bytes, shorter than the %d-byte header", path,
                    (unsigned long long)fsize, DCOMM_CKPT_HEADER_SIZE);
    goto out;
  }
  unsigned char raw[DCOMM_CKPT_HEADER_SIZE];
  size_t got;
  if ((e = dcomm__ckpt_read_full(fd, raw, sizeof(raw), &got)) < 0) {
    rc = dcomm__err_sys(-e, "checkpoint %s: read header", path);
    goto out;
  }
  if (got < sizeof(raw)) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: torn: header cut at %zu bytes", path, got);
    goto out;
  }
  if (memcmp(raw + OFF_MAGIC, DCOMM_CKPT_MAGIC, 8) != 0) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: bad magic (not a dcomm checkpoint)", path);
    goto out;
  }
  struct ckpt_header h;
  header_decode(raw, &h);
  uint32_t hcrc = header_crc_of(raw);
  if (hcrc != h.header_crc) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: header CRC mismatch (stored 0x%08x, computed 0x%08x)", path,
                    h.header_crc, hcrc);
    goto out;
  }
  if (h.version != DCOMM_CKPT_VERSION) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: unsupported format version %u (this build reads %u)", path,
                    h.version, DCOMM_CKPT_VERSION);
    goto out;
  }
  if (h.payload_len > DCOMM_CKPT_MAX_PAYLOAD) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: payload length %llu exceeds the %llu-byte limit", path,
                    (unsigned long long)h.payload_len, (unsigned long long)DCOMM_CKPT_MAX_PAYLOAD);
    goto out;
  }
  uint64_t have = fsize - DCOMM_CKPT_HEADER_SIZE;
  if (h.payload_len > have) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: torn: header says %llu payload bytes, file holds %llu", path,
                    (unsigned long long)h.payload_len, (unsigned long long)have);
    goto out;
  }
  if (h.payload_len < have) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: %llu unexpected bytes after the %llu-byte payload", path,
                    (unsigned long long)(have - h.payload_len), (unsigned long long)h.payload_len);
    goto out;
  }
  if (h.payload_len > (uint64_t)SIZE_MAX) {
    rc = dcomm__err(DCOMM_ENOMEM, "checkpoint %s: payload of %llu bytes does not fit in memory", path,
                    (unsigned long long)h.payload_len);
    goto out;
  }
  size_t plen = (size_t)h.payload_len;
  if (plen > 0) {
    if (!(buf = malloc(plen))) {
      rc = dcomm__err(DCOMM_ENOMEM, "checkpoint %s: cannot allocate %zu bytes for the payload", path, plen);
      goto out;
    }
    if ((e = dcomm__ckpt_read_full(fd, buf, plen, &got)) < 0) {
      rc = dcomm__err_sys(-e, "checkpoint %s: read payload", path);
      goto out;
    }
    if (got < plen) { /* the file shrank since fstat */
      rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: torn: payload cut at %zu of %zu bytes", path, got, plen);
      goto out;
    }
  }
  uint32_t pcrc = crc_buf(buf, plen);
  if (pcrc != h.payload_crc) {
    rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: payload CRC mismatch (stored 0x%08x, computed 0x%08x)", path,
                    h.payload_crc, pcrc);
    goto out;
  }
  if (info) {
    info->step = h.step;
    info->generation = h.generation;
    info->len = h.payload_len;
    info->header_crc = h.header_crc;
    info->payload_crc = h.payload_crc;
    snprintf(info->path, sizeof(info->path), "%s", path);
  }
  *data = buf;
  *len = plen;
  buf = NULL;
out:
  free(buf);
  close(fd);
  return rc;
}

