/*
 * dcomm_bench.c: dcomm-bench, the collective bandwidth benchmark of dcomm,
 * in the style of nccl-tests. For each message size from -b to -e (times
 * -f each step) it runs one collective -w times to warm up and -n times
 * timed, and rank 0 prints one row:
 *
 *   size count type time_us algbw_GBps busbw_GBps errors
 *
 * size is the bytes of the per-rank buffer as nccl-tests define it (the
 * whole buffer for all_reduce and broadcast, the gathered output for
 * all_gather, the input for reduce_scatter and all_to_all), count is the
 * count passed to the call, time is the average per iteration of the
 * slowest rank, algbw = size / time and busbw = algbw times nccl-tests'
 * factor for the op. errors is the number of wrong elements over all ranks
 * after one checked run against a reference computed locally from the
 * deterministic, integer-valued input pattern (so sums are exact).
 *
 * It uses only the public API (dcomm.h) and the C library, and joins the
 * job through dcomm_init(NULL, NULL), e.g. under dcomm-run:
 *
 *   ./dcomm-run --nproc-per-node 4 -- ./dcomm-bench -o all_reduce -b 8 -e 64M -f 4
 *
 * Exit status: 0 success, 1 a dcomm call failed or a result was wrong,
 * 2 a usage error. See dcomm-bench(1).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dcomm.h"

enum bench_op { OP_ALL_REDUCE, OP_ALL_GATHER, OP_BROADCAST, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_BARRIER, OP_COUNT };

static const char *const op_names[OP_COUNT] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all",
                                               "barrier"};

static const struct {
  const char *name;
  dcomm_dtype_t dt;
  double exact; /* largest integer every value and sum must stay below */
} dtypes[] = {
    {"int8", DCOMM_INT8, 127},           {"uint8", DCOMM_UINT8, 255},
    {"int32", DCOMM_INT32, 2147483647.0}, {"uint32", DCOMM_UINT32, 4294967295.0},
    {"int64", DCOMM_INT64, 9.0e15},      {"uint64", DCOMM_UINT64, 9.0e15},
    {"float16", DCOMM_FLOAT16, 2048},    {"bfloat16", DCOMM_BFLOAT16, 256},
    {"float32", DCOMM_FLOAT32, 16777216}, {"float64", DCOMM_FLOAT64, 9.0e15},
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

/* Other spellings accepted by -d. */
static const struct {
  const char *alias, *name;
} dtype_aliases[] = {{"char", "int8"},    {"int", "int32"},    {"float", "float32"}, {"double", "float64"},
                     {"half", "float16"}, {"fp16", "float16"}, {"bf16", "bfloat16"}, {"fp32", "float32"},
                     {"fp64", "float64"}};

struct opts {
  int op;
  size_t dti; /* index into dtypes */
  size_t minb, maxb, factor;
  long iters, warmup, group, check;
};

static int my_rank_env = -1; /* RANK from the launcher, for usage errors before init */

static const char synopsis[] =
    "usage: dcomm-bench [-o OP] [-b MIN] [-e MAX] [-f FACTOR] [-d DTYPE] [-n ITERS] [-w WARMUP]\n"
    "                   [-g GROUP-SIZE] [-c 0|1] [-h]\n";

static void usage(FILE *f) {
  fputs(synopsis, f);
  fprintf(f,
          "  -o OP      all_reduce (default), all_gather, broadcast, reduce_scatter, all_to_all, barrier\n"
          "  -b MIN     smallest size in bytes, K/M/G suffixes (default 8)\n"
          "  -e MAX     largest size in bytes (default 8M)\n"
          "  -f FACTOR  multiply the size by FACTOR each step (default 2)\n"
          "  -d DTYPE   int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 (default) float64\n"
          "  -n ITERS   timed iterations per size (default 20)\n"
          "  -w WARMUP  untimed iterations per size (default 5)\n"
          "  -g SIZE    run on sub-groups of SIZE consecutive ranks (default: the whole world)\n"
          "  -c 0|1     check the results (default 1)\n"
          "  -h         this text\n"
          "Run it under a launcher that sets the env:// variables, e.g.\n"
          "  dcomm-run --nproc-per-node 4 -- dcomm-bench -o all_reduce -b 8 -e 64M -f 4\n");
}

static void usage_error(const char *fmt, const char *arg) {
  if (my_rank_env <= 0) {
    fprintf(stderr, "dcomm-bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s(dcomm-bench -h for details)\n", synopsis);
  }
  exit(2);
}

/* Unsigned decimal with an optional K, M or G (powers of 1024) suffix. */
static int parse_size(const char *s, size_t *out) {
  if (!s || *s < '0' || *s > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  if (v > (SIZE_MAX >> shift)) return -1;
  *out = (size_t)v << shift;
  return 0;
}

static long parse_long(const char *s, const char *flag, long min) {
  if (!s || *s < '0' || *s > '9') usage_error("%s needs a non-negative integer", flag);
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < min || v > 1000000000L) usage_error("bad value for %s", flag);
  return v;
}

static void parse_args(int argc, char **argv, struct opts *o) {
  *o = (struct opts){.op = OP_ALL_REDUCE, .dti = 8, .minb = 8, .maxb = 8u << 20, .factor = 2,
                     .iters = 20, .warmup = 5, .group = 0, .check = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      if (my_rank_env <= 0) usage(stdout);
      exit(0);
    }
    if (a[0] != '-' || !a[1] || a[2]) usage_error("unknown argument '%s'", a);
    if (i + 1 >= argc) usage_error("%s needs a value", a);
    const char *v = argv[++i];
    switch (a[1]) {
      case 'o': {
        int k;
        for (k = 0; k < OP_COUNT && strcmp(v, op_names[k]); k++) {
        }
        if (k == OP_COUNT) usage_error("unknown operation '%s' (-o)", v);
        o->op = k;
        break;
      }
      case 'd': {
        const char *name = v;
        for (size_t k = 0; k < sizeof(dtype_aliases) / sizeof(dtype_aliases[0]); k++)
          if (!strcmp(v, dtype_aliases[k].alias)) name = dtype_aliases[k].name;
        size_t k;
        for (k = 0; k < NDTYPES && strcmp(name, dtypes[k].name); k++) {
        }
        if (k == NDTYPES) usage_error("unknown dtype '%s' (-d)", v);
        o->dti = k;
        break;
      }
      case 'b':
        if (parse_size(v, &o->minb) < 0 || o->minb == 0) usage_error("bad size '%s' for -b (bytes >= 1, K/M/G)", v);
        break;
      case 'e':
        if (parse_size(v, &o->maxb) < 0 || o->maxb == 0) usage_error("bad size '%s' for -e (bytes >= 1, K/M/G)", v);
        break;
      case 'f':
        if (parse_size(v, &o->factor) < 0 || o->factor < 1) usage_error("bad factor '%s' for -f", v);
        break;
      case 'n': o->iters = parse_long(v, "-n", 1); break;
      case 'w': o->warmup = parse_long(v, "-w", 0); break;
      case 'g': o->group = parse_long(v, "-g", 1); break;
      case 'c':
        o->check = parse_long(v, "-c", 0);
        if (o->check > 1) usage_error("-c takes 0 or 1, not %s", v);
        break;
      default: usage_error("unknown option '%s'", a);
    }
  }
  if (o->minb > o->maxb) usage_error("%s", "-b is larger than -e");
  if (o->factor == 1 && o->minb != o->maxb) usage_error("%s", "-f 1 needs -b equal to -e");
}

