/*
 * check_etcd.c: tests of the etcd client (src/store/etcd_*.c) and the
 * etcd store (src/store/store_etcd.c) against REAL etcd servers that this
 * program starts itself. Every case of the store conformance suite
 * (store_conformance.c) runs on the etcd store here; the store tests of
 * this file are the etcd store's own (its key layout in etcd, calls not
 * serialized per handle). The servers: one plain member, a 3-member
 * cluster on loopback, one member with authentication (1 s tokens) and,
 * when openssl is there, one TLS member with client certificates. Each
 * runs with every ETCD_* variable unset, a fresh data dir under one mkdtemp
 * base and free loopback ports, and is stopped by its own pid (SIGTERM,
 * then SIGKILL after 5 s) at exit or on a signal; PR_SET_PDEATHSIG covers a
 * killed test program.
 * Malformed answers come from a small HTTP responder thread that answers
 * canned bytes. Without an etcd binary the program prints why and exits 77.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dcomm.h"
#include "etcd_client.h"
#include "log.h"
#include "store.h"
#include "store_conformance.h"

extern char **environ;

/* ---- helpers ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

#define OK(call)                                                                                        \
  do {                                                                                                  \
    int rc_ = (call);                                                                                   \
    ck_assert_msg(rc_ == 0, "%s -> %d (%s): %s", #call, rc_, dcomm_error_name(rc_), dcomm_last_error()); \
  } while (0)

#define EXPECT_RC(want, call)                                                                               \
  do {                                                                                                      \
    int rc_ = (call);                                                                                       \
    ck_assert_msg(rc_ == (want), "%s -> %d (%s), expected %s: %s", #call, rc_, dcomm_error_name(rc_), #want, \
                  dcomm_last_error());                                                                      \
  } while (0)

#define EXPECT_MSG(sub)                                                                                 \
  ck_assert_msg(strstr(dcomm_last_error(), (sub)) != NULL, "message '%s' does not mention '%s'",     \
                dcomm_last_error(), (sub))

/* A free loopback port: bind port 0, read it, close. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(fd, (struct sockaddr *)&a, &l) < 0) {
    perror("free_port");
    exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

/* Picks n distinct free ports (all sockets held until every one is read). */
static void free_ports(int *out, int n) {
  int fds[16];
  for (int i = 0; i < n; i++) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof(a)) < 0 ||
        getsockname(fds[i], (struct sockaddr *)&a, &l) < 0) {
      perror("free_ports");
      exit(1);
    }
    out[i] = ntohs(a.sin_port);
  }
  for (int i = 0; i < n; i++) close(fds[i]);
}

struct mem {
  char *p;
  size_t n;
};

static size_t mem_write(char *d, size_t s, size_t n, void *ud) {
  struct mem *m = ud;
  char *p = realloc(m->p, m->n + s * n + 1);
  if (!p) return 0;
  memcpy(p + m->n, d, s * n);
  m->p = p;
  m->n += s * n;
  p[m->n] = 0;
  return s * n;
}

/* A plain HTTP request for the test's own bookkeeping (health, status,
 * auth set-up, compaction); body NULL: GET. Returns the HTTP code or -1. */
static long http_req(const char *url, const char *body, const char *tls_dir, char **out) {
  CURL *h = curl_easy_init();
  struct mem m = {0};
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, mem_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &m);
  char ca[600], ck[600];
  if (tls_dir) {
    snprintf(ca, sizeof(ca), "%s/cert.pem", tls_dir);
    snprintf(ck, sizeof(ck), "%s/key.pem", tls_dir);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca);
    curl_easy_setopt(h, CURLOPT_SSLCERT, ca);
    curl_easy_setopt(h, CURLOPT_SSLKEY, ck);
  }
  if (body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  long code = -1;
  if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(h);
  if (out) *out = m.p;
  else free(m.p);
  return code;
}

/* ---- the etcd processes ---- */

struct etcd_proc {
  pid_t pid;
  char name[8];
  int cport, pport;
  int tls;
  char dir[512];
};

enum { P_SINGLE, P_A, P_B, P_C, P_AUTH, P_TLS, P_COUNT };
static struct etcd_proc g_p[P_COUNT];
static pid_t g_owner;
static char g_base[256];
static int g_have_tls;
static char g_ep_single[64], g_ep_auth[64], g_ep_tls[64];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

/* Async-signal-safe: kill, waitpid and nanosleep only. SIGTERM to the
 * processes in mask, up to 5 s for them to exit, then SIGKILL. */
static void stop_set(unsigned mask) {
  for (int i = 0; i < P_COUNT; i++)
    if ((mask >> i & 1) && g_p[i].pid > 0) kill(g_p[i].pid, SIGTERM);
  for (int t = 0; t < 500; t++) {
    int left = 0, st;
    for (int i = 0; i < P_COUNT; i++)
      if ((mask >> i & 1) && g_p[i].pid > 0) {
        if (waitpid(g_p[i].pid, &st, WNOHANG) != 0) g_p[i].pid = 0;
        else left++;
      }
    if (!left) return;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < P_COUNT; i++)
    if ((mask >> i & 1) && g_p[i].pid > 0) {
      int st;
      kill(g_p[i].pid, SIGKILL);
      waitpid(g_p[i].pid, &st, 0);
      g_p[i].pid = 0;
    }
}

/* Cluster members one after the other: a leader stopping together with its
 * followers waits out a failed leadership transfer. */
static void stop_procs(void) {
  stop_set(~0u & ~(1u << P_B) & ~(1u << P_C));
  stop_set(1u << P_B);
  stop_set(1u << P_C);
}

static void stop_all(void) {
  if (getpid() != g_owner) return; /* a forked test or client */
  stop_procs();
  if (g_base[0]) nftw(g_base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  g_base[0] = 0;
}

static void on_signal(int sig) {
  if (getpid() == g_owner) {
    stop_procs();
    pid_t rm = fork(); /* nftw is not async-signal-safe; fork and exec are */
    if (rm == 0) {
      execl("/bin/rm", "rm", "-rf", g_base, (char *)NULL);
      _exit(127);
    }
    if (rm > 0) waitpid(rm, NULL, 0);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void start_etcd(struct etcd_proc *p, const char *cluster, const char *extra1, const char *extra2) {
  char curl_[128], purl[128], logp[600], data[600];
  snprintf(curl_, sizeof(curl_), "%s://127.0.0.1:%d", p->tls ? "https" : "http", p->cport);
  snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", p->pport);
  snprintf(p->dir, sizeof(p->dir), "%s/%s", g_base, p->name);
  snprintf(data, sizeof(data), "%s/data", p->dir);
  snprintf(logp, sizeof(logp), "%s/etcd.log", p->dir);
  mkdir(p->dir, 0700);
  char cert[600], key[600];
  snprintf(cert, sizeof(cert), "%s/tls/cert.pem", g_base);
  snprintf(key, sizeof(key), "%s/tls/key.pem", g_base);
  char token[64];
  snprintf(token, sizeof(token), "check-etcd-%d", (int)getpid());
  const char *argv[48];
  int n = 0;
  argv[n++] = "etcd";
  argv[n++] = "--name", argv[n++] = p->name;
  argv[n++] = "--data-dir", argv[n++] = data;
  argv[n++] = "--listen-client-urls", argv[n++] = curl_;
  argv[n++] = "--advertise-client-urls", argv[n++] = curl_;
  argv[n++] = "--listen-peer-urls", argv[n++] = purl;
  argv[n++] = "--initial-advertise-peer-urls", argv[n++] = purl;
  argv[n++] = "--initial-cluster", argv[n++] = cluster;
  argv[n++] = "--initial-cluster-token", argv[n++] = token;
  argv[n++] = "--initial-cluster-state", argv[n++] = "new";
  argv[n++] = "--heartbeat-interval", argv[n++] = "50";
  argv[n++] = "--election-timeout", argv[n++] = "500";
  argv[n++] = "--logger", argv[n++] = "zap";
  argv[n++] = "--log-level", argv[n++] = "warn";
  if (p->tls) {
    argv[n++] = "--cert-file", argv[n++] = cert;
    argv[n++] = "--key-file", argv[n++] = key;
    argv[n++] = "--client-cert-auth";
    argv[n++] = "--trusted-ca-file", argv[n++] = cert;
  }
  if (extra1) argv[n++] = extra1;
  if (extra2) argv[n++] = extra2;
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(1);
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* A variable and the same flag together is fatal: unset every ETCD_*. */
    for (int again = 1; again;) {
      again = 0;
      for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "ETCD_", 5) == 0) {
          char nm[256];
          size_t l = strcspn(*e, "=");
          snprintf(nm, sizeof(nm), "%.*s", (int)(l < 255 ? l : 255), *e);
          unsetenv(nm);
          again = 1;
          break;
        }
    }
    int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execvp("etcd", (char **)argv);
    _exit(127);
  }
  p->pid = pid;
}

static void print_log_tail(const struct etcd_proc *p) {
  char cmd[700];
  snprintf(cmd, sizeof(cmd), "tail -n 15 '%s/etcd.log' >&2", p->dir);
  if (system(cmd) < 0) perror("system");
}

static int healthy(const struct etcd_proc *p) {
  char url[128], tls[300], *body = NULL;
  snprintf(url, sizeof(url), "%s://127.0.0.1:%d/health", p->tls ? "https" : "http", p->cport);
  snprintf(tls, sizeof(tls), "%s/tls", g_base);
  long code = http_req(url, NULL, p->tls ? tls : NULL, &body);
  int ok = 0;
  if (code == 200 && body) {
    json_t *j = json_loads(body, 0, NULL);
    json_t *h = json_object_get(j, "health");
    ok = json_is_string(h) && strcmp(json_string_value(h), "true") == 0;
    json_decref(j);
  }
  free(body);
  return ok;
}

static int etcd_in_path(void) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char *copy = strdup(path), *save = NULL;
  int found = 0;
  for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
    char f[1024];
    snprintf(f, sizeof(f), "%s/etcd", *d ? d : ".");
    found = access(f, X_OK) == 0;
  }
  free(copy);
  return found;
}

