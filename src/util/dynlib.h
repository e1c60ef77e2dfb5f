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

/* Defines, for the X-macro list FUNCS(X) of a library's functions, one
 * pointer dcomm__pfn_<f> per function typed from the library's own header
 * (the header's macro renaming f to that pointer leaves the type as is)
 * and `static struct dcomm_dynlib var` that loads them all. */
#define DCOMM_DYNLIB_PFN_(f) __typeof__(f) *dcomm__pfn_##f;
#define DCOMM_DYNLIB_NAME_(f) #f,
#define DCOMM_DYNLIB_SLOT_(f) (void **)&dcomm__pfn_##f,
#define DCOMM_DYNLIB_DEFINE(FUNCS, var, soname_, feature_, hint_)                  \
  FUNCS(DCOMM_DYNLIB_PFN_)                                                          \
  static const char *const var##_names[] = {FUNCS(DCOMM_DYNLIB_NAME_)};             \
  static void **const var##_slots[] = {FUNCS(DCOMM_DYNLIB_SLOT_)};                  \
  static struct dcomm_dynlib var = {.soname = (soname_),                            \
                                    .feature = (feature_),                          \
                                    .install_hint = (hint_),                        \
                                    .names = var##_names,                           \
                                    .slots = var##_slots,                           \
                                    .n = (int)(sizeof(var##_names) / sizeof(var##_names[0]))};

#endif
