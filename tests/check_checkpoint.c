/*
 * check_checkpoint.c: unit tests of the crash-safe checkpoint files
 * (elastic/checkpoint.c): round trips (empty to 20 MiB) and the on-disk
 * format, pruning to `keep`, fallback to the previous checkpoint when the
 * newest is torn, has a flipped payload or header byte, a bad magic or bad
 * fields under a valid CRC, not-found cases, leftover temp files, and a real
 * crash test: a child writing 50 MiB checkpoints in a loop is SIGKILLed at
 * random moments and the newest readable checkpoint must always be valid, at
 * least as new as the last one the child saw committed, and hold the payload
 * derived from its step.
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
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint.h"
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

static void ckpt_path(char *buf, size_t cap, const char *dir, uint64_t step) {
  snprintf(buf, cap, "%s/ckpt-%012llu.dcp", dir, (unsigned long long)step);
}

/* Writes a checkpoint of len bytes whose payload is derived from step. */
static void write_step(const char *dir, uint64_t step, size_t len, int keep) {
  unsigned char *p = make_payload(len, step);
  int rc = dcomm__ckpt_write(dir, step, (int64_t)step * 10 - 7, p, len, keep);
  ck_assert_msg(rc == 0, "write step %llu: %s (%s)", (unsigned long long)step, dcomm_error_name(rc),
                dcomm_last_error());
  free(p);
}

/* read_latest must return `step`, with the payload write_step gave it. */
static void expect_latest(const char *dir, uint64_t step, size_t len) {
  void *data = NULL;
  size_t got = 0;
  struct dcomm_ckpt_info info;
  int rc = dcomm__ckpt_read_latest(dir, &data, &got, &info);
  ck_assert_msg(rc == 0, "read_latest: %s (%s)", dcomm_error_name(rc), dcomm_last_error());
  ck_assert_msg(info.step == step, "read_latest returned step %llu, want %llu", (unsigned long long)info.step,
                (unsigned long long)step);
  ck_assert_int_eq(info.generation, (int64_t)step * 10 - 7);
  ck_assert_uint_eq(got, len);
  ck_assert_uint_eq(info.len, len);
  char want[512];
  ckpt_path(want, sizeof(want), dir, step);
  ck_assert_str_eq(info.path, want);
  if (len == 0) {
    ck_assert_ptr_null(data);
  } else {
    unsigned char *exp = make_payload(len, step);
    ck_assert_msg(memcmp(data, exp, len) == 0, "payload of step %llu differs", (unsigned long long)step);
    free(exp);
  }
  free(data);
}

