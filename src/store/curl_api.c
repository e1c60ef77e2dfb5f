/*
 * curl_api.c: the pointers curl_api.h renames libcurl's functions to, and
 * their loading at the etcd client's first use.
 */
#include "config.h"

#ifdef DCOMM_HAVE_ETCD

#include "curl_api.h"
#include "dynlib.h"

DCOMM_DYNLIB_DEFINE(DCOMM_CURL_FUNCS, curl, DCOMM_LIBCURL_SONAME,
                    "the etcd rendezvous",
                    "install libcurl (apt-get install libcurl4)")

int etcd__curl_load(void) { return dcomm__dynlib_load(&curl); }

#endif
