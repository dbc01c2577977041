/*
 * test_norm_threads.c: layer norm (forward and backward, f32 and bf16, with
 * and without weight and bias, and RMS norm) and the column sums of
 * cpu_reduce (a sum over the rows of {rows, few columns}: bias gradients)
 * give the same bits on 1 and 2 threads.
 *
 * Both kernels were restructured for speed (layer norm four rows side by
 * side, its weight/bias gradients summed in fixed row chunks; the column
 * sums in ROW_CHUNKS fixed chunks of rows, COLS columns at a time): the order
 * of every sum is fixed by the shape alone, never by the thread count. The
 * shapes are ragged on purpose: rows not a multiple of four (the 4-row
 * groups' tail) or of the chunk count, widths not a multiple of 16 or 32
 * (the vector and COLS tails), and sizes both under and past MP_PAR_MIN, so
 * that the parallel paths really split. The column sums are in double, exact
 * for most data whatever the order, so some columns get values over 80
 * binades and some rows of small, 2^60, -2^60 in turn, where a different cut
 * into chunks changes the sum (checked: a ROW_CHUNKS or LN_CHUNKS that
 * follows the thread count fails here).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"

static void *alloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    cr_assert(p);
    return p;
}

/* random values around scale, some negative, wide: times 2^-40..2^40 (so that
 * even double sums round, and their order shows); bf16 rounded from them */
static void fill_wide(mp_dtype dt, void *p, int64_t n, unsigned *seed, float scale, float shift, int wide)
{
    for (int64_t i = 0; i < n; i++) {
        float v = ((float)rand_r(seed) / (float)RAND_MAX - 0.5f) * scale + shift;
        if (wide) v = ldexpf(v, rand_r(seed) % 81 - 40);
        if (dt == MP_F32) ((float *)p)[i] = v;
        else if (dt == MP_F16) ((uint16_t *)p)[i] = mp_f32_to_f16(v);
        else ((uint16_t *)p)[i] = mp_f32_to_bf16(v);
    }
}

static void fill(mp_dtype dt, void *p, int64_t n, unsigned *seed, float scale, float shift)
{
    fill_wide(dt, p, n, seed, scale, shift, 0);
}

static void same(const void *a, const void *b, size_t bytes, const char *what, int64_t rows, int64_t n)
{
    cr_assert(memcmp(a, b, bytes) == 0, "%s differs between 1 and 2 threads for {%ld, %ld}", what, (long)rows,
              (long)n);
}

/* one layer norm forward and backward on `threads` threads into the outputs */
typedef struct { void *y, *gx; float *mean, *rstd, *gw, *gb; } ln_out;

static void ln_run(mp_dtype dt, int rms, int affine, const void *x, const void *w, const void *b, const void *gy,
                   int64_t rows, int64_t n, int threads, ln_out *o)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    int was = omp_get_max_threads();
    omp_set_num_threads(threads);
    cr_assert_eq(cpu_layer_norm(cx, dt, o->y, rms ? NULL : o->mean, o->rstd, x, affine ? w : NULL,
                                affine && !rms ? b : NULL, rows, n, 1e-5f), 0);
    cr_assert_eq(cpu_layer_norm_grad(cx, dt, o->gx, affine ? o->gw : NULL, affine && !rms ? o->gb : NULL, gy, x,
                                     rms ? NULL : o->mean, o->rstd, affine ? w : NULL, rows, n), 0);
    omp_set_num_threads(was);
}

static void ln_case(mp_dtype dt, int64_t rows, int64_t n, unsigned seed)
{
    size_t es = mp_dtype_size(dt), data = (size_t)(rows * n) * es;
    void *x = alloc(data), *gy = alloc(data), *w = alloc((size_t)n * es), *b = alloc((size_t)n * es);
    fill(dt, x, rows * n, &seed, 4.0f, 0.5f);
    fill(dt, gy, rows * n, &seed, 2.0f, 0.0f);
    fill(dt, w, n, &seed, 1.0f, 1.0f);
    fill(dt, b, n, &seed, 1.0f, 0.0f);
    ln_out o[2];
    for (int t = 0; t < 2; t++) {
        o[t].y = alloc(data), o[t].gx = alloc(data);
        o[t].mean = alloc(sizeof(float) * (size_t)rows), o[t].rstd = alloc(sizeof(float) * (size_t)rows);
        o[t].gw = alloc(sizeof(float) * (size_t)n), o[t].gb = alloc(sizeof(float) * (size_t)n);
    }
    for (int rms = 0; rms < 2; rms++)
        for (int affine = 0; affine < 2; affine++) {
            for (int t = 0; t < 2; t++) ln_run(dt, rms, affine, x, w, b, gy, rows, n, t + 1, &o[t]);
            const char *kind = rms ? (affine ? "rms norm (w)" : "rms norm") : (affine ? "layer norm (w, b)" : "layer norm");
            char what[96];
            snprintf(what, sizeof what, "%s %s y", dt == MP_F32 ? "f32" : "bf16", kind);
            same(o[0].y, o[1].y, data, what, rows, n);
            snprintf(what, sizeof what, "%s %s gx", dt == MP_F32 ? "f32" : "bf16", kind);
            same(o[0].gx, o[1].gx, data, what, rows, n);
            same(o[0].rstd, o[1].rstd, sizeof(float) * (size_t)rows, "rstd", rows, n);
            if (!rms) same(o[0].mean, o[1].mean, sizeof(float) * (size_t)rows, "mean", rows, n);
            if (affine) same(o[0].gw, o[1].gw, sizeof(float) * (size_t)n, "gw", rows, n);
            if (affine && !rms) same(o[0].gb, o[1].gb, sizeof(float) * (size_t)n, "gb", rows, n);
        }
    for (int t = 0; t < 2; t++)
        free(o[t].y), free(o[t].gx), free(o[t].mean), free(o[t].rstd), free(o[t].gw), free(o[t].gb);
    free(x), free(gy), free(w), free(b);
}

