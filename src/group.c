/*
 * group.c: process groups. dcomm_new_group (collective over the world) and
 * dcomm_group_split (collective over the parent) compute the member list
 * the same way on every rank and give it a communicator id derived from the
 * call's position and its members, so a rank that passed a different list
 * cannot be wired into the wrong communicator. dcomm_new_group_named is
 * collective over its members only: its id comes from the world's id, the
 * name and the members, which every member knows without the others.
 */
#include "config.h"
#include "world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "log.h"
#include "sock.h"
#include "store.h"

/* Handed out when a group cannot be created: every call refuses it, so a
 * caller who ignores the error does not silently use the world (NULL). */
static struct dcomm_group invalid_group = {.label = "invalid group"};

int dcomm__group_resolve(dcomm_group_t g, const char *call, struct dcomm_group **out) {
  if (!dcomm__w.initialized) return dcomm__err(DCOMM_ENOTINIT, "dcomm is not initialized (call dcomm_init first)");
  struct dcomm_group *grp = g ? g : &dcomm__w.world;
  if (g) {
    struct dcomm_group *it = dcomm__w.groups;
    while (it && it != g) it = it->next;
    if (!it) return dcomm__err(DCOMM_EINVAL, "group handle %p is not a live group (freed, or from another init)", (void *)g);
  }
  if (call && !grp->is_member)
    return dcomm__err(DCOMM_ENOTMEMBER, "%s%s: world rank %d is not a member of %s, created by %s on this rank",
                      strncmp(call, "dcomm_", 6) ? "dcomm_" : "", call, dcomm__w.rank, grp->label,
                      grp->origin[0] ? grp->origin : "an earlier call");
  *out = grp;
  return 0;
}

struct dcomm_comm_spec dcomm__group_spec(const struct dcomm_group *grp) {
  return (struct dcomm_comm_spec){.comm_id = grp->id,
                                  .rank = grp->rank,
                                  .size = grp->size,
                                  .world_ranks = grp->world_ranks,
                                  .deadline = dcomm__now() + grp->timeout,
                                  .label = grp->label};
}

void dcomm__group_set_comm(struct dcomm_group *grp, void *bcomm) {
  pthread_mutex_lock(&dcomm__w.lock); /* the elastic watcher aborts what it finds */
  grp->bcomm = bcomm;
  pthread_mutex_unlock(&dcomm__w.lock);
}

int dcomm__group_connect(struct dcomm_group *grp) {
  struct dcomm_comm_spec spec = dcomm__group_spec(grp);
  void *bc = NULL;
  int rc = dcomm__w.be->comm_create(dcomm__w.be_ctx, &spec, &bc);
  dcomm__group_set_comm(grp, rc < 0 ? NULL : bc);
  if (rc < 0) return dcomm__err_ctx(rc, "creating the communicator of %s", grp->label);
  return 0;
}

void dcomm__group_release(struct dcomm_group *grp) {
  if (grp->bcomm) dcomm__w.be->comm_destroy(grp->bcomm);
  grp->bcomm = NULL;
  free(grp->world_ranks);
  grp->world_ranks = NULL;
}

/* Gives grp its communicator: split from parent's when the backend can
 * (every member of parent takes part, members of grp with color), else a
 * new one on the members alone (always when parent is NULL). */
static int group_attach(struct dcomm_group *grp, struct dcomm_group *parent, int color) {
  int (*split)(void *, int, const struct dcomm_comm_spec *, void **) = DCOMM_BACKEND_OP(dcomm__w.be, comm_split);
  if (split && parent && parent->bcomm) {
    struct dcomm_comm_spec spec = dcomm__group_spec(grp);
    void *bc = NULL;
    int rc = split(parent->bcomm, grp->is_member ? color : -1, grp->is_member ? &spec : NULL, &bc);
    dcomm__group_set_comm(grp, rc == 0 ? bc : NULL);
    if (rc == 0) return 0;
    if (rc != DCOMM_ENOTSUP) return dcomm__err_ctx(rc, "splitting the communicator of %s from %s", grp->label, parent->label);
    DCOMM_LOG(DEBUG, GROUP, "%s: no split from %s (%s): a new communicator", grp->label, parent->label, dcomm_last_error());
  }
  return grp->is_member ? dcomm__group_connect(grp) : 0;
}

