/*
 * convert.c: bulk f16/bf16 <-> f32 conversion on the CPU (see convert.h).
 *
 * Casts sit on the hot path of mixed-precision training (master weights to
 * f16, f16 activations to f32 for every op), so the f16 conversions use the
 * F16C instructions when the processor has them: eight values per
 * instruction against a dozen branchy integer steps per value in C.
 *
 * The portable path is a plain loop over the scalar functions of half.h, and
 * is the definition; the F16C path gives bit-identical results (tests/c/
 * test_half.c checks every f16, every rounding boundary, every f32 of the
 * exponents that matter and millions of random f32s). The F16C functions are
 * compiled for f16c/avx2 with a target attribute, so the file builds without
 * -mf16c and runs on any x86-64; the mp_cpu_* entry points ask the processor
 * once and cache the answer.
 *
 * bf16 needs no special instructions: its rounding is a few integer
 * operations with no branches. The C loops are the portable path; on AVX-512
 * and on AVX2 the same steps are written out with 512- and 256-bit registers
 * (below; tests/c/test_half.c checks them against the C loops on every bf16
 * and every f32).
 *
 * Long arrays are split over threads with OpenMP; the conversion is memory
 * bound, so short ones stay on one thread where fork/join would cost more
 * than it saves, and very long ones are written with streaming stores on the
 * F16C path.
 */
#include "kernels/cpu/convert.h"
#include "kernels/cpu/convert_avx512.h"
#include "kernels/half.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MP_X86 1
#endif

/* below this many elements one thread does the whole array (cpu.h's
 * MP_PAR_MIN_MEM: a memory pass, worth 2 threads from 32K elements) */
#define PAR_MIN ((int64_t)1 << 15)

typedef void (*run_fn)(void *dst, const void *src, int64_t n);

/* Run fn over n elements, in one contiguous block per thread when n is large.
 * dsz and ssz are the element sizes of dst and src. */
static void run_split(run_fn fn, void *dst, size_t dsz, const void *src, size_t ssz,
                      int64_t n)
{
    if (n <= PAR_MIN) {
        if (n > 0)
            fn(dst, src, n);
        return;
    }
    /* blocks of a multiple of 64 elements keep every block but the last free
     * of a tail and its stores on whole cache lines */
    #pragma omp parallel
    {
#ifdef _OPENMP
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
        int nt = 1, t = 0;
#endif
        int64_t per = ((n + nt - 1) / nt + 63) & ~(int64_t)63;
        int64_t lo = (int64_t)t * per;
        int64_t hi = lo + per < n ? lo + per : n;
        if (lo < hi)
            fn((char *)dst + lo * dsz, (const char *)src + lo * ssz, hi - lo);
    }
}

/* ---- portable ---------------------------------------------------------- */

static void f16_to_f32_c(void *dst, const void *src, int64_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++)
        d[i] = mp_f16_to_f32(s[i]);
}

static void f32_to_f16_c(void *dst, const void *src, int64_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    for (int64_t i = 0; i < n; i++)
        d[i] = mp_f32_to_f16(s[i]);
}

/* The bf16 loops run in blocks of BLK with an inner loop of fixed count,
 * because gcc's vectoriser at -O2 (the "very cheap" cost model, which the
 * library is built with) only takes loops that need no scalar remainder. */
#define BLK 16
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BF16_SIMD __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define BF16_SIMD
#endif

BF16_SIMD static void bf16_to_f32_c(void *dst, const void *src, int64_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + BLK <= n; i += BLK)
        for (int j = 0; j < BLK; j++)
            d[i + j] = mp_bf16_to_f32(s[i + j]);
    for (; i < n; i++)
        d[i] = mp_bf16_to_f32(s[i]);
}

