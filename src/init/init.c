/*
 * init.c: dcomm_init / dcomm_finalize, the library's one composition root.
 * It parses the init method, sets up the store of that kind (rank 0 hosts
 * the embedded server unless a launcher does; pmix:// learns the address
 * through PMIx; etcd:// uses etcd; file:// a shared file), loads the
 * backend, builds the world and, in elastic mode, starts the watcher and
 * joins through the recovery rounds. It is the only core file that knows
 * elastic/, pmix/ and the store kinds.
 */
#include "config.h"
#include "world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uuid/uuid.h>

#include "auth.h"
#include "checkin.h"
#include "elastic.h"
#include "error.h"
#include "etcd_client.h"
#include "init_method.h"
#include "keys.h"
#include "log.h"
#include "param.h"
#include "pmix_boot.h"
#include "sock.h"
#include "store.h"

static char file_store_path[1024];

/* ---- init / finalize ---- */

/* pmix://, rank 0: hosts the store (DCOMM_STORE_PORT, else any port) and
 * says where; host "" lets PMIx boot pick this host's address. */
static int pmix_host_store(void *arg, char *host, size_t hostlen, int *port) {
  struct dcomm_world *w = arg;
  long want = dcomm__param_int(DCOMM_P_STORE_PORT);
  if (want < 0 || want > 65535) return dcomm__err(DCOMM_EINVAL, "DCOMM_STORE_PORT=%ld is not a port number", want);
  int rc = dcomm__store_server_start(NULL, (int)want, w->job_id, w->token, &w->server);
  if (rc < 0) return dcomm__err_ctx(rc, "rank 0 cannot host the store on port %ld (DCOMM_STORE_PORT)", want);
  *port = dcomm__store_server_port(w->server);
  snprintf(host, hostlen, "%s", dcomm__param_str(DCOMM_P_SOCKET_IFADDR));
  return 0;
}

/* Runs on PMIx's thread: must not block. Failures are detected by the
 * backend anyway; this says early who is gone: in elastic mode the watcher
 * turns it into the revoke notice of the generation. */
static void pmix_on_lost(int rank, void *arg) {
  struct dcomm_world *w = arg;
  if (rank >= 0) DCOMM_LOG(WARN, PMIX, "the PMIx server reports rank %d lost", rank);
  else DCOMM_LOG(WARN, PMIX, "the PMIx server reports a lost process or connection");
  __atomic_store_n(&w->lost_hint, rank + 1, __ATOMIC_RELAXED);
  __atomic_store_n(&w->lost_hint_set, 1, __ATOMIC_RELEASE);
}

/* pmix://: identity from PMIx, rank 0's store address through the modex. */
static int setup_pmix(struct dcomm_world *w, struct dcomm_init_spec *spec, double timeout) {
  struct dcomm_pmix_boot b;
  DCOMM_CHECK(dcomm__pmix_boot(&b, timeout, pmix_host_store, w));
  w->rank = spec->rank = b.rank;
  w->size = spec->world_size = b.size;
  w->local_rank = spec->local_rank = b.local_rank;
  w->local_size = spec->local_size = b.local_size;
  snprintf(spec->host, sizeof(spec->host), "%s", b.store_host);
  spec->port = b.store_port;
  spec->agent_store = 1; /* already started by pmix_host_store on rank 0 */
  dcomm__log_set_identity(w->rank, w->generation);
  if (dcomm__pmix_register_events(pmix_on_lost, w) < 0)
    DCOMM_LOG(INFO, PMIX, "no PMIx event handler: %s", dcomm_last_error());
  return 0;
}

