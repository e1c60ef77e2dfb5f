/*
 * tcp_cma.c: whether a single copy (process_vm_readv, "CMA") of data the
 * sender wrote earlier in a collective pays, decided from the collectives'
 * own times (DCOMM_SHM_CMA_FWD_MIN=auto, the default).
 *
 * For such data (all_reduce's partial sums, forwarded ring and tree
 * blocks) the rings cost two copies, but they run in parallel on the two
 * processes and from cache-sized pieces; the single copy is one copy done
 * by the reader, through the kernel, which pins the sender's pages first.
 * Which wins depends on the machine, by a factor of 1.5-3 either way: on
 * an AMD EPYC guest the single copy made a 4 MiB all_reduce 3.2x slower,
 * on an Intel Xeon VM 1.5x faster. A one-process probe of the kernel's
 * copy rate against memcpy's predicted neither (0.21-0.44 of memcpy on
 * the first, 0.5 on the second), so nothing here is a rate threshold:
 * each communicator times the two ways on its own calls.
 *
 * Per communicator, collective and size class (a power of two of the
 * bytes per rank, from TCP_CMA_FWD_FLOOR), the first calls are a trial:
 * two calls unmeasured, one each way (first-touch page faults, links being
 * made), then the single copy and the rings alternately, TCP_CMA_TRIALS
 * calls each; the way with the faster best call is kept for the
 * communicator's life and logged at INFO. The single copy keeps getting
 * faster over its first few calls (on the Intel VM a 4 MiB all_reduce took
 * 670, 510, 470, 430 us on its 1st-4th), so two timed calls each chose the
 * rings there and six choose the single copy, which a fixed setting
 * confirms (480-520 us against 700-1130 through the rings). Every member
 * makes the same calls in the same order, so all switch together and the
 * times compare like with like. A member
 * may still conclude otherwise than its peers: each frame says how it was
 * sent, so mixed choices stay correct (check_coll covers them).
 * A trial call costs at most one slower call of its class; a communicator
 * makes TCP_CMA_CALLS of them per collective and class it uses. Only calls
 * that had forwarded data the single copy could take count.
 */
#include "config.h"
#include "tcp.h"

#include <stdio.h>

static int size_class(const struct dcomm_coll_args *a) {
  size_t bytes = a->count * dcomm_dtype_size(a->dtype);
  if (bytes < TCP_CMA_FWD_FLOOR) return -1;
  int k = 0;
  while (k + 1 < TCP_CMA_CLASSES && bytes >= TCP_CMA_FWD_FLOOR << (k + 1)) k++;
  return k;
}

int tcp_cma_fwd_begin(struct tcp_comm *c, const struct dcomm_coll_args *a, struct tcp_cma_call *k) {
  c->cma_fwd_now = c->cma_fwd_asked = 0;
  if (!c->t.cma_fwd_auto || !c->t.cma_min || c->ctx->transport == TCP_TR_TCP || c->topo.nlocal < 2 || a->coll <= DCOMM_COLL_NONE ||
      a->coll >= DCOMM_COLL_COUNT)
    return 0;
  int cls = size_class(a);
  if (cls < 0) return 0;
  struct tcp_cma_try *t = &c->cma_try[a->coll][cls];
  if (t->calls >= TCP_CMA_CALLS) { /* decided */
    c->cma_fwd_now = t->pick;
    return 0;
  }
  k->t = t;
  k->coll = a->coll;
  k->cls = cls;
  /* Calls 0 and 1 unmeasured, through the rings and by single copy (each
   * way's first use is slow: faults, pinning), then the single copy on
   * even calls and the rings on odd ones. */
  k->mode = t->calls < 2 ? -1 : t->calls % 2 == 0;
  c->cma_fwd_now = t->calls < 2 ? t->calls : k->mode;
  k->t0 = c->ctx->host->now();
  return 1;
}

void tcp_cma_fwd_end(struct tcp_comm *c, const struct tcp_cma_call *k, int rc) {
  double dt = c->ctx->host->now() - k->t0;
  struct tcp_cma_try *t = k->t;
  c->cma_fwd_now = 0;
  /* A failed call says nothing (the comm is broken anyway), nor does one
   * whose forwarded data could not go by single copy (all_gather on one
   * host is direct; small pieces at many ranks; peers over TCP). */
  if (rc < 0 || !c->cma_fwd_asked) return;
  if (k->mode >= 0 && (t->best[k->mode] <= 0 || dt < t->best[k->mode])) t->best[k->mode] = dt;
  if (++t->calls < TCP_CMA_CALLS) return;
  t->pick = t->best[1] < t->best[0];
  size_t mib = (TCP_CMA_FWD_FLOOR << k->cls) >> 20;
  char range[48];
  if (k->cls + 1 < TCP_CMA_CLASSES) snprintf(range, sizeof(range), "%zu-%zu MiB", mib, 2 * mib);
  else snprintf(range, sizeof(range), "%zu MiB or more", mib);
  TCP_LOG(c->ctx, INFO,
          "%s: single copy of forwarded data in %s of %s per rank: %s (fastest call %.1f us with it, %.1f us "
          "through the rings; DCOMM_SHM_CMA_FWD_MIN sets a size instead)",
          c->label, tcp_coll_name(k->coll), range, t->pick ? "on" : "off", t->best[1] * 1e6, t->best[0] * 1e6);
}
