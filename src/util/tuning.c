/*
 * tuning.c: reads the tuning file (tuning.h): lines "DCOMM_NAME=VALUE",
 * blank lines and lines starting with '#'. The values of a table that was
 * in force stay allocated when another file replaces it (a parameter of
 * string type may still point into it), on a list that keeps them reachable.
 */
#include "config.h"
#include "tuning.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "error.h"

#ifndef DCOMM_SYSCONFDIR
#define DCOMM_SYSCONFDIR "/etc"
#endif
#define TUNING_DEFAULT DCOMM_SYSCONFDIR "/dcomm/tuning.conf"
#define TUNING_MAX_LINE 1024
#define TUNING_MAX_ENTRIES 256

struct tuning_table {
  char *path;
  int n;
  char *name[TUNING_MAX_ENTRIES], *value[TUNING_MAX_ENTRIES];
  struct tuning_table *retired; /* the tables this one replaced */
};

static struct tuning_table *cur;    /* NULL: no file in force */
static char *loaded_from;           /* the path last asked for ("" none) */
static struct tuning_table *graveyard; /* replaced tables, kept reachable */

static void retire(struct tuning_table *t) {
  if (!t) return;
  t->retired = graveyard;
  graveyard = t;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
  return s;
}

static int valid_name(const char *s) {
  if (strncmp(s, "DCOMM_", 6) || !s[6]) return 0;
  for (const char *p = s + 6; *p; p++)
    if (!isupper((unsigned char)*p) && !isdigit((unsigned char)*p) && *p != '_') return 0;
  return 1;
}

/* Parses f into t. 0 or DCOMM_EINVAL naming path:line. */
static int parse(FILE *f, const char *path, struct tuning_table *t) {
  char line[TUNING_MAX_LINE + 2];
  int lineno = 0;
  while (fgets(line, sizeof(line), f)) {
    lineno++;
    size_t len = strlen(line);
    if (len > TUNING_MAX_LINE && line[len - 1] != '\n')
      return dcomm__err(DCOMM_EINVAL, "tuning file %s, line %d: longer than %d bytes (DCOMM_TUNING_FILE)", path,
                        lineno, TUNING_MAX_LINE);
    char *s = trim(line);
    if (!*s || *s == '#') continue;
    char *eq = strchr(s, '=');
    if (eq) *eq = 0;
    char *name = trim(s), *value = eq ? trim(eq + 1) : NULL;
    if (!eq || !valid_name(name))
      return dcomm__err(DCOMM_EINVAL,
                        "tuning file %s, line %d: '%s' is not DCOMM_NAME=VALUE (fix the line or set "
                        "DCOMM_TUNING_FILE=none)",
                        path, lineno, s);
    int slot = -1;
    for (int i = 0; i < t->n; i++)
      if (!strcmp(t->name[i], name)) slot = i; /* a later line wins */
    if (slot < 0) {
      if (t->n == TUNING_MAX_ENTRIES)
        return dcomm__err(DCOMM_EINVAL, "tuning file %s: more than %d settings", path, TUNING_MAX_ENTRIES);
      slot = t->n++;
      t->name[slot] = strdup(name);
    } else {
      free(t->value[slot]);
    }
    t->value[slot] = strdup(value);
    if (!t->name[slot] || !t->value[slot]) return dcomm__err(DCOMM_ENOMEM, "tuning file %s: out of memory", path);
  }
  if (ferror(f)) return dcomm__err(DCOMM_ESYSTEM, "tuning file %s: read error: %s", path, strerror(errno));
  return 0;
}

static void table_free(struct tuning_table *t) {
  for (int i = 0; i < t->n; i++) {
    free(t->name[i]);
    free(t->value[i]);
  }
  free(t->path);
  free(t);
}

int dcomm__tuning_load(void) {
  const char *env = getenv("DCOMM_TUNING_FILE");
  int named = env && *env;
  const char *path = !named ? TUNING_DEFAULT : strcmp(env, "none") ? env : "";
  if (loaded_from && !strcmp(loaded_from, path)) return 0;
  free(loaded_from);
  loaded_from = strdup(path);
  retire(cur);
  cur = NULL;
  if (!*path) return 0;
  FILE *f = fopen(path, "r");
  if (!f) {
    if (!named && errno == ENOENT) return 0; /* no machine tuning: the defaults */
    int e = errno;
    free(loaded_from);
    loaded_from = NULL; /* asked again at the next load */
    return dcomm__err(DCOMM_ESYSTEM, "cannot read the tuning file %s%s: %s", path,
                      named ? " (DCOMM_TUNING_FILE)" : "", strerror(e));
  }
  struct tuning_table *t = calloc(1, sizeof(*t));
  int rc = t ? 0 : dcomm__err(DCOMM_ENOMEM, "tuning file %s: out of memory", path);
  if (rc == 0) rc = parse(f, path, t);
  fclose(f);
  if (rc == 0 && !(t->path = strdup(path))) rc = dcomm__err(DCOMM_ENOMEM, "tuning file %s: out of memory", path);
  if (rc != 0) {
    if (t) table_free(t);
    free(loaded_from);
    loaded_from = NULL;
    return rc;
  }
  cur = t;
  return 0;
}

const char *dcomm__tuning_value(const char *name) {
  if (!cur) return NULL;
  for (int i = 0; i < cur->n; i++)
    if (!strcmp(cur->name[i], name)) return cur->value[i];
  return NULL;
}

const char *dcomm__tuning_path(void) { return cur ? cur->path : NULL; }

int dcomm__tuning_count(void) { return cur ? cur->n : 0; }
