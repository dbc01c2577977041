/*
 * test_gemm_dnnl.c: f32 and bf16 products through oneDNN
 * (kernels/cpu/cpu_gemm_dnnl.c) against the exact product (double), over the layouts
 * the engine asks for: both transpose flags, batches with a shared operand
 * (stride 0), alpha, beta (the bias the linear layer preloads), odd and tiny
 * sizes. f32 accumulation over k terms may differ from the exact product by
 * (k + 2) 2^-24 of the terms' magnitudes summed: that is the f32 bound; in bf16
 * it is far under bf16's 2^-8, so the result is the exact product rounded once
 * to bf16 or one of its neighbours.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"

/* n values of dtype dt (f32 or bf16), multiples of 1/500 in [-2, 2] */
static void *rand_vals(mp_dtype dt, int64_t n, unsigned *seed)
{
    void *p = malloc(4 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        float v = (float)(rand_r(seed) % 2001 - 1000) / 500.0f;
        if (dt == MP_F32) ((float *)p)[i] = v;
        else ((uint16_t *)p)[i] = mp_f32_to_bf16(v);
    }
    return p;
}

static float get(mp_dtype dt, const void *p, int64_t i)
{
    return dt == MP_F32 ? ((const float *)p)[i] : mp_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* element (r, c) of a row-major {rows, cols} matrix stored transposed when t */
static float at(mp_dtype dt, const void *p, int64_t off, int t, int64_t rows, int64_t cols, int64_t r, int64_t c)
{
    return get(dt, p, off + (t ? c * rows + r : r * cols + c));
}

static void check(mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, int shared_a,
                  int shared_b, float alpha, float beta)
{
    unsigned seed = (unsigned)(m * 131 + n * 17 + k + batch);
    int64_t sa = shared_a ? 0 : m * k, sb = shared_b ? 0 : k * n, sc = m * n;
    void *a = rand_vals(dt, (shared_a ? 1 : batch) * m * k, &seed), *b = rand_vals(dt, (shared_b ? 1 : batch) * k * n, &seed);
    void *c = rand_vals(dt, batch * m * n, &seed), *c0 = malloc(4 * (size_t)(batch * m * n));
    memcpy(c0, c, 4 * (size_t)(batch * m * n));
    mp_kctx *cx = mp_cpu_backend.ctx;
    const char *dn = dt == MP_F32 ? "f32" : "bf16";
    cr_assert_eq(cpu_gemm_dnnl(cx, dt, ta, tb, batch, m, n, k, alpha, a, sa, b, sb, beta, c, sc), 0,
                 "oneDNN declined %s %s%s batch %ld %ldx%ldx%ld", dn, ta ? "T" : "N", tb ? "T" : "N", (long)batch,
                 (long)m, (long)n, (long)k);
    for (int64_t i = 0; i < batch; i++)
        for (int64_t r = 0; r < m; r++)
            for (int64_t q = 0; q < n; q++) {
                double s = 0, mag = 0;
                for (int64_t j = 0; j < k; j++) {
                    double t = (double)at(dt, a, i * sa, ta, m, k, r, j) * at(dt, b, i * sb, tb, k, n, j, q);
                    s += t, mag += fabs(t);
                }
                double c_old = get(dt, c0, i * sc + r * n + q);
                s = alpha * s + beta * c_old, mag = fabs(alpha) * mag + fabs(beta * c_old);
                double got = get(dt, c, i * sc + r * n + q), want = s, tol = (double)(k + 2) * 0x1p-24 * mag;
                if (dt == MP_BF16) {
                    want = mp_bf16_to_f32(mp_f32_to_bf16((float)s));
                    tol = fabs(want) * 0x1p-7 + 0x1p-120;
                }
                cr_assert(fabs(got - want) <= tol, "%s %s%s batch %ld %ldx%ldx%ld at (%ld,%ld,%ld): got %.9g want %.9g",
                          dn, ta ? "T" : "N", tb ? "T" : "N", (long)batch, (long)m, (long)n, (long)k, (long)i,
                          (long)r, (long)q, got, want);
            }
    free(a), free(b), free(c), free(c0);
}

static void layouts(mp_dtype dt)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check(dt, ta, tb, 1, 37, 29, 53, 0, 0, 1.0f, 0.0f);
            check(dt, ta, tb, 1, 64, 128, 256, 0, 0, 1.0f, 1.0f);     /* linear's bias preload */
            check(dt, ta, tb, 3, 17, 9, 33, 0, 0, 0.5f, 0.0f);
            check(dt, ta, tb, 4, 8, 16, 24, 1, 0, 1.0f, 0.0f);        /* one A for every item */
            check(dt, ta, tb, 4, 8, 16, 24, 0, 1, 1.0f, 0.25f);       /* one B for every item */
            check(dt, ta, tb, 1, 1, 1, 1, 0, 0, 1.0f, 0.0f);
            check(dt, ta, tb, 2, 5, 114, 7, 0, 0, 1.0f, 0.0f);
        }
}

