/*
 * shrink.c: the shrink path of recovery. When the plan of the new
 * generation holds exactly the old members minus the dead ones, in their
 * old order, and the backend has the optional comm_shrink, the survivors
 * keep the backend context (no finalize / init, no new addresses or ids
 * through the store) and turn each communicator into the next
 * generation's: comm_shrink for the world, then for every sub-group in
 * creation order that lost members; a sub-group that lost none gets a new
 * communicator from the kept context (comm_shrink needs a rank to
 * exclude). The groups end up as dcomm__groups_rebuild leaves them: the
 * same renumbering (dcomm__group_renumber), ids and labels.
 *
 * The members agree on the outcome through the store (g<gen>/shrink/n:
 * +1 for success, +SHRINK_FAILED for a failure; g<gen>/shrink/end once
 * everyone succeeded or someone failed). On any failure, DCOMM_ENOTSUP
 * included, every member releases what it holds and the generation is
 * rebuilt the usual way under the store prefix g<gen>/rebuild/, so that
 * nothing the attempt wrote is read. A member that waits inside a shrink
 * for one that already gave up waits until the creation deadline (the
 * group's timeout), as for a comm_create whose peer never comes.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "param.h"
#include "shrink.h"
#include "store.h"
#include "world.h"

#define SHRINK_FAILED (INT64_C(1) << 32) /* more than any count of members */

int dcomm__shrink_applies(const struct dcomm_world *w, char (*plan)[40], char (*old_members)[40], int old_size) {
  if (!plan || !old_members || old_size <= w->size || !w->be_ctx) return 0; /* nobody lost: nothing to exclude */
  if (!dcomm__param_bool(DCOMM_P_ELASTIC_SHRINK) || !DCOMM_BACKEND_OP(w->be, comm_shrink)) return 0;
  /* The plan must be a subsequence of the old member table: no joiner,
   * survivors in their old order. */
  int next = 0;
  for (int i = 0; i < w->size; i++) {
    while (next < old_size && strcmp(old_members[next], plan[i])) next++;
    if (next++ >= old_size) return 0;
  }
  return 1;
}

/* comm_shrink of old (aborted) into g's communicator of this generation,
 * excluding the ngone ranks in gone. */
static int shrink_one(struct dcomm_world *w, struct dcomm_group *g, void *old, const int *gone, int ngone) {
  if (!old) return dcomm__err(DCOMM_ENOTSUP, "%s has no communicator to shrink (an earlier recovery failed)", g->label);
  struct dcomm_comm_spec spec = dcomm__group_spec(g);
  void *nc = NULL;
  int rc = DCOMM_BACKEND_OP(w->be, comm_shrink)(old, gone, ngone, &spec, &nc);
  if (rc < 0) return dcomm__err_ctx(rc, "shrinking the communicator of %s", g->label);
  dcomm__group_set_comm(g, nc);
  return 0;
}

/* 1 if every member of the generation succeeded (ok: this one did). */
static int agree(struct dcomm_world *w, int ok) {
  int64_t v = 0;
  int rc = dcomm__store_add(w->store, "shrink/n", ok ? 1 : SHRINK_FAILED, &v);
  if (rc == 0 && (!ok || v == w->size)) rc = dcomm__store_set(w->store, "shrink/end", "", 1);
  if (rc < 0 || !ok) return 0;
  if (v < w->size) { /* wait for the last one, or the first failure */
    void *val = NULL;
    size_t len = 0;
    rc = dcomm__store_get(w->store, "shrink/end", w->world.timeout, &val, &len);
    free(val);
    if (rc == 0) rc = dcomm__store_add(w->store, "shrink/n", 0, &v);
    if (rc < 0) DCOMM_LOG(WARN, ELASTIC, "no agreement on the shrink: %s", dcomm_last_error());
  }
  return rc == 0 && v >= w->size && v < SHRINK_FAILED;
}

int dcomm__elastic_shrink(struct dcomm_world *w, char (*plan)[40], char (*old_members)[40], int old_size) {
  struct dcomm_group **order = NULL;
  int n = 0, rc = dcomm__groups_ordered(&order, &n);
  /* Entry 0 is the world, entry i the sub-group order[i - 1]. */
  int **gone = rc == 0 ? calloc((size_t)n + 1, sizeof(*gone)) : NULL;
  int *ngone = rc == 0 ? calloc((size_t)n + 1, sizeof(*ngone)) : NULL;
  void **old = rc == 0 ? calloc((size_t)n + 1, sizeof(*old)) : NULL;
  int ok = gone && ngone && old;
  for (int i = 0; ok && i <= n; i++) {
    int size = i ? order[i - 1]->size : w->world.size;
    ok = (gone[i] = malloc(sizeof(int) * (size_t)(size ? size : 1))) != NULL;
  }
  free(w->members);
  w->members = plan; /* the new generation's member table, in rank order */
  int *map = ok ? dcomm__members_map(old_members, old_size) : NULL;
  ok = ok && map;
  if (!ok) {
    if (rc == 0) rc = dcomm__err(DCOMM_ENOMEM, "out of memory");
    dcomm__world_release(w, 1);
  } else {
    /* Every handle leaves its group first, so the watcher sees only new
     * communicators (the old ones were aborted already). */
    pthread_mutex_lock(&w->lock);
    old[0] = w->world.bcomm;
    w->world.bcomm = NULL;
    for (int i = 1; i <= n; i++) {
      old[i] = order[i - 1]->bcomm;
      order[i - 1]->bcomm = NULL;
    }
    pthread_mutex_unlock(&w->lock);
    /* The renumbering is done in full before any backend call, so a
     * failure at any group leaves every group as the rebuild expects. */
    ngone[0] = dcomm__group_renumber(&w->world, map, old_size, gone[0]);
    for (int i = 1; i <= n; i++) ngone[i] = dcomm__group_renumber(order[i - 1], map, old_size, gone[i]);
    rc = dcomm__world_enter(w);
    if (rc == 0) rc = dcomm__world_group_reset(w);
    if (rc == 0) rc = shrink_one(w, &w->world, old[0], gone[0], ngone[0]);
    for (int i = 1; i <= n && rc == 0; i++) {
      struct dcomm_group *g = order[i - 1];
      if (g->is_member) rc = ngone[i] ? shrink_one(w, g, old[i], gone[i], ngone[i]) : dcomm__group_connect(g);
      DCOMM_LOG(INFO, GROUP, "%s %s: %d members (%d lost), my rank %d", ngone[i] ? "shrunk" : "rebuilt", g->label,
                g->size, ngone[i], g->rank);
    }
    for (int i = 0; i <= n; i++)
      if (old[i]) w->be->comm_destroy(old[i]);
    if (rc < 0) DCOMM_LOG(INFO, ELASTIC, "shrink of generation %ld failed, rebuilding: %s", w->generation, dcomm_last_error());
    if (!agree(w, rc == 0)) {
      dcomm__world_release(w, 1);
      w->shrink_failed = 1;
      rc = 1;
    }
  }
  for (int i = 0; gone && i <= n; i++) free(gone[i]);
  free(gone), free(ngone), free(old), free(order), free(map);
  return rc;
}
