/*
 * cuda_attention.cu: scaled dot-product attention without the t x t scores in
 * memory, the numerics of kernels/cpu/cpu_attention.c (f32 compute, an online
 * softmax, each row's log-sum-exp for the backward, Philox dropout at the same
 * counters, causal = keys j <= i). Inside a CUDA graph capture (args
 * rng_graph) the dropout's seed and base offset are the graph's pair, read when
 * the kernels run (cuda.h mp_cuda_rng_pair).
 *
 * f16 and bf16 with head dims 64 and 128 go to the tensor-core kernels of
 * cuda_flash.cu (FlashAttention-2 style, a deterministic backward). The rest
 * (f32, other head dims) stays on this first, simple fused kernel, written for
 * correctness against the CPU (the parity harness), not for speed: one thread
 * per query row, key and value tiles staged in shared memory, the row's
 * accumulator in local memory (head dims up to MAXD). Its backward gives each
 * query row's dq from its own thread and adds its share of dk and dv into f32
 * sums in the context's scratch with atomics (their order, and so the last
 * bits of dk and dv, change run to run), rounded to the dtype at the end.
 */
#include "kernels/cuda/cuda.h"
#include "kernels/philox.h"

#define MAXD 256           /* head dims above this: a device error "attention (head dim above 256)" */
#define ROWS 64            /* query rows (threads) per block */
#define SHARED_FLOATS 8192 /* 32 KiB of shared memory for a key tile and a value tile */

