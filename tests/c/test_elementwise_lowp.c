/*
 * test_elementwise_lowp.c: the bf16/f16 fast paths of the cheap ops give the
 * bits of the general paths they stand in for.
 *
 * - cpu_elementwise_lowp.c's fused kernels (ReLU, its gradient, the scalar
 *   ops, add/sub/mul/div of two tensors or a tensor and a one-value operand)
 *   against cpu_elementwise.c's widen-compute-round blocks (the fused paths
 *   switched off): every bf16 value as the first operand (so ±0, subnormals,
 *   ±inf, signalling and quiet NaNs, the largest finites), random bit patterns
 *   as the second (sums and products that round, ties among them), crafted
 *   ties, every f16 value likewise, lengths with a tail of each size, and a
 *   length that splits over threads; and the fused path is the one taken
 *   where the processor has AVX-512BW, and declined while flushes are counted.
 * - GELU's table lookups (both forms) as AVX-512 gathers, forward and
 *   gradient, against the scalar lookups: every bf16/f16 pattern as x, random
 *   gradients, every tail length, and a length split over 2 threads.
 * - f32 with f16/bf16 (add, sub, mul; the low operand first or second)
 *   widened in registers (cpu_binary_mixed) against the cast then cpu_binary's
 *   f32 op: every low pattern against random and special f32 values, tails,
 *   2 threads.
 * - cpu_batch_norm.c's passes reading the 16-bit runs and widening in
 *   registers (cpu_batch_norm_lowp.c), and its channels widened once into
 *   scratch, each against the same kernel widening block by block and
 *   rounding through cpu_store (both switched off): y, the
 *   statistics, the running statistics and every gradient, bf16 and f16,
 *   values with -0, inf and NaN among them,
 *   training and not, several shapes (runs shorter and longer than a block,
 *   ResNet-sized channels, a channel too large for the scratch), and the same
 *   bits on 1 and 2 threads. The numbers are the same sums over the same
 *   pieces in the same order, so nothing may differ: a bit-for-bit check.
 * - cpu_batch_norm_act (the sum and ReLU in batch norm's output pass) against
 *   cpu_batch_norm, cpu_binary's add and cpu_unary's ReLU in turn, f32, bf16
 *   and f16, both paths, 1 and 2 threads, flushes counted or not; sums that
 *   are infinite, NaN, -0 and underflowing.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/convert_avx512.h"
#include "kernels/half.h"

static const char *dn(mp_dtype dt) { return dt == MP_F16 ? "f16" : "bf16"; }

static uint16_t *bits_buf(int64_t n)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    cr_assert(p);
    return p;
}

/* n values: every 16-bit pattern in turn from `start`, or random patterns */
static uint16_t *patterns(int64_t n, int every, unsigned start, unsigned *seed)
{
    uint16_t *p = bits_buf(n);
    for (int64_t i = 0; i < n; i++) p[i] = every ? (uint16_t)(start + (unsigned)i) : (uint16_t)rand_r(seed);
    return p;
}

static int is_nan(mp_dtype dt, uint16_t v)
{
    return dt == MP_F16 ? (v & 0x7fff) > 0x7c00 : (v & 0x7fff) > 0x7f80;
}

/* bit for bit, but for one case: with both operands NaN, which one's payload
 * the result carries is the operand order of the instruction the compiler
 * picked (C leaves it open, and the general path's clones may differ); there
 * the result must be a NaN, either one */
static void same_bits(const uint16_t *got, const uint16_t *want, int64_t n, const char *what, mp_dtype dt, int op,
                      const uint16_t *a, const uint16_t *b)
{
    for (int64_t i = 0; i < n; i++)
        if (!(b && is_nan(dt, a[i]) && is_nan(dt, b[i]) && is_nan(dt, got[i]) && is_nan(dt, want[i])))
            cr_assert_eq(got[i], want[i], "%s %s op %d [%ld]: fused 0x%04x, general 0x%04x (a 0x%04x, b 0x%04x)", dn(dt),
                     what, op, (long)i, got[i], want[i], a[i], b ? b[i] : 0);
}

static const mp_unop un_ops[] = { MP_RELU, MP_NEG, MP_ADDS, MP_MULS, MP_RSUBS, MP_DIVS };
static const double un_ps[] = { 0, 0, 0.3, -1.7, 2.5, 3.0 };

/* op over a and b (b: the gradient for the unary gradients) with the fused
 * paths on and off; kind 0 unary, 1 unary gradient, 2 binary */
