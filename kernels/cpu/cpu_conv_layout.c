/*
 * cpu_conv_layout.c: the reorders between the engine's NCHW activations and
 * the layouts oneDNN's convolution kernels take them in - nChw16c (f32 on
 * AVX-512: its direct and 1x1 kernels), nhwc (bf16: its AMX brgemm kernels)
 * and nChw8c (f32 on AVX2) - done here with 16 x 16 (AVX-512) and 8 x 8
 * (AVX2) transposes of 32-bit words instead of oneDNN's reorder primitives.
 * Those ran the blocked -> plain way at ~11 GB/s (f32) and ~4 GB/s (bf16
 * nhwc -> nchw) on the ResNets' shapes, a tenth of a training step. On an
 * AVX2 machine (Zen 3) oneDNN's nChw8c reorders are better (18-38 GB/s on
 * the wide ResNet's shapes, in L2) and these 29-60 GB/s, but the
 * convolutions gain little: 0.997-1.026x, mostly under 1%
 * (scripts/bench/bench_conv_layout.c, both in one process, alternating).
 *
 * The layouts are one form: element (image i, channel c, position p) at
 * i sn + (c / B) scb + p sp + c % B, B the block (16 or 8; nChw16c: sn =
 * ceil(C/16) 16 HW, scb = 16 HW, sp = 16; nhwc: B 16, sn = C HW, scb = 16,
 * sp = C; nChw8c: sn = ceil(C/8) 8 HW, scb = 8 HW, sp = 8). A tile is B
 * channels of B positions (f32) or of 32 (bf16: two positions' 16-bit values
 * paired into each 32-bit word by one vpermw, then the same transpose).
 * Channels past C in the last block are skipped (to plain) or written as
 * zeros where the layout holds them (the blocked layouts' padding, which
 * oneDNN's kernels read); positions past HW are masked. A reorder moves bits:
 * the result is the same in any thread count (tests/c/test_conv.c checks it
 * against oneDNN's reorder, bit for bit, on odd shapes).
 */
#include <omp.h>
#include <string.h>
#include "kernels/cpu/cpu_dnnl.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define LAYOUT_FN __attribute__((target("avx512f,avx512bw,avx512vl")))

int cpu_conv_layout_ok(void)
{
    static int has = -1;
    if (has < 0)
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl");
    return has;
}

/* r[0..15] (rows of 16 32-bit words) transposed in place */
LAYOUT_FN static inline void tr16(__m512i r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        __m512 a = _mm512_castsi512_ps(r[2 * i]), b = _mm512_castsi512_ps(r[2 * i + 1]);
        t[2 * i] = _mm512_unpacklo_ps(a, b);
        t[2 * i + 1] = _mm512_unpackhi_ps(a, b);
    }
    /* u[4g + k], 128-bit lane l: rows 4g..4g+3 of column 4l + k */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
        t[4 + k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
        t[8 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
        t[12 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[k], t[8 + k], 0x88));
        r[8 + k] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd));
        r[4 + k] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88));
        r[12 + k] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xdd));
    }
}

/* vpermw indexes: two positions' 16 channels (low, high 256 bits) <-> the
 * channels' pairs of positions (word j: channel j of both) */
static const uint16_t pair_idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
static const uint16_t unpair_idx[32] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                        1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

/* one image's channel block, layout -> plain rows (f32) */
LAYOUT_FN static void to_plain_f32(const float *src, float *dst, int64_t cval, int64_t hw, int64_t sp)
{
    __mmask16 cm = (__mmask16)((1u << cval) - 1);
    for (int64_t p = 0; p < hw; p += 16) {
        int64_t t = hw - p < 16 ? hw - p : 16;
        __m512i r[16];
        for (int k = 0; k < 16; k++)
            r[k] = k < t ? _mm512_castps_si512(_mm512_maskz_loadu_ps(cm, src + (p + k) * sp)) : _mm512_setzero_si512();
        tr16(r);
        __mmask16 pm = (__mmask16)((1u << t) - 1);
        for (int j = 0; j < cval; j++) _mm512_mask_storeu_epi32(dst + j * hw + p, pm, r[j]);
    }
}

LAYOUT_FN static void to_plain_bf16(const uint16_t *src, uint16_t *dst, int64_t cval, int64_t hw, int64_t sp)
{
    __mmask16 cm = (__mmask16)((1u << cval) - 1);
    const __m512i idx = _mm512_loadu_si512(pair_idx);
    for (int64_t p = 0; p < hw; p += 32) {
        int64_t t = hw - p < 32 ? hw - p : 32;
        __m512i r[16];
        for (int q = 0; q < 16; q++) {
            __m256i lo = 2 * q < t ? _mm256_maskz_loadu_epi16(cm, src + (p + 2 * q) * sp) : _mm256_setzero_si256();
            __m256i hi = 2 * q + 1 < t ? _mm256_maskz_loadu_epi16(cm, src + (p + 2 * q + 1) * sp) : _mm256_setzero_si256();
            r[q] = _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
        }
        tr16(r);
        __mmask32 pm = t == 32 ? ~(__mmask32)0 : (__mmask32)((1u << t) - 1);
        for (int j = 0; j < cval; j++) _mm512_mask_storeu_epi16(dst + j * hw + p, pm, r[j]);
    }
}

