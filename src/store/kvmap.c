/*
 * kvmap.c: the store's hash map (see kvmap.h).
 */
#include "config.h"
#include "kvmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dcomm.h"
#include "hash.h"

/* The project's one FNV-1a (util/hash.c), unseeded. */
static uint64_t hash_key(const char *k, size_t n) { return dcomm__hash64(0, k, n); }

struct dcomm_kv *dcomm__kvmap_find(const struct dcomm_kvmap *m, const char *k, size_t kl) {
  if (!m->nb) return NULL;
  uint64_t h = hash_key(k, kl);
  for (struct dcomm_kv *e = m->b[h % m->nb]; e; e = e->next)
    if (e->hash == h && e->klen == kl && memcmp(e->key, k, kl) == 0) return e;
  return NULL;
}

static int map_grow(struct dcomm_kvmap *m) {
  size_t nb = m->nb ? m->nb * 2 : 256;
  struct dcomm_kv **b = calloc(nb, sizeof(*b));
  if (!b) return DCOMM_ENOMEM;
  for (size_t i = 0; i < m->nb; i++)
    for (struct dcomm_kv *e = m->b[i], *nx; e; e = nx) {
      nx = e->next;
      e->next = b[e->hash % nb];
      b[e->hash % nb] = e;
    }
  free(m->b);
  m->b = b;
  m->nb = nb;
  return 0;
}

int dcomm__kvmap_put(struct dcomm_kvmap *m, const char *k, size_t kl, unsigned char *val, size_t vl) {
  struct dcomm_kv *e = dcomm__kvmap_find(m, k, kl);
  if (e) {
    free(e->val);
    e->val = val;
    e->vlen = vl;
    return 0;
  }
  if (m->n >= m->nb * 3 / 4 && map_grow(m) < 0) return DCOMM_ENOMEM;
  e = malloc(sizeof(*e) + kl + 1);
  if (!e) return DCOMM_ENOMEM;
  e->hash = hash_key(k, kl);
  e->klen = kl;
  memcpy(e->key, k, kl);
  e->key[kl] = 0;
  e->val = val;
  e->vlen = vl;
  e->next = m->b[e->hash % m->nb];
  m->b[e->hash % m->nb] = e;
  m->n++;
  return 0;
}

int dcomm__kvmap_del(struct dcomm_kvmap *m, const char *k, size_t kl) {
  if (!m->nb) return 0;
  uint64_t h = hash_key(k, kl);
  for (struct dcomm_kv **pp = &m->b[h % m->nb]; *pp; pp = &(*pp)->next) {
    struct dcomm_kv *e = *pp;
    if (e->hash == h && e->klen == kl && memcmp(e->key, k, kl) == 0) {
      *pp = e->next;
      free(e->val);
      free(e);
      m->n--;
      return 1;
    }
  }
  return 0;
}

void dcomm__kvmap_free(struct dcomm_kvmap *m) {
  for (size_t i = 0; i < m->nb; i++)
    for (struct dcomm_kv *e = m->b[i], *nx; e; e = nx) {
      nx = e->next;
      free(e->val);
      free(e);
    }
  free(m->b);
  m->b = NULL;
  m->nb = m->n = 0;
}

int dcomm__kv_parse_int64(const unsigned char *v, size_t n, int64_t *out) {
  char buf[32];
  if (n == 0 || n >= sizeof(buf)) return DCOMM_EINVAL;
  memcpy(buf, v, n);
  buf[n] = 0;
  size_t i = (buf[0] == '-' || buf[0] == '+') ? 1 : 0;
  if (!buf[i]) return DCOMM_EINVAL;
  for (size_t j = i; j < n; j++)
    if (buf[j] < '0' || buf[j] > '9') return DCOMM_EINVAL;
  errno = 0;
  long long x = strtoll(buf, NULL, 10);
  if (errno) return DCOMM_EINVAL;
  *out = (int64_t)x;
  return 0;
}
