/*
 * cpu_batch_norm_lowp.c: batch norm's passes over f16/bf16 runs with the
 * values widened in AVX-512 registers as they are read, and the outputs
 * rounded in the registers that computed them. cpu_batch_norm.c calls them
 * through cpu_lowp_bn(), where cpu_lowp_usable() says they run. Before, each
 * channel was first widened into an f32 copy in scratch and every pass read
 * that: on a bf16 wide ResNet step at 2 threads the widening alone
 * (bf16_to_f32) was 3.4% of the samples, more than any pass that read it.
 *
 * Same bits as the widened path, value for value: widening is exact, so
 * each sum adds the same f64 terms in the same order, and each output is the
 * same f32 operations in the same order (no FMA: the kernels build with
 * -ffp-contract=off) rounded by the same steps as cpu_store (lowp_regs.h).
 * The sums keep cpu_batch_norm.c's lanes: BN_LANES = 32 f64 lanes (here four
 * registers of eight), value j of a piece into lane j mod 32, each lane in
 * order, the lanes added in order at the end; the caller gives the same
 * pieces (blocks of MP_BLOCK of a run). tests/c/test_elementwise_lowp.c
 * compares this path with the widened one and the blockwise one bit for bit.
 *
 * The output pass does batch_norm_act's residual add and ReLU in the same
 * registers (affine_act16), rounding after each step as the separate kernels
 * do. Before, it stored y and went over the piece again with cpu_add_serial
 * and relu16, in L1: those two were 1.0% and 1.0% of a bf16 wide ResNet
 * step's samples; in one process, steps alternating in blocks, the
 * register form measured 0.993-0.998 of the step time in four runs (batch
 * 32, 2 threads). act_is_the_three_kernels (the same test file) checks it
 * against the three kernels.
 */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/lowp_regs.h"

#ifdef MP_HAVE_AVX512_CONVERT

/* 32 f32 values (lo: lanes 0..15, hi: 16..31) as four registers of f64
 * lanes, exactly */
LOWP_INLINE void lanes32(__m512 lo, __m512 hi, __m512d d[4])
{
    d[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(lo));
    d[1] = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(lo), 1)));
    d[2] = _mm512_cvtps_pd(_mm512_castps512_ps256(hi));
    d[3] = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(hi), 1)));
}

/* the last k < 32 values of a piece, zero-padded to 32, and the masks of
 * their lanes in each of the four registers */
LOWP_INLINE void tail32(int f16, const uint16_t *p, int64_t k, __m512 *lo, __m512 *hi, __mmask8 mk[4])
{
    uint16_t t[32] = {0};
    memcpy(t, p, sizeof(uint16_t) * (size_t)k);
    *lo = load16(f16, t), *hi = load16(f16, t + 16);
    uint32_t bits = (uint32_t)(((uint64_t)1 << k) - 1);
    for (int r = 0; r < 4; r++) mk[r] = (__mmask8)(bits >> (8 * r));
}

/* lane 0 + lane 1 + ... + lane 31, in order, from +0 */
LOWP_INLINE double lanes_total(const __m512d acc[4])
{
    double t[32], s = 0;
    for (int r = 0; r < 4; r++) _mm512_storeu_pd(t + 8 * r, acc[r]);
    for (int l = 0; l < 32; l++) s += t[l];
    return s;
}

/* sum of x[j] (dev 0), or of (x[j] - m)^2 with the difference in f32 (dev 1) */
LOWP_INLINE double sum_run(int f16, int dev, const uint16_t *x, int64_t n, float m)
{
    __m512d acc[4] = { _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd() }, d[4];
    __m512 vm = _mm512_set1_ps(m), lo, hi;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        lo = load16(f16, x + j), hi = load16(f16, x + j + 16);
        if (dev) lo = _mm512_sub_ps(lo, vm), hi = _mm512_sub_ps(hi, vm);
        lanes32(lo, hi, d);
        for (int r = 0; r < 4; r++) acc[r] = _mm512_add_pd(acc[r], dev ? _mm512_mul_pd(d[r], d[r]) : d[r]);
    }
    if (j < n) {
        __mmask8 mk[4];
        tail32(f16, x + j, n - j, &lo, &hi, mk);
        if (dev) lo = _mm512_sub_ps(lo, vm), hi = _mm512_sub_ps(hi, vm);
        lanes32(lo, hi, d);
        for (int r = 0; r < 4; r++)
            acc[r] = _mm512_mask_add_pd(acc[r], mk[r], acc[r], dev ? _mm512_mul_pd(d[r], d[r]) : d[r]);
    }
    return lanes_total(acc);
}

