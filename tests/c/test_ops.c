/*
 * test_ops.c: the engine's ops on the CPU backend, against naive reference
 * loops written here: broadcasting, low-precision rounding, reductions, GEMM in
 * every float dtype, layout copies, random streams, and argument checking.
 */
#include <criterion/criterion.h>
#include <omp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/backend.h"
#include <math.h>
#include <string.h>
#include "engine/ops.h"
#include "engine/memory.h"
#include "engine/error.h"
#include "kernels/half.h"

static mp_tensor *make(mp_dtype dt, int nd, const int64_t *shape, const double *v)
{
    mp_tensor *t = mp_from_f64(dt, MP_CPU, nd, shape, v);
    cr_assert(t, "%s", mp_error());
    return t;
}

static double at(const mp_tensor *t, int64_t i)
{
    double v;
    cr_assert_eq(mp_read_f64(t, i, 1, &v), 0);
    return v;
}

static mp_tensor *randt(mp_dtype dt, int nd, const int64_t *shape)
{
    mp_tensor *t = mp_randn(dt, MP_CPU, nd, shape);
    cr_assert(t);
    return t;
}

Test(ops, broadcast_matches_naive_loop)
{
    int64_t sa[3] = {4, 1, 5}, sb[2] = {3, 1};
    mp_manual_seed(1);
    mp_tensor *a = randt(MP_F32, 3, sa), *b = randt(MP_F32, 2, sb);
    for (mp_binop op = MP_ADD; op <= MP_DIV; op++) {
        mp_tensor *c = mp_binary(op, a, b);
        cr_assert(c, "%s", mp_error());
        cr_assert_eq(c->ndim, 3);
        cr_assert(c->shape[0] == 4 && c->shape[1] == 3 && c->shape[2] == 5);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++)
                for (int k = 0; k < 5; k++) {
                    float x = (float)at(a, i * 5 + k), y = (float)at(b, j);
                    float want = op == MP_ADD ? x + y : op == MP_SUB ? x - y : op == MP_MUL ? x * y : x / y;
                    cr_assert_eq((float)at(c, (i * 3 + j) * 5 + k), want, "op %d at %d,%d,%d", op, i, j, k);
                }
        mp_release(c);
    }
    mp_release(a);
    mp_release(b);
}

Test(ops, comparisons_write_u8)
{
    int64_t s[1] = {4};
    double x[4] = {1, 2, NAN, -1}, y[4] = {1, 1, 0, 0};
    mp_tensor *a = make(MP_F16, 1, s, x), *b = make(MP_F32, 1, s, y);
    double want[6][4] = {{0, 1, 0, 0}, {0, 0, 0, 1}, {1, 1, 0, 0}, {1, 0, 0, 1}, {1, 0, 0, 0}, {0, 1, 1, 1}};
    for (mp_binop op = MP_GT; op <= MP_NE; op++) {
        mp_tensor *c = mp_binary(op, a, b);
        cr_assert(c, "%s", mp_error());
        cr_assert_eq(c->dtype, MP_U8);
        for (int i = 0; i < 4; i++) cr_assert_eq(at(c, i), want[op - MP_GT][i], "op %d at %d", op, i);
        mp_release(c);
    }
    mp_release(a), mp_release(b);
}

Test(ops, f16_arithmetic_rounds_once)
{
    /* computed in f32 and rounded once: 1 + 2^-11 is a tie and goes to even (1),
     * 1 + 3*2^-11 rounds up to 1 + 2^-9 */
    int64_t s[1] = {3};
    double x[3] = {1, 1, 2048}, y[3] = {ldexp(1, -11), 3 * ldexp(1, -11), 1};
    mp_tensor *a = make(MP_F16, 1, s, x), *b = make(MP_F16, 1, s, y), *c = mp_binary(MP_ADD, a, b);
    cr_assert_eq(at(c, 0), 1.0);
    cr_assert_eq(at(c, 1), 1.0 + ldexp(1, -9));
    cr_assert_eq(at(c, 2), 2048.0);   /* 2049 is a tie between 2048 and 2050: even mantissa wins */
    mp_release(c);
    /* overflow to inf, underflow to zero */
    double big[3] = {60000, 1e-7, -60000}, two[3] = {2, 0.25, 2};
    mp_tensor *p = make(MP_F16, 1, s, big), *q = make(MP_F16, 1, s, two), *r = mp_binary(MP_MUL, p, q);
    cr_assert(isinf(at(r, 0)) && at(r, 0) > 0);
    cr_assert_eq(at(r, 1), 0.0);
    cr_assert(isinf(at(r, 2)) && at(r, 2) < 0);
    mp_release(a), mp_release(b), mp_release(p), mp_release(q), mp_release(r);
}

