/*
 * test_conv.c: the CPU convolution kernels (kernels/cpu/cpu_conv.c and, with
 * oneDNN on, its convolution primitives in cpu_conv_dnnl.c) against the exact
 * convolution (double) of the same stored values, forward and every gradient,
 * in f32, f16 and bf16, with oneDNN and without it (the im2col path: OpenBLAS
 * for f32, widening for bf16), over shapes with stride, padding, dilation,
 * groups and depthwise, 1 x 1 projections, no images, a batch cut into chunks
 * (im2col) and into chunks with a shorter last one (oneDNN's weight gradient,
 * forward and backward data: the same bits as the whole batch's).
 *
 * Bound: f32 accumulation over K terms, in any order (the im2col GEMM's, or
 * oneDNN's blocks of channels and taps; for the weight gradient, K = n oh ow:
 * each chunk of images summed, then the chunks' partial sums added), differs
 * from the exact sum by at most (K + 2) 2^-24 of the terms' magnitudes summed
 * (K - 1 additions and one rounding of each product, each at most 2^-24
 * relative, to first order). The one rounding into f16/bf16 adds half an ulp
 * of the result (2^-11, 2^-8 relative), and the exact value may sit on the
 * other side of a rounding boundary: one ulp allowed. Also: the bits of every
 * output do not depend on the thread count (1 or 2) on every path - oneDNN's
 * primitives, the im2col path on oneDNN's GEMMs and on OpenBLAS - and
 * oneDNN's path is the one taken on the ResNet's shapes. The properties of
 * oneDNN's path itself (chunks, blocked weight gradient, own reorders) are
 * checked where oneDNN takes the shape (cpu_conv_dnnl_takes), which is every
 * dtype: f32 and f16 on x86-64's JIT kernels, bf16 on oneDNN's bf16 kernels
 * where the processor has AVX-512 BF16, else widened onto the f32 ones.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu_dnnl.h"
#include "kernels/half.h"

static void put(mp_dtype dt, void *p, int64_t i, float v)
{
    if (dt == MP_F32) ((float *)p)[i] = v;
    else if (dt == MP_F16) ((uint16_t *)p)[i] = mp_f32_to_f16(v);
    else ((uint16_t *)p)[i] = mp_f32_to_bf16(v);
}

static double get(mp_dtype dt, const void *p, int64_t i)
{
    if (dt == MP_F32) return ((const float *)p)[i];
    if (dt == MP_F16) return mp_f16_to_f32(((const uint16_t *)p)[i]);
    return mp_bf16_to_f32(((const uint16_t *)p)[i]);
}

static void *rand_buf(mp_dtype dt, int64_t n, unsigned *seed)
{
    void *p = malloc(4 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) put(dt, p, i, (float)(rand_r(seed) % 2001 - 1000) / 700.0f);
    return p;
}

/* the relative rounding of a result in dt (one ulp: the exact value may be a
 * rounding boundary away) */
static double ulp(mp_dtype dt) { return dt == MP_F32 ? 0 : dt == MP_F16 ? ldexp(1, -10) : ldexp(1, -7); }

static const char *dn(mp_dtype dt) { return dt == MP_F32 ? "f32" : dt == MP_F16 ? "f16" : "bf16"; }

static void close_to(mp_dtype dt, double got, double want, double mag, int64_t terms, const char *what, int64_t i)
{
    double tol = (double)(terms + 2) * ldexp(1, -24) * mag + ulp(dt) * fabs(want) + 1e-30;
    if (dt == MP_F16) tol += ldexp(1, -24);   /* f16 subnormal spacing */
    cr_assert(fabs(got - want) <= tol, "%s %s[%ld]: %.9g, exact %.9g (tol %.3g)", dn(dt), what, (long)i, got,
              want, tol);
}

