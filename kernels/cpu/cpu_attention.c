/*
 * cpu_attention.c: scaled dot-product attention, blocked as FlashAttention is
 * (Dao et al. 2022; the backward as in FlashAttention-2): softmax(q k^T * scale
 * [+ causal mask]) v over {bh, t, d} operands without ever holding more than a
 * BQ x BK block of the t x t scores. The forward keeps a running maximum and sum
 * per query row (the online softmax) and writes the output and each row's
 * log-sum-exp (f32); the backward recomputes each block of probabilities from
 * that log-sum-exp. Operands are widened to f32 (a head at a time), products run
 * through block_gemm.h, results are rounded once.
 *
 * Causal: query i sees keys j <= i (top-left aligned, PyTorch's is_causal).
 * Dropout on the probabilities (p > 0): element (r, i, j) is kept when the
 * Philox uniform at counter offset + (r * tq + i) * tk + j is >= p and scaled
 * by 1 / (1 - p), the same draw in the forward and the backward (and on every
 * backend: kernels/philox.h). The softmax's normaliser is that of the undropped
 * probabilities, as in PyTorch.
 */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/lane_sums.h"
#include "kernels/cpu/vmath.h"
#include "kernels/philox.h"

#define BQ 64
#define BK 64

/* x{rows, cols} -> xt{cols, rows}: keys and values transposed once per head, so
 * that every product below is a block_gemm with B read along its rows */
static void transpose(float *xt, const float *x, int64_t rows, int64_t cols)
{
    for (int64_t j = 0; j < rows; j++)
        for (int64_t p = 0; p < cols; p++) xt[p * rows + j] = x[j * cols + p];
}

/* The forward's row loops, vectorised: max and sum over 16 lanes, combined in
 * lane order at the end (the same bits on every clone) */
#define LANES 16

MP_SIMD static float row_max(const float *x, int64_t n, float init)
{
    float acc[LANES];
    for (int l = 0; l < LANES; l++) acc[l] = init;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
    for (; j < n; j++) acc[0] = x[j] > acc[0] ? x[j] : acc[0];
    float m = acc[0];
    for (int l = 1; l < LANES; l++) m = acc[l] > m ? acc[l] : m;
    return m;
}

