/*
 * test_fp8_gemm.c: the FP8 GEMM (kernels/cpu/cpu_fp8_gemm.c).
 * f32 accumulation: against the exact product of the decoded values and
 * their scales (double), within the f32 summation bound (k + c) 2^-24 of the
 * terms' magnitudes summed (c: the chunks' promotion adds and the scale
 * products), for every granularity pair, through oneDNN and without it; exact
 * where the sums are small integers. The modelled accumulator: with 23 bits
 * it is f32 arithmetic (sequential f32 sums, bit for bit); with 14 bits it
 * matches an integer reference of the same rules bit for bit (e4m3 values
 * are multiples of 2^-9, so their products' sums are integers in units of
 * 2^-18, rounded here to 15 significant bits by integer arithmetic).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu_dnnl.h"
#include "kernels/cpu/cpu_fp8.h"
#include "kernels/half.h"

static mp_kctx *cx(void) { return mp_cpu_backend.ctx; }

/* n random finite codes of fmt (within +-2^lim's codes when lim > 0) */
static uint8_t *rand_codes(int64_t n, mp_fp8_format fmt, unsigned seed)
{
    uint8_t *q = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        uint8_t c;
        do c = (uint8_t)rand_r(&seed); while (!isfinite(mp_fp8_to_f32(c, fmt)));
        q[i] = c;
    }
    return q;
}

/* scales: f32 in [0.1, 3) with odd mantissas, or E8M0 bytes 127 +- spread */
static void *rand_scales(mp_fp8_gran g, int64_t rows, int64_t k, int spread, unsigned seed)
{
    int64_t n = mp_fp8_nscales(g, rows, k);
    if (g == MP_FP8_MX) {
        uint8_t *e = malloc((size_t)n);
        for (int64_t i = 0; i < n; i++) e[i] = (uint8_t)(127 + rand_r(&seed) % (2 * spread + 1) - spread);
        return e;
    }
    float *d = malloc(sizeof *d * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = 0.1f + (float)(rand_r(&seed) % 29000) / 10000.0f;
    return d;
}

/* the decode scale of row r at column j, as the contract reads it */
static double ref_scale(const mp_fp8_operand *x, int64_t r, int64_t j, int64_t k)
{
    int64_t nk = (k + 127) / 128;
    const float *d = x->scales;
    switch (x->g) {
    case MP_FP8_TENSOR: return d[0];
    case MP_FP8_TILE: return d[r * nk + j / 128];
    case MP_FP8_BLOCK: return d[r / 128 * nk + j / 128];
    case MP_FP8_MX: return ldexp(1.0, ((const uint8_t *)x->scales)[r * ((k + 31) / 32) + j / 32] - 127);
    }
    return 0;
}

static double val(const mp_fp8_operand *x, int64_t r, int64_t j, int64_t k)
{
    return mp_fp8_to_f32(x->q[r * k + j], x->fmt) * ref_scale(x, r, j, k);
}

/* C (f32 accumulation) within the f32 bound of the exact product */
static void check_f32acc(int64_t m, int64_t n, int64_t k, mp_fp8_gran ga, mp_fp8_format fa, mp_fp8_gran gb,
                         mp_fp8_format fb, int spread)
{
    unsigned seed = (unsigned)(m * 7 + n * 3 + k + ga * 11 + gb);
    mp_fp8_operand a = {rand_codes(m * k, fa, seed), fa, ga, rand_scales(ga, m, k, spread, seed + 1)};
    mp_fp8_operand b = {rand_codes(n * k, fb, seed + 2), fb, gb, rand_scales(gb, n, k, spread, seed + 3)};
    float *c = malloc(sizeof *c * (size_t)(m * n));
    cr_assert_eq(cpu_fp8_gemm(cx(), m, n, k, &a, &b, 0, 0, MP_F32, c), 0);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) {
                double t = val(&a, i, q, k) * val(&b, j, q, k);
                s += t, mag += fabs(t);
            }
            double bound = (double)(k + 2 * (k / 32 + 2)) * 0x1p-24 * mag;
            cr_assert_leq(fabs(c[i * n + j] - s), bound, "%ldx%ldx%ld (%d, %d) at (%ld, %ld): %.9g vs %.9g",
                          (long)m, (long)n, (long)k, ga, gb, (long)i, (long)j, c[i * n + j], s);
        }
    free((void *)a.q), free((void *)a.scales), free((void *)b.q), free((void *)b.scales), free(c);
}