/* "dcomm_new_group([0, 2, 5])", "dcomm_new_group_named(\"x\", [1, 3])" or
 * "dcomm_group_split(world, color 1) as [0, 2]": for messages that name
 * the group's creation (long lists end with "..."). */
static void set_origin(struct dcomm_group *grp, const char *kind, const char *name, const struct dcomm_group *parent,
                       int color) {
  char ranks[120];
  size_t n = 0;
  ranks[0] = 0;
  for (int i = 0; i < grp->size && n < sizeof(ranks); i++) {
    if (n + 16 >= sizeof(ranks)) {
      snprintf(ranks + n, sizeof(ranks) - n, ", ...");
      break;
    }
    n += (size_t)snprintf(ranks + n, sizeof(ranks) - n, "%s%d", i ? ", " : "", grp->world_ranks[i]);
  }
  if (!strcmp(kind, "group_split")) {
    if (color < 0)
      snprintf(grp->origin, sizeof(grp->origin), "dcomm_group_split(%s, color %d): a negative color gives a "
               "non-member handle", parent ? parent->label : "?", color);
    else
      snprintf(grp->origin, sizeof(grp->origin), "dcomm_group_split(%s, color %d) as world ranks [%s]",
               parent ? parent->label : "?", color, ranks);
  } else if (name) {
    snprintf(grp->origin, sizeof(grp->origin), "dcomm_%s(\"%.22s\", [%s])", kind, name, ranks);
  } else {
    snprintf(grp->origin, sizeof(grp->origin), "dcomm_%s([%s])", kind, ranks);
  }
}

/* Makes a group from world ranks (already validated) on every member of
 * parent (NULL: on its own members only); color as for group_attach;
 * name: dcomm_new_group_named's, or NULL. */
static int make_group(uint64_t id, const int *world_ranks, int n, double timeout, struct dcomm_group *parent, int color,
                      const char *kind, const char *name, dcomm_group_t *out) {
  struct dcomm_group *grp = calloc(1, sizeof(*grp));
  if (!grp) return dcomm__err(DCOMM_ENOMEM, "%s: out of memory", kind);
  grp->world_ranks = malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (!grp->world_ranks) {
    free(grp);
    return dcomm__err(DCOMM_ENOMEM, "%s: out of memory", kind);
  }
  memcpy(grp->world_ranks, world_ranks, sizeof(int) * (size_t)n);
  grp->id = id;
  grp->size = n;
  grp->rank = -1;
  grp->timeout = timeout;
  for (int i = 0; i < n; i++)
    if (world_ranks[i] == dcomm__w.rank) grp->rank = i;
  grp->is_member = grp->rank >= 0;
  if (name) {
    snprintf(grp->name, sizeof(grp->name), "%s", name);
    snprintf(grp->label, sizeof(grp->label), "group \"%.22s\"", name);
  } else {
    snprintf(grp->label, sizeof(grp->label), "group %016llx", (unsigned long long)id);
  }
  set_origin(grp, kind, name, parent, color);
  int rc = group_attach(grp, parent, color);
  if (rc < 0) {
    free(grp->world_ranks);
    free(grp);
    return rc;
  }
  pthread_mutex_lock(&dcomm__w.lock); /* the elastic watcher walks the list */
  grp->next = dcomm__w.groups;
  dcomm__w.groups = grp;
  pthread_mutex_unlock(&dcomm__w.lock);
  DCOMM_LOG(INFO, GROUP, "%s: %s of %d ranks, my rank %d", kind, grp->label, n, grp->rank);
  *out = grp;
  return 0;
}