static void auth_setup(void) {
  char base[64], url[128];
  snprintf(base, sizeof(base), "http://127.0.0.1:%d/v3", g_p[P_AUTH].cport);
  const char *steps[][2] = {{"/auth/user/add", "{\"name\":\"root\",\"password\":\"rootpw\"}"},
                            {"/auth/role/add", "{\"name\":\"root\"}"},
                            {"/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}"},
                            {"/auth/user/add", "{\"name\":\"alice\",\"password\":\"alicepw\"}"},
                            {"/auth/user/grant", "{\"user\":\"alice\",\"role\":\"root\"}"},
                            {"/auth/enable", "{}"}};
  for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
    snprintf(url, sizeof(url), "%s%s", base, steps[i][0]);
    char *out = NULL;
    long code = http_req(url, steps[i][1], NULL, &out);
    if (code != 200) {
      fprintf(stderr, "check_etcd: auth set-up %s failed: HTTP %ld %s\n", steps[i][0], code, out ? out : "");
      exit(1);
    }
    free(out);
  }
}

static void start_all(void) {
  int ports[2 * P_COUNT];
  free_ports(ports, 2 * P_COUNT);
  const char *names[P_COUNT] = {"single", "a", "b", "c", "auth", "tls"};
  for (int i = 0; i < P_COUNT; i++) {
    snprintf(g_p[i].name, sizeof(g_p[i].name), "%s", names[i]);
    g_p[i].cport = ports[2 * i];
    g_p[i].pport = ports[2 * i + 1];
  }
  g_p[P_TLS].tls = 1;
  char cl[512];
  for (int i = 0; i < P_COUNT; i++) {
    if (i == P_TLS && !g_have_tls) continue;
    if (i >= P_A && i <= P_C)
      snprintf(cl, sizeof(cl), "a=http://127.0.0.1:%d,b=http://127.0.0.1:%d,c=http://127.0.0.1:%d", g_p[P_A].pport,
               g_p[P_B].pport, g_p[P_C].pport);
    else
      snprintf(cl, sizeof(cl), "%s=http://127.0.0.1:%d", g_p[i].name, g_p[i].pport);
    if (i == P_AUTH) start_etcd(&g_p[i], cl, "--auth-token-ttl", "1");
    else start_etcd(&g_p[i], cl, NULL, NULL);
  }
  double deadline = now_s() + 20;
  int ready[P_COUNT] = {0};
  for (;;) {
    int all = 1;
    for (int i = 0; i < P_COUNT; i++) {
      if (g_p[i].pid <= 0 || ready[i]) continue;
      int st;
      if (waitpid(g_p[i].pid, &st, WNOHANG) == g_p[i].pid) {
        fprintf(stderr, "check_etcd: etcd '%s' exited early (status %d); its log:\n", g_p[i].name, st);
        g_p[i].pid = 0;
        print_log_tail(&g_p[i]);
        exit(1);
      }
      ready[i] = healthy(&g_p[i]);
      all &= ready[i];
    }
    if (all) break;
    if (now_s() > deadline) {
      for (int i = 0; i < P_COUNT; i++)
        if (g_p[i].pid > 0 && !ready[i]) {
          fprintf(stderr, "check_etcd: etcd '%s' not healthy within 20 s; its log:\n", g_p[i].name);
          print_log_tail(&g_p[i]);
        }
      exit(1);
    }
    sleep_s(0.05);
  }
  auth_setup();
  snprintf(g_ep_single, sizeof(g_ep_single), "127.0.0.1:%d", g_p[P_SINGLE].cport);
  snprintf(g_ep_auth, sizeof(g_ep_auth), "127.0.0.1:%d", g_p[P_AUTH].cport);
  snprintf(g_ep_tls, sizeof(g_ep_tls), "https://127.0.0.1:%d", g_p[P_TLS].cport);
}

static struct dcomm_etcd *client(const char *eps, double timeout) {
  struct dcomm_etcd_opts o = {.timeout = timeout};
  struct dcomm_etcd *c = NULL;
  OK(dcomm__etcd_create(eps, &o, &c));
  return c;
}

/* ---- KV and transactions ---- */

