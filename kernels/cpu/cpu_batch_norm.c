/*
 * cpu_batch_norm.c: batch norm over the channels of {n, c, hw}, forward and
 * backward (backend.h). A channel is n runs of hw values; statistics are f64
 * sums of each run, the runs added in order (the mean first, then the squared
 * deviations: two passes, no cancellation), stored as f32. Channels run in
 * parallel, each on one thread, so the bits do not depend on the thread count.
 * f32 runs are read in place; f16/bf16 ones (a low-precision activation under
 * autocast) are widened a block at a time, exactly, and y and the gradient of x
 * are rounded once.
 *
 * The sums: BN_LANES = 32 f64 lanes, each lane in order and the lanes added in
 * order at the end (four independent vectors of eight doubles, so the adds do not
 * wait on each other as with lane_sums.h's eight). Any fixed grouping of a sum of
 * k terms in f64 is within (k - 1) 2^-53 sum|t| of the exact sum, far below the
 * f32 rounding of the statistics (2^-24 relative), so the grouping changes a
 * statistic by at most one f32 ulp (and rarely by that); the bits stay the same
 * on every machine, clone and thread count.
 */
#include <math.h>
#include "kernels/cpu/cpu.h"

#define BN_LANES 32

/* sum of r[j] */
MP_SIMD static double bn_sum(const float *r, int64_t n)
{
    double acc[BN_LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + BN_LANES <= n; j += BN_LANES)
        for (int l = 0; l < BN_LANES; l++) acc[l] += r[j + l];
    for (; j < n; j++) acc[j % BN_LANES] += r[j];
    for (int l = 0; l < BN_LANES; l++) s += acc[l];
    return s;
}

/* sum of (r[j] - m)^2, the difference taken in f32 */
MP_SIMD static double bn_sumsq_dev(const float *r, int64_t n, float m)
{
    double acc[BN_LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + BN_LANES <= n; j += BN_LANES)
        for (int l = 0; l < BN_LANES; l++) { double d = r[j + l] - m; acc[l] += d * d; }
    for (; j < n; j++) { double d = r[j] - m; acc[j % BN_LANES] += d * d; }
    for (int l = 0; l < BN_LANES; l++) s += acc[l];
    return s;
}

/* *sg += sum of g[j], *sgd += sum of g[j] (x[j] - m) (the difference in f32): one pass */
MP_SIMD static void bn_sum_dot_dev(const float *g, const float *x, int64_t n, float m, double *sg, double *sgd)
{
    double a[BN_LANES] = {0}, b[BN_LANES] = {0}, s = 0, t = 0;
    int64_t j = 0;
    for (; j + BN_LANES <= n; j += BN_LANES)
        for (int l = 0; l < BN_LANES; l++) a[l] += g[j + l], b[l] += (double)g[j + l] * (x[j + l] - m);
    for (; j < n; j++) a[j % BN_LANES] += g[j], b[j % BN_LANES] += (double)g[j] * (x[j] - m);
    for (int l = 0; l < BN_LANES; l++) s += a[l], t += b[l];
    *sg += s, *sgd += t;
}

/* a piece of a run as f32: in place for f32, else widened into buf */
static inline const float *piece(mp_dtype dt, const void *src, int64_t off, int64_t len, float *buf)
{
    if (dt == MP_F32) return (const float *)src + off;
    cpu_load(dt, src, off, buf, len);
    return buf;
}

/* for each piece (off, len) of channel ch, in order: its n runs of hw values,
 * whole for f32, in blocks that fit the widening buffers otherwise */
#define PIECE(dt, hw) ((dt) == MP_F32 ? (hw) : MP_BLOCK)
#define FOR_PIECES(dt, n, c, hw, ch, off, len)                                           \
    for (int64_t i_ = 0; i_ < (n); i_++)                                                   \
        for (int64_t e_ = 0, len = 0, off = 0; e_ < (hw); e_ += len)                      \
            if ((len = (hw) - e_ < PIECE(dt, hw) ? (hw) - e_ : PIECE(dt, hw)),             \
                (off = (i_ * (c) + (ch)) * (hw) + e_), 1)

