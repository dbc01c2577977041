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
 * - optim_step: SGD, Adam and AdamW (RMSprop and Adagrad below them, one value per thread) as one fused pass over flat f32 arrays, with
 *   128-bit loads and stores where the arrays are 16-byte aligned, that also
 *   writes the parameters' f16/bf16 working copy for autocast when there is one, element by
 *   element with the float operations of cpu_optim.c in the same order
 *   (PyTorch's single-tensor implementations). Every operation is an explicitly
 *   rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn), so nvcc
 *   cannot contract a multiply and an add into an FMA and --use_fast_math could
 *   not approximate a division or a square root.
 * - unscale: g *= 1/scale in place, with the statistics of cpu_scaler.c
 *   reduced per block (warp shuffles, then shared memory), then added with one
 *   atomic per figure and block into the state's slot in device memory. With
 *   telemetry, one launch over the whole gradient arena that also keeps the
 *   statistics of each parameter (see unscale_tel_kernel): the log2 histogram
 *   goes into per-warp bins in shared memory, not through atomics on a few hot
 *   bins.
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
    /* the kinds these kernels know: any other is a compile error where it is
     * instantiated (mp_cuda_optim_step's switch has no default either) */
    static_assert(KIND == MP_SGD || KIND == MP_ADAM || KIND == MP_ADAMW, "a new optimizer kind needs its update here");
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

/* RMSprop and Adagrad: one value per thread (no 128-bit path: RMSprop's
 * states are optional), the operations of cpu_optim.c in the same order. The
 * third state (a->s3) is a pointer argument of its own, not read from the
 * struct, so that every array the kernel writes is an argument. */
static __device__ __forceinline__ void rmsprop_one(const mp_optim_args &a, float &p, float g, float *sq, float *buf,
                                                   float *ga)
{
    float gi = g;
    if (a.weight_decay != 0.0f) gi = __fadd_rn(gi, __fmul_rn(a.weight_decay, p));
    float s = __fadd_rn(__fmul_rn(*sq, a.alpha), __fmul_rn(__fmul_rn(a.one_minus_alpha, gi), gi));
    *sq = s;
    float avg;
    if (a.centered) {
        float m = __fadd_rn(__fmul_rn(*ga, a.alpha), __fmul_rn(a.one_minus_alpha, gi));
        *ga = m;
        avg = __fsqrt_rn(__fadd_rn(s, __fmul_rn(-m, m)));
    } else {
        avg = __fsqrt_rn(s);
    }
    avg = __fadd_rn(avg, a.eps);
    if (a.momentum > 0.0f) {
        float b = __fadd_rn(__fmul_rn(*buf, a.momentum), __fdiv_rn(gi, avg));
        *buf = b;
        p = __fadd_rn(p, __fmul_rn(-a.lr, b));
    } else {
        p = __fadd_rn(p, __fdiv_rn(__fmul_rn(-a.lr, gi), avg));
    }
}

static __device__ __forceinline__ void adagrad_one(const mp_optim_args &a, float nclr, float &p, float g, float *sum)
{
    float gi = g;
    if (a.weight_decay != 0.0f) gi = __fadd_rn(gi, __fmul_rn(a.weight_decay, p));
    float s = __fadd_rn(*sum, __fmul_rn(gi, gi));
    *sum = s;
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(nclr, gi), __fadd_rn(__fsqrt_rn(s), a.eps)));
}

