/*
 * bench_fp8.c: the CPU FP8 GEMM (kernels/cpu/cpu_fp8_gemm.c: codes decoded to
 * bf16, oneDNN's bf16 GEMM with f32 results, scales applied per chunk) against
 * the bf16 GEMM of the same shape on bf16 operands already in memory, and the
 * quantizer's throughput; then the accumulator experiment of issue 30: K =
 * 4096, inputs quantized to e4m3 with one scale each, C against the f64
 * product of the decoded values (relative Frobenius error) for f32
 * accumulation, a 14-bit accumulator without promotion and the same promoted
 * to f32 every 128 products. The quantizer's own rows come first (GB/s of
 * f32 / bf16 input per granularity); `bench_fp8 quantize` prints only those. Each time is the median of several runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu_fp8.h"
#include "scripts/bench/bench_clock.h"

static mp_kctx *cx(void) { return mp_cpu_backend.ctx; }

/* n standard normal values (+ mean) */
static float *normal(int64_t n, double mean, unsigned seed)
{
    float *x = malloc(sizeof *x * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        double u = ((double)rand_r(&seed) + 1) / ((double)RAND_MAX + 2), v = (double)rand_r(&seed) / RAND_MAX;
        x[i] = (float)(mean + sqrt(-2 * log(u)) * cos(2 * M_PI * v));
    }
    return x;
}

typedef struct {
    uint8_t *q;
    float *d;
    mp_fp8_operand op;
} quantized;

static quantized quantize(const float *x, int64_t rows, int64_t k, mp_fp8_gran g)
{
    quantized r = {malloc((size_t)(rows * k)), malloc(sizeof(float) * (size_t)mp_fp8_nscales(g, rows, k)), {0}};
    mp_fp8_stats st;
    cpu_fp8_quantize(cx(), MP_F32, x, rows, k, MP_FP8_E4M3, g, NULL, r.q, r.d, &st);
    r.op = (mp_fp8_operand){r.q, MP_FP8_E4M3, g, r.d};
    return r;
}

#define REPS 7

static void bench_shape(int64_t m, int64_t n, int64_t k)
{
    float *x = normal(m * k, 0, 1), *w = normal(n * k, 0, 2), *c = malloc(sizeof(float) * (size_t)(m * n));
    uint16_t *xb = malloc(2 * (size_t)(m * k)), *wb = malloc(2 * (size_t)(n * k));
    for (int64_t i = 0; i < m * k; i++) xb[i] = mp_f32_to_bf16(x[i]);
    for (int64_t i = 0; i < n * k; i++) wb[i] = mp_f32_to_bf16(w[i]);
    quantized a = quantize(x, m, k, MP_FP8_TENSOR), b = quantize(w, n, k, MP_FP8_TENSOR);
    quantized at = quantize(x, m, k, MP_FP8_TILE), bt = quantize(w, n, k, MP_FP8_BLOCK);
    double t[4][REPS];
    for (int r = 0; r < REPS + 1; r++) {   /* run 0 warms caches, threads and oneDNN's plans */
        double t0 = now();
        cpu_gemm_dnnl_f32out(cx(), 0, 1, 1, m, n, k, 1.0f, xb, 0, wb, 0, 0.0f, c, m * n);
        double t1 = now();
        cpu_fp8_gemm(cx(), m, n, k, &a.op, &b.op, 0, 0, MP_F32, c);
        double t2 = now();
        cpu_fp8_gemm(cx(), m, n, k, &at.op, &bt.op, 0, 0, MP_F32, c);
        double t3 = now();
        quantized q = quantize(x, m, k, MP_FP8_TILE);
        double t4 = now();
        free(q.q), free(q.d);
        if (r) t[0][r - 1] = t1 - t0, t[1][r - 1] = t2 - t1, t[2][r - 1] = t3 - t2, t[3][r - 1] = t4 - t3;
    }
    double fl = 2.0 * m * n * k, bf = median(t[0], REPS), f8 = median(t[1], REPS), f8t = median(t[2], REPS);
    printf("fp8 gemm %lldx%lldx%lld: bf16 %.1f GFLOP/s | e4m3 tensor scales %.1f GFLOP/s (%.2fx) | "
           "1x128 x 128x128 scales %.1f GFLOP/s (%.2fx) | quantize 1x128 %.2f GB/s of f32\n",
           (long long)m, (long long)n, (long long)k, fl / bf / 1e9, fl / f8 / 1e9, bf / f8, fl / f8t / 1e9,
           bf / f8t, 4.0 * m * k / median(t[3], REPS) / 1e9);
    free(x), free(w), free(c), free(xb), free(wb);
    free(a.q), free(a.d), free(b.q), free(b.d), free(at.q), free(at.d), free(bt.q), free(bt.d);
}

/* the quantizer alone (kernels/cpu/cpu_fp8_quant.c), e4m3, on a {rows, k}
 * input of dtype dt: GB/s of input read per granularity (the tensor
 * granularity without a scale reads it twice, once for the amax) */
