/*
 * checkin.c: the check-in of dcomm_init's first world, before it is wired.
 * Every rank publishes the world size it was told; rank 0 reads those of
 * its world and publishes a verdict every rank waits for, so that a
 * disagreement or a rank that never came fails every rank at once, each
 * naming what to fix. When the first world then cannot be built within
 * DCOMM_CONNECT_TIMEOUT, rank 0 names the ranks that checked in but never
 * began building it, and the others report rank 0's word.
 */
#include "config.h"
#include "checkin.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "param.h"
#include "store.h"

/* The names of the world size and the store address in messages. */
static const char *size_var(const struct dcomm_init_spec *spec) {
  return spec->kind == DCOMM_IM_ENV ? "WORLD_SIZE" : "the world size (WORLD_SIZE or ?world_size=)";
}

/* The check-in's keys (job-wide, generation 0). */
#define CHECKIN_SIZE_PREFIX "g0/init/size/"
#define CHECKIN_SIZE CHECKIN_SIZE_PREFIX "%d" /* the world size each rank was told */
#define CHECKIN_EXTRA "g0/init/extra"      /* a rank beyond rank 0's world: the disagreement */
#define CHECKIN_VERDICT "g0/init/verdict"  /* rank 0's: "0 ok" or "<code> <message>" */
#define CHECKIN_ACK "g0/init/verdict_read" /* the ranks that read a failing verdict */
#define BUILD_FAILED "g0/init/build_failed" /* rank 0's: "<code> <message>" */
#define BUILD_ACK "g0/init/build_failed_read"
/* How long rank 0, failing, keeps the store it hosts for the others to
 * read why (it returns as soon as all of them did). */
#define VERDICT_GRACE_S 2.0

/* Rank 0, after a failure it published in the store it hosts: waits
 * (bounded) until want ranks have read it, so that its exit does not take
 * the store away from them first. */
static void await_readers(struct dcomm_world *w, const char *key, int64_t want) {
  int64_t got = 0;
  for (double until = dcomm__now() + VERDICT_GRACE_S; w->server && want > 0 && dcomm__now() < until; usleep(2000))
    if (dcomm__store_add(w->jstore, key, 0, &got) < 0 || got >= want) return;
}

/* "<code> <message>" as published by rank 0: the code, message in *msg. */
static int parse_verdict(const char *val, size_t len, const char **msg) {
  char *end = NULL;
  long code = len && val[len - 1] == 0 ? strtol(val, &end, 10) : 1;
  if (!end || *end != ' ' || code > 0 || code < -100) {
    *msg = "a malformed verdict in the store";
    return DCOMM_EPROTO;
  }
  *msg = end + 1;
  return (int)code;
}

/* A world size as published: a NUL-terminated decimal, else -1. */
static long parse_size(const void *val, size_t len) {
  return val && len && ((const char *)val)[len - 1] == 0 ? strtol(val, NULL, 10) : -1;
}

static int read_size(struct dcomm_world *w, int r, double until, long *size) {
  char key[64];
  void *val = NULL;
  size_t len = 0;
  double left = until - dcomm__now();
  snprintf(key, sizeof(key), CHECKIN_SIZE, r);
  DCOMM_CHECK(dcomm__store_get(w->jstore, key, left > 0.001 ? left : 0.001, &val, &len));
  *size = parse_size(val, len);
  free(val);
  return 0;
}

/* Rank 0: the world sizes of ranks 1..n-1, read at once (get_many) within
 * until. 0, or DCOMM_ETIMEDOUT with *missing the ranks never seen (their
 * sizes[r] -1, *first the lowest), or another error. */
static int read_sizes(struct dcomm_world *w, double until, long *sizes, int *missing, int *first) {
  int n = w->size - 1;
  void **vals = calloc((size_t)n, sizeof(*vals));
  size_t *lens = calloc((size_t)n, sizeof(*lens));
  int rc = vals && lens ? 0 : dcomm__err(DCOMM_ENOMEM, "check-in: out of memory");
  double left = until - dcomm__now();
  if (rc == 0)
    rc = dcomm__store_get_numbered(w->jstore, CHECKIN_SIZE_PREFIX, 1, n, left > 0.001 ? left : 0.001, NULL, NULL,
                                   vals, lens);
  *missing = 0;
  *first = -1;
  for (int i = 0; (rc == 0 || rc == DCOMM_ETIMEDOUT) && i < n; i++) {
    sizes[i + 1] = vals[i] ? parse_size(vals[i], lens[i]) : -1;
    if (!vals[i] && (*missing)++ == 0) *first = i + 1;
    free(vals[i]);
  }
  free(vals);
  free(lens);
  return rc;
}

/* Rank 0's side of the check-in: reads the world size of every rank of
 * its world, and publishes the verdict every rank returns. */
