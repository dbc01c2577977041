/*
 * cpu_conv.c: 2-d convolution, forward and backward, for every float dtype:
 * products accumulate in f32 and results are rounded once. Each direction
 * goes first to oneDNN's convolution primitives (cpu_conv_dnnl.c: twice as
 * fast on the ResNet; f16, and bf16 where oneDNN has no bf16 kernel, widened
 * to f32 for its f32 ones); what they decline (oneDNN off, a shape with only a
 * reference kernel, no images) takes the im2col + GEMM path here. The bias
 * gradient is always summed here (f64, in order).
 * f32 and f16 run through the engine's f32 GEMM (oneDNN, else OpenBLAS; f16
 * operands widened first). bf16 operands stay bf16 (columns included) and go
 * to oneDNN's bf16 GEMM with f32 results (AVX512-BF16: bf16 pairs multiplied
 * into f32 accumulators at twice the f32 rate); where oneDNN has no such kernel
 * they are widened and take the f32 GEMM, with the same numerics.
 *
 * Per group g and per image, the input's patches are unrolled into
 * col {cg r s, oh ow} (zeros where a tap falls in the padding), so that
 *   y[g]   {kg, oh ow}   = w[g] {kg, cg r s} @ col
 *   gcol   {cg r s, oh ow} = w[g]^T @ gy[g], folded back into gx (col2im)
 *   gw[g] += gy[g] @ col^T                     (images in order)
 * Images go through in chunks whose columns fit in COL_FLOATS, so the working
 * memory is bounded whatever the batch; the sums are the same for any chunking
 * and thread count (each output element is one GEMM dot product, gw adds the
 * images in order, and each GEMM runs on one thread: gemm_1). The copies,
 * col2im, bias and roundings around the GEMMs run on threads.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include "kernels/cpu/cpu_dnnl.h"

#define COL_FLOATS ((int64_t)1 << 22)   /* 16 MiB of columns per chunk of images */
/* scratch slots (cpu.h) */
enum { S_COL = 4, S_GCOL, S_X, S_GY, S_GX, S_W, S_GW, S_WA, S_WB };

/* the output columns [*lo, *hi) whose input column j * sw - pw + v * dw lies in
 * [0, w) for kernel column v: the rest read padding */
static inline void valid_cols(const mp_conv_args *a, int64_t v, int64_t *lo, int64_t *hi)
{
    int64_t off = v * a->dw - a->pw;   /* input column of output column 0 */
    *lo = off >= 0 ? 0 : (-off + a->sw - 1) / a->sw;
    *hi = a->w - off <= 0 ? 0 : (a->w - off + a->sw - 1) / a->sw;
    if (*hi > a->ow) *hi = a->ow;
    if (*lo > *hi) *lo = *hi;
}

/* x{cg, h, w} (one group of one image) -> col{cg r s, oh ow}, for 4-byte (f32)
 * and 2-byte (bf16) elements: copies, zeros where a tap reads padding */
#define IM2COL(NAME, T)                                                                          \
    static void NAME(const mp_conv_args *a, const T *x, T *col, int64_t cg)                      \
    {                                                                                            \
        int64_t ohw = a->oh * a->ow;                                                             \
        for (int64_t row = 0; row < cg * a->r * a->s; row++) {                                   \
            int64_t c = row / (a->r * a->s), u = row / a->s % a->r, v = row % a->s, lo, hi;      \
            valid_cols(a, v, &lo, &hi);                                                          \
            int64_t off = v * a->dw - a->pw;   /* + j * sw: output column j's input column */    \
            const T *xc = x + c * a->h * a->w;                                                   \
            T *out = col + row * ohw;                                                            \
            for (int64_t i = 0; i < a->oh; i++) {                                                \
                int64_t ih = i * a->sh - a->ph + u * a->dh;                                      \
                T *o = out + i * a->ow;                                                          \
                if (ih < 0 || ih >= a->h) { memset(o, 0, sizeof(T) * (size_t)a->ow); continue; } \
                const T *xr = xc + ih * a->w;                                                    \
                for (int64_t j = 0; j < lo; j++) o[j] = 0;                                       \
                if (a->sw == 1) memcpy(o + lo, xr + off + lo, sizeof(T) * (size_t)(hi - lo));    \
                else for (int64_t j = lo; j < hi; j++) o[j] = xr[off + j * a->sw];               \
                for (int64_t j = hi; j < a->ow; j++) o[j] = 0;                                   \
            }                                                                                    \
        }                                                                                        \
    }
