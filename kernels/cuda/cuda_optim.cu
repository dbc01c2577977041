/*
 * cuda_optim.cu: the optimizer step and the loss scaler on the device
 * (mp_backend.optim_count, optim_step, scale_loss, unscale, scale_rule).
 *
 * Nothing here returns a value to the host: the scaler's state (the scale, what
 * the step found, the skip decision, the policy counters) and the optimizer's
 * step count live in device memory, the once-per-step rules run on one device
 * thread (kernels/step_rules.h, the same code as the CPU backend), and the
 * optimizer kernels read the skip flag themselves. A training step with a
 * built-in policy therefore never waits for the GPU.
 *
 * - optim_step: SGD, Adam and AdamW as one fused pass over flat f32 arrays, with
 *   128-bit loads and stores where the arrays are 16-byte aligned, that also
 *   writes the parameters' f16/bf16 working copy for autocast when there is one, element by
 *   element with the float operations of cpu_optim.c in the same order
 *   (PyTorch's single-tensor implementations). Every operation is an explicitly
 *   rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn), so nvcc
 *   cannot contract a multiply and an add into an FMA and --use_fast_math could
 *   not approximate a division or a square root.
 * - unscale: g *= 1/scale in place, with the statistics of cpu_scaler.c
 *   accumulated per block in shared memory, then with atomics into the state's
 *   slot (and the telemetry record) in device memory.
 */
#include "kernels/cuda/cuda.h"
#include "kernels/step_rules.h"

/* ---- optimizer ---- */

struct optim_consts {
    float lr, wd, mom, damp, b1, b2, c1, c2, decay, eps, neg_step, bc2;
    int first, nesterov;
};

static __device__ __forceinline__ void sgd_one(const optim_consts &k, float &p, float g, float *buf)
{
    float d = g;
    if (k.wd != 0.0f) d = __fadd_rn(d, __fmul_rn(k.wd, p));
    if (k.mom != 0.0f) {   /* buf: the momentum buffer (unused without momentum) */
        float b = k.first ? d : __fadd_rn(__fmul_rn(*buf, k.mom), __fmul_rn(k.damp, d));
        *buf = b;
        d = k.nesterov ? __fadd_rn(d, __fmul_rn(k.mom, b)) : b;
    }
    p = __fsub_rn(p, __fmul_rn(k.lr, d));
}

template <bool DECOUPLED>
static __device__ __forceinline__ void adam_one(const optim_consts &k, float &p, float g, float &m, float &v)
{
    float pi = p, gi = g;
    if (DECOUPLED) pi = __fmul_rn(pi, k.decay);          /* AdamW: p *= 1 - lr*wd */
    else gi = __fadd_rn(gi, __fmul_rn(k.wd, pi));        /* Adam: L2 term, even when wd == 0 */
    float mi = __fadd_rn(__fmul_rn(m, k.b1), __fmul_rn(k.c1, gi));
    float vi = __fadd_rn(__fmul_rn(v, k.b2), __fmul_rn(__fmul_rn(k.c2, gi), gi));
    m = mi, v = vi;
    float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2), k.eps);
    p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(k.neg_step, mi), den));
}

template <int KIND>   /* MP_SGD, MP_ADAM, MP_ADAMW */
static __device__ __forceinline__ void update_one(const optim_consts &k, float &p, float g, float *s1, float *s2)
{
    if (KIND == MP_SGD) sgd_one(k, p, g, s1);
    else adam_one<KIND == MP_ADAMW>(k, p, g, *s1, *s2);
}

