/*
 * bench_util.c: the part dcomm-bench (tools/dcomm_bench.c) and its MPI twin
 * (tests/perf/mpi_bench.c) share: option parsing, size steps, the input
 * pattern and its check, bus bandwidth and the output rows; and the dtype
 * element access the tests use too. No libdcomm or MPI call: see
 * bench_util.h.
 */
#include "bench_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- element access for every dtype --- */

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

void bench_put(void *buf, dcomm_dtype_t dt, size_t i, double v) {
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

double bench_get(const void *buf, dcomm_dtype_t dt, size_t i) {
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

/* --- options --- */

const char *const bench_op_names[OP_COUNT] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all",
                                              "barrier"};

/* In dcomm_dtype_t order: bench_dtypes[dt].dt == dt. */
const struct bench_dtype bench_dtypes[DCOMM_DTYPE_COUNT] = {
    {"int8", DCOMM_INT8, 1, 127},           {"uint8", DCOMM_UINT8, 1, 255},
    {"int32", DCOMM_INT32, 4, 2147483647.0}, {"uint32", DCOMM_UINT32, 4, 4294967295.0},
    {"int64", DCOMM_INT64, 8, 9.0e15},      {"uint64", DCOMM_UINT64, 8, 9.0e15},
    {"float16", DCOMM_FLOAT16, 2, 2048},    {"bfloat16", DCOMM_BFLOAT16, 2, 256},
    {"float32", DCOMM_FLOAT32, 4, 16777216}, {"float64", DCOMM_FLOAT64, 8, 9.0e15},
};

/* Other spellings accepted by -d. */
static const struct {
  const char *alias, *name;
} dtype_aliases[] = {{"char", "int8"},    {"int", "int32"},    {"float", "float32"}, {"double", "float64"},
                     {"half", "float16"}, {"fp16", "float16"}, {"bf16", "bfloat16"}, {"fp32", "float32"},
                     {"fp64", "float64"}};

static const struct bench_prog *prog; /* set by bench_parse_args */

static void synopsis(FILE *f) {
  fprintf(f, "usage: %s [-o OP] [-b MIN] [-e MAX] [-f FACTOR] [-d DTYPE] [-n ITERS] [-w WARMUP]\n", prog->name);
  fprintf(f, "%*s[-g GROUP-SIZE] [-c 0|1] [-h]\n", (int)strlen(prog->name) + 8, "");
}

static void usage(FILE *f) {
  synopsis(f);
  fprintf(f,
          "  -o OP      all_reduce (default), all_gather, broadcast, reduce_scatter, all_to_all, barrier\n"
          "  -b MIN     smallest size in bytes, K/M/G suffixes (default 8)\n"
          "  -e MAX     largest size in bytes (default 8M)\n"
          "  -f FACTOR  multiply the size by FACTOR each step (default 2)\n"
          "  -d DTYPE   %s\n"
          "  -n ITERS   timed iterations per size (default 20)\n"
          "  -w WARMUP  untimed iterations per size (default 5)\n"
          "  -g SIZE    run on sub-groups of SIZE consecutive ranks (default: the whole world)\n"
          "  -c 0|1     check the results (default 1)\n"
          "  -h         this text\n"
          "%s",
          prog->dtypes, prog->run_hint);
}

void bench_usage_error(const char *fmt, const char *arg) {
  if (prog->rank_env <= 0) {
    fprintf(stderr, "%s: ", prog->name);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    synopsis(stderr);
    fprintf(stderr, "(%s -h for details)\n", prog->name);
  }
  exit(2);
}

/* Unsigned decimal with an optional K, M or G (powers of 1024) suffix. */
int bench_parse_size(const char *s, size_t *out) {
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
  if (!s || *s < '0' || *s > '9') bench_usage_error("%s needs a non-negative integer", flag);
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < min || v > 1000000000L) bench_usage_error("bad value for %s", flag);
  return v;
}