Test(ops, promotion)
{
    int64_t s[1] = {2};
    double v[2] = {1, 2};
    mp_tensor *h = make(MP_F16, 1, s, v), *b = make(MP_BF16, 1, s, v), *i = make(MP_I32, 1, s, v);
    mp_tensor *hb = mp_binary(MP_ADD, h, b), *hi = mp_binary(MP_ADD, h, i), *ii = mp_binary(MP_DIV, i, i);
    cr_assert_eq(hb->dtype, MP_F32);
    cr_assert_eq(hi->dtype, MP_F16);
    cr_assert_eq(ii->dtype, MP_F32);
    cr_assert_eq(at(ii, 0), 1.0);
    mp_tensor *half = mp_binary_scalar(MP_MUL, i, 0.5, 0);
    cr_assert_eq(half->dtype, MP_F32);
    cr_assert_eq(at(half, 1), 1.0);
    mp_release(h), mp_release(b), mp_release(i), mp_release(hb), mp_release(hi), mp_release(ii), mp_release(half);
}

Test(ops, reductions_along_dims)
{
    int64_t s[3] = {2, 3, 4};
    mp_tensor *a = mp_arange(24, MP_F32, MP_CPU), *b = mp_reshape(a, 3, s);
    mp_tensor *s1 = mp_reduce(MP_SUM, b, 1, 0), *s2 = mp_reduce(MP_MEAN, b, -2, 0);
    mp_tensor *m3 = mp_reduce(MP_MAX, b, 3, 0), *am = mp_reduce(MP_ARGMAX, b, 2, 0), *all = mp_reduce(MP_SUM, b, 0, 0);
    cr_assert(s1 && s2 && m3 && am && all, "%s", mp_error());
    cr_assert(s1->ndim == 2 && s1->shape[0] == 3 && s1->shape[1] == 4);
    for (int j = 0; j < 12; j++) cr_assert_eq(at(s1, j), (double)j + (12 + j));
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) cr_assert_eq(at(s2, i * 4 + k), i * 12 + k + 4.0);
    for (int i = 0; i < 6; i++) cr_assert_eq(at(m3, i), i * 4 + 3.0);
    cr_assert_eq(am->dtype, MP_I32);
    for (int i = 0; i < 8; i++) cr_assert_eq(at(am, i), 2.0);   /* 0-based index of the last row */
    cr_assert_eq(all->ndim, 0);
    cr_assert_eq(at(all, 0), 276.0);
    mp_release(a), mp_release(b), mp_release(s1), mp_release(s2), mp_release(m3), mp_release(am), mp_release(all);
}

Test(ops, max_propagates_nan_argmax_takes_first)
{
    int64_t s[1] = {4};
    double v[4] = {1, NAN, 5, 5}, w[4] = {3, 7, 7, 1};
    mp_tensor *a = make(MP_F32, 1, s, v), *b = make(MP_F32, 1, s, w);
    mp_tensor *m = mp_reduce(MP_MAX, a, 0, 0), *i = mp_reduce(MP_ARGMAX, b, 1, 0), *j = mp_reduce(MP_ARGMAX, a, 1, 0);
    cr_assert(isnan(at(m, 0)));
    cr_assert_eq(at(i, 0), 1.0);
    cr_assert_eq(at(j, 0), 1.0);
    mp_release(a), mp_release(b), mp_release(m), mp_release(i), mp_release(j);
}

