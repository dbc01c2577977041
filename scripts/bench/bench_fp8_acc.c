/*
 * bench_fp8_acc.c: the accumulator figure of issue 30 (a figure, not a
 * timing): how much a limited-precision FP8 accumulator loses, by the CPU's
 * modelled accumulator (kernels/cpu/cpu_fp8_gemm.c).
 *
 * C {m, n} = A B^T with K = 4096, A {64, 4096} and B {64, 4096} drawn from
 * N(mu, 1) (Box-Muller, fixed seeds) and quantized to e4m3 with one scale per
 * tensor (FP8_MAX / amax). The reference is the f64 product of the decoded
 * values (codes x scales), exact to f64 rounding; each row prints the
 * relative error ||C - ref||_F / ||ref||_F, the mean over SEEDS draws, for:
 * f32 accumulation; a 14-bit accumulator (14 bits after the leading one)
 * without promotion, rounded to nearest or truncated toward zero; and the
 * same promoted to f32 every 128 products (DeepSeek-V3's remedy). mu = 0 is
 * a mean-zero product (sums grow as sqrt(K)); mu = 1 makes every sum grow
 * as K, which is where a short accumulator stagnates.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "kernels/cpu/cpu_fp8.h"

#define M 64
#define N 64
#define K 4096
#define SEEDS 4

static mp_kctx *cx(void) { return mp_cpu_backend.ctx; }

static void normal(float *x, int64_t n, double mu, unsigned seed)
{
    for (int64_t i = 0; i < n; i++) {
        double u = ((double)rand_r(&seed) + 1) / ((double)RAND_MAX + 2), v = (double)rand_r(&seed) / RAND_MAX;
        x[i] = (float)(mu + sqrt(-2 * log(u)) * cos(2 * M_PI * v));
    }
}

static const struct {
    const char *name;
    int bits;
    int64_t pe;
    mp_fp8_acc_round rnd;
} RUNS[] = {
    {"f32 accumulation", 0, 0, MP_FP8_ACC_NEAREST},
    {"14 bits, no promotion, nearest", 14, 0, MP_FP8_ACC_NEAREST},
    {"14 bits, no promotion, truncate", 14, 0, MP_FP8_ACC_TRUNCATE},
    {"14 bits, promote every 128, nearest", 14, 128, MP_FP8_ACC_NEAREST},
    {"14 bits, promote every 128, truncate", 14, 128, MP_FP8_ACC_TRUNCATE},
};
#define NRUNS (sizeof RUNS / sizeof *RUNS)

/* the mean relative Frobenius error of every run for inputs N(mu, 1) */
static void errors(double mu, double *err)
{
    static float x[M * K], w[N * K], c[M * N];
    static uint8_t qa[M * K], qb[N * K];
    static double ref[M * N];
    for (size_t r = 0; r < NRUNS; r++) err[r] = 0;
    for (unsigned s = 0; s < SEEDS; s++) {
        normal(x, M * K, mu, 100 + 2 * s), normal(w, N * K, mu, 101 + 2 * s);
        float da, db;
        mp_fp8_stats st;
        cpu_fp8_quantize(cx(), MP_F32, x, M, K, MP_FP8_E4M3, MP_FP8_TENSOR, NULL, qa, &da, &st);
        cpu_fp8_quantize(cx(), MP_F32, w, N, K, MP_FP8_E4M3, MP_FP8_TENSOR, NULL, qb, &db, &st);
        mp_fp8_operand a = {qa, MP_FP8_E4M3, MP_FP8_TENSOR, &da}, b = {qb, MP_FP8_E4M3, MP_FP8_TENSOR, &db};
        double rr = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double t = 0;
                for (int64_t q = 0; q < K; q++) t += (double)mp_e4m3_to_f32(qa[i * K + q]) * mp_e4m3_to_f32(qb[j * K + q]);
                ref[i * N + j] = t * da * db, rr += ref[i * N + j] * ref[i * N + j];
            }
        for (size_t r = 0; r < NRUNS; r++) {
            if (cpu_fp8_gemm_round(cx(), M, N, K, &a, &b, RUNS[r].bits, RUNS[r].pe, RUNS[r].rnd, MP_F32, c)) {
                fprintf(stderr, "bench_fp8_acc: %s failed\n", RUNS[r].name);
                exit(1);
            }
            double e = 0;
            for (int64_t i = 0; i < M * N; i++) e += (c[i] - ref[i]) * (c[i] - ref[i]);
            err[r] += sqrt(e / rr) / SEEDS;
        }
    }
}

int main(void)
{
    double e0[NRUNS], e1[NRUNS];
    errors(0.0, e0);
    errors(1.0, e1);
    printf("fp8 accumulator: C = A B^T, A, B {%d, %d} ~ N(mu, 1) as e4m3 with one scale per tensor, relative "
           "Frobenius error vs the f64 product of the decoded values (mean of %d draws):\n", M, K, SEEDS);
    printf("  %-38s %12s %12s\n", "accumulation", "N(0, 1)", "N(1, 1)");
    for (size_t r = 0; r < NRUNS; r++) printf("  %-38s %12.3g %12.3g\n", RUNS[r].name, e0[r], e1[r]);
    return 0;
}
