/*
 * log.h: leveled logging (DCOMM_LOG_LEVEL=error|warn|info|debug) with a
 * subsystem filter (DCOMM_LOG_SUBSYS=init,store,...). One line per event,
 * prefixed with host, pid, rank and generation.
 */
#ifndef DCOMM_LOG_H
#define DCOMM_LOG_H

#include "dcomm_plugin.h" /* enum dcomm_log_level */

/* The core's subsystems; backends get theirs by name (dcomm__log_subsys). */
#define DCOMM_SUBSYS_TABLE(X)                                                   \
  X(INIT, "init") X(STORE, "store") X(COLL, "coll") X(GROUP, "group")           \
  X(ELASTIC, "elastic") X(PMIX, "pmix") X(ETCD, "etcd") X(RUN, "run")

enum dcomm_subsys {
#define X(id, name) DCOMM_SUB_##id,
  DCOMM_SUBSYS_TABLE(X)
#undef X
  DCOMM_SUB_COUNT
};

/* Reads DCOMM_LOG_LEVEL / DCOMM_LOG_SUBSYS; safe to call more than once. */
void dcomm__log_setup(void);
/* Identity shown in each line; rank -1 is shown as '-'. */
void dcomm__log_set_identity(int rank, long generation);
int dcomm__log_enabled(int level, int subsys);
/* The id of a subsystem named name (a backend's), registered on first use;
 * DCOMM_SUB_INIT when the table is full. */
int dcomm__log_subsys(const char *name);
void dcomm__log(int level, int subsys, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define DCOMM_LOG(level, sub, ...)                                              \
  do {                                                                          \
    if (dcomm__log_enabled(DCOMM_LOG_##level, DCOMM_SUB_##sub))                 \
      dcomm__log(DCOMM_LOG_##level, DCOMM_SUB_##sub, __VA_ARGS__);              \
  } while (0)

#endif
