/*
 * bench_tune.c: dcomm-bench --tune FILE [-e MAXBYTES] (bench_tune.h).
 * Every rank of the job joins it once and runs the same trials: for each
 * candidate value of a setting it sets the variable, times an op over a
 * range of sizes (the slowest rank's mean, fastest of TUNE_PASSES passes)
 * on a new group of the whole world, which the backend builds with the
 * settings in force at its creation, and frees it. The times are world
 * maxima, so every rank takes the same decisions. -e stops every range at
 * MAXBYTES (default and most: 64 MiB). Rank 0 prints the tables and writes
 * the file (a temporary file renamed into place), its comments naming the
 * CPU, the world and the figures each value was chosen from.
 *
 * Settings tuned, in this order (each trial runs with the values chosen
 * before it):
 *   DCOMM_SHM_SPIN            0, 10, 50 or 200 microseconds: small-message
 *                             latency, which spinning helps while a core is
 *                             free and hurts when ranks share cores;
 *   DCOMM_TCP_SMALL_THRESHOLD where recursive doubling stops beating the
 *                             ring for all_reduce (broadcast's tree/chain
 *                             switch uses the same value);
 *   DCOMM_SHM_CMA_MIN         from which size the single copy
 *                             (process_vm_readv) beats the rings for data
 *                             read from the caller's input (all_gather);
 *   DCOMM_SHM_CMA_FWD_MIN     the same for data the sender wrote earlier in
 *                             the call (all_reduce's partial sums), which
 *                             the reader fetches from the writer's cache;
 *                             both only when the whole world is on one
 *                             host. On a PVM guest the rings won at every
 *                             size to 64 MiB, by up to 2x; on the Intel
 *                             machine of docs/PERFORMANCE.md the single
 *                             copy won from 16 KiB: it is measured.
 */
#include "bench_tune.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "dcomm.h"

#define TUNE_PASSES 5
#define TUNE_TARGET_S 0.03 /* time each pass aims to take */
/* A value wins at a size only by this factor; closer is noise, and the
 * built-in choice stands there. */
#define TUNE_MARGIN 1.10
#define TUNE_MAX_ITERS 2000
#define TUNE_MAX_SIZES 8

struct sizes {
  int n;
  size_t b[TUNE_MAX_SIZES];
};

static const struct sizes spin_sizes = {3, {8, 1024, 65536}};
static const struct sizes algo_sizes = {7, {4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}};
static const struct sizes cma_sizes = {8, {1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}};
static const struct sizes fwd_sizes = {5, {262144, 1048576, 4194304, 16777216, 67108864}};
#define TUNE_MAX_BYTES ((size_t)67108864)
/* The least -e: every range keeps two sizes to compare. */
#define TUNE_MIN_CAP ((size_t)1048576)

/* sz without its sizes above max. */
static struct sizes upto(const struct sizes *sz, size_t max) {
  struct sizes c = {0, {0}};
  for (int k = 0; k < sz->n; k++)
    if (sz->b[k] <= max) c.b[c.n++] = sz->b[k];
  return c;
}
/* The op a trial times: all_reduce, or all_gather of bytes in all (in
 * place: each rank's block already at its place in buf). */
enum tune_op { TUNE_ALL_REDUCE, TUNE_ALL_GATHER };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int world_max(double *v, size_t n) { return dcomm_all_reduce(v, n, DCOMM_FLOAT64, DCOMM_MAX, NULL); }

static int run_op(enum tune_op op, dcomm_group_t g, float *buf, size_t bytes) {
  if (op == TUNE_ALL_REDUCE) return dcomm_all_reduce(buf, bytes / sizeof(float), DCOMM_FLOAT32, DCOMM_SUM, g);
  size_t count = bytes / sizeof(float) / (size_t)dcomm_world_size();
  return dcomm_all_gather(buf + (size_t)dcomm_rank() * count, buf, count, DCOMM_FLOAT32, g);
}

/* The slowest rank's mean seconds per op of bytes, fastest of
 * TUNE_PASSES; the same value on every rank. <0: a dcomm error. */