/* etcd://: the store is etcd itself, one client per link. */
static int setup_etcd(struct dcomm_world *w, struct dcomm_init_spec *spec, double timeout) {
  int rc = dcomm__store_etcd_open(spec->path, w->job_id, timeout, &w->store);
  if (rc < 0) return dcomm__err_ctx(rc, "cannot use etcd at %s as the store", spec->path);
  if (w->elastic) {
    rc = dcomm__store_etcd_open(spec->path, w->job_id, timeout, &w->estore);
    if (rc < 0) return dcomm__err_ctx(rc, "cannot use etcd at %s as the store", spec->path);
    dcomm__store_set_prefix(w->estore, "");
  }
  const char *ifaddr = dcomm__param_str(DCOMM_P_SOCKET_IFADDR);
  if (*ifaddr) snprintf(w->listen_ip, sizeof(w->listen_ip), "%s", ifaddr);
  else DCOMM_CHECK(dcomm__sock_route_ip(spec->host, spec->port, w->listen_ip, sizeof(w->listen_ip)));
  return 0;
}

/* pmix:// fills in the spec (identity and store address) first. */
static int setup_store(struct dcomm_world *w, struct dcomm_init_spec *spec) {
  double timeout = dcomm__param_double(DCOMM_P_TIMEOUT);
  double ctimeout = dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT);
  if (spec->kind == DCOMM_IM_PMIX) DCOMM_CHECK(setup_pmix(w, spec, ctimeout));
  if (spec->kind == DCOMM_IM_FILE) {
    snprintf(file_store_path, sizeof(file_store_path), "%s", spec->path);
    DCOMM_CHECK(dcomm__store_file_open(spec->path, timeout, &w->store));
    if (w->elastic) {
      DCOMM_CHECK(dcomm__store_file_open(spec->path, timeout, &w->estore));
      dcomm__store_set_prefix(w->estore, "");
    }
    const char *ifaddr = dcomm__param_str(DCOMM_P_SOCKET_IFADDR);
    snprintf(w->listen_ip, sizeof(w->listen_ip), "%s", *ifaddr ? ifaddr : "127.0.0.1");
    return 0;
  }
  file_store_path[0] = 0;
  if (spec->kind == DCOMM_IM_ETCD) return setup_etcd(w, spec, timeout);
  if (spec->rank == 0 && !spec->agent_store) {
    int rc = dcomm__store_server_start(spec->singleton ? spec->host : NULL, spec->port, w->job_id, w->token,
                                       &w->server);
    if (rc == 0 && spec->port == 0) spec->port = dcomm__store_server_port(w->server);
    if (rc < 0)
      return dcomm__err_ctx(rc, "rank 0 cannot host the store on port %d (is %s in use?)", spec->port,
                            spec->kind == DCOMM_IM_SLURM ? "the port derived from SLURM_JOB_ID and SLURM_STEP_ID "
                                                           "(set DCOMM_STORE_PORT)"
                                                         : "MASTER_PORT");
  }
  int rc = dcomm__store_tcp_connect(spec->host, spec->port, w->job_id, w->token, ctimeout, timeout, &w->store);
  if (rc < 0 && spec->kind == DCOMM_IM_ENV && !spec->agent_store)
    return dcomm__err_ctx(rc, "cannot reach the store at %s:%d (MASTER_ADDR:MASTER_PORT) within "
                              "DCOMM_CONNECT_TIMEOUT=%g s: is rank 0 running, and do MASTER_ADDR and MASTER_PORT "
                              "name its host and port on every rank?",
                          spec->host, spec->port, ctimeout);
  if (rc < 0) return dcomm__err_ctx(rc, "cannot reach the store at %s:%d within DCOMM_CONNECT_TIMEOUT=%g s",
                                    spec->host, spec->port, ctimeout);
  if (w->elastic) { /* the watcher's own link, so it never delays calls */
    rc = dcomm__store_tcp_connect(spec->host, spec->port, w->job_id, w->token, ctimeout, timeout, &w->estore);
    if (rc < 0) return dcomm__err_ctx(rc, "cannot reach the store at %s:%d", spec->host, spec->port);
    dcomm__store_set_prefix(w->estore, "");
  }
  const char *ifaddr = dcomm__param_str(DCOMM_P_SOCKET_IFADDR);
  if (*ifaddr) snprintf(w->listen_ip, sizeof(w->listen_ip), "%s", ifaddr);
  else DCOMM_CHECK(dcomm__store_tcp_local_ip(w->store, w->listen_ip, sizeof(w->listen_ip)));
  return 0;
}

