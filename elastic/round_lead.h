/*
 * round_lead.h: the leader of a recovery round (round_lead.c), the member
 * that took its first ticket: it closes the round and publishes the plan.
 */
#ifndef DCOMM_ELASTIC_ROUND_LEAD_H
#define DCOMM_ELASTIC_ROUND_LEAD_H

struct dcomm_store;

/* Closes round gen and writes its plan: 0; 1 when it gave up on the round
 * at the timeout (abandoned); 2 when a later round formed a world or the
 * job moved on (this one is superseded); or an error. */
int dcomm__round_lead(struct dcomm_store *s, long gen);

/* Publishes an empty plan ("0") for round gen, unless a plan is there: the
 * members waiting for it, and those that come later, move on to the next
 * round at once instead of waiting out the timeout, and know that no
 * generation was formed without them. */
void dcomm__round_abandon(struct dcomm_store *s, long gen);

#endif
