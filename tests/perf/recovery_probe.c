/*
 * recovery_probe.c: the probe of the recovery-time benchmark
 * (tests/perf/recovery-bench.sh). Run it under dcomm-run with 4 ranks; it
 * uses only the public API (dcomm.h, dcomm_elastic.h).
 *
 * It loops a float32 SUM all_reduce of --bytes bytes for --iters
 * iterations. With --mode kill or --mode stop, at iteration --kill-at the
 * rank --victim writes the wall-clock time (CLOCK_REALTIME, seconds as a
 * double) to DIR/kill.time and raises SIGKILL (kill) or SIGSTOP (stop: the
 * launcher's heartbeat check then kills it) on itself. Every survivor
 * records t_detect, the moment its failing call returned an error, calls
 * dcomm_elastic_recover(), runs one all_reduce on the new world (result
 * checked), records t_first_ok when it succeeds, writes
 *   "rank t_detect t_first_ok error_name"
 * (rank: its generation-0 rank) to DIR/rank.<member-id>, and exits 0.
 *
 * With --mode none (failure-free reference) rank 0 writes DIR/iter.time:
 *   "median_s mean_s min_s max_s timed_iterations bytes"
 * of the all_reduce calls after --warmup iterations.
 *
 *   dcomm-run --nproc-per-node 4 -- recovery_probe --mode kill --victim 2 \
 *       --kill-at 10 --bytes 4194304 --out /tmp/dir
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dcomm.h"
#include "dcomm_elastic.h"

enum mode { MODE_NONE, MODE_KILL, MODE_STOP };

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(void) {
  fprintf(stderr,
          "usage: recovery_probe --out DIR [--mode kill|stop|none] [--victim R] [--kill-at I]\n"
          "                      [--iters N] [--warmup W] [--bytes B]\n");
  exit(2);
}

static long parse_long(const char *s, const char *what) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < 0) {
    fprintf(stderr, "recovery_probe: bad %s '%s'\n", what, s);
    exit(2);
  }
  return v;
}

/* Writes text to DIR/name through a temporary file and a rename, so the
 * script never reads a half-written file. */
