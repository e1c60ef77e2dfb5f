/*
 * run_args.c: the command line of dcomm-run. torchrun's option names where
 * torchrun has one; both spellings (--nproc-per-node, --nproc_per_node) and
 * both forms (--opt value, --opt=value). The program starts at "--" or at
 * the first argument that is not an option.
 */
#include "config.h"
#include "run.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"

static const char usage_text[] =
    "usage: dcomm-run --nproc-per-node N [options] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts N workers of PROGRAM on this host, hosts their store (or meets the\n"
    "other nodes' agents in etcd), prints their output prefixed with their rank,\n"
    "and handles worker and node failures.\n"
    "\n"
    "options:\n"
    "  --nproc-per-node N        workers to start (required)\n"
    "  --restart-policy P        on a worker death: shrink (survivors go on, the\n"
    "                            default), replace (start a replacement that joins)\n"
    "                            or all (restart every worker)\n"
    "  --max-restarts K          replacements or full restarts allowed (default 3)\n"
    "  --min-nproc M             shrink: fail when fewer than M workers are left\n"
    "                            (default 1)\n"
    "  --nnodes N|MIN:MAX        nodes of the job: 1 with the static backend; with\n"
    "                            etcd the job starts with MIN to MAX nodes, goes on\n"
    "                            down to MIN and grows up to MAX (default 1)\n"
    "  --rdzv-backend static|etcd  static: this agent hosts the store (one node);\n"
    "                            etcd: one agent per node meets the others in etcd\n"
    "  --rdzv-endpoint HOST:PORT static: where the store listens (default 127.0.0.1\n"
    "                            and a free port); etcd: H1:P1,H2:P2 (required)\n"
    "  --rdzv-id ID              job id (default dcomm-<8 hex>; required with etcd)\n"
    "  --bind-to core|none|auto  bind each worker to a processor of its own (core),\n"
    "                            or not (none); auto (the default) binds when\n"
    "                            every worker of the node gets its own processor\n"
    "  --quiet-prefix            print worker output without the [rank]: prefix\n"
    "  -h, --help                this text\n";

