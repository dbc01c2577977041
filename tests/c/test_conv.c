/*
 * test_conv.c: the CPU convolution kernels (kernels/cpu/cpu_conv.c) against the
 * exact convolution (double) of the same stored values, forward and every
 * gradient, in f32, f16 and bf16, with oneDNN and without it (the paths that
 * stand in for it: OpenBLAS for f32, widening for bf16), over shapes with
 * stride, padding, dilation, groups and a batch cut into chunks.
 *
 * Bound: f32 accumulation over K terms may differ from the exact sum by
 * (K + 2) 2^-24 of the terms' magnitudes summed; the one rounding into f16/bf16
 * adds half an ulp of the result (2^-11, 2^-8 relative), and the exact value
 * may sit on the other side of a rounding boundary: one ulp allowed.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"

static void put(mp_dtype dt, void *p, int64_t i, float v)
{
    if (dt == MP_F32) ((float *)p)[i] = v;
    else if (dt == MP_F16) ((uint16_t *)p)[i] = mp_f32_to_f16(v);
    else ((uint16_t *)p)[i] = mp_f32_to_bf16(v);
}

static double get(mp_dtype dt, const void *p, int64_t i)
{
    if (dt == MP_F32) return ((const float *)p)[i];
    if (dt == MP_F16) return mp_f16_to_f32(((const uint16_t *)p)[i]);
    return mp_bf16_to_f32(((const uint16_t *)p)[i]);
}

static void *rand_buf(mp_dtype dt, int64_t n, unsigned *seed)
{
    void *p = malloc(4 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) put(dt, p, i, (float)(rand_r(seed) % 2001 - 1000) / 700.0f);
    return p;
}

/* the relative rounding of a result in dt (one ulp: the exact value may be a
 * rounding boundary away) */
static double ulp(mp_dtype dt) { return dt == MP_F32 ? 0 : dt == MP_F16 ? ldexp(1, -10) : ldexp(1, -7); }

static const char *dn(mp_dtype dt) { return dt == MP_F32 ? "f32" : dt == MP_F16 ? "f16" : "bf16"; }

static void close_to(mp_dtype dt, double got, double want, double mag, int64_t terms, const char *what, int64_t i)
{
    double tol = (double)(terms + 2) * ldexp(1, -24) * mag + ulp(dt) * fabs(want) + 1e-30;
    if (dt == MP_F16) tol += ldexp(1, -24);   /* f16 subnormal spacing */
    cr_assert(fabs(got - want) <= tol, "%s %s[%ld]: %.9g, exact %.9g (tol %.3g)", dn(dt), what, (long)i, got,
              want, tol);
}