static void expect_notfound(const char *dir) {
  void *data = (void *)1;
  size_t got = 99;
  int rc = dcomm__ckpt_read_latest(dir, &data, &got, NULL);
  ck_assert_msg(rc == DCOMM_ENOTFOUND, "read_latest(%s): %s (%s), want DCOMM_ENOTFOUND", dir, dcomm_error_name(rc),
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

/* Runs read_latest with stderr sent to a file; returns what it logged
 * (malloc'd). */
static char *read_latest_logged(const char *dir, int *rc, struct dcomm_ckpt_info *info) {
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
  *rc = dcomm__ckpt_read_latest(dir, &data, &len, info);
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
  ck_assert_int_eq(dcomm__ckpt_write(dir, step, -2, payload, sizeof(payload), 1), 0);
  char path[512];
  snprintf(path, sizeof(path), "%s/ckpt-%012llu.dcp", dir, (unsigned long long)step);
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
  /* The step is zero-padded to 12 digits. */
  ck_assert_int_eq(dcomm__ckpt_write(dir, 42, 0, payload, 1, 5), 0);
  snprintf(path, sizeof(path), "%s/ckpt-000000000042.dcp", dir);
  ck_assert_msg(exists(path), "%s missing", path);
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
  ck_assert_int_eq(dcomm__ckpt_read_latest(clean, &data, &len, &info), 0);
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
  ck_assert_int_eq(dcomm__ckpt_write(dir, 1, 0, &x, 1, 0), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_write(dir, 1, 0, NULL, 1, 1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_write("", 1, 0, &x, 1, 1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_write(NULL, 1, 0, &x, 1, 1), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__ckpt_write(dir, 1, 0, NULL, 0, 1), 0); /* NULL is fine for len 0 */
  /* dir is a regular file: a system error that names it. */
  char file[512];
  snprintf(file, sizeof(file), "%s/plainfile", dir);
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  int rc = dcomm__ckpt_write(file, 1, 0, &x, 1, 1);
  ck_assert_int_eq(rc, DCOMM_ESYSTEM);
  ck_assert_msg(strstr(dcomm_last_error(), "plainfile") != NULL, "detail: %s", dcomm_last_error());
  /* read_file on a missing file; NULL out-pointers. */
  char missing[512];
  snprintf(missing, sizeof(missing), "%s/ckpt-000000000099.dcp", dir);
  void *data;
  size_t len;
  ck_assert_int_eq(dcomm__ckpt_read_file(missing, &data, &len, NULL), DCOMM_ENOTFOUND);
  ck_assert_int_eq(dcomm__ckpt_read_latest(dir, NULL, &len, NULL), DCOMM_EINVAL);
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
  expect_latest(dir, 10, 1010);
  /* keep=1 leaves only the newest. */
  write_step(dir, 11, 10, 1);
  count_files(dir, &nc, &nt);
  ck_assert_int_eq(nc, 1);
  expect_latest(dir, 11, 10);
  rm_rf(dir);
}
END_TEST

/* ---- fallback on damage ---- */

/* A new dir (DIRCAP bytes) holding steps 1..3 (keep 5); p3 gets the path of step 3. */
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
  char *log = read_latest_logged(dir, &rc, &info);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(info.step, 2);
  ck_assert_msg(strstr(log, "WARN") && strstr(log, "ckpt-000000000003.dcp") && strstr(log, "payload CRC"),
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
  char *log = read_latest_logged(dir, &rc, NULL);
  ck_assert_int_eq(rc, 0);
  ck_assert_msg(strstr(log, "ckpt-000000000003.dcp") && strstr(log, "header CRC"), "log: %s", log);
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
  /* A valid file under another step's name is not taken for that step. */
  write_step(dir, 3, len, 5);
  char p9[512];
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
  char *log = read_latest_logged(dir, &rc, NULL);
  ck_assert_int_eq(rc, DCOMM_ENOTFOUND);
  ck_assert_msg(strstr(dcomm_last_error(), dir) != NULL, "detail: %s", dcomm_last_error());
  for (int s = 1; s <= 3; s++) {
    char name[64];
    snprintf(name, sizeof(name), "ckpt-%012d.dcp", s);
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
  write_step(dir, 9, 500, 3);
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
  /* The next successful write removes it (and only it). */
  write_step(dir, 3, 500, 3);
  ck_assert_msg(!exists(tmp), "leftover temp file survived a write");
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

/* ---- crash safety ---- */

#define CRASH_LEN ((size_t)50 << 20)
#define CRASH_KEEP 3

static int64_t crash_gen(uint64_t step) { return (int64_t)(step * 3) - 1000; }

/* The child: writes steps start, start+1, ... until killed, reporting each
 * committed step on fd (8-byte writes to a pipe are atomic). */
static void __attribute__((noreturn)) crash_writer(const char *dir, uint64_t start, unsigned char *buf, int fd) {
  for (uint64_t s = start;; s++) {
    fill(buf, CRASH_LEN, s);
    int rc = dcomm__ckpt_write(dir, s, crash_gen(s), buf, CRASH_LEN, CRASH_KEEP);
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
  ck_assert_int_eq(dcomm__ckpt_write(dir, 1, crash_gen(1), buf, CRASH_LEN, CRASH_KEEP), 0);
  double cycle = now_s() - t0;
  if (cycle < 0.005) cycle = 0.005;

  uint64_t latest = 1, last_committed = 1;
  int rounds = 0, mid_write = 0, advanced = 0;
  double start = now_s();
  while (rounds < 40 && (rounds < 6 || now_s() - start < 5.0)) {
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
      /* After its first commit, somewhere within the next write. */
      uint64_t s;
      struct pollfd p = {pfd[0], POLLIN, 0};
      ck_assert_msg(poll(&p, 1, 20000) == 1, "crash writer made no progress in 20 s");
      ck_assert_msg(read(pfd[0], &s, sizeof(s)) == (ssize_t)sizeof(s), "crash writer died before its first commit");
      last_committed = s;
      delay = cycle * (double)rand() / RAND_MAX + jitter;
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

    int nc, nt;
    count_files(dir, &nc, &nt);
    mid_write += nt > 0;
    /* A kill between rename and pruning can leave one extra file. */
    ck_assert_msg(nc >= 1 && nc <= CRASH_KEEP + 1, "round %d: %d checkpoint files", rounds, nc);

    void *data = NULL;
    size_t len = 0;
    struct dcomm_ckpt_info info;
    int rc = dcomm__ckpt_read_latest(dir, &data, &len, &info);
    ck_assert_msg(rc == 0, "round %d (delay %.1f ms, seed %u): %s (%s)", rounds, delay * 1e3, seed,
                  dcomm_error_name(rc), dcomm_last_error());
    ck_assert_msg(info.step >= last_committed, "round %d: read step %llu but step %llu was committed", rounds,
                  (unsigned long long)info.step, (unsigned long long)last_committed);
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
  fprintf(stderr, "crash test: %d rounds in %.1f s (write cycle %.0f ms, seed %u), %d killed mid-write, %d advanced, "
                  "last step %llu\n",
          rounds, now_s() - start, cycle * 1e3, seed, mid_write, advanced, (unsigned long long)latest);
  /* The schedule must have hit both cases for the test to mean anything. */
  ck_assert_msg(mid_write > 0, "no round killed the writer mid-write");
  ck_assert_msg(advanced > 0, "no round committed a new checkpoint");

  /* A normal write afterwards cleans up: exactly keep files, no temp file. */
  fill(buf, CRASH_LEN, latest + 1);
  ck_assert_int_eq(dcomm__ckpt_write(dir, latest + 1, crash_gen(latest + 1), buf, CRASH_LEN, CRASH_KEEP), 0);
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
