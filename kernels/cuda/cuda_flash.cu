/*
 * cuda_flash.cu: attention on tensor cores, FlashAttention-2 style (Dao 2023),
 * for f16 and bf16 with head dims 64 and 128 (cuda_attention.cu sends those
 * here and keeps its simple kernel for the rest). The numerics are those of
 * kernels/cpu/cpu_attention.c: scores scaled in f32, an online softmax with
 * f32 row maxima and sums, each row's log-sum-exp for the backward, causal =
 * keys j <= i, Philox dropout at the CPU's counters (inside a CUDA graph
 * capture, their seed and base read from the graph's pair when the kernel
 * runs: cuda.h mp_cuda_rng_pair), the softmax normaliser that of the undropped
 * probabilities.
 *
 * Forward (k_flash): a block per (head, 64 query rows), 4 warps of 16 rows.
 * Key and value tiles of 64 rows are staged in shared memory; each warp keeps
 * its Q rows as WMMA fragments, forms S = Q K^T (m16n16k16, f32 sums), writes
 * it to its own shared rows, and runs the online softmax there a row at a
 * time, each lane on two of the tile's keys (row maximum and sum by a
 * butterfly of shuffles, so every lane holds the same bits). P, after dropout, is
 * rounded to the input dtype (the tensor cores' operand) and O += P V runs
 * through WMMA again, O kept in shared memory as f32 (a row's rescaling by
 * exp(m_old - m_new) needs to know which elements are the row's: a fragment's
 * layout is not the kernel's to know). Causal tiles wholly above the diagonal
 * are not visited, the diagonal one is masked.
 *
 * Backward, no atomics, so two runs give the same bits:
 * - k_flash_dot: D_i = dO_i . O_i, a warp per row summed in f64 (the CPU sums
 *   in f64 too) and rounded to f32 into scratch.
 * - k_flash_dkv: a block per (head, 64 keys), a warp per 16 keys. For every
 *   query tile (causal: from the key tile's first row on) it recomputes
 *   S^T = K Q^T and dP^T = V dO^T, then P = exp(S - lse), Pd = P * keep,
 *   dS = P (dP keep - D), and accumulates dV += Pd^T dO and dK += dS^T Q in
 *   WMMA accumulators that stay in registers for the whole pass.
 * - k_flash_dq: a block per (head, 64 query rows), a warp per 16 rows; for
 *   every key tile it recomputes S, dP and dS and accumulates dQ += dS K.
 *   Each of dQ, dK and dV is summed by one warp in one fixed order.
 * Pd and dS are rounded to the input dtype before they multiply (as P in the
 * forward); dK and dQ are multiplied by the scale once, at the end.
 *
 * Shared memory: every loop over a tile's elements has lanes on consecutive
 * words of a row. (A lane per row, as these kernels had first, puts all 32
 * lanes of an access on one bank: 32-way conflicts. On an H200, ncu measured
 * the three kernels at 95-97% of L1's throughput and 6-7% of the SMs', 10.5
 * TFLOP/s forward + backward against SDPA's 210.)
 *
 * What this costs against the CPU (parity.c's attention cases check it):
 * - bf16: the CPU rounds the same intermediates (P after dropout, Pd, dS) to
 *   bf16 before the same products (cpu_attention.c's head); what differs is the
 *   order of the f32 sums (S: d products, O: the keys, dV/dK/dQ: queries or
 *   keys), each within gamma_n = n 2^-24 of the sum of the terms' magnitudes,
 *   and, where two f32 values of P or dS that differ in their last bits round
 *   to different bf16 neighbours, a whole bf16 ulp of that element (rare: the
 *   f32 values differ by ~2^-20 of themselves, one in ~2^12 elements).
 * - f16: the CPU keeps P, Pd and dS in f32; here each is rounded to f16,
 *   off by delta, |delta| <= u = 2^-11 of itself (2^-25 absolute below f16's
 *   normal range). An output sum_j t_j gains sum_j delta_j t_j:
 *     |d out_i| <= u sum_j Pd_ij |V_j| / l_i     |d dV_j| <= u sum_i Pd_ij |dO_i|
 *     |d dQ_i|  <= s u sum_j |dS_ij| |K_j|       |d dK_j| <= s u sum_i |dS_ij| |Q_i|
 *   plus the f32 sums above and the output's own f16 rounding (u of it, on both
 *   sides). As an nmse over random values: (u^2 / 3) kappa per rounding site
 *   (kappa = sum t^2 / (sum t)^2: about 1 for long rows of random signs, 1.5e-7
 *   measured; larger where the terms cancel, as dQ_i = s sum_j dS_ij K_j does
 *   with dS's zero row sums, most in short causal rows: 1.3e-6 measured at
 *   tq 3), against parity's f16 bound of 1e-5.
 * - The emulated device sums each mma_sync's 16 products in k order from C
 *   (tests/emu/emu_wmma.cc); the GPU's tensor cores add them in an order and
 *   with an internal alignment CUDA does not specify. Both are covered by the
 *   f32 terms above; the bits on a GPU may differ from the emulator's (but not
 *   run to run).
 *
 * The scores' overflow: S, P and dP stay f32 (the inputs are f16/bf16, S the
 * tensor cores' f32 sum); only P, Pd (in [0, 1/(1-p)]) and dS meet the dtype's
 * range, dS as the CPU's bf16 path does and as FlashAttention does for f16.
 */
