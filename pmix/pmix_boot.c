/*
 * pmix_boot.c: the only code of dcomm that talks to PMIx (see
 * pmix_boot.h). Boot: PMIx_Init, job size / local size / local rank,
 * rank 0's store address published with Put + Commit + Fence and read by
 * the others with Get. Events: one handler for lost processes. Built
 * without PMIx, the calls are stubs returning DCOMM_ENOTSUP.
 *
 * PMIx 4.2 cannot be initialized again after PMIx_Finalize (job data is
 * gone: PMIx_Get answers NOT-FOUND), so PMIx stays initialized from the
 * first boot until the process exits (an atexit handler finalizes it), and
 * each boot publishes under its own key ("dcomm.store.N").
 */
#include "config.h"
#include "pmix_boot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

extern char **environ;

int dcomm__pmix_detect(void) {
  const char *ns = getenv("PMIX_NAMESPACE");
  if (ns && *ns) return 1;
  for (char **e = environ; e && *e; e++)
    if (!strncmp(*e, "PMIX_SERVER_URI", 15)) return 1;
  return 0;
}

#ifdef DCOMM_HAVE_PMIX

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <limits.h>
#include <math.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pmix_api.h"

#define STORE_KEY "dcomm.store"

static pmix_proc_t me;
static int pmix_up;   /* PMIx_Init done (until exit) */
static int booted;    /* a dcomm session uses it (boot .. finalize) */
static int boots;     /* sessions so far: the key suffix */
static size_t ev_id;
static int ev_registered;
static void (*volatile lost_cb)(int rank, void *arg);
static void *volatile lost_arg;

static int pmix_fail(int code, const char *call, pmix_status_t rc) {
  return dcomm__err(code, "pmix://: %s failed: %s (%d)", call, PMIx_Error_string(rc), (int)rc);
}

/* An integer attribute of proc, whatever integer type the launcher used. */
static int get_number(const pmix_proc_t *proc, const char *key, const char *what, long *out) {
  pmix_value_t *val = NULL;
  pmix_status_t rc = PMIx_Get(proc, key, NULL, 0, &val);
  if (rc != PMIX_SUCCESS || !val)
    return dcomm__err(DCOMM_EBACKEND, "pmix://: PMIx_Get(%s, the %s) failed: %s (%d)", key, what,
                      PMIx_Error_string(rc), (int)rc);
  long n = 0;
  pmix_status_t s;
  PMIX_VALUE_GET_NUMBER(s, val, n, long);
  pmix_data_type_t t = val->type;
  PMIX_VALUE_RELEASE(val);
  if (s != PMIX_SUCCESS)
    return dcomm__err(DCOMM_EBACKEND, "pmix://: %s (the %s) is a %s, not a number", key, what,
                      PMIx_Data_type_string(t));
  *out = n;
  return 0;
}

static int is_loopback4(const struct in_addr *a) { return (ntohl(a->s_addr) >> 24) == 127; }

/* An IPv4 address of this host that the other ranks can reach. */
static void pick_host(char *host, size_t len, int multi_host) {
  char name[256] = "";
  pmix_value_t *val = NULL;
  if (PMIx_Get(&me, PMIX_HOSTNAME, NULL, 0, &val) == PMIX_SUCCESS && val) {
    if (val->type == PMIX_STRING && val->data.string) snprintf(name, sizeof(name), "%s", val->data.string);
    PMIX_VALUE_RELEASE(val);
  }
  if (!name[0] && gethostname(name, sizeof(name) - 1) != 0) name[0] = 0;
  name[sizeof(name) - 1] = 0;

  char loop[INET_ADDRSTRLEN] = "";
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (name[0] && getaddrinfo(name, NULL, &hints, &res) == 0) {
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
      struct in_addr *a = &((struct sockaddr_in *)ai->ai_addr)->sin_addr;
      char ip[INET_ADDRSTRLEN];
      if (!inet_ntop(AF_INET, a, ip, sizeof(ip))) continue;
      if (!is_loopback4(a)) {
        snprintf(host, len, "%s", ip);
        freeaddrinfo(res);
        DCOMM_LOG(DEBUG, PMIX, "store host: %s (%s)", host, name);
        return;
      }
      if (!loop[0]) snprintf(loop, sizeof(loop), "%s", ip);
    }
    freeaddrinfo(res);
  }
  if (loop[0] && !multi_host) { /* everybody is on this host */
    snprintf(host, len, "%s", loop);
    DCOMM_LOG(DEBUG, PMIX, "store host: %s (%s, one host)", host, name);
    return;
  }
  /* The name resolves to loopback (Debian's 127.0.1.1) or not at all: the
   * first non-loopback interface that is up. */
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) == 0) {
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
          (i->ifa_flags & IFF_LOOPBACK))
        continue;
      struct in_addr *a = &((struct sockaddr_in *)i->ifa_addr)->sin_addr;
      if (is_loopback4(a) || !inet_ntop(AF_INET, a, host, (socklen_t)len)) continue;
      freeifaddrs(ifs);
      DCOMM_LOG(DEBUG, PMIX, "store host: %s (interface address; %s resolves to loopback)", host, name);
      return;
    }
    freeifaddrs(ifs);
  }
  snprintf(host, len, "%s", loop[0] ? loop : name[0] ? name : "127.0.0.1");
}

