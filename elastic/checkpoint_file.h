/*
 * checkpoint_file.h: crash-safe, fenced checkpoint files. One process (rank 0)
 * writes <dir>/ckpt-<step>-g<generation>.dcp through a temporary file,
 * fsync and an atomic rename; the file counts only once it is committed: a
 * record naming it (and its CRCs) in <dir>/COMMITTED, written after the job's
 * store accepted the same record from a writer of the current generation
 * (checkpoint_coll.c). A crash at any point leaves the last committed checkpoint
 * readable; readers take the newest committed record whose file is intact
 * and never read a file that no record names.
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
 * "Newest" means the highest generation, then the highest step.
 */
#ifndef DCOMM_ELASTIC_CHECKPOINT_FILE_H
#define DCOMM_ELASTIC_CHECKPOINT_FILE_H

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
  uint32_t header_crc, payload_crc;
  char path[1024];
};

/* A commit record: which file holds a committed checkpoint, and what it
 * must contain. Text form (dcomm__ckpt_rec_format / _parse), one line:
 *   "<step> <generation> <payload length> <header crc> <payload crc> <name>"
 * with the CRCs in hex. The directory keeps the newest records in
 * <dir>/COMMITTED ("dcomm-checkpoint-commits 1", then one record a line,
 * newest first), written through a temp file, fsync and rename under an
 * flock of <dir>/.commit.lock. */
#define DCOMM_CKPT_COMMIT_FILE "COMMITTED"
#define DCOMM_CKPT_REC_TEXT 160
struct dcomm_ckpt_rec {
  uint64_t step;
  int64_t generation;
  uint64_t len;
  uint32_t header_crc, payload_crc;
  char name[64]; /* ckpt-<step as %012llu>-g<generation>.dcp */
};
int dcomm__ckpt_rec_format(const struct dcomm_ckpt_rec *r, char *buf, size_t n);
/* 0, or DCOMM_EPROTO when text is not a record. */
int dcomm__ckpt_rec_parse(const char *text, struct dcomm_ckpt_rec *r);

/* Writes <dir>/ckpt-<step as %012llu>-g<generation>.dcp: a temp file in dir
 * (".ckpt-<step>.tmp.<pid>", which never matches ckpt-*.dcp), write all,
 * fsync, rename, fsync the dir; creates dir (mkdir -p) if missing, and fills
 * rec (may be NULL) with the file's commit record. The file does not count
 * until it is committed (dcomm__ckpt_commit); a writer of an older
 * generation cannot replace it, since the name carries the generation.
 * data may be NULL when len is 0. Returns 0, DCOMM_EINVAL (bad argument),
 * DCOMM_ESYSTEM / DCOMM_ENOMEM (a system call failed; the detail names the
 * file and the call). If only the final fsync of the directory fails, the
 * new file is already in place but may not survive a power loss, and the
 * call fails. */
int dcomm__ckpt_write(const char *dir, uint64_t step, int64_t generation, const void *data, size_t len,
                      struct dcomm_ckpt_rec *rec);

/* Adds rec to <dir>/COMMITTED (kept sorted newest first: by generation,
 * then step; at most keep >= 1 records), then deletes every ckpt-*.dcp file
 * the list does not name and the temp files of crashed writers. A failure
 * to prune is logged as a warning and does not fail the call. */
int dcomm__ckpt_commit(const char *dir, const struct dcomm_ckpt_rec *rec, int keep);

/* Reads the newest committed checkpoint that is intact: the records of
 * <dir>/COMMITTED, plus also (may be NULL: the job's store's record, which
 * may be newer than the file when the writer died in between), newest
 * first; a file that is missing, torn, corrupt or not the one its record
 * describes is skipped with a warning naming it and why, and the previous
 * record is used. Files that no record names (never committed: written by
 * a fenced or crashed writer) are never read; each is named in a warning.
 * On success *data is malloc'd (NULL when *len is 0; the caller frees it)
 * and info, when not NULL, is filled. DCOMM_ENOTFOUND (with detail) when no
 * committed checkpoint is intact or dir does not exist; other errors
 * (DCOMM_ESYSTEM, DCOMM_ENOMEM) are returned as they are. */
int dcomm__ckpt_read_committed(const char *dir, const struct dcomm_ckpt_rec *also, void **data, size_t *len,
                               struct dcomm_ckpt_info *info);

/* Validates and reads one file. DCOMM_EPROTO when it is torn or corrupt (bad
 * magic, version, header CRC, length or payload CRC), DCOMM_ENOTFOUND when it
 * does not exist, DCOMM_ESYSTEM / DCOMM_ENOMEM otherwise. On failure *data is
 * NULL and *len 0. info may be NULL. */
int dcomm__ckpt_read_file(const char *path, void **data, size_t *len, struct dcomm_ckpt_info *info);

/* Shared by checkpoint_file.c and checkpoint_commit.c: I/O that retries
 * EINTR and short transfers (0 or -errno; read_full sets *got), fsync that
 * retries EINTR (0 or -1 with errno), and "dir/name" into buf
 * (DCOMM_EINVAL when it does not fit). */
int dcomm__ckpt_write_all(int fd, const void *buf, size_t len);
int dcomm__ckpt_read_full(int fd, void *buf, size_t len, size_t *got);
int dcomm__ckpt_fsync(int fd);
int dcomm__ckpt_join_path(char *buf, size_t cap, const char *dir, const char *name);

#endif
