/*
 * error.c: dcomm_strerror / dcomm_error_name from the one error table, and
 * the thread-local detail message behind dcomm_last_error().
 */
#include "config.h"
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <errno.h>
#include <string.h>

static __thread char last_detail[1024];

const char *dcomm_strerror(int err) {
  switch (err) {
#define X(name, value, msg) \
  case DCOMM_##name:         \
    return msg;
    DCOMM_ERRNO_MAP(X)
#undef X
  }
  return "unknown error";
}

const char *dcomm_error_name(int err) {
  switch (err) {
#define X(name, value, msg) \
  case DCOMM_##name:         \
    return "DCOMM_" #name;
    DCOMM_ERRNO_MAP(X)
#undef X
  }
  return "DCOMM_E?";
}

const char *dcomm_last_error(void) { return last_detail; }

void dcomm__err_clear(void) { last_detail[0] = 0; }

int dcomm__err(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_detail, sizeof(last_detail), fmt, ap);
  va_end(ap);
  return err;
}

int dcomm__err_ctx(int err, const char *fmt, ...) {
  char ctx[512], old[sizeof(last_detail)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof(ctx), fmt, ap);
  va_end(ap);
  memcpy(old, last_detail, sizeof(old));
  if (old[0])
    snprintf(last_detail, sizeof(last_detail), "%.400s: %.600s", ctx, old);
  else
    snprintf(last_detail, sizeof(last_detail), "%.400s: %s", ctx, dcomm_strerror(err));
  return err;
}

int dcomm__err_sys(int errno_value, const char *fmt, ...) {
  char ctx[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof(ctx), fmt, ap);
  va_end(ap);
  snprintf(last_detail, sizeof(last_detail), "%.500s: %s", ctx, strerror(errno_value));
  return errno_value == ENOMEM ? DCOMM_ENOMEM : DCOMM_ESYSTEM;
}