template <int KIND>   /* MP_RMSPROP, MP_ADAGRAD */
__global__ void optim_kernel_1(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ s1,
                               float *__restrict__ s2, float *__restrict__ s3, int64_t n, mp_optim_args a,
                               const int64_t *step, const int32_t *skip, void *__restrict__ lowp, mp_dtype lowp_dt)
{
    static_assert(KIND == MP_RMSPROP || KIND == MP_ADAGRAD, "a new optimizer kind needs its update here");
    if (skip && *skip) return;
    float nclr = 0;
    if (KIND == MP_ADAGRAD) nclr = -mp_adagrad_clr(&a, *step);
    MP_FOR(i, n) {
        float pp = p[i];
        if (KIND == MP_RMSPROP) rmsprop_one(a, pp, g[i], &s1[i], s2 ? &s2[i] : NULL, s3 ? &s3[i] : NULL);
        else adagrad_one(a, nclr, pp, g[i], &s1[i]);
        p[i] = pp;
        if (lowp) mp_st(lowp_dt, lowp, i, pp);
    }
}

__global__ void optim_count_kernel(int64_t *step, const int32_t *skip)
{
    if (!(skip && *skip)) ++*step;
}

void mp_cuda_optim_count(mp_kctx *cx, int64_t *step, const int32_t *skip)
{
    MP_LAUNCH(1, 1, 0, cx->stream, optim_count_kernel, step, skip);
    MP_LAUNCHED("optim_step");
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

void mp_cuda_optim_step(mp_kctx *cx, mp_optim_kind kind, float *p, const float *g, float *s1, float *s2, int64_t n,
                        const mp_optim_args *a, const int64_t *step, const int32_t *skip, void *lowp,
                        mp_dtype lowp_dt, float *wide)
{
    (void)wide;   /* no gemm_wide here: the engine keeps no widened copy on this backend */
    if (n <= 0) return;
    bool vec = aligned16(p) && aligned16(g) && (!s1 || aligned16(s1)) && (!s2 || aligned16(s2));
    unsigned blocks = mp_blocks(vec ? (n + 3) / 4 : n);
#define STEP(K) \
    MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, optim_kernel<K>, p, g, s1, s2, n, *a, step, skip, vec, lowp, lowp_dt)
    switch (kind) {
    case MP_SGD: STEP(MP_SGD); break;
    case MP_ADAM: STEP(MP_ADAM); break;
    case MP_ADAMW: STEP(MP_ADAMW); break;
    case MP_RMSPROP:
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, optim_kernel_1<MP_RMSPROP>, p, g, s1, s2, a->s3, n, *a, step,
                  skip,
                  lowp, lowp_dt);
        break;
    case MP_ADAGRAD:
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, optim_kernel_1<MP_ADAGRAD>, p, g, s1, s2, a->s3, n, *a, step,
                  skip,
                  lowp, lowp_dt);
        break;
    }
#undef STEP
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

/* unscales one value and counts it; returns its histogram bin with telemetry
 * (-1: zero or not finite, in no bin) */
template <bool TEL>
static __device__ __forceinline__ float unscale_one(float x, float inv, unscale_local &c, int &bin)
{
    unsigned int u = __float_as_uint(x) & 0x7fffffffu;   /* |x| of the scaled value */
    float y = __fmul_rn(x, inv);
    unsigned int v = __float_as_uint(y) & 0x7fffffffu;   /* |y| of the unscaled value */
    c.nan += v > 0x7f800000u;                             /* inf/NaN counted after unscaling */
    c.inf += v == 0x7f800000u;
    bin = -1;
    if (u < 0x7f800000u) {
        c.amax = max(c.amax, u);
        if (TEL) {
            /* compared as bits, so that no flush-to-zero mode can touch a subnormal */
            c.zeros += u == 0;
            c.under += u != 0 && u <= 0x33000000u;   /* |x| <= 2^-25 */
            c.over += u >= 0x477ff000u;              /* |x| >= 65520 */
            if (u != 0) {
                int e = (int)(u >> 23) - 127 - MP_HIST_LO;   /* subnormals: bin 0 */
                bin = e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e;
            }
        }
    }
    return y;
}

/* the counts of a block (MP_THREADS threads, a multiple of 32) into *o: warp
 * sums by shuffles, then one shared slot per warp, then thread 0; every thread
 * of the block must call it (it synchronises). n: the values they stand for. */