static void check(mp_dtype dt, const mp_conv_args *a0)
{
    mp_conv_args a = *a0;
    a.oh = (a.h + 2 * a.ph - a.dh * (a.r - 1) - 1) / a.sh + 1;
    a.ow = (a.w + 2 * a.pw - a.dw * (a.s - 1) - 1) / a.sw + 1;
    int64_t cg = a.c / a.groups, kg = a.k / a.groups;
    int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * cg * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
    unsigned seed = (unsigned)(nx + nw * 7);
    void *x = rand_buf(dt, nx, &seed), *w = rand_buf(dt, nw, &seed), *b = rand_buf(dt, a.k, &seed);
    void *gy = rand_buf(dt, ny, &seed), *y = malloc(4 * (size_t)ny), *gx = malloc(4 * (size_t)nx);
    void *gw = malloc(4 * (size_t)nw);
    float *gb = malloc(4 * (size_t)a.k);
    double *gxr = calloc((size_t)nx, sizeof(double)), *gxm = calloc((size_t)nx, sizeof(double));
    double *gwr = calloc((size_t)nw, sizeof(double)), *gwm = calloc((size_t)nw, sizeof(double));
    mp_kctx *cx = mp_cpu_backend.ctx;
    /* the gradient first: nothing it reads may be left in scratch by the forward */
    cr_assert_eq(cpu_conv2d_grad(cx, dt, gx, gw, gb, gy, x, w, &a), 0);
    cr_assert_eq(cpu_conv2d(cx, dt, y, x, w, b, &a), 0);
    for (int64_t n = 0; n < a.n; n++)
        for (int64_t k = 0; k < a.k; k++) {
            int64_t g = k / kg;
            for (int64_t i = 0; i < a.oh; i++)
                for (int64_t j = 0; j < a.ow; j++) {
                    int64_t yi = ((n * a.k + k) * a.oh + i) * a.ow + j;
                    double s = get(dt, b, k), mag = fabs(s), gyv = get(dt, gy, yi);
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t u = 0; u < a.r; u++)
                            for (int64_t v = 0; v < a.s; v++) {
                                int64_t ih = i * a.sh - a.ph + u * a.dh, iw = j * a.sw - a.pw + v * a.dw;
                                if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) continue;
                                int64_t xi = ((n * a.c + g * cg + c) * a.h + ih) * a.w + iw;
                                int64_t wi = ((k * cg + c) * a.r + u) * a.s + v;
                                double t = get(dt, x, xi) * get(dt, w, wi);
                                s += t, mag += fabs(t);
                                gxr[xi] += gyv * get(dt, w, wi), gxm[xi] += fabs(gyv * get(dt, w, wi));
                                gwr[wi] += gyv * get(dt, x, xi), gwm[wi] += fabs(gyv * get(dt, x, xi));
                            }
                    close_to(dt, get(dt, y, yi), s, mag, cg * a.r * a.s + 1, "y", yi);
                }
        }
    int64_t terms_x = kg * a.r * a.s, terms_w = a.n * a.oh * a.ow;
    for (int64_t i = 0; i < nx; i++) close_to(dt, get(dt, gx, i), gxr[i], gxm[i], terms_x, "gx", i);
    for (int64_t i = 0; i < nw; i++) close_to(dt, get(dt, gw, i), gwr[i], gwm[i], terms_w, "gw", i);
    for (int64_t k = 0; k < a.k; k++) {
        double s = 0, m = 0;
        for (int64_t n = 0; n < a.n; n++)
            for (int64_t e = 0; e < a.oh * a.ow; e++) {
                double v = get(dt, gy, (n * a.k + k) * a.oh * a.ow + e);
                s += v, m += fabs(v);
            }
        close_to(MP_F32, gb[k], s, m, a.n * a.oh * a.ow, "gb", k);
    }
    free(x), free(w), free(b), free(gy), free(y), free(gx), free(gw), free(gb);
    free(gxr), free(gxm), free(gwr), free(gwm);
}

static const mp_conv_args shapes[] = {
    {.n = 2, .c = 3, .h = 7, .w = 6, .k = 4, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1},
    {.n = 3, .c = 4, .h = 9, .w = 8, .k = 6, .r = 3, .s = 2, .sh = 2, .sw = 3, .ph = 2, .pw = 1, .dh = 2, .dw = 1, .groups = 2},
    {.n = 2, .c = 4, .h = 5, .w = 5, .k = 4, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 4},
    {.n = 1, .c = 2, .h = 4, .w = 3, .k = 3, .r = 1, .s = 1, .sh = 1, .sw = 1, .ph = 0, .pw = 0, .dh = 1, .dw = 1, .groups = 1},
    /* 16 x 9 x 62 x 62 columns per image: chunks of 7 images */
    {.n = 9, .c = 16, .h = 64, .w = 64, .k = 2, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 0, .pw = 0, .dh = 1, .dw = 1, .groups = 1},
    /* the ResNet's stride-2 3x3 and 1x1 projection; 37 images: oneDNN's weight
     * gradient in 7 chunks of 5 and one of 2 */
    {.n = 37, .c = 16, .h = 8, .w = 8, .k = 32, .r = 3, .s = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1},
    {.n = 4, .c = 16, .h = 8, .w = 8, .k = 32, .r = 1, .s = 1, .sh = 2, .sw = 2, .ph = 0, .pw = 0, .dh = 1, .dw = 1, .groups = 1},
    /* no images */
    {.n = 0, .c = 3, .h = 5, .w = 5, .k = 4, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1},
};

static void sweep(void)
{
    static const mp_dtype dts[] = {MP_F32, MP_F16, MP_BF16};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) check(dts[d], &shapes[s]);
}

Test(conv, matches_the_exact_convolution_with_onednn) { sweep(); }

Test(conv, matches_the_exact_convolution_without_onednn)
{
    int was = cpu_dnnl_enable(0);
    sweep();
    cpu_dnnl_enable(was);
}

/* asserts that oneDNN's primitives take every direction of a (with a bias
 * forward) in dt here: every dtype must be taken - f32 and f16 by x86-64's JIT
 * kernels, bf16 by oneDNN's bf16 kernels where the processor has them, else
 * widened onto the f32 ones (cpu_conv_dnnl.c) */