static void teardown(struct dcomm_world *w) {
  if (w->elastic) dcomm__elastic_stop(w);
  while (w->groups) {
    struct dcomm_group *g = w->groups;
    w->groups = g->next;
    dcomm__group_release(g);
    free(g);
  }
  if (w->be) dcomm__world_release(w, 0);
  free(w->world.world_ranks);
  w->world.world_ranks = NULL;
  free(w->members);
  w->members = NULL;
  dcomm__backend_unload(w->be_module);
  w->be_module = NULL;
  w->be = NULL;
  if (w->jstore) dcomm__store_close(w->jstore);
  w->jstore = NULL;
  if (w->store) dcomm__store_close(w->store);
  w->store = NULL;
  if (w->estore) dcomm__store_close(w->estore);
  w->estore = NULL;
  if (w->server) dcomm__store_server_stop(w->server);
  w->server = NULL;
  dcomm__pmix_finalize(); /* no-op unless pmix:// booted */
  w->initialized = 0;
  w->new_groups = 0;
  w->joiner = 0;
  w->shrink_failed = 0;
}

/* Through this thread's own store link, never the watcher's: the watcher
 * holds its link for a whole blocking get (a heartbeat interval). */
static int set_generation_zero(struct dcomm_world *w) {
  return dcomm__store_set(w->jstore, DCOMM_KEY_GEN, "0", 2);
}

