/*
 * tcp_cpus.c: which processors this rank may run on, and whether the ranks
 * of its host share them. A rank that waits on a shared-memory ring spins
 * for a few microseconds before it yields its processor; when the rank it
 * waits for may need that very processor (more ranks than processors among
 * those that can run where this one runs), it yields at once instead.
 *
 * The answer needs every local rank's processor set, not only this rank's:
 * a launcher that binds each rank to a processor of its own (dcomm-run's
 * and mpirun's default) leaves every rank with one processor and no one
 * to share it with. Each rank therefore publishes its set, as a Linux CPU
 * list ("0-3,8"), in the world's address directory (tcp_conn.c).
 */
#include "config.h"
#include "tcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tcp_cpus_own(struct tcp_ctx *ctx) {
  CPU_ZERO(&ctx->cpus);
  if (sched_getaffinity(0, sizeof(ctx->cpus), &ctx->cpus) != 0) {
    CPU_ZERO(&ctx->cpus);
    CPU_SET(0, &ctx->cpus); /* unknown: as if one processor, as before */
  }
}

int tcp_cpus_format(const cpu_set_t *set, char *buf, size_t len) {
  size_t at = 0;
  if (len) buf[0] = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, set)) last++;
    int n = last == cpu ? snprintf(buf + at, len - at, "%s%d", at ? "," : "", cpu)
                        : snprintf(buf + at, len - at, "%s%d-%d", at ? "," : "", cpu, last);
    if (n < 0 || (size_t)n >= len - at) {
      if (len) buf[0] = 0; /* too long: published as unknown */
      return -1;
    }
    at += (size_t)n;
    cpu = last;
  }
  return 0;
}

int tcp_cpus_parse(const char *s, cpu_set_t *set) {
  CPU_ZERO(set);
  if (!*s) return -1;
  while (*s) {
    char *end;
    long lo = strtol(s, &end, 10), hi = lo;
    if (end == s || lo < 0 || lo >= CPU_SETSIZE) return -1;
    if (*end == '-') {
      s = end + 1;
      hi = strtol(s, &end, 10);
      if (end == s || hi < lo || hi >= CPU_SETSIZE) return -1;
    }
    for (long c = lo; c <= hi; c++) CPU_SET((int)c, set);
    if (*end == ',' && end[1]) end++;
    else if (*end) return -1;
    s = end;
  }
  return 0;
}

/* Counted once, from the directory, the first time a wait asks: the world
 * ranks of this host whose processors overlap this rank's (itself
 * included), against the processors all of them together may run on. A
 * rank that published no set counts as sharing and adds nothing. */
int tcp_oversubscribed(struct tcp_ctx *ctx) {
  if (!ctx->sharing) {
    cpu_set_t all = ctx->cpus;
    int sharing = 0;
    for (int r = 0; r < ctx->host->world_size; r++) {
      if (strcmp(ctx->addrs[r].host, ctx->host_id)) continue;
      cpu_set_t theirs, both;
      if (tcp_cpus_parse(ctx->addrs[r].cpus, &theirs) < 0) {
        sharing++;
        continue;
      }
      CPU_AND(&both, &theirs, &ctx->cpus);
      if (!CPU_COUNT(&both)) continue;
      sharing++;
      CPU_OR(&all, &all, &theirs);
    }
    ctx->sharing = sharing ? sharing : 1;
    ctx->sharing_cpus = CPU_COUNT(&all);
    TCP_LOG(ctx, INFO, "%d rank(s) of this host may run on this rank's processors, %d processor(s) among them: "
            "a waiting rank %s", ctx->sharing, ctx->sharing_cpus,
            ctx->sharing > ctx->sharing_cpus ? "yields at once" : "spins before it yields");
  }
  return ctx->sharing > ctx->sharing_cpus;
}

void tcp_cpus_forget(struct tcp_ctx *ctx) { ctx->sharing = 0; }
