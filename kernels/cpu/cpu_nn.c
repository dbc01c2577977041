/*
 * cpu_nn.c: the row-wise kernels of neural networks: softmax and log-softmax,
 * cross-entropy fused with log-softmax (the probabilities are never stored),
 * and layer norm (RMS norm too: layer norm without centring). All compute in
 * f32 (double for the row sums) and round once; f64 goes to cpu_f64.c, in double.
 * Each thread's row buffers come from the context's scratch (slot 3), taken
 * before the parallel region: a kernel that cannot have them returns -1 and
 * writes nothing.
 */
#include <math.h>
#include <omp.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_f64.h"
#include "kernels/cpu/lane_sums.h"
#include "kernels/cpu/vmath.h"

/* exp of a row goes through vmath.h in chunks of this many (a stack buffer) */
#define EXP_CHUNK 256

/* r[j] = exp(r[j] - c) * k */
MP_SIMD static void exp_shift(float *r, int64_t n, float c, float k)
{
    for (int64_t j = 0; j < n; j++) r[j] -= c;
    cpu_vexp(r, r, n);
    if (k != 1.0f) for (int64_t j = 0; j < n; j++) r[j] *= k;
}

/* floats per thread (rounded up to a cache line) for the threads a region of
 * `work` elements will run on; NULL when the scratch cannot grow */
static float *rows_for(mp_kctx *cx, int64_t work, int64_t per_thread, int64_t *stride)
{
    int threads = work >= MP_PAR_MIN ? omp_get_max_threads() : 1;
    *stride = (per_thread + 15) & ~(int64_t)15;
    return cpu_scratch(cx, 3, sizeof(float) * (size_t)(*stride) * (size_t)threads);
}

/* this thread's rows in a region run with `if (work >= MP_PAR_MIN)` */
static inline float *my_rows(float *base, int64_t stride) { return base + stride * omp_get_thread_num(); }

/* a strided row of n values {outer, n, inner} at (o, i) into f32 */
static void load_row(mp_dtype dt, const void *x, int64_t o, int64_t i, int64_t n, int64_t inner, float *r)
{
    if (inner == 1) { cpu_load(dt, x, o * n, r, n); return; }
    for (int64_t j = 0; j < n; j++) cpu_load(dt, x, (o * n + j) * inner + i, r + j, 1);
}

static void store_row(mp_kctx *cx, mp_dtype dt, void *y, int64_t o, int64_t i, int64_t n, int64_t inner, const float *r)
{
    if (inner == 1) { cpu_store(cx, dt, y, o * n, r, n); return; }
    for (int64_t j = 0; j < n; j++) cpu_store(cx, dt, y, (o * n + j) * inner + i, r + j, 1);
}

/* max and log(sum(exp(x - max))) + max of a row */
static float logsumexp(const float *r, int64_t n)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = r[j] > m ? r[j] : m;
    if (isinf(m)) return m;   /* all -inf (or a +inf): nothing finite to normalise */
    double s = 0;
    float e[EXP_CHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += EXP_CHUNK) {
        int64_t c = n - j0 < EXP_CHUNK ? n - j0 : EXP_CHUNK;
        for (int64_t j = 0; j < c; j++) e[j] = r[j0 + j] - m;
        cpu_vexp(e, e, c);
        for (int64_t j = 0; j < c; j++) s += e[j];
    }
    return m + (float)log(s);
}

int cpu_softmax(mp_kctx *cx, mp_dtype dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner, int log)
{
    if (dt == MP_F64) return cpu_softmax_f64(y, x, outer, n, inner, log);
    int64_t stride, work = outer * n * inner;
    float *base = rows_for(cx, work, n, &stride);
    if (!base) return -1;
    #pragma omp parallel if (work >= MP_PAR_MIN)
    {
        float *r = my_rows(base, stride);
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < outer * inner; q++) {
            int64_t o = q / inner, i = q % inner;
            load_row(dt, x, o, i, n, inner, r);
            float lse = logsumexp(r, n);
            if (log) for (int64_t j = 0; j < n; j++) r[j] -= lse;
            else exp_shift(r, n, lse, 1.0f);
            store_row(cx, dt, y, o, i, n, inner, r);
        }
    }
    return 0;
}

