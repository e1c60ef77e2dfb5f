/*
 * pmix_boot.h: the pmix:// init method. Under a PMIx launcher (mpirun,
 * srun --mpi=pmix) rank, sizes and local rank come from the PMIx server,
 * rank 0 hosts the embedded store and publishes its address through the
 * PMIx modex, and launcher events about lost processes are forwarded to
 * dcomm. This header does not include pmix.h; without PMIx at build time
 * (DCOMM_HAVE_PMIX undefined) every call but dcomm__pmix_detect returns
 * DCOMM_ENOTSUP ("built without PMIx").
 */
#ifndef DCOMM_PMIX_BOOT_H
#define DCOMM_PMIX_BOOT_H

#include <stddef.h>

struct dcomm_pmix_boot {
  int rank, size, local_rank, local_size;
  char store_host[256]; /* where rank 0's store listens */
  int store_port;
};

/* 1 when a PMIx server is announced in the environment (PMIX_NAMESPACE or
 * a PMIX_SERVER_URI* variable), else 0. Works in every build. */
int dcomm__pmix_detect(void);

/* 0 when libpmix, which the boot opens at its first use, can be opened
 * here; else DCOMM_ENOTSUP saying why. dcomm-info reports it. */
int dcomm__pmix_available(void);

/* Called on rank 0 only: starts the store and reports where it listens.
 * Leaving host "" lets dcomm__pmix_boot pick an address others can reach
 * (this host's name, from PMIX_HOSTNAME or gethostname, resolved to an
 * IPv4 address; a non-loopback interface when the job spans hosts).
 * Returns 0 or a negative DCOMM_E* code. */
typedef int (*dcomm_pmix_host_store_fn)(void *arg, char *host, size_t hostlen, int *port);

/* PMIx_Init, job facts, store address exchange (Put / Commit / Fence with
 * PMIX_COLLECT_DATA and PMIX_TIMEOUT, Get of rank 0's "dcomm.store.N",
 * N counting the boots of this process). timeout: seconds the fence and
 * the get may take (<= 0: unbounded). No PMIx server: DCOMM_EINVAL.
 * Collective: every rank of the job calls it (once per dcomm_init). */
int dcomm__pmix_boot(struct dcomm_pmix_boot *b, double timeout, dcomm_pmix_host_store_fn host_store, void *arg);

/* Ends dcomm's use of PMIx: deregisters the event handler (no-op when not
 * booted). PMIx itself stays initialized until the process exits (an
 * atexit handler calls PMIx_Finalize): PMIx 4.2 cannot be initialized
 * again after PMIx_Finalize, and a later dcomm_init may boot again. */
void dcomm__pmix_finalize(void);

/* After dcomm__pmix_boot: on_lost(rank, arg) runs on PMIx's progress
 * thread (it must not block or call PMIx) for PMIX_ERR_PROC_ABORTED,
 * PMIX_PROC_TERMINATED (unless its PMIX_EXIT_CODE is 0) and
 * PMIX_ERR_LOST_CONNECTION. rank is the affected process of this job, or
 * -1 when unknown (lost connection to the server).
 * Launchers may deliver none of these: treat it as one signal among
 * several, never as the only failure detector. */
int dcomm__pmix_register_events(void (*on_lost)(int rank, void *arg), void *arg);

#endif
