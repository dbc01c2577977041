/*
 * cuda_pool.cu: 2-d max and average pooling (plain and adaptive) over the
 * planes of NCHW tensors (mp_pool_args in backend.h), the CPU's rules and sums
 * in the CPU's order: a thread per output for the forward (the window's
 * elements in row order), a thread per input for the backward, gathering the
 * outputs whose windows hold it in output order. No atomics: the same bits as
 * the CPU backend and on every run.
 */
#include "kernels/cuda/cuda.h"

/* the input rows [*lo, *hi) of output row i (columns alike), as cpu_pool.c */
__device__ __forceinline__ void window(const mp_pool_args a, int64_t i, int64_t n, int64_t on, int64_t k, int64_t s,
                                       int64_t p, int64_t *lo, int64_t *hi)
{
    if (a.adaptive) {
        *lo = i * n / on;
        *hi = ((i + 1) * n + on - 1) / on;
        return;
    }
    int64_t b = i * s - p, e = b + k;
    *lo = b < 0 ? 0 : b;
    *hi = e > n ? n : e;
}

/* the output rows whose windows may hold input row r: [*lo, *hi), a superset
 * that the caller checks against window() */
__device__ __forceinline__ void outputs_of(const mp_pool_args a, int64_t r, int64_t n, int64_t on, int64_t k,
                                           int64_t s, int64_t p, int64_t *lo, int64_t *hi)
{
    if (a.adaptive) {
        int64_t c = r * on / n;
        *lo = c > 0 ? c - 1 : 0;
        *hi = (r + 1) * on / n + 2;
    } else {
        int64_t t = r + p - k + 1;   /* i * s >= t */
        *lo = t <= 0 ? 0 : (t + s - 1) / s;
        *hi = (r + p) / s + 1;
    }
    if (*hi > on) *hi = on;
}

__device__ __forceinline__ float divisor(const mp_pool_args a, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
    return a.adaptive ? (float)((r1 - r0) * (c1 - c0)) : (float)(a.kh * a.kw);
}

__global__ void k_max_pool(mp_dtype dt, void *y, int32_t *idx, const void *x, const mp_pool_args a,
                           unsigned long long *fc)
{
    mp_tally tl(fc);
    int64_t ohw = a.oh * a.ow, hw = a.h * a.w;
    MP_FOR(o, a.planes * ohw) {
        int64_t p = o / ohw, i = o % ohw / a.ow, j = o % a.ow, r0, r1, c0, c1;
        window(a, i, a.h, a.oh, a.kh, a.sh, a.ph, &r0, &r1);
        window(a, j, a.w, a.ow, a.kw, a.sw, a.pw, &c0, &c1);
        const int64_t base = p * hw;
        float m = -INFINITY;
        int32_t at = r0 < r1 && c0 < c1 ? (int32_t)(r0 * a.w + c0) : -1;
        bool nan = false;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) {
                float v = mp_ld(dt, x, base + r * a.w + c);
                if (isnan(v)) nan = true, m = v, at = (int32_t)(r * a.w + c);   /* the last NaN wins */
                else if (!nan && v > m) m = v, at = (int32_t)(r * a.w + c);
            }
        mp_stc(dt, y, o, m, tl);
        idx[o] = at;
    }
    tl.commit();
}

__global__ void k_max_pool_grad(mp_dtype dt, void *gx, const void *gy, const int32_t *idx, const mp_pool_args a,
                                unsigned long long *fc)
{
    mp_tally tl(fc);
    int64_t ohw = a.oh * a.ow, hw = a.h * a.w;
    MP_FOR(e, a.planes * hw) {
        int64_t p = e / hw, r = e % hw / a.w, c = e % a.w, i0, i1, j0, j1;
        outputs_of(a, r, a.h, a.oh, a.kh, a.sh, a.ph, &i0, &i1);
        outputs_of(a, c, a.w, a.ow, a.kw, a.sw, a.pw, &j0, &j1);
        float s = 0.0f;
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = j0; j < j1; j++) {
                int64_t o = p * ohw + i * a.ow + j;
                if (idx[o] == (int32_t)(r * a.w + c)) s += mp_ld(dt, gy, o);
            }
        mp_stc(dt, gx, e, s, tl);
    }
    tl.commit();
}

