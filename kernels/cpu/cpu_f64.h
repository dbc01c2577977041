/*
 * cpu_f64.h: the CPU's f64 paths (kernels/cpu/cpu_f64.c). An op on f64 data
 * computes and accumulates in double and rounds nothing: the f32 kernels'
 * widen-compute-round blocks would lose f64's precision, so each kernel that
 * runs f64 hands it here first, and cpu_supports declines f64 for the kernels
 * that have no such path (convolution, pooling, batch norm, attention).
 */
#ifndef MP_CPU_F64_H
#define MP_CPU_F64_H

#include "kernels/backend.h"

/* o[j] = a[j*ia] OP b[j*ib] for n elements (arithmetic ops; comparisons are cpu_binary's) */
void cpu_bin_f64(mp_binop op, double *o, const double *a, int64_t ia, const double *b, int64_t ib, int64_t n);
void cpu_unary_f64(mp_unop op, double *o, const double *x, int64_t n, double p);
/* gi = go * op'(x), x or the forward output y as the op needs (either may be NULL when not needed) */
void cpu_unary_grad_f64(mp_unop op, double *gi, const double *go, const double *x, const double *y, int64_t n,
                        double p);

/* the row-wise kernels (backend.h's entries of the same names): their f32
 * statistics arrays (lse, loss, scale, mean, rstd, gw, gb) hold doubles for
 * f64 inputs (the engine allocates them in f64, engine/ops_nn.c) */
int cpu_softmax_f64(double *y, const double *x, int64_t outer, int64_t n, int64_t inner, int log);
int cpu_softmax_grad_f64(double *gx, const double *gy, const double *y, int64_t outer, int64_t n, int64_t inner,
                         int log);
int cpu_cross_entropy_f64(double *loss, double *lse, const double *x, const int32_t *target, int64_t rows,
                          int64_t classes);
int cpu_cross_entropy_grad_f64(double *gx, const double *x, const double *lse, const int32_t *target,
                               const double *scale, int64_t rows, int64_t classes);
int cpu_layer_norm_f64(double *y, double *mean, double *rstd, const double *x, const double *w, const double *b,
                       int64_t rows, int64_t n, double eps);
/* the CPU's supports (backend.h): every op but the few without an f64 path */
mp_be_supports_fn cpu_supports;

int cpu_layer_norm_grad_f64(double *gx, double *gw, double *gb, const double *gy, const double *x,
                            const double *mean, const double *rstd, const double *w, int64_t rows, int64_t n);

#endif
