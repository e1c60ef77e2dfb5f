/*
 * world.c: the process's world of the current generation: building it
 * (store prefix, backend, world communicator, member table), aborting and
 * releasing every communicator, and the public identity getters.
 */
#include "config.h"
#include "world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "log.h"
#include "param.h"
#include "store.h"

struct dcomm_world dcomm__w = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .nap_mu = PTHREAD_MUTEX_INITIALIZER, .nap_cv = PTHREAD_COND_INITIALIZER};

void dcomm__world_abort_locked(struct dcomm_world *w) {
  if (w->world.bcomm) w->be->comm_abort(w->world.bcomm, DCOMM_EREVOKED);
  for (struct dcomm_group *g = w->groups; g; g = g->next)
    if (g->bcomm) w->be->comm_abort(g->bcomm, DCOMM_EREVOKED);
}

/* Destroys every communicator (groups stay, without comms) and the
 * backend. aborted: the generation failed, so comms are aborted first. */
void dcomm__world_release(struct dcomm_world *w, int aborted) {
  pthread_mutex_lock(&w->lock);
  if (aborted) dcomm__world_abort_locked(w);
  for (struct dcomm_group *g = w->groups; g; g = g->next)
    if (g->bcomm) {
      w->be->comm_destroy(g->bcomm);
      g->bcomm = NULL;
    }
  if (w->world.bcomm) {
    w->be->comm_destroy(w->world.bcomm);
    w->world.bcomm = NULL;
  }
  if (w->be_ctx) w->be->finalize(w->be_ctx);
  w->be_ctx = NULL;
  pthread_mutex_unlock(&w->lock);
}

/* Reads every world rank's member id (each rank set its own before it
 * connected, so after the world exists they are all there), in one
 * request per DCOMM_STORE_MAX_WAIT_KEYS where the store can. */
static int load_members(struct dcomm_world *w) {
  int n = w->size;
  free(w->members);
  w->members = calloc((size_t)n, sizeof(*w->members));
  void **vals = calloc((size_t)n, sizeof(*vals));
  size_t *lens = calloc((size_t)n, sizeof(*lens));
  int rc = w->members && vals && lens ? 0 : dcomm__err(DCOMM_ENOMEM, "out of memory");
  if (rc == 0) rc = dcomm__store_get_numbered(w->store, "member/", 0, n, -1, NULL, NULL, vals, lens);
  for (int r = 0; rc == 0 && r < n; r++) {
    if (lens[r] == 0 || lens[r] > sizeof(w->members[r]) || ((char *)vals[r])[lens[r] - 1])
      rc = dcomm__err(DCOMM_EPROTO, "malformed member id of rank %d in the store", r);
    else
      memcpy(w->members[r], vals[r], lens[r]);
  }
  for (int r = 0; vals && r < n; r++) free(vals[r]);
  free(vals);
  free(lens);
  return rc;
}

int dcomm__world_prefix(struct dcomm_world *w) {
  char prefix[64];
  /* A rebuild after a failed shrink must not read what the attempt wrote
   * (a backend's keys per communicator id: the ids are the same). */
  snprintf(prefix, sizeof(prefix), w->shrink_failed ? "g%ld/rebuild/" : "g%ld/", w->generation);
  return dcomm__store_set_prefix(w->store, prefix);
}

int dcomm__world_enter(struct dcomm_world *w) {
  DCOMM_CHECK(dcomm__world_prefix(w));
  w->control_seq = 0; /* restarts per generation, joiners included */
  dcomm__log_set_identity(w->rank, w->generation);
  dcomm__host_identity(w);
  char key[64];
  snprintf(key, sizeof(key), "member/%d", w->rank);
  return dcomm__store_set(w->store, key, w->member_id, strlen(w->member_id) + 1);
}

int dcomm__world_group_reset(struct dcomm_world *w) {
  struct dcomm_group *wg = &w->world;
  w->new_groups = 0; /* group ids restart per generation, joiners included */
  double timeout = wg->timeout > 0 ? wg->timeout : dcomm__param_double(DCOMM_P_TIMEOUT);
  free(wg->world_ranks);
  memset(wg, 0, sizeof(*wg));
  wg->id = dcomm__hash64((uint64_t)w->generation, "world", 5);
  wg->is_member = 1;
  wg->rank = w->rank;
  wg->size = w->size;
  wg->timeout = timeout;
  snprintf(wg->label, sizeof(wg->label), "world");
  wg->world_ranks = malloc(sizeof(int) * (size_t)w->size);
  if (!wg->world_ranks) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  for (int i = 0; i < w->size; i++) wg->world_ranks[i] = i;
  return 0;
}

int dcomm__world_build(struct dcomm_world *w) {
  dcomm__host_fill(w);
  DCOMM_CHECK(dcomm__world_enter(w));
  int rc = w->be->init(&w->host, &w->be_ctx);
  if (rc < 0) {
    w->be_ctx = NULL;
    return rc;
  }
  DCOMM_CHECK(dcomm__world_group_reset(w));
  DCOMM_CHECK(dcomm__group_connect(&w->world));
  return load_members(w);
}

int dcomm_initialized(void) { return dcomm__w.initialized; }
int dcomm_rank(void) { return dcomm__w.initialized ? dcomm__w.rank : DCOMM_ENOTINIT; }
int dcomm_world_size(void) { return dcomm__w.initialized ? dcomm__w.size : DCOMM_ENOTINIT; }
int dcomm_local_rank(void) { return dcomm__w.initialized ? dcomm__w.local_rank : DCOMM_ENOTINIT; }
int dcomm_local_world_size(void) { return dcomm__w.initialized ? dcomm__w.local_size : DCOMM_ENOTINIT; }
const char *dcomm_backend_name(void) { return dcomm__w.initialized ? dcomm__w.be->name : NULL; }
