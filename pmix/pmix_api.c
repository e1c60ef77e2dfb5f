/*
 * pmix_api.c: the pointers pmix_api.h renames libpmix's functions to, and
 * their loading at the first PMIx boot.
 */
#include "config.h"

#ifdef DCOMM_HAVE_PMIX

#include "dynlib.h"
#include "pmix_api.h"

/* The function's type, named through its pointer's macro (the argument is
 * expanded there: the type is the same). */
#define DEFINE_PFN(f) __typeof__(f) *dcomm__pfn_##f;
DCOMM_PMIX_FUNCS(DEFINE_PFN)
#undef DEFINE_PFN

#define NAME(f) #f,
static const char *const names[] = {DCOMM_PMIX_FUNCS(NAME)};
#undef NAME
#define SLOT(f) (void **)&dcomm__pfn_##f,
static void **const slots[] = {DCOMM_PMIX_FUNCS(SLOT)};
#undef SLOT

static struct dcomm_dynlib pmix = {
    .soname = DCOMM_LIBPMIX_SONAME,
    .feature = "PMIx bootstrap (pmix://, srun --mpi=pmix, mpirun)",
    .install_hint = "install libpmix (apt-get install libpmix2)",
    .names = names,
    .slots = slots,
    .n = (int)(sizeof(names) / sizeof(names[0])),
};

int dcomm__pmix_load(void) { return dcomm__dynlib_load(&pmix); }

#endif
