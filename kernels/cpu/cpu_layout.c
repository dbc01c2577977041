/*
 * cpu_layout.c: copies that change layout: dim permutation (transpose) and
 * narrowing a middle dim. Both move whole elements as bytes, so they serve
 * every dtype.
 */
#include <omp.h>
#include <string.h>
#include "kernels/cpu/cpu.h"

/* a short contiguous run (a head's 32 values: 64 or 128 bytes): 32 bytes at a
 * time with constant-size copies the compiler inlines, not a call a row */
static inline void copy_run(char *o, const char *i, size_t n)
{
    size_t j = 0;
    for (; j + 32 <= n; j += 32) memcpy(o + j, i + j, 32);
    if (j < n) memcpy(o + j, i + j, n - j);
}

/* [*a, *b): the calling thread's even share of total items, in a parallel
 * region (cpu_permute's rows; the narrows' elements, below) */
static void flat_split(int64_t total, int64_t *a, int64_t *b)
{
    int nt = omp_get_num_threads(), t = omp_get_thread_num();
    *a = total * t / nt, *b = total * (t + 1) / nt;
}

void cpu_permute(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int ndim, const int64_t *shape, const int *perm)
{
    size_t es = mp_dtype_size(dt);
    int64_t istride[MP_MAXDIM], oshape[MP_MAXDIM], ostride_in[MP_MAXDIM], total = 1;
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) istride[d] = s, s *= shape[d];
    for (int d = 0; d < ndim; d++) {
        oshape[d] = shape[perm[d]];
        ostride_in[d] = istride[perm[d]];   /* input stride when stepping output dim d */
        total *= oshape[d];
    }
    int64_t last = oshape[ndim - 1], ls = ostride_in[ndim - 1], rows = total / last;
    /* Each thread takes a run of output rows and steps the row's source offset
     * with an odometer over the outer dims (the divisions once per run, not per
     * row: rows of a head split are 32 elements, and three divisions a row cost
     * as much as the copy). A row whose last dim stays last (ls == 1) is one
     * contiguous run: a memcpy. */
    #pragma omp parallel if (total >= MP_PAR_MIN)
    {
        int64_t r0, r1, idx[MP_MAXDIM] = {0}, src = 0, q;
        flat_split(rows, &r0, &r1);
        q = r0;
        for (int d = ndim - 2; d >= 0; d--) {
            idx[d] = q % oshape[d], q /= oshape[d];
            src += idx[d] * ostride_in[d];
        }
        const char *i = (const char *)in;
        for (int64_t r = r0; r < r1; r++) {
            char *o = (char *)out + (size_t)(r * last) * es;
            if (ls == 1) copy_run(o, i + (size_t)src * es, (size_t)last * es);
            else switch (es) {   /* every element size the dtypes have (f64's 8 was once copied a byte at a time) */
            case 8: for (int64_t j = 0; j < last; j++) ((uint64_t *)o)[j] = ((const uint64_t *)i)[src + j * ls]; break;
            case 4: for (int64_t j = 0; j < last; j++) ((uint32_t *)o)[j] = ((const uint32_t *)i)[src + j * ls]; break;
            case 2: for (int64_t j = 0; j < last; j++) ((uint16_t *)o)[j] = ((const uint16_t *)i)[src + j * ls]; break;
            default: for (int64_t j = 0; j < last; j++) memcpy(o + (size_t)j * es, i + (size_t)(src + j * ls) * es, es);
            }
            for (int d = ndim - 2; d >= 0; d--) {   /* the next row's source: carry through the dims */
                src += ostride_in[d];
                if (++idx[d] < oshape[d]) break;
                src -= idx[d] * ostride_in[d], idx[d] = 0;
            }
        }
    }
}

/* Narrow and its two inverses below split their output as one flat range of
 * elements, cut evenly among the threads (flat_split), not by rows: their rows
 * can be few and long - the GPT's q, k and v are the three slabs of one {3, B,
 * H, T, Dh} tensor, so a slab's gradient is narrow_pad of one row - and a
 * split by rows left one thread doing all of it (1.2 ms of a 28 ms bf16 step,
 * the other thread waiting). Every element is still moved or added on its
 * own, so the split changes no bit. */

/* the contiguous side's elements [a, b) of a narrow: rows of w elements there,
 * of row elements on the narrowed side with the slice lo elements in; put:
 * copied into the narrowed side, else out of it */
static void narrow_span(char *nar, char *flat, size_t es, int64_t w, int64_t row, int64_t lo, int put, int64_t a,
                        int64_t b)
{
    while (a < b) {
        int64_t r = a / w, c = a - r * w, len = w - c < b - a ? w - c : b - a;
        char *p = nar + (size_t)(r * row + lo + c) * es, *q = flat + (size_t)a * es;
        if (put) memcpy(p, q, (size_t)len * es);
        else memcpy(q, p, (size_t)len * es);
        a += len;
    }
}