static double time_op(enum tune_op op, dcomm_group_t g, float *buf, size_t bytes) {
  int rc;
  for (int i = 0; i < 3; i++)
    if ((rc = run_op(op, g, buf, bytes)) != 0) return rc;
  double est[1] = {now_s()};
  for (int i = 0; i < 3; i++)
    if ((rc = run_op(op, g, buf, bytes)) != 0) return rc;
  est[0] = (now_s() - est[0]) / 3;
  if ((rc = world_max(est, 1)) != 0) return rc;
  long iters = est[0] > 0 ? (long)(TUNE_TARGET_S / est[0]) : TUNE_MAX_ITERS;
  if (iters < 3) iters = 3;
  if (iters > TUNE_MAX_ITERS) iters = TUNE_MAX_ITERS;
  double best = INFINITY;
  for (int p = 0; p < TUNE_PASSES; p++) {
    if ((rc = dcomm_barrier(g)) != 0) return rc;
    double t[1] = {now_s()};
    for (long i = 0; i < iters; i++)
      if ((rc = run_op(op, g, buf, bytes)) != 0) return rc;
    t[0] = (now_s() - t[0]) / (double)iters;
    if ((rc = world_max(t, 1)) != 0) return rc;
    if (t[0] < best) best = t[0];
  }
  return best;
}

/* A trial: the variable set to value, a group of the whole world created
 * with it, one time per size into out (seconds). The variable's earlier
 * value comes back. */
static int trial(const char *name, const char *value, enum tune_op op, const struct sizes *sz, float *buf,
                 double *out) {
  const char *old = getenv(name);
  char *saved = old ? strdup(old) : NULL;
  setenv(name, value, 1);
  dcomm_group_t g = NULL;
  int rc = dcomm_group_split(NULL, 0, dcomm_rank(), &g);
  for (int k = 0; rc == 0 && k < sz->n; k++) {
    double t = time_op(op, g, buf, sz->b[k]);
    if (t < 0) rc = (int)t;
    out[k] = t;
  }
  if (rc != 0) fprintf(stderr, "dcomm-bench --tune: %s=%s: %s\n", name, value, dcomm_last_error());
  if (g && dcomm_group_free(g) != 0 && rc == 0) rc = -1;
  if (saved) setenv(name, saved, 1);
  else unsetenv(name);
  free(saved);
  return rc;
}

static void size_str(size_t b, char *s, size_t n) {
  if (b >= 1048576 && b % 1048576 == 0) snprintf(s, n, "%zuM", b >> 20);
  else if (b >= 1024 && b % 1024 == 0) snprintf(s, n, "%zuK", b >> 10);
  else snprintf(s, n, "%zu", b);
}

/* The report, printed by rank 0 and kept in the file's comments. */
struct report {
  char text[8192];
  size_t len;
};

static void say(struct report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct report *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(r->text + r->len, sizeof(r->text) - r->len, fmt, ap);
  va_end(ap);
  if (n > 0) r->len += (size_t)n < sizeof(r->text) - r->len ? (size_t)n : sizeof(r->text) - r->len - 1;
}

static void table(struct report *r, const struct sizes *sz, const char *what, enum tune_op op,
                  const char *const names[], int nc, double t[][TUNE_MAX_SIZES]) {
  say(r, "# %s, microseconds per %s (float32):\n#   %9s", what, op == TUNE_ALL_REDUCE ? "all_reduce" : "all_gather",
      "bytes");
  for (int c = 0; c < nc; c++) say(r, " %12s", names[c]);
  say(r, "\n");
  for (int k = 0; k < sz->n; k++) {
    char s[24];
    size_str(sz->b[k], s, sizeof(s));
    say(r, "#   %9s", s);
    for (int c = 0; c < nc; c++) say(r, " %12.2f", t[c][k] * 1e6);
    say(r, "\n");
  }
}

/* The spin whose times, each relative to the best at its size, add up to
 * the least; a smaller spin within TUNE_MARGIN of that is preferred (it
 * burns less). */
static int pick_spin(int nc, double t[][TUNE_MAX_SIZES], int ns) {
  double score[8];
  int best = 0;
  for (int c = 0; c < nc; c++) {
    score[c] = 0;
    for (int k = 0; k < ns; k++) {
      double m = INFINITY;
      for (int d = 0; d < nc; d++) m = fmin(m, t[d][k]);
      score[c] += t[c][k] / m;
    }
    if (score[c] < score[best]) best = c;
  }
  for (int c = 0; c < best; c++)
    if (score[c] <= score[best] * TUNE_MARGIN) return c;
  return best;
}

/* Where a's sizes end and b's begin: the index of the last size a keeps, -1
 * when b takes every size. At each size the clear winner (by TUNE_MARGIN)
 * takes it; a tie goes the built-in way (a up to and including def_last).
 * a ends before the first size b takes together with the next one (noise
 * at one size does not move the switch). */
