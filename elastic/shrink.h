/*
 * shrink.h: the shrink path of the generation transition (shrink.c): the
 * survivors turn every communicator into the next generation's without a
 * new rendezvous, where the backend can.
 */
#ifndef DCOMM_ELASTIC_SHRINK_H
#define DCOMM_ELASTIC_SHRINK_H

struct dcomm_world;

/* Whether the plan is the old members less the dead ones, in order, and the
 * backend can shrink (DCOMM_ELASTIC_SHRINK). */
int dcomm__shrink_applies(const struct dcomm_world *w, char (*plan)[40], char (*old_members)[40], int old_size);
/* Shrinks the world and every sub-group (takes plan). 0 done; 1: released
 * and renumbered, build anew; < 0 an error. */
int dcomm__elastic_shrink(struct dcomm_world *w, char (*plan)[40], char (*old_members)[40], int old_size);

#endif