MP_SIMD static float row_sum(const float *x, int64_t n)
{
    float acc[LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[j + l];
    for (; j < n; j++) acc[j % LANES] += x[j];
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

MP_SIMD static void add_to_row(float *x, int64_t n, float c)
{
    for (int64_t j = 0; j < n; j++) x[j] += c;
}

MP_SIMD static void scale_row(float *x, int64_t n, float c)
{
    for (int64_t j = 0; j < n; j++) x[j] *= c;
}

/* one row of dS = P * (dP - D) */
MP_SIMD static void ds_row(float *dp, const float *p, float di, int64_t n)
{
    for (int64_t j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - di);
}

/* the dropout factor of element (row r of the flattened heads, query i, key j) */
static inline float keep(const mp_attn_args *a, int64_t r, int64_t i, int64_t j)
{
    uint64_t idx = a->offset + ((uint64_t)r * (uint64_t)a->tq + (uint64_t)i) * (uint64_t)a->tk + (uint64_t)j;
    return mp_philox_uniform(a->seed, idx, 24) >= a->dropout ? 1.0f / (1.0f - a->dropout) : 0.0f;
}

/* S{BQ,BK} block (q rows i0.., keys j0..; kt: the keys transposed, {d, tk}):
 * scores * scale, masked to -inf */
static void scores(const mp_attn_args *a, const float *q, const float *kt, int64_t i0, int64_t ni, int64_t j0,
                   int64_t nj, float *s)
{
    cpu_block_gemm(0, ni, nj, a->d, a->scale, q + i0 * a->d, a->d, kt + j0, a->tk, 0.0f, s, BK);
    if (!a->causal) return;
    for (int64_t i = 0; i < ni; i++)   /* keys j0 + j > i0 + i are in the future */
        for (int64_t j = i0 + i - j0 + 1 > 0 ? i0 + i - j0 + 1 : 0; j < nj; j++) s[i * BK + j] = -INFINITY;
}

/* the scratch of every thread that will run heads (each head is independent:
 * its own rows of out, lse, dq, dk, dv): `floats` each, cache-line apart;
 * one thread below MP_PAR_MIN multiply-adds */
static float *per_thread(mp_kctx *cx, const mp_attn_args *a, int64_t floats, int64_t *stride, int64_t *threads)
{
    int64_t work = a->bh * a->tq * a->tk * a->d;
    *threads = work >= MP_PAR_MIN && a->bh > 1 ? omp_get_max_threads() : 1;
    *stride = (floats + 15) & ~(int64_t)15;
    return cpu_scratch(cx, 3, sizeof(float) * (size_t)(*stride * *threads));
}

int cpu_attention(mp_kctx *cx, mp_dtype dt, void *out, float *lse, const void *q, const void *k, const void *v,
                  const mp_attn_args *a)
{
    int64_t tq = a->tq, tk = a->tk, d = a->d, stride, threads;
    float *base = per_thread(cx, a, tq * d + 3 * tk * d + BQ * BK + BQ * d + 2 * BQ, &stride, &threads);
    if (!base) return -1;
    #pragma omp parallel for if (threads > 1) schedule(static)
    for (int64_t r = 0; r < a->bh; r++) {
        float *qf = base + stride * omp_get_thread_num();
        float *kf = qf + tq * d, *kt = kf + tk * d, *vf = kt + tk * d, *s = vf + tk * d, *acc = s + BQ * BK;
        float *m = acc + BQ * d, *l = m + BQ;
        cpu_load(dt, q, r * tq * d, qf, tq * d);
        cpu_load(dt, k, r * tk * d, kf, tk * d);
        cpu_load(dt, v, r * tk * d, vf, tk * d);
        transpose(kt, kf, tk, d);
        for (int64_t i0 = 0; i0 < tq; i0 += BQ) {
            int64_t ni = tq - i0 < BQ ? tq - i0 : BQ;
            for (int64_t i = 0; i < ni; i++) m[i] = -INFINITY, l[i] = 0;
            memset(acc, 0, sizeof(float) * (size_t)(ni * d));
            int64_t jend = a->causal ? (i0 + ni < tk ? i0 + ni : tk) : tk;
            for (int64_t j0 = 0; j0 < jend; j0 += BK) {
                int64_t nj = jend - j0 < BK ? jend - j0 : BK;
                scores(a, qf, kt, i0, ni, j0, nj, s);
                for (int64_t i = 0; i < ni; i++) {   /* online softmax: rescale what came before */
                    float *si = s + i * BK, mx = row_max(si, nj, m[i]);
                    if (mx == -INFINITY) { for (int64_t j = 0; j < nj; j++) si[j] = 0; continue; }
                    float c = expf(m[i] - mx);
                    add_to_row(si, nj, -mx);
                    cpu_vexp(si, si, nj);
                    l[i] = l[i] * c + row_sum(si, nj), m[i] = mx;
                    scale_row(acc + i * d, d, c);
                    if (a->dropout > 0)
                        for (int64_t j = 0; j < nj; j++) si[j] *= keep(a, r, i0 + i, j0 + j);
                }
                cpu_block_gemm(0, ni, d, nj, 1.0f, s, BK, vf + j0 * d, d, 1.0f, acc, d);
            }
            for (int64_t i = 0; i < ni; i++) {
                scale_row(acc + i * d, d, l[i] > 0 ? 1.0f / l[i] : 0.0f);
                lse[r * tq + i0 + i] = l[i] > 0 ? m[i] + logf(l[i]) : -INFINITY;
            }
            cpu_store(cx, dt, out, (r * tq + i0) * d, acc, ni * d);
        }
    }
    return 0;
}

int cpu_attention_grad(mp_kctx *cx, mp_dtype dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                       const void *k, const void *v, const void *out, const float *lse, const mp_attn_args *a)
{
    int64_t tq = a->tq, tk = a->tk, d = a->d, stride, threads;
    float *base = per_thread(cx, a, 4 * tq * d + 6 * tk * d + tq + 3 * BQ * BK, &stride, &threads);
    if (!base) return -1;
    #pragma omp parallel for if (threads > 1) schedule(static)
    for (int64_t r = 0; r < a->bh; r++) {
        float *qf = base + stride * omp_get_thread_num();
        float *of = qf + tq * d, *gf = of + tq * d, *dqf = gf + tq * d;          /* q, out, dout, dq */
        float *kf = dqf + tq * d, *vf = kf + tk * d, *dkf = vf + tk * d, *dvf = dkf + tk * d;
        float *kt = dvf + tk * d, *vt = kt + tk * d;                               /* k, v transposed */
        float *di = vt + tk * d, *p = di + tq, *pd = p + BQ * BK, *dp = pd + BQ * BK;
        cpu_load(dt, q, r * tq * d, qf, tq * d);
        cpu_load(dt, out, r * tq * d, of, tq * d);
        cpu_load(dt, dout, r * tq * d, gf, tq * d);
        cpu_load(dt, k, r * tk * d, kf, tk * d);
        cpu_load(dt, v, r * tk * d, vf, tk * d);
        transpose(kt, kf, tk, d);
        transpose(vt, vf, tk, d);
        memset(dqf, 0, sizeof(float) * (size_t)(tq * d));
        memset(dkf, 0, sizeof(float) * (size_t)(2 * tk * d));
        for (int64_t i = 0; i < tq; i++) di[i] = (float)lane_dot(gf + i * d, of + i * d, d);   /* D_i = dout_i . out_i */
        const float *L = lse + r * tq;
        for (int64_t i0 = 0; i0 < tq; i0 += BQ) {
            int64_t ni = tq - i0 < BQ ? tq - i0 : BQ;
            int64_t jend = a->causal ? (i0 + ni < tk ? i0 + ni : tk) : tk;
            for (int64_t j0 = 0; j0 < jend; j0 += BK) {
                int64_t nj = jend - j0 < BK ? jend - j0 : BK;
                scores(a, qf, kt, i0, ni, j0, nj, p);
                for (int64_t i = 0; i < ni; i++) {   /* P = exp(S - lse); Pd = P * dropout factor */
                    float *pi = p + i * BK, li = L[i0 + i];
                    if (li == -INFINITY) for (int64_t j = 0; j < nj; j++) pi[j] = 0.0f;
                    else {
                        add_to_row(pi, nj, -li);
                        cpu_vexp(pi, pi, nj);
                    }
                    if (a->dropout > 0)
                        for (int64_t j = 0; j < nj; j++) pd[i * BK + j] = pi[j] * keep(a, r, i0 + i, j0 + j);
                }
                const float *pdb = a->dropout > 0 ? pd : p;   /* without dropout Pd is P */
                cpu_block_gemm(1, nj, d, ni, 1.0f, pdb, BK, gf + i0 * d, d, 1.0f, dvf + j0 * d, d);  /* dV += Pd^T dO */
                cpu_block_gemm(0, ni, nj, d, 1.0f, gf + i0 * d, d, vt + j0, tk, 0.0f, dp, BK);       /* dPd = dO V^T */
                for (int64_t i = 0; i < ni; i++) {   /* dS = P * (dP - D), dP = dPd * dropout factor */
                    float *dpi = dp + i * BK;
                    if (a->dropout > 0)
                        for (int64_t j = 0; j < nj; j++) dpi[j] *= keep(a, r, i0 + i, j0 + j);
                    ds_row(dpi, p + i * BK, di[i0 + i], nj);
                }
                cpu_block_gemm(0, ni, d, nj, a->scale, dp, BK, kf + j0 * d, d, 1.0f, dqf + i0 * d, d);  /* dQ += dS K s */
                cpu_block_gemm(1, nj, d, ni, a->scale, dp, BK, qf + i0 * d, d, 1.0f, dkf + j0 * d, d);  /* dK += dS^T Q s */
            }
        }
        cpu_store(cx, dt, dq, r * tq * d, dqf, tq * d);
        cpu_store(cx, dt, dk, r * tk * d, dkf, tk * d);
        cpu_store(cx, dt, dv, r * tk * d, dvf, tk * d);
    }
    return 0;
}
