/*
 * dcomm_elastic.h: the elastic API. A job launched by dcomm-run (or any
 * launcher that sets DCOMM_ELASTIC=1) survives the loss of ranks: after a
 * call fails with DCOMM_EPEERLOST / DCOMM_EREVOKED / DCOMM_ETIMEDOUT, every
 * survivor calls dcomm_elastic_recover(), which agrees on the next
 * generation (survivors in their old order, then joiners), rebuilds the
 * world and every sub-group the program holds (the handles stay valid and
 * shrink), and returns. Checkpoints are written by rank 0 between two
 * barriers and read back by everyone.
 *
 * dcomm_elastic_run() wraps all of it: the user supplies the step and the
 * state (save / load callbacks).
 */
#ifndef DCOMM_ELASTIC_H
#define DCOMM_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include "dcomm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Current generation: +1 per recovery; the first world is generation 0
 * when the launcher gave the ranks (static dcomm-run, srun, mpirun), 1 when
 * the processes met through a rendezvous (dcomm-run --rdzv-backend etcd). */
DCOMM_API long dcomm_generation(void);
/* 1 if this process entered a running job (a replacement or a node that
 * came later) rather than starting in its first world: it holds none of
 * the sub-groups made before it came. 0 otherwise or when not elastic. */
DCOMM_API int dcomm_elastic_is_joiner(void);
/* 1 when running in elastic mode (DCOMM_ELASTIC=1). */
DCOMM_API int dcomm_elastic_enabled(void);
/* This process's member id (a UUID string, stable across generations). */
DCOMM_API const char *dcomm_member_id(void);
/* 1 if err is a failure recovery can repair. */
DCOMM_API int dcomm_elastic_recoverable(int err);

/* Collective over the survivors: revoke the current generation, agree on
 * the next, rebuild the world and every sub-group. On success the rank and
 * world size may have changed. */
DCOMM_API int dcomm_elastic_recover(void);

/* The first step of a recovery alone: revoke the current generation for
 * every member and abort this process's communicators, so that every call
 * in progress, in any thread, returns DCOMM_EREVOKED promptly. Callable
 * from any thread while other calls run (a program with one thread per
 * group calls it, waits for those threads to leave their calls, then calls
 * dcomm_elastic_recover). */
DCOMM_API int dcomm_elastic_revoke(void);

/* Collective over the world: barrier; rank 0 writes data (temp file, fsync,
 * rename, directory fsync, keeping the newest DCOMM_CHECKPOINT_KEEP); the
 * result is broadcast so every rank returns the same code. Only rank 0's
 * data is used (others may pass NULL, 0). */
DCOMM_API int dcomm_checkpoint_save(const char *dir, uint64_t step, const void *data, size_t len);
/* Collective: rank 0 reads the newest valid checkpoint (a torn or corrupt
 * newer one is skipped) and broadcasts it (with a backend that takes
 * device memory only, every rank reads that file itself: the directory
 * must be shared). DCOMM_ENOTFOUND on every rank when there is none.
 * *data is malloc'd; the caller frees it. */
DCOMM_API int dcomm_checkpoint_load(const char *dir, void **data, size_t *len, uint64_t *step);

struct dcomm_membership_change {
  int old_world_size, new_world_size;
  int old_rank, new_rank;
  long generation;
  double recovery_seconds; /* failure detected -> world rebuilt and restored */
  uint64_t resume_step;    /* the step the job goes on with */
  int error;               /* the error that started the recovery */
};

typedef struct dcomm_elastic_config {
  size_t size; /* sizeof(dcomm_elastic_config_t) */
  int version; /* 1 */
  uint64_t total_steps;
  uint64_t checkpoint_every; /* 0: never */
  const char *checkpoint_dir;
  /* One training step; a negative dcomm error from a collective starts a
   * recovery (if recoverable), any other negative value ends the run. */
  int (*step)(uint64_t step, void *user);
  /* Rank 0 only: serialize the state into *data (malloc'd; dcomm frees). */
  int (*save)(void **data, size_t *len, void *user);
  /* Every rank: restore the state; data NULL / len 0 means "no checkpoint:
   * start from the initial state". */
  int (*load)(const void *data, size_t len, uint64_t step, void *user);
  /* Optional: after each recovery (re-shard data, rescale a rate...). */
  void (*on_membership_change)(const struct dcomm_membership_change *c, void *user);
  void *user;
} dcomm_elastic_config_t;

#define DCOMM_ELASTIC_CONFIG_INIT {sizeof(dcomm_elastic_config_t), 1, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL}

DCOMM_API int dcomm_elastic_run(const dcomm_elastic_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* DCOMM_ELASTIC_H */
