/*
 * run_exec.c: starts a worker program without copying dcomm-run's memory.
 *
 * fork() copies the agent's page tables, and every page either side then
 * writes (the store server's threads keep writing) costs a copy and a TLB
 * flush on every processor; at 1024 workers on 2 cores that was a third of
 * the launcher's time, and posix_spawn-style creation took 1024 processes
 * from 3.3 s to 1.9 s. So the child is made with vfork: it shares the
 * agent's memory, the agent's thread waiting until it has exec'd or died,
 * so it writes nothing but its stack and makes raw system calls only (no
 * libc state, no malloc: the program's path candidates are built before).
 * The sanitizers know vfork (ThreadSanitizer turns it into fork; a raw
 * clone with CLONE_VM made it believe the agent itself had forked).
 * posix_spawn is not used because it cannot set the death signal
 * (PR_SET_PDEATHSIG) nor the processor binding, both set in the child
 * before exec.
 */
#include "config.h"
#include "run.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

struct child {
  const struct run_exec *x;
  char **paths; /* candidates for argv[0], in PATH order */
  pid_t agent;
};

/* The kernel's struct sigaction (x86-64, arm64 and others without
 * SA_RESTORER quirks need only these fields, with an 8-byte mask). */
struct ksigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)(void);
  unsigned long mask;
};

static size_t slen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

/* Child side: raw system calls only (see the top of the file). */
__attribute__((noreturn, noinline, no_sanitize("address", "thread", "undefined"))) static void child_main(
    const struct child *ch) {
  const struct run_exec *x = ch->x;
  struct ksigaction dfl = {SIG_DFL, 0, NULL, 0};
  syscall(SYS_rt_sigaction, SIGPIPE, &dfl, NULL, sizeof(dfl.mask)); /* the agent ignores it */
  if (x->cpus) syscall(SYS_sched_setaffinity, 0, sizeof(*x->cpus), x->cpus); /* unbound rather than not at all */
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, x->mask, NULL, sizeof(dfl.mask));
  if (syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) syscall(SYS_exit, 127);
  if (syscall(SYS_getppid) != ch->agent) syscall(SYS_exit, 127); /* the agent died before prctl took effect */
  if (syscall(SYS_dup3, x->out_fd, 1, 0) < 0 || syscall(SYS_dup3, x->err_fd, 2, 0) < 0) syscall(SYS_exit, 127);
  long err = ENOENT;
  int denied = 0;
  for (char **p = ch->paths; *p; p++) {
    syscall(SYS_execve, *p, x->argv, x->envp);
    err = errno;
    if (err == EACCES) denied = 1;
    if (err != ENOENT && err != ENOTDIR && err != EACCES) break; /* as execvp: only these try the next */
  }
  if (denied && (err == ENOENT || err == ENOTDIR)) err = EACCES;
  const char *why = err == ENOENT    ? "no such file or directory\n"
                    : err == EACCES  ? "permission denied\n"
                    : err == ENOEXEC ? "exec format error\n"
                    : err == ENOTDIR ? "not a directory\n"
                                     : "exec failed\n";
  syscall(SYS_write, 2, x->errmsg, x->errlen);
  syscall(SYS_write, 2, why, slen(why));
  for (;;) syscall(SYS_exit, 127);
}

/* argv[0] itself when it has a '/', else each PATH directory joined with
 * it (execvp's search; an empty PATH entry is the current directory). */
static char **candidates(const char *file) {
  if (strchr(file, '/')) {
    char **v = calloc(2, sizeof(*v));
    if (v && !(v[0] = strdup(file))) {
      free(v);
      return NULL;
    }
    return v;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/bin:/usr/bin";
  size_t n = 2;
  for (const char *c = path; *c; c++) n += *c == ':';
  char **v = calloc(n, sizeof(*v));
  if (!v) return NULL;
  size_t k = 0, fl = strlen(file);
  for (const char *d = path;; d++) {
    const char *e = strchr(d, ':');
    size_t dl = e ? (size_t)(e - d) : strlen(d);
    char *s = malloc(dl + fl + 3);
    if (!s) break;
    memcpy(s, dl ? d : ".", dl ? dl : 1);
    size_t at = dl ? dl : 1;
    s[at++] = '/';
    memcpy(s + at, file, fl + 1);
    v[k++] = s;
    if (!e) break;
    d = e;
  }
  return v;
}

static void free_list(char **v) {
  for (size_t i = 0; v && v[i]; i++) free(v[i]);
  free(v);
}

/* Alone in its frame, so that nothing the parent uses after vfork lives
 * in a register or slot the child's calls could have overwritten. */
__attribute__((noinline)) static pid_t start_child(const struct child *ch) {
  pid_t pid = vfork();
  if (pid == 0) child_main(ch);
  return pid;
}

pid_t run_exec_start(const struct run_exec *x) {
  struct child ch = {x, candidates(x->argv[0]), getpid()};
  pid_t pid = -1;
  int e = ENOMEM;
  if (ch.paths) {
    pid = start_child(&ch);
    e = errno;
  }
  free_list(ch.paths);
  errno = e;
  return pid;
}
