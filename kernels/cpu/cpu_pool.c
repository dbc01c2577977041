/*
 * cpu_pool.c: 2-d max and average pooling (plain and adaptive) over the planes
 * of NCHW tensors, forward and backward (mp_pool_args in backend.h). Each plane
 * is widened to f32 once, windows are read in row order, results rounded once;
 * planes run in parallel, each on one thread, so the bits do not depend on the
 * thread count. Max pooling's common window, 2 x 2 at stride 2 unpadded, takes
 * a row kernel of its own (max2x2_row, and its AVX-512 form with masked tails):
 * with the general loop it was 22% of the bf16 CNN step's perf samples, with
 * the row kernel 2.9%; its backward writes planes such windows tile row pair
 * by row pair (max2x2_grad_row). Max pooling reads and writes f32 planes in
 * place (no copy through scratch).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"

/* the input rows [*lo, *hi) of output row i (columns: the same with w/ow/kw/sw/pw) */
static inline void window(const mp_pool_args *a, int64_t i, int64_t n, int64_t on, int64_t k, int64_t s, int64_t p,
                   int64_t *lo, int64_t *hi)
{
    if (a->adaptive) {
        *lo = i * n / on;
        *hi = ((i + 1) * n + on - 1) / on;
        return;
    }
    int64_t b = i * s - p, e = b + k;
    *lo = b < 0 ? 0 : b;
    *hi = e > n ? n : e;
}

/* the divisor of an average window: kh * kw, or the window's size when adaptive */
static float divisor(const mp_pool_args *a, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
    return a->adaptive ? (float)((r1 - r0) * (c1 - c0)) : (float)(a->kh * a->kw);
}

/* per-thread f32 planes: in (h * w) and out (oh * ow) */
static float *planes(mp_kctx *cx, const mp_pool_args *a, int64_t *stride, int *threads)
{
    int64_t work = a->planes * a->h * a->w;
    *threads = work >= MP_PAR_MIN && a->planes > 1 ? omp_get_max_threads() : 1;
    *stride = (a->h * a->w + a->oh * a->ow + 15) & ~(int64_t)15;
    return cpu_scratch(cx, 3, sizeof(float) * (size_t)(*stride * *threads));
}

/* the largest of a window (rows r0..r1, columns c0..c1 of a plane w wide) and
 * its position: the first of equals, starting from the window's first element
 * at -inf (PyTorch's rule). Branch-free: which element wins is data, and a
 * branch on it mispredicts half the time. *nan: the window holds a NaN. */
static inline float window_max(const float *x, int64_t w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int32_t *at,
                               int *nan)
{
    float m = -INFINITY;
    uint32_t pos = r0 < r1 && c0 < c1 ? (uint32_t)(r0 * w + c0) : UINT32_MAX, bad = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            float v = x[r * w + c];
            uint32_t gt = 0u - (uint32_t)(v > m);
            bad |= (uint32_t)(v != v);
            m = v > m ? v : m;
            pos = (pos & ~gt) | ((uint32_t)(r * w + c) & gt);
        }
    *at = (int32_t)pos, *nan = (int)bad;
    return m;
}

/* The common 2 x 2 window at stride 2 without padding, n whole windows of input
 * rows x0 and x1 = x0 + w (at plane position base): the same decisions as
 * window_max and the NaN rule after it, in the same order (a, b, c, d), so the
 * same values and positions; written for the vectoriser (the stride-2 loads
 * become permutes and the decisions masks), which window_max's general loops
 * defeat: max pooling was a fifth of the bf16 CNN step. */
MP_SIMD static void max2x2_row(const float *x0, const float *x1, int64_t n, int32_t base, int32_t w, float *y,
                               int32_t *idx)
{
    for (int64_t j = 0; j < n; j++) {
        float a = x0[2 * j], b = x0[2 * j + 1], c = x1[2 * j], d = x1[2 * j + 1];
        int32_t pa = base + 2 * (int32_t)j, pc = pa + w, pos = pa;
        float m = a > -INFINITY ? a : -INFINITY;
        pos = b > m ? pa + 1 : pos, m = b > m ? b : m;
        pos = c > m ? pc : pos, m = c > m ? c : m;
        pos = d > m ? pc + 1 : pos, m = d > m ? d : m;
        if (a != a) m = a, pos = pa;   /* a NaN wins: the last one */
        if (b != b) m = b, pos = pa + 1;
        if (c != c) m = c, pos = pc;
        if (d != d) m = d, pos = pc + 1;
        y[j] = m, idx[j] = pos;
    }
}

/* max2x2_row's backward: rows x0 and x1 = x0 + w of the gradient (all 2n
 * values written) from n windows' gradients g and positions at: each value
 * 0 + g where the window's maximum was, else 0, which is what zeroing the plane
 * and adding g at the position gives (-0 becomes +0 either way) */