START_TEST(test_kv_roundtrip) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  unsigned char bin[256];
  for (int i = 0; i < 256; i++) bin[i] = (unsigned char)(255 - i);
  int64_t rev1 = 0, rev2 = 0;
  OK(dcomm__etcd_put(c, "/t/kv/a", bin, sizeof(bin), 0, &rev1));
  OK(dcomm__etcd_put(c, "/t/kv/b", "", 0, 0, &rev2));
  OK(dcomm__etcd_put(c, "/t/kw", "outside", 7, 0, NULL));
  ck_assert_int_gt(rev2, rev1);
  struct dcomm_etcd_kv kv;
  int64_t hrev;
  OK(dcomm__etcd_get(c, "/t/kv/a", -1, &kv, &hrev));
  ck_assert_int_eq(kv.vlen, sizeof(bin));
  ck_assert(memcmp(kv.val, bin, sizeof(bin)) == 0);
  ck_assert_int_eq(kv.mod_revision, rev1);
  ck_assert_int_ge(hrev, rev2);
  ck_assert_str_eq(kv.key, "/t/kv/a");
  dcomm__etcd_kv_clear(&kv);
  OK(dcomm__etcd_get(c, "/t/kv/b", -1, &kv, NULL));
  ck_assert_int_eq(kv.vlen, 0); /* an empty value is left out of the answer */
  dcomm__etcd_kv_clear(&kv);
  struct dcomm_etcd_kv *kvs;
  size_t n;
  OK(dcomm__etcd_range_prefix(c, "/t/kv/", &kvs, &n, NULL));
  ck_assert_int_eq(n, 2);
  ck_assert_str_eq(kvs[0].key, "/t/kv/a");
  ck_assert_str_eq(kvs[1].key, "/t/kv/b");
  ck_assert_int_eq(kvs[0].vlen, sizeof(bin));
  dcomm__etcd_kvs_free(kvs, n);
  int64_t del = -1;
  OK(dcomm__etcd_delete(c, "/t/kv/a", 0, &del));
  ck_assert_int_eq(del, 1);
  OK(dcomm__etcd_delete(c, "/t/kv/a", 0, &del));
  ck_assert_int_eq(del, 0);
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_get(c, "/t/kv/a", -1, &kv, NULL));
  ck_assert_ptr_null(kv.key);
  OK(dcomm__etcd_delete(c, "/t/kv/", 1, &del));
  ck_assert_int_eq(del, 1);
  OK(dcomm__etcd_range_prefix(c, "/t/kv/", &kvs, &n, NULL));
  ck_assert_int_eq(n, 0);
  OK(dcomm__etcd_get(c, "/t/kw", -1, NULL, NULL)); /* outside the prefix: kept */
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_put(c, "", "x", 1, 0, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

START_TEST(test_txn) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  struct dcomm_etcd_kv cur;
  int done = -1;
  OK(dcomm__etcd_create_if_absent(c, "/t/txn/k", "v1", 2, 0, &done, &cur));
  ck_assert_int_eq(done, 1);
  ck_assert_str_eq(cur.val, "v1");
  int64_t rev1 = cur.mod_revision;
  ck_assert_int_gt(rev1, 0);
  dcomm__etcd_kv_clear(&cur);
  OK(dcomm__etcd_create_if_absent(c, "/t/txn/k", "v2", 2, 0, &done, &cur));
  ck_assert_int_eq(done, 0);
  ck_assert_str_eq(cur.val, "v1");
  ck_assert_int_eq(cur.mod_revision, rev1);
  dcomm__etcd_kv_clear(&cur);
  /* CAS: mismatch, then match. */
  OK(dcomm__etcd_cas(c, "/t/txn/k", rev1 + 100, "v3", 2, 0, &done, &cur));
  ck_assert_int_eq(done, 0);
  ck_assert_str_eq(cur.val, "v1");
  dcomm__etcd_kv_clear(&cur);
  OK(dcomm__etcd_cas(c, "/t/txn/k", rev1, "v3", 2, 0, &done, &cur));
  ck_assert_int_eq(done, 1);
  ck_assert_int_gt(cur.mod_revision, rev1);
  dcomm__etcd_kv_clear(&cur);
  OK(dcomm__etcd_get(c, "/t/txn/k", -1, &cur, NULL));
  ck_assert_str_eq(cur.val, "v3");
  dcomm__etcd_kv_clear(&cur);
  /* CAS on an absent key: mod_revision 0 matches, anything else fails. */
  OK(dcomm__etcd_cas(c, "/t/txn/absent", 5, "x", 1, 0, &done, &cur));
  ck_assert_int_eq(done, 0);
  ck_assert_ptr_null(cur.key);
  OK(dcomm__etcd_cas(c, "/t/txn/absent", 0, "x", 1, 0, &done, &cur));
  ck_assert_int_eq(done, 1);
  dcomm__etcd_kv_clear(&cur);
  /* Compare on the value. */
  OK(dcomm__etcd_cas_value(c, "/t/txn/none", "", 0, "y", 1, &done, &cur));
  ck_assert_int_eq(done, 0); /* absent is not "empty" */
  ck_assert_ptr_null(cur.key);
  OK(dcomm__etcd_cas_value(c, "/t/txn/k", "nope", 4, "v4", 2, &done, &cur));
  ck_assert_int_eq(done, 0);
  ck_assert_str_eq(cur.val, "v3");
  dcomm__etcd_kv_clear(&cur);
  OK(dcomm__etcd_cas_value(c, "/t/txn/k", "v3", 2, "v4", 2, &done, &cur));
  ck_assert_int_eq(done, 1);
  ck_assert_str_eq(cur.val, "v4");
  dcomm__etcd_kv_clear(&cur);
  OK(dcomm__etcd_delete(c, "/t/txn/", 1, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

/* dcomm__etcd_txn that must succeed as a call; returns done. */
#define ETXN(c, cmps, nc, puts, np) etxn_at(__LINE__, c, cmps, nc, puts, np)
static int etxn_at(int line, struct dcomm_etcd *c, const struct dcomm_etcd_cmp *cmps, size_t nc,
                   const struct dcomm_etcd_put *puts, size_t np) {
  int done = -1;
  int rc = dcomm__etcd_txn(c, cmps, nc, puts, np, &done);
  ck_assert_msg(rc == 0, "line %d: txn -> %d (%s): %s", line, rc, dcomm_error_name(rc), dcomm_last_error());
  ck_assert_msg(done == 0 || done == 1, "line %d: txn done is %d", line, done);
  return done;
}

/* The value of key (raw client), or absent when want is NULL. */
#define EXPECT_KEY(c, key, want) expect_key_at(__LINE__, c, key, want)
static void expect_key_at(int line, struct dcomm_etcd *c, const char *key, const char *want) {
  struct dcomm_etcd_kv kv;
  int rc = dcomm__etcd_get(c, key, -1, &kv, NULL);
  if (!want) {
    ck_assert_msg(rc == DCOMM_ENOTFOUND, "line %d: '%s' should be absent, get -> %d", line, key, rc);
    return;
  }
  ck_assert_msg(rc == 0, "line %d: get '%s' -> %d (%s)", line, key, rc, dcomm_last_error());
  ck_assert_msg(kv.vlen == strlen(want) && memcmp(kv.val, want, kv.vlen) == 0, "line %d: '%s' is '%s', expected '%s'",
                line, key, (char *)kv.val, want);
  dcomm__etcd_kv_clear(&kv);
}

START_TEST(test_txn_compares) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  /* ABSENT holds, then fails; two puts land together. */
  struct dcomm_etcd_cmp absent = {"/t/gt/a", DCOMM_STORE_ABSENT, NULL, 0};
  struct dcomm_etcd_put ab[2] = {{"/t/gt/a", "1", 1, 0}, {"/t/gt/b", "2", 1, 0}};
  struct dcomm_etcd_put pc = {"/t/gt/c", "3", 1, 0};
  ck_assert_int_eq(ETXN(c, &absent, 1, ab, 2), 1);
  EXPECT_KEY(c, "/t/gt/a", "1");
  EXPECT_KEY(c, "/t/gt/b", "2");
  ck_assert_int_eq(ETXN(c, &absent, 1, &pc, 1), 0);
  EXPECT_KEY(c, "/t/gt/c", NULL);
  /* EXISTS holds on a present key, fails on an absent one. */
  struct dcomm_etcd_cmp exists = {"/t/gt/a", DCOMM_STORE_EXISTS, NULL, 0};
  struct dcomm_etcd_cmp exists_not = {"/t/gt/none", DCOMM_STORE_EXISTS, NULL, 0};
  ck_assert_int_eq(ETXN(c, &exists_not, 1, &pc, 1), 0);
  EXPECT_KEY(c, "/t/gt/c", NULL);
  ck_assert_int_eq(ETXN(c, &exists, 1, &pc, 1), 1);
  EXPECT_KEY(c, "/t/gt/c", "3");
  /* EQUAL: exact bytes and length; absent is not "empty". */
  struct dcomm_etcd_put pd = {"/t/gt/d", "4", 1, 0};
  struct dcomm_etcd_cmp miss[] = {{"/t/gt/a", DCOMM_STORE_EQUAL, "2", 1},  {"/t/gt/a", DCOMM_STORE_EQUAL, "11", 2},
                                  {"/t/gt/a", DCOMM_STORE_EQUAL, "", 0},   {"/t/gt/a", DCOMM_STORE_EQUAL, NULL, 0},
                                  {"/t/gt/none", DCOMM_STORE_EQUAL, "", 0}, {"/t/gt/none", DCOMM_STORE_EQUAL, "1", 1}};
  for (size_t i = 0; i < sizeof(miss) / sizeof(miss[0]); i++) {
    ck_assert_msg(ETXN(c, &miss[i], 1, &pd, 1) == 0, "EQUAL compare %zu held", i);
    EXPECT_KEY(c, "/t/gt/d", NULL);
  }
  struct dcomm_etcd_cmp eq = {"/t/gt/a", DCOMM_STORE_EQUAL, "1", 1};
  ck_assert_int_eq(ETXN(c, &eq, 1, &pd, 1), 1);
  EXPECT_KEY(c, "/t/gt/d", "4");
  /* An empty value: exists, equals "" (with or without a buffer), not "x". */
  OK(dcomm__etcd_put(c, "/t/gt/e", "", 0, 0, NULL));
  struct dcomm_etcd_cmp e_eq = {"/t/gt/e", DCOMM_STORE_EQUAL, "", 0}, e_eq0 = {"/t/gt/e", DCOMM_STORE_EQUAL, NULL, 0};
  struct dcomm_etcd_cmp e_x = {"/t/gt/e", DCOMM_STORE_EQUAL, "x", 1}, e_ab = {"/t/gt/e", DCOMM_STORE_ABSENT, NULL, 0};
  struct dcomm_etcd_cmp e_ex = {"/t/gt/e", DCOMM_STORE_EXISTS, NULL, 0};
  struct dcomm_etcd_put pe = {"/t/gt/e-seen", "y", 1, 0};
  ck_assert_int_eq(ETXN(c, &e_x, 1, &pe, 1), 0);
  ck_assert_int_eq(ETXN(c, &e_ab, 1, &pe, 1), 0);
  EXPECT_KEY(c, "/t/gt/e-seen", NULL);
  ck_assert_int_eq(ETXN(c, &e_eq, 1, &pe, 1), 1);
  OK(dcomm__etcd_delete(c, "/t/gt/e-seen", 0, NULL));
  ck_assert_int_eq(ETXN(c, &e_eq0, 1, &pe, 1), 1);
  OK(dcomm__etcd_delete(c, "/t/gt/e-seen", 0, NULL));
  ck_assert_int_eq(ETXN(c, &e_ex, 1, &pe, 1), 1);
  EXPECT_KEY(c, "/t/gt/e-seen", "y");
  /* Binary values with NUL bytes compare in full. */
  const char bin[] = {'g', 0, 'x', 0, (char)0xff}, bin2[] = {'g', 0, 'y', 0, (char)0xff};
  OK(dcomm__etcd_put(c, "/t/gt/bin", bin, sizeof(bin), 0, NULL));
  struct dcomm_etcd_cmp bq2 = {"/t/gt/bin", DCOMM_STORE_EQUAL, bin2, sizeof(bin2)};
  struct dcomm_etcd_cmp bq = {"/t/gt/bin", DCOMM_STORE_EQUAL, bin, sizeof(bin)};
  struct dcomm_etcd_put pb = {"/t/gt/bin-ok", "1", 1, 0};
  ck_assert_int_eq(ETXN(c, &bq2, 1, &pb, 1), 0);
  ck_assert_int_eq(ETXN(c, &bq, 1, &pb, 1), 1);
  /* Several compares: one failing, wherever it is, stops every put. */
  struct dcomm_etcd_cmp good[4] = {{"/t/gt/a", DCOMM_STORE_EQUAL, "1", 1},
                                   {"/t/gt/b", DCOMM_STORE_EXISTS, NULL, 0},
                                   {"/t/gt/plan", DCOMM_STORE_ABSENT, NULL, 0},
                                   {"/t/gt/e", DCOMM_STORE_EQUAL, "", 0}};
  const struct dcomm_etcd_cmp bad[4] = {{"/t/gt/a", DCOMM_STORE_EQUAL, "0", 1},
                                        {"/t/gt/none", DCOMM_STORE_EXISTS, NULL, 0},
                                        {"/t/gt/b", DCOMM_STORE_ABSENT, NULL, 0},
                                        {"/t/gt/e", DCOMM_STORE_EQUAL, "e", 1}};
  struct dcomm_etcd_put step[3] = {{"/t/gt/a", "2", 1, 0}, {"/t/gt/plan", "p", 1, 0}, {"/t/gt/x", "x", 1, 0}};
  for (int i = 0; i < 4; i++) {
    struct dcomm_etcd_cmp m[4];
    memcpy(m, good, sizeof(m));
    m[i] = bad[i];
    ck_assert_msg(ETXN(c, m, 4, step, 3) == 0, "txn with compare %d failing wrote", i);
    EXPECT_KEY(c, "/t/gt/a", "1");
    EXPECT_KEY(c, "/t/gt/plan", NULL);
    EXPECT_KEY(c, "/t/gt/x", NULL);
  }
  ck_assert_int_eq(ETXN(c, good, 4, step, 3), 1);
  EXPECT_KEY(c, "/t/gt/a", "2");
  EXPECT_KEY(c, "/t/gt/plan", "p");
  EXPECT_KEY(c, "/t/gt/x", "x");
  ck_assert_int_eq(ETXN(c, good, 4, step, 3), 0); /* a moved on, plan exists */
  /* No compare: the puts just happen. */
  struct dcomm_etcd_put pf = {"/t/gt/free", "f", 1, 0};
  ck_assert_int_eq(ETXN(c, NULL, 0, &pf, 1), 1);
  EXPECT_KEY(c, "/t/gt/free", "f");
  /* Malformed requests: refused before anything is sent. */
  int done = -1;
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, &absent, 1, &pc, 0, &done));
  ck_assert_int_eq(done, 0);
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, &absent, 1, NULL, 1, &done));
  struct dcomm_etcd_cmp badk = {"/t/gt/a", 3, NULL, 0};
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, &badk, 1, &pf, 1, &done));
  badk.kind = -1;
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, &badk, 1, &pf, 1, &done));
  struct dcomm_etcd_cmp nokey = {"", DCOMM_STORE_EXISTS, NULL, 0}, nullval = {"/t/gt/a", DCOMM_STORE_EQUAL, NULL, 2};
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, &nokey, 1, &pf, 1, &done));
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, &nullval, 1, &pf, 1, &done));
  struct dcomm_etcd_put noput = {"", "v", 1, 0}, nullput = {"/t/gt/np", NULL, 3, 0};
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, NULL, 0, &noput, 1, &done));
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(c, NULL, 0, &nullput, 1, &done));
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_txn(NULL, NULL, 0, &pf, 1, &done));
  ck_assert_int_eq(done, 0);
  EXPECT_KEY(c, "/t/gt/np", NULL);
  OK(dcomm__etcd_delete(c, "/t/gt/", 1, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

START_TEST(test_txn_lease_fencing) {
  /* A node's record lives under its lease; a member checks "my node's
   * record EXISTS" in the same txn as its write. Once the lease is revoked
   * (the node was fenced) the compare fails and nothing is written. */
  struct dcomm_etcd *c = client(g_ep_single, 5);
  int64_t id = 0;
  OK(dcomm__etcd_lease_grant(c, 30, &id, NULL));
  OK(dcomm__etcd_put(c, "/t/gf/node/n1", "up", 2, id, NULL));
  OK(dcomm__etcd_put(c, "/t/gf/gen", "4", 1, 0, NULL));
  struct dcomm_etcd_cmp guard[2] = {{"/t/gf/gen", DCOMM_STORE_EQUAL, "4", 1},
                                    {"/t/gf/node/n1", DCOMM_STORE_EXISTS, NULL, 0}};
  struct dcomm_etcd_put step[2] = {{"/t/gf/gen", "5", 1, 0}, {"/t/gf/plan/5", "p5", 2, 0}};
  ck_assert_int_eq(ETXN(c, guard, 2, step, 2), 1);
  EXPECT_KEY(c, "/t/gf/plan/5", "p5");
  /* A txn can itself put a key under the lease. */
  struct dcomm_etcd_cmp rec_absent = {"/t/gf/rec/n1", DCOMM_STORE_ABSENT, NULL, 0};
  struct dcomm_etcd_put rec = {"/t/gf/rec/n1", "pid 1", 5, id};
  ck_assert_int_eq(ETXN(c, &rec_absent, 1, &rec, 1), 1);
  struct dcomm_etcd_kv kv;
  OK(dcomm__etcd_get(c, "/t/gf/rec/n1", -1, &kv, NULL));
  ck_assert_int_eq(kv.lease, id);
  dcomm__etcd_kv_clear(&kv);
  OK(dcomm__etcd_lease_revoke(c, id));
  EXPECT_KEY(c, "/t/gf/node/n1", NULL);
  EXPECT_KEY(c, "/t/gf/rec/n1", NULL);
  /* The fenced member, still believing in generation 5. */
  guard[0].val = "5";
  struct dcomm_etcd_put late[2] = {{"/t/gf/gen", "6", 1, 0}, {"/t/gf/plan/6", "fenced", 6, 0}};
  ck_assert_int_eq(ETXN(c, guard, 2, late, 2), 0);
  ck_assert_int_eq(ETXN(c, guard + 1, 1, late, 2), 0);
  EXPECT_KEY(c, "/t/gf/gen", "5");
  EXPECT_KEY(c, "/t/gf/plan/6", NULL);
  /* Without the node compare the same write would have gone through. */
  struct dcomm_etcd_cmp node_gone = {"/t/gf/node/n1", DCOMM_STORE_ABSENT, NULL, 0};
  guard[1] = node_gone;
  ck_assert_int_eq(ETXN(c, guard, 2, late, 2), 1);
  EXPECT_KEY(c, "/t/gf/plan/6", "fenced");
  /* A put under the revoked lease is refused as a whole. */
  int done = -1;
  struct dcomm_etcd_put both[2] = {{"/t/gf/ok", "1", 1, 0}, {"/t/gf/rec/n1", "again", 5, id}};
  int rc = dcomm__etcd_txn(c, NULL, 0, both, 2, &done);
  ck_assert_msg(rc < 0 && done == 0, "a txn put under a revoked lease -> %d, done %d", rc, done);
  EXPECT_KEY(c, "/t/gf/ok", NULL);
  OK(dcomm__etcd_delete(c, "/t/gf/", 1, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

/* ---- leases ---- */

START_TEST(test_lease_revoke) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  int64_t id = 0, ttl = 0;
  OK(dcomm__etcd_lease_grant(c, 30, &id, &ttl));
  ck_assert_int_ne(id, 0);
  ck_assert_int_eq(ttl, 30);
  OK(dcomm__etcd_put(c, "/t/lease/r", "x", 1, id, NULL));
  struct dcomm_etcd_kv kv;
  OK(dcomm__etcd_get(c, "/t/lease/r", -1, &kv, NULL));
  ck_assert_int_eq(kv.lease, id);
  dcomm__etcd_kv_clear(&kv);
  OK(dcomm__etcd_lease_keepalive(c, id, &ttl));
  ck_assert_int_gt(ttl, 0);
  OK(dcomm__etcd_lease_revoke(c, id));
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_get(c, "/t/lease/r", -1, &kv, NULL));
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_lease_keepalive(c, id, &ttl));
  EXPECT_MSG("gone");
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_lease_revoke(c, id));
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_put(c, "/t/lease/r", "x", 1, id, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

START_TEST(test_lease_expiry) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  int64_t id = 0;
  OK(dcomm__etcd_lease_grant(c, 2, &id, NULL));
  OK(dcomm__etcd_put(c, "/t/lease/e", "x", 1, id, NULL));
  double t0 = now_s();
  int rc;
  while ((rc = dcomm__etcd_get(c, "/t/lease/e", -1, NULL, NULL)) == 0 && now_s() - t0 < 8) sleep_s(0.1);
  double gone = now_s() - t0;
  ck_assert_msg(rc == DCOMM_ENOTFOUND, "the key outlived its 2 s lease by far (%.1f s, rc %d)", gone, rc);
  ck_assert_msg(gone > 1.0, "the key went away after %.2f s, before its 2 s TTL", gone);
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_lease_keepalive(c, id, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

START_TEST(test_lease_keepalive) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  int64_t id = 0, ttl = 0;
  OK(dcomm__etcd_lease_grant(c, 2, &id, NULL));
  OK(dcomm__etcd_put(c, "/t/lease/k", "x", 1, id, NULL));
  double t0 = now_s();
  while (now_s() - t0 < 4.0) {
    OK(dcomm__etcd_lease_keepalive(c, id, &ttl));
    ck_assert_int_gt(ttl, 0);
    sleep_s(0.5);
  }
  OK(dcomm__etcd_get(c, "/t/lease/k", -1, NULL, NULL)); /* twice its TTL later: still there */
  OK(dcomm__etcd_lease_revoke(c, id));
  dcomm__etcd_destroy(c);
}
END_TEST

/* ---- watch ---- */

struct collected {
  int n, want;
  int type[8];
  char key[8][64], val[8][64];
  int64_t rev[8];
  int compacted;
  int64_t compact_rev;
};

static int collect(const struct dcomm_etcd_event *ev, void *arg) {
  struct collected *c = arg;
  if (ev->type == DCOMM_ETCD_COMPACTED) {
    c->compacted = 1;
    c->compact_rev = ev->mod_revision;
    return 0;
  }
  if (c->n < 8) {
    c->type[c->n] = ev->type;
    snprintf(c->key[c->n], 64, "%s", ev->key);
    snprintf(c->val[c->n], 64, "%.*s", (int)ev->vlen, (const char *)ev->val);
    c->rev[c->n] = ev->mod_revision;
  }
  c->n++;
  return c->n >= c->want;
}

struct watch_job {
  struct dcomm_etcd *c;
  const char *key;
  int prefix;
  int64_t from;
  double timeout;
  struct collected got;
  int cancel;
  int rc;
  char err[512];
  double ended;
};

static void *watch_main(void *arg) {
  struct watch_job *w = arg;
  w->rc = dcomm__etcd_watch(w->c, w->key, w->prefix, w->from, w->timeout, collect, &w->got, &w->cancel);
  snprintf(w->err, sizeof(w->err), "%s", dcomm_last_error());
  w->ended = now_s();
  return NULL;
}

START_TEST(test_watch_events) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  int64_t rev0;
  OK(dcomm__etcd_put(c, "/t/w/start", "0", 1, 0, &rev0));
  OK(dcomm__etcd_put(c, "/t/w/k1", "v1", 2, 0, NULL));
  OK(dcomm__etcd_delete(c, "/t/w/k1", 0, NULL));
  OK(dcomm__etcd_put(c, "/t/x/other", "no", 2, 0, NULL)); /* outside the prefix */
  /* Half from history, half live. */
  struct watch_job w = {.c = c, .key = "/t/w/", .prefix = 1, .from = rev0 + 1, .timeout = 10};
  w.got.want = 4;
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, watch_main, &w), 0);
  sleep_s(0.3);
  OK(dcomm__etcd_put(c, "/t/w/k2", "v2", 2, 0, NULL));
  OK(dcomm__etcd_delete(c, "/t/w/k2", 0, NULL));
  pthread_join(th, NULL);
  ck_assert_msg(w.rc == 0, "watch returned %d: %s", w.rc, w.err);
  ck_assert_int_eq(w.got.n, 4);
  int types[4] = {DCOMM_ETCD_PUT, DCOMM_ETCD_DELETE, DCOMM_ETCD_PUT, DCOMM_ETCD_DELETE};
  const char *keys[4] = {"/t/w/k1", "/t/w/k1", "/t/w/k2", "/t/w/k2"};
  const char *vals[4] = {"v1", "", "v2", ""};
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(w.got.type[i], types[i]);
    ck_assert_str_eq(w.got.key[i], keys[i]);
    ck_assert_str_eq(w.got.val[i], vals[i]);
    if (i) ck_assert_int_gt(w.got.rev[i], w.got.rev[i - 1]);
  }
  dcomm__etcd_destroy(c);
}
END_TEST