Test(norm_threads, layer_norm_same_bits_on_1_and_2_threads)
{
    /* widths: under a vector, vector tails, the GPT's 128, a long ragged row;
     * rows: fewer than four, 4-row tails, and enough to pass MP_PAR_MIN */
    static const int64_t widths[] = { 1, 7, 16, 33, 128, 301 };
    static const int64_t rows_small[] = { 1, 3, 5, 130 };
    unsigned seed = 1;
    mp_dtype dts[] = { MP_F32, MP_BF16 };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
            for (size_t r = 0; r < sizeof rows_small / sizeof rows_small[0]; r++)
                ln_case(dts[d], rows_small[r], widths[i], seed++);
            int64_t big = (MP_PAR_MIN + widths[i] - 1) / widths[i] + 3;   /* past the split, rows % 4 == 3 or so */
            ln_case(dts[d], big, widths[i], seed++);
        }
}

/* cpu_reduce's sum (and mean) over the rows of {rows, cols} on 1 and 2 threads */
static void colsum_case(mp_dtype dt, mp_redop op, int64_t rows, int64_t cols, unsigned seed, int cancel)
{
    size_t es = mp_dtype_size(dt);
    void *a = alloc((size_t)(rows * cols) * es), *o1 = alloc((size_t)cols * es), *o2 = alloc((size_t)cols * es);
    fill_wide(dt, a, rows * cols, &seed, 8.0f, 0.25f, dt != MP_F16);   /* f16: no such range */
    if (cancel)   /* rows of small, 2^60, -2^60 in turn: a sum that a cut between a small and 2^60 changes */
        for (int64_t j = 0; j < rows; j++)
            for (int64_t q = 0; q < cols; q++) {
                float v = j % 3 == 0 ? (float)(1 + q % 5) : j % 3 == 1 ? 0x1p60f : -0x1p60f;
                if (dt == MP_F32) ((float *)a)[j * cols + q] = v;
                else ((uint16_t *)a)[j * cols + q] = mp_f32_to_bf16(v);
            }
    mp_kctx *cx = mp_cpu_backend.ctx;
    int was = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu_reduce(cx, op, dt, o1, a, 1, rows, cols);
    omp_set_num_threads(2);
    cpu_reduce(cx, op, dt, o2, a, 1, rows, cols);
    omp_set_num_threads(was);
    char what[64];
    snprintf(what, sizeof what, "%s column %s", dt == MP_F32 ? "f32" : dt == MP_BF16 ? "bf16" : "f16",
             op == MP_SUM ? "sums" : "means");
    same(o1, o2, (size_t)cols * es, what, rows, cols);
    free(a), free(o1), free(o2);
}

Test(norm_threads, column_sums_same_bits_on_1_and_2_threads)
{
    /* columns: a COLS tail alone, COLS exactly, COLS plus a tail, two blocks'
     * worth less one (the chunked path takes fewer than 4 blocks of columns),
     * the GPT's bias widths; rows past MP_PAR_MIN, not a multiple of 16 */
    static const int64_t cols[] = { 3, 31, 32, 33, 95, 128, 200, 384 };
    unsigned seed = 3;
    mp_dtype dts[] = { MP_F32, MP_BF16, MP_F16 };
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
            int64_t big = (MP_PAR_MIN + cols[i] - 1) / cols[i] + 13;
            colsum_case(dts[d], MP_SUM, big, cols[i], seed++, 0);
            colsum_case(dts[d], MP_MEAN, big, cols[i], seed++, 0);
            colsum_case(dts[d], MP_SUM, 2048, cols[i], seed++, 0);   /* the GPT's B*T rows */
            colsum_case(dts[d], MP_SUM, 67, cols[i], seed++, 0);      /* under the split */
            for (int64_t extra = 0; extra < 3 && dts[d] != MP_F16; extra++)
                colsum_case(dts[d], MP_SUM, big + extra, cols[i], seed++, 1);
        }
}
