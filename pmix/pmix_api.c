/*
 * pmix_api.c: the pointers pmix_api.h renames libpmix's functions to, and
 * their loading at the first PMIx boot.
 */
#include "config.h"

#ifdef DCOMM_HAVE_PMIX

#include "dynlib.h"
#include "pmix_api.h"

DCOMM_DYNLIB_DEFINE(DCOMM_PMIX_FUNCS, pmix, DCOMM_LIBPMIX_SONAME,
                    "PMIx bootstrap (pmix://, srun --mpi=pmix, mpirun)",
                    "install libpmix (apt-get install libpmix2)")

int dcomm__pmix_load(void) { return dcomm__dynlib_load(&pmix); }

#endif