/* naive f64 matmul of row-major {m,k} x {k,n} from tensors, each batch item */
static void check_gemm(mp_dtype dt, int64_t batch, int64_t m, int64_t n, int64_t k, int batch_b)
{
    int64_t sa[3] = {batch, m, k}, sb[3] = {batch, k, n}, sb2[2] = {k, n};
    mp_tensor *a = randt(dt, 3, sa), *b = batch_b ? randt(dt, 3, sb) : randt(dt, 2, sb2);
    mp_tensor *c = mp_matmul(a, b);
    cr_assert(c, "%s", mp_error());
    cr_assert(c->ndim == 3 && c->shape[0] == batch && c->shape[1] == m && c->shape[2] == n);
    for (int64_t q = 0; q < batch; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double want = 0;
                for (int64_t l = 0; l < k; l++)
                    want += at(a, (q * m + i) * k + l) * at(b, (batch_b ? q * k * n : 0) + l * n + j);
                /* f32 accumulation, then one rounding to dt; f64: dgemm, no rounding */
                float wf = (float)want;
                double expect = dt == MP_F64 ? want : dt == MP_F16 ? mp_f16_to_f32(mp_f32_to_f16(wf))
                              : dt == MP_BF16 ? mp_bf16_to_f32(mp_f32_to_bf16(wf)) : wf;
                double got = at(c, (q * m + i) * n + j);
                double ulp = dt == MP_F64 ? 1e-13 : dt == MP_F32 ? 1e-5 : dt == MP_F16 ? 1e-3 : 8e-3;
                cr_assert(fabs(got - expect) <= ulp * (fabs(expect) + 1) , "%s [%ld,%ld,%ld] got %g want %g",
                          mp_dtype_name(dt), (long)q, (long)i, (long)j, got, expect);
            }
    mp_release(a), mp_release(b), mp_release(c);
}

Test(ops, gemm_every_float_dtype)
{
    mp_manual_seed(7);
    for (mp_dtype dt = MP_F32; dt <= MP_BF16; dt++) {
        check_gemm(dt, 1, 5, 7, 3, 1);
        check_gemm(dt, 3, 4, 6, 17, 1);
        check_gemm(dt, 2, 3, 5, 8, 0);
    }
    check_gemm(MP_F64, 1, 5, 7, 3, 1);
    check_gemm(MP_F64, 3, 4, 6, 17, 1);
    check_gemm(MP_F64, 2, 3, 5, 8, 0);
}

/* f64: promotion, exact values, casts rounding to nearest even at known bits,
 * and the CPU's refusal of the ops it has no f64 kernel for */
Test(ops, f64_promotes_keeps_and_rounds)
{
    int64_t s[1] = {4};
    double v[4] = {0.1, 1 + 0x1p-24, 1 + 3 * 0x1p-24, 1 + 0x1p-11 + 0x1p-40};
    mp_tensor *d = make(MP_F64, 1, s, v), *f = make(MP_F32, 1, s, v), *h = make(MP_F16, 1, s, v);
    mp_tensor *df = mp_binary(MP_ADD, d, f), *dh = mp_binary(MP_ADD, d, h), *f32 = mp_to(d, MP_F32, MP_CPU);
    mp_tensor *f16 = mp_to(d, MP_F16, MP_CPU), *bf = mp_to(d, MP_BF16, MP_CPU);
    cr_assert(df && dh && f32 && f16 && bf, "%s", mp_error());
    cr_assert_eq(df->dtype, MP_F64);
    cr_assert_eq(dh->dtype, MP_F64);
    for (int i = 0; i < 4; i++) cr_assert_eq(at(d, i), v[i]);
    uint32_t b0;
    float x0 = (float)at(f32, 0);
    memcpy(&b0, &x0, 4);
    cr_assert_eq(b0, 0x3dcccccdu);
    cr_assert_eq(at(f32, 1), 1.0);                 /* a tie: to the even neighbour */
    cr_assert_eq(at(f32, 2), 1 + 0x1p-22);
    const uint16_t *hb = mp_data(f16), *bb = mp_data(bf);
    cr_assert_eq(hb[0], 0x2e66);
    cr_assert_eq(hb[3], 0x3c00);                   /* through f32, as PyTorch: the 2^-40 is gone, then a tie */
    cr_assert_eq(bb[0], 0x3dcd);
    int64_t s4[4] = {1, 1, 4, 4}, sw[4] = {1, 1, 3, 3};
    mp_tensor *x = mp_full(MP_F64, MP_CPU, 4, s4, 0), *w = mp_full(MP_F64, MP_CPU, 4, sw, 0);
    const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    cr_assert_null(mp_conv2d(x, w, NULL, one, zero, one, 1));
    cr_assert_str_eq(mp_error(), "conv2d is not available for f64 tensors on cpu (the backend declines it)");
    mp_release(d), mp_release(f), mp_release(h), mp_release(df), mp_release(dh), mp_release(f32);
    mp_release(f16), mp_release(bf), mp_release(x), mp_release(w);
}

