/*
 * test_gemm_wide.c: the epilogues of the f16 product with operands given
 * widened (kernels/cpu/cpu_gemm.c, backend gemm_wide) against the two steps
 * each stands in for, bit for bit, and of the bf16 product where the CPU
 * widens it too (no oneDNN bf16 kernels: below AVX512-core):
 *   bias  C filled with 0 + bias in dt (binary's add, then the store), then
 *         the product accumulated onto it with beta 1 (cpu_gemm);
 *   acc   C written in dt (cpu_gemm), then added widened into an f32 array
 *         (cpu_add_widened: a cast's gradient into its leaf's .grad).
 * With the widened operands and without; sizes past the passes' thread split
 * (2^15) and not multiples of the 1024-blocks; biases and products with
 * signed zeros, subnormals, infinities and a NaN. And both ways of the
 * bias against the exact sum rounded once, on inputs whose f32 sums are exact.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_f64.h"   /* cpu_supports */
#include "kernels/half.h"

static uint16_t narrow(mp_dtype dt, float f) { return dt == MP_F16 ? mp_f32_to_f16(f) : mp_f32_to_bf16(f); }
static float wide(mp_dtype dt, uint16_t h) { return dt == MP_F16 ? mp_f16_to_f32(h) : mp_bf16_to_f32(h); }
static const char *dtn(mp_dtype dt) { return dt == MP_F16 ? "f16" : "bf16"; }

/* n values of dt, multiples of 1/64 in [-8, 8], some of them zeros of either sign */
static uint16_t *rand_lp(mp_dtype dt, int64_t n, unsigned *seed)
{
    uint16_t *p = malloc(2 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        int r = rand_r(seed) % 1025 - 512;
        p[i] = r == 0 && (rand_r(seed) & 1) ? 0x8000 : narrow(dt, (float)r / 64.0f);
    }
    return p;
}

static float *widened(mp_dtype dt, const uint16_t *h, int64_t n)
{
    float *f = malloc(4 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) f[i] = wide(dt, h[i]);
    return f;
}

/* the dtypes whose products this CPU widens whole (cpu_gemm_widens) */
static const mp_dtype dts[] = {MP_F16, MP_BF16};
#define FOR_WIDENED_DT(dt) \
    for (size_t di_ = 0; di_ < 2; di_++) \
        for (mp_dtype dt = dts[di_]; cpu_gemm_widens(dt); dt = MP_F32)

/* C{m,n} = A{m,k} @ B{n,k}^T + bias, as gemm_wide's bias epilogue and as the engine did before it */
static void check_bias(mp_dtype dt, int64_t m, int64_t n, int64_t k, int wide_a, int wide_b)
{
    unsigned seed = (unsigned)(m * 7 + n * 3 + k + wide_a + 2 * wide_b);
    mp_kctx *cx = mp_cpu_backend.ctx;
    uint16_t *a = rand_lp(dt, m * k, &seed), *b = rand_lp(dt, n * k, &seed), *bias = rand_lp(dt, n, &seed);
    const uint16_t odd16[] = {0x8000, 0x0000, 0x0001, 0x83ff, 0x7c00, 0xfc00, 0x7e00, 0x7bff};
    const uint16_t oddb16[] = {0x8000, 0x0000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc0, 0x7f7f};
    for (int64_t i = 0; i < n && i < 8; i++)   /* -0, +0, subnormals, +-inf, NaN, the largest */
        bias[i] = dt == MP_F16 ? odd16[i] : oddb16[i];
    float *fa = widened(dt, a, m * k), *fb = widened(dt, b, n * k);
    uint16_t *got = malloc(2 * (size_t)(m * n)), *want = malloc(2 * (size_t)(m * n));
    memset(got, 0xff, 2 * (size_t)(m * n));
    for (int64_t r = 0; r < m; r++)
        for (int64_t q = 0; q < n; q++) {
            float s = 0.0f + wide(dt, bias[q]);
            cpu_store(cx, dt, want, r * n + q, &s, 1);
        }
    cr_assert_eq(cpu_gemm(cx, dt, 0, 1, 1, m, n, k, 1.0f, a, 0, b, 0, 1.0f, want, m * n), 0);
    cr_assert_eq(cpu_gemm_wide(cx, dt, 0, 1, 1, m, n, k, 1.0f, wide_a ? (void *)fa : a, wide_a, 0,
                               wide_b ? (void *)fb : b, wide_b, 0, 0.0f, got, m * n, bias, NULL), 0);
    for (int64_t i = 0; i < m * n; i++)
        cr_assert_eq(got[i], want[i], "%s bias %ldx%ldx%ld (wide %d%d) at %ld: got 0x%04x, want 0x%04x",
                     dtn(dt), (long)m, (long)n, (long)k, wide_a, wide_b, (long)i, got[i], want[i]);
    free(a), free(b), free(bias), free(fa), free(fb), free(got), free(want);
}

