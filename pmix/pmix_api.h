/*
 * pmix_api.h: libpmix as pmix_boot.c sees it, opened at the first PMIx
 * boot (dynlib.h) instead of linked: a rank started without PMIx never
 * loads libpmix and what it pulls in (libevent, hwloc, munge, udev).
 * pmix_boot.c includes this instead of <pmix.h>; each libpmix function it
 * calls, directly or through pmix.h's macros, is renamed below to a
 * pointer that dcomm__pmix_load fills, with the type pmix.h declares.
 */
#ifndef DCOMM_PMIX_API_H
#define DCOMM_PMIX_API_H

#include <pmix.h>

#define DCOMM_PMIX_FUNCS(X)                                                                                  \
  X(PMIx_Init) X(PMIx_Finalize) X(PMIx_Get) X(PMIx_Put) X(PMIx_Commit) X(PMIx_Fence)                           \
  X(PMIx_Register_event_handler) X(PMIx_Deregister_event_handler) X(PMIx_Error_string) X(PMIx_Data_type_string) \
  X(PMIx_Info_load) X(PMIx_Value_destruct)

#define DCOMM_PMIX_DECLARE(f) extern __typeof__(f) *dcomm__pfn_##f;
DCOMM_PMIX_FUNCS(DCOMM_PMIX_DECLARE)
#undef DCOMM_PMIX_DECLARE

#define PMIx_Init (*dcomm__pfn_PMIx_Init)
#define PMIx_Finalize (*dcomm__pfn_PMIx_Finalize)
#define PMIx_Get (*dcomm__pfn_PMIx_Get)
#define PMIx_Put (*dcomm__pfn_PMIx_Put)
#define PMIx_Commit (*dcomm__pfn_PMIx_Commit)
#define PMIx_Fence (*dcomm__pfn_PMIx_Fence)
#define PMIx_Register_event_handler (*dcomm__pfn_PMIx_Register_event_handler)
#define PMIx_Deregister_event_handler (*dcomm__pfn_PMIx_Deregister_event_handler)
#define PMIx_Error_string (*dcomm__pfn_PMIx_Error_string)
#define PMIx_Data_type_string (*dcomm__pfn_PMIx_Data_type_string)
#define PMIx_Info_load (*dcomm__pfn_PMIx_Info_load)
#define PMIx_Value_destruct (*dcomm__pfn_PMIx_Value_destruct)

/* Opens libpmix and resolves every function above: 0, or DCOMM_ENOTSUP
 * with the reason. Called before the first of them. */
int dcomm__pmix_load(void);

#endif
