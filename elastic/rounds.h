/*
 * rounds.h: the recovery rounds (rounds.c), used by the generation
 * transition (generation.c).
 */
#ifndef DCOMM_ELASTIC_ROUNDS_H
#define DCOMM_ELASTIC_ROUNDS_H

struct dcomm_world;

/* Joins rounds from gen on (through w->jstore) until a plan includes this
 * member; sets w->generation, w->rank and w->size. old_rank and old_size:
 * this member's place in generation gen - 1 (-1: a joiner). Its plan's
 * member ids go to *plan (w->size entries, the caller frees them) when
 * plan is not NULL; *missed (may be NULL) says whether a generation was
 * formed without it on the way. */
int dcomm__rounds_join(struct dcomm_world *w, long gen, int old_rank, int old_size, char (**plan)[40], int *missed);

#endif
