/*
 * run_status.c: the operator's side of dcomm-run.
 *
 *   dcomm-run status --rdzv-endpoint HOST:PORT --rdzv-id ID [--token T] [--json]
 *   dcomm-run status --rdzv-backend etcd --rdzv-endpoint H1:P1,... --rdzv-id ID [--json]
 *   dcomm-run clean --rdzv-backend etcd --rdzv-endpoint H1:P1,... --rdzv-id ID [--force]
 *
 * status reads a running job's keys (keys.h) and prints its generation,
 * world size, the members of each node (node slot, host, pids), their
 * heartbeat ages and the last committed checkpoint (ckpt/last). With the
 * static backend it connects to the agent's store with the job's token
 * (--token or DCOMM_AUTH_TOKEN, which the agent then must have been given);
 * with etcd it reads the job's prefix in one range request. It only reads.
 *
 * A heartbeat holds its writer's CLOCK_MONOTONIC: its age is exact for
 * members of this host (the static backend, or a node whose record names
 * this host); for other hosts status reads the heartbeats again after
 * SAMPLE_S and says whether they moved.
 *
 * clean removes a dead etcd job's keys (every key under /dcomm/<id>/); it
 * refuses while a node record of the job exists (their leases are alive)
 * unless --force.
 */
#include "config.h"
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "etcd_client.h"
#include "keys.h"
#include "param.h"
#include "sock.h"
#include "store.h"

#define SAMPLE_S 1.0
#define MAX_SLOTS 1024

struct st_args {
  int etcd, json, force;
  const char *endpoint, *id, *token;
};

static const char status_usage[] =
    "usage: dcomm-run status [--rdzv-backend static|etcd] --rdzv-endpoint ENDPOINT --rdzv-id ID\n"
    "                        [--token TOKEN] [--json]\n"
    "       dcomm-run clean --rdzv-backend etcd --rdzv-endpoint H1:P1[,H2:P2...] --rdzv-id ID [--force]\n"
    "\n"
    "status: a running job's generation, world size, members per node, heartbeat\n"
    "ages and last committed checkpoint. static: the agent's store endpoint and the\n"
    "job's token (--token or DCOMM_AUTH_TOKEN, as given to the agent); etcd: the\n"
    "etcd endpoints. clean: removes the keys of a dead etcd job (refused while its\n"
    "nodes' leases are alive, unless --force).\n";

static int parse(int argc, char **argv, struct st_args *a, int clean) {
  memset(a, 0, sizeof(*a));
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *eq = strchr(o, '=');
    char name[32];
    size_t nl = eq ? (size_t)(eq - o) : strlen(o);
    if (nl >= sizeof(name)) nl = sizeof(name) - 1;
    for (size_t k = 0; k < nl; k++) name[k] = o[k] == '_' ? '-' : o[k];
    name[nl] = 0;
    if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
      fputs(status_usage, stdout);
      return 0;
    }
    if (!strcmp(name, "--json") && !clean) {
      a->json = 1;
      continue;
    }
    if (!strcmp(name, "--force") && clean) {
      a->force = 1;
      continue;
    }
    const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
    if (!v || !*v) {
      fprintf(stderr, "dcomm-run: option '%s' needs a value\n%s", o, status_usage);
      return 2;
    }
    if (!strcmp(name, "--rdzv-backend")) {
      if (!strcmp(v, "etcd")) a->etcd = 1;
      else if (!strcmp(v, "static")) a->etcd = 0;
      else {
        fprintf(stderr, "dcomm-run: --rdzv-backend '%s': expected static or etcd\n", v);
        return 2;
      }
    } else if (!strcmp(name, "--rdzv-endpoint")) {
      a->endpoint = v;
    } else if (!strcmp(name, "--rdzv-id")) {
      a->id = v;
    } else if (!strcmp(name, "--token") && !clean) {
      a->token = v;
    } else {
      fprintf(stderr, "dcomm-run: unknown option '%s'\n%s", o, status_usage);
      return 2;
    }
  }
  if (!a->endpoint || !a->id) {
    fprintf(stderr, "dcomm-run: %s needs --rdzv-endpoint and --rdzv-id\n%s", clean ? "clean" : "status", status_usage);
    return 2;
  }
  if (clean && !a->etcd) {
    fprintf(stderr, "dcomm-run: clean is for etcd jobs (--rdzv-backend etcd); a static job's store goes with its agent\n");
    return 2;
  }
  if (strlen(a->id) > 255) {
    fprintf(stderr, "dcomm-run: --rdzv-id is longer than 255 characters\n");
    return 2;
  }
  return -1;
}