/* one image's channel block, plain rows -> layout; padded: the layout holds
 * all 16 lanes of the last block (zeros past C), else only C's */
LAYOUT_FN static void to_blk_f32(const float *src, float *dst, int64_t cval, int64_t hw, int64_t sp, int padded)
{
    __mmask16 cm = padded ? (__mmask16)0xffff : (__mmask16)((1u << cval) - 1);
    for (int64_t p = 0; p < hw; p += 16) {
        int64_t t = hw - p < 16 ? hw - p : 16;
        __mmask16 pm = (__mmask16)((1u << t) - 1);
        __m512i r[16];
        for (int j = 0; j < 16; j++)
            r[j] = j < cval ? _mm512_castps_si512(_mm512_maskz_loadu_ps(pm, src + j * hw + p)) : _mm512_setzero_si512();
        tr16(r);
        for (int k = 0; k < t; k++) _mm512_mask_storeu_epi32(dst + (p + k) * sp, cm, r[k]);
    }
}

LAYOUT_FN static void to_blk_bf16(const uint16_t *src, uint16_t *dst, int64_t cval, int64_t hw, int64_t sp, int padded)
{
    __mmask16 cm = padded ? (__mmask16)0xffff : (__mmask16)((1u << cval) - 1);
    const __m512i idx = _mm512_loadu_si512(unpair_idx);
    for (int64_t p = 0; p < hw; p += 32) {
        int64_t t = hw - p < 32 ? hw - p : 32;
        __mmask32 pm = t == 32 ? ~(__mmask32)0 : (__mmask32)((1u << t) - 1);
        __m512i r[16];
        for (int j = 0; j < 16; j++)
            r[j] = j < cval ? _mm512_maskz_loadu_epi16(pm, src + j * hw + p) : _mm512_setzero_si512();
        tr16(r);
        for (int q = 0; 2 * q < t; q++) {
            __m512i v = _mm512_permutexvar_epi16(idx, r[q]);
            _mm256_mask_storeu_epi16(dst + (p + 2 * q) * sp, cm, _mm512_castsi512_si256(v));
            if (2 * q + 1 < t) _mm256_mask_storeu_epi16(dst + (p + 2 * q + 1) * sp, cm, _mm512_extracti64x4_epi64(v, 1));
        }
    }
}

#define AVX2_FN __attribute__((target("avx2")))

int cpu_conv_layout8_ok(void)
{
    static int has = -1;
    if (has < 0) has = __builtin_cpu_supports("avx2");
    return has;
}

/* r[0..7] (rows of 8 floats) transposed in place */
AVX2_FN static inline void tr8(__m256 r[8])
{
    __m256 t[8], u[8];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + k], 128-bit lane l: rows 4g..4g+3 of column 4l + k */
    _Pragma("GCC unroll 2")
    for (int g = 0; g < 2; g++) {
        u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}

/* a whole 8 x 8 tile: 8 rows of 8 floats from s (rows ss apart) transposed
 * into 8 rows at d (rows ds apart), in registers; both directions' tiles */
AVX2_FN static inline void tile8(const float *s, int64_t ss, float *d, int64_t ds)
{
    __m256 r[8];
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(s + k * ss);
    tr8(r);
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++) _mm256_storeu_ps(d + j * ds, r[j]);
}

/* nChw8c: one image's channel block -> plain rows. Whole tiles (8 channels,
 * 8 positions) go straight through registers; a tile with fewer channels or
 * positions loads all 8 lanes of its positions (the padding lanes lie inside
 * the layout) and stores its positions through a copy, not AVX2's masked
 * stores (slow on AMD) */
AVX2_FN static void to_plain_f32_8(const float *src, float *dst, int64_t cval, int64_t hw)
{
    int64_t p = 0;
    if (cval == 8)
        for (; p + 8 <= hw; p += 8) {
            tile8(src + p * 8, 8, dst + p, hw);
        }
    for (; p < hw; p += 8) {
        int64_t t = hw - p < 8 ? hw - p : 8;
        __m256 r[8];
        for (int k = 0; k < 8; k++) r[k] = k < t ? _mm256_loadu_ps(src + (p + k) * 8) : _mm256_setzero_ps();
        tr8(r);
        for (int j = 0; j < cval; j++) {
            float row[8];
            _mm256_storeu_ps(row, r[j]);
            memcpy(dst + j * hw + p, row, (size_t)t * sizeof *row);
        }
    }
}

/* nChw8c: plain rows -> one image's channel block, all 8 lanes written
 * (zeros past C); whole tiles straight through registers, as above */
