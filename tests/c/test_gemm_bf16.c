/*
 * test_gemm_bf16.c: bf16 products through oneDNN (kernels/cpu/cpu_gemm_dnnl.c)
 * against the exact product (double) rounded once to bf16, over the layouts
 * the engine asks for: both transpose flags, batches with a shared operand
 * (stride 0), alpha, beta (the bias the linear layer preloads), odd and tiny
 * sizes. f32 accumulation over k terms may differ from the exact product by
 * k * 2^-24 of the terms' magnitude, far under bf16's 2^-8: the result is the
 * exact product's bf16 or one of its neighbours.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"

static uint16_t *rand_bf16(int64_t n, unsigned *seed)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = mp_f32_to_bf16((float)(rand_r(seed) % 2001 - 1000) / 500.0f);
    return p;
}

/* element (r, c) of a row-major {rows, cols} matrix stored transposed when t */
static float at(const uint16_t *p, int t, int64_t rows, int64_t cols, int64_t r, int64_t c)
{
    return mp_bf16_to_f32(p[t ? c * rows + r : r * cols + c]);
}

static void check(int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, int shared_a, int shared_b,
                  float alpha, float beta)
{
    unsigned seed = (unsigned)(m * 131 + n * 17 + k + batch);
    int64_t sa = shared_a ? 0 : m * k, sb = shared_b ? 0 : k * n, sc = m * n;
    uint16_t *a = rand_bf16((shared_a ? 1 : batch) * m * k, &seed), *b = rand_bf16((shared_b ? 1 : batch) * k * n, &seed);
    uint16_t *c = rand_bf16(batch * m * n, &seed), *c0 = malloc(sizeof(uint16_t) * (size_t)(batch * m * n));
    memcpy(c0, c, sizeof(uint16_t) * (size_t)(batch * m * n));
    mp_kctx *cx = mp_cpu_backend.ctx;
    cr_assert_eq(cpu_gemm_dnnl(cx, ta, tb, batch, m, n, k, alpha, a, sa, b, sb, beta, c, sc), 0,
                 "oneDNN declined %s%s batch %ld %ldx%ldx%ld", ta ? "T" : "N", tb ? "T" : "N", (long)batch,
                 (long)m, (long)n, (long)k);
    for (int64_t i = 0; i < batch; i++)
        for (int64_t r = 0; r < m; r++)
            for (int64_t q = 0; q < n; q++) {
                double s = 0;
                for (int64_t j = 0; j < k; j++)
                    s += (double)at(a + i * sa, ta, m, k, r, j) * at(b + i * sb, tb, k, n, j, q);
                s = alpha * s + beta * (double)mp_bf16_to_f32(c0[i * sc + r * n + q]);
                float want = mp_bf16_to_f32(mp_f32_to_bf16((float)s));
                float got = mp_bf16_to_f32(c[i * sc + r * n + q]);
                float ulp = fabsf(want) * 0x1p-7f + 0x1p-120f;
                cr_assert(fabsf(got - want) <= ulp, "%s%s batch %ld %ldx%ldx%ld at (%ld,%ld,%ld): got %g want %g",
                          ta ? "T" : "N", tb ? "T" : "N", (long)batch, (long)m, (long)n, (long)k, (long)i, (long)r,
                          (long)q, got, want);
            }
    free(a), free(b), free(c), free(c0);
}

Test(gemm_bf16, onednn_matches_the_exact_product_rounded_once)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) cr_skip_test("no AVX512-BF16: bf16 products take the widening path");
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check(ta, tb, 1, 37, 29, 53, 0, 0, 1.0f, 0.0f);
            check(ta, tb, 1, 64, 128, 256, 0, 0, 1.0f, 1.0f);     /* linear's bias preload */
            check(ta, tb, 3, 17, 9, 33, 0, 0, 0.5f, 0.0f);
            check(ta, tb, 4, 8, 16, 24, 1, 0, 1.0f, 0.0f);        /* one A for every item */
            check(ta, tb, 4, 8, 16, 24, 0, 1, 1.0f, 0.25f);       /* one B for every item */
            check(ta, tb, 1, 1, 1, 1, 0, 0, 1.0f, 0.0f);
            check(ta, tb, 2, 5, 114, 7, 0, 0, 1.0f, 0.0f);
        }
}

/* the plan table wraps: more shapes than it holds, each still right */
Test(gemm_bf16, more_shapes_than_plans)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) cr_skip_test("no AVX512-BF16");
    for (int i = 1; i <= 70; i++) check(0, 1, 1, i, 3, 5, 0, 0, 1.0f, 0.0f);
    for (int i = 1; i <= 3; i++) check(0, 1, 1, i, 3, 5, 0, 0, 1.0f, 0.0f);   /* evicted, made again */
}

/* every batch item accumulating into one C (stride 0) is not one matmul:
 * declined, nothing written, and cpu_gemm's own path does it */
Test(gemm_bf16, one_c_for_every_item_is_declined)
{
    uint16_t a[2 * 6] = {0}, b[2 * 6] = {0}, c[4 + 2];
    for (int i = 0; i < 6; i++) c[i] = 0x3f80;   /* 1.0 */
    cr_assert_eq(cpu_gemm_dnnl(mp_cpu_backend.ctx, 0, 0, 2, 2, 2, 3, 1.0f, a, 6, b, 6, 1.0f, c, 0), 1);
    for (int i = 0; i < 6; i++) cr_assert_eq(c[i], 0x3f80);
}
