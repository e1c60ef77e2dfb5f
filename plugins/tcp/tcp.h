/*
 * tcp.h: internals of the tcp backend (CPU, sockets). Layering:
 *   tcp_backend.c  the ops table, request queue (post/test/wait), abort;
 *   tcp_conn.c     the address directory and the links of a communicator:
 *                  its ring neighbours' at creation, the others dialed
 *                  when an operation first needs them;
 *   tcp_listen.c   the listener thread: accepts and authenticates links,
 *                  parks them until their communicator adopts them;
 *   tcp_engine.c   the framed transfer engine: several sends and receives to
 *                  different peers progressed together under one poll()
 *                  (the other links watched through an epoll set),
 *                  with deadline, abort, death and mismatch detection;
 *   tcp_algos.c    the collective algorithms written on the engine;
 *   tcp_shm.c      shared-memory rings for the links between members on
 *                  one host (the socket stays as liveness/abort channel).
 * Only dcomm_plugin.h and dcomm.h are included from the core.
 */
#ifndef DCOMM_TCP_H
#define DCOMM_TCP_H

#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dcomm_plugin.h"

/* Logs under the subsystem the host gave this backend ("tcp"). */
#define TCP_LOG(ctx, lvl, ...)                                                  \
  do {                                                                          \
    if ((ctx)->host->log_enabled(DCOMM_LOG_##lvl, (ctx)->host->log_subsys))     \
      (ctx)->host->log(DCOMM_LOG_##lvl, (ctx)->host->log_subsys, __VA_ARGS__);  \
  } while (0)

#define TCP_CHECK(call)                                                         \
  do {                                                                          \
    int tcp__rc = (call);                                                       \
    if (tcp__rc < 0) return tcp__rc;                                            \
  } while (0)

enum tcp_frame_type { TCP_F_DATA = 1, TCP_F_P2P, TCP_F_ABORT, TCP_F_BYE, TCP_F_WAKE, TCP_F_ACK };
/* tcp_hdr.reserved flag of a DATA frame on a shared-memory link: the ring
 * carries the sender's buffer address (8 bytes), and the receiver copies
 * the len payload bytes with process_vm_readv, then answers TCP_F_ACK. */
#define TCP_HF_CMA 1u

/* Every message starts with this header (host byte order: one cluster
 * shares one architecture). The signature fields let the receiver detect
 * mismatched collectives; len is checked against what it expects. */
struct tcp_hdr {
  uint32_t magic;
  uint8_t type, coll, dtype, op;
  int32_t root; /* root, or the tag for TCP_F_P2P, or the error for ABORT */
  uint32_t reserved;
  uint64_t seq;
  uint64_t count;
  uint64_t len; /* payload bytes that follow */
};
#define TCP_MAGIC 0x44434652u /* "DCFR" */
#define TCP_MAX_ABORT_MSG 512

struct tcp_uq;  /* a queued unexpected p2p message */
struct tcp_shm; /* a shared-memory link (tcp_shm.c) */

enum tcp_ar_algo { TCP_AR_AUTO = 0, TCP_AR_RING, TCP_AR_RD, TCP_AR_HIER, TCP_AR_RHD };
enum tcp_bcast_algo { TCP_BCAST_AUTO = 0, TCP_BCAST_TREE, TCP_BCAST_PIPELINE };
enum tcp_transport { TCP_TR_AUTO = 0, TCP_TR_SHM, TCP_TR_TCP };
#define TCP_HOST_ID_LEN 112
#define TCP_CPUS_LEN 64

struct tcp_peer {
  int fd;
  int departed; /* sent BYE: finalized cleanly */
  int closed;   /* saw EOF */
  /* A shared-memory link whose peer's ring was full when it finalized: its
   * BYE came on the socket, after everything in the ring. A link found
   * closed with the ring empty then says that the peer finalized. */
  int bye_on_sock;
  int mid_send; /* a send stopped inside a frame: no ABORT can follow */
  int ring_mid; /* the same in the shared-memory ring: the ACK of a
                 * single-copy receive from this peer waits for its end */
  int watch_off; /* pending data ahead of anything else: stop watching */
  struct tcp_hdr hdr; /* header being read / read but not consumed */
  size_t hgot;        /* bytes of hdr read so far */
  int have_hdr;       /* hdr complete and not yet consumed */
  struct tcp_uq *uq_head, *uq_tail;
  struct tcp_uq *rx_uq; /* unexpected message whose payload is still arriving */
  size_t rx_got;        /* its payload bytes read so far */
  /* Shared-memory link: frames go through its rings, the socket carries
   * only ABORT/WAKE frames (and a BYE that found the ring full) and the end of file (closed) of a dead peer. */
  struct tcp_shm *shm;
  struct tcp_hdr shdr; /* socket header being read on a shm link */
  size_t sgot;
  uint64_t cma_sent, cma_acked; /* single-copy sends offered / answered */
};

/* A link the listener accepted, waiting for its communicator's thread. */
struct tcp_parked {
  int fd;
  uint64_t comm_id;
  uint32_t rank, size;
  struct tcp_shm *shm;
};

/* What a dialing rank sends after the authenticated handshake: the
 * communicator, its rank there, and a shared-memory offer (shm_fd < 0:
 * none). */
struct tcp_hello {
  uint64_t comm_id;
  uint32_t rank, size;
  int32_t shm_pid, shm_fd;
  uint64_t shm_nonce, shm_ring;
  char host[TCP_HOST_ID_LEN];
};

/* The listener's answer: magic TCP_MAGIC, the link is taken (shm: the
 * offer was mapped); TCP_REFUSE_MAGIC, refused, since the listening rank
 * is dialing the dialer itself and its own link wins (tcp_listen.c). */
struct tcp_link_answer {
  uint32_t magic;
  int32_t shm;
};
#define TCP_REFUSE_MAGIC 0x44435246u /* "DCRF" */
struct tcp_dial;

struct tcp_addr {
  char addr[80];              /* "ip:port" */
  char host[TCP_HOST_ID_LEN]; /* host identity: boot id / host name */
  char cpus[TCP_CPUS_LEN];    /* its processors, a CPU list ("" unknown) */
};

struct tcp_ctx {
  const struct dcomm_host *host;
  int lfd, port;
  struct tcp_addr *addrs; /* of every world rank, loaded once */
  uint64_t addrs_comm;    /* the comm whose world numbering addrs follows (tcp_shrink.c) */
  char host_id[TCP_HOST_ID_LEN];
  /* The listener thread (tcp_listen.c) and what it shares, under
   * links_lock: the links it parked, the dials in progress. */
  pthread_t listener;
  int listener_on, stop_fd;
  pthread_mutex_t links_lock;
  pthread_cond_t links_cond;
  struct tcp_parked *parked;
  int nparked, cparked;
  struct tcp_dial *dialing;
  int ndialing, cdialing;
  atomic_uint park_serial; /* links parked so far (a comm looks when it moved) */
  int eager_all;           /* DCOMM_TCP_LINKS=eager: every link at creation */
  size_t chunk, bufsize;
  int check_mismatch;
  int transport;    /* enum tcp_transport */
  size_t shm_ring;  /* bytes per direction of a shm link, at most */
  size_t shm_budget; /* bytes the rings of one comm may take on a host */
  cpu_set_t cpus;   /* processors this process may run on */
  int sharing;      /* ranks of this host that may run on them (0: not counted yet) */
  int sharing_cpus; /* processors those ranks may run on */
};

/* The settings whose best value depends on the machine (dcomm-bench
 * --tune measures them): read when each communicator is created, so that
 * one job can compare values, a tuning file or variables change them. */
struct tcp_tuning {
  size_t small;     /* DCOMM_TCP_SMALL_THRESHOLD */
  int algo;         /* all_reduce: enum tcp_ar_algo (DCOMM_ALGO) */
  int bcast_algo;   /* broadcast: enum tcp_bcast_algo */
  double shm_spin;  /* seconds to poll rings before sleeping */
  size_t cma_min;   /* shm payloads from this size are read by the peer
                     * with process_vm_readv (0: never) */
  size_t cma_fwd_min; /* the same for data written earlier in the call */
  int cma_fwd_auto;   /* DCOMM_SHM_CMA_FWD_MIN=auto: from 1 MiB where
                       * the comm's own calls say it pays (tcp_cma.c) */
};

struct tcp_req;

/* DCOMM_SHM_CMA_FWD_MIN=auto (tcp_cma.c): size classes (powers of two of
 * the bytes per rank from TCP_CMA_FWD_FLOOR, the last open-ended) and
 * timed calls of each way per class. */
#define TCP_CMA_CLASSES 12
#define TCP_CMA_TRIALS 6
#define TCP_CMA_CALLS (2 + 2 * TCP_CMA_TRIALS) /* with the two unmeasured */
struct tcp_cma_try {
  unsigned char calls; /* trial calls made; TCP_CMA_CALLS: decided */
  unsigned char pick;  /* the decision: 1 single copy, 0 rings */
  double best[2];      /* fastest call through the rings [0], single copy [1] */
};
struct tcp_cma_call { /* one trial call */
  struct tcp_cma_try *t;
  int coll, cls, mode;
  double t0;
};

/* How a communicator's members sit on hosts (tcp_topo.c). */
struct tcp_topo {
  int nhosts;    /* distinct hosts among the members */
  int *local;    /* the members on this rank's host, ascending: local[0] leads it */
  int nlocal, local_me;
  int *leaders;  /* each host's leader (its lowest rank), ascending */
  int leader_me; /* this rank's index in leaders; -1: not a leader */
};

struct tcp_comm {
  struct tcp_ctx *ctx;
  struct tcp_tuning t;
  uint64_t id;
  int rank, size;
  const int *world_ranks_ref; /* not owned; copied below */
  int *world_ranks;
  struct tcp_peer *peers; /* size entries; peers[rank].fd = -1 */
  char label[32];
  int abort_fd;        /* eventfd: readable once aborted */
  atomic_int error;    /* first error that broke the comm, or 0 */
  char errmsg[TCP_MAX_ABORT_MSG];
  int abort_sent;
  void *stage[2];      /* chunk-sized staging buffers for reduce receives */
  void *tmp;           /* scratch for algorithms */
  void *cma_stage;     /* chunk-sized buffer for reducing single-copy reads */
  char *recv_mark;     /* size entries: peers with a pending receive (engine) */
  struct pollfd *pf;   /* the engine's poll set and what each entry is for, */
  int *pf_who;         /* grown to the largest set used (no fixed cap) */
  int pf_cap;
  /* The watched links (those no op of the step reads), in an epoll set
   * that the engine's poll sees as one descriptor: a step's poll costs
   * its ops, not the group's size. ep_on: registered now. */
  int epfd;
  char *ep_on;
  int ep_init;         /* every link registered once */
  int *woff, nwoff;    /* links held back (watch_off) until the next step */
  int nshm;            /* links in shared memory */
  size_t ring;         /* bytes per direction of its shared-memory rings */
  int nlinks;          /* links made (lazily: grows as peers are first used) */
  unsigned park_seen;  /* ctx->park_serial when this comm last adopted */
  struct tcp_topo topo;
  struct tcp_cma_try cma_try[DCOMM_COLL_COUNT][TCP_CMA_CLASSES];
  int cma_fwd_now;     /* this call's forwarded data may go by single copy */
  int cma_fwd_asked;   /* this call had forwarded data that could */
  uint64_t uq_serial;  /* unexpected messages completed so far (arrival order) */
  size_t tmp_cap;
  /* request queue (tcp_backend.c) */
  pthread_mutex_t qlock;
  pthread_cond_t qcond;
  struct tcp_req *qhead, *qtail;
  int executing, worker_started, worker_stop;
  pthread_t worker;
};

/* tcp_conn.c */
int tcp_listen_and_publish(struct tcp_ctx *ctx);
/* A new communicator's links: the directory, the host map, the links to
 * its ring neighbours (every peer with DCOMM_TCP_LINKS=eager). */
int tcp_links_open(struct tcp_ctx *ctx, struct tcp_comm *c, double deadline);
/* Between waits for a link: < 0 stops the wait with that error. */
typedef int (*tcp_link_check)(struct tcp_comm *c, void *arg);
/* The link to peer, dialed now if there is none (by the comm's thread). */
int tcp_link(struct tcp_comm *c, int peer, double deadline, tcp_link_check check, void *arg);
/* Adopts the links the listener parked for c since it last looked. */
int tcp_links_adopt(struct tcp_comm *c);

/* tcp_listen.c: the listener thread and the parked links */
int tcp_listener_start(struct tcp_ctx *ctx);
void tcp_listener_stop(struct tcp_ctx *ctx); /* also closes what is parked */
/* Takes the parked link of (comm, peer) (peer -1: any): 1 taken, 0 none. */
int tcp_parked_take(struct tcp_ctx *ctx, uint64_t comm_id, int size, int me, int peer, struct tcp_parked *out);
/* The same, waiting until then for the listener to park it. */
int tcp_parked_wait(struct tcp_ctx *ctx, uint64_t comm_id, int size, int me, int peer, double until,
                    struct tcp_parked *out);
/* Before dialing peer: 1 a parked link was taken instead (no dial), 0 the
 * dial is recorded (tcp_dial_end when it is over: made, the record stays
 * while the communicator lives), < 0 error. */
int tcp_dial_begin(struct tcp_ctx *ctx, uint64_t comm_id, int size, int me, int peer, struct tcp_parked *out);
void tcp_dial_end(struct tcp_ctx *ctx, uint64_t comm_id, int peer, int made);
/* Closes the links parked for a communicator that is gone, forgets its
 * dials. */
void tcp_parked_forget(struct tcp_ctx *ctx, uint64_t comm_id);

/* tcp_topo.c: the host map of a communicator, built from the address
 * directory before its links are made (tcp_links_open) */
int tcp_topo_build(struct tcp_comm *c);
void tcp_topo_free(struct tcp_topo *t);

/* tcp_shrink.c: comm_shrink, a new communicator among the survivors */
int tcp_comm_shrink(void *comm, const int *exclude, int nexclude, const struct dcomm_comm_spec *spec, void **out);
extern const struct dcomm_backend_v1 dcomm__backend_tcp; /* the ops table (tcp_backend.c) */

/* tcp_engine.c */
struct tcp_xop {
  int peer;
  int is_send;
  int reduce;         /* receive: reduce into buf instead of copying */
  const void *racc;   /* reducing receive: rbuf = racc (op) data, racc left
                       * as it is (NULL: rbuf's own contents); rbuf may be
                       * racc */
  const void *sbuf;   /* send payload */
  void *rbuf;         /* receive destination */
  size_t len;         /* payload bytes */
  /* progress (engine-private) */
  size_t done;        /* sends: header+payload bytes sent; receives: payload bytes */
  size_t reduced;     /* receives in reduce mode: bytes already reduced */
  int stage_idx;
  int hdr_ok;         /* receives: the header was checked and accepted */
  int cma;            /* single copy: sends wait for ack ticket, receives read raddr */
  int fwd;            /* sends: data this rank wrote earlier in the same call
                       * (partial sums, forwarded blocks), which a reader
                       * would fetch from this processor's cache */
  uint64_t ticket, raddr;
  int complete;
  struct tcp_hdr hdr; /* sends: the header to send */
};
/* Runs sends/receives concurrently until all complete. The collective's
 * signature (coll, dtype, op, root, seq, count) comes from a. */
int tcp_xfer(struct tcp_comm *c, struct tcp_xop *ops, int n, const struct dcomm_coll_args *a);
/* The comm's first error again (0 while it works). */
int tcp_broken(struct tcp_comm *c);
/* Room for need entries in the comm's poll set (c->pf, c->pf_who). */
int tcp_pf_reserve(struct tcp_comm *c, int need);
/* tcp_cpus.c: this rank's processors (at init) and a CPU list's text
 * ("0-3,8": -1 when it does not fit, or does not parse). */
void tcp_cpus_own(struct tcp_ctx *ctx);
int tcp_cpus_format(const cpu_set_t *set, char *buf, size_t len);
int tcp_cpus_parse(const char *s, cpu_set_t *set);
/* Whether the ranks of this host that may run on this rank's processors
 * outnumber those processors (a spinning rank may hold the processor its
 * peer needs); counted once from the directory, again after
 * tcp_cpus_forget (the world was renumbered). */
int tcp_oversubscribed(struct tcp_ctx *ctx);
void tcp_cpus_forget(struct tcp_ctx *ctx);
/* A waiting rank that finds nothing pauses this long before it yields. */
#define TCP_PAUSE_SPIN 5e-6
static inline void tcp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* tcp_frame.c: frames under the engine. */
/* Breaks the comm with err and msg (first error wins), tells the peers. */
int tcp_fail(struct tcp_comm *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An unexpected point-to-point message, queued on its peer until a recv
 * with its tag comes (at most MAX_UNEXPECTED bytes each). Its payload is
 * read as it arrives, never waited for (tcp_peer.rx_uq until complete):
 * two ranks that send each other large messages both drain the other's
 * while they wait for room. */
struct tcp_uq {
  struct tcp_uq *next;
  struct tcp_hdr hdr;
  void *data;
  size_t cap;      /* bytes allocated at data: grows as the payload arrives */
  uint64_t serial; /* arrival order among the comm's queued messages */
};
/* The first allocation for an unexpected payload; it doubles as bytes come,
 * so a header alone (a peer that announces 4 GiB and sends nothing) costs
 * this much, not what it announced. */
#define UQ_FIRST_CAP ((size_t)1 << 20)
#define MAX_UNEXPECTED ((uint64_t)1 << 32)
/* Frees the unexpected messages queued on p (its link is closing). */
void tcp_peer_free_queue(struct tcp_peer *p);
const char *tcp_coll_name(int c);
int tcp_world_of(const struct tcp_comm *c, int r);
/* Fails the comm: peer's link was lost while doing what. */
int tcp_lost_msg(struct tcp_comm *c, int peer, const char *what);
/* Takes in the control frames a shared-memory peer's ring holds. */
int tcp_shm_drain(struct tcp_comm *c, int peer);
/* Reads what is missing of peer's next header: 1 complete, 0 would block,
 * < 0 an error (end of file included). */
int tcp_read_hdr(struct tcp_comm *c, int peer);
/* Handles a complete header that is not data the caller waits for (ABORT,
 * BYE, an unexpected p2p message): 1 consumed, 0 data to keep, < 0 error. */
int tcp_take_control(struct tcp_comm *c, int peer, double deadline);
void tcp_describe_args(char *buf, size_t len, const struct dcomm_host *h, int coll, uint64_t seq, uint64_t count,
                       int dtype, int op, int root);
/* Whether header h belongs to collective a (same signature). */
int tcp_sig_matches(const struct tcp_hdr *h, const struct dcomm_coll_args *a);
/* Fails the comm with DCOMM_EMISMATCH naming peer's call and a. */
int tcp_mismatch(struct tcp_comm *c, int peer, const struct dcomm_coll_args *a);
/* Checks peer's header against the receive op of collective a. */
int tcp_check_hdr(struct tcp_comm *c, int peer, const struct tcp_xop *op, const struct dcomm_coll_args *a);

/* tcp_p2p.c: point-to-point send, receive and probe. */
int tcp_p2p_send(struct tcp_comm *c, const struct dcomm_coll_args *a);
/* (tcp_engine.c) Whether a send of len bytes to peer completes without the peer's help
 * (a shared-memory link with that much room). */
int tcp_sends_now(struct tcp_comm *c, int peer, size_t len, int fwd);
int tcp_p2p_recv(struct tcp_comm *c, const struct dcomm_coll_args *a);
/* (tcp_engine.c, which matches a receive's frame with it) Takes peer's
 * oldest queued message with a's tag into buf: 1 taken, 0 none queued,
 * DCOMM_EMISMATCH (comm broken) if its size or dtype differ. */
int tcp_uq_take(struct tcp_comm *c, int peer, const struct dcomm_coll_args *a, void *buf);
/* The probe op: see dcomm_plugin.h (called with the comm idle). */
int tcp_p2p_probe(struct tcp_comm *c, int peer, int tag, double deadline, int *src, size_t *nbytes);
/* tcp_conn.c: clean goodbye on every link (BYE + shutdown + drain); then close. */
void tcp_close_links(struct tcp_comm *c);

/* tcp_shm.c */
void tcp_host_id(char *buf, size_t len);
size_t tcp_shm_ring_size(size_t want); /* power of two, 64 KiB .. 256 MiB */
/* The smallest ring a link may have (DCOMM_SHM_HOST_BUDGET never goes
 * below it). Smaller rings were tried: with 16 and 32 KiB, check_coll's
 * 3-rank reduce_scatter hung and an all_to_allv mismatch went unnoticed. */
#define TCP_SHM_RING_MIN ((size_t)65536)
/* A ring send publishes at most this much at a time, so the reader copies
 * out while the rest is copied in (tcp_engine.c). */
#define TCP_SHM_PIECE ((size_t)65536)
/* DCOMM_SHM_CMA_FWD_MIN=auto: below this forwarded data goes through the
 * rings on every machine measured (a single copy's fixed cost). */
#define TCP_CMA_FWD_FLOOR ((size_t)1048576)
/* The connector creates (side 0) and offers pid/memfd/nonce; the acceptor
 * attaches (side 1). -1 with a reason in why on failure. */
int tcp_shm_create(size_t ring, struct tcp_shm **out, int *memfd, uint64_t *nonce, char *why, size_t wl);
int tcp_shm_attach(int pid, int fd, uint64_t nonce, size_t ring, struct tcp_shm **out, char *why, size_t wl);
void tcp_shm_set_fd(struct tcp_shm *s, int fd);
/* The peer's pid if it and this process may read each other's memory
 * with process_vm_readv, else 0. */
int tcp_shm_cma_pid(const struct tcp_shm *s);
/* tcp_cma.c: whether the single copy of forwarded data pays, tried on a
 * comm's first calls of each collective and size class. begin sets
 * c->cma_fwd_now for the call; it returns 1 when the call is part of a
 * trial, and then end takes its time. */
int tcp_cma_fwd_begin(struct tcp_comm *c, const struct dcomm_coll_args *a, struct tcp_cma_call *k);
void tcp_cma_fwd_end(struct tcp_comm *c, const struct tcp_cma_call *k, int rc);
void tcp_shm_free(struct tcp_shm *s);
/* Producer: a header and as much of its payload as fits, published at
 * once: the payload bytes written, or -1 if not even the header fits. Then
 * the rest of the payload: bytes written. */
long tcp_shm_put_frame(struct tcp_shm *s, const struct tcp_hdr *h, const void *src, size_t len);
size_t tcp_shm_put(struct tcp_shm *s, const void *src, size_t len);
/* Whether a whole frame of len payload bytes fits in the ring right now. */
int tcp_shm_fits(struct tcp_shm *s, size_t len);
/* Consumer: 1/0 header read or none yet; contiguous readable bytes at *p
 * (then consume); copy out. */
int tcp_shm_get_hdr(struct tcp_shm *s, struct tcp_hdr *h);
size_t tcp_shm_peek(struct tcp_shm *s, const void **p);
void tcp_shm_consume(struct tcp_shm *s, size_t n);
size_t tcp_shm_get(struct tcp_shm *s, void *dst, size_t len);
/* Before sleeping: raise the waiting flag; nonzero if there is already
 * something to do (then do not sleep). */
int tcp_shm_arm_rx(struct tcp_shm *s);
int tcp_shm_arm_tx(struct tcp_shm *s);

/* tcp_algos.c */
int tcp_run_coll(struct tcp_comm *c, const struct dcomm_coll_args *a);
/* Scratch buffer of at least len bytes owned by the comm. */
void *tcp_scratch(struct tcp_comm *c, size_t len);

#endif