#include <mma.h>
#include "kernels/cuda/cuda.h"
#include "kernels/philox.h"

using namespace nvcuda;

#define FB 64            /* query rows of a block, keys of a tile */
#define FW 4             /* warps of a block, 16 rows (or keys) each */
#define FT (FW * 32)     /* threads of a block */

namespace {

template <class T> struct frag {
    typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a_row;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b_row;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b_col;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
};

/* the dropout factor of element (head row r, query i, key j): cpu_attention.c's keep */
__device__ __forceinline__ float keep_at(const mp_attn_args &a, int64_t r, int64_t i, int64_t j)
{
    uint64_t idx = a.offset + ((uint64_t)r * (uint64_t)a.tq + (uint64_t)i) * (uint64_t)a.tk + (uint64_t)j;
    return mp_philox_uniform(a.seed, idx, 24) >= a.dropout ? 1.0f / (1.0f - a.dropout) : 0.0f;
}

/* rows [0, rows) of a {., D} matrix of 16-bit elements into shared memory, rows
 * from `valid` on as zeros (a partial tile: zeros keep every product finite);
 * by threads tid, tid + nt, ...; vec: 16 bytes at a time (src 16-byte aligned) */
template <int D>
__device__ __forceinline__ void stage_rows(uint16_t *dst, const uint16_t *src, int rows, int valid, int tid, int nt,
                                           bool vec)
{
    if (vec) {
        const int per = D / 8;
        for (int t = tid; t < rows * per; t += nt)
            ((uint4 *)dst)[t] = t / per < valid ? ((const uint4 *)src)[t] : make_uint4(0, 0, 0, 0);
    } else {
        for (int t = tid; t < rows * D; t += nt) dst[t] = t / D < valid ? src[t] : (uint16_t)0;
    }
}

/* the larger, NaN-blind as cpu_attention.c's row_max (x > m ? x : m) */
__device__ __forceinline__ float larger(float x, float m) { return x > m ? x : m; }

/* the two products the backward recomputes for one 16 x 16 tile, each through
 * D / 16 WMMA steps: s = A1 B1^T * scale and dp = A2 B2^T (rows of 16 x D
 * operands, leading dimension D), stored as f32 rows of FB into s_out, dp_out */
template <class T, int D>
__device__ __forceinline__ void s_dp_tile(const T *a1, const T *b1, const T *a2, const T *b2, float scale,
                                          float *s_out, float *dp_out)
{
    typename frag<T>::acc s, dp;
    wmma::fill_fragment(s, 0.0f);
    wmma::fill_fragment(dp, 0.0f);
    for (int kb = 0; kb < D / 16; kb++) {
        typename frag<T>::a_row xa;
        typename frag<T>::b_col xb;
        wmma::load_matrix_sync(xa, a1 + 16 * kb, D);
        wmma::load_matrix_sync(xb, b1 + 16 * kb, D);
        wmma::mma_sync(s, xa, xb, s);
        wmma::load_matrix_sync(xa, a2 + 16 * kb, D);
        wmma::load_matrix_sync(xb, b2 + 16 * kb, D);
        wmma::mma_sync(dp, xa, xb, dp);
    }
    for (int e = 0; e < s.num_elements; e++) s.x[e] *= scale;
    wmma::store_matrix_sync(s_out, s, FB, wmma::mem_row_major);
    wmma::store_matrix_sync(dp_out, dp, FB, wmma::mem_row_major);
}

/* ---- forward ---- */

/* shared bytes: K and V tiles (T), O (f32), each warp's S (f32) and P (T) */
template <int D> constexpr size_t fwd_shared() { return 2 * FB * D * 2 + FB * D * 4 + FW * 16 * FB * (4 + 2); }

template <class T, int D>
__global__ void __launch_bounds__(FT) k_flash(T *out, float *lse, const T *q, const T *k, const T *v, mp_attn_args a,
                                              const uint64_t *pair, bool vec, unsigned long long *fc)
{
    mp_rng_from(pair, a.seed, a.offset);
    MP_DYNAMIC_SHARED(float, sh);
    uint16_t *ks = (uint16_t *)sh, *vs = ks + FB * D;
    float *os = (float *)(vs + FB * D), *ss = os + FB * D;
    uint16_t *ps = (uint16_t *)(ss + FW * 16 * FB);
    const int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int64_t r = blockIdx.x, tq = a.tq, tk = a.tk, i0 = (int64_t)blockIdx.y * FB, iw = i0 + 16 * w;
    float *ow = os + 16 * w * D, *sw = ss + 16 * w * FB;
    uint16_t *pw = ps + 16 * w * FB;
    const bool live = iw < tq;   /* the warp has rows (uniform over the warp) */

    /* Q's 16 rows of this warp as fragments, staged in the warp's O rows */
    typename frag<T>::a_row qf[D / 16];
    stage_rows<D>((uint16_t *)ow, (const uint16_t *)q + (r * tq + iw) * D, 16, live ? (int)min((int64_t)16, tq - iw) : 0,
                  lane, 32, vec);
    __syncwarp();
    for (int kb = 0; kb < D / 16; kb++) wmma::load_matrix_sync(qf[kb], (const T *)ow + 16 * kb, D);
    __syncwarp();
    for (int t = lane; t < 16 * D; t += 32) ow[t] = 0.0f;

    /* row lane % 16's running maximum and sum, on lanes t and t + 16 (read by
     * the others through a shuffle: two registers, not two arrays) */
    float mo = -INFINITY, lo = 0.0f;
    const int64_t ni = min((int64_t)FB, tq - i0), jend = a.causal ? min(i0 + ni, tk) : tk;
    for (int64_t j0 = 0; j0 < jend; j0 += FB) {
        const int nj = (int)min((int64_t)FB, jend - j0);
        __syncthreads();   /* the last tile is read no more */
        stage_rows<D>(ks, (const uint16_t *)k + (r * tk + j0) * D, FB, nj, (int)threadIdx.x, FT, vec);
        stage_rows<D>(vs, (const uint16_t *)v + (r * tk + j0) * D, FB, nj, (int)threadIdx.x, FT, vec);
        __syncthreads();
        if (!live || (a.causal && j0 > iw + 15)) continue;   /* no row of the warp sees a key of the tile */

        /* S = Q K^T * scale, into the warp's rows of ss */
        for (int nb = 0; nb < FB / 16; nb++) {
            typename frag<T>::acc s;
            wmma::fill_fragment(s, 0.0f);
            for (int kb = 0; kb < D / 16; kb++) {
                typename frag<T>::b_col kf;
                wmma::load_matrix_sync(kf, (const T *)ks + 16 * nb * D + 16 * kb, D);
                wmma::mma_sync(s, qf[kb], kf, s);
            }
            for (int e = 0; e < s.num_elements; e++) s.x[e] *= a.scale;
            wmma::store_matrix_sync(sw + 16 * nb, s, FB, wmma::mem_row_major);
        }
        __syncwarp();

        /* the online softmax, the warp's rows one at a time, lane t on keys t
         * and t + 32 of the tile (consecutive words: no bank conflicts) */
        for (int rr = 0; rr < 16; rr++) {
            const int64_t i = iw + rr;
            const float *srow = sw + rr * FB;
            uint16_t *prow = pw + rr * FB;
            const float m = __shfl_sync(0xffffffffu, mo, rr), l = __shfl_sync(0xffffffffu, lo, rr);
            float x[2];
            float mx = m;
            for (int u = 0; u < 2; u++) {
                const int jt = lane + 32 * u;
                x[u] = jt >= nj || (a.causal && j0 + jt > i) ? -INFINITY : srow[jt];
                mx = larger(x[u], mx);
            }
            for (int o = 16; o > 0; o /= 2) mx = larger(__shfl_xor_sync(0xffffffffu, mx, o), mx);
            float c = 1.0f;
            if (mx == -INFINITY) {   /* nothing seen yet: P = 0, m and l stay (cpu_attention.c's softmax_block) */
                prow[lane] = prow[lane + 32] = 0;
            } else {
                c = expf(m - mx);
                float p[2];
                for (int u = 0; u < 2; u++) p[u] = expf(x[u] - mx);
                /* the row's sum by a butterfly: the same bits on every lane */
                float sum = p[0] + p[1];
                for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                for (int u = 0; u < 2; u++) {
                    if (a.dropout > 0) p[u] *= keep_at(a, r, i, j0 + lane + 32 * u);
                    prow[lane + 32 * u] = (uint16_t)mp_ty<T>::bits(p[u]);   /* P in the dtype, for the tensor cores */
                }
                if (lane % 16 == rr) lo = l * c + sum, mo = mx;
            }
            for (int e = lane; e < D; e += 32) ow[rr * D + e] *= c;
        }
        __syncwarp();

        /* O += P V */
        typename frag<T>::a_row pf[FB / 16];
        for (int kb = 0; kb < FB / 16; kb++) wmma::load_matrix_sync(pf[kb], (const T *)pw + 16 * kb, FB);
        for (int db = 0; db < D / 16; db++) {
            typename frag<T>::acc o;
            wmma::load_matrix_sync(o, ow + 16 * db, D, wmma::mem_row_major);
            for (int kb = 0; kb < FB / 16; kb++) {
                typename frag<T>::b_row vf;
                wmma::load_matrix_sync(vf, (const T *)vs + 16 * kb * D + 16 * db, D);
                wmma::mma_sync(o, pf[kb], vf, o);
            }
            wmma::store_matrix_sync(ow + 16 * db, o, D, wmma::mem_row_major);
        }
        __syncwarp();
    }
    mp_tally t(fc);
    for (int rr = 0; rr < 16; rr++) {
        const int64_t i = iw + rr;
        const float m = __shfl_sync(0xffffffffu, mo, rr), l = __shfl_sync(0xffffffffu, lo, rr);
        if (!live || i >= tq) continue;
        const float inv = l > 0 ? 1.0f / l : 0.0f;
        for (int e = lane; e < D; e += 32) mp_put<T>(out, (r * tq + i) * D + e, ow[rr * D + e] * inv, t);
        if (lane == 0) lse[r * tq + i] = l > 0 ? m + logf(l) : -INFINITY;
    }
    t.commit();
}


/* ---- backward ---- */

/* D_i = dO_i . O_i: a warp per row, the products summed in f64 (exact
 * products, as cpu_attention.c's lane_dot), the lanes combined by a butterfly
 * (every lane the same bits) */
template <class T, int D> __global__ void k_flash_dot(float *dvec, const T *dout, const T *out, int64_t n)
{
    const int lane = (int)threadIdx.x % 32, wpb = (int)blockDim.x / 32;
    for (int64_t row = (int64_t)blockIdx.x * wpb + threadIdx.x / 32; row < n; row += (int64_t)gridDim.x * wpb) {
        double s = 0;
        for (int e = lane; e < D; e += 32) s += (double)mp_get<T>(dout, row * D + e) * (double)mp_get<T>(out, row * D + e);
        for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) dvec[row] = (float)s;
    }
}