static int check_in_rank0(struct dcomm_world *w, const struct dcomm_init_spec *spec, double until) {
  double ct = dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT);
  char msg[600] = "", verdict[620];
  int code = 0, missing = 0, first = -1;
  long *sizes = calloc((size_t)w->size, sizeof(*sizes));
  if (!sizes) return dcomm__err(DCOMM_ENOMEM, "check-in: out of memory");
  int rc = w->size > 1 ? read_sizes(w, until, sizes, &missing, &first) : 0;
  if (rc < 0 && rc != DCOMM_ETIMEDOUT) {
    free(sizes);
    return dcomm__err_ctx(rc, "reading the world sizes of %d ranks from the store", w->size - 1);
  }
  /* A disagreement names both values; it is told before a rank that never came. */
  for (int r = 1; r < w->size && !code; r++)
    if (sizes[r] != -1 && sizes[r] != w->size) {
      code = DCOMM_EINVAL;
      snprintf(msg, sizeof(msg), "%s disagrees between ranks: world rank 0 was told %d, world rank %d was told %ld; "
                                 "give every rank the same value", size_var(spec), w->size, r, sizes[r]);
    }
  free(sizes);
  if (!code && missing) {
    code = DCOMM_ETIMEDOUT;
    char more[64] = "";
    if (missing > 1) snprintf(more, sizeof(more), " (and %d more ranks)", missing - 1);
    snprintf(msg, sizeof(msg), "world rank %d%s never reached the store within DCOMM_CONNECT_TIMEOUT=%g s: did it "
                               "start, and does its MASTER_ADDR:MASTER_PORT (or init URL) name this store (%s:%d)?",
             first, more, ct, spec->host, spec->port);
  }
  if (!code) { /* a rank beyond this world, told a larger size, may have said so */
    void *val = NULL;
    size_t len = 0;
    rc = dcomm__store_get(w->jstore, CHECKIN_EXTRA, 0.001, &val, &len);
    if (rc == 0) {
      code = DCOMM_EINVAL;
      snprintf(msg, sizeof(msg), "%.*s", len && ((char *)val)[len - 1] == 0 ? (int)len - 1 : 0, (char *)val);
      free(val);
    } else if (rc != DCOMM_ETIMEDOUT) {
      return dcomm__err_ctx(rc, "reading the check-in from the store");
    }
  }
  snprintf(verdict, sizeof(verdict), "%d %s", code, code ? msg : "ok");
  rc = dcomm__store_set(w->jstore, CHECKIN_VERDICT, verdict, strlen(verdict) + 1);
  if (!code) return rc;
  if (rc == 0) await_readers(w, CHECKIN_ACK, w->size - 1 - missing);
  return dcomm__err(code, "%s", msg);
}

/* Before the world is wired, every rank publishes the world size it was
 * told (a rank other than 0 after it read rank 0's). Rank 0 reads those of
 * its world and publishes a verdict that every rank waits for, so that a
 * disagreement fails every rank at once, each naming both values: a rank
 * that disagrees with rank 0 knows it from rank 0's value; one beyond
 * rank 0's world (told a larger size) tells rank 0 through CHECKIN_EXTRA,
 * which counts if it arrives before rank 0 has heard from all of its world
 * (a later one fails alone). A rank that never reaches the store fails
 * every rank within DCOMM_CONNECT_TIMEOUT (until) instead of the operation
 * timeout. */
int dcomm__checkin(struct dcomm_world *w, const struct dcomm_init_spec *spec, double until) {
  double ct = dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT);
  char own[64], mine[16], msg[600];
  snprintf(mine, sizeof(mine), "%d", w->size);
  snprintf(own, sizeof(own), CHECKIN_SIZE, w->rank);
  if (w->rank == 0) {
    DCOMM_CHECK(dcomm__store_set(w->jstore, own, mine, strlen(mine) + 1));
    return check_in_rank0(w, spec, until);
  }
  long theirs;
  int rc = read_size(w, 0, until, &theirs);
  if (rc == DCOMM_ETIMEDOUT)
    return dcomm__err(rc, "world rank 0 did not check in at the store within DCOMM_CONNECT_TIMEOUT=%g s", ct);
  if (rc < 0) return dcomm__err_ctx(rc, "reading world rank 0's world size from the store");
  rc = dcomm__store_set(w->jstore, own, mine, strlen(mine) + 1);
  int64_t dummy;
  if (theirs != w->size) {
    const char *fmt = "%s disagrees between ranks: world rank 0 was told %ld, world rank %d%s was told %d; give every "
                      "rank the same value";
    /* Rank 0 does not read the size of a rank beyond its world: tell it.
     * One of its world it reads; then it waits for this rank to be done. */
    if (w->rank >= theirs) {
      snprintf(msg, sizeof(msg), fmt, size_var(spec), theirs, w->rank, "", w->size);
      (void)dcomm__store_set(w->jstore, CHECKIN_EXTRA, msg, strlen(msg) + 1);
    } else {
      (void)dcomm__store_add(w->jstore, CHECKIN_ACK, 1, &dummy);
    }
    snprintf(msg, sizeof(msg), fmt, size_var(spec), theirs, w->rank, " (this rank)", w->size);
    return dcomm__err(DCOMM_EINVAL, "%s", msg);
  }
  if (rc < 0) return rc;
  /* Rank 0 decides by its deadline at the latest; its clock started first. */
  void *val = NULL;
  size_t len = 0;
  double left = until + 1.0 - dcomm__now();
  rc = dcomm__store_get(w->jstore, CHECKIN_VERDICT, left > 0.001 ? left : 0.001, &val, &len);
  if (rc == DCOMM_ETIMEDOUT)
    return dcomm__err(rc, "world rank 0 did not say within DCOMM_CONNECT_TIMEOUT=%g s whether every rank checked in",
                      ct);
  if (rc < 0) return dcomm__err_ctx(rc, "reading world rank 0's verdict on the check-in");
  const char *text;
  int code = parse_verdict(val, len, &text);
  if (code < 0) {
    snprintf(msg, sizeof(msg), "%s", text);
    free(val);
    (void)dcomm__store_add(w->jstore, CHECKIN_ACK, 1, &dummy);
    return dcomm__err(code, "%s", msg);
  }
  free(val);
  return 0;
}