static void die(const char *what, int rc) {
  fprintf(stderr, "dcomm-bench: rank %d: %s failed: %s (%s)\n", dcomm_rank(), what, dcomm_last_error(),
          dcomm_error_name(rc));
  exit(1);
}

#define CHECK(call)                        \
  do {                                     \
    int rc__ = (call);                     \
    if (rc__ < 0) die(#call, rc__);        \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- element access for every dtype (values are small integers) --- */

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  uint32_t sign = (x >> 16) & 0x8000u, m = x & 0x7fffffu;
  int be = (int)((x >> 23) & 0xff);
  if (be == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0));
  int e = be - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal half or zero */
    if (e < -10) return (uint16_t)sign;
    m |= 0x800000u;
    unsigned shift = (unsigned)(14 - e);
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry may round up to inf: right */
  return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  float m = (float)(h & 0x3ff), v;
  if (e == 0) v = ldexpf(m, -24);
  else if (e == 31) v = (h & 0x3ff) ? NAN : INFINITY;
  else v = ldexpf(m + 1024.0f, e - 25);
  return (h & 0x8000) ? -v : v;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, sizeof(f));
  return f;
}

static void put(dcomm_dtype_t dt, void *buf, size_t i, double v) {
  switch (dt) {
    case DCOMM_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DCOMM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DCOMM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DCOMM_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case DCOMM_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DCOMM_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case DCOMM_FLOAT16: ((uint16_t *)buf)[i] = f32_to_f16((float)v); break;
    case DCOMM_BFLOAT16: ((uint16_t *)buf)[i] = f32_to_bf16((float)v); break;
    case DCOMM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DCOMM_FLOAT64: ((double *)buf)[i] = v; break;
    default: break;
  }
}

