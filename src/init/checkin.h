/*
 * checkin.h: the check-in of dcomm_init's first world (checkin.c).
 */
#ifndef DCOMM_CHECKIN_H
#define DCOMM_CHECKIN_H

#include "init_method.h"
#include "world.h"

/* Every rank: publishes its world size and waits for rank 0's verdict
 * (rank 0: reads its world's and publishes it), by until at the latest. */
int dcomm__checkin(struct dcomm_world *w, const struct dcomm_init_spec *spec, double until);
/* DCOMM_INIT_TEST_STALL_RANK: this rank stalls after its check-in. */
void dcomm__checkin_test_stall(struct dcomm_world *w);
/* The first world's build failed with rc (message set): the error every
 * rank returns, rank 0's naming the ranks that never began building. */
int dcomm__first_world_failed(struct dcomm_world *w, int rc);

#endif
