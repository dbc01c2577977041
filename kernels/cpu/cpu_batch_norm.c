/*
 * cpu_batch_norm.c: batch norm over the channels of {n, c, hw}, forward and
 * backward (backend.h). A channel is n runs of hw values; statistics are f64
 * sums of each run, the runs added in order (the mean first, then the squared
 * deviations: two passes, no cancellation), stored as f32. Channels run in
 * parallel, each on one thread, so the bits do not depend on the thread count.
 * f32 runs are read in place; f16/bf16 ones (a low-precision activation under
 * autocast) are widened exactly, and y and the gradient of x are rounded once.
 * The forward reads x three times (mean, variance, normalise) and the backward
 * x and the gradient twice each. Where the processor has AVX-512BW every pass
 * reads the 16-bit values and widens them in registers (cpu_batch_norm_lowp.c,
 * through cpu_lowp_bn): a channel's 16-bit runs stay in L2 between passes,
 * half the bytes of an f32 copy, and no widening pass runs at all. Elsewhere
 * (or with flush counting on), where a channel has at most BN_WIDE_MAX values
 * it is widened once, whole, into the thread's f32 scratch (cx's slot 3; 512 KB
 * a channel, L2-resident) and every pass reads that; otherwise each pass widens
 * a block at a time again (widening was a fifth of a 1-thread bf16 ResNet step,
 * three quarters of it here). The sums run over the same pieces every way
 * (whole runs for f32, blocks of MP_BLOCK of a run otherwise), so where the
 * widening happens changes no bit (tests/c/test_elementwise_lowp.c compares
 * the three ways, f16 and bf16, on 1 and 2 threads).
 *
 * The sums: BN_LANES = 32 f64 lanes, each lane in order and the lanes added in
 * order at the end (four independent vectors of eight doubles, so the adds do not
 * wait on each other as with lane_sums.h's eight). Any fixed grouping of a sum of
 * k terms in f64 is within (k - 1) 2^-53 sum|t| of the exact sum, far below the
 * f32 rounding of the statistics (2^-24 relative), so the grouping changes a
 * statistic by at most one f32 ulp (and rarely by that); the bits stay the same
 * on every machine, clone and thread count.
 *
 * batch_norm_act is the forward with the block's next passes in its last one:
 * y = relu(bn(x) + z) (z and the ReLU each optional), each piece finished while
 * it is in L1, so the sum and the activation cost no pass of their own over
 * memory. Its bits are those of the three kernels in turn: in f32 the same
 * f32 operations (x a + b, then + z, then x < 0 ? 0 : x, as cpu_unary's ReLU);
 * in f16/bf16 each step rounds into y as the separate kernels' outputs did
 * (batch norm's y, then cpu_add_serial's sum, then the ReLU of the rounded
 * sum, which keeps a -0 that the rounding made as cpu_unary does): in
 * registers where cpu_lowp_bn runs (affine_act), else piece by piece
 * through act_lowp.
 *
 * The backward keeps batch_norm_act's ReLU gradient a pass of its own
 * (cpu_unary_grad, before cpu_batch_norm_grad). Forming it in the first pass
 * instead, in registers (the same bits: mask, store, sum), measured no gain
 * on a bf16 wide ResNet step (1 thread, perf, alternating binaries): that
 * pass's share went from 5.0-5.4% (sums 3.7-3.9% plus the ReLU's 1.3-1.5%)
 * to 5.1-5.5%: most likely the first pass waits on memory at the start of each
 * short strided run and a third stream (y) costs it as much as the separate
 * streaming pass did. Prefetching 2 or 8 KB of runs ahead there (instead of
 * the next run) measured no gain either.
 */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
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

/* a piece of a run from the channel's widened copy (wo: its place there) when
 * there is one, else as piece() gives it */
static inline const float *wpiece(mp_dtype dt, const void *src, const float *wide, int64_t off, int64_t wo,
                                  int64_t len, float *buf)
{
    return wide ? wide + wo : piece(dt, src, off, len, buf);
}

/* for each piece (off, len) of channel ch, in order: its n runs of hw values,
 * whole for f32, in blocks that fit the widening buffers otherwise; wo is the
 * piece's offset within the channel (its place in a widened copy) */
