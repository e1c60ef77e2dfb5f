/*
 * check_checkpoint.c: unit tests of the crash-safe, fenced checkpoint files
 * (elastic/checkpoint.c): round trips (empty to 20 MiB), the on-disk format
 * and the file names (ckpt-<step>-g<generation>.dcp), commit records (their
 * text form, and <dir>/COMMITTED: sorted by generation then step, pruned to
 * `keep`), fallback to the previous committed checkpoint when the newest is
 * torn, has a flipped payload or header byte, a bad magic or bad fields
 * under a valid CRC, or is not the file its record describes; the fence: a
 * file written but never committed is never read (and is named in a
 * warning), a writer that dies between its file and its commit leaves the
 * previous commit in force, and the store's record (`also`) counts when it is
 * newer than COMMITTED; not-found cases, leftover temp files, and a real
 * crash test: a child writing and committing 50 MiB checkpoints in a loop is
 * SIGKILLed at random moments and the checkpoint read must always be the
 * newest committed one, at least as new as the last one the child saw
 * committed, and hold the payload derived from its step.
 *
 * Every test works in its own mkdtemp directory under one mkdtemp base
 * directory in /tmp, which main() removes at the end even when tests fail.
 */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint_file.h"
#include "dcomm.h"
#include "error.h"
#include "log.h"

/* ---- helpers ---- */

static char base_dir[64]; /* made by main() in the parent process */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path) < 0 ? -1 : 0;
}

