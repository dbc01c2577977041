/*
 * cpu_conv.c: 2-d convolution as im2col + GEMM (the engine's f32 GEMM: oneDNN,
 * else OpenBLAS), forward and backward, for every float dtype: f16/bf16
 * operands are widened to f32, products accumulate in f32, results are rounded
 * once.
 *
 * Per group g and per image, the input's patches are unrolled into
 * col {cg r s, oh ow} (zeros where a tap falls in the padding), so that
 *   y[g]   {kg, oh ow}   = w[g] {kg, cg r s} @ col
 *   gcol   {cg r s, oh ow} = w[g]^T @ gy[g], folded back into gx (col2im)
 *   gw[g] += gy[g] @ col^T                     (images in order)
 * Images go through in chunks whose columns fit in COL_FLOATS, so the working
 * memory is bounded whatever the batch; the sums are the same for any chunking
 * and thread count (each output element is one GEMM dot product, gw adds the
 * images in order).
 */
#include <string.h>
#include "kernels/cpu/cpu.h"

#define COL_FLOATS ((int64_t)1 << 22)   /* 16 MiB of columns per chunk of images */
/* scratch slots (cpu.h) */
enum { S_COL = 4, S_GCOL, S_X, S_GY, S_GX, S_W, S_GW };

/* x{cg, h, w} (f32, one group of one image) -> col{cg r s, oh ow} */
static void im2col(const mp_conv_args *a, const float *x, float *col, int64_t cg)
{
    int64_t ohw = a->oh * a->ow;
    for (int64_t row = 0; row < cg * a->r * a->s; row++) {
        int64_t c = row / (a->r * a->s), u = row / a->s % a->r, v = row % a->s;
        const float *xc = x + c * a->h * a->w;
        float *out = col + row * ohw;
        for (int64_t i = 0; i < a->oh; i++) {
            int64_t ih = i * a->sh - a->ph + u * a->dh;
            float *o = out + i * a->ow;
            if (ih < 0 || ih >= a->h) { memset(o, 0, sizeof(float) * (size_t)a->ow); continue; }
            const float *xr = xc + ih * a->w;
            for (int64_t j = 0; j < a->ow; j++) {
                int64_t iw = j * a->sw - a->pw + v * a->dw;
                o[j] = iw >= 0 && iw < a->w ? xr[iw] : 0.0f;
            }
        }
    }
}

/* the adjoint: gx{cg, h, w} += col{cg r s, oh ow}, taps in row order */
static void col2im(const mp_conv_args *a, const float *col, float *gx, int64_t cg)
{
    int64_t ohw = a->oh * a->ow;
    for (int64_t c = 0; c < cg; c++)   /* a channel's taps in order: one thread owns the channel */
        for (int64_t t = 0; t < a->r * a->s; t++) {
            int64_t u = t / a->s, v = t % a->s;
            const float *in = col + (c * a->r * a->s + t) * ohw;
            float *gc = gx + c * a->h * a->w;
            for (int64_t i = 0; i < a->oh; i++) {
                int64_t ih = i * a->sh - a->ph + u * a->dh;
                if (ih < 0 || ih >= a->h) continue;
                float *gr = gc + ih * a->w;
                const float *o = in + i * a->ow;
                for (int64_t j = 0; j < a->ow; j++) {
                    int64_t iw = j * a->sw - a->pw + v * a->dw;
                    if (iw >= 0 && iw < a->w) gr[iw] += o[j];
                }
            }
        }
}

/* src (dtype dt, n values) as f32: src itself for f32, else widened into slot */
static const float *as_f32(mp_kctx *cx, int slot, mp_dtype dt, const void *src, int64_t n)
{
    if (dt == MP_F32) return src;
    float *f = cpu_scratch(cx, slot, sizeof(float) * (size_t)(n ? n : 1));
    if (!f) return NULL;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) cpu_load(dt, src, i, f + i, n - i < MP_BLOCK ? n - i : MP_BLOCK);
    return f;
}

static void store_f32(mp_dtype dt, void *dst, const float *src, int64_t n)
{
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) cpu_store(dt, dst, i, src + i, n - i < MP_BLOCK ? n - i : MP_BLOCK);
}

/* images per chunk: their columns (one group) fit in COL_FLOATS */
static int64_t chunk_images(const mp_conv_args *a)
{
    int64_t per = a->c / a->groups * a->r * a->s * a->oh * a->ow, n = per ? COL_FLOATS / per : a->n;
    return n < 1 ? 1 : n > a->n ? a->n : n;
}

