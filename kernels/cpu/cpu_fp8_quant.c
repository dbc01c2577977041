/*
 * cpu_fp8_quant.c: f32/f16/bf16 -> scaled FP8 codes (cpu_fp8.h). Each group
 * (the tensor, a 1 x 128 tile, a 128 x 128 block, an MX block of 32) is read
 * for its amax and then scaled and rounded while it is still in cache, so
 * only the tensor granularity reads its input twice. Every code is
 * mp_f32_to_fp8's (kernels/fp8.h), saturating, so the CUDA quantizer and this
 * one give the same bytes for the same scale; the loops that make them are
 * cpu_fp8_seg.c's (AVX-512 where the CPU has it, held to that reference bit
 * for bit).
 */
#include <float.h>
#include <math.h>
#include <string.h>
#include "kernels/cpu/cpu_fp8.h"
#include "kernels/cpu/cpu_fp8_seg.h"

#define SEG 128   /* elements widened to f32 at a time (a tile) */

typedef cpu_fp8_seen seen;

static void seen_add(seen *to, const seen *s)
{
    if (s->amax > to->amax) to->amax = s->amax;
    to->nan |= s->nan, to->saturated += s->saturated, to->flushed += s->flushed;
}

/* len (at most SEG) elements of x from off as f32: in place for f32, else
 * widened into buf */
static const float *seg_view(mp_dtype dt, const void *x, int64_t off, int64_t len, float *buf)
{
    if (dt == MP_F32) return (const float *)x + off;
    cpu_load(dt, x, off, buf, len);
    return buf;
}

/* the amax of n elements of x from element off */
static void seg_amax(const cpu_fp8_seg_path *p, mp_dtype dt, const void *x, int64_t off, int64_t n, seen *s)
{
    float buf[SEG];
    for (int64_t i = 0; i < n; i += SEG) {
        int64_t len = n - i < SEG ? n - i : SEG;
        p->amax(seg_view(dt, x, off + i, len, buf), len, s);
    }
}

/* n elements of x from off, times sc, to codes at q + off; counts into s, and
 * with amax != 0 the amax too, from the same read */
static void seg_quant(const cpu_fp8_seg_path *p, mp_dtype dt, const void *x, int64_t off, int64_t n, float sc,
                      mp_fp8_format fmt, int amax, uint8_t *q, seen *s)
{
    float buf[SEG];
    for (int64_t i = 0; i < n; i += SEG) {
        int64_t len = n - i < SEG ? n - i : SEG;
        const float *v = seg_view(dt, x, off + i, len, buf);
        if (amax) p->amax(v, len, s);
        p->codes(v, len, sc, fmt, q + off + i, s);
    }
}

/* the multiplier that takes a group of amax a to the format's largest value */
static float scale_of(float a, float fmax)
{
    if (!(a > 0.0f) || !isfinite(a)) return 1.0f;
    float s = fmax / a;
    return isfinite(s) ? s : FLT_MAX;
}

/* one row's MX blocks: amax, the E8M0 byte, the codes */
static void mx_row(const cpu_fp8_seg_path *p, mp_dtype dt, const void *x, int64_t row, int64_t k, mp_fp8_format fmt,
                   int emax, uint8_t *q, uint8_t *e8, seen *st)
{
    for (int64_t j = 0, b = 0; j < k; j += MP_FP8_MX_K, b++) {
        int64_t len = k - j < MP_FP8_MX_K ? k - j : MP_FP8_MX_K, off = row * k + j;
        seen s = {0};
        float buf[MP_FP8_MX_K];
        const float *v = seg_view(dt, x, off, len, buf);   /* read once: amax, then codes */
        p->amax(v, len, &s);
        int e = 0;
        if (s.nan || !isfinite(s.amax)) e8[b] = 0xff;   /* OCP MX: the block's scale is NaN */
        else if (s.amax == 0.0f) e8[b] = 127;           /* any scale is right for zeros: 1 */
        else {
            frexpf(s.amax, &e);                         /* amax = f 2^e, f in [0.5, 1) */
            e = e - 1 - emax;                           /* floor(log2 amax) - emax */
            e = e < -127 ? -127 : e > 127 ? 127 : e;
            e8[b] = (uint8_t)(e + 127);
        }
        p->codes(v, len, e8[b] == 0xff ? 1.0f : ldexpf(1.0f, -e), fmt, q + off, &s);
        seen_add(st, &s);
    }
}