Test(fp8_gemm, tensor_scales) { check_f32acc(37, 29, 300, MP_FP8_TENSOR, MP_FP8_E4M3, MP_FP8_TENSOR, MP_FP8_E4M3, 0); }
Test(fp8_gemm, tensor_e5m2) { check_f32acc(16, 70, 1000, MP_FP8_TENSOR, MP_FP8_E5M2, MP_FP8_TENSOR, MP_FP8_E4M3, 0); }
Test(fp8_gemm, tile_by_block) { check_f32acc(33, 150, 300, MP_FP8_TILE, MP_FP8_E4M3, MP_FP8_BLOCK, MP_FP8_E4M3, 0); }
Test(fp8_gemm, block_by_tile) { check_f32acc(140, 20, 384, MP_FP8_BLOCK, MP_FP8_E5M2, MP_FP8_TILE, MP_FP8_E4M3, 0); }
Test(fp8_gemm, tile_by_tensor) { check_f32acc(9, 11, 129, MP_FP8_TILE, MP_FP8_E4M3, MP_FP8_TENSOR, MP_FP8_E4M3, 0); }
Test(fp8_gemm, mx_folded) { check_f32acc(21, 19, 200, MP_FP8_MX, MP_FP8_E4M3, MP_FP8_MX, MP_FP8_E5M2, 6); }
Test(fp8_gemm, mx_chunked) { check_f32acc(21, 19, 200, MP_FP8_MX, MP_FP8_E4M3, MP_FP8_MX, MP_FP8_E4M3, 50); }

Test(fp8_gemm, without_onednn)
{
    int was = cpu_dnnl_enable(0);
    check_f32acc(33, 150, 300, MP_FP8_TILE, MP_FP8_E4M3, MP_FP8_BLOCK, MP_FP8_E4M3, 0);
    check_f32acc(21, 19, 200, MP_FP8_MX, MP_FP8_E4M3, MP_FP8_MX, MP_FP8_E5M2, 6);
    cpu_dnnl_enable(was);
}

/* small integers (codes of 1..8) with scale 1: every sum is exact in f32 */
Test(fp8_gemm, exact_sums)
{
    int64_t m = 8, n = 8, k = 256;
    uint8_t *qa = malloc((size_t)(m * k)), *qb = malloc((size_t)(n * k));
    float one = 1, c[64];
    for (int64_t i = 0; i < m * k; i++) qa[i] = mp_f32_to_e4m3((float)(i % 8 + 1), 1);
    for (int64_t i = 0; i < n * k; i++) qb[i] = mp_f32_to_e4m3((float)((i * 5) % 8) - 4.0f, 1);
    mp_fp8_operand a = {qa, MP_FP8_E4M3, MP_FP8_TENSOR, &one}, b = {qb, MP_FP8_E4M3, MP_FP8_TENSOR, &one};
    cr_assert_eq(cpu_fp8_gemm(cx(), m, n, k, &a, &b, 0, 0, MP_F32, c), 0);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            long s = 0;
            for (int64_t q = 0; q < k; q++)
                s += (long)mp_e4m3_to_f32(qa[i * k + q]) * (long)mp_e4m3_to_f32(qb[j * k + q]);
            cr_assert_eq(c[i * n + j], (float)s);
        }
    free(qa), free(qb);
}

