/*
 * cpu_attention.c: scaled dot-product attention, blocked as FlashAttention is
 * (Dao et al. 2022; the backward as in FlashAttention-2): softmax(q k^T * scale
 * [+ causal mask]) v over {bh, t, d} operands without ever holding more than a
 * BQ x BK block of the t x t scores. The forward keeps a running maximum and sum
 * per query row (the online softmax) and writes the output and each row's
 * log-sum-exp (f32); the backward recomputes each block of probabilities from
 * that log-sum-exp. f32 and f16 operands are widened to f32 (a head at a time),
 * products run through block_gemm.h, results are rounded once.
 *
 * bf16 stays bf16 (issue 28): the products take bf16 operands into f32 sums
 * (block_gemm_bf16.h: vdpbf16ps where the processor has AVX512-BF16), keys and
 * values packed in pairs once per head; nothing is widened. As in PyTorch's CPU
 * flash attention (and FlashAttention on GPUs), the f32 intermediates that
 * multiply are rounded to bf16 first: P (after dropout) before P V and dV = Pd^T dO,
 * dS before dQ = dS K and dK = dS^T Q. The softmax, its row sums l and maxima,
 * D = dO . out, dS = P (dP - D) and every sum stay f32 (l sums the unrounded P).
 * What that costs, against the same bf16 inputs with f32 intermediates (u = 2^-8,
 * bf16's unit roundoff: each rounded element is off by at most u of itself):
 *   out_i: u sum_j P_ij |V_j|          dV_j: u sum_i Pd_ij |dO_i|
 *   dQ_i: s u sum_j |dS_ij| |K_j|      dK_j: s u sum_i |dS_ij| |Q_i|
 * plus f32 accumulation (k 2^-24 of the same sums) and the one rounding of the
 * output to bf16 (u of it) that both ways have. tests/lua/attention_spec.lua
 * checks these element by element; parity.c's bf16 bound against the CUDA
 * kernel (f32 intermediates) covers them as an nmse (the note there).
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
#include "kernels/cpu/block_gemm_bf16.h"
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

/* a block of scores (query rows i0.., keys j0..) masked to -inf where causal */
static void causal_mask(const mp_attn_args *a, int64_t i0, int64_t ni, int64_t j0, int64_t nj, float *s)
{
    if (!a->causal) return;
    for (int64_t i = 0; i < ni; i++)   /* keys j0 + j > i0 + i are in the future */
        for (int64_t j = i0 + i - j0 + 1 > 0 ? i0 + i - j0 + 1 : 0; j < nj; j++) s[i * BK + j] = -INFINITY;
}

/* S{BQ,BK} block (q rows i0.., keys j0..; kt: the keys transposed, {d, tk}):
 * scores * scale, masked to -inf */
static void scores(const mp_attn_args *a, const float *q, const float *kt, int64_t i0, int64_t ni, int64_t j0,
                   int64_t nj, float *s)
{
    cpu_block_gemm(0, ni, nj, a->d, a->scale, q + i0 * a->d, a->d, kt + j0, a->tk, 0.0f, s, BK);
    causal_mask(a, i0, ni, j0, nj, s);
}

/* The forward's online softmax over one block of scores s (rows i0.., keys
 * j0..): s becomes the block's probabilities against the running maximum m
 * (dropped out where dropout draws so), l the running sums, and the rows of acc
 * computed so far are rescaled to the new maximum */
static void softmax_block(const mp_attn_args *a, int64_t r, int64_t i0, int64_t ni, int64_t j0, int64_t nj, float *s,
                          float *m, float *l, float *acc)
{
    for (int64_t i = 0; i < ni; i++) {   /* online softmax: rescale what came before */
        float *si = s + i * BK, mx = row_max(si, nj, m[i]);
        if (mx == -INFINITY) { for (int64_t j = 0; j < nj; j++) si[j] = 0; continue; }
        float c = expf(m[i] - mx);
        add_to_row(si, nj, -mx);
        cpu_vexp(si, si, nj);
        l[i] = l[i] * c + row_sum(si, nj), m[i] = mx;
        scale_row(acc + i * a->d, a->d, c);
        if (a->dropout > 0)
            for (int64_t j = 0; j < nj; j++) si[j] *= keep(a, r, i0 + i, j0 + j);
    }
}

/* the forward's end of a query block: out = acc / l, lse = m + log l */
static void finish_rows(const mp_attn_args *a, int64_t r, int64_t i0, int64_t ni, const float *m, const float *l,
                        float *acc, float *lse)
{
    for (int64_t i = 0; i < ni; i++) {
        scale_row(acc + i * a->d, a->d, l[i] > 0 ? 1.0f / l[i] : 0.0f);
        lse[r * a->tq + i0 + i] = l[i] > 0 ? m[i] + logf(l[i]) : -INFINITY;
    }
}