/* shared bytes of k_flash_dkv: Q, dO, K and V tiles (T), the tile's lse and D,
 * each warp's S^T and dP^T (f32) and Pd^T and dS^T (T) */
template <int D> constexpr size_t dkv_shared() { return 4 * FB * D * 2 + 2 * FB * 4 + FW * 16 * FB * (4 + 4 + 2 + 2); }

template <class T, int D>
__global__ void __launch_bounds__(FT) k_flash_dkv(T *dk, T *dv, const T *q, const T *k, const T *v, const T *dout,
                                                  const float *lse, const float *dvec, mp_attn_args a,
                                                  const uint64_t *pair, bool vec, unsigned long long *fc)
{
    mp_rng_from(pair, a.seed, a.offset);
    MP_DYNAMIC_SHARED(float, sh);
    uint16_t *qs = (uint16_t *)sh, *gs = qs + FB * D, *ks = gs + FB * D, *vs = ks + FB * D;
    float *ls = (float *)(vs + FB * D), *dd = ls + FB, *st = dd + FB, *dpt = st + FW * 16 * FB;
    uint16_t *pt = (uint16_t *)(dpt + FW * 16 * FB), *dst = pt + FW * 16 * FB;
    const int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int64_t r = blockIdx.x, tq = a.tq, tk = a.tk, j0 = (int64_t)blockIdx.y * FB, jw = j0 + 16 * w;
    float *stw = st + 16 * w * FB, *dpw = dpt + 16 * w * FB;
    uint16_t *ptw = pt + 16 * w * FB, *dsw = dst + 16 * w * FB;
    const bool live = jw < tk;   /* the warp has keys (uniform over the warp) */
    const int nj = (int)min((int64_t)FB, tk - j0);
    stage_rows<D>(ks, (const uint16_t *)k + (r * tk + j0) * D, FB, nj, (int)threadIdx.x, FT, vec);
    stage_rows<D>(vs, (const uint16_t *)v + (r * tk + j0) * D, FB, nj, (int)threadIdx.x, FT, vec);

    typename frag<T>::acc dka[D / 16], dva[D / 16];   /* the warp's 16 rows of dK and dV, for the whole pass */
    for (int db = 0; db < D / 16; db++) wmma::fill_fragment(dka[db], 0.0f), wmma::fill_fragment(dva[db], 0.0f);
    for (int64_t i0 = a.causal ? j0 : 0; i0 < tq; i0 += FB) {   /* causal: queries before j0 see none of these keys */
        const int ni = (int)min((int64_t)FB, tq - i0);
        __syncthreads();   /* the last query tile is read no more (and K, V are in, the first time) */
        stage_rows<D>(qs, (const uint16_t *)q + (r * tq + i0) * D, FB, ni, (int)threadIdx.x, FT, vec);
        stage_rows<D>(gs, (const uint16_t *)dout + (r * tq + i0) * D, FB, ni, (int)threadIdx.x, FT, vec);
        for (int t = (int)threadIdx.x; t < FB; t += FT) {
            ls[t] = t < ni ? lse[r * tq + i0 + t] : -INFINITY;
            dd[t] = t < ni ? dvec[r * tq + i0 + t] : 0.0f;
        }
        __syncthreads();
        if (!live) continue;

        /* S^T = K Q^T * scale and dP^T = V dO^T, the warp's 16 keys against the tile's 64 queries */
        for (int nb = 0; nb < FB / 16; nb++)
            s_dp_tile<T, D>((const T *)ks + 16 * w * D, (const T *)qs + 16 * nb * D, (const T *)vs + 16 * w * D,
                            (const T *)gs + 16 * nb * D, a.scale, stw + 16 * nb, dpw + 16 * nb);
        __syncwarp();

        /* P = exp(S - lse), Pd = P keep, dS = P (dP keep - D) of the warp's 16
         * keys (rows) against the tile's queries (columns), lanes on
         * consecutive columns (consecutive words: no bank conflicts) */
        for (int e = lane; e < 16 * FB; e += 32) {
            const int kr = e / FB, c = e % FB;
            const int64_t i = i0 + c, j = jw + kr;
            const float L = ls[c];
            const bool seen = c < ni && j < tk && !(a.causal && j > i) && L != -INFINITY;
            const float p = seen ? expf(stw[e] - L) : 0.0f;
            const float kf = a.dropout > 0 && seen ? keep_at(a, r, i, j) : 1.0f;
            ptw[e] = (uint16_t)mp_ty<T>::bits(p * kf);
            dsw[e] = (uint16_t)mp_ty<T>::bits(p * (dpw[e] * kf - dd[c]));
        }
        __syncwarp();

        /* dV += Pd^T dO, dK += dS^T Q */
        typename frag<T>::a_row pf[FB / 16], sf[FB / 16];
        for (int kb = 0; kb < FB / 16; kb++) {
            wmma::load_matrix_sync(pf[kb], (const T *)ptw + 16 * kb, FB);
            wmma::load_matrix_sync(sf[kb], (const T *)dsw + 16 * kb, FB);
        }
        for (int db = 0; db < D / 16; db++)
            for (int kb = 0; kb < FB / 16; kb++) {
                typename frag<T>::b_row xb;
                wmma::load_matrix_sync(xb, (const T *)gs + 16 * kb * D + 16 * db, D);
                wmma::mma_sync(dva[db], pf[kb], xb, dva[db]);
                wmma::load_matrix_sync(xb, (const T *)qs + 16 * kb * D + 16 * db, D);
                wmma::mma_sync(dka[db], sf[kb], xb, dka[db]);
            }
    }
    /* out through the tiles' room (every warp is past its last read): the
     * warp's dK and dV rows as f32, then rounded, lanes on consecutive words */
    __syncthreads();
    float *kw = sh + 32 * w * D, *vw = kw + 16 * D;
    for (int db = 0; db < D / 16; db++) {
        for (int e = 0; e < dka[db].num_elements; e++) dka[db].x[e] *= a.scale;
        wmma::store_matrix_sync(kw + 16 * db, dka[db], D, wmma::mem_row_major);
        wmma::store_matrix_sync(vw + 16 * db, dva[db], D, wmma::mem_row_major);
    }
    __syncwarp();
    mp_tally t(fc);
    if (live)
        for (int e = lane; e < 16 * D; e += 32) {
            const int64_t j = jw + e / D;
            if (j >= tk) break;   /* rows in order: the rest are past tk too */
            mp_put<T>(dk, (r * tk + j) * D + e % D, kw[e], t);
            mp_put<T>(dv, (r * tk + j) * D + e % D, vw[e], t);
        }
    t.commit();
}

