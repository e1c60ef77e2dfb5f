/*
 * check_reduce.c: unit tests for the reduction kernels and datatype facts in
 * src/reduce.c. Every dtype x op is compared with a plain scalar reference
 * on random data; the float16 / bfloat16 conversions are checked against an
 * independent reference built on double arithmetic, exhaustively where the
 * input space allows it.
 */
#include "config.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "reduce.h"

/*
 * Test hook in reduce.c (not in reduce.h): 0 forces the portable float16
 * conversion loops where the F16C ones would be used. Returns whether the
 * hardware path is in use.
 */
int dcomm__reduce_hw_convert(int enable);

/* Deterministic xorshift64* generator, so that a failure can be replayed. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static int half_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
static int bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

/* Reference binary16 decoding, straight from the definition of the format. */
static float ref_half_to_float(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0x1f) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp(m, -24);
  else v = ldexp(m + 1024, e - 25);
  return (float)((h & 0x8000) ? -v : v);
}

/*
 * Reference rounding of a float to a format with `mbits` stored mantissa
 * bits and minimum normal exponent `emin`, to nearest-even, in double: the
 * float is divided by the unit in the last place at its exponent (exact, a
 * power of two), rounded with nearbyint and re-encoded. The result is the
 * encoding without the sign; `inf` is the encoding of infinity.
 */
static uint32_t ref_round(float f, int mbits, int emin, uint32_t inf) {
  double a = fabs((double)f);
  if (a == 0) return 0;
  int ex;
  frexp(a, &ex);
  int e = ex - 1 < emin ? emin : ex - 1;
  double q = nearbyint(ldexp(a, mbits - e));
  uint32_t bits;
  if (a < ldexp(1.0, emin)) bits = (uint32_t)q; /* subnormal; may carry into the first normal */
  else bits = ((uint32_t)(e - emin + 1) << mbits) + (uint32_t)q - (1u << mbits);
  return bits >= inf ? inf : bits;
}

static uint16_t ref_float_to_half(float f) {
  if (isnan(f)) return 0x7e00;
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isinf(f)) return sign | 0x7c00;
  return (uint16_t)(sign | ref_round(f, 10, -14, 0x7c00));
}

static uint16_t ref_float_to_bf16(float f) {
  if (isnan(f)) return 0x7fc0;
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isinf(f)) return sign | 0x7f80;
  return (uint16_t)(sign | ref_round(f, 7, -126, 0x7f80));
}

/*
 * Check reports every passing ck_assert to the parent process in fork mode,
 * which costs a system call, so the hot loops below test with a plain `if`
 * and only call into Check on failure.
 */
#define REQUIRE(cond, ...)                  \
  do {                                      \
    if (!(cond)) ck_abort_msg(__VA_ARGS__); \
  } while (0)

/* The conversion results agree: both NaN, or the same bits. */
static void check_half(uint16_t got, uint16_t want, const char *what, uint32_t input) {
  if (half_is_nan(want)) REQUIRE(half_is_nan(got), "%s(0x%08x): got 0x%04x, want NaN", what, input, got);
  else REQUIRE(got == want, "%s(0x%08x): got 0x%04x, want 0x%04x", what, input, got, want);
}

static void check_bf16(uint16_t got, uint16_t want, const char *what, uint32_t input) {
  if (bf16_is_nan(want)) REQUIRE(bf16_is_nan(got), "%s(0x%08x): got 0x%04x, want NaN", what, input, got);
  else REQUIRE(got == want, "%s(0x%08x): got 0x%04x, want 0x%04x", what, input, got, want);
}

/* Conversions. */

START_TEST(test_half_all_patterns) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float f = dcomm__half_to_float(h), r = ref_half_to_float(h);
    if (half_is_nan(h)) {
      REQUIRE(isnan(f), "half 0x%04x should decode to NaN", h);
      REQUIRE(half_is_nan(dcomm__float_to_half(f)), "half NaN 0x%04x did not stay NaN", h);
    } else {
      REQUIRE(f2u(f) == f2u(r), "half 0x%04x decoded to %a, want %a", h, f, r);
      uint16_t back = dcomm__float_to_half(f);
      REQUIRE(back == h, "half 0x%04x round-tripped to 0x%04x", h, back);
    }
  }
}
END_TEST

START_TEST(test_bf16_all_patterns) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t b = (uint16_t)i;
    float f = dcomm__bf16_to_float(b);
    REQUIRE(f2u(f) == i << 16, "bf16 0x%04x decoded to 0x%08x", b, f2u(f));
    uint16_t back = dcomm__float_to_bf16(f);
    if (bf16_is_nan(b)) REQUIRE(bf16_is_nan(back), "bf16 NaN 0x%04x did not stay NaN", b);
    else REQUIRE(back == b, "bf16 0x%04x round-tripped to 0x%04x", b, back);
  }
}
END_TEST

/*
 * Every midpoint between two adjacent finite halves is a tie and must round
 * to the even one; one float step either side must round to the nearer one.
 * The midpoints are exact floats (12 significant bits).
 */
START_TEST(test_half_ties_all) {
  for (uint32_t i = 0; i < 0x7bff; i++) {
    for (int neg = 0; neg < 2; neg++) {
      uint16_t lo = (uint16_t)(i | (neg ? 0x8000 : 0)), hi = (uint16_t)(lo + 1);
      float mid = (float)(((double)dcomm__half_to_float(lo) + (double)dcomm__half_to_float(hi)) / 2);
      uint16_t even = (lo & 1) ? hi : lo;
      check_half(dcomm__float_to_half(mid), even, "float_to_half(tie)", f2u(mid));
      float toward_lo = nextafterf(mid, dcomm__half_to_float(lo));
      float toward_hi = nextafterf(mid, dcomm__half_to_float(hi));
      check_half(dcomm__float_to_half(toward_lo), lo, "float_to_half(below tie)", f2u(toward_lo));
      check_half(dcomm__float_to_half(toward_hi), hi, "float_to_half(above tie)", f2u(toward_hi));
    }
  }
}
END_TEST

START_TEST(test_bf16_ties_all) {
  for (uint32_t i = 0; i < 0x7f7f; i++) {
    for (int neg = 0; neg < 2; neg++) {
      uint16_t lo = (uint16_t)(i | (neg ? 0x8000 : 0)), hi = (uint16_t)(lo + 1);
      float mid = (float)(((double)dcomm__bf16_to_float(lo) + (double)dcomm__bf16_to_float(hi)) / 2);
      uint16_t even = (lo & 1) ? hi : lo;
      check_bf16(dcomm__float_to_bf16(mid), even, "float_to_bf16(tie)", f2u(mid));
      float toward_lo = nextafterf(mid, dcomm__bf16_to_float(lo));
      float toward_hi = nextafterf(mid, dcomm__bf16_to_float(hi));
      check_bf16(dcomm__float_to_bf16(toward_lo), lo, "float_to_bf16(below tie)", f2u(toward_lo));
      check_bf16(dcomm__float_to_bf16(toward_hi), hi, "float_to_bf16(above tie)", f2u(toward_hi));
    }
  }
}
END_TEST