static void compare_all(mp_dtype dt, const uint16_t *a, const uint16_t *b, int64_t n)
{
    uint16_t *f = bits_buf(n), *g = bits_buf(n);
    for (size_t k = 0; k < sizeof un_ops / sizeof un_ops[0]; k++) {
        for (int pass = 0; pass < 2; pass++) {
            int was = cpu_lowp_fused_enable(pass == 0);
            cpu_unary(NULL, un_ops[k], dt, pass ? g : f, a, n, un_ps[k]);
            cpu_lowp_fused_enable(was);
        }
        same_bits(f, g, n, "unary", dt, un_ops[k], a, NULL);
        for (int pass = 0; pass < 2; pass++) {
            int was = cpu_lowp_fused_enable(pass == 0);
            cpu_unary_grad(NULL, un_ops[k], dt, pass ? g : f, b, a, NULL, n, un_ps[k]);
            cpu_lowp_fused_enable(was);
        }
        same_bits(f, g, n, "unary_grad", dt, un_ops[k], a, b);
    }
    static const mp_binop bin_ops[] = { MP_ADD, MP_SUB, MP_MUL, MP_DIV };
    /* same shape; then b as one value broadcast, then a */
    uint16_t *sa = bits_buf(n), *sb = bits_buf(n);
    for (int64_t i = 0; i < n; i++) sa[i] = a[0], sb[i] = b[0];
    for (int form = 0; form < 3; form++) {
        mp_bcast bc = { .ndim = 1, .shape = { n }, .sa = { form == 2 ? 0 : 1 }, .sb = { form == 1 ? 0 : 1 } };
        for (size_t k = 0; k < sizeof bin_ops / sizeof bin_ops[0]; k++) {
            for (int pass = 0; pass < 2; pass++) {
                int was = cpu_lowp_fused_enable(pass == 0);
                cpu_binary(NULL, bin_ops[k], dt, pass ? g : f, a, b, &bc);
                cpu_lowp_fused_enable(was);
            }
            same_bits(f, g, n, form ? "binary (scalar operand)" : "binary", dt, bin_ops[k], form == 2 ? sa : a,
                      form == 1 ? sb : b);
        }
    }
    free(f), free(g), free(sa), free(sb);
}

Test(elementwise_lowp, every_value_against_general_path)
{
    unsigned seed = 7;
    mp_dtype dts[] = { MP_BF16, MP_F16 };
    for (int d = 0; d < 2; d++) {
        int64_t n = 65536 + 13;   /* every pattern, then a tail of 13 */
        uint16_t *a = patterns(n, 1, 0, &seed), *b = patterns(n, 0, 0, &seed);
        compare_all(dts[d], a, b, n);
        /* b every pattern too, against a reversed: other pairs */
        for (int64_t i = 0; i < n; i++) b[i] = a[n - 1 - i];
        compare_all(dts[d], a, b, n);
        free(a), free(b);
    }
}

/* sums and products that land halfway between two bf16 (f16) values, and
 * halfway plus or minus the smallest step: round to even, or not */
Test(elementwise_lowp, rounding_ties)
{
    int64_t n = 0, cap = 4096;
    uint16_t *a = bits_buf(cap), *b = bits_buf(cap);
    for (int e = -20; e <= 20 && n + 8 <= cap; e++)
        for (int m = 0; m < 4; m++) {
            float x = ldexpf(1.0f + (float)m / 128.0f, e);      /* bf16: 7 fraction bits */
            float h = ldexpf(1.0f, e - 8);                      /* half an ulp of x */
            a[n] = mp_f32_to_bf16(x), b[n++] = mp_f32_to_bf16(h);
            a[n] = mp_f32_to_bf16(-x), b[n++] = mp_f32_to_bf16(-h);
            a[n] = mp_f32_to_bf16(x), b[n++] = mp_f32_to_bf16(h * 1.5f);
            a[n] = mp_f32_to_bf16(x), b[n++] = mp_f32_to_bf16(h * 0.75f);
        }
    compare_all(MP_BF16, a, b, n);
    n = 0;
    for (int e = -14; e <= 14 && n + 4 <= cap; e++)
        for (int m = 0; m < 8; m++) {
            float x = ldexpf(1.0f + (float)m / 1024.0f, e), h = ldexpf(1.0f, e - 11);
            a[n] = mp_f32_to_f16(x), b[n++] = mp_f32_to_f16(h);
            a[n] = mp_f32_to_f16(-x), b[n++] = mp_f32_to_f16(-h);
        }
    compare_all(MP_F16, a, b, n);
    free(a), free(b);
}

/* every length up to 40 (tails of every size, lengths under one register) */
Test(elementwise_lowp, short_lengths)
{
    unsigned seed = 11;
    for (int64_t n = 1; n <= 40; n++) {
        uint16_t *a = patterns(n, 0, 0, &seed), *b = patterns(n, 0, 0, &seed);
        compare_all(MP_BF16, a, b, n);
        compare_all(MP_F16, a, b, n);
        free(a), free(b);
    }
}

/* long enough to split over threads: the same bits on 2 threads as the
 * general path */
Test(elementwise_lowp, threads)
{
    unsigned seed = 5;
    int64_t n = MP_PAR_MIN + 4099;
    uint16_t *a = patterns(n, 1, 0x3000, &seed), *b = patterns(n, 0, 0, &seed);
    int nt = omp_get_max_threads();
    omp_set_num_threads(2);
    compare_all(MP_BF16, a, b, n);
    omp_set_num_threads(nt);
    free(a), free(b);
}

