/*
 * fuzz_hostlist.c: fuzz target for SLURM hostlist expressions
 * (pmix/hostlist.c), which slurm:// reads from SLURM_STEP_NODELIST and
 * friends. Checks that count, first and expand agree on every accepted
 * expression and that every name is shorter than 256 bytes.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "fuzz_util.h"
#include "hostlist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 2048) return 0; /* an environment value, not a file */
  char *expr = fuzz_cstr(data, size);
  int count = -1;
  if (dcomm__hostlist_count(expr, &count) == 0) {
    if (count < 1 || count > DCOMM_HOSTLIST_MAX) abort();
    char first[256];
    int frc = dcomm__hostlist_first(expr, first, sizeof(first));
    /* Expanding allocates a name per host: keep the fuzzer fast. */
    if (count <= 4096) {
      char **hosts = NULL;
      int n = 0;
      if (dcomm__hostlist_expand(expr, &hosts, &n) == 0) {
        if (n != count) abort();
        for (int i = 0; i < n; i++)
          if (strlen(hosts[i]) >= 256) abort();
        if (frc == 0 && strcmp(first, hosts[0]) != 0) abort();
        dcomm__hostlist_free(hosts, n);
      } else if (hosts || n) {
        abort(); /* a failure leaves nothing behind */
      }
    }
  }
  free(expr);
  return 0;
}