/* ---- where the keys come from ---- */

struct src {
  struct dcomm_store *st;  /* static: the agent's store */
  struct dcomm_etcd *ec;   /* etcd */
  struct dcomm_etcd_kv *kvs;
  size_t n;
  char ns[300]; /* "/dcomm/<id>/" */
};

/* 1 found (NUL-terminated, cut to n - 1), 0 absent, -1 error. */
static int src_get(struct src *s, const char *key, char *buf, size_t n) {
  if (s->st) {
    int rc = dcomm__store_peek(s->st, key, buf, n);
    return rc < 0 ? -1 : rc;
  }
  size_t pl = strlen(s->ns);
  for (size_t i = 0; i < s->n; i++)
    if (s->kvs[i].klen == pl + strlen(key) && !memcmp(s->kvs[i].key, s->ns, pl) && !strcmp(s->kvs[i].key + pl, key)) {
      size_t l = s->kvs[i].vlen < n ? s->kvs[i].vlen : n - 1;
      memcpy(buf, s->kvs[i].val, l);
      buf[l] = 0;
      return 1;
    }
  return 0;
}

static int etcd_open(const struct st_args *a, struct dcomm_etcd **ec) {
  struct dcomm_etcd_opts eo;
  memset(&eo, 0, sizeof(eo));
  eo.timeout = dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT);
  eo.user = dcomm__param_str(DCOMM_P_ETCD_USER);
  eo.password = dcomm__param_str(DCOMM_P_ETCD_PASSWORD);
  eo.cacert = dcomm__param_str(DCOMM_P_ETCD_CACERT);
  eo.cert = dcomm__param_str(DCOMM_P_ETCD_CERT);
  eo.key = dcomm__param_str(DCOMM_P_ETCD_KEY);
  return dcomm__etcd_create(a->endpoint, &eo, ec);
}

/* HOST:PORT or [V6]:PORT. */
static int split_endpoint(const char *ep, char *host, size_t hn, int *port) {
  const char *colon;
  if (*ep == '[') {
    const char *close = strchr(ep, ']');
    if (!close || close[1] != ':' || (size_t)(close - ep - 1) >= hn) return -1;
    snprintf(host, hn, "%.*s", (int)(close - ep - 1), ep + 1);
    colon = close + 1;
  } else {
    colon = strrchr(ep, ':');
    if (!colon || (size_t)(colon - ep) >= hn || colon == ep) return -1;
    snprintf(host, hn, "%.*s", (int)(colon - ep), ep);
  }
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (*end || p <= 0 || p > 65535) return -1;
  *port = (int)p;
  return 0;
}

/* ---- status ---- */

struct member {
  int slot, rank, local_rank, plan_rank;
  long pid;
  char id[40], hb[64];
  int local;   /* its heartbeat can be compared with this host's clock */
  double age;  /* local: seconds since its last heartbeat; -1: none */
  int moved;   /* not local: its heartbeat changed within SAMPLE_S */
};

struct node {
  int slot, live, nproc;
  long agent_pid;
  char host[128];
  size_t first, count; /* its members in the member array */
};

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static int fetch(struct src *s, const struct st_args *a) {
  if (s->ec) {
    dcomm__etcd_kvs_free(s->kvs, s->n);
    s->kvs = NULL;
    s->n = 0;
    return dcomm__etcd_range_prefix(s->ec, s->ns, &s->kvs, &s->n, NULL);
  }
  (void)a;
  return 0;
}

