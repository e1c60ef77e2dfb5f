/*
 * checkpoint.h: crash-safe checkpoint files. One process (rank 0) writes
 * <dir>/ckpt-<step as %012llu>.dcp through a temporary file, fsync and an
 * atomic rename, so that a crash at any point leaves the last committed
 * checkpoint readable; readers pick the newest file whose header and CRCs
 * are valid and skip torn or corrupt ones.
 *
 * File format (all integers little-endian, serialized field by field):
 *   off  0  magic "DCOMMCKP"   8 bytes
 *   off  8  u32 version        1
 *   off 12  u32 header_crc     CRC32 of the 48-byte header with this field 0
 *   off 16  u64 step
 *   off 24  i64 generation
 *   off 32  u64 payload_len    at most DCOMM_CKPT_MAX_PAYLOAD
 *   off 40  u32 payload_crc    CRC32 of the payload
 *   off 44  u32 reserved       0
 *   off 48  payload, exactly payload_len bytes, then end of file
 * CRC32 is zlib's crc32().
 *
 * Steps are expected to grow: "newest" means the highest step.
 */
#ifndef DCOMM_ELASTIC_CHECKPOINT_H
#define DCOMM_ELASTIC_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#define DCOMM_CKPT_MAGIC "DCOMMCKP"
#define DCOMM_CKPT_VERSION 1u
#define DCOMM_CKPT_HEADER_SIZE 48
#define DCOMM_CKPT_MAX_PAYLOAD (64ull << 30) /* 64 GiB */

struct dcomm_ckpt_info {
  uint64_t step;
  int64_t generation;
  uint64_t len;
  char path[1024];
};

/* Writes <dir>/ckpt-<step as %012llu>.dcp: a temp file in dir
 * (".ckpt-<step>.tmp.<pid>", which never matches ckpt-*.dcp), write all,
 * fsync, rename, fsync the dir; then deletes older checkpoints so that at most
 * keep (>= 1) remain (the file just written is never deleted) and removes
 * temp files left over by crashed writers. Creates dir (mkdir -p) if missing.
 * data may be NULL when len is 0. Returns 0, DCOMM_EINVAL (bad argument),
 * DCOMM_ESYSTEM / DCOMM_ENOMEM (a system call failed; the detail names the
 * file and the call). If only the final fsync of the directory fails, the
 * new file is already in place but may not survive a power loss, and the call
 * fails. A failure to prune once the checkpoint is committed is logged as a
 * warning and does not fail the call. */
int dcomm__ckpt_write(const char *dir, uint64_t step, int64_t generation, const void *data, size_t len, int keep);

/* Finds the newest checkpoint in dir whose header and CRCs are valid; a torn
 * or corrupt newer one is skipped with a warning naming the file and why.
 * On success *data is malloc'd (NULL when *len is 0; the caller frees it) and
 * info, when not NULL, is filled. DCOMM_ENOTFOUND (with detail) when none is
 * valid or dir does not exist; other errors (DCOMM_ESYSTEM, DCOMM_ENOMEM) are
 * returned as they are rather than silently falling back to an older file. */
int dcomm__ckpt_read_latest(const char *dir, void **data, size_t *len, struct dcomm_ckpt_info *info);

/* Validates and reads one file. DCOMM_EPROTO when it is torn or corrupt (bad
 * magic, version, header CRC, length or payload CRC), DCOMM_ENOTFOUND when it
 * does not exist, DCOMM_ESYSTEM / DCOMM_ENOMEM otherwise. On failure *data is
 * NULL and *len 0. info may be NULL. */
int dcomm__ckpt_read_file(const char *path, void **data, size_t *len, struct dcomm_ckpt_info *info);

#endif
