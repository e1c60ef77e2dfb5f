/*
 * dynlib.c: opening a library at its first use (see dynlib.h).
 */
#include "config.h"
#include "dynlib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "dcomm.h"
#include "error.h"

/* Serializes loads; a library's slots are written once, under it, before
 * any caller of dcomm__dynlib_load returns with 0. */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static void load(struct dcomm_dynlib *lib) {
  void *h = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(lib->why, sizeof(lib->why), "%s needs %s, which cannot be opened (%s); %s", lib->feature, lib->soname,
             e ? e : "unknown error", lib->install_hint);
    lib->rc = DCOMM_ENOTSUP;
    return;
  }
  for (int i = 0; i < lib->n; i++) {
    void *f = dlsym(h, lib->names[i]);
    if (!f) {
      snprintf(lib->why, sizeof(lib->why), "%s needs %s from %s, which lacks it (too old a version?)", lib->feature,
               lib->names[i], lib->soname);
      lib->rc = DCOMM_ENOTSUP;
      return; /* the library stays open: it is loaded for the process's lifetime either way */
    }
    *lib->slots[i] = f;
  }
  lib->rc = 0;
}

int dcomm__dynlib_load(struct dcomm_dynlib *lib) {
  pthread_mutex_lock(&load_mu);
  if (!lib->tried) load(lib);
  lib->tried = 1;
  int rc = lib->rc;
  pthread_mutex_unlock(&load_mu);
  return rc ? dcomm__err(rc, "%s", lib->why) : 0;
}