static __device__ void block_counts(unscale_local c, int64_t n, mp_grad_stats *o1, mp_grad_stats *o2, bool tel)
{
    __shared__ unscale_local part[MP_THREADS / 32];
    c.nan = warp_sum(c.nan), c.inf = warp_sum(c.inf), c.amax = warp_max(c.amax);
    if (tel) c.zeros = warp_sum(c.zeros), c.under = warp_sum(c.under), c.over = warp_sum(c.over);
    const int w = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) part[w] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        unscale_local t = part[0];
        for (int k = 1; k < (int)blockDim.x / 32; k++) {
            t.nan += part[k].nan, t.inf += part[k].inf, t.amax = max(t.amax, part[k].amax);
            t.zeros += part[k].zeros, t.under += part[k].under, t.over += part[k].over;
        }
        mp_grad_stats *outs[2] = {o1, o2};
        for (int j = 0; j < 2; j++) {
            mp_grad_stats *o = outs[j];
            if (!o) continue;
            add_count(&o->n, (unsigned long long)n);
            add_count(&o->nan, t.nan);
            add_count(&o->inf, t.inf);
            if (tel) {
                add_count(&o->zeros, t.zeros);
                add_count(&o->underflow, t.under);
                add_count(&o->overflow, t.over);
            }
            max_float(&o->amax, t.amax);
        }
    }
    __syncthreads();   /* part[] is free again */
}

/* The plain pass (no telemetry): g *= 1/scale over the arena, four values per
 * load where g is 16-byte aligned; the counts of each block into the slot */