START_TEST(test_watch_cancel_and_timeout) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  struct watch_job w = {.c = c, .key = "/t/wc/", .prefix = 1, .timeout = 30};
  w.got.want = 1;
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, watch_main, &w), 0);
  sleep_s(0.5);
  double t0 = now_s();
  dcomm__etcd_watch_cancel(&w.cancel);
  pthread_join(th, NULL);
  ck_assert_msg(w.rc == DCOMM_EREVOKED, "cancelled watch returned %d: %s", w.rc, w.err);
  ck_assert_msg(w.ended - t0 < 1.0, "the watch took %.2f s to notice the cancel", w.ended - t0);
  /* A unary call on the same client still works while/after a watch. */
  OK(dcomm__etcd_put(c, "/t/wc/after", "1", 1, 0, NULL));
  struct collected got = {.want = 100};
  t0 = now_s();
  EXPECT_RC(DCOMM_ETIMEDOUT, dcomm__etcd_watch(c, "/t/wc/quiet", 0, 0, 0.5, collect, &got, NULL));
  double el = now_s() - t0;
  ck_assert_msg(el > 0.4 && el < 2.0, "watch timeout of 0.5 s took %.2f s", el);
  dcomm__etcd_destroy(c);
}
END_TEST

START_TEST(test_watch_compacted) {
  struct dcomm_etcd *c = client(g_ep_single, 5);
  int64_t r1, r2;
  OK(dcomm__etcd_put(c, "/t/wk/a", "1", 1, 0, &r1));
  OK(dcomm__etcd_put(c, "/t/wk/a", "2", 1, 0, &r2));
  char url[128], body[128];
  snprintf(url, sizeof(url), "http://%s/v3/kv/compaction", g_ep_single);
  snprintf(body, sizeof(body), "{\"revision\":\"%lld\"}", (long long)r2);
  ck_assert_int_eq(http_req(url, body, NULL, NULL), 200);
  struct collected got = {.want = 10};
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_watch(c, "/t/wk/", 1, r1, 5, collect, &got, NULL));
  EXPECT_MSG("compacted");
  ck_assert_int_eq(got.compacted, 1);
  ck_assert_int_eq(got.compact_rev, r2);
  dcomm__etcd_destroy(c);
}
END_TEST