static void onednn_takes(mp_dtype dt, const mp_conv_args *a, const char *test, size_t s)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    static const char *dirs[3] = {"forward", "backward data", "backward weights"};
    for (int dir = 0; dir < 3; dir++)
        cr_assert(cpu_conv_dnnl_takes(cx, dir, dt, dir == CPU_CONV_FWD, a), "%s %s shape %zu: oneDNN declines %s", test,
                  dn(dt), s, dirs[dir]);
}

/* the ResNet's shapes (bench_resnet.lua), the outputs in 1 and in 2 threads */
static const mp_conv_args resnet[] = {
    {.n = 32, .c = 3, .h = 32, .w = 32, .k = 16, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1},
    {.n = 32, .c = 16, .h = 32, .w = 32, .k = 32, .r = 3, .s = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1},
    {.n = 32, .c = 16, .h = 32, .w = 32, .k = 32, .r = 1, .s = 1, .sh = 2, .sw = 2, .ph = 0, .pw = 0, .dh = 1, .dw = 1, .groups = 1},
    {.n = 19, .c = 64, .h = 8, .w = 8, .k = 64, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1},
};

/* the ResNet's shapes and two more: 3 input channels and 4 output channels
 * (padded blocks), 37 images (a shorter last chunk); the output size filled in */
#define MORE_SHAPES (sizeof resnet / sizeof resnet[0] + 2)
static mp_conv_args more_shape(size_t s)
{
    const size_t nr = sizeof resnet / sizeof resnet[0];
    mp_conv_args a = s < nr ? resnet[s] : shapes[s == nr ? 0 : 5];
    a.oh = (a.h + 2 * a.ph - a.dh * (a.r - 1) - 1) / a.sh + 1;
    a.ow = (a.w + 2 * a.pw - a.dw * (a.s - 1) - 1) / a.sw + 1;
    return a;
}

static void outputs(mp_dtype dt, const mp_conv_args *a, const void *x, const void *w, const void *b, const void *gy,
                    char *out[4], int threads)
{
    int64_t nx = a->n * a->c * a->h * a->w, nw = a->k * a->c / a->groups * a->r * a->s, ny = a->n * a->k * a->oh * a->ow;
    size_t es = mp_dtype_size(dt);
    int was = omp_get_max_threads();
    omp_set_num_threads(threads);
    out[0] = malloc(es * (size_t)ny), out[1] = malloc(es * (size_t)nx), out[2] = malloc(es * (size_t)nw);
    out[3] = malloc(4 * (size_t)a->k);
    cr_assert_eq(cpu_conv2d(mp_cpu_backend.ctx, dt, out[0], x, w, b, a), 0);
    cr_assert_eq(cpu_conv2d_grad(mp_cpu_backend.ctx, dt, out[1], out[2], (float *)out[3], gy, x, w, a), 0);
    omp_set_num_threads(was);
}

static void same_bits_in_1_and_2_threads(void)
{
    static const mp_dtype dts[] = {MP_F32, MP_F16, MP_BF16};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof resnet / sizeof resnet[0]; s++) {
            mp_conv_args a = resnet[s];
            mp_dtype dt = dts[d];
            a.oh = (a.h + 2 * a.ph - a.dh * (a.r - 1) - 1) / a.sh + 1;
            a.ow = (a.w + 2 * a.pw - a.dw * (a.s - 1) - 1) / a.sw + 1;
            int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * a.c * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
            if (!cpu_conv_dnnl_takes(mp_cpu_backend.ctx, CPU_CONV_FWD, dt, 1, &a))
                cr_log_info("%s shape %zu: on cpu_conv.c's im2col path", dn(dt), s);
            unsigned seed = (unsigned)s + 1;
            void *x = rand_buf(dt, nx, &seed), *w = rand_buf(dt, nw, &seed), *b = rand_buf(dt, a.k, &seed);
            void *gy = rand_buf(dt, ny, &seed);
            char *one[4], *two[4];
            outputs(dt, &a, x, w, b, gy, one, 1);
            outputs(dt, &a, x, w, b, gy, two, 2);
            size_t es = mp_dtype_size(dt), bytes[4] = {es * (size_t)ny, es * (size_t)nx, es * (size_t)nw, 4 * (size_t)a.k};
            static const char *names[4] = {"y", "gx", "gw", "gb"};
            for (int i = 0; i < 4; i++) {
                cr_assert(!memcmp(one[i], two[i], bytes[i]), "%s shape %zu: %s differs between 1 and 2 threads", dn(dt),
                          s, names[i]);
                free(one[i]), free(two[i]);
            }
            free(x), free(w), free(b), free(gy);
        }
}

Test(conv, same_bits_whatever_the_thread_count_with_onednn) { same_bits_in_1_and_2_threads(); }

/* the im2col path on oneDNN's GEMMs, every dtype (bf16 on its bf16 GEMM
 * where the processor has one, else widened): oneDNN's GEMM kernels split a
 * sum among threads (AVX2: K cut for small outputs), so cpu_conv.c runs them
 * on one thread */