template <int KIND>
__global__ void optim_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ s1,
                             float *__restrict__ s2, int64_t n, mp_optim_args a, const int64_t *step,
                             const int32_t *skip, bool vec, void *__restrict__ lowp, mp_dtype lowp_dt)
{
    if (skip && *skip) return;   /* the scaler found inf/NaN: everything stays as it was */
    __shared__ optim_consts k;
    if (threadIdx.x == 0) {      /* the bias corrections once per block, in double */
        int64_t t = *step;
        float step_size = 0, bc2 = 1;
        if (KIND != MP_SGD) mp_adam_bias(&a, t, &step_size, &bc2);
        k = optim_consts{a.lr, a.weight_decay, a.momentum, a.one_minus_dampening, a.beta1, a.beta2,
                         a.one_minus_beta1, a.one_minus_beta2, a.decay, a.eps, -step_size, bc2,
                         t == 1, a.nesterov};
    }
    __syncthreads();
    const bool state1 = KIND != MP_SGD || k.mom != 0.0f;
    int64_t done = 0;
    if (vec) {   /* all arrays 16-byte aligned: four values per load */
        int64_t n4 = n / 4;
        float4 *p4 = (float4 *)p, *m4 = (float4 *)s1, *v4 = (float4 *)s2;
        const float4 *g4 = (const float4 *)g;
        MP_FOR(i, n4) {
            float4 pp = p4[i], gg = g4[i];
            float4 mm = state1 ? m4[i] : make_float4(0, 0, 0, 0);
            float4 vv = KIND != MP_SGD ? v4[i] : make_float4(0, 0, 0, 0);
            update_one<KIND>(k, pp.x, gg.x, &mm.x, &vv.x);
            update_one<KIND>(k, pp.y, gg.y, &mm.y, &vv.y);
            update_one<KIND>(k, pp.z, gg.z, &mm.z, &vv.z);
            update_one<KIND>(k, pp.w, gg.w, &mm.w, &vv.w);
            p4[i] = pp;
            if (state1) m4[i] = mm;
            if (KIND != MP_SGD) v4[i] = vv;
            if (lowp) {   /* the working copy, rounded once, in the same pass */
                mp_st(lowp_dt, lowp, 4 * i, pp.x);
                mp_st(lowp_dt, lowp, 4 * i + 1, pp.y);
                mp_st(lowp_dt, lowp, 4 * i + 2, pp.z);
                mp_st(lowp_dt, lowp, 4 * i + 3, pp.w);
            }
        }
        done = n4 * 4;
    }
    for (int64_t i = done + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float pp = p[i], mm = state1 ? s1[i] : 0.0f, vv = KIND != MP_SGD ? s2[i] : 0.0f;
        update_one<KIND>(k, pp, g[i], &mm, &vv);
        p[i] = pp;
        if (state1) s1[i] = mm;
        if (KIND != MP_SGD) s2[i] = vv;
        if (lowp) mp_st(lowp_dt, lowp, i, pp);
    }
}

__global__ void optim_count_kernel(int64_t *step, const int32_t *skip)
{
    if (!(skip && *skip)) ++*step;
}

