/*
 * cpu_scaler.c: the loss scaler on the CPU: the scaled loss, the pass over the
 * gradient arena (unscale in place, look for inf/NaN, take the largest
 * magnitude and, with telemetry on, count what f16 would flush or overflow at
 * the current scale) and the once-per-step state operations, which are the
 * shared rules of kernels/step_rules.h run on host memory. The plain pass is
 * branch-free so that it vectorises; so is telemetry's counting (below).
 *
 * inf/NaN are counted on the unscaled values (a finite scaled value that 1/scale
 * > 1 pushes past f32's range counts too), amax and the telemetry counts on the
 * finite scaled values: the CUDA backend counts the same way.
 *
 * The plain pass splits a long arena over the threads in pieces: each value is
 * unscaled on its own, and the pieces' maxima and counts are combined by max
 * and sum, so the result is the same bits on any thread count.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/step_rules.h"

/* n is a piece (at most UNSCALE_PIECE): the count fits 32-bit lanes, which
 * keep it in the float lanes' registers (a 64-bit count widened every mask
 * into two registers: a third of the loop's instructions) */
MP_SIMD static void unscale_plain(float *restrict g, int n, float inv, float *amax, int *nonfinite)
{
    float m = 0.0f;
    int bad = 0;
    #pragma omp simd reduction(max:m) reduction(+:bad)
    for (int i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x), y = x * inv;
        bad += !(fabsf(y) <= 3.4028235e38f);   /* inf or NaN after unscaling */
        float v = a <= 3.4028235e38f ? a : 0.0f;
        m = v > m ? v : m;
        g[i] = y;
    }
    *amax = m;
    *nonfinite = bad;
}

/* Telemetry, vectorised: a piece of TEL_PIECE values at a time, one SIMD pass
 * unscales and counts (branch-free, reductions over lanes) and writes each
 * value's histogram bin as a byte; then the bytes are counted into 8 private
 * histograms (consecutive values in different copies, so runs of one exponent,
 * the common case, do not wait on each other's increments) and summed. Counts
 * are integers and amax a maximum: the result is the same whatever the pieces
 * and threads. The bins come from the exponent bits (ilogbf's bins, subnormals
 * in bin 0); non-finite and zero values go to a sink bin that is not counted. */
#define TEL_PIECE 4096
#define UNSCALE_PIECE 16384   /* the plain pass's pieces, split over threads past MP_PAR_MIN_MEM */
#define SINK MP_HIST_BINS

/* each value's histogram bin, from the exponent bits of |x| (ilogbf's bins,
 * subnormals in bin 0); zero and non-finite values to the sink */
MP_SIMD static void tel_bins(const float *restrict g, int n, uint8_t *restrict bin)
{
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &g[i], sizeof u);
        u &= 0x7fffffffu;
        int e = (int)(u >> 23) - 127 - MP_HIST_LO;
        e = e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e;
        bin[i] = (uint8_t)(u != 0 && u < 0x7f800000u ? e : SINK);
    }
}

/* unscale a piece and count (32-bit lanes throughout: a piece is short) */
MP_SIMD static void tel_counts(float *restrict g, int n, float inv, int64_t c[5], float *amax)
{
    int nan = 0, inf = 0, zeros = 0, under = 0, over = 0;
    float m = 0.0f;
    #pragma omp simd reduction(+:nan, inf, zeros, under, over) reduction(max:m)
    for (int i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x), y = x * inv, ay = fabsf(y);
        int fin = a <= 3.4028235e38f;
        nan += y != y;
        inf += ay == INFINITY;
        zeros += a == 0.0f;
        under += (a != 0.0f) & (a <= 0x1p-25f);
        over += fin & (a >= 65520.0f);
        m = fin && a > m ? a : m;
        g[i] = y;
    }
    c[0] += nan, c[1] += inf, c[2] += zeros, c[3] += under, c[4] += over;
    if (m > *amax) *amax = m;
}