int cpu_conv2d(mp_kctx *cx, mp_dtype dt, void *y, const void *x, const void *w, const void *b, const mp_conv_args *a)
{
    int64_t g = a->groups, cg = a->c / g, kg = a->k / g, crs = cg * a->r * a->s, ohw = a->oh * a->ow;
    int64_t chw = a->c * a->h * a->w, nb = chunk_images(a);
    const float *wf = as_f32(cx, S_W, dt, w, a->k * crs);
    float *col = cpu_scratch(cx, S_COL, sizeof(float) * (size_t)(nb * crs * ohw + 1));
    /* the GEMM's output: y itself for f32 without groups, else f32 scratch */
    int direct = dt == MP_F32 && g == 1;
    float *yf = direct ? NULL : cpu_scratch(cx, S_GCOL, sizeof(float) * (size_t)(nb * kg * ohw + 1));
    if (!wf || !col || (!direct && !yf)) return -1;
    float bias[1024], *bv = a->k <= 1024 ? bias : cpu_scratch(cx, S_GW, sizeof(float) * (size_t)a->k);
    if (!bv) return -1;
    if (b) cpu_load(dt, b, 0, bv, a->k);
    for (int64_t n0 = 0; n0 < a->n; n0 += nb) {
        int64_t ni = a->n - n0 < nb ? a->n - n0 : nb;
        const float *xf = as_f32(cx, S_X, dt, (const char *)x + (size_t)(n0 * chw) * mp_dtype_size(dt), ni * chw);
        if (!xf) return -1;
        for (int64_t gi = 0; gi < g; gi++) {
            #pragma omp parallel for if (ni * crs * ohw >= MP_PAR_MIN) schedule(static)
            for (int64_t i = 0; i < ni; i++) im2col(a, xf + i * chw + gi * cg * a->h * a->w, col + i * crs * ohw, cg);
            float *out = direct ? (float *)y + n0 * a->k * ohw : yf;
            int64_t so = direct ? a->k * ohw : kg * ohw;
            if (cpu_gemm(cx, MP_F32, 0, 0, ni, kg, ohw, crs, 1.0f, wf + gi * kg * crs, 0, col, crs * ohw, 0.0f, out, so))
                return -1;
            /* bias, and the rounding into y's channels of this group */
            #pragma omp parallel for if (ni * kg * ohw >= MP_PAR_MIN) schedule(static)
            for (int64_t q = 0; q < ni * kg; q++) {
                int64_t i = q / kg, ch = gi * kg + q % kg;
                float *row = out + i * so + (q % kg) * ohw;
                if (b) for (int64_t e = 0; e < ohw; e++) row[e] += bv[ch];
                if (!direct) cpu_store(dt, y, ((n0 + i) * a->k + ch) * ohw, row, ohw);
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
    size_t es = mp_dtype_size(dt);
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
    if (!gx && !gw) return 0;
    const float *wf = as_f32(cx, S_W, dt, w, a->k * crs);
    float *col = gw ? cpu_scratch(cx, S_COL, sizeof(float) * (size_t)(nb * crs * ohw + 1)) : NULL;
    float *gcol = gx ? cpu_scratch(cx, S_GCOL, sizeof(float) * (size_t)(nb * crs * ohw + 1)) : NULL;
    float *gwf = !gw ? NULL : dt == MP_F32 ? gw : cpu_scratch(cx, S_GW, sizeof(float) * (size_t)(a->k * crs));
    if (!wf || (gw && (!col || !gwf)) || (gx && !gcol)) return -1;
    for (int64_t n0 = 0; n0 < a->n; n0 += nb) {
        int64_t ni = a->n - n0 < nb ? a->n - n0 : nb;
        const float *gyf = as_f32(cx, S_GY, dt, (const char *)gy + (size_t)(n0 * kohw) * es, ni * kohw);
        const float *xf = gw ? as_f32(cx, S_X, dt, (const char *)x + (size_t)(n0 * chw) * es, ni * chw) : NULL;
        float *gxf = !gx ? NULL : dt == MP_F32 ? (float *)gx + n0 * chw : cpu_scratch(cx, S_GX, sizeof(float) * (size_t)(ni * chw));
        if (!gyf || (gw && !xf) || (gx && !gxf)) return -1;
        if (gxf) memset(gxf, 0, sizeof(float) * (size_t)(ni * chw));
        for (int64_t gi = 0; gi < g; gi++) {
            const float *wg = wf + gi * kg * crs, *gyg = gyf + gi * kg * ohw;
            if (gx) {
                if (cpu_gemm(cx, MP_F32, 1, 0, ni, crs, ohw, kg, 1.0f, wg, 0, gyg, kohw, 0.0f, gcol, crs * ohw)) return -1;
                #pragma omp parallel for if (ni * crs * ohw >= MP_PAR_MIN) schedule(static)
                for (int64_t i = 0; i < ni; i++)
                    col2im(a, gcol + i * crs * ohw, gxf + i * chw + gi * cg * a->h * a->w, cg);
            }
            if (gw) {
                #pragma omp parallel for if (ni * crs * ohw >= MP_PAR_MIN) schedule(static)
                for (int64_t i = 0; i < ni; i++) im2col(a, xf + i * chw + gi * cg * a->h * a->w, col + i * crs * ohw, cg);
                for (int64_t i = 0; i < ni; i++)   /* images in order */
                    if (cpu_gemm(cx, MP_F32, 0, 1, 1, kg, crs, ohw, 1.0f, gyg + i * kohw, 0, col + i * crs * ohw, 0,
                                 n0 + i == 0 ? 0.0f : 1.0f, gwf + gi * kg * crs, 0))
                        return -1;
            }
        }
        if (gx && dt != MP_F32) store_f32(dt, (char *)gx + (size_t)(n0 * chw) * es, gxf, ni * chw);
    }
    if (gw && dt != MP_F32) store_f32(dt, gw, gwf, a->k * crs);
    return 0;
}
