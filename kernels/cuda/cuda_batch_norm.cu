/*
 * cuda_batch_norm.cu: batch norm over the channels of {n, c, hw} (backend.h),
 * as cpu_batch_norm.c: per channel, f64 sums of its n * hw values in a fixed
 * order (the same bits on every run), the mean first and then the squared
 * deviations; statistics stored as f32, running buffers moved once per
 * channel; then an elementwise pass.
 *
 * The sums run in two levels: a channel's n * hw values in `parts` ranges of
 * consecutive positions, a block each (a fixed tree within it), then a block
 * per channel adding its parts' sums in order. One block per channel before
 * left a GPU with 32 or 64 blocks for a channel's millions of values: on the
 * H200, the CNN bench's batch norm statistics and gradient sums took 9.3 and
 * 7.6 ms a launch, 78% of its step's GPU time (ncu), the step 0.33x PyTorch's.
 */
#include "kernels/cuda/cuda.h"

/* the sum of every thread's v over the block (a fixed tree; blockDim a power of 2) */
__device__ double block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    double s = sh[0];
    __syncthreads();
    return s;
}

/* element e (0 <= e < n * hw) of channel ch */
__device__ __forceinline__ int64_t at(int64_t e, int64_t ch, int64_t c, int64_t hw) { return (e / hw * c + ch) * hw + e % hw; }

/* how many ranges a channel's count values go in: enough blocks for the
 * whole GPU (PARTS_TOTAL over all channels), each of at least PART_MIN values */
#define PARTS_TOTAL 1024
#define PART_MIN 384
static int64_t parts_of(int64_t c, int64_t count)
{
    int64_t by_len = (count + PART_MIN - 1) / PART_MIN, by_grid = (PARTS_TOTAL + c - 1) / c;
    int64_t p = by_len < by_grid ? by_len : by_grid;
    return p < 1 ? 1 : p;
}

/* block b of c * parts (channel b / parts, range b % parts): what = 0, the sum
 * of x; 1, the sum of (x - m)^2 with m the channel's f32 mean; 2, the sums of
 * gy and of gy (x - m). Written to part[b] (and part[c * parts + b] for 2). */
__global__ void k_bn_part(int what, mp_dtype dt, double *part, const void *x, const void *gy, const float *mean,
                          int64_t c, int64_t hw, int64_t count, int64_t parts)
{
    __shared__ double sh[MP_THREADS];
    int64_t len = (count + parts - 1) / parts;
    for (int64_t b = blockIdx.x; b < c * parts; b += gridDim.x) {
        int64_t ch = b / parts, lo = b % parts * len, hi = lo + len < count ? lo + len : count;
        float m = what ? mean[ch] : 0.0f;
        double s = 0, t = 0;
        for (int64_t e = lo + threadIdx.x; e < hi; e += blockDim.x) {
            int64_t i = at(e, ch, c, hw);
            if (what == 0) s += mp_ld(dt, x, i);
            else if (what == 1) {
                double d = mp_ld(dt, x, i) - m;
                s += d * d;
            } else {
                float g = mp_ld(dt, gy, i);
                s += g, t += (double)g * (mp_ld(dt, x, i) - m);
            }
        }
        s = block_sum(s, sh);
        if (what == 2) t = block_sum(t, sh);
        if (threadIdx.x == 0) {
            part[b] = s;
            if (what == 2) part[c * parts + b] = t;
        }
    }
}

/* channel ch's parts added in order (thread 0: parts is at most PARTS_TOTAL) */
__device__ double parts_sum(const double *part, int64_t ch, int64_t parts)
{
    double s = 0;
    for (int64_t p = 0; p < parts; p++) s += part[ch * parts + p];
    return s;
}

/* training, after k_bn_part 0: mean (f32, for k_bn_part 1) and its f64 in mu */
__global__ void k_bn_mean(float *mean, double *mu, const double *part, int64_t c, int64_t count, int64_t parts)
{
    MP_FOR(ch, c) {
        double m = count ? parts_sum(part, ch, parts) / (double)count : 0;
        mu[ch] = m, mean[ch] = (float)m;
    }
}

/* after k_bn_part 1 (training) or from the running buffers: rstd, and the
 * running buffers moved */
__global__ void k_bn_finish(float *mean, float *rstd, float *rm, float *rv, const double *mu, const double *part,
                            int64_t c, int64_t count, int64_t parts, int training, float momentum, float eps)
{
    MP_FOR(ch, c) {
        double var;
        if (training) {
            double q = parts_sum(part, ch, parts);
            var = count ? q / (double)count : 0;
            if (rm) rm[ch] = (float)((1.0 - momentum) * rm[ch] + momentum * mu[ch]);
            if (rv && count > 1) rv[ch] = (float)((1.0 - momentum) * rv[ch] + momentum * q / (double)(count - 1));
        } else {
            mean[ch] = rm[ch], var = rv[ch];
        }
        rstd[ch] = (float)(1.0 / sqrt(var + (double)eps));
    }
}

__global__ void k_bn_apply(mp_dtype dt, void *y, const void *x, const float *mean, const float *rstd, const float *w,
                           const float *b, int64_t total, int64_t c, int64_t hw, unsigned long long *fc)
{
    mp_tally tl(fc);
    MP_FOR(i, total) {
        int64_t ch = i / hw % c;
        float scale = w ? w[ch] * rstd[ch] : rstd[ch], shift = (b ? b[ch] : 0.0f) - mean[ch] * scale;
        mp_stc(dt, y, i, mp_ld(dt, x, i) * scale + shift, tl);
    }
    tl.commit();
}