/* mp_f32_to_bf16 with its branch written as a select, so that it vectorises */
static inline uint16_t to_bf16(float f)
{
    uint32_t x = mp_f32_bits(f);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
    uint32_t q = (x >> 16) | 0x0040;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

BF16_SIMD static void f32_to_bf16_c(void *dst, const void *src, int64_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    int64_t i = 0;
    for (; i + BLK <= n; i += BLK)
        for (int j = 0; j < BLK; j++)
            d[i + j] = to_bf16(s[i + j]);
    for (; i < n; i++)
        d[i] = to_bf16(s[i]);
}

void mp_cpu_f16_to_f32_portable(float *dst, const uint16_t *src, int64_t n)
{
    run_split(f16_to_f32_c, dst, sizeof *dst, src, sizeof *src, n);
}

void mp_cpu_f32_to_f16_portable(uint16_t *dst, const float *src, int64_t n)
{
    run_split(f32_to_f16_c, dst, sizeof *dst, src, sizeof *src, n);
}

/* bf16 with AVX-512 written out: the same integer steps as to_bf16, sixteen
 * values per instruction, narrowed with one vpmovdw (convert_avx512.h's
 * register steps, which the fused kernels of cpu_elementwise_lowp.c share). The compiler's own
 * vectorisation of the C loops keeps to 256-bit registers and packs and
 * unpacks its way to 16-bit lanes (47 GB/s in cache against 201 for widening,
 * scripts/bench/bench_convert.c); conversions were 8% of a bf16 GPT step. */
#if defined(MP_X86) && defined(__GNUC__)
#define AVX512_FN __attribute__((target(MP_AVX512BW_TARGET)))

AVX512_FN static void bf16_to_f32_avx512(void *dst, const void *src, int64_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, mp_bf16x16_widen(_mm256_loadu_si256((const __m256i *)(s + i))));
    for (; i < n; i++) d[i] = mp_bf16_to_f32(s[i]);
}

AVX512_FN static void f32_to_bf16_avx512(void *dst, const void *src, int64_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i), mp_f32x16_to_bf16(_mm512_loadu_ps(s + i)));
    for (; i < n; i++) d[i] = to_bf16(s[i]);
}

/* bf16 with AVX2 written out, for processors without AVX-512 (AMD Zen 2/3):
 * the same integer steps as to_bf16, eight values a register (the NaN test
 * a signed compare: both sides lie in 0..0x7fffffff), two registers narrowed
 * with one vpackusdw (its saturation keeps 0..0xffff as they are) and their
 * 128-bit halves put back in order. gcc's avx2 clone of the C loop packed
 * twice per sixteen values, around its select as well as for the store. */
#define AVX2_FN __attribute__((target("avx2")))

AVX2_FN static inline __m256i f32x8_to_bf16_lanes(__m256i x)
{
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x0040);
    __m256i hi = _mm256_srli_epi32(x, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, half), _mm256_and_si256(hi, one)), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs), inf);
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
}

/* sixteen f32 at s rounded to bf16 at d */
AVX2_FN static inline void f32x16_to_bf16_avx2(uint16_t *d, const float *s)
{
    __m256i a = f32x8_to_bf16_lanes(_mm256_loadu_si256((const __m256i *)s));
    __m256i b = f32x8_to_bf16_lanes(_mm256_loadu_si256((const __m256i *)(s + 8)));
    _mm256_storeu_si256((__m256i *)d, _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
}

AVX2_FN static void bf16_to_f32_avx2(void *dst, const void *src, int64_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(h, 16));
    }
    for (; i < n; i++) d[i] = mp_bf16_to_f32(s[i]);
}

AVX2_FN static void f32_to_bf16_avx2(void *dst, const void *src, int64_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) f32x16_to_bf16_avx2(d + i, s + i);
    for (; i < n; i++) d[i] = to_bf16(s[i]);
}

/* the one-pass forms of the bf16 step (see f32_to_f16_widened_hw below): the
 * rounded lanes widened by a shift as they are stored, or added into acc */
AVX2_FN static void f32_to_bf16_widened_avx2(uint16_t *d, float *w, const float *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = f32x8_to_bf16_lanes(_mm256_loadu_si256((const __m256i *)(s + i)));
        __m256i b = f32x8_to_bf16_lanes(_mm256_loadu_si256((const __m256i *)(s + i + 8)));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
        _mm256_storeu_si256((__m256i *)(w + i), _mm256_slli_epi32(a, 16));
        _mm256_storeu_si256((__m256i *)(w + i + 8), _mm256_slli_epi32(b, 16));
    }
    for (; i < n; i++) {
        d[i] = to_bf16(s[i]);
        w[i] = mp_bf16_to_f32(d[i]);
    }
}

