/*
 * cpu_reduce.c: sum, mean, max, argmax, min and argmin over the middle axis of an
 * {outer, n, inner} view. Sums accumulate in double on the CPU (the reference
 * backend errs on the accurate side) and round once into the output dtype
 * (f64 sums are plain double sums: nothing wider to accumulate in).
 * max and min propagate NaN, and argmax/argmin take the first maximum/minimum,
 * NaN winning either way (the first NaN), as PyTorch does.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include "kernels/cpu/cpu.h"

#define get cpu_get_f64

static void put(mp_kctx *cx, mp_dtype dt, void *p, int64_t i, double v)
{
    float f = (float)v;
    switch (dt) {
    case MP_F32: ((float *)p)[i] = f; break;
    case MP_F64: ((double *)p)[i] = v; break;
    case MP_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(int64_t)v; break;
    case MP_U8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
    case MP_E4M3:   /* (not reached: the engine gives FP8 to no op that computes) */
    case MP_E5M2:
    case MP_F16:
    case MP_BF16: cpu_store(cx, dt, p, i, &f, 1); break;
    }
}

/* sum of n contiguous elements, widened blockwise */
static double sum_run(mp_dtype dt, const void *a, int64_t off, int64_t n)
{
    double s = 0;
    if (dt == MP_F32) {
        const float *x = (const float *)a + off;
        for (int64_t j = 0; j < n; j++) s += x[j];
    } else if (dt == MP_F64) {
        const double *x = (const double *)a + off;
        for (int64_t j = 0; j < n; j++) s += x[j];
    } else if (dt == MP_F16 || dt == MP_BF16) {
        float buf[MP_BLOCK];
        for (int64_t j = 0; j < n; j += MP_BLOCK) {
            int64_t len = n - j < MP_BLOCK ? n - j : MP_BLOCK;
            cpu_load(dt, a, off + j, buf, len);
            for (int64_t q = 0; q < len; q++) s += buf[q];
        }
    } else {
        int64_t is = 0;
        for (int64_t j = 0; j < n; j++) is += (int64_t)get(dt, a, off + j);
        s = (double)is;
    }
    return s;
}

/* one output element: the reduction of a[o*n*inner + j*inner + i] over j */
static void reduce_one(mp_kctx *cx, mp_redop op, mp_dtype dt, void *out, const void *a, int64_t o, int64_t n,
                       int64_t inner, int64_t i)
{
    int64_t base = o * n * inner + i;
    if (op == MP_SUM || op == MP_MEAN) {
        double s = 0;
        if (inner == 1) s = sum_run(dt, a, base, n);
        else for (int64_t j = 0; j < n; j++) s += get(dt, a, base + j * inner);
        put(cx, dt, out, o * inner + i, op == MP_MEAN ? s / (double)n : s);
        return;
    }
    double best = get(dt, a, base);
    int64_t at = 0;
    bool lo = op == MP_MIN || op == MP_ARGMIN;
    for (int64_t j = 1; j < n && !isnan(best); j++) {
        double v = get(dt, a, base + j * inner);
        if ((lo ? v < best : v > best) || isnan(v)) best = v, at = j;
    }
    if (op == MP_MAX || op == MP_MIN) put(cx, dt, out, o * inner + i, best);
    else ((int32_t *)out)[o * inner + i] = (int32_t)at;
}

/* sums over the middle axis when it is not the last: whole rows of `inner`
 * values add into a double accumulator, so the loads stay contiguous */
static void sum_rows(mp_kctx *cx, mp_redop op, mp_dtype dt, void *out, const void *a, int64_t o, int64_t n,
                     int64_t inner, int64_t i0, int64_t len)
{
    double acc[MP_BLOCK] = {0};
    float buf[MP_BLOCK];
    for (int64_t j = 0; j < n; j++) {
        int64_t base = (o * n + j) * inner + i0;
        if (dt == MP_F32) {
            const float *x = (const float *)a + base;
            for (int64_t q = 0; q < len; q++) acc[q] += x[q];
        } else if (dt == MP_F16 || dt == MP_BF16) {
            cpu_load(dt, a, base, buf, len);
            for (int64_t q = 0; q < len; q++) acc[q] += buf[q];
        } else {
            for (int64_t q = 0; q < len; q++) acc[q] += get(dt, a, base + q);
        }
    }
    for (int64_t q = 0; q < len; q++) put(cx, dt, out, o * inner + i0 + q, op == MP_MEAN ? acc[q] / (double)n : acc[q]);
}

/* Column sums with few columns and many rows (a bias's gradient: {2048, 384}
 * -> {384}) have too few column blocks to share: the rows are cut into
 * ROW_CHUNKS fixed chunks, each summed in double in row order, the chunks then
 * added in order. The cut depends on the shape alone, so the bits do not
 * depend on the number of threads. */
#define ROW_CHUNKS 16