/* y = x a + b over a piece */
MP_SIMD static void affine(float *y, const float *x, int64_t n, float a, float b)
{
    for (int64_t j = 0; j < n; j++) y[j] = x[j] * a + b;
}

/* gx = a g + b + k (x - m) over a piece */
MP_SIMD static void grad_piece(float *gx, const float *g, const float *x, int64_t n, float a, float b, float k, float m)
{
    for (int64_t j = 0; j < n; j++) gx[j] = a * g[j] + b + k * (x[j] - m);
}

int cpu_batch_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,
                   float *running_var, const void *x, const float *w, const float *b, int64_t n, int64_t c,
                   int64_t hw, int training, float momentum, float eps)
{
    int64_t count = n * hw;
    #pragma omp parallel for if (n * c * hw >= MP_PAR_MIN) schedule(static)
    for (int64_t ch = 0; ch < c; ch++) {
        float buf[MP_BLOCK], out[MP_BLOCK];
        double mu, var;
        if (training) {
            double s = 0, q = 0;
            FOR_PIECES(dt, n, c, hw, ch, off, len) s += bn_sum(piece(dt, x, off, len, buf), len);
            mu = count ? s / (double)count : 0;
            FOR_PIECES(dt, n, c, hw, ch, off, len) q += bn_sumsq_dev(piece(dt, x, off, len, buf), len, (float)mu);
            var = count ? q / (double)count : 0;
            if (running_mean) running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mu);
            if (running_var && count > 1)
                running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * q / (double)(count - 1));
        } else {
            mu = running_mean[ch], var = running_var[ch];
        }
        float m = (float)mu, r = (float)(1.0 / sqrt(var + (double)eps));
        mean[ch] = m, rstd[ch] = r;
        float scale = w ? w[ch] * r : r, shift = (b ? b[ch] : 0.0f) - m * scale;
        FOR_PIECES(dt, n, c, hw, ch, off, len) {
            const float *xp = piece(dt, x, off, len, buf);
            if (dt == MP_F32) affine((float *)y + off, xp, len, scale, shift);
            else affine(out, xp, len, scale, shift), cpu_store(cx, dt, y, off, out, len);
        }
    }
    return 0;
}

int cpu_batch_norm_grad(mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                        const float *mean, const float *rstd, const float *w, int64_t n, int64_t c, int64_t hw,
                        int training)
{
    int64_t count = n * hw;
    #pragma omp parallel for if (n * c * hw >= MP_PAR_MIN) schedule(static)
    for (int64_t ch = 0; ch < c; ch++) {
        float gbuf[MP_BLOCK], xbuf[MP_BLOCK], out[MP_BLOCK];
        float m = mean[ch], r = rstd[ch], wc = w ? w[ch] : 1.0f;
        double sg = 0, sgd = 0;   /* sum gy, sum gy (x - mean) */
        FOR_PIECES(dt, n, c, hw, ch, off, len) {
            const float *g = piece(dt, gy, off, len, gbuf), *xp = piece(dt, x, off, len, xbuf);
            bn_sum_dot_dev(g, xp, len, m, &sg, &sgd);
        }
        double sgx = sgd * r;     /* sum gy x-hat */
        if (gb) gb[ch] = (float)sg;
        if (gw) gw[ch] = (float)sgx;
        if (!gx) continue;
        /* training: gx = w rstd (gy - mean(gy) - x-hat mean(gy x-hat)); fixed statistics: gx = w rstd gy */
        float k = wc * r, mg = training && count ? (float)(sg / (double)count) : 0.0f;
        float mgx = training && count ? (float)(sgx / (double)count) : 0.0f;
        FOR_PIECES(dt, n, c, hw, ch, off, len) {
            const float *g = piece(dt, gy, off, len, gbuf), *xp = piece(dt, x, off, len, xbuf);
            float *o = dt == MP_F32 ? (float *)gx + off : out;
            grad_piece(o, g, xp, len, k, -k * mg, -k * r * mgx, m);
            if (dt != MP_F32) cpu_store(cx, dt, gx, off, out, len);
        }
    }
    return 0;
}
