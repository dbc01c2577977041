/*
 * cpu_nn.c: the row-wise kernels of neural networks: softmax and log-softmax,
 * cross-entropy fused with log-softmax (the probabilities are never stored),
 * and layer norm. All compute in f32 (double for the row sums) and round once.
 */
#include <math.h>
#include <stdlib.h>
#include "kernels/cpu/cpu.h"

/* a strided row of n values {outer, n, inner} at (o, i) into f32 */
static void load_row(mp_dtype dt, const void *x, int64_t o, int64_t i, int64_t n, int64_t inner, float *r)
{
    if (inner == 1) { cpu_load(dt, x, o * n, r, n); return; }
    for (int64_t j = 0; j < n; j++) cpu_load(dt, x, (o * n + j) * inner + i, r + j, 1);
}

static void store_row(mp_dtype dt, void *y, int64_t o, int64_t i, int64_t n, int64_t inner, const float *r)
{
    if (inner == 1) { cpu_store(dt, y, o * n, r, n); return; }
    for (int64_t j = 0; j < n; j++) cpu_store(dt, y, (o * n + j) * inner + i, r + j, 1);
}

/* max and log(sum(exp(x - max))) + max of a row */
static float logsumexp(const float *r, int64_t n)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = r[j] > m ? r[j] : m;
    if (isinf(m)) return m;   /* all -inf (or a +inf): nothing finite to normalise */
    double s = 0;
    for (int64_t j = 0; j < n; j++) s += expf(r[j] - m);
    return m + (float)log(s);
}

void cpu_softmax(mp_dtype dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner, int log)
{
    #pragma omp parallel if (outer * n * inner >= MP_PAR_MIN)
    {
        float *r = malloc(sizeof(float) * (size_t)n);
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < outer * inner; q++) {
            if (!r) continue;
            int64_t o = q / inner, i = q % inner;
            load_row(dt, x, o, i, n, inner, r);
            float lse = logsumexp(r, n);
            for (int64_t j = 0; j < n; j++) r[j] = log ? r[j] - lse : expf(r[j] - lse);
            store_row(dt, y, o, i, n, inner, r);
        }
        free(r);
    }
}

void cpu_softmax_grad(mp_dtype dt, void *gx, const void *gy, const void *y,
                      int64_t outer, int64_t n, int64_t inner, int log)
{
    #pragma omp parallel if (outer * n * inner >= MP_PAR_MIN)
    {
        float *g = malloc(sizeof(float) * (size_t)n * 2), *p = g ? g + n : NULL;
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < outer * inner; q++) {
            if (!g) continue;
            int64_t o = q / inner, i = q % inner;
            load_row(dt, gy, o, i, n, inner, g);
            load_row(dt, y, o, i, n, inner, p);
            double s = 0;
            if (log) {   /* gx = g - softmax * sum(g) */
                for (int64_t j = 0; j < n; j++) s += g[j];
                for (int64_t j = 0; j < n; j++) g[j] = g[j] - expf(p[j]) * (float)s;
            } else {     /* gx = y * (g - sum(g * y)) */
                for (int64_t j = 0; j < n; j++) s += (double)g[j] * p[j];
                for (int64_t j = 0; j < n; j++) g[j] = p[j] * (g[j] - (float)s);
            }
            store_row(dt, gx, o, i, n, inner, g);
        }
        free(g);
    }
}

void cpu_cross_entropy(mp_dtype dt, float *loss, float *lse, const void *x, const int32_t *target,
                       int64_t rows, int64_t classes)
{
    #pragma omp parallel if (rows * classes >= MP_PAR_MIN)
    {
        float *r = malloc(sizeof(float) * (size_t)classes);
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < rows; q++) {
            if (!r) continue;
            cpu_load(dt, x, q * classes, r, classes);
            lse[q] = logsumexp(r, classes);
            loss[q] = lse[q] - r[target[q]];
        }
        free(r);
    }
}

void cpu_cross_entropy_grad(mp_dtype dt, void *gx, const void *x, const float *lse,
                            const int32_t *target, const float *scale, int64_t rows, int64_t classes)
{
    #pragma omp parallel if (rows * classes >= MP_PAR_MIN)
    {
        float *r = malloc(sizeof(float) * (size_t)classes);
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < rows; q++) {
            if (!r) continue;
            cpu_load(dt, x, q * classes, r, classes);
            for (int64_t j = 0; j < classes; j++) r[j] = expf(r[j] - lse[q]) * scale[q];
            r[target[q]] -= scale[q];
            cpu_store(dt, gx, q * classes, r, classes);
        }
        free(r);
    }
}

void cpu_layer_norm(mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                    const void *b, int64_t rows, int64_t n, float eps)
{
    #pragma omp parallel if (rows * n >= MP_PAR_MIN)
    {
        float *r = malloc(sizeof(float) * (size_t)n * 3), *wf = r ? r + n : NULL, *bf = r ? r + 2 * n : NULL;
        if (r) {
            for (int64_t j = 0; j < n; j++) wf[j] = 1.0f, bf[j] = 0.0f;
            if (w) cpu_load(dt, w, 0, wf, n);
            if (b) cpu_load(dt, b, 0, bf, n);
        }
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < rows; q++) {
            if (!r) continue;
            cpu_load(dt, x, q * n, r, n);
            double s = 0, ss = 0;
            for (int64_t j = 0; j < n; j++) s += r[j];
            float m = (float)(s / n);
            for (int64_t j = 0; j < n; j++) ss += (double)(r[j] - m) * (r[j] - m);
            float rs = 1.0f / sqrtf((float)(ss / n) + eps);
            for (int64_t j = 0; j < n; j++) r[j] = (r[j] - m) * rs * wf[j] + bf[j];
            cpu_store(dt, y, q * n, r, n);
            mean[q] = m, rstd[q] = rs;
        }
        free(r);
    }
}

/* gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)); gw = sum g*xhat; gb = sum g */
void cpu_layer_norm_grad(mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                         const float *mean, const float *rstd, const void *w, int64_t rows, int64_t n)
{
    float *wf = malloc(sizeof(float) * (size_t)n * 3), *g = wf ? wf + n : NULL, *xh = wf ? wf + 2 * n : NULL;
    if (!wf) return;
    for (int64_t j = 0; j < n; j++) wf[j] = 1.0f;
    if (w) cpu_load(dt, w, 0, wf, n);
    if (gw) for (int64_t j = 0; j < n; j++) gw[j] = 0;
    if (gb) for (int64_t j = 0; j < n; j++) gb[j] = 0;
    /* rows in order: the weight sums add in a fixed order, so results are reproducible */
    for (int64_t q = 0; q < rows; q++) {
        cpu_load(dt, gy, q * n, g, n);
        cpu_load(dt, x, q * n, xh, n);
        double a = 0, c = 0;
        for (int64_t j = 0; j < n; j++) {
            xh[j] = (xh[j] - mean[q]) * rstd[q];
            if (gw) gw[j] += g[j] * xh[j];
            if (gb) gb[j] += g[j];
            float gwj = g[j] * wf[j];
            a += gwj, c += (double)gwj * xh[j];
        }
        float ma = (float)(a / n), mc = (float)(c / n);
        for (int64_t j = 0; j < n; j++) g[j] = rstd[q] * (g[j] * wf[j] - ma - xh[j] * mc);
        cpu_store(dt, gx, q * n, g, n);
    }
    free(wf);
}
