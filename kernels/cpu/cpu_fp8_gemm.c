/*
 * cpu_fp8_gemm.c: C = (A dequantized) (B dequantized)^T for FP8 codes with
 * their decode scales (cpu_fp8.h).
 *
 * f32 accumulation (acc_bits = 0). Every e4m3 and e5m2 value is a bf16 value
 * (3 or 2 mantissa bits, exponents well inside bf16's normal range), so the
 * codes are decoded to bf16 exactly and multiplied by the bf16 GEMM with f32
 * results (oneDNN, vdpbf16ps / AMX: each product of two such values is exact
 * in f32 and only the sums round). Where A's or B's scale changes along k
 * (tile, block: every 128), k is cut into those chunks: each chunk's f32 GEMM
 * result T is added as C += T (sa(i, c) sb(j, c)) into an f32 total - the
 * promotion DeepSeek-V3 does with its per-128 scales. MX's E8M0 scales are
 * powers of two: they are folded into the decoded values (exact) when every
 * one lies within 2^+-40 (the products stay normal f32 numbers); otherwise MX
 * too is cut into its 32-long chunks.
 *
 * The modelled accumulator (acc_bits = p in 1..23, promote_every = N): a
 * model of what DeepSeek-V3 reports of Hopper's FP8 tensor cores (partial
 * sums kept to about 14 bits, promoted to f32 on the CUDA cores every 128
 * elements of k), not a bit-exact copy of any hardware. Per element of C:
 *   partial = 0; total = 0 (f32)
 *   for each k: partial = round_p(partial + a_k b_k)
 *                 (a_k b_k exact: decoded values, MX scales folded in;
 *                  the exact sum rounded once, to nearest even - or toward
 *                  zero, truncated, with acc_round = MP_FP8_ACC_TRUNCATE - to
 *                  a significand of p bits after the leading one; exponent
 *                  range unbounded)
 *               after every N products, and after the last:
 *                 total = total + (f32) partial * (sa sb)   (two f32 roundings)
 *                 partial = 0
 *   N = 0: one interval over the whole of k (no promotion: the
 *   accumulator's own precision throughout). The f32 scales (tensor, tile,
 *   block) are applied at promotion, as the hardware can only do there; so
 *   tile and block scales need N dividing 128. p = 23 with N = 1 is f32
 *   arithmetic (the tests check that, and the 14-bit model against an
 *   integer reference of the same rules).
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/cpu_fp8.h"

#define FOLD_MAX 40   /* |log2| of MX scales folded into the decoded values */

/* the decoded value of every code as bf16 bits (exact: the top half of the f32) */
static void bf16_table(mp_fp8_format fmt, uint16_t *t)
{
    for (int c = 0; c < 256; c++) t[c] = (uint16_t)(mp_f32_bits(mp_fp8_to_f32((uint8_t)c, fmt)) >> 16);
}

/* the k-length of one scale of operand x (k: one for the whole row) */
static int64_t scale_k(const mp_fp8_operand *x, int64_t k, int folded)
{
    switch (x->g) {
    case MP_FP8_TENSOR: return k;
    case MP_FP8_TILE: case MP_FP8_BLOCK: return MP_FP8_TILE_K;
    case MP_FP8_MX: return folded ? k : MP_FP8_MX_K;
    }
    return k;
}

/* the f32 decode scale of row r at column j (MX: 2^(e - 127) from its byte) */
static float scale_at(const mp_fp8_operand *x, int64_t r, int64_t j, int64_t k)
{
    int64_t nk = (k + MP_FP8_TILE_K - 1) / MP_FP8_TILE_K;
    switch (x->g) {
    case MP_FP8_TENSOR: return ((const float *)x->scales)[0];
    case MP_FP8_TILE: return ((const float *)x->scales)[r * nk + j / MP_FP8_TILE_K];
    case MP_FP8_BLOCK: return ((const float *)x->scales)[r / MP_FP8_BLOCK_ROWS * nk + j / MP_FP8_TILE_K];
    case MP_FP8_MX: {
        uint8_t b = ((const uint8_t *)x->scales)[r * ((k + MP_FP8_MX_K - 1) / MP_FP8_MX_K) + j / MP_FP8_MX_K];
        return b == 0xff ? NAN : ldexpf(1.0f, (int)b - 127);
    }
    }
    return 1.0f;
}