/* GELU (p 0: erf, 1: tanh form) forward and gradient, the gathers on and off */
static void compare_gelu(mp_dtype dt, const uint16_t *x, const uint16_t *g, int64_t n)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    uint16_t *f = bits_buf(n), *h = bits_buf(n);
    for (int form = 0; form < 2; form++) {
        for (int pass = 0; pass < 2; pass++) {
            int was = cpu_lowp_fused_enable(pass == 0);
            cpu_unary(cx, MP_GELU, dt, pass ? h : f, x, n, form);
            cpu_lowp_fused_enable(was);
        }
        same_bits(f, h, n, "gelu", dt, form, x, NULL);
        for (int pass = 0; pass < 2; pass++) {
            int was = cpu_lowp_fused_enable(pass == 0);
            cpu_unary_grad(cx, MP_GELU, dt, pass ? h : f, g, x, NULL, n, form);
            cpu_lowp_fused_enable(was);
        }
        /* the gradient is g * slope(x), and the slope is NaN at some finite x (the
         * tanh form at |x| past f32's cube root of the maximum, as in PyTorch):
         * with a NaN g too, either NaN's payload may come out (C leaves the
         * operand order of a product open; -O3 without contraction swaps it) */
        for (int64_t i = 0; i < n; i++)
            if (is_nan(dt, g[i]) && is_nan(dt, f[i]) && is_nan(dt, h[i])) f[i] = h[i];
        same_bits(f, h, n, "gelu_grad", dt, form, x, g);
    }
    free(f), free(h);
}

Test(elementwise_lowp, gelu_tables_gathered)
{
    unsigned seed = 17;
    mp_dtype dts[] = { MP_BF16, MP_F16 };
    for (int d = 0; d < 2; d++) {
        int64_t n = 65536 + 13;
        uint16_t *x = patterns(n, 1, 0, &seed), *g = patterns(n, 0, 0, &seed);
        compare_gelu(dts[d], x, g, n);
        for (int64_t i = 0; i < n; i++) g[i] = x[n - 1 - i];   /* every pattern as the gradient too */
        compare_gelu(dts[d], x, g, n);
        free(x), free(g);
        for (int64_t m = 1; m <= 40; m++) {
            x = patterns(m, 0, 0, &seed), g = patterns(m, 0, 0, &seed);
            compare_gelu(dts[d], x, g, m);
            free(x), free(g);
        }
    }
    int64_t n = MP_PAR_MIN + 4099;
    uint16_t *x = patterns(n, 1, 0xff00, &seed), *g = patterns(n, 0, 0, &seed);
    int nt = omp_get_max_threads();
    omp_set_num_threads(2);
    compare_gelu(MP_BF16, x, g, n);
    compare_gelu(MP_F16, x, g, n);
    omp_set_num_threads(nt);
    free(x), free(g);
    uint16_t o[64], a[64] = {0};
    const uint16_t table[65537] = {0};
    const float slope[65536] = {0};
    int has = mp_cpu_has_avx512bw();
    cr_assert_eq(cpu_lowp_gelu(mp_cpu_backend.ctx, MP_BF16, o, a, 64, table), has);
    cr_assert_eq(cpu_lowp_gelu_grad(mp_cpu_backend.ctx, MP_BF16, o, a, a, 64, slope), has);
    cr_assert_eq(cpu_lowp_gelu(mp_cpu_backend.ctx, MP_F32, o, a, 32, table), 0);
    int was = cpu_lowp_fused_enable(0);
    cr_assert_eq(cpu_lowp_gelu_grad(mp_cpu_backend.ctx, MP_BF16, o, a, a, 64, slope), 0);
    cpu_lowp_fused_enable(was);
}

/* low (n values of dt) against hi (n f32), both orders, add/sub/mul */
static void compare_mixed(mp_dtype dt, const uint16_t *low, const float *hi, int64_t n)
{
    float *wide = malloc(sizeof(float) * (size_t)n), *f = malloc(sizeof(float) * (size_t)n),
          *g = malloc(sizeof(float) * (size_t)n);
    cr_assert(wide && f && g);
    if (dt == MP_F16) mp_cpu_f16_to_f32(wide, low, n);
    else mp_cpu_bf16_to_f32(wide, low, n);
    static const mp_binop ops[] = { MP_ADD, MP_SUB, MP_MUL };
    mp_bcast bc = { .ndim = 1, .shape = { n }, .sa = { 1 }, .sb = { 1 } };
    for (int k = 0; k < 3; k++)
        for (int lowa = 0; lowa < 2; lowa++) {
            int rc = lowa ? cpu_binary_mixed(NULL, ops[k], f, low, dt, hi, MP_F32, n)
                          : cpu_binary_mixed(NULL, ops[k], f, hi, MP_F32, low, dt, n);
            cr_assert_eq(rc, mp_cpu_has_avx512bw() && (dt == MP_BF16 || mp_cpu_has_avx512_f16c()) ? 0 : 1);
            if (rc) continue;
            cpu_binary(NULL, ops[k], MP_F32, g, lowa ? wide : hi, lowa ? hi : wide, &bc);
            for (int64_t i = 0; i < n; i++) {
                uint32_t x, y;
                memcpy(&x, f + i, 4), memcpy(&y, g + i, 4);
                /* two NaN operands: either payload (as same_bits) */
                if (x != y && isnan(f[i]) && isnan(g[i]) && isnan(wide[i]) && isnan(hi[i])) continue;
                cr_assert_eq(x, y, "%s op %d low %s [%ld]: mixed 0x%08x, cast then op 0x%08x (low 0x%04x, f32 %g)",
                             dn(dt), ops[k], lowa ? "first" : "second", (long)i, x, y, low[i], hi[i]);
            }
        }
    free(wide), free(f), free(g);
}

