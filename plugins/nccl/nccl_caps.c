/*
 * nccl_caps.c: the nccl backend's decisions that need no GPU, kept apart
 * so that tests/check_nccl.c checks them on any machine: which
 * fault-tolerance calls the loaded NCCL offers (version gating at build and
 * run time), the validation of a shrink or split request, NCCL result and
 * dcomm error names, and
 * the message for a communicator init that NCCL refused (two ranks of one
 * communicator on one GPU). Nothing here calls CUDA or NCCL.
 */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dnccl_version_text(int v, char *buf, size_t len) {
  int major, minor, patch;
  if (v >= 10000) { /* 2.9 and later: X*10000 + Y*100 + Z */
    major = v / 10000, minor = v % 10000 / 100, patch = v % 100;
  } else {
    major = v / 1000, minor = v % 1000 / 100, patch = v % 100;
  }
  snprintf(buf, len, "%d.%d.%d", major, minor, patch);
}

void dnccl_caps_compute(int version, const struct dnccl_syms *y, struct dnccl_caps *out) {
  out->split = y->built_split && y->have_split && version >= DNCCL_SPLIT_VERSION;
  out->shrink = y->built_shrink && y->have_shrink && version >= DNCCL_SHRINK_VERSION;
  out->revoke = y->built_revoke && y->have_revoke && version >= DNCCL_REVOKE_VERSION;
  out->group_abort = version >= DNCCL_GROUP_ABORT_VERSION;
}

struct dnccl_syms dnccl_syms_here(void) {
  struct dnccl_syms y = {DNCCL_BUILD_SPLIT, 0, DNCCL_BUILD_SHRINK, 0, DNCCL_BUILD_REVOKE, 0};
#if DNCCL_BUILD_SPLIT
  y.have_split = ncclCommSplit != NULL;
#endif
#if DNCCL_BUILD_SHRINK
  y.have_shrink = ncclCommShrink != NULL;
#endif
#if DNCCL_BUILD_REVOKE
  y.have_revoke = ncclCommRevoke != NULL;
#endif
  return y;
}

int dnccl_split_check(int color, const struct dcomm_comm_spec *spec, char *why, size_t len) {
  if (color < -1) {
    snprintf(why, len, "color %d: a color is >= 0, or -1 for none", color);
    return DCOMM_EINVAL;
  }
  if ((color < 0) != !spec) {
    snprintf(why, len, color < 0 ? "a spec with color -1 (a rank that joins no communicator has none)"
                                 : "color %d without a spec for the new communicator", color);
    return DCOMM_EINVAL;
  }
  if (spec && (spec->size < 1 || spec->rank < 0 || spec->rank >= spec->size)) {
    snprintf(why, len, "rank %d is not in a communicator of size %d", spec->rank, spec->size);
    return DCOMM_EINVAL;
  }
  return 0;
}

/* The module does not link libdcomm, so it names the codes itself. */
const char *dnccl_err_name(int code) {
  switch (code) {
  case DCOMM_SUCCESS: return "DCOMM_SUCCESS";
  case DCOMM_EINVAL: return "DCOMM_EINVAL";
  case DCOMM_ETIMEDOUT: return "DCOMM_ETIMEDOUT";
  case DCOMM_EPEERLOST: return "DCOMM_EPEERLOST";
  case DCOMM_EREVOKED: return "DCOMM_EREVOKED";
  case DCOMM_ENOTSUP: return "DCOMM_ENOTSUP";
  case DCOMM_EBACKEND: return "DCOMM_EBACKEND";
  case DCOMM_ESYSTEM: return "DCOMM_ESYSTEM";
  case DCOMM_ENOMEM: return "DCOMM_ENOMEM";
  default: return "DCOMM error";
  }
}

const char *dnccl_result_name(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "ncclSuccess";
  case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
  case ncclSystemError: return "ncclSystemError";
  case ncclInternalError: return "ncclInternalError";
  case ncclInvalidArgument: return "ncclInvalidArgument";
  case ncclInvalidUsage: return "ncclInvalidUsage";
  case ncclRemoteError: return "ncclRemoteError";
  case ncclInProgress: return "ncclInProgress";
  default: return "ncclResult (unknown)";
  }
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return x < y ? -1 : x > y;
}

int dnccl_shrink_plan(int size, int rank, const int *exclude, int nexclude, int *sorted, int *new_rank, char *why,
                      size_t len) {
  if (nexclude < 1 || !exclude) {
    snprintf(why, len, "no rank to exclude (%d given)", nexclude);
    return DCOMM_EINVAL;
  }
  if (nexclude >= size) {
    snprintf(why, len, "excluding %d of %d ranks leaves none", nexclude, size);
    return DCOMM_EINVAL;
  }
  memcpy(sorted, exclude, sizeof(int) * (size_t)nexclude);
  qsort(sorted, (size_t)nexclude, sizeof(int), cmp_int);
  int below = 0;
  for (int i = 0; i < nexclude; i++) {
    if (sorted[i] < 0 || sorted[i] >= size) {
      snprintf(why, len, "excluded rank %d is not a rank of the communicator (size %d)", sorted[i], size);
      return DCOMM_EINVAL;
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      snprintf(why, len, "rank %d is excluded twice", sorted[i]);
      return DCOMM_EINVAL;
    }
    if (sorted[i] == rank) {
      snprintf(why, len, "rank %d excludes itself: an excluded rank must not take part in the shrink", rank);
      return DCOMM_EINVAL;
    }
    below += sorted[i] < rank;
  }
  *new_rank = rank - below; /* survivors keep their order */
  return 0;
}

void dnccl_init_failure_text(ncclResult_t r, const char *detail, int dev, const char *busid, int local_rank,
                             int local_size, int ndev, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s: %s", dnccl_result_name(r), detail && *detail ? detail : "no detail");
  if (r != ncclInvalidUsage || n < 0 || (size_t)n >= len) return;
  /* NCCL says "Duplicate GPU detected" in its last-error text; other
   * misuse at init is possible, so without that text it is a likely cause. */
  int dup = detail && strstr(detail, "Duplicate GPU");
  snprintf(buf + n, len - (size_t)n,
           "; %s two ranks of one communicator on one GPU, which NCCL refuses (this rank uses CUDA device %d, "
           "bus %s; local rank %d of %d on a host with %d CUDA device(s)): give every local rank its own GPU",
           dup ? "cause:" : "a likely cause:", dev, busid && *busid ? busid : "?", local_rank, local_size, ndev);
}
