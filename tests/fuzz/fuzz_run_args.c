/*
 * fuzz_run_args.c: fuzz target for dcomm-run's command line
 * (launcher/run_args.c). The input is the argument vector, NUL-separated
 * (argv[0] is added). A parse either says to run (then every number is in
 * its documented range and the program is one of the arguments) or gives
 * an exit code (0 after --help, 2 after a usage error).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "run.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 8192) return 0;
  char *f[MAX_ARGS];
  int n = fuzz_fields(data, size, f, MAX_ARGS);
  char *argv[MAX_ARGS + 2];
  argv[0] = "dcomm-run";
  for (int i = 0; i < n; i++) argv[i + 1] = f[i];
  argv[n + 1] = NULL;
  struct run_opts o;
  int code = -1;
  if (run_parse_args(n + 1, argv, &o, &code) == 0) {
    if (o.nproc < 1 || o.nproc > RUN_MAX_NPROC || o.min_nproc < 1 || o.min_nproc > o.nproc) abort();
    if (o.max_restarts < 0 || o.min_nodes < 1 || o.min_nodes > o.max_nodes) abort();
    if (o.port < 0 || o.port > 65535 || !o.job_id[0]) abort();
    if (!o.argv || o.argv <= argv || o.argv > argv + n || !*o.argv) abort();
    if (!o.etcd && o.max_nodes != 1) abort();
  } else if (code != 0 && code != 1 && code != 2) {
    abort();
  }
  fuzz_fields_free(f, n);
  return 0;
}
