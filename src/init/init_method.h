/*
 * init_method.h: turns an init method (env://, tcp://, file://, pmix://,
 * slurm://, etcd://, or none: detect) into the facts dcomm_init needs: rank, world
 * size, local rank, and where the store is. Missing or contradictory values
 * are DCOMM_EINVAL naming the variable. pmix:// is only recognized here:
 * its facts come from the PMIx server when the store is set up.
 * etcd://h1:p1,h2:p2 keeps the store in etcd; without ?rank=&world_size=
 * (or RANK/WORLD_SIZE) every process joins the job's next generation, so
 * it needs elastic mode: that is how dcomm-run --rdzv-backend etcd starts
 * its workers.
 */
#ifndef DCOMM_INIT_METHOD_H
#define DCOMM_INIT_METHOD_H

enum dcomm_init_kind { DCOMM_IM_ENV = 1, DCOMM_IM_TCP, DCOMM_IM_FILE, DCOMM_IM_PMIX, DCOMM_IM_SLURM, DCOMM_IM_ETCD };

struct dcomm_init_spec {
  enum dcomm_init_kind kind;
  int rank, world_size, local_rank, local_size;
  char host[256]; /* tcp store host (env://: MASTER_ADDR) */
  int port;
  char path[1024]; /* file:// path; etcd://: the endpoint list */
  int agent_store; /* 1: a launcher hosts the store; rank 0 starts none */
  int join;        /* 1: the rank comes from the next generation's plan */
  int singleton;   /* 1: no launcher, nothing set: a world of one, store on 127.0.0.1:any */
};

/* The init methods, from the table dcomm_init dispatches through: i from
 * 0 until NULL. built: 0 when this build lacks the library it needs. */
struct dcomm_init_method_info {
  const char *scheme; /* "env://" */
  enum dcomm_init_kind kind;
  int built;
  const char *what; /* where the facts come from, for dcomm-info */
  const char *library; /* the library it opens at its first use, or NULL */
};
const struct dcomm_init_method_info *dcomm__init_method_info(int i);
/* 0 when method i can run here (its library, if any, opens); else
 * DCOMM_ENOTSUP saying why. */
int dcomm__init_method_usable(int i);

/* url NULL or "": DCOMM_INIT_METHOD, else detected: env:// when MASTER_ADDR,
 * RANK and WORLD_SIZE are all set (a torchrun-style launcher, also inside
 * a SLURM or PMIx job), else pmix:// under a PMIx server, else slurm://
 * when SLURM_PROCID is set, else env:// when MASTER_ADDR is set. Nothing
 * set at all (no launcher): a world of one (spec->singleton); some of
 * torchrun's variables set but not MASTER_ADDR: DCOMM_EINVAL naming the
 * missing ones. */
int dcomm__init_spec_parse(const char *url, struct dcomm_init_spec *out);

#endif
