/*
 * cpu_scaler.c: the loss scaler's pass over the gradient arena: unscale in
 * place, look for inf/NaN, take the largest magnitude and, with telemetry on,
 * count what f16 would flush or overflow at the current scale. The plain pass
 * is branch-free so that it vectorises; telemetry is a second, slower loop.
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/cpu.h"

MP_SIMD static void unscale_plain(float *restrict g, int64_t n, float inv, float *amax, int64_t *nonfinite)
{
    float m = 0.0f;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x);
        bad += !(a <= 3.4028235e38f);          /* inf or NaN */
        m = a > m && a <= 3.4028235e38f ? a : m;
        g[i] = x * inv;
    }
    *amax = m;
    *nonfinite = bad;
}

static void unscale_telemetry(float *g, int64_t n, float inv, mp_grad_stats *st)
{
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x);
        if (isnan(x)) st->nan++;
        else if (isinf(x)) st->inf++;
        else {
            if (a > st->amax) st->amax = a;
            if (a == 0.0f) st->zeros++;
            else {
                if (a <= 0x1p-25f) st->underflow++;
                if (a >= 65520.0f) st->overflow++;
                int e = ilogbf(a) - MP_HIST_LO;
                st->hist[e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e]++;
            }
        }
        g[i] = x * inv;
    }
}

void cpu_unscale(float *g, int64_t n, float inv_scale, int telemetry, mp_grad_stats *st)
{
    st->n += n;
    if (telemetry) { unscale_telemetry(g, n, inv_scale, st); return; }
    float amax;
    int64_t bad;
    unscale_plain(g, n, inv_scale, &amax, &bad);
    if (amax > st->amax) st->amax = amax;
    if (bad) {   /* rare: tell NaN from inf, for the skip reason */
        for (int64_t i = 0; i < n; i++) {
            float x = g[i];
            if (isnan(x)) st->nan++;
            else if (isinf(x)) st->inf++;
        }
    }
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

void cpu_flush_counter(int on, int64_t counts[3])
{
    if (counts) memcpy(counts, flush_counts, sizeof flush_counts);
    if (on) memset(flush_counts, 0, sizeof flush_counts);
    cpu_flush_counting = on;
}