/* ---- the store ---- */

/* Every case of the store conformance suite (store_conformance.c) runs on
 * the single member too; what follows here is the etcd store's own: where
 * its keys live in etcd, and a handle whose calls are not serialized. */

static struct dcomm_store *open_store(const char *eps, const char *job, double timeout) {
  struct dcomm_store *s = NULL;
  OK(dcomm__store_etcd_open(eps, job, timeout, &s));
  return s;
}

/* The conformance cases' store: the single member, under a job of the
 * case's own ("conf-<pid>": each case runs in a process of its own), which
 * the teardown deletes. */
static char g_conf_job[64];

static void conf_etcd_setup(void) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the runner, as the servers do */
  snprintf(g_conf_job, sizeof(g_conf_job), "conf-%d", (int)getpid());
}

static void conf_etcd_teardown(void) {
  char ns[96];
  snprintf(ns, sizeof(ns), "/dcomm/%s/", g_conf_job);
  struct dcomm_etcd *c = client(g_ep_single, 5);
  OK(dcomm__etcd_delete(c, ns, 1, NULL));
  dcomm__etcd_destroy(c);
}

/* The handle's default get/wait timeout is the one asked for; its client's
 * own I/O timeout is at least 5 s, so that a slow write (etcd syncs its
 * log) does not fail a case whose handles wait 0.3 s by default. */
static int etcd_open(double timeout, struct dcomm_store **out) {
  int rc = dcomm__store_etcd_open(g_ep_single, g_conf_job, timeout > 5 ? timeout : 5, out);
  if (rc == 0) (*out)->timeout = timeout;
  return rc;
}

static const struct store_factory etcd_factory = {
    .name = "etcd",
    .open = etcd_open,
    /* etcd refuses a request over --max-request-bytes (1.5 MiB unless
     * set), and a value travels base64-encoded in it. */
    .large_value = 1u << 20,
    .add_threads = 4,
    .add_shared = 2,
    .add_procs = 4,
    .add_iters = 25,
};

START_TEST(test_store_namespace) {
  /* Keys live under /dcomm/<job>/, then the handle's prefix. */
  struct dcomm_store *s = open_store(g_ep_single, "job-ops", 5);
  struct dcomm_etcd *c = client(g_ep_single, 5);
  unsigned char bin[300];
  for (int i = 0; i < 300; i++) bin[i] = (unsigned char)(i * 7);
  OK(dcomm__store_set(s, "bin", bin, sizeof(bin)));
  struct dcomm_etcd_kv kv;
  OK(dcomm__etcd_get(c, "/dcomm/job-ops/bin", -1, &kv, NULL));
  ck_assert(kv.vlen == sizeof(bin) && memcmp(kv.val, bin, sizeof(bin)) == 0);
  dcomm__etcd_kv_clear(&kv);
  OK(dcomm__store_set_prefix(s, "g1/"));
  OK(dcomm__store_set(s, "p", "q", 1));
  EXPECT_KEY(c, "/dcomm/job-ops/g1/p", "q");
  OK(dcomm__store_set_prefix(s, ""));
  /* add keeps decimal text there; delete removes the key there. */
  int64_t r = 0;
  OK(dcomm__store_add(s, "ctr", 5, &r));
  OK(dcomm__store_add(s, "ctr", -7, &r));
  EXPECT_KEY(c, "/dcomm/job-ops/ctr", "-2");
  OK(dcomm__store_delete(s, "bin", NULL));
  EXPECT_KEY(c, "/dcomm/job-ops/bin", NULL);
  /* Another job is another namespace. */
  struct dcomm_store *o = open_store(g_ep_single, "job-ops-other", 5);
  expect_absent(o, "ctr");
  OK(dcomm__store_set(o, "ctr", "7", 1));
  EXPECT_KEY(c, "/dcomm/job-ops-other/ctr", "7");
  expect_value(s, "ctr", "-2", 2);
  dcomm__store_close(o);
  OK(dcomm__etcd_delete(c, "/dcomm/job-ops/", 1, NULL));
  OK(dcomm__etcd_delete(c, "/dcomm/job-ops-other/", 1, NULL));
  dcomm__etcd_destroy(c);
  dcomm__store_close(s);
}
END_TEST

START_TEST(test_store_get_same_handle) {
  /* A get blocked in one thread does not hold up a set from another thread
   * on the same handle: the watch has a connection of its own. (The TCP
   * and file stores serialize the calls of a handle.) */
  struct dcomm_store *s = open_store(g_ep_single, "job-get", 10);
  struct conf_blocked_get g = {.s = s, .key = "late2", .timeout = 10};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, conf_blocked_get_main, &g), 0);
  sleep_s(0.4);
  OK(dcomm__store_set(s, "late2", "v", 1));
  pthread_join(th, NULL);
  ck_assert_msg(g.rc == 0 && g.len == 1, "threaded get: %d", g.rc);
  ck_assert_msg(g.elapsed > 0.3 && g.elapsed < 5, "threaded get returned after %.2f s", g.elapsed);
  free(g.val);
  /* A timeout: about the timeout, and the message names it. */
  double t0 = now_s();
  void *v = (void *)1;
  size_t n = 0;
  EXPECT_RC(DCOMM_ETIMEDOUT, dcomm__store_get(s, "never", 1.0, &v, &n));
  double el = now_s() - t0;
  ck_assert_msg(el > 0.9 && el < 2.5, "get with a 1 s timeout took %.2f s", el);
  EXPECT_MSG("not set within");
  ck_assert_ptr_null(v);
  struct dcomm_etcd *c = client(g_ep_single, 5);
  OK(dcomm__etcd_delete(c, "/dcomm/job-get/", 1, NULL));
  dcomm__etcd_destroy(c);
  dcomm__store_close(s);
}
END_TEST

START_TEST(test_store_txn_namespace) {
  /* Where a txn's compares look and its puts land in etcd: the handle's
   * prefix under /dcomm/<job>/. (Its semantics are conformance cases.) */
  struct dcomm_store *s = open_store(g_ep_single, "job-txn", 5), *s2 = open_store(g_ep_single, "job-txn", 5);
  struct dcomm_etcd *c = client(g_ep_single, 5);
  int done = -1;
  /* s (prefix "g3/") compares on what s2 (no prefix) wrote as "g3/gen". */
  OK(dcomm__store_set_prefix(s, "g3/"));
  OK(dcomm__store_set(s2, "g3/gen", "3", 1));
  OK(dcomm__store_set(s2, "gen", "999", 3));
  struct dcomm_store_cmp lead[2] = {{"gen", DCOMM_STORE_EQUAL, "3", 1}, {"plan/4", DCOMM_STORE_ABSENT, NULL, 0}};
  struct dcomm_store_put step[2] = {{"gen", "4", 1}, {"plan/4", "p4", 2}};
  OK(dcomm__store_txn(s, lead, 2, step, 2, &done));
  ck_assert_int_eq(done, 1);
  EXPECT_KEY(c, "/dcomm/job-txn/g3/gen", "4");
  EXPECT_KEY(c, "/dcomm/job-txn/g3/plan/4", "p4");
  EXPECT_KEY(c, "/dcomm/job-txn/gen", "999");
  EXPECT_KEY(c, "/dcomm/job-txn/plan/4", NULL);
  /* s's "gen" is g3/gen: the unprefixed value does not match it. */
  struct dcomm_store_cmp other = {"gen", DCOMM_STORE_EQUAL, "999", 3};
  struct dcomm_store_put px = {"plan/x", "x", 1};
  OK(dcomm__store_txn(s, &other, 1, &px, 1, &done));
  ck_assert_int_eq(done, 0);
  OK(dcomm__store_txn(s, lead + 1, 1, &px, 1, &done)); /* g3/plan/4 exists */
  ck_assert_int_eq(done, 0);
  EXPECT_KEY(c, "/dcomm/job-txn/g3/plan/x", NULL);
  EXPECT_KEY(c, "/dcomm/job-txn/plan/x", NULL);
  /* Without the prefix plan/4 is absent; in another job too. */
  struct dcomm_store_put po = {"plan/4", "o", 1};
  OK(dcomm__store_txn(s2, lead + 1, 1, &po, 1, &done));
  ck_assert_int_eq(done, 1);
  EXPECT_KEY(c, "/dcomm/job-txn/plan/4", "o");
  struct dcomm_store *s3 = open_store(g_ep_single, "job-txn-other", 5);
  OK(dcomm__store_set_prefix(s3, "g3/"));
  OK(dcomm__store_txn(s3, lead + 1, 1, &po, 1, &done));
  ck_assert_int_eq(done, 1);
  EXPECT_KEY(c, "/dcomm/job-txn-other/g3/plan/4", "o");
  EXPECT_KEY(c, "/dcomm/job-txn/g3/plan/4", "p4");
  dcomm__store_close(s3);
  /* The other way round: s2 (prefix "g3/node/") sets "7", which s sees as
   * "node/7" and s2 itself as "7". */
  OK(dcomm__store_set_prefix(s2, "g3/node/"));
  OK(dcomm__store_set(s2, "7", "up", 2));
  struct dcomm_store_cmp node[2] = {{"node/7", DCOMM_STORE_EXISTS, NULL, 0}, {"gen", DCOMM_STORE_EQUAL, "4", 1}};
  struct dcomm_store_put p5[2] = {{"gen", "5", 1}, {"plan/5", "p5", 2}};
  OK(dcomm__store_txn(s2, node, 1, p5, 2, &done)); /* s2's "node/7" is g3/node/node/7 */
  ck_assert_int_eq(done, 0);
  OK(dcomm__store_txn(s, node, 2, p5, 2, &done));
  ck_assert_int_eq(done, 1);
  EXPECT_KEY(c, "/dcomm/job-txn/g3/gen", "5");
  EXPECT_KEY(c, "/dcomm/job-txn/g3/plan/5", "p5");
  EXPECT_KEY(c, "/dcomm/job-txn/g3/node/gen", NULL);
  OK(dcomm__etcd_delete(c, "/dcomm/job-txn/", 1, NULL));
  OK(dcomm__etcd_delete(c, "/dcomm/job-txn-other/", 1, NULL));
  dcomm__etcd_destroy(c);
  dcomm__store_close(s);
  dcomm__store_close(s2);
}
END_TEST