/* per channel: sum gy and sum gy (x - mean), f64, from k_bn_part 2's parts */
__global__ void k_bn_grad_sums(double *sums, const double *part, int64_t c, int64_t parts)
{
    MP_FOR(ch, c) sums[2 * ch] = parts_sum(part, ch, parts), sums[2 * ch + 1] = parts_sum(part + c * parts, ch, parts);
}

__global__ void k_bn_wb(float *gw, float *gb, const double *sums, const float *rstd, int64_t c)
{
    MP_FOR(ch, c) {
        if (gb) gb[ch] = (float)sums[2 * ch];
        if (gw) gw[ch] = (float)(sums[2 * ch + 1] * rstd[ch]);
    }
}

/* training: gx = w rstd (gy - mean(gy) - x-hat mean(gy x-hat)); fixed statistics: gx = w rstd gy */
__global__ void k_bn_gx(mp_dtype dt, void *gx, const void *gy, const void *x, const double *sums, const float *mean,
                        const float *rstd, const float *w, int64_t total, int64_t c, int64_t hw, int64_t count,
                        int training, unsigned long long *fc)
{
    mp_tally tl(fc);
    MP_FOR(i, total) {
        int64_t ch = i / hw % c;
        float m = mean[ch], r = rstd[ch], k = (w ? w[ch] : 1.0f) * r;
        float mg = training && count ? (float)(sums[2 * ch] / (double)count) : 0.0f;
        float mgx = training && count ? (float)(sums[2 * ch + 1] * r / (double)count) : 0.0f;
        mp_stc(dt, gx, i, k * mp_ld(dt, gy, i) + -k * mg + -k * r * mgx * (mp_ld(dt, x, i) - m), tl);
    }
    tl.commit();
}

int mp_cuda_batch_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,
                       float *running_var, const void *x, const float *w, const float *b, int64_t n, int64_t c,
                       int64_t hw, int training, float momentum, float eps)
{
    if (c == 0) return 0;
    int64_t count = n * hw, parts = parts_of(c, count);
    double *part = NULL, *mu = NULL;
    if (training) {
        part = (double *)mp_cuda_scratch(cx, sizeof(double) * (size_t)(c * parts + c));
        if (!part) return -1;
        mu = part + c * parts;
        MP_LAUNCH(mp_blocks(c * parts * MP_THREADS), MP_THREADS, 0, cx->stream, k_bn_part, 0, dt, part, x,
                  (const void *)NULL, (const float *)NULL, c, hw, count, parts);
        MP_LAUNCHED("batch_norm sums");
        MP_LAUNCH(mp_blocks(c), MP_THREADS, 0, cx->stream, k_bn_mean, mean, mu, part, c, count, parts);
        MP_LAUNCHED("batch_norm mean");
        MP_LAUNCH(mp_blocks(c * parts * MP_THREADS), MP_THREADS, 0, cx->stream, k_bn_part, 1, dt, part, x,
                  (const void *)NULL, (const float *)mean, c, hw, count, parts);
        MP_LAUNCHED("batch_norm squared deviations");
    }
    MP_LAUNCH(mp_blocks(c), MP_THREADS, 0, cx->stream, k_bn_finish, mean, rstd, running_mean, running_var,
              (const double *)mu, (const double *)part, c, count, parts, training, momentum, eps);
    MP_LAUNCHED("batch_norm statistics");
    int64_t total = n * c * hw;
    if (total) {
        MP_LAUNCH(mp_blocks(total), MP_THREADS, 0, cx->stream, k_bn_apply, dt, y, x, mean, rstd, w, b, total, c, hw,
                  cx->flush);
        MP_LAUNCHED("batch_norm");
    }
    return 0;
}

int mp_cuda_batch_norm_grad(mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                            const float *mean, const float *rstd, const float *w, int64_t n, int64_t c, int64_t hw,
                            int training)
{
    if (c == 0) return 0;
    int64_t count = n * hw, parts = parts_of(c, count);
    double *sums = (double *)mp_cuda_scratch(cx, sizeof(double) * (size_t)(2 * c + 2 * c * parts));
    if (!sums) return -1;
    double *part = sums + 2 * c;
    MP_LAUNCH(mp_blocks(c * parts * MP_THREADS), MP_THREADS, 0, cx->stream, k_bn_part, 2, dt, part, x, gy, mean, c,
              hw, count, parts);
    MP_LAUNCHED("batch_norm_grad partial sums");
    MP_LAUNCH(mp_blocks(c), MP_THREADS, 0, cx->stream, k_bn_grad_sums, sums, part, c, parts);
    MP_LAUNCHED("batch_norm_grad sums");
    if (gw || gb) {
        MP_LAUNCH(mp_blocks(c), MP_THREADS, 0, cx->stream, k_bn_wb, gw, gb, sums, rstd, c);
        MP_LAUNCHED("batch_norm_grad weight and bias");
    }
    int64_t total = n * c * hw;
    if (gx && total) {
        MP_LAUNCH(mp_blocks(total), MP_THREADS, 0, cx->stream, k_bn_gx, dt, gx, gy, x, sums, mean, rstd, w, total, c,
                  hw, n * hw, training, cx->flush);
        MP_LAUNCHED("batch_norm_grad");
    }
    return 0;
}