AVX2_FN static void to_blk_f32_8(const float *src, float *dst, int64_t cval, int64_t hw)
{
    int64_t p = 0;
    if (cval == 8)
        for (; p + 8 <= hw; p += 8) {
            tile8(src + p, hw, dst + p * 8, 8);
        }
    for (; p < hw; p += 8) {
        int64_t t = hw - p < 8 ? hw - p : 8;
        __m256 r[8];
        for (int j = 0; j < 8; j++) {
            float row[8] = {0};
            if (j < cval) memcpy(row, src + j * hw + p, (size_t)t * sizeof *row);
            r[j] = _mm256_loadu_ps(row);
        }
        tr8(r);
        for (int k = 0; k < t; k++) _mm256_storeu_ps(dst + (p + k) * 8, r[k]);
    }
}

void cpu_conv_layout_move(int to_plain, size_t es, const void *from, void *to, const cpu_conv_layout *l)
{
    int64_t B = l->blk, cb = (l->c + B - 1) / B, units = l->n * cb;
    const char *f = from;
    char *o = to;
    #pragma omp parallel for schedule(static) if (l->n * cb * B * l->hw >= MP_PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        int64_t i = u / cb, b = u % cb, cval = l->c - B * b < B ? l->c - B * b : B;
        size_t blk = (size_t)(i * l->sn + b * l->scb) * es, pl = (size_t)((i * l->c + B * b) * l->hw) * es;
        if (B == 8 && to_plain) to_plain_f32_8((const float *)(f + blk), (float *)(o + pl), cval, l->hw);
        else if (B == 8) to_blk_f32_8((const float *)(f + pl), (float *)(o + blk), cval, l->hw);
        else if (to_plain && es == 4) to_plain_f32((const float *)(f + blk), (float *)(o + pl), cval, l->hw, l->sp);
        else if (to_plain) to_plain_bf16((const uint16_t *)(f + blk), (uint16_t *)(o + pl), cval, l->hw, l->sp);
        else if (es == 4) to_blk_f32((const float *)(f + pl), (float *)(o + blk), cval, l->hw, l->sp, l->padded);
        else to_blk_bf16((const uint16_t *)(f + pl), (uint16_t *)(o + blk), cval, l->hw, l->sp, l->padded);
    }
}

#else
int cpu_conv_layout_ok(void) { return 0; }
int cpu_conv_layout8_ok(void) { return 0; }
void cpu_conv_layout_move(int to_plain, size_t es, const void *from, void *to, const cpu_conv_layout *l) {}
#endif

/* the form of layout m against the plain one u (both f32 or both bf16, the
 * same dims): 1 and *l filled when m is nChw16c or nhwc (AVX-512), or nChw8c
 * (f32, AVX2), with no offsets or extra, else 0 */
int cpu_conv_layout_of(const dnnl_memory_desc_t *m, const dnnl_memory_desc_t *u, cpu_conv_layout *l)
{
    if (m->ndims != 4 || u->ndims != 4 || m->data_type != u->data_type ||
        (m->data_type != dnnl_f32 && m->data_type != dnnl_bf16) || m->format_kind != dnnl_blocked ||
        u->format_kind != dnnl_blocked || m->offset0 || u->offset0 || m->extra.flags || u->extra.flags)
        return 0;
    const int64_t *d = m->dims;
    int64_t n = d[0], c = d[1], h = d[2], w = d[3];
    const dnnl_blocking_desc_t *b = &m->format_desc.blocking, *ub = &u->format_desc.blocking;
    for (int i = 0; i < 4; i++)
        if (u->dims[i] != d[i] || u->padded_dims[i] != d[i] || m->padded_offsets[i] || u->padded_offsets[i] ||
            (i != 1 && m->padded_dims[i] != d[i]))
            return 0;
    if (ub->inner_nblks || ub->strides[3] != 1 || ub->strides[2] != w || ub->strides[1] != h * w ||
        ub->strides[0] != c * h * w)
        return 0;
    l->n = n, l->c = c, l->hw = h * w;
    /* nChw<B>c: blocks of B channels, the last padded to B */
    for (int64_t B = 16; B >= 8; B /= 2) {
        int64_t cp = (c + B - 1) / B * B;
        if (!(B == 16 ? cpu_conv_layout_ok() : cpu_conv_layout8_ok() && m->data_type == dnnl_f32)) continue;
        if (b->inner_nblks == 1 && b->inner_blks[0] == B && b->inner_idxs[0] == 1 && m->padded_dims[1] == cp &&
            b->strides[3] == B && b->strides[2] == B * w && b->strides[1] == B * h * w && b->strides[0] == cp * h * w) {
            l->blk = B, l->sn = cp * h * w, l->scb = B * h * w, l->sp = B, l->padded = 1;
            return 1;
        }
    }
    if (cpu_conv_layout_ok() && b->inner_nblks == 0 && m->padded_dims[1] == c && b->strides[1] == 1 &&
        b->strides[3] == c && b->strides[2] == c * w && b->strides[0] == c * h * w) {
        l->blk = 16, l->sn = c * h * w, l->scb = 16, l->sp = c, l->padded = 0;
        return 1;
    }
    return 0;
}
