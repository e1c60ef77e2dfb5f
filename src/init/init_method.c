/*
 * init_method.c: parsing of init-method URLs and torchrun's environment
 * variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT), srun's (slurm://), etcd:// and the detection of the launcher.
 */
#include "config.h"
#include "init_method.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "param.h"
#include "etcd_client.h"
#include "pmix_boot.h"
#include "slurm_env.h"

/* Reads an integer variable; absent leaves *out and returns 0 (present=0). */
static int env_int(const char *name, int *out, int *present) {
  const char *v = getenv(name);
  long l;
  *present = 0;
  if (!v) return 0;
  if (dcomm__parse_long(v, &l) || l < -1 || l > 1 << 24)
    return dcomm__err(DCOMM_EINVAL, "%s='%s' is not a valid integer", name, v);
  *out = (int)l;
  *present = 1;
  return 0;
}

/* Finds "name=" in a query string; copies the value. 1 found, 0 not. */
static int query_get(const char *query, const char *name, char *buf, size_t len) {
  size_t nl = strlen(name);
  for (const char *p = query; p && *p;) {
    const char *amp = strchr(p, '&');
    size_t seg = amp ? (size_t)(amp - p) : strlen(p);
    if (seg > nl && !strncmp(p, name, nl) && p[nl] == '=') {
      size_t vl = seg - nl - 1;
      if (vl >= len) vl = len - 1;
      memcpy(buf, p + nl + 1, vl);
      buf[vl] = 0;
      return 1;
    }
    p = amp ? amp + 1 : NULL;
  }
  return 0;
}

static int query_int(const char *query, const char *name, const char *url, int *out, int *present) {
  char v[64];
  long l;
  *present = 0;
  if (!query_get(query, name, v, sizeof(v))) return 0;
  if (dcomm__parse_long(v, &l) || l < 0 || l > 1 << 24)
    return dcomm__err(DCOMM_EINVAL, "init method '%s': %s='%s' is not a valid integer", url, name, v);
  *out = (int)l;
  *present = 1;
  return 0;
}

static int parse_port(const char *s, const char *what, int *port) {
  long l;
  if (dcomm__parse_long(s, &l) || l < 1 || l > 65535)
    return dcomm__err(DCOMM_EINVAL, "%s='%s' is not a port number (1-65535)", what, s);
  *port = (int)l;
  return 0;
}

/* Fills local rank/size from LOCAL_RANK / LOCAL_WORLD_SIZE (defaults: one
 * host, so local = global) and checks every value against the others. */
static int finish(struct dcomm_init_spec *s, const char *src) {
  int present;
  /* A joiner's rank comes from the next generation's plan, not from RANK. */
  s->join = dcomm__param_bool(DCOMM_P_ELASTIC_JOIN);
  if (s->join) s->rank = 0;
  s->local_rank = s->rank;
  s->local_size = s->world_size;
  DCOMM_CHECK(env_int("LOCAL_WORLD_SIZE", &s->local_size, &present));
  int lws_present = present;
  DCOMM_CHECK(env_int("LOCAL_RANK", &s->local_rank, &present));
  if (!present && lws_present && s->local_size > 0) s->local_rank = s->rank % s->local_size;
  if (s->world_size < 1) return dcomm__err(DCOMM_EINVAL, "%s: world size %d must be at least 1", src, s->world_size);
  if (s->rank < 0 || s->rank >= s->world_size)
    return dcomm__err(DCOMM_EINVAL, "%s: rank %d is not in [0, world size %d)", src, s->rank, s->world_size);
  if (s->local_size < 1 || s->local_size > s->world_size)
    return dcomm__err(DCOMM_EINVAL, "LOCAL_WORLD_SIZE=%d contradicts WORLD_SIZE=%d", s->local_size, s->world_size);
  if (s->local_rank < 0 || s->local_rank >= s->local_size)
    return dcomm__err(DCOMM_EINVAL, "LOCAL_RANK=%d is not in [0, LOCAL_WORLD_SIZE=%d)", s->local_rank, s->local_size);
  s->agent_store = dcomm__param_bool(DCOMM_P_USE_AGENT_STORE);
  return 0;
}