static int do_status(const struct st_args *a, struct src *s) {
  char buf[4096], key[128], myhost[128];
  if (gethostname(myhost, sizeof(myhost)) != 0) myhost[0] = 0;
  myhost[sizeof(myhost) - 1] = 0;
  DCOMM_CHECK(fetch(s, a));
  long slots = 0, gen = -1;
  if (src_get(s, DCOMM_KEY_AGENTS_N, buf, sizeof(buf)) == 1) slots = strtol(buf, NULL, 10);
  if (slots <= 0)
    return dcomm__err(DCOMM_ENOTFOUND, "no job '%s' at %s (no node has registered under that id)", a->id, a->endpoint);
  if (slots >= MAX_SLOTS) slots = MAX_SLOTS - 1;
  if (src_get(s, DCOMM_KEY_GEN, buf, sizeof(buf)) == 1) gen = strtol(buf, NULL, 10);
  int done = src_get(s, DCOMM_KEY_DONE, buf, sizeof(buf)) == 1;
  int min_nodes = 0, max_nodes = 0;
  if (src_get(s, DCOMM_KEY_NNODES, buf, sizeof(buf)) == 1) sscanf(buf, "%d %d", &min_nodes, &max_nodes);
  unsigned long long ck_step = 0;
  long long ck_gen = 0;
  char ck_name[64] = "";
  int have_ck = src_get(s, DCOMM_KEY_CKPT_LAST, buf, sizeof(buf)) == 1 &&
                dcomm__ckpt_last_parse(buf, &ck_step, &ck_gen, ck_name, sizeof(ck_name)) == 0;
  /* The plan of the current generation: its members in rank order. */
  char *plan = NULL;
  int world = -1;
  if (gen >= 0) {
    snprintf(key, sizeof(key), DCOMM_KEY_PLAN_FMT, gen);
    size_t cap = 65536;
    plan = malloc(cap);
    if (plan && src_get(s, key, plan, cap) == 1) world = atoi(plan);
    else {
      free(plan);
      plan = NULL;
    }
  }
  struct node *nodes = calloc((size_t)slots + 1, sizeof(*nodes));
  size_t nn = 0, nm = 0, capm = 64;
  struct member *ms = malloc(capm * sizeof(*ms));
  if (!nodes || !ms) {
    free(nodes);
    free(ms);
    free(plan);
    return dcomm__err(DCOMM_ENOMEM, "out of memory");
  }
  char *list = malloc(65536);
  int need_sample = 0, live_sum = 0;
  for (long sl = 1; sl <= slots && list; sl++) {
    snprintf(key, sizeof(key), DCOMM_KEY_AGENT_FMT, sl);
    if (src_get(s, key, buf, sizeof(buf)) != 1) continue; /* gone or left */
    struct node *nd = &nodes[nn++];
    nd->slot = (int)sl;
    if (sscanf(buf, "%d %d %127s %ld", &nd->live, &nd->nproc, nd->host, &nd->agent_pid) != 4) snprintf(nd->host, sizeof(nd->host), "?");
    live_sum += nd->live;
    nd->first = nm;
    snprintf(key, sizeof(key), DCOMM_KEY_WORKERS_FMT, sl);
    if (src_get(s, key, list, 65536) != 1) continue;
    char *save = NULL;
    for (char *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      if (nm == capm) {
        struct member *nv = realloc(ms, 2 * capm * sizeof(*ms));
        if (!nv) break;
        ms = nv;
        capm *= 2;
      }
      struct member *m = &ms[nm];
      memset(m, 0, sizeof(*m));
      if (dcomm__worker_line_parse(line, &m->rank, &m->local_rank, &m->pid, m->id) < 0) continue;
      m->slot = (int)sl;
      m->plan_rank = -1;
      if (plan) {
        int i = 0;
        char *ps = NULL, *pc = strdup(plan);
        for (char *l = pc ? strtok_r(pc, "\n", &ps) : NULL; l; l = strtok_r(NULL, "\n", &ps), i++)
          if (i > 0 && !strcmp(l, m->id)) m->plan_rank = i - 1;
        free(pc);
      } else {
        m->plan_rank = m->rank; /* a world not formed by rounds: the launch ranks */
      }
      snprintf(key, sizeof(key), DCOMM_KEY_HB_FMT, m->id);
      if (src_get(s, key, m->hb, sizeof(m->hb)) != 1) m->hb[0] = 0;
      m->local = s->st != NULL || !strcmp(nd->host, myhost);
      m->age = -1;
      if (m->local && m->hb[0]) {
        m->age = dcomm__now() - strtod(m->hb, NULL);
        if (m->age < 0) m->age = 0;
      }
      if (!m->local) need_sample = 1;
      nm++;
      nd->count++;
    }
  }
  free(list);
  if (need_sample) { /* other hosts: do their heartbeats still move? */
    struct timespec ts = {(time_t)SAMPLE_S, (long)((SAMPLE_S - (double)(time_t)SAMPLE_S) * 1e9)};
    nanosleep(&ts, NULL);
    if (fetch(s, a) == 0)
      for (size_t i = 0; i < nm; i++) {
        char hb[64] = "";
        snprintf(key, sizeof(key), DCOMM_KEY_HB_FMT, ms[i].id);
        if (!ms[i].local && src_get(s, key, hb, sizeof(hb)) == 1) ms[i].moved = strcmp(hb, ms[i].hb) != 0;
      }
  }
  if (world < 0) world = live_sum;
  const char *backend = s->ec ? "etcd" : "static";
  if (a->json) {
    printf("{\"job\":");
    json_str(a->id);
    printf(",\"backend\":\"%s\",\"endpoint\":", backend);
    json_str(a->endpoint);
    printf(",\"generation\":%ld,\"world_size\":%d,\"finished\":%s", gen, world, done ? "true" : "false");
    if (max_nodes > 0) printf(",\"nnodes\":{\"min\":%d,\"max\":%d}", min_nodes, max_nodes);
    if (have_ck) {
      printf(",\"checkpoint\":{\"step\":%llu,\"generation\":%lld,\"file\":", ck_step, ck_gen);
      json_str(ck_name);
      printf("}");
    } else {
      printf(",\"checkpoint\":null");
    }
    printf(",\"nodes\":[");
    for (size_t k = 0; k < nn; k++) {
      struct node *nd = &nodes[k];
      printf("%s{\"slot\":%d,\"host\":", k ? "," : "", nd->slot);
      json_str(nd->host);
      printf(",\"agent_pid\":%ld,\"live\":%d,\"nproc\":%d,\"members\":[", nd->agent_pid, nd->live, nd->nproc);
      for (size_t i = 0; i < nd->count; i++) {
        struct member *m = &ms[nd->first + i];
        printf("%s{\"member\":\"%s\",\"rank\":%d,\"launch_rank\":%d,\"local_rank\":%d,\"pid\":%ld,\"in_world\":%s,",
               i ? "," : "", m->id, m->plan_rank, m->rank, m->local_rank, m->pid, m->plan_rank >= 0 ? "true" : "false");
        if (m->local && m->age >= 0) printf("\"heartbeat_age\":%.3f}", m->age);
        else if (m->local) printf("\"heartbeat_age\":null}");
        else printf("\"heartbeat_age\":null,\"heartbeat_moved_within\":%s}", m->moved ? "1.0" : "null");
      }
      printf("]}");
    }
    printf("]}\n");
  } else {
    printf("job %s (%s %s): ", a->id, backend, a->endpoint);
    if (gen < 0) printf("no world formed yet");
    else printf("generation %ld, world size %d", gen, world);
    if (max_nodes > 0) printf(", %zu node%s (--nnodes %d:%d)", nn, nn == 1 ? "" : "s", min_nodes, max_nodes);
    printf("%s\n", done ? ", finished" : "");
    if (have_ck) printf("last checkpoint: step %llu (generation %lld), %s\n", ck_step, ck_gen, ck_name);
    else printf("last checkpoint: none committed\n");
    for (size_t k = 0; k < nn; k++) {
      struct node *nd = &nodes[k];
      printf("node slot %d: host %s, agent pid %ld, %d of %d workers live\n", nd->slot, nd->host, nd->agent_pid,
             nd->live, nd->nproc);
      for (size_t i = 0; i < nd->count; i++) {
        struct member *m = &ms[nd->first + i];
        if (m->plan_rank >= 0) printf("  rank %-4d", m->plan_rank);
        else printf("  waiting  ");
        printf(" pid %-7ld member %s  ", m->pid, m->id);
        if (m->local && m->age >= 0) printf("heartbeat %.1f s ago\n", m->age);
        else if (m->local) printf("no heartbeat yet\n");
        else if (!m->hb[0]) printf("no heartbeat yet\n");
        else if (m->moved) printf("heartbeat moved within %.1f s\n", SAMPLE_S);
        else printf("heartbeat unchanged for %.1f s\n", SAMPLE_S);
      }
    }
  }
  free(plan);
  free(nodes);
  free(ms);
  return 0;
}

