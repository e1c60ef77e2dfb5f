/*
 * bench_util.h: what the collective benchmarks dcomm-bench
 * (tools/dcomm_bench.c) and its MPI twin (tests/perf/mpi_bench.c) share: the
 * options, the size steps, the checked input pattern, nccl-tests' bus
 * bandwidth factors, the measurement loop and the output rows; and the
 * element access for every dtype that the tests use too (tests/check_coll.c,
 * tests/gpu/gpu_coll.c). It calls neither libdcomm nor MPI: it takes only
 * the dtype enum from dcomm.h, and each program passes its communication as
 * callbacks.
 */
#ifndef DCOMM_BENCH_UTIL_H
#define DCOMM_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dcomm.h"

/* Element i of buf, of type dt, as a double and back (float16 and bfloat16
 * round to nearest-even). */
void bench_put(void *buf, dcomm_dtype_t dt, size_t i, double v);
double bench_get(const void *buf, dcomm_dtype_t dt, size_t i);

enum bench_op { OP_ALL_REDUCE, OP_ALL_GATHER, OP_BROADCAST, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_BARRIER, OP_COUNT };

extern const char *const bench_op_names[OP_COUNT];

struct bench_dtype {
  const char *name;
  dcomm_dtype_t dt;
  size_t size;  /* bytes of one element */
  double exact; /* largest integer every value and sum must stay below */
};
extern const struct bench_dtype bench_dtypes[DCOMM_DTYPE_COUNT];

struct bench_opts {
  int op;
  size_t dti; /* index into bench_dtypes */
  size_t minb, maxb, factor;
  long iters, warmup, group, check;
};

/* What the -h text and the usage errors say of the program. */
struct bench_prog {
  const char *name;     /* "dcomm-bench" */
  const char *dtypes;   /* the dtypes -d accepts, for -h */
  const char *run_hint; /* the closing lines of -h: how to launch it */
  int rank_env;         /* rank from the launcher's environment, -1 unknown: only rank <= 0 prints */
};

/* Parses the flags into o; -h prints the help and exits 0, a bad flag
 * exits 2 (see bench_usage_error). */
void bench_parse_args(const struct bench_prog *p, int argc, char **argv, struct bench_opts *o);
/* Prints "NAME: " fmt (with arg) and the synopsis (on rank <= 0), exits 2. */
void bench_usage_error(const char *fmt, const char *arg);
/* A size in bytes: unsigned decimal with an optional K, M or G (powers of
 * 1024) suffix and an optional B. 0, or -1 when s is not one. */
int bench_parse_size(const char *s, size_t *out);

/* One benchmark on this rank's group: the buffers and the call's count. */
struct bench_run {
  int op;
  dcomm_dtype_t dt;
  size_t es, count; /* count: what the call takes */
  int grank, gsize;
  void *sbuf, *rbuf;   /* host memory: the pattern is written and checked here */
  void *dsbuf, *drbuf; /* device copies the call uses (dcomm-bench with nccl), else NULL */
};

/* The send and receive bytes of the call x describes (0: no such buffer). */
void bench_run_bytes(const struct bench_run *x, size_t *sbytes, size_t *rbytes);

/* The send and receive buffer bytes the largest size (-e) needs; 0 when
 * the op has no such buffer. *maxcount is the largest count of the call. */
void bench_buffer_bytes(const struct bench_opts *o, size_t es, int n, size_t *maxcount, size_t *sbytes, size_t *rbytes);

/* The communication a program gives the loop; each dies on failure. */
struct bench_comm {
  void (*run_once)(void *ctx, const struct bench_run *x); /* the collective under test */
  int64_t (*sum_world)(void *ctx, int64_t v);             /* sum over the world */
  double (*max_world)(void *ctx, double v);               /* max over the world */
  void (*barrier_world)(void *ctx);
  void *ctx;
  /* Optional (device buffers): copy the prepared input to them, and the
   * checked result back. */
  void (*upload)(void *ctx, const struct bench_run *x);
  void (*download)(void *ctx, const struct bench_run *x);
};

/* Prints (when print) the "# op ..." line, and the column header. */
void bench_print_config(const struct bench_opts *o, int wsize, int gsize);
void bench_print_columns(void);
/* Runs every size from -b to -e, printing one row per size and the summary
 * when print; returns the wrong elements over all ranks. */
uint64_t bench_loop(const struct bench_opts *o, struct bench_run *x, const struct bench_comm *c, int print);

#endif