Test(elementwise_lowp, mixed_f32_and_low_widened_in_registers)
{
    unsigned seed = 23;
    mp_dtype dts[] = { MP_BF16, MP_F16 };
    static const float special[] = { 0.0f, -0.0f, 1.0f, -1.0f, 1e-40f, -1e-40f, 3.4e38f, INFINITY, -INFINITY, NAN };
    for (int d = 0; d < 2; d++) {
        int64_t n = 65536 + 13;
        uint16_t *low = patterns(n, 1, 0, &seed);
        float *hi = malloc(sizeof(float) * (size_t)n);
        cr_assert(hi);
        for (int64_t i = 0; i < n; i++) {
            uint32_t r = (uint32_t)rand_r(&seed) ^ ((uint32_t)rand_r(&seed) << 16);
            memcpy(hi + i, &r, 4);
            if (i % 5 == 0) hi[i] = special[i / 5 % 10];
            if (i % 7 == 0) hi[i] = ((float)rand_r(&seed) / (float)RAND_MAX - 0.5f) * 8.0f;
        }
        compare_mixed(dts[d], low, hi, n);
        for (int64_t m = 1; m <= 40; m++) compare_mixed(dts[d], low + 1000 * m, hi + 77 * m, m);
        free(low), free(hi);
    }
    int64_t n = MP_PAR_MIN + 4099;
    uint16_t *low = patterns(n, 1, 0x3f00, &seed);
    float *hi = malloc(sizeof(float) * (size_t)n);
    cr_assert(hi);
    for (int64_t i = 0; i < n; i++) hi[i] = (float)i * 0.37f - 1000.0f;
    int nt = omp_get_max_threads();
    omp_set_num_threads(2);
    compare_mixed(MP_BF16, low, hi, n);
    compare_mixed(MP_F16, low, hi, n);
    omp_set_num_threads(nt);
    free(low), free(hi);
    /* declined: other ops and dtype pairs */
    uint16_t a[32] = {0};
    float o[32], f[32] = {0};
    cr_assert_eq(cpu_binary_mixed(NULL, MP_DIV, o, f, MP_F32, a, MP_BF16, 32), 1);
    cr_assert_eq(cpu_binary_mixed(NULL, MP_ADD, o, a, MP_BF16, a, MP_F16, 32), 1);
    cr_assert_eq(cpu_binary_mixed(NULL, MP_ADD, o, f, MP_F32, f, MP_F32, 32), 1);
}

/* A broadcast where both operands repeat over every row ({rows, len} with
 * strides {0, 1}: a linear layer's bias rows, 0 + b, under autocast) computes
 * the first row and copies it (cpu_elementwise.c): every row must hold the
 * bits of that row computed on its own by the general path, for f32, f16 and
 * bf16, a comparison (u8 out), one row, 3-d shapes and long rows (a split
 * over 2 threads); with flushes counted, the rows are computed as before. */