#define PIECE(dt, hw) ((dt) == MP_F32 ? (hw) : MP_BLOCK)
#define FOR_PIECES(dt, n, c, hw, ch, off, len, wo)                                       \
    for (int64_t i_ = 0; i_ < (n); i_++)                                                   \
        for (int64_t e_ = 0, len = 0, off = 0, wo = 0; e_ < (hw); e_ += len)              \
            if ((len = (hw) - e_ < PIECE(dt, hw) ? (hw) - e_ : PIECE(dt, hw)),             \
                (off = (i_ * (c) + (ch)) * (hw) + e_), (wo = i_ * (hw) + e_), 1)

/* The first pass over a channel reads it from memory run by run, each run
 * (hw values) a stride of c hw from the last: a ResNet's runs are 0.1-4 KB,
 * too short for the hardware's stream prefetch to get going before each is
 * over, so that pass waited on memory at each run's start. It asks for the
 * start of the next run's piece before summing this one's (step c hw, total
 * n c hw values): the first KB of an f32 run, enough for the hardware to go
 * on from (the whole run, 4 KB in the wide ResNet's first stage, cost more
 * requests than it saved), the whole piece of a 16-bit run (at most 2 KB,
 * read by cpu_batch_norm_lowp.c's passes). 1-thread wide ResNet steps, perf
 * samples of the first passes and their loops: f32 456 -> 415 and 458 -> 422
 * (two more pairs of runs on a noisier machine: 510 -> 472, 466 -> 459),
 * bf16 805 -> 675. A channel widened into scratch reads its runs in
 * widen_channel, not here, and goes without. */
static inline void fetch_next_run(mp_dtype dt, const void *src, int64_t off, int64_t len, int64_t step, int64_t total)
{
    if (off + step >= total) return;
    size_t es = mp_dtype_size(dt), bytes = (size_t)len * es, ahead = dt == MP_F32 ? 1024 : 4096;
    const char *p = (const char *)src + (size_t)(off + step) * es;
    for (size_t o = 0; o < bytes && o < ahead; o += 64) __builtin_prefetch(p + o);
}

/* A low-precision channel of at most this many values is widened once (the
 * head comment); per thread the scratch holds one channel (forward) or two
 * (backward: x and the gradient) */
#define BN_WIDE_MAX ((int64_t)1 << 17)

static int wide_on = 1;

int cpu_batch_norm_wide_enable(int on)
{
    int was = wide_on;
    wide_on = on;
    return was;
}

/* the per-thread scratch for `arrays` widened channels of count values each, or
 * NULL (f32, a channel too large, no memory, or switched off: the blockwise
 * path); *per: floats per thread */
static float *wide_scratch(mp_kctx *cx, mp_dtype dt, int64_t count, int arrays, int par, int64_t *per)
{
    if (!wide_on || !cx || dt == MP_F32 || count == 0 || count > BN_WIDE_MAX) return NULL;
#ifdef _OPENMP
    int nt = par ? omp_get_max_threads() : 1;
#else
    int nt = 1;
#endif
    *per = (arrays * count + 15) & ~(int64_t)15;   /* each thread's part on its own cache lines */
    return cpu_scratch(cx, 3, sizeof(float) * (size_t)(*per * nt));
}

static inline float *thread_part(float *base, int64_t per)
{
    if (!base) return NULL;
#ifdef _OPENMP
    return base + per * omp_get_thread_num();
#else
    return base;
#endif
}

/* channel ch of src (n runs of hw values) widened into w, run after run */
static void widen_channel(mp_dtype dt, const void *src, float *w, int64_t n, int64_t c, int64_t hw, int64_t ch)
{
    for (int64_t i = 0; i < n; i++) cpu_load(dt, src, (i * c + ch) * hw, w + i * hw, hw);
}

/* y = x a + b over a piece */
MP_SIMD static void affine(float *y, const float *x, int64_t n, float a, float b)
{
    for (int64_t j = 0; j < n; j++) y[j] = x[j] * a + b;
}

/* y = act(x a + b + z) over a piece, f32: the same operations as affine(),
 * cpu_binary's add and cpu_unary's ReLU one after the other */
MP_SIMD static void affine_act(float *y, const float *x, const float *z, int64_t n, float a, float b, int relu)
{
    if (z && relu)
        for (int64_t j = 0; j < n; j++) { float v = x[j] * a + b; v = v + z[j]; y[j] = v < 0.0f ? 0.0f : v; }
    else if (z)
        for (int64_t j = 0; j < n; j++) { float v = x[j] * a + b; y[j] = v + z[j]; }
    else if (relu)
        for (int64_t j = 0; j < n; j++) { float v = x[j] * a + b; y[j] = v < 0.0f ? 0.0f : v; }
    else
        affine(y, x, n, a, b);
}

