/*
 * gpu_shrink.c: the kill-one-rank recovery of the nccl backend, driven
 * through the backend ABI (dcomm_plugin.h) the way the elastic layer uses
 * it, for a machine with two or more GPUs. tests/gpu/run.sh starts one
 * process per GPU:
 *   gpu_shrink MODULE DIR RANK NRANKS
 * MODULE is dcomm_nccl.so; DIR is an empty directory that serves as the
 * store (one file per key) and where run.sh signals: every rank writes its
 * pid into "ready.<rank>" once the world works; run.sh then SIGKILLs the last rank,
 * reaps it and creates "killed". The survivors are blocked in an
 * all_reduce meanwhile; a watcher thread (as the elastic watcher does on a
 * revoke notice) calls comm_abort, which revokes the NCCL communicators
 * (ncclCommRevoke), the blocked call returns, and the survivors shrink
 * the world with comm_shrink (ncclCommShrink, NCCL_SHRINK_ABORT), check an
 * all_reduce on it, and, for comparison, time the fall-back: abort and a
 * new communicator from a fresh unique id. The last line is
 *   [rank R] GPU checks: N passed, M failed
 */
#define _GNU_SOURCE /* usleep, strdup */

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcomm_plugin.h"
#include "gpu_harness.h"

static int me, np;
static const char *dir;
static char last_err[2048];
static const struct dcomm_backend_v1 *be;

static const char *rctext(int rc) {
  static char buf[2200];
  if (rc == 0) return "0";
  snprintf(buf, sizeof(buf), "%d (%s)", rc, last_err);
  return buf;
}

/* ---- the host services: a store of files in dir ---- */

static void key_path(const char *key, char *out, size_t len) {
  int n = snprintf(out, len, "%s/", dir);
  for (const char *k = key; *k && (size_t)n + 1 < len; k++) out[n++] = *k == '/' ? '_' : *k;
  out[n] = 0;
}

static int h_store_set(void *s, const char *key, const void *val, size_t len) {
  (void)s;
  char path[1024], tmp[1100];
  key_path(key, path, sizeof(path));
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, me);
  FILE *f = fopen(tmp, "wb");
  if (!f || fwrite(val, 1, len, f) != len || fclose(f) != 0 || rename(tmp, path) != 0) return DCOMM_ESYSTEM;
  return 0;
}

static int h_store_get(void *s, const char *key, double timeout, void **val, size_t *len) {
  (void)s;
  char path[1024];
  key_path(key, path, sizeof(path));
  double until = gpu_now() + timeout;
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      char *buf = malloc(65536);
      size_t n = buf ? fread(buf, 1, 65536, f) : 0;
      fclose(f);
      if (!buf) return DCOMM_ENOMEM;
      *val = buf;
      *len = n;
      return 0;
    }
    if (gpu_now() >= until) {
      snprintf(last_err, sizeof(last_err), "store key %s did not appear in %.1f s", key, timeout);
      return DCOMM_ETIMEDOUT;
    }
    usleep(1000);
  }
}

static int exists(const char *name) {
  char path[1024];
  key_path(name, path, sizeof(path));
  return access(path, F_OK) == 0;
}

static int h_log_enabled(int level, int subsys) {
  (void)subsys;
  return level <= (getenv("GPU_SHRINK_VERBOSE") ? 2 : 1);
}

static void h_log(int level, int subsys, const char *fmt, ...) {
  (void)subsys;
  va_list ap;
  fprintf(stderr, "[rank %d] log%d: ", me, level);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
}

static int h_err(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_err, sizeof(last_err), fmt, ap);
  va_end(ap);
  return code;
}

static const char *h_param(const char *name) { return getenv(name); }

/* ---- one all_reduce of one int through the table ---- */

