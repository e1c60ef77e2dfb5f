/*
 * error.h: the thread-local detail message that explains the last error,
 * and the early-return macro. The error codes themselves are dcomm.h's one
 * table, DCOMM_ERRNO_MAP.
 */
#ifndef DCOMM_ERROR_H
#define DCOMM_ERROR_H

#include "dcomm.h"

/* Records a detail message for the calling thread and returns err, so that
 * callers write: return dcomm__err(DCOMM_EINVAL, "count %zu too large", n); */
int dcomm__err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like dcomm__err, but prefixes the existing detail ("ctx: old detail"). */
int dcomm__err_ctx(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* errno-based: appends strerror(errno_value). */
int dcomm__err_sys(int errno_value, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dcomm__err_clear(void);

/* Early return on error, the NCCLCHECK way. */
#define DCOMM_CHECK(call)                                                       \
  do {                                                                          \
    int dcomm__rc = (call);                                                     \
    if (dcomm__rc < 0) return dcomm__rc;                                        \
  } while (0)

#endif
