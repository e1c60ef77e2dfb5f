/*
 * run_proc.c: dcomm-run's worker processes and their output.
 *
 * run_spawn builds the worker's environment (the agent's own, minus the
 * variables it sets, plus torchrun's and dcomm's), creates its stdout and
 * stderr pipes and starts the program (run_exec.c: without copying the
 * agent's memory; everything the child needs is built before).
 *
 * The agent reads the pipes and prints each complete line as "[rank]: line"
 * with one write(), so that lines of different workers and of the agent
 * itself never interleave mid-line. A line longer than RUN_MAX_LINE is cut
 * into pieces of that size.
 */
#include "config.h"
#include "run.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <uuid/uuid.h>

#include "sock.h"

#define RUN_MAX_LINE 65536

extern char **environ;

/* ---- output ---- */

/* Writes all of buf to fd; a closed or broken output is given up on. */
static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n > 0) {
      buf += n;
      len -= (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) { /* a non-blocking stdout we inherited */
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      if (poll(&p, 1, 1000) <= 0) return;
    } else {
      return;
    }
  }
}

void run_log(const char *fmt, ...) {
  char line[2048];
  int n = snprintf(line, sizeof(line), "dcomm-run: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  line[len++] = '\n';
  write_all(2, line, len);
}

static void emit_line(const struct run_stream *s, int rank, int quiet, const char *data, size_t len) {
  char stackbuf[4096];
  char pre[24];
  int plen = quiet ? 0 : snprintf(pre, sizeof(pre), "[%d]: ", rank);
  size_t total = (size_t)plen + len + 1;
  char *out = total <= sizeof(stackbuf) ? stackbuf : malloc(total);
  if (!out) { /* out of memory: still print, in pieces */
    if (plen) write_all(s->out_fd, pre, (size_t)plen);
    write_all(s->out_fd, data, len);
    write_all(s->out_fd, "\n", 1);
    return;
  }
  memcpy(out, pre, (size_t)plen);
  memcpy(out + plen, data, len);
  out[total - 1] = '\n';
  write_all(s->out_fd, out, total);
  if (out != stackbuf) free(out);
}

/* Prints every complete line in the buffer (and over-long pieces). */
static void emit_lines(struct run_stream *s, int rank, int quiet) {
  size_t start = 0;
  for (;;) {
    char *nl = memchr(s->buf + start, '\n', s->len - start);
    if (nl) {
      emit_line(s, rank, quiet, s->buf + start, (size_t)(nl - (s->buf + start)));
      start = (size_t)(nl - s->buf) + 1;
    } else if (s->len - start >= RUN_MAX_LINE) {
      emit_line(s, rank, quiet, s->buf + start, RUN_MAX_LINE);
      start += RUN_MAX_LINE;
    } else {
      break;
    }
  }
  if (start) {
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
  }
}

void run_stream_close(struct run_stream *s, int rank, int quiet) {
  if (s->fd < 0) return;
  if (s->len) emit_line(s, rank, quiet, s->buf, s->len);
  s->len = 0;
  close(s->fd);
  s->fd = -1;
  free(s->buf);
  s->buf = NULL;
  s->cap = 0;
}

void run_stream_pump(struct run_stream *s, int rank, int quiet) {
  /* Bounded, so that one chatty worker cannot starve the event loop. */
  for (int rounds = 0; s->fd >= 0 && rounds < 16; rounds++) {
    if (s->cap - s->len < 16384) {
      size_t ncap = s->cap ? s->cap * 2 : 32768;
      char *nb = realloc(s->buf, ncap);
      if (!nb) { /* print what is buffered to make room */
        if (s->len) emit_line(s, rank, quiet, s->buf, s->len);
        s->len = 0;
        if (s->cap - s->len < 1) return;
      } else {
        s->buf = nb;
        s->cap = ncap;
      }
    }
    ssize_t n = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (n > 0) {
      s->len += (size_t)n;
      emit_lines(s, rank, quiet);
    } else if (n == 0) {
      run_stream_close(s, rank, quiet);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN) {
      return;
    } else {
      run_stream_close(s, rank, quiet);
    }
  }
}

void run_describe_status(int status, char *buf, size_t n) {
  if (WIFEXITED(status)) {
    snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    const char *d = sigdescr_np(WTERMSIG(status));
    snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(status), d ? d : "?");
  } else {
    snprintf(buf, n, "wait status 0x%x", (unsigned)status);
  }
}