/* DCOMM_INIT_TEST_STALL_RANK: this world rank stalls after it checked
 * in, as a rank that was stopped or hangs there would. */
void dcomm__checkin_test_stall(struct dcomm_world *w) {
  if (dcomm__param_int(DCOMM_P_INIT_TEST_STALL_RANK) != w->rank) return;
  double s = dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT) + 1.0;
  DCOMM_LOG(WARN, INIT, "DCOMM_INIT_TEST_STALL_RANK=%d: stalling %.1f s after the check-in", w->rank, s);
  usleep((useconds_t)(s * 1e6));
}

/* The first world could not be built within DCOMM_CONNECT_TIMEOUT (rc, the
 * message set). Rank 0 knows most (a rank other than 0 waits for rank 0's
 * directory, so its own message names rank 0): it names the ranks that
 * checked in but never began building the world and publishes its
 * message, which the others add to theirs. */
int dcomm__first_world_failed(struct dcomm_world *w, int rc) {
  char own[700], msg[1000];
  char hint[96] = "";
  if (rc == DCOMM_ETIMEDOUT)
    snprintf(hint, sizeof(hint), " (the first world must be built within DCOMM_CONNECT_TIMEOUT=%g s)",
             dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT));
  snprintf(own, sizeof(own), "%s%s", dcomm_last_error(), hint);
  int64_t dummy;
  if (w->rank == 0) {
    char list[200] = "";
    int nmiss = 0;
    size_t used = 0;
    for (int r = 1; r < w->size; r++) {
      char key[64];
      void *val = NULL;
      size_t len = 0;
      snprintf(key, sizeof(key), "g0/member/%d", r);
      int grc = dcomm__store_get(w->jstore, key, 0.001, &val, &len);
      free(val);
      if (grc != DCOMM_ETIMEDOUT) {
        if (grc < 0) break;
        continue;
      }
      if (nmiss++ < 8 && used < sizeof(list))
        used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%d", nmiss > 1 ? ", " : "", r);
    }
    if (nmiss)
      snprintf(msg, sizeof(msg), "%d %s; world rank%s %s%s checked in but never began building the world (stopped, "
                                 "or hung after the check-in?)", rc, own, nmiss > 1 ? "s" : "", list,
               nmiss > 8 ? ", ..." : "");
    else
      snprintf(msg, sizeof(msg), "%d %s", rc, own);
    if (dcomm__store_set(w->jstore, BUILD_FAILED, msg, strlen(msg) + 1) == 0)
      await_readers(w, BUILD_ACK, w->size - 1 - nmiss);
    return dcomm__err(rc, "%s", strchr(msg, ' ') + 1);
  }
  void *val = NULL;
  size_t len = 0;
  if (dcomm__store_get(w->jstore, BUILD_FAILED, VERDICT_GRACE_S, &val, &len) == 0) {
    const char *text;
    if (parse_verdict(val, len, &text) < 0) { /* this rank's own error names rank 0: in the log */
      DCOMM_LOG(INFO, INIT, "building the first world: %s", own);
      snprintf(msg, sizeof(msg), "the first world could not be built; world rank 0 reports: %s", text);
      rc = dcomm__err(rc, "%s", msg);
    }
    free(val);
    (void)dcomm__store_add(w->jstore, BUILD_ACK, 1, &dummy);
    return rc;
  }
  return dcomm__err(rc, "%s", own);
}