static int all_reduce_int(void *comm, int *dbuf, int v, double timeout, int *out) {
  if (cudaMemcpy(dbuf, &v, sizeof(int), cudaMemcpyHostToDevice) != cudaSuccess) return DCOMM_EBACKEND;
  struct dcomm_coll_args a = {.coll = DCOMM_COLL_ALL_REDUCE, .recvbuf = dbuf, .count = 1, .dtype = DCOMM_INT32,
                              .op = DCOMM_SUM, .deadline = gpu_now() + timeout};
  void *req = NULL;
  int rc = be->post(comm, &a, &req);
  if (rc == 0) rc = be->wait(req);
  if (rc == 0 && cudaMemcpy(out, dbuf, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) rc = DCOMM_EBACKEND;
  return rc;
}

/* ---- the watcher: aborts the world once run.sh says a rank is gone ---- */

struct watch {
  void *comm;
  double seen, aborted;
  int rc;
};

static void *watcher(void *arg) {
  struct watch *w = arg;
  double until = gpu_now() + 120;
  while (!exists("killed") && gpu_now() < until) usleep(500);
  w->seen = gpu_now();
  w->rc = be->comm_abort(w->comm, DCOMM_EPEERLOST);
  w->aborted = gpu_now();
  return NULL;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 5) {
    fprintf(stderr, "usage: gpu_shrink MODULE DIR RANK NRANKS\n");
    return 2;
  }
  dir = argv[2];
  me = atoi(argv[3]);
  gpu_set_rank(me);
  np = atoi(argv[4]);
  int victim = np - 1;
  void *mod = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!mod) {
    gpu_result(0, "dlopen %s: %s", argv[1], dlerror());
    gpu_finish();
  }
  be = dlsym(mod, "dcomm_backend_v1");
  gpu_result(be && be->size >= sizeof(*be) && be->abi_version == DCOMM_BACKEND_ABI_VERSION, "module table, ABI %d",
             be ? be->abi_version : -1);
  if (!be) gpu_finish();
  int (*shrink)(void *, const int *, int, const struct dcomm_comm_spec *, void **) = DCOMM_BACKEND_OP(be, comm_shrink);
  gpu_result(shrink != NULL, "the module offers comm_shrink");

  struct dcomm_host host = {.size = sizeof(host), .world_rank = me, .world_size = np, .local_rank = me,
                            .local_size = np, .job_id = "gpu-shrink", .auth_token = "", .listen_ip = "127.0.0.1",
                            .store = (void *)dir, .now = gpu_now, .log_enabled = h_log_enabled, .log = h_log,
                            .err = h_err, .param = h_param, .store_set = h_store_set, .store_get = h_store_get};
  void *ctx = NULL;
  int rc = be->init(&host, &ctx);
  gpu_result(rc == 0, "backend init on GPU %d: rc %s", me, rctext(rc));
  if (rc) gpu_finish();
  char desc[512] = "";
  be->describe(ctx, desc, sizeof(desc));
  if (me == 0) printf("[rank %d] %s\n", me, desc);
  int can_shrink = strstr(desc, "shrink yes") != NULL, can_revoke = strstr(desc, "revoke yes") != NULL;

  struct dcomm_comm_spec spec = {.comm_id = 1, .rank = me, .size = np, .deadline = gpu_now() + 60, .label = "world"};
  void *world = NULL;
  double t0 = gpu_now();
  rc = be->comm_create(ctx, &spec, &world);
  gpu_result(rc == 0, "world of %d: rc %s, %.3f s", np, rctext(rc), gpu_now() - t0);
  if (rc) gpu_finish();
  int *dbuf = NULL, got = 0;
  if (cudaMalloc((void **)&dbuf, sizeof(int)) != cudaSuccess) {
    gpu_result(0, "cudaMalloc");
    gpu_finish();
  }
  rc = all_reduce_int(world, dbuf, me + 1, 30, &got);
  gpu_result(rc == 0 && got == np * (np + 1) / 2, "all_reduce on the world: rc %s, got %d", rctext(rc), got);
  char key[32], pid[32];
  snprintf(key, sizeof(key), "ready.%d", me);
  int pl = snprintf(pid, sizeof(pid), "%d", (int)getpid());
  h_store_set(NULL, key, pid, (size_t)pl);

  if (me == victim) { /* run.sh kills this one */
    for (int i = 0; i < 1200; i++) usleep(100000);
    gpu_result(0, "the victim was never killed");
    gpu_finish();
  }

  /* Survivors: blocked in an all_reduce the victim never joins. */
  struct watch w = {.comm = world};
  pthread_t th;
  pthread_create(&th, NULL, watcher, &w);
  rc = all_reduce_int(world, dbuf, 1, 90, &got);
  double t_ret = gpu_now();
  pthread_join(th, NULL);
  gpu_result(rc == DCOMM_EPEERLOST || rc == DCOMM_EREVOKED,
             "the blocked all_reduce returns after comm_abort: rc %s, %.1f ms after the abort", rctext(rc),
             (t_ret - w.aborted) * 1e3);
  gpu_result(w.rc == 0, "comm_abort (%s): rc %s, %.1f ms", can_revoke ? "ncclCommRevoke" : "ncclCommAbort",
             rctext(w.rc), (w.aborted - w.seen) * 1e3);

  /* Shrink to the survivors. */
  int exclude[1] = {victim};
  struct dcomm_comm_spec sspec = {.comm_id = 2, .rank = me, .size = np - 1, .deadline = gpu_now() + 30,
                                  .label = "world-shrunk"};
  void *small = NULL;
  t0 = gpu_now();
  rc = shrink ? shrink(world, exclude, 1, &sspec, &small) : DCOMM_ENOTSUP;
  double t_shrink = gpu_now() - t0;
  if (can_shrink && can_revoke) {
    gpu_result(rc == 0, "comm_shrink without rank %d: rc %s, %.1f ms", victim, rctext(rc), t_shrink * 1e3);
  } else {
    gpu_result(rc == DCOMM_ENOTSUP, "comm_shrink says it cannot (%s): rc %s", desc, rctext(rc));
    printf("[rank %d] skip: shrink needs NCCL >= 2.28.7 here (revoke keeps the handle for it)\n", me);
  }
  if (rc == 0) {
    rc = all_reduce_int(small, dbuf, me + 1, 30, &got);
    gpu_result(rc == 0 && got == (np - 1) * np / 2, "all_reduce on the shrunk world: rc %s, got %d want %d", rctext(rc),
               got, (np - 1) * np / 2);
  }

  /* The fall-back, for comparison: release the old one, new unique id. */
  t0 = gpu_now();
  rc = be->comm_destroy(world);
  double t_destroy = gpu_now() - t0;
  gpu_result(rc == 0 || rc == DCOMM_EREVOKED || rc == DCOMM_EPEERLOST,
             "release the failed world (abort): rc %s, %.1f ms", rctext(rc), t_destroy * 1e3);
  struct dcomm_comm_spec rspec = {.comm_id = 3, .rank = me, .size = np - 1, .deadline = gpu_now() + 60,
                                  .label = "world-reinit"};
  void *re = NULL;
  t0 = gpu_now();
  rc = be->comm_create(ctx, &rspec, &re);
  double t_reinit = gpu_now() - t0;
  gpu_result(rc == 0, "re-init of %d ranks from a fresh unique id: rc %s, %.1f ms", np - 1, rctext(rc), t_reinit * 1e3);
  if (rc == 0) {
    rc = all_reduce_int(re, dbuf, me + 1, 30, &got);
    gpu_result(rc == 0 && got == (np - 1) * np / 2, "all_reduce on the re-initialized world: rc %s, got %d", rctext(rc),
               got);
    rc = be->comm_destroy(re);
    gpu_result(rc == 0, "destroy the re-initialized world: rc %s", rctext(rc));
  }
  if (small) {
    rc = be->comm_destroy(small);
    gpu_result(rc == 0, "destroy the shrunk world (finalize): rc %s", rctext(rc));
  }
  if (me == 0)
    gpu_figure("kill-one-rank of %d: revoke+unblock %.1f ms, shrink %s%.1f ms, versus abort %.1f ms + re-init %.1f ms",
               np, (t_ret - w.seen) * 1e3, small ? "" : "(not used) ", t_shrink * 1e3, t_destroy * 1e3,
               t_reinit * 1e3);
  cudaFree(dbuf);
  be->finalize(ctx);
  gpu_finish();
  return 0;
}