Test(gemm_dnnl, f32_matches_the_exact_product) { layouts(MP_F32); }

Test(gemm_dnnl, bf16_matches_the_exact_product_rounded_once)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) cr_skip_test("no AVX512-BF16: bf16 products take the widening path");
    layouts(MP_BF16);
}

/* the plan table wraps: more shapes than it holds, each still right */
Test(gemm_dnnl, more_shapes_than_plans)
{
    for (int i = 1; i <= 70; i++) check(MP_F32, 0, 1, 1, i, 3, 5, 0, 0, 1.0f, 0.0f);
    for (int i = 1; i <= 3; i++) check(MP_F32, 0, 1, 1, i, 3, 5, 0, 0, 1.0f, 0.0f);   /* evicted, made again */
}

/* every batch item accumulating into one C (stride 0) is not one matmul:
 * declined, nothing written, and cpu_gemm's own path does it */
Test(gemm_dnnl, one_c_for_every_item_and_f16_are_declined)
{
    uint16_t a[2 * 6] = {0}, b[2 * 6] = {0}, c[4 + 2];
    for (int i = 0; i < 6; i++) c[i] = 0x3f80;   /* 1.0 */
    cr_assert_eq(cpu_gemm_dnnl(mp_cpu_backend.ctx, MP_BF16, 0, 0, 2, 2, 2, 3, 1.0f, a, 6, b, 6, 1.0f, c, 0), 1);
    cr_assert_eq(cpu_gemm_dnnl(mp_cpu_backend.ctx, MP_F16, 0, 0, 1, 2, 2, 3, 1.0f, a, 6, b, 6, 1.0f, c, 4), 1);
    for (int i = 0; i < 6; i++) cr_assert_eq(c[i], 0x3f80);
}

/* the bias in the epilogue: C = A B^T + bias on every row, rounded once */
static void check_bias(mp_dtype dt, int64_t m, int64_t n, int64_t k)
{
    unsigned seed = (unsigned)(m + 7 * n + 13 * k);
    void *a = rand_vals(dt, m * k, &seed), *b = rand_vals(dt, n * k, &seed), *bias = rand_vals(dt, n, &seed);
    void *c = malloc(4 * (size_t)(m * n));
    cr_assert_eq(cpu_gemm_bias(mp_cpu_backend.ctx, dt, m, n, k, a, b, bias, c), 0);
    for (int64_t r = 0; r < m; r++)
        for (int64_t q = 0; q < n; q++) {
            double s = get(dt, bias, q), mag = fabs(s);
            for (int64_t j = 0; j < k; j++) {
                double t = (double)get(dt, a, r * k + j) * get(dt, b, q * k + j);
                s += t, mag += fabs(t);
            }
            double got = get(dt, c, r * n + q), want = s, tol = (double)(k + 2) * 0x1p-24 * mag;
            if (dt == MP_BF16) want = mp_bf16_to_f32(mp_f32_to_bf16((float)s)), tol = fabs(want) * 0x1p-7 + 0x1p-120;
            cr_assert(fabs(got - want) <= tol, "gemm_bias %dx%dx%d at (%d,%d): got %.9g want %.9g", (int)m, (int)n,
                      (int)k, (int)r, (int)q, got, want);
        }
    free(a), free(b), free(bias), free(c);
}

Test(gemm_dnnl, bias_in_the_epilogue)
{
    check_bias(MP_F32, 37, 29, 53);
    check_bias(MP_F32, 1, 1, 1);
    check_bias(MP_F32, 64, 114, 128);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bf16")) check_bias(MP_BF16, 37, 29, 53), check_bias(MP_BF16, 64, 114, 128);
    uint16_t x[4] = {0};
    cr_assert_eq(cpu_gemm_bias(mp_cpu_backend.ctx, MP_F16, 1, 1, 1, x, x, x, x + 3), 1, "f16 is declined");
}
