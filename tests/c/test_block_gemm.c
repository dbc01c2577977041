/*
 * test_block_gemm.c: the small f32 products of blocked kernels
 * (kernels/cpu/block_gemm.c) against the exact product (double), on every path
 * this processor has: both forms of A, every tile shape (rows 1-4 of a tile,
 * 1-4 vectors, masked tails), several column panels, leading dimensions wider
 * than the matrix, alpha, beta 0 (C never read: it holds NaN), 1 and 0.5, and
 * the elements just past C left untouched. The bound is that of f32
 * accumulation: (k + 2) 2^-24 of the terms' magnitudes summed; the vector
 * paths (AVX-512, AVX2) must also give the bits of one fused sum in k order.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/block_gemm.h"

static float rnd(unsigned *seed) { return (float)(rand_r(seed) % 2001 - 1000) / 500.0f; }

/* the vector paths' contract, bit for bit: acc = fmaf(a, b, acc) over k in
 * order from 0, then alpha * acc, then fmaf(beta, c, that) */
static float korder(int at, int64_t i, int64_t j, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                    int64_t ldb, float beta, float c)
{
    float acc = 0.0f;
    for (int64_t p = 0; p < k; p++) acc = fmaf(at ? a[p * lda + i] : a[i * lda + p], b[p * ldb + j], acc);
    float x = alpha * acc;
    return beta != 0.0f ? fmaf(beta, c, x) : x;
}

static void check(int at, int64_t m, int64_t n, int64_t k, float alpha, float beta)
{
    unsigned seed = (unsigned)(m * 7919 + n * 131 + k * 17 + at);
    int64_t lda = (at ? m : k) + 3, ldb = n + 5, ldc = n + 2, arows = at ? k : m;
    float *a = malloc(sizeof(float) * (size_t)(arows * lda + 1)), *b = malloc(sizeof(float) * (size_t)(k * ldb + 1));
    float *c = malloc(sizeof(float) * (size_t)(m * ldc)), *c0 = malloc(sizeof(float) * (size_t)(m * ldc));
    for (int64_t i = 0; i < arows * lda; i++) a[i] = rnd(&seed);
    for (int64_t i = 0; i < k * ldb; i++) b[i] = rnd(&seed);
    for (int64_t i = 0; i < m * ldc; i++) c[i] = c0[i] = beta == 0.0f ? NAN : rnd(&seed);
    cpu_block_gemm(at, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
                double t = (double)(at ? a[p * lda + i] : a[i * lda + p]) * b[p * ldb + j];
                s += t, mag += fabs(t);
            }
            double cterm = beta == 0.0f ? 0.0 : (double)beta * c0[i * ldc + j];
            double want = alpha * s + cterm, tol = (double)(k + 2) * ldexp(1.0, -24) * (fabs(alpha) * mag + fabs(cterm));
            cr_assert(fabs(c[i * ldc + j] - want) <= tol, "%s at=%d %ldx%ldx%ld alpha %g beta %g: c[%ld,%ld] = %.9g, want %.9g",
                      cpu_block_gemm_path(), at, (long)m, (long)n, (long)k, alpha, beta, (long)i, (long)j,
                      c[i * ldc + j], want);
            if (strcmp(cpu_block_gemm_path(), "blas") != 0) {   /* the vector paths: the k-order sum's bits */
                float ko = korder(at, i, j, k, alpha, a, lda, b, ldb, beta, c0[i * ldc + j]);
                cr_assert(memcmp(&ko, &c[i * ldc + j], sizeof ko) == 0,
                          "%s at=%d %ldx%ldx%ld alpha %g beta %g: c[%ld,%ld] = %a, the k-order sum %a",
                          cpu_block_gemm_path(), at, (long)m, (long)n, (long)k, alpha, beta, (long)i, (long)j,
                          c[i * ldc + j], ko);
            }
        }
        for (int64_t j = n; j < ldc; j++)   /* past the row: untouched (NaN stays NaN) */
            cr_assert(c[i * ldc + j] == c0[i * ldc + j] || (isnan(c[i * ldc + j]) && isnan(c0[i * ldc + j])),
                      "%s wrote past column %ld", cpu_block_gemm_path(), (long)n);
    }
    free(a), free(b), free(c), free(c0);
}

static void sweep(void)
{
    static const int64_t ms[] = { 1, 2, 3, 4, 5, 7, 64, 67 }, ns[] = { 1, 15, 16, 17, 32, 48, 63, 64, 65, 130 };
    static const int64_t ks[] = { 0, 1, 32, 64 };
    for (int at = 0; at < 2; at++)
        for (size_t i = 0; i < sizeof ms / sizeof *ms; i++)
            for (size_t j = 0; j < sizeof ns / sizeof *ns; j++)
                for (size_t l = 0; l < sizeof ks / sizeof *ks; l++) {
                    check(at, ms[i], ns[j], ks[l], 1.0f, 0.0f);
                    check(at, ms[i], ns[j], ks[l], 0.25f, 1.0f);
                }
    check(0, 64, 64, 32, -0.5f, 0.5f);
    check(1, 64, 32, 64, 3.0f, 0.5f);
    check(0, 67, 65, 33, 0.7f, 0.3f);   /* inexact alpha and beta: a product or an add not fused shows */
}

Test(block_gemm, every_path_matches_the_exact_product)
{
    static const char *paths[] = { "avx512", "avx2", "blas" };
    int ran = 0;
    for (int p = 0; p < 2; p++) {
        if (cpu_block_gemm_use(paths[p]) != 0) continue;   /* this processor lacks it */
        cr_assert_str_eq(cpu_block_gemm_path(), paths[p]);
        sweep();
        ran++;
    }
    cpu_block_gemm_use(NULL);
    cr_assert(ran >= 1, "no path ran");
}

Test(block_gemm, unknown_path_is_refused)
{
    cr_assert_eq(cpu_block_gemm_use("sse9"), -1);
    cr_assert_eq(cpu_block_gemm_use(NULL), 0);
}