/* ---- scheduling: frozen or starved ---- */

int run_proc_sched(pid_t pid, unsigned long long *wait_ns, int *stopped) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return -1;
  unsigned long long sum = 0;
  int threads = 0, halted = 0, read_any = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    long tid = strtol(e->d_name, NULL, 10);
    char f[96], buf[512];
    threads++;
    snprintf(f, sizeof(f), "/proc/%d/task/%ld/schedstat", (int)pid, tid);
    FILE *fp = fopen(f, "r");
    if (fp) {
      unsigned long long run, wait;
      if (fscanf(fp, "%llu %llu", &run, &wait) == 2) {
        sum += wait;
        read_any = 1;
      }
      fclose(fp);
    }
    /* The state is the field after the command name's closing ')'. */
    snprintf(f, sizeof(f), "/proc/%d/task/%ld/stat", (int)pid, tid);
    fp = fopen(f, "r");
    if (fp) {
      size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
      buf[n] = 0;
      const char *rp = strrchr(buf, ')');
      if (rp && (rp[1] == ' ') && (rp[2] == 'T' || rp[2] == 't')) halted++;
      fclose(fp);
    }
  }
  closedir(d);
  if (!read_any) return -1;
  *wait_ns = sum;
  *stopped = threads > 0 && halted == threads;
  return 0;
}

/* ---- the environment ---- */

struct envbuf {
  char **v;
  size_t n, cap;
  int failed;
};

static void env_push(struct envbuf *e, char *s) {
  if (!s) {
    e->failed = 1;
    return;
  }
  if (e->n + 2 > e->cap) {
    size_t ncap = e->cap ? e->cap * 2 : 64;
    char **nv = realloc(e->v, ncap * sizeof(*nv));
    if (!nv) {
      free(s);
      e->failed = 1;
      return;
    }
    e->v = nv;
    e->cap = ncap;
  }
  e->v[e->n++] = s;
  e->v[e->n] = NULL;
}