/* a bf16 (f16) C is the f32 C rounded once */
Test(fp8_gemm, low_precision_out)
{
    int64_t m = 17, n = 23, k = 260;
    float da = 0.37f, db = 1.9f, c[17 * 23];
    uint16_t h[17 * 23];
    mp_fp8_operand a = {rand_codes(m * k, MP_FP8_E4M3, 1), MP_FP8_E4M3, MP_FP8_TENSOR, &da};
    mp_fp8_operand b = {rand_codes(n * k, MP_FP8_E4M3, 2), MP_FP8_E4M3, MP_FP8_TENSOR, &db};
    cpu_fp8_gemm(cx(), m, n, k, &a, &b, 0, 0, MP_F32, c);
    cr_assert_eq(cpu_fp8_gemm(cx(), m, n, k, &a, &b, 0, 0, MP_BF16, h), 0);
    for (int i = 0; i < m * n; i++) cr_assert_eq(h[i], mp_f32_to_bf16(c[i]));
    cr_assert_eq(cpu_fp8_gemm(cx(), m, n, k, &a, &b, 0, 0, MP_F16, h), 0);
    for (int i = 0; i < m * n; i++) cr_assert_eq(h[i], mp_f32_to_f16(c[i]));
    free((void *)a.q), free((void *)b.q);
}

/* integer |x| rounded to p significant bits, to nearest even, or toward zero when trunc */
static int64_t round_int(int64_t x, int p, int trunc)
{
    int64_t ax = x < 0 ? -x : x;
    int len = 0;
    while (len < 63 && (ax >> len)) len++;
    if (len <= p) return x;
    int drop = len - p;
    int64_t q = ax >> drop, rem = ax & (((int64_t)1 << drop) - 1), half = (int64_t)1 << (drop - 1);
    if (!trunc && (rem > half || (rem == half && (q & 1)))) q++;
    return x < 0 ? -(q << drop) : q << drop;
}

static int trunc_ref;   /* model_ref truncates instead of rounding to nearest */

/* the model's rules in integers: e4m3 value v = i 2^-9, products i j 2^-18 */
static float model_ref(const uint8_t *x, const uint8_t *y, int64_t k, int acc_bits, int64_t pe, float sc)
{
    float total = 0;
    if (pe == 0) pe = k;
    for (int64_t j0 = 0; j0 < k; j0 += pe) {
        int64_t part = 0;
        for (int64_t q = j0; q < j0 + pe && q < k; q++) {
            int64_t i = (int64_t)ldexpf(mp_e4m3_to_f32(x[q]), 9), j = (int64_t)ldexpf(mp_e4m3_to_f32(y[q]), 9);
            part = round_int(part + i * j, acc_bits + 1, trunc_ref);
        }
        total = total + (float)ldexp((double)part, -18) * sc;
    }
    return total;
}

static void check_model_round(int acc_bits, int64_t pe, float da, float db, int sequential, mp_fp8_acc_round rnd)
{
    int64_t m = 6, n = 5, k = 4096;
    mp_fp8_operand a = {rand_codes(m * k, MP_FP8_E4M3, 11), MP_FP8_E4M3, MP_FP8_TENSOR, &da};
    mp_fp8_operand b = {rand_codes(n * k, MP_FP8_E4M3, 12), MP_FP8_E4M3, MP_FP8_TENSOR, &db};
    float c[30];
    trunc_ref = rnd == MP_FP8_ACC_TRUNCATE;
    cr_assert_eq(cpu_fp8_gemm_round(cx(), m, n, k, &a, &b, acc_bits, pe, rnd, MP_F32, c), 0);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float want;
            if (sequential) {   /* 23 bits, promotion every product or never: f32 sums */
                want = 0;
                for (int64_t q = 0; q < k; q++)
                    want += mp_e4m3_to_f32(a.q[i * k + q]) * mp_e4m3_to_f32(b.q[j * k + q]);
                want *= da * db;
            } else
                want = model_ref(a.q + i * k, b.q + j * k, k, acc_bits, pe, da * db);
            cr_assert_eq(c[i * n + j], want, "%d bits every %ld at (%ld, %ld): %.9g vs %.9g", acc_bits, (long)pe,
                         (long)i, (long)j, c[i * n + j], want);
        }
    free((void *)a.q), free((void *)b.q);
}

