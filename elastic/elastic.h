/*
 * elastic.h: what the composition root (src/init/init.c) calls of the
 * elastic layer: the heartbeat/revoke watcher (watcher.c) and the entry of
 * a joining member (generation.c).
 */
#ifndef DCOMM_ELASTIC_HOOKS_H
#define DCOMM_ELASTIC_HOOKS_H

struct dcomm_world;

/* Starts the watcher thread (heartbeats, revoke notices) on w->estore. */
int dcomm__elastic_start(struct dcomm_world *w);
void dcomm__elastic_stop(struct dcomm_world *w);
/* A member that enters a running job (or a rendezvous' first world). */
int dcomm__elastic_join(struct dcomm_world *w);

#endif
