/*
 * cuda_optim.cu: the optimizer step and the loss scaler's unscale pass
 * (mp_backend.optim_step and .unscale) on the device.
 *
 * - optim_step: SGD, Adam and AdamW as one fused grid-stride pass over flat f32
 *   arrays, element by element with the float operations of cpu_optim.c in the
 *   same order (PyTorch's single-tensor implementations). Every operation is an
 *   explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn),
 *   so nvcc cannot contract a multiply and an add into an FMA and flags such
 *   as --use_fast_math cannot approximate a division or a square root (only
 *   -ftz=true would still flush subnormals).
 * - unscale: g *= inv_scale in place, with the statistics of cpu_scaler.c
 *   accumulated on the device (per block in shared memory, then atomics into a
 *   small persistent device struct), copied back and added into the caller's
 *   host mp_grad_stats.
 */
#include <string.h>
#include "kernels/cuda/cuda.h"

/* ---- optimizer ---- */

__global__ void optim_kernel(mp_optim_kind kind, float *__restrict__ p, const float *__restrict__ g,
                             float *__restrict__ s1, float *__restrict__ s2, int64_t n, mp_optim_args a)
{
    if (kind == MP_SGD) {
        const float lr = a.lr, wd = a.weight_decay, mom = a.momentum, damp = a.one_minus_dampening;
        const int first = a.first, nesterov = a.nesterov;
        MP_FOR(i, n) {
            float pi = p[i], d = g[i];
            if (wd != 0.0f) d = __fadd_rn(d, __fmul_rn(wd, pi));
            if (mom != 0.0f) {   /* s1 is the momentum buffer (unused, maybe NULL, without momentum) */
                float b = first ? d : __fadd_rn(__fmul_rn(s1[i], mom), __fmul_rn(damp, d));
                s1[i] = b;
                d = nesterov ? __fadd_rn(d, __fmul_rn(mom, b)) : b;
            }
            p[i] = __fsub_rn(pi, __fmul_rn(lr, d));
        }
        return;
    }
    const float b1 = a.beta1, b2 = a.beta2, c1 = a.one_minus_beta1, c2 = a.one_minus_beta2;
    const float wd = a.weight_decay, decay = a.decay;
    const float bc2 = a.bc2_sqrt, eps = a.eps, step = -a.step_size;
    const bool decoupled = kind == MP_ADAMW;
    MP_FOR(i, n) {
        float gi = g[i], pi = p[i];
        if (decoupled) pi = __fmul_rn(pi, decay);          /* AdamW: p *= 1 - lr*wd */
        else gi = __fadd_rn(gi, __fmul_rn(wd, pi));        /* Adam: L2 term, even when wd == 0 */
        float mi = __fadd_rn(__fmul_rn(s1[i], b1), __fmul_rn(c1, gi));
        float vi = __fadd_rn(__fmul_rn(s2[i], b2), __fmul_rn(__fmul_rn(c2, gi), gi));
        s1[i] = mi, s2[i] = vi;
        float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2), eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(step, mi), den));
    }
}

void mp_cuda_optim_step(mp_optim_kind kind, float *p, const float *g, float *s1, float *s2, int64_t n,
                        const mp_optim_args *a)
{
    if (n <= 0) return;
    optim_kernel<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(kind, p, g, s1, s2, n, *a);
    MP_LAUNCHED("optim_step");
}

/* ---- unscale ---- */

/* What the kernel accumulates. Without telemetry, nan and inf count the values
 * after unscaling and `bad` the non-finite values before it (the CPU's plain
 * pass counts NaN/inf only when it saw a non-finite scaled value); with
 * telemetry, nan and inf count the scaled values, as the CPU's telemetry pass. */
struct unscale_stats {
    unsigned long long nan, inf, zeros, under, over, bad;
    unsigned int amax;                 /* bits of the largest finite |x|, a non-negative float */
    unsigned long long hist[MP_HIST_BINS];
};

