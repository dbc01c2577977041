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
    #pragma omp simd reduction(max:m) reduction(+:bad)
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x);
        int fin = a <= 3.4028235e38f;          /* not inf or NaN */
        bad += !fin;
        float v = fin ? a : 0.0f;
        m = v > m ? v : m;
        g[i] = x * inv;
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
    float amax = st->amax;
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], a = fabsf(x);
        uint32_t u;
        memcpy(&u, &a, sizeof u);
        if (u >= 0x7f800000u) {
            if (u > 0x7f800000u) nan++; else inf++;
        } else {
            amax = a > amax ? a : amax;
            zeros += u == 0;
            under += u != 0 && a <= 0x1p-25f;
            over += a >= 65520.0f;
            int e = (int)(u >> 23) - 127 - MP_HIST_LO;
            e = e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e;
            hist[e] += u != 0;
        }
        g[i] = x * inv;
    }
    st->nan += nan, st->inf += inf, st->zeros += zeros, st->underflow += under, st->overflow += over;
    st->amax = amax;
    for (int b = 0; b < MP_HIST_BINS; b++) st->hist[b] += hist[b];
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