AVX2_FN static void bf16_round_add_avx2(float *acc, const float *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i r = f32x8_to_bf16_lanes(_mm256_loadu_si256((const __m256i *)(s + i)));
        __m256 y = _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), y));
    }
    for (; i < n; i++) acc[i] = acc[i] + mp_bf16_to_f32(to_bf16(s[i]));
}

int mp_cpu_has_avx2(void)
{
    static int has = -1;   /* racing threads all store the same answer */
    int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx2");
        __atomic_store_n(&has, h, __ATOMIC_RELAXED);
    }
    return h;
}

int mp_cpu_has_avx512bw(void)
{
    static int has = -1;   /* racing threads all store the same answer */
    int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
        __atomic_store_n(&has, h, __ATOMIC_RELAXED);
    }
    return h;
}
#else
int mp_cpu_has_avx512bw(void) { return 0; }
int mp_cpu_has_avx2(void) { return 0; }
#define bf16_to_f32_avx512 bf16_to_f32_c
#define f32_to_bf16_avx512 f32_to_bf16_c
#define bf16_to_f32_avx2 bf16_to_f32_c
#define f32_to_bf16_avx2 f32_to_bf16_c
#endif

void mp_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n)
{
    run_split(mp_cpu_has_avx512bw() ? bf16_to_f32_avx512 : mp_cpu_has_avx2() ? bf16_to_f32_avx2 : bf16_to_f32_c, dst,
              sizeof *dst, src, sizeof *src, n);
}

void mp_cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    run_split(mp_cpu_has_avx512bw() ? f32_to_bf16_avx512 : mp_cpu_has_avx2() ? f32_to_bf16_avx2 : f32_to_bf16_c, dst,
              sizeof *dst, src, sizeof *src, n);
}

void mp_cpu_f32_to_bf16_widened_portable(uint16_t *dst, float *wide, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        dst[i] = mp_f32_to_bf16(src[i]);
        wide[i] = mp_bf16_to_f32(dst[i]);
    }
}

void mp_cpu_bf16_round_add_portable(float *acc, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) acc[i] = acc[i] + mp_bf16_to_f32(mp_f32_to_bf16(src[i]));
}

void mp_cpu_f32_to_bf16_widened(uint16_t *dst, float *wide, const float *src, int64_t n)
{
#if defined(MP_X86) && defined(__GNUC__)
    if (mp_cpu_has_avx2()) {
        f32_to_bf16_widened_avx2(dst, wide, src, n);
        return;
    }
#endif
    mp_cpu_f32_to_bf16_widened_portable(dst, wide, src, n);
}

void mp_cpu_bf16_round_add(float *acc, const float *src, int64_t n)
{
#if defined(MP_X86) && defined(__GNUC__)
    if (mp_cpu_has_avx2()) {
        bf16_round_add_avx2(acc, src, n);
        return;
    }
#endif
    mp_cpu_bf16_round_add_portable(acc, src, n);
}

void mp_cpu_bf16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n)
{
    run_split(bf16_to_f32_avx2, dst, sizeof *dst, src, sizeof *src, n);
}

void mp_cpu_f32_to_bf16_avx2(uint16_t *dst, const float *src, int64_t n)
{
    run_split(f32_to_bf16_avx2, dst, sizeof *dst, src, sizeof *src, n);
}

void mp_cpu_bf16_to_f32_portable(float *dst, const uint16_t *src, int64_t n)
{
    run_split(bf16_to_f32_c, dst, sizeof *dst, src, sizeof *src, n);
}

void mp_cpu_f32_to_bf16_portable(uint16_t *dst, const float *src, int64_t n)
{
    run_split(f32_to_bf16_c, dst, sizeof *dst, src, sizeof *src, n);
}

/* ---- F16C -------------------------------------------------------------- */

#ifdef MP_X86

#define F16C_FN __attribute__((target("f16c,avx2")))