Test(ops, matmul_vectors)
{
    int64_t s2[2] = {2, 3}, s1[1] = {3}, s1b[1] = {2};
    double m[6] = {1, 2, 3, 4, 5, 6}, v[3] = {1, 0, -1}, w[2] = {1, 1};
    mp_tensor *a = make(MP_F32, 2, s2, m), *x = make(MP_F32, 1, s1, v), *y = make(MP_F32, 1, s1b, w);
    mp_tensor *ax = mp_matmul(a, x), *ya = mp_matmul(y, a), *xx = mp_matmul(x, x);
    cr_assert(ax && ya && xx, "%s", mp_error());
    cr_assert(ax->ndim == 1 && ax->shape[0] == 2 && at(ax, 0) == -2 && at(ax, 1) == -2);
    cr_assert(ya->ndim == 1 && ya->shape[0] == 3 && at(ya, 0) == 5 && at(ya, 2) == 9);
    cr_assert(xx->ndim == 0 && at(xx, 0) == 2);
    mp_release(a), mp_release(x), mp_release(y), mp_release(ax), mp_release(ya), mp_release(xx);
}

Test(ops, matmul_rejects_bad_shapes)
{
    int64_t s1[2] = {2, 3}, s2[2] = {4, 5}, s3[3] = {2, 3, 4}, s4[3] = {3, 4, 5};
    mp_tensor *a = randt(MP_F32, 2, s1), *b = randt(MP_F32, 2, s2), *c = randt(MP_F32, 3, s3), *d = randt(MP_F32, 3, s4);
    mp_tensor *h = mp_to(a, MP_F16, MP_CPU);
    cr_assert_null(mp_matmul(a, b));
    cr_assert_str_eq(mp_error(), "shapes {2,3} and {4,5} do not match (3 vs 4)");
    cr_assert_null(mp_matmul(c, d));
    cr_assert(strstr(mp_error(), "batch dims of {2,3,4} and {3,4,5} do not broadcast (dim 1: 2 vs 3)"), "%s", mp_error());
    cr_assert_null(mp_matmul(h, a));
    cr_assert(strstr(mp_error(), "dtypes f16 and f32 differ"));
    mp_release(a), mp_release(b), mp_release(c), mp_release(d), mp_release(h);
}

Test(ops, transpose_and_narrow)
{
    int64_t s[3] = {2, 3, 4};
    mp_tensor *r = mp_arange(24, MP_I32, MP_CPU), *a = mp_reshape(r, 3, s);
    mp_tensor *t = mp_transpose(a, 1, 3);
    cr_assert(t->shape[0] == 4 && t->shape[1] == 3 && t->shape[2] == 2);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) cr_assert_eq(at(t, (i * 3 + j) * 2 + k), (k * 3 + j) * 4 + i);
    mp_tensor *n1 = mp_narrow(a, 1, 2, 1), *n3 = mp_narrow(a, -1, 2, 2);
    cr_assert_eq(n1->st, a->st, "narrow along dim 1 shares storage");
    cr_assert_eq(at(n1, 0), 12);
    cr_assert_neq(n3->st, a->st);
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(at(n3, 2 * i), i * 4 + 1);
        cr_assert_eq(at(n3, 2 * i + 1), i * 4 + 2);
    }
    cr_assert_null(mp_narrow(a, 2, 3, 2));
    cr_assert(strstr(mp_error(), "length 2 out of range"));
    cr_assert_null(mp_narrow(a, 4, 1, 1));
    cr_assert(strstr(mp_error(), "dim 4 out of range"));
    mp_release(r), mp_release(a), mp_release(t), mp_release(n1), mp_release(n3);
}

Test(ops, reshape_infers_one_dim)
{
    int64_t s[2] = {-1, 6}, bad[2] = {-1, 5}, two[2] = {-1, -1};
    mp_tensor *a = mp_arange(24, MP_F32, MP_CPU), *b = mp_reshape(a, 2, s);
    cr_assert(b && b->shape[0] == 4 && b->st == a->st);
    cr_assert_null(mp_reshape(a, 2, bad));
    cr_assert(strstr(mp_error(), "cannot reshape {24}"));
    cr_assert_null(mp_reshape(a, 2, two));
    mp_release(a), mp_release(b);
}

