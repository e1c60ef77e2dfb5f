/*
 * tests/proc_fds.h: how many descriptors this process holds, read from
 * /proc/self/fd. Shared by the scale check, the scale probe and the tcp
 * peer fuzz target, which all assert or report that dcomm leaves no
 * descriptor behind and holds few per rank.
 */
#ifndef DCOMM_TESTS_PROC_FDS_H
#define DCOMM_TESTS_PROC_FDS_H

#include <dirent.h>

/* Open descriptors, not counting "." and ".." nor the directory stream's
 * own descriptor; -1 when /proc cannot be read. */
static inline int proc_open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n - 3;
}

#endif