static int parse_hostport(struct dcomm_init_spec *s, const char *hp, size_t hl, const char *what);

/* What env:// users are told to do when a variable is missing. */
#define ENV_HINT                                                                                                      \
  " (set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE on every rank, or start the program with "                    \
  "dcomm-run --nproc-per-node N, which sets them)"

static int parse_env(struct dcomm_init_spec *s) {
  int present;
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (!addr || !*addr)
    return dcomm__err(DCOMM_EINVAL, "env:// needs MASTER_ADDR (the store host), which is not set" ENV_HINT);
  if (!port || !*port) return dcomm__err(DCOMM_EINVAL, "env:// needs MASTER_PORT, which is not set" ENV_HINT);
  if (strlen(addr) >= sizeof(s->host)) return dcomm__err(DCOMM_EINVAL, "MASTER_ADDR is too long");
  snprintf(s->host, sizeof(s->host), "%s", addr);
  DCOMM_CHECK(parse_port(port, "MASTER_PORT", &s->port));
  DCOMM_CHECK(env_int("RANK", &s->rank, &present));
  if (!present) return dcomm__err(DCOMM_EINVAL, "env:// needs RANK, which is not set" ENV_HINT);
  DCOMM_CHECK(env_int("WORLD_SIZE", &s->world_size, &present));
  if (!present) return dcomm__err(DCOMM_EINVAL, "env:// needs WORLD_SIZE, which is not set" ENV_HINT);
  DCOMM_CHECK(finish(s, "env://"));
  /* dcomm-run keeps MASTER_PORT free for the program's own use (torch's
   * store) and names its store here. */
  const char *agent = dcomm__param_str(DCOMM_P_AGENT_STORE);
  if (s->agent_store && agent && *agent) DCOMM_CHECK(parse_hostport(s, agent, strlen(agent), "DCOMM_AGENT_STORE"));
  return 0;
}

/* rank and world_size from the query, else from RANK / WORLD_SIZE. */
static int query_rank_size(struct dcomm_init_spec *s, const char *query, const char *url) {
  int present;
  DCOMM_CHECK(query_int(query, "rank", url, &s->rank, &present));
  if (!present) {
    DCOMM_CHECK(env_int("RANK", &s->rank, &present));
    if (!present) return dcomm__err(DCOMM_EINVAL, "init method '%s' needs ?rank=R (or RANK)", url);
  }
  DCOMM_CHECK(query_int(query, "world_size", url, &s->world_size, &present));
  if (!present) {
    DCOMM_CHECK(env_int("WORLD_SIZE", &s->world_size, &present));
    if (!present) return dcomm__err(DCOMM_EINVAL, "init method '%s' needs &world_size=N (or WORLD_SIZE)", url);
  }
  return 0;
}

/* host:port or [v6]:port (hl bytes of hp) into s->host / s->port; what
 * names the source in messages. */
static int parse_hostport(struct dcomm_init_spec *s, const char *hp, size_t hl, const char *what) {
  char hostport[300];
  if (hl == 0 || hl >= sizeof(hostport)) return dcomm__err(DCOMM_EINVAL, "%s: expected host:port", what);
  memcpy(hostport, hp, hl);
  hostport[hl] = 0;
  char *colon = strrchr(hostport, ':');
  if (!colon) return dcomm__err(DCOMM_EINVAL, "%s: missing :port", what);
  *colon = 0;
  char *h = hostport;
  if (*h == '[') { /* [v6]:port */
    h++;
    size_t l = strlen(h);
    if (l && h[l - 1] == ']') h[l - 1] = 0;
  }
  if (!*h) return dcomm__err(DCOMM_EINVAL, "%s: missing host", what);
  if (strlen(h) >= sizeof(s->host)) return dcomm__err(DCOMM_EINVAL, "%s: host name too long", what);
  memcpy(s->host, h, strlen(h) + 1);
  return parse_port(colon + 1, what, &s->port);
}

