/*
 * run.h: what the parts of dcomm-run (the launcher/agent, launcher/dcomm_run.c)
 * share: the parsed command line (run_args.c), and the worker processes with
 * their prefixed output streams (run_proc.c). Internal to the program.
 */
#ifndef DCOMM_RUN_H
#define DCOMM_RUN_H

#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

enum run_policy { RUN_SHRINK, RUN_REPLACE, RUN_ALL };

enum run_bind { RUN_BIND_AUTO = 0, RUN_BIND_CORE, RUN_BIND_NONE };

#define RUN_MAX_NPROC 4096 /* --nproc-per-node and --min-nproc at most */

struct run_opts {
  int nproc;             /* --nproc-per-node */
  enum run_bind bind;    /* --bind-to */
  enum run_policy policy; /* --restart-policy */
  int max_restarts;      /* --max-restarts */
  int min_nproc;         /* --min-nproc */
  int quiet_prefix;      /* --quiet-prefix */
  char host[256];        /* --rdzv-endpoint host (brackets of IPv6 removed) */
  int port;              /* --rdzv-endpoint port; 0: any free port */
  int explicit_id;       /* --rdzv-id was given */
  char job_id[256];      /* --rdzv-id, else "dcomm-" + 8 hex */
  int etcd;              /* --rdzv-backend etcd */
  char endpoints[1024];  /* etcd: --rdzv-endpoint H1:P1,H2:P2 */
  int min_nodes, max_nodes; /* --nnodes MIN:MAX (etcd; static: 1:1) */
  char **argv;           /* the program and its arguments (into main's argv) */
};

/* run_args.c: parses the command line. Returns 0 when the job should run;
 * otherwise the caller exits with *exit_code (0 after --help, 2 after a
 * usage error, which has been explained on stderr). */
int run_parse_args(int argc, char **argv, struct run_opts *o, int *exit_code);
const char *run_policy_name(enum run_policy p);

/* ---- run_proc.c ---- */

/* One output pipe of a worker; complete lines are printed as "[rank]: line". */
struct run_stream {
  int fd;     /* read end; -1 once closed */
  int out_fd; /* where lines go: 1 or 2 */
  char *buf;  /* the pending partial line */
  size_t len, cap;
};

struct run_worker {
  int local_rank;
  int rank; /* launch rank: 0..N-1, replacements N, N+1, ... */
  pid_t pid;
  char member[40]; /* DCOMM_MEMBER_ID (uuid) */
  int running;     /* not reaped yet */
  int done;        /* exited 0 */
  int dead;        /* exited otherwise */
  int agent_stop;  /* the agent stopped it while tearing the job down */
  int hung;        /* the agent killed it for a lost heartbeat */
  /* While its heartbeat is late: the run-queue wait measured when it went
   * late (monotonic time; ns, its own and the agent's, whose store carries
   * the heartbeats) and whether the last look found it starved
   * (1), not (0) or has not judged yet (-1). */
  double late_t;
  unsigned long long late_wait, late_own_wait;
  int starved, starved_logged;
  int status;      /* wait status once reaped */
  double spawn_t, exit_t; /* monotonic */
  struct run_stream s[2]; /* stdout, stderr */
};

/* What every worker's environment is made of. */
struct run_env {
  const char *etcd; /* etcd endpoints (workers use etcd://); NULL: the agent's store */
  int slot;         /* DCOMM_AGENT_SLOT */
  const char *addr; /* MASTER_ADDR */
  int port;         /* the store's port: DCOMM_AGENT_STORE */
  int app_port;     /* MASTER_PORT, free for the program's own store */
  const char *token;
  const char *job_id;
  int world;         /* WORLD_SIZE = LOCAL_WORLD_SIZE */
  int local_rank;    /* LOCAL_RANK: a replacement takes its predecessor's slot */
  int restart_count; /* DCOMM_RESTART_COUNT */
  int max_restarts;
  int cpu;           /* the processor to bind the worker to, or -1 */
};

/* run_proc.c: whether each of nproc workers gets OMP_NUM_THREADS=1 (as
 * torchrun: several workers, the variable unset here). */
int run_omp_one(int nproc);

/* run_bind.c: the processor for the worker of local_rank, or -1 (unbound). */
int run_bind_cpu(enum run_bind mode, int nproc, int local_rank);

/* Starts one worker (fork + exec of argv[0], searched in PATH) with its
 * output piped back; join 1 adds DCOMM_ELASTIC_JOIN=1. child_mask is the
 * signal mask the program gets. 0, or -1 when fork or pipe failed (logged). */