static __device__ __forceinline__ unsigned long long warp_sum(unsigned long long v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ unsigned int warp_max(unsigned int v)
{
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

/* MP_THREADS (a multiple of 32) threads per block */
template <bool TEL>
__global__ void unscale_kernel(float *__restrict__ g, int64_t n, float inv, unscale_stats *__restrict__ out)
{
    __shared__ unsigned long long s_cnt[6];             /* nan, inf, zeros, under, over, bad */
    __shared__ unsigned int s_amax;
    __shared__ unsigned long long s_hist[TEL ? MP_HIST_BINS : 1];
    if (threadIdx.x < 6) s_cnt[threadIdx.x] = 0;
    if (threadIdx.x == 0) s_amax = 0;
    if (TEL)
        for (int b = threadIdx.x; b < MP_HIST_BINS; b += blockDim.x) s_hist[b] = 0;
    __syncthreads();

    unsigned long long nan = 0, inf = 0, zeros = 0, under = 0, over = 0, bad = 0;
    unsigned int amax = 0;   /* the bits of +0.0f */
    MP_FOR(i, n) {
        float x = g[i];
        unsigned int u = __float_as_uint(x) & 0x7fffffffu;   /* |x| */
        float y = __fmul_rn(x, inv);
        g[i] = y;
        if (u >= 0x7f800000u) {                              /* inf or NaN */
            if (TEL) {
                if (u > 0x7f800000u) nan++; else inf++;
            } else {
                bad++;
            }
        } else {
            amax = max(amax, u);   /* non-negative floats order as their bits */
            if (TEL) {
                /* compared as bits (non-negative floats order as their bits), so
                 * that no flush-to-zero mode can touch a subnormal */
                zeros += u == 0;
                under += u != 0 && u <= 0x33000000u;   /* |x| <= 2^-25 */
                over += u >= 0x477ff000u;              /* |x| >= 65520 */
                if (u != 0) {
                    int e = (int)(u >> 23) - 127 - MP_HIST_LO;   /* subnormals: bin 0 */
                    e = e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e;
                    atomicAdd(&s_hist[e], 1ull);
                }
            }
        }
        if (!TEL) {   /* the unscaled value, counted by the host only when bad != 0 */
            unsigned int v = __float_as_uint(y) & 0x7fffffffu;
            nan += v > 0x7f800000u;
            inf += v == 0x7f800000u;
        }
    }

    /* warp partials, then block partials in shared memory */
    nan = warp_sum(nan), inf = warp_sum(inf), bad = warp_sum(bad);
    if (TEL) zeros = warp_sum(zeros), under = warp_sum(under), over = warp_sum(over);
    amax = warp_max(amax);
    if ((threadIdx.x & 31) == 0) {
        if (nan) atomicAdd(&s_cnt[0], nan);
        if (inf) atomicAdd(&s_cnt[1], inf);
        if (zeros) atomicAdd(&s_cnt[2], zeros);
        if (under) atomicAdd(&s_cnt[3], under);
        if (over) atomicAdd(&s_cnt[4], over);
        if (bad) atomicAdd(&s_cnt[5], bad);
        atomicMax(&s_amax, amax);
    }
    __syncthreads();

    /* block partials into the device struct */
    if (threadIdx.x == 0) {
        if (s_cnt[0]) atomicAdd(&out->nan, s_cnt[0]);
        if (s_cnt[1]) atomicAdd(&out->inf, s_cnt[1]);
        if (s_cnt[2]) atomicAdd(&out->zeros, s_cnt[2]);
        if (s_cnt[3]) atomicAdd(&out->under, s_cnt[3]);
        if (s_cnt[4]) atomicAdd(&out->over, s_cnt[4]);
        if (s_cnt[5]) atomicAdd(&out->bad, s_cnt[5]);
        if (s_amax) atomicMax(&out->amax, s_amax);
    }
    if (TEL)
        for (int b = threadIdx.x; b < MP_HIST_BINS; b += blockDim.x)
            if (s_hist[b]) atomicAdd(&out->hist[b], s_hist[b]);
}

static unscale_stats *d_stats;   /* persistent device struct, allocated on first use */

void mp_cuda_unscale(float *g, int64_t n, float inv_scale, int telemetry, mp_grad_stats *st)
{
    st->n += n;
    if (n <= 0) return;
    if (!d_stats) {
        cudaError_t e = cudaMalloc(&d_stats, sizeof *d_stats);
        if (e != cudaSuccess) {
            d_stats = NULL;
            mp_cuda_note(e, "unscale: cudaMalloc");
            return;
        }
    }
    cudaError_t e = cudaMemsetAsync(d_stats, 0, sizeof *d_stats, mp_cuda_stream);
    if (e != cudaSuccess) { mp_cuda_note(e, "unscale: cudaMemsetAsync"); return; }

    /* a few blocks per SM are plenty for a memory-bound pass, and fewer blocks
     * mean fewer atomics on the device struct */
    unsigned blocks = mp_blocks(n);
    if (blocks > 1024) blocks = 1024;
    if (telemetry) unscale_kernel<true><<<blocks, MP_THREADS, 0, mp_cuda_stream>>>(g, n, inv_scale, d_stats);
    else unscale_kernel<false><<<blocks, MP_THREADS, 0, mp_cuda_stream>>>(g, n, inv_scale, d_stats);
    MP_LAUNCHED("unscale");

    /* KNOWN SYNC: the statistics come back to the host here, and the stream
     * waits for them. A later change will remove this (keeping the statistics on
     * the device until the engine needs them). */
    unscale_stats h;
    e = cudaMemcpyAsync(&h, d_stats, sizeof h, cudaMemcpyDeviceToHost, mp_cuda_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(mp_cuda_stream);
    if (e != cudaSuccess) { mp_cuda_note(e, "unscale: statistics to host"); return; }

    float amax;
    memcpy(&amax, &h.amax, sizeof amax);
    if (amax > st->amax) st->amax = amax;
    if (telemetry) {
        st->nan += (int64_t)h.nan, st->inf += (int64_t)h.inf;
        st->zeros += (int64_t)h.zeros, st->underflow += (int64_t)h.under, st->overflow += (int64_t)h.over;
        for (int b = 0; b < MP_HIST_BINS; b++) st->hist[b] += (int64_t)h.hist[b];
    } else if (h.bad) {   /* as cpu_unscale: NaN/inf of the unscaled values, once any scaled one was */
        st->nan += (int64_t)h.nan, st->inf += (int64_t)h.inf;
    }
}
