/*
 * hash.c: a stable 64-bit hash (FNV-1a) for ids equal on every process
 * (communicator ids, store keys of paths).
 */
#include "hash.h"

uint64_t dcomm__hash64(uint64_t seed, const void *data, size_t len) {
  uint64_t h = 1469598103934665603ull ^ seed;
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