static void rm_rf(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* A fresh directory for the calling test, in dir (DIRCAP bytes). */
#define DIRCAP 128
static void new_dir(char *dir) {
  snprintf(dir, DIRCAP, "%s/t-XXXXXX", base_dir);
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The payload of a checkpoint is a function of (seed, len). */
static void fill(unsigned char *buf, size_t len, uint64_t seed) {
  uint64_t s = splitmix64(seed * 0x100000001b3ull + len);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t v = splitmix64(s + i);
    memcpy(buf + i, &v, 8);
  }
  if (i < len) {
    uint64_t v = splitmix64(s + i);
    memcpy(buf + i, &v, len - i);
  }
}

static unsigned char *make_payload(size_t len, uint64_t seed) {
  unsigned char *p = malloc(len ? len : 1);
  ck_assert_ptr_nonnull(p);
  fill(p, len, seed);
  return p;
}

/* The generation write_step gives a step (negative for step 0). */
static int64_t step_gen(uint64_t step) { return (int64_t)step * 10 - 7; }

/* "ckpt-<step as %012llu>-g<generation>.dcp" */
static void ckpt_name(char *buf, size_t cap, uint64_t step, int64_t gen) {
  snprintf(buf, cap, "ckpt-%012llu-g%lld.dcp", (unsigned long long)step, (long long)gen);
}

static void ckpt_path_g(char *buf, size_t cap, const char *dir, uint64_t step, int64_t gen) {
  char name[64];
  ckpt_name(name, sizeof(name), step, gen);
  snprintf(buf, cap, "%s/%s", dir, name);
}

/* The path of the file write_step writes for step. */
static void ckpt_path(char *buf, size_t cap, const char *dir, uint64_t step) {
  ckpt_path_g(buf, cap, dir, step, step_gen(step));
}

/* Writes, without committing, a checkpoint of step and gen holding len bytes
 * derived from seed; rec (may be NULL) gets its record. */
static void write_only(const char *dir, uint64_t step, int64_t gen, size_t len, uint64_t seed,
                       struct dcomm_ckpt_rec *rec) {
  unsigned char *p = make_payload(len, seed);
  int rc = dcomm__ckpt_write(dir, step, gen, p, len, rec);
  ck_assert_msg(rc == 0, "write step %llu: %s (%s)", (unsigned long long)step, dcomm_error_name(rc),
                dcomm_last_error());
  free(p);
}

static void commit_rec(const char *dir, const struct dcomm_ckpt_rec *rec, int keep) {
  int rc = dcomm__ckpt_commit(dir, rec, keep);
  ck_assert_msg(rc == 0, "commit %s: %s (%s)", rec->name, dcomm_error_name(rc), dcomm_last_error());
}

/* Writes a checkpoint of len bytes whose payload and generation are derived
 * from step, and commits it keeping keep records. */
static void write_step(const char *dir, uint64_t step, size_t len, int keep) {
  struct dcomm_ckpt_rec rec;
  write_only(dir, step, step_gen(step), len, step, &rec);
  commit_rec(dir, &rec, keep);
}

/* read_committed(dir, also) must return step of generation gen, from its
 * file, with len bytes derived from seed. */
static void expect_read(const char *dir, const struct dcomm_ckpt_rec *also, uint64_t step, int64_t gen, size_t len,
                        uint64_t seed) {
  void *data = NULL;
  size_t got = 0;
  struct dcomm_ckpt_info info;
  int rc = dcomm__ckpt_read_committed(dir, also, &data, &got, &info);
  ck_assert_msg(rc == 0, "read_committed: %s (%s)", dcomm_error_name(rc), dcomm_last_error());
  ck_assert_msg(info.step == step, "read_committed returned step %llu, want %llu", (unsigned long long)info.step,
                (unsigned long long)step);
  ck_assert_int_eq(info.generation, gen);
  ck_assert_uint_eq(got, len);
  ck_assert_uint_eq(info.len, len);
  char want[512];
  ckpt_path_g(want, sizeof(want), dir, step, gen);
  ck_assert_str_eq(info.path, want);
  if (len == 0) {
    ck_assert_ptr_null(data);
  } else {
    unsigned char *exp = make_payload(len, seed);
    ck_assert_msg(memcmp(data, exp, len) == 0, "payload of step %llu differs", (unsigned long long)step);
    free(exp);
  }
  free(data);
}

/* read_committed must return `step`, with the payload write_step gave it. */
static void expect_latest(const char *dir, uint64_t step, size_t len) {
  expect_read(dir, NULL, step, step_gen(step), len, step);
}

static void expect_notfound(const char *dir) {
  void *data = (void *)1;
  size_t got = 99;
  int rc = dcomm__ckpt_read_committed(dir, NULL, &data, &got, NULL);
  ck_assert_msg(rc == DCOMM_ENOTFOUND, "read_committed(%s): %s (%s), want DCOMM_ENOTFOUND", dir, dcomm_error_name(rc),
                dcomm_last_error());
  ck_assert_ptr_null(data);
  ck_assert_uint_eq(got, 0);
  ck_assert_msg(strlen(dcomm_last_error()) > 0, "ENOTFOUND without detail");
}

static long file_size(const char *path) {
  struct stat st;
  ck_assert_msg(stat(path, &st) == 0, "stat %s: %s", path, strerror(errno));
  return (long)st.st_size;
}

static void flip_byte(const char *path, long off) {
  int fd = open(path, O_RDWR);
  ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
  unsigned char c;
  ck_assert_int_eq(pread(fd, &c, 1, off), 1);
  c ^= 0x5a;
  ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
  close(fd);
}

static void read_header(const char *path, unsigned char *raw) {
  int fd = open(path, O_RDONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pread(fd, raw, DCOMM_CKPT_HEADER_SIZE, 0), DCOMM_CKPT_HEADER_SIZE);
  close(fd);
}

static void le_put(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t le_get(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The header CRC as the format defines it: over the header, its field 0. */
static uint32_t hdr_crc(const unsigned char *raw) {
  unsigned char tmp[DCOMM_CKPT_HEADER_SIZE];
  memcpy(tmp, raw, sizeof(tmp));
  memset(tmp + 12, 0, 4);
  return (uint32_t)crc32(crc32(0L, Z_NULL, 0), tmp, sizeof(tmp));
}

/* Sets an n-byte header field and recomputes the header CRC, so that only
 * the field's meaning can make the file invalid. */
static void patch_header(const char *path, int off, uint64_t v, int n) {
  unsigned char raw[DCOMM_CKPT_HEADER_SIZE];
  read_header(path, raw);
  le_put(raw + off, v, n);
  le_put(raw + 12, hdr_crc(raw), 4);
  int fd = open(path, O_WRONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, raw, sizeof(raw), 0), DCOMM_CKPT_HEADER_SIZE);
  close(fd);
}

/* Names in dir: number of ckpt-*.dcp and of .ckpt-*.tmp.* entries. */
static void count_files(const char *dir, int *nckpt, int *ntmp) {
  *nckpt = *ntmp = 0;
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (!strncmp(de->d_name, "ckpt-", 5) && l > 9 && !strcmp(de->d_name + l - 4, ".dcp")) ++*nckpt;
    else if (!strncmp(de->d_name, ".ckpt-", 6) && strstr(de->d_name, ".tmp.")) ++*ntmp;
  }
  closedir(d);
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* The whole file, NUL-terminated and malloc'd; NULL when it does not exist. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    ck_assert_msg(errno == ENOENT, "open %s: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  size_t k;
  while ((k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += k;
    if (cap - n - 1 == 0) {
      buf = realloc(buf, cap *= 2);
      ck_assert_ptr_nonnull(buf);
    }
  }
  fclose(f);
  buf[n] = 0;
  return buf;
}

static void spit(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_msg(f != NULL, "create %s: %s", path, strerror(errno));
  ck_assert_int_eq(fputs(text, f) >= 0, 1);
  ck_assert_int_eq(fclose(f), 0);
}

static void commit_file(char *buf, size_t cap, const char *dir) {
  snprintf(buf, cap, "%s/%s", dir, DCOMM_CKPT_COMMIT_FILE);
}

/* The records of <dir>/COMMITTED, in file order (at most max); 0 when it does
 * not exist. Its first line and every record must be well formed. */
static int commit_list(const char *dir, struct dcomm_ckpt_rec *recs, int max) {
  char path[512], line[512];
  commit_file(path, sizeof(path), dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    ck_assert_msg(errno == ENOENT, "open %s: %s", path, strerror(errno));
    return 0;
  }
  ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
  ck_assert_str_eq(line, "dcomm-checkpoint-commits 1\n");
  int n = 0;
  while (fgets(line, sizeof(line), f)) {
    ck_assert_msg(n < max, "%s holds more than %d records", path, max);
    line[strcspn(line, "\n")] = 0;
    ck_assert_msg(dcomm__ckpt_rec_parse(line, &recs[n]) == 0, "%s: bad line '%s': %s", path, line,
                  dcomm_last_error());
    n++;
  }
  fclose(f);
  return n;
}

static void expect_rec_eq(const struct dcomm_ckpt_rec *a, const struct dcomm_ckpt_rec *b) {
  ck_assert_uint_eq(a->step, b->step);
  ck_assert_int_eq(a->generation, b->generation);
  ck_assert_uint_eq(a->len, b->len);
  ck_assert_uint_eq(a->header_crc, b->header_crc);
  ck_assert_uint_eq(a->payload_crc, b->payload_crc);
  ck_assert_str_eq(a->name, b->name);
}

/* Runs read_committed(dir, also) with stderr sent to a file; returns what it
 * logged at level warn (malloc'd). */
static char *read_committed_logged(const char *dir, const struct dcomm_ckpt_rec *also, int *rc,
                                   struct dcomm_ckpt_info *info) {
  setenv("DCOMM_LOG_LEVEL", "warn", 1);
  unsetenv("DCOMM_LOG_SUBSYS");
  dcomm__log_setup();
  FILE *cap = tmpfile();
  ck_assert_ptr_nonnull(cap);
  fflush(stderr);
  int saved = dup(2);
  ck_assert_int_ge(saved, 0);
  ck_assert_int_ge(dup2(fileno(cap), 2), 0);
  void *data = NULL;
  size_t len = 0;
  *rc = dcomm__ckpt_read_committed(dir, also, &data, &len, info);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  free(data);
  setenv("DCOMM_LOG_LEVEL", "error", 1);
  dcomm__log_setup();
  off_t n = lseek(fileno(cap), 0, SEEK_END);
  ck_assert_int_ge(n, 0);
  char *out = calloc(1, (size_t)n + 1);
  ck_assert_ptr_nonnull(out);
  if (n > 0) ck_assert_int_eq(pread(fileno(cap), out, (size_t)n, 0), n);
  fclose(cap);
  return out;
}

/* ---- round trips and format ---- */

START_TEST(test_roundtrip_sizes) {
  char dir[DIRCAP];
  new_dir(dir);
  const size_t sizes[] = {0, 1, 47, 48, 4099, 20u << 20};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    uint64_t step = 100 + i;
    write_step(dir, step, sizes[i], 10);
    expect_latest(dir, step, sizes[i]);
    /* read_file on the same file agrees. */
    char path[512];
    ckpt_path(path, sizeof(path), dir, step);
    ck_assert_int_eq(file_size(path), (long)(DCOMM_CKPT_HEADER_SIZE + sizes[i]));
    void *data = NULL;
    size_t len = 1;
    struct dcomm_ckpt_info info;
    int rc = dcomm__ckpt_read_file(path, &data, &len, &info);
    ck_assert_msg(rc == 0, "read_file: %s", dcomm_last_error());
    ck_assert_uint_eq(len, sizes[i]);
    ck_assert_uint_eq(info.step, step);
    ck_assert_str_eq(info.path, path);
    free(data);
  }
  rm_rf(dir);
}
END_TEST

START_TEST(test_format_little_endian) {
  char dir[DIRCAP];
  new_dir(dir);
  unsigned char payload[5] = {1, 2, 3, 4, 5};
  uint64_t step = 0x0102030405060708ull;
  struct dcomm_ckpt_rec rec;
  memset(&rec, 0xa5, sizeof(rec));
  ck_assert_int_eq(dcomm__ckpt_write(dir, step, -2, payload, sizeof(payload), &rec), 0);
  char path[512];
  snprintf(path, sizeof(path), "%s/ckpt-%012llu-g-2.dcp", dir, (unsigned long long)step);
  ck_assert_msg(exists(path), "%s missing", path);
  ck_assert_int_eq(file_size(path), DCOMM_CKPT_HEADER_SIZE + 5);
  unsigned char raw[DCOMM_CKPT_HEADER_SIZE];
  read_header(path, raw);
  ck_assert_int_eq(memcmp(raw, "DCOMMCKP", 8), 0);
  ck_assert_uint_eq(le_get(raw + 8, 4), 1);
  ck_assert_uint_eq(le_get(raw + 12, 4), hdr_crc(raw));
  ck_assert_int_eq(raw[16], 0x08); /* low byte first */
  ck_assert_int_eq(raw[23], 0x01);
  ck_assert_uint_eq(le_get(raw + 16, 8), step);
  ck_assert_int_eq((int64_t)le_get(raw + 24, 8), -2);
  ck_assert_uint_eq(le_get(raw + 32, 8), 5);
  ck_assert_uint_eq(le_get(raw + 40, 4), (uint32_t)crc32(crc32(0L, Z_NULL, 0), payload, 5));
  ck_assert_uint_eq(le_get(raw + 44, 4), 0);
  /* The record the write filled describes that file. */
  ck_assert_uint_eq(rec.step, step);
  ck_assert_int_eq(rec.generation, -2);
  ck_assert_uint_eq(rec.len, 5);
  ck_assert_uint_eq(rec.header_crc, le_get(raw + 12, 4));
  ck_assert_uint_eq(rec.payload_crc, le_get(raw + 40, 4));
  ck_assert_str_eq(rec.name, strrchr(path, '/') + 1);
  /* The step is zero-padded to 12 digits; rec may be NULL. */
  ck_assert_int_eq(dcomm__ckpt_write(dir, 42, 0, payload, 1, NULL), 0);
  snprintf(path, sizeof(path), "%s/ckpt-000000000042-g0.dcp", dir);
  ck_assert_msg(exists(path), "%s missing", path);
  /* Writing commits nothing. */
  commit_file(path, sizeof(path), dir);
  ck_assert_msg(!exists(path), "a write created %s", path);
  rm_rf(dir);
}
END_TEST

START_TEST(test_mkdir_p) {
  char dir[DIRCAP];
  new_dir(dir);
  char nested[512];
  snprintf(nested, sizeof(nested), "%s/a/b//c/", dir);
  write_step(nested, 7, 100, 2);
  char clean[512];
  snprintf(clean, sizeof(clean), "%s/a/b/c", dir);
  void *data;
  size_t len;
  struct dcomm_ckpt_info info;
  ck_assert_int_eq(dcomm__ckpt_read_committed(clean, NULL, &data, &len, &info), 0);
  ck_assert_uint_eq(info.step, 7);
  ck_assert_uint_eq(len, 100);
  free(data);
  /* An existing directory is fine too. */
  write_step(nested, 8, 100, 2);
  rm_rf(dir);
}
END_TEST

START_TEST(test_bad_args) {
  char dir[DIRCAP];
  new_dir(dir);
  char x = 0;
  ck_assert_int_eq(dcomm__ckpt_write(dir, 1, 0, NULL, 1, NULL), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_write("", 1, 0, &x, 1, NULL), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_write(NULL, 1, 0, &x, 1, NULL), DCOMM_EINVAL);
  struct dcomm_ckpt_rec rec;
  ck_assert_int_eq(dcomm__ckpt_write(dir, 1, 0, NULL, 0, &rec), 0); /* NULL is fine for len 0 */
  /* commit: keep < 1, no record, no directory, a name that is not the file
   * of the record's step. */
  ck_assert_int_eq(dcomm__ckpt_commit(dir, &rec, 0), DCOMM_EINVAL);
  ck_assert_msg(strstr(dcomm_last_error(), "keep") != NULL, "detail: %s", dcomm_last_error());
  ck_assert_int_eq(dcomm__ckpt_commit(dir, &rec, -1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_commit(dir, NULL, 1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_commit("", &rec, 1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_commit(NULL, &rec, 1), DCOMM_EINVAL);
  struct dcomm_ckpt_rec bad = rec;
  bad.step = 2;
  ck_assert_int_eq(dcomm__ckpt_commit(dir, &bad, 1), DCOMM_EINVAL);
  bad = rec;
  snprintf(bad.name, sizeof(bad.name), "notes.txt");
  ck_assert_int_eq(dcomm__ckpt_commit(dir, &bad, 1), DCOMM_EINVAL);
  /* None of them committed anything. */
  expect_notfound(dir);
  /* dir is a regular file: a system error that names it. */
  char file[512];
  snprintf(file, sizeof(file), "%s/plainfile", dir);
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  int rc = dcomm__ckpt_write(file, 1, 0, &x, 1, NULL);
  ck_assert_int_eq(rc, DCOMM_ESYSTEM);
  ck_assert_msg(strstr(dcomm_last_error(), "plainfile") != NULL, "detail: %s", dcomm_last_error());
  rc = dcomm__ckpt_commit(file, &rec, 1);
  ck_assert_int_eq(rc, DCOMM_ESYSTEM);
  ck_assert_msg(strstr(dcomm_last_error(), "plainfile") != NULL, "detail: %s", dcomm_last_error());
  /* read_file on a missing file; NULL out-pointers. */
  char missing[512];
  snprintf(missing, sizeof(missing), "%s/ckpt-000000000099-g0.dcp", dir);
  void *data;
  size_t len;
  ck_assert_int_eq(dcomm__ckpt_read_file(missing, &data, &len, NULL), DCOMM_ENOTFOUND);
  ck_assert_int_eq(dcomm__ckpt_read_committed(dir, NULL, NULL, &len, NULL), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_read_committed(dir, NULL, &data, NULL, NULL), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_read_committed("", NULL, &data, &len, NULL), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_read_file(missing, &data, NULL, NULL), DCOMM_EINVAL);
  rm_rf(dir);
}
END_TEST

/* ---- pruning ---- */

START_TEST(test_keep_three) {
  char dir[DIRCAP];
  new_dir(dir);
  char other[512];
  snprintf(other, sizeof(other), "%s/notes.txt", dir);
  FILE *f = fopen(other, "w");
  ck_assert_ptr_nonnull(f);
  fputs("not a checkpoint\n", f);
  fclose(f);
  for (uint64_t s = 1; s <= 10; s++) write_step(dir, s, 1000 + s, 3);
  int nc, nt;
  count_files(dir, &nc, &nt);
  ck_assert_int_eq(nc, 3);
  ck_assert_int_eq(nt, 0);
  char path[512];
  for (uint64_t s = 1; s <= 10; s++) {
    ckpt_path(path, sizeof(path), dir, s);
    ck_assert_msg(exists(path) == (s >= 8), "step %llu: exists=%d", (unsigned long long)s, exists(path));
  }
  ck_assert_msg(exists(other), "an unrelated file was deleted");
  /* COMMITTED names exactly those, newest first. */
  struct dcomm_ckpt_rec recs[8];
  ck_assert_int_eq(commit_list(dir, recs, 8), 3);
  for (int i = 0; i < 3; i++) {
    char name[64];
    ckpt_name(name, sizeof(name), 10 - (uint64_t)i, step_gen(10 - (uint64_t)i));
    ck_assert_str_eq(recs[i].name, name);
  }
  expect_latest(dir, 10, 1010);
  /* A write alone prunes nothing and changes nothing. */
  struct dcomm_ckpt_rec r11;
  write_only(dir, 11, step_gen(11), 10, 11, &r11);
  count_files(dir, &nc, &nt);
  ck_assert_int_eq(nc, 4);
  expect_latest(dir, 10, 1010);
  /* Its commit with keep=1 leaves only it. */
  commit_rec(dir, &r11, 1);
  count_files(dir, &nc, &nt);
  ck_assert_int_eq(nc, 1);
  ck_assert_int_eq(commit_list(dir, recs, 8), 1);
  expect_rec_eq(&recs[0], &r11);
  expect_latest(dir, 11, 10);
  rm_rf(dir);
}
END_TEST

/* ---- fallback on damage ---- */

/* A new dir (DIRCAP bytes) holding steps 1..3, committed (keep 5); p3 gets
 * the path of step 3. */
static void three_steps(char *dir, char *p3, size_t cap, size_t len) {
  new_dir(dir);
  for (uint64_t s = 1; s <= 3; s++) write_step(dir, s, len, 5);
  ckpt_path(p3, cap, dir, 3);
}

START_TEST(test_torn_newest) {
  char p3[512];
  const size_t len = 10000;
  char dir[DIRCAP];
  three_steps(dir, p3, sizeof(p3), len);
  const off_t cuts[] = {0, 1, 20, DCOMM_CKPT_HEADER_SIZE - 1, DCOMM_CKPT_HEADER_SIZE, DCOMM_CKPT_HEADER_SIZE + 1,
                        DCOMM_CKPT_HEADER_SIZE + len / 2, DCOMM_CKPT_HEADER_SIZE + len - 1};
  for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
    write_step(dir, 3, len, 5);
    ck_assert_int_eq(truncate(p3, cuts[i]), 0);
    expect_latest(dir, 2, len);
    void *data;
    size_t got;
    ck_assert_int_eq(dcomm__ckpt_read_file(p3, &data, &got, NULL), DCOMM_EPROTO);
    ck_assert_msg(strstr(dcomm_last_error(), "torn") != NULL, "cut %ld: %s", (long)cuts[i], dcomm_last_error());
  }
  rm_rf(dir);
}
END_TEST

START_TEST(test_flipped_payload_byte) {
  char p3[512];
  const size_t len = 5000;
  char dir[DIRCAP];
  three_steps(dir, p3, sizeof(p3), len);
  const long offs[] = {DCOMM_CKPT_HEADER_SIZE, DCOMM_CKPT_HEADER_SIZE + 2500, DCOMM_CKPT_HEADER_SIZE + len - 1};
  for (size_t i = 0; i < 3; i++) {
    write_step(dir, 3, len, 5);
    flip_byte(p3, offs[i]);
    expect_latest(dir, 2, len);
  }
  /* The skip is logged, naming the file and the reason. */
  int rc;
  struct dcomm_ckpt_info info;
  char *log = read_committed_logged(dir, NULL, &rc, &info);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(info.step, 2);
  ck_assert_msg(strstr(log, "WARN") && strstr(log, "ckpt-000000000003-g23.dcp") && strstr(log, "payload CRC"),
                "log: %s", log);
  free(log);
  rm_rf(dir);
}
END_TEST

START_TEST(test_flipped_header_byte) {
  char p3[512];
  const size_t len = 300;
  char dir[DIRCAP];
  three_steps(dir, p3, sizeof(p3), len);
  /* Every single header byte, the CRC field included. */
  for (long off = 0; off < DCOMM_CKPT_HEADER_SIZE; off++) {
    write_step(dir, 3, len, 5);
    flip_byte(p3, off);
    expect_latest(dir, 2, len);
  }
  write_step(dir, 3, len, 5);
  flip_byte(p3, 17); /* in the step field */
  int rc;
  char *log = read_committed_logged(dir, NULL, &rc, NULL);
  ck_assert_int_eq(rc, 0);
  ck_assert_msg(strstr(log, "ckpt-000000000003-g23.dcp") && strstr(log, "header CRC"), "log: %s", log);
  free(log);
  rm_rf(dir);
}
END_TEST

START_TEST(test_bad_magic) {
  char p3[512];
  char dir[DIRCAP];
  three_steps(dir, p3, sizeof(p3), 64);
  patch_header(p3, 7, 'X', 1); /* "DCOMMCKX" under a valid header CRC */
  expect_latest(dir, 2, 64);
  void *data;
  size_t len;
  ck_assert_int_eq(dcomm__ckpt_read_file(p3, &data, &len, NULL), DCOMM_EPROTO);
  ck_assert_msg(strstr(dcomm_last_error(), "magic") != NULL, "%s", dcomm_last_error());
  /* A file of garbage with the right name. */
  write_step(dir, 3, 64, 5);
  int fd = open(p3, O_WRONLY | O_TRUNC);
  ck_assert_int_ge(fd, 0);
  char junk[200];
  memset(junk, 'j', sizeof(junk));
  ck_assert_int_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
  close(fd);
  expect_latest(dir, 2, 64);
  rm_rf(dir);
}
END_TEST

/* Fields that are wrong although the header CRC matches them. */
START_TEST(test_bad_fields_valid_crc) {
  char p3[512];
  const size_t len = 256;
  char dir[DIRCAP];
  three_steps(dir, p3, sizeof(p3), len);
  void *data;
  size_t got;
  struct {
    int off, n;
    uint64_t v;
    const char *why;
  } cases[] = {
      {8, 4, 2, "version"},                              /* unknown version */
      {32, 8, len + 1, "torn"},                          /* longer than the file */
      {32, 8, (64ull << 30) + 1, "limit"},               /* over 64 GiB */
      {32, 8, UINT64_MAX, "limit"},                      /* absurd */
      {32, 8, len - 1, "unexpected bytes"},              /* shorter than the file */
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    write_step(dir, 3, len, 5);
    patch_header(p3, cases[i].off, cases[i].v, cases[i].n);
    expect_latest(dir, 2, len);
    ck_assert_int_eq(dcomm__ckpt_read_file(p3, &data, &got, NULL), DCOMM_EPROTO);
    ck_assert_msg(strstr(dcomm_last_error(), cases[i].why) != NULL, "case %zu: %s", i, dcomm_last_error());
  }
  /* Trailing garbage after an intact payload. */
  write_step(dir, 3, len, 5);
  FILE *f = fopen(p3, "a");
  ck_assert_ptr_nonnull(f);
  fputs("tail", f);
  fclose(f);
  expect_latest(dir, 2, len);
  /* A valid file of another step under the committed name is not taken for
   * that step... */
  write_step(dir, 3, len, 5);
  char p9[512];
  write_only(dir, 9, step_gen(3), len, 3, NULL);
  ckpt_path_g(p9, sizeof(p9), dir, 9, step_gen(3));
  ck_assert_int_eq(rename(p9, p3), 0);
  expect_latest(dir, 2, len);
  /* ...and the committed file under another name is not read either. */
  write_step(dir, 3, len, 5);
  ckpt_path(p9, sizeof(p9), dir, 9);
  ck_assert_int_eq(rename(p3, p9), 0);
  expect_latest(dir, 2, len);
  rm_rf(dir);
}
END_TEST

START_TEST(test_all_corrupt) {
  char p3[512], p[512];
  char dir[DIRCAP];
  three_steps(dir, p3, sizeof(p3), 128);
  ckpt_path(p, sizeof(p), dir, 1);
  flip_byte(p, 60);
  ckpt_path(p, sizeof(p), dir, 2);
  ck_assert_int_eq(truncate(p, 10), 0);
  flip_byte(p3, 3);
  int rc;
  char *log = read_committed_logged(dir, NULL, &rc, NULL);
  ck_assert_int_eq(rc, DCOMM_ENOTFOUND);
  ck_assert_msg(strstr(dcomm_last_error(), dir) != NULL, "detail: %s", dcomm_last_error());
  for (int s = 1; s <= 3; s++) {
    char name[64];
    snprintf(name, sizeof(name), "ckpt-%012d-g%d.dcp", s, s * 10 - 7);
    ck_assert_msg(strstr(log, name) != NULL, "%s not named in the log: %s", name, log);
  }
  free(log);
  expect_notfound(dir);
  rm_rf(dir);
}
END_TEST

START_TEST(test_missing_or_empty_dir) {
  char dir[DIRCAP];
  new_dir(dir);
  char missing[512];
  snprintf(missing, sizeof(missing), "%s/does/not/exist", dir);
  expect_notfound(missing);
  ck_assert_msg(strstr(dcomm_last_error(), "does/not/exist") != NULL, "%s", dcomm_last_error());
  expect_notfound(dir); /* exists, but empty */
  rm_rf(dir);
}
END_TEST

START_TEST(test_leftover_temp_file) {
  char dir[DIRCAP];
  new_dir(dir);
  write_step(dir, 1, 500, 3);
  write_step(dir, 2, 500, 3);
  /* A crashed writer's temp file for step 9, even holding a complete valid
   * checkpoint, is not a checkpoint. */
  char p2[512], tmp[512], other[512];
  ckpt_path(p2, sizeof(p2), dir, 2);
  write_only(dir, 9, step_gen(9), 500, 9, NULL);
  char p9[512];
  ckpt_path(p9, sizeof(p9), dir, 9);
  snprintf(tmp, sizeof(tmp), "%s/.ckpt-000000000009.tmp.999999", dir);
  ck_assert_int_eq(rename(p9, tmp), 0);
  snprintf(other, sizeof(other), "%s/.ckpt-notes.tmp", dir);
  FILE *f = fopen(other, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  expect_latest(dir, 2, 500);
  int nc, nt;
  count_files(dir, &nc, &nt);
  ck_assert_int_eq(nc, 2);
  /* A write alone leaves it; the next commit removes it (and only it). */
  struct dcomm_ckpt_rec r3;
  write_only(dir, 3, step_gen(3), 500, 3, &r3);
  ck_assert_msg(exists(tmp), "a write without a commit pruned");
  commit_rec(dir, &r3, 3);
  ck_assert_msg(!exists(tmp), "leftover temp file survived a commit");
  ck_assert_msg(exists(other), "an unrelated file was deleted");
  count_files(dir, &nc, &nt);
  ck_assert_int_eq(nt, 0);
  ck_assert_int_eq(nc, 3);
  expect_latest(dir, 3, 500);
  /* A directory with only a temp file has no checkpoint. */
  char dir2[DIRCAP];
  new_dir(dir2);
  char tmp2[512];
  snprintf(tmp2, sizeof(tmp2), "%s/.ckpt-000000000001.tmp.1234", dir2);
  ck_assert_int_eq(rename(p2, tmp2), 0);
  expect_notfound(dir2);
  rm_rf(dir2);
  rm_rf(dir);
}
END_TEST

/* ---- the fence: commit records ---- */

/* A file written but never committed (its writer crashed before the commit,
 * or was fenced) is never read, and is named in a warning. */
START_TEST(test_uncommitted_never_read) {
  char dir[DIRCAP];
  new_dir(dir);
  const size_t len = 700;
  write_step(dir, 1, len, 5);
  write_step(dir, 2, len, 5);
  char cpath[512], p3[512], p50[512];
  commit_file(cpath, sizeof(cpath), dir);
  char *before = slurp(cpath);
  ck_assert_ptr_nonnull(before);
  /* A newer valid file nobody committed, and one of a fenced writer of an
   * older generation at a much higher step. */
  struct dcomm_ckpt_rec r3;
  write_only(dir, 3, step_gen(3), len, 3, &r3);
  write_only(dir, 50, -1, len, 50, NULL);
  ckpt_path(p3, sizeof(p3), dir, 3);
  ckpt_path_g(p50, sizeof(p50), dir, 50, -1);
  int rc;
  struct dcomm_ckpt_info info;
  char *log = read_committed_logged(dir, NULL, &rc, &info);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(info.step, 2);
  ck_assert_msg(strstr(log, "WARN") && strstr(log, "ckpt-000000000003-g23.dcp") && strstr(log, "never committed"),
                "log: %s", log);
  ck_assert_msg(strstr(log, "ckpt-000000000050-g-1.dcp") != NULL, "log: %s", log);
  ck_assert_msg(!strstr(log, "ckpt-000000000002-g13.dcp") && !strstr(log, "ckpt-000000000001-g3.dcp"),
                "a committed file was reported: %s", log);
  free(log);
  expect_latest(dir, 2, len);
  /* Reading changes nothing on disk. */
  char *after = slurp(cpath);
  ck_assert_ptr_nonnull(after);
  ck_assert_str_eq(after, before);
  free(after);
  free(before);
  ck_assert_msg(exists(p3) && exists(p50), "a read deleted a file");
  /* Once committed, it counts; that commit deletes the fenced writer's file. */
  commit_rec(dir, &r3, 5);
  expect_latest(dir, 3, len);
  ck_assert_msg(!exists(p50), "a file never committed survived a commit");
  /* A directory holding only files never committed has no checkpoint. */
  char dir2[DIRCAP];
  new_dir(dir2);
  write_only(dir2, 1, step_gen(1), len, 1, NULL);
  write_only(dir2, 2, step_gen(2), len, 2, NULL);
  log = read_committed_logged(dir2, NULL, &rc, NULL);
  ck_assert_int_eq(rc, DCOMM_ENOTFOUND);
  ck_assert_msg(strstr(log, "ckpt-000000000001-g3.dcp") && strstr(log, "ckpt-000000000002-g13.dcp") &&
                    strstr(log, "never committed"),
                "log: %s", log);
  free(log);
  expect_notfound(dir2);
  rm_rf(dir2);
  rm_rf(dir);
}
END_TEST

/* A writer that dies between its file and its commit (or holding the commit
 * lock, or halfway through writing the commit list) leaves the previous
 * commit in force, and blocks no later writer. */
START_TEST(test_crash_before_commit) {
  char dir[DIRCAP];
  new_dir(dir);
  const size_t len = 4096;
  write_step(dir, 1, len, 3);
  write_step(dir, 2, len, 3);
  char cpath[512], p3[512];
  commit_file(cpath, sizeof(cpath), dir);
  ckpt_path(p3, sizeof(p3), dir, 3);
  char *before = slurp(cpath);
  ck_assert_ptr_nonnull(before);
  unsigned char *payload = make_payload(len, 3);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    struct dcomm_ckpt_rec rec;
    if (dcomm__ckpt_write(dir, 3, step_gen(3), payload, len, &rec) != 0) _exit(2);
    kill(getpid(), SIGKILL);
    _exit(3);
  }
  free(payload);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "writer ended on its own (status 0x%x)", st);
  /* Its file is complete and valid, but not committed. */
  void *data;
  size_t got;
  struct dcomm_ckpt_info info;
  ck_assert_int_eq(dcomm__ckpt_read_file(p3, &data, &got, &info), 0);
  ck_assert_uint_eq(info.step, 3);
  free(data);
  expect_latest(dir, 2, len);
  char *after = slurp(cpath);
  ck_assert_ptr_nonnull(after);
  ck_assert_str_eq(after, before);
  free(after);
  free(before);
  /* A committer killed halfway through the new list: its temp file, naming
   * step 3, is not the list. */
  struct dcomm_ckpt_rec r3 = {.step = info.step, .generation = info.generation, .len = info.len,
                              .header_crc = info.header_crc, .payload_crc = info.payload_crc};
  ckpt_name(r3.name, sizeof(r3.name), 3, step_gen(3));
  char line[DCOMM_CKPT_REC_TEXT], text[DCOMM_CKPT_REC_TEXT + 64], half[512];
  ck_assert_int_gt(dcomm__ckpt_rec_format(&r3, line, sizeof(line)), 0);
  snprintf(text, sizeof(text), "dcomm-checkpoint-commits 1\n%s\n", line);
  snprintf(half, sizeof(half), "%s/.commit.tmp.999999", dir);
  spit(half, text);
  expect_latest(dir, 2, len);
  /* A writer killed holding the commit lock. */
  int pfd[2];
  ck_assert_int_eq(pipe(pfd), 0);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    char lock[512];
    snprintf(lock, sizeof(lock), "%s/.commit.lock", dir);
    int fd = open(lock, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) < 0) _exit(2);
    if (write(pfd[1], "x", 1) != 1) _exit(3);
    for (;;) pause();
  }
  close(pfd[1]);
  char c;
  ck_assert_msg(read(pfd[0], &c, 1) == 1, "lock holder died before taking the lock");
  close(pfd[0]);
  kill(pid, SIGKILL);
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  /* The next writer's commit works, and deletes the crashed writer's file. */
  write_step(dir, 4, len, 3);
  expect_latest(dir, 4, len);
  ck_assert_msg(!exists(p3), "the file never committed survived a commit");
  struct dcomm_ckpt_rec recs[8];
  ck_assert_int_eq(commit_list(dir, recs, 8), 3);
  ck_assert_uint_eq(recs[0].step, 4);
  ck_assert_uint_eq(recs[1].step, 2);
  ck_assert_uint_eq(recs[2].step, 1);
  rm_rf(dir);
}
END_TEST