/* Checks a list of world ranks for a new group: in range, none twice. */
static int check_ranks(const char *what, const int *world_ranks, int n) {
  if (n < 1 || n > dcomm__w.size || !world_ranks)
    return dcomm__err(DCOMM_EINVAL, "%s: %d ranks requested from a world of %d", what, n, dcomm__w.size);
  char *seen = calloc((size_t)dcomm__w.size, 1);
  if (!seen) return dcomm__err(DCOMM_ENOMEM, "%s: out of memory", what);
  for (int i = 0; i < n; i++) {
    int r = world_ranks[i];
    if (r < 0 || r >= dcomm__w.size || seen[r]) {
      free(seen);
      return dcomm__err(DCOMM_EINVAL, "%s: rank %d at position %d is %s", what, r, i,
                        r < 0 || r >= dcomm__w.size ? "out of range" : "listed twice");
    }
    seen[r] = 1;
  }
  free(seen);
  return 0;
}

int dcomm_new_group(const int *world_ranks, int n, dcomm_group_t *group) {
  struct dcomm_group *world;
  DCOMM_CHECK(dcomm__group_resolve(NULL, "dcomm_new_group", &world));
  if (!group) return dcomm__err(DCOMM_EINVAL, "dcomm_new_group: group is NULL");
  *group = &invalid_group;
  DCOMM_CHECK(check_ranks("dcomm_new_group", world_ranks, n));
  uint64_t serial = dcomm__w.new_groups++;
  uint64_t id = dcomm__hash64(world->id ^ (serial * 0x9e3779b97f4a7c15ull), world_ranks, sizeof(int) * (size_t)n);
  return make_group(id, world_ranks, n, world->timeout, world, 0, "new_group", NULL, group);
}

int dcomm_new_group_named(const char *name, const int *world_ranks, int n, dcomm_group_t *group) {
  struct dcomm_group *world;
  DCOMM_CHECK(dcomm__group_resolve(NULL, "dcomm_new_group_named", &world));
  if (!group) return dcomm__err(DCOMM_EINVAL, "dcomm_new_group_named: group is NULL");
  *group = &invalid_group;
  if (!name || !*name) return dcomm__err(DCOMM_EINVAL, "dcomm_new_group_named: the name is %s", name ? "empty" : "NULL");
  size_t len = strlen(name);
  if (len > DCOMM__GROUP_NAME_MAX)
    return dcomm__err(DCOMM_EINVAL, "dcomm_new_group_named: the name is %zu bytes long (at most %d)", len,
                      DCOMM__GROUP_NAME_MAX);
  char what[DCOMM__GROUP_NAME_MAX + 48];
  snprintf(what, sizeof(what), "dcomm_new_group_named(\"%s\")", name);
  DCOMM_CHECK(check_ranks(what, world_ranks, n));
  /* No communication here, so a repeated name with the same members
   * would give two groups one communicator id: refused. */
  for (struct dcomm_group *g = dcomm__w.groups; g; g = g->next)
    if (g->size == n && !strcmp(g->name, name) && !memcmp(g->world_ranks, world_ranks, sizeof(int) * (size_t)n))
      return dcomm__err(DCOMM_EINVAL, "%s: a live group of that name with these %d ranks exists (%s); free it first",
                        what, n, g->label);
  /* Distinct from dcomm_new_group's ids (which hash a serial), different
   * per generation (the world's id) and per name. */
  uint64_t seed = dcomm__hash64(world->id ^ 0x6e616d6564677270ull, name, len); /* "namedgrp" */
  uint64_t id = dcomm__hash64(seed, world_ranks, sizeof(int) * (size_t)n);
  return make_group(id, world_ranks, n, world->timeout, NULL, 0, "new_group_named", name, group);
}

struct split_entry {
  int32_t color, key, parent_rank;
};

static int cmp_split(const void *a, const void *b) {
  const struct split_entry *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->parent_rank < y->parent_rank ? -1 : x->parent_rank > y->parent_rank;
}

/* Every member of p publishes (color, key) and reads everyone's, in one
 * all-gather through the store (O(size) store requests in all). */