/* shared bytes of k_flash_dq: each warp's Q and dO rows (T), K and V tiles (T),
 * each warp's S and dP (f32) and dS (T) */
template <int D> constexpr size_t dq_shared() { return 4 * FB * D * 2 + FW * 16 * FB * (4 + 4 + 2); }

template <class T, int D>
__global__ void __launch_bounds__(FT) k_flash_dq(T *dq, const T *q, const T *k, const T *v, const T *dout,
                                                 const float *lse, const float *dvec, mp_attn_args a,
                                                 const uint64_t *pair, bool vec, unsigned long long *fc)
{
    mp_rng_from(pair, a.seed, a.offset);
    MP_DYNAMIC_SHARED(float, sh);
    const int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, lr = lane % 16;
    uint16_t *qw = (uint16_t *)sh + 32 * w * D, *gw = qw + 16 * D;   /* the warp's Q rows, then its dO rows */
    uint16_t *ks = (uint16_t *)sh + 2 * FB * D, *vs = ks + FB * D;
    float *sw = (float *)(vs + FB * D) + 16 * w * FB, *dpw = (float *)(vs + FB * D) + FW * 16 * FB + 16 * w * FB;
    uint16_t *dsw = (uint16_t *)((float *)(vs + FB * D) + 2 * FW * 16 * FB) + 16 * w * FB;
    const int64_t r = blockIdx.x, tq = a.tq, tk = a.tk, i0 = (int64_t)blockIdx.y * FB, iw = i0 + 16 * w, i = iw + lr;
    const bool live = iw < tq;   /* the warp has rows (uniform over the warp) */
    const int nw = live ? (int)min((int64_t)16, tq - iw) : 0;
    stage_rows<D>(qw, (const uint16_t *)q + (r * tq + iw) * D, 16, nw, lane, 32, vec);
    stage_rows<D>(gw, (const uint16_t *)dout + (r * tq + iw) * D, 16, nw, lane, 32, vec);
    /* row lr's log-sum-exp and D on lanes lr and lr + 16, shuffled to the lanes of its columns */
    const float L = live && i < tq ? lse[r * tq + i] : -INFINITY, di = live && i < tq ? dvec[r * tq + i] : 0.0f;
    __syncwarp();

    typename frag<T>::acc dqa[D / 16];   /* the warp's 16 rows of dQ, for the whole pass */
    for (int db = 0; db < D / 16; db++) wmma::fill_fragment(dqa[db], 0.0f);
    const int64_t ni = min((int64_t)FB, tq - i0), jend = a.causal ? min(i0 + ni, tk) : tk;
    for (int64_t j0 = 0; j0 < jend; j0 += FB) {
        const int nj = (int)min((int64_t)FB, jend - j0);
        __syncthreads();   /* the last tile is read no more */
        stage_rows<D>(ks, (const uint16_t *)k + (r * tk + j0) * D, FB, nj, (int)threadIdx.x, FT, vec);
        stage_rows<D>(vs, (const uint16_t *)v + (r * tk + j0) * D, FB, nj, (int)threadIdx.x, FT, vec);
        __syncthreads();
        if (!live || (a.causal && j0 > iw + 15)) continue;   /* no row of the warp sees a key of the tile */

        /* S = Q K^T * scale and dP = dO V^T, the warp's 16 rows against the tile's 64 keys */
        for (int nb = 0; nb < FB / 16; nb++)
            s_dp_tile<T, D>((const T *)qw, (const T *)ks + 16 * nb * D, (const T *)gw, (const T *)vs + 16 * nb * D,
                            a.scale, sw + 16 * nb, dpw + 16 * nb);
        __syncwarp();

        /* dS = P (dP keep - D) of the warp's 16 rows against the tile's keys,
         * lanes on consecutive columns (no bank conflicts); a row's L and D
         * come from its lane (every lane runs each step: the shuffles' rule) */
        for (int e = lane; e < 16 * FB; e += 32) {
            const int row = e / FB, c = e % FB;
            const float Lr = __shfl_sync(0xffffffffu, L, row), dr = __shfl_sync(0xffffffffu, di, row);
            const int64_t key = j0 + c, ir = iw + row;
            const bool seen = c < nj && ir < tq && !(a.causal && key > ir) && Lr != -INFINITY;
            const float p = seen ? expf(sw[e] - Lr) : 0.0f;
            const float kf = a.dropout > 0 && seen ? keep_at(a, r, ir, key) : 1.0f;
            dsw[e] = (uint16_t)mp_ty<T>::bits(p * (dpw[e] * kf - dr));
        }
        __syncwarp();

        /* dQ += dS K */
        typename frag<T>::a_row sf[FB / 16];
        for (int kb = 0; kb < FB / 16; kb++) wmma::load_matrix_sync(sf[kb], (const T *)dsw + 16 * kb, FB);
        for (int db = 0; db < D / 16; db++)
            for (int kb = 0; kb < FB / 16; kb++) {
                typename frag<T>::b_row xb;
                wmma::load_matrix_sync(xb, (const T *)ks + 16 * kb * D + 16 * db, D);
                wmma::mma_sync(dqa[db], sf[kb], xb, dqa[db]);
            }
    }
    /* out through the warp's Q and dO rows (its own: no other warp reads them) */
    __syncwarp();
    float *qo = (float *)qw;
    for (int db = 0; db < D / 16; db++) {
        for (int e = 0; e < dqa[db].num_elements; e++) dqa[db].x[e] *= a.scale;
        wmma::store_matrix_sync(qo + 16 * db, dqa[db], D, wmma::mem_row_major);
    }
    __syncwarp();
    mp_tally t(fc);
    if (live)
        for (int e = lane; e < 16 * D; e += 32) {
            const int64_t ir = iw + e / D;
            if (ir >= tq) break;   /* rows in order: the rest are past tq too */
            mp_put<T>(dq, (r * tq + ir) * D + e % D, qo[e], t);
        }
    t.commit();
}

}  /* namespace */