/* A committed name whose file was replaced by another valid checkpoint (a
 * writer of the same step and generation with other content, or a file of
 * another generation or step moved there) is not the committed one. */
START_TEST(test_replaced_committed_file) {
  char p3[512];
  const size_t len = 400;
  char dir[DIRCAP];
  three_steps(dir, p3, sizeof(p3), len);
  struct dcomm_ckpt_rec recs[8];
  ck_assert_int_eq(commit_list(dir, recs, 8), 3);
  struct dcomm_ckpt_rec committed3 = recs[0];
  ck_assert_uint_eq(committed3.step, 3);
  struct dcomm_ckpt_rec other;
  write_only(dir, 3, step_gen(3), len, 3333, &other);
  ck_assert_str_eq(other.name, committed3.name);
  ck_assert_uint_eq(other.len, committed3.len);
  ck_assert_uint_ne(other.payload_crc, committed3.payload_crc);
  void *data;
  size_t got;
  ck_assert_int_eq(dcomm__ckpt_read_file(p3, &data, &got, NULL), 0); /* valid by itself */
  free(data);
  int rc;
  struct dcomm_ckpt_info info;
  char *log = read_committed_logged(dir, NULL, &rc, &info);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(info.step, 2);
  ck_assert_msg(strstr(log, "WARN") && strstr(log, "ckpt-000000000003-g23.dcp") &&
                    strstr(log, "not the file its commit record describes") && strstr(log, "fell back"),
                "log: %s", log);
  free(log);
  expect_latest(dir, 2, len);
  /* Another length under that name. */
  write_only(dir, 3, step_gen(3), len + 1, 3, NULL);
  expect_latest(dir, 2, len);
  /* The same payload under a header of another generation, or step. */
  char dir2[DIRCAP], q[512];
  new_dir(dir2);
  write_only(dir2, 3, 99, len, 3, NULL);
  ckpt_path_g(q, sizeof(q), dir2, 3, 99);
  ck_assert_int_eq(rename(q, p3), 0);
  expect_latest(dir, 2, len);
  write_only(dir2, 4, step_gen(3), len, 3, NULL);
  ckpt_path_g(q, sizeof(q), dir2, 4, step_gen(3));
  ck_assert_int_eq(rename(q, p3), 0);
  expect_latest(dir, 2, len);
  /* The committed content back under that name counts again. */
  write_only(dir, 3, step_gen(3), len, 3, NULL);
  expect_latest(dir, 3, len);
  rm_rf(dir2);
  rm_rf(dir);
}
END_TEST

