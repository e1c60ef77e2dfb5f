/*
 * generation.c: the generation transition, in one place. A failure in
 * generation g (or joiners waiting at a checkpoint) leads here:
 * dcomm_elastic_recover posts the revoke notice of g, aborts every
 * communicator of g, takes part in the rounds (rounds.c) until a plan
 * includes this member, then either shrinks every communicator in place
 * (shrink.c) or releases them and builds the world of the new generation
 * (world.c) and every sub-group (group.c). dcomm__elastic_join is the same
 * for a member that enters the job. The elastic getters of the public API
 * live here too, with dcomm_elastic_revoke (the first half of a recovery,
 * for programs whose other threads must leave their calls first).
 */
#include "config.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm_elastic.h"
#include "elastic.h"
#include "error.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "rounds.h"
#include "shrink.h"
#include "sock.h"
#include "store.h"
#include "world.h"

int dcomm__elastic_join(struct dcomm_world *w) {
  long gen = dcomm__store_peek_long(w->jstore, DCOMM_KEY_GEN, 0);
  DCOMM_LOG(INFO, ELASTIC, "joining the job after generation %ld", gen);
  DCOMM_CHECK(dcomm__rounds_join(w, gen + 1, -1, -1, NULL, NULL));
  /* The job's first world: generation 0 from the launch ranks, or the
   * first round of a rendezvous (elastic/first). */
  w->joiner = w->generation > dcomm__store_peek_long(w->jstore, DCOMM_KEY_FIRST, 0);
  return 0;
}

int dcomm_elastic_revoke(void) {
  struct dcomm_world *w = &dcomm__w;
  if (!w->initialized) return dcomm__err(DCOMM_ENOTINIT, "dcomm_elastic_revoke: not initialized");
  if (!w->elastic) return dcomm__err(DCOMM_ENOTSUP, "dcomm_elastic_revoke: not in elastic mode (DCOMM_ELASTIC=1, set by dcomm-run)");
  char why[512];
  snprintf(why, sizeof(why), "rank %d: %s", w->rank, dcomm_last_error());
  DCOMM_CHECK(dcomm__post_revoke(w->jstore, w->generation, why));
  pthread_mutex_lock(&w->lock);
  dcomm__world_abort_locked(w);
  pthread_mutex_unlock(&w->lock);
  DCOMM_LOG(INFO, ELASTIC, "generation %ld revoked by this rank", w->generation);
  return 0;
}

/* DCOMM_ELASTIC_TEST_DIE_BEFORE_BUILD: in the first recovery this process
 * takes part in, the survivor of that old world rank dies once the plan is
 * made, before the communicators are built: the others must not wait out
 * DCOMM_TIMEOUT for an address it never publishes (tests/elastic_recovery.sh). */
static void die_before_build(int old_rank) {
  static int recovered_once;
  long die = dcomm__param_int(DCOMM_P_ELASTIC_TEST_DIE_BEFORE_BUILD);
  if (recovered_once++ || die < 0 || old_rank != die) return;
  DCOMM_LOG(WARN, ELASTIC, "DCOMM_ELASTIC_TEST_DIE_BEFORE_BUILD=%ld: dying before building generation %ld", die,
            __atomic_load_n(&dcomm__w.generation, __ATOMIC_ACQUIRE));
  raise(SIGKILL);
}

int dcomm_elastic_recover(void) {
  struct dcomm_world *w = &dcomm__w;
  if (!w->initialized) return dcomm__err(DCOMM_ENOTINIT, "dcomm_elastic_recover: not initialized");
  if (!w->elastic) return dcomm__err(DCOMM_ENOTSUP, "dcomm_elastic_recover: not in elastic mode (DCOMM_ELASTIC=1, set by dcomm-run)");
  char why[512];
  snprintf(why, sizeof(why), "rank %d: %s", w->rank, dcomm_last_error());
  long gen = w->generation;
  int old_rank = w->rank, old_size = w->size;
  double t0 = dcomm__now();
  DCOMM_CHECK(dcomm__post_revoke(w->jstore, gen, why));
  /* Every communicator of generation gen stops at once, so nothing waits
   * on a dead peer; releasing them (and the backend) waits for the plan,
   * since a pure shrink keeps the backend and turns them into the next
   * generation's. */
  pthread_mutex_lock(&w->lock);
  dcomm__world_abort_locked(w);
  pthread_mutex_unlock(&w->lock);
  w->shrink_failed = 0;
  char(*old_members)[40] = w->members; /* NULL after a failed attempt */
  if (!old_members) old_size = 0;       /* then the groups cannot be mapped */
  w->members = NULL;
  char(*plan)[40] = NULL;
  int missed = 0;
  int rc = dcomm__rounds_join(w, gen + 1, old_rank, old_size, &plan, &missed);
  if (rc == 0) die_before_build(old_rank);
  /* A member left out of a plan missed a generation: the others rebuilt
   * their groups without it, so it comes back like a joiner, with none.
   * Rounds that formed nothing (abandoned, leader gone) do not count. */
  int map_size = rc == 0 && !missed ? old_size : 0;
  const char *how = "rebuilt";
  if (rc == 0 && dcomm__shrink_applies(w, plan, old_members, map_size)) {
    rc = dcomm__elastic_shrink(w, plan, old_members, map_size); /* takes plan */
    if (rc == 0) how = "shrunk in place";
    if (rc == 1) { /* released, groups renumbered: build anew */
      how = "rebuilt after a failed shrink";
      rc = dcomm__world_build(w);
      if (rc == 0) rc = dcomm__groups_rebuild(NULL, -1);
    }
  } else {
    free(plan);
    dcomm__world_release(w, 1);
    if (rc == 0) rc = dcomm__world_build(w);
    if (rc == 0) rc = dcomm__groups_rebuild(old_members, map_size);
  }
  free(old_members);
  if (rc < 0) return dcomm__err_ctx(rc, "recovery from generation %ld", gen);
  DCOMM_LOG(INFO, ELASTIC, "generation %ld: rank %d of %d (was %d of %d), %s in %.3f s", w->generation, w->rank,
            w->size, old_rank, old_size, how, dcomm__now() - t0);
  return 0;
}

long dcomm_generation(void) { return dcomm__w.initialized ? dcomm__w.generation : DCOMM_ENOTINIT; }
int dcomm_elastic_enabled(void) { return dcomm__w.initialized && dcomm__w.elastic; }
int dcomm_elastic_is_joiner(void) { return dcomm__w.initialized && dcomm__w.elastic && dcomm__w.joiner; }
const char *dcomm_member_id(void) { return dcomm__w.initialized ? dcomm__w.member_id : NULL; }
int dcomm_elastic_recoverable(int err) {
  return err == DCOMM_EPEERLOST || err == DCOMM_EREVOKED || err == DCOMM_ETIMEDOUT;
}