/* the flash kernels take this op: f16/bf16, head dim 64 or 128 */
bool mp_cuda_flash_takes(mp_dtype dt, int64_t d) { return (dt == MP_F16 || dt == MP_BF16) && (d == 64 || d == 128); }

template <class T, int D>
static void flash_fwd(mp_kctx *cx, void *out, float *lse, const void *q, const void *k, const void *v,
                      const mp_attn_args *a, const uint64_t *pair)
{
    const size_t shared = fwd_shared<D>();
    MP_CUDA_CHECK(cudaFuncSetAttribute((const void *)k_flash<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared), "attention (shared memory)");
    dim3 grid((unsigned)a->bh, (unsigned)((a->tq + FB - 1) / FB));
    const bool vec = mp_al16(q) && mp_al16(k) && mp_al16(v);
    MP_LAUNCH(grid, FT, shared, cx->stream, k_flash<T, D>, (T *)out, lse, (const T *)q, (const T *)k, (const T *)v, *a,
              pair, vec, cx->flush);
}

int mp_cuda_flash_attention(mp_kctx *cx, mp_dtype dt, void *out, float *lse, const void *q, const void *k,
                            const void *v, const mp_attn_args *a)
{
    const uint64_t *pair;
    if (a->bh <= 0 || a->tq <= 0 ||
        mp_cuda_rng_pair(cx, a->dropout > 0 && a->rng_graph, &pair, "attention (the graph's random state)"))
        return 0;   /* an error is noted: the engine reports it after the op */
    if (dt == MP_F16) {
        if (a->d == 64) flash_fwd<__half, 64>(cx, out, lse, q, k, v, a, pair);
        else flash_fwd<__half, 128>(cx, out, lse, q, k, v, a, pair);
    } else {
        if (a->d == 64) flash_fwd<__nv_bfloat16, 64>(cx, out, lse, q, k, v, a, pair);
        else flash_fwd<__nv_bfloat16, 128>(cx, out, lse, q, k, v, a, pair);
    }
    MP_LAUNCHED("attention");
    return 0;
}