IM2COL(im2col_f32, float)
IM2COL(im2col_u16, uint16_t)

/* one group of one image into its columns: es-byte elements */
static void im2col(const mp_conv_args *a, const void *x, void *col, int64_t cg, size_t es)
{
    if (es == 2) im2col_u16(a, x, col, cg);
    else im2col_f32(a, x, col, cg);
}

/* the adjoint: gx{cg, h, w} += col{cg r s, oh ow}, a channel's taps in order
 * (one thread owns the image) */
static void col2im(const mp_conv_args *a, const float *col, float *gx, int64_t cg)
{
    int64_t ohw = a->oh * a->ow;
    for (int64_t c = 0; c < cg; c++)
        for (int64_t t = 0; t < a->r * a->s; t++) {
            int64_t u = t / a->s, v = t % a->s, lo, hi;
            valid_cols(a, v, &lo, &hi);
            const float *in = col + (c * a->r * a->s + t) * ohw;
            int64_t off = v * a->dw - a->pw;
            float *gc = gx + c * a->h * a->w;
            for (int64_t i = 0; i < a->oh; i++) {
                int64_t ih = i * a->sh - a->ph + u * a->dh;
                if (ih < 0 || ih >= a->h) continue;
                float *gr = gc + ih * a->w;
                const float *o = in + i * a->ow;
                if (a->sw == 1) for (int64_t j = lo; j < hi; j++) gr[off + j] += o[j];
                else for (int64_t j = lo; j < hi; j++) gr[off + j * a->sw] += o[j];
            }
        }
}

/* images per chunk: their columns (one group) fit in COL_FLOATS */
static int64_t chunk_images(const mp_conv_args *a)
{
    int64_t per = a->c / a->groups * a->r * a->s * a->oh * a->ow, n = per ? COL_FLOATS / per : a->n;
    return n < 1 ? 1 : n > a->n ? a->n : n;
}

/* es-byte element i of p */
static inline const void *at(const void *p, int64_t i, size_t es) { return (const char *)p + (size_t)i * es; }

/* the elements an operand of batch items (stride s, 0 shared) spans */
static int64_t span(int64_t batch, int64_t s, int64_t item) { return s ? (batch - 1) * s + item : item; }

/* The GEMM itself on one thread. oneDNN's GEMM kernels split a product's
 * sum among the threads of the count they run under (gemm:jit on AVX2 cuts K
 * for small m n: a ResNet stage's y {64, 64} over K = 576 and the stem's gw
 * {16, 27} over K = 1024 came out with other bits on 2 threads than on 1),
 * so on threads this path's bits would follow the thread count. On one
 * thread they are those it gave on one before, whatever the count. */
static int gemm_1(mp_kctx *cx, int lowp, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                  const void *a, int64_t sa, const void *b, int64_t sb, float beta, float *c, int64_t sc)
{
    int was = omp_get_max_threads();
    if (was > 1) omp_set_num_threads(1);
    int r = lowp ? cpu_gemm_dnnl_f32out(cx, ta, tb, batch, m, n, k, 1.0f, a, sa, b, sb, beta, c, sc)
                 : cpu_gemm(cx, MP_F32, ta, tb, batch, m, n, k, 1.0f, a, sa, b, sb, beta, c, sc);
    if (was > 1) omp_set_num_threads(was);
    return r;
}

/* C (f32) = op(A) op(B) + beta C over a batch (the engine's GEMM arguments):
 * f32 operands through cpu_gemm; bf16 ones (lowp) through oneDNN's bf16 GEMM
 * with f32 results, or widened into S_WA/S_WB (on threads) and then cpu_gemm */
static int gemm_f32out(mp_kctx *cx, int lowp, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                       const void *a, int64_t sa, const void *b, int64_t sb, float beta, float *c, int64_t sc)
{
    if (!lowp) return gemm_1(cx, 0, ta, tb, batch, m, n, k, a, sa, b, sb, beta, c, sc);
    if (gemm_1(cx, 1, ta, tb, batch, m, n, k, a, sa, b, sb, beta, c, sc) == 0) return 0;
    const float *fa = cpu_scratch_f32(cx, S_WA, MP_BF16, a, span(batch, sa, m * k));
    const float *fb = fa ? cpu_scratch_f32(cx, S_WB, MP_BF16, b, span(batch, sb, k * n)) : NULL;
    return fb ? gemm_1(cx, 0, ta, tb, batch, m, n, k, fa, sa, fb, sb, beta, c, sc) : -1;
}

