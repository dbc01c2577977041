/*
 * cpu_f64.c: the CPU's f64 kernels (cpu_f64.h): elementwise maths, their
 * gradients and the row-wise kernels, all in double with libm's double
 * functions. f64 is the dtype of checking (finite differences, gradcheck), not
 * of speed: plain loops, threads only where a row-wise kernel has many rows.
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_f64.h"

static double bin(mp_binop op, double x, double y)
{
    switch (op) {
    case MP_ADD: return x + y;
    case MP_SUB: return x - y;
    case MP_MUL: return x * y;
    case MP_DIV: return x / y;
    case MP_POWT: return pow(x, y);
    case MP_GT: case MP_LT: case MP_GE: case MP_LE: case MP_EQ: case MP_NE: break;   /* cpu_binary's cmp() */
    }
    return 0;
}

void cpu_bin_f64(mp_binop op, double *o, const double *a, int64_t ia, const double *b, int64_t ib, int64_t n)
{
    for (int64_t j = 0; j < n; j++) o[j] = bin(op, a[j * ia], b[j * ib]);
}

/* sigmoid as the f32 kernel forms it: e = e^-|x| <= 1, so nothing overflows */
static double sigmoid(double x)
{
    double e = exp(-fabs(x));
    return (x < 0 ? e : 1.0) / (1.0 + e);
}

#define GELU_K 0.79788456080286535588   /* sqrt(2 / pi) */

static double un(mp_unop op, double x, double p)
{
    switch (op) {
    case MP_NEG: return -x;
    case MP_ABS: return fabs(x);
    case MP_EXP: return exp(x);
    case MP_LOG: return log(x);
    case MP_SQRT: return sqrt(x);
    case MP_POW: return p == 2.0 ? x * x : pow(x, p);
    case MP_MULS: return x * p;
    case MP_ADDS: return x + p;
    case MP_RSUBS: return p - x;
    case MP_DIVS: return x / p;
    case MP_RDIVS: return p / x;
    case MP_RELU: return x < 0 ? 0.0 : x;
    case MP_TANH: return tanh(x);
    case MP_SIGMOID: return sigmoid(x);
    case MP_GELU:
        if (p == 0) return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
        return 0.5 * x * (1.0 + tanh(GELU_K * (x + 0.044715 * x * x * x)));
    case MP_SILU: return x * sigmoid(x);
    case MP_DROPMASK: return x >= p ? 1.0 / (1.0 - p) : 0.0;
    case MP_SIN: return sin(x);
    case MP_COS: return cos(x);
    }
    return 0;
}

void cpu_unary_f64(mp_unop op, double *o, const double *x, int64_t n, double p)
{
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t j = 0; j < n; j++) o[j] = un(op, x[j], p);
}

/* d op(x) / dx times g, from x or the forward output y (as grad_f32 in cpu_elementwise.c) */
static double grad(mp_unop op, double g, double x, double y, double p)
{
    switch (op) {
    case MP_NEG: return -g;
    case MP_ABS: return x > 0 ? g : x < 0 ? -g : 0.0;
    case MP_EXP: return g * y;
    case MP_LOG: return g / x;
    case MP_SQRT: return g / (2.0 * y);
    case MP_POW: return p == 2.0 ? g * 2.0 * x : p == 0.0 ? 0.0 : g * p * pow(x, p - 1.0);
    case MP_MULS: return g * p;
    case MP_ADDS: return g;
    case MP_RSUBS: return -g;
    case MP_DIVS: return g / p;
    case MP_RDIVS: return -g * y / x;
    case MP_RELU: return x > 0 ? g : 0.0;
    case MP_TANH: return g * (1.0 - y * y);
    case MP_SIGMOID: return g * y * (1.0 - y);
    case MP_GELU:
        if (p == 0) {   /* cdf + x pdf */
            double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2)), pdf = 0.39894228040143267794 * exp(-0.5 * x * x);
            return g * (cdf + x * pdf);
        } else {
            double th = tanh(GELU_K * (x + 0.044715 * x * x * x));
            return g * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x));
        }
    case MP_SILU: {   /* s (1 + x (1 - s)) */
        double s = sigmoid(x);
        return g * s * (1.0 + x * (1.0 - s));
    }
    case MP_DROPMASK: return 0.0;   /* a mask: constant in x */
    case MP_SIN: return g * cos(x);
    case MP_COS: return -g * sin(x);
    }
    return 0;
}

void cpu_unary_grad_f64(mp_unop op, double *gi, const double *go, const double *x, const double *y, int64_t n,
                        double p)
{
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t j = 0; j < n; j++) gi[j] = grad(op, go[j], x ? x[j] : 0.0, y ? y[j] : 0.0, p);
}

/* log(sum(exp(x - max))) + max of a strided row */
static double logsumexp(const double *x, int64_t n, int64_t stride)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; j++) m = x[j * stride] > m ? x[j * stride] : m;
    if (isinf(m)) return m;   /* all -inf (or a +inf): nothing finite to normalise */
    for (int64_t j = 0; j < n; j++) s += exp(x[j * stride] - m);
    return m + log(s);
}

int cpu_softmax_f64(double *y, const double *x, int64_t outer, int64_t n, int64_t inner, int log)
{
    #pragma omp parallel for if (outer * n * inner >= MP_PAR_MIN) schedule(static)
    for (int64_t q = 0; q < outer * inner; q++) {
        int64_t base = (q / inner) * n * inner + q % inner;
        double lse = logsumexp(x + base, n, inner);
        for (int64_t j = 0; j < n; j++) {
            double v = x[base + j * inner] - lse;
            y[base + j * inner] = log ? v : exp(v);
        }
    }
    return 0;
}