Test(conv, same_bits_whatever_the_thread_count_on_im2col_with_onednn_gemms)
{
    int was = cpu_conv_dnnl_convs(0);
    same_bits_in_1_and_2_threads();
    cpu_conv_dnnl_convs(was);
}

Test(conv, same_bits_whatever_the_thread_count_without_onednn)
{
    int was = cpu_dnnl_enable(0);
    same_bits_in_1_and_2_threads();
    cpu_dnnl_enable(was);
}

/* NaN in every byte of convolution's scratch (cpu.h: slots 4-12): whatever
 * the kernels read without writing first (padding lanes of blocked layouts)
 * shows up */
static void poison_scratch(void)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    for (int s = 4; s <= 12; s++)
        if (cx->scratch[s]) memset(cx->scratch[s], 0xff, cx->scratch_cap[s]);
}

/* The weight gradient on oneDNN keeps each chunk's partial in the blocked
 * layout, adds the partials there and reorders the sum once; x and gy go into
 * that layout once for the whole batch, gy's copy shared with backward data.
 * Its bits must be those of the plain path (each chunk reorders its own
 * inputs and its partial into the plain layout, where the partials are added
 * in the same order), with scratch poisoned so that padding lanes (3 input
 * channels, 4 output channels) would show. */
Test(conv, blocked_weight_gradient_has_the_plain_paths_bits)
{
    static const mp_dtype dts[] = {MP_F32, MP_F16, MP_BF16};
    mp_kctx *cx = mp_cpu_backend.ctx;
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < MORE_SHAPES; s++) {
            mp_conv_args a = more_shape(s);
            mp_dtype dt = dts[d];
            int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * a.c * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
            size_t es = mp_dtype_size(dt);
            unsigned seed = (unsigned)s + 11;
            void *x = rand_buf(dt, nx, &seed), *w = rand_buf(dt, nw, &seed), *gy = rand_buf(dt, ny, &seed);
            void *gx = malloc(es * (size_t)nx), *gw = malloc(es * (size_t)nw);
            void *gx0 = malloc(es * (size_t)nx), *gw0 = malloc(es * (size_t)nw);
            onednn_takes(dt, &a, "blocked weight gradient", s);
            poison_scratch();
            cr_assert_eq(cpu_conv_dnnl_grad(cx, dt, gx, gw, gy, x, w, &a), 3, "%s shape %zu", dn(dt), s);
            int was = cpu_conv_dnnl_blocked(0);
            poison_scratch();
            cr_assert_eq(cpu_conv_dnnl(cx, CPU_CONV_BWD_DATA, dt, gx0, gy, w, NULL, &a), 0);
            cr_assert_eq(cpu_conv_dnnl(cx, CPU_CONV_BWD_WEIGHTS, dt, gw0, x, gy, NULL, &a), 0);
            cpu_conv_dnnl_blocked(was);
            cr_assert(!memcmp(gx, gx0, es * (size_t)nx), "%s shape %zu: gx differs", dn(dt), s);
            cr_assert(!memcmp(gw, gw0, es * (size_t)nw), "%s shape %zu: gw differs from the plain path's", dn(dt), s);
            free(x), free(w), free(gy), free(gx), free(gw), free(gx0), free(gw0);
        }
}

/* Forward and backward data run on chunks of images (single-threaded plans,
 * one chunk a thread) where the batch is big enough; the bits must be those
 * of the whole batch on threaded plans: the ResNet's shapes (bias, padding
 * lanes of 3 input channels), a shorter last chunk (37 images), depthwise (9
 * images: 4 + 4 + 1), with the weight gradient sharing the chunks' gy copy.
 * On 2 threads, as here, the chunks are at least 4 a thread down to 4 images
 * (32 images in 8 of 4, 37 in 9 of 4 and one of 1), handed out dynamically. */
Test(conv, chunked_forward_and_backward_data_have_the_whole_batchs_bits)
{
    static const mp_dtype dts[] = {MP_F32, MP_F16, MP_BF16};
    mp_conv_args cases[3] = {resnet[0], resnet[1], resnet[1]};
    cases[2].n = 37;
    mp_conv_args dw = {.n = 9, .c = 32, .h = 32, .w = 32, .k = 32, .r = 3, .s = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1,
                       .dh = 1, .dw = 1, .groups = 32};
    int was = omp_get_max_threads();
    omp_set_num_threads(2);
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < 4; s++) {
            mp_conv_args a = s < 3 ? cases[s] : dw;
            mp_dtype dt = dts[d];
            a.oh = (a.h + 2 * a.ph - a.dh * (a.r - 1) - 1) / a.sh + 1;
            a.ow = (a.w + 2 * a.pw - a.dw * (a.s - 1) - 1) / a.sw + 1;
            int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * a.c / a.groups * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
            unsigned seed = (unsigned)s + 23;
            void *x = rand_buf(dt, nx, &seed), *w = rand_buf(dt, nw, &seed), *b = rand_buf(dt, a.k, &seed);
            void *gy = rand_buf(dt, ny, &seed);
            onednn_takes(dt, &a, "chunks", s);
            long runs = cpu_conv_dnnl_chunk_runs();
            char *chunked[4], *whole[4];
            poison_scratch();
            outputs(dt, &a, x, w, b, gy, chunked, 2);
            cr_assert_eq(cpu_conv_dnnl_chunk_runs() - runs, 2, "%s shape %zu: not in chunks", dn(dt), s);
            int on = cpu_conv_dnnl_chunks(0);
            runs = cpu_conv_dnnl_chunk_runs();
            poison_scratch();
            outputs(dt, &a, x, w, b, gy, whole, 2);
            cr_assert_eq(cpu_conv_dnnl_chunk_runs(), runs, "%s shape %zu: chunks while off", dn(dt), s);
            cpu_conv_dnnl_chunks(on);
            size_t es = mp_dtype_size(dt), bytes[4] = {es * (size_t)ny, es * (size_t)nx, es * (size_t)nw, 4 * (size_t)a.k};
            static const char *names[4] = {"y", "gx", "gw", "gb"};
            for (int i = 0; i < 4; i++) {
                cr_assert(!memcmp(chunked[i], whole[i], bytes[i]), "%s shape %zu: %s differs from the whole batch's",
                          dn(dt), s, names[i]);
                free(chunked[i]), free(whole[i]);
            }
            free(x), free(w), free(b), free(gy);
        }
    omp_set_num_threads(was);
}

