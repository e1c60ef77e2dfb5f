/*
 * store_gather.c: an all-gather through the store in O(n) requests for n
 * members, not n per member. Every member sets PREFIX/<rank>; member 0
 * reads them all, in one request per DCOMM_STORE_MAX_WAIT_KEYS where the
 * store can (get_many), and sets PREFIX/all (one value holding all of
 * them); the other members read that one value, and each member deletes
 * its own key. The tcp backend's address directory and
 * dcomm_group_split's (color, key) exchange go through it, so
 * bootstrapping a world of n ranks costs the store 3n requests instead of
 * n^2, and member 0 waits for O(n / 1024) answers, not n.
 *
 * The gathered value (dcomm_plugin.h describes it to backends): n + 1
 * offsets (uint64_t, host order) then the bytes; member r's value is the
 * bytes [off[r], off[r+1]). It is checked here before anyone indexes it.
 */
#include "config.h"
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"

/* Checks a gathered value read from the store. */
static int check_gathered(const void *all, size_t len, int n) {
  size_t head = sizeof(uint64_t) * ((size_t)n + 1);
  if (len < head) return -1;
  uint64_t off[2];
  uint64_t prev = head;
  for (int r = 0; r <= n; r++) {
    memcpy(off, (const char *)all + sizeof(uint64_t) * (size_t)r, sizeof(uint64_t));
    if (off[0] < prev || off[0] > len) return -1;
    prev = off[0];
  }
  return prev == len ? 0 : -1;
}

/* Member 0: reads every member's value (in one request per
 * DCOMM_STORE_MAX_WAIT_KEYS where the store can) and builds the gathered
 * one. */
static int gather_all(struct dcomm_store *s, const char *prefix, int n, double deadline, dcomm_store_stop_fn stop,
                      void *arg, void **all, size_t *alllen) {
  void **vals = calloc((size_t)n, sizeof(*vals));
  size_t *lens = calloc((size_t)n, sizeof(*lens));
  char each[DCOMM_STORE_MAX_KEY + 2];
  snprintf(each, sizeof(each), "%s/", prefix);
  int rc = vals && lens ? 0 : dcomm__err(DCOMM_ENOMEM, "store all-gather: out of memory");
  if (rc == 0) {
    double left = deadline - dcomm__now();
    rc = dcomm__store_get_numbered(s, each, 0, n, left > 0.001 ? left : 0.001, stop, arg, vals, lens);
  }
  if (rc == DCOMM_ETIMEDOUT) {
    int first = -1, missing = 0;
    for (int r = 0; r < n; r++)
      if (!vals[r] && missing++ == 0) first = r;
    char more[48] = "";
    if (missing > 1) snprintf(more, sizeof(more), " (and %d more members)", missing - 1);
    rc = dcomm__err(rc, "member %d of %d%s never published %s%d", first, n, more, each, first);
  }
  size_t total = sizeof(uint64_t) * ((size_t)n + 1);
  for (int r = 0; rc == 0 && r < n; r++) total += lens[r];
  unsigned char *buf = rc == 0 ? malloc(total) : NULL;
  if (rc == 0 && !buf) rc = dcomm__err(DCOMM_ENOMEM, "store all-gather: out of memory");
  if (rc == 0) {
    uint64_t off = sizeof(uint64_t) * ((size_t)n + 1);
    for (int r = 0; r <= n; r++) {
      memcpy(buf + sizeof(uint64_t) * (size_t)r, &off, sizeof(off));
      if (r < n) {
        if (lens[r]) memcpy(buf + off, vals[r], lens[r]);
        off += lens[r];
      }
    }
    *all = buf;
    *alllen = total;
  }
  for (int r = 0; vals && r < n; r++) free(vals[r]);
  free(vals);
  free(lens);
  return rc;
}

int dcomm__store_allgather(struct dcomm_store *s, const char *prefix, int rank, int n, const void *mine, size_t len,
                           double timeout, void **all, size_t *alllen) {
  return dcomm__store_allgather_stop(s, prefix, rank, n, mine, len, timeout, NULL, NULL, all, alllen);
}

int dcomm__store_allgather_stop(struct dcomm_store *s, const char *prefix, int rank, int n, const void *mine,
                                size_t len, double timeout, dcomm_store_stop_fn stop, void *arg, void **all,
                                size_t *alllen) {
  if (!all || !alllen || !prefix || n < 1 || rank < 0 || rank >= n || (len && !mine))
    return dcomm__err(DCOMM_EINVAL, "store all-gather: bad arguments");
  *all = NULL;
  *alllen = 0;
  double deadline = dcomm__now() + (timeout < 0 ? s->timeout : timeout);
  char key[DCOMM_STORE_MAX_KEY + 1];
  if (strlen(prefix) + 16 > DCOMM_STORE_MAX_KEY)
    return dcomm__err(DCOMM_EINVAL, "store all-gather: prefix of %zu bytes is too long", strlen(prefix));
  snprintf(key, sizeof(key), "%s/all", prefix);
  if (rank == 0) {
    /* Member 0's own value goes through the store too: one code path, and
     * the store checks its size as it does everyone's. */
    char own[DCOMM_STORE_MAX_KEY + 1];
    snprintf(own, sizeof(own), "%s/0", prefix);
    DCOMM_CHECK(dcomm__store_set(s, own, mine, len));
    DCOMM_CHECK(gather_all(s, prefix, n, deadline, stop, arg, all, alllen));
    int rc = dcomm__store_set(s, key, *all, *alllen);
    if (rc == 0) dcomm__store_delete(s, own, NULL); /* each member deletes its own: tidiness only */
    if (rc < 0) {
      free(*all);
      *all = NULL;
      *alllen = 0;
    }
    return rc;
  }
  char own[DCOMM_STORE_MAX_KEY + 1];
  snprintf(own, sizeof(own), "%s/%d", prefix, rank);
  DCOMM_CHECK(dcomm__store_set(s, own, mine, len));
  double left = deadline - dcomm__now();
  int rc = dcomm__store_get_stop(s, key, left > 0.001 ? left : 0.001, stop, arg, all, alllen);
  if (rc == DCOMM_EREVOKED) return rc;
  if (rc < 0) return dcomm__err_ctx(rc, "member 0 of %d never published %s", n, key);
  if (check_gathered(*all, *alllen, n) < 0) {
    free(*all);
    *all = NULL;
    *alllen = 0;
    return dcomm__err(DCOMM_EPROTO, "store all-gather: the value of %s is malformed", key);
  }
  dcomm__store_delete(s, own, NULL); /* member 0 has read it: tidiness only */
  return 0;
}