template <class T, int D>
static int flash_bwd(mp_kctx *cx, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                     const void *v, const void *out, const float *lse, const mp_attn_args *a, const uint64_t *pair)
{
    const int64_t rows = a->bh * a->tq;
    float *dvec = (float *)mp_cuda_scratch(cx, sizeof(float) * (size_t)rows);
    if (!dvec) return -1;
    const bool vec = mp_al16(q) && mp_al16(k) && mp_al16(v) && mp_al16(dout);
    if (rows > 0)
        MP_LAUNCH(mp_blocks(rows * 32), MP_THREADS, 0, cx->stream, k_flash_dot<T, D>, dvec, (const T *)dout,
                  (const T *)out, rows);
    if (a->tk > 0) {   /* dK and dV: zeros where no query sees a key (tq 0, causal keys past tq) */
        const size_t shared = dkv_shared<D>();
        MP_CUDA_CHECK(cudaFuncSetAttribute((const void *)k_flash_dkv<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)shared), "attention_grad (shared memory)");
        dim3 grid((unsigned)a->bh, (unsigned)((a->tk + FB - 1) / FB));
        MP_LAUNCH(grid, FT, shared, cx->stream, k_flash_dkv<T, D>, (T *)dk, (T *)dv, (const T *)q, (const T *)k,
                  (const T *)v, (const T *)dout, lse, (const float *)dvec, *a, pair, vec, cx->flush);
    }
    if (a->tq > 0) {   /* dQ: zeros where there are no keys */
        const size_t shared = dq_shared<D>();
        MP_CUDA_CHECK(cudaFuncSetAttribute((const void *)k_flash_dq<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)shared), "attention_grad (shared memory)");
        dim3 grid((unsigned)a->bh, (unsigned)((a->tq + FB - 1) / FB));
        MP_LAUNCH(grid, FT, shared, cx->stream, k_flash_dq<T, D>, (T *)dq, (const T *)q, (const T *)k, (const T *)v,
                  (const T *)dout, lse, (const float *)dvec, *a, pair, vec, cx->flush);
    }
    MP_LAUNCHED("attention_grad");
    return 0;
}

int mp_cuda_flash_attention_grad(mp_kctx *cx, mp_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                                 const void *q, const void *k, const void *v, const void *out, const float *lse,
                                 const mp_attn_args *a)
{
    const uint64_t *pair;
    if (a->bh <= 0 ||
        mp_cuda_rng_pair(cx, a->dropout > 0 && a->rng_graph, &pair, "attention_grad (the graph's random state)"))
        return 0;
    if (dt == MP_F16)
        return a->d == 64 ? flash_bwd<__half, 64>(cx, dq, dk, dv, dout, q, k, v, out, lse, a, pair)
                          : flash_bwd<__half, 128>(cx, dq, dk, dv, dout, q, k, v, out, lse, a, pair);
    return a->d == 64 ? flash_bwd<__nv_bfloat16, 64>(cx, dq, dk, dv, dout, q, k, v, out, lse, a, pair)
                      : flash_bwd<__nv_bfloat16, 128>(cx, dq, dk, dv, dout, q, k, v, out, lse, a, pair);
}