/* the ResNet's f32 shapes take oneDNN's primitives (x86-64 has its JIT
 * kernels), every direction; with oneDNN off they are declined */
Test(conv, resnet_shapes_take_onednn_primitives)
{
    for (size_t s = 0; s < sizeof resnet / sizeof resnet[0]; s++) {
        mp_conv_args a = resnet[s];
        a.oh = (a.h + 2 * a.ph - a.dh * (a.r - 1) - 1) / a.sh + 1;
        a.ow = (a.w + 2 * a.pw - a.dw * (a.s - 1) - 1) / a.sw + 1;
        int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * a.c * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
        float *x = calloc((size_t)nx, 4), *w = calloc((size_t)nw, 4), *y = calloc((size_t)ny, 4);
        mp_kctx *cx = mp_cpu_backend.ctx;
        cr_assert_eq(cpu_conv_dnnl(cx, CPU_CONV_FWD, MP_F32, y, x, w, NULL, &a), 0, "shape %zu forward", s);
        cr_assert_eq(cpu_conv_dnnl(cx, CPU_CONV_BWD_DATA, MP_F32, x, y, w, NULL, &a), 0, "shape %zu backward data", s);
        cr_assert_eq(cpu_conv_dnnl(cx, CPU_CONV_BWD_WEIGHTS, MP_F32, w, x, y, NULL, &a), 0, "shape %zu weights", s);
        int was = cpu_dnnl_enable(0);
        cr_assert_eq(cpu_conv_dnnl(cx, CPU_CONV_FWD, MP_F32, y, x, w, NULL, &a), 1);
        cpu_dnnl_enable(was);
        free(x), free(w), free(y);
    }
}

/* cpu_conv_layout.c's transposes against oneDNN's reorder primitives, both
 * ways, in nChw16c and nhwc (f32 and bf16, AVX-512) and nChw8c (f32, AVX2),
 * on odd shapes (channels not a multiple of 8 or 16, positions not a
 * multiple of 8, 16 or 32, one image) and on one big enough to run threaded
 * (1 and 2 threads): the same bits, padding lanes included (zeros), from
 * buffers of random bits (NaNs too: a reorder moves bits) */
static void onednn_move(struct cpu_dnnl *d, const dnnl_memory_desc_t *from, void *f, const dnnl_memory_desc_t *to, void *t)
{
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnl_memory_t mf, mt;
    cr_assert_eq(dnnl_reorder_primitive_desc_create(&pd, from, d->engine, to, d->engine, NULL), dnnl_success);
    cr_assert_eq(dnnl_primitive_create(&p, pd), dnnl_success);
    cr_assert_eq(dnnl_memory_create(&mf, from, d->engine, f), dnnl_success);
    cr_assert_eq(dnnl_memory_create(&mt, to, d->engine, t), dnnl_success);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
    cr_assert_eq(dnnl_primitive_execute(p, d->stream, 2, args), dnnl_success);
    cr_assert_eq(dnnl_stream_wait(d->stream), dnnl_success);
    dnnl_memory_destroy(mf), dnnl_memory_destroy(mt), dnnl_primitive_destroy(p), dnnl_primitive_desc_destroy(pd);
}

