/*
 * test_pool.c: max pooling against an oracle written here from PyTorch's rule
 * (each window scanned in row order from -inf: the first of equal maxima wins;
 * a window holding a NaN gives its last NaN, payload and all), value and
 * position bit for bit, forward and backward (gradients added at the positions
 * into zeros: -0 gives +0, NaNs pass), f32/f16/bf16, on 1 and 2 threads.
 *
 * The 2 x 2, stride 2 windows take row kernels (cpu_pool.c: max2x2_row and
 * max2x2_grad_row, and their AVX-512 forms, both run here) and everything else the general loop, so
 * the shapes here have rows of 1 to 9, 14, 17, 20, 33 and 65 windows (every
 * mask of the AVX-512 form, the vectoriser's body and tails), odd widths and heights
 * (a last column or row no whole window covers), output sizes past
 * the whole windows (a clipped last window, as ceil_mode makes), and data drawn
 * from a few values (ties everywhere), with -inf, +inf, -0/+0 and NaNs of
 * several payloads planted.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"

static void *alloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    cr_assert(p);
    return p;
}

static float get(mp_dtype dt, const void *p, int64_t i)
{
    if (dt == MP_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == MP_F16 ? mp_f16_to_f32(h) : mp_bf16_to_f32(h);
}

static void put(mp_dtype dt, void *p, int64_t i, float v)
{
    if (dt == MP_F32) ((float *)p)[i] = v;
    else if (dt == MP_F16) ((uint16_t *)p)[i] = mp_f32_to_f16(v);
    else ((uint16_t *)p)[i] = mp_f32_to_bf16(v);
}

static size_t esize(mp_dtype dt) { return dt == MP_F32 ? 4 : 2; }

/* few distinct values (ties), specials planted at a rate of about one in 16 */
static void fill(mp_dtype dt, void *p, int64_t n, unsigned *seed, int nans)
{
    static const uint32_t nan_bits[3] = {0x7fc00000u, 0xffc00000u, 0x7fa50000u};
    for (int64_t i = 0; i < n; i++) {
        int r = rand_r(seed) % 64;
        float v = (float)(rand_r(seed) % 7) - 3.0f;
        if (r == 0) v = -INFINITY;
        else if (r == 1) v = INFINITY;
        else if (r == 2) v = -0.0f;
        else if (r == 3 && nans) {
            uint32_t b = nan_bits[rand_r(seed) % 3];
            memcpy(&v, &b, 4);
        }
        put(dt, p, i, v);
    }
}

/* the oracle: window (i, j) of plane p, PyTorch's rule; -inf and -1 when empty */
static float oracle(mp_dtype dt, const void *x, const mp_pool_args *a, int64_t p, int64_t i, int64_t j, int32_t *at)
{
    float m = -INFINITY;
    int32_t pos = -1, nan_at = -1;
    for (int64_t r = i * a->sh - a->ph; r < i * a->sh - a->ph + a->kh; r++)
        for (int64_t c = j * a->sw - a->pw; c < j * a->sw - a->pw + a->kw; c++) {
            if (r < 0 || r >= a->h || c < 0 || c >= a->w) continue;
            float v = get(dt, x, p * a->h * a->w + r * a->w + c);
            if (pos < 0) pos = (int32_t)(r * a->w + c);
            if (isnan(v)) nan_at = (int32_t)(r * a->w + c);
            else if (v > m) m = v, pos = (int32_t)(r * a->w + c);
        }
    if (nan_at >= 0) m = get(dt, x, p * a->h * a->w + nan_at), pos = nan_at;
    *at = pos;
    return m;
}

