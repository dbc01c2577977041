/*
 * cpu_scaler.c: the loss scaler on the CPU: the scaled loss, the pass over the
 * gradient arena (unscale in place, look for inf/NaN, take the largest
 * magnitude and, with telemetry on, count what f16 would flush or overflow at
 * the current scale) and the once-per-step state operations, which are the
 * shared rules of kernels/step_rules.h run on host memory. The plain pass is
 * branch-free so that it vectorises; telemetry is a second, slower loop.
 *
 * inf/NaN are counted on the unscaled values (a finite scaled value that 1/scale
 * > 1 pushes past f32's range counts too), amax and the telemetry counts on the
 * finite scaled values: the CUDA backend counts the same way.
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/step_rules.h"

MP_SIMD static void unscale_plain(float *restrict g, int64_t n, float inv, float *amax, int64_t *nonfinite)
{
    float m = 0.0f;
    int64_t bad = 0;
    #pragma omp simd reduction(max:m) reduction(+:bad)
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x), y = x * inv;
        bad += !(fabsf(y) <= 3.4028235e38f);   /* inf or NaN after unscaling */
        float v = a <= 3.4028235e38f ? a : 0.0f;
        m = v > m ? v : m;
        g[i] = y;
    }
    *amax = m;
    *nonfinite = bad;
}

static void unscale_telemetry(float *restrict g, int64_t n, float inv, mp_grad_stats *restrict st)
{
    /* counters in locals (a store to g[i] could otherwise alias st->amax), the
     * exponent from the bits instead of ilogbf: the same bins, subnormals in bin 0 */
    int64_t nan = 0, inf = 0, zeros = 0, under = 0, over = 0;
    int64_t hist[MP_HIST_BINS] = {0};
    float amax = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x), y = x * inv;
        uint32_t u;
        memcpy(&u, &a, sizeof u);
        nan += isnan(y) != 0;   /* glibc: isinf(-inf) is -1 */
        inf += isinf(y) != 0;
        if (u < 0x7f800000u) {
            amax = a > amax ? a : amax;
            zeros += u == 0;
            under += u != 0 && a <= 0x1p-25f;
            over += a >= 65520.0f;
            int e = (int)(u >> 23) - 127 - MP_HIST_LO;
            e = e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e;
            hist[e] += u != 0;
        }
        g[i] = y;
    }
    st->n = n, st->nan = nan, st->inf = inf, st->zeros = zeros, st->underflow = under, st->overflow = over;
    st->amax = amax;
    for (int b = 0; b < MP_HIST_BINS; b++) st->hist[b] = hist[b];
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
    float amax;
    int64_t bad;
    unscale_plain(g, n, inv, &amax, &bad);
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
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t m = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        cpu_load(dt, in, i, buf, m);
        for (int64_t j = 0; j < m; j++) {
            if (check && !isfinite(buf[j])) st->loss_bad = 1;
            buf[j] = buf[j] * scale;
        }
        if (out) cpu_store(dt, out, i, buf, m);
    }
}

void cpu_scale_rule(mp_kctx *cx, mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg, float value)
{
    mp_scale_apply(op, st, p, arg, value);
}

/* ---- counting flushes at the f16/bf16 rounding points ---- */

int cpu_flush_counting;
static int64_t flush_counts[3];

void cpu_count_flush(mp_dtype dt, const float *src, const uint16_t *dst, int64_t n)
{
    int64_t zero = 0, inf = 0;
    for (int64_t j = 0; j < n; j++) {
        uint16_t mag = dst[j] & 0x7fff;
        uint16_t inf_bits = dt == MP_F16 ? 0x7c00 : 0x7f80;
        zero += mag == 0 && src[j] != 0.0f;
        inf += mag == inf_bits && isfinite(src[j]);
    }
    #pragma omp atomic
    flush_counts[0] += n;
    #pragma omp atomic
    flush_counts[1] += zero;
    #pragma omp atomic
    flush_counts[2] += inf;
}

void cpu_flush_counter(mp_kctx *cx, int on, int64_t counts[3])
{
    if (counts) memcpy(counts, flush_counts, sizeof flush_counts);
    if (on) memset(flush_counts, 0, sizeof flush_counts);
    cpu_flush_counting = on;
}