Test(ops, random_streams_are_reproducible)
{
    int64_t s[1] = {100000};
    mp_manual_seed(42);
    mp_tensor *a = mp_randn(MP_F32, MP_CPU, 1, s), *u = mp_rand(MP_F32, MP_CPU, 1, s);
    mp_manual_seed(42);
    mp_tensor *b = mp_randn(MP_F32, MP_CPU, 1, s);
    cr_assert_eq(memcmp(mp_data(a), mp_data(b), mp_nbytes(a)), 0);
    double sum = 0, sq = 0, lo = 1, hi = 0;
    for (int i = 0; i < 100000; i++) {
        double x = ((float *)mp_data(a))[i], y = ((float *)mp_data(u))[i];
        sum += x, sq += x * x;
        lo = y < lo ? y : lo, hi = y > hi ? y : hi;
    }
    cr_assert(fabs(sum / 1e5) < 0.02 && fabs(sq / 1e5 - 1) < 0.02, "mean %g var %g", sum / 1e5, sq / 1e5);
    cr_assert(lo >= 0 && hi < 1 && lo < 0.001 && hi > 0.999);
    mp_release(a), mp_release(b), mp_release(u);
}

Test(ops, casts_saturate_and_keep_nan_out_of_ints)
{
    int64_t s[1] = {5};
    double v[5] = {-3.7, 300.5, NAN, 1e12, 2.9};
    mp_tensor *a = make(MP_F32, 1, s, v), *i = mp_to(a, MP_I32, MP_CPU), *u = mp_to(a, MP_U8, MP_CPU);
    double wi[5] = {-3, 300, 0, 2147483647.0, 2}, wu[5] = {0, 255, 0, 255, 2};
    for (int k = 0; k < 5; k++) {
        cr_assert_eq(at(i, k), wi[k], "i32 %d", k);
        cr_assert_eq(at(u, k), wu[k], "u8 %d", k);
    }
    mp_release(a), mp_release(i), mp_release(u);
}

Test(ops, memory_accounting_and_limit)
{
    mp_memstats before = mp_memory(MP_CPU);
    int64_t s[1] = {1 << 20};
    mp_tensor *a = mp_full(MP_F32, MP_CPU, 1, s, 1);
    cr_assert_eq(mp_memory(MP_CPU).in_use, before.in_use + (4u << 20));
    mp_release(a);
    cr_assert_eq(mp_memory(MP_CPU).in_use, before.in_use);
    int64_t huge[2] = {1000000, 1000000};
    cr_assert_null(mp_full(MP_F32, MP_CPU, 2, huge, 0));
    cr_assert_eq(mp_errcode_last(), MP_EOOM);
    cr_assert(strstr(mp_error(), "out of memory"));
    int64_t zero[2] = {3, 0};
    cr_assert_null(mp_full(MP_F32, MP_CPU, 2, zero, 0));
    cr_assert(strstr(mp_error(), "must be positive"));
}

/* where there is no CUDA device, asking for one is an error that says why;
 * where there is one (a GPU machine, or MP_CUDA_BACKEND), it works */
Test(ops, cuda_tensors_or_why_not)
{
    int64_t s[1] = {2};
    mp_clear_error();
    mp_tensor *t = mp_full(MP_F32, MP_CUDA, 1, s, 2.5);
    const char *why = mp_device_why_not(MP_CUDA);
    if (why) {
        cr_assert_null(t);
        cr_assert(strstr(mp_error(), "not available"), "%s", mp_error());
        cr_assert(strstr(mp_error(), why), "%s lacks %s", mp_error(), why);
        return;
    }
    cr_assert_not_null(t, "%s", mp_error());
    cr_assert_eq(t->dev, MP_CUDA);
    double v[2] = {0, 0};
    cr_assert_eq(mp_read_f64(t, 0, 2, v), 0, "%s", mp_error());
    cr_assert_eq(v[0], 2.5);
    cr_assert_eq(v[1], 2.5);
    mp_release(t);
}

/* layer norm's backward sums its weight and bias gradients over fixed chunks
 * of rows: one thread or two give the same bits (and the row outputs too) */