Test(conv, own_layout_reorders_move_the_bits_as_onednn_does)
{
    struct cpu_dnnl *d = cpu_dnnl_of(mp_cpu_backend.ctx);
    cr_assert(d);
    if (!cpu_conv_layout_ok() && !cpu_conv_layout8_ok()) return;   /* neither: oneDNN's reorders stay */
    static const int64_t dims[][4] = {{1, 3, 5, 7}, {2, 17, 3, 5}, {3, 32, 4, 4}, {1, 40, 1, 33}, {2, 16, 6, 6},
                                      {1, 1, 2, 17}, {2, 9, 3, 3}, {4, 33, 64, 64}};
    static const int dts[2] = {dnnl_f32, dnnl_bf16};
    static const int tags[3] = {dnnl_aBcd16b, dnnl_acdb, dnnl_aBcd8b};
    unsigned seed = 7;
    int moved = 0;
    for (size_t s = 0; s < sizeof dims / sizeof dims[0]; s++)
        for (int di = 0; di < 2; di++)
            for (int ti = 0; ti < 3; ti++) {
                /* what this processor's transposes cover: 16 lanes on AVX-512, 8 (f32) on AVX2 */
                if (ti < 2 ? !cpu_conv_layout_ok() : !cpu_conv_layout8_ok() || dts[di] != dnnl_f32) continue;
                dnnl_memory_desc_t u, m;
                cr_assert_eq(dnnl_memory_desc_init_by_tag(&u, 4, dims[s], dts[di], dnnl_nchw), dnnl_success);
                cr_assert_eq(dnnl_memory_desc_init_by_tag(&m, 4, dims[s], dts[di], tags[ti]), dnnl_success);
                cpu_conv_layout l;
                cr_assert(cpu_conv_layout_of(&m, &u, &l), "shape %zu dt %d tag %d: not taken", s, di, ti);
                size_t ub = dnnl_memory_desc_get_size(&u), mb = dnnl_memory_desc_get_size(&m);
                unsigned char *plain = malloc(ub), *blk = malloc(mb), *a = malloc(mb > ub ? mb : ub),
                              *b = malloc(mb > ub ? mb : ub);
                for (size_t i = 0; i < ub; i++) plain[i] = (unsigned char)rand_r(&seed);
                for (size_t i = 0; i < mb; i++) blk[i] = (unsigned char)rand_r(&seed);
                size_t es = dts[di] == dnnl_f32 ? 4 : 2;
                for (int threads = 1; threads <= 2; threads++) {
                    int was = omp_get_max_threads();
                    omp_set_num_threads(threads);
                    /* plain -> layout (the buffers poisoned differently: padding must be written) */
                    memset(a, 0x11, mb), memset(b, 0x22, mb);
                    onednn_move(d, &u, plain, &m, a);
                    cpu_conv_layout_move(0, es, plain, b, &l);
                    cr_assert(!memcmp(a, b, mb), "shape %zu dt %d tag %d threads %d: into the layout differs", s, di, ti,
                              threads);
                    /* layout (random padding lanes) -> plain */
                    memset(a, 0x11, ub), memset(b, 0x22, ub);
                    onednn_move(d, &m, blk, &u, a);
                    cpu_conv_layout_move(1, es, blk, b, &l);
                    cr_assert(!memcmp(a, b, ub), "shape %zu dt %d tag %d threads %d: out of the layout differs", s, di,
                              ti, threads);
                    omp_set_num_threads(was);
                }
                moved++;
                free(plain), free(blk), free(a), free(b);
            }
    /* every case that this processor's transposes cover ran */
    cr_assert_eq(moved, (int)(sizeof dims / sizeof dims[0]) * ((cpu_conv_layout_ok() ? 4 : 0) + (cpu_conv_layout8_ok() ? 1 : 0)));
}

/* the convolutions with the own reorders give oneDNN's reorders' bits, every
 * direction and dtype, scratch poisoned (padding lanes would show) */
Test(conv, own_layout_reorders_give_the_same_convolutions)
{
    static const mp_dtype dts[] = {MP_F32, MP_F16, MP_BF16};
    mp_kctx *cx = mp_cpu_backend.ctx;
    if (!cpu_conv_layout_ok() && !cpu_conv_layout8_ok()) {   /* neither: the own reorders never run, oneDNN's stay */
        cr_log_info("own reorders: neither AVX-512 nor AVX2 here, cpu_conv_layout.c's transposes do not run; skipped");
        return;
    }
    for (size_t d = 0; d < 3; d++) {
        long runs0 = cpu_conv_dnnl_own_runs();
        for (size_t s = 0; s < MORE_SHAPES; s++) {
            mp_conv_args a = more_shape(s);
            mp_dtype dt = dts[d];
            int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * a.c * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
            size_t es = mp_dtype_size(dt);
            unsigned seed = (unsigned)s + 21;
            void *x = rand_buf(dt, nx, &seed), *w = rand_buf(dt, nw, &seed), *gy = rand_buf(dt, ny, &seed);
            void *b = rand_buf(dt, a.k, &seed);
            onednn_takes(dt, &a, "own reorders", s);
            char *out[2][3];
            long runs = cpu_conv_dnnl_own_runs();
            for (int own = 0; own < 2; own++) {
                int was = cpu_conv_dnnl_own_reorders(own);
                out[own][0] = malloc(es * (size_t)ny), out[own][1] = malloc(es * (size_t)nx);
                out[own][2] = malloc(es * (size_t)nw);
                poison_scratch();
                cr_assert_eq(cpu_conv_dnnl(cx, CPU_CONV_FWD, dt, out[own][0], x, w, b, &a), 0);
                poison_scratch();
                cr_assert_eq(cpu_conv_dnnl_grad(cx, dt, out[own][1], out[own][2], gy, x, w, &a), 3);
                cpu_conv_dnnl_own_reorders(was);
                /* oneDNN's only while off */
                if (own == 0) cr_assert_eq(cpu_conv_dnnl_own_runs(), runs, "%s shape %zu: own reorders ran while off", dn(dt), s);
            }
            size_t bytes[3] = {es * (size_t)ny, es * (size_t)nx, es * (size_t)nw};
            static const char *names[3] = {"y", "gx", "gw"};
            for (int i = 0; i < 3; i++) {
                cr_assert(!memcmp(out[0][i], out[1][i], bytes[i]), "%s shape %zu: %s differs with the own reorders",
                          dn(dt), s, names[i]);
                free(out[0][i]), free(out[1][i]);
            }
            free(x), free(w), free(gy), free(b);
        }
        /* the comparison meant something: the own reorders ran for this dtype's shapes */
        cr_assert_gt(cpu_conv_dnnl_own_runs(), runs0, "%s: no own reorder ran on any shape", dn(dts[d]));
    }
}