/* The store's record (`also`), newer than COMMITTED when the writer died
 * between the two commits, is read; one whose file is missing or not the
 * one it describes falls back to COMMITTED. */
START_TEST(test_also_record) {
  char dir[DIRCAP];
  new_dir(dir);
  const size_t len = 600;
  write_step(dir, 1, len, 5);
  write_step(dir, 2, len, 5);
  struct dcomm_ckpt_rec r3;
  write_only(dir, 3, step_gen(3), len, 3, &r3);
  expect_read(dir, &r3, 3, step_gen(3), len, 3);
  int rc;
  struct dcomm_ckpt_info info;
  char *log = read_committed_logged(dir, &r3, &rc, &info);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(info.step, 3);
  ck_assert_msg(!strstr(log, "never committed") && !strstr(log, "skipping"), "log: %s", log);
  free(log);
  /* Without it, that file does not count. */
  expect_latest(dir, 2, len);
  /* A record older than, or the same as, COMMITTED's newest changes nothing. */
  struct dcomm_ckpt_rec recs[8];
  ck_assert_int_eq(commit_list(dir, recs, 8), 2);
  expect_read(dir, &recs[1], 2, step_gen(2), len, 2);
  expect_read(dir, &recs[0], 2, step_gen(2), len, 2);
  /* A record naming a missing file falls back, with a warning naming it. */
  struct dcomm_ckpt_rec gone = r3;
  gone.step = 4;
  gone.generation = step_gen(4);
  ckpt_name(gone.name, sizeof(gone.name), 4, step_gen(4));
  log = read_committed_logged(dir, &gone, &rc, &info);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(info.step, 2);
  ck_assert_msg(strstr(log, "WARN") && strstr(log, "ckpt-000000000004-g33.dcp") && strstr(log, "does not exist"),
                "log: %s", log);
  free(log);
  expect_read(dir, &gone, 2, step_gen(2), len, 2);
  /* So does one that differs from the file in any one field. */
  for (int field = 0; field < 5; field++) {
    struct dcomm_ckpt_rec bad = r3;
    switch (field) {
      case 0: bad.step = 5; break;
      case 1: bad.generation++; break;
      case 2: bad.len++; break;
      case 3: bad.header_crc ^= 1; break;
      default: bad.payload_crc ^= 1; break;
    }
    expect_read(dir, &bad, 2, step_gen(2), len, 2);
  }
  /* With nothing committed, the store's record alone is enough. */
  char dir2[DIRCAP];
  new_dir(dir2);
  struct dcomm_ckpt_rec r7;
  write_only(dir2, 7, step_gen(7), 100, 7, &r7);
  expect_notfound(dir2);
  expect_read(dir2, &r7, 7, step_gen(7), 100, 7);
  rm_rf(dir2);
  rm_rf(dir);
}
END_TEST