/* 1 when operand x's MX scales can be folded into its decoded values */
static int foldable(const mp_fp8_operand *x, int64_t rows, int64_t k)
{
    if (x->g != MP_FP8_MX) return 0;
    const uint8_t *e = x->scales;
    for (int64_t i = 0, n = mp_fp8_nscales(MP_FP8_MX, rows, k); i < n; i++)
        if (e[i] != 0xff && abs((int)e[i] - 127) > FOLD_MAX) return 0;
    return 1;
}

/* columns j0..j0+len-1 of x {rows, k} decoded to bf16 {rows, len}, MX scales
 * folded when fold */
static void decode_bf16(const mp_fp8_operand *x, int64_t rows, int64_t k, int64_t j0, int64_t len, int fold,
                        uint16_t *dst)
{
    uint16_t t[256];
    float tf[256];   /* folding: the codes' values as f32, each block's scale read once */
    bf16_table(x->fmt, t);
    for (int c = 0; c < 256; c++) tf[c] = mp_fp8_to_f32((uint8_t)c, x->fmt);
    #pragma omp parallel for if (rows * len > MP_PAR_MIN_MEM) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *q = x->q + r * k + j0;
        uint16_t *d = dst + r * len;
        if (!fold) {
            for (int64_t j = 0; j < len; j++) d[j] = t[q[j]];
            continue;
        }
        for (int64_t j = 0; j < len;) {
            /* the rest of the MX block holding column j0 + j shares its scale */
            int64_t end = j + MP_FP8_MX_K - (j0 + j) % MP_FP8_MX_K;
            if (end > len) end = len;
            float s = scale_at(x, r, j0 + j, k);
            for (; j < end; j++) d[j] = (uint16_t)(mp_f32_bits(tf[q[j]] * s) >> 16);
        }
    }
}

/* T {m, n} (f32) = A' B'^T for bf16 A' {m, kc}, B' {n, kc}: oneDNN's bf16
 * GEMM, or where it declines both widened (exactly) and multiplied in f32 */
static int gemm_chunk(mp_kctx *cx, int64_t m, int64_t n, int64_t kc, const uint16_t *a, const uint16_t *b, float *t)
{
    if (cpu_gemm_dnnl_f32out(cx, 0, 1, 1, m, n, kc, 1.0f, a, 0, b, 0, 0.0f, t, m * n) == 0) return 0;
    float *fa = cpu_scratch_f32(cx, 4, MP_BF16, a, m * kc), *fb = fa ? cpu_scratch_f32(cx, 5, MP_BF16, b, n * kc) : NULL;
    if (!fb) return -1;
    return cpu_gemm(cx, MP_F32, 0, 1, 1, m, n, kc, 1.0f, fa, 0, fb, 0, 0.0f, t, m * n);
}

/* the f32 scales of rows 0..rows-1 of x at column j0 (1 where folded) */
static void scales_at(const mp_fp8_operand *x, int64_t rows, int64_t j0, int64_t k, int folded, float *s)
{
    for (int64_t r = 0; r < rows; r++) s[r] = folded ? 1.0f : scale_at(x, r, j0, k);
}