static int write_file(const char *dir, const char *name, const char *text) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    fprintf(stderr, "recovery_probe: cannot write %s: %s\n", tmp, strerror(errno));
    return -1;
  }
  int bad = fputs(text, f) < 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    fprintf(stderr, "recovery_probe: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

static void fill(float *buf, size_t n, float v) {
  for (size_t i = 0; i < n; i++) buf[i] = v;
}

/* Every element must be the world size after a SUM of ones. */
static int check_sum(const float *buf, size_t n, int size) {
  for (size_t i = 0; i < n; i += 4093)
    if (buf[i] != (float)size) return -1;
  return buf[n - 1] == (float)size ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *out = NULL;
  enum mode mode = MODE_KILL;
  long victim = 2, kill_at = 10, iters = 30, warmup = 5;
  long bytes = 4L << 20;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage();
    const char *opt = argv[i], *val = argv[++i];
    if (!strcmp(opt, "--out")) out = val;
    else if (!strcmp(opt, "--mode")) {
      if (!strcmp(val, "kill")) mode = MODE_KILL;
      else if (!strcmp(val, "stop")) mode = MODE_STOP;
      else if (!strcmp(val, "none")) mode = MODE_NONE;
      else usage();
    } else if (!strcmp(opt, "--victim")) victim = parse_long(val, "--victim");
    else if (!strcmp(opt, "--kill-at")) kill_at = parse_long(val, "--kill-at");
    else if (!strcmp(opt, "--iters")) iters = parse_long(val, "--iters");
    else if (!strcmp(opt, "--warmup")) warmup = parse_long(val, "--warmup");
    else if (!strcmp(opt, "--bytes")) bytes = parse_long(val, "--bytes");
    else usage();
  }
  if (!out || bytes < 4 || iters < 1) usage();
  if (mode != MODE_NONE && kill_at >= iters) {
    fprintf(stderr, "recovery_probe: --kill-at must be less than --iters\n");
    return 2;
  }

  int rc = dcomm_init(NULL, NULL);
  if (rc < 0) {
    fprintf(stderr, "recovery_probe: dcomm_init: %s\n", dcomm_last_error());
    return 1;
  }
  if (mode != MODE_NONE && !dcomm_elastic_enabled()) {
    fprintf(stderr, "recovery_probe: not in elastic mode (run it under dcomm-run)\n");
    dcomm_finalize();
    return 1;
  }
  const int rank0 = dcomm_rank(), size0 = dcomm_world_size();
  const size_t count = (size_t)bytes / sizeof(float);
  float *buf = malloc(count * sizeof(float));
  double *times = calloc((size_t)iters, sizeof(double));
  if (!buf || !times) {
    fprintf(stderr, "recovery_probe: out of memory\n");
    return 1;
  }

  for (long it = 0; it < iters; it++) {
    if (mode != MODE_NONE && it == kill_at && rank0 == victim) {
      char line[64];
      snprintf(line, sizeof(line), "%.6f\n", wall());
      if (write_file(out, "kill.time", line) < 0) return 1;
      raise(mode == MODE_KILL ? SIGKILL : SIGSTOP);
      /* Only reached if someone sent SIGCONT before the launcher's kill. */
      fprintf(stderr, "recovery_probe: rank %d resumed after SIGSTOP\n", rank0);
      return 3;
    }
    fill(buf, count, 1.0f);
    double t0 = wall();
    rc = dcomm_all_reduce(buf, count, DCOMM_FLOAT32, DCOMM_SUM, NULL);
    double t1 = wall();
    if (rc == 0) {
      times[it] = t1 - t0;
      if (check_sum(buf, count, size0) < 0) {
        fprintf(stderr, "recovery_probe: rank %d: wrong all_reduce result at iteration %ld\n", rank0, it);
        return 1;
      }
      continue;
    }

    /* The failing call: t1 is the moment it returned. */
    const double t_detect = t1;
    const char *err_name = dcomm_error_name(rc);
    fprintf(stderr, "recovery_probe: rank %d: iteration %ld failed: %s: %s\n", rank0, it, err_name,
            dcomm_last_error());
    if (mode == MODE_NONE || !dcomm_elastic_recoverable(rc)) return 1;
    rc = dcomm_elastic_recover();
    if (rc < 0) {
      fprintf(stderr, "recovery_probe: rank %d: dcomm_elastic_recover: %s\n", rank0, dcomm_last_error());
      return 1;
    }
    int size1 = dcomm_world_size();
    fill(buf, count, 1.0f);
    rc = dcomm_all_reduce(buf, count, DCOMM_FLOAT32, DCOMM_SUM, NULL);
    const double t_first_ok = wall();
    if (rc < 0) {
      fprintf(stderr, "recovery_probe: rank %d: first all_reduce of generation %ld: %s\n", rank0,
              dcomm_generation(), dcomm_last_error());
      return 1;
    }
    if (check_sum(buf, count, size1) < 0) {
      fprintf(stderr, "recovery_probe: rank %d: wrong result of the first all_reduce after recovery\n", rank0);
      return 1;
    }
    char name[96], line[256];
    snprintf(name, sizeof(name), "rank.%s", dcomm_member_id());
    snprintf(line, sizeof(line), "%d %.6f %.6f %s\n", rank0, t_detect, t_first_ok, err_name);
    fprintf(stderr, "recovery_probe: rank %d -> rank %d of %d, generation %ld, recovered %.3f s after detection\n",
            rank0, dcomm_rank(), size1, dcomm_generation(), t_first_ok - t_detect);
    if (write_file(out, name, line) < 0) return 1;
    dcomm_finalize();
    free(buf);
    free(times);
    return 0;
  }

  if (mode != MODE_NONE) {
    fprintf(stderr, "recovery_probe: rank %d: no failure seen in %ld iterations\n", rank0, iters);
    dcomm_finalize();
    return 1;
  }
  if (rank0 == 0) {
    long n = iters > warmup ? iters - warmup : iters;
    double *t = times + (iters - n), sum = 0;
    for (long i = 0; i < n; i++) sum += t[i];
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    double med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
    char line[256];
    snprintf(line, sizeof(line), "%.6f %.6f %.6f %.6f %ld %ld\n", med, sum / (double)n, t[0], t[n - 1], n, bytes);
    if (write_file(out, "iter.time", line) < 0) return 1;
  }
  dcomm_finalize();
  free(buf);
  free(times);
  return 0;
}