START_TEST(test_rec_text) {
  char dir[DIRCAP];
  new_dir(dir);
  struct dcomm_ckpt_rec r, back;
  write_only(dir, 12345, -2, 77, 5, &r);
  char text[DCOMM_CKPT_REC_TEXT], want[DCOMM_CKPT_REC_TEXT];
  int k = dcomm__ckpt_rec_format(&r, text, sizeof(text));
  ck_assert_int_gt(k, 0);
  ck_assert_uint_eq(strlen(text), (size_t)k);
  snprintf(want, sizeof(want), "12345 -2 77 %08x %08x ckpt-000000012345-g-2.dcp", r.header_crc, r.payload_crc);
  ck_assert_str_eq(text, want);
  ck_assert_int_eq(dcomm__ckpt_rec_parse(text, &back), 0);
  expect_rec_eq(&back, &r);
  /* As a line of COMMITTED, with its newline. */
  snprintf(want, sizeof(want), "%s\n", text);
  ck_assert_int_eq(dcomm__ckpt_rec_parse(want, &back), 0);
  expect_rec_eq(&back, &r);
  /* Extremes round-trip too, and fit DCOMM_CKPT_REC_TEXT. */
  struct dcomm_ckpt_rec big;
  memset(&big, 0, sizeof(big));
  big.step = UINT64_MAX;
  big.generation = INT64_MIN;
  big.len = DCOMM_CKPT_MAX_PAYLOAD;
  big.header_crc = 0xffffffffu;
  big.payload_crc = 0;
  ckpt_name(big.name, sizeof(big.name), big.step, big.generation);
  ck_assert_int_gt(dcomm__ckpt_rec_format(&big, text, sizeof(text)), 0);
  ck_assert_int_eq(dcomm__ckpt_rec_parse(text, &back), 0);
  expect_rec_eq(&back, &big);
  /* A buffer too small is an error, not a cut record. */
  ck_assert_int_eq(dcomm__ckpt_rec_format(&r, text, 10), DCOMM_EINVAL);
  /* Malformed text. */
  char longname[DCOMM_CKPT_REC_TEXT + 32];
  snprintf(longname, sizeof(longname), "3 23 400 0000abcd 0000ef01 ckpt-%070d.dcp", 3);
  const char *bad[] = {
      "",
      "   ",
      "garbage",
      "3 23 400 0000abcd 0000ef01",                                 /* no name */
      "3 23 400 0000abcd ckpt-000000000003-g23.dcp",                /* a CRC missing */
      "3 23 400 0000abcd 0000ef01 ckpt-000000000003-g23.dcp extra", /* one field too many */
      "3 23 400 0000abcd 0000ef01 notes.txt",                       /* not a checkpoint's name */
      "3 23 400 0000abcd 0000ef01 ckpt-000000000004-g23.dcp",       /* the name of another step */
      "3 23 400 zzzz 0000ef01 ckpt-000000000003-g23.dcp",           /* a CRC not in hex */
      "x 23 400 0000abcd 0000ef01 ckpt-000000000003-g23.dcp",       /* a step not a number */
      "3 gen 400 0000abcd 0000ef01 ckpt-000000000003-g23.dcp",      /* a generation not a number */
      "3 23 400 0000abcd 0000ef01 ckpt-000000000003-g23.dcp.tmp",   /* another suffix */
      "3 23 400 0000abcd 0000ef01 .ckpt-000000000003.tmp.12",       /* a temp file */
      "3 23 400 0000abcd 0000ef01 ckpt-000000000003-gx.dcp",        /* a name's generation not a number */
      longname,                                                     /* a name too long */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ck_assert_msg(dcomm__ckpt_rec_parse(bad[i], &back) == DCOMM_EPROTO, "parsed '%s'", bad[i]);
    ck_assert_msg(strstr(dcomm_last_error(), "malformed") != NULL, "'%s': %s", bad[i], dcomm_last_error());
  }
  rm_rf(dir);
}
END_TEST