MP_SIMD static void max2x2_grad_row(float *x0, float *x1, int64_t n, int32_t base, int32_t w, const float *g,
                                    const int32_t *at)
{
    for (int64_t j = 0; j < n; j++) {
        int32_t pa = base + 2 * (int32_t)j, pc = pa + w, p = at[j];
        float v = g[j];
        x0[2 * j] = 0.0f + (p == pa ? v : 0.0f), x0[2 * j + 1] = 0.0f + (p == pa + 1 ? v : 0.0f);
        x1[2 * j] = 0.0f + (p == pc ? v : 0.0f), x1[2 * j + 1] = 0.0f + (p == pc + 1 ? v : 0.0f);
    }
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define POOL_FN __attribute__((target("avx512f")))

/* max2x2_row in 16 windows at a time, the rows' tails through masks: the CNN's
 * rows are 14 and 7 windows, too short for the vectoriser's 16-lane body, whose
 * scalar tail then took them all */
POOL_FN static void max2x2_row_avx512(const float *x0, const float *x1, int64_t n, int32_t base, int32_t w, float *y,
                                      int32_t *idx)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1)), one = _mm512_set1_epi32(1);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        __mmask16 mo = (__mmask16)((1u << k) - 1), ml = k >= 8 ? 0xffff : (__mmask16)((1u << 2 * k) - 1);
        __mmask16 mh = k > 8 ? (__mmask16)((1u << (2 * k - 16)) - 1) : 0;
        __m512 l0 = _mm512_maskz_loadu_ps(ml, x0 + 2 * j), h0 = _mm512_maskz_loadu_ps(mh, x0 + 2 * j + 16);
        __m512 l1 = _mm512_maskz_loadu_ps(ml, x1 + 2 * j), h1 = _mm512_maskz_loadu_ps(mh, x1 + 2 * j + 16);
        __m512 a = _mm512_permutex2var_ps(l0, even, h0), b = _mm512_permutex2var_ps(l0, odd, h0);
        __m512 c = _mm512_permutex2var_ps(l1, even, h1), d = _mm512_permutex2var_ps(l1, odd, h1);
        __m512i pa = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * (int32_t)j), even);
        __m512i pb = _mm512_add_epi32(pa, one), pc = _mm512_add_epi32(pa, _mm512_set1_epi32(w));
        __m512i pd = _mm512_add_epi32(pc, one), pos = pa;
        __m512 m = _mm512_mask_mov_ps(ninf, _mm512_cmp_ps_mask(a, ninf, _CMP_GT_OQ), a);
        __mmask16 gt = _mm512_cmp_ps_mask(b, m, _CMP_GT_OQ);
        m = _mm512_mask_mov_ps(m, gt, b), pos = _mm512_mask_mov_epi32(pos, gt, pb);
        gt = _mm512_cmp_ps_mask(c, m, _CMP_GT_OQ);
        m = _mm512_mask_mov_ps(m, gt, c), pos = _mm512_mask_mov_epi32(pos, gt, pc);
        gt = _mm512_cmp_ps_mask(d, m, _CMP_GT_OQ);
        m = _mm512_mask_mov_ps(m, gt, d), pos = _mm512_mask_mov_epi32(pos, gt, pd);
        __mmask16 na = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), nb = _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
        __mmask16 nc = _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q), nd = _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
        m = _mm512_mask_mov_ps(m, na, a), pos = _mm512_mask_mov_epi32(pos, na, pa);   /* the last NaN wins */
        m = _mm512_mask_mov_ps(m, nb, b), pos = _mm512_mask_mov_epi32(pos, nb, pb);
        m = _mm512_mask_mov_ps(m, nc, c), pos = _mm512_mask_mov_epi32(pos, nc, pc);
        m = _mm512_mask_mov_ps(m, nd, d), pos = _mm512_mask_mov_epi32(pos, nd, pd);
        _mm512_mask_storeu_ps(y + j, mo, m);
        _mm512_mask_storeu_epi32(idx + j, mo, pos);
    }
}