void bench_parse_args(const struct bench_prog *p, int argc, char **argv, struct bench_opts *o) {
  prog = p;
  *o = (struct bench_opts){.op = OP_ALL_REDUCE, .dti = DCOMM_FLOAT32, .minb = 8, .maxb = 8u << 20, .factor = 2,
                           .iters = 20, .warmup = 16, .group = 0, .check = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      if (p->rank_env <= 0) usage(stdout);
      exit(0);
    }
    if (a[0] != '-' || !a[1] || a[2]) bench_usage_error("unknown argument '%s'", a);
    if (i + 1 >= argc) bench_usage_error("%s needs a value", a);
    const char *v = argv[++i];
    switch (a[1]) {
      case 'o': {
        int k;
        for (k = 0; k < OP_COUNT && strcmp(v, bench_op_names[k]); k++) {
        }
        if (k == OP_COUNT) bench_usage_error("unknown operation '%s' (-o)", v);
        o->op = k;
        break;
      }
      case 'd': {
        const char *name = v;
        for (size_t k = 0; k < sizeof(dtype_aliases) / sizeof(dtype_aliases[0]); k++)
          if (!strcmp(v, dtype_aliases[k].alias)) name = dtype_aliases[k].name;
        size_t k;
        for (k = 0; k < DCOMM_DTYPE_COUNT && strcmp(name, bench_dtypes[k].name); k++) {
        }
        if (k == DCOMM_DTYPE_COUNT) bench_usage_error("unknown dtype '%s' (-d)", v);
        o->dti = k;
        break;
      }
      case 'b':
        if (bench_parse_size(v, &o->minb) < 0 || o->minb == 0) bench_usage_error("bad size '%s' for -b (bytes >= 1, K/M/G)", v);
        break;
      case 'e':
        if (bench_parse_size(v, &o->maxb) < 0 || o->maxb == 0) bench_usage_error("bad size '%s' for -e (bytes >= 1, K/M/G)", v);
        break;
      case 'f':
        if (bench_parse_size(v, &o->factor) < 0 || o->factor < 1) bench_usage_error("bad factor '%s' for -f", v);
        break;
      case 'n': o->iters = parse_long(v, "-n", 1); break;
      case 'w': o->warmup = parse_long(v, "-w", 0); break;
      case 'g': o->group = parse_long(v, "-g", 1); break;
      case 'c':
        o->check = parse_long(v, "-c", 0);
        if (o->check > 1) bench_usage_error("-c takes 0 or 1, not %s", v);
        break;
      default: bench_usage_error("unknown option '%s'", a);
    }
  }
  if (o->minb > o->maxb) bench_usage_error("%s", "-b is larger than -e");
  if (o->factor == 1 && o->minb != o->maxb) bench_usage_error("%s", "-f 1 needs -b equal to -e");
}

/* --- the checked input pattern --- */

/* Element k of group rank r's buffer. Values lie in [0, mod) with mod *
 * group size below the dtype's exact-integer limit, so every sum is exact
 * and no integer type overflows. */
static uint64_t pat_mod = 1;
static double pat(int r, size_t k) { return (double)(((uint64_t)k * 7u + (uint64_t)r * 13u + 1u) % pat_mod); }

static void fill(dcomm_dtype_t dt, void *buf, size_t n, int r, size_t k0) {
  for (size_t i = 0; i < n; i++) bench_put(buf, dt, i, pat(r, k0 + i));
}

/* Sum over the n ranks of element k, as the reduction computes it. */
static double sum_pat(int n, size_t k) {
  double s = 0;
  for (int r = 0; r < n; r++) s += pat(r, k);
  return s;
}

/* Fills the inputs from the pattern (the result buffer with this rank's
 * values too, so a collective that does not write it is caught). */
static void prepare(const struct bench_run *x) {
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
static uint64_t verify(const struct bench_run *x) {
  size_t c = x->count, n = (size_t)x->gsize;
  int me = x->grank;
  uint64_t bad = 0;
  switch (x->op) {
    case OP_ALL_REDUCE:
      for (size_t i = 0; i < c; i++) bad += bench_get(x->rbuf, x->dt, i) != sum_pat(x->gsize, i);
      break;
    case OP_BROADCAST:
      for (size_t i = 0; i < c; i++) bad += bench_get(x->rbuf, x->dt, i) != pat(0, i);
      break;
    case OP_ALL_GATHER:
      for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < c; i++) bad += bench_get(x->rbuf, x->dt, j * c + i) != pat((int)j, i);
      break;
    case OP_REDUCE_SCATTER:
      for (size_t i = 0; i < c; i++) bad += bench_get(x->rbuf, x->dt, i) != sum_pat(x->gsize, (size_t)me * c + i);
      break;
    case OP_ALL_TO_ALL:
      for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < c; i++) bad += bench_get(x->rbuf, x->dt, j * c + i) != pat((int)j, (size_t)me * c + i);
      break;
    default: break;
  }
  return bad;
}

/* --- sizes, bandwidth, rows --- */

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