/* COMMITTED is sorted newest first by generation, then step: a record of an
 * older generation (a fenced writer's, even at a higher step) never becomes
 * the newest, and a full list drops its oldest, never a newer record. */
START_TEST(test_commit_order) {
  char dir[DIRCAP];
  new_dir(dir);
  const size_t len = 100;
  struct dcomm_ckpt_rec a, b, c, d, e, f, g, recs[8];
  char p[512];
  write_only(dir, 5, 3, len, 5, &a);
  commit_rec(dir, &a, 3);
  write_only(dir, 6, 3, len, 6, &b);
  commit_rec(dir, &b, 3);
  write_only(dir, 10, 2, len, 10, &c);
  commit_rec(dir, &c, 3);
  expect_read(dir, NULL, 6, 3, len, 6);
  ck_assert_int_eq(commit_list(dir, recs, 8), 3);
  expect_rec_eq(&recs[0], &b);
  expect_rec_eq(&recs[1], &a);
  expect_rec_eq(&recs[2], &c);
  /* An older step of the newest generation sorts below it, above older
   * generations: here it pushes c out. */
  write_only(dir, 4, 3, len, 4, &d);
  commit_rec(dir, &d, 3);
  ck_assert_int_eq(commit_list(dir, recs, 8), 3);
  expect_rec_eq(&recs[0], &b);
  expect_rec_eq(&recs[1], &a);
  expect_rec_eq(&recs[2], &d);
  ckpt_path_g(p, sizeof(p), dir, 10, 2);
  ck_assert_msg(!exists(p), "%s outlived its record", p);
  expect_read(dir, NULL, 6, 3, len, 6);
  /* A full list drops an older record committed late, not a newer one. */
  write_only(dir, 1, 1, len, 1, &e);
  commit_rec(dir, &e, 3);
  ck_assert_int_eq(commit_list(dir, recs, 8), 3);
  expect_rec_eq(&recs[0], &b);
  expect_rec_eq(&recs[1], &a);
  expect_rec_eq(&recs[2], &d);
  ckpt_path_g(p, sizeof(p), dir, 1, 1);
  ck_assert_msg(!exists(p), "%s outlived its record", p);
  expect_read(dir, NULL, 6, 3, len, 6);
  /* A record already in the list is not added twice; keep=2 drops the
   * oldest. */
  commit_rec(dir, &b, 2);
  ck_assert_int_eq(commit_list(dir, recs, 8), 2);
  expect_rec_eq(&recs[0], &b);
  expect_rec_eq(&recs[1], &a);
  ckpt_path_g(p, sizeof(p), dir, 4, 3);
  ck_assert_msg(!exists(p), "%s outlived its record", p);
  /* A newer generation is the newest even at a lower step; negative
   * generations sort below the others. */
  write_only(dir, 2, 4, len, 2, &f);
  commit_rec(dir, &f, 4);
  write_only(dir, 99, -2, len, 99, &g);
  commit_rec(dir, &g, 4);
  ck_assert_int_eq(commit_list(dir, recs, 8), 4);
  expect_rec_eq(&recs[0], &f);
  expect_rec_eq(&recs[1], &b);
  expect_rec_eq(&recs[2], &a);
  expect_rec_eq(&recs[3], &g);
  expect_read(dir, NULL, 2, 4, len, 2);
  /* When the newest is damaged, the next in that order is read. */
  ckpt_path_g(p, sizeof(p), dir, 2, 4);
  flip_byte(p, DCOMM_CKPT_HEADER_SIZE + 1);
  expect_read(dir, NULL, 6, 3, len, 6);
  rm_rf(dir);
}
END_TEST

