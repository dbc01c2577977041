/*
 * cuda_batch_norm.cu: batch norm over the channels of {n, c, hw} (backend.h),
 * as cpu_batch_norm.c: per channel, f64 sums of its n * hw values (a block per
 * channel, a fixed tree: the same bits on every run), the mean first and then
 * the squared deviations; statistics stored as f32, running buffers moved by
 * the first thread of the channel's block; then an elementwise pass.
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

__global__ void k_bn_stats(mp_dtype dt, float *mean, float *rstd, float *rm, float *rv, const void *x, int64_t n,
                           int64_t c, int64_t hw, int training, float momentum, float eps)
{
    __shared__ double sh[MP_THREADS];
    int64_t count = n * hw;
    for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
        double mu, var;
        if (training) {
            double s = 0;
            for (int64_t e = threadIdx.x; e < count; e += blockDim.x) s += mp_ld(dt, x, at(e, ch, c, hw));
            mu = count ? block_sum(s, sh) / (double)count : 0;
            float m = (float)mu;
            double q = 0;
            for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
                double d = mp_ld(dt, x, at(e, ch, c, hw)) - m;
                q += d * d;
            }
            q = block_sum(q, sh);
            var = count ? q / (double)count : 0;
            if (threadIdx.x == 0) {
                if (rm) rm[ch] = (float)((1.0 - momentum) * rm[ch] + momentum * mu);
                if (rv && count > 1) rv[ch] = (float)((1.0 - momentum) * rv[ch] + momentum * q / (double)(count - 1));
            }
        } else {
            mu = rm[ch], var = rv[ch];
        }
        if (threadIdx.x == 0) mean[ch] = (float)mu, rstd[ch] = (float)(1.0 / sqrt(var + (double)eps));
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

/* per channel: sum gy and sum gy (x - mean), f64 */
__global__ void k_bn_grad_sums(mp_dtype dt, double *sums, const void *gy, const void *x, const float *mean, int64_t n,
                               int64_t c, int64_t hw)
{
    __shared__ double sh[MP_THREADS];
    int64_t count = n * hw;
    for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
        float m = mean[ch];
        double sg = 0, sgd = 0;
        for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
            int64_t i = at(e, ch, c, hw);
            float g = mp_ld(dt, gy, i);
            sg += g, sgd += (double)g * (mp_ld(dt, x, i) - m);
        }
        sg = block_sum(sg, sh);
        sgd = block_sum(sgd, sh);
        if (threadIdx.x == 0) sums[2 * ch] = sg, sums[2 * ch + 1] = sgd;
    }
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
    MP_LAUNCH(mp_blocks(c * MP_THREADS), MP_THREADS, 0, cx->stream, k_bn_stats, dt, mean, rstd, running_mean,
              running_var, x, n, c, hw, training, momentum, eps);
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
    double *sums = (double *)mp_cuda_scratch(cx, sizeof(double) * (size_t)(2 * c));
    if (!sums) return -1;
    MP_LAUNCH(mp_blocks(c * MP_THREADS), MP_THREADS, 0, cx->stream, k_bn_grad_sums, dt, sums, gy, x, mean, n, c, hw);
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
