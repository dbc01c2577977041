/*
 * test_block_gemm_bf16.c: the small bf16 products of blocked kernels
 * (kernels/cpu/block_gemm_bf16.c) and their packers, on every path this
 * processor has (the portable one always, forced): both forms of A, operands
 * packed from both layouts, every tile shape (rows 1-8, 1-4 vectors, masked
 * tails), odd k (the zero half of the last pair), several column panels, leading
 * dimensions wider than the matrix, alpha, beta 0 (C never read: it holds NaN),
 * 1 and 0.5, and the elements just past C untouched. Against the exact product of
 * the same bf16 values (double): f32 accumulation's bound, (k + 2) 2^-24 of the
 * terms' magnitudes summed, plus 2^-24 of the beta term. Each vector path the
 * processor has (AVX512-BF16, AVX2 + FMA) agrees with the portable one bit for
 * bit, on ordinary values and on values that meet subnormals (inputs read as
 * zero, sums flushed).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/block_gemm_bf16.h"
#include "kernels/half.h"

/* a bf16 in [-2, 2]; tiny = 1: also values near and under 2^-126 (inputs read
 * as zero); tiny = 2: every value near 2^-63, so that products and their sums
 * fall on both sides of 2^-126 (sums flushed) */
static uint16_t rnd(unsigned *seed, int tiny)
{
    float f = (float)(rand_r(seed) % 2001 - 1000) / 500.0f;
    if (tiny == 1 && rand_r(seed) % 3 == 0) f *= ldexpf(1.0f, -120 - rand_r(seed) % 12);
    if (tiny == 2) f *= ldexpf(1.0f, -60 - rand_r(seed) % 7);
    return mp_f32_to_bf16(f);
}

static float bf(uint16_t h) { return mp_bf16_to_f32(h); }

typedef struct {
    int64_t m, n, k, lda, ldb, ldc, bt;
    uint16_t *ax, *bx;   /* the operands as they lie: A{m,k} (at 0) or A{k,m} (at 1); B{k,n} or B{n,k} (bt) */
    uint16_t *a, *b;     /* A as the kernel reads it; B packed */
    float *c0;
} operands;

/* A and B at random; B given as {k,n} (bt = 0, packed along rows) or {n,k}
 * (bt = 1, packed along columns); A^T (at = 1) packed along rows */
static operands make(int at, int bt, int64_t m, int64_t n, int64_t k, float beta, int tiny, unsigned seed)
{
    operands o = { .m = m, .n = n, .k = k, .bt = bt };
    int64_t kp = (k + 1) / 2, xa = (at ? m : k) + 3, xb = (bt ? k : n) + 5;
    o.ldc = n + 2;
    o.ax = malloc(sizeof(uint16_t) * (size_t)((at ? k : m) * xa + 1));
    o.bx = malloc(sizeof(uint16_t) * (size_t)((bt ? n : k) * xb + 1));
    for (int64_t i = 0; i < (at ? k : m) * xa; i++) o.ax[i] = rnd(&seed, tiny);
    for (int64_t i = 0; i < (bt ? n : k) * xb; i++) o.bx[i] = rnd(&seed, tiny);
    o.ldb = n + 3;
    o.b = malloc(sizeof(uint16_t) * (size_t)(2 * kp * o.ldb + 1));
    memset(o.b, 0xff, sizeof(uint16_t) * (size_t)(2 * kp * o.ldb));   /* NaN where nothing is packed */
    if (bt) cpu_bf16_pack_cols(o.b, o.ldb, o.bx, xb, n, k);
    else cpu_bf16_pack_rows(o.b, o.ldb, o.bx, xb, k, n);
    if (at) {
        o.lda = m + 1;
        o.a = malloc(sizeof(uint16_t) * (size_t)(2 * kp * o.lda + 1));
        cpu_bf16_pack_rows(o.a, o.lda, o.ax, xa, k, m);
    } else {   /* rows as they lie, with a zero after an odd k */
        o.lda = 2 * kp + 4;
        o.a = malloc(sizeof(uint16_t) * (size_t)(m * o.lda + 1));
        for (int64_t i = 0; i < m; i++) {
            memcpy(o.a + i * o.lda, o.ax + i * xa, sizeof(uint16_t) * (size_t)k);
            if (k & 1) o.a[i * o.lda + k] = 0;
        }
    }
    o.c0 = malloc(sizeof(float) * (size_t)(m * o.ldc));
    for (int64_t i = 0; i < m * o.ldc; i++) o.c0[i] = beta == 0.0f ? NAN : bf(rnd(&seed, 0));
    return o;
}

