/*
 * bench_scaler.c: the loss scaler's pass over a gradient arena (the CPU
 * backend's unscale: g *= 1/scale, inf/NaN count, amax, and with telemetry the
 * per-value statistics) against memcpy of the same bytes, in one run, called
 * directly: no Lua, no optimizer. bench_amp.lua measures the same pass through
 * scaler:unscale(opt) on the MLP's real gradients.
 *
 * N f32 values (535818 by default, the Fashion-MNIST MLP's arena; or argv[1]).
 * GB/s counts the bytes read plus the bytes written (8 per value for both the
 * pass and the copy). Each figure is the median of REPS runs after a warm-up,
 * run in blocks of BLOCK back to back (the arena hot in the caches, as it is
 * right after the backward wrote it); the variants' blocks alternate so that a
 * noisy neighbour slows them alike.
 * The pass alternates scales 65536 and 1/65536 (factors 1/65536 and 65536), so the values stay the
 * same from run to run (both are exact) and never drift into subnormals.
 *
 *   scaler pass (535818 f32, 4.3 MB r+w, kernel only)  plain 11.08 GB/s (0.387 ms)  telemetry ...  memcpy 97.52 GB/s (0.044 ms)  plain/memcpy 0.11x (target >= 0.5x)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "scripts/bench/bench_clock.h"

#define REPS 300
#define BLOCK 50

/* gradient-like values: a spread of magnitudes (2^-30 .. 2^2, times the
 * scale 65536), both signs, one in eight exactly zero (ReLU) */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float grad_value(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    if ((rng & 7) == 0) return 0.0f;
    double mant = 1.0 + (double)((rng >> 11) & 0xfffff) / (double)(1 << 20);
    int e = (int)((rng >> 40) % 33) - 30;
    double v = mant * (double)(1ull << 16);
    v = e >= 0 ? v * (double)(1 << e) : v / (double)(1ull << -e);
    return (float)((rng >> 63) ? -v : v);
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 535818;
    float *g = malloc(sizeof *g * (size_t)n), *src = malloc(sizeof *src * (size_t)n),
          *dst = malloc(sizeof *dst * (size_t)n);
    mp_scale_state *st = calloc(1, sizeof *st);   /* the scaler's state, as the kernel reads it */
    mp_grad_stats *tel = malloc(sizeof *tel);
    if (!g || !src || !dst || !st || !tel) {
        fprintf(stderr, "bench_scaler: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n; i++) src[i] = g[i] = grad_value();
    memset(dst, 0, sizeof *dst * (size_t)n);

    const mp_backend *be = &mp_cpu_backend;
    int64_t seg[2] = {0, n};   /* telemetry: the whole array as one parameter */
    static double tp[REPS], tt[REPS], tc[REPS];
    st->scale = 65536.0f;
    /* each variant runs BLOCK times back to back (hot, like a pass over an arena
     * that the backward just wrote), and the blocks alternate */
    for (int r0 = -BLOCK; r0 < REPS; r0 += BLOCK) {
        for (int r = r0; r < r0 + BLOCK && r < REPS; r++) {
            double t0 = now();
            memset(&st->slot[0], 0, sizeof st->slot[0]);
            be->unscale(be->ctx, g, n, st, 0, NULL, NULL, 0);
            double t1 = now();
            st->scale = st->scale > 1.0f ? 1.0f / 65536.0f : 65536.0f;
            if (r >= 0) tp[r] = t1 - t0;
        }
        for (int r = r0; r < r0 + BLOCK && r < REPS; r++) {
            double t0 = now();
            memset(&st->slot[0], 0, sizeof st->slot[0]);
            memset(tel, 0, sizeof *tel);
            be->unscale(be->ctx, g, n, st, 0, tel, seg, 1);
            double t1 = now();
            st->scale = st->scale > 1.0f ? 1.0f / 65536.0f : 65536.0f;
            if (r >= 0) tt[r] = t1 - t0;
        }
        for (int r = r0; r < r0 + BLOCK && r < REPS; r++) {
            double t0 = now();
            memcpy(dst, src, sizeof *dst * (size_t)n);
            double t1 = now();
            if (r >= 0) tc[r] = t1 - t0;
        }
    }
    /* keep the results live */
    volatile float sink = dst[n / 2] + g[n / 3];
    (void)sink;
    double p = median(tp, REPS), t = median(tt, REPS), c = median(tc, REPS);
    double bytes = 8.0 * (double)n;
    printf("scaler pass (%lld f32, %.1f MB r+w, kernel only)  plain %.2f GB/s (%.3f ms)  telemetry %.2f GB/s (%.3f ms)"
           "  memcpy %.2f GB/s (%.3f ms)  plain/memcpy %.2fx (target >= 0.5x)\n",
           (long long)n, bytes / 1e6, bytes / p / 1e9, p * 1e3, bytes / t / 1e9, t * 1e3, bytes / c / 1e9, c * 1e3,
           c / p);
    free(g), free(src), free(dst), free(st), free(tel);
    return 0;
}