Test(elementwise_lowp, broadcast_rows_alike_copied)
{
    static const mp_dtype dts[] = { MP_F32, MP_F16, MP_BF16 };
    static const mp_binop ops[] = { MP_ADD, MP_MUL, MP_GT };
    static const int64_t shapes[][3] = { {1, 5, 37}, {1, 1, 33}, {2, 3, 1030}, {1, 70, 600} };
    unsigned seed = 99;
    int nt = omp_get_max_threads();
    omp_set_num_threads(2);
    mp_kctx *cx = mp_cpu_backend.ctx;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                mp_dtype dt = dts[d];
                int64_t r0 = shapes[si][0], r1 = shapes[si][1], len = shapes[si][2], rows = r0 * r1;
                size_t es = mp_dtype_size(dt), os = MP_IS_CMP(ops[o]) ? 1 : es;
                unsigned char *a = malloc(es * (size_t)len), *b = malloc(es * (size_t)len);
                for (size_t i = 0; i < es * (size_t)len; i++) a[i] = (unsigned char)rand_r(&seed), b[i] = (unsigned char)rand_r(&seed);
                for (int64_t i = 0; dt == MP_F32 && i < len; i++)   /* finite f32: NaN only where set below */
                    ((float *)a)[i] = (float)rand_r(&seed) / 1e6f - 1000.0f, ((float *)b)[i] = (float)rand_r(&seed) / 1e7f;
                if (dt != MP_F32) ((uint16_t *)a)[0] = 0x8000, ((uint16_t *)b)[1] = dt == MP_F16 ? 0x7d01 : 0x7f81;   /* -0, a signalling NaN */
                else ((float *)a)[0] = -0.0f, ((float *)b)[1] = NAN;
                unsigned char *got = malloc(os * (size_t)(rows * len)), *row = malloc(os * (size_t)len);
                unsigned char *counted = malloc(os * (size_t)(rows * len));
                mp_bcast bc = { .ndim = 3, .shape = { r0, r1, len }, .sa = { 0, 0, 1 }, .sb = { 0, 0, 1 } };
                cpu_binary(cx, ops[o], dt, got, a, b, &bc);
                int on = cx->flush.on;
                cx->flush.on = 1;
                cpu_binary(cx, ops[o], dt, counted, a, b, &bc);
                cx->flush.on = on;
                int was = cpu_lowp_fused_enable(0);
                mp_bcast one = { .ndim = 1, .shape = { len }, .sa = { 1 }, .sb = { 1 } };
                cpu_binary(NULL, ops[o], dt, row, a, b, &one);
                cpu_lowp_fused_enable(was);
                for (int64_t r = 0; r < rows; r++) {
                    unsigned char *g = got + (size_t)r * os * (size_t)len, *c = counted + (size_t)r * os * (size_t)len;
                    if (os == 2) {   /* 16-bit: where both operands are NaN, either payload (same_bits) */
                        same_bits((uint16_t *)g, (uint16_t *)row, len, "rows alike", dt, ops[o], (uint16_t *)a, (uint16_t *)b);
                        same_bits((uint16_t *)c, (uint16_t *)row, len, "rows alike, flushes counted", dt, ops[o],
                                  (uint16_t *)a, (uint16_t *)b);
                        continue;
                    }
                    cr_assert_eq(memcmp(g, row, os * (size_t)len), 0, "dtype %d op %d shape %lldx%lldx%lld: row %lld differs",
                                 dt, ops[o], (long long)r0, (long long)r1, (long long)len, (long long)r);
                    cr_assert_eq(memcmp(c, row, os * (size_t)len), 0, "dtype %d op %d, flushes counted: row %lld differs", dt,
                                 ops[o], (long long)r);
                }
                free(a), free(b), free(got), free(row), free(counted);
            }
    omp_set_num_threads(nt);
}

Test(elementwise_lowp, taken_and_declined)
{
    uint16_t a[64] = {0}, b[64] = {0}, o[64];
    int has = mp_cpu_has_avx512bw();
    cr_assert_eq(cpu_unary_lowp(NULL, MP_RELU, MP_BF16, o, a, 64, 0), has);
    cr_assert_eq(cpu_unary_grad_lowp(NULL, MP_RELU, MP_BF16, o, b, a, 64, 0), has);
    mp_bcast bc = { .ndim = 1, .shape = { 64 }, .sa = { 1 }, .sb = { 1 } };
    cr_assert_eq(cpu_binary_lowp(NULL, MP_ADD, MP_BF16, o, a, b, &bc), has);
    /* declined: other ops and dtypes, ReLU's gradient without x, strides, flush counting */
    cr_assert_eq(cpu_unary_lowp(NULL, MP_EXP, MP_BF16, o, a, 64, 0), 0);
    cr_assert_eq(cpu_unary_lowp(NULL, MP_RELU, MP_F32, o, a, 32, 0), 0);
    cr_assert_eq(cpu_unary_grad_lowp(NULL, MP_RELU, MP_BF16, o, b, NULL, 64, 0), 0);
    cr_assert_eq(cpu_binary_lowp(NULL, MP_POWT, MP_BF16, o, a, b, &bc), 0);
    mp_bcast st = { .ndim = 1, .shape = { 32 }, .sa = { 2 }, .sb = { 1 } };
    cr_assert_eq(cpu_binary_lowp(NULL, MP_ADD, MP_BF16, o, a, b, &st), 0);
    mp_bcast rows = { .ndim = 2, .shape = { 4, 16 }, .sa = { 16, 1 }, .sb = { 0, 1 } };
    cr_assert_eq(cpu_binary_lowp(NULL, MP_ADD, MP_BF16, o, a, b, &rows), 0);
    mp_kctx *cx = mp_cpu_backend.ctx;
    int on = cx->flush.on;
    cx->flush.on = 1;
    cr_assert_eq(cpu_unary_lowp(cx, MP_RELU, MP_BF16, o, a, 64, 0), 0);
    cx->flush.on = on;
    int was = cpu_lowp_fused_enable(0);
    cr_assert_eq(cpu_unary_lowp(NULL, MP_RELU, MP_BF16, o, a, 64, 0), 0);
    cpu_lowp_fused_enable(was);
}

/* ---- batch norm ---------------------------------------------------------- */

typedef struct {
    uint16_t *y, *gx;
    float *mean, *rstd, *rm, *rv, *gw, *gb;
} bn_out;

