/*
 * live_worker.c: the worker of tests/run_live_output.sh. It initializes
 * (under dcomm-run), prints one line with printf and no fflush, sleeps
 * (argument: seconds, default 4) and finalizes. Its line reaches
 * dcomm-run's output while it sleeps only if stdout is line-buffered.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dcomm.h"

int main(int argc, char **argv) {
  int secs = argc > 1 ? atoi(argv[1]) : 4;
  if (dcomm_init(NULL, NULL) != 0) {
    fprintf(stderr, "live_worker: init failed: %s\n", dcomm_last_error());
    return 1;
  }
  printf("live line from rank %d\n", dcomm_rank());
  sleep((unsigned)secs);
  printf("rank %d done\n", dcomm_rank());
  return dcomm_finalize() == 0 ? 0 : 1;
}