/* Random float bit patterns (every class: NaN, inf, subnormal, huge). */
START_TEST(test_conversions_random_floats) {
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = (uint32_t)rnd();
    /* Half the draws land near the binary16 range, where rounding matters. */
    if (i & 1) u = (u & 0x80ffffffu) | ((uint32_t)(96 + (u >> 24) % 52) << 23);
    float f = u2f(u);
    check_half(dcomm__float_to_half(f), ref_float_to_half(f), "float_to_half", u);
    check_bf16(dcomm__float_to_bf16(f), ref_float_to_bf16(f), "float_to_bf16", u);
  }
}
END_TEST

/* Hand-picked values: ties, overflow, subnormals, signed zero, NaN. */
START_TEST(test_conversions_chosen) {
  static const struct {
    float f;
    uint16_t half, bf16;
  } cases[] = {
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {1.0f, 0x3c00, 0x3f80},
      {-2.0f, 0xc000, 0xc000},
      {2049.0f, 0x6800, 0x4500},          /* half tie between 2048 and 2050: even is 2048 */
      {2051.0f, 0x6802, 0x4500},          /* half tie between 2050 and 2052: even is 2052 */
      {1.0f + 0x1p-11f, 0x3c00, 0x3f80},  /* half tie: rounds down to even 1.0 */
      {1.0f + 0x3p-11f, 0x3c02, 0x3f80},  /* half tie: rounds up to even */
      {1.0f + 0x1p-8f, 0x3c04, 0x3f80},   /* bf16 tie: rounds down to even 1.0 */
      {1.0f + 0x3p-8f, 0x3c0c, 0x3f82},   /* bf16 tie: rounds up to even */
      {65504.0f, 0x7bff, 0x4780},         /* largest finite half */
      {65519.0f, 0x7bff, 0x4780},         /* just below the overflow tie */
      {65520.0f, 0x7c00, 0x4780},         /* tie with 65536: even is infinity */
      {1e6f, 0x7c00, 0x4974},
      {-1e6f, 0xfc00, 0xc974},
      {FLT_MAX, 0x7c00, 0x7f80},          /* bf16 rounds up past its largest finite */
      {-FLT_MAX, 0xfc00, 0xff80},
      {INFINITY, 0x7c00, 0x7f80},
      {-INFINITY, 0xfc00, 0xff80},
      {0x1p-14f, 0x0400, 0x3880},         /* smallest normal half */
      {0x1p-24f, 0x0001, 0x3380},         /* smallest subnormal half */
      {0x1p-25f, 0x0000, 0x3300},         /* tie with 0: even is 0 */
      {0x3p-26f, 0x0001, 0x3340},         /* above the tie */
      {-0x1p-25f, 0x8000, 0xb300},
      {0x3p-25f, 0x0002, 0x33c0},         /* tie between 1 and 2 units: even is 2 */
      {0x3ffp-24f, 0x03ff, 0x3880},       /* largest subnormal half */
      {0x1p-133f, 0x0000, 0x0001},        /* smallest subnormal bf16 */
      {0x1p-134f, 0x0000, 0x0000},        /* bf16 tie with 0 */
      {0x3p-134f, 0x0000, 0x0002},        /* bf16 tie between 1 and 2 units */
      {0x1p-126f, 0x0000, 0x0080},        /* smallest normal bf16 */
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ck_assert_msg(dcomm__float_to_half(cases[i].f) == cases[i].half, "float_to_half(%a) = 0x%04x, want 0x%04x",
                  cases[i].f, dcomm__float_to_half(cases[i].f), cases[i].half);
    ck_assert_msg(dcomm__float_to_bf16(cases[i].f) == cases[i].bf16, "float_to_bf16(%a) = 0x%04x, want 0x%04x",
                  cases[i].f, dcomm__float_to_bf16(cases[i].f), cases[i].bf16);
  }
  ck_assert(half_is_nan(dcomm__float_to_half(NAN)));
  ck_assert(half_is_nan(dcomm__float_to_half(-NAN)));
  ck_assert(bf16_is_nan(dcomm__float_to_bf16(NAN)));
  ck_assert(bf16_is_nan(dcomm__float_to_bf16(-NAN)));
  /* A NaN whose payload sits only in the low bits must not become infinity. */
  ck_assert(half_is_nan(dcomm__float_to_half(u2f(0x7f800001u))));
  ck_assert(bf16_is_nan(dcomm__float_to_bf16(u2f(0x7f800001u))));
  ck_assert(bf16_is_nan(dcomm__float_to_bf16(u2f(0xff800001u))));
  ck_assert(isinf(dcomm__half_to_float(0x7c00)) && dcomm__half_to_float(0xfc00) < 0);
  ck_assert(dcomm__half_to_float(0x0001) == 0x1p-24f);
  ck_assert(dcomm__half_to_float(0x8001) == -0x1p-24f);
  ck_assert(dcomm__half_to_float(0x7bff) == 65504.0f);
  ck_assert(signbit(dcomm__half_to_float(0x8000)) && dcomm__half_to_float(0x8000) == 0);
}
END_TEST

/* Reference reductions, one element at a time. */

static double ref_fop(double x, double y, dcomm_op_t op) {
  switch (op) {
    case DCOMM_SUM:
    case DCOMM_AVG: return x + y;
    case DCOMM_PROD: return x * y;
    case DCOMM_MAX: return isnan(x) || isnan(y) ? NAN : (x > y ? x : y);
    case DCOMM_MIN: return isnan(x) || isnan(y) ? NAN : (x < y ? x : y);
    default: return 0;
  }
}

/* Wrapping integer reference on the value's two's-complement bits. */
static uint64_t ref_iop_bits(uint64_t x, uint64_t y, int64_t sx, int64_t sy, int is_signed, dcomm_op_t op) {
  switch (op) {
    case DCOMM_SUM:
    case DCOMM_AVG: return x + y;
    case DCOMM_PROD: return x * y;
    case DCOMM_MAX: return is_signed ? (sx > sy ? x : y) : (x > y ? x : y);
    case DCOMM_MIN: return is_signed ? (sx < sy ? x : y) : (x < y ? x : y);
    case DCOMM_BAND: return x & y;
    case DCOMM_BOR: return x | y;
    case DCOMM_BXOR: return x ^ y;
    default: return 0;
  }
}

