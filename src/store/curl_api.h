/*
 * curl_api.h: libcurl as the etcd client sees it, opened at the client's
 * first use (dynlib.h) instead of linked: a rank that does not use etcd
 * never loads libcurl and the libraries it pulls in. The etcd client files
 * include this instead of <curl/curl.h>; each libcurl function they call
 * is renamed below to a pointer that etcd__curl_load fills, with the
 * type of the function curl's own header declares.
 */
#ifndef DCOMM_CURL_API_H
#define DCOMM_CURL_API_H

#include <curl/curl.h>

/* curl's type-checking wrappers (GCC) are macros of these names. */
#undef curl_easy_setopt
#undef curl_easy_getinfo

#define DCOMM_CURL_FUNCS(X)                                                                                     \
  X(curl_global_init) X(curl_easy_init) X(curl_easy_cleanup) X(curl_easy_setopt) X(curl_easy_getinfo)          \
  X(curl_easy_perform) X(curl_easy_strerror) X(curl_multi_init) X(curl_multi_cleanup) X(curl_multi_add_handle) \
  X(curl_multi_remove_handle) X(curl_multi_perform) X(curl_multi_poll) X(curl_multi_info_read)                 \
  X(curl_multi_strerror) X(curl_slist_append) X(curl_slist_free_all)

#define DCOMM_CURL_DECLARE(f) extern __typeof__(f) *dcomm__pfn_##f;
DCOMM_CURL_FUNCS(DCOMM_CURL_DECLARE)
#undef DCOMM_CURL_DECLARE

#define curl_global_init (*dcomm__pfn_curl_global_init)
#define curl_easy_init (*dcomm__pfn_curl_easy_init)
#define curl_easy_cleanup (*dcomm__pfn_curl_easy_cleanup)
#define curl_easy_setopt (*dcomm__pfn_curl_easy_setopt)
#define curl_easy_getinfo (*dcomm__pfn_curl_easy_getinfo)
#define curl_easy_perform (*dcomm__pfn_curl_easy_perform)
#define curl_easy_strerror (*dcomm__pfn_curl_easy_strerror)
#define curl_multi_init (*dcomm__pfn_curl_multi_init)
#define curl_multi_cleanup (*dcomm__pfn_curl_multi_cleanup)
#define curl_multi_add_handle (*dcomm__pfn_curl_multi_add_handle)
#define curl_multi_remove_handle (*dcomm__pfn_curl_multi_remove_handle)
#define curl_multi_perform (*dcomm__pfn_curl_multi_perform)
#define curl_multi_poll (*dcomm__pfn_curl_multi_poll)
#define curl_multi_info_read (*dcomm__pfn_curl_multi_info_read)
#define curl_multi_strerror (*dcomm__pfn_curl_multi_strerror)
#define curl_slist_append (*dcomm__pfn_curl_slist_append)
#define curl_slist_free_all (*dcomm__pfn_curl_slist_free_all)

/* Opens libcurl and resolves every function above: 0, or DCOMM_ENOTSUP
 * with the reason. Called before the first of them. */
int etcd__curl_load(void);

#endif