int cpu_conv2d(mp_kctx *cx, mp_dtype dt, void *y, const void *x, const void *w, const void *b, const mp_conv_args *a)
{
    int64_t g = a->groups, cg = a->c / g, kg = a->k / g, crs = cg * a->r * a->s, ohw = a->oh * a->ow;
    int64_t chw = a->c * a->h * a->w, nb = chunk_images(a);
    int lowp = dt == MP_BF16;
    size_t es = mp_dtype_size(dt), ce = lowp ? 2 : 4;   /* bytes of an element of x, of the columns */
    int done = cpu_conv_dnnl(cx, CPU_CONV_FWD, dt, y, x, w, b, a);
    if (done <= 0) return done;
    const void *wop = lowp ? w : cpu_scratch_f32(cx, S_W, dt, w, a->k * crs);
    void *col = cpu_scratch(cx, S_COL, ce * (size_t)(nb * crs * ohw + 1));
    /* the GEMM's output: y itself for f32 without groups, else f32 scratch */
    int direct = dt == MP_F32 && g == 1;
    float *yf = direct ? NULL : cpu_scratch(cx, S_GCOL, sizeof(float) * (size_t)(nb * kg * ohw + 1));
    if (!wop || !col || (!direct && !yf)) return -1;
    float bias[1024], *bv = a->k <= 1024 ? bias : cpu_scratch(cx, S_GW, sizeof(float) * (size_t)a->k);
    if (!bv) return -1;
    if (b) cpu_load(dt, b, 0, bv, a->k);
    for (int64_t n0 = 0; n0 < a->n; n0 += nb) {
        int64_t ni = a->n - n0 < nb ? a->n - n0 : nb;
        const void *xop = lowp ? at(x, n0 * chw, es) : cpu_scratch_f32(cx, S_X, dt, at(x, n0 * chw, es), ni * chw);
        if (!xop) return -1;
        for (int64_t gi = 0; gi < g; gi++) {
            #pragma omp parallel for if (ni * crs * ohw >= MP_PAR_MIN) schedule(static)
            for (int64_t i = 0; i < ni; i++)
                im2col(a, at(xop, i * chw + gi * cg * a->h * a->w, ce), (char *)col + (size_t)(i * crs * ohw) * ce, cg, ce);
            float *out = direct ? (float *)y + n0 * a->k * ohw : yf;
            int64_t so = direct ? a->k * ohw : kg * ohw;
            if (gemm_f32out(cx, lowp, 0, 0, ni, kg, ohw, crs, at(wop, gi * kg * crs, ce), 0, col, crs * ohw, 0.0f, out, so))
                return -1;
            /* bias, and the rounding into y's channels of this group */
            #pragma omp parallel for if (ni * kg * ohw >= MP_PAR_MIN) schedule(static)
            for (int64_t q = 0; q < ni * kg; q++) {
                int64_t i = q / kg, ch = gi * kg + q % kg;
                float *row = out + i * so + (q % kg) * ohw;
                if (b) for (int64_t e = 0; e < ohw; e++) row[e] += bv[ch];
                if (!direct) cpu_store(cx, dt, y, ((n0 + i) * a->k + ch) * ohw, row, ohw);
            }
        }
    }
    return 0;
}