static void check(mp_dtype dt, const mp_conv_args *a0)
{
    mp_conv_args a = *a0;
    a.oh = (a.h + 2 * a.ph - a.dh * (a.r - 1) - 1) / a.sh + 1;
    a.ow = (a.w + 2 * a.pw - a.dw * (a.s - 1) - 1) / a.sw + 1;
    int64_t cg = a.c / a.groups, kg = a.k / a.groups;
    int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * cg * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
    unsigned seed = (unsigned)(nx + nw * 7);
    void *x = rand_buf(dt, nx, &seed), *w = rand_buf(dt, nw, &seed), *b = rand_buf(dt, a.k, &seed);
    void *gy = rand_buf(dt, ny, &seed), *y = malloc(4 * (size_t)ny), *gx = malloc(4 * (size_t)nx);
    void *gw = malloc(4 * (size_t)nw);
    float *gb = malloc(4 * (size_t)a.k);
    double *gxr = calloc((size_t)nx, sizeof(double)), *gxm = calloc((size_t)nx, sizeof(double));
    double *gwr = calloc((size_t)nw, sizeof(double)), *gwm = calloc((size_t)nw, sizeof(double));
    mp_kctx *cx = mp_cpu_backend.ctx;
    cr_assert_eq(cpu_conv2d(cx, dt, y, x, w, b, &a), 0);
    cr_assert_eq(cpu_conv2d_grad(cx, dt, gx, gw, gb, gy, x, w, &a), 0);
    for (int64_t n = 0; n < a.n; n++)
        for (int64_t k = 0; k < a.k; k++) {
            int64_t g = k / kg;
            for (int64_t i = 0; i < a.oh; i++)
                for (int64_t j = 0; j < a.ow; j++) {
                    int64_t yi = ((n * a.k + k) * a.oh + i) * a.ow + j;
                    double s = get(dt, b, k), mag = fabs(s), gyv = get(dt, gy, yi);
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t u = 0; u < a.r; u++)
                            for (int64_t v = 0; v < a.s; v++) {
                                int64_t ih = i * a.sh - a.ph + u * a.dh, iw = j * a.sw - a.pw + v * a.dw;
                                if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) continue;
                                int64_t xi = ((n * a.c + g * cg + c) * a.h + ih) * a.w + iw;
                                int64_t wi = ((k * cg + c) * a.r + u) * a.s + v;
                                double t = get(dt, x, xi) * get(dt, w, wi);
                                s += t, mag += fabs(t);
                                gxr[xi] += gyv * get(dt, w, wi), gxm[xi] += fabs(gyv * get(dt, w, wi));
                                gwr[wi] += gyv * get(dt, x, xi), gwm[wi] += fabs(gyv * get(dt, x, xi));
                            }
                    close_to(dt, get(dt, y, yi), s, mag, cg * a.r * a.s + 1, "y", yi);
                }
        }
    int64_t terms_x = kg * a.r * a.s, terms_w = a.n * a.oh * a.ow;
    for (int64_t i = 0; i < nx; i++) close_to(dt, get(dt, gx, i), gxr[i], gxm[i], terms_x, "gx", i);
    for (int64_t i = 0; i < nw; i++) close_to(dt, get(dt, gw, i), gwr[i], gwm[i], terms_w, "gw", i);
    for (int64_t k = 0; k < a.k; k++) {
        double s = 0, m = 0;
        for (int64_t n = 0; n < a.n; n++)
            for (int64_t e = 0; e < a.oh * a.ow; e++) {
                double v = get(dt, gy, (n * a.k + k) * a.oh * a.ow + e);
                s += v, m += fabs(v);
            }
        close_to(MP_F32, gb[k], s, m, a.n * a.oh * a.ow, "gb", k);
    }
    free(x), free(w), free(b), free(gy), free(y), free(gx), free(gw), free(gb);
    free(gxr), free(gxm), free(gwr), free(gwm);
}

static const mp_conv_args shapes[] = {
    {.n = 2, .c = 3, .h = 7, .w = 6, .k = 4, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1},
    {.n = 3, .c = 4, .h = 9, .w = 8, .k = 6, .r = 3, .s = 2, .sh = 2, .sw = 3, .ph = 2, .pw = 1, .dh = 2, .dw = 1, .groups = 2},
    {.n = 2, .c = 4, .h = 5, .w = 5, .k = 4, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 4},
    {.n = 1, .c = 2, .h = 4, .w = 3, .k = 3, .r = 1, .s = 1, .sh = 1, .sw = 1, .ph = 0, .pw = 0, .dh = 1, .dw = 1, .groups = 1},
    /* 16 x 9 x 62 x 62 columns per image: chunks of 7 images */
    {.n = 9, .c = 16, .h = 64, .w = 64, .k = 2, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 0, .pw = 0, .dh = 1, .dw = 1, .groups = 1},
};

static void sweep(void)
{
    static const mp_dtype dts[] = {MP_F32, MP_F16, MP_BF16};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) check(dts[d], &shapes[s]);
}

Test(conv, matches_the_exact_convolution_with_onednn) { sweep(); }

Test(conv, matches_the_exact_convolution_without_onednn)
{
    int was = cpu_dnnl_enable(0);
    sweep();
    cpu_dnnl_enable(was);
}