static void bn_alloc(bn_out *o, int64_t n, int64_t c)
{
    o->y = bits_buf(n), o->gx = bits_buf(n);
    o->mean = malloc(4 * (size_t)c), o->rstd = malloc(4 * (size_t)c), o->rm = malloc(4 * (size_t)c);
    o->rv = malloc(4 * (size_t)c), o->gw = malloc(4 * (size_t)c), o->gb = malloc(4 * (size_t)c);
    for (int64_t i = 0; i < c; i++) o->rm[i] = 0.1f * (float)i, o->rv[i] = 1.0f + 0.05f * (float)i;
}

static void bn_free(bn_out *o)
{
    free(o->y), free(o->gx), free(o->mean), free(o->rstd), free(o->rm), free(o->rv), free(o->gw), free(o->gb);
}

static void bn_run(bn_out *o, mp_dtype dt, const uint16_t *x, const uint16_t *gy, const float *w, const float *b,
                   int64_t n, int64_t c, int64_t hw, int training, int wide, int direct, int threads)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    /* wide 0, direct 0 (the reference): widened block by block, y and gx
     * rounded by cpu_store; wide 1: each channel widened once into scratch;
     * direct 1: every pass widening in registers (cpu_batch_norm_lowp.c) */
    int nt = omp_get_max_threads(), was = cpu_batch_norm_wide_enable(wide), fused = cpu_lowp_fused_enable(direct);
    omp_set_num_threads(threads);
    cr_assert_eq(cpu_batch_norm(cx, dt, o->y, o->mean, o->rstd, o->rm, o->rv, x, w, b, n, c, hw, training, 0.1f,
                                1e-5f), 0);
    cr_assert_eq(cpu_batch_norm_grad(cx, dt, o->gx, o->gw, o->gb, gy, x, o->mean, o->rstd, w, n, c, hw, training),
                 0);
    omp_set_num_threads(nt);
    cpu_batch_norm_wide_enable(was), cpu_lowp_fused_enable(fused);
}

/* 1 where batch norm's passes widen in registers (cpu_batch_norm_lowp.c): they
 * must wherever the processor has the instructions */
static int bn_direct_runs(mp_dtype dt)
{
    int runs = cpu_lowp_bn(mp_cpu_backend.ctx, dt) != NULL;
    cr_assert_eq(runs, mp_cpu_has_avx512bw() && (dt == MP_BF16 || mp_cpu_has_avx512_f16c()));
    return runs;
}

static void bn_same(const bn_out *p, const bn_out *q, int64_t total, int64_t c, const char *what)
{
    cr_assert(!memcmp(p->y, q->y, 2 * (size_t)total), "%s: y differs", what);
    cr_assert(!memcmp(p->gx, q->gx, 2 * (size_t)total), "%s: gx differs", what);
    cr_assert(!memcmp(p->mean, q->mean, 4 * (size_t)c), "%s: mean differs", what);
    cr_assert(!memcmp(p->rstd, q->rstd, 4 * (size_t)c), "%s: rstd differs", what);
    cr_assert(!memcmp(p->rm, q->rm, 4 * (size_t)c), "%s: running mean differs", what);
    cr_assert(!memcmp(p->rv, q->rv, 4 * (size_t)c), "%s: running var differs", what);
    cr_assert(!memcmp(p->gw, q->gw, 4 * (size_t)c), "%s: gw differs", what);
    cr_assert(!memcmp(p->gb, q->gb, 4 * (size_t)c), "%s: gb differs", what);
}