/* max2x2_grad_row in 16 windows at a time, tails through masks */
POOL_FN static void max2x2_grad_row_avx512(float *x0, float *x1, int64_t n, int32_t base, int32_t w, const float *g,
                                           const int32_t *at)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8)), one = _mm512_set1_epi32(1);
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        __mmask16 mo = (__mmask16)((1u << k) - 1), ml = k >= 8 ? 0xffff : (__mmask16)((1u << 2 * k) - 1);
        __mmask16 mh = k > 8 ? (__mmask16)((1u << (2 * k - 16)) - 1) : 0;
        __m512 v = _mm512_maskz_loadu_ps(mo, g + j);
        __m512i p = _mm512_maskz_loadu_epi32(mo, at + j);
        __m512i pa = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * (int32_t)j), even);
        __m512i pc = _mm512_add_epi32(pa, _mm512_set1_epi32(w));
        __m512 a = _mm512_add_ps(zero, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(p, pa), v));
        __m512 b = _mm512_add_ps(zero, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(p, _mm512_add_epi32(pa, one)), v));
        __m512 c = _mm512_add_ps(zero, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(p, pc), v));
        __m512 d = _mm512_add_ps(zero, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(p, _mm512_add_epi32(pc, one)), v));
        _mm512_mask_storeu_ps(x0 + 2 * j, ml, _mm512_permutex2var_ps(a, lo, b));
        _mm512_mask_storeu_ps(x0 + 2 * j + 16, mh, _mm512_permutex2var_ps(a, hi, b));
        _mm512_mask_storeu_ps(x1 + 2 * j, ml, _mm512_permutex2var_ps(c, lo, d));
        _mm512_mask_storeu_ps(x1 + 2 * j + 16, mh, _mm512_permutex2var_ps(c, hi, d));
    }
}

static int has_avx512(void)
{
    static int has = -1;
    if (has < 0) has = __builtin_cpu_supports("avx512f");
    return has;
}
#else
static void max2x2_row_avx512(const float *x0, const float *x1, int64_t n, int32_t base, int32_t w, float *y,
                              int32_t *idx)
{
    max2x2_row(x0, x1, n, base, w, y, idx);
}
static void max2x2_grad_row_avx512(float *x0, float *x1, int64_t n, int32_t base, int32_t w, const float *g,
                                   const int32_t *at)
{
    max2x2_grad_row(x0, x1, n, base, w, g, at);
}
static int has_avx512(void) { return 0; }
#endif

static int avx512_on = 1;

/* the windows the row kernels take: 2 x 2 at stride 2, unpadded */
static int two_by_two(const mp_pool_args *a)
{
    return !a->adaptive && a->kh == 2 && a->kw == 2 && a->sh == 2 && a->sw == 2 && a->ph == 0 && a->pw == 0;
}

int cpu_pool_avx512_enable(int on)
{
    int was = avx512_on;
    avx512_on = on;
    return was;
}

int cpu_max_pool2d(mp_kctx *cx, mp_dtype dt, void *y, int32_t *idx, const void *x, const mp_pool_args *a)
{
    int64_t stride, hw = a->h * a->w, ohw = a->oh * a->ow;
    int threads;
    float *base = planes(cx, a, &stride, &threads);
    if (!base) return -1;
    int two = two_by_two(a);
    void (*row)(const float *, const float *, int64_t, int32_t, int32_t, float *, int32_t *) =
        avx512_on && has_avx512() ? max2x2_row_avx512 : max2x2_row;
    #pragma omp parallel for if (threads > 1) num_threads(threads) schedule(static)
    for (int64_t p = 0; p < a->planes; p++) {
        float *xs = base + stride * omp_get_thread_num(), *yf = xs + hw;
        const float *xf = xs;
        if (dt == MP_F32) xf = (const float *)x + p * hw, yf = (float *)y + p * ohw;   /* read and written in place */
        else cpu_load(dt, x, p * hw, xs, hw);
        for (int64_t i = 0; i < a->oh; i++) {
            int64_t r0, r1, c0, c1, j = 0;
            window(a, i, a->h, a->oh, a->kh, a->sh, a->ph, &r0, &r1);
            if (two && r1 - r0 == 2) {   /* the whole windows of this row; the rest below */
                j = a->ow < a->w / 2 ? a->ow : a->w / 2;
                row(xf + r0 * a->w, xf + (r0 + 1) * a->w, j, (int32_t)(r0 * a->w), (int32_t)a->w, yf + i * a->ow,
                    idx + p * ohw + i * a->ow);
            }
            for (; j < a->ow; j++) {
                window(a, j, a->w, a->ow, a->kw, a->sw, a->pw, &c0, &c1);
                int32_t at;
                int nan;
                float m = window_max(xf, a->w, r0, r1, c0, c1, &at, &nan);
                if (nan)   /* a NaN wins: the last one, as in PyTorch */
                    for (int64_t r = r0; r < r1; r++)
                        for (int64_t c = c0; c < c1; c++)
                            if (isnan(xf[r * a->w + c])) m = xf[r * a->w + c], at = (int32_t)(r * a->w + c);
                yf[i * a->ow + j] = m;
                idx[p * ohw + i * a->ow + j] = at;
            }
        }
        if (dt != MP_F32) cpu_store(cx, dt, y, p * ohw, yf, ohw);
    }
    return 0;
}