/* Older clangs do not know "f16c" in __builtin_cpu_supports; ask cpuid. */
#if defined(__clang__)
#include <cpuid.h>
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#else
static int cpu_has_f16c(void) { return __builtin_cpu_supports("f16c"); }
#endif

/* Beyond this many output bytes the output cannot stay in cache anyway
 * (it is half or more of the last-level cache of the machines we run on), so
 * the F16C path writes it with streaming stores. They skip reading each
 * destination line before overwriting it: 4 of the 10 bytes per element that
 * f16->f32 otherwise moves, 2 of the 8 of f32->f16. Measured on 16M elements,
 * 10-25% more throughput. Below it, ordinary stores leave the result in cache
 * for the next op. */
#define STREAM_MIN_BYTES ((int64_t)16 << 20)

/* The bodies take `stream` as a constant from their callers below, so each
 * caller gets its own copy with the test folded away. Heads and tails go
 * through the scalar forms of the same instructions, so every element of the
 * F16C path is the hardware's answer. */
F16C_FN static inline void f16_to_f32_hw(float *d, const uint16_t *s, int64_t n, int stream)
{
    int64_t i = 0;
    if (stream)                 /* streaming stores want aligned addresses */
        for (; i < n && ((uintptr_t)(d + i) & 31); i++)
            d[i] = _cvtsh_ss(s[i]);
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i + 8)));
        if (stream) {
            _mm256_stream_ps(d + i, a);
            _mm256_stream_ps(d + i + 8, b);
        } else {
            _mm256_storeu_ps(d + i, a);
            _mm256_storeu_ps(d + i + 8, b);
        }
    }
    if (stream)                 /* order them before whatever reads dst next */
        _mm_sfence();
    for (; i < n; i++)
        d[i] = _cvtsh_ss(s[i]);
}

F16C_FN static inline void f32_to_f16_hw(uint16_t *d, const float *s, int64_t n, int stream)
{
    int64_t i = 0;
    if (stream)
        for (; i < n && ((uintptr_t)(d + i) & 15); i++)
            d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
        __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(s + i + 8), _MM_FROUND_TO_NEAREST_INT);
        if (stream) {
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 8), b);
        } else {
            _mm_storeu_si128((__m128i *)(d + i), a);
            _mm_storeu_si128((__m128i *)(d + i + 8), b);
        }
    }
    if (stream)
        _mm_sfence();
    for (; i < n; i++)
        d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
}

F16C_FN static void f16_to_f32_hw_cached(void *dst, const void *src, int64_t n)
{
    f16_to_f32_hw(dst, src, n, 0);
}

F16C_FN static void f16_to_f32_hw_stream(void *dst, const void *src, int64_t n)
{
    f16_to_f32_hw(dst, src, n, 1);
}

F16C_FN static void f32_to_f16_hw_cached(void *dst, const void *src, int64_t n)
{
    f32_to_f16_hw(dst, src, n, 0);
}

F16C_FN static void f32_to_f16_hw_stream(void *dst, const void *src, int64_t n)
{
    f32_to_f16_hw(dst, src, n, 1);
}

/* The same instructions in their AVX-512 (EVEX) form: sixteen values per
 * instruction instead of eight. Each element gets the same instruction's
 * answer as on the F16C path (vcvtph2ps/vcvtps2ph round to nearest even
 * whatever the vector width), so the results are bit-identical; in cache it
 * converts about twice as fast (f16 working copies, GEMM operands and the
 * per-block widening of elementwise ops are all in-cache work). */
#define AVX512_F16C_FN __attribute__((target("avx512f,f16c,avx2")))

AVX512_F16C_FN static inline void f16_to_f32_512(float *d, const uint16_t *s, int64_t n, int stream)
{
    int64_t i = 0;
    if (stream)                 /* 512-bit streaming stores want 64-byte alignment */
        for (; i < n && ((uintptr_t)(d + i) & 63); i++)
            d[i] = _cvtsh_ss(s[i]);
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i)));
        __m512 b = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i + 16)));
        if (stream) {
            _mm512_stream_ps(d + i, a);
            _mm512_stream_ps(d + i + 16, b);
        } else {
            _mm512_storeu_ps(d + i, a);
            _mm512_storeu_ps(d + i + 16, b);
        }
    }
    if (stream)
        _mm_sfence();
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = _cvtsh_ss(s[i]);
}

