/*
 * convert_avx512.h: the bf16 <-> f32 steps of convert.c on sixteen values in
 * one AVX-512 register, for kernels that widen, compute and round in
 * registers (cpu_elementwise_lowp.c) rather than through an f32 block in
 * memory. convert.c's bulk loops are built from these same functions, so a
 * fused kernel rounds exactly as cpu_store does: to nearest even, a NaN kept
 * a NaN (its payload's top bits, quieted).
 *
 * Call them only from functions compiled for MP_AVX512BW_TARGET (a target
 * attribute: the file builds without -mavx512bw and runs anywhere), and only
 * when mp_cpu_has_avx512bw() says the processor has the instructions.
 */
#ifndef MP_CPU_CONVERT_AVX512_H
#define MP_CPU_CONVERT_AVX512_H

#include <stdint.h>

/* 1 when the processor has AVX-512F and AVX-512BW (asked once, then cached) */
int mp_cpu_has_avx512bw(void);

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define MP_HAVE_AVX512_CONVERT 1
#include <immintrin.h>

#define MP_AVX512BW_TARGET "avx512f,avx512bw"

/* sixteen bf16 (one 256-bit word of 16-bit lanes) as f32: exact */
__attribute__((target(MP_AVX512BW_TARGET))) static inline __m512 mp_bf16x16_widen(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* sixteen f32 rounded to bf16 (nearest even; NaN: the top half, quieted) */
__attribute__((target(MP_AVX512BW_TARGET))) static inline __m256i mp_f32x16_to_bf16(__m512 f)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x0040);
    __m512i x = _mm512_castps_si512(f), hi = _mm512_srli_epi32(x, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, half), _mm512_and_si512(hi, one)), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs), inf);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
    return _mm512_cvtepi32_epi16(r);
}
#endif

#endif