static double get(dcomm_dtype_t dt, const void *buf, size_t i) {
  switch (dt) {
    case DCOMM_INT8: return ((const int8_t *)buf)[i];
    case DCOMM_UINT8: return ((const uint8_t *)buf)[i];
    case DCOMM_INT32: return ((const int32_t *)buf)[i];
    case DCOMM_UINT32: return ((const uint32_t *)buf)[i];
    case DCOMM_INT64: return (double)((const int64_t *)buf)[i];
    case DCOMM_UINT64: return (double)((const uint64_t *)buf)[i];
    case DCOMM_FLOAT16: return f16_to_f32(((const uint16_t *)buf)[i]);
    case DCOMM_BFLOAT16: return bf16_to_f32(((const uint16_t *)buf)[i]);
    case DCOMM_FLOAT32: return ((const float *)buf)[i];
    case DCOMM_FLOAT64: return ((const double *)buf)[i];
    default: return NAN;
  }
}

/* The input pattern: element k of group rank r's buffer. Values lie in
 * [0, mod) with mod * group size below the dtype's exact-integer limit, so
 * every sum is exact and no integer type overflows. */
static uint64_t pat_mod = 1;
static double pat(int r, size_t k) { return (double)(((uint64_t)k * 7u + (uint64_t)r * 13u + 1u) % pat_mod); }

static void fill(dcomm_dtype_t dt, void *buf, size_t n, int r, size_t k0) {
  for (size_t i = 0; i < n; i++) put(dt, buf, i, pat(r, k0 + i));
}

/* Sum over the n ranks of element k, as the reduction computes it. */
static double sum_pat(int n, size_t k) {
  double s = 0;
  for (int r = 0; r < n; r++) s += pat(r, k);
  return s;
}

struct run {
  int op;
  dcomm_dtype_t dt;
  size_t es, count; /* count: what the call takes */
  int grank, gsize;
  dcomm_group_t g;
  void *sbuf, *rbuf;
};

static int run_once(const struct run *x) {
  switch (x->op) {
    case OP_ALL_REDUCE: return dcomm_all_reduce(x->rbuf, x->count, x->dt, DCOMM_SUM, x->g);
    case OP_ALL_GATHER: return dcomm_all_gather(x->sbuf, x->rbuf, x->count, x->dt, x->g);
    case OP_BROADCAST: return dcomm_broadcast(x->rbuf, x->count, x->dt, 0, x->g);
    case OP_REDUCE_SCATTER: return dcomm_reduce_scatter(x->sbuf, x->rbuf, x->count, x->dt, DCOMM_SUM, x->g);
    case OP_ALL_TO_ALL: return dcomm_all_to_all(x->sbuf, x->rbuf, x->count, x->dt, x->g);
    case OP_BARRIER: return dcomm_barrier(x->g);
    default: return DCOMM_EINVAL;
  }
}

/* Fills the inputs from the pattern (the result buffer with this rank's
 * values too, so a collective that does not write it is caught). */
static void prepare(const struct run *x) {
  size_t c = x->count, n = (size_t)x->gsize;
  switch (x->op) {
    case OP_ALL_REDUCE:
    case OP_BROADCAST: fill(x->dt, x->rbuf, c, x->grank, 0); break;
    case OP_ALL_GATHER:
      fill(x->dt, x->sbuf, c, x->grank, 0);
      fill(x->dt, x->rbuf, c * n, x->grank, c);
      break;
    case OP_REDUCE_SCATTER:
      fill(x->dt, x->sbuf, c * n, x->grank, 0);
      fill(x->dt, x->rbuf, c, x->grank, 1);
      break;
    case OP_ALL_TO_ALL:
      fill(x->dt, x->sbuf, c * n, x->grank, 0);
      fill(x->dt, x->rbuf, c * n, x->grank, 1);
      break;
    default: break;
  }
}