void bench_run_bytes(const struct bench_run *x, size_t *sbytes, size_t *rbytes) {
  size_t one = x->count * x->es, all = one * (size_t)x->gsize;
  *sbytes = *rbytes = 0;
  switch (x->op) {
    case OP_ALL_REDUCE: case OP_BROADCAST: *rbytes = one; break;
    case OP_ALL_GATHER: *sbytes = one; *rbytes = all; break;
    case OP_REDUCE_SCATTER: *sbytes = all; *rbytes = one; break;
    case OP_ALL_TO_ALL: *sbytes = *rbytes = all; break;
    default: break;
  }
}

void bench_buffer_bytes(const struct bench_opts *o, size_t es, int n, size_t *maxcount, size_t *sbytes, size_t *rbytes) {
  size_t maxsize = 0;
  *maxcount = 0;
  shape(o->op, o->maxb, es, n, maxcount, &maxsize);
  const struct bench_run largest = {.op = o->op, .es = es, .count = *maxcount, .gsize = n};
  bench_run_bytes(&largest, sbytes, rbytes);
}

void bench_print_config(const struct bench_opts *o, int wsize, int gsize) {
  printf("# op %s  dtype %s  redop %s  world size %d  group size %d (%d group%s)  iters %ld  warmup %ld  check %ld\n",
         bench_op_names[o->op], bench_dtypes[o->dti].name,
         (o->op == OP_ALL_REDUCE || o->op == OP_REDUCE_SCATTER) ? "sum" : "none", wsize, gsize, wsize / gsize,
         wsize / gsize == 1 ? "" : "s", o->iters, o->warmup, o->check);
}

void bench_print_columns(void) {
  printf("#%11s %13s %9s %12s %11s %11s %7s\n", "size", "count", "type", "time_us", "algbw_GBps", "busbw_GBps",
         "errors");
  fflush(stdout);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t bench_loop(const struct bench_opts *o, struct bench_run *x, const struct bench_comm *c, int print) {
  double lim = bench_dtypes[o->dti].exact / x->gsize;
  pat_mod = lim >= 1021 ? 1021 : lim >= 1 ? (uint64_t)lim : 1;
  uint64_t total_errors = 0;
  double busbw_sum = 0;
  int rows = 0;
  size_t prev_size = (size_t)-1;
  for (size_t b = o->minb;;) {
    size_t size = 0;
    shape(o->op, b, x->es, x->gsize, &x->count, &size);
    int skip = o->op != OP_BARRIER && x->count == 0;
    if (o->op == OP_BARRIER && rows > 0) break; /* sizes mean nothing to a barrier */
    if (skip || size == prev_size) {
      if (print && skip) printf("# %zu bytes: less than one element per rank, skipped\n", b);
    } else {
      prev_size = size;
      char errs[24] = "N/A";
      prepare(x);
      if (c->upload) c->upload(c->ctx, x);
      if (o->check) {
        c->run_once(c->ctx, x);
        if (c->download) c->download(c->ctx, x);
        int64_t bad = c->sum_world(c->ctx, (int64_t)verify(x));
        total_errors += (uint64_t)bad;
        snprintf(errs, sizeof(errs), "%lld", (long long)bad);
      }
      for (long i = 0; i < o->warmup; i++) c->run_once(c->ctx, x);
      c->barrier_world(c->ctx);
      double t0 = now_s();
      for (long i = 0; i < o->iters; i++) c->run_once(c->ctx, x);
      double t = c->max_world(c->ctx, (now_s() - t0) / (double)o->iters);
      double algbw = (double)size / t / 1e9, busbw = algbw * bus_factor(o->op, x->gsize);
      busbw_sum += busbw;
      rows++;
      if (print) {
        printf("%12zu %13zu %9s %12.2f %11.4f %11.4f %7s\n", size, x->count, bench_dtypes[o->dti].name, t * 1e6, algbw,
               busbw, errs);
        fflush(stdout);
      }
    }
    if (b >= o->maxb || o->factor == 1) break;
    b = b > o->maxb / o->factor ? o->maxb : b * o->factor; /* the last step is MAX itself */
  }
  if (print) {
    if (rows && o->op != OP_BARRIER) printf("# avg busbw_GBps: %.4f\n", busbw_sum / rows);
    printf("# wrong elements: %llu%s\n", (unsigned long long)total_errors,
           o->check ? (total_errors ? "  FAILED" : "") : " (not checked)");
    fflush(stdout);
  }
  return total_errors;
}
