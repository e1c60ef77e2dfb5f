/*
 * log.c: one line per event on stderr, "[dcomm host:pid r<rank> g<gen>] LEVEL
 * subsys: message", filtered by level and subsystem.
 */
#include "config.h"
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static int log_level = DCOMM_LOG_WARN;
static unsigned log_mask = ~0u;
static char log_filter[256]; /* DCOMM_LOG_SUBSYS, "" for all */
static int log_rank = -1;
static long log_gen = 0;
static char log_host[64];

#define MAX_SUBSYS 32
static const char *subsys_names[MAX_SUBSYS] = {
#define X(id, name) name,
    DCOMM_SUBSYS_TABLE(X)
#undef X
};
static char subsys_store[MAX_SUBSYS][33]; /* names registered at run time */
static int nsubsys = DCOMM_SUB_COUNT;
static pthread_mutex_t subsys_lock = PTHREAD_MUTEX_INITIALIZER;

/* Whether the filter names name. */
static int filter_has(const char *name) {
  if (!log_filter[0]) return 1;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", log_filter);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
    if (!strcasecmp(t, name)) return 1;
  return 0;
}

int dcomm__log_subsys(const char *name) {
  pthread_mutex_lock(&subsys_lock);
  int id = DCOMM_SUB_INIT;
  for (int i = 0; i < nsubsys; i++)
    if (!strcasecmp(subsys_names[i], name)) id = i;
  if (id == DCOMM_SUB_INIT && strcasecmp(name, "init") && nsubsys < MAX_SUBSYS) {
    id = nsubsys++;
    snprintf(subsys_store[id], sizeof(subsys_store[id]), "%s", name);
    subsys_names[id] = subsys_store[id];
    if (filter_has(name)) log_mask |= 1u << id;
    else log_mask &= ~(1u << id);
  }
  pthread_mutex_unlock(&subsys_lock);
  return id;
}

void dcomm__log_setup(void) {
  const char *lv = getenv("DCOMM_LOG_LEVEL");
  if (lv) {
    if (!strcasecmp(lv, "error")) log_level = DCOMM_LOG_ERROR;
    else if (!strcasecmp(lv, "warn")) log_level = DCOMM_LOG_WARN;
    else if (!strcasecmp(lv, "info")) log_level = DCOMM_LOG_INFO;
    else if (!strcasecmp(lv, "debug") || !strcasecmp(lv, "trace")) log_level = DCOMM_LOG_DEBUG;
  }
  const char *ss = getenv("DCOMM_LOG_SUBSYS");
  snprintf(log_filter, sizeof(log_filter), "%s", ss && strcasecmp(ss, "all") ? ss : "");
  log_mask = 0;
  for (int i = 0; i < nsubsys; i++)
    if (filter_has(subsys_names[i])) log_mask |= 1u << i;
  gethostname(log_host, sizeof(log_host) - 1);
}

/* Any thread logs (the tcp listener, watchers, workers) while a recovery
 * changes the identity: both are read and written atomically. */
void dcomm__log_set_identity(int rank, long generation) {
  __atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED);
  __atomic_store_n(&log_gen, generation, __ATOMIC_RELAXED);
}

int dcomm__log_enabled(int level, int subsys) {
  return level <= log_level && (level == DCOMM_LOG_ERROR || (log_mask >> subsys) & 1u);
}

void dcomm__log(int level, int subsys, const char *fmt, ...) {
  static const char *const lvname[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char msg[1024], rk[16];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  int rank = __atomic_load_n(&log_rank, __ATOMIC_RELAXED);
  long gen = __atomic_load_n(&log_gen, __ATOMIC_RELAXED);
  if (rank >= 0) snprintf(rk, sizeof(rk), "%d", rank);
  else snprintf(rk, sizeof(rk), "-");
  /* One fprintf so that lines of concurrent processes do not interleave. */
  fprintf(stderr, "[dcomm %s:%d r%s g%ld] %s %s: %s\n", log_host[0] ? log_host : "?", (int)getpid(), rk, gen,
          lvname[level], subsys >= 0 && subsys < nsubsys ? subsys_names[subsys] : "?", msg);
}
