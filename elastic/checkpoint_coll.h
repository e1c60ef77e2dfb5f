/*
 * checkpoint_coll.h: what the training loop (train_loop.c) calls of the
 * checkpoint collectives beyond the public dcomm_checkpoint_save: the same
 * save, telling a failure of the checkpoint directory (the file or the
 * COMMITTED list could not be written) from a failure of the job (a lost
 * peer, a fenced generation, the store), which the loop handles by its
 * DCOMM_CHECKPOINT_ON_ERROR policy and by recovery respectively.
 */
#ifndef DCOMM_CHECKPOINT_COLL_H
#define DCOMM_CHECKPOINT_COLL_H

#include <stddef.h>
#include <stdint.h>

/* dcomm_checkpoint_save; *storage (every rank) is 1 when the error came
 * from rank 0's writes into dir, else 0. */
int dcomm__checkpoint_save(const char *dir, uint64_t step, const void *data, size_t len, int *storage);

#endif