int cpu_softmax_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const void *y,
                      int64_t outer, int64_t n, int64_t inner, int log)
{
    if (dt == MP_F64) return cpu_softmax_grad_f64(gx, gy, y, outer, n, inner, log);
    int64_t stride, work = outer * n * inner;
    float *base = rows_for(cx, work, 2 * n, &stride);
    if (!base) return -1;
    #pragma omp parallel if (work >= MP_PAR_MIN)
    {
        float *g = my_rows(base, stride), *p = g + n;
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < outer * inner; q++) {
            int64_t o = q / inner, i = q % inner;
            load_row(dt, gy, o, i, n, inner, g);
            load_row(dt, y, o, i, n, inner, p);
            double s = 0;
            if (log) {   /* gx = g - softmax * sum(g) */
                for (int64_t j = 0; j < n; j++) s += g[j];
                cpu_vexp(p, p, n);
                for (int64_t j = 0; j < n; j++) g[j] = g[j] - p[j] * (float)s;
            } else {     /* gx = y * (g - sum(g * y)) */
                for (int64_t j = 0; j < n; j++) s += (double)g[j] * p[j];
                for (int64_t j = 0; j < n; j++) g[j] = p[j] * (g[j] - (float)s);
            }
            store_row(cx, dt, gx, o, i, n, inner, g);
        }
    }
    return 0;
}

int cpu_cross_entropy(mp_kctx *cx, mp_dtype dt, float *loss, float *lse, const void *x, const int32_t *target,
                       int64_t rows, int64_t classes)
{
    if (dt == MP_F64) return cpu_cross_entropy_f64((double *)loss, (double *)lse, x, target, rows, classes);
    int64_t stride, work = rows * classes * 8;   /* an exp and a log-sum per element: worth threads sooner */
    float *base = rows_for(cx, work, classes, &stride);
    if (!base) return -1;
    #pragma omp parallel if (work >= MP_PAR_MIN)
    {
        float *r = my_rows(base, stride);
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < rows; q++) {
            cpu_load(dt, x, q * classes, r, classes);
            lse[q] = logsumexp(r, classes);
            loss[q] = lse[q] - r[target[q]];
        }
    }
    return 0;
}

int cpu_cross_entropy_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *x, const float *lse,
                            const int32_t *target, const float *scale, int64_t rows, int64_t classes)
{
    if (dt == MP_F64)
        return cpu_cross_entropy_grad_f64(gx, x, (const double *)lse, target, (const double *)scale, rows, classes);
    int64_t stride, work = rows * classes * 8;   /* an exp and a log-sum per element: worth threads sooner */
    float *base = rows_for(cx, work, classes, &stride);
    if (!base) return -1;
    #pragma omp parallel if (work >= MP_PAR_MIN)
    {
        float *r = my_rows(base, stride);
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < rows; q++) {
            cpu_load(dt, x, q * classes, r, classes);
            exp_shift(r, classes, lse[q], scale[q]);
            r[target[q]] -= scale[q];
            cpu_store(cx, dt, gx, q * classes, r, classes);
        }
    }
    return 0;
}

#define LANES MP_LANES

/* MP_ROWS rows of the layer norm backward (row k's g and x at g + k * stride,
 * xh + k * stride; rows k1.. are padding): xh becomes x-hat, g becomes gx
 * (f32), and g * x-hat, g add into the chunk's weight and bias sums pw, pb,
 * row after row; the two row sums run for all the rows side by side
 * (lane_sums.h), each row's in the order of a row alone. Without centring
 * (RMS norm: m is 0) gx has no mean(g*w) term. */
