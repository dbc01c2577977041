/*
 * cpu_fp8_seg.c: the quantizer's inner loops (cpu_fp8_seg.h), three ways.
 *
 * The branch-free form of mp_f32_to_fp8 (saturating) on v = x * sc, with
 * ax = |v|'s bits, s = 23 - mbits:
 *   normal in the target (ax >= the smallest normal's bits): the code is
 *     (ax + 2^(s-1) - 1 + bit s of ax) >> s less the exponent rebias, ties to
 *     even, a carry bumping the exponent;
 *   below it: the implicit-one mantissa m shifted right by r = 23 + emin -
 *     mbits - e, rounded the same way; r is clamped to 31, where m < 2^24
 *     rounds to 0 as the reference's early "too small" return does (the
 *     reference's midpoint case, r = 24, rounds to even: 0);
 *   a code past maxcode (an overflow, an infinity) is maxcode, and counts as
 *   saturated; a NaN is 0x7f and counts as nothing.
 * This is the reference's arithmetic with its branches turned into selects;
 * the counts follow its definitions (a saturated code is one whose
 * non-saturating conversion overflows, which is exactly "past maxcode").
 * The amax compares |x|'s bits as integers, NaNs left out: for non-NaN
 * magnitudes the integer order is the float order.
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/convert_avx512.h"
#include "kernels/cpu/cpu_fp8_seg.h"

#ifdef MP_HAVE_AVX512_CONVERT
#define SEG_X86 1
#endif

/* bit casts through a union (GNU C defines it), which the vectoriser takes
 * where it gives up on memcpy's */
typedef union { float f; uint32_t u; } pun;

static inline uint32_t bits_of(float f) { return (pun){.f = f}.u; }

static inline float float_of(uint32_t u) { return (pun){.u = u}.f; }

/* ---- the reference: kernels/fp8.h an element, as the quantizer always did */

static void amax_ref(const float *x, int64_t n, cpu_fp8_seen *s)
{
    for (int64_t j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (a > s->amax) s->amax = a;
        s->nan |= a != a;
    }
}

static void codes_ref(const float *x, int64_t n, float sc, mp_fp8_format fmt, uint8_t *q, cpu_fp8_seen *s)
{
    float fmax = mp_fp8_to_f32(fmt.maxcode, fmt);
    for (int64_t j = 0; j < n; j++) {
        float v = x[j] * sc;
        uint8_t c = mp_f32_to_fp8(v, fmt, 1);
        q[j] = c;
        /* saturated: rounds past the largest finite value (not merely above it:
         * 448 (1 + 2^-24) is 448, the scale's own rounding can put amax there) */
        if (fabsf(v) > fmax) s->saturated += (mp_f32_to_fp8(v, fmt, 0) & 0x7f) == fmt.overflow;
        s->flushed += x[j] != 0.0f && isfinite(x[j]) && (c & 0x7f) == 0;
    }
}

/* ---- portable: branch-free C, the format's constants known at compile time;
 * an AVX2 clone too (its variable shifts let the compiler vectorise the
 * subnormal rounding; plain x86-64 has none), which is also what valgrind,
 * lacking AVX-512, runs */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PORTABLE_FN __attribute__((target_clones("default", "avx2")))
#else
#define PORTABLE_FN
#endif

/* in signed 32-bit lanes (magnitudes' bits are below 2^31), which SSE2 and
 * AVX2 compare; they have no unsigned compare */
static inline __attribute__((always_inline)) void amax_body(const float *x, int64_t n, cpu_fp8_seen *s)
{
    int32_t mx = 0, nan = 0;
    for (int64_t j = 0; j < n; j++) {
        int32_t a = (int32_t)(bits_of(x[j]) & 0x7fffffffu);
        int32_t isnan = a > 0x7f800000;
        a = isnan ? 0 : a;
        mx = a > mx ? a : mx;
        nan |= isnan;
    }
    float m = float_of((uint32_t)mx);
    if (m > s->amax) s->amax = m;
    s->nan |= nan;
}

