/*
 * leak_worker.c: the worker of tests/elastic_leak.sh. An elastic training
 * loop (dcomm_elastic_run: an all_reduce and a sub-group all_reduce per
 * step, a checkpoint every 20 steps) that prints, at start and after every
 * change of membership, what its own process holds:
 *   res pid=P rank=R gen=G world=N fds=F threads=T maps=M heap=H
 * (open descriptors, threads, memory mappings, bytes in use on the malloc
 * heap; heap is 0 under a sanitizer, whose allocator mallinfo2 does not
 * see). The script kills other workers again and again and compares a
 * survivor's lines: a per-generation leak grows them.
 * Usage: leak_worker STOP_FILE CKPT_DIR. Rank 0 ends the run for everyone
 * (the same step) once STOP_FILE exists.
 */
#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm.h"
#include "dcomm_elastic.h"

#define STOPPED (-9999) /* the step function's "the job is done" */

struct app {
  const char *stop_file;
  dcomm_group_t half;
  int has_half;
  double state;
};

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  int n = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the descriptor opendir holds */
}

static int count_lines(const char *path, const char *prefix) {
  FILE *f = fopen(path, "r");
  char line[512];
  int n = 0;
  if (!f) return -1;
  while (fgets(line, sizeof(line), f)) {
    if (!prefix) n++;
    else if (!strncmp(line, prefix, strlen(prefix))) n = atoi(line + strlen(prefix));
  }
  fclose(f);
  return n;
}

static void report(void) {
  struct mallinfo2 mi = mallinfo2();
  printf("res pid=%d rank=%d gen=%ld world=%d fds=%d threads=%d maps=%d heap=%zu\n", (int)getpid(), dcomm_rank(),
         dcomm_generation(), dcomm_world_size(), count_dir("/proc/self/fd"),
         count_lines("/proc/self/status", "Threads:"), count_lines("/proc/self/maps", NULL), mi.uordblks);
  fflush(stdout);
}

static int step_fn(uint64_t step, void *user) {
  struct app *a = user;
  double v[2] = {1.0, 0.0};
  if (dcomm_rank() == 0 && access(a->stop_file, F_OK) == 0) v[1] = 1.0;
  int rc = dcomm_all_reduce(v, 2, DCOMM_FLOAT64, DCOMM_SUM, NULL);
  if (rc < 0) return rc;
  if (a->has_half) {
    double h = 1.0;
    if ((rc = dcomm_all_reduce(&h, 1, DCOMM_FLOAT64, DCOMM_SUM, a->half)) < 0) return rc;
  }
  a->state += v[0];
  (void)step;
  usleep(5000);
  return v[1] > 0 ? STOPPED : 0;
}

static int save_fn(void **data, size_t *len, void *user) {
  struct app *a = user;
  if (!(*data = malloc(sizeof(a->state)))) return DCOMM_ENOMEM;
  memcpy(*data, &a->state, sizeof(a->state));
  *len = sizeof(a->state);
  return 0;
}

static int load_fn(const void *data, size_t len, uint64_t step, void *user) {
  struct app *a = user;
  (void)step;
  a->state = 0;
  if (data && len == sizeof(a->state)) memcpy(&a->state, data, len);
  return 0;
}

static void changed(const struct dcomm_membership_change *c, void *user) {
  (void)c;
  (void)user;
  report();
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: leak_worker STOP_FILE CKPT_DIR\n");
    return 2;
  }
  struct app a = {.stop_file = argv[1]};
  if (dcomm_init(NULL, NULL) < 0) {
    fprintf(stderr, "leak_worker: dcomm_init: %s\n", dcomm_last_error());
    return 1;
  }
  if (!dcomm_elastic_is_joiner()) {
    if (dcomm_group_split(NULL, dcomm_rank() % 2, 0, &a.half) < 0) {
      fprintf(stderr, "leak_worker: split: %s\n", dcomm_last_error());
      return 1;
    }
    a.has_half = 1;
  }
  report();
  dcomm_elastic_config_t cfg = DCOMM_ELASTIC_CONFIG_INIT;
  cfg.total_steps = UINT64_MAX / 2;
  cfg.checkpoint_every = 20;
  cfg.checkpoint_dir = argv[2];
  cfg.step = step_fn;
  cfg.save = save_fn;
  cfg.load = load_fn;
  cfg.on_membership_change = changed;
  cfg.user = &a;
  int rc = dcomm_elastic_run(&cfg);
  if (rc < 0 && rc != STOPPED) {
    fprintf(stderr, "leak_worker: rank %d: %s: %s\n", dcomm_rank(), dcomm_error_name(rc), dcomm_last_error());
    return 1;
  }
  if (a.has_half) dcomm_group_free(a.half);
  dcomm_finalize();
  return 0;
}