/* ---- 3-member cluster: failover ---- */

/* The member whose header.member_id is the leader it reports. */
static int find_leader(void) {
  for (int tries = 0; tries < 100; tries++) {
    for (int i = P_A; i <= P_C; i++) {
      char url[128], *body = NULL;
      snprintf(url, sizeof(url), "http://127.0.0.1:%d/v3/maintenance/status", g_p[i].cport);
      if (http_req(url, "{}", NULL, &body) == 200 && body) {
        json_t *j = json_loads(body, 0, NULL);
        json_t *me = json_object_get(json_object_get(j, "header"), "member_id");
        json_t *ld = json_object_get(j, "leader");
        int is = json_is_string(me) && json_is_string(ld) && strcmp(json_string_value(me), json_string_value(ld)) == 0;
        json_decref(j);
        free(body);
        if (is) return i;
      } else {
        free(body);
      }
    }
    sleep_s(0.1);
  }
  return -1;
}

START_TEST(test_cluster_failover) {
  int leader = find_leader();
  ck_assert_msg(leader >= 0, "no leader in the 3-member cluster");
  /* The leader first: the client uses it, and losing it forces an election. */
  int order[3] = {leader, leader == P_A ? P_B : P_A, 0};
  order[2] = P_A + P_B + P_C - order[0] - order[1];
  char eps[256];
  snprintf(eps, sizeof(eps), "127.0.0.1:%d, 127.0.0.1:%d,127.0.0.1:%d", g_p[order[0]].cport, g_p[order[1]].cport,
           g_p[order[2]].cport);
  struct dcomm_etcd *c = client(eps, 10);
  ck_assert_int_eq(dcomm__etcd_endpoint_count(c), 3);
  struct dcomm_store *s = open_store(eps, "job-cl", 10);
  int64_t rev;
  OK(dcomm__etcd_put(c, "/t/cl/before", "1", 1, 0, &rev));
  OK(dcomm__store_set(s, "before", "b", 1));
  char url[128];
  int idx = dcomm__etcd_current_endpoint(c, url, sizeof(url));
  ck_assert_int_eq(idx, 0);
  /* A watch that must survive the loss of its member. */
  struct dcomm_etcd *cw = client(eps, 10);
  struct watch_job w = {.c = cw, .key = "/t/cl/after", .from = rev + 1, .timeout = 20};
  w.got.want = 1;
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, watch_main, &w), 0);
  sleep_s(0.3);
  ck_assert_int_eq(kill(g_p[order[idx]].pid, SIGKILL), 0); /* the member in use (and leader) */
  double t0 = now_s();
  OK(dcomm__etcd_put(c, "/t/cl/after", "2", 1, 0, NULL));
  double el = now_s() - t0;
  struct dcomm_etcd_kv kv;
  OK(dcomm__etcd_get(c, "/t/cl/after", -1, &kv, NULL));
  ck_assert_str_eq(kv.val, "2");
  dcomm__etcd_kv_clear(&kv);
  ck_assert_int_ne(dcomm__etcd_current_endpoint(c, url, sizeof(url)), 0);
  /* The store on all three endpoints too. */
  OK(dcomm__store_set(s, "after", "a", 1));
  expect_value(s, "after", "a", 1);
  expect_value(s, "before", "b", 1);
  int64_t r;
  OK(dcomm__store_add(s, "n", 3, &r));
  ck_assert_int_eq(r, 3);
  pthread_join(th, NULL);
  ck_assert_msg(w.rc == 0 && w.got.n == 1, "the watch did not survive the failover: %d %s", w.rc, w.err);
  ck_assert_str_eq(w.got.val[0], "2");
  fprintf(stderr, "check_etcd: failover put took %.2f s\n", el);
  dcomm__store_close(s);
  dcomm__etcd_destroy(cw);
  dcomm__etcd_destroy(c);
}
END_TEST

/* ---- unreachable ---- */

START_TEST(test_unreachable) {
  char eps[64];
  snprintf(eps, sizeof(eps), "127.0.0.1:%d", free_port()); /* nothing listens */
  struct dcomm_etcd *c = client(eps, 1.0);
  double t0 = now_s();
  EXPECT_RC(DCOMM_EPEERLOST, dcomm__etcd_put(c, "/k", "v", 1, 0, NULL));
  double el = now_s() - t0;
  ck_assert_msg(el > 0.8 && el < 3, "unreachable put failed after %.2f s", el);
  EXPECT_MSG("no endpoint answered");
  EXPECT_MSG(eps);
  struct collected got = {.want = 1};
  t0 = now_s();
  EXPECT_RC(DCOMM_EPEERLOST, dcomm__etcd_watch(c, "/k", 0, 0, 10, collect, &got, NULL));
  ck_assert(now_s() - t0 < 5);
  dcomm__etcd_destroy(c);
  struct dcomm_store *s = (struct dcomm_store *)1;
  t0 = now_s();
  EXPECT_RC(DCOMM_EPEERLOST, dcomm__store_etcd_open(eps, "job", 1.0, &s));
  ck_assert_ptr_null(s);
  ck_assert(now_s() - t0 < 3);
  EXPECT_MSG("etcd store at");
  /* Bad arguments. */
  EXPECT_RC(DCOMM_EINVAL, dcomm__store_etcd_open("", "job", 1.0, &s));
  EXPECT_RC(DCOMM_EINVAL, dcomm__store_etcd_open(eps, "a/b", 1.0, &s));
  struct dcomm_etcd *c2 = NULL;
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_create("unix:///x", NULL, &c2));
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_create(" , ", NULL, &c2));
}
END_TEST

/* ---- authentication ---- */

START_TEST(test_auth) {
  struct dcomm_etcd *c = client(g_ep_auth, 3);
  EXPECT_RC(DCOMM_EAUTH, dcomm__etcd_put(c, "/t/auth/k", "v", 1, 0, NULL));
  EXPECT_MSG("DCOMM_ETCD_USER");
  dcomm__etcd_destroy(c);
  struct dcomm_etcd_opts bad = {.timeout = 3, .user = "alice", .password = "wrong"};
  c = (struct dcomm_etcd *)1;
  EXPECT_RC(DCOMM_EAUTH, dcomm__etcd_create(g_ep_auth, &bad, &c));
  ck_assert_ptr_null(c);
  struct dcomm_etcd_opts good = {.timeout = 3, .user = "alice", .password = "alicepw"};
  OK(dcomm__etcd_create(g_ep_auth, &good, &c));
  int64_t rev;
  OK(dcomm__etcd_put(c, "/t/auth/k", "v", 1, 0, &rev));
  sleep_s(2.5); /* tokens live 1 s here: the next calls re-authenticate */
  struct dcomm_etcd_kv kv;
  OK(dcomm__etcd_get(c, "/t/auth/k", -1, &kv, NULL));
  ck_assert_str_eq(kv.val, "v");
  dcomm__etcd_kv_clear(&kv);
  sleep_s(2.5);
  struct collected got = {.want = 1};
  OK(dcomm__etcd_watch(c, "/t/auth/k", 0, rev, 5, collect, &got, NULL));
  ck_assert_int_eq(got.n, 1);
  dcomm__etcd_destroy(c);
  /* The store takes its credentials from the environment. */
  setenv("DCOMM_ETCD_USER", "alice", 1);
  setenv("DCOMM_ETCD_PASSWORD", "alicepw", 1);
  struct dcomm_store *s = open_store(g_ep_auth, "job-auth", 3);
  OK(dcomm__store_set(s, "x", "1", 1));
  expect_value(s, "x", "1", 1);
  dcomm__store_close(s);
  setenv("DCOMM_ETCD_PASSWORD", "nope", 1);
  EXPECT_RC(DCOMM_EAUTH, dcomm__store_etcd_open(g_ep_auth, "job-auth", 3, &s));
  unsetenv("DCOMM_ETCD_USER");
  unsetenv("DCOMM_ETCD_PASSWORD");
}
END_TEST

/* ---- TLS ---- */