/*
 * want = x op y for element i of the buffers, written into `out`. For float
 * types the single operation is done in the element type itself, exactly as
 * IEEE arithmetic does it.
 */
static void ref_elem(void *out, const void *xa, const void *ya, size_t i, dcomm_dtype_t dt, dcomm_op_t op) {
  switch (dt) {
#define IREF(DT, T, U, SIGNED)                                                               \
  case DT: {                                                                                 \
    T x = ((const T *)xa)[i], y = ((const T *)ya)[i];                                        \
    uint64_t r = ref_iop_bits((uint64_t)x, (uint64_t)y, (int64_t)x, (int64_t)y, SIGNED, op); \
    *(T *)out = (T)(U)r;                                                                     \
    break;                                                                                   \
  }
    IREF(DCOMM_INT8, int8_t, uint8_t, 1)
    IREF(DCOMM_UINT8, uint8_t, uint8_t, 0)
    IREF(DCOMM_INT32, int32_t, uint32_t, 1)
    IREF(DCOMM_UINT32, uint32_t, uint32_t, 0)
    IREF(DCOMM_INT64, int64_t, uint64_t, 1)
    IREF(DCOMM_UINT64, uint64_t, uint64_t, 0)
#undef IREF
    case DCOMM_FLOAT32: {
      float x = ((const float *)xa)[i], y = ((const float *)ya)[i], r;
      if (op == DCOMM_SUM || op == DCOMM_AVG) r = x + y;
      else if (op == DCOMM_PROD) r = x * y;
      else r = (float)ref_fop(x, y, op);
      *(float *)out = r;
      break;
    }
    case DCOMM_FLOAT64: *(double *)out = ref_fop(((const double *)xa)[i], ((const double *)ya)[i], op); break;
    case DCOMM_FLOAT16: {
      float x = dcomm__half_to_float(((const uint16_t *)xa)[i]), y = dcomm__half_to_float(((const uint16_t *)ya)[i]);
      float r = op == DCOMM_SUM || op == DCOMM_AVG ? x + y : op == DCOMM_PROD ? x * y : (float)ref_fop(x, y, op);
      *(uint16_t *)out = dcomm__float_to_half(r);
      break;
    }
    case DCOMM_BFLOAT16: {
      float x = dcomm__bf16_to_float(((const uint16_t *)xa)[i]), y = dcomm__bf16_to_float(((const uint16_t *)ya)[i]);
      float r = op == DCOMM_SUM || op == DCOMM_AVG ? x + y : op == DCOMM_PROD ? x * y : (float)ref_fop(x, y, op);
      *(uint16_t *)out = dcomm__float_to_bf16(r);
      break;
    }
    default: break;
  }
}

/* Element equality: same bits, or both NaN, or both zero for float types. */
static int elem_equal(const void *p, const void *q, dcomm_dtype_t dt) {
  switch (dt) {
    case DCOMM_FLOAT32: {
      float x = *(const float *)p, y = *(const float *)q;
      return x == y || (isnan(x) && isnan(y));
    }
    case DCOMM_FLOAT64: {
      double x = *(const double *)p, y = *(const double *)q;
      return x == y || (isnan(x) && isnan(y));
    }
    case DCOMM_FLOAT16: {
      uint16_t x = *(const uint16_t *)p, y = *(const uint16_t *)q;
      return x == y || (half_is_nan(x) && half_is_nan(y)) || ((x | y) & 0x7fff) == 0;
    }
    case DCOMM_BFLOAT16: {
      uint16_t x = *(const uint16_t *)p, y = *(const uint16_t *)q;
      return x == y || (bf16_is_nan(x) && bf16_is_nan(y)) || ((x | y) & 0x7fff) == 0;
    }
    default: return memcmp(p, q, dcomm_dtype_size(dt)) == 0;
  }
}

static float rnd_float(void) {
  uint64_t r = rnd();
  switch (r % 16) {
    case 0: return u2f((uint32_t)(r >> 32)); /* any bit pattern, NaN and inf included */
    case 1: return (float)((double)(int64_t)(r >> 8) * 1e-9);  /* large, either sign */
    case 2: return (float)ldexp((double)(r >> 40) - (double)(1ull << 23), -40); /* tiny */
    case 3: return (r >> 8) & 1 ? -0.0f : 0.0f;
    default: return (float)(((double)(r >> 11) / 9007199254740992.0) * 2000.0 - 1000.0);
  }
}

/* Random elements for dt: every bit pattern for integers, a mix for floats. */
static void fill_random(void *buf, size_t n, dcomm_dtype_t dt) {
  size_t sz = dcomm_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    char *p = (char *)buf + i * sz;
    switch (dt) {
      case DCOMM_FLOAT32: {
        float f = rnd_float();
        memcpy(p, &f, sz);
        break;
      }
      case DCOMM_FLOAT64: {
        uint64_t r = rnd();
        double d = r % 16 == 0 ? (double)rnd_float() : r % 16 == 1 ? (double)(int64_t)rnd() * 1e290 / 9.3e18
                                                                   : ((double)(r >> 11) / 9007199254740992.0) * 2e6 - 1e6;
        if (r % 16 == 2) memcpy(&d, &r, sizeof(d)); /* any bit pattern */
        memcpy(p, &d, sz);
        break;
      }
      case DCOMM_FLOAT16: {
        uint64_t r = rnd();
        uint16_t h = r % 8 == 0 ? (uint16_t)(r >> 16) : dcomm__float_to_half(rnd_float() / 64);
        memcpy(p, &h, sz);
        break;
      }
      case DCOMM_BFLOAT16: {
        uint64_t r = rnd();
        uint16_t b = r % 8 == 0 ? (uint16_t)(r >> 16) : dcomm__float_to_bf16(rnd_float());
        memcpy(p, &b, sz);
        break;
      }
      default: {
        uint64_t r = rnd();
        /* A quarter of the integers are small, so MAX/MIN/PROD see ordinary values too. */
        if (r % 4 == 0) r = (uint64_t)((int64_t)(r >> 56) - 128);
        memcpy(p, &r, sz); /* little-endian: the low bytes */
        break;
      }
    }
  }
}

#define GUARD 64
#define GUARD_BYTE 0xa5

/* A buffer of n elements followed by GUARD bytes that must stay untouched. */
static void *alloc_guarded(size_t n, dcomm_dtype_t dt) {
  size_t bytes = n * dcomm_dtype_size(dt);
  unsigned char *p = malloc(bytes + GUARD);
  ck_assert_ptr_nonnull(p);
  memset(p + bytes, GUARD_BYTE, GUARD);
  return p;
}