static void check_model(int acc_bits, int64_t pe, float da, float db, int sequential)
{
    check_model_round(acc_bits, pe, da, db, sequential, MP_FP8_ACC_NEAREST);
}

Test(fp8_gemm, model_23_bits_is_f32) { check_model(23, 0, 1, 1, 1); }
Test(fp8_gemm, model_14_bits_no_promotion) { check_model(14, 0, 1, 1, 0); }
Test(fp8_gemm, model_14_bits_promote_128) { check_model(14, 128, 0.37f, 2.5f, 0); }
Test(fp8_gemm, model_10_bits_promote_32) { check_model(10, 32, 1.0f, 0.75f, 0); }
Test(fp8_gemm, model_14_bits_truncated) { check_model_round(14, 0, 1, 1, 0, MP_FP8_ACC_TRUNCATE); }
Test(fp8_gemm, model_14_bits_truncated_promote_128)
{
    check_model_round(14, 128, 0.37f, 2.5f, 0, MP_FP8_ACC_TRUNCATE);
}

/* a hand-checked sum: 4 + 1.75 = 5.75 with 3 significant bits (acc_bits 2,
 * grid 4 5 6 7 in [4, 8)) is 6 to nearest and 5 truncated; -5.75 is -6 and
 * -5; promoted after every product both are 5.75 (f32 sums) */
Test(fp8_gemm, model_truncation_by_hand)
{
    uint8_t x[4] = {mp_f32_to_e4m3(4.0f, 1), mp_f32_to_e4m3(1.75f, 1), mp_f32_to_e4m3(-4.0f, 1),
                    mp_f32_to_e4m3(-1.75f, 1)};
    uint8_t y[2] = {mp_f32_to_e4m3(1.0f, 1), mp_f32_to_e4m3(1.0f, 1)};
    float one = 1, c[2];
    mp_fp8_operand a = {x, MP_FP8_E4M3, MP_FP8_TENSOR, &one}, b = {y, MP_FP8_E4M3, MP_FP8_TENSOR, &one};
    cr_assert_eq(cpu_fp8_gemm_round(cx(), 2, 1, 2, &a, &b, 2, 0, MP_FP8_ACC_NEAREST, MP_F32, c), 0);
    cr_assert_eq(c[0], 6.0f);
    cr_assert_eq(c[1], -6.0f);
    cr_assert_eq(cpu_fp8_gemm_round(cx(), 2, 1, 2, &a, &b, 2, 0, MP_FP8_ACC_TRUNCATE, MP_F32, c), 0);
    cr_assert_eq(c[0], 5.0f);
    cr_assert_eq(c[1], -5.0f);
    cr_assert_eq(cpu_fp8_gemm_round(cx(), 2, 1, 2, &a, &b, 2, 1, MP_FP8_ACC_TRUNCATE, MP_F32, c), 0);
    cr_assert_eq(c[0], 5.75f);
    cr_assert_eq(cpu_fp8_gemm_round(cx(), 2, 1, 2, &a, &b, 2, 0, (mp_fp8_acc_round)2, MP_F32, c), -2);
}

/* the 14-bit accumulator without promotion loses what f32 keeps: a long sum
 * of equal terms stops growing once the term is below half its ulp */
Test(fp8_gemm, model_stagnates)
{
    int64_t k = 1 << 16;
    uint8_t *x = malloc((size_t)k), *y = malloc((size_t)k);
    memset(x, mp_f32_to_e4m3(1.0f, 1), (size_t)k), memset(y, mp_f32_to_e4m3(1.0f, 1), (size_t)k);
    float one = 1, c;
    mp_fp8_operand a = {x, MP_FP8_E4M3, MP_FP8_TENSOR, &one}, b = {y, MP_FP8_E4M3, MP_FP8_TENSOR, &one};
    cpu_fp8_gemm(cx(), 1, 1, k, &a, &b, 14, 0, MP_F32, &c);
    cr_assert_eq(c, 32768.0f, "2^15 + 1 ties to even 2^15 with 15 bits: %g", c);
    cpu_fp8_gemm(cx(), 1, 1, k, &a, &b, 14, 128, MP_F32, &c);
    cr_assert_eq(c, 65536.0f);
    free(x), free(y);
}