static int parse_tcp(struct dcomm_init_spec *s, const char *url) {
  const char *hp = url + strlen("tcp://");
  const char *q = strchr(hp, '?');
  char what[320];
  snprintf(what, sizeof(what), "init method '%s'", url);
  DCOMM_CHECK(parse_hostport(s, hp, q ? (size_t)(q - hp) : strlen(hp), what));
  DCOMM_CHECK(query_rank_size(s, q ? q + 1 : "", url));
  return finish(s, url);
}

static int parse_file(struct dcomm_init_spec *s, const char *url) {
  const char *p = url + strlen("file://");
  const char *q = strchr(p, '?');
  size_t pl = q ? (size_t)(q - p) : strlen(p);
  if (pl == 0 || p[0] != '/') return dcomm__err(DCOMM_EINVAL, "init method '%s': expected file:///absolute/path", url);
  if (pl >= sizeof(s->path)) return dcomm__err(DCOMM_EINVAL, "init method '%s': path too long", url);
  memcpy(s->path, p, pl);
  s->path[pl] = 0;
  DCOMM_CHECK(query_rank_size(s, q ? q + 1 : "", url));
  return finish(s, url);
}

/* slurm://: everything from srun's variables; rank 0 hosts the store on
 * the first node of the step. */
static int parse_slurm(struct dcomm_init_spec *s) {
  DCOMM_CHECK(dcomm__slurm_spec(&s->rank, &s->world_size, &s->local_rank, &s->local_size, s->host, sizeof(s->host),
                                &s->port));
  s->agent_store = 0;
  return 0;
}

/* etcd://h1:p1,h2:p2[?rank=R&world_size=N]: the store lives in etcd. */
static int parse_etcd(struct dcomm_init_spec *s, const char *url) {
  const char *p = url + strlen("etcd://");
  const char *q = strchr(p, '?');
  size_t pl = q ? (size_t)(q - p) : strlen(p);
  if (pl == 0) return dcomm__err(DCOMM_EINVAL, "init method '%s': expected etcd://host:port[,host:port...]", url);
  if (pl >= sizeof(s->path)) return dcomm__err(DCOMM_EINVAL, "init method '%s': endpoint list too long", url);
  memcpy(s->path, p, pl);
  s->path[pl] = 0;
  /* The first endpoint's host: the peers listen on the address that reaches it. */
  const char *h = s->path;
  if (!strncmp(h, "http://", 7)) h += 7;
  else if (!strncmp(h, "https://", 8)) h += 8;
  size_t hl = strcspn(h, ",");
  if (hl >= sizeof(s->host)) return dcomm__err(DCOMM_EINVAL, "init method '%s': host name too long", url);
  memcpy(s->host, h, hl);
  s->host[hl] = 0;
  char *colon = *s->host == '[' ? strstr(s->host, "]:") : strrchr(s->host, ':');
  if (!colon) return dcomm__err(DCOMM_EINVAL, "init method '%s': endpoint '%s' has no :port", url, s->host);
  if (*colon == ']') *colon++ = 0;
  *colon = 0;
  DCOMM_CHECK(parse_port(colon + 1, "etcd:// port", &s->port));
  if (*s->host == '[') memmove(s->host, s->host + 1, strlen(s->host));
  s->agent_store = 1; /* nobody hosts a store: etcd is the store */
  int rp, wp;
  char v[64];
  const char *query = q ? q + 1 : "";
  if (query_get(query, "rank", v, sizeof(v)) || getenv("RANK")) {
    DCOMM_CHECK(query_rank_size(s, query, url));
    DCOMM_CHECK(finish(s, url));
    s->agent_store = 1;
    return 0;
  }
  /* No rank: every process joins through the generation protocol. */
  if (!dcomm__param_bool(DCOMM_P_ELASTIC))
    return dcomm__err(DCOMM_EINVAL, "init method '%s' without ?rank=&world_size= needs elastic mode (DCOMM_ELASTIC=1, "
                                    "as dcomm-run sets): ranks are assigned when the processes meet", url);
  s->join = 1;
  s->rank = 0;
  s->local_rank = 0;
  s->local_size = 1;
  DCOMM_CHECK(env_int("LOCAL_WORLD_SIZE", &s->local_size, &wp));
  DCOMM_CHECK(env_int("LOCAL_RANK", &s->local_rank, &rp));
  if (s->local_size < 1) return dcomm__err(DCOMM_EINVAL, "LOCAL_WORLD_SIZE=%d must be at least 1", s->local_size);
  if (s->local_rank < 0 || s->local_rank >= s->local_size)
    return dcomm__err(DCOMM_EINVAL, "LOCAL_RANK=%d is not in [0, LOCAL_WORLD_SIZE=%d)", s->local_rank, s->local_size);
  s->world_size = s->local_size; /* until the plan says */
  return 0;
}