static float *run(int at, const operands *o, float alpha, float beta)
{
    float *c = malloc(sizeof(float) * (size_t)(o->m * o->ldc));
    memcpy(c, o->c0, sizeof(float) * (size_t)(o->m * o->ldc));
    cpu_block_gemm_bf16(at, o->m, o->n, o->k, alpha, o->a, o->lda, o->b, o->ldb, beta, c, o->ldc);
    return c;
}

static void release(operands *o) { free(o->ax), free(o->bx), free(o->a), free(o->b), free(o->c0); }

static void check(int at, int bt, int64_t m, int64_t n, int64_t k, float alpha, float beta)
{
    unsigned seed = (unsigned)(m * 7919 + n * 131 + k * 17 + at * 3 + bt);
    operands o = make(at, bt, m, n, k, beta, 0, seed);
    int64_t xa = (at ? m : k) + 3, xb = (bt ? k : n) + 5;
    float *c = run(at, &o, alpha, beta);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
                double t = (double)bf(at ? o.ax[p * xa + i] : o.ax[i * xa + p]) * bf(bt ? o.bx[j * xb + p] : o.bx[p * xb + j]);
                s += t, mag += fabs(t);
            }
            double cterm = beta == 0.0f ? 0.0 : (double)beta * o.c0[i * o.ldc + j];
            double want = alpha * s + cterm;
            double tol = (double)(k + 2) * ldexp(1.0, -24) * fabs(alpha) * mag + ldexp(1.0, -24) * fabs(cterm);
            cr_assert(fabs(c[i * o.ldc + j] - want) <= tol,
                      "%s at=%d bt=%d %ldx%ldx%ld alpha %g beta %g: c[%ld,%ld] = %.9g, want %.9g",
                      cpu_block_gemm_bf16_path(), at, bt, (long)m, (long)n, (long)k, alpha, beta, (long)i, (long)j,
                      c[i * o.ldc + j], want);
        }
        for (int64_t j = n; j < o.ldc; j++)   /* past the row: untouched (NaN stays NaN) */
            cr_assert(c[i * o.ldc + j] == o.c0[i * o.ldc + j] || (isnan(c[i * o.ldc + j]) && isnan(o.c0[i * o.ldc + j])),
                      "%s wrote past column %ld", cpu_block_gemm_bf16_path(), (long)n);
    }
    free(c);
    release(&o);
}

static void sweep(void)
{
    static const int64_t ms[] = { 1, 2, 3, 4, 5, 7, 8, 9, 64, 67 }, ns[] = { 1, 15, 16, 17, 32, 33, 48, 63, 64, 65, 130 };
    static const int64_t ks[] = { 0, 1, 2, 7, 32, 33, 64 };
    for (int at = 0; at < 2; at++)
        for (size_t i = 0; i < sizeof ms / sizeof *ms; i++)
            for (size_t j = 0; j < sizeof ns / sizeof *ns; j++)
                for (size_t l = 0; l < sizeof ks / sizeof *ks; l++) {
                    check(at, (int)(l & 1), ms[i], ns[j], ks[l], 1.0f, 0.0f);
                    check(at, (int)((l + 1) & 1), ms[i], ns[j], ks[l], 0.25f, 1.0f);
                }
    check(0, 1, 64, 64, 32, -0.5f, 0.5f);
    check(1, 0, 64, 32, 64, 3.0f, 0.5f);
    check(0, 0, 64, 128, 128, 0.125f, 0.0f);
    check(1, 1, 6, 270, 521, 0.5f, 1.0f);   /* column blocks and k passes of the AVX2 path */
}