/* Wrong elements of this rank's result. */
static uint64_t verify(const struct run *x) {
  size_t c = x->count, n = (size_t)x->gsize;
  int me = x->grank;
  uint64_t bad = 0;
  switch (x->op) {
    case OP_ALL_REDUCE:
      for (size_t i = 0; i < c; i++) bad += get(x->dt, x->rbuf, i) != sum_pat(x->gsize, i);
      break;
    case OP_BROADCAST:
      for (size_t i = 0; i < c; i++) bad += get(x->dt, x->rbuf, i) != pat(0, i);
      break;
    case OP_ALL_GATHER:
      for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < c; i++) bad += get(x->dt, x->rbuf, j * c + i) != pat((int)j, i);
      break;
    case OP_REDUCE_SCATTER:
      for (size_t i = 0; i < c; i++) bad += get(x->dt, x->rbuf, i) != sum_pat(x->gsize, (size_t)me * c + i);
      break;
    case OP_ALL_TO_ALL:
      for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < c; i++) bad += get(x->dt, x->rbuf, j * c + i) != pat((int)j, (size_t)me * c + i);
      break;
    default: break;
  }
  return bad;
}

/* nccl-tests' bus bandwidth factor. */
static double bus_factor(int op, int n) {
  switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case OP_ALL_GATHER:
    case OP_REDUCE_SCATTER:
    case OP_ALL_TO_ALL: return (double)(n - 1) / n;
    case OP_BROADCAST: return 1.0;
    default: return 0.0;
  }
}

/* Element count of the call and the reported size for a requested size. */
static void shape(int op, size_t bytes, size_t es, int n, size_t *count, size_t *size) {
  size_t elems = bytes / es;
  switch (op) {
    case OP_ALL_REDUCE:
    case OP_BROADCAST: *count = elems; *size = elems * es; break;
    case OP_ALL_GATHER:
    case OP_REDUCE_SCATTER:
    case OP_ALL_TO_ALL: *count = elems / (size_t)n; *size = *count * (size_t)n * es; break;
    default: *count = 0; *size = 0; break;
  }
}