namespace {

__device__ __forceinline__ float keep_factor(const mp_attn_args a, int64_t r, int64_t i, int64_t j)
{
    uint64_t idx = a.offset + ((uint64_t)r * (uint64_t)a.tq + (uint64_t)i) * (uint64_t)a.tk + (uint64_t)j;
    return mp_philox_uniform(a.seed, idx, 24) >= a.dropout ? 1.0f / (1.0f - a.dropout) : 0.0f;
}

/* keys per tile: a key tile and a value tile of kt x d floats fit the shared memory */
__host__ __device__ __forceinline__ int key_tile(int64_t d) { return (int)(SHARED_FLOATS / 2 / d < 64 ? SHARED_FLOATS / 2 / d : 64); }

/* the keys a block's last row sees (causal: up to it) */
__device__ __forceinline__ int64_t keys_seen(const mp_attn_args &a)
{
    int64_t last = (int64_t)blockIdx.y * ROWS + ROWS - 1;
    return a.causal ? (last + 1 < a.tk ? last + 1 : a.tk) : a.tk;
}

/* keys j0 .. j0+nj-1 of head r and their values into shared memory, as f32; the
 * block waits before (the last tile is read no more) and after (this one is in) */
__device__ __forceinline__ void load_tile(mp_dtype dt, const void *k, const void *v, const mp_attn_args &a, int64_t r,
                                          int64_t j0, int64_t nj, float *ks, float *vs)
{
    __syncthreads();
    for (int64_t t = threadIdx.x; t < nj * a.d; t += blockDim.x) {
        ks[t] = mp_ld(dt, k, (r * a.tk + j0) * a.d + t);
        vs[t] = mp_ld(dt, v, (r * a.tk + j0) * a.d + t);
    }
    __syncthreads();
}

__global__ void k_attention(mp_dtype dt, void *out, float *lse, const void *q, const void *k, const void *v,
                            mp_attn_args a, const uint64_t *pair, unsigned long long *fc)
{
    mp_rng_from(pair, a.seed, a.offset);
    MP_DYNAMIC_SHARED(float, sh);
    const int64_t d = a.d, r = blockIdx.x, i = (int64_t)blockIdx.y * ROWS + threadIdx.x;
    const int kt = key_tile(d);
    float *ks = sh, *vs = sh + (int64_t)kt * d;
    const bool row = i < a.tq;
    float qr[MAXD], acc[MAXD], m = -INFINITY, l = 0;
    for (int64_t e = 0; e < d; e++) qr[e] = row ? mp_ld(dt, q, (r * a.tq + i) * d + e) : 0.0f, acc[e] = 0;
    const int64_t jend = keys_seen(a);
    for (int64_t j0 = 0; j0 < jend; j0 += kt) {
        int64_t nj = jend - j0 < kt ? jend - j0 : kt;
        load_tile(dt, k, v, a, r, j0, nj, ks, vs);
        if (!row) continue;
        for (int64_t j = 0; j < nj; j++) {
            if (a.causal && j0 + j > i) break;
            float s = 0;
            for (int64_t e = 0; e < d; e++) s = __fadd_rn(s, __fmul_rn(qr[e], ks[j * d + e]));
            s *= a.scale;
            float mn = s > m ? s : m, c = expf(m - mn), p = expf(s - mn);
            l = l * c + p, m = mn;
            float pd = a.dropout > 0 ? p * keep_factor(a, r, i, j0 + j) : p;
            for (int64_t e = 0; e < d; e++) acc[e] = acc[e] * c + pd * vs[j * d + e];
        }
    }
    mp_tally t(fc);
    if (row) {
        float inv = l > 0 ? 1.0f / l : 0.0f;
        for (int64_t e = 0; e < d; e++) mp_stc(dt, out, (r * a.tq + i) * d + e, acc[e] * inv, t);
        lse[r * a.tq + i] = l > 0 ? m + logf(l) : -INFINITY;
    }
    t.commit();
}

/* dq of each query row (its own thread); dk, dv added into f32 sums dk32, dv32 */
__global__ void k_attention_grad(mp_dtype dt, void *dq, float *dk32, float *dv32, const void *dout, const void *q,
                                 const void *k, const void *v, const void *out, const float *lse, mp_attn_args a,
                                 const uint64_t *pair, unsigned long long *fc)
{
    mp_rng_from(pair, a.seed, a.offset);
    MP_DYNAMIC_SHARED(float, sh);
    const int64_t d = a.d, r = blockIdx.x, i = (int64_t)blockIdx.y * ROWS + threadIdx.x;
    const int kt = key_tile(d);
    float *ks = sh, *vs = sh + (int64_t)kt * d;
    const bool row = i < a.tq;
    float qr[MAXD], g[MAXD], dqr[MAXD], di = 0;
    for (int64_t e = 0; e < d; e++) {
        int64_t at = (r * a.tq + i) * d + e;
        qr[e] = row ? mp_ld(dt, q, at) : 0.0f;
        g[e] = row ? mp_ld(dt, dout, at) : 0.0f;
        di += row ? g[e] * mp_ld(dt, out, at) : 0.0f;
        dqr[e] = 0;
    }
    const float L = row ? lse[r * a.tq + i] : -INFINITY;
    const int64_t jend = keys_seen(a);
    for (int64_t j0 = 0; j0 < jend; j0 += kt) {
        int64_t nj = jend - j0 < kt ? jend - j0 : kt;
        load_tile(dt, k, v, a, r, j0, nj, ks, vs);
        if (!row || L == -INFINITY) continue;
        for (int64_t j = 0; j < nj; j++) {
            if (a.causal && j0 + j > i) break;
            float s = 0, dp = 0;
            for (int64_t e = 0; e < d; e++) {
                s = __fadd_rn(s, __fmul_rn(qr[e], ks[j * d + e]));
                dp = __fadd_rn(dp, __fmul_rn(g[e], vs[j * d + e]));
            }
            float p = expf(s * a.scale - L), kf = a.dropout > 0 ? keep_factor(a, r, i, j0 + j) : 1.0f;
            float ds = p * (dp * kf - di);
            float *dkr = dk32 + (r * a.tk + j0 + j) * d, *dvr = dv32 + (r * a.tk + j0 + j) * d;
            for (int64_t e = 0; e < d; e++) {
                dqr[e] += ds * ks[j * d + e] * a.scale;
                atomicAdd(dkr + e, ds * qr[e] * a.scale);
                atomicAdd(dvr + e, p * kf * g[e]);
            }
        }
    }
    mp_tally t(fc);
    if (row)
        for (int64_t e = 0; e < d; e++) mp_stc(dt, dq, (r * a.tq + i) * d + e, dqr[e], t);
    t.commit();
}

__global__ void k_round(mp_dtype dt, void *dst, const float *src, int64_t n, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) mp_stc(dt, dst, i, src[i], t);
    t.commit();
}

} /* namespace */