Test(block_gemm_bf16, every_path_matches_the_exact_product)
{
    static const char *paths[] = { "avx512bf16", "avx2", "portable" };
    int ran = 0;
    for (int p = 0; p < 2; p++) {
        if (cpu_block_gemm_bf16_use(paths[p]) != 0) continue;   /* this processor lacks it */
        cr_assert_str_eq(cpu_block_gemm_bf16_path(), paths[p]);
        sweep();
        ran++;
    }
    cpu_block_gemm_bf16_use(NULL);
    cr_assert(ran >= 1, "no path ran");
    cr_assert_eq(cpu_block_gemm_bf16_use("portable"), 0, "the portable path is always there");
    cpu_block_gemm_bf16_use(NULL);
}

/* path's bits against the portable path's, every shape, both forms of A,
 * beta 0 and 0.5, ordinary and tiny values; 0 when this processor lacks it */
static int agree_with_portable(const char *path)
{
    if (cpu_block_gemm_bf16_use(path) != 0) return 0;
    static const int64_t shapes[][3] = { { 64, 64, 32 }, { 64, 32, 64 }, { 67, 65, 33 }, { 5, 17, 7 }, { 9, 130, 128 },
                                         { 3, 9, 5 }, { 7, 23, 64 }, { 6, 270, 521 } };
    for (int tiny = 0; tiny < 3; tiny++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int at = 0; at < 2; at++)
                for (int bi = 0; bi < 2; bi++) {
                    float beta = bi ? 0.3f : 0.0f;   /* inexact: whether the epilogue is fused shows */
                    int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                    operands o = make(at, (int)s & 1, m, n, k, beta, tiny, (unsigned)(s * 31 + at + 7 * tiny));
                    cpu_block_gemm_bf16_use(path);
                    float *hw = run(at, &o, 0.75f, beta);
                    cpu_block_gemm_bf16_use("portable");
                    float *sw = run(at, &o, 0.75f, beta);
                    for (int64_t i = 0; i < m * o.ldc; i++)
                        cr_assert(memcmp(hw + i, sw + i, sizeof(float)) == 0,
                                  "tiny %d %ldx%ldx%ld at=%d beta %g: element %ld is %a on %s, %a portable", tiny,
                                  (long)m, (long)n, (long)k, at, beta, (long)i, hw[i], path, sw[i]);
                    free(hw), free(sw);
                    release(&o);
                }
    cpu_block_gemm_bf16_use(NULL);
    return 1;
}

Test(block_gemm_bf16, the_paths_agree_bit_for_bit)
{
    int ran = agree_with_portable("avx512bf16") + agree_with_portable("avx2");
    if (!ran) cr_skip_test("neither AVX512-BF16 nor AVX2 + FMA: only the portable path");
}

Test(block_gemm_bf16, packers_pair_along_k_with_a_zero_after_an_odd_k)
{
    uint16_t x[3 * 5], r[2 * 2 * 5], c[3 * 2 * 3];
    for (int i = 0; i < 15; i++) x[i] = (uint16_t)(i + 1);
    cpu_bf16_pack_rows(r, 5, x, 5, 3, 5);   /* X{3,5} as B{k=3, n=5} */
    for (int p = 0; p < 2; p++)
        for (int j = 0; j < 5; j++) {
            cr_assert_eq(r[2 * (p * 5 + j)], x[2 * p * 5 + j]);
            cr_assert_eq(r[2 * (p * 5 + j) + 1], 2 * p + 1 < 3 ? x[(2 * p + 1) * 5 + j] : 0);
        }
    cpu_bf16_pack_cols(c, 3, x, 5, 3, 5);   /* X{3,5} as B = X^T {k=5, n=3} */
    for (int p = 0; p < 3; p++)
        for (int j = 0; j < 3; j++) {
            cr_assert_eq(c[2 * (p * 3 + j)], x[j * 5 + 2 * p]);
            cr_assert_eq(c[2 * (p * 3 + j) + 1], 2 * p + 1 < 5 ? x[j * 5 + 2 * p + 1] : 0);
        }
}

Test(block_gemm_bf16, unknown_path_is_refused)
{
    cr_assert_eq(cpu_block_gemm_bf16_use("sse9"), -1);
    cr_assert_eq(cpu_block_gemm_bf16_use(NULL), 0);
}
