/*
 * dynlib.h: a shared library that dcomm opens only when a feature needs it
 * (libcurl for the etcd rendezvous, libpmix for PMIx bootstrap), so that a
 * process that uses neither does not load them and the dozens of
 * libraries they pull in at every start. Each user lists its functions
 * once; the first call to dcomm__dynlib_load opens the library and
 * resolves every function, later calls return what the first found.
 */
#ifndef DCOMM_DYNLIB_H
#define DCOMM_DYNLIB_H

struct dcomm_dynlib {
  const char *soname;       /* what dlopen is given, e.g. "libcurl.so.4" */
  const char *feature;      /* who needs it, for the error: "the etcd rendezvous" */
  const char *install_hint; /* e.g. "apt-get install libcurl4" */
  const char *const *names; /* the functions, in the order of slots */
  void **const *slots;      /* where each function's address goes */
  int n;
  /* Filled by the first load. */
  int tried, rc;
  char why[512];
};

/* 0 when every function is resolved; else DCOMM_ENOTSUP naming the
 * library, the feature and why (set as the thread's last error). */
int dcomm__dynlib_load(struct dcomm_dynlib *lib);

#endif
