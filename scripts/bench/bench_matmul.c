/*
 * bench_matmul.c: mp_matmul in f32 and f16 against OpenBLAS sgemm called
 * directly on the same sizes, in one run. f16 pays for widening its inputs and
 * rounding its output around the same sgemm; the ratio shows that cost.
 * Each figure is the best of several repetitions (GFLOP/s = 2 n^3 / time).
 */
#include <cblas.h>
#include <stdio.h>
#include <time.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "scripts/bench/bench_clock.h"

static int reps_for(int64_t n) { return n <= 256 ? 200 : n <= 1024 ? 10 : 4; }

static double bench_engine(mp_dtype dt, int64_t n)
{
    int64_t shape[2] = {n, n};
    mp_tensor *a = mp_randn(dt, MP_CPU, 2, shape), *b = mp_randn(dt, MP_CPU, 2, shape);
    double best = 1e30;
    for (int r = 0; r < reps_for(n) + 1; r++) {
        double t0 = now();
        mp_tensor *c = mp_matmul(a, b);
        double t = now() - t0;
        if (!c) { fprintf(stderr, "matmul: %s\n", mp_error()); return 0; }
        mp_release(c);
        if (r > 0 && t < best) best = t;   /* the first run warms caches and threads */
    }
    mp_release(a);
    mp_release(b);
    return 2.0 * n * n * n / best / 1e9;
}

static double bench_sgemm(int64_t n)
{
    int64_t shape[2] = {n, n};
    mp_tensor *a = mp_randn(MP_F32, MP_CPU, 2, shape), *b = mp_randn(MP_F32, MP_CPU, 2, shape);
    mp_tensor *c = mp_full(MP_F32, MP_CPU, 2, shape, 0);
    double best = 1e30;
    for (int r = 0; r < reps_for(n) + 1; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, mp_data(a), n,
                    mp_data(b), n, 0.0f, mp_data(c), n);
        double t = now() - t0;
        if (r > 0 && t < best) best = t;
    }
    mp_release(a);
    mp_release(b);
    mp_release(c);
    return 2.0 * n * n * n / best / 1e9;
}

int main(void)
{
    int64_t sizes[] = {256, 1024, 2048};
    for (int i = 0; i < 3; i++) {
        int64_t n = sizes[i];
        double ref = bench_sgemm(n), f32 = bench_engine(MP_F32, n), f16 = bench_engine(MP_F16, n);
        printf("matmul n=%-5lld sgemm %7.1f GFLOP/s  f32 %7.1f GFLOP/s (%.2fx)  f16 %7.1f GFLOP/s (%.2fx)\n",
               (long long)n, ref, f32, f32 / ref, f16, f16 / ref);
    }
    return 0;
}