MP_SIMD static void ln_grad_rows(float *g, float *xh, int64_t stride, const float *wf, const float *m,
                                 const float *rs, int64_t n, int64_t k1, float *pw, float *pb, bool centred)
{
    double a8[MP_ROWS][LANES] = {{0}}, c8[MP_ROWS][LANES] = {{0}};
    for (int64_t k = 0; k < k1; k++) {
        float *gk = g + k * stride, *xk = xh + k * stride, mk = m[k], rk = rs[k];
        for (int64_t j = 0; j < n; j++) {
            xk[j] = (xk[j] - mk) * rk;
            pw[j] += gk[j] * xk[j];
            pb[j] += gk[j];
        }
    }
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < MP_ROWS; k++)
            for (int l = 0; l < LANES; l++) {
                float gw = g[k * stride + j + l] * wf[j + l];
                a8[k][l] += gw, c8[k][l] += (double)gw * xh[k * stride + j + l];
            }
    for (; j < n; j++)
        for (int k = 0; k < MP_ROWS; k++) {
            float gw = g[k * stride + j] * wf[j];
            a8[k][j % LANES] += gw, c8[k][j % LANES] += (double)gw * xh[k * stride + j];
        }
    for (int64_t k = 0; k < k1; k++) {
        double a = 0, c = 0;
        for (int l = 0; l < LANES; l++) a += a8[k][l], c += c8[k][l];
        float ma = centred ? (float)(a / n) : 0.0f, mc = (float)(c / n), rk = rs[k];
        float *gk = g + k * stride, *xk = xh + k * stride;
        for (int64_t q = 0; q < n; q++) gk[q] = rk * (gk[q] * wf[q] - ma - xk[q] * mc);
    }
}

MP_SIMD static void ln_row(float *y, const float *r, const float *wf, const float *bf, float m, float rs, int64_t n)
{
    for (int64_t j = 0; j < n; j++) y[j] = (r[j] - m) * rs * wf[j] + bf[j];
}

int cpu_layer_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                    const void *b, int64_t rows, int64_t n, float eps)
{
    if (dt == MP_F64) return cpu_layer_norm_f64(y, (double *)mean, (double *)rstd, x, w, b, rows, n, eps);
    int64_t stride, work = rows * n, nn = (n + 15) & ~(int64_t)15;
    float *base = rows_for(cx, work, (MP_ROWS + 2) * nn, &stride);
    if (!base) return -1;
    #pragma omp parallel if (work >= MP_PAR_MIN)
    {
        /* MP_ROWS rows at a time (lane_sums.h: each row's statistics have the
         * bits of a row alone); a group never spans threads' shares, and the
         * bits do not depend on where a group starts */
        float *r = my_rows(base, stride), *wf = r + MP_ROWS * nn, *bf = wf + nn;
        for (int64_t j = 0; j < n; j++) wf[j] = 1.0f, bf[j] = 0.0f;
        if (w) cpu_load(dt, w, 0, wf, n);
        if (b) cpu_load(dt, b, 0, bf, n);
        #pragma omp for schedule(static)
        for (int64_t q0 = 0; q0 < rows; q0 += MP_ROWS) {
            int64_t k1 = rows - q0 < MP_ROWS ? rows - q0 : MP_ROWS;
            float m[MP_ROWS] = {0}, rs[MP_ROWS];
            double s[MP_ROWS];
            /* f32 rows are read where they are and written straight into y
             * (a whole group only: the sums read MP_ROWS rows) */
            bool direct = dt == MP_F32 && k1 == MP_ROWS;
            const float *src = direct ? (const float *)x + q0 * n : r;
            int64_t ss = direct ? n : nn;
            if (!direct) {
                for (int64_t k = 0; k < k1; k++) cpu_load(dt, x, (q0 + k) * n, r + k * nn, n);
                for (int64_t k = k1; k < MP_ROWS; k++) for (int64_t j = 0; j < n; j++) r[k * nn + j] = 0;
            }
            if (mean) {   /* no mean: RMS norm, no centring */
                lane_sum_rows(src, ss, n, s);
                for (int k = 0; k < MP_ROWS; k++) m[k] = (float)(s[k] / n);
            }
            lane_sumsq_dev_rows(src, ss, n, m, s);
            for (int64_t k = 0; k < k1; k++) {
                rs[k] = 1.0f / sqrtf((float)(s[k] / n) + eps);
                if (direct) {
                    ln_row((float *)y + (q0 + k) * n, src + k * ss, wf, bf, m[k], rs[k], n);
                } else {
                    ln_row(r + k * nn, r + k * nn, wf, bf, m[k], rs[k], n);
                    cpu_store(cx, dt, y, (q0 + k) * n, r + k * nn, n);
                }
                if (mean) mean[q0 + k] = m[k];
                rstd[q0 + k] = rs[k];
            }
        }
    }
    return 0;
}

