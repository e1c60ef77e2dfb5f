/*
 * checkpoint_commit.c: which checkpoint files count. Commit records (one
 * line each), the directory's COMMITTED list (read-modify-write under an
 * flock, temp file + fsync + rename), pruning of every file no record
 * names, and reading the newest committed checkpoint that is intact. The
 * file format itself is checkpoint_file.c.
 */
#include "config.h"
#include "checkpoint_file.h"

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

#include "error.h"
#include "log.h"

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
/* ---- pruning ---- */

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
  if (removed > 0 && dcomm__ckpt_fsync(dfd) < 0 && errno != EINVAL && errno != ENOTSUP) {
    DCOMM_LOG(WARN, ELASTIC, "checkpoint: fsync of directory %s after pruning: %s", dir, strerror(errno));
    failures++;
  }
  return failures;
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
  int e = dcomm__ckpt_read_full(fd, buf, sizeof(buf) - 1, &got);
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
  int e = dcomm__ckpt_write_all(fd, text, off), rc = 0;
  if (e < 0) rc = dcomm__err_sys(-e, "checkpoint commit: write %s/%s", dir, tmp);
  else if (dcomm__ckpt_fsync(fd) < 0) rc = dcomm__err_sys(errno, "checkpoint commit: fsync %s/%s", dir, tmp);
  close(fd);
  if (rc == 0 && renameat(dfd, tmp, dfd, DCOMM_CKPT_COMMIT_FILE) < 0)
    rc = dcomm__err_sys(errno, "checkpoint commit: rename %s/%s to %s", dir, tmp, DCOMM_CKPT_COMMIT_FILE);
  if (rc < 0) {
    unlinkat(dfd, tmp, 0);
    return rc;
  }
  if (dcomm__ckpt_fsync(dfd) < 0 && errno != EINVAL && errno != ENOTSUP)
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
    rc = dcomm__ckpt_join_path(path, sizeof(path), dir, recs[i].name);
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

