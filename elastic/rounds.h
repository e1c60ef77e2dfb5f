/*
 * rounds.h: the recovery rounds (rounds.c), used by the generation
 * transition (generation.c).
 */
#ifndef DCOMM_ELASTIC_ROUNDS_H
#define DCOMM_ELASTIC_ROUNDS_H

#include <stddef.h>
#include <stdint.h>

struct dcomm_world;

/* Joins rounds from gen on (through w->jstore) until a plan includes this
 * member; sets w->generation, w->rank and w->size. old_rank and old_size:
 * this member's place in generation gen - 1 (-1: a joiner). Its plan's
 * member ids go to *plan (w->size entries, the caller frees them) when
 * plan is not NULL; *missed (may be NULL) says whether a generation was
 * formed without it on the way. */
int dcomm__rounds_join(struct dcomm_world *w, long gen, int old_rank, int old_size, char (**plan)[40], int *missed);

/* Rank 0 of generation gen (size members; n tickets taken in round
 * gen + 1) asks whether the next round could admit any of those joiners:
 * 0 when the world is already as large as --nnodes MAX x the nodes' nproc,
 * or when every waiting joiner is on a node beyond the MAX nodes the world
 * already spans (a spare node). 1 otherwise (also when it cannot tell). */
struct dcomm_store;
int dcomm__rounds_admissible(struct dcomm_store *s, long gen, int size, int64_t n);

/* Reads the plan of a round (len bytes in plan, which it changes, NUL
 * last): *size members; *rank: me's place in it, or -1 when it is not
 * there or the plan is short (then *ids is NULL), else its member ids in
 * rank order go to *ids (*size entries, the caller frees them). 0, or
 * DCOMM_EPROTO when malformed. */
int dcomm__plan_parse(char *plan, size_t len, const char *me, int *rank, int *size, char (**ids)[40]);

#endif