static void check_guard(const void *buf, size_t n, dcomm_dtype_t dt, const char *what) {
  const unsigned char *g = (const unsigned char *)buf + n * dcomm_dtype_size(dt);
  for (int i = 0; i < GUARD; i++)
    REQUIRE(g[i] == GUARD_BYTE, "%s %s n=%zu wrote past the end (byte %d)", what, dcomm__dtype_name(dt), n, i);
}

static void compare(const void *got, const void *a, const void *b, size_t n, dcomm_dtype_t dt, dcomm_op_t op,
                    const char *what) {
  size_t sz = dcomm_dtype_size(dt);
  unsigned char want[8];
  for (size_t i = 0; i < n; i++) {
    ref_elem(want, a, b, i, dt, op);
    const unsigned char *g = (const unsigned char *)got + i * sz;
    if (!elem_equal(g, want, dt)) {
      uint64_t gv = 0, wv = 0, av = 0, bv = 0;
      memcpy(&gv, g, sz);
      memcpy(&wv, want, sz);
      memcpy(&av, (const char *)a + i * sz, sz);
      memcpy(&bv, (const char *)b + i * sz, sz);
      ck_abort_msg("%s %s %s n=%zu i=%zu: 0x%llx op 0x%llx gave 0x%llx, want 0x%llx", what, dcomm__dtype_name(dt),
                   dcomm__op_name(op), n, i, (unsigned long long)av, (unsigned long long)bv, (unsigned long long)gv,
                   (unsigned long long)wv);
    }
  }
}

/*
 * One dtype x op at count n: in place (dcomm__reduce), out of place into a
 * third buffer, and out of place with dst aliasing a and aliasing b.
 */
static void run_refused(dcomm_dtype_t dt, dcomm_op_t op, size_t n);

static void run_case(dcomm_dtype_t dt, dcomm_op_t op, size_t n) {
  if (!dcomm__op_dtype_ok(op, dt)) {
    run_refused(dt, op, n);
    return;
  }
  size_t bytes = n * dcomm_dtype_size(dt);
  void *a = alloc_guarded(n, dt), *b = alloc_guarded(n, dt), *d = alloc_guarded(n, dt);
  void *a0 = malloc(bytes + 1), *b0 = malloc(bytes + 1);
  ck_assert_ptr_nonnull(a0);
  ck_assert_ptr_nonnull(b0);
  fill_random(a, n, dt);
  fill_random(b, n, dt);
  memcpy(a0, a, bytes);
  memcpy(b0, b, bytes);

  dcomm__reduce3(d, a, b, n, dt, op);
  compare(d, a0, b0, n, dt, op, "reduce3");
  ck_assert_msg(memcmp(a, a0, bytes) == 0 && memcmp(b, b0, bytes) == 0, "reduce3 modified an input");
  check_guard(d, n, dt, "reduce3");

  memcpy(d, a0, bytes);
  dcomm__reduce(d, b, n, dt, op);
  compare(d, a0, b0, n, dt, op, "reduce");
  ck_assert_msg(memcmp(b, b0, bytes) == 0, "reduce modified src");
  check_guard(d, n, dt, "reduce");

  dcomm__reduce3(a, a, b, n, dt, op);
  compare(a, a0, b0, n, dt, op, "reduce3(dst==a)");
  check_guard(a, n, dt, "reduce3(dst==a)");

  memcpy(a, a0, bytes);
  dcomm__reduce3(b, a, b, n, dt, op);
  compare(b, a0, b0, n, dt, op, "reduce3(dst==b)");
  check_guard(b, n, dt, "reduce3(dst==b)");

  /* Reducing a buffer with itself (dst == src). */
  memcpy(d, a0, bytes);
  dcomm__reduce(d, d, n, dt, op);
  compare(d, a0, a0, n, dt, op, "reduce(dst==src)");
  check_guard(d, n, dt, "reduce(dst==src)");

  free(a);
  free(b);
  free(d);
  free(a0);
  free(b0);
}

/* A pair without a kernel (a bitwise op on a floating dtype) leaves every
 * buffer as it was, in each calling form. */
static void run_refused(dcomm_dtype_t dt, dcomm_op_t op, size_t n) {
  size_t bytes = n * dcomm_dtype_size(dt);
  void *a = alloc_guarded(n, dt), *b = alloc_guarded(n, dt), *d = alloc_guarded(n, dt);
  void *a0 = malloc(bytes + 1), *b0 = malloc(bytes + 1);
  ck_assert_ptr_nonnull(a0);
  ck_assert_ptr_nonnull(b0);
  fill_random(a, n, dt);
  fill_random(b, n, dt);
  memset(d, 0x3c, bytes);
  memcpy(a0, a, bytes);
  memcpy(b0, b, bytes);
  dcomm__reduce3(d, a, b, n, dt, op);
  dcomm__reduce(a, b, n, dt, op);
  dcomm__reduce3(b, a, b, n, dt, op);
  dcomm__reduce(a, a, n, dt, op);
  for (size_t i = 0; i < bytes; i++)
    REQUIRE(((unsigned char *)d)[i] == 0x3c && ((unsigned char *)a)[i] == ((unsigned char *)a0)[i] &&
                ((unsigned char *)b)[i] == ((unsigned char *)b0)[i],
            "%s %s n=%zu has no kernel but changed byte %zu", dcomm__dtype_name(dt), dcomm__op_name(op), n, i);
  check_guard(a, n, dt, "refused");
  check_guard(b, n, dt, "refused");
  check_guard(d, n, dt, "refused");
  free(a);
  free(b);
  free(d);
  free(a0);
  free(b0);
}

static const size_t small_counts[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 63, 64, 65, 255, 256, 257, 511, 513, 4099};

/*
 * Loop index i: dtype i / DCOMM_OP_COUNT, op i % DCOMM_OP_COUNT. float16
 * runs twice, through the hardware conversions (where the CPU has them) and
 * through the portable ones.
 */
START_TEST(test_reduce_random) {
  dcomm_dtype_t dt = (dcomm_dtype_t)(_i / DCOMM_OP_COUNT);
  dcomm_op_t op = (dcomm_op_t)(_i % DCOMM_OP_COUNT);
  rng_state += (uint64_t)_i * 0x100000001b3ull;
  for (int hw = dt == DCOMM_FLOAT16 ? 0 : 1; hw < 2; hw++) {
    dcomm__reduce_hw_convert(hw);
    for (size_t k = 0; k < sizeof(small_counts) / sizeof(small_counts[0]); k++) run_case(dt, op, small_counts[k]);
  }
}
END_TEST

