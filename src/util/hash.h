/*
 * hash.h: a stable 64-bit id from a seed and data (FNV-1a).
 */
#ifndef DCOMM_HASH_H
#define DCOMM_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t dcomm__hash64(uint64_t seed, const void *data, size_t len);

#endif
