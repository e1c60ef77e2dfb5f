/*
 * keys.c: the node record format and the store helpers of keys.h, shared
 * by the elastic layer and dcomm-run.
 */
#include "config.h"
#include "keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "store.h"

int dcomm__node_record_format(char *buf, size_t n, int live, int nproc, const char *host, long pid, const char *pids) {
  int k = snprintf(buf, n, "%d %d %s %ld%s", live, nproc, host, pid, pids ? pids : "");
  return k < 0 || (size_t)k >= n ? dcomm__err(DCOMM_EINVAL, "node record longer than %zu bytes", n) : k;
}

int dcomm__node_record_parse(const char *rec, long *live, const char **pids) {
  *pids = NULL;
  if (sscanf(rec, "%ld", live) != 1 || *live < 0) return -1;
  const char *p = strstr(rec, " pids=");
  if (p) *pids = p + 6;
  return 0;
}

int dcomm__node_record_has_pid(const char *pids, long pid) {
  for (const char *p = pids; p && *p && *p != ' ';) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    if (v == pid) return 1;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

int dcomm__ticket_parse(const void *val, size_t len, struct dcomm_ticket *t) {
  char buf[128] = "";
  if (len < sizeof(buf)) memcpy(buf, val, len);
  memset(t, 0, sizeof(*t));
  t->old_gen = -1;
  t->old_size = -1;
  if (sscanf(buf, "%39s %d %d %d %ld %ld %d", t->id, &t->old_rank, &t->slot, &t->local_rank, &t->pid, &t->old_gen,
             &t->old_size) < 2)
    return -1;
  return 0;
}

int dcomm__worker_line_parse(const char *line, int *rank, int *local_rank, long *pid, char id[40]) {
  return sscanf(line, "%d %d %ld %39s", rank, local_rank, pid, id) == 4 ? 0 : -1;
}

int dcomm__ckpt_last_parse(const char *text, unsigned long long *step, long long *gen, char *name, size_t n) {
  char nm[256];
  if (n == 0 || sscanf(text, "%llu %lld %255s", step, gen, nm) != 3) return -1;
  snprintf(name, n, "%s", nm);
  return 0;
}

int dcomm__store_peek(struct dcomm_store *s, const char *key, char *buf, size_t n) {
  void *val = NULL;
  size_t len = 0;
  int rc = dcomm__store_get(s, key, 0, &val, &len);
  if (rc == DCOMM_ETIMEDOUT) return 0;
  if (rc < 0) return rc;
  if (len >= n) len = n - 1;
  memcpy(buf, val, len);
  buf[len] = 0;
  free(val);
  return 1;
}

long dcomm__store_peek_long(struct dcomm_store *s, const char *key, long dflt) {
  char buf[32], *end;
  if (dcomm__store_peek(s, key, buf, sizeof(buf)) != 1) return dflt;
  long v = strtol(buf, &end, 10);
  return end == buf ? dflt : v;
}

int dcomm__post_revoke(struct dcomm_store *s, long gen, const char *why) {
  char key[64];
  void *cur = NULL;
  size_t clen = 0;
  snprintf(key, sizeof(key), DCOMM_KEY_REVOKE_FMT, gen);
  int rc = dcomm__store_compare_set(s, key, NULL, 0, why, strlen(why) + 1, &cur, &clen);
  free(cur);
  return rc;
}