/*
 * Every float16 / bfloat16 pattern through the block path: x + -0 and x * 1
 * are exact, so each finite value must come back unchanged and NaN must stay
 * NaN. Loop index: 0 float16 portable, 1 float16 hardware, 2 bfloat16.
 */
START_TEST(test_half_block_identity) {
  dcomm_dtype_t dt = _i == 2 ? DCOMM_BFLOAT16 : DCOMM_FLOAT16;
  dcomm__reduce_hw_convert(_i == 1);
  int (*is_nan)(uint16_t) = dt == DCOMM_FLOAT16 ? half_is_nan : bf16_is_nan;
  static uint16_t x[65536], d[65536], negzero[65536], one[65536];
  for (uint32_t i = 0; i < 65536; i++) {
    x[i] = (uint16_t)i;
    negzero[i] = 0x8000;
    one[i] = dt == DCOMM_FLOAT16 ? 0x3c00 : 0x3f80;
  }
  for (int pass = 0; pass < 2; pass++) {
    dcomm__reduce3(d, x, pass ? one : negzero, 65536, dt, pass ? DCOMM_PROD : DCOMM_SUM);
    for (uint32_t i = 0; i < 65536; i++) {
      if (is_nan(x[i])) REQUIRE(is_nan(d[i]), "%s NaN 0x%04x became 0x%04x", dcomm__dtype_name(dt), x[i], d[i]);
      else REQUIRE(d[i] == x[i], "%s 0x%04x %s gave 0x%04x", dcomm__dtype_name(dt), x[i], pass ? "* 1" : "+ -0", d[i]);
    }
  }
}
END_TEST

/*
 * Division of every pattern rounds in the block path exactly as the scalar
 * conversions do (ties, subnormal results, NaN). Same loop index as above.
 */
START_TEST(test_half_block_scale_all) {
  dcomm_dtype_t dt = _i == 2 ? DCOMM_BFLOAT16 : DCOMM_FLOAT16;
  dcomm__reduce_hw_convert(_i == 1);
  static uint16_t x[65536];
  static const int divisors[] = {3, 7, 10, 1024};
  for (size_t k = 0; k < sizeof(divisors) / sizeof(divisors[0]); k++) {
    int n = divisors[k];
    for (uint32_t i = 0; i < 65536; i++) x[i] = (uint16_t)i;
    dcomm__scale_div(x, 65536, dt, n);
    for (uint32_t i = 0; i < 65536; i++) {
      if (dt == DCOMM_FLOAT16)
        check_half(x[i], dcomm__float_to_half(dcomm__half_to_float((uint16_t)i) / (float)n), "scale_div(float16)", i);
      else
        check_bf16(x[i], dcomm__float_to_bf16(dcomm__bf16_to_float((uint16_t)i) / (float)n), "scale_div(bfloat16)", i);
    }
  }
}
END_TEST

/* A count far past every block size, odd, so that the tails run too. */
START_TEST(test_reduce_large_odd) {
  dcomm_dtype_t dt = (dcomm_dtype_t)_i;
  if (dt == DCOMM_DTYPE_COUNT) { /* one extra round: float16 through the portable conversions */
    dt = DCOMM_FLOAT16;
    dcomm__reduce_hw_convert(0);
  }
  size_t n = 1000003, bytes = n * dcomm_dtype_size(dt);
  void *a = alloc_guarded(n, dt), *b = malloc(bytes), *d = alloc_guarded(n, dt);
  ck_assert_ptr_nonnull(b);
  fill_random(a, n, dt);
  fill_random(b, n, dt);
  for (int op = 0; op < DCOMM_OP_COUNT; op++) {
    if (!dcomm__op_dtype_ok(op, dt)) continue; /* run_refused covers these */
    dcomm__reduce3(d, a, b, n, dt, (dcomm_op_t)op);
    compare(d, a, b, n, dt, (dcomm_op_t)op, "reduce3(large)");
    check_guard(d, n, dt, "reduce3(large)");
  }
  free(a);
  free(b);
  free(d);
}
END_TEST

/* Specific values that a random draw may miss. */

START_TEST(test_int_wrap) {
  int8_t a8[] = {127, -128, -128, 100}, b8[] = {1, -1, -1, 3};
  dcomm__reduce(a8, b8, 2, DCOMM_INT8, DCOMM_SUM);
  ck_assert_int_eq(a8[0], -128);
  ck_assert_int_eq(a8[1], 127);
  dcomm__reduce(a8 + 2, b8 + 2, 2, DCOMM_INT8, DCOMM_PROD);
  ck_assert_int_eq(a8[2], -128); /* -128 * -1 wraps to -128 */
  ck_assert_int_eq(a8[3], 44);   /* 300 mod 256 */
  int32_t a32[] = {INT32_MAX, INT32_MIN}, b32[] = {1, -1};
  dcomm__reduce(a32, b32, 2, DCOMM_INT32, DCOMM_SUM);
  ck_assert_int_eq(a32[0], INT32_MIN);
  ck_assert_int_eq(a32[1], INT32_MAX);
  int64_t a64[] = {INT64_MAX, INT64_MIN}, b64[] = {2, -1};
  dcomm__reduce(a64, b64, 2, DCOMM_INT64, DCOMM_PROD);
  ck_assert(a64[0] == -2);
  ck_assert(a64[1] == INT64_MIN);
  uint64_t u64[] = {UINT64_MAX, 3}, v64[] = {2, UINT64_MAX};
  dcomm__reduce(u64, v64, 2, DCOMM_UINT64, DCOMM_SUM);
  ck_assert(u64[0] == 1 && u64[1] == 2);
  uint8_t u8[] = {200, 0, 255}, v8[] = {100, 255, 254};
  dcomm__reduce(u8, v8, 3, DCOMM_UINT8, DCOMM_MAX);
  ck_assert(u8[0] == 200 && u8[1] == 255 && u8[2] == 255);
  int8_t m8[] = {-5, 5}, n8[] = {3, -3};
  dcomm__reduce(m8, n8, 2, DCOMM_INT8, DCOMM_MIN);
  ck_assert(m8[0] == -5 && m8[1] == -3);
  uint32_t mu[] = {0x80000000u}, nu[] = {1};
  dcomm__reduce(mu, nu, 1, DCOMM_UINT32, DCOMM_MIN); /* unsigned compare, not signed */
  ck_assert(mu[0] == 1);
}
END_TEST

