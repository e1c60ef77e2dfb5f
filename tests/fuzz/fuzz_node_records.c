/*
 * fuzz_node_records.c: fuzz target for the records that dcomm-run and the
 * elastic rounds write to the store and read back (elastic/keys.c,
 * elastic/rounds.c, used by launcher/run_status.c and rounds.c). The first
 * byte picks what the rest of the input is (a store value, as read):
 *   0: a node record (rdzv/agent/<slot>): dcomm__node_record_parse, then
 *      dcomm__node_record_has_pid for the pids it lists and for others;
 *      a record formatted from what was parsed parses back the same;
 *   1: a ticket (elastic/join/<g>/m/<t>, DCOMM_TICKET_FMT):
 *      dcomm__ticket_parse, and its formatted form parses back the same;
 *   2: "member-id" NUL then a round plan (elastic/plan/<g>):
 *      dcomm__plan_parse; a member's rank must name that member;
 *   3: a launcher's worker list (rdzv/workers/<slot>), line by line as its
 *      readers split it: dcomm__worker_line_parse;
 *   4: ckpt/last: dcomm__ckpt_last_parse.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "fuzz_util.h"
#include "keys.h"
#include "rounds.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Each pid of a record's list "P1,P2,..." as has_pid walks it must be found. */
static void check_pids(const char *pids) {
  int steps = 0;
  for (const char *p = pids; p && *p && *p != ' ' && steps < 4096; steps++) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    if (!dcomm__node_record_has_pid(pids, v)) abort();
    p = *end == ',' ? end + 1 : end;
  }
}

static void node_record(const uint8_t *d, size_t n) {
  char *rec = fuzz_cstr(d, n);
  long live = -1;
  const char *pids = NULL;
  if (dcomm__node_record_parse(rec, &live, &pids) == 0) {
    if (live < 0) abort();
    if (pids && (pids < rec || pids > rec + strlen(rec))) abort();
    check_pids(pids);
    (void)dcomm__node_record_has_pid(pids, 0);
    (void)dcomm__node_record_has_pid(pids, -1);
    /* What a launcher writes with that count and list reads back so. */
    if (live <= 1 << 30 && (!pids || strlen(pids) < DCOMM_NODE_PIDS_TEXT - 8)) {
      char list[DCOMM_NODE_PIDS_TEXT], buf[DCOMM_NODE_RECORD_MAX];
      size_t pl = pids ? strcspn(pids, " ") : 0;
      if (pids) snprintf(list, sizeof(list), " pids=%.*s", (int)pl, pids);
      if (dcomm__node_record_format(buf, sizeof(buf), (int)live, 4, "host", 1234, pids ? list : NULL) < 0) abort();
      long live2;
      const char *pids2;
      if (dcomm__node_record_parse(buf, &live2, &pids2) != 0 || live2 != live || !pids != !pids2) abort();
      if (pids && strncmp(pids, pids2, pl) != 0) abort();
    }
  } else if (pids) {
    abort(); /* a malformed record has no list */
  }
  free(rec);
}

static void ticket(const uint8_t *d, size_t n) {
  struct dcomm_ticket t, t2;
  if (dcomm__ticket_parse(d, n, &t) != 0) return;
  if (!t.id[0] || memchr(t.id, 0, sizeof(t.id)) == NULL) abort();
  char buf[256];
  int k = snprintf(buf, sizeof(buf), DCOMM_TICKET_FMT, t.id, t.old_rank, (long)t.slot, t.local_rank, t.pid, t.old_gen,
                   t.old_size);
  if (k < 0 || (size_t)k >= sizeof(buf)) abort();
  if (dcomm__ticket_parse(buf, (size_t)k + 1, &t2) != 0 || strcmp(t.id, t2.id) || t.old_rank != t2.old_rank ||
      t.slot != t2.slot || t.local_rank != t2.local_rank || t.pid != t2.pid || t.old_gen != t2.old_gen ||
      t.old_size != t2.old_size)
    abort();
}

static void plan(const uint8_t *d, size_t n) {
  char *f[2];
  int nf = fuzz_fields(d, n, f, 2);
  if (nf == 2) {
    /* The plan is the value's bytes, its NUL (when the input has one) included. */
    size_t off = strlen(f[0]) + 1, len = n - off;
    char *val = malloc(len ? len : 1);
    if (!val) abort();
    memcpy(val, d + off, len);
    int rank = -2, sz = -2;
    char(*ids)[40] = (void *)1;
    int rc = dcomm__plan_parse(val, len, f[0], &rank, &sz, &ids);
    if (rc < 0 && rc != DCOMM_EPROTO) abort();
    if (rank >= 0) {
      if (rc != 0 || !ids || rank >= sz || strncmp(ids[rank], f[0], 39) != 0) abort();
    } else if (ids) {
      abort(); /* not in it: nothing to free */
    }
    free(ids);
    free(val);
  }
  fuzz_fields_free(f, nf);
}

static void workers(const uint8_t *d, size_t n) {
  char *list = fuzz_cstr(d, n), *save = NULL;
  for (char *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    int rank, lr;
    long pid;
    char id[40];
    if (dcomm__worker_line_parse(line, &rank, &lr, &pid, id) == 0 && (!id[0] || !memchr(id, 0, sizeof(id)))) abort();
  }
  free(list);
}

static void ckpt_last(const uint8_t *d, size_t n) {
  char *text = fuzz_cstr(d, n);
  unsigned long long step;
  long long gen;
  char name[64];
  if (dcomm__ckpt_last_parse(text, &step, &gen, name, sizeof(name)) == 0 && !memchr(name, 0, sizeof(name))) abort();
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 65536) return 0;
  const uint8_t *d = data + 1;
  size_t n = size - 1;
  switch (data[0] % 5) {
    case 0: node_record(d, n); break;
    case 1: ticket(d, n); break;
    case 2: plan(d, n); break;
    case 3: workers(d, n); break;
    default: ckpt_last(d, n); break;
  }
  return 0;
}
