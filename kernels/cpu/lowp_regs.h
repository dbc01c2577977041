/*
 * lowp_regs.h: sixteen f16/bf16 values widened to f32 in one AVX-512
 * register and rounded back, loads and stores with tails - the steps the
 * fused 16-bit kernels are built from (cpu_elementwise_lowp.c's elementwise
 * ops, cpu_batch_norm_lowp.c's batch norm passes). widen and narrow are the
 * same steps as convert.c's bulk loops (convert_avx512.h for bf16;
 * vcvtph2ps / vcvtps2ph, nearest even, for f16), so a value computed in
 * registers rounds exactly as cpu_store would round it.
 *
 * Only for functions compiled for MP_AVX512BW_TARGET, called where
 * cpu_lowp_usable() says the processor (and, for f16, its conversions) has
 * them.
 */
#ifndef MP_CPU_LOWP_REGS_H
#define MP_CPU_LOWP_REGS_H

#include <string.h>
#include "kernels/cpu/convert_avx512.h"

#ifdef MP_HAVE_AVX512_CONVERT

#define LOWP_FN __attribute__((target(MP_AVX512BW_TARGET)))
/* the loops are inlined into one copy per dtype and op (their callers'
 * switches), so no branch on either is left inside them */
#define LOWP_INLINE __attribute__((target(MP_AVX512BW_TARGET), always_inline)) static inline

LOWP_FN static inline __m512 widen(int f16, __m256i h)
{
    return f16 ? _mm512_cvtph_ps(h) : mp_bf16x16_widen(h);
}

LOWP_FN static inline __m256i narrow(int f16, __m512 v)
{
    return f16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : mp_f32x16_to_bf16(v);
}

LOWP_FN static inline __m512 load16(int f16, const uint16_t *p)
{
    return widen(f16, _mm256_loadu_si256((const __m256i *)p));
}

LOWP_FN static inline void store16(int f16, uint16_t *p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)p, narrow(f16, v));
}

/* a tail of k < 16 values goes through a zeroed 16-value copy: lanes past k
 * compute on zeros and are not stored */
LOWP_FN static inline __m512 load_tail(int f16, const uint16_t *p, int64_t k)
{
    uint16_t t[16] = {0};
    memcpy(t, p, sizeof(uint16_t) * (size_t)k);
    return load16(f16, t);
}

LOWP_FN static inline void store_tail(int f16, uint16_t *p, __m512 v, int64_t k)
{
    uint16_t t[16];
    store16(f16, t, v);
    memcpy(p, t, sizeof(uint16_t) * (size_t)k);
}

#endif

#endif
