/*
 * harness.h: runs a test body in N real processes on loopback. Each child
 * gets a world through tcp://127.0.0.1:PORT (rank 0 hosts the store), runs
 * the body and exits 0 on success; the parent reaps them all within a
 * bound and kills any straggler, so no test can hang.
 */
#ifndef DCOMM_TEST_HARNESS_H
#define DCOMM_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

#include "dcomm.h"

typedef int (*mp_body)(int rank, int size, void *arg);

struct mp_result {
  int exit_code[64]; /* per rank: exit status, or 128+signal */
  int failed;        /* ranks that did not exit 0 */
  int timed_out;     /* ranks killed by the harness */
};

/* Picks a free loopback port (bind to 0, read it, close). */
int mp_free_port(void);
/* Forks size ranks; init_method NULL uses tcp:// on a fresh port. With
 * no_init the body does dcomm_init itself (the URL is in DCOMM_TEST_URL). */
int mp_run_ex(int size, mp_body body, void *arg, double timeout_s, int no_init, struct mp_result *res);
/* Returns the number of failed ranks (0: all passed). */
int mp_run(int size, mp_body body, void *arg, double timeout_s);

/* Inside a body: report and fail the rank. */
#define MP_REQUIRE(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "[rank %d] %s:%d: requirement failed: %s: ", dcomm_rank(), __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, " (last error: %s)\n", dcomm_last_error());             \
      return 1;                                                                \
    }                                                                          \
  } while (0)

#define MP_OK(call) MP_REQUIRE((call) == 0, "%s returned non-zero", #call)

double mp_now(void);

#endif