static int split_exchange(struct dcomm_group *p, int32_t color, int32_t key, int32_t *all) {
  char k[96];
  int32_t mine[2] = {color, key};
  snprintf(k, sizeof(k), "split/%016llx/%llu", (unsigned long long)p->id, (unsigned long long)p->splits);
  void *got = NULL;
  size_t glen = 0;
  int rc = dcomm__store_allgather(dcomm__w.store, k, p->rank, p->size, mine, sizeof(mine), p->timeout, &got, &glen);
  if (rc < 0) return dcomm__err_ctx(rc, "dcomm_group_split on %s: a member never called split", p->label);
  const uint64_t *off = got;
  for (int r = 0; r < p->size; r++) {
    uint64_t a, b;
    memcpy(&a, off + r, sizeof(a));
    memcpy(&b, off + r + 1, sizeof(b));
    if (b - a != sizeof(mine)) {
      free(got);
      return dcomm__err(DCOMM_EPROTO, "dcomm_group_split: malformed entry of rank %d", r);
    }
    memcpy(all + 2 * r, (const char *)got + a, sizeof(mine));
  }
  free(got);
  return 0;
}

int dcomm_group_split(dcomm_group_t parent, int color, int key, dcomm_group_t *group) {
  struct dcomm_group *p;
  DCOMM_CHECK(dcomm__group_resolve(parent, "dcomm_group_split", &p));
  if (!group) return dcomm__err(DCOMM_EINVAL, "dcomm_group_split: group is NULL");
  *group = &invalid_group;
  int32_t *all = malloc(sizeof(int32_t) * 2 * (size_t)p->size);
  struct split_entry *ent = malloc(sizeof(*ent) * (size_t)p->size);
  int *members = malloc(sizeof(int) * (size_t)p->size);
  if (!all || !ent || !members) {
    free(all), free(ent), free(members);
    return dcomm__err(DCOMM_ENOMEM, "dcomm_group_split: out of memory");
  }
  /* Colors and keys travel through the store, not the backend: a GPU
   * backend's collectives take device memory only. */
  int rc = split_exchange(p, color < 0 ? -1 : color, key, all);
  int n = 0;
  if (rc == 0 && color >= 0) {
    for (int i = 0; i < p->size; i++)
      if (all[2 * i] == color) ent[n++] = (struct split_entry){all[2 * i], all[2 * i + 1], i};
    qsort(ent, (size_t)n, sizeof(*ent), cmp_split);
    for (int i = 0; i < n; i++) members[i] = p->world_ranks[ent[i].parent_rank];
  }
  uint64_t serial = p->splits++;
  if (rc == 0) {
    uint64_t seed = p->id ^ ((serial + 1) * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(uint32_t)color << 32);
    uint64_t id = dcomm__hash64(seed, members, sizeof(int) * (size_t)n);
    rc = make_group(id, members, n, p->timeout, p, color < 0 ? -1 : color, "group_split", NULL, group); /* n is 0 for color < 0 */
  }
  free(all), free(ent), free(members);
  return rc;
}

int dcomm_group_rank(dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, "dcomm_group_rank", &grp));
  return grp->rank;
}

int dcomm_group_size(dcomm_group_t g) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, NULL, &grp));
  return grp->size;
}

int dcomm_group_world_rank(dcomm_group_t g, int group_rank) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, NULL, &grp));
  if (group_rank < 0 || group_rank >= grp->size)
    return dcomm__err(DCOMM_EINVAL, "rank %d is not in %s of size %d", group_rank, grp->label, grp->size);
  return grp->world_ranks[group_rank];
}

int dcomm_group_set_timeout(dcomm_group_t g, double seconds) {
  struct dcomm_group *grp;
  DCOMM_CHECK(dcomm__group_resolve(g, NULL, &grp));
  if (!(seconds > 0)) return dcomm__err(DCOMM_EINVAL, "timeout must be positive, got %g", seconds);
  grp->timeout = seconds;
  return 0;
}