/*
 * Bitwise ops on every integer dtype with edge values (zero, all ones,
 * the signed extremes, alternating bits), in every position of a vector
 * block and its tail, against constants worked out by hand.
 */
#define BITWISE_CASE(DT, T)                                                                                   \
  do {                                                                                                        \
    const T all = (T)~(T)0, hi = (T)(UINT64_C(1) << (sizeof(T) * 8 - 1)), lo = (T)~hi;                       \
    const T five = (T)UINT64_C(0x5555555555555555), aa = (T)~five; /* 0x55.. and 0xaa.. */                   \
    const T xs[] = {0, all, hi, lo, five, aa, 1, all, hi, 0}, ys[] = {all, all, lo, lo, aa, aa, all, 0, hi, 0}; \
    const T want_and[] = {0, all, 0, lo, 0, aa, 1, 0, hi, 0};                                                 \
    const T want_or[] = {all, all, all, lo, all, aa, all, all, hi, 0};                                        \
    const T want_xor[] = {all, 0, all, 0, all, 0, (T)(all - 1), all, 0, 0};                                   \
    const T *wants[] = {want_and, want_or, want_xor};                                                         \
    enum { N = 10, LEN = 130 }; /* two 64-byte blocks of int8 and a tail */                                   \
    for (int o = 0; o < 3; o++) {                                                                             \
      dcomm_op_t op = (dcomm_op_t)(DCOMM_BAND + o);                                                           \
      T x[LEN], y[LEN], d[LEN];                                                                               \
      for (int i = 0; i < LEN; i++) x[i] = xs[i % N], y[i] = ys[i % N];                                       \
      dcomm__reduce3(d, x, y, LEN, DT, op);                                                                   \
      for (int i = 0; i < LEN; i++)                                                                           \
        REQUIRE(d[i] == wants[o][i % N], "%s %s element %d: 0x%llx op 0x%llx gave 0x%llx", dcomm__dtype_name(DT), \
                dcomm__op_name(op), i, (unsigned long long)x[i], (unsigned long long)y[i], (unsigned long long)d[i]); \
      dcomm__reduce(x, y, LEN, DT, op);                                                                       \
      REQUIRE(memcmp(x, d, sizeof(d)) == 0, "%s %s in place differs", dcomm__dtype_name(DT), dcomm__op_name(op)); \
      for (int i = 0; i < LEN; i++) x[i] = xs[i % N];                                                         \
      dcomm__reduce(x, x, LEN, DT, op); /* x op x: x, x, 0 */                                                 \
      for (int i = 0; i < LEN; i++)                                                                           \
        REQUIRE(x[i] == (op == DCOMM_BXOR ? (T)0 : xs[i % N]), "%s %s with itself wrong at %d",                \
                dcomm__dtype_name(DT), dcomm__op_name(op), i);                                                 \
    }                                                                                                         \
  } while (0)

START_TEST(test_bitwise_edges) {
  BITWISE_CASE(DCOMM_INT8, int8_t);
  BITWISE_CASE(DCOMM_UINT8, uint8_t);
  BITWISE_CASE(DCOMM_INT32, int32_t);
  BITWISE_CASE(DCOMM_UINT32, uint32_t);
  BITWISE_CASE(DCOMM_INT64, int64_t);
  BITWISE_CASE(DCOMM_UINT64, uint64_t);
}
END_TEST

/* Which pairs reduce: bitwise ops take the six integer dtypes only. */
START_TEST(test_bitwise_dtypes) {
  for (int dt = 0; dt < DCOMM_DTYPE_COUNT; dt++)
    for (int op = 0; op < DCOMM_OP_COUNT; op++) {
      int bitwise = op == DCOMM_BAND || op == DCOMM_BOR || op == DCOMM_BXOR;
      int integer = dt <= DCOMM_UINT64;
      ck_assert_int_eq(dcomm__op_bitwise(op), bitwise);
      ck_assert_int_eq(dcomm__dtype_integer(dt), integer);
      ck_assert_msg(dcomm__op_dtype_ok(op, dt) == (!bitwise || integer), "%s %s", dcomm__dtype_name(dt),
                    dcomm__op_name(op));
    }
  ck_assert(!dcomm__op_dtype_ok(DCOMM_OP_COUNT, DCOMM_INT32));
  ck_assert(!dcomm__op_dtype_ok(DCOMM_BAND, DCOMM_DTYPE_COUNT));
  ck_assert_int_eq(DCOMM_BAND, 5);
  ck_assert_int_eq(DCOMM_BOR, 6);
  ck_assert_int_eq(DCOMM_BXOR, 7);
  ck_assert_int_eq(DCOMM_OP_COUNT, 8);
}
END_TEST