/* values [lo, hi) of g into st (added to what it holds) */
static void tel_range(float *g, int64_t lo, int64_t hi, float inv, mp_grad_stats *st)
{
    uint8_t bin[TEL_PIECE];
    int64_t c[5] = {0}, h[8][SINK + 1];
    memset(h, 0, sizeof h);
    float amax = 0.0f;
    for (int64_t i = lo; i < hi; i += TEL_PIECE) {
        int64_t len = hi - i < TEL_PIECE ? hi - i : TEL_PIECE, j = 0;
        tel_bins(g + i, (int)len, bin);
        tel_counts(g + i, (int)len, inv, c, &amax);
        for (; j + 8 <= len; j += 8)
            for (int l = 0; l < 8; l++) h[l][bin[j + l]]++;
        for (; j < len; j++) h[0][bin[j]]++;
    }
    st->n += hi - lo, st->nan += c[0], st->inf += c[1], st->zeros += c[2], st->underflow += c[3], st->overflow += c[4];
    if (amax > st->amax) st->amax = amax;
    for (int b = 0; b < MP_HIST_BINS; b++)
        for (int l = 0; l < 8; l++) st->hist[b] += h[l][b];
}

/* one parameter's run: long ones split over the threads, each into its own
 * stats, added at the end (integers and a maximum: any order gives the same) */
static void unscale_telemetry(float *restrict g, int64_t n, float inv, mp_grad_stats *restrict st)
{
    memset(st, 0, sizeof *st);
    if (n < 4 * TEL_PIECE || omp_get_max_threads() == 1) {
        tel_range(g, 0, n, inv, st);
        return;
    }
    #pragma omp parallel
    {
        mp_grad_stats mine;
        memset(&mine, 0, sizeof mine);
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t pieces = (n + TEL_PIECE - 1) / TEL_PIECE, p0 = pieces * t / nt, p1 = pieces * (t + 1) / nt;
        int64_t hi = p1 * TEL_PIECE < n ? p1 * TEL_PIECE : n;
        if (p0 * TEL_PIECE < hi) tel_range(g, p0 * TEL_PIECE, hi, inv, &mine);
        #pragma omp critical(mp_telemetry)
        mp_grad_stats_add(st, &mine);
    }
    st->n = n;
}

void cpu_unscale(mp_kctx *cx, float *g, int64_t n, mp_scale_state *st, int slot, mp_grad_stats *tel, const int64_t *seg, int nseg)
{
    mp_grad_stats *acc = &st->slot[slot];
    float inv = 1.0f / st->scale;
    if (tel) {   /* parameter by parameter */
        for (int i = 0; i < nseg; i++) {
            mp_grad_stats mine;
            unscale_telemetry(g + seg[i], seg[i + 1] - seg[i], inv, &mine);
            mp_grad_stats_add(&tel[i], &mine);
            mp_grad_stats_add(acc, &mine);
        }
        return;
    }
    float amax = 0.0f;
    int64_t bad = 0;
    #pragma omp parallel for if (n >= MP_PAR_MIN_MEM) schedule(static) reduction(max:amax) reduction(+:bad)
    for (int64_t i = 0; i < n; i += UNSCALE_PIECE) {
        float m;
        int b;
        unscale_plain(g + i, (int)(n - i < UNSCALE_PIECE ? n - i : UNSCALE_PIECE), inv, &m, &b);
        amax = m > amax ? m : amax;
        bad += b;
    }
    acc->n += n;
    if (amax > acc->amax) acc->amax = amax;
    if (bad) {   /* rare: tell NaN from inf, for the skip reason */
        for (int64_t i = 0; i < n; i++) {
            float x = g[i];
            if (isnan(x)) acc->nan++;
            else if (isinf(x)) acc->inf++;
        }
    }
}

void cpu_scale_loss(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t n, mp_scale_state *st, int check)
{
    float buf[MP_BLOCK];
    const float scale = st->scale;
    if (dt == MP_F64) {   /* in double: an f64 loss keeps its bits through the scale */
        for (int64_t i = 0; i < n; i++) {
            double v = ((const double *)in)[i];
            if (check && !isfinite(v)) st->loss_bad = 1;
            if (out) ((double *)out)[i] = v * scale;
        }
        return;
    }
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t m = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        cpu_load(dt, in, i, buf, m);
        for (int64_t j = 0; j < m; j++) {
            if (check && !isfinite(buf[j])) st->loss_bad = 1;
            buf[j] = buf[j] * scale;
        }
        if (out) cpu_store(cx, dt, out, i, buf, m);
    }
}

void cpu_scale_rule(mp_kctx *cx, mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg, float value)
{
    mp_scale_apply(op, st, p, arg, value);
}