static int open_src(const struct st_args *a, struct src *s) {
  memset(s, 0, sizeof(*s));
  snprintf(s->ns, sizeof(s->ns), "/dcomm/%s/", a->id);
  if (a->etcd) return etcd_open(a, &s->ec);
  char host[256];
  int port = 0;
  if (split_endpoint(a->endpoint, host, sizeof(host), &port) < 0)
    return dcomm__err(DCOMM_EINVAL, "--rdzv-endpoint '%s': expected HOST:PORT (the agent's store)", a->endpoint);
  const char *tok = a->token ? a->token : dcomm__param_str(DCOMM_P_AUTH_TOKEN);
  if (!tok || !*tok)
    return dcomm__err(DCOMM_EINVAL, "the static backend needs the job's token: --token or DCOMM_AUTH_TOKEN (start the "
                      "agent with DCOMM_AUTH_TOKEN set to know it)");
  double t = dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT);
  DCOMM_CHECK(dcomm__store_tcp_connect(host, port, a->id, tok, t, t, &s->st));
  return dcomm__store_set_prefix(s->st, "");
}

static void close_src(struct src *s) {
  if (s->st) dcomm__store_close(s->st);
  dcomm__etcd_kvs_free(s->kvs, s->n);
  dcomm__etcd_destroy(s->ec);
}

