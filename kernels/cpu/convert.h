/*
 * convert.h: bulk f16/bf16 <-> f32 conversion on the CPU.
 *
 * Two paths with bit-identical results: one using the F16C instructions
 * (vcvtph2ps / vcvtps2ph, round to nearest even) where the processor has them,
 * and a portable one for every other processor. The mp_cpu_* entry points pick
 * the F16C path at run time (its AVX-512 form where the processor has
 * AVX-512F); the explicit ones exist for tests and benchmarks.
 */
#ifndef MP_CPU_CONVERT_H
#define MP_CPU_CONVERT_H

#include <stdint.h>

int mp_cpu_has_f16c(void);

void mp_cpu_f16_to_f32(float *dst, const uint16_t *src, int64_t n);
void mp_cpu_f32_to_f16(uint16_t *dst, const float *src, int64_t n);
void mp_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);
void mp_cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);

/* bf16: the C loops (the entry points above take AVX-512 where it is, else AVX2) */
void mp_cpu_bf16_to_f32_portable(float *dst, const uint16_t *src, int64_t n);
void mp_cpu_f32_to_bf16_portable(uint16_t *dst, const float *src, int64_t n);
/* bf16 in AVX2 registers; only call these when mp_cpu_has_avx2() */
int mp_cpu_has_avx2(void);
void mp_cpu_bf16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n);
void mp_cpu_f32_to_bf16_avx2(uint16_t *dst, const float *src, int64_t n);
void mp_cpu_f16_to_f32_portable(float *dst, const uint16_t *src, int64_t n);
void mp_cpu_f32_to_f16_portable(uint16_t *dst, const float *src, int64_t n);
/* only call these when mp_cpu_has_f16c() */
void mp_cpu_f16_to_f32_f16c(float *dst, const uint16_t *src, int64_t n);
void mp_cpu_f32_to_f16_f16c(uint16_t *dst, const float *src, int64_t n);
/* the same instructions sixteen wide (the entry points above take these where
 * the processor has AVX-512F); only call these when mp_cpu_has_avx512_f16c() */
int mp_cpu_has_avx512_f16c(void);
void mp_cpu_f16_to_f32_avx512(float *dst, const uint16_t *src, int64_t n);
void mp_cpu_f32_to_f16_avx512(uint16_t *dst, const float *src, int64_t n);

/* src rounded to f16 into dst and those f16 values widened into wide: the bits
 * of mp_cpu_f32_to_f16 then mp_cpu_f16_to_f32 of dst, in one pass (F16C: the
 * rounded register widened as it is stored); on the calling thread, for blocks */
void mp_cpu_f32_to_f16_widened(uint16_t *dst, float *wide, const float *src, int64_t n);
/* acc[i] = acc[i] + src[i] rounded to f16 and widened, in one pass on the
 * calling thread (the bits of rounding into f16, widening, then the f32 add) */
void mp_cpu_f16_round_add(float *acc, const float *src, int64_t n);
/* the same as plain C loops (the definition; tests hold the above to them) */
void mp_cpu_f32_to_f16_widened_portable(uint16_t *dst, float *wide, const float *src, int64_t n);
void mp_cpu_f16_round_add_portable(float *acc, const float *src, int64_t n);
/* the same two for bf16 (AVX2 where there is, else the plain loops) */
void mp_cpu_f32_to_bf16_widened(uint16_t *dst, float *wide, const float *src, int64_t n);
void mp_cpu_bf16_round_add(float *acc, const float *src, int64_t n);
void mp_cpu_f32_to_bf16_widened_portable(uint16_t *dst, float *wide, const float *src, int64_t n);
void mp_cpu_bf16_round_add_portable(float *acc, const float *src, int64_t n);

#endif