/* *sg += sum of g[j], *sgd += sum of g[j] (x[j] - m), the difference in f32 */
LOWP_INLINE void sum_dot_run(int f16, const uint16_t *g, const uint16_t *x, int64_t n, float m, double *sg,
                             double *sgd)
{
    __m512d a[4], b[4], dg[4], dx[4];
    for (int r = 0; r < 4; r++) a[r] = b[r] = _mm512_setzero_pd();
    __m512 vm = _mm512_set1_ps(m), glo, ghi, xlo, xhi;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        glo = load16(f16, g + j), ghi = load16(f16, g + j + 16);
        xlo = _mm512_sub_ps(load16(f16, x + j), vm), xhi = _mm512_sub_ps(load16(f16, x + j + 16), vm);
        lanes32(glo, ghi, dg), lanes32(xlo, xhi, dx);
        for (int r = 0; r < 4; r++)
            a[r] = _mm512_add_pd(a[r], dg[r]), b[r] = _mm512_add_pd(b[r], _mm512_mul_pd(dg[r], dx[r]));
    }
    if (j < n) {
        __mmask8 mk[4];
        tail32(f16, g + j, n - j, &glo, &ghi, mk);
        tail32(f16, x + j, n - j, &xlo, &xhi, mk);
        xlo = _mm512_sub_ps(xlo, vm), xhi = _mm512_sub_ps(xhi, vm);
        lanes32(glo, ghi, dg), lanes32(xlo, xhi, dx);
        for (int r = 0; r < 4; r++)
            a[r] = _mm512_mask_add_pd(a[r], mk[r], a[r], dg[r]),
            b[r] = _mm512_mask_add_pd(b[r], mk[r], b[r], _mm512_mul_pd(dg[r], dx[r]));
    }
    *sg += lanes_total(a), *sgd += lanes_total(b);
}

/* y = act(x a + b + z) on sixteen values, each step rounded into dt as the
 * separate kernels round it: batch norm's x a + b (no FMA), then cpu_binary's
 * add of the rounded y and z, then cpu_unary's ReLU of the rounded sum, decided on
 * its widened value (exact): below 0 becomes +0; -0 and NaN stay, as relu16
 * keeps them on the bits. with_z, relu: constants in each copy. */
LOWP_INLINE __m256i affine_act16(int f16, int with_z, int relu, __m512 x, __m256i zh, __m512 a, __m512 b)
{
    __m256i h = narrow(f16, _mm512_add_ps(_mm512_mul_ps(x, a), b));
    if (with_z) h = narrow(f16, _mm512_add_ps(widen(f16, h), widen(f16, zh)));
    if (relu) {   /* AVX-512BW's 32-lane form (no VL here): the upper lanes are dropped */
        __mmask32 keep = (uint16_t)~_mm512_cmp_ps_mask(widen(f16, h), _mm512_setzero_ps(), _CMP_LT_OQ);
        h = _mm512_castsi512_si256(_mm512_maskz_mov_epi16(keep, _mm512_castsi256_si512(h)));
    }
    return h;
}

/* y = act(x a + b + z) over a run (z unused without with_z) */
LOWP_INLINE void affine_act_run(int f16, int with_z, int relu, uint16_t *y, const uint16_t *x, const uint16_t *z,
                                int64_t n, float a, float b)
{
    __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    __m256i zh = _mm256_setzero_si256();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        if (with_z) zh = _mm256_loadu_si256((const __m256i *)(z + j));
        _mm256_storeu_si256((__m256i *)(y + j), affine_act16(f16, with_z, relu, load16(f16, x + j), zh, va, vb));
    }
    if (j < n) {
        uint16_t t[16] = {0};
        if (with_z) memcpy(t, z + j, sizeof(uint16_t) * (size_t)(n - j)), zh = _mm256_loadu_si256((const __m256i *)t);
        _mm256_storeu_si256((__m256i *)t, affine_act16(f16, with_z, relu, load_tail(f16, x + j, n - j), zh, va, vb));
        memcpy(y + j, t, sizeof(uint16_t) * (size_t)(n - j));
    }
}

