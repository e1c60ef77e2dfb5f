/*
 * store_server_conn.h: the embedded store server's state, shared by its
 * event loop (store_server.c: connections, deadlines, start and stop) and
 * its commands (store_commands.c: the waiter table, frame parsing, the
 * handlers and their answers). Private to those two files.
 */
#ifndef DCOMM_STORE_SERVER_CONN_H
#define DCOMM_STORE_SERVER_CONN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "kvmap.h"

/* Buckets of the waiter table (a power of two). */
#define WAIT_BUCKETS 1024

/* What a parse step or a handler returns. */
enum {
  SV_CLOSE = -1, /* close the connection now */
  SV_OK = 0,     /* field read, go on */
  SV_NEED = 1,   /* the frame is not complete yet */
  SV_BLOCK = 2,  /* the request waits for a key */
  SV_DONE = 3,   /* the answer is queued (a closing error included) */
};

struct conn {
  int fd;
  int in_hs;   /* the handshake is not done */
  int closing; /* close once the output is flushed */
  int eof;     /* the client closed its side: serve what is in, then close */
  int dead;    /* closed; freed at the end of the loop pass */
  uint32_t events;
  unsigned char nonce[DCOMM_HS_NONCE_LEN];
  unsigned char *in, *out;
  size_t in_len, in_cap, out_len, out_off, out_cap;
  /* Deadlines (CLOCK_MONOTONIC seconds): the handshake, the frame whose
   * first byte is in, the answer being flushed, the blocked request. The
   * heap holds the one that applies (conn_deadline). */
  double hs_dl, frame_dl, out_dl, block_dl;
  size_t hpos; /* in the deadline heap, or SIZE_MAX */
  int blocked;
  /* While blocked: the key it waits for (in its frame), its place in the
   * waiter table; woken: its place in the ready list. */
  const char *wkey;
  size_t wklen;
  struct conn *wnext, **wprev;
  struct conn *rnext;
  int ready;
  struct conn *anext, **aprev; /* every connection */
};

struct dcomm_store_server {
  pthread_mutex_t busy; /* held by the loop except in epoll_wait */
  pthread_cond_t started_cv; /* start returns once the loop runs */
  int started;
  struct dcomm_store_server *reg_next; /* running servers (atfork) */
  int lfd, port, epfd;
  int stop_pipe[2]; /* written once by stop, never drained */
  pthread_t loop;
  struct conn *waiters[WAIT_BUCKETS];
  struct conn *ready, **ready_tail;
  struct conn *all, *graveyard;
  struct conn **heap;
  size_t nheap, heap_cap;
  int nconns, max_conns;
  int listen_paused;
  double listen_resume;
  double refusal_at; /* refusals logged at most once a second */
  long refusals_quiet;
  struct dcomm_kvmap map;
  char *job_id, *token;
  char tag_listen, tag_stop; /* epoll data of the listener and the pipe */
};

/* DCOMM_TIMEOUT, at least 10 s: the bound on a frame's arrival and on an
 * answer's departure. */
double dcomm__sv_frame_timeout(void);
/* A refused or dropped connection: a warning, at most one a second. */
void dcomm__sv_note_refusal(struct dcomm_store_server *srv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- store_commands.c ---- */

/* Takes c out of the waiter table (it was closed or answered). */
void dcomm__sv_unwait(struct conn *c);
/* Queues bytes a then b on c's output: SV_DONE, or SV_CLOSE without memory. */
int dcomm__sv_out_put(struct conn *c, const void *a, size_t al, const void *b, size_t bl);
/* An error answer; closing: the request was malformed, the stream cannot
 * be trusted any more and the connection ends after this answer. */
int dcomm__sv_answer_err(struct conn *c, int status, int closing, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The request at the head of c's input: SV_NEED, SV_BLOCK, SV_DONE (its
 * frame consumed unless the connection is closing) or SV_CLOSE. */
int dcomm__sv_serve_frame(struct dcomm_store_server *srv, struct conn *c);
/* The handshake answer at the head of c's input. */
int dcomm__sv_serve_hs(struct dcomm_store_server *srv, struct conn *c);

#endif
