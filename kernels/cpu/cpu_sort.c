/*
 * cpu_sort.c: the k largest (or smallest) values of each row and where they
 * are, in order: topk, and sort when k is the row's length. Ties keep the
 * lower index first and NaN counts as larger than every number, as in PyTorch,
 * so the result does not depend on the sorting algorithm. Keys are doubles, so
 * that i32 values are compared and kept exactly (they were once widened as if
 * they were f32 bits: -1 a NaN; parity's i32 topk cases found it).
 */
#include <math.h>
#include <stdlib.h>
#include "kernels/cpu/cpu.h"

typedef struct { double v; int32_t i; } entry;

/* a before b in descending order (NaN first), lower index first among equals */
static int desc(const void *x, const void *y)
{
    const entry *a = x, *b = y;
    bool an = isnan(a->v), bn = isnan(b->v);
    if (an != bn) return an ? -1 : 1;
    if (!an && a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static int asc(const void *x, const void *y)
{
    const entry *a = x, *b = y;
    bool an = isnan(a->v), bn = isnan(b->v);
    if (an != bn) return an ? 1 : -1;
    if (!an && a->v != b->v) return a->v < b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

int cpu_topk(mp_kctx *cx, mp_dtype dt, void *values, int32_t *idx, const void *x, int64_t rows, int64_t n, int64_t k,
             int largest)
{
    entry *e = cpu_scratch(cx, 3, sizeof(entry) * (size_t)n + sizeof(float) * (size_t)(n + k));
    if (!e) return -1;
    float *row = (float *)(e + n), *out = row + n;
    const int32_t *xi = (const int32_t *)x;
    for (int64_t r = 0; r < rows; r++) {
        if (dt == MP_I32)
            for (int64_t j = 0; j < n; j++) e[j].v = xi[r * n + j], e[j].i = (int32_t)j;
        else if (dt == MP_F64)
            for (int64_t j = 0; j < n; j++) e[j].v = ((const double *)x)[r * n + j], e[j].i = (int32_t)j;
        else {
            cpu_load(dt, x, r * n, row, n);
            for (int64_t j = 0; j < n; j++) e[j].v = row[j], e[j].i = (int32_t)j;
        }
        qsort(e, (size_t)n, sizeof *e, largest ? desc : asc);
        for (int64_t j = 0; j < k; j++) idx[r * k + j] = e[j].i;
        if (dt == MP_I32) {
            for (int64_t j = 0; j < k; j++) ((int32_t *)values)[r * k + j] = (int32_t)e[j].v;
        } else if (dt == MP_F64) {
            for (int64_t j = 0; j < k; j++) ((double *)values)[r * k + j] = e[j].v;
        } else {
            for (int64_t j = 0; j < k; j++) out[j] = (float)e[j].v;
            cpu_store(cx, dt, values, r * k, out, k);
        }
    }
    return 0;
}
