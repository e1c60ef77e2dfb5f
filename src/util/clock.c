/*
 * clock.c: monotonic seconds and poll() timeouts from deadlines.
 */
#include "config.h"
#include "clock.h"

#include <limits.h>
#include <time.h>

double dcomm__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int dcomm__ms_until(double deadline) {
  double left = deadline - dcomm__now();
  if (left <= 0) return 0;
  if (left * 1000.0 > (double)INT_MAX) return INT_MAX;
  return (int)(left * 1000.0) + 1;
}
