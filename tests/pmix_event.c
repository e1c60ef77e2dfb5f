/*
 * pmix_event.c: checks that a PMIx "process aborted" event reaches the
 * elastic watcher (tests/pmix_mpirun.sh). Run under mpirun with 3 ranks
 * and DCOMM_ELASTIC=1: every rank initializes through pmix://, rank 1 then
 * notifies the namespace through the PMIx server that rank 2 aborted
 * (no process dies: the event is the only signal), and every rank enters a
 * barrier that must fail with DCOMM_EREVOKED (the script checks the log
 * line naming the PMIx report). Prints "rank R revoked: ..." and exits 0
 * when it did; 1 when the barrier succeeded or failed otherwise.
 */
#include <pmix.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "dcomm.h"

/* Non-blocking notify: the server need not acknowledge it. */
static void notified(pmix_status_t status, void *cbdata) {
  (void)status, (void)cbdata;
}

/* Rank 1's notifier thread: PMIx may not return from the notification
 * in this process (it delivers the event here too), so the main thread
 * goes on without it. */
static void *notify_main(void *arg) {
  (void)arg;
  pmix_proc_t self, gone;
  if (PMIx_Init(&self, NULL, 0) != PMIX_SUCCESS) {
    fprintf(stderr, "rank 1: PMIx_Init failed\n");
    _exit(1);
  }
  PMIX_PROC_LOAD(&gone, self.nspace, 2);
  pmix_info_t info[1];
  PMIX_INFO_LOAD(&info[0], PMIX_EVENT_AFFECTED_PROC, &gone, PMIX_PROC);
  pmix_status_t st = PMIx_Notify_event(PMIX_ERR_PROC_ABORTED, &self, PMIX_RANGE_NAMESPACE, info, 1, notified, NULL);
  if (st != PMIX_SUCCESS && st != PMIX_OPERATION_SUCCEEDED) {
    fprintf(stderr, "rank 1: PMIx_Notify_event: %s\n", PMIx_Error_string(st));
    _exit(1);
  }
  return NULL;
}

int main(void) {
  int rc = dcomm_init("tcp", "pmix://");
  if (rc < 0) {
    fprintf(stderr, "dcomm_init: %s\n", dcomm_last_error());
    return 1;
  }
  int me = dcomm_rank();
  rc = dcomm_barrier(NULL); /* everyone has its event handler */
  if (rc < 0) {
    fprintf(stderr, "rank %d: first barrier: %s\n", me, dcomm_last_error());
    return 1;
  }
  pthread_t th;
  if (me == 1 && pthread_create(&th, NULL, notify_main, NULL) != 0) {
    fprintf(stderr, "rank 1: pthread_create failed\n");
    return 1;
  }
  /* The revoke takes a heartbeat interval or so; the barrier waits for it
   * because rank 1 holds back, and the op timeout bounds it. */
  if (me == 1) sleep(3);
  rc = dcomm_barrier(NULL);
  if (rc == DCOMM_EREVOKED) {
    printf("rank %d revoked: %s\n", me, dcomm_last_error());
    dcomm_finalize(); /* mpirun takes a process that skips it for failed */
    if (me == 1) PMIx_Finalize(NULL, 0); /* the notifier's own PMIx_Init */
    return 0;
  }
  fprintf(stderr, "rank %d: barrier returned %s: %s\n", me, dcomm_error_name(rc), dcomm_last_error());
  return 1;
}