static int last_win(const struct sizes *sz, const double *a, const double *b, size_t def_last) {
  int n = sz->n, takes_b[TUNE_MAX_SIZES];
  for (int k = 0; k < n; k++)
    takes_b[k] = a[k] > b[k] * TUNE_MARGIN ? 1 : b[k] > a[k] * TUNE_MARGIN ? 0 : sz->b[k] > def_last;
  for (int k = 0; k < n; k++)
    if (takes_b[k] && (k + 1 == n || takes_b[k + 1])) return k - 1;
  return n - 1;
}

/* A single-copy threshold: the trials of name with the rings only (value
 * off) and the single copy always ("1"); the setting is the first size the
 * single copy takes (last_win, def_last the built-in rings' last size), or
 * twice the largest size measured when the rings take them all. 0 or a
 * dcomm error. */
static int tune_single_copy(struct report *r, struct report *set, const char *name, const char *off, enum tune_op op,
                            const struct sizes *sz, size_t def_last, float *buf) {
  const char *values[] = {off, "1"};
  double t[2][TUNE_MAX_SIZES];
  int rc = 0;
  for (int c = 0; c < 2 && rc == 0; c++) rc = trial(name, values[c], op, sz, buf, t[c]);
  if (rc != 0) return rc;
  int k = last_win(sz, t[0], t[1], def_last);
  size_t min = k + 1 < sz->n ? sz->b[k + 1] : 2 * sz->b[sz->n - 1];
  char what[96];
  snprintf(what, sizeof(what), "%s rings only / single copy always", name);
  table(r, sz, what, op, (const char *const[]){"rings", "single copy"}, 2, t);
  say(set, "%s=%zu\n", name, min);
  return 0;
}

static int one_host(void) {
  char h[256] = "";
  gethostname(h, sizeof(h) - 1);
  uint64_t x = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = h; *p; p++) x = (x ^ (unsigned char)*p) * 1099511628211ull;
  int64_t v[2] = {(int64_t)(x >> 1), -(int64_t)(x >> 1)};
  if (dcomm_all_reduce(v, 2, DCOMM_INT64, DCOMM_MAX, NULL) != 0) return 0;
  return v[0] == -v[1];
}

static void cpu_model(char *s, size_t n) {
  snprintf(s, n, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      char *v = strchr(line, ':') + 1;
      while (*v == ' ' || *v == '\t') v++;
      v[strcspn(v, "\n")] = 0;
      snprintf(s, n, "%s", v);
      break;
    }
  fclose(f);
}

static int write_file(const char *path, const struct report *r, const char *settings) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) {
    perror(tmp);
    return -1;
  }
  int bad = fputs(r->text, f) < 0 || fputs(settings, f) < 0;
  bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    perror(path);
    unlink(tmp);
    return -1;
  }
  return 0;
}