/* run_exec.c: starts argv[0] (searched in PATH as execvp does) in a child
 * that shares the agent's memory until exec: envp its environment, mask
 * its signal mask, cpus its processors (NULL: unbound), out_fd / err_fd its
 * stdout and stderr; the child dies with the agent (PR_SET_PDEATHSIG) and
 * writes errmsg and the reason to err_fd when exec fails (exit 127).
 * Returns the pid, or -1 with errno. */
struct run_exec {
  char **argv, **envp;
  const sigset_t *mask;
  const cpu_set_t *cpus;
  int out_fd, err_fd;
  const char *errmsg;
  size_t errlen;
};
pid_t run_exec_start(const struct run_exec *x);
int run_spawn(struct run_worker *w, int rank, int join, const struct run_env *e, char **argv,
              const sigset_t *child_mask);
/* Reads what is available; prints complete lines; closes the stream at EOF. */
void run_stream_pump(struct run_stream *s, int rank, int quiet);
/* Prints a pending partial line and closes the stream. */
void run_stream_close(struct run_stream *s, int rank, int quiet);
/* "exited with status 3" / "killed by signal 9 (Killed)". */
void run_describe_status(int status, char *buf, size_t n);
/* How the kernel schedules pid: the run-queue wait of all its threads
 * together (ns, /proc/PID/task/N/schedstat) and whether every thread is
 * stopped (SIGSTOP, a debugger). -1 when /proc says nothing of it. A worker
 * whose heartbeat is late while it waits for a processor is starved (an
 * overloaded host), not hung. */
int run_proc_sched(pid_t pid, unsigned long long *wait_ns, int *stopped);
/* One line "dcomm-run: ..." on stderr, written at once. */
void run_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- run_rdzv.c: the etcd rendezvous ---- */

struct dcomm_store;
struct run_rdzv;
/* Connects to etcd, clears a finished earlier job with the same id, agrees
 * on the job token and --nnodes, takes a node slot and registers it under
 * a lease; starts the keepalive and watch threads. *st: a store on the
 * job's etcd namespace for the caller's thread. -1 on error (explained by
 * dcomm_last_error). */
int run_rdzv_open(const struct run_opts *o, struct run_rdzv **out, struct dcomm_store **st, char token[33],
                  int *slot);
/* Writes this node's record (keys.h: live workers, nproc, host, pid, the
 * " pids=..." list of its live workers). */
int run_rdzv_update(struct run_rdzv *r, int live, const char *pids);
/* 1 when this node is out of the job (its lease is gone); why (may be
 * NULL) says so. */
int run_rdzv_lost(struct run_rdzv *r, char *why, size_t n);
/* 1 while etcd answers the lease renewals: only then can a missing worker
 * heartbeat be told from a missing etcd. */
int run_rdzv_healthy(struct run_rdzv *r);
/* Seconds after its last answered renewal at which an agent fences itself
 * (kills its workers, leaves the job): the TTL less max(TTL/6, 0.5 s). */
double run_rdzv_fence_after(double ttl);
/* Fences now if that time has passed; 1 when this node is out of the job.
 * Called by the keepalive thread and every tick of the main loop. */
int run_rdzv_check_fence(struct run_rdzv *r);
/* Puts key (under the job's namespace) = val, NUL included, under this
 * node's lease. */
int run_rdzv_put(struct run_rdzv *r, const char *key, const char *val);
/* Reads key (under the job's namespace) into buf, NUL-terminated, within
 * a third of the TTL (the main loop must not wait out an etcd outage):
 * 1 found, 0 absent, < 0 error. */
int run_rdzv_peek(struct run_rdzv *r, const char *key, char *buf, size_t n);
/* 0 when etcd takes a write (rdzv/probe/<slot> under this node's lease)
 * within a third of the TTL. A renewed lease is not enough to judge the
 * workers' heartbeats: a leader can renew leases while its proposals do
 * not commit (members catching up after a lost quorum, a stalled disk),
 * and then no heartbeat can be written. */
int run_rdzv_write_probe(struct run_rdzv *r);
/* An orderly stop: marks the node as left (rdzv/left/<slot> = why) and
 * revokes the current generation with that reason, before the workers go. */
void run_rdzv_leave(struct run_rdzv *r, const char *why);
enum run_leave { RUN_LEAVE_FAILED, RUN_LEAVE_FINISHED, RUN_LEAVE_STOPPED };
/* Stops the threads; finished or stopped: marks the node as left (not
 * failed); revokes the lease; finished, and no other node left: removes
 * the job's keys from etcd. NULL is fine. */
void run_rdzv_close(struct run_rdzv *r, enum run_leave how);

/* ---- run_status.c: "dcomm-run status" and "dcomm-run clean" ---- */
int run_status_main(int argc, char **argv);
int run_clean_main(int argc, char **argv);

#endif
