/*
 * curl_api.c: the pointers curl_api.h renames libcurl's functions to, and
 * their loading at the etcd client's first use.
 */
#include "config.h"

#ifdef DCOMM_HAVE_ETCD

#include "curl_api.h"
#include "dynlib.h"

/* The function's type, named through its pointer's macro (the argument is
 * expanded there: the type is the same). */
#define DEFINE_PFN(f) __typeof__(f) *dcomm__pfn_##f;
DCOMM_CURL_FUNCS(DEFINE_PFN)
#undef DEFINE_PFN

#define NAME(f) #f,
static const char *const names[] = {DCOMM_CURL_FUNCS(NAME)};
#undef NAME
#define SLOT(f) (void **)&dcomm__pfn_##f,
static void **const slots[] = {DCOMM_CURL_FUNCS(SLOT)};
#undef SLOT

static struct dcomm_dynlib curl = {
    .soname = DCOMM_LIBCURL_SONAME,
    .feature = "the etcd rendezvous",
    .install_hint = "install libcurl (apt-get install libcurl4)",
    .names = names,
    .slots = slots,
    .n = (int)(sizeof(names) / sizeof(names[0])),
};

int etcd__curl_load(void) { return dcomm__dynlib_load(&curl); }

#endif