AVX512_F16C_FN static inline void f32_to_f16_512(uint16_t *d, const float *s, int64_t n, int stream)
{
    int64_t i = 0;
    if (stream)
        for (; i < n && ((uintptr_t)(d + i) & 31); i++)
            d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
        __m256i b = _mm512_cvtps_ph(_mm512_loadu_ps(s + i + 16), _MM_FROUND_TO_NEAREST_INT);
        if (stream) {
            _mm256_stream_si256((__m256i *)(d + i), a);
            _mm256_stream_si256((__m256i *)(d + i + 16), b);
        } else {
            _mm256_storeu_si256((__m256i *)(d + i), a);
            _mm256_storeu_si256((__m256i *)(d + i + 16), b);
        }
    }
    if (stream)
        _mm_sfence();
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
}

AVX512_F16C_FN static void f16_to_f32_512_cached(void *dst, const void *src, int64_t n)
{
    f16_to_f32_512(dst, src, n, 0);
}

AVX512_F16C_FN static void f16_to_f32_512_stream(void *dst, const void *src, int64_t n)
{
    f16_to_f32_512(dst, src, n, 1);
}

AVX512_F16C_FN static void f32_to_f16_512_cached(void *dst, const void *src, int64_t n)
{
    f32_to_f16_512(dst, src, n, 0);
}

AVX512_F16C_FN static void f32_to_f16_512_stream(void *dst, const void *src, int64_t n)
{
    f32_to_f16_512(dst, src, n, 1);
}

int mp_cpu_has_avx512_f16c(void)
{
    static int has = -1;   /* racing threads all store the same answer */
    int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        h = mp_cpu_has_f16c() && __builtin_cpu_supports("avx512f");
        __atomic_store_n(&has, h, __ATOMIC_RELAXED);
    }
    return h;
}

void mp_cpu_f16_to_f32_avx512(float *dst, const uint16_t *src, int64_t n)
{
    int stream = n * (int64_t)sizeof *dst >= STREAM_MIN_BYTES;
    run_split(stream ? f16_to_f32_512_stream : f16_to_f32_512_cached, dst, sizeof *dst, src,
              sizeof *src, n);
}

void mp_cpu_f32_to_f16_avx512(uint16_t *dst, const float *src, int64_t n)
{
    int stream = n * (int64_t)sizeof *dst >= STREAM_MIN_BYTES;
    run_split(stream ? f32_to_f16_512_stream : f32_to_f16_512_cached, dst, sizeof *dst, src,
              sizeof *src, n);
}

int mp_cpu_has_f16c(void)
{
    /* -1 until first asked; racing threads all store the same answer */
    static int has = -1;
    int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        /* avx2 also tells that the OS saves the ymm registers */
        h = cpu_has_f16c() && __builtin_cpu_supports("avx2");
        __atomic_store_n(&has, h, __ATOMIC_RELAXED);
    }
    return h;
}

void mp_cpu_f16_to_f32_f16c(float *dst, const uint16_t *src, int64_t n)
{
    int stream = n * (int64_t)sizeof *dst >= STREAM_MIN_BYTES;
    run_split(stream ? f16_to_f32_hw_stream : f16_to_f32_hw_cached, dst, sizeof *dst, src,
              sizeof *src, n);
}

void mp_cpu_f32_to_f16_f16c(uint16_t *dst, const float *src, int64_t n)
{
    int stream = n * (int64_t)sizeof *dst >= STREAM_MIN_BYTES;
    run_split(stream ? f32_to_f16_hw_stream : f32_to_f16_hw_cached, dst, sizeof *dst, src,
              sizeof *src, n);
}


/* ---- rounded and widened in one pass ------------------------------------ */

/* The f16 step keeps an f16 value and its f32 widening side by side (a weight's
 * working copy and the copy the GEMMs read; a weight gradient rounded and added
 * into its f32 .grad). Rounding, storing, loading back and widening is two
 * passes and a reload from L1 for what one register holds: vcvtps2ph, then
 * vcvtph2ps of that same register. The instructions are the bulk paths', so
 * the bits are those of mp_cpu_f32_to_f16 followed by mp_cpu_f16_to_f32. One
 * thread, no split: the callers hand over blocks from inside their own
 * parallel loops. */
