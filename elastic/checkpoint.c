/*
 * checkpoint.c: crash-safe checkpoint files (see checkpoint.h for the format).
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
#include "checkpoint.h"

#include <dirent.h>
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
static int write_all(int fd, const void *buf, size_t len) {
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
static int read_full(int fd, void *buf, size_t len, size_t *got) {
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

static int fsync_retry(int fd) {
  int rc;
  do rc = fsync(fd);
  while (rc < 0 && errno == EINTR);
  return rc;
}

/* ---- names ---- */

/* "ckpt-<digits>-g<digits>.dcp" (the generation may be negative), or the
 * older "ckpt-<digits>.dcp"; the digits give the step. */
static int parse_ckpt_name(const char *name, uint64_t *step) {
  if (strncmp(name, "ckpt-", 5) != 0) return 0;
  const char *d = name + 5, *e = d;
  while (*e >= '0' && *e <= '9') e++;
  if (e == d || e - d > 20) return 0;
  const char *tail = e;
  if (!strncmp(tail, "-g", 2)) {
    const char *g = tail + 2 + (tail[2] == '-'), *ge = g;
    while (*ge >= '0' && *ge <= '9') ge++;
    if (ge == g || ge - g > 19) return 0;
    tail = ge;
  }
  if (strcmp(tail, ".dcp") != 0) return 0;
  errno = 0;
  unsigned long long v = strtoull(d, NULL, 10);
  if (errno == ERANGE) return 0;
  *step = (uint64_t)v;
  return 1;
}

/* ".ckpt-<digits>.tmp.<digits>" or ".commit.tmp.<digits>" exactly. */
static int is_tmp_name(const char *name) {
  if (!strncmp(name, ".commit.tmp.", 12)) {
    const char *q = name + 12;
    while (*q >= '0' && *q <= '9') q++;
    return q != name + 12 && *q == 0;
  }
  if (strncmp(name, ".ckpt-", 6) != 0) return 0;
  const char *p = name + 6, *q = p;
  while (*q >= '0' && *q <= '9') q++;
  if (q == p || strncmp(q, ".tmp.", 5) != 0) return 0;
  p = q + 5;
  q = p;
  while (*q >= '0' && *q <= '9') q++;
  return q != p && *q == 0;
}

struct ckpt_entry {
  uint64_t step;
  char name[64]; /* parse_ckpt_name bounds it */
};

struct ckpt_list {
  struct ckpt_entry *v;
  size_t n, cap;
  char **tmp; /* leftover temp files */
  size_t ntmp, captmp;
};

static void list_free(struct ckpt_list *l) {
  free(l->v);
  for (size_t i = 0; i < l->ntmp; i++) free(l->tmp[i]);
  free(l->tmp);
  memset(l, 0, sizeof(*l));
}

/* Newest (highest step) first; equal steps by name for a stable order. */
static int entry_cmp(const void *a, const void *b) {
  const struct ckpt_entry *x = a, *y = b;
  if (x->step != y->step) return x->step > y->step ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Scans an open directory stream (which it closes) into l, sorted newest
 * first. want_tmp: also collect temp file names. dir is for messages. */
static int scan_dir(DIR *d, const char *dir, int want_tmp, struct ckpt_list *l) {
  memset(l, 0, sizeof(*l));
  for (;;) {
    errno = 0;
    struct dirent *de = readdir(d);
    if (!de) {
      if (errno) {
        int e = errno;
        closedir(d);
        list_free(l);
        return dcomm__err_sys(e, "checkpoint: readdir %s", dir);
      }
      break;
    }
    uint64_t step;
    if (parse_ckpt_name(de->d_name, &step)) {
      if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct ckpt_entry *nv = realloc(l->v, cap * sizeof(*nv));
        if (!nv) goto oom;
        l->v = nv;
        l->cap = cap;
      }
      size_t nl = strlen(de->d_name); /* < sizeof name: parse_ckpt_name bounds it */
      if (nl >= sizeof(l->v[l->n].name)) continue;
      l->v[l->n].step = step;
      memcpy(l->v[l->n].name, de->d_name, nl + 1);
      l->n++;
    } else if (want_tmp && is_tmp_name(de->d_name)) {
      if (l->ntmp == l->captmp) {
        size_t cap = l->captmp ? 2 * l->captmp : 4;
        char **nt = realloc(l->tmp, cap * sizeof(*nt));
        if (!nt) goto oom;
        l->tmp = nt;
        l->captmp = cap;
      }
      if (!(l->tmp[l->ntmp] = strdup(de->d_name))) goto oom;
      l->ntmp++;
    }
  }
  closedir(d);
  if (l->n > 1) qsort(l->v, l->n, sizeof(*l->v), entry_cmp);
  return 0;
oom:
  closedir(d);
  list_free(l);
  return dcomm__err(DCOMM_ENOMEM, "checkpoint: out of memory listing %s", dir);
}