/* bf16 where oneDNN has no bf16 primitive (oneDNN 2.6 makes none on AVX2)
 * takes the f16 route: operands widened to f32, the f32 primitive, each
 * output rounded once. Its bits must be those of the f32 convolution of the
 * widened operands (the same f32 primitives, called in f32) rounded once -
 * forward with bias, backward data, backward weights, each alone and both
 * gradients together - in 1 and in 2 threads; with flush counting on, the
 * same bits and each output counted once, with its rounding's flushes. Checked
 * wherever the route runs by itself (cpu_conv_dnnl_widened_runs tells), and
 * with the tests' switch that sends every bf16 convolution there (processors
 * with bf16 primitives), on the ResNet's shapes, a shorter last chunk, padded
 * channel blocks, groups with strides and dilation, and depthwise. */
static uint16_t *rounded_bf16(const float *f, int64_t n)
{
    uint16_t *h = malloc(2 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) h[i] = mp_f32_to_bf16(f[i]);
    return h;
}

static float *widened_bf16(const uint16_t *h, int64_t n)
{
    float *f = malloc(4 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) f[i] = mp_bf16_to_f32(h[i]);
    return f;
}

/* the three directions of a in bf16, one cpu_conv_dnnl call each, into out
 * (each its own call: routed[dir] 1 where it took the f16 route) */
static void bf16_directions(const mp_conv_args *a, const void *x, const void *w, const void *b, const void *gy,
                            char *out[3], int routed[3])
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    const void *in0[3] = {x, gy, x}, *in1[3] = {w, w, gy};
    for (int dir = 0; dir < 3; dir++) {
        long r0 = cpu_conv_dnnl_widened_runs();
        int got = cpu_conv_dnnl(cx, dir, MP_BF16, out[dir], in0[dir], in1[dir], dir == CPU_CONV_FWD ? b : NULL, a);
        routed[dir] = (int)(cpu_conv_dnnl_widened_runs() - r0);
        cr_assert(routed[dir] == 0 || (routed[dir] == 1 && got == 0), "direction %d: %d runs, returned %d", dir,
                  routed[dir], got);
    }
}

