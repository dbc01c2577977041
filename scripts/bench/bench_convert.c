/*
 * bench_convert.c: throughput of the CPU f16/bf16 <-> f32 conversions.
 *
 * Converts N elements (16M by default, or argv[1]) with the F16C path and the
 * portable path, best of REPS runs each, and prints GB/s counting the bytes
 * read plus the bytes written, so a figure can be held against the memory
 * bandwidth of the machine. bf16 has one path and gets one figure.
 *
 *   convert f16->f32  f16c  12.34 GB/s  portable  1.23 GB/s  ratio 10.0x
 *
 * The inputs are ordinary values (normal f16 range, some negatives), the kind
 * a training run converts; the portable path's branches are predictable on
 * them, so this is its good case, not its worst.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/convert.h"
#include "kernels/half.h"
#include "scripts/bench/bench_clock.h"

#define REPS 7

/* A tiny fixed-seed generator, so runs are repeatable. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rand_value(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    /* uniform in (-8, 8): mostly normal f16s of varied exponents */
    return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 16.0 - 8.0);
}

/* One timing loop serves both directions: it is given one of these. */
typedef void (*up_fn)(float *, const uint16_t *, int64_t);
typedef void (*down_fn)(uint16_t *, const float *, int64_t);

typedef struct {
    float *f32;
    uint16_t *h;
    int64_t n;
} buffers;

/* best (shortest) time of REPS runs, after one warm-up run that also touches
 * every output page */
static double best_time(const buffers *b, up_fn up, down_fn down)
{
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now();
        if (up)
            up(b->f32, b->h, b->n);
        else
            down(b->h, b->f32, b->n);
        double t = now() - t0;
        if (r > 0 && t < best)
            best = t;
    }
    return best;
}

/* every conversion reads n elements of one width and writes n of the other */
static double gbps(int64_t n, double secs)
{
    return (double)n * (sizeof(float) + sizeof(uint16_t)) / secs / 1e9;
}

static void row2(const char *name, int64_t n, double t_hw, double t_c)
{
    printf("convert %-9s f16c %6.2f GB/s  portable %5.2f GB/s  ratio %.1fx\n", name,
           gbps(n, t_hw), gbps(n, t_c), t_c / t_hw);
}

static void row1(const char *name, int64_t n, double t)
{
    printf("convert %s  bf16 %6.2f GB/s\n", name, gbps(n, t));
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : (int64_t)1 << 24;
    if (n <= 0) {
        fprintf(stderr, "usage: %s [elements > 0]\n", argv[0]);
        return 2;
    }
    buffers b = {malloc((size_t)n * sizeof(float)), malloc((size_t)n * sizeof(uint16_t)), n};
    if (!b.f32 || !b.h) {
        fprintf(stderr, "bench_convert: out of memory for %lld elements\n", (long long)n);
        return 1;
    }
    for (int64_t i = 0; i < n; i++)
        b.f32[i] = rand_value();
    mp_cpu_f32_to_f16_portable(b.h, b.f32, n);

    int hw = mp_cpu_has_f16c();
    printf("# %lld elements, best of %d, F16C %s\n", (long long)n, REPS,
           hw ? "present" : "absent (the f16c column runs the portable path)");

    /* f16->f32 replaces the f32s by their f16 values, which f32->f16 turns
     * back into the bits h already holds: every run sees the same data */
    up_fn up = hw ? mp_cpu_f16_to_f32_f16c : mp_cpu_f16_to_f32_portable;
    down_fn down = hw ? mp_cpu_f32_to_f16_f16c : mp_cpu_f32_to_f16_portable;
    double up_hw = best_time(&b, up, NULL);
    double up_c = best_time(&b, mp_cpu_f16_to_f32_portable, NULL);
    double dn_hw = best_time(&b, NULL, down);
    double dn_c = best_time(&b, NULL, mp_cpu_f32_to_f16_portable);
    row2("f16->f32", n, up_hw, up_c);
    row2("f32->f16", n, dn_hw, dn_c);

    /* bf16 on the same values; h now holds bf16 bits */
    mp_cpu_f32_to_bf16(b.h, b.f32, n);
    row1("bf16->f32", n, best_time(&b, mp_cpu_bf16_to_f32, NULL));
    row1("f32->bf16", n, best_time(&b, NULL, mp_cpu_f32_to_bf16));

    free(b.f32);
    free(b.h);
    return 0;
}