/* The backward's probabilities of a block, from the scores in p and each row's
 * log-sum-exp L: P = exp(S - lse) in p; Pd = P * dropout factor in pd */
static void probs_block(const mp_attn_args *a, int64_t r, const float *L, int64_t i0, int64_t ni, int64_t j0,
                        int64_t nj, float *p, float *pd)
{
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
}

/* dS = P * (dP - D) over a block, in dp: dP = dPd * dropout factor */
static void dscores_block(const mp_attn_args *a, int64_t r, const float *di, int64_t i0, int64_t ni, int64_t j0,
                          int64_t nj, const float *p, float *dp)
{
    for (int64_t i = 0; i < ni; i++) {   /* dS = P * (dP - D), dP = dPd * dropout factor */
        float *dpi = dp + i * BK;
        if (a->dropout > 0)
            for (int64_t j = 0; j < nj; j++) dpi[j] *= keep(a, r, i0 + i, j0 + j);
        ds_row(dpi, p + i * BK, di[i0 + i], nj);
    }
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

/* ---- bf16: the block products on bf16 operands (block_gemm_bf16.h) ---- */

/* bytes of n elements of `size` bytes in a thread's scratch, kept 64-byte aligned */
#define SPAN(n, size) ((((int64_t)(n) * (int64_t)(size)) + 63) & ~(int64_t)63)

static void *take(char **at, int64_t n, size_t size)
{
    void *p = *at;
    *at += SPAN(n, size);
    return p;
}

/* rows {t, d} of a bf16 head read with their pairs along d (the A operand):
 * in place when d is even, else copied with a zero after each row */
static const uint16_t *pair_rows(const uint16_t *x, int64_t t, int64_t d, uint16_t *pad, int64_t *ld)
{
    if (!(d & 1)) { *ld = d; return x; }
    *ld = d + 1;
    for (int64_t i = 0; i < t; i++) {
        memcpy(pad + i * (d + 1), x + i * d, sizeof(uint16_t) * (size_t)d);
        pad[i * (d + 1) + d] = 0;
    }
    return pad;
}

/* a block's f32 values {ni, nj} (ld BK) rounded to bf16 rows (ld BK), a zero
 * after an odd nj (the pair's missing half) */
static void round_block(uint16_t *dst, const float *src, int64_t ni, int64_t nj)
{
    if (nj == BK) { mp_cpu_f32_to_bf16(dst, src, ni * BK); return; }
    for (int64_t i = 0; i < ni; i++) {
        mp_cpu_f32_to_bf16(dst + i * BK, src + i * BK, nj);
        if (nj & 1) dst[i * BK + nj] = 0;
    }
}

/* A causal block can end at an odd key `key` - 1 short of tk: then the pair
 * (key - 1, key) of a pack along the keys (pairs {., cols}) holds a key that is
 * not in the product, multiplied by the zero after P's or dS's row; a
 * non-finite value there would make 0 * inf = NaN. Hide that half while the
 * product runs (hide 1) and put it back after (hide 0). */
static void hide_key(uint16_t *pairs, int64_t cols, int64_t key, uint16_t *save, int hide)
{
    uint16_t *h = pairs + 2 * (key / 2) * cols + 1;
    for (int64_t c = 0; c < cols; c++) {
        if (hide) save[c] = h[2 * c], h[2 * c] = 0;
        else h[2 * c] = save[c];
    }
}

static int attention_bf16(mp_kctx *cx, uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, const mp_attn_args *a)
{
    int64_t tq = a->tq, tk = a->tk, d = a->d, de = d + (d & 1), te = tk + (tk & 1), stride, threads;
    int64_t bytes = SPAN(tq * de, 2) + SPAN(de * tk, 2) + SPAN(te * d, 2) + SPAN(BQ * BK, 2) + SPAN(d, 2) +
                    SPAN(BQ * BK, 4) + SPAN(BQ * d, 4) + 2 * SPAN(BQ, 4);
    float *base = per_thread(cx, a, bytes / 4, &stride, &threads);
    if (!base) return -1;
    #pragma omp parallel for if (threads > 1) schedule(static)
    for (int64_t r = 0; r < a->bh; r++) {
        char *at = (char *)(base + stride * omp_get_thread_num());
        uint16_t *qpad = take(&at, tq * de, 2), *kc = take(&at, de * tk, 2), *vr = take(&at, te * d, 2);
        uint16_t *pb = take(&at, BQ * BK, 2), *save = take(&at, d, 2);
        float *s = take(&at, BQ * BK, 4), *acc = take(&at, BQ * d, 4), *m = take(&at, BQ, 4), *l = take(&at, BQ, 4);
        int64_t ldq;
        const uint16_t *qr = pair_rows(q + r * tq * d, tq, d, qpad, &ldq);
        cpu_bf16_pack_cols(kc, tk, k + r * tk * d, d, tk, d);   /* K^T: pairs along d, a column per key */
        cpu_bf16_pack_rows(vr, d, v + r * tk * d, d, tk, d);    /* V: pairs along the keys */
        for (int64_t i0 = 0; i0 < tq; i0 += BQ) {
            int64_t ni = tq - i0 < BQ ? tq - i0 : BQ;
            for (int64_t i = 0; i < ni; i++) m[i] = -INFINITY, l[i] = 0;
            memset(acc, 0, sizeof(float) * (size_t)(ni * d));
            int64_t jend = a->causal ? (i0 + ni < tk ? i0 + ni : tk) : tk;
            for (int64_t j0 = 0; j0 < jend; j0 += BK) {
                int64_t nj = jend - j0 < BK ? jend - j0 : BK;
                cpu_block_gemm_bf16(0, ni, nj, d, a->scale, qr + i0 * ldq, ldq, kc + 2 * j0, tk, 0.0f, s, BK);
                causal_mask(a, i0, ni, j0, nj, s);
                softmax_block(a, r, i0, ni, j0, nj, s, m, l, acc);
                round_block(pb, s, ni, nj);   /* P in bf16 for P V; l summed the f32 P */
                int hide = (nj & 1) && j0 + nj < tk;
                if (hide) hide_key(vr, d, j0 + nj, save, 1);
                cpu_block_gemm_bf16(0, ni, d, nj, 1.0f, pb, BK, vr + j0 * d, d, 1.0f, acc, d);
                if (hide) hide_key(vr, d, j0 + nj, save, 0);
            }
            finish_rows(a, r, i0, ni, m, l, acc, lse);
            cpu_store(cx, MP_BF16, out, (r * tq + i0) * d, acc, ni * d);
        }
    }
    return 0;
}

static int attention_grad_bf16(mp_kctx *cx, uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                               const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *out,
                               const float *lse, const mp_attn_args *a)
{
    int64_t tq = a->tq, tk = a->tk, d = a->d, de = d + (d & 1), te = tk + (tk & 1), qe = tq + (tq & 1);
    int64_t stride, threads;
    int64_t bytes = 2 * SPAN(tq * de, 2) + 2 * SPAN(de * tk, 2) + SPAN(te * d, 2) + 2 * SPAN(qe * d, 2) +
                    4 * SPAN(BQ * BK, 2) + SPAN(d, 2) + SPAN(tq * d, 4) + 2 * SPAN(tk * d, 4) + SPAN(tq, 4) +
                    3 * SPAN(BQ * BK, 4) + SPAN(2 * d, 4);
    float *base = per_thread(cx, a, bytes / 4, &stride, &threads);
    if (!base) return -1;
    #pragma omp parallel for if (threads > 1) schedule(static)
    for (int64_t r = 0; r < a->bh; r++) {
        char *at = (char *)(base + stride * omp_get_thread_num());
        uint16_t *qpad = take(&at, tq * de, 2), *gpad = take(&at, tq * de, 2);
        uint16_t *kc = take(&at, de * tk, 2), *vc = take(&at, de * tk, 2), *kr = take(&at, te * d, 2);
        uint16_t *qp = take(&at, qe * d, 2), *gp = take(&at, qe * d, 2);
        uint16_t *pb = take(&at, BQ * BK, 2), *pt = take(&at, BQ * BK, 2), *sb = take(&at, BQ * BK, 2);
        uint16_t *st = take(&at, BQ * BK, 2), *save = take(&at, d, 2);
        float *dqf = take(&at, tq * d, 4), *dkf = take(&at, tk * d, 4), *dvf = take(&at, tk * d, 4);
        float *di = take(&at, tq, 4), *p = take(&at, BQ * BK, 4), *pd = take(&at, BQ * BK, 4);
        float *dp = take(&at, BQ * BK, 4), *row = take(&at, 2 * d, 4);
        const uint16_t *qh = q + r * tq * d, *gh = dout + r * tq * d, *oh = out + r * tq * d;
        const uint16_t *kh = k + r * tk * d, *vh = v + r * tk * d;
        int64_t ldq, ldg;
        const uint16_t *qrow = pair_rows(qh, tq, d, qpad, &ldq), *grow = pair_rows(gh, tq, d, gpad, &ldg);
        cpu_bf16_pack_cols(kc, tk, kh, d, tk, d);   /* K^T and V^T: pairs along d, a column per key */
        cpu_bf16_pack_cols(vc, tk, vh, d, tk, d);
        cpu_bf16_pack_rows(kr, d, kh, d, tk, d);    /* K: pairs along the keys; Q and dO along the queries */
        cpu_bf16_pack_rows(qp, d, qh, d, tq, d);
        cpu_bf16_pack_rows(gp, d, gh, d, tq, d);
        memset(dqf, 0, sizeof(float) * (size_t)(tq * d));
        memset(dkf, 0, sizeof(float) * (size_t)(tk * d));
        memset(dvf, 0, sizeof(float) * (size_t)(tk * d));
        for (int64_t i = 0; i < tq; i++) {   /* D_i = dout_i . out_i */
            mp_cpu_bf16_to_f32(row, gh + i * d, d);
            mp_cpu_bf16_to_f32(row + d, oh + i * d, d);
            di[i] = (float)lane_dot(row, row + d, d);
        }
        const float *L = lse + r * tq;
        for (int64_t i0 = 0; i0 < tq; i0 += BQ) {
            int64_t ni = tq - i0 < BQ ? tq - i0 : BQ;
            int64_t jend = a->causal ? (i0 + ni < tk ? i0 + ni : tk) : tk;
            for (int64_t j0 = 0; j0 < jend; j0 += BK) {
                int64_t nj = jend - j0 < BK ? jend - j0 : BK;
                cpu_block_gemm_bf16(0, ni, nj, d, a->scale, qrow + i0 * ldq, ldq, kc + 2 * j0, tk, 0.0f, p, BK);
                causal_mask(a, i0, ni, j0, nj, p);
                probs_block(a, r, L, i0, ni, j0, nj, p, pd);
                round_block(pb, a->dropout > 0 ? pd : p, ni, nj);   /* Pd in bf16 */
                cpu_bf16_pack_rows(pt, BK, pb, BK, ni, nj);           /* Pd^T: pairs along the queries */
                cpu_block_gemm_bf16(1, nj, d, ni, 1.0f, pt, BK, gp + i0 * d, d, 1.0f, dvf + j0 * d, d);      /* dV += Pd^T dO */
                cpu_block_gemm_bf16(0, ni, nj, d, 1.0f, grow + i0 * ldg, ldg, vc + 2 * j0, tk, 0.0f, dp, BK); /* dPd = dO V^T */
                dscores_block(a, r, di, i0, ni, j0, nj, p, dp);   /* dS in f32 from the f32 P */
                round_block(sb, dp, ni, nj);                      /* dS in bf16 */
                int hide = (nj & 1) && j0 + nj < tk;
                if (hide) hide_key(kr, d, j0 + nj, save, 1);
                cpu_block_gemm_bf16(0, ni, d, nj, a->scale, sb, BK, kr + j0 * d, d, 1.0f, dqf + i0 * d, d);  /* dQ += dS K s */
                if (hide) hide_key(kr, d, j0 + nj, save, 0);
                cpu_bf16_pack_rows(st, BK, sb, BK, ni, nj);   /* dS^T: pairs along the queries */
                cpu_block_gemm_bf16(1, nj, d, ni, a->scale, st, BK, qp + i0 * d, d, 1.0f, dkf + j0 * d, d);  /* dK += dS^T Q s */
            }
        }
        cpu_store(cx, MP_BF16, dq, r * tq * d, dqf, tq * d);
        cpu_store(cx, MP_BF16, dk, r * tk * d, dkf, tk * d);
        cpu_store(cx, MP_BF16, dv, r * tk * d, dvf, tk * d);
    }
    return 0;
}

int cpu_attention(mp_kctx *cx, mp_dtype dt, void *out, float *lse, const void *q, const void *k, const void *v,
                  const mp_attn_args *a)
{
    if (dt == MP_BF16)
        return attention_bf16(cx, out, lse, q, k, v, a);
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
                softmax_block(a, r, i0, ni, j0, nj, s, m, l, acc);
                cpu_block_gemm(0, ni, d, nj, 1.0f, s, BK, vf + j0 * d, d, 1.0f, acc, d);
            }
            finish_rows(a, r, i0, ni, m, l, acc, lse);
            cpu_store(cx, dt, out, (r * tq + i0) * d, acc, ni * d);
        }
    }
    return 0;
}

int cpu_attention_grad(mp_kctx *cx, mp_dtype dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                       const void *k, const void *v, const void *out, const float *lse, const mp_attn_args *a)
{
    if (dt == MP_BF16)
        return attention_grad_bf16(cx, dq, dk, dv, dout, q, k, v, out, lse, a);
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
                probs_block(a, r, L, i0, ni, j0, nj, p, pd);
                const float *pdb = a->dropout > 0 ? pd : p;   /* without dropout Pd is P */
                cpu_block_gemm(1, nj, d, ni, 1.0f, pdb, BK, gf + i0 * d, d, 1.0f, dvf + j0 * d, d);  /* dV += Pd^T dO */
                cpu_block_gemm(0, ni, nj, d, 1.0f, gf + i0 * d, d, vt + j0, tk, 0.0f, dp, BK);       /* dPd = dO V^T */
                dscores_block(a, r, di, i0, ni, j0, nj, p, dp);
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