/* acc{m,n} += (A{k,m}^T @ B{k,n}) rounded to dt: a weight gradient into its f32 .grad */
static void check_acc(mp_dtype dt, int64_t m, int64_t n, int64_t k, int wide_a, int wide_b)
{
    unsigned seed = (unsigned)(m * 5 + n * 11 + k + wide_a + 2 * wide_b);
    mp_kctx *cx = mp_cpu_backend.ctx;
    uint16_t *a = rand_lp(dt, k * m, &seed), *b = rand_lp(dt, k * n, &seed), *c = malloc(2 * (size_t)(m * n));
    float *fa = widened(dt, a, k * m), *fb = widened(dt, b, k * n);
    float *got = malloc(4 * (size_t)(m * n)), *want = malloc(4 * (size_t)(m * n));
    for (int64_t i = 0; i < m * n; i++) {   /* a .grad holding a sum already, with a few overflowing products */
        got[i] = want[i] = (float)(rand_r(&seed) % 2001 - 1000) / 3.0f;
        if (i % 997 == 5) got[i] = want[i] = dt == MP_F16 ? 65000.0f : 3.0e38f;
    }
    if (m * k > 3) a[3] = dt == MP_F16 ? 0x7c00 : 0x7f80;   /* an infinity: a row of infinite products, a NaN where it meets a zero */
    if (m * k > 3) fa[3] = INFINITY;
    cr_assert_eq(cpu_gemm(cx, dt, 1, 0, 1, m, n, k, 1.0f, a, 0, b, 0, 0.0f, c, m * n), 0);
    cpu_add_widened(cx, want, c, dt, m * n);
    cr_assert_eq(cpu_gemm_wide(cx, dt, 1, 0, 1, m, n, k, 1.0f, wide_a ? (void *)fa : a, wide_a, 0,
                               wide_b ? (void *)fb : b, wide_b, 0, 0.0f, NULL, m * n, NULL, got), 0);
    for (int64_t i = 0; i < m * n; i++) {
        uint32_t g, w;
        memcpy(&g, &got[i], 4), memcpy(&w, &want[i], 4);
        cr_assert_eq(g, w, "%s acc %ldx%ldx%ld (wide %d%d) at %ld: got %.9g, want %.9g", dtn(dt), (long)m,
                     (long)n, (long)k, wide_a, wide_b, (long)i, got[i], want[i]);
    }
    free(a), free(b), free(c), free(fa), free(fb), free(got), free(want);
}

Test(gemm_wide, bias_epilogue_is_the_fill_then_the_product)
{
    FOR_WIDENED_DT(dt) {
        for (int w = 0; w < 4; w++) {
            check_bias(dt, 37, 29, 53, w & 1, w >> 1);
            check_bias(dt, 128, 300, 257, w & 1, w >> 1);   /* C past the thread split */
        }
        check_bias(dt, 1, 1, 1, 0, 1);
        check_bias(dt, 3, 8, 2, 0, 0);
    }
}

Test(gemm_wide, acc_epilogue_is_the_product_then_the_widened_add)
{
    FOR_WIDENED_DT(dt) {
        for (int w = 0; w < 4; w++) {
            check_acc(dt, 37, 29, 53, w & 1, w >> 1);
            check_acc(dt, 300, 257, 128, w & 1, w >> 1);   /* past the thread split, blocks with a tail */
        }
        check_acc(dt, 1, 1, 1, 1, 0);
    }
}

/* C{m,n} = A{m,k} @ B{n,k}^T + bias in dt against the exact sum rounded once,
 * through the engine's two ways (fill + gemm, the bias epilogue with operands
 * widened or not). The inputs are multiples of 1/32 in [-1, 1]: the products
 * multiples of 2^-10 of at most 1, every partial sum (bias included) one
 * below (k + 1) 2^10 < 2^24 units, exact in f32 in any order of summing, and
 * in double here: each path, whatever its kernel's order on this processor
 * (AVX2 or AVX-512), must give the exact sum's one rounding; a rounding
 * before the bias is added, or an accumulator of fewer bits, misses it */