static void check(mp_dtype dt, int64_t planes, int64_t h, int64_t w, int64_t k, int64_t s, int64_t pad, int ceil_mode,
                  int nans)
{
    mp_pool_args a = {.planes = planes, .h = h, .w = w, .kh = k, .kw = k, .sh = s, .sw = s, .ph = pad, .pw = pad};
    a.oh = (h + 2 * pad - k + (ceil_mode ? s - 1 : 0)) / s + 1;
    a.ow = (w + 2 * pad - k + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (a.oh - 1) * s >= h + pad) a.oh--;   /* PyTorch: the last window starts inside */
    if (ceil_mode && (a.ow - 1) * s >= w + pad) a.ow--;
    int64_t n = planes * h * w, on = planes * a.oh * a.ow;
    unsigned seed = (unsigned)(h * 131 + w * 7 + k + dt);
    void *x = alloc(esize(dt) * n), *gy = alloc(esize(dt) * on), *y[2], *gx[2];
    int32_t *idx[2];
    fill(dt, x, n, &seed, nans);
    for (int64_t i = 0; i < on; i++) {   /* eighths, some -0 (0 + -0 is +0) and NaNs */
        int r = rand_r(&seed) % 32;
        put(dt, gy, i, r == 0 ? -0.0f : r == 1 ? -NAN : (float)(rand_r(&seed) % 17 - 8) / 8.0f);
    }
    mp_kctx *cx = mp_cpu_backend.ctx;
    int was = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        y[t] = alloc(esize(dt) * on), gx[t] = alloc(esize(dt) * n), idx[t] = alloc(sizeof(int32_t) * on);
        omp_set_num_threads(t + 1);
        cr_assert_eq(cpu_max_pool2d(cx, dt, y[t], idx[t], x, &a), 0);
        cr_assert_eq(cpu_max_pool2d_grad(cx, dt, gx[t], gy, idx[t], &a), 0);
    }
    omp_set_num_threads(was);
    float *want_gx = alloc(sizeof(float) * n);
    for (int64_t p = 0; p < planes; p++)
        for (int64_t i = 0; i < a.oh; i++)
            for (int64_t j = 0; j < a.ow; j++) {
                int32_t at;
                int64_t o = p * a.oh * a.ow + i * a.ow + j;
                float want = oracle(dt, x, &a, p, i, j, &at), got = get(dt, y[0], o);
                cr_assert_eq(idx[0][o], at, "dtype %d {%ld,%ld,%ld} k%ld s%ld p%ld: window (%ld,%ld,%ld) at %d, want %d",
                             dt, (long)planes, (long)h, (long)w, (long)k, (long)s, (long)pad, (long)p, (long)i, (long)j,
                             idx[0][o], at);
                cr_assert(memcmp(&got, &want, 4) == 0 || (dt != MP_F32 && isnan(got) && isnan(want)),
                          "dtype %d: window (%ld,%ld,%ld) max %g, want %g", dt, (long)p, (long)i, (long)j, got, want);
                if (at >= 0) want_gx[p * h * w + at] += get(dt, gy, o);
            }
    if (dt == MP_F32) cr_assert(memcmp(y[0], y[1], 4 * (size_t)on) == 0, "f32 y differs between 1 and 2 threads");
    else cr_assert(memcmp(y[0], y[1], 2 * (size_t)on) == 0, "y differs between 1 and 2 threads");
    cr_assert(memcmp(idx[0], idx[1], sizeof(int32_t) * (size_t)on) == 0, "positions differ between 1 and 2 threads");
    cr_assert(memcmp(gx[0], gx[1], esize(dt) * (size_t)n) == 0, "gx differs between 1 and 2 threads");
    for (int64_t i = 0; i < n; i++) {   /* gy is a few eighths: the sums are exact in every dtype */
        float got = get(dt, gx[0], i);
        uint32_t gb, wb;
        memcpy(&gb, &got, 4), memcpy(&wb, &want_gx[i], 4);
        cr_assert(gb == wb, "dtype %d: gx[%ld] %g (0x%08x), want %g (0x%08x)", dt, (long)i, got, gb, want_gx[i], wb);
    }
    for (int t = 0; t < 2; t++) free(y[t]), free(gx[t]), free(idx[t]);
    free(x), free(gy), free(want_gx);
}

static const mp_dtype dts[3] = {MP_F32, MP_F16, MP_BF16};

Test(pool, max_2x2_stride_2_matches_the_rule)
{
    for (int v = 0; v < 2; v++)   /* the AVX-512 row kernel (where the CPU has it), then the portable one */
    for (int d = 0; d < 3; d++) {
        cpu_pool_avx512_enable(!v);
        check(dts[d], 5, 28, 28, 2, 2, 0, 0, 1);    /* the CNN's shapes, whole windows */
        check(dts[d], 3, 14, 14, 2, 2, 0, 0, 1);
        check(dts[d], 3, 9, 67, 2, 2, 0, 0, 1);     /* odd: a last row and column left out */
        check(dts[d], 3, 9, 67, 2, 2, 0, 1, 1);     /* ceil_mode: a clipped last window */
        check(dts[d], 2, 4, 130, 2, 2, 0, 0, 0);    /* ties only, no NaN */
        check(dts[d], 1100, 6, 40, 2, 2, 0, 0, 1);  /* enough planes for both threads: */
        cr_assert(1100 * 6 * 40 >= MP_PAR_MIN, "the shape above no longer splits over threads");
        check(dts[d], 2, 8, 66, 2, 2, 0, 0, 1);     /* 33 windows: two whole vectors and one */
        check(dts[d], 2, 8, 34, 2, 2, 0, 0, 1);     /* 17, and rows of 1 to 9 windows: */
        for (int64_t w = 2; w <= 19; w++) check(dts[d], 2, 6, w, 2, 2, 0, 0, 1);   /* every mask */
    }
    cpu_pool_avx512_enable(1);
}

Test(pool, max_other_windows_match_the_rule)
{
    for (int d = 0; d < 3; d++) {
        check(dts[d], 3, 11, 37, 2, 2, 1, 0, 1);    /* padded: the general loop */
        check(dts[d], 3, 11, 37, 3, 2, 1, 0, 1);    /* overlapping windows */
        check(dts[d], 3, 11, 37, 2, 1, 0, 0, 1);
        check(dts[d], 3, 12, 36, 3, 3, 0, 1, 1);
        check(dts[d], 700, 11, 37, 3, 2, 1, 0, 1);  /* enough planes for both threads: */
        cr_assert(700 * 11 * 37 >= MP_PAR_MIN, "the shape above no longer splits over threads");
    }
}
