/*
 * param.c: the typed parameter registry. Each DCOMM_* variable is declared
 * once in params.def; this file parses and serves them.
 */
#include "config.h"
#include "param.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "log.h"
#include "tuning.h"

static const struct dcomm_param_info infos[DCOMM_P_COUNT] = {
#define P(id, type, def, help) {"DCOMM_" #id, DCOMM_PT_##type, def, help},
#include "params.def"
#undef P
};

union pval {
  long i;
  double d;
  size_t z;
};

static union pval values[DCOMM_P_COUNT];
static const char *strs[DCOMM_P_COUNT];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded;

int dcomm__parse_long(const char *s, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno) return DCOMM_EINVAL;
  *out = v;
  return 0;
}

int dcomm__parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || isnan(v)) return DCOMM_EINVAL;
  *out = v;
  return 0;
}

int dcomm__parse_bool(const char *s, int *out) {
  if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on")) *out = 1;
  else if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off")) *out = 0;
  else return DCOMM_EINVAL;
  return 0;
}

int dcomm__parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  if (!*s || *s == '-') return DCOMM_EINVAL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return DCOMM_EINVAL;
  unsigned long long mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1ull << 10, end++;
  else if (*end == 'm' || *end == 'M') mul = 1ull << 20, end++;
  else if (*end == 'g' || *end == 'G') mul = 1ull << 30, end++;
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end || (v && mul > ~0ull / v)) return DCOMM_EINVAL;
  *out = (size_t)(v * mul);
  return 0;
}

static int parse_one(int id, const char *s) {
  const struct dcomm_param_info *p = &infos[id];
  int b = 0;
  switch (p->type) {
    case DCOMM_PT_STR: strs[id] = s; return 0;
    case DCOMM_PT_INT: return dcomm__parse_long(s, &values[id].i);
    case DCOMM_PT_DOUBLE:
      if (dcomm__parse_double(s, &values[id].d) || !(values[id].d > 0)) return DCOMM_EINVAL;
      return 0;
    case DCOMM_PT_BOOL:
      if (dcomm__parse_bool(s, &b)) return DCOMM_EINVAL;
      values[id].i = b;
      return 0;
    case DCOMM_PT_SIZE: return dcomm__parse_size(s, &values[id].z);
  }
  return DCOMM_EINVAL;
}

/* Fills values from defaults, the tuning file and the environment, each
 * over the one before; the first bad value is the error. */
static int load_locked(void) {
  int rc = dcomm__tuning_load();
  for (int id = 0; id < DCOMM_P_COUNT; id++) {
    const char *base = infos[id].def; /* what stands when the environment's value is bad */
    const char *tuned = dcomm__tuning_value(infos[id].name);
    if (tuned && parse_one(id, tuned) == 0) {
      base = tuned;
    } else if (tuned && rc == 0) {
      rc = dcomm__err(DCOMM_EINVAL, "%s='%s' in the tuning file %s is not a valid %s", infos[id].name, tuned,
                      dcomm__tuning_path(), dcomm__param_type_name(infos[id].type));
    }
    parse_one(id, base);
    const char *env = getenv(infos[id].name);
    if (env && parse_one(id, env) != 0) {
      if (rc == 0)
        rc = dcomm__err(DCOMM_EINVAL, "%s='%s' is not a valid %s", infos[id].name, env,
                        dcomm__param_type_name(infos[id].type));
      parse_one(id, base);
    }
  }
  loaded = 1;
  return rc;
}

int dcomm__params_load(void) {
  pthread_mutex_lock(&lock);
  int rc = load_locked();
  pthread_mutex_unlock(&lock);
  return rc;
}

static void ensure(void) {
  pthread_mutex_lock(&lock);
  if (!loaded) {
    if (load_locked() != 0) DCOMM_LOG(WARN, INIT, "%s (using the default)", dcomm_last_error());
  }
  pthread_mutex_unlock(&lock);
}

const struct dcomm_param_info *dcomm__param_info(int id) {
  return id >= 0 && id < DCOMM_P_COUNT ? &infos[id] : NULL;
}

const char *dcomm__param_type_name(enum dcomm_param_type t) {
  static const char *const n[] = {"string", "integer", "number", "boolean", "size"};
  return t <= DCOMM_PT_SIZE ? n[t] : "?";
}

const char *dcomm__param_str(enum dcomm_param_id id) { ensure(); return strs[id] ? strs[id] : ""; }
long dcomm__param_int(enum dcomm_param_id id) { ensure(); return values[id].i; }
double dcomm__param_double(enum dcomm_param_id id) { ensure(); return values[id].d; }
int dcomm__param_bool(enum dcomm_param_id id) { ensure(); return (int)values[id].i; }
size_t dcomm__param_size(enum dcomm_param_id id) { ensure(); return values[id].z; }

const char *dcomm__param_by_name(const char *name) {
  ensure();
  const char *env = getenv(name);
  if (env) return env;
  pthread_mutex_lock(&lock);
  const char *v = dcomm__tuning_value(name);
  pthread_mutex_unlock(&lock);
  if (v) return v;
  for (int id = 0; id < DCOMM_P_COUNT; id++)
    if (!strcmp(infos[id].name, name)) return infos[id].def;
  return NULL;
}
