/*
 * fuzz_checkpoint.c: fuzz target for what dcomm reads back from a
 * checkpoint directory (elastic/checkpoint_file.c, checkpoint_commit.c):
 * the first byte picks what the rest of the input is:
 *   0: a checkpoint file (header, CRCs, payload, truncation), read with
 *      dcomm__ckpt_read_file;
 *   1: the COMMITTED list, next to one good checkpoint, read with
 *      dcomm__ckpt_read_committed: whatever the list says, what comes back
 *      is that good checkpoint or DCOMM_ENOTFOUND, never other bytes;
 *   2: one commit record line, parsed and formatted back.
 * Files live in a private directory under /dev/shm (else /tmp), removed at
 * exit.
 */
#include "config.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint_file.h"
#include "dcomm.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[256], good_path[512], list_path[512], file_path[512];
static const char good_payload[] = "the one intact, committed checkpoint";

static void cleanup(void) {
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) { /* best effort */ }
}

static void setup(void) {
  setenv("DCOMM_LOG_LEVEL", "error", 1); /* skipped files are warnings: keep the fuzzer quiet */
  snprintf(dir, sizeof(dir), "%s/dcomm-fuzz-ckpt-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  if (!mkdtemp(dir)) abort();
  atexit(cleanup);
  struct dcomm_ckpt_rec rec;
  if (dcomm__ckpt_write(dir, 7, 1, good_payload, sizeof(good_payload), &rec) < 0) abort();
  if (dcomm__ckpt_join_path(good_path, sizeof(good_path), dir, rec.name) < 0) abort();
  snprintf(list_path, sizeof(list_path), "%s/%s", dir, DCOMM_CKPT_COMMIT_FILE);
  snprintf(file_path, sizeof(file_path), "%s/fuzzed.dcp", dir);
}

static void put_file(const char *path, const uint8_t *d, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || (n && dcomm__ckpt_write_all(fd, d, n) < 0)) abort();
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    setup();
    ready = 1;
  }
  if (size < 1 || size > 65536) return 0;
  uint8_t mode = data[0] % 3;
  data++;
  size--;
  void *out = NULL;
  size_t len = 0;
  struct dcomm_ckpt_info info;
  if (mode == 0) {
    put_file(file_path, data, size);
    int rc = dcomm__ckpt_read_file(file_path, &out, &len, &info);
    if (rc == 0 && info.len != len) abort();
    if (rc < 0 && (out || len)) abort();
  } else if (mode == 1) {
    put_file(list_path, data, size);
    int rc = dcomm__ckpt_read_committed(dir, NULL, &out, &len, &info);
    if (rc == 0 && (len != sizeof(good_payload) || memcmp(out, good_payload, len) != 0)) abort();
    if (rc < 0 && rc != DCOMM_ENOTFOUND) abort();
    /* The reader must never delete the good file, whatever the list says. */
    if (access(good_path, R_OK) != 0) abort();
  } else {
    char *text = fuzz_cstr(data, size);
    struct dcomm_ckpt_rec r;
    if (dcomm__ckpt_rec_parse(text, &r) == 0) {
      char back[DCOMM_CKPT_REC_TEXT];
      if (dcomm__ckpt_rec_format(&r, back, sizeof(back)) < 0) abort();
      struct dcomm_ckpt_rec r2;
      if (dcomm__ckpt_rec_parse(back, &r2) != 0 || r.step != r2.step || r.generation != r2.generation ||
          r.len != r2.len || r.header_crc != r2.header_crc || r.payload_crc != r2.payload_crc ||
          strcmp(r.name, r2.name) != 0)
        abort();
    }
    free(text);
  }
  free(out);
  return 0;
}