static inline __attribute__((always_inline)) void codes_body(const float *x, int64_t n, float sc, const int mbits,
                                                             const int bias, const int32_t maxcode, uint8_t *q,
                                                             cpu_fp8_seen *s)
{
    const int sh = 23 - mbits, emin = 1 - bias;
    const int32_t normmin = (emin + 127) << 23, rebias = (127 - bias) << mbits;
    const int32_t rbase = 23 + emin - mbits + 127;   /* r = rbase - biased exponent */
    int64_t sat = 0, flu = 0;
    for (int64_t j = 0; j < n; j++) {
        float v = x[j] * sc;
        uint32_t b = bits_of(v);
        int32_t ax = (int32_t)(b & 0x7fffffffu), sign = (int32_t)((b >> 24) & 0x80u);
        /* unsigned: a NaN's bits plus the rounding increment pass 2^31 (the result is
         * not used for a NaN, but a signed overflow would be undefined) */
        int32_t cn = (int32_t)(((uint32_t)ax + (uint32_t)((1 << (sh - 1)) - 1) + (uint32_t)((ax >> sh) & 1)) >> sh)
                     - rebias;
        int32_t r = rbase - (ax >> 23);
        r = r < 1 ? 1 : r > 31 ? 31 : r;
        int32_t m = (ax & 0x7fffff) | 0x800000;
        int32_t cs = (m + ((1 << (r - 1)) - 1) + ((m >> r) & 1)) >> r;
        int32_t c = ax >= normmin ? cn : cs;
        int32_t over = c > maxcode, isnan = ax > 0x7f800000;
        c = over ? maxcode : c;
        c = isnan ? 0x7f : (c | sign);
        q[j] = (uint8_t)c;
        sat += over & !isnan;
        int32_t xa = (int32_t)(bits_of(x[j]) & 0x7fffffffu);
        flu += (x[j] != 0.0f) & (xa < 0x7f800000) & ((c & 0x7f) == 0);
    }
    s->saturated += sat, s->flushed += flu;
}

PORTABLE_FN static void amax_portable(const float *x, int64_t n, cpu_fp8_seen *s) { amax_body(x, n, s); }

PORTABLE_FN static void codes_portable(const float *x, int64_t n, float sc, mp_fp8_format fmt, uint8_t *q, cpu_fp8_seen *s)
{
    if (fmt.mbits == 3 && fmt.bias == 7 && fmt.maxcode == 0x7e) codes_body(x, n, sc, 3, 7, 0x7e, q, s);
    else if (fmt.mbits == 2 && fmt.bias == 15 && fmt.maxcode == 0x7b) codes_body(x, n, sc, 2, 15, 0x7b, q, s);
    else codes_ref(x, n, sc, fmt, q, s);
}

/* ---- AVX-512: sixteen lanes, the tail under a mask */

#ifdef SEG_X86
#define AVX512_FN __attribute__((target(MP_AVX512BW_TARGET)))
#define AVX512_INLINE __attribute__((target(MP_AVX512BW_TARGET), always_inline)) static inline

AVX512_FN static void amax_avx512(const float *x, int64_t n, cpu_fp8_seen *s)
{
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    __m512i mx = _mm512_setzero_si512();
    __mmask16 nan = 0;
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + j), absm);
        __mmask16 isnan = _mm512_cmpgt_epu32_mask(a, inf);
        nan |= isnan;
        mx = _mm512_mask_max_epu32(mx, (__mmask16)~isnan, mx, a);
    }
    float m = float_of((uint32_t)_mm512_reduce_max_epu32(mx));
    if (m > s->amax) s->amax = m;
    s->nan |= nan != 0;
}