/* "dir/name" into buf; DCOMM_EINVAL when it does not fit. */
static int join_path(char *buf, size_t cap, const char *dir, const char *name) {
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

/* ---- write ---- */

/* Deletes every checkpoint file not named in names[0..n) and leftover temp
 * files. Returns the number of failures; each one is logged. */
static int prune(int dfd, const char *dir, const struct dcomm_ckpt_rec *names, int n) {
  int fd2 = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd2 < 0) {
    DCOMM_LOG(WARN, ELASTIC, "checkpoint: cannot prune %s: open: %s", dir, strerror(errno));
    return 1;
  }
  DIR *d = fdopendir(fd2);
  if (!d) {
    DCOMM_LOG(WARN, ELASTIC, "checkpoint: cannot prune %s: fdopendir: %s", dir, strerror(errno));
    close(fd2);
    return 1;
  }
  struct ckpt_list l;
  int rc = scan_dir(d, dir, 1, &l);
  if (rc < 0) {
    DCOMM_LOG(WARN, ELASTIC, "checkpoint: cannot prune %s: %s", dir, dcomm_last_error());
    return 1;
  }
  int failures = 0, removed = 0;
  for (size_t i = 0; i < l.n; i++) {
    int named = 0;
    for (int k = 0; k < n && !named; k++) named = !strcmp(l.v[i].name, names[k].name);
    if (named) continue;
    if (unlinkat(dfd, l.v[i].name, 0) < 0 && errno != ENOENT) {
      DCOMM_LOG(WARN, ELASTIC, "checkpoint: cannot delete old checkpoint %s/%s: unlink: %s", dir, l.v[i].name,
                strerror(errno));
      failures++;
    } else {
      DCOMM_LOG(DEBUG, ELASTIC, "checkpoint: deleted %s/%s (old or never committed)", dir, l.v[i].name);
      removed++;
    }
  }
  for (size_t i = 0; i < l.ntmp; i++) {
    if (unlinkat(dfd, l.tmp[i], 0) < 0 && errno != ENOENT) {
      DCOMM_LOG(WARN, ELASTIC, "checkpoint: cannot delete leftover temp file %s/%s: unlink: %s", dir, l.tmp[i],
                strerror(errno));
      failures++;
    } else {
      DCOMM_LOG(INFO, ELASTIC, "checkpoint: deleted leftover temp file %s/%s", dir, l.tmp[i]);
      removed++;
    }
  }
  list_free(&l);
  /* Make the deletions durable too; not needed for correctness. */
  if (removed > 0 && fsync_retry(dfd) < 0 && errno != EINVAL && errno != ENOTSUP) {
    DCOMM_LOG(WARN, ELASTIC, "checkpoint: fsync of directory %s after pruning: %s", dir, strerror(errno));
    failures++;
  }
  return failures;
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
  if ((e = write_all(fd, raw, sizeof(raw))) < 0 || (len > 0 && (e = write_all(fd, data, len)) < 0)) {
    rc = dcomm__err_sys(-e, "checkpoint write: write %s/%s (%zu payload bytes)", dir, tmp_name, len);
    goto fail_fd;
  }
  if (fsync_retry(fd) < 0) {
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
  if (fsync_retry(dfd) < 0 && errno != EINVAL && errno != ENOTSUP) {
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
  if ((e = read_full(fd, raw, sizeof(raw), &got)) < 0) {
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
    if ((e = read_full(fd, buf, plen, &got)) < 0) {
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

/* ---- commit records ---- */

int dcomm__ckpt_rec_format(const struct dcomm_ckpt_rec *r, char *buf, size_t n) {
  int k = snprintf(buf, n, "%llu %lld %llu %08x %08x %s", (unsigned long long)r->step, (long long)r->generation,
                   (unsigned long long)r->len, r->header_crc, r->payload_crc, r->name);
  if (k < 0 || (size_t)k >= n) return dcomm__err(DCOMM_EINVAL, "checkpoint: record of %s does not fit", r->name);
  return k;
}

int dcomm__ckpt_rec_parse(const char *text, struct dcomm_ckpt_rec *r) {
  unsigned long long step, len;
  long long gen;
  unsigned hc, pc;
  char name[64], extra;
  memset(r, 0, sizeof(*r));
  uint64_t named_step;
  if (sscanf(text, "%llu %lld %llu %8x %8x %63s %c", &step, &gen, &len, &hc, &pc, name, &extra) != 6 ||
      !parse_ckpt_name(name, &named_step) || named_step != step)
    return dcomm__err(DCOMM_EPROTO, "checkpoint: malformed commit record '%.120s'", text);
  r->step = step;
  r->generation = gen;
  r->len = len;
  r->header_crc = hc;
  r->payload_crc = pc;
  memcpy(r->name, name, sizeof(r->name));
  return 0;
}

/* Newest first: by generation, then step. */
static int rec_cmp(const void *a, const void *b) {
  const struct dcomm_ckpt_rec *x = a, *y = b;
  if (x->generation != y->generation) return x->generation > y->generation ? -1 : 1;
  if (x->step != y->step) return x->step > y->step ? -1 : 1;
  return strcmp(x->name, y->name);
}

#define MAX_RECS 64 /* records COMMITTED holds at most */

/* Adds r to recs[0..n) (room for one more), replacing a record of the same
 * file; returns the new count. */
static int put_rec(struct dcomm_ckpt_rec *recs, int n, const struct dcomm_ckpt_rec *r) {
  for (int i = 0; i < n; i++)
    if (!strcmp(recs[i].name, r->name)) {
      recs[i] = *r;
      return n;
    }
  recs[n] = *r;
  return n + 1;
}

/* Reads <dir>/COMMITTED into recs (at most MAX_RECS): *n records, 0 when the
 * file does not exist. Malformed lines are skipped with a warning. */
static int read_commits(int dfd, const char *dir, struct dcomm_ckpt_rec *recs, int *n) {
  *n = 0;
  int fd = openat(dfd, DCOMM_CKPT_COMMIT_FILE, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 0 : dcomm__err_sys(errno, "checkpoint: open %s/%s", dir, DCOMM_CKPT_COMMIT_FILE);
  char buf[MAX_RECS * DCOMM_CKPT_REC_TEXT + 64];
  size_t got = 0;
  int e = read_full(fd, buf, sizeof(buf) - 1, &got);
  close(fd);
  if (e < 0) return dcomm__err_sys(-e, "checkpoint: read %s/%s", dir, DCOMM_CKPT_COMMIT_FILE);
  buf[got] = 0;
  char *save = NULL, *line = strtok_r(buf, "\n", &save);
  if (!line || strcmp(line, "dcomm-checkpoint-commits 1") != 0) {
    DCOMM_LOG(WARN, ELASTIC, "checkpoint: %s/%s is not a commit list; no checkpoint there counts", dir,
              DCOMM_CKPT_COMMIT_FILE);
    return 0;
  }
  while ((line = strtok_r(NULL, "\n", &save)) && *n < MAX_RECS) {
    if (dcomm__ckpt_rec_parse(line, &recs[*n]) == 0) ++*n;
    else DCOMM_LOG(WARN, ELASTIC, "checkpoint: %s/%s: %s", dir, DCOMM_CKPT_COMMIT_FILE, dcomm_last_error());
  }
  return 0;
}

/* Writes recs to <dir>/COMMITTED: temp file, fsync, rename, fsync dir. */
static int write_commits(int dfd, const char *dir, const struct dcomm_ckpt_rec *recs, int n) {
  char tmp[64], text[MAX_RECS * DCOMM_CKPT_REC_TEXT + 64];
  snprintf(tmp, sizeof(tmp), ".commit.tmp.%ld", (long)getpid());
  size_t off = (size_t)snprintf(text, sizeof(text), "dcomm-checkpoint-commits 1\n");
  for (int i = 0; i < n; i++) {
    int k = dcomm__ckpt_rec_format(&recs[i], text + off, sizeof(text) - off - 1);
    if (k < 0) return k;
    off += (size_t)k;
    text[off++] = '\n';
  }
  int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return dcomm__err_sys(errno, "checkpoint commit: create %s/%s", dir, tmp);
  int e = write_all(fd, text, off), rc = 0;
  if (e < 0) rc = dcomm__err_sys(-e, "checkpoint commit: write %s/%s", dir, tmp);
  else if (fsync_retry(fd) < 0) rc = dcomm__err_sys(errno, "checkpoint commit: fsync %s/%s", dir, tmp);
  close(fd);
  if (rc == 0 && renameat(dfd, tmp, dfd, DCOMM_CKPT_COMMIT_FILE) < 0)
    rc = dcomm__err_sys(errno, "checkpoint commit: rename %s/%s to %s", dir, tmp, DCOMM_CKPT_COMMIT_FILE);
  if (rc < 0) {
    unlinkat(dfd, tmp, 0);
    return rc;
  }
  if (fsync_retry(dfd) < 0 && errno != EINVAL && errno != ENOTSUP)
    return dcomm__err_sys(errno, "checkpoint commit: fsync directory %s", dir);
  return 0;
}

int dcomm__ckpt_commit(const char *dir, const struct dcomm_ckpt_rec *rec, int keep) {
  if (!dir || !*dir || !rec) return dcomm__err(DCOMM_EINVAL, "checkpoint commit: empty directory or NULL record");
  if (keep < 1) return dcomm__err(DCOMM_EINVAL, "checkpoint commit: keep must be >= 1 (got %d)", keep);
  if (keep > MAX_RECS - 1) keep = MAX_RECS - 1;
  uint64_t named;
  if (!parse_ckpt_name(rec->name, &named) || named != rec->step)
    return dcomm__err(DCOMM_EINVAL, "checkpoint commit: '%s' is not the file of step %llu", rec->name,
                      (unsigned long long)rec->step);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return dcomm__err_sys(errno, "checkpoint commit: open directory %s", dir);
  /* One read-modify-write at a time, even with a fenced writer about. */
  int lfd = openat(dfd, ".commit.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lfd < 0 || flock(lfd, LOCK_EX) < 0) {
    int rc = dcomm__err_sys(errno, "checkpoint commit: lock %s/.commit.lock", dir);
    if (lfd >= 0) close(lfd);
    close(dfd);
    return rc;
  }
  struct dcomm_ckpt_rec recs[MAX_RECS + 1];
  int n = 0;
  int rc = read_commits(dfd, dir, recs, &n);
  if (rc == 0) {
    n = put_rec(recs, n, rec); /* the same step saved again replaces its record */
    qsort(recs, (size_t)n, sizeof(recs[0]), rec_cmp);
    if (n > keep) n = keep;
    rc = write_commits(dfd, dir, recs, n);
  }
  if (rc == 0) {
    DCOMM_LOG(INFO, ELASTIC, "checkpoint: committed step %llu (generation %lld) in %s/%s", (unsigned long long)rec->step,
              (long long)rec->generation, dir, DCOMM_CKPT_COMMIT_FILE);
    prune(dfd, dir, recs, n);
  }
  flock(lfd, LOCK_UN);
  close(lfd);
  close(dfd);
  return rc;
}

/* Warns about every checkpoint file of dir that no record names. */
static void warn_uncommitted(const char *dir, const struct dcomm_ckpt_rec *recs, int n) {
  DIR *d = opendir(dir);
  struct ckpt_list l;
  if (!d || scan_dir(d, dir, 0, &l) < 0) return;
  for (size_t i = 0; i < l.n; i++) {
    int named = 0;
    for (int k = 0; k < n && !named; k++) named = !strcmp(l.v[i].name, recs[k].name);
    if (!named)
      DCOMM_LOG(WARN, ELASTIC, "checkpoint: ignoring %s/%s: never committed (its writer crashed, or was fenced: "
                "a member of a generation that had ended)", dir, l.v[i].name);
  }
  list_free(&l);
}

int dcomm__ckpt_read_committed(const char *dir, const struct dcomm_ckpt_rec *also, void **data, size_t *len,
                               struct dcomm_ckpt_info *info) {
  if (!data || !len) return dcomm__err(DCOMM_EINVAL, "checkpoint read: data and len must not be NULL");
  *data = NULL;
  *len = 0;
  if (!dir || !*dir) return dcomm__err(DCOMM_EINVAL, "checkpoint read: empty directory name");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return dcomm__err(DCOMM_ENOTFOUND, "no checkpoint: %s does not exist or is not a directory", dir);
    return dcomm__err_sys(errno, "checkpoint read: open directory %s", dir);
  }
  struct dcomm_ckpt_rec recs[MAX_RECS + 1];
  int n = 0;
  int rc = read_commits(dfd, dir, recs, &n);
  close(dfd);
  if (rc < 0) return rc;
  if (also) n = put_rec(recs, n, also); /* the store's record is the newer word on its file */
  qsort(recs, (size_t)n, sizeof(recs[0]), rec_cmp);
  warn_uncommitted(dir, recs, n);
  if (n == 0) return dcomm__err(DCOMM_ENOTFOUND, "no checkpoint: nothing committed in %s (no %s)", dir, DCOMM_CKPT_COMMIT_FILE);
  int skipped = 0;
  for (int i = 0; i < n; i++) {
    char path[PATH_MAX];
    struct dcomm_ckpt_info tmp;
    void *buf = NULL;
    size_t blen = 0;
    rc = join_path(path, sizeof(path), dir, recs[i].name);
    if (rc == 0) rc = dcomm__ckpt_read_file(path, &buf, &blen, &tmp);
    if (rc == 0 && (tmp.step != recs[i].step || tmp.generation != recs[i].generation || tmp.len != recs[i].len ||
                    tmp.header_crc != recs[i].header_crc || tmp.payload_crc != recs[i].payload_crc)) {
      free(buf);
      rc = dcomm__err(DCOMM_EPROTO, "checkpoint %s: not the file its commit record describes (step %llu, "
                      "generation %lld, CRCs %08x/%08x)", path, (unsigned long long)recs[i].step,
                      (long long)recs[i].generation, recs[i].header_crc, recs[i].payload_crc);
    }
    if (rc == DCOMM_EPROTO || rc == DCOMM_ENOTFOUND) {
      DCOMM_LOG(WARN, ELASTIC, "skipping invalid %s", dcomm_last_error()); /* the detail names the file */
      skipped++;
      continue;
    }
    if (rc < 0) return rc;
    if (skipped > 0)
      DCOMM_LOG(WARN, ELASTIC, "checkpoint: fell back to %s (step %llu) after skipping %d newer invalid file(s)",
                tmp.path, (unsigned long long)tmp.step, skipped);
    else
      DCOMM_LOG(INFO, ELASTIC, "checkpoint: read step %llu (generation %lld, %zu bytes) from %s",
                (unsigned long long)tmp.step, (long long)tmp.generation, blen, tmp.path);
    if (info) *info = tmp;
    *data = buf;
    *len = blen;
    return 0;
  }
  return dcomm__err(DCOMM_ENOTFOUND, "no valid checkpoint in %s: all %d committed file(s) are missing, torn or corrupt",
                    dir, n);
}
