/*
 * hostlist.c: parser and expander for SLURM hostlist expressions
 * (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST), see hostlist.h for the
 * grammar. Nothing is allocated until the whole expression is known to be
 * well formed and small enough; every item is re-read from the string when
 * its names are produced, so the parser keeps no tables.
 */
#include "config.h"
#include "hostlist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define HL_MAX_GROUPS 16  /* bracket groups in one item */
#define HL_MAX_DIGITS 18  /* digits of one number (fits unsigned long long) */
#define HL_MAX_NAME 256   /* bytes of one host name, NUL included */

/* One item: [s, s + len) with its bracket groups' sizes. */
struct hl_item {
  const char *s;
  size_t len;
  int ngroups;
  unsigned long long counts[HL_MAX_GROUPS];
  unsigned long long total;
};

static int is_sep(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int hl_fail(const char *expr, const char *at, const char *why) {
  return dcomm__err(DCOMM_EINVAL, "malformed hostlist '%.200s'%s: %s at offset %zu", expr,
                    strlen(expr) > 200 ? "..." : "", why, (size_t)(at - expr));
}

/* Well formed, but more than DCOMM_HOSTLIST_MAX hosts. */
static int hl_too_big(const char *expr, const char *at, const char *what) {
  return dcomm__err(DCOMM_EINVAL, "hostlist '%.200s'%s: %s at offset %zu expands to more than %d hosts", expr,
                    strlen(expr) > 200 ? "..." : "", what, (size_t)(at - expr), DCOMM_HOSTLIST_MAX);
}

/* Reads a decimal number at *p (before end); advances *p. */
static int hl_number(const char *expr, const char **p, const char *end, unsigned long long *v, int *width) {
  const char *q = *p;
  unsigned long long x = 0;
  int w = 0;
  while (q < end && *q >= '0' && *q <= '9') {
    if (++w > HL_MAX_DIGITS) return hl_fail(expr, *p, "number with too many digits");
    x = x * 10 + (unsigned long long)(*q - '0');
    q++;
  }
  if (w == 0) return hl_fail(expr, q, q < end ? "expected a number" : "unterminated '['");
  *v = x;
  *width = w;
  *p = q;
  return 0;
}

/* Reads "lo[-hi]" at *p; advances *p past it. */
static int hl_range(const char *expr, const char **p, const char *end, unsigned long long *lo, unsigned long long *hi,
                    int *width) {
  int w2;
  const char *start = *p;
  DCOMM_CHECK(hl_number(expr, p, end, lo, width));
  *hi = *lo;
  if (*p < end && **p == '-') {
    (*p)++;
    if (*p >= end) return hl_fail(expr, *p, "unterminated '['");
    if (**p < '0' || **p > '9') return hl_fail(expr, *p, "missing upper bound of a range");
    DCOMM_CHECK(hl_number(expr, p, end, hi, &w2));
    if (*hi < *lo) return hl_fail(expr, start, "range upper bound below its lower bound");
  }
  if (*hi - *lo >= DCOMM_HOSTLIST_MAX)
    return hl_too_big(expr, start, "the range");
  return 0;
}

/* Checks the bracket group starting after '[' at *p, sums its size, and
 * leaves *p after the closing ']'. */
static int hl_group(const char *expr, const char **p, const char *end, unsigned long long *count) {
  unsigned long long lo, hi, n = 0;
  int width;
  if (*p < end && **p == ']') return hl_fail(expr, *p, "empty brackets '[]'");
  for (;;) {
    DCOMM_CHECK(hl_range(expr, p, end, &lo, &hi, &width));
    n += hi - lo + 1;
    if (n > DCOMM_HOSTLIST_MAX) return hl_too_big(expr, *p, "the bracket group");
    if (*p >= end) return hl_fail(expr, *p, "unterminated '['");
    char c = **p;
    (*p)++;
    if (c == ']') break;
    if (c == '[') return hl_fail(expr, *p - 1, "nested '['");
    if (c != ',') return hl_fail(expr, *p - 1, "expected ',' or ']' in brackets");
  }
  *count = n;
  return 0;
}

/* Validates one item and sizes its groups. */
static int hl_scan(const char *expr, struct hl_item *it) {
  const char *p = it->s, *end = it->s + it->len;
  it->ngroups = 0;
  it->total = 1;
  while (p < end) {
    char c = *p;
    if (c == '[') {
      if (it->ngroups == HL_MAX_GROUPS) return hl_fail(expr, p, "more than 16 bracket groups in one host name");
      p++;
      unsigned long long n = 0;
      DCOMM_CHECK(hl_group(expr, &p, end, &n));
      it->counts[it->ngroups++] = n;
      if (it->total > DCOMM_HOSTLIST_MAX / n) return hl_too_big(expr, it->s, "the host name");
      it->total *= n;
    } else if (c == ']') {
      return hl_fail(expr, p, "']' without '['");
    } else if ((unsigned char)c < 0x20 || c == 0x7f) {
      return hl_fail(expr, p, "control character");
    } else {
      p++;
    }
  }
  if (it->len == 0) return hl_fail(expr, it->s, "empty host name");
  return 0;
}

/* Finds the next item after *pos (skipping separators); 0 when none left.
 * Separators inside brackets belong to the item. */
static int hl_next(const char **pos, struct hl_item *it) {
  const char *p = *pos;
  while (*p && is_sep(*p)) p++;
  if (!*p) {
    *pos = p;
    return 0;
  }
  const char *s = p;
  int depth = 0;
  while (*p && (depth > 0 || !is_sep(*p))) {
    if (*p == '[') depth++;
    else if (*p == ']' && depth > 0) depth--;
    p++;
  }
  it->s = s;
  it->len = (size_t)(p - s);
  *pos = p;
  return 1;
}

/* Writes name number k (0-based, last group fastest) of a scanned item. */
static int hl_name(const char *expr, const struct hl_item *it, unsigned long long k, char *out, size_t outlen) {
  unsigned long long digit[HL_MAX_GROUPS];
  for (int g = it->ngroups - 1; g >= 0; g--) {
    digit[g] = k % it->counts[g];
    k /= it->counts[g];
  }
  const char *p = it->s, *end = it->s + it->len;
  size_t o = 0;
  int g = 0;
  while (p < end) {
    if (*p != '[') {
      if (o + 1 >= outlen) goto too_long;
      out[o++] = *p++;
      continue;
    }
    p++;
    unsigned long long d = digit[g++], lo, hi;
    int width, found = 0;
    for (;;) {
      DCOMM_CHECK(hl_range(expr, &p, end, &lo, &hi, &width));
      if (!found && d <= hi - lo) {
        int w = snprintf(out + o, outlen - o, "%0*llu", width, lo + d);
        if (w < 0 || (size_t)w >= outlen - o) goto too_long;
        o += (size_t)w;
        found = 1;
      } else if (!found) {
        d -= hi - lo + 1;
      }
      if (*p++ == ']') break;
    }
  }
  out[o] = 0;
  return 0;
too_long:
  if (outlen) out[0] = 0;
  return dcomm__err(DCOMM_EINVAL, "hostlist '%.200s': host name '%.*s' is longer than %zu bytes", expr, (int)it->len,
                    it->s, outlen ? outlen - 1 : 0);
}

/* Validates the whole expression; *total hosts. */
static int hl_validate(const char *expr, int *total) {
  struct hl_item it;
  const char *pos = expr;
  unsigned long long sum = 0;
  int items = 0;
  if (!expr) return dcomm__err(DCOMM_EINVAL, "hostlist: no expression (NULL)");
  while (hl_next(&pos, &it)) {
    DCOMM_CHECK(hl_scan(expr, &it));
    sum += it.total;
    items++;
    if (sum > DCOMM_HOSTLIST_MAX)
      return dcomm__err(DCOMM_EINVAL, "hostlist '%.200s' expands to more than %d hosts", expr, DCOMM_HOSTLIST_MAX);
  }
  if (!items) return dcomm__err(DCOMM_EINVAL, "hostlist '%.200s' names no host", expr);
  *total = (int)sum;
  return 0;
}

int dcomm__hostlist_count(const char *expr, int *n) {
  int total;
  DCOMM_CHECK(hl_validate(expr, &total));
  *n = total;
  return 0;
}

int dcomm__hostlist_first(const char *expr, char *out, size_t outlen) {
  int total;
  struct hl_item it;
  if (!out || outlen == 0) return dcomm__err(DCOMM_EINVAL, "hostlist: no output buffer");
  out[0] = 0;
  DCOMM_CHECK(hl_validate(expr, &total));
  const char *pos = expr;
  hl_next(&pos, &it);
  DCOMM_CHECK(hl_scan(expr, &it));
  return hl_name(expr, &it, 0, out, outlen);
}

void dcomm__hostlist_free(char **hosts, int n) {
  if (!hosts) return;
  for (int i = 0; i < n; i++) free(hosts[i]);
  free(hosts);
}

int dcomm__hostlist_expand(const char *expr, char ***hosts, int *n) {
  int total, k = 0, rc = 0;
  struct hl_item it;
  char name[HL_MAX_NAME];
  *hosts = NULL;
  *n = 0;
  DCOMM_CHECK(hl_validate(expr, &total));
  char **v = calloc((size_t)total, sizeof(*v));
  if (!v) return dcomm__err(DCOMM_ENOMEM, "hostlist: out of memory for %d hosts", total);
  const char *pos = expr;
  while (rc == 0 && hl_next(&pos, &it)) {
    if ((rc = hl_scan(expr, &it)) < 0) break;
    for (unsigned long long i = 0; i < it.total && rc == 0; i++) {
      if ((rc = hl_name(expr, &it, i, name, sizeof(name))) < 0) break;
      if (!(v[k] = strdup(name))) rc = dcomm__err(DCOMM_ENOMEM, "hostlist: out of memory");
      else k++;
    }
  }
  if (rc < 0) {
    dcomm__hostlist_free(v, k);
    return rc;
  }
  *hosts = v;
  *n = k;
  return 0;
}