int cpu_fp8_quantize(mp_kctx *cx, mp_dtype dt, const void *x, int64_t rows, int64_t k, mp_fp8_format fmt,
                     mp_fp8_gran g, const float *given_scale, uint8_t *q, void *scales, mp_fp8_stats *st)
{
    const cpu_fp8_seg_path *p = cpu_fp8_seg_best();
    float fmax = mp_fp8_to_f32(fmt.maxcode, fmt);
    int64_t n = rows * k, nk = (k + MP_FP8_TILE_K - 1) / MP_FP8_TILE_K;
    float amax = 0.0f;
    int nan = 0;
    int64_t sat = 0, flu = 0;
    if (g == MP_FP8_TENSOR) {
        float s;
        if (given_scale) s = *given_scale;
        else {
            #pragma omp parallel for if (n > MP_PAR_MIN_MEM) reduction(max : amax) reduction(| : nan)
            for (int64_t i = 0; i < n; i += 16 * MP_BLOCK) {
                seen t = {0};
                seg_amax(p, dt, x, i, n - i < 16 * MP_BLOCK ? n - i : 16 * MP_BLOCK, &t);
                if (t.amax > amax) amax = t.amax;
                nan |= t.nan;
            }
            s = scale_of(nan ? NAN : amax, fmax);
        }
        ((float *)scales)[0] = 1.0f / s;
        float am2 = 0.0f;
        int nan2 = 0;
        #pragma omp parallel for if (n > MP_PAR_MIN_MEM) reduction(max : am2) reduction(| : nan2) \
            reduction(+ : sat, flu)
        for (int64_t i = 0; i < n; i += 16 * MP_BLOCK) {
            int64_t len = n - i < 16 * MP_BLOCK ? n - i : 16 * MP_BLOCK;
            seen t = {0};
            /* given a scale, one pass: the amax comes with the codes */
            seg_quant(p, dt, x, i, len, s, fmt, given_scale != NULL, q, &t);
            if (t.amax > am2) am2 = t.amax;
            nan2 |= t.nan, sat += t.saturated, flu += t.flushed;
        }
        if (given_scale) amax = am2, nan = nan2;
    } else if (g == MP_FP8_TILE || g == MP_FP8_MX) {
        int emax = 0;
        frexpf(fmax, &emax);
        emax -= 1;   /* 8 for e4m3 (448 = 1.75 2^8), 15 for e5m2 */
        #pragma omp parallel for if (n > MP_PAR_MIN_MEM) reduction(max : amax) reduction(| : nan) \
            reduction(+ : sat, flu)
        for (int64_t r = 0; r < rows; r++) {
            seen t = {0};
            if (g == MP_FP8_MX) {
                mx_row(p, dt, x, r, k, fmt, emax, q, (uint8_t *)scales + r * ((k + MP_FP8_MX_K - 1) / MP_FP8_MX_K),
                       &t);
            } else {
                for (int64_t j = 0, b = 0; j < k; j += MP_FP8_TILE_K, b++) {
                    int64_t len = k - j < MP_FP8_TILE_K ? k - j : MP_FP8_TILE_K, off = r * k + j;
                    seen s = {0};
                    float buf[MP_FP8_TILE_K];
                    const float *v = seg_view(dt, x, off, len, buf);   /* read once: amax, then codes */
                    p->amax(v, len, &s);
                    float sc = scale_of(s.nan ? NAN : s.amax, fmax);
                    ((float *)scales)[r * nk + b] = 1.0f / sc;
                    p->codes(v, len, sc, fmt, q + off, &s);
                    seen_add(&t, &s);
                }
            }
            if (t.amax > amax) amax = t.amax;
            nan |= t.nan, sat += t.saturated, flu += t.flushed;
        }
    } else {   /* 128 x 128 blocks: one block per iteration */
        int64_t nr = (rows + MP_FP8_BLOCK_ROWS - 1) / MP_FP8_BLOCK_ROWS;
        #pragma omp parallel for if (n > MP_PAR_MIN_MEM) reduction(max : amax) reduction(| : nan) \
            reduction(+ : sat, flu) schedule(dynamic)
        for (int64_t bi = 0; bi < nr * nk; bi++) {
            int64_t r0 = bi / nk * MP_FP8_BLOCK_ROWS, j = bi % nk * MP_FP8_TILE_K;
            int64_t r1 = r0 + MP_FP8_BLOCK_ROWS < rows ? r0 + MP_FP8_BLOCK_ROWS : rows;
            int64_t len = k - j < MP_FP8_TILE_K ? k - j : MP_FP8_TILE_K;
            seen s = {0};
            for (int64_t r = r0; r < r1; r++) seg_amax(p, dt, x, r * k + j, len, &s);
            float sc = scale_of(s.nan ? NAN : s.amax, fmax);
            ((float *)scales)[bi] = 1.0f / sc;
            for (int64_t r = r0; r < r1; r++) seg_quant(p, dt, x, r * k + j, len, sc, fmt, 0, q, &s);
            if (s.amax > amax) amax = s.amax;
            nan |= s.nan, sat += s.saturated, flu += s.flushed;
        }
    }
    (void)cx;
    st->amax = nan ? NAN : amax;
    st->saturated = sat, st->flushed = flu;
    return 0;
}

/* the backend's fp8_quantize: the format by its dtype, the statistics as the
 * entry's four words (the amax's bits, the counts; word 3 the counts as two
 * f32, for a device tensor of them) */
int cpu_fp8_quantize_entry(mp_kctx *cx, mp_dtype dt, const void *x, int64_t rows, int64_t k, mp_dtype fmt, int g,
                           const float *given, uint8_t *q, void *scales, unsigned long long *st)
{
    mp_fp8_stats s;
    int r = cpu_fp8_quantize(cx, dt, x, rows, k, fmt == MP_E5M2 ? MP_FP8_E5M2 : MP_FP8_E4M3, (mp_fp8_gran)g, given, q,
                             scales, &s);
    st[0] = mp_f32_bits(s.amax), st[1] = (unsigned long long)s.saturated, st[2] = (unsigned long long)s.flushed;
    float f[2] = {(float)s.saturated, (float)s.flushed};
    memcpy(&st[3], f, sizeof f);
    return r;
}