__global__ void unscale_kernel(float *__restrict__ g, int64_t n, mp_scale_state *st, int slot, bool vec)
{
    const float inv = __fdiv_rn(1.0f, st->scale);   /* as the CPU: 1.0f / scale */
    unscale_local c = {0, 0, 0, 0, 0, 0};
    int bin;
    int64_t done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        float4 *g4 = (float4 *)g;
        MP_FOR(i, n4) {
            float4 x = g4[i];
            x.x = unscale_one<false>(x.x, inv, c, bin);
            x.y = unscale_one<false>(x.y, inv, c, bin);
            x.z = unscale_one<false>(x.z, inv, c, bin);
            x.w = unscale_one<false>(x.w, inv, c, bin);
            g4[i] = x;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        g[i] = unscale_one<false>(g[i], inv, c, bin);
    block_counts(c, blockIdx.x == 0 ? n : 0, &st->slot[slot], NULL, false);
}

/* The pass with telemetry, one launch over the whole arena with statistics per
 * parameter. seg[0..nseg] are the parameters' offsets (seg[nseg] = n). Block b
 * takes the run [b*TEL_RUN, (b+1)*TEL_RUN) of the arena and, for each parameter
 * that overlaps it, the overlap: its warps take 32 consecutive values at a time
 * (coalesced), count in registers, and put each value's log2 bin into the warp's
 * own row of shared bins; lanes that share a bin elect one of them, which adds
 * their number (__match_any_sync), so no two lanes write one counter and no
 * atomics touch the bins. At the end of each overlap the block adds its counts
 * and its bins, summed over warps, into the parameter's record and the slot.
 * Launched with MP_THREADS threads per block: the shared arrays are sized for it.
 * (Checked under host emulation against cpu_unscale: 280 cases, bit for bit.) */
#define TEL_RUN ((int64_t)MP_THREADS * 64)

__global__ void unscale_tel_kernel(float *__restrict__ g, int64_t n, mp_scale_state *st, int slot,
                                   mp_grad_stats *__restrict__ tel, const int64_t *__restrict__ seg, int nseg)
{
    __shared__ unsigned int bins[MP_THREADS / 32][MP_HIST_BINS];
    __shared__ int first;
    const int lane = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
    const int64_t lo = (int64_t)blockIdx.x * TEL_RUN, hi = min(lo + TEL_RUN, n);
    for (int b = threadIdx.x; b < MP_THREADS / 32 * MP_HIST_BINS; b += blockDim.x) (&bins[0][0])[b] = 0;
    if (threadIdx.x == 0) {   /* the last parameter starting at or before lo */
        int a = 0, z = nseg - 1;
        while (a < z) {
            int m = (a + z + 1) / 2;
            if (seg[m] <= lo) a = m;
            else z = m - 1;
        }
        first = a;
    }
    __syncthreads();
    const float inv = __fdiv_rn(1.0f, st->scale);
    for (int p = first; p < nseg && seg[p] < hi; p++) {
        const int64_t a = max(seg[p], lo), z = min(seg[p + 1], hi);
        if (a >= z) continue;   /* an empty parameter: the block agrees, no barrier is skipped by some */
        unscale_local c = {0, 0, 0, 0, 0, 0};
        /* a warp takes 4 x 32 consecutive values at a time, loaded first (four
         * coalesced loads in flight), then counted 32 at a time; the warp moves
         * as one: every lane runs the same iterations, lanes past the end idle */
        for (int64_t base = a + (int64_t)w * 128; base < z; base += (int64_t)nw * 128) {
            float x[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t i = base + 32 * k + lane;
                x[k] = i < z ? g[i] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t i = base + 32 * k + lane;
                int bin = -1;
                if (i < z) g[i] = unscale_one<true>(x[k], inv, c, bin);
                const unsigned same = __match_any_sync(0xffffffffu, bin);
                if (bin >= 0 && lane == __ffs(same) - 1) bins[w][bin] += __popc(same);
                __syncwarp();   /* this add is seen by the lane that makes the next one */
            }
        }
        block_counts(c, z - a, &tel[p], &st->slot[slot], true);   /* synchronises: the bins are complete */
        for (int b = threadIdx.x; b < MP_HIST_BINS; b += blockDim.x) {
            unsigned long long t = 0;
            for (int k = 0; k < nw; k++) t += bins[k][b], bins[k][b] = 0;
            if (t) add_count(&tel[p].hist[b], t), add_count(&st->slot[slot].hist[b], t);
        }
        __syncthreads();   /* the bins are zero again before the next parameter */
    }
}

void mp_cuda_unscale(mp_kctx *cx, float *g, int64_t n, mp_scale_state *st, int slot, mp_grad_stats *tel, const int64_t *seg,
                     int nseg)
{
    if (n <= 0) return;
    if (tel) {
        int64_t blocks = (n + TEL_RUN - 1) / TEL_RUN;
        MP_LAUNCH((unsigned)blocks, MP_THREADS, 0, cx->stream, unscale_tel_kernel, g, n, st, slot, tel, seg, nseg);
        MP_LAUNCHED("unscale");
        return;
    }
    bool vec = ((uintptr_t)g & 15) == 0;
    /* a few blocks per SM are plenty for a memory-bound pass, and fewer blocks
     * mean fewer atomics on the state */
    unsigned blocks = mp_blocks(vec ? (n + 3) / 4 : n);
    if (blocks > 1024) blocks = 1024;
    MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, unscale_kernel, g, n, st, slot, vec);
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

void mp_cuda_scale_loss(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t n, mp_scale_state *st, int check)
{
    if (n <= 0) return;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, scale_loss_kernel, dt, out, in, n, st, check,
              out ? cx->flush : NULL);
    MP_LAUNCHED("scale");
}

__global__ void scale_rule_kernel(mp_scale_op op, mp_scale_state *st, mp_policy p, int arg, float value)
{
    mp_scale_apply(op, st, &p, arg, value);
}

void mp_cuda_scale_rule(mp_kctx *cx, mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg, float value)
{
    MP_LAUNCH(1, 1, 0, cx->stream, scale_rule_kernel, op, st, *p, arg, value);
    MP_LAUNCHED("scaler");
}