int run_status_main(int argc, char **argv) {
  struct st_args a;
  int rc = parse(argc, argv, &a, 0);
  if (rc >= 0) return rc;
  if (dcomm__params_load() < 0) fprintf(stderr, "dcomm-run: warning: %s (using the default)\n", dcomm_last_error());
  struct src s;
  rc = open_src(&a, &s);
  if (rc == 0) rc = do_status(&a, &s);
  close_src(&s);
  if (rc < 0) {
    fprintf(stderr, "dcomm-run: status of job '%s' at %s: %s\n", a.id, a.endpoint, dcomm_last_error());
    return 1;
  }
  return 0;
}

int run_clean_main(int argc, char **argv) {
  struct st_args a;
  int rc = parse(argc, argv, &a, 1);
  if (rc >= 0) return rc;
  if (dcomm__params_load() < 0) fprintf(stderr, "dcomm-run: warning: %s (using the default)\n", dcomm_last_error());
  struct src s;
  rc = open_src(&a, &s);
  char prefix[400];
  snprintf(prefix, sizeof(prefix), "%s" DCOMM_KEY_AGENT_PREFIX, s.ns);
  struct dcomm_etcd_kv *kvs = NULL;
  size_t n = 0;
  if (rc == 0) rc = dcomm__etcd_range_prefix(s.ec, prefix, &kvs, &n, NULL);
  if (rc == 0 && n > 0 && !a.force) {
    fprintf(stderr, "dcomm-run: job '%s' still has %zu live node%s (their etcd leases are alive; a dead node's lease "
            "ends within DCOMM_RDZV_TTL seconds); not cleaning (--force removes the keys anyway, and the live nodes "
            "then leave the job)\n", a.id, n, n == 1 ? "" : "s");
    dcomm__etcd_kvs_free(kvs, n);
    close_src(&s);
    return 1;
  }
  dcomm__etcd_kvs_free(kvs, n);
  int64_t deleted = 0;
  if (rc == 0) rc = dcomm__etcd_delete(s.ec, s.ns, 1, &deleted);
  close_src(&s);
  if (rc < 0) {
    fprintf(stderr, "dcomm-run: clean of job '%s' at %s: %s\n", a.id, a.endpoint, dcomm_last_error());
    return 1;
  }
  printf("dcomm-run: removed %lld key%s of job '%s'\n", (long long)deleted, deleted == 1 ? "" : "s", a.id);
  return 0;
}
