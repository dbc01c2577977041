/*
 * cpu_batch_norm.c: batch norm over the channels of {n, c, hw}, forward and
 * backward (backend.h). Statistics are f64 sums over the channel's n * hw
 * values in order (mean first, then the squared deviations: two passes, no
 * cancellation), stored as f32; channels run in parallel, each on one thread,
 * so the bits do not depend on the thread count.
 */
#include <math.h>
#include "kernels/cpu/cpu.h"

/* sum of channel ch's values (about mu: of their squared deviations), f64, in order */
static double channel_sum(mp_dtype dt, const void *x, int64_t n, int64_t c, int64_t hw, int64_t ch, int sq, double mu)
{
    float buf[MP_BLOCK];
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < hw; e += MP_BLOCK) {
            int64_t len = hw - e < MP_BLOCK ? hw - e : MP_BLOCK;
            cpu_load(dt, x, (i * c + ch) * hw + e, buf, len);
            if (sq) for (int64_t l = 0; l < len; l++) s += ((double)buf[l] - mu) * ((double)buf[l] - mu);
            else for (int64_t l = 0; l < len; l++) s += buf[l];
        }
    return s;
}

int cpu_batch_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,
                   float *running_var, const void *x, const float *w, const float *b, int64_t n, int64_t c,
                   int64_t hw, int training, float momentum, float eps)
{
    int64_t count = n * hw;
    #pragma omp parallel for if (n * c * hw >= MP_PAR_MIN) schedule(static)
    for (int64_t ch = 0; ch < c; ch++) {
        float buf[MP_BLOCK];
        double mu, var;
        if (training) {
            mu = count ? channel_sum(dt, x, n, c, hw, ch, 0, 0) / (double)count : 0;
            double q = channel_sum(dt, x, n, c, hw, ch, 1, mu);
            var = count ? q / (double)count : 0;
            if (running_mean) running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mu);
            if (running_var && count > 1)
                running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * q / (double)(count - 1));
        } else {
            mu = running_mean[ch], var = running_var[ch];
        }
        float m = (float)mu, r = (float)(1.0 / sqrt(var + (double)eps));
        mean[ch] = m, rstd[ch] = r;
        float scale = w ? w[ch] * r : r, shift = b ? b[ch] : 0.0f;
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < hw; e += MP_BLOCK) {
                int64_t len = hw - e < MP_BLOCK ? hw - e : MP_BLOCK, off = (i * c + ch) * hw + e;
                cpu_load(dt, x, off, buf, len);
                for (int64_t l = 0; l < len; l++) buf[l] = (buf[l] - m) * scale + shift;
                cpu_store(dt, y, off, buf, len);
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
        float gbuf[MP_BLOCK], xbuf[MP_BLOCK];
        float m = mean[ch], r = rstd[ch], wc = w ? w[ch] : 1.0f;
        double sg = 0, sgx = 0;   /* sum gy, sum gy * xhat */
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < hw; e += MP_BLOCK) {
                int64_t len = hw - e < MP_BLOCK ? hw - e : MP_BLOCK, off = (i * c + ch) * hw + e;
                cpu_load(dt, gy, off, gbuf, len);
                cpu_load(dt, x, off, xbuf, len);
                for (int64_t l = 0; l < len; l++) sg += gbuf[l], sgx += (double)gbuf[l] * ((xbuf[l] - m) * r);
            }
        if (gb) gb[ch] = (float)sg;
        if (gw) gw[ch] = (float)sgx;
        if (!gx) continue;
        /* training: gx = w rstd (gy - mean(gy) - xhat mean(gy xhat)); fixed statistics: gx = w rstd gy */
        float k = wc * r, mg = training && count ? (float)(sg / (double)count) : 0.0f;
        float mgx = training && count ? (float)(sgx / (double)count) : 0.0f;
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < hw; e += MP_BLOCK) {
                int64_t len = hw - e < MP_BLOCK ? hw - e : MP_BLOCK, off = (i * c + ch) * hw + e;
                cpu_load(dt, gy, off, gbuf, len);
                cpu_load(dt, x, off, xbuf, len);
                for (int64_t l = 0; l < len; l++) gbuf[l] = k * (gbuf[l] - mg - (xbuf[l] - m) * r * mgx);
                cpu_store(dt, gx, off, gbuf, len);
            }
    }
    return 0;
}
