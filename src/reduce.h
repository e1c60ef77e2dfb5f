/*
 * reduce.h: datatype facts and the reduction kernels used by the CPU
 * backends. float16 and bfloat16 are reduced in float and rounded back to
 * nearest-even after each step.
 */
#ifndef DCOMM_REDUCE_H
#define DCOMM_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "dcomm.h"

int dcomm__dtype_valid(int dt);
int dcomm__op_valid(int op);
const char *dcomm__dtype_name(int dt); /* "float32", ... or "dtype?" */
const char *dcomm__op_name(int op);    /* "sum", ... */
int dcomm__op_bitwise(int op);         /* DCOMM_BAND, DCOMM_BOR, DCOMM_BXOR */
int dcomm__dtype_integer(int dt);      /* int8 .. uint64 */
/* Whether op reduces dt: both valid, and bitwise ops on integers only. */
int dcomm__op_dtype_ok(int op, int dt);

/* dst[i] = dst[i] (op) src[i]; DCOMM_AVG reduces as a sum. A pair that
 * dcomm__op_dtype_ok refuses leaves dst unchanged. */
void dcomm__reduce(void *dst, const void *src, size_t count, dcomm_dtype_t dt, dcomm_op_t op);
/* Same, out of place: dst[i] = a[i] (op) b[i] (dst may alias a). */
void dcomm__reduce3(void *dst, const void *a, const void *b, size_t count, dcomm_dtype_t dt, dcomm_op_t op);
/* buf[i] /= n (the last step of DCOMM_AVG); integers divide truncating. */
void dcomm__scale_div(void *buf, size_t count, dcomm_dtype_t dt, int n);

float dcomm__half_to_float(uint16_t h);
uint16_t dcomm__float_to_half(float f);
float dcomm__bf16_to_float(uint16_t b);
uint16_t dcomm__float_to_bf16(float f);

#endif