static int gemm_f32acc(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a,
                       const mp_fp8_operand *b, float *acc)
{
    int fa = foldable(a, m, k), fb = foldable(b, n, k);
    int64_t ka = scale_k(a, k, fa), kb = scale_k(b, k, fb), ck = ka < kb ? ka : kb;
    uint16_t *da = cpu_scratch(cx, 0, 2 * (size_t)(m * ck)), *db = da ? cpu_scratch(cx, 1, 2 * (size_t)(n * ck)) : NULL;
    float *sv = db ? cpu_scratch(cx, 8, 4 * (size_t)(m + n)) : NULL;
    /* one chunk: the GEMM writes C itself, its one scale applied in place */
    float *t = sv ? (ck >= k ? acc : cpu_scratch(cx, 2, 4 * (size_t)(m * n))) : NULL;
    if (!t) return -1;
    for (int64_t j0 = 0; j0 < k; j0 += ck) {
        int64_t len = k - j0 < ck ? k - j0 : ck;
        decode_bf16(a, m, k, j0, len, fa, da);
        decode_bf16(b, n, k, j0, len, fb, db);
        if (gemm_chunk(cx, m, n, len, da, db, t)) return -1;
        scales_at(a, m, j0, k, fa, sv);
        scales_at(b, n, j0, k, fb, sv + m);
        /* the chunk's sums times their scales, into the total (the first
         * chunk too: 0 + x is x) */
        const float *sb = sv + m;
        #pragma omp parallel for if (m * n > MP_PAR_MIN_MEM) schedule(static)
        for (int64_t i = 0; i < m; i++) {
            float sa = sv[i], *ci = acc + i * n;
            const float *ti = t + i * n;
            if (j0 == 0)
                for (int64_t j = 0; j < n; j++) ci[j] = 0.0f + ti[j] * (sa * sb[j]);
            else
                for (int64_t j = 0; j < n; j++) ci[j] = ci[j] + ti[j] * (sa * sb[j]);
        }
    }
    return 0;
}

double mp_fp8_round_acc(double hi, double lo, int acc_bits)
{
    uint64_t u;
    memcpy(&u, &hi, sizeof u);
    if (hi == 0.0 || !isfinite(hi)) return hi;
    int drop = 52 - acc_bits;                  /* f64 fraction bits below the kept ones */
    uint64_t mask = ((uint64_t)1 << drop) - 1, half = (uint64_t)1 << (drop - 1), rem = u & mask;
    u &= ~mask;
    /* the magnitude goes up past half an ulp, or at exactly half when lo
     * pushes it up (same sign as hi) or, lo being 0, to the even neighbour */
    int up = rem > half || (rem == half && (lo != 0.0 ? (lo > 0.0) == (hi > 0.0) : ((u >> drop) & 1)));
    if (up) u += (uint64_t)1 << drop;          /* a carry into the exponent is right */
    double r;
    memcpy(&r, &u, sizeof r);
    return r;
}

