/*
 * harness.c: the multi-process runner behind every multi-rank suite.
 */
#include "config.h"
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double mp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int mp_free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(s, (struct sockaddr *)&a, &l) < 0) {
    if (s >= 0) close(s);
    return -1;
  }
  close(s);
  return ntohs(a.sin_port);
}

/* Before the harness kills a rank that ran past its time: every thread's
 * stack, by gdb when the machine has it (bounded to 30 s), so that a hang
 * seen once in CI names where each rank waited. */
static void print_stacks(int rank, pid_t pid) {
  if (system("command -v gdb >/dev/null 2>&1") != 0) return;
  char cmd[512];
  snprintf(cmd, sizeof(cmd),
           "timeout 30 gdb -p %d -batch -nx -ex 'thread apply all bt 24' 2>/dev/null | "
           "grep -E '^(Thread|#)' | sed 's/^/[rank %d stack] /' >&2",
           (int)pid, rank);
  fflush(stderr);
  if (system(cmd) != 0) fprintf(stderr, "[rank %d stack] gdb could not read it\n", rank);
}

int mp_run_ex(int size, mp_body body, void *arg, double timeout_s, int no_init, struct mp_result *res) {
  pid_t pids[64];
  char url[256];
  memset(res, 0, sizeof(*res));
  if (size < 1 || size > 64) return -1;
  int port = mp_free_port();
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < size; r++) {
    pid_t p = fork();
    if (p == 0) {
      alarm((unsigned)timeout_s + 5); /* a last guard if the parent dies */
      snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=%d&world_size=%d", port, r, size);
      setenv("DCOMM_TEST_URL", url, 1);
      if (!no_init) {
        int rc = dcomm_init("tcp", url);
        if (rc != 0) {
          fprintf(stderr, "[rank %d] dcomm_init: %s: %s\n", r, dcomm_error_name(rc), dcomm_last_error());
          _exit(3);
        }
      }
      int rc = body(r, size, arg);
      if (!no_init && dcomm_initialized()) dcomm_finalize();
      fflush(stdout);
      fflush(stderr);
      _exit(rc == 0 ? 0 : 1);
    }
    pids[r] = p;
  }
  double deadline = mp_now() + timeout_s;
  int left = size;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < size; r++)
        if (pids[r] == p) {
          res->exit_code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          pids[r] = 0;
          left--;
        }
      continue;
    }
    if (mp_now() > deadline) {
      /* The stacks of all first (up to 8 ranks), while each still waits
       * where it hung: a kill would move the others on. */
      for (int r = 0, shown = 0; r < size && shown < 8; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "harness: rank %d still running after %.0f s: its threads' stacks\n", r, timeout_s);
          print_stacks(r, pids[r]);
          shown++;
        }
      for (int r = 0; r < size; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "harness: rank %d still running after %.0f s: killed\n", r, timeout_s);
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          res->exit_code[r] = 128 + SIGKILL;
          res->timed_out++;
          pids[r] = 0;
          left--;
        }
      break;
    }
    usleep(2000);
  }
  for (int r = 0; r < size; r++)
    if (res->exit_code[r] != 0) res->failed++;
  return res->failed;
}

int mp_run(int size, mp_body body, void *arg, double timeout_s) {
  struct mp_result res;
  return mp_run_ex(size, body, arg, timeout_s, 0, &res);
}
