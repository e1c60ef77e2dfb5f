/*
 * plugin_loader.c: finds a backend by name. "tcp" is built into libdcomm;
 * any other name is a run-time module dcomm_<name>.so searched in
 * DCOMM_PLUGIN_PATH, the build tree and the installed plugin directory, so
 * libdcomm itself never depends on CUDA.
 */
#include "config.h"
#include "world.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "param.h"

extern const struct dcomm_backend_v1 dcomm__backend_tcp;

static int valid_name(const char *name) {
  if (!*name || strlen(name) > 32) return 0;
  for (const char *p = name; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) return 0;
  return 1;
}

/* A table of ABI version 1 at least as long as its mandatory ops, every one
 * of them set. A shorter optional part reads as NULL (DCOMM_BACKEND_OP). */
static int check_table(const struct dcomm_backend_v1 *t, const char *path) {
  if (!t || t->abi_version != DCOMM_BACKEND_ABI_VERSION || t->size < DCOMM_BACKEND_V1_MIN_SIZE)
    return dcomm__err(DCOMM_EBACKEND, "%s is not a dcomm backend of ABI version %d (its dcomm_backend_v1 says "
                      "version %d, %zu bytes; at least %zu needed)", path, DCOMM_BACKEND_ABI_VERSION,
                      t ? t->abi_version : 0, t ? t->size : 0, (size_t)DCOMM_BACKEND_V1_MIN_SIZE);
  if (!t->name || !t->init || !t->finalize || !t->comm_create || !t->comm_destroy || !t->comm_abort || !t->post ||
      !t->test || !t->wait || !t->async_error)
    return dcomm__err(DCOMM_EBACKEND, "%s: its dcomm_backend_v1 lacks a mandatory op (name, init, finalize, "
                      "comm_create, comm_destroy, comm_abort, post, test, wait and async_error must be set)", path);
  return 0;
}

int dcomm__backend_load(const char *name, const struct dcomm_backend_v1 **be, void **handle) {
  *handle = NULL;
  if (!strcmp(name, "tcp") || !strcmp(name, "gloo") || !strcmp(name, "cpu")) {
    *be = &dcomm__backend_tcp;
    return 0;
  }
  if (!valid_name(name)) return dcomm__err(DCOMM_EINVAL, "backend name '%s' is not valid", name);
  const char *dirs[] = {dcomm__param_str(DCOMM_P_PLUGIN_PATH), DCOMM_PLUGINDIR};
  char path[1200], tried[2048] = "";
  const char *dlerr = NULL;
  for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
    if (!dirs[i] || !*dirs[i]) continue;
    snprintf(path, sizeof(path), "%s/dcomm_%s.so", dirs[i], name);
    size_t tl = strlen(tried);
    snprintf(tried + tl, sizeof(tried) - tl, "%s%s", tl ? ", " : "", path);
    if (access(path, R_OK) != 0) continue;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      dlerr = dlerror();
      continue;
    }
    const struct dcomm_backend_v1 *t = dlsym(h, "dcomm_backend_v1");
    int rc = check_table(t, path);
    if (rc < 0) {
      dlclose(h);
      return rc;
    }
    DCOMM_LOG(INFO, INIT, "loaded backend %s from %s", name, path);
    *be = t;
    *handle = h;
    return 0;
  }
  if (dlerr) return dcomm__err(DCOMM_ENOTSUP, "backend '%s' could not be loaded: %s", name, dlerr);
  return dcomm__err(DCOMM_ENOTSUP, "backend '%s' is not built or not installed (looked for %s)", name, tried);
}

const char *dcomm__backend_param_default(const struct dcomm_backend_v1 *be, const char *name) {
  const struct dcomm_backend_param *p = be ? DCOMM_BACKEND_OP(be, params) : NULL;
  for (; p && p->name; p++)
    if (!strcmp(p->name, name)) return p->def;
  return NULL;
}

void dcomm__backend_unload(void *handle) {
  if (handle) dlclose(handle);
}