void mp_cuda_optim_count(int64_t *step, const int32_t *skip)
{
    optim_count_kernel<<<1, 1, 0, mp_cuda_stream>>>(step, skip);
    MP_LAUNCHED("optim_step");
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

void mp_cuda_optim_step(mp_optim_kind kind, float *p, const float *g, float *s1, float *s2, int64_t n,
                        const mp_optim_args *a, const int64_t *step, const int32_t *skip, void *lowp,
                        mp_dtype lowp_dt)
{
    if (n <= 0) return;
    bool vec = aligned16(p) && aligned16(g) && (!s1 || aligned16(s1)) && (!s2 || aligned16(s2));
    unsigned blocks = mp_blocks(vec ? (n + 3) / 4 : n);
    switch (kind) {
    case MP_SGD: optim_kernel<MP_SGD><<<blocks, MP_THREADS, 0, mp_cuda_stream>>>(p, g, s1, s2, n, *a, step, skip, vec, lowp, lowp_dt); break;
    case MP_ADAM: optim_kernel<MP_ADAM><<<blocks, MP_THREADS, 0, mp_cuda_stream>>>(p, g, s1, s2, n, *a, step, skip, vec, lowp, lowp_dt); break;
    case MP_ADAMW: optim_kernel<MP_ADAMW><<<blocks, MP_THREADS, 0, mp_cuda_stream>>>(p, g, s1, s2, n, *a, step, skip, vec, lowp, lowp_dt); break;
    }
    MP_LAUNCHED("optim_step");
}

/* ---- unscale ---- */

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

static __device__ __forceinline__ void add_count(int64_t *to, unsigned long long v)
{
    if (v) atomicAdd((unsigned long long *)to, v);
}

/* the largest of non-negative floats, as bits (non-negative floats order as their bits) */
static __device__ __forceinline__ void max_float(float *to, unsigned int bits)
{
    if (bits) atomicMax((unsigned int *)to, bits);
}

/* what one thread has seen */
struct unscale_local {
    unsigned long long nan, inf, zeros, under, over;
    unsigned int amax;
};

template <bool TEL>
static __device__ __forceinline__ float unscale_one(float x, float inv, unscale_local &c, unsigned long long *s_hist)
{
    unsigned int u = __float_as_uint(x) & 0x7fffffffu;   /* |x| of the scaled value */
    float y = __fmul_rn(x, inv);
    unsigned int v = __float_as_uint(y) & 0x7fffffffu;   /* |y| of the unscaled value */
    c.nan += v > 0x7f800000u;                             /* inf/NaN counted after unscaling */
    c.inf += v == 0x7f800000u;
    if (u < 0x7f800000u) {
        c.amax = max(c.amax, u);
        if (TEL) {
            /* compared as bits, so that no flush-to-zero mode can touch a subnormal */
            c.zeros += u == 0;
            c.under += u != 0 && u <= 0x33000000u;   /* |x| <= 2^-25 */
            c.over += u >= 0x477ff000u;              /* |x| >= 65520 */
            if (u != 0) {
                int e = (int)(u >> 23) - 127 - MP_HIST_LO;   /* subnormals: bin 0 */
                e = e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e;
                atomicAdd(&s_hist[e], 1ull);
            }
        }
    }
    return y;
}

/* MP_THREADS (a multiple of 32) threads per block */
template <bool TEL>
__global__ void unscale_kernel(float *__restrict__ g, int64_t n, mp_scale_state *st, int slot,
                               mp_grad_stats *tel, bool vec)
{
    __shared__ unsigned long long s_cnt[5];             /* nan, inf, zeros, under, over */
    __shared__ unsigned int s_amax;
    __shared__ unsigned long long s_hist[TEL ? MP_HIST_BINS : 1];
    if (threadIdx.x < 5) s_cnt[threadIdx.x] = 0;
    if (threadIdx.x == 0) s_amax = 0;
    if (TEL)
        for (int b = threadIdx.x; b < MP_HIST_BINS; b += blockDim.x) s_hist[b] = 0;
    __syncthreads();

    const float inv = __fdiv_rn(1.0f, st->scale);   /* as the CPU: 1.0f / scale */
    unscale_local c = {0, 0, 0, 0, 0, 0};
    int64_t done = 0;
    if (vec) {   /* g 16-byte aligned: four values per load */
        int64_t n4 = n / 4;
        float4 *g4 = (float4 *)g;
        MP_FOR(i, n4) {
            float4 x = g4[i];
            x.x = unscale_one<TEL>(x.x, inv, c, s_hist);
            x.y = unscale_one<TEL>(x.y, inv, c, s_hist);
            x.z = unscale_one<TEL>(x.z, inv, c, s_hist);
            x.w = unscale_one<TEL>(x.w, inv, c, s_hist);
            g4[i] = x;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        g[i] = unscale_one<TEL>(g[i], inv, c, s_hist);

    /* warp partials, then block partials in shared memory */
    c.nan = warp_sum(c.nan), c.inf = warp_sum(c.inf);
    if (TEL) c.zeros = warp_sum(c.zeros), c.under = warp_sum(c.under), c.over = warp_sum(c.over);
    c.amax = warp_max(c.amax);
    if ((threadIdx.x & 31) == 0) {
        if (c.nan) atomicAdd(&s_cnt[0], c.nan);
        if (c.inf) atomicAdd(&s_cnt[1], c.inf);
        if (c.zeros) atomicAdd(&s_cnt[2], c.zeros);
        if (c.under) atomicAdd(&s_cnt[3], c.under);
        if (c.over) atomicAdd(&s_cnt[4], c.over);
        atomicMax(&s_amax, c.amax);
    }
    __syncthreads();

    /* block partials into the state's slot and the telemetry record */
    if (threadIdx.x == 0) {
        mp_grad_stats *outs[2] = {&st->slot[slot], tel};
        for (int j = 0; j < (TEL ? 2 : 1); j++) {
            mp_grad_stats *o = outs[j];
            if (blockIdx.x == 0) add_count(&o->n, (unsigned long long)n);
            add_count(&o->nan, s_cnt[0]);
            add_count(&o->inf, s_cnt[1]);
            add_count(&o->zeros, s_cnt[2]);
            add_count(&o->underflow, s_cnt[3]);
            add_count(&o->overflow, s_cnt[4]);
            max_float(&o->amax, s_amax);
        }
    }
    if (TEL)
        for (int b = threadIdx.x; b < MP_HIST_BINS; b += blockDim.x)
            if (s_hist[b]) {
                add_count(&st->slot[slot].hist[b], s_hist[b]);
                add_count(&tel->hist[b], s_hist[b]);
            }
}

void mp_cuda_unscale(float *g, int64_t n, mp_scale_state *st, int slot, mp_grad_stats *tel)
{
    if (n <= 0) return;
    bool vec = ((uintptr_t)g & 15) == 0;
    /* a few blocks per SM are plenty for a memory-bound pass, and fewer blocks
     * mean fewer atomics on the state */
    unsigned blocks = mp_blocks(vec ? (n + 3) / 4 : n);
    if (blocks > 1024) blocks = 1024;
    if (tel) unscale_kernel<true><<<blocks, MP_THREADS, 0, mp_cuda_stream>>>(g, n, st, slot, tel, vec);
    else unscale_kernel<false><<<blocks, MP_THREADS, 0, mp_cuda_stream>>>(g, n, st, slot, NULL, vec);
    MP_LAUNCHED("unscale");
}

/* ---- the scaled loss and the state rules ---- */

__global__ void scale_loss_kernel(mp_dtype dt, void *out, const void *in, int64_t n, mp_scale_state *st, int check,
                                  unsigned long long *fc)
{
    const float scale = st->scale;
    mp_tally t(fc);   /* the f16/bf16 rounding of out is counted, as the CPU's cpu_store counts it */
    MP_FOR(i, n) {
        float v = mp_ld(dt, in, i);
        if (check && !isfinite(v)) st->loss_bad = 1;   /* every writer writes 1 */
        if (out) mp_stc(dt, out, i, __fmul_rn(v, scale), t);
    }
    t.commit();
}

void mp_cuda_scale_loss(mp_dtype dt, void *out, const void *in, int64_t n, mp_scale_state *st, int check)
{
    if (n <= 0) return;
    scale_loss_kernel<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(dt, out, in, n, st, check, out ? mp_cuda_flush : NULL);
    MP_LAUNCHED("scale");
}

__global__ void scale_rule_kernel(mp_scale_op op, mp_scale_state *st, mp_policy p, int arg, float value)
{
    mp_scale_apply(op, st, &p, arg, value);
}

void mp_cuda_scale_rule(mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg, float value)
{
    scale_rule_kernel<<<1, 1, 0, mp_cuda_stream>>>(op, st, *p, arg, value);
    MP_LAUNCHED("scaler");
}
