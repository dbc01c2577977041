/*
 * cpu_pool.c: 2-d max and average pooling (plain and adaptive) over the planes
 * of NCHW tensors, forward and backward (mp_pool_args in backend.h). Each plane
 * is widened to f32 once, windows are read in row order, results rounded once;
 * planes run in parallel, each on one thread, so the bits do not depend on the
 * thread count.
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

int cpu_max_pool2d(mp_kctx *cx, mp_dtype dt, void *y, int32_t *idx, const void *x, const mp_pool_args *a)
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
        cpu_store(cx, dt, y, p * ohw, yf, ohw);
    }
    return 0;
}

int cpu_max_pool2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const int32_t *idx, const mp_pool_args *a)
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
        for (int64_t o = 0; o < ohw; o++) {   /* overlapping windows add in output order */
            int32_t at = idx[p * ohw + o];
            if (at >= 0) gxf[at] += gyf[o];
        }
        cpu_store(cx, dt, gx, p * hw, gxf, hw);
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