static void check_exact(mp_dtype dt, int64_t m, int64_t n, int64_t k)
{
    unsigned seed = (unsigned)(m * 13 + n * 5 + k);
    mp_kctx *cx = mp_cpu_backend.ctx;
    uint16_t *a = malloc(2 * (size_t)(m * k)), *b = malloc(2 * (size_t)(n * k)), *bias = malloc(2 * (size_t)n);
    uint16_t *all[3] = {a, b, bias};
    int64_t len[3] = {m * k, n * k, n};
    for (int q = 0; q < 3; q++)
        for (int64_t i = 0; i < len[q]; i++) all[q][i] = narrow(dt, (float)(rand_r(&seed) % 65 - 32) / 32.0f);
    float *fa = widened(dt, a, m * k), *fb = widened(dt, b, n * k);
    uint16_t *want = malloc(2 * (size_t)(m * n)), *got[3];
    for (int p = 0; p < 3; p++) got[p] = malloc(2 * (size_t)(m * n));
    for (int64_t r = 0; r < m; r++)
        for (int64_t q = 0; q < n; q++) {
            double sum = wide(dt, bias[q]);
            for (int64_t l = 0; l < k; l++) sum += (double)fa[r * k + l] * fb[q * k + l];
            want[r * n + q] = narrow(dt, (float)sum);   /* (float)sum is exact: one rounding */
            got[0][r * n + q] = bias[q];
        }
    cr_assert_eq(cpu_gemm(cx, dt, 0, 1, 1, m, n, k, 1.0f, a, 0, b, 0, 1.0f, got[0], m * n), 0);
    cr_assert_eq(cpu_gemm_wide(cx, dt, 0, 1, 1, m, n, k, 1.0f, a, 0, 0, b, 0, 0, 0.0f, got[1], m * n, bias, NULL), 0);
    cr_assert_eq(cpu_gemm_wide(cx, dt, 0, 1, 1, m, n, k, 1.0f, fa, 1, 0, fb, 1, 0, 0.0f, got[2], m * n, bias, NULL), 0);
    static const char *way[3] = {"fill + gemm", "bias epilogue", "bias epilogue, widened"};
    for (int p = 0; p < 3; p++)
        for (int64_t i = 0; i < m * n; i++)
            cr_assert_eq(got[p][i], want[i], "%s %s %ldx%ldx%ld at %ld: got 0x%04x, want 0x%04x", dtn(dt), way[p], (long)m, (long)n,
                         (long)k, (long)i, got[p][i], want[i]);
    for (int p = 0; p < 3; p++) free(got[p]);
    free(a), free(b), free(bias), free(fa), free(fb), free(want);
}

Test(gemm_wide, linear_is_the_exact_sum_rounded_once)
{
    FOR_WIDENED_DT(dt) {
        check_exact(dt, 37, 29, 53);
        check_exact(dt, 64, 114, 128);
        check_exact(dt, 7, 1000, 300);
        check_exact(dt, 64, 512, 784);
        check_exact(dt, 24, 40, 4096);
        check_exact(dt, 1, 1, 1);
    }
}

/* what the epilogues do not take is declined, nothing written: a batch, and
 * bf16 where oneDNN multiplies bf16 itself (AVX512-core) */
Test(gemm_wide, declines_a_batch_and_bf16_where_onednn_has_it)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    uint16_t a[12] = {0}, b[12] = {0}, c[8], bias[2] = {0};
    float acc[8];
    for (int i = 0; i < 8; i++) c[i] = 0x3c00, acc[i] = 1.0f;
    cr_assert(cpu_gemm_widens(MP_F16));
    cr_assert_eq(cpu_gemm_widens(MP_BF16), !cpu_gemm_dnnl_has_bf16());
    cr_assert(!cpu_gemm_widens(MP_F32) && !cpu_gemm_widens(MP_F64));
    cr_assert_eq(cpu_supports(cx, "gemm_wide", MP_BF16), cpu_gemm_widens(MP_BF16), "supports says what gemm_wide takes");
    for (int d = 0; d < 2; d++) {
        mp_dtype dt = d ? MP_BF16 : MP_F16;
        cr_assert_eq(cpu_gemm_wide(cx, dt, 0, 1, 2, 2, 2, 3, 1.0f, a, 0, 6, b, 0, 6, 0.0f, c, 4, bias, NULL), 1);
        cr_assert_eq(cpu_gemm_wide(cx, dt, 0, 1, 2, 2, 2, 3, 1.0f, a, 0, 6, b, 0, 6, 0.0f, c, 4, NULL, acc), 1);
    }
    if (cpu_gemm_dnnl_has_bf16())
        cr_assert_eq(cpu_gemm_wide(cx, MP_BF16, 0, 1, 1, 2, 2, 3, 1.0f, a, 0, 0, b, 0, 0, 0.0f, c, 4, bias, NULL), 1);
    for (int i = 0; i < 8; i++) cr_assert(c[i] == 0x3c00 && acc[i] == 1.0f, "nothing written");
}
