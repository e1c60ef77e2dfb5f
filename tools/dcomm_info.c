/*
 * dcomm_info.c: the dcomm-info tool. Prints the version, the backends that
 * are built (and whether each can run here), the init methods this build
 * has (from src/init's table), the tuning file in force, and with -e every
 * DCOMM_* parameter with its type, default, current value (and whether the
 * tuning file gave it) and help.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "init_method.h"
#include "param.h"
#include "tuning.h"
#include "world.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dcomm-info [-e] [-h]\n"
          "  (no option)  version, backends and optional parts\n"
          "  -e           every DCOMM_* parameter: type, default, value, help\n");
}

static void print_param(const char *name, const char *type, const char *def, const char *help, const char *owner) {
  const char *cur = getenv(name), *tuned = dcomm__tuning_value(name);
  const char *from = cur ? "" : tuned ? " (tuning file)" : "";
  if (!cur) cur = tuned;
  printf("%s\n  type: %s  default: \"%s\"%s%s%s%s%s%s\n  %s\n", name, type, def, cur ? "  value: \"" : "",
         cur ? cur : "", cur ? "\"" : "", from, owner ? "  backend: " : "", owner ? owner : "", help);
}

/* The core's parameters, then those each backend that loads here declares. */
static void print_params(void) {
  for (int id = 0; id < DCOMM_P_COUNT; id++) {
    const struct dcomm_param_info *p = dcomm__param_info(id);
    print_param(p->name, dcomm__param_type_name(p->type), p->def, p->help, NULL);
  }
  const char *backends[] = {"tcp", "nccl"};
  for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
    const struct dcomm_backend_v1 *be = NULL;
    void *module = NULL;
    if (dcomm__backend_load(backends[i], &be, &module) < 0) continue;
    for (const struct dcomm_backend_param *p = DCOMM_BACKEND_OP(be, params); p && p->name; p++)
      print_param(p->name, p->type, p->def, p->help, be->name);
    dcomm__backend_unload(module);
  }
}

static void print_backend(const char *name) {
  const struct dcomm_backend_v1 *be = NULL;
  void *module = NULL;
  char desc[256] = "";
  if (dcomm__backend_load(name, &be, &module) < 0) {
    printf("  %-6s not available: %s\n", name, dcomm_last_error());
    return;
  }
  if (be->describe) be->describe(NULL, desc, sizeof(desc));
  printf("  %-6s %s%s\n", name, desc, module ? " (module)" : "");
  dcomm__backend_unload(module);
}

int main(int argc, char **argv) {
  int env = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-e") || !strcmp(argv[i], "--env")) env = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  /* Reads the tuning file too; a bad value is reported, not fatal here. */
  if (dcomm__params_load() < 0) fprintf(stderr, "dcomm-info: %s\n", dcomm_last_error());
  if (env) {
    print_params();
    return 0;
  }
  printf("dcomm %s\n", PACKAGE_VERSION);
  printf("backends:\n");
  print_backend("tcp");
  print_backend("nccl");
  /* From the table dcomm_init dispatches through: what this build has. */
  printf("init methods:");
  for (int i = 0; dcomm__init_method_info(i); i++)
    if (dcomm__init_method_info(i)->built) printf(" %s", dcomm__init_method_info(i)->scheme);
  printf("\n");
  /* The libraries some of them open at their first use, not at start. */
  for (int i = 0; dcomm__init_method_info(i); i++) {
    const struct dcomm_init_method_info *m = dcomm__init_method_info(i);
    if (!m->built || !m->library) continue;
    if (dcomm__init_method_usable(i) == 0) printf("  %s opens %s when used: found\n", m->scheme, m->library);
    else printf("  %s opens %s when used: %s\n", m->scheme, m->library, dcomm_last_error());
  }
  if (dcomm__tuning_path())
    printf("tuning file: %s (%d setting%s)\n", dcomm__tuning_path(), dcomm__tuning_count(),
           dcomm__tuning_count() == 1 ? "" : "s");
  else
    printf("tuning file: none\n");
  return 0;
}