F16C_FN static void f32_to_f16_widened_hw(uint16_t *d, float *w, const float *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
        __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(s + i + 8), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(d + i), a);
        _mm_storeu_si128((__m128i *)(d + i + 8), b);
        _mm256_storeu_ps(w + i, _mm256_cvtph_ps(a));
        _mm256_storeu_ps(w + i + 8, _mm256_cvtph_ps(b));
    }
    for (; i < n; i++) {
        d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
        w[i] = _cvtsh_ss(d[i]);
    }
}

/* acc + (s rounded to f16 and widened), added in that order as add_f32's
 * acc[q] + y[q] */
F16C_FN static void f16_round_add_hw(float *acc, const float *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
        __m256 b = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(s + i + 8), _MM_FROUND_TO_NEAREST_INT));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), a));
        _mm256_storeu_ps(acc + i + 8, _mm256_add_ps(_mm256_loadu_ps(acc + i + 8), b));
    }
    for (; i < n; i++)
        acc[i] = acc[i] + _cvtsh_ss(_cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT));
}

#else /* not x86: no F16C; the explicit entry points fall back */

int mp_cpu_has_f16c(void) { return 0; }
int mp_cpu_has_avx512_f16c(void) { return 0; }

void mp_cpu_f16_to_f32_avx512(float *dst, const uint16_t *src, int64_t n)
{
    mp_cpu_f16_to_f32_portable(dst, src, n);
}

void mp_cpu_f32_to_f16_avx512(uint16_t *dst, const float *src, int64_t n)
{
    mp_cpu_f32_to_f16_portable(dst, src, n);
}

void mp_cpu_f16_to_f32_f16c(float *dst, const uint16_t *src, int64_t n)
{
    mp_cpu_f16_to_f32_portable(dst, src, n);
}

void mp_cpu_f32_to_f16_f16c(uint16_t *dst, const float *src, int64_t n)
{
    mp_cpu_f32_to_f16_portable(dst, src, n);
}

#endif

/* ---- dispatch ---------------------------------------------------------- */

void mp_cpu_f16_to_f32(float *dst, const uint16_t *src, int64_t n)
{
    if (mp_cpu_has_avx512_f16c())
        mp_cpu_f16_to_f32_avx512(dst, src, n);
    else if (mp_cpu_has_f16c())
        mp_cpu_f16_to_f32_f16c(dst, src, n);
    else
        mp_cpu_f16_to_f32_portable(dst, src, n);
}

void mp_cpu_f32_to_f16(uint16_t *dst, const float *src, int64_t n)
{
    if (mp_cpu_has_avx512_f16c())
        mp_cpu_f32_to_f16_avx512(dst, src, n);
    else if (mp_cpu_has_f16c())
        mp_cpu_f32_to_f16_f16c(dst, src, n);
    else
        mp_cpu_f32_to_f16_portable(dst, src, n);
}

void mp_cpu_f32_to_f16_widened_portable(uint16_t *dst, float *wide, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        dst[i] = mp_f32_to_f16(src[i]);
        wide[i] = mp_f16_to_f32(dst[i]);
    }
}

void mp_cpu_f16_round_add_portable(float *acc, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        acc[i] = acc[i] + mp_f16_to_f32(mp_f32_to_f16(src[i]));
}

void mp_cpu_f32_to_f16_widened(uint16_t *dst, float *wide, const float *src, int64_t n)
{
#ifdef MP_X86
    if (mp_cpu_has_f16c()) {
        f32_to_f16_widened_hw(dst, wide, src, n);
        return;
    }
#endif
    mp_cpu_f32_to_f16_widened_portable(dst, wide, src, n);
}

void mp_cpu_f16_round_add(float *acc, const float *src, int64_t n)
{
#ifdef MP_X86
    if (mp_cpu_has_f16c()) {
        f16_round_add_hw(acc, src, n);
        return;
    }
#endif
    mp_cpu_f16_round_add_portable(acc, src, n);
}