static void env_setf(struct envbuf *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void env_setf(struct envbuf *e, const char *fmt, ...) {
  char *s = NULL;
  va_list ap;
  va_start(ap, fmt);
  int rc = vasprintf(&s, fmt, ap);
  va_end(ap);
  env_push(e, rc < 0 ? NULL : s);
}

static void env_free(struct envbuf *e) {
  for (size_t i = 0; i < e->n; i++) free(e->v[i]);
  free(e->v);
}

/* Variables the agent sets: any inherited value is dropped. */
static const char *const owned[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DCOMM_USE_AGENT_STORE", "DCOMM_AGENT_STORE", "DCOMM_AUTH_TOKEN",
    "DCOMM_JOB_ID",
    "DCOMM_ELASTIC", "DCOMM_ELASTIC_JOIN", "DCOMM_MEMBER_ID", "DCOMM_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "DCOMM_INIT_METHOD", "DCOMM_AGENT_SLOT", "DCOMM_LINE_BUFFERED", NULL};

static int is_owned(const char *kv) {
  for (int i = 0; owned[i]; i++) {
    size_t l = strlen(owned[i]);
    if (!strncmp(kv, owned[i], l) && kv[l] == '=') return 1;
  }
  return 0;
}

/* Several workers on a node each get one OpenMP thread unless the user
 * said otherwise: each would start one per processor. */
int run_omp_one(int nproc) { return nproc > 1 && !getenv("OMP_NUM_THREADS"); }

static int build_env(struct envbuf *e, int rank, int join, const char *member, const struct run_env *re) {
  memset(e, 0, sizeof(*e));
  for (char **p = environ; p && *p; p++)
    if (!is_owned(*p)) env_push(e, strdup(*p));
  if (run_omp_one(re->world)) env_setf(e, "OMP_NUM_THREADS=1");
  if (re->etcd) {
    /* Ranks are assigned when the nodes meet: the workers join through
     * etcd, and read dcomm_rank() / dcomm_world_size() once initialized. */
    env_setf(e, "DCOMM_INIT_METHOD=etcd://%s", re->etcd);
    env_setf(e, "LOCAL_RANK=%d", re->local_rank);
    env_setf(e, "LOCAL_WORLD_SIZE=%d", re->world);
  } else {
    env_setf(e, "RANK=%d", rank);
    env_setf(e, "LOCAL_RANK=%d", re->local_rank);
    env_setf(e, "WORLD_SIZE=%d", re->world);
    env_setf(e, "LOCAL_WORLD_SIZE=%d", re->world);
    env_setf(e, "GROUP_RANK=0");
    env_setf(e, "GROUP_WORLD_SIZE=1");
    env_setf(e, "ROLE_RANK=%d", rank);
    env_setf(e, "ROLE_WORLD_SIZE=%d", re->world);
    env_setf(e, "MASTER_ADDR=%s", re->addr);
    env_setf(e, "MASTER_PORT=%d", re->app_port);
    env_setf(e, "DCOMM_USE_AGENT_STORE=1");
    if (strchr(re->addr, ':')) env_setf(e, "DCOMM_AGENT_STORE=[%s]:%d", re->addr, re->port);
    else env_setf(e, "DCOMM_AGENT_STORE=%s:%d", re->addr, re->port);
  }
  env_setf(e, "DCOMM_AGENT_SLOT=%d", re->slot);
  env_setf(e, "DCOMM_AUTH_TOKEN=%s", re->token);
  env_setf(e, "DCOMM_JOB_ID=%s", re->job_id);
  env_setf(e, "DCOMM_ELASTIC=1");
  if (join) env_setf(e, "DCOMM_ELASTIC_JOIN=1");
  env_setf(e, "DCOMM_MEMBER_ID=%s", member);
  env_setf(e, "DCOMM_RESTART_COUNT=%d", re->restart_count);
  env_setf(e, "TORCHELASTIC_RUN_ID=%s", re->job_id);
  env_setf(e, "TORCHELASTIC_RESTART_COUNT=%d", re->restart_count);
  env_setf(e, "TORCHELASTIC_MAX_RESTARTS=%d", re->max_restarts);
  env_setf(e, "DCOMM_LINE_BUFFERED=1");
  return e->failed ? -1 : 0;
}

/* ---- spawning ---- */

int run_spawn(struct run_worker *w, int rank, int join, const struct run_env *re, char **argv,
              const sigset_t *child_mask) {
  memset(w, 0, sizeof(*w));
  w->rank = rank;
  w->pid = -1;
  w->s[0].fd = w->s[1].fd = -1;
  w->s[0].out_fd = 1;
  w->s[1].out_fd = 2;
  uuid_t u;
  uuid_generate(u);
  uuid_unparse_lower(u, w->member);

  struct envbuf env;
  if (build_env(&env, rank, join, w->member, re) < 0) {
    env_free(&env);
    run_log("cannot start worker %d: out of memory", rank);
    return -1;
  }
  char errmsg[512];
  int el = snprintf(errmsg, sizeof(errmsg), "dcomm-run: cannot execute '%s': ", argv[0]);
  size_t errlen = el < 0 ? 0 : (size_t)el >= sizeof(errmsg) ? sizeof(errmsg) - 1 : (size_t)el;

  int po[2] = {-1, -1}, pe[2] = {-1, -1};
  if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0) {
    int e = errno;
    for (int i = 0; i < 2; i++) {
      if (po[i] >= 0) close(po[i]);
      if (pe[i] >= 0) close(pe[i]);
    }
    env_free(&env);
    run_log("cannot start worker %d: pipe: %s", rank, strerror(e));
    return -1;
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (re->cpu >= 0) CPU_SET(re->cpu, &cpus);
  struct run_exec x = {.argv = argv,
                       .envp = env.v,
                       .mask = child_mask,
                       .cpus = re->cpu >= 0 ? &cpus : NULL,
                       .out_fd = po[1],
                       .err_fd = pe[1],
                       .errmsg = errmsg,
                       .errlen = errlen};
  pid_t pid = run_exec_start(&x);
  int e = errno;
  close(po[1]);
  close(pe[1]);
  env_free(&env);
  if (pid < 0) {
    close(po[0]);
    close(pe[0]);
    run_log("cannot start worker %d: clone: %s", rank, strerror(e));
    return -1;
  }
  fcntl(po[0], F_SETFL, fcntl(po[0], F_GETFL) | O_NONBLOCK);
  fcntl(pe[0], F_SETFL, fcntl(pe[0], F_GETFL) | O_NONBLOCK);
  w->pid = pid;
  w->s[0].fd = po[0];
  w->s[1].fd = pe[0];
  w->running = 1;
  w->spawn_t = dcomm__now();
  return 0;
}