START_TEST(test_float_nan_max_min) {
  float a[] = {NAN, 1.0f, NAN, -INFINITY, 2.0f, 1.0f}, b[] = {1.0f, NAN, NAN, 3.0f, -INFINITY, 1.0f};
  float d[6];
  dcomm__reduce3(d, a, b, 6, DCOMM_FLOAT32, DCOMM_MAX);
  ck_assert(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
  ck_assert(d[3] == 3.0f && d[4] == 2.0f && d[5] == 1.0f);
  dcomm__reduce3(d, a, b, 6, DCOMM_FLOAT32, DCOMM_MIN);
  ck_assert(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
  ck_assert(d[3] == -INFINITY && d[4] == -INFINITY && d[5] == 1.0f);
  double x[] = {NAN, 0.5}, y[] = {-1.0, NAN};
  dcomm__reduce(x, y, 2, DCOMM_FLOAT64, DCOMM_MAX);
  ck_assert(isnan(x[0]) && isnan(x[1]));
  uint16_t h[] = {0x7e00, 0x3c00, 0x7c00}, g[] = {0x3c00, 0x7e01, 0xfc00};
  dcomm__reduce(h, g, 3, DCOMM_FLOAT16, DCOMM_MIN);
  ck_assert(half_is_nan(h[0]) && half_is_nan(h[1]) && h[2] == 0xfc00);
  uint16_t bh[] = {0x7fc0, 0x3f80, 0x7f80}, bg[] = {0x3f80, 0xffc1, 0x7f80};
  dcomm__reduce(bh, bg, 3, DCOMM_BFLOAT16, DCOMM_SUM);
  ck_assert(bf16_is_nan(bh[0]) && bf16_is_nan(bh[1]) && bh[2] == 0x7f80);
  /* inf + -inf is NaN; the half path must not turn it into infinity. */
  uint16_t p[] = {0x7c00}, q[] = {0xfc00};
  dcomm__reduce(p, q, 1, DCOMM_FLOAT16, DCOMM_SUM);
  ck_assert(half_is_nan(p[0]));
}
END_TEST

/* float16 rounds after each step: 2048 + 1 is a tie and stays 2048. */
START_TEST(test_half_sum_rounding) {
  uint16_t a[300], b[300];
  for (int i = 0; i < 300; i++) a[i] = 0x6800, b[i] = 0x3c00; /* 2048, 1 */
  dcomm__reduce(a, b, 300, DCOMM_FLOAT16, DCOMM_SUM);
  for (int i = 0; i < 300; i++) REQUIRE(a[i] == 0x6800, "2048 + 1 gave 0x%04x", a[i]);
  for (int i = 0; i < 300; i++) a[i] = 0x7bff, b[i] = 0x7bff; /* 65504 + 65504 overflows */
  dcomm__reduce(a, b, 300, DCOMM_FLOAT16, DCOMM_SUM);
  for (int i = 0; i < 300; i++) REQUIRE(a[i] == 0x7c00, "65504 + 65504 gave 0x%04x", a[i]);
  for (int i = 0; i < 300; i++) a[i] = 0x0001, b[i] = 0x0001; /* subnormal + subnormal */
  dcomm__reduce(a, b, 300, DCOMM_FLOAT16, DCOMM_SUM);
  for (int i = 0; i < 300; i++) REQUIRE(a[i] == 0x0002, "2^-24 + 2^-24 gave 0x%04x", a[i]);
}
END_TEST

/* A zero count touches nothing, not even through NULL pointers. */
START_TEST(test_count_zero) {
  for (int dt = 0; dt < DCOMM_DTYPE_COUNT; dt++) {
    for (int op = 0; op < DCOMM_OP_COUNT; op++) {
      unsigned char d[64], a[64], b[64];
      memset(d, 0x5a, sizeof(d));
      memset(a, 0x11, sizeof(a));
      memset(b, 0x22, sizeof(b));
      dcomm__reduce(d, a, 0, (dcomm_dtype_t)dt, (dcomm_op_t)op);
      dcomm__reduce3(d, a, b, 0, (dcomm_dtype_t)dt, (dcomm_op_t)op);
      dcomm__reduce3(a, a, b, 0, (dcomm_dtype_t)dt, (dcomm_op_t)op);
      dcomm__reduce(NULL, NULL, 0, (dcomm_dtype_t)dt, (dcomm_op_t)op);
      dcomm__reduce3(NULL, NULL, NULL, 0, (dcomm_dtype_t)dt, (dcomm_op_t)op);
      for (size_t i = 0; i < sizeof(d); i++)
        REQUIRE(d[i] == 0x5a && a[i] == 0x11 && b[i] == 0x22, "%s %s count 0 wrote byte %zu",
                dcomm__dtype_name(dt), dcomm__op_name(op), i);
    }
    unsigned char s[64];
    memset(s, 0x77, sizeof(s));
    dcomm__scale_div(s, 0, (dcomm_dtype_t)dt, 3);
    dcomm__scale_div(NULL, 0, (dcomm_dtype_t)dt, 3);
    for (size_t i = 0; i < sizeof(s); i++) REQUIRE(s[i] == 0x77, "scale_div count 0 wrote byte %zu", i);
  }
}
END_TEST

/* An invalid dtype or op is ignored rather than read as a table index. */
START_TEST(test_invalid_ignored) {
  unsigned char d[16], a[16];
  memset(d, 0x5a, sizeof(d));
  memset(a, 0x11, sizeof(a));
  dcomm__reduce(d, a, 4, DCOMM_DTYPE_COUNT, DCOMM_SUM);
  dcomm__reduce(d, a, 4, (dcomm_dtype_t)-1, DCOMM_SUM);
  dcomm__reduce(d, a, 4, DCOMM_INT32, DCOMM_OP_COUNT);
  dcomm__reduce3(d, d, a, 4, DCOMM_INT32, (dcomm_op_t)-1);
  dcomm__scale_div(d, 4, DCOMM_DTYPE_COUNT, 2);
  for (size_t i = 0; i < sizeof(d); i++) REQUIRE(d[i] == 0x5a, "invalid dtype/op wrote byte %zu", i);
}
END_TEST

START_TEST(test_avg_is_sum) {
  float a[] = {1.5f, -2.0f}, b[] = {2.5f, 5.0f};
  dcomm__reduce(a, b, 2, DCOMM_FLOAT32, DCOMM_AVG);
  ck_assert(a[0] == 4.0f && a[1] == 3.0f);
  dcomm__scale_div(a, 2, DCOMM_FLOAT32, 2);
  ck_assert(a[0] == 2.0f && a[1] == 1.5f);
}
END_TEST

START_TEST(test_scale_div_int) {
  int8_t i8[] = {-7, 7, -128, 127, 1};
  dcomm__scale_div(i8, 5, DCOMM_INT8, 2);
  ck_assert(i8[0] == -3 && i8[1] == 3 && i8[2] == -64 && i8[3] == 63 && i8[4] == 0);
  int8_t j8[] = {-128, 127};
  dcomm__scale_div(j8, 2, DCOMM_INT8, 1000); /* a divisor wider than the type */
  ck_assert(j8[0] == 0 && j8[1] == 0);
  uint8_t u8[] = {255, 10};
  dcomm__scale_div(u8, 2, DCOMM_UINT8, 3);
  ck_assert(u8[0] == 85 && u8[1] == 3);
  int32_t i32[] = {-10, 10, INT32_MIN};
  dcomm__scale_div(i32, 3, DCOMM_INT32, 4);
  ck_assert(i32[0] == -2 && i32[1] == 2 && i32[2] == INT32_MIN / 4);
  uint32_t u32[] = {UINT32_MAX};
  dcomm__scale_div(u32, 1, DCOMM_UINT32, 2);
  ck_assert(u32[0] == UINT32_MAX / 2);
  int64_t i64[] = {-9, INT64_MIN};
  dcomm__scale_div(i64, 2, DCOMM_INT64, 2);
  ck_assert(i64[0] == -4 && i64[1] == INT64_MIN / 2);
  uint64_t u64[] = {UINT64_MAX, 5};
  dcomm__scale_div(u64, 2, DCOMM_UINT64, 3);
  ck_assert(u64[0] == UINT64_MAX / 3 && u64[1] == 1);
  /* Odd lengths past the vector block, checked against plain division. */
  int32_t big[1001];
  for (int i = 0; i < 1001; i++) big[i] = (int32_t)(i * 7919) - 3000000;
  dcomm__scale_div(big, 1001, DCOMM_INT32, 7);
  for (int i = 0; i < 1001; i++) REQUIRE(big[i] == ((int32_t)(i * 7919) - 3000000) / 7, "int32 /7 wrong at %d", i);
  /* n == 1 changes nothing; n < 1 means nothing and is ignored (no division by zero). */
  int32_t one[] = {-5};
  dcomm__scale_div(one, 1, DCOMM_INT32, 1);
  ck_assert_int_eq(one[0], -5);
  dcomm__scale_div(one, 1, DCOMM_INT32, 0);
  dcomm__scale_div(one, 1, DCOMM_INT32, -2);
  ck_assert_int_eq(one[0], -5);
}
END_TEST

START_TEST(test_scale_div_float) {
  float f[1001];
  for (int i = 0; i < 1001; i++) f[i] = (float)i - 500.25f;
  dcomm__scale_div(f, 1001, DCOMM_FLOAT32, 3);
  for (int i = 0; i < 1001; i++) REQUIRE(f[i] == ((float)i - 500.25f) / 3.0f, "float32 /3 wrong at %d", i);
  double d[] = {1.0, -7.0, INFINITY};
  dcomm__scale_div(d, 3, DCOMM_FLOAT64, 4);
  ck_assert(d[0] == 0.25 && d[1] == -1.75 && isinf(d[2]));
  uint16_t h[513];
  for (int i = 0; i < 513; i++) h[i] = (uint16_t)(i * 61);
  uint16_t h0[513];
  memcpy(h0, h, sizeof(h));
  dcomm__scale_div(h, 513, DCOMM_FLOAT16, 3);
  for (int i = 0; i < 513; i++) {
    uint16_t want = dcomm__float_to_half(dcomm__half_to_float(h0[i]) / 3.0f);
    check_half(h[i], want, "scale_div(float16)", h0[i]);
  }
  uint16_t b[300], b0[300];
  for (int i = 0; i < 300; i++) b[i] = b0[i] = (uint16_t)(i * 211);
  dcomm__scale_div(b, 300, DCOMM_BFLOAT16, 5);
  for (int i = 0; i < 300; i++) {
    uint16_t want = dcomm__float_to_bf16(dcomm__bf16_to_float(b0[i]) / 5.0f);
    check_bf16(b[i], want, "scale_div(bfloat16)", b0[i]);
  }
}
END_TEST

START_TEST(test_dtype_facts) {
  static const struct {
    dcomm_dtype_t dt;
    size_t size;
    const char *name;
  } facts[] = {
      {DCOMM_INT8, 1, "int8"},         {DCOMM_UINT8, 1, "uint8"},       {DCOMM_INT32, 4, "int32"},
      {DCOMM_UINT32, 4, "uint32"},     {DCOMM_INT64, 8, "int64"},       {DCOMM_UINT64, 8, "uint64"},
      {DCOMM_FLOAT16, 2, "float16"},   {DCOMM_BFLOAT16, 2, "bfloat16"}, {DCOMM_FLOAT32, 4, "float32"},
      {DCOMM_FLOAT64, 8, "float64"},
  };
  ck_assert_int_eq(sizeof(facts) / sizeof(facts[0]), DCOMM_DTYPE_COUNT);
  for (size_t i = 0; i < sizeof(facts) / sizeof(facts[0]); i++) {
    ck_assert_uint_eq(dcomm_dtype_size(facts[i].dt), facts[i].size);
    ck_assert_str_eq(dcomm__dtype_name(facts[i].dt), facts[i].name);
    ck_assert(dcomm__dtype_valid(facts[i].dt));
  }
  ck_assert_uint_eq(dcomm_dtype_size(DCOMM_DTYPE_COUNT), 0);
  ck_assert_uint_eq(dcomm_dtype_size((dcomm_dtype_t)-1), 0);
  ck_assert_uint_eq(dcomm_dtype_size((dcomm_dtype_t)999), 0);
  ck_assert(!dcomm__dtype_valid(DCOMM_DTYPE_COUNT));
  ck_assert(!dcomm__dtype_valid(-1));
  ck_assert_str_eq(dcomm__dtype_name(DCOMM_DTYPE_COUNT), "dtype?");
  ck_assert_str_eq(dcomm__dtype_name(-3), "dtype?");
}
END_TEST

START_TEST(test_op_facts) {
  static const char *const names[] = {"sum", "prod", "max", "min", "avg", "band", "bor", "bxor"};
  ck_assert_int_eq(sizeof(names) / sizeof(names[0]), DCOMM_OP_COUNT);
  for (int op = 0; op < DCOMM_OP_COUNT; op++) {
    ck_assert(dcomm__op_valid(op));
    ck_assert_str_eq(dcomm__op_name(op), names[op]);
  }
  ck_assert(!dcomm__op_valid(DCOMM_OP_COUNT));
  ck_assert(!dcomm__op_valid(-1));
  ck_assert_ptr_nonnull(dcomm__op_name(DCOMM_OP_COUNT));
  ck_assert_ptr_nonnull(dcomm__op_name(-1));
}
END_TEST

static Suite *reduce_suite(void) {
  Suite *s = suite_create("reduce");
  TCase *tc = tcase_create("conversions");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_half_all_patterns);
  tcase_add_test(tc, test_bf16_all_patterns);
  tcase_add_test(tc, test_half_ties_all);
  tcase_add_test(tc, test_bf16_ties_all);
  tcase_add_test(tc, test_conversions_random_floats);
  tcase_add_test(tc, test_conversions_chosen);
  suite_add_tcase(s, tc);

  tc = tcase_create("kernels");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_reduce_random, 0, DCOMM_DTYPE_COUNT * DCOMM_OP_COUNT);
  tcase_add_loop_test(tc, test_reduce_large_odd, 0, DCOMM_DTYPE_COUNT + 1);
  tcase_add_loop_test(tc, test_half_block_identity, 0, 3);
  tcase_add_loop_test(tc, test_half_block_scale_all, 0, 3);
  tcase_add_test(tc, test_int_wrap);
  tcase_add_test(tc, test_bitwise_edges);
  tcase_add_test(tc, test_bitwise_dtypes);
  tcase_add_test(tc, test_float_nan_max_min);
  tcase_add_test(tc, test_half_sum_rounding);
  tcase_add_test(tc, test_count_zero);
  tcase_add_test(tc, test_invalid_ignored);
  tcase_add_test(tc, test_avg_is_sum);
  suite_add_tcase(s, tc);

  tc = tcase_create("scale_and_facts");
  tcase_add_test(tc, test_scale_div_int);
  tcase_add_test(tc, test_scale_div_float);
  tcase_add_test(tc, test_dtype_facts);
  tcase_add_test(tc, test_op_facts);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(reduce_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