static void bench_quantize(mp_dtype dt, int64_t rows, int64_t k, int reps)
{
    static const struct { const char *name; mp_fp8_gran g; } G[] = {
        {"tensor", MP_FP8_TENSOR}, {"1x128", MP_FP8_TILE}, {"128x128", MP_FP8_BLOCK}, {"mx32", MP_FP8_MX}};
    int64_t n = rows * k;
    float *x = normal(n, 0, 5);
    size_t es = dt == MP_F32 ? 4 : 2;
    void *in = x;
    if (dt != MP_F32) {
        uint16_t *h = malloc(2 * (size_t)n);
        for (int64_t i = 0; i < n; i++) h[i] = dt == MP_BF16 ? mp_f32_to_bf16(x[i]) : mp_f32_to_f16(x[i]);
        in = h;
    }
    uint8_t *q = malloc((size_t)n);
    float *d = malloc(sizeof(float) * (size_t)mp_fp8_nscales(MP_FP8_TILE, rows, k));
    printf("quantize %s %lldx%lld -> e4m3:", dt == MP_F32 ? "f32" : dt == MP_BF16 ? "bf16" : "f16", (long long)rows,
           (long long)k);
    for (int gi = 0; gi < 4; gi++) {
        double t[REPS];
        mp_fp8_stats st;
        for (int r = 0; r < REPS + 1; r++) {
            double t0 = now();
            for (int i = 0; i < reps; i++)
                cpu_fp8_quantize(cx(), dt, in, rows, k, MP_FP8_E4M3, G[gi].g, NULL, q, d, &st);
            if (r) t[r - 1] = (now() - t0) / reps;
        }
        printf(" %s %.2f GB/s%s", G[gi].name, (double)es * n / median(t, REPS) / 1e9, gi < 3 ? " |" : "\n");
    }
    if (in != x) free(in);
    free(x), free(q), free(d);
}

/* relative Frobenius error of C against the f64 product of the decoded
 * values, and the largest elementwise relative error (DeepSeek-V3 quotes a
 * maximum relative error; near-zero elements of a mean-zero product make it
 * far larger than the norm's) */
static double rel_err(const float *c, const double *ref, int64_t n, double *max_rel)
{
    double e = 0, s = 0;
    *max_rel = 0;
    for (int64_t i = 0; i < n; i++) {
        e += (c[i] - ref[i]) * (c[i] - ref[i]), s += ref[i] * ref[i];
        if (ref[i] != 0 && fabs(c[i] - ref[i]) / fabs(ref[i]) > *max_rel) *max_rel = fabs(c[i] - ref[i]) / fabs(ref[i]);
    }
    return sqrt(e / s);
}

static void accumulator(double mean)
{
    int64_t m = 128, n = 128, k = 4096;
    float *x = normal(m * k, mean, 3), *w = normal(n * k, mean, 4), *c = malloc(sizeof(float) * (size_t)(m * n));
    double *ref = malloc(sizeof(double) * (size_t)(m * n));
    quantized a = quantize(x, m, k, MP_FP8_TENSOR), b = quantize(w, n, k, MP_FP8_TENSOR);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t q = 0; q < k; q++) s += (double)mp_e4m3_to_f32(a.q[i * k + q]) * mp_e4m3_to_f32(b.q[j * k + q]);
            ref[i * n + j] = s * a.d[0] * b.d[0];
        }
    struct { const char *name; int bits; int64_t pe; } runs[] = {
        {"f32 accumulation", 0, 0}, {"14 bits, no promotion", 14, 0}, {"14 bits, promoted every 128", 14, 128}};
    printf("accumulator K=%lld, %lldx%lld, N(%g, 1) inputs as e4m3 with a per-tensor scale, relative error vs "
           "the f64 product (Frobenius / largest elementwise):\n", (long long)k, (long long)m, (long long)n, mean);
    for (int r = 0; r < 3; r++) {
        double mx, t0 = now();
        cpu_fp8_gemm(cx(), m, n, k, &a.op, &b.op, runs[r].bits, runs[r].pe, MP_F32, c);
        double t = now() - t0, fro = rel_err(c, ref, m * n, &mx);
        printf("  %-28s %.3g / %.3g  (%.0f ms)\n", runs[r].name, fro, mx, 1e3 * t);
    }
    free(x), free(w), free(c), free(ref), free(a.q), free(a.d), free(b.q), free(b.d);
}

int main(int argc, char **argv)
{
    /* "quantize [ROWS]": the quantizer's rows only, ROWS x 4096 (default 1024;
     * fewer for valgrind's instruction counts) */
    int only_quantize = argc > 1 && !strcmp(argv[1], "quantize");
    int64_t rows = only_quantize && argc > 2 ? atoll(argv[2]) : 1024;
    if (rows < 1) rows = 1024;
    bench_quantize(MP_F32, rows, 4096, only_quantize ? 1 : 5);
    bench_quantize(MP_BF16, rows, 4096, only_quantize ? 1 : 5);
    if (only_quantize) return 0;
    bench_shape(1024, 1024, 1024);
    bench_shape(1024, 1024, 4096);
    accumulator(0.0);
    accumulator(1.0);
    return 0;
}