void cpu_narrow(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,
                int64_t start, int64_t len, int64_t inner)
{
    size_t es = mp_dtype_size(dt);
    int64_t total = outer * len * inner;
    #pragma omp parallel if (total >= MP_PAR_MIN)
    {
        int64_t a, b;
        flat_split(total, &a, &b);
        narrow_span((char *)in, out, es, len * inner, n * inner, start * inner, 0, a, b);
    }
}

void cpu_gather(mp_kctx *cx, mp_dtype dt, void *out, const void *in, const int32_t *idx, int64_t nidx,
                int64_t outer, int64_t n, int64_t inner)
{
    size_t es = mp_dtype_size(dt), row = (size_t)inner * es;
    #pragma omp parallel for if (outer * nidx * inner >= MP_PAR_MIN) schedule(static)
    for (int64_t q = 0; q < outer * nidx; q++) {
        int64_t o = q / nidx, j = q % nidx;
        memcpy((char *)out + (size_t)q * row, (const char *)in + (size_t)(o * n + idx[j]) * row, row);
    }
}

/* sequential over indices so repeated indices add in a fixed order
 * (deterministic); integers wrap, as the engine's integer arithmetic does (u8
 * was once widened as if it were f32: 4 bytes an element, past the end) */
void cpu_scatter_add(mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx, int64_t nidx,
                     int64_t outer, int64_t n, int64_t inner)
{
    float a[MP_BLOCK], b[MP_BLOCK];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < nidx; j++) {
            int64_t dst = (o * n + idx[j]) * inner, s = (o * nidx + j) * inner;
            for (int64_t i = 0; i < inner; i += MP_BLOCK) {
                int64_t len = inner - i < MP_BLOCK ? inner - i : MP_BLOCK;
                if (dt == MP_I32) {   /* in uint32: a wrap, not signed overflow */
                    uint32_t *d = (uint32_t *)out + dst + i;
                    for (int64_t k = 0; k < len; k++) d[k] += ((const uint32_t *)src)[s + i + k];
                    continue;
                }
                if (dt == MP_F64) {
                    for (int64_t k = 0; k < len; k++) ((double *)out)[dst + i + k] += ((const double *)src)[s + i + k];
                    continue;
                }
                if (dt == MP_U8) {
                    for (int64_t k = 0; k < len; k++) ((uint8_t *)out)[dst + i + k] += ((const uint8_t *)src)[s + i + k];
                    continue;
                }
                cpu_load(dt, out, dst + i, a, len);
                cpu_load(dt, src, s + i, b, len);
                for (int64_t k = 0; k < len; k++) a[k] += b[k];
                cpu_store(cx, dt, out, dst + i, a, len);
            }
        }
}

void cpu_narrow_put(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,
                    int64_t start, int64_t len, int64_t inner)
{
    size_t es = mp_dtype_size(dt);
    int64_t total = outer * len * inner;
    #pragma omp parallel if (total >= MP_PAR_MIN)
    {
        int64_t a, b;
        flat_split(total, &a, &b);
        narrow_span(out, (char *)in, es, len * inner, n * inner, start * inner, 1, a, b);
    }
}

/* out's elements [a, b) of narrow_pad: rows of row elements, each lo outside
 * the slice, w from in's rows of w, the rest outside again */
static void pad_span(mp_kctx *cx, mp_dtype dt, char *o, const char *in, size_t es, int64_t row, int64_t lo,
                     int64_t w, int add, int64_t a, int64_t b)
{
    static const uint64_t zero = 0;   /* all-zero bits: +0 (0 for the integers) in every dtype */
    while (a < b) {
        int64_t r = a / row, c = a - r * row, inside = c >= lo && c < lo + w;
        int64_t end = c < lo ? lo : inside ? lo + w : row, len = end - c < b - a ? end - c : b - a;
        char *d = o + (size_t)a * es;
        const char *s = inside ? in + (size_t)(r * w + c - lo) * es : NULL;
        if (!add) {
            if (inside) memcpy(d, s, (size_t)len * es);
            else memset(d, 0, (size_t)len * es);
        } else cpu_add_serial(cx, dt, d, d, inside ? (const void *)s : &zero, inside, len);
        a += len;
    }
}

/* narrow's gradient (backend.h narrow_pad). The adds are cpu_binary's add
 * (cpu_add_serial) on each row's three runs (before, inside, after the
 * slice), or the parts of them in a thread's share, so each element gets the
 * add (and rounding, and flush count) the whole padded tensor's add gave it,
 * with out as the first operand as there. */
void cpu_narrow_pad(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n, int64_t start,
                    int64_t len, int64_t inner, int add)
{
    size_t es = mp_dtype_size(dt);
    int64_t row = n * inner, total = outer * row;
    #pragma omp parallel if (total >= MP_PAR_MIN)
    {
        int64_t a, b;
        flat_split(total, &a, &b);
        pad_span(cx, dt, out, in, es, row, start * inner, len * inner, add, a, b);
    }
}

void cpu_put_along(mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx,
                   int64_t outer, int64_t n, int64_t inner)
{
    size_t es = mp_dtype_size(dt);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t q = o * inner + i;
            memcpy((char *)out + (size_t)((o * n + idx[q]) * inner + i) * es, (const char *)src + (size_t)q * es, es);
        }
}