static int env_set(const char *name) {
  const char *v = getenv(name);
  return v && *v;
}

/* The init method of this process's launcher, or NULL. */
static const char *detect(void) {
  /* A torchrun-style launcher (dcomm-run, torchrun) started inside a SLURM
   * or PMIx job: its variables describe this process, the outer ones its
   * launcher. */
  if (env_set("MASTER_ADDR") && env_set("RANK") && env_set("WORLD_SIZE")) return "env://";
  if (dcomm__pmix_detect()) return "pmix://";
  if (dcomm__slurm_detect()) return "slurm://";
  if (env_set("MASTER_ADDR")) return "env://";
  return NULL;
}

static int parse_env_url(struct dcomm_init_spec *s, const char *url) {
  (void)url;
  return parse_env(s);
}

/* pmix://: the facts come from PMIx in setup_store. */
static int parse_pmix(struct dcomm_init_spec *s, const char *url) {
  (void)s;
  (void)url;
  return 0;
}

static int parse_slurm_url(struct dcomm_init_spec *s, const char *url) {
  (void)url;
  return parse_slurm(s);
}

#ifdef DCOMM_HAVE_PMIX
#define HAVE_PMIX_BUILT 1
#define PMIX_LIBRARY DCOMM_LIBPMIX_SONAME
#else
#define HAVE_PMIX_BUILT 0
#define PMIX_LIBRARY NULL
#endif
#ifdef DCOMM_HAVE_ETCD
#define HAVE_ETCD_BUILT 1
#define ETCD_LIBRARY DCOMM_LIBCURL_SONAME
#else
#define HAVE_ETCD_BUILT 0
#define ETCD_LIBRARY NULL
#endif

/* The one table of init methods: dcomm_init dispatches through it and
 * dcomm-info lists the built ones from it. exact: the URL is the scheme
 * alone (no host or query). */
static const struct init_method {
  struct dcomm_init_method_info info;
  int exact;
  int (*parse)(struct dcomm_init_spec *, const char *);
} methods[] = {
    {{"env://", DCOMM_IM_ENV, 1, "MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torchrun, dcomm-run)", NULL}, 0,
     parse_env_url},
    {{"tcp://", DCOMM_IM_TCP, 1, "tcp://host:port?rank=R&world_size=N", NULL}, 0, parse_tcp},
    {{"file://", DCOMM_IM_FILE, 1, "file:///shared/path?rank=R&world_size=N", NULL}, 0, parse_file},
    {{"pmix://", DCOMM_IM_PMIX, HAVE_PMIX_BUILT, "a PMIx server (mpirun, prterun, srun --mpi=pmix)", PMIX_LIBRARY}, 1,
     parse_pmix},
    {{"slurm://", DCOMM_IM_SLURM, 1, "srun's SLURM_* variables", NULL}, 1, parse_slurm_url},
    {{"etcd://", DCOMM_IM_ETCD, HAVE_ETCD_BUILT, "etcd://host:port[,host:port...] (dcomm-run --rdzv-backend etcd)",
      ETCD_LIBRARY},
     0, parse_etcd},
};