int mp_cuda_attention(mp_kctx *cx, mp_dtype dt, void *out, float *lse, const void *q, const void *k, const void *v,
                      const mp_attn_args *a)
{
    if (a->d > MAXD) {   /* reported by the engine after the op, as any device error */
        MP_CUDA_CHECK(cudaErrorInvalidValue, "attention (head dim above 256)");
        return 0;
    }
    if (mp_cuda_flash_takes(dt, a->d)) return mp_cuda_flash_attention(cx, dt, out, lse, q, k, v, a);
    const uint64_t *pair;
    if (a->bh <= 0 || a->tq <= 0 ||
        mp_cuda_rng_pair(cx, a->dropout > 0 && a->rng_graph, &pair, "attention (the graph's random state)"))
        return 0;   /* an error is noted: the engine reports it after the op */
    dim3 grid((unsigned)a->bh, (unsigned)((a->tq + ROWS - 1) / ROWS));
    size_t shared = sizeof(float) * 2 * (size_t)key_tile(a->d) * (size_t)a->d;
    MP_LAUNCH(grid, ROWS, shared, cx->stream, k_attention, dt, out, lse, q, k, v, *a, pair, cx->flush);
    MP_LAUNCHED("attention");
    return 0;
}

int mp_cuda_attention_grad(mp_kctx *cx, mp_dtype dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const void *out, const float *lse, const mp_attn_args *a)
{
    if (a->d > MAXD) {
        MP_CUDA_CHECK(cudaErrorInvalidValue, "attention_grad (head dim above 256)");
        return 0;
    }
    if (mp_cuda_flash_takes(dt, a->d))
        return mp_cuda_flash_attention_grad(cx, dt, dq, dk, dv, dout, q, k, v, out, lse, a);
    const uint64_t *pair;
    if (mp_cuda_rng_pair(cx, a->dropout > 0 && a->rng_graph, &pair, "attention_grad (the graph's random state)"))
        return 0;
    int64_t nk = a->bh * a->tk * a->d;
    float *sums = (float *)mp_cuda_scratch(cx, sizeof(float) * 2 * (size_t)nk);
    if (!sums) return -1;
    MP_CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(float) * 2 * (size_t)nk, cx->stream), "attention_grad");
    if (a->bh > 0 && a->tq > 0) {
        dim3 grid((unsigned)a->bh, (unsigned)((a->tq + ROWS - 1) / ROWS));
        size_t shared = sizeof(float) * 2 * (size_t)key_tile(a->d) * (size_t)a->d;
        MP_LAUNCH_UNORDERED(grid, ROWS, shared, cx->stream, k_attention_grad, dt, dq, sums, sums + nk, dout, q, k, v,
                            out, lse, *a, pair, cx->flush);
        MP_LAUNCHED("attention_grad");
    }
    if (nk > 0) {
        MP_LAUNCH(mp_blocks(nk), MP_THREADS, 0, cx->stream, k_round, dt, dk, sums, nk, cx->flush);
        MP_LAUNCH(mp_blocks(nk), MP_THREADS, 0, cx->stream, k_round, dt, dv, sums + nk, nk, cx->flush);
        MP_LAUNCHED("attention_grad (round)");
    }
    return 0;
}