/* COLS columns of rows [j0, j1) summed in double, each column in row order from
 * 0, into acc: the accumulators stay in registers across the rows (the
 * order of each column's sum is the order of one row at a time). bf16 widens
 * in place (a shift); f16 through cpu_load, COLS at a time. */
#define COLS 32

MP_SIMD static void col_sums(mp_dtype dt, const void *a, int64_t j0, int64_t j1, int64_t inner, int64_t q0,
                             double *acc)
{
    double s[COLS] = {0};
    if (dt == MP_F32) {
        for (int64_t j = j0; j < j1; j++) {
            const float *x = (const float *)a + j * inner + q0;
            for (int q = 0; q < COLS; q++) s[q] += x[q];
        }
    } else if (dt == MP_BF16) {
        for (int64_t j = j0; j < j1; j++) {
            const uint16_t *x = (const uint16_t *)a + j * inner + q0;
            for (int q = 0; q < COLS; q++) {
                union { uint32_t u; float f; } v = {.u = (uint32_t)x[q] << 16};
                s[q] += v.f;
            }
        }
    } else {
        float buf[COLS];
        for (int64_t j = j0; j < j1; j++) {
            cpu_load(dt, a, j * inner + q0, buf, COLS);
            for (int q = 0; q < COLS; q++) s[q] += buf[q];
        }
    }
    for (int q = 0; q < COLS; q++) acc[q] = s[q];
}

static int sum_rows_chunked(mp_kctx *cx, mp_redop op, mp_dtype dt, void *out, const void *a, int64_t n, int64_t inner)
{
    double *part = cpu_scratch(cx, 2, sizeof(double) * (size_t)(ROW_CHUNKS * inner));
    if (!part) return -1;
    int64_t wide = inner / COLS * COLS;   /* columns summed COLS at a time; the rest as before */
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < ROW_CHUNKS; c++) {
        double *acc = part + c * inner;
        int64_t j0 = n * c / ROW_CHUNKS, j1 = n * (c + 1) / ROW_CHUNKS;
        for (int64_t q0 = 0; q0 < wide; q0 += COLS) col_sums(dt, a, j0, j1, inner, q0, acc + q0);
        if (wide == inner) continue;
        float buf[COLS];
        int64_t len = inner - wide;
        for (int64_t q = wide; q < inner; q++) acc[q] = 0;
        for (int64_t j = j0; j < j1; j++) {
            cpu_load(dt, a, j * inner + wide, buf, len);
            for (int64_t q = 0; q < len; q++) acc[wide + q] += buf[q];
        }
    }
    for (int64_t q = 0; q < inner; q++) {
        double s = 0;
        for (int64_t c = 0; c < ROW_CHUNKS; c++) s += part[c * inner + q];
        put(cx, dt, out, q, op == MP_MEAN ? s / (double)n : s);
    }
    return 0;
}

void cpu_reduce(mp_kctx *cx, mp_redop op, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner)
{
    if ((op == MP_SUM || op == MP_MEAN) && inner > 1 && (dt != MP_I32 || n < (1 << 20))) {
        int64_t blocks = (inner + MP_BLOCK - 1) / MP_BLOCK;
        if (outer == 1 && blocks < 4 && n >= 4 * ROW_CHUNKS && (dt == MP_F32 || dt == MP_F16 || dt == MP_BF16) && n * inner >= MP_PAR_MIN &&
            sum_rows_chunked(cx, op, dt, out, a, n, inner) == 0)
            return;
        #pragma omp parallel for if (outer * n * inner >= MP_PAR_MIN) schedule(static)
        for (int64_t it = 0; it < outer * blocks; it++) {
            int64_t o = it / blocks, i0 = (it % blocks) * MP_BLOCK;
            sum_rows(cx, op, dt, out, a, o, n, inner, i0, inner - i0 < MP_BLOCK ? inner - i0 : MP_BLOCK);
        }
        return;
    }
    int64_t items = outer * inner;
    if (items == 1 && (op == MP_SUM || op == MP_MEAN) && n >= MP_PAR_MIN) {
        /* one long sum: split it over threads, combine the partial sums in order */
        double part[64] = {0};
        int64_t chunk = (n + 63) / 64;
        #pragma omp parallel for schedule(static)
        for (int c = 0; c < 64; c++) {
            int64_t s = c * chunk, e = s + chunk < n ? s + chunk : n;
            if (s < e) part[c] = sum_run(dt, a, s, e - s);
        }
        double s = 0;
        for (int c = 0; c < 64; c++) s += part[c];
        put(cx, dt, out, 0, op == MP_MEAN ? s / (double)n : s);
        return;
    }
    #pragma omp parallel for if (items * n >= MP_PAR_MIN) schedule(static)
    for (int64_t it = 0; it < items; it++)
        reduce_one(cx, op, dt, out, a, it / inner, n, inner, it % inner);
}