/* one copy per combination of z and the ReLU, so neither is a branch in the loop */
LOWP_INLINE void affine_act_any(int f16, uint16_t *y, const uint16_t *x, const uint16_t *z, int64_t n, float a,
                                float b, int relu)
{
    if (z && relu) affine_act_run(f16, 1, 1, y, x, z, n, a, b);
    else if (z) affine_act_run(f16, 1, 0, y, x, z, n, a, b);
    else if (relu) affine_act_run(f16, 0, 1, y, x, z, n, a, b);
    else affine_act_run(f16, 0, 0, y, x, z, n, a, b);
}

/* gx = a g + b + k (x - m), rounded into dt */
LOWP_INLINE __m512 bn_grad16(__m512 g, __m512 x, __m512 a, __m512 b, __m512 k, __m512 m)
{
    return _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(a, g), b), _mm512_mul_ps(k, _mm512_sub_ps(x, m)));
}

LOWP_INLINE void grad_run(int f16, uint16_t *gx, const uint16_t *g, const uint16_t *x, int64_t n, float a, float b,
                          float k, float m)
{
    __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), vk = _mm512_set1_ps(k), vm = _mm512_set1_ps(m);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        store16(f16, gx + j, bn_grad16(load16(f16, g + j), load16(f16, x + j), va, vb, vk, vm));
    if (j < n)
        store_tail(f16, gx + j,
                   bn_grad16(load_tail(f16, g + j, n - j), load_tail(f16, x + j, n - j), va, vb, vk, vm), n - j);
}

/* one copy of each per dtype, the dtype a constant inside */
LOWP_FN static double sum_bf16(const uint16_t *x, int64_t n) { return sum_run(0, 0, x, n, 0.0f); }
LOWP_FN static double sum_f16(const uint16_t *x, int64_t n) { return sum_run(1, 0, x, n, 0.0f); }
LOWP_FN static double sumsq_bf16(const uint16_t *x, int64_t n, float m) { return sum_run(0, 1, x, n, m); }
LOWP_FN static double sumsq_f16(const uint16_t *x, int64_t n, float m) { return sum_run(1, 1, x, n, m); }
LOWP_FN static void sum_dot_bf16(const uint16_t *g, const uint16_t *x, int64_t n, float m, double *sg, double *sgd)
{
    sum_dot_run(0, g, x, n, m, sg, sgd);
}
LOWP_FN static void sum_dot_f16(const uint16_t *g, const uint16_t *x, int64_t n, float m, double *sg, double *sgd)
{
    sum_dot_run(1, g, x, n, m, sg, sgd);
}
LOWP_FN static void affine_act_bf16(uint16_t *y, const uint16_t *x, const uint16_t *z, int64_t n, float a, float b,
                                    int relu)
{
    affine_act_any(0, y, x, z, n, a, b, relu);
}
LOWP_FN static void affine_act_f16(uint16_t *y, const uint16_t *x, const uint16_t *z, int64_t n, float a, float b,
                                   int relu)
{
    affine_act_any(1, y, x, z, n, a, b, relu);
}
LOWP_FN static void grad_bf16(uint16_t *gx, const uint16_t *g, const uint16_t *x, int64_t n, float a, float b,
                              float k, float m)
{
    grad_run(0, gx, g, x, n, a, b, k, m);
}
LOWP_FN static void grad_f16(uint16_t *gx, const uint16_t *g, const uint16_t *x, int64_t n, float a, float b,
                             float k, float m)
{
    grad_run(1, gx, g, x, n, a, b, k, m);
}

static const cpu_bn_lowp bn_bf16 = { sum_bf16, sumsq_bf16, sum_dot_bf16, affine_act_bf16, grad_bf16 };
static const cpu_bn_lowp bn_f16 = { sum_f16, sumsq_f16, sum_dot_f16, affine_act_f16, grad_f16 };

const cpu_bn_lowp *cpu_lowp_bn(mp_kctx *cx, mp_dtype dt)
{
    if (!cpu_lowp_usable(cx, dt)) return NULL;
    return dt == MP_F16 ? &bn_f16 : &bn_bf16;
}

#else   /* no AVX-512 intrinsics: cpu_batch_norm.c widens its channels */

const cpu_bn_lowp *cpu_lowp_bn(mp_kctx *cx, mp_dtype dt) { return NULL; }

#endif
