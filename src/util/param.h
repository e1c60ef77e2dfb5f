/*
 * param.h: the typed parameter registry built from params.def. Values come
 * from the environment, else the tuning file (tuning.h), else the default;
 * they are parsed by dcomm__params_load() (each dcomm_init), and a bad
 * value is an error naming the variable.
 */
#ifndef DCOMM_PARAM_H
#define DCOMM_PARAM_H

#include <stddef.h>

enum dcomm_param_type { DCOMM_PT_STR, DCOMM_PT_INT, DCOMM_PT_DOUBLE, DCOMM_PT_BOOL, DCOMM_PT_SIZE };

enum dcomm_param_id {
#define P(id, type, def, help) DCOMM_P_##id,
#include "params.def"
#undef P
  DCOMM_P_COUNT
};

struct dcomm_param_info {
  const char *name; /* full variable name, e.g. "DCOMM_TIMEOUT" */
  enum dcomm_param_type type;
  const char *def;
  const char *help;
};

/* Parses every DCOMM_* variable; returns DCOMM_EINVAL naming a bad one. */
int dcomm__params_load(void);
const struct dcomm_param_info *dcomm__param_info(int id);
const char *dcomm__param_type_name(enum dcomm_param_type t);
/* Typed getters (load on first use with defaults for bad values). */
const char *dcomm__param_str(enum dcomm_param_id id);
long dcomm__param_int(enum dcomm_param_id id);
double dcomm__param_double(enum dcomm_param_id id);
int dcomm__param_bool(enum dcomm_param_id id);
size_t dcomm__param_size(enum dcomm_param_id id);

/* Raw value of a variable by name: the environment's, else the tuning
 * file's (tuning.h), else the registry's default (NULL for a name that is
 * not in the registry, such as a backend's own: the host adds those). */
const char *dcomm__param_by_name(const char *name);

/* Shared parsers (also used by init-method URLs). 0 or DCOMM_EINVAL. */
int dcomm__parse_long(const char *s, long *out);
int dcomm__parse_double(const char *s, double *out);
int dcomm__parse_bool(const char *s, int *out);
int dcomm__parse_size(const char *s, size_t *out); /* accepts K, M, G suffixes */

#endif