START_TEST(test_tls) {
  if (!g_have_tls) {
    fprintf(stderr, "check_etcd: no openssl: TLS test skipped\n");
    return;
  }
  char ca[600], key[600];
  snprintf(ca, sizeof(ca), "%s/tls/cert.pem", g_base);
  snprintf(key, sizeof(key), "%s/tls/key.pem", g_base);
  struct dcomm_etcd_opts o = {.timeout = 3, .cacert = ca, .cert = ca, .key = key};
  struct dcomm_etcd *c = NULL;
  OK(dcomm__etcd_create(g_ep_tls, &o, &c));
  OK(dcomm__etcd_put(c, "/t/tls/k", "secure", 6, 0, NULL));
  struct dcomm_etcd_kv kv;
  OK(dcomm__etcd_get(c, "/t/tls/k", -1, &kv, NULL));
  ck_assert_str_eq(kv.val, "secure");
  dcomm__etcd_kv_clear(&kv);
  dcomm__etcd_destroy(c);
  /* Without our CA the server is not trusted. */
  struct dcomm_etcd_opts noca = {.timeout = 2};
  OK(dcomm__etcd_create(g_ep_tls, &noca, &c));
  EXPECT_RC(DCOMM_EAUTH, dcomm__etcd_put(c, "/t/tls/k", "x", 1, 0, NULL));
  EXPECT_MSG("TLS");
  dcomm__etcd_destroy(c);
  /* Without a client certificate the server refuses us. */
  struct dcomm_etcd_opts nocert = {.timeout = 1, .cacert = ca};
  OK(dcomm__etcd_create(g_ep_tls, &nocert, &c));
  ck_assert_int_lt(dcomm__etcd_put(c, "/t/tls/k", "x", 1, 0, NULL), 0);
  dcomm__etcd_destroy(c);
  /* The store through the environment. */
  char hostport[64];
  snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", g_p[P_TLS].cport); /* https implied by the TLS files */
  setenv("DCOMM_ETCD_CACERT", ca, 1);
  setenv("DCOMM_ETCD_CERT", ca, 1);
  setenv("DCOMM_ETCD_KEY", key, 1);
  struct dcomm_store *s = open_store(hostport, "job-tls", 3);
  OK(dcomm__store_set(s, "x", "1", 1));
  expect_value(s, "x", "1", 1);
  dcomm__store_close(s);
}
END_TEST

/* ---- malformed answers from a canned responder ---- */

struct responder {
  int lfd, port;
  pthread_t th;
  int stop;
  pthread_mutex_t mu;
  const char *parts[8]; /* written one after another with a pause between */
  int nparts;
  int served;
};
static struct responder g_r;

static void *responder_main(void *arg) {
  struct responder *r = arg;
  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    struct pollfd p = {r->lfd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int fd = accept(r->lfd, NULL, NULL);
    if (fd < 0) continue;
    /* Read the request: headers, then Content-Length bytes. */
    char req[65536];
    size_t n = 0;
    long clen = -1;
    char *hend = NULL;
    double dl = now_s() + 2;
    while (now_s() < dl && n < sizeof(req) - 1) {
      struct pollfd q = {fd, POLLIN, 0};
      if (poll(&q, 1, 100) <= 0) continue;
      ssize_t k = recv(fd, req + n, sizeof(req) - 1 - n, 0);
      if (k <= 0) break;
      n += (size_t)k;
      req[n] = 0;
      if (!hend && (hend = strstr(req, "\r\n\r\n"))) {
        char *cl = strcasestr(req, "Content-Length:");
        clen = cl ? strtol(cl + 15, NULL, 10) : 0;
      }
      if (hend && (long)(n - (size_t)(hend + 4 - req)) >= clen) break;
    }
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->nparts; i++) {
      if (i) sleep_s(0.05); /* separate reads on the client side */
      if (send(fd, r->parts[i], strlen(r->parts[i]), MSG_NOSIGNAL) < 0) break;
    }
    r->served++;
    pthread_mutex_unlock(&r->mu);
    close(fd);
  }
  return NULL;
}