Test(conv, bf16_without_bf16_primitives_is_the_f32_convolution_rounded_once)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    int threads = omp_get_max_threads();
    cpu_flush saved = cx->flush;
    mp_conv_args cases[MORE_SHAPES + 2];
    for (size_t s = 0; s < MORE_SHAPES; s++) cases[s] = more_shape(s);
    cases[MORE_SHAPES] = shapes[1], cases[MORE_SHAPES + 1] = shapes[2];   /* groups, depthwise */
    for (size_t s = MORE_SHAPES; s < MORE_SHAPES + 2; s++) {
        mp_conv_args *a = &cases[s];
        a->oh = (a->h + 2 * a->ph - a->dh * (a->r - 1) - 1) / a->sh + 1;
        a->ow = (a->w + 2 * a->pw - a->dw * (a->s - 1) - 1) / a->sw + 1;
    }
    long checked[2] = {0, 0};
    for (int forced = 0; forced < 2; forced++) {
        int was = cpu_conv_dnnl_bf16_widen(forced);
        for (size_t s = 0; s < MORE_SHAPES + 2; s++) {
            const mp_conv_args *a = &cases[s];
            int64_t nx = a->n * a->c * a->h * a->w, nw = a->k * a->c / a->groups * a->r * a->s;
            int64_t ny = a->n * a->k * a->oh * a->ow, n[3] = {ny, nx, nw};
            unsigned seed = (unsigned)s + 31;
            uint16_t *x = rand_buf(MP_BF16, nx, &seed), *w = rand_buf(MP_BF16, nw, &seed);
            uint16_t *b = rand_buf(MP_BF16, a->k, &seed), *gy = rand_buf(MP_BF16, ny, &seed);
            float *xf = widened_bf16(x, nx), *wf = widened_bf16(w, nw), *bf = widened_bf16(b, a->k);
            float *gyf = widened_bf16(gy, ny);
            char *first[3] = {NULL, NULL, NULL};   /* 1 thread's outputs */
            for (int t = 1; t <= 2; t++) {
                omp_set_num_threads(t);
                /* the f32 convolution of the widened operands, rounded once */
                float *ref[3];
                int has[3];
                const float *in0[3] = {xf, gyf, xf}, *in1[3] = {wf, wf, gyf};
                for (int dir = 0; dir < 3; dir++) {
                    ref[dir] = malloc(4 * (size_t)n[dir]);
                    has[dir] = cpu_conv_dnnl(cx, dir, MP_F32, ref[dir], in0[dir], in1[dir], dir ? NULL : bf, a) == 0;
                }
                char *out[3], *both[2];
                for (int dir = 0; dir < 3; dir++) out[dir] = malloc(2 * (size_t)n[dir]);
                both[0] = malloc(2 * (size_t)nx), both[1] = malloc(2 * (size_t)nw);
                int routed[3];
                bf16_directions(a, x, w, b, gy, out, routed);
                static const char *names[3] = {"y", "gx", "gw"};
                for (int dir = 0; dir < 3; dir++) {
                    /* the switch sends every direction that has an f32 primitive */
                    if (forced) cr_assert_eq(routed[dir], has[dir], "shape %zu %s: routed %d", s, names[dir], routed[dir]);
                    if (!routed[dir]) continue;
                    cr_assert(has[dir], "shape %zu %s: widened without an f32 primitive", s, names[dir]);
                    uint16_t *want = rounded_bf16(ref[dir], n[dir]);
                    for (int64_t i = 0; i < n[dir]; i++)
                        cr_assert_eq(((uint16_t *)out[dir])[i], want[i],
                                     "shape %zu %s[%ld] in %d threads: 0x%04x, the f32 convolution's rounded 0x%04x", s,
                                     names[dir], (long)i, t, ((uint16_t *)out[dir])[i], want[i]);
                    if (t == 2)
                        cr_assert(!memcmp(first[dir], out[dir], 2 * (size_t)n[dir]),
                                  "shape %zu %s differs between 1 and 2 threads", s, names[dir]);
                    checked[forced]++;
                    free(want);
                }
                /* both gradients in one call (gy widened once, its blocked copy shared) */
                int got = cpu_conv_dnnl_grad(cx, MP_BF16, both[0], both[1], gy, x, w, a);
                for (int g = 0; g < 2; g++)
                    if (routed[g + 1]) {
                        cr_assert(got & (1 << g), "shape %zu: %s declined with the other gradient", s, names[g + 1]);
                        cr_assert(!memcmp(both[g], out[g + 1], 2 * (size_t)n[g + 1]),
                                  "shape %zu: %s differs when computed with the other gradient", s, names[g + 1]);
                    }
                /* flush counting on: the same bits, each output counted once with its rounding's flushes */
                if (routed[0] && routed[1] && routed[2]) {
                    char *counted[3];
                    for (int dir = 0; dir < 3; dir++) counted[dir] = malloc(2 * (size_t)n[dir]);
                    cpu_flush_select(&cx->flush, 0);
                    cpu_flush_take(&cx->flush, NULL, true);
                    int again[3];
                    bf16_directions(a, x, w, b, gy, counted, again);
                    int64_t counts[MP_FLUSH_SLOTS][3];
                    cpu_flush_take(&cx->flush, counts, true);
                    cpu_flush want = {.on = true};
                    for (int dir = 0; dir < 3; dir++) {
                        cr_assert(again[dir] && !memcmp(counted[dir], out[dir], 2 * (size_t)n[dir]),
                                  "shape %zu %s differs with flush counting on", s, names[dir]);
                        cpu_flush_count(&want, MP_BF16, ref[dir], (const uint16_t *)out[dir], n[dir]);
                        free(counted[dir]);
                    }
                    cr_assert_eq(counts[0][0], nx + ny + nw, "shape %zu: %ld roundings counted", s, (long)counts[0][0]);
                    for (int c = 0; c < 3; c++) cr_assert_eq(counts[0][c], want.counts[0][c], "shape %zu: count %d", s, c);
                    cx->flush = saved;
                }
                for (int dir = 0; dir < 3; dir++) {
                    free(ref[dir]);
                    if (t == 1) first[dir] = out[dir];
                    else free(out[dir]), free(first[dir]);
                }
                free(both[0]), free(both[1]);
            }
            omp_set_num_threads(threads);
            free(x), free(w), free(b), free(gy), free(xf), free(wf), free(bf), free(gyf);
        }
        cpu_conv_dnnl_bf16_widen(was);
    }
    /* with the switch every shape's every direction took the route (all have f32 primitives here) */
    cr_assert_eq(checked[1], 2 * 3 * (long)(MORE_SHAPES + 2), "%ld directions checked with the switch", checked[1]);
    cr_log_info("bf16 directions on the f16 route by themselves: %ld of %ld", checked[0], checked[1]);
}