Test(ops, layer_norm_grad_same_bits_on_any_thread_count)
{
    int64_t rows = 1000, n = 300;   /* 3e5 elements: above the fork threshold */
    size_t bytes = sizeof(float) * (size_t)(rows * n);
    float *x = malloc(bytes), *gy = malloc(bytes), *gx1 = malloc(bytes), *gx2 = malloc(bytes);
    float *w = malloc(sizeof(float) * (size_t)n), *mean = malloc(sizeof(float) * (size_t)rows);
    float *rstd = malloc(sizeof(float) * (size_t)rows), gw[2][300], gb[2][300];
    for (int64_t i = 0; i < rows * n; i++) x[i] = (float)((i * 7919) % 1013) / 97.0f - 5.0f, gy[i] = (float)((i * 104729) % 509) / 211.0f - 1.2f;
    for (int64_t j = 0; j < n; j++) w[j] = 0.5f + (float)j / (float)n;
    const mp_backend *cpu = &mp_cpu_backend;
    cr_assert_eq(cpu->layer_norm(cpu->ctx, MP_F32, gx1, mean, rstd, x, w, NULL, rows, n, 1e-5f), 0);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    cr_assert_eq(cpu->layer_norm_grad(cpu->ctx, MP_F32, gx1, gw[0], gb[0], gy, x, mean, rstd, w, rows, n), 0);
    omp_set_num_threads(2);
    cr_assert_eq(cpu->layer_norm_grad(cpu->ctx, MP_F32, gx2, gw[1], gb[1], gy, x, mean, rstd, w, rows, n), 0);
    omp_set_num_threads(saved);
    cr_assert(memcmp(gx1, gx2, bytes) == 0, "gx differs between 1 and 2 threads");
    cr_assert(memcmp(gw[0], gw[1], sizeof gw[0]) == 0 && memcmp(gb[0], gb[1], sizeof gb[0]) == 0,
              "weight or bias gradient differs between 1 and 2 threads");
    /* and the sums are right: gb is the column sum of gy */
    for (int64_t j = 0; j < n; j += 37) {
        double s = 0;
        for (int64_t q = 0; q < rows; q++) s += gy[q * n + j];
        cr_assert(fabs(gb[0][j] - s) <= 1e-4 * (fabs(s) + 1), "gb[%ld] %g vs %g", (long)j, gb[0][j], s);
    }
    free(x), free(gy), free(gx1), free(gx2), free(w), free(mean), free(rstd);
}

/* a column sum with few columns and many rows (a bias's gradient) is cut into
 * fixed chunks of rows: one thread or two give the same bits, near the exact sum */
Test(ops, column_sum_same_bits_on_any_thread_count)
{
    int64_t n = 2048, inner = 384;
    float *a = malloc(sizeof(float) * (size_t)(n * inner)), s1[384], s2[384];
    for (int64_t i = 0; i < n * inner; i++) a[i] = (float)((i * 7919) % 2003) / 1001.0f - 1.0f;
    const mp_backend *cpu = &mp_cpu_backend;
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu->reduce(cpu->ctx, MP_SUM, MP_F32, s1, a, 1, n, inner);
    omp_set_num_threads(2);
    cpu->reduce(cpu->ctx, MP_SUM, MP_F32, s2, a, 1, n, inner);
    omp_set_num_threads(saved);
    cr_assert(memcmp(s1, s2, sizeof s1) == 0, "the column sums differ between 1 and 2 threads");
    for (int64_t q = 0; q < inner; q += 17) {
        double e = 0;
        for (int64_t j = 0; j < n; j++) e += a[j * inner + q];
        cr_assert(fabs(s1[q] - e) <= 1e-6 * (fabs(e) + 1), "column %ld: %g vs %g", (long)q, s1[q], e);
    }
    free(a);
}

/* batch norm of a bf16 input (an activation under autocast) with f32 weight and
 * bias: the same bits on 1 and 2 threads (a channel is one thread's), f32
 * statistics within f32's rounding of the exact ones (the f64 sums are exact to
 * far better than that), and y within one rounding to bf16 of the exact value
 * (2^-8 relative) plus the f32 affine's own roundings (a few 2^-24 of |x a| + |b|,
 * bounded here by 2^-20) */