Test(fp8_gemm, model_rejects_straddling_intervals)
{
    int64_t k = 256;
    uint8_t q[256 * 2] = {0};
    float d[4] = {1, 1, 1, 1}, c[4];
    mp_fp8_operand a = {q, MP_FP8_E4M3, MP_FP8_TILE, d}, b = {q, MP_FP8_E4M3, MP_FP8_TENSOR, d};
    cr_assert_eq(cpu_fp8_gemm(cx(), 2, 1, k, &a, &b, 14, 0, MP_F32, c), -2);
    cr_assert_eq(cpu_fp8_gemm(cx(), 2, 1, k, &a, &b, 14, 96, MP_F32, c), -2);
    cr_assert_eq(cpu_fp8_gemm(cx(), 2, 1, k, &a, &b, 14, 64, MP_F32, c), 0);
    cr_assert_eq(cpu_fp8_gemm(cx(), 2, 1, k, &a, &b, 24, 64, MP_F32, c), -2);
}

Test(fp8_gemm, round_acc)
{
    /* 15 significant bits: the ulp is 4 in [2^16, 2^17), 2 below; 2^16 + 2
     * is a tie (to even: down), 2^16 + 6 too (up); a tie is broken by the
     * two-sum's tail; 2^16 - 1 ties up into the next binade */
    cr_assert_eq(mp_fp8_round_acc(65537.0, 0.0, 14), 65536.0);
    cr_assert_eq(mp_fp8_round_acc(65539.0, 0.0, 14), 65540.0);
    cr_assert_eq(mp_fp8_round_acc(65538.0, 0.0, 14), 65536.0);
    cr_assert_eq(mp_fp8_round_acc(65542.0, 0.0, 14), 65544.0);
    cr_assert_eq(mp_fp8_round_acc(65538.0, 1e-9, 14), 65540.0);
    cr_assert_eq(mp_fp8_round_acc(-65538.0, -1e-9, 14), -65540.0);
    cr_assert_eq(mp_fp8_round_acc(-65538.0, 1e-9, 14), -65536.0);
    cr_assert_eq(mp_fp8_round_acc(65535.0, 0.0, 14), 65536.0);
}

Test(fp8_gemm, trunc_acc)
{
    /* toward zero to 15 significant bits: the grid is 4 in [2^16, 2^17), 2
     * in [2^15, 2^16). On the grid with a tail toward zero, one step in
     * (across the binade: 2^16 - tail becomes 65534); a tail away from zero
     * changes nothing */
    cr_assert_eq(mp_fp8_trunc_acc(65539.0, 0.0, 14), 65536.0);
    cr_assert_eq(mp_fp8_trunc_acc(-65543.0, 0.0, 14), -65540.0);
    cr_assert_eq(mp_fp8_trunc_acc(65540.0, 1e-9, 14), 65540.0);
    cr_assert_eq(mp_fp8_trunc_acc(65540.0, -1e-9, 14), 65536.0);
    cr_assert_eq(mp_fp8_trunc_acc(-65540.0, 1e-9, 14), -65536.0);
    cr_assert_eq(mp_fp8_trunc_acc(65536.0, -1e-9, 14), 65534.0);
    cr_assert_eq(mp_fp8_trunc_acc(-65536.0, 1e-9, 14), -65534.0);
    cr_assert_eq(mp_fp8_trunc_acc(65535.0, 0.0, 14), 65534.0);
    cr_assert_eq(mp_fp8_trunc_acc(0.0, 0.0, 14), 0.0);
}
