/*
 * error.h: the one table of dcomm error codes (X-macro) and the thread-local
 * detail message that explains the last error.
 */
#ifndef DCOMM_ERROR_H
#define DCOMM_ERROR_H

#include "dcomm.h"

/* X(code, NAME, message) */
#define DCOMM_ERROR_TABLE(X)                                                    \
  X(DCOMM_SUCCESS, "DCOMM_SUCCESS", "success")                                  \
  X(DCOMM_EINVAL, "DCOMM_EINVAL", "invalid argument")                           \
  X(DCOMM_ENOTINIT, "DCOMM_ENOTINIT", "dcomm is not initialized")               \
  X(DCOMM_ETIMEDOUT, "DCOMM_ETIMEDOUT", "operation timed out")                  \
  X(DCOMM_EPEERLOST, "DCOMM_EPEERLOST", "a peer was lost")                      \
  X(DCOMM_EREVOKED, "DCOMM_EREVOKED", "communicator revoked")                   \
  X(DCOMM_EMISMATCH, "DCOMM_EMISMATCH", "ranks called mismatched collectives")  \
  X(DCOMM_ENOTSUP, "DCOMM_ENOTSUP", "operation not supported")                  \
  X(DCOMM_EAUTH, "DCOMM_EAUTH", "authentication failed")                        \
  X(DCOMM_EBACKEND, "DCOMM_EBACKEND", "backend failure")                        \
  X(DCOMM_ESYSTEM, "DCOMM_ESYSTEM", "system call failed")                       \
  X(DCOMM_ENOMEM, "DCOMM_ENOMEM", "out of memory")                              \
  X(DCOMM_ENOTMEMBER, "DCOMM_ENOTMEMBER", "not a member of the group")          \
  X(DCOMM_EPROTO, "DCOMM_EPROTO", "protocol error")                             \
  X(DCOMM_ENOTFOUND, "DCOMM_ENOTFOUND", "not found")

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