int dcomm_init(const char *backend, const char *init_method) {
  struct dcomm_world *w = &dcomm__w;
  struct dcomm_init_spec spec;
  int rc;
  dcomm__err_clear();
  if (w->initialized) return dcomm__err(DCOMM_EINVAL, "dcomm_init: already initialized (call dcomm_finalize first)");
  dcomm__log_setup();
  DCOMM_CHECK(dcomm__params_load());
  /* dcomm-run asks for it: a worker's printf reaches the launcher's
   * output line by line (live), not in blocks at exit. */
  if (dcomm__param_bool(DCOMM_P_LINE_BUFFERED)) setvbuf(stdout, NULL, _IOLBF, 0);
  DCOMM_CHECK(dcomm__init_spec_parse(init_method, &spec));
  if (!backend || !*backend) backend = dcomm__param_str(DCOMM_P_BACKEND);
  snprintf(w->backend_name, sizeof(w->backend_name), "%s", backend);
  w->rank = spec.rank;
  w->size = spec.world_size;
  w->local_rank = spec.local_rank;
  w->local_size = spec.local_size;
  w->generation = 0;
  w->revoked = 0;
  w->world.timeout = dcomm__param_double(DCOMM_P_TIMEOUT);
  w->elastic = dcomm__param_bool(DCOMM_P_ELASTIC);
  dcomm__log_set_identity(w->rank, w->generation);
  const char *job = dcomm__param_str(DCOMM_P_JOB_ID);
  snprintf(w->job_id, sizeof(w->job_id), "%s", *job ? job : "default");
  /* slurm:// derives its port, so two steps may meet on one: their job ids
   * differ, so the handshake refuses the wrong store. */
  if (!*job && spec.kind == DCOMM_IM_SLURM && getenv("SLURM_JOB_ID") && getenv("SLURM_STEP_ID"))
    snprintf(w->job_id, sizeof(w->job_id), "slurm-%.100s.%.100s", getenv("SLURM_JOB_ID"), getenv("SLURM_STEP_ID"));
  snprintf(w->token, sizeof(w->token), "%s", dcomm__param_str(DCOMM_P_AUTH_TOKEN));
  if (strlen(w->job_id) > DCOMM_HS_MAX_JOB) return dcomm__err(DCOMM_EINVAL, "DCOMM_JOB_ID is longer than %d bytes", DCOMM_HS_MAX_JOB);
  const char *mid = dcomm__param_str(DCOMM_P_MEMBER_ID);
  if (*mid) {
    if (strlen(mid) >= sizeof(w->member_id)) return dcomm__err(DCOMM_EINVAL, "DCOMM_MEMBER_ID is longer than 39 bytes");
    snprintf(w->member_id, sizeof(w->member_id), "%s", mid);
  } else {
    uuid_t u;
    uuid_generate(u);
    uuid_unparse_lower(u, w->member_id);
  }

  if (spec.join && (!w->elastic || !spec.agent_store))
    return dcomm__err(DCOMM_EINVAL, "DCOMM_ELASTIC_JOIN=1 needs elastic mode with a launcher-hosted store "
                                    "(DCOMM_ELASTIC=1, DCOMM_USE_AGENT_STORE=1, as dcomm-run sets)");
  rc = dcomm__backend_load(backend, &w->be, &w->be_module);
  if (rc < 0) return rc;
  double t0 = dcomm__now();
  /* The first world's whole set-up (reaching the store, the check-in and
   * the world's communicator) within DCOMM_CONNECT_TIMEOUT; a joiner's
   * world is a recovery's, bounded by DCOMM_TIMEOUT. */
  double until = t0 + dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT);
  if ((rc = setup_store(w, &spec)) < 0) goto fail;
  if ((rc = dcomm__store_view(w->store, "", &w->jstore)) < 0) goto fail;
  w->initialized = 1; /* groups and the elastic layer need the world */
  /* The watcher starts first so that a joiner heartbeats while it waits. */
  if (w->elastic && (rc = dcomm__elastic_start(w)) < 0) goto fail;
  if (w->elastic && spec.join && (rc = dcomm__elastic_join(w)) < 0) goto fail;
  if (!spec.join && w->size > 1 && (rc = dcomm__checkin(w, &spec, until)) < 0) goto fail;
  if (!spec.join) {
    dcomm__checkin_test_stall(w);
    double left = until - dcomm__now();
    w->world.timeout = left < 0.001 ? 0.001 : left < w->world.timeout ? left : w->world.timeout;
  }
  rc = dcomm__world_build(w);
  w->world.timeout = dcomm__param_double(DCOMM_P_TIMEOUT);
  if (rc < 0 && !spec.join && w->size > 1) rc = dcomm__first_world_failed(w, rc);
  if (rc < 0) goto fail;
  /* A world started from the launch ranks is generation 0: recovery rounds
   * must not take their first round for the job's first rendezvous. */
  if (w->elastic && !spec.join && w->rank == 0 && (rc = set_generation_zero(w)) < 0) goto fail;
  if (spec.singleton)
    DCOMM_LOG(INFO, INIT, "no launcher and no MASTER_ADDR/RANK/WORLD_SIZE: running as a world of one");
  DCOMM_LOG(INFO, INIT, "initialized: rank %d of %d (local %d of %d), backend %s, job %s, generation %ld, %.3f s",
            w->rank, w->size, w->local_rank, w->local_size, w->be->name, w->job_id, w->generation, dcomm__now() - t0);
  return 0;
fail:
  DCOMM_LOG(INFO, INIT, "dcomm_init failed: %s", dcomm_last_error()); /* the caller gets it */
  {
    char saved[1024];
    snprintf(saved, sizeof(saved), "%s", dcomm_last_error());
    teardown(w);
    dcomm__err(rc, "%s", saved);
  }
  return rc;
}

int dcomm_finalize(void) {
  struct dcomm_world *w = &dcomm__w;
  if (!w->initialized) return dcomm__err(DCOMM_ENOTINIT, "dcomm_finalize: not initialized");
  /* Count the ranks that are done, so the rank hosting the store (and the
   * last user of a shared file) can wait for the others, bounded. */
  int64_t done = 0;
  int counted = w->store && dcomm__store_add(w->store, "finalized", 1, &done) == 0;
  if (counted && w->server) {
    double until = dcomm__now() + 5.0;
    while (done < w->size && dcomm__now() < until) {
      usleep(2000);
      if (dcomm__store_add(w->store, "finalized", 0, &done) < 0) break;
    }
  }
  int last = counted && done >= w->size;
  teardown(w);
  if (last && file_store_path[0]) unlink(file_store_path);
  return 0;
}