/* A damaged COMMITTED: a malformed line is skipped with a warning and the
 * other records still count; a file that is not a commit list commits
 * nothing. */
START_TEST(test_commit_list_damaged) {
  char dir[DIRCAP];
  new_dir(dir);
  const size_t len = 200;
  write_step(dir, 1, len, 5);
  write_step(dir, 2, len, 5);
  char cpath[512];
  commit_file(cpath, sizeof(cpath), dir);
  char *orig = slurp(cpath);
  ck_assert_ptr_nonnull(orig);
  const char *recs_text = strchr(orig, '\n');
  ck_assert_ptr_nonnull(recs_text);
  recs_text++;
  size_t cap = strlen(orig) + 128;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  snprintf(text, cap, "dcomm-checkpoint-commits 1\nthis is not a record\n%s", recs_text);
  spit(cpath, text);
  int rc;
  struct dcomm_ckpt_info info;
  char *log = read_committed_logged(dir, NULL, &rc, &info);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(info.step, 2);
  ck_assert_msg(strstr(log, "WARN") && strstr(log, "malformed") && strstr(log, "this is not a record"), "log: %s",
                log);
  free(log);
  expect_latest(dir, 2, len);
  snprintf(text, cap, "dcomm-checkpoint-commits 2\n%s", recs_text);
  spit(cpath, text);
  log = read_committed_logged(dir, NULL, &rc, NULL);
  ck_assert_int_eq(rc, DCOMM_ENOTFOUND);
  ck_assert_msg(strstr(log, "not a commit list") && strstr(log, "ckpt-000000000002-g13.dcp"), "log: %s", log);
  free(log);
  expect_notfound(dir);
  /* The well-formed list back, all is well again. */
  spit(cpath, orig);
  expect_latest(dir, 2, len);
  free(text);
  free(orig);
  rm_rf(dir);
}
END_TEST

/* ---- crash safety ---- */

#define CRASH_LEN ((size_t)50 << 20)
#define CRASH_KEEP 3

static int64_t crash_gen(uint64_t step) { return (int64_t)(step * 3) - 1000; }

/* The child: writes and commits steps start, start+1, ... until killed,
 * reporting each committed step on fd (8-byte writes to a pipe are atomic). */
static void __attribute__((noreturn)) crash_writer(const char *dir, uint64_t start, unsigned char *buf, int fd) {
  for (uint64_t s = start;; s++) {
    fill(buf, CRASH_LEN, s);
    struct dcomm_ckpt_rec rec;
    int rc = dcomm__ckpt_write(dir, s, crash_gen(s), buf, CRASH_LEN, &rec);
    if (rc == 0) rc = dcomm__ckpt_commit(dir, &rec, CRASH_KEEP);
    if (rc != 0) {
      fprintf(stderr, "crash writer: step %llu: %s\n", (unsigned long long)s, dcomm_last_error());
      _exit(2);
    }
    if (write(fd, &s, sizeof(s)) != (ssize_t)sizeof(s)) _exit(3);
  }
}