/* "host:port" -> b; 0 or DCOMM_EPROTO. */
static int parse_addr(const char *s, struct dcomm_pmix_boot *b) {
  const char *colon = strrchr(s, ':');
  char *end;
  if (!colon || colon == s || (size_t)(colon - s) >= sizeof(b->store_host)) goto bad;
  long port = strtol(colon + 1, &end, 10);
  if (end == colon + 1 || *end || port < 1 || port > 65535) goto bad;
  memcpy(b->store_host, s, (size_t)(colon - s));
  b->store_host[colon - s] = 0;
  b->store_port = (int)port;
  return 0;
bad:
  return dcomm__err(DCOMM_EPROTO, "pmix://: rank 0 published a malformed store address '%.300s'", s);
}

/* Rank 0's value: "host:port", or "!code:message" when it could not host. */
static int publish(const char *key, const char *value) {
  pmix_value_t v;
  PMIX_VALUE_CONSTRUCT(&v);
  v.type = PMIX_STRING;
  v.data.string = (char *)value; /* PMIx_Put copies */
  pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
  if (rc != PMIX_SUCCESS) return dcomm__err(DCOMM_EBACKEND, "pmix://: PMIx_Put(%s) failed: %s (%d)", key,
                                            PMIx_Error_string(rc), (int)rc);
  return 0;
}

static int exchange(struct dcomm_pmix_boot *b, double timeout, dcomm_pmix_host_store_fn host_store, void *arg) {
  pmix_status_t prc;
  int rc = 0, tmo = 0;
  if (timeout > 0) tmo = timeout >= INT_MAX ? INT_MAX : (int)ceil(timeout);
  char value[512], key[64];
  snprintf(key, sizeof(key), STORE_KEY ".%d", boots);
  if (b->rank == 0) {
    char host[256] = "";
    int port = 0;
    rc = host_store ? host_store(arg, host, sizeof(host), &port)
                    : dcomm__err(DCOMM_EINVAL, "pmix://: no store host callback");
    if (rc == 0 && (port < 1 || port > 65535)) rc = dcomm__err(DCOMM_EINVAL, "pmix://: store port %d is invalid", port);
    if (rc == 0) {
      if (!host[0]) pick_host(host, sizeof(host), b->local_size < b->size);
      snprintf(b->store_host, sizeof(b->store_host), "%s", host);
      b->store_port = port;
      snprintf(value, sizeof(value), "%s:%d", host, port);
    } else {
      snprintf(value, sizeof(value), "!%d:%s", rc, dcomm_last_error());
    }
    /* Published even on failure, so the others fail fast with the reason. */
    int prc2 = publish(key, value);
    if (rc == 0) rc = prc2;
  }
  if ((prc = PMIx_Commit()) != PMIX_SUCCESS) return rc < 0 ? rc : pmix_fail(DCOMM_EBACKEND, "PMIx_Commit", prc);

  pmix_info_t info[2];
  bool collect = true;
  PMIX_INFO_CONSTRUCT(&info[0]);
  PMIX_INFO_CONSTRUCT(&info[1]);
  PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &tmo, PMIX_INT);
  size_t ninfo = tmo > 0 ? 2 : 1;
  DCOMM_LOG(DEBUG, PMIX, "fence (timeout %d s)", tmo);
  prc = PMIx_Fence(NULL, 0, info, ninfo);
  if (prc != PMIX_SUCCESS && rc == 0) {
    if (prc == PMIX_ERR_TIMEOUT)
      rc = dcomm__err(DCOMM_ETIMEDOUT,
                      "pmix://: PMIx_Fence timed out after %d s: not every rank of the job reached dcomm_init", tmo);
    else
      rc = pmix_fail(DCOMM_EBACKEND, "PMIx_Fence", prc);
  }
  if (rc < 0 || b->rank == 0) {
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    return rc;
  }

  pmix_proc_t root;
  pmix_value_t *val = NULL;
  PMIX_PROC_LOAD(&root, me.nspace, 0);
  prc = PMIx_Get(&root, key, &info[1], tmo > 0 ? 1 : 0, &val);
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  if (prc != PMIX_SUCCESS || !val)
    return dcomm__err(DCOMM_EBACKEND, "pmix://: PMIx_Get(rank 0, %s) failed: %s (%d)", key, PMIx_Error_string(prc),
                      (int)prc);
  if (val->type != PMIX_STRING || !val->data.string) {
    PMIX_VALUE_RELEASE(val);
    return dcomm__err(DCOMM_EPROTO, "pmix://: rank 0's %s is not a string", key);
  }
  snprintf(value, sizeof(value), "%s", val->data.string);
  PMIX_VALUE_RELEASE(val);
  if (value[0] == '!') {
    char *end;
    long code = strtol(value + 1, &end, 10);
    if (code >= 0 || code < -100 || *end != ':') code = DCOMM_EBACKEND;
    return dcomm__err((int)code, "pmix://: rank 0 could not host the store: %s", *end == ':' ? end + 1 : value + 1);
  }
  return parse_addr(value, b);
}