int cpu_softmax_grad_f64(double *gx, const double *gy, const double *y, int64_t outer, int64_t n, int64_t inner,
                         int log)
{
    #pragma omp parallel for if (outer * n * inner >= MP_PAR_MIN) schedule(static)
    for (int64_t q = 0; q < outer * inner; q++) {
        int64_t base = (q / inner) * n * inner + q % inner;
        const double *g = gy + base, *p = y + base;
        double s = 0;
        if (log) {   /* gx = g - softmax * sum(g) */
            for (int64_t j = 0; j < n; j++) s += g[j * inner];
            for (int64_t j = 0; j < n; j++) gx[base + j * inner] = g[j * inner] - exp(p[j * inner]) * s;
        } else {     /* gx = y * (g - sum(g * y)) */
            for (int64_t j = 0; j < n; j++) s += g[j * inner] * p[j * inner];
            for (int64_t j = 0; j < n; j++) gx[base + j * inner] = p[j * inner] * (g[j * inner] - s);
        }
    }
    return 0;
}

int cpu_cross_entropy_f64(double *loss, double *lse, const double *x, const int32_t *target, int64_t rows,
                          int64_t classes)
{
    #pragma omp parallel for if (rows * classes >= MP_PAR_MIN) schedule(static)
    for (int64_t q = 0; q < rows; q++) {
        lse[q] = logsumexp(x + q * classes, classes, 1);
        loss[q] = lse[q] - x[q * classes + target[q]];
    }
    return 0;
}

int cpu_cross_entropy_grad_f64(double *gx, const double *x, const double *lse, const int32_t *target,
                               const double *scale, int64_t rows, int64_t classes)
{
    #pragma omp parallel for if (rows * classes >= MP_PAR_MIN) schedule(static)
    for (int64_t q = 0; q < rows; q++) {
        for (int64_t j = 0; j < classes; j++) gx[q * classes + j] = exp(x[q * classes + j] - lse[q]) * scale[q];
        gx[q * classes + target[q]] -= scale[q];
    }
    return 0;
}

/* mean NULL: RMS norm (no centring), as the f32 kernel */
int cpu_layer_norm_f64(double *y, double *mean, double *rstd, const double *x, const double *w, const double *b,
                       int64_t rows, int64_t n, double eps)
{
    #pragma omp parallel for if (rows * n >= MP_PAR_MIN) schedule(static)
    for (int64_t q = 0; q < rows; q++) {
        const double *r = x + q * n;
        double m = 0, v = 0;
        if (mean) {
            for (int64_t j = 0; j < n; j++) m += r[j];
            m /= (double)n;
        }
        for (int64_t j = 0; j < n; j++) v += (r[j] - m) * (r[j] - m);
        double rs = 1.0 / sqrt(v / (double)n + eps);
        for (int64_t j = 0; j < n; j++) y[q * n + j] = (r[j] - m) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
        if (mean) mean[q] = m;
        rstd[q] = rs;
    }
    return 0;
}

/* gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)); gw = sum g*xhat; gb = sum g
 * (without mean: no mean(g*w) term); rows in order, so the sums do not depend on threads */
int cpu_layer_norm_grad_f64(double *gx, double *gw, double *gb, const double *gy, const double *x,
                            const double *mean, const double *rstd, const double *w, int64_t rows, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        if (gw) gw[j] = 0;
        if (gb) gb[j] = 0;
    }
    for (int64_t q = 0; q < rows; q++) {
        const double *g = gy + q * n, *r = x + q * n;
        double m = mean ? mean[q] : 0.0, rs = rstd[q], a = 0, c = 0;
        for (int64_t j = 0; j < n; j++) {
            double xh = (r[j] - m) * rs, gwj = g[j] * (w ? w[j] : 1.0);
            a += gwj, c += gwj * xh;
            if (gw) gw[j] += g[j] * xh;
            if (gb) gb[j] += g[j];
        }
        double ma = mean ? a / (double)n : 0.0, mc = c / (double)n;
        for (int64_t j = 0; j < n; j++) {
            double xh = (r[j] - m) * rs;
            gx[q * n + j] = rs * (g[j] * (w ? w[j] : 1.0) - ma - xh * mc);
        }
    }
    return 0;
}

/* The ops whose kernels have no f64 path: their f32 blocks would round f64
 * data to f32 silently, so the CPU declines them in f64 and the engine says
 * so ("conv2d is not available for f64 tensors on cpu (the backend declines
 * it)"). Every other op computes f64 in double. */
static const char *const no_f64[] = {"conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "batch_norm",
                                     "batch_norm_act", "attention"};

bool cpu_supports(mp_kctx *cx, const char *op, mp_dtype dt)
{
    /* the dtypes whose GEMM widens its operands whole (cpu_gemm.c): the engine
     * keeps autocast weights widened for them (kernels/backend.h gemm_wide) */
    if (strcmp(op, "gemm_wide") == 0) return cpu_gemm_widens(dt);
    if (dt != MP_F64) return true;
    for (size_t i = 0; i < sizeof no_f64 / sizeof *no_f64; i++)
        if (strcmp(op, no_f64[i]) == 0) return false;
    return true;
}