int cpu_max_pool2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const int32_t *idx, const mp_pool_args *a)
{
    int64_t stride, hw = a->h * a->w, ohw = a->oh * a->ow;
    int threads;
    float *base = planes(cx, a, &stride, &threads);
    if (!base) return -1;
    /* 2 x 2 windows at stride 2 tiling the plane (a last odd row or column left
     * out): each value of gx written once, row pair by row pair */
    int tiled = two_by_two(a) && a->oh == a->h / 2 && a->ow == a->w / 2;
    void (*row)(float *, float *, int64_t, int32_t, int32_t, const float *, const int32_t *) =
        avx512_on && has_avx512() ? max2x2_grad_row_avx512 : max2x2_grad_row;
    #pragma omp parallel for if (threads > 1) num_threads(threads) schedule(static)
    for (int64_t p = 0; p < a->planes; p++) {
        float *gxf = base + stride * omp_get_thread_num(), *gys = gxf + hw;
        const float *gyf = gys;
        if (dt == MP_F32) gxf = (float *)gx + p * hw, gyf = (const float *)gy + p * ohw;   /* in place */
        else cpu_load(dt, gy, p * ohw, gys, ohw);
        if (tiled) {
            for (int64_t i = 0; i < a->oh; i++) {
                float *r0 = gxf + 2 * i * a->w;
                row(r0, r0 + a->w, a->ow, (int32_t)(2 * i * a->w), (int32_t)a->w, gyf + i * a->ow,
                    idx + p * ohw + i * a->ow);
                if (a->w & 1) r0[a->w - 1] = 0.0f, r0[2 * a->w - 1] = 0.0f;
            }
            if (a->h & 1) memset(gxf + (a->h - 1) * a->w, 0, sizeof(float) * (size_t)a->w);
        } else {
            memset(gxf, 0, sizeof(float) * (size_t)hw);
            for (int64_t o = 0; o < ohw; o++) {   /* overlapping windows add in output order */
                int32_t at = idx[p * ohw + o];
                if (at >= 0) gxf[at] += gyf[o];
            }
        }
        if (dt != MP_F32) cpu_store(cx, dt, gx, p * hw, gxf, hw);
    }
    return 0;
}

int cpu_avg_pool2d(mp_kctx *cx, mp_dtype dt, void *y, const void *x, const mp_pool_args *a)
{
    int64_t stride, hw = a->h * a->w, ohw = a->oh * a->ow;
    int threads;
    float *base = planes(cx, a, &stride, &threads);
    if (!base) return -1;
    #pragma omp parallel for if (threads > 1) num_threads(threads) schedule(static)
    for (int64_t p = 0; p < a->planes; p++) {
        float *xf = base + stride * omp_get_thread_num(), *yf = xf + hw;
        cpu_load(dt, x, p * hw, xf, hw);
        for (int64_t i = 0; i < a->oh; i++) {
            int64_t r0, r1, c0, c1;
            window(a, i, a->h, a->oh, a->kh, a->sh, a->ph, &r0, &r1);
            for (int64_t j = 0; j < a->ow; j++) {
                window(a, j, a->w, a->ow, a->kw, a->sw, a->pw, &c0, &c1);
                float s = 0;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) s += xf[r * a->w + c];
                yf[i * a->ow + j] = s / divisor(a, r0, r1, c0, c1);
            }
        }
        cpu_store(cx, dt, y, p * ohw, yf, ohw);
    }
    return 0;
}

int cpu_avg_pool2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const mp_pool_args *a)
{
    int64_t stride, hw = a->h * a->w, ohw = a->oh * a->ow;
    int threads;
    float *base = planes(cx, a, &stride, &threads);
    if (!base) return -1;
    #pragma omp parallel for if (threads > 1) num_threads(threads) schedule(static)
    for (int64_t p = 0; p < a->planes; p++) {
        float *gxf = base + stride * omp_get_thread_num(), *gyf = gxf + hw;
        cpu_load(dt, gy, p * ohw, gyf, ohw);
        memset(gxf, 0, sizeof(float) * (size_t)hw);
        for (int64_t i = 0; i < a->oh; i++) {
            int64_t r0, r1, c0, c1;
            window(a, i, a->h, a->oh, a->kh, a->sh, a->ph, &r0, &r1);
            for (int64_t j = 0; j < a->ow; j++) {
                window(a, j, a->w, a->ow, a->kw, a->sw, a->pw, &c0, &c1);
                float g = gyf[i * a->ow + j] / divisor(a, r0, r1, c0, c1);
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) gxf[r * a->w + c] += g;
            }
        }
        cpu_store(cx, dt, gx, p * hw, gxf, hw);
    }
    return 0;
}