static void pmix_at_exit(void) {
  if (!pmix_up) return;
  pmix_up = 0;
  PMIx_Finalize(NULL, 0);
}

int dcomm__pmix_boot(struct dcomm_pmix_boot *b, double timeout, dcomm_pmix_host_store_fn host_store, void *arg) {
  static int at_exit_set;
  memset(b, 0, sizeof(*b));
  if (booted) return dcomm__err(DCOMM_EINVAL, "pmix://: PMIx is already in use by dcomm (finalize first)");
  if (!pmix_up) {
    DCOMM_CHECK(dcomm__pmix_load());
    pmix_status_t prc = PMIx_Init(&me, NULL, 0);
    if (prc == PMIX_ERR_UNREACH) {
      PMIx_Finalize(NULL, 0); /* the singleton PMIx_Init set up */
      return dcomm__err(DCOMM_EINVAL,
                        "pmix://: no PMIx server (PMIx_Init: %s): start the job with a PMIx launcher (mpirun, srun "
                        "--mpi=pmix) or use another init method",
                        PMIx_Error_string(prc));
    }
    if (prc != PMIX_SUCCESS) return pmix_fail(DCOMM_EBACKEND, "PMIx_Init", prc);
    pmix_up = 1;
    if (!at_exit_set && atexit(pmix_at_exit) == 0) at_exit_set = 1;
  }
  booted = 1;
  boots++;

  pmix_proc_t wild;
  PMIX_PROC_LOAD(&wild, me.nspace, PMIX_RANK_WILDCARD);
  long size = 0, lsize = 0, lrank = 0;
  int rc;
  if ((rc = get_number(&wild, PMIX_JOB_SIZE, "job size", &size)) < 0 ||
      (rc = get_number(&wild, PMIX_LOCAL_SIZE, "processes on this host", &lsize)) < 0 ||
      (rc = get_number(&me, PMIX_LOCAL_RANK, "local rank", &lrank)) < 0)
    goto fail;
  if (size < 1 || size > 1 << 24 || me.rank >= (pmix_rank_t)size) {
    rc = dcomm__err(DCOMM_EBACKEND, "pmix://: rank %u is not in the job of %ld processes", (unsigned)me.rank, size);
    goto fail;
  }
  if (lsize < 1 || lsize > size || lrank < 0 || lrank >= lsize) {
    rc = dcomm__err(DCOMM_EBACKEND, "pmix://: local rank %ld of %ld processes on this host contradicts job size %ld",
                    lrank, lsize, size);
    goto fail;
  }
  b->rank = (int)me.rank;
  b->size = (int)size;
  b->local_rank = (int)lrank;
  b->local_size = (int)lsize;
  DCOMM_LOG(DEBUG, PMIX, "PMIx namespace %s: rank %d of %d, local %d of %d", me.nspace, b->rank, b->size,
            b->local_rank, b->local_size);
  if ((rc = exchange(b, timeout, host_store, arg)) < 0) goto fail;
  DCOMM_LOG(DEBUG, PMIX, "store at %s:%d", b->store_host, b->store_port);
  return 0;
fail: {
  char saved[1024];
  snprintf(saved, sizeof(saved), "%s", dcomm_last_error());
  dcomm__pmix_finalize();
  return dcomm__err(rc, "%s", saved);
}
}