Test(batch_norm_lowp, widened_once_same_bits)
{
    /* n, c, hw: runs shorter than a block, longer than one and not a multiple
     * of it, ResNet-sized channels (split over threads), one image, a channel
     * over BN_WIDE_MAX values (blockwise either way) */
    static const int64_t shapes[][3] = {
        { 4, 3, 50 }, { 2, 5, 1500 }, { 3, 4, 1024 }, { 32, 16, 1024 }, { 128, 8, 64 }, { 1, 6, 7 }, { 2, 2, 70000 },
    };
    mp_dtype dts[] = { MP_BF16, MP_F16 };
    unsigned seed = 3;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], total = n * c * hw;
        for (int d = 0; d < 2; d++) {
            mp_dtype dt = dts[d];
            uint16_t *x = bits_buf(total), *gy = bits_buf(total);
            float *w = malloc(4 * (size_t)c), *b = malloc(4 * (size_t)c);
            for (int64_t i = 0; i < total; i++) {
                int64_t ch = (i / hw) % c;   /* each channel its own offset and spread */
                float v = (float)ch * 0.37f + (float)(rand_r(&seed) % 20001 - 10000) / 4000.0f * (1.0f + (float)ch);
                float g = (float)(rand_r(&seed) % 20001 - 10000) / 9000.0f;
                x[i] = dt == MP_F16 ? mp_f32_to_f16(v) : mp_f32_to_bf16(v);
                gy[i] = dt == MP_F16 ? mp_f32_to_f16(g) : mp_f32_to_bf16(g);
            }
            if (c >= 4) {
                /* image 0: -0 and +inf in channel 1's x (an infinite mean, NaN
                 * statistics), one NaN in channel 2's x, +inf and -0 in
                 * channel 3's gradient */
                int f = dt == MP_F16;
                x[hw] = 0x8000, x[hw + 1] = f ? 0x7c00 : 0x7f80;
                x[2 * hw + hw / 2] = f ? 0x7e01 : 0x7fc1;
                gy[3 * hw + 2] = f ? 0x7c00 : 0x7f80, gy[3 * hw + 3] = 0x8000;
            }
            for (int64_t i = 0; i < c; i++) w[i] = 0.5f + 0.25f * (float)i, b[i] = -0.125f * (float)i;
            for (int training = 0; training < 2; training++) {
                bn_out ref, once, two, reg, reg2;
                bn_alloc(&ref, total, c), bn_alloc(&once, total, c), bn_alloc(&two, total, c);
                bn_alloc(&reg, total, c), bn_alloc(&reg2, total, c);
                bn_run(&ref, dt, x, gy, w, b, n, c, hw, training, 0, 0, 1);
                bn_run(&once, dt, x, gy, w, b, n, c, hw, training, 1, 0, 1);
                bn_run(&two, dt, x, gy, w, b, n, c, hw, training, 1, 0, 2);
                bn_run(&reg, dt, x, gy, w, b, n, c, hw, training, 1, 1, 1);
                bn_run(&reg2, dt, x, gy, w, b, n, c, hw, training, 0, 1, 2);
                char what[96];
                snprintf(what, sizeof what, "%s %ldx%ldx%ld training %d, widened once", dn(dt), (long)n, (long)c,
                         (long)hw, training);
                bn_same(&once, &ref, total, c, what);
                snprintf(what, sizeof what, "%s %ldx%ldx%ld training %d, 2 threads", dn(dt), (long)n, (long)c,
                         (long)hw, training);
                bn_same(&two, &ref, total, c, what);
                if (bn_direct_runs(dt)) {
                    snprintf(what, sizeof what, "%s %ldx%ldx%ld training %d, in registers", dn(dt), (long)n, (long)c,
                             (long)hw, training);
                    bn_same(&reg, &ref, total, c, what);
                    snprintf(what, sizeof what, "%s %ldx%ldx%ld training %d, in registers, 2 threads", dn(dt),
                             (long)n, (long)c, (long)hw, training);
                    bn_same(&reg2, &ref, total, c, what);
                }
                bn_free(&ref), bn_free(&once), bn_free(&two), bn_free(&reg), bn_free(&reg2);
            }
            free(x), free(gy), free(w), free(b);
        }
    }
}

/* no affine weights and no gradient of x wanted (the frozen-input case): the
 * same bits as well */
Test(batch_norm_lowp, no_weights_no_gx)
{
    int64_t n = 8, c = 4, hw = 300, total = n * c * hw;
    unsigned seed = 9;
    uint16_t *x = bits_buf(total), *gy = bits_buf(total);
    for (int64_t i = 0; i < total; i++)
        x[i] = mp_f32_to_bf16((float)(rand_r(&seed) % 2001 - 1000) / 300.0f),
        gy[i] = mp_f32_to_bf16((float)(rand_r(&seed) % 2001 - 1000) / 700.0f);
    mp_kctx *cx = mp_cpu_backend.ctx;
    float out[2][6][4];
    uint16_t *y[2] = { bits_buf(total), bits_buf(total) };
    for (int wide = 0; wide < 2; wide++) {
        int was = cpu_batch_norm_wide_enable(wide), fused = cpu_lowp_fused_enable(wide);
        float *m = out[wide][0], *r = out[wide][1], *rm = out[wide][2], *rv = out[wide][3];
        for (int i = 0; i < 4; i++) rm[i] = 0, rv[i] = 1;
        cr_assert_eq(cpu_batch_norm(cx, MP_BF16, y[wide], m, r, rm, rv, x, NULL, NULL, n, c, hw, 1, 0.1f, 1e-5f), 0);
        cr_assert_eq(cpu_batch_norm_grad(cx, MP_BF16, NULL, out[wide][4], out[wide][5], gy, x, m, r, NULL, n, c, hw,
                                         1), 0);
        cpu_batch_norm_wide_enable(was), cpu_lowp_fused_enable(fused);
    }
    cr_assert(!memcmp(out[0], out[1], sizeof out[0]));
    cr_assert(!memcmp(y[0], y[1], 2 * (size_t)total));
    free(x), free(gy), free(y[0]), free(y[1]);
}

/* batch_norm_act (relu(bn(x) + z) in batch norm's output pass) against the
 * three kernels it stands in for, cpu_batch_norm, cpu_binary's add and
 * cpu_unary's ReLU, in f32, bf16 and f16: with and without z, with and without
 * the ReLU, the widened and blockwise paths, 1 and 2 threads, on values with
 * zeros and sums that cancel to zero (z = -bias on a constant channel). The
 * output, mean, rstd and running statistics bit for bit. */
