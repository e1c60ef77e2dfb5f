/*
 * world.h: the process-wide state behind the public API (one world per
 * process), the group object, and the core's internal calls (world,
 * groups, collectives, control values, the plugin loader, the services
 * offered to backends). Internal to the library.
 */
#ifndef DCOMM_WORLD_H
#define DCOMM_WORLD_H

#include <pthread.h>
#include <stdint.h>

#include "dcomm.h"
#include "dcomm_plugin.h"

struct dcomm_store;
struct dcomm_store_server;

/* Longest name dcomm_new_group_named takes (bytes, without the NUL). */
#define DCOMM__GROUP_NAME_MAX 127

struct dcomm_group {
  uint64_t id;      /* communicator id, equal on every member */
  int is_member;    /* 0: a handle held by a non-member */
  int rank, size;   /* this process's rank in the group, group size */
  int *world_ranks; /* size entries */
  void *bcomm;      /* backend communicator (members only) */
  double timeout;   /* seconds per operation */
  uint64_t seq;     /* collectives issued so far */
  uint64_t splits;  /* dcomm_group_split calls on this group so far */
  char label[32];
  char name[DCOMM__GROUP_NAME_MAX + 1]; /* dcomm_new_group_named's name, else "" */
  char origin[200]; /* the call that created it: "dcomm_new_group([0, 2])", for messages */
  struct dcomm_group *next;
};

struct dcomm_world {
  int initialized;
  int rank, size, local_rank, local_size;
  long generation;
  long revoked; /* generation + 1 of the last generation the watcher aborted; 0: none */
  char job_id[256];
  char token[256];
  char listen_ip[64];
  char backend_name[33];
  struct dcomm_store *store;  /* this generation's view: keys under "g<gen>/" */
  struct dcomm_store *jstore; /* the job-wide view of the same link: no prefix */
  struct dcomm_store_server *server;
  const struct dcomm_backend_v1 *be;
  void *be_ctx, *be_module;
  struct dcomm_host host;
  struct dcomm_group world;  /* the world group (dcomm_group_t NULL) */
  struct dcomm_group *groups; /* sub-groups, newest first */
  uint64_t new_groups;        /* dcomm_new_group calls so far */
  uint64_t control_seq;       /* dcomm__control_bcast calls in this generation */
  pthread_mutex_t lock;       /* guards comms against the elastic watcher */
  /* elastic state */
  int elastic;
  char member_id[40];
  char (*members)[40];        /* member id of every world rank */
  int joiner;                 /* entered after the job's first world */
  int shrink_failed;          /* this generation is rebuilt after a failed shrink */
  int lost_hint;              /* PMIx said rank lost_hint-1 (or -1+1=0: someone) is gone; 0: none */
  int lost_hint_set;          /* set by PMIx's thread, taken by the watcher */
  struct dcomm_store *estore; /* the watcher's own store link, no prefix */
  pthread_t watcher;
  int watcher_running, watcher_stop;
  /* The watcher's pauses: a timed wait that elastic_stop cuts short (one
   * wake-up per pause, not one per 10 ms: 1024 ranks on 2 cores napping
   * in 10 ms steps made 100000 wake-ups a second during a recovery). */
  pthread_mutex_t nap_mu;
  pthread_cond_t nap_cv;
};

extern struct dcomm_world dcomm__w;

/* host.c: the struct dcomm_host of the world (host_identity: the part that
 * changes with the generation, all a shrink updates). */
void dcomm__host_fill(struct dcomm_world *w);
void dcomm__host_identity(struct dcomm_world *w);

/* world.c: builds the world of the current generation (store prefix,
 * backend, world communicator, member table) / releases every comm. */
int dcomm__world_build(struct dcomm_world *w);
/* Points the world's store handle at this generation's prefix "g<gen>/"
 * ("g<gen>/rebuild/" after a failed shrink). */
int dcomm__world_prefix(struct dcomm_world *w);
/* The steps of world_build that do not touch the backend: the store
 * prefix, log and host identity, this member's id in the store; and the
 * world group's fields for this generation (id, rank, size, identity
 * world ranks; bcomm cleared: the caller holds the old one). */
int dcomm__world_enter(struct dcomm_world *w);
int dcomm__world_group_reset(struct dcomm_world *w);
/* Aborts every communicator (they stay until released); w->lock held. */
void dcomm__world_abort_locked(struct dcomm_world *w);
void dcomm__world_release(struct dcomm_world *w, int aborted);

/* plugin_loader.c */
int dcomm__backend_load(const char *name, const struct dcomm_backend_v1 **be, void **handle);
void dcomm__backend_unload(void *handle);
/* The default a backend declares for a parameter, or NULL. */
const char *dcomm__backend_param_default(const struct dcomm_backend_v1 *be, const char *name);

/* group.c */
/* Resolves a handle (NULL: world); requires init and, if need_member, membership. */
/* g (NULL: the world) as a live group; call (e.g. "all_reduce"), when not
 * NULL, is a call that needs this rank to be a member: DCOMM_ENOTMEMBER
 * names it and how the group was created. */
int dcomm__group_resolve(dcomm_group_t g, const char *call, struct dcomm_group **out);
/* What the backend gets for a filled-in group's communicator (members
 * only): comm_create's and comm_shrink's spec. */
struct dcomm_comm_spec dcomm__group_spec(const struct dcomm_group *grp);
/* Sets grp's communicator under the world lock, which the elastic
 * watcher holds while it aborts every communicator it finds. */
void dcomm__group_set_comm(struct dcomm_group *grp, void *bcomm);
/* Creates the backend communicator for a filled-in group (members only). */
int dcomm__group_connect(struct dcomm_group *grp);
void dcomm__group_release(struct dcomm_group *grp);
/* The sub-groups in creation order, oldest first: *n entries in *order
 * (the caller frees it). */
int dcomm__groups_ordered(struct dcomm_group ***order, int *n);
/* After a recovery: each old world rank's rank in the new world (-1: gone),
 * found by member id (old_members: the previous generation's table of
 * old_size; the new one is w->members), in O(n log n). malloc'd; NULL out
 * of memory. */
int *dcomm__members_map(char (*old_members)[40], int old_size);
/* g keeps its members that are still alive, in their old order, as ranks
 * of the new world (map: dcomm__members_map); the id is re-derived from
 * the generation, sequence numbers restart; the handle stays valid.
 * Returns how many members g lost; their ranks in g before the call go to
 * gone (g->size entries) unless it is NULL. */
int dcomm__group_renumber(struct dcomm_group *g, const int *map, int old_size, int *gone);
/* Renumbers every sub-group (old_size < 0: a failed shrink already did)
 * and creates the communicators of those this rank is in, in creation
 * order. */
int dcomm__groups_rebuild(char (*old_members)[40], int old_size);

/* collectives.c: runs one op through the backend (post + wait). */
int dcomm__run_op(struct dcomm_group *grp, struct dcomm_coll_args *a, const char *what);

/* control.c: len bytes of host data from world rank 0 to every rank (the
 * runtime's own agreements); what names the call in messages. */
int dcomm__control_bcast(void *buf, size_t len, const char *what);
/* 1: those go through the store (the backend takes device memory only, or
 * DCOMM_CONTROL_PATH=store), 0: the backend's broadcast; <0: bad setting. */
int dcomm__control_via_store(void);

#endif
