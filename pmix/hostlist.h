/*
 * hostlist.h: SLURM hostlist expressions ("node[01-04,07],gpu3",
 * "a[1-3]b", "rack[1-2]-n[01-02]") turned into host names, for the
 * slurm:// init method (the store host is the first node of the step).
 *
 * Grammar (what SLURM's hostlist_create accepts, minus its quirks):
 *   list  := item { sep item }        sep: ',' or white space (runs count once)
 *   item  := { text | '[' ranges ']' }  several bracket groups: cartesian
 *   ranges:= range { ',' range }
 *   range := digits [ '-' digits ]    lo <= hi; the width of lo is kept
 *                                     ("[08-10]": 08 09 10)
 * The last bracket group varies fastest ("r[1-2]-n[1-2]": r1-n1 r1-n2 r2-n1
 * r2-n2). At most DCOMM_HOSTLIST_MAX hosts, each shorter than 256 bytes.
 * Malformed input ("node[1-", "node[3-1]", "[]", "a]") is DCOMM_EINVAL with
 * a detail message that quotes the expression.
 */
#ifndef DCOMM_HOSTLIST_H
#define DCOMM_HOSTLIST_H

#include <stddef.h>

#define DCOMM_HOSTLIST_MAX 65536

/* Copies the first host of expr into out (validating the whole expression).
 * 0, or DCOMM_EINVAL (malformed, or the name does not fit outlen). */
int dcomm__hostlist_first(const char *expr, char *out, size_t outlen);

/* Expands expr: *hosts is a malloc'd array of *n malloc'd names, freed with
 * dcomm__hostlist_free. 0, DCOMM_EINVAL or DCOMM_ENOMEM (then *hosts is
 * NULL and *n 0). */
int dcomm__hostlist_expand(const char *expr, char ***hosts, int *n);

/* Counts the hosts of expr without expanding it. 0 or DCOMM_EINVAL. */
int dcomm__hostlist_count(const char *expr, int *n);

void dcomm__hostlist_free(char **hosts, int n);

#endif