/* The weight and bias sums of the backward add over rows in a fixed number of
 * chunks, each in row order, then the chunks in order: the same bits on any
 * number of threads. */
#define LN_CHUNKS 16

/* gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)); gw = sum g*xhat; gb = sum g.
 * No mean (RMS norm): xhat = x * rstd and gx = rstd * (g*w - xhat * mean(g*w * xhat)). */
int cpu_layer_norm_grad(mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                         const float *mean, const float *rstd, const void *w, int64_t rows, int64_t n)
{
    if (dt == MP_F64)
        return cpu_layer_norm_grad_f64(gx, (double *)gw, (double *)gb, gy, x, (const double *)mean,
                                       (const double *)rstd, w, rows, n);
    int64_t chunks = rows < LN_CHUNKS ? (rows > 0 ? rows : 1) : LN_CHUNKS, work = rows * n;
    int threads = work >= MP_PAR_MIN ? omp_get_max_threads() : 1;
    int64_t nn = (n + 15) & ~(int64_t)15;   /* rows of floats, cache-line apart */
    float *wf = cpu_scratch(cx, 3, sizeof(float) * (size_t)(nn * (1 + 2 * chunks + 2 * MP_ROWS * threads)));
    if (!wf) return -1;
    float *part = wf + nn, *rowbuf = part + 2 * chunks * nn;
    for (int64_t j = 0; j < n; j++) wf[j] = 1.0f;
    if (w) cpu_load(dt, w, 0, wf, n);
    #pragma omp parallel for if (threads > 1) schedule(static)
    for (int64_t ch = 0; ch < chunks; ch++) {
        float *pw = part + 2 * ch * nn, *pb = pw + nn;
        float *g = rowbuf + 2 * MP_ROWS * nn * omp_get_thread_num(), *xh = g + MP_ROWS * nn;
        for (int64_t j = 0; j < n; j++) pw[j] = 0, pb[j] = 0;
        int64_t q1 = rows * (ch + 1) / chunks;
        for (int64_t q0 = rows * ch / chunks; q0 < q1; q0 += MP_ROWS) {
            int64_t k1 = q1 - q0 < MP_ROWS ? q1 - q0 : MP_ROWS;
            float m[MP_ROWS] = {0}, rs[MP_ROWS] = {0};
            for (int64_t k = 0; k < k1; k++) {
                cpu_load(dt, gy, (q0 + k) * n, g + k * nn, n);
                cpu_load(dt, x, (q0 + k) * n, xh + k * nn, n);
                m[k] = mean ? mean[q0 + k] : 0.0f, rs[k] = rstd[q0 + k];
            }
            for (int64_t k = k1; k < MP_ROWS; k++)
                for (int64_t j = 0; j < n; j++) g[k * nn + j] = 0, xh[k * nn + j] = 0;
            ln_grad_rows(g, xh, nn, wf, m, rs, n, k1, pw, pb, mean != NULL);
            for (int64_t k = 0; k < k1; k++) cpu_store(cx, dt, gx, (q0 + k) * n, g + k * nn, n);
        }
    }
    for (int64_t j = 0; j < n; j++) {
        float sw = 0, sb = 0;
        for (int64_t ch = 0; ch < chunks; ch++) sw += part[2 * ch * nn + j], sb += part[(2 * ch + 1) * nn + j];
        if (gw) gw[j] = sw;
        if (gb) gb[j] = sb;
    }
    return 0;
}