double mp_fp8_trunc_acc(double hi, double lo, int acc_bits)
{
    uint64_t u;
    memcpy(&u, &hi, sizeof u);
    if (hi == 0.0 || !isfinite(hi)) return hi;
    int drop = 52 - acc_bits;
    uint64_t mask = ((uint64_t)1 << drop) - 1, rem = u & mask;
    u &= ~mask;   /* |hi| toward zero */
    /* hi already on the grid and lo pulling toward zero: the exact sum lies
     * just inside, so one step of the grid down in magnitude (a borrow from
     * the exponent is right: the largest value of the binade below) */
    if (rem == 0 && lo != 0.0 && (lo > 0.0) != (hi > 0.0)) u -= (uint64_t)1 << drop;
    double r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* the modelled accumulator (the file's head) over decoded f32 A {m, k}, B {n, k} */
static void gemm_model(int64_t m, int64_t n, int64_t k, const float *fa, const float *fb, const mp_fp8_operand *a,
                       const mp_fp8_operand *b, int acc_bits, int64_t pe, mp_fp8_acc_round rnd, float *acc)
{
    double (*round_p)(double, double, int) = rnd == MP_FP8_ACC_TRUNCATE ? mp_fp8_trunc_acc : mp_fp8_round_acc;
    #pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float *x = fa + i * k, *y = fb + j * k;
            float total = 0.0f;
            for (int64_t j0 = 0; j0 < k; j0 += pe) {
                int64_t j1 = j0 + pe < k ? j0 + pe : k;
                double part = 0.0;
                for (int64_t q = j0; q < j1; q++) {
                    double p = (double)x[q] * y[q], s = part + p;   /* p exact: a few bits each */
                    double bp = s - part, lo = (part - (s - bp)) + (p - bp);   /* two-sum: s + lo exact */
                    part = round_p(s, lo, acc_bits);
                }
                float sc = (a->g == MP_FP8_MX ? 1.0f : scale_at(a, i, j0, k)) *
                           (b->g == MP_FP8_MX ? 1.0f : scale_at(b, j, j0, k));
                total = total + (float)part * sc;
            }
            acc[i * n + j] = total;
        }
}

/* x's codes decoded to f32 {rows, k}, MX scales folded in (exact in range) */
static float *decode_f32(mp_kctx *cx, int slot, const mp_fp8_operand *x, int64_t rows, int64_t k)
{
    float *f = cpu_scratch(cx, slot, 4 * (size_t)(rows * k > 0 ? rows * k : 1));
    if (!f) return NULL;
    #pragma omp parallel for if (rows * k > MP_PAR_MIN_MEM) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k; j++)
            f[r * k + j] = mp_fp8_to_f32(x->q[r * k + j], x->fmt) *
                           (x->g == MP_FP8_MX ? scale_at(x, r, j, k) : 1.0f);
    return f;
}

/* 1 when the f32 scales of x never change inside a promotion interval of pe */
static int intervals_fit(const mp_fp8_operand *x, int64_t pe, int64_t k)
{
    if (x->g == MP_FP8_TENSOR || x->g == MP_FP8_MX) return 1;
    return pe > 0 && MP_FP8_TILE_K % pe == 0;
}

int cpu_fp8_gemm_round(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a,
                       const mp_fp8_operand *b, int acc_bits, int64_t promote_every, mp_fp8_acc_round rnd,
                       mp_dtype out, void *c)
{
    if (acc_bits < 0 || acc_bits > 23 || promote_every < 0 || (rnd != MP_FP8_ACC_NEAREST && rnd != MP_FP8_ACC_TRUNCATE))
        return -2;
    if (m == 0 || n == 0) return 0;
    float *acc = out == MP_F32 ? c : cpu_scratch(cx, 3, 4 * (size_t)(m * n));
    if (!acc) return -1;
    if (k == 0) memset(acc, 0, 4 * (size_t)(m * n));
    else if (acc_bits == 0) {
        if (gemm_f32acc(cx, m, n, k, a, b, acc)) return -1;
    } else {
        int64_t pe = promote_every ? promote_every : k;
        if (!intervals_fit(a, pe, k) || !intervals_fit(b, pe, k)) return -2;
        const float *fa = decode_f32(cx, 6, a, m, k), *fb = fa ? decode_f32(cx, 7, b, n, k) : NULL;
        if (!fb) return -1;
        gemm_model(m, n, k, fa, fb, a, b, acc_bits, pe, rnd, acc);
    }
    if (out != MP_F32) cpu_store_f32(cx, out, c, acc, m * n);
    return 0;
}

int cpu_fp8_gemm(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a, const mp_fp8_operand *b,
                 int acc_bits, int64_t promote_every, mp_dtype out, void *c)
{
    return cpu_fp8_gemm_round(cx, m, n, k, a, b, acc_bits, promote_every, MP_FP8_ACC_NEAREST, out, c);
}

/* the backend's fp8_gemm: fast (the device's own limited accumulation) is
 * answered with the model at 14 bits without promotion, as the emulated
 * cuBLASLt answers FAST_ACCUM */
int cpu_fp8_gemm_entry(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a, const mp_fp8_operand *b,
                       int acc_bits, int64_t promote_every, int acc_round, int fast, mp_dtype out, void *c)
{
    if (fast && !acc_bits) acc_bits = 14, promote_every = 0, acc_round = MP_FP8_ACC_NEAREST;
    int r = cpu_fp8_gemm_round(cx, m, n, k, a, b, acc_bits, promote_every, (mp_fp8_acc_round)acc_round, out, c);
    return r == -2 ? 1 : r;
}