START_TEST(test_crash_kill_random) {
  char dir[DIRCAP];
  new_dir(dir);
  unsigned char *buf = malloc(CRASH_LEN), *want = malloc(CRASH_LEN);
  ck_assert_ptr_nonnull(buf);
  ck_assert_ptr_nonnull(want);
  unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  srand(seed);

  /* A first committed checkpoint, and the time one write cycle takes. */
  double t0 = now_s();
  fill(buf, CRASH_LEN, 1);
  struct dcomm_ckpt_rec rec;
  ck_assert_int_eq(dcomm__ckpt_write(dir, 1, crash_gen(1), buf, CRASH_LEN, &rec), 0);
  ck_assert_int_eq(dcomm__ckpt_commit(dir, &rec, CRASH_KEEP), 0);
  double cycle = now_s() - t0;
  if (cycle < 0.005) cycle = 0.005;

  uint64_t latest = 1, last_committed = 1;
  int rounds = 0, mid_write = 0, uncommitted = 0, advanced = 0;
  double start = now_s();
  /* At least 6 rounds and 5 s; longer (up to 30 s) until both a kill in the
   * middle of a write and a new commit were seen, as a loaded machine or a
   * sanitizer build can make the payload's fill take most of the cycle. */
  while (rounds < 40 && (rounds < 6 || now_s() - start < 5.0 ||
                         ((mid_write == 0 || advanced == 0) && now_s() - start < 30.0))) {
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      close(pfd[0]);
      crash_writer(dir, latest + 1, buf, pfd[1]);
    }
    close(pfd[1]);
    double jitter = (double)(rand() % 5000) * 1e-6; /* 0-5 ms */
    double delay;
    if (rounds % 2 == 0) {
      /* Anywhere from the child's start to past its first commit. */
      delay = cycle * 1.2 * (double)rand() / RAND_MAX + jitter;
    } else {
      /* After its first commit, within the next write: once its temporary
       * file is there (the fill and checksum before it can be most of the
       * cycle in a sanitizer build), within 5 ms. */
      uint64_t s;
      struct pollfd p = {pfd[0], POLLIN, 0};
      ck_assert_msg(poll(&p, 1, 20000) == 1, "crash writer made no progress in 20 s");
      ck_assert_msg(read(pfd[0], &s, sizeof(s)) == (ssize_t)sizeof(s), "crash writer died before its first commit");
      last_committed = s;
      int nc, nt = 0;
      for (double until = now_s() + 2 * cycle + 1; nt == 0 && now_s() < until; sleep_s(0.0005))
        count_files(dir, &nc, &nt);
      delay = jitter;
    }
    sleep_s(delay);
    kill(pid, SIGKILL);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "crash writer ended on its own (status 0x%x)", st);
    /* Every step the child saw committed, in order. */
    uint64_t s;
    while (read(pfd[0], &s, sizeof(s)) == (ssize_t)sizeof(s)) last_committed = s;
    close(pfd[0]);

    /* COMMITTED is always whole: keep records at most, newest first. */
    struct dcomm_ckpt_rec recs[8];
    int nrec = commit_list(dir, recs, 8);
    ck_assert_msg(nrec >= 1 && nrec <= CRASH_KEEP, "round %d: %d records", rounds, nrec);
    for (int i = 1; i < nrec; i++) ck_assert_uint_gt(recs[i - 1].step, recs[i].step);
    int nc, nt;
    count_files(dir, &nc, &nt);
    mid_write += nt > 0;
    uncommitted += nc > nrec;
    /* Every record's file, plus at most a file written but not committed
     * and one a kill between a commit and its pruning left behind. */
    ck_assert_msg(nc >= nrec && nc <= CRASH_KEEP + 2, "round %d: %d checkpoint files, %d records", rounds, nc, nrec);

    /* The newest committed checkpoint is the one read, intact; a newer file
     * not committed is not. */
    void *data = NULL;
    size_t len = 0;
    struct dcomm_ckpt_info info;
    int rc = dcomm__ckpt_read_committed(dir, NULL, &data, &len, &info);
    ck_assert_msg(rc == 0, "round %d (delay %.1f ms, seed %u): %s (%s)", rounds, delay * 1e3, seed,
                  dcomm_error_name(rc), dcomm_last_error());
    ck_assert_msg(info.step == recs[0].step && info.payload_crc == recs[0].payload_crc,
                  "round %d: read step %llu, but the newest record is step %llu", rounds,
                  (unsigned long long)info.step, (unsigned long long)recs[0].step);
    ck_assert_msg(info.step >= last_committed, "round %d: read step %llu but step %llu was committed", rounds,
                  (unsigned long long)info.step, (unsigned long long)last_committed);
    ck_assert_msg(info.step <= last_committed + 1, "round %d: read step %llu, past the step %llu being committed",
                  rounds, (unsigned long long)info.step, (unsigned long long)last_committed + 1);
    ck_assert_msg(info.step >= latest, "round %d: went back from step %llu to %llu", rounds,
                  (unsigned long long)latest, (unsigned long long)info.step);
    ck_assert_uint_eq(len, CRASH_LEN);
    ck_assert_int_eq(info.generation, crash_gen(info.step));
    fill(want, CRASH_LEN, info.step);
    ck_assert_msg(memcmp(data, want, CRASH_LEN) == 0, "round %d: step %llu holds another step's payload", rounds,
                  (unsigned long long)info.step);
    free(data);
    advanced += info.step > latest;
    latest = info.step;
    last_committed = latest;
    rounds++;
  }
  fprintf(stderr, "crash test: %d rounds in %.1f s (write cycle %.0f ms, seed %u), %d killed mid-write, "
                  "%d left a file not committed, %d advanced, last step %llu\n",
          rounds, now_s() - start, cycle * 1e3, seed, mid_write, uncommitted, advanced, (unsigned long long)latest);
  /* The schedule must have hit both cases for the test to mean anything. */
  ck_assert_msg(mid_write > 0, "no round killed the writer mid-write");
  ck_assert_msg(advanced > 0, "no round committed a new checkpoint");

  /* A normal write and commit afterwards cleans up: exactly keep files, no
   * temp file. */
  fill(buf, CRASH_LEN, latest + 1);
  ck_assert_int_eq(dcomm__ckpt_write(dir, latest + 1, crash_gen(latest + 1), buf, CRASH_LEN, &rec), 0);
  ck_assert_int_eq(dcomm__ckpt_commit(dir, &rec, CRASH_KEEP), 0);
  int nc, nt;
  count_files(dir, &nc, &nt);
  ck_assert_int_eq(nc, CRASH_KEEP);
  ck_assert_int_eq(nt, 0);
  free(buf);
  free(want);
  rm_rf(dir);
}
END_TEST

static Suite *checkpoint_suite(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("files");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_roundtrip_sizes);
  tcase_add_test(tc, test_format_little_endian);
  tcase_add_test(tc, test_mkdir_p);
  tcase_add_test(tc, test_bad_args);
  tcase_add_test(tc, test_keep_three);
  tcase_add_test(tc, test_torn_newest);
  tcase_add_test(tc, test_flipped_payload_byte);
  tcase_add_test(tc, test_flipped_header_byte);
  tcase_add_test(tc, test_bad_magic);
  tcase_add_test(tc, test_bad_fields_valid_crc);
  tcase_add_test(tc, test_all_corrupt);
  tcase_add_test(tc, test_missing_or_empty_dir);
  tcase_add_test(tc, test_leftover_temp_file);
  suite_add_tcase(s, tc);
  TCase *tf = tcase_create("fence");
  tcase_set_timeout(tf, 60);
  tcase_add_test(tf, test_uncommitted_never_read);
  tcase_add_test(tf, test_crash_before_commit);
  tcase_add_test(tf, test_replaced_committed_file);
  tcase_add_test(tf, test_also_record);
  tcase_add_test(tf, test_rec_text);
  tcase_add_test(tf, test_commit_order);
  tcase_add_test(tf, test_commit_list_damaged);
  suite_add_tcase(s, tf);
  TCase *tk = tcase_create("crash");
  tcase_set_timeout(tk, 60);
  tcase_add_test(tk, test_crash_kill_random);
  suite_add_tcase(s, tk);
  return s;
}

int main(void) {
  snprintf(base_dir, sizeof(base_dir), "/tmp/dcomm-ckpt-XXXXXX");
  if (!mkdtemp(base_dir)) {
    perror("check_checkpoint: mkdtemp");
    return EXIT_FAILURE;
  }
  /* The skip warnings are expected here; the tests that check them turn
   * them back on. DCOMM_LOG_LEVEL from the environment wins. */
  setenv("DCOMM_LOG_LEVEL", "error", 0);
  dcomm__log_setup();
  SRunner *sr = srunner_create(checkpoint_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  rm_rf(base_dir);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