void dcomm__pmix_finalize(void) {
  if (!booted) return;
  if (ev_registered) {
    PMIx_Deregister_event_handler(ev_id, NULL, NULL);
    ev_registered = 0;
  }
  lost_cb = NULL;
  lost_arg = NULL;
  booted = 0; /* PMIx itself is finalized at exit (see the top) */
}

/* Forwards one affected process (of this job) to the callback. */
static void report(const pmix_proc_t *p, void (*cb)(int, void *), void *arg, int *reported) {
  if (!p || !PMIX_CHECK_NSPACE(p->nspace, me.nspace)) return;
  int rank = p->rank >= PMIX_RANK_VALID ? -1 : (int)p->rank;
  cb(rank, arg);
  *reported = 1;
}

static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                     pmix_info_t *results, size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata) {
  void (*cb)(int, void *) = lost_cb;
  void *arg = lost_arg;
  int reported = 0, foreign = 0;
  /* A process that terminated with exit code 0 finished; it was not lost. */
  if (status == PMIX_PROC_TERMINATED)
    for (size_t i = 0; i < ninfo; i++)
      if (PMIX_CHECK_KEY(&info[i], PMIX_EXIT_CODE) && info[i].value.type == PMIX_INT &&
          info[i].value.data.integer == 0)
        cb = NULL;
  if (cb) {
    for (size_t i = 0; i < ninfo; i++) {
      if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC) && info[i].value.type == PMIX_PROC) {
        const pmix_proc_t *p = info[i].value.data.proc;
        if (p && !PMIX_CHECK_NSPACE(p->nspace, me.nspace)) foreign = 1;
        report(p, cb, arg, &reported);
      } else if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROCS) && info[i].value.type == PMIX_DATA_ARRAY &&
                 info[i].value.data.darray && info[i].value.data.darray->type == PMIX_PROC) {
        const pmix_proc_t *procs = info[i].value.data.darray->array;
        for (size_t k = 0; procs && k < info[i].value.data.darray->size; k++) {
          if (!PMIX_CHECK_NSPACE(procs[k].nspace, me.nspace)) foreign = 1;
          report(&procs[k], cb, arg, &reported);
        }
      }
    }
    /* A lost server, or an event naming nobody: somebody may be gone. */
    if (!reported && !foreign) cb(-1, arg);
  }
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

int dcomm__pmix_register_events(void (*on_lost)(int rank, void *arg), void *arg) {
  if (!booted) return dcomm__err(DCOMM_EINVAL, "pmix: register events before dcomm__pmix_boot");
  if (ev_registered) return dcomm__err(DCOMM_EINVAL, "pmix: event handler already registered");
  pmix_status_t codes[] = {PMIX_ERR_PROC_ABORTED, PMIX_PROC_TERMINATED, PMIX_ERR_LOST_CONNECTION};
  pmix_info_t info;
  PMIX_INFO_CONSTRUCT(&info);
  PMIX_INFO_LOAD(&info, PMIX_EVENT_HDLR_NAME, "dcomm-lost-proc", PMIX_STRING);
  lost_arg = arg;
  lost_cb = on_lost;
  /* No callback: blocking; the id (possibly 0) or a negative status. */
  pmix_status_t rc = PMIx_Register_event_handler(codes, sizeof(codes) / sizeof(codes[0]), &info, 1, on_event, NULL, NULL);
  PMIX_INFO_DESTRUCT(&info);
  if (rc < 0) {
    lost_cb = NULL;
    lost_arg = NULL;
    return pmix_fail(DCOMM_EBACKEND, "PMIx_Register_event_handler", rc);
  }
  ev_id = (size_t)rc;
  ev_registered = 1;
  DCOMM_LOG(DEBUG, PMIX, "event handler %zu registered", ev_id);
  return 0;
}

int dcomm__pmix_available(void) { return dcomm__pmix_load(); }

#else /* !DCOMM_HAVE_PMIX */

int dcomm__pmix_available(void) {
  return dcomm__err(DCOMM_ENOTSUP, "pmix: dcomm was built without PMIx");
}

int dcomm__pmix_boot(struct dcomm_pmix_boot *b, double timeout, dcomm_pmix_host_store_fn host_store, void *arg) {
  memset(b, 0, sizeof(*b));
  return dcomm__err(DCOMM_ENOTSUP, "pmix://: dcomm was built without PMIx (install libpmix-dev and reconfigure)");
}

void dcomm__pmix_finalize(void) {}

int dcomm__pmix_register_events(void (*on_lost)(int rank, void *arg), void *arg) {
  return dcomm__err(DCOMM_ENOTSUP, "pmix: dcomm was built without PMIx");
}

#endif