Test(batch_norm_lowp, act_is_the_three_kernels)
{
    static const int64_t shapes[][3] = { { 4, 3, 50 }, { 2, 5, 1500 }, { 32, 16, 1024 }, { 2, 2, 70000 } };
    mp_dtype dts[] = { MP_F32, MP_BF16, MP_F16 };
    mp_kctx *cx = mp_cpu_backend.ctx;
    unsigned seed = 11;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 3; d++) {
            mp_dtype dt = dts[d];
            int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], total = n * c * hw;
            size_t es = mp_dtype_size(dt), bytes = es * (size_t)total;
            float *xf = malloc(4 * (size_t)total), *zf = malloc(4 * (size_t)total);
            float *w = malloc(4 * (size_t)c), *b = malloc(4 * (size_t)c);
            for (int64_t i = 0; i < c; i++) w[i] = 0.5f + 0.25f * (float)i, b[i] = i == 1 ? 0.375f : -0.125f * (float)i;
            /* channel 2: weight 0, bias -0, a positive mean: y is +0 or -0
             * (x < 0), the sum with a -0 of z -0, and the ReLU must keep it;
             * channel 3: weight 0, bias -1e-9: y rounds to -0 in f16 before
             * the ReLU sees it */
            if (c > 2) w[2] = 0.0f, b[2] = -0.0f;
            if (c > 3) w[3] = 0.0f, b[3] = -1e-9f;
            for (int64_t i = 0; i < total; i++) {
                int64_t ch = (i / hw) % c;
                int r = rand_r(&seed) % 20001 - 10000;
                xf[i] = ch == 1 ? 0.75f : ch == 2 ? (float)r / 3000.0f + 2.0f : r % 5 == 0 ? 0.0f : (float)r / 3000.0f;
                float zr = (float)(rand_r(&seed) % 2001 - 1000) / 700.0f;
                zf[i] = ch == 1 ? -b[1] : ch == 2 && r % 3 == 0 ? -0.0f : r % 7 == 0 ? 0.0f : zr;
            }
            zf[0] = -INFINITY, zf[1] = INFINITY, zf[2] = NAN, zf[3] = -NAN, zf[4] = -0.0f, zf[5] = 1e-30f;
            zf[6] = -1e-30f;   /* underflows to -0 in f16 (bf16: a subnormal) unless the sum is larger */
            void *x = malloc(bytes), *z = malloc(bytes), *ya = malloc(bytes), *yr = malloc(bytes);
            cpu_store(NULL, dt, x, 0, xf, total), cpu_store(NULL, dt, z, 0, zf, total);
            mp_bcast bc = { .ndim = 1, .shape = { total }, .sa = { 1 }, .sb = { 1 } };
            for (int mode = 1; mode < 4; mode++)   /* bit 0: z, bit 1: the ReLU */
                for (int wide = 0; wide < 2; wide++)
                    for (int threads = 1; threads <= 2; threads++)
                    for (int flush = 0; flush < 2; flush++) {   /* flushes counted: the widening paths */
                        int with_z = mode & 1, relu = mode >> 1, on = cx->flush.on;
                        cx->flush.on = flush;
                        float st[2][4][16] = { { { 0 } } };   /* mean, rstd, running mean, running var (c <= 16) */
                        for (int k = 0; k < 2; k++)
                            for (int64_t i = 0; i < c; i++) st[k][2][i] = 0.1f * (float)i, st[k][3][i] = 1.0f;
                        int nt = omp_get_max_threads(), was = cpu_batch_norm_wide_enable(wide);
                        omp_set_num_threads(threads);
                        cr_assert_eq(cpu_batch_norm_act(cx, dt, ya, st[0][0], st[0][1], st[0][2], st[0][3], x, w, b,
                                                        with_z ? z : NULL, n, c, hw, 1, 0.1f, 1e-5f, relu), 0);
                        cr_assert_eq(cpu_batch_norm(cx, dt, yr, st[1][0], st[1][1], st[1][2], st[1][3], x, w, b, n, c,
                                                    hw, 1, 0.1f, 1e-5f), 0);
                        if (with_z) cpu_binary(cx, MP_ADD, dt, yr, yr, z, &bc);
                        if (relu) cpu_unary(cx, MP_RELU, dt, yr, yr, total, 0.0);
                        omp_set_num_threads(nt);
                        cpu_batch_norm_wide_enable(was);
                        cx->flush.on = on;
                        cr_assert(!memcmp(ya, yr, bytes),
                                  "dtype %d %ldx%ldx%ld z %d relu %d wide %d threads %d flush %d: y", (int)dt, (long)n,
                                  (long)c, (long)hw, with_z, relu, wide, threads, flush);
                        cr_assert(!memcmp(st[0], st[1], sizeof st[0]), "dtype %d %ldx%ldx%ld: statistics", (int)dt,
                                  (long)n, (long)c, (long)hw);
                    }
            free(xf), free(zf), free(w), free(b), free(x), free(z), free(ya), free(yr);
        }
}