__global__ void k_avg_pool(mp_dtype dt, void *y, const void *x, const mp_pool_args a, unsigned long long *fc)
{
    mp_tally tl(fc);
    int64_t ohw = a.oh * a.ow, hw = a.h * a.w;
    MP_FOR(o, a.planes * ohw) {
        int64_t p = o / ohw, i = o % ohw / a.ow, j = o % a.ow, r0, r1, c0, c1;
        window(a, i, a.h, a.oh, a.kh, a.sh, a.ph, &r0, &r1);
        window(a, j, a.w, a.ow, a.kw, a.sw, a.pw, &c0, &c1);
        float s = 0.0f;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) s += mp_ld(dt, x, p * hw + r * a.w + c);
        mp_stc(dt, y, o, s / divisor(a, r0, r1, c0, c1), tl);
    }
    tl.commit();
}

__global__ void k_avg_pool_grad(mp_dtype dt, void *gx, const void *gy, const mp_pool_args a, unsigned long long *fc)
{
    mp_tally tl(fc);
    int64_t ohw = a.oh * a.ow, hw = a.h * a.w;
    MP_FOR(e, a.planes * hw) {
        int64_t p = e / hw, r = e % hw / a.w, c = e % a.w, i0, i1, j0, j1;
        outputs_of(a, r, a.h, a.oh, a.kh, a.sh, a.ph, &i0, &i1);
        outputs_of(a, c, a.w, a.ow, a.kw, a.sw, a.pw, &j0, &j1);
        float s = 0.0f;
        for (int64_t i = i0; i < i1; i++) {
            int64_t r0, r1;
            window(a, i, a.h, a.oh, a.kh, a.sh, a.ph, &r0, &r1);
            if (r < r0 || r >= r1) continue;
            for (int64_t j = j0; j < j1; j++) {
                int64_t c0, c1;
                window(a, j, a.w, a.ow, a.kw, a.sw, a.pw, &c0, &c1);
                if (c < c0 || c >= c1) continue;
                s += mp_ld(dt, gy, p * ohw + i * a.ow + j) / divisor(a, r0, r1, c0, c1);
            }
        }
        mp_stc(dt, gx, e, s, tl);
    }
    tl.commit();
}

int mp_cuda_max_pool2d(mp_kctx *cx, mp_dtype dt, void *y, int32_t *idx, const void *x, const mp_pool_args *a)
{
    int64_t n = a->planes * a->oh * a->ow;
    if (n == 0) return 0;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, k_max_pool, dt, y, idx, x, *a, cx->flush);
    MP_LAUNCHED("max_pool2d");
    return 0;
}

int mp_cuda_max_pool2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const int32_t *idx,
                            const mp_pool_args *a)
{
    int64_t n = a->planes * a->h * a->w;
    if (n == 0) return 0;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, k_max_pool_grad, dt, gx, gy, idx, *a, cx->flush);
    MP_LAUNCHED("max_pool2d_grad");
    return 0;
}

int mp_cuda_avg_pool2d(mp_kctx *cx, mp_dtype dt, void *y, const void *x, const mp_pool_args *a)
{
    int64_t n = a->planes * a->oh * a->ow;
    if (n == 0) return 0;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, k_avg_pool, dt, y, x, *a, cx->flush);
    MP_LAUNCHED("avg_pool2d");
    return 0;
}

int mp_cuda_avg_pool2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const mp_pool_args *a)
{
    int64_t n = a->planes * a->h * a->w;
    if (n == 0) return 0;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, k_avg_pool_grad, dt, gx, gy, *a, cx->flush);
    MP_LAUNCHED("avg_pool2d_grad");
    return 0;
}