int dcomm__init_method_usable(int i) {
  const struct dcomm_init_method_info *m = dcomm__init_method_info(i);
  if (!m || !m->built) return dcomm__err(DCOMM_ENOTSUP, "init method %d is not built", i);
  if (m->kind == DCOMM_IM_PMIX) return dcomm__pmix_available();
  if (m->kind == DCOMM_IM_ETCD) return dcomm__etcd_available();
  return 0;
}

const struct dcomm_init_method_info *dcomm__init_method_info(int i) {
  if (i < 0 || (size_t)i >= sizeof(methods) / sizeof(methods[0])) return NULL;
  return &methods[i].info;
}

/* "env://, tcp://, ... or etcd://": the schemes this build has. */
static void built_list(char *buf, size_t len) {
  size_t n = 0, built = 0, k = 0;
  buf[0] = 0;
  for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) built += (size_t)methods[i].info.built;
  for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]) && n < len; i++) {
    if (!methods[i].info.built) continue;
    k++;
    n += (size_t)snprintf(buf + n, len - n, "%s%s", k == 1 ? "" : k == built ? " or " : ", ", methods[i].info.scheme);
  }
}

int dcomm__init_spec_parse(const char *url, struct dcomm_init_spec *out) {
  char list[128];
  memset(out, 0, sizeof(*out));
  if (!url || !*url) url = dcomm__param_str(DCOMM_P_INIT_METHOD);
  if (!url || !*url) url = detect();
  built_list(list, sizeof(list));
  if (!url) {
    /* torchrun's variables, some set: name the missing ones. */
    static const char *const vars[] = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE"};
    char set[128] = "", unset[128] = "";
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
      char *b = env_set(vars[i]) ? set : unset;
      if (i >= 4 && b == unset) continue; /* LOCAL_* are optional */
      snprintf(b + strlen(b), 128 - strlen(b), "%s%s", *b ? ", " : "", vars[i]);
    }
    if (*set)
      return dcomm__err(DCOMM_EINVAL, "no init method: %s %s set but %s %s not; set all of MASTER_ADDR, MASTER_PORT, "
                                      "RANK and WORLD_SIZE (env://), or start the program with dcomm-run "
                                      "--nproc-per-node N (which sets them), mpirun or srun",
                        set, strchr(set, ',') ? "are" : "is", unset, strchr(unset, ',') ? "are" : "is");
  }
  if (!url && !dcomm__pbs_detect()) {
    /* Started alone, nothing set: a world of one, as an MPI singleton
     * (its store on an ephemeral loopback port). */
    out->kind = DCOMM_IM_TCP;
    out->singleton = 1;
    snprintf(out->host, sizeof(out->host), "127.0.0.1");
    out->port = 0;
    out->rank = out->local_rank = 0;
    out->world_size = out->local_size = 1;
    return 0;
  }
  if (!url) {
    if (dcomm__pbs_detect())
      return dcomm__err(DCOMM_EINVAL, "no init method under PBS (PBS_JOBID is set): start the ranks with mpirun "
                                      "(pmix://) or set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (env://)");
    return dcomm__err(DCOMM_EINVAL,
                      "no init method: pass one (%s), start under dcomm-run, mpirun or srun, or set MASTER_ADDR, "
                      "MASTER_PORT, RANK and WORLD_SIZE",
                      list);
  }
  for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
    const struct init_method *m = &methods[i];
    size_t sl = strlen(m->info.scheme);
    if (m->exact ? strcmp(url, m->info.scheme) : strncmp(url, m->info.scheme, sl)) continue;
    if (!m->info.built)
      return dcomm__err(DCOMM_EINVAL, "init method '%s': this dcomm is built without %s support (this build has %s)",
                        url, m->info.kind == DCOMM_IM_PMIX ? "PMIx" : "etcd (libcurl, jansson)", list);
    out->kind = m->info.kind;
    return m->parse(out, url);
  }
  return dcomm__err(DCOMM_EINVAL, "unknown init method '%s' (expected %s)", url, list);
}