int cpu_conv2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, void *gw, float *gb, const void *gy, const void *x,
                    const void *w, const mp_conv_args *a)
{
    int64_t g = a->groups, cg = a->c / g, kg = a->k / g, crs = cg * a->r * a->s, ohw = a->oh * a->ow;
    int64_t chw = a->c * a->h * a->w, kohw = a->k * ohw, nb = chunk_images(a);
    int lowp = dt == MP_BF16;
    size_t es = mp_dtype_size(dt), ce = lowp ? 2 : 4;
    if (gb) {   /* each channel's sum over images and pixels, in f64, in order */
        #pragma omp parallel for if (a->n * kohw >= MP_PAR_MIN) schedule(static)
        for (int64_t ch = 0; ch < a->k; ch++) {
            double s = 0;
            float buf[MP_BLOCK];
            for (int64_t i = 0; i < a->n; i++)
                for (int64_t e = 0; e < ohw; e += MP_BLOCK) {
                    int64_t len = ohw - e < MP_BLOCK ? ohw - e : MP_BLOCK;
                    cpu_load(dt, gy, (i * a->k + ch) * ohw + e, buf, len);
                    for (int64_t l = 0; l < len; l++) s += buf[l];
                }
            gb[ch] = (float)s;
        }
    }
    int done = gx || gw ? cpu_conv_dnnl_grad(cx, dt, gx, gw, gy, x, w, a) : 0;
    if (done < 0) return -1;
    if (done & 1) gx = NULL;
    if (done & 2) gw = NULL;
    if (!gx && !gw) return 0;
    const void *wop = lowp ? w : cpu_scratch_f32(cx, S_W, dt, w, a->k * crs);
    void *col = gw ? cpu_scratch(cx, S_COL, ce * (size_t)(nb * crs * ohw + 1)) : NULL;
    float *gcol = gx ? cpu_scratch(cx, S_GCOL, sizeof(float) * (size_t)(nb * crs * ohw + 1)) : NULL;
    float *gwf = !gw ? NULL : dt == MP_F32 ? gw : cpu_scratch(cx, S_GW, sizeof(float) * (size_t)(a->k * crs));
    if (!wop || (gw && (!col || !gwf)) || (gx && !gcol)) return -1;
    if (gwf && a->n == 0) memset(gwf, 0, sizeof(float) * (size_t)(a->k * crs));
    for (int64_t n0 = 0; n0 < a->n; n0 += nb) {
        int64_t ni = a->n - n0 < nb ? a->n - n0 : nb;
        const void *gyop = lowp ? at(gy, n0 * kohw, es) : cpu_scratch_f32(cx, S_GY, dt, at(gy, n0 * kohw, es), ni * kohw);
        const void *xop = !gw ? NULL : lowp ? at(x, n0 * chw, es) : cpu_scratch_f32(cx, S_X, dt, at(x, n0 * chw, es), ni * chw);
        float *gxf = !gx ? NULL : dt == MP_F32 ? (float *)gx + n0 * chw : cpu_scratch(cx, S_GX, sizeof(float) * (size_t)(ni * chw));
        if (!gyop || (gw && !xop) || (gx && !gxf)) return -1;
        if (gxf) memset(gxf, 0, sizeof(float) * (size_t)(ni * chw));
        for (int64_t gi = 0; gi < g; gi++) {
            const void *wg = at(wop, gi * kg * crs, ce), *gyg = at(gyop, gi * kg * ohw, ce);
            if (gx) {
                if (gemm_f32out(cx, lowp, 1, 0, ni, crs, ohw, kg, wg, 0, gyg, kohw, 0.0f, gcol, crs * ohw)) return -1;
                #pragma omp parallel for if (ni * crs * ohw >= MP_PAR_MIN) schedule(static)
                for (int64_t i = 0; i < ni; i++)
                    col2im(a, gcol + i * crs * ohw, gxf + i * chw + gi * cg * a->h * a->w, cg);
            }
            if (gw) {
                #pragma omp parallel for if (ni * crs * ohw >= MP_PAR_MIN) schedule(static)
                for (int64_t i = 0; i < ni; i++)
                    im2col(a, at(xop, i * chw + gi * cg * a->h * a->w, ce), (char *)col + (size_t)(i * crs * ohw) * ce, cg, ce);
                for (int64_t i = 0; i < ni; i++)   /* images in order */
                    if (gemm_f32out(cx, lowp, 0, 1, 1, kg, crs, ohw, at(gyg, i * kohw, ce), 0,
                                    (char *)col + (size_t)(i * crs * ohw) * ce, 0, n0 + i == 0 ? 0.0f : 1.0f,
                                    gwf + gi * kg * crs, 0))
                        return -1;
            }
        }
        if (gx && dt != MP_F32) cpu_store_f32(cx, dt, (char *)gx + (size_t)(n0 * chw) * es, gxf, ni * chw);
    }
    if (gw && dt != MP_F32) cpu_store_f32(cx, dt, gw, gwf, a->k * crs);
    return 0;
}