int bench_tune(int argc, char **argv) {
  size_t cap = TUNE_MAX_BYTES;
  int bad = argc != 2 && argc != 4;
  if (!bad && argc == 4) {
    bad = strcmp(argv[2], "-e") != 0;
    if (!bad && (bench_parse_size(argv[3], &cap) < 0 || cap < TUNE_MIN_CAP)) {
      fprintf(stderr, "dcomm-bench --tune: bad size '%s' for -e (at least 1M, so that every setting has two sizes "
                      "to compare; K/M/G)\n", argv[3]);
      return 2;
    }
  }
  if (bad || argv[1][0] == '-') {
    fprintf(stderr, "usage: dcomm-bench --tune FILE [-e MAXBYTES]   (run under a launcher, e.g.\n"
                    "  dcomm-run --nproc-per-node 4 -- dcomm-bench --tune tuning.conf;\n"
                    "  -e: measure sizes up to MAXBYTES only, default and most 64M)\n");
    return 2;
  }
  const char *path = argv[1];
  if (cap > TUNE_MAX_BYTES) cap = TUNE_MAX_BYTES;
  const struct sizes spin_sz = upto(&spin_sizes, cap), algo_sz = upto(&algo_sizes, cap),
                     cma_sz = upto(&cma_sizes, cap), fwd_sz = upto(&fwd_sizes, cap);
  /* The trials measure the built-in defaults and the values chosen here,
   * not an earlier tuning file's. */
  setenv("DCOMM_TUNING_FILE", "none", 1);
  float *buf = calloc(cap / sizeof(float), sizeof(float));
  if (!buf) {
    fprintf(stderr, "dcomm-bench --tune: cannot allocate %zu bytes\n", cap);
    return 1;
  }
  if (dcomm_init(NULL, NULL) != 0) {
    fprintf(stderr, "dcomm-bench --tune: %s\n", dcomm_last_error());
    free(buf);
    return 1;
  }
  int rank = dcomm_rank(), world = dcomm_world_size(), single = one_host();
  const char *backend = dcomm_backend_name();
  const char *tr = getenv("DCOMM_TRANSPORT");
  int shm = single && !(tr && !strcmp(tr, "tcp"));

  struct report r = {.len = 0}, set = {.len = 0};
  char cpu[256], when[64];
  cpu_model(cpu, sizeof(cpu));
  time_t now = time(NULL);
  strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", gmtime(&now));
  say(&r, "# dcomm tuning file, written by dcomm-bench --tune on %s (dcomm %s, backend %s)\n", when,
      dcomm_version_string(), backend);
  say(&r, "# CPU: %s; %d ranks%s%s\n", cpu, world, single ? " on one host" : " on several hosts",
      shm ? " (shared memory)" : "");
  if (cap < TUNE_MAX_BYTES) {
    char s[24];
    size_str(cap, s, sizeof(s));
    say(&r, "# Sizes measured up to %s only (-e %s)\n", s, s);
  }
  say(&r, "# Read by libdcomm through DCOMM_TUNING_FILE (or as $(sysconfdir)/dcomm/tuning.conf); a variable\n"
          "# set in the environment wins over a line here.\n");
  int rc = 0;

  /* 1. spin */
  static const char *const spins[] = {"0", "10", "50", "200"};
  double ts[4][TUNE_MAX_SIZES];
  for (int c = 0; c < 4 && rc == 0; c++) rc = trial("DCOMM_SHM_SPIN", spins[c], TUNE_ALL_REDUCE, &spin_sz, buf, ts[c]);
  if (rc == 0) {
    const char *spin = spins[pick_spin(4, ts, spin_sz.n)];
    table(&r, &spin_sz, "DCOMM_SHM_SPIN 0 / 10 / 50 / 200 us", TUNE_ALL_REDUCE, spins, 4, ts);
    say(&set, "DCOMM_SHM_SPIN=%s\n", spin);
    setenv("DCOMM_SHM_SPIN", spin, 1); /* for the trials below */
  }

  /* 2. recursive doubling up to the threshold, the ring above */
  static const char *const algos[] = {"all_reduce=rd", "all_reduce=ring"};
  double ta[2][TUNE_MAX_SIZES];
  for (int c = 0; c < 2 && rc == 0; c++) rc = trial("DCOMM_ALGO", algos[c], TUNE_ALL_REDUCE, &algo_sz, buf, ta[c]);
  if (rc == 0) {
    int k = last_win(&algo_sz, ta[0], ta[1], 262144); /* the built-in DCOMM_TCP_SMALL_THRESHOLD */
    size_t thr = k < 0 ? 0 : algo_sz.b[k];
    table(&r, &algo_sz, "DCOMM_ALGO all_reduce=rd / ring", TUNE_ALL_REDUCE, (const char *const[]){"rd", "ring"}, 2,
          ta);
    say(&set, "DCOMM_TCP_SMALL_THRESHOLD=%zu\n", thr);
    char v[32];
    snprintf(v, sizeof(v), "%zu", thr);
    setenv("DCOMM_TCP_SMALL_THRESHOLD", v, 1);
  }

  /* 3. the single copy, on one host: first of the caller's data (built in:
   * from 16 KiB), then, single copy on for it, of data written in the call
   * (built in: from 1 MiB) */
  if (rc == 0 && shm) {
    rc = tune_single_copy(&r, &set, "DCOMM_SHM_CMA_MIN", "0", TUNE_ALL_GATHER, &cma_sz, 16383, buf);
    setenv("DCOMM_SHM_CMA_MIN", "1", 1);
    if (rc == 0)
      rc = tune_single_copy(&r, &set, "DCOMM_SHM_CMA_FWD_MIN", "1099511627776", TUNE_ALL_REDUCE, &fwd_sz, 1048575, buf);
    unsetenv("DCOMM_SHM_CMA_MIN");
  } else if (rc == 0) {
    say(&r, "# DCOMM_SHM_CMA_MIN and DCOMM_SHM_CMA_FWD_MIN not tuned: the ranks do not all share one host's memory\n");
  }
  free(buf);
  if (rc == 0 && rank == 0) {
    fputs(r.text, stdout);
    fputs(set.text, stdout);
    if (write_file(path, &r, set.text) < 0) rc = -1;
    else printf("# written to %s; use it with DCOMM_TUNING_FILE=%s\n", path, path);
  }
  if (dcomm_finalize() != 0 && rc == 0) rc = -1;
  return rc ? 1 : 0;
}