Test(ops, batch_norm_bf16_same_bits_on_any_thread_count_and_rounded_once)
{
    int64_t n = 16, c = 8, hw = 2304, count = n * c * hw;   /* hw > MP_BLOCK: widened in pieces; >= MP_PAR_MIN */
    uint16_t *x = malloc(2 * (size_t)count), *g = malloc(2 * (size_t)count);
    uint16_t *y[2] = {malloc(2 * (size_t)count), malloc(2 * (size_t)count)};
    uint16_t *gx[2] = {malloc(2 * (size_t)count), malloc(2 * (size_t)count)};
    float w[8], b[8], mean[2][8], rstd[2][8], rm[2][8], rv[2][8], gw[2][8], gb[2][8];
    for (int64_t i = 0; i < count; i++) {
        x[i] = mp_f32_to_bf16((float)((i * 7919) % 1013) / 97.0f - 3.0f + (float)(i / (hw * 1) % c));
        g[i] = mp_f32_to_bf16((float)((i * 104729) % 509) / 211.0f - 1.2f);
    }
    for (int j = 0; j < 8; j++) w[j] = 0.5f + 0.25f * (float)j, b[j] = 0.1f * (float)j - 0.3f;
    const mp_backend *cpu = &mp_cpu_backend;
    int saved = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        for (int j = 0; j < 8; j++) rm[t][j] = 0, rv[t][j] = 1;
        cr_assert_eq(cpu->batch_norm(cpu->ctx, MP_BF16, y[t], mean[t], rstd[t], rm[t], rv[t], x, w, b, n, c, hw, 1,
                                     0.1f, 1e-5f), 0);
        cr_assert_eq(cpu->batch_norm_grad(cpu->ctx, MP_BF16, gx[t], gw[t], gb[t], g, x, mean[t], rstd[t], w, n, c, hw, 1),
                     0);
    }
    omp_set_num_threads(saved);
    cr_assert(memcmp(y[0], y[1], 2 * (size_t)count) == 0 && memcmp(gx[0], gx[1], 2 * (size_t)count) == 0,
              "y or gx differs between 1 and 2 threads");
    cr_assert(memcmp(mean[0], mean[1], sizeof mean[0]) == 0 && memcmp(rstd[0], rstd[1], sizeof rstd[0]) == 0 &&
              memcmp(rm[0], rm[1], sizeof rm[0]) == 0 && memcmp(rv[0], rv[1], sizeof rv[0]) == 0 &&
              memcmp(gw[0], gw[1], sizeof gw[0]) == 0 && memcmp(gb[0], gb[1], sizeof gb[0]) == 0,
              "a statistic or a weight gradient differs between 1 and 2 threads");
    for (int64_t ch = 0; ch < c; ch++) {
        double s = 0, q = 0, sg = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < hw; e++) s += mp_bf16_to_f32(x[(i * c + ch) * hw + e]);
        double mu = s / (double)(n * hw);
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < hw; e++) {
                double d = mp_bf16_to_f32(x[(i * c + ch) * hw + e]) - mu;
                q += d * d, sg += mp_bf16_to_f32(g[(i * c + ch) * hw + e]);
            }
        double r = 1.0 / sqrt(q / (double)(n * hw) + 1e-5);
        cr_assert(fabs(mean[0][ch] - mu) <= 0x1p-23 * fabs(mu) + 1e-7, "mean %g vs %g", mean[0][ch], mu);
        cr_assert(fabs(rstd[0][ch] - r) <= 0x1p-22 * r, "rstd %g vs %g", rstd[0][ch], r);
        cr_assert(fabs(gb[0][ch] - sg) <= 1e-6 * (fabs(sg) + 1), "gb %g vs %g", gb[0][ch], sg);
        double a = w[ch] * r, sh = b[ch] - mu * a;
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < hw; e += 7) {
                int64_t k = (i * c + ch) * hw + e;
                double xv = mp_bf16_to_f32(x[k]), ye = xv * a + sh, got = mp_bf16_to_f32(y[0][k]);
                cr_assert(fabs(got - ye) <= 0x1p-8 * fabs(ye) + 0x1p-20 * (fabs(xv * a) + fabs(sh)),
                          "y[%ld] %.9g vs %.9g", (long)k, got, ye);
            }
    }
    free(x), free(g), free(y[0]), free(y[1]), free(gx[0]), free(gx[1]);
}