int main(int argc, char **argv) {
  const char *re = getenv("RANK");
  if (re && *re) my_rank_env = atoi(re);
  struct opts o;
  parse_args(argc, argv, &o);
  const char *ws = getenv("WORLD_SIZE");
  if (ws && atoi(ws) > 0 && o.group && (o.group > atoi(ws) || atoi(ws) % o.group)) {
    if (my_rank_env <= 0) fprintf(stderr, "dcomm-bench: -g %ld must divide the world size %s\n", o.group, ws);
    return 2;
  }
  dcomm_dtype_t dt = dtypes[o.dti].dt;
  size_t es = dcomm_dtype_size(dt);

  /* Wall-clock (one clock for every rank of a host) around dcomm_init. */
  struct timespec t_in, t_out;
  clock_gettime(CLOCK_REALTIME, &t_in);
  CHECK(dcomm_init(NULL, NULL));
  clock_gettime(CLOCK_REALTIME, &t_out);
  double t_enter = (double)t_in.tv_sec + t_in.tv_nsec * 1e-9, t_exit = (double)t_out.tv_sec + t_out.tv_nsec * 1e-9;
  double init_t[3] = {t_exit - t_enter, -t_enter, t_exit}; /* max of each: slowest, first entry, last exit */
  CHECK(dcomm_all_reduce(init_t, 3, DCOMM_FLOAT64, DCOMM_MAX, NULL));
  int wrank = dcomm_rank(), wsize = dcomm_world_size();
  int G = o.group ? (int)o.group : wsize;
  if (G > wsize || wsize % G) {
    if (wrank == 0)
      fprintf(stderr, "dcomm-bench: -g %d must divide the world size %d\n", G, wsize);
    dcomm_finalize();
    return 2;
  }
  struct run x = {.op = o.op, .dt = dt, .es = es};
  if (G == wsize) {
    x.g = NULL;
  } else {
    CHECK(dcomm_group_split(NULL, wrank / G, wrank, &x.g));
  }
  x.grank = dcomm_group_rank(x.g);
  x.gsize = dcomm_group_size(x.g);
  if (x.grank < 0) die("dcomm_group_rank", x.grank);

  double lim = dtypes[o.dti].exact / x.gsize;
  pat_mod = lim >= 1021 ? 1021 : lim >= 1 ? (uint64_t)lim : 1;

  /* Buffers for the largest size. */
  size_t maxcount = 0, maxsize = 0, sbytes = 0, rbytes = 0;
  shape(o.op, o.maxb, es, x.gsize, &maxcount, &maxsize);
  switch (o.op) {
    case OP_ALL_REDUCE: case OP_BROADCAST: rbytes = maxsize; break;
    case OP_ALL_GATHER: sbytes = maxcount * es; rbytes = maxsize; break;
    case OP_REDUCE_SCATTER: sbytes = maxsize; rbytes = maxcount * es; break;
    case OP_ALL_TO_ALL: sbytes = rbytes = maxsize; break;
    default: break;
  }
  x.sbuf = malloc(sbytes ? sbytes : 1);
  x.rbuf = malloc(rbytes ? rbytes : 1);
  if (!x.sbuf || !x.rbuf) {
    fprintf(stderr, "dcomm-bench: rank %d: cannot allocate %zu + %zu bytes\n", wrank, sbytes, rbytes);
    return 1;
  }

  if (wrank == 0) {
    const char *algo = getenv("DCOMM_ALGO"), *thr = getenv("DCOMM_TCP_SMALL_THRESHOLD"), *tr = getenv("DCOMM_TRANSPORT");
    printf("# dcomm-bench (dcomm %s, backend %s)\n", dcomm_version_string(), dcomm_backend_name());
    printf("# op %s  dtype %s  redop %s  world size %d  group size %d (%d group%s)  iters %ld  warmup %ld  check %ld\n",
           op_names[o.op], dtypes[o.dti].name, (o.op == OP_ALL_REDUCE || o.op == OP_REDUCE_SCATTER) ? "sum" : "none",
           wsize, x.gsize, wsize / x.gsize, wsize / x.gsize == 1 ? "" : "s", o.iters, o.warmup, o.check);
    if ((algo && *algo) || (thr && *thr) || (tr && *tr))
      printf("# DCOMM_ALGO=%s DCOMM_TCP_SMALL_THRESHOLD=%s DCOMM_TRANSPORT=%s\n", algo ? algo : "", thr ? thr : "",
             tr ? tr : "");
    printf("# dcomm_init: slowest rank %.1f ms; first call to last return %.1f ms\n", init_t[0] * 1e3,
           (init_t[2] + init_t[1]) * 1e3);
    printf("#%11s %13s %9s %12s %11s %11s %7s\n", "size", "count", "type", "time_us", "algbw_GBps", "busbw_GBps",
           "errors");
    fflush(stdout);
  }

  uint64_t total_errors = 0;
  double busbw_sum = 0;
  int rows = 0;
  size_t prev_size = (size_t)-1;
  for (size_t b = o.minb;;) {
    size_t size = 0;
    shape(o.op, b, es, x.gsize, &x.count, &size);
    int skip = o.op != OP_BARRIER && x.count == 0;
    if (o.op == OP_BARRIER && rows > 0) break; /* sizes mean nothing to a barrier */
    if (skip || size == prev_size) {
      if (wrank == 0 && skip)
        printf("# %zu bytes: less than one element per rank, skipped\n", b);
    } else {
      prev_size = size;
      char errs[24] = "N/A";
      if (o.check) {
        prepare(&x);
        CHECK(run_once(&x));
        int64_t bad = (int64_t)verify(&x);
        CHECK(dcomm_all_reduce(&bad, 1, DCOMM_INT64, DCOMM_SUM, NULL));
        total_errors += (uint64_t)bad;
        snprintf(errs, sizeof(errs), "%lld", (long long)bad);
      } else {
        prepare(&x);
      }
      for (long i = 0; i < o.warmup; i++) CHECK(run_once(&x));
      CHECK(dcomm_barrier(NULL));
      double t0 = now_s();
      for (long i = 0; i < o.iters; i++) CHECK(run_once(&x));
      double t = (now_s() - t0) / (double)o.iters;
      CHECK(dcomm_all_reduce(&t, 1, DCOMM_FLOAT64, DCOMM_MAX, NULL));
      double algbw = (double)size / t / 1e9, busbw = algbw * bus_factor(o.op, x.gsize);
      busbw_sum += busbw;
      rows++;
      if (wrank == 0) {
        printf("%12zu %13zu %9s %12.2f %11.4f %11.4f %7s\n", size, x.count, dtypes[o.dti].name, t * 1e6, algbw, busbw,
               errs);
        fflush(stdout);
      }
    }
    if (b >= o.maxb || o.factor == 1) break;
    b = b > o.maxb / o.factor ? o.maxb : b * o.factor; /* the last step is MAX itself */
  }
  if (wrank == 0) {
    if (rows && o.op != OP_BARRIER) printf("# avg busbw_GBps: %.4f\n", busbw_sum / rows);
    printf("# wrong elements: %llu%s\n", (unsigned long long)total_errors,
           o.check ? (total_errors ? "  FAILED" : "") : " (not checked)");
    fflush(stdout);
  }
  if (x.g) CHECK(dcomm_group_free(x.g));
  free(x.sbuf);
  free(x.rbuf);
  CHECK(dcomm_finalize());
  return total_errors ? 1 : 0;
}