/* the ReLU of n f16/bf16 values in place, on their bits: a value below 0 (sign
 * set, not -0, not NaN: magnitude bits in (0, inf]) becomes +0, the rest stay,
 * as widening, x < 0 ? 0 : x and the exact rounding back give */
MP_SIMD static void relu16(mp_dtype dt, uint16_t *p, int64_t n)
{
    const uint16_t inf = dt == MP_F16 ? 0x7c00 : 0x7f80;
    for (int64_t j = 0; j < n; j++) {
        uint16_t h = p[j], m = h & 0x7fff;
        p[j] = (h & 0x8000) && m != 0 && m <= inf ? 0 : h;
    }
}

/* f16/bf16: y's piece (batch norm's rounded output) plus z's, rounded, then
 * its ReLU, in place: the separate kernels' roundings (the head comment) */
static void act_lowp(mp_kctx *cx, mp_dtype dt, void *y, const void *z, int64_t off, int64_t len, int relu)
{
    uint16_t *yp = (uint16_t *)y + off;
    if (z) cpu_add_serial(cx, dt, yp, yp, (const uint16_t *)z + off, 1, len);
    if (!relu) return;
    if (!cx || !cx->flush.on) { relu16(dt, yp, len); return; }
    float v[MP_BLOCK];   /* flushes counted: through cpu_store, as cpu_unary's ReLU counts them then */
    for (int64_t e = 0, k; e < len; e += k) {
        k = len - e < MP_BLOCK ? len - e : MP_BLOCK;
        cpu_load(dt, yp, e, v, k);
        for (int64_t j = 0; j < k; j++) v[j] = v[j] < 0.0f ? 0.0f : v[j];
        cpu_store(cx, dt, yp, e, v, k);   /* exact: each value is the rounded one or 0 */
    }
}

/* gx = a g + b + k (x - m) over a piece */
MP_SIMD static void grad_piece(float *gx, const float *g, const float *x, int64_t n, float a, float b, float k, float m)
{
    for (int64_t j = 0; j < n; j++) gx[j] = a * g[j] + b + k * (x[j] - m);
}

/* the forward, y = act(bn(x) + z) (z NULL: none; relu 0: no ReLU) */
static int bn_forward(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,
                      float *running_var, const void *x, const float *w, const float *b, const void *z, int64_t n,
                      int64_t c, int64_t hw, int training, float momentum, float eps, int relu)
{
    int64_t count = n * hw, per = 0;
    int par = n * c * hw >= MP_PAR_MIN;
    const cpu_bn_lowp *lp = dt != MP_F32 ? cpu_lowp_bn(cx, dt) : NULL;   /* the passes widen in registers */
    const uint16_t *x16 = x;
    /* out of training x is read once: nothing to gain from a widened copy */
    float *wbase = training && !lp ? wide_scratch(cx, dt, count, 1, par, &per) : NULL;
    #pragma omp parallel for if (par) schedule(static)
    for (int64_t ch = 0; ch < c; ch++) {
        float buf[MP_BLOCK], out[MP_BLOCK], *wx = thread_part(wbase, per);
        double mu, var;
        if (wx) widen_channel(dt, x, wx, n, c, hw, ch);
        if (training) {
            double s = 0, q = 0;
            FOR_PIECES(dt, n, c, hw, ch, off, len, wo) {
                if (!wx) fetch_next_run(dt, x, off, len, c * hw, n * c * hw);
                s += lp ? lp->sum(x16 + off, len) : bn_sum(wpiece(dt, x, wx, off, wo, len, buf), len);
            }
            mu = count ? s / (double)count : 0;
            FOR_PIECES(dt, n, c, hw, ch, off, len, wo)
                q += lp ? lp->sumsq_dev(x16 + off, len, (float)mu)
                        : bn_sumsq_dev(wpiece(dt, x, wx, off, wo, len, buf), len, (float)mu);
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
        FOR_PIECES(dt, n, c, hw, ch, off, len, wo) {
            if (lp) {
                lp->affine_act((uint16_t *)y + off, x16 + off, z ? (const uint16_t *)z + off : NULL, len, scale,
                               shift, relu);
                continue;
            }
            const float *xp = wpiece(dt, x, wx, off, wo, len, buf);
            if (dt == MP_F32) {
                affine_act((float *)y + off, xp, z ? (const float *)z + off : NULL, len, scale, shift, relu);
                continue;
            }
            affine(out, xp, len, scale, shift), cpu_store(cx, dt, y, off, out, len);
            if (z || relu) act_lowp(cx, dt, y, z, off, len, relu);
        }
    }
    return 0;
}

int cpu_batch_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,
                   float *running_var, const void *x, const float *w, const float *b, int64_t n, int64_t c,
                   int64_t hw, int training, float momentum, float eps)
{
    return bn_forward(cx, dt, y, mean, rstd, running_mean, running_var, x, w, b, NULL, n, c, hw, training, momentum,
                      eps, 0);
}

