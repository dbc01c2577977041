/*
 * test_layout_threads.c: narrow, narrow_put and narrow_pad (add 0 and add 1)
 * on 2 threads against a plain loop over the elements and against 1 thread,
 * byte for byte.
 *
 * The three split their output as one flat range of elements among the
 * threads, so a run of a row (before, inside or after the slice) can start or
 * end at a thread's cut: the shapes are sized past MP_PAR_MIN so that 2
 * threads really split, with few rows on purpose (one row: the GPT's q, k, v
 * slabs of one {3, B, H, T, Dh} tensor, where a split by rows gave one thread
 * everything), cuts inside the slice and outside it, slices at the start and
 * the end, a whole row, and many short rows. add 1 must add 0 outside the
 * slice (-0 + 0 is +0: -0 is planted in out) and in inside it; the loop
 * computes that in f32 and i32/u8 (their adds are exact C adds), and f16/bf16
 * are compared with 1 thread (whose runs are each row's whole runs).
 */
#include <criterion/criterion.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"

typedef struct { int64_t outer, n, start, len, inner; } shape;

static const shape SHAPES[] = {
    {1, 3, 1, 1, (1 << 18) + 77},   /* one row, the slice in the middle: the cut falls inside it */
    {1, 3, 0, 1, (1 << 18) + 5},    /* one row, the slice first: the cut falls after it */
    {1, 2, 1, 1, 270001},           /* one row, the slice last */
    {3, 5, 2, 2, 45001},            /* three rows */
    {8000, 3, 0, 3, 11},            /* the whole row, many rows */
    {270001, 3, 2, 1, 1},           /* many short rows, inner 1 */
};
static const mp_dtype DTS[] = {MP_F32, MP_BF16, MP_F16, MP_I32, MP_U8};
static const char *DTN[] = {"f32", "bf16", "f16", "i32", "u8"};

static void *alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert(p);
    return p;
}

/* random bytes, -0 planted every 7th element (f32, f16, bf16) */
static void fill(mp_dtype dt, void *p, int64_t n, unsigned *seed)
{
    size_t es = mp_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        float v = ((float)rand_r(seed) / (float)RAND_MAX - 0.5f) * 8.0f;
        if (i % 7 == 0) v = -0.0f;
        switch (dt) {
        case MP_F32: ((float *)p)[i] = v; break;
        case MP_F16: ((uint16_t *)p)[i] = mp_f32_to_f16(v); break;
        case MP_BF16: ((uint16_t *)p)[i] = mp_f32_to_bf16(v); break;
        default: for (size_t k = 0; k < es; k++) ((unsigned char *)p)[(size_t)i * es + k] = (unsigned char)rand_r(seed);
        }
    }
}

/* element i of a padded gradient's add: out + 0 or out + in, exact C adds */
static void add_ref(mp_dtype dt, void *out, int64_t i, const void *in, int64_t j)
{
    switch (dt) {
    case MP_F32: ((float *)out)[i] += j < 0 ? 0.0f : ((const float *)in)[j]; break;
    case MP_I32: ((uint32_t *)out)[i] += j < 0 ? 0u : ((const uint32_t *)in)[j]; break;
    case MP_U8: ((uint8_t *)out)[i] += j < 0 ? 0 : ((const uint8_t *)in)[j]; break;
    default: cr_assert_fail("add_ref: no loop for dtype %d", (int)dt);
    }
}

/* what: 0 narrow, 1 narrow_put, 2 narrow_pad add 0, 3 narrow_pad add 1 */
static void run(int what, mp_dtype dt, const shape *s, void *out, const void *in, int threads)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    int was = omp_get_max_threads();
    omp_set_num_threads(threads);
    if (what == 0) cpu_narrow(cx, dt, out, in, s->outer, s->n, s->start, s->len, s->inner);
    else if (what == 1) cpu_narrow_put(cx, dt, out, in, s->outer, s->n, s->start, s->len, s->inner);
    else cpu_narrow_pad(cx, dt, out, in, s->outer, s->n, s->start, s->len, s->inner, what == 3);
    omp_set_num_threads(was);
}

static const char *NAMES[] = {"narrow", "narrow_put", "narrow_pad add 0", "narrow_pad add 1"};

Test(layout_threads, narrows_split_by_elements_have_the_loops_bytes)
{
    unsigned seed = 7;
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++)
        for (size_t d = 0; d < sizeof DTS / sizeof DTS[0]; d++)
            for (int what = 0; what < 4; what++) {
                const shape *s = &SHAPES[si];
                mp_dtype dt = DTS[d];
                size_t es = mp_dtype_size(dt);
                int64_t big = s->outer * s->n * s->inner, small = s->outer * s->len * s->inner;
                cr_assert((what < 2 ? small : big) >= (int64_t)1 << 18, "shape %zu too small to split", si);
                /* narrow reads the big side; the others write it */
                int64_t nin = what == 0 ? big : small, nout = what == 0 ? small : big;
                void *in = alloc((size_t)nin * es), *start = alloc((size_t)nout * es);
                void *want = alloc((size_t)nout * es), *one = alloc((size_t)nout * es), *two = alloc((size_t)nout * es);
                fill(dt, in, nin, &seed);
                fill(dt, start, nout, &seed);
                memcpy(want, start, (size_t)nout * es);
                memcpy(one, start, (size_t)nout * es);
                memcpy(two, start, (size_t)nout * es);
                /* the loop, element by element */
                for (int64_t o = 0; o < s->outer; o++)
                    for (int64_t k = 0; k < s->n; k++)
                        for (int64_t i = 0; i < s->inner; i++) {
                            int64_t b = (o * s->n + k) * s->inner + i, inside = k >= s->start && k < s->start + s->len;
                            int64_t f = inside ? (o * s->len + k - s->start) * s->inner + i : -1;
                            if (what == 0 && inside) memcpy((char *)want + f * es, (char *)in + b * es, es);
                            if (what == 1 && inside) memcpy((char *)want + b * es, (char *)in + f * es, es);
                            if (what == 2) {
                                if (inside) memcpy((char *)want + b * es, (char *)in + f * es, es);
                                else memset((char *)want + b * es, 0, es);
                            }
                            if (what == 3 && (dt == MP_F32 || dt == MP_I32 || dt == MP_U8)) add_ref(dt, want, b, in, f);
                        }
                run(what, dt, s, one, in, 1);
                run(what, dt, s, two, in, 2);
                cr_assert(!memcmp(one, two, (size_t)nout * es), "%s %s shape %zu: 2 threads differ from 1",
                          NAMES[what], DTN[d], si);
                if ((what < 3 || dt == MP_F32 || dt == MP_I32 || dt == MP_U8) &&
                    memcmp(two, want, (size_t)nout * es))
                    for (int64_t i = 0; i < nout; i++)
                        cr_assert(!memcmp((char *)two + i * es, (char *)want + i * es, es),
                                  "%s %s shape %zu: element %lld differs from the loop's", NAMES[what], DTN[d], si,
                                  (long long)i);
                free(in), free(start), free(want), free(one), free(two);
            }
}