int dcomm_group_free(dcomm_group_t g) {
  struct dcomm_group *grp;
  if (!g) return dcomm__err(DCOMM_EINVAL, "dcomm_group_free: the world group cannot be freed (use dcomm_finalize)");
  DCOMM_CHECK(dcomm__group_resolve(g, NULL, &grp));
  pthread_mutex_lock(&dcomm__w.lock);
  struct dcomm_group **pp = &dcomm__w.groups;
  while (*pp != grp) pp = &(*pp)->next;
  *pp = grp->next;
  pthread_mutex_unlock(&dcomm__w.lock);
  dcomm__group_release(grp);
  free(grp);
  return 0;
}

int dcomm__groups_ordered(struct dcomm_group ***order, int *n) {
  int k = 0;
  for (struct dcomm_group *g = dcomm__w.groups; g; g = g->next) k++;
  *order = malloc(sizeof(**order) * (size_t)(k ? k : 1));
  if (!*order) return dcomm__err(DCOMM_ENOMEM, "out of memory");
  *n = k;
  for (struct dcomm_group *g = dcomm__w.groups; g; g = g->next) (*order)[--k] = g;
  return 0;
}

static int cmp_member(const void *a, const void *b) {
  return strcmp(dcomm__w.members[*(const int *)a], dcomm__w.members[*(const int *)b]);
}

int *dcomm__members_map(char (*old_members)[40], int old_size) {
  struct dcomm_world *w = &dcomm__w;
  int *map = malloc(sizeof(int) * (size_t)(old_size > 0 ? old_size : 1));
  int *by_id = malloc(sizeof(int) * (size_t)(w->size > 0 ? w->size : 1));
  if (!map || !by_id) {
    free(map);
    free(by_id);
    dcomm__err(DCOMM_ENOMEM, "out of memory");
    return NULL;
  }
  /* The new world's ranks sorted by member id, then one search per old
   * member: n log n, not n^2. */
  for (int r = 0; r < w->size; r++) by_id[r] = r;
  if (w->members) qsort(by_id, (size_t)w->size, sizeof(int), cmp_member);
  for (int old = 0; old < old_size; old++) {
    int lo = 0, hi = w->members ? w->size : 0;
    map[old] = -1;
    while (lo < hi) {
      int mid = lo + (hi - lo) / 2, c = strcmp(w->members[by_id[mid]], old_members[old]);
      if (c == 0) {
        map[old] = by_id[mid];
        break;
      }
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
  }
  free(by_id);
  return map;
}

int dcomm__group_renumber(struct dcomm_group *g, const int *map, int old_size, int *gone) {
  struct dcomm_world *w = &dcomm__w;
  int k = 0, ngone = 0;
  for (int j = 0; j < g->size; j++) {
    int old = g->world_ranks[j];
    int now = old >= 0 && old < old_size ? map[old] : -1;
    if (now >= 0) g->world_ranks[k++] = now;
    else if (gone) gone[ngone] = j;
    ngone += now < 0;
  }
  g->size = k;
  g->rank = -1;
  for (int j = 0; j < k; j++)
    if (g->world_ranks[j] == w->rank) g->rank = j;
  g->is_member = g->rank >= 0;
  g->id = dcomm__hash64(g->id ^ (uint64_t)w->generation, "rebuild", 7);
  g->seq = 0;
  g->splits = 0;
  return ngone;
}

/* Groups are rebuilt in creation order so that every member creates them
 * in the same order. */
int dcomm__groups_rebuild(char (*old_members)[40], int old_size) {
  struct dcomm_group **order = NULL;
  int n = 0, rc = 0;
  int *map = NULL;
  if (old_size >= 0 && !(map = dcomm__members_map(old_members, old_size))) return DCOMM_ENOMEM;
  rc = dcomm__groups_ordered(&order, &n);
  for (int i = 0; i < n && rc == 0; i++) {
    struct dcomm_group *g = order[i];
    if (map) dcomm__group_renumber(g, map, old_size, NULL);
    if (g->is_member) rc = dcomm__group_connect(g);
    DCOMM_LOG(INFO, GROUP, "rebuilt %s: %d members, my rank %d", g->label, g->size, g->rank);
  }
  free(order);
  free(map);
  return rc;
}