int cpu_batch_norm_act(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,
                       float *running_var, const void *x, const float *w, const float *b, const void *z, int64_t n,
                       int64_t c, int64_t hw, int training, float momentum, float eps, int relu)
{
    return bn_forward(cx, dt, y, mean, rstd, running_mean, running_var, x, w, b, z, n, c, hw, training, momentum,
                      eps, relu);
}

int cpu_batch_norm_grad(mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                        const float *mean, const float *rstd, const float *w, int64_t n, int64_t c, int64_t hw,
                        int training)
{
    int64_t count = n * hw, per = 0;
    int par = n * c * hw >= MP_PAR_MIN;
    const cpu_bn_lowp *lp = dt != MP_F32 ? cpu_lowp_bn(cx, dt) : NULL;   /* the passes widen in registers */
    const uint16_t *x16 = x, *g16 = gy;
    /* without gx, x and gy are read once: nothing to gain from widened copies */
    float *wbase = gx && !lp ? wide_scratch(cx, dt, count, 2, par, &per) : NULL;
    #pragma omp parallel for if (par) schedule(static)
    for (int64_t ch = 0; ch < c; ch++) {
        float gbuf[MP_BLOCK], xbuf[MP_BLOCK], out[MP_BLOCK];
        float *wg = thread_part(wbase, per), *wx = wg ? wg + count : NULL;
        float m = mean[ch], r = rstd[ch], wc = w ? w[ch] : 1.0f;
        double sg = 0, sgd = 0;   /* sum gy, sum gy (x - mean) */
        if (wg) widen_channel(dt, gy, wg, n, c, hw, ch), widen_channel(dt, x, wx, n, c, hw, ch);
        FOR_PIECES(dt, n, c, hw, ch, off, len, wo) {
            if (!wg) {
                fetch_next_run(dt, gy, off, len, c * hw, n * c * hw);
                fetch_next_run(dt, x, off, len, c * hw, n * c * hw);
            }
            if (lp) {
                lp->sum_dot_dev(g16 + off, x16 + off, len, m, &sg, &sgd);
                continue;
            }
            const float *g = wpiece(dt, gy, wg, off, wo, len, gbuf), *xp = wpiece(dt, x, wx, off, wo, len, xbuf);
            bn_sum_dot_dev(g, xp, len, m, &sg, &sgd);
        }
        double sgx = sgd * r;     /* sum gy x-hat */
        if (gb) gb[ch] = (float)sg;
        if (gw) gw[ch] = (float)sgx;
        if (!gx) continue;
        /* training: gx = w rstd (gy - mean(gy) - x-hat mean(gy x-hat)); fixed statistics: gx = w rstd gy */
        float k = wc * r, mg = training && count ? (float)(sg / (double)count) : 0.0f;
        float mgx = training && count ? (float)(sgx / (double)count) : 0.0f;
        FOR_PIECES(dt, n, c, hw, ch, off, len, wo) {
            if (lp) {
                lp->grad((uint16_t *)gx + off, g16 + off, x16 + off, len, k, -k * mg, -k * r * mgx, m);
                continue;
            }
            const float *g = wpiece(dt, gy, wg, off, wo, len, gbuf), *xp = wpiece(dt, x, wx, off, wo, len, xbuf);
            float *o = dt == MP_F32 ? (float *)gx + off : out;
            grad_piece(o, g, xp, len, k, -k * mg, -k * r * mgx, m);
            if (dt != MP_F32) cpu_store(cx, dt, gx, off, out, len);
        }
    }
    return 0;
}
