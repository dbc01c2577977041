/*
 * cpu_fp8_cast.h: the CPU's bulk FP8 (e4m3, e5m2) conversions
 * (cpu_fp8_cast.c), which cpu_load / cpu_store (cpu.h) and the casts
 * (cpu_create.c) call: the codes' exact f32 values; f32 rounded to nearest
 * even, overflow saturating or not (kernels/fp8.h); f64 -> f32 rounded to
 * odd, so that an f64 then rounds once into FP8.
 */
#ifndef MP_CPU_FP8_CAST_H
#define MP_CPU_FP8_CAST_H

#include <stdbool.h>
#include <stdint.h>
#include "kernels/backend.h"

void cpu_fp8_decode(mp_dtype dt, const uint8_t *src, float *dst, int64_t n);
void cpu_fp8_encode(mp_dtype dt, uint8_t *dst, const float *src, int64_t n, int saturate);
float cpu_f64_to_f32_odd(double d);
static inline bool cpu_is_fp8(mp_dtype dt) { return dt == MP_E4M3 || dt == MP_E5M2; }

#endif