static int usage_error(int *exit_code, const char *fmt, const char *arg) {
  fputs("dcomm-run: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs("\n", stderr);
  fputs(usage_text, stderr);
  *exit_code = 2;
  return 1;
}

const char *run_policy_name(enum run_policy p) {
  switch (p) {
    case RUN_SHRINK: return "shrink";
    case RUN_REPLACE: return "replace";
    case RUN_ALL: return "all";
  }
  return "?";
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

/* HOST:PORT, [V6]:PORT, HOST (any free port). */
static int parse_endpoint(const char *s, struct run_opts *o) {
  const char *host = s, *port = NULL;
  size_t hlen;
  if (*s == '[') {
    const char *close = strchr(s, ']');
    if (!close) return -1;
    host = s + 1;
    hlen = (size_t)(close - host);
    if (close[1] == ':') port = close + 2;
    else if (close[1]) return -1;
  } else {
    const char *colon = strrchr(s, ':');
    if (colon && strchr(s, ':') != colon) colon = NULL; /* bare IPv6 address */
    hlen = colon ? (size_t)(colon - s) : strlen(s);
    if (colon) port = colon + 1;
  }
  if (hlen == 0 || hlen >= sizeof(o->host)) return -1;
  memcpy(o->host, host, hlen);
  o->host[hlen] = 0;
  o->port = 0;
  if (port && parse_int(port, 0, 65535, &o->port) < 0) return -1;
  return 0;
}

/* N or MIN:MAX. */
static int parse_nnodes(const char *s, int *min, int *max) {
  const char *colon = strchr(s, ':');
  if (!colon) {
    if (parse_int(s, 1, RUN_MAX_NPROC, min) < 0) return -1;
    *max = *min;
    return 0;
  }
  char lo[32];
  size_t n = (size_t)(colon - s);
  if (n == 0 || n >= sizeof(lo)) return -1;
  memcpy(lo, s, n);
  lo[n] = 0;
  if (parse_int(lo, 1, RUN_MAX_NPROC, min) < 0 || parse_int(colon + 1, 1, RUN_MAX_NPROC, max) < 0) return -1;
  return *min <= *max ? 0 : -1;
}

/* Options that take a value; the name is normalized to dashes. */
static const char *const valued[] = {"nproc-per-node", "restart-policy", "max-restarts", "min-nproc", "nnodes",
                                     "rdzv-backend",   "rdzv-endpoint",  "rdzv-id",      "bind-to",
                                     NULL};

static int takes_value(const char *name) {
  for (int i = 0; valued[i]; i++)
    if (!strcmp(valued[i], name)) return 1;
  return 0;
}

int run_parse_args(int argc, char **argv, struct run_opts *o, int *exit_code) {
  memset(o, 0, sizeof(*o));
  o->policy = RUN_SHRINK;
  o->max_restarts = 3;
  o->min_nproc = 1;
  snprintf(o->host, sizeof(o->host), "127.0.0.1");
  int nproc_set = 0;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      i++;
      break;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(usage_text, stdout);
      *exit_code = 0;
      return 1;
    }
    if (strncmp(a, "--", 2) != 0) {
      if (a[0] == '-' && a[1]) return usage_error(exit_code, "unknown option '%s'", a);
      break; /* the program */
    }
    char name[64];
    const char *eq = strchr(a + 2, '=');
    size_t nlen = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
    if (nlen == 0 || nlen >= sizeof(name)) return usage_error(exit_code, "unknown option '%s'", a);
    for (size_t k = 0; k < nlen; k++) name[k] = a[2 + k] == '_' ? '-' : a[2 + k];
    name[nlen] = 0;
    const char *val = NULL;
    if (!strcmp(name, "quiet-prefix")) {
      if (eq) return usage_error(exit_code, "option '%s' takes no value", a);
      o->quiet_prefix = 1;
      continue;
    }
    if (!takes_value(name)) return usage_error(exit_code, "unknown option '%s'", a);
    if (eq) val = eq + 1;
    else if (i + 1 < argc) val = argv[++i];
    else return usage_error(exit_code, "option '%s' needs a value", a);

    if (!strcmp(name, "nproc-per-node")) {
      if (parse_int(val, 1, RUN_MAX_NPROC, &o->nproc) < 0)
        return usage_error(exit_code, "--nproc-per-node '%s': expected a number from 1 to 4096", val);
      nproc_set = 1;
    } else if (!strcmp(name, "restart-policy")) {
      if (!strcmp(val, "shrink")) o->policy = RUN_SHRINK;
      else if (!strcmp(val, "replace")) o->policy = RUN_REPLACE;
      else if (!strcmp(val, "all")) o->policy = RUN_ALL;
      else return usage_error(exit_code, "--restart-policy '%s': expected shrink, replace or all", val);
    } else if (!strcmp(name, "max-restarts")) {
      if (parse_int(val, 0, INT_MAX / 2, &o->max_restarts) < 0)
        return usage_error(exit_code, "--max-restarts '%s': expected a number >= 0", val);
    } else if (!strcmp(name, "min-nproc")) {
      if (parse_int(val, 1, RUN_MAX_NPROC, &o->min_nproc) < 0)
        return usage_error(exit_code, "--min-nproc '%s': expected a number >= 1", val);
    } else if (!strcmp(name, "nnodes")) {
      if (parse_nnodes(val, &o->min_nodes, &o->max_nodes) < 0)
        return usage_error(exit_code, "--nnodes '%s': expected N or MIN:MAX with 1 <= MIN <= MAX", val);
    } else if (!strcmp(name, "bind-to")) {
      if (!strcmp(val, "core")) o->bind = RUN_BIND_CORE;
      else if (!strcmp(val, "none")) o->bind = RUN_BIND_NONE;
      else if (!strcmp(val, "auto")) o->bind = RUN_BIND_AUTO;
      else return usage_error(exit_code, "--bind-to '%s': expected core, none or auto", val);
    } else if (!strcmp(name, "rdzv-backend")) {
      if (!strcmp(val, "etcd")) o->etcd = 1;
      else if (!strcmp(val, "static")) o->etcd = 0;
      else return usage_error(exit_code, "--rdzv-backend '%s': expected static or etcd", val);
    } else if (!strcmp(name, "rdzv-endpoint")) {
      size_t l = strlen(val);
      if (l == 0 || l >= sizeof(o->endpoints))
        return usage_error(exit_code, "--rdzv-endpoint '%s': expected HOST:PORT", val);
      memcpy(o->endpoints, val, l + 1);
    } else if (!strcmp(name, "rdzv-id")) {
      size_t l = strlen(val);
      if (l == 0 || l >= sizeof(o->job_id))
        return usage_error(exit_code, "--rdzv-id '%s': expected 1 to 255 characters", val);
      memcpy(o->job_id, val, l + 1);
      o->explicit_id = 1;
    }
  }
  if (!nproc_set) return usage_error(exit_code, "%s", "--nproc-per-node is required");
  if (!o->min_nodes) o->min_nodes = o->max_nodes = 1;
  if (o->etcd) {
    if (!o->endpoints[0])
      return usage_error(exit_code, "%s", "--rdzv-backend etcd needs --rdzv-endpoint H1:P1[,H2:P2...] (etcd's client URLs)");
    if (!o->explicit_id)
      return usage_error(exit_code, "%s", "--rdzv-backend etcd needs --rdzv-id: the agents of one job meet under it");
    if (o->policy == RUN_ALL)
      return usage_error(exit_code, "%s",
                         "--restart-policy all is for the static backend; with etcd use shrink or replace");
  } else {
    if (o->max_nodes != 1)
      return usage_error(exit_code, "%s", "--nnodes above 1 needs --rdzv-backend etcd (the static backend runs one node)");
    if (o->endpoints[0] && parse_endpoint(o->endpoints, o) < 0)
      return usage_error(exit_code, "--rdzv-endpoint '%s': expected HOST:PORT", o->endpoints);
  }
  if (i >= argc) return usage_error(exit_code, "%s", "no program to run");
  if (o->min_nproc > o->nproc) return usage_error(exit_code, "%s", "--min-nproc is larger than --nproc-per-node");
  o->argv = argv + i;
  if (!o->explicit_id) {
    unsigned char r[4];
    if (dcomm__random_bytes(r, sizeof(r)) < 0) {
      fprintf(stderr, "dcomm-run: getrandom failed (%s); cannot make a job id\n", strerror(errno));
      *exit_code = 1;
      return 1;
    }
    snprintf(o->job_id, sizeof(o->job_id), "dcomm-%02x%02x%02x%02x", r[0], r[1], r[2], r[3]);
  }
  return 0;
}