AVX512_INLINE void codes_avx512_body(const float *x, int64_t n, float sc, const int mbits, const int bias,
                                     const uint32_t maxcode, uint8_t *q, cpu_fp8_seen *s)
{
    const int sh = 23 - mbits, emin = 1 - bias;
    const __m512 scv = _mm512_set1_ps(sc), zero = _mm512_setzero_ps();
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i one = _mm512_set1_epi32(1), hn = _mm512_set1_epi32((1 << (sh - 1)) - 1);
    const __m512i rebias = _mm512_set1_epi32((127 - bias) << mbits), normmin = _mm512_set1_epi32((emin + 127) << 23);
    const __m512i rbase = _mm512_set1_epi32(23 + emin - mbits + 127), r31 = _mm512_set1_epi32(31);
    const __m512i mmask = _mm512_set1_epi32(0x7fffff), implicit = _mm512_set1_epi32(0x800000);
    const __m512i maxc = _mm512_set1_epi32((int)maxcode), c7f = _mm512_set1_epi32(0x7f);
    const __m512i smask = _mm512_set1_epi32(0x80);
    int64_t sat = 0, flu = 0;
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(k, x + j);
        __m512i b = _mm512_castps_si512(_mm512_mul_ps(xv, scv));
        __m512i ax = _mm512_and_si512(b, absm);
        __m512i sign = _mm512_and_si512(_mm512_srli_epi32(b, 24), smask);
        /* normal in the target */
        __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ax, sh), one);
        __m512i cn = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(ax, hn), odd), sh), rebias);
        /* below the smallest normal */
        __m512i r = _mm512_sub_epi32(rbase, _mm512_srli_epi32(ax, 23));
        r = _mm512_min_epi32(_mm512_max_epi32(r, one), r31);
        __m512i m = _mm512_or_si512(_mm512_and_si512(ax, mmask), implicit);
        __m512i half1 = _mm512_sub_epi32(_mm512_sllv_epi32(one, _mm512_sub_epi32(r, one)), one);
        __m512i modd = _mm512_and_si512(_mm512_srlv_epi32(m, r), one);
        __m512i cs = _mm512_srlv_epi32(_mm512_add_epi32(_mm512_add_epi32(m, half1), modd), r);
        __m512i c = _mm512_mask_blend_epi32(_mm512_cmpge_epu32_mask(ax, normmin), cs, cn);
        __mmask16 over = _mm512_cmpgt_epu32_mask(c, maxc), isnan = _mm512_cmpgt_epu32_mask(ax, inf);
        c = _mm512_or_si512(_mm512_min_epu32(c, maxc), sign);
        c = _mm512_mask_mov_epi32(c, isnan, c7f);
        _mm512_mask_cvtepi32_storeu_epi8(q + j, k, c);
        sat += __builtin_popcount((unsigned)(over & (__mmask16)~isnan & k));
        __mmask16 nz = _mm512_cmp_ps_mask(xv, zero, _CMP_NEQ_UQ);
        __mmask16 fin = _mm512_cmplt_epu32_mask(_mm512_and_si512(_mm512_castps_si512(xv), absm), inf);
        __mmask16 zc = _mm512_testn_epi32_mask(c, c7f);
        flu += __builtin_popcount((unsigned)(nz & fin & zc & k));
    }
    s->saturated += sat, s->flushed += flu;
}

AVX512_FN static void codes_avx512(const float *x, int64_t n, float sc, mp_fp8_format fmt, uint8_t *q,
                                   cpu_fp8_seen *s)
{
    if (fmt.mbits == 3 && fmt.bias == 7 && fmt.maxcode == 0x7e) codes_avx512_body(x, n, sc, 3, 7, 0x7e, q, s);
    else if (fmt.mbits == 2 && fmt.bias == 15 && fmt.maxcode == 0x7b) codes_avx512_body(x, n, sc, 2, 15, 0x7b, q, s);
    else codes_ref(x, n, sc, fmt, q, s);
}

#endif

static const cpu_fp8_seg_path PATHS[] = {
    {"reference", amax_ref, codes_ref},
    {"portable", amax_portable, codes_portable},
#ifdef SEG_X86
    {"avx512", amax_avx512, codes_avx512},
#endif
};

const cpu_fp8_seg_path *cpu_fp8_seg_paths(int *n)
{
    int all = (int)(sizeof PATHS / sizeof PATHS[0]);
#ifdef SEG_X86
    if (!mp_cpu_has_avx512bw()) all--;
#endif
    *n = all;
    return PATHS;
}

const cpu_fp8_seg_path *cpu_fp8_seg_best(void)
{
    int n;
    const cpu_fp8_seg_path *p = cpu_fp8_seg_paths(&n);
    return &p[n - 1];
}