static void responder_setup(void) {
  memset(&g_r, 0, sizeof(g_r));
  pthread_mutex_init(&g_r.mu, NULL);
  g_r.lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  ck_assert(bind(g_r.lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
  ck_assert(listen(g_r.lfd, 16) == 0);
  ck_assert(getsockname(g_r.lfd, (struct sockaddr *)&a, &l) == 0);
  g_r.port = ntohs(a.sin_port);
  ck_assert_int_eq(pthread_create(&g_r.th, NULL, responder_main, &g_r), 0);
}

static void responder_teardown(void) {
  __atomic_store_n(&g_r.stop, 1, __ATOMIC_RELEASE);
  pthread_join(g_r.th, NULL);
  close(g_r.lfd);
}

/* Canned: a complete HTTP answer with body. */
static char g_canned[8][4096];

static void answer(int status, const char *body) {
  pthread_mutex_lock(&g_r.mu);
  snprintf(g_canned[0], sizeof(g_canned[0]),
           "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
           status, strlen(body), body);
  g_r.parts[0] = g_canned[0];
  g_r.nparts = 1;
  g_r.served = 0;
  pthread_mutex_unlock(&g_r.mu);
}

/* Canned stream: chunked, each part its own chunk (and its own write);
 * end: 1 sends the last chunk, 0 just closes. */
static void stream(const char *const *parts, int n, int end) {
  pthread_mutex_lock(&g_r.mu);
  snprintf(g_canned[0], sizeof(g_canned[0]),
           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n");
  g_r.parts[0] = g_canned[0];
  for (int i = 0; i < n; i++)
    snprintf(g_canned[i + 1], sizeof(g_canned[i + 1]), "%zx\r\n%s\r\n%s", strlen(parts[i]), parts[i],
             (end && i == n - 1) ? "0\r\n\r\n" : "");
  for (int i = 0; i < n; i++) g_r.parts[i + 1] = g_canned[i + 1];
  g_r.nparts = n + 1;
  g_r.served = 0;
  pthread_mutex_unlock(&g_r.mu);
}

static void raw(const char *bytes) {
  pthread_mutex_lock(&g_r.mu);
  snprintf(g_canned[0], sizeof(g_canned[0]), "%s", bytes);
  g_r.parts[0] = g_canned[0];
  g_r.nparts = 1;
  g_r.served = 0;
  pthread_mutex_unlock(&g_r.mu);
}

static struct dcomm_etcd *responder_client(double timeout) {
  char eps[64];
  snprintf(eps, sizeof(eps), "http://127.0.0.1:%d", g_r.port);
  return client(eps, timeout);
}

#define HDR "\"header\":{\"revision\":\"7\"}"

/* Answers served so far (the responder thread counts them). */
static int served(void) {
  pthread_mutex_lock(&g_r.mu);
  int n = g_r.served;
  pthread_mutex_unlock(&g_r.mu);
  return n;
}

START_TEST(test_malformed_unary) {
  struct dcomm_etcd *c = responder_client(2);
  struct dcomm_etcd_kv kv;
  /* Truncated JSON. */
  answer(200, "{" HDR ",\"kvs\":[{\"key\":\"Zm9v\",\"val");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_get(c, "foo", -1, &kv, NULL));
  EXPECT_MSG("get");
  /* Wrong types. */
  answer(200, "{" HDR ",\"kvs\":\"Zm9v\"}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_get(c, "foo", -1, &kv, NULL));
  EXPECT_MSG("kvs");
  answer(200, "{" HDR ",\"kvs\":[{\"key\":\"Zm9v\",\"mod_revision\":true}]}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_get(c, "foo", -1, &kv, NULL));
  EXPECT_MSG("mod_revision");
  answer(200, "{\"header\":{\"revision\":\"12x\"}}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  answer(200, "{\"header\":[]}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  answer(200, "[1,2]");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  answer(200, "");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  answer(200, "{\"deleted\":{}}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_delete(c, "foo", 0, NULL));
  /* Non-base64 values and keys. */
  answer(200, "{" HDR ",\"kvs\":[{\"key\":\"Zm9v\",\"value\":\"!!not-base64!!\",\"mod_revision\":\"3\"}]}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_get(c, "foo", -1, &kv, NULL));
  EXPECT_MSG("base64");
  answer(200, "{" HDR ",\"kvs\":[{\"key\":\"Zm9\",\"mod_revision\":\"3\"}]}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_get(c, "foo", -1, &kv, NULL));
  /* An answer about another key, or several. */
  answer(200, "{" HDR ",\"kvs\":[{\"key\":\"YmFy\",\"mod_revision\":\"3\"}]}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_get(c, "foo", -1, &kv, NULL));
  /* A correct one still parses (missing value = empty). */
  answer(200, "{" HDR ",\"kvs\":[{\"key\":\"Zm9v\",\"mod_revision\":\"3\"}]}");
  OK(dcomm__etcd_get(c, "foo", -1, &kv, NULL));
  ck_assert_int_eq(kv.vlen, 0);
  ck_assert_int_eq(kv.mod_revision, 3);
  dcomm__etcd_kv_clear(&kv);
  /* Transactions and leases with missing parts. */
  int done;
  answer(200, "{" HDR "}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_create_if_absent(c, "foo", "v", 1, 0, &done, &kv));
  EXPECT_MSG("txn");
  answer(200, "{" HDR ",\"succeeded\":\"yes\"}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_cas(c, "foo", 3, "v", 1, 0, &done, &kv));
  answer(200, "{" HDR ",\"TTL\":\"5\"}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_lease_grant(c, 5, &(int64_t){0}, NULL));
  EXPECT_MSG("ID");
  answer(200, "{\"result\":{" HDR ",\"ID\":\"9\"}}");
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_lease_keepalive(c, 9, NULL)); /* TTL missing: gone */
  answer(200, "{\"result\":{" HDR ",\"ID\":\"9\",\"TTL\":\"4\"}}\n");
  int64_t ttl = 0;
  OK(dcomm__etcd_lease_keepalive(c, 9, &ttl));
  ck_assert_int_eq(ttl, 4);
  answer(200, "{\"nothing\":1}");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_lease_keepalive(c, 9, NULL));
  /* HTTP errors. */
  answer(500, "<html>internal error</html>");
  EXPECT_RC(DCOMM_EBACKEND, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  EXPECT_MSG("HTTP 500");
  answer(500, "{\"error\":\"boom\",\"message\":\"boom\",\"code\":2}");
  EXPECT_RC(DCOMM_EBACKEND, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  EXPECT_MSG("boom");
  answer(404, "{\"error\":\"etcdserver: requested lease not found\",\"code\":5}");
  EXPECT_RC(DCOMM_ENOTFOUND, dcomm__etcd_lease_revoke(c, 9));
  answer(401, "{\"error\":\"etcdserver: invalid auth token\",\"code\":16}");
  EXPECT_RC(DCOMM_EAUTH, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  answer(400, "{\"error\":\"etcdserver: key is not provided\",\"code\":3}");
  EXPECT_RC(DCOMM_EINVAL, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  answer(404, "404 page not found");
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  /* Unavailable: retried until the timeout, then lost. */
  answer(503, "{\"error\":\"etcdserver: no leader\",\"code\":14}");
  double t0 = now_s();
  EXPECT_RC(DCOMM_EPEERLOST, dcomm__etcd_put(c, "foo", "v", 1, 0, NULL));
  ck_assert(now_s() - t0 > 1.5 && now_s() - t0 < 4);
  EXPECT_MSG("no leader");
  ck_assert_int_gt(served(), 2);
  /* Not HTTP at all. */
  raw("garbage garbage garbage\r\n\r\n");
  ck_assert_int_lt(dcomm__etcd_put(c, "foo", "v", 1, 0, NULL), 0);
  /* A body cut short of its Content-Length: a lost connection. */
  raw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"header\":");
  EXPECT_RC(DCOMM_EPEERLOST, dcomm__etcd_get(c, "foo", 1.0, &kv, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

#define CREATED "{\"result\":{" HDR ",\"created\":true}}\n"
#define EV_PUT "{\"result\":{" HDR ",\"events\":[{\"kv\":{\"key\":\"Zm9v\",\"mod_revision\":\"8\",\"value\":\"YmFy\"}}]}}\n"
#define EV_DEL "{\"result\":{" HDR ",\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"Zm9v\",\"mod_revision\":\"9\"}}]}}\n"

START_TEST(test_malformed_stream) {
  struct dcomm_etcd *c = responder_client(2);
  struct collected got;
  /* Lines split across chunks at awkward places are reassembled. */
  const char *split[] = {"{\"result\":{" HDR ",\"crea", "ted\":true}}\n{\"result\":{" HDR ",\"events\":[{\"kv\":{\"ke",
                         "y\":\"Zm9v\",\"mod_revision\":\"8\",\"value\":\"YmFy\"}}]}}", "\n" EV_DEL};
  stream(split, 4, 0);
  memset(&got, 0, sizeof(got));
  got.want = 2;
  OK(dcomm__etcd_watch(c, "foo", 0, 8, 5, collect, &got, NULL));
  ck_assert_int_eq(got.n, 2);
  ck_assert_int_eq(got.type[0], DCOMM_ETCD_PUT);
  ck_assert_str_eq(got.key[0], "foo");
  ck_assert_str_eq(got.val[0], "bar");
  ck_assert_int_eq(got.rev[0], 8);
  ck_assert_int_eq(got.type[1], DCOMM_ETCD_DELETE);
  ck_assert_int_eq(got.rev[1], 9);
  /* A stream that ends cleanly in the middle of a line. */
  const char *cut[] = {CREATED, "{\"result\":{" HDR ",\"events\":[{\"kv\":"};
  stream(cut, 2, 1);
  memset(&got, 0, sizeof(got));
  got.want = 5;
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  EXPECT_MSG("middle of a line");
  /* A connection dropped mid-line: retried, then a clear error. */
  stream(cut, 2, 0);
  EXPECT_RC(DCOMM_EPEERLOST, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  EXPECT_MSG("middle of a line");
  /* Garbage lines. */
  const char *notjson[] = {CREATED, "this is not json\n"};
  stream(notjson, 2, 0);
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  const char *nocreated[] = {EV_PUT};
  stream(nocreated, 1, 0);
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  EXPECT_MSG("created");
  const char *badev[] = {CREATED, "{\"result\":{\"events\":[{\"type\":\"EXPLODE\",\"kv\":{\"key\":\"Zm9v\"}}]}}\n"};
  stream(badev, 2, 0);
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  const char *badb64[] = {CREATED, "{\"result\":{\"events\":[{\"kv\":{\"key\":\"Zm9v\",\"value\":\"%%%\",\"mod_revision\":\"3\"}}]}}\n"};
  stream(badb64, 2, 0);
  EXPECT_RC(DCOMM_EPROTO, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  EXPECT_MSG("base64");
  const char *canceled[] = {CREATED, "{\"result\":{\"canceled\":true,\"cancel_reason\":\"mvcc: something\"}}\n"};
  stream(canceled, 2, 0);
  EXPECT_RC(DCOMM_EBACKEND, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  EXPECT_MSG("mvcc: something");
  const char *streamerr[] = {"{\"error\":{\"grpc_code\":7,\"http_code\":403,\"message\":\"permission denied\"}}\n"};
  stream(streamerr, 1, 0);
  EXPECT_RC(DCOMM_EAUTH, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  answer(500, "oops");
  EXPECT_RC(DCOMM_EBACKEND, dcomm__etcd_watch(c, "foo", 0, 0, 5, collect, &got, NULL));
  /* A quiet stream honours its timeout. */
  const char *quiet[] = {CREATED};
  stream(quiet, 1, 0);
  EXPECT_RC(DCOMM_ETIMEDOUT, dcomm__etcd_watch(c, "foo", 0, 0, 0.02, collect, &got, NULL));
  dcomm__etcd_destroy(c);
}
END_TEST

/* ---- suite ---- */

/* Runs in each forked test: it dies with the runner, as the servers do. */
static void child_setup(void) { prctl(PR_SET_PDEATHSIG, SIGKILL); }

static Suite *etcd_suite(void) {
  Suite *s = suite_create("etcd");
  TCase *tc = tcase_create("kv");
  tcase_add_checked_fixture(tc, child_setup, NULL);
  tcase_set_timeout(tc, 20);
  tcase_add_test(tc, test_kv_roundtrip);
  tcase_add_test(tc, test_txn);
  tcase_add_test(tc, test_txn_compares);
  tcase_add_test(tc, test_txn_lease_fencing);
  tcase_add_test(tc, test_lease_revoke);
  tcase_add_test(tc, test_lease_expiry);
  tcase_add_test(tc, test_lease_keepalive);
  tcase_add_test(tc, test_watch_events);
  tcase_add_test(tc, test_watch_cancel_and_timeout);
  tcase_add_test(tc, test_watch_compacted);
  suite_add_tcase(s, tc);
  TCase *ts = tcase_create("store");
  tcase_add_checked_fixture(ts, child_setup, NULL);
  tcase_set_timeout(ts, 30);
  tcase_add_test(ts, test_store_namespace);
  tcase_add_test(ts, test_store_get_same_handle);
  tcase_add_test(ts, test_store_txn_namespace);
  suite_add_tcase(s, ts);
  /* The conformance cases, each in a fresh job namespace. */
  TCase *tsc = tcase_create("conformance-etcd");
  tcase_add_checked_fixture(tsc, conf_etcd_setup, conf_etcd_teardown);
  tcase_set_timeout(tsc, 30);
  store_conformance_add(tsc, &etcd_factory);
  suite_add_tcase(s, tsc);
  TCase *tf = tcase_create("faults");
  tcase_add_checked_fixture(tf, child_setup, NULL);
  tcase_set_timeout(tf, 30);
  tcase_add_test(tf, test_unreachable);
  tcase_add_test(tf, test_auth);
  tcase_add_test(tf, test_tls);
  tcase_add_test(tf, test_cluster_failover); /* kills a member: keep last of the real-etcd tests */
  suite_add_tcase(s, tf);
  TCase *tm = tcase_create("malformed");
  tcase_add_checked_fixture(tm, child_setup, NULL);
  tcase_set_timeout(tm, 30);
  tcase_add_checked_fixture(tm, responder_setup, responder_teardown);
  tcase_add_test(tm, test_malformed_unary);
  tcase_add_test(tm, test_malformed_stream);
  suite_add_tcase(s, tm);
  return s;
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!etcd_in_path()) {
    printf("check_etcd: SKIP: no 'etcd' binary in PATH (apt-get install etcd-server)\n");
    return 77;
  }
  g_owner = getpid();
  snprintf(g_base, sizeof(g_base), "%s/check_etcd.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_base)) {
    perror("mkdtemp");
    return 1;
  }
  atexit(stop_all);
  int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT, SIGSEGV};
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) signal(sigs[i], on_signal);
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  dcomm__log_setup();
  char cmd[1400];
  snprintf(cmd, sizeof(cmd),
           "command -v openssl >/dev/null 2>&1 && mkdir -p '%s/tls' && openssl req -x509 -newkey ec -pkeyopt "
           "ec_paramgen_curve:prime256v1 -nodes -keyout '%s/tls/key.pem' -out '%s/tls/cert.pem' -days 2 "
           "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1",
           g_base, g_base, g_base);
  g_have_tls = system(cmd) == 0;
  double t0 = now_s();
  start_all();
  printf("check_etcd: %d etcd servers up in %.1f s under %s\n", g_have_tls ? 6 : 5, now_s() - t0, g_base);
  /* Check answers SIGINT/SIGTERM by signalling its whole process group, so
   * the runner gets a group of its own; this process keeps the servers and
   * its handlers, and the runner dies with it. */
  fflush(stdout);
  pid_t runner = fork();
  if (runner < 0) {
    perror("fork");
    return 1;
  }
  if (runner == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setpgid(0, 0);
    SRunner *sr = srunner_create(etcd_suite());
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists every test */
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    exit(failed != 0);
  }
  int st = 0;
  while (waitpid(runner, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st)) fprintf(stderr, "check_etcd: the test runner died (status %d)\n", st);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
