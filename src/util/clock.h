/*
 * clock.h: the process clock every deadline is measured on
 * (CLOCK_MONOTONIC, shared by the processes of one host, moved by no clock
 * step).
 */
#ifndef DCOMM_CLOCK_H
#define DCOMM_CLOCK_H

/* Monotonic seconds. */
double dcomm__now(void);
/* Milliseconds until deadline for poll(): >= 0, capped to INT_MAX. */
int dcomm__ms_until(double deadline);

#endif
