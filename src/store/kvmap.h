/*
 * kvmap.h: the byte-string hash map (chained, FNV-1a) that holds keys and
 * values for the embedded store server and for the replayed shared-file
 * store. Not thread-safe: callers hold their own lock.
 */
#ifndef DCOMM_KVMAP_H
#define DCOMM_KVMAP_H

#include <stddef.h>
#include <stdint.h>

struct dcomm_kv {
  struct dcomm_kv *next;
  uint64_t hash;
  size_t klen, vlen;
  unsigned char *val;
  char key[]; /* NUL-terminated */
};

struct dcomm_kvmap {
  struct dcomm_kv **b;
  size_t nb, n;
};

/* The entry for k, or NULL. */
struct dcomm_kv *dcomm__kvmap_find(const struct dcomm_kvmap *m, const char *k, size_t kl);
/* Stores val (taking ownership of the malloc'd buffer) under k; 0 or DCOMM_ENOMEM. */
int dcomm__kvmap_put(struct dcomm_kvmap *m, const char *k, size_t kl, unsigned char *val, size_t vl);
/* Removes k; 1 if it was there. */
int dcomm__kvmap_del(struct dcomm_kvmap *m, const char *k, size_t kl);
void dcomm__kvmap_free(struct dcomm_kvmap *m);
/* A value as the counter of an add: a decimal integer; 0 or DCOMM_EINVAL. */
int dcomm__kv_parse_int64(const unsigned char *v, size_t n, int64_t *out);

#endif
