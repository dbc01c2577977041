/*
 * cpu_elementwise.c: binary ops with broadcasting and unary maths.
 *
 * Broadcast dims are first merged where both inputs allow, so most calls become
 * "rows of a contiguous inner run", where each input's inner stride is 1 or 0.
 * Work is split into (row, block) items over OpenMP threads. f16/bf16 blocks are
 * widened to f32, computed, and rounded once on the way out.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_f64.h"
#include "kernels/int_rules.h"
#include "kernels/cpu/vmath.h"

/* o[j] = a[j*ia] OP b[j*ib] with the common stride cases spelled out so they vectorise */
#define BIN_LOOP(EXPR)                                                                \
    do {                                                                              \
        if (ia == 1 && ib == 1) for (int64_t j = 0; j < n; j++) { float x = a[j], y = b[j]; o[j] = EXPR; } \
        else if (ia == 0 && ib == 1) { float x = a[0]; for (int64_t j = 0; j < n; j++) { float y = b[j]; o[j] = EXPR; } } \
        else if (ia == 1 && ib == 0) { float y = b[0]; for (int64_t j = 0; j < n; j++) { float x = a[j]; o[j] = EXPR; } } \
        else for (int64_t j = 0; j < n; j++) { float x = a[j * ia], y = b[j * ib]; o[j] = EXPR; } \
    } while (0)

MP_SIMD static void bin_f32(mp_binop op, float *o, const float *a, int64_t ia, const float *b, int64_t ib, int64_t n)
{
    switch (op) {
    case MP_ADD: BIN_LOOP(x + y); break;
    case MP_SUB: BIN_LOOP(x - y); break;
    case MP_MUL: BIN_LOOP(x * y); break;
    case MP_DIV: BIN_LOOP(x / y); break;
    case MP_POWT: BIN_LOOP(powf(x, y)); break;
    case MP_GT: case MP_LT: case MP_GE: case MP_LE: case MP_EQ: case MP_NE: break;   /* comparisons: cmp() */
    }
}

/* input offsets of the first element of output row r (all dims but the last) */
static void row_offsets(const mp_bcast *bc, int64_t r, int64_t *oa, int64_t *ob)
{
    int64_t a = 0, b = 0;
    for (int d = bc->ndim - 2; d >= 0; d--) {
        int64_t i = r % bc->shape[d];
        r /= bc->shape[d];
        a += i * bc->sa[d], b += i * bc->sb[d];
    }
    *oa = a, *ob = b;
}

/* gather n values of float dtype dt from src[off + j*stride] into f32 */
static void gather(mp_dtype dt, const void *src, int64_t off, int64_t stride, float *dst, int64_t n)
{
    if (stride == 1) { cpu_load(dt, src, off, dst, n); return; }
    float v;
    if (stride == 0) {
        cpu_load(dt, src, off, &v, 1);
        for (int64_t j = 0; j < n; j++) dst[j] = v;
        return;
    }
    for (int64_t j = 0; j < n; j++) cpu_load(dt, src, off + j * stride, dst + j, 1);
}


static uint8_t cmp(mp_binop op, double x, double y)
{
    switch (op) {
    case MP_GT: return x > y;
    case MP_LT: return x < y;
    case MP_GE: return x >= y;
    case MP_LE: return x <= y;
    case MP_EQ: return x == y;
    case MP_NE: return x != y;
    case MP_ADD: case MP_SUB: case MP_MUL: case MP_DIV: case MP_POWT: break;   /* arithmetic: bin_f32() */
    }
    return 0;
}

/* Both operands broadcast over every dim but the last (a linear layer's bias
 * rows, 0 + b, under autocast): every output row is the same, so the first is
 * computed by cpu_binary and copied into the others, the same bits as
 * computing each. Not while flushes are counted (cpu_store counts every
 * rounding, the copies would go uncounted). 1 done, 0 not this case. */
static int binary_rows_alike(mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b,
                             const mp_bcast *bc)
{
    int nd = bc->ndim;
    int64_t rows = 1, len = bc->shape[nd - 1];
    for (int d = 0; d < nd - 1; d++) {
        if (bc->sa[d] != 0 || bc->sb[d] != 0) return 0;
        rows *= bc->shape[d];
    }
    if (nd < 2 || rows < 2 || len == 0 || (cx && cx->flush.on)) return 0;
    mp_bcast one = {.ndim = 1, .shape = {len}, .sa = {bc->sa[nd - 1]}, .sb = {bc->sb[nd - 1]}};
    cpu_binary(cx, op, dt, out, a, b, &one);
    size_t row = (size_t)len * (MP_IS_CMP(op) ? 1 : mp_dtype_size(dt));
    #pragma omp parallel for if (rows * len >= MP_PAR_MIN_MEM) schedule(static)
    for (int64_t r = 1; r < rows; r++) memcpy((char *)out + (size_t)r * row, out, row);
    return 1;
}

void cpu_binary(mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b, const mp_bcast *bc0)
{
    if (cpu_binary_lowp(cx, op, dt, out, a, b, bc0)) return;   /* bf16/f16 fused in registers */
    mp_bcast bc;
    int nd = mp_bcast_coalesce(bc0, &bc);
    if (binary_rows_alike(cx, op, dt, out, a, b, &bc)) return;
    int64_t len = bc.shape[nd - 1], ia = bc.sa[nd - 1], ib = bc.sb[nd - 1];
    int64_t rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= bc.shape[d];
    int64_t blocks = (len + MP_BLOCK - 1) / MP_BLOCK, items = rows * blocks;

    #pragma omp parallel for if (rows * len >= MP_PAR_MIN) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        int64_t r = it / blocks, j0 = (it % blocks) * MP_BLOCK;
        int64_t n = len - j0 < MP_BLOCK ? len - j0 : MP_BLOCK, oa, ob, oo = r * len + j0;
        row_offsets(&bc, r, &oa, &ob);
        oa += j0 * ia, ob += j0 * ib;
        if (MP_IS_CMP(op)) {
            for (int64_t j = 0; j < n; j++)
                ((uint8_t *)out)[oo + j] = cmp(op, cpu_get_f64(dt, a, oa + j * ia), cpu_get_f64(dt, b, ob + j * ib));
        } else if (dt == MP_F64) {
            cpu_bin_f64(op, (double *)out + oo, (const double *)a + oa, ia, (const double *)b + ob, ib, n);
        } else if (dt == MP_F32) {
            bin_f32(op, (float *)out + oo, (const float *)a + oa, ia, (const float *)b + ob, ib, n);
        } else if (dt == MP_F16 || dt == MP_BF16) {
            float x[MP_BLOCK], y[MP_BLOCK], z[MP_BLOCK];
            gather(dt, a, oa, ia, x, n);
            gather(dt, b, ob, ib, y, n);
            bin_f32(op, z, x, 1, y, 1, n);
            cpu_store(cx, dt, out, oo, z, n);
        } else if (dt == MP_I32) {
            const int32_t *pa = (const int32_t *)a + oa, *pb = (const int32_t *)b + ob;
            int32_t *po = (int32_t *)out + oo;
            for (int64_t j = 0; j < n; j++) po[j] = (int32_t)(uint32_t)mp_bin_int(op, pa[j * ia], pb[j * ib]);
        } else {
            const uint8_t *pa = (const uint8_t *)a + oa, *pb = (const uint8_t *)b + ob;
            uint8_t *po = (uint8_t *)out + oo;
            for (int64_t j = 0; j < n; j++) po[j] = (uint8_t)mp_bin_int(op, pa[j * ia], pb[j * ib]);
        }
    }
}

/* out[i] = a[i] + b[i * ib] (ib 1, or 0 for one value) for n values on the
 * calling thread: cpu_binary's add, the same bits (the fused bf16/f16 loop,
 * bin_f32's add, or blocks widened and rounded by cpu_load/cpu_store), for a
 * kernel that splits its own work into short runs (cpu_narrow_pad: a parallel
 * region per run of a row cost more than the adds) */
void cpu_add_serial(mp_kctx *cx, mp_dtype dt, void *out, const void *a, const void *b, int64_t ib, int64_t n)
{
    if (n <= 0 || cpu_lowp_add_serial(cx, dt, out, a, b, ib, n)) return;
    if (dt == MP_F32) { bin_f32(MP_ADD, out, a, 1, b, ib, n); return; }
    if (dt != MP_F16 && dt != MP_BF16) {
        mp_bcast bc = {.ndim = 1, .shape = {n}, .sa = {1}, .sb = {ib}};
        cpu_binary(cx, MP_ADD, dt, out, a, b, &bc);
        return;
    }
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        float x[MP_BLOCK], y[MP_BLOCK], z[MP_BLOCK];
        cpu_load(dt, a, i, x, len);
        gather(dt, b, i * ib, ib, y, len);
        bin_f32(MP_ADD, z, x, 1, y, 1, len);
        cpu_store(cx, dt, out, i, z, len);
    }
}

/* acc += x widened from dt: a cast's gradient into an f32 leaf's .grad in one
 * pass (kernels/backend.h add_widened). Each block is widened into L1 and
 * added with bin_f32's add, so every sum is the one cpu_binary's f32 add of
 * the widened tensor gives (widening is exact): bit-identical to that pair */
void cpu_add_widened(mp_kctx *cx, float *acc, const void *x, mp_dtype dt, int64_t n)
{
    (void)cx;
    #pragma omp parallel for if (n >= MP_PAR_MIN_MEM) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        float y[MP_BLOCK];
        cpu_load(dt, x, i, y, len);
        bin_f32(MP_ADD, acc + i, acc + i, 1, y, 1, len);
    }
}

/* t and e are written before they are read, in loops over the same n that GCC
 * cannot match to the vmath call between them */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/* n <= MP_BLOCK, and o may be x. exp, log, tanh and erf are vmath.h's vector
 * primitives (<= 1.5 ulp); the rest of each formula is a loop the compiler
 * vectorises, through t when x is still needed after the primitive. */
MP_SIMD static void un_f32(mp_unop op, float *o, const float *x, int64_t n, double pd)
{
    float p = (float)pd, t[MP_BLOCK];
    switch (op) {
    case MP_NEG: for (int64_t j = 0; j < n; j++) o[j] = -x[j]; break;
    case MP_ABS: for (int64_t j = 0; j < n; j++) o[j] = fabsf(x[j]); break;
    case MP_EXP: cpu_vexp(o, x, n); break;
    case MP_LOG: cpu_vlog(o, x, n); break;
    case MP_SQRT: for (int64_t j = 0; j < n; j++) o[j] = sqrtf(x[j]); break;
    case MP_POW:
        if (p == 2.0f) for (int64_t j = 0; j < n; j++) o[j] = x[j] * x[j];
        else for (int64_t j = 0; j < n; j++) o[j] = powf(x[j], p);
        break;
    case MP_MULS: for (int64_t j = 0; j < n; j++) o[j] = x[j] * p; break;
    case MP_ADDS: for (int64_t j = 0; j < n; j++) o[j] = x[j] + p; break;
    case MP_RSUBS: for (int64_t j = 0; j < n; j++) o[j] = p - x[j]; break;
    case MP_DIVS: for (int64_t j = 0; j < n; j++) o[j] = x[j] / p; break;
    case MP_RDIVS: for (int64_t j = 0; j < n; j++) o[j] = p / x[j]; break;
    case MP_RELU: for (int64_t j = 0; j < n; j++) o[j] = x[j] < 0.0f ? 0.0f : x[j]; break;
    case MP_TANH: cpu_vtanh(o, x, n); break;
    case MP_SIGMOID:   /* 1 / (1 + e^-x), or e^x / (1 + e^x) for x < 0: e <= 1 either way */
        for (int64_t j = 0; j < n; j++) t[j] = -fabsf(x[j]);
        cpu_vexp(t, t, n);
        for (int64_t j = 0; j < n; j++) o[j] = (x[j] < 0.0f ? t[j] : 1.0f) / (1.0f + t[j]);
        break;
    case MP_GELU:
        if (pd == 0) {
            for (int64_t j = 0; j < n; j++) t[j] = x[j] * 0.70710678118654752f;
            cpu_verf(t, t, n);
        } else {
            for (int64_t j = 0; j < n; j++) {
                float v = x[j];
                t[j] = 0.79788456080286536f * (v + 0.044715f * v * v * v);
            }
            cpu_vtanh(t, t, n);
        }
        for (int64_t j = 0; j < n; j++) o[j] = 0.5f * x[j] * (1.0f + t[j]);
        break;
    case MP_SILU:   /* x sigmoid(x), sigmoid as above */
        for (int64_t j = 0; j < n; j++) t[j] = -fabsf(x[j]);
        cpu_vexp(t, t, n);
        for (int64_t j = 0; j < n; j++) o[j] = x[j] * (x[j] < 0.0f ? t[j] : 1.0f) / (1.0f + t[j]);
        break;
    case MP_SIN: cpu_vsin(o, x, n); break;
    case MP_COS: cpu_vcos(o, x, n); break;
    case MP_DROPMASK: {
        float keep = 1.0f / (1.0f - p);
        for (int64_t j = 0; j < n; j++) o[j] = x[j] >= p ? keep : 0.0f;
        break;
    }
    }
}

/* gi = go * op'(x), with the forward output y where that is cheaper; n <= MP_BLOCK */
MP_SIMD static void grad_f32(mp_unop op, float *gi, const float *go, const float *x, const float *y, int64_t n, double pd)
{
    float p = (float)pd, t[MP_BLOCK], e[MP_BLOCK];
    switch (op) {
    case MP_NEG: for (int64_t j = 0; j < n; j++) gi[j] = -go[j]; break;
    case MP_ABS: for (int64_t j = 0; j < n; j++) gi[j] = x[j] > 0 ? go[j] : x[j] < 0 ? -go[j] : 0.0f; break;
    case MP_EXP: for (int64_t j = 0; j < n; j++) gi[j] = go[j] * y[j]; break;
    case MP_LOG: for (int64_t j = 0; j < n; j++) gi[j] = go[j] / x[j]; break;
    case MP_SQRT: for (int64_t j = 0; j < n; j++) gi[j] = go[j] / (2.0f * y[j]); break;
    case MP_POW:
        if (p == 2.0f) for (int64_t j = 0; j < n; j++) gi[j] = go[j] * 2.0f * x[j];
        else for (int64_t j = 0; j < n; j++) gi[j] = p == 0.0f ? 0.0f : go[j] * p * powf(x[j], p - 1.0f);
        break;
    case MP_MULS: for (int64_t j = 0; j < n; j++) gi[j] = go[j] * p; break;
    case MP_ADDS: for (int64_t j = 0; j < n; j++) gi[j] = go[j]; break;
    case MP_RSUBS: for (int64_t j = 0; j < n; j++) gi[j] = -go[j]; break;
    case MP_DIVS: for (int64_t j = 0; j < n; j++) gi[j] = go[j] / p; break;
    case MP_RDIVS: for (int64_t j = 0; j < n; j++) gi[j] = -go[j] * y[j] / x[j]; break;
    case MP_RELU: for (int64_t j = 0; j < n; j++) gi[j] = x[j] > 0.0f ? go[j] : 0.0f; break;
    case MP_TANH: for (int64_t j = 0; j < n; j++) gi[j] = go[j] * (1.0f - y[j] * y[j]); break;
    case MP_SIGMOID: for (int64_t j = 0; j < n; j++) gi[j] = go[j] * y[j] * (1.0f - y[j]); break;
    case MP_GELU:
        if (pd == 0) {   /* cdf + x pdf */
            for (int64_t j = 0; j < n; j++) t[j] = x[j] * 0.70710678118654752f, e[j] = -0.5f * x[j] * x[j];
            cpu_verf(t, t, n);
            cpu_vexp(e, e, n);
            for (int64_t j = 0; j < n; j++) {
                float cdf = 0.5f * (1.0f + t[j]), pdf = 0.39894228040143268f * e[j];
                gi[j] = go[j] * (cdf + x[j] * pdf);
            }
        } else {
            const float k = 0.79788456080286536f;
            for (int64_t j = 0; j < n; j++) t[j] = k * (x[j] + 0.044715f * x[j] * x[j] * x[j]);
            cpu_vtanh(t, t, n);
            for (int64_t j = 0; j < n; j++) {
                float v = x[j], th = t[j];
                gi[j] = go[j] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * v * v));
            }
        }
        break;
    case MP_SILU:   /* s (1 + x (1 - s)), s = sigmoid(x) */
        for (int64_t j = 0; j < n; j++) t[j] = -fabsf(x[j]);
        cpu_vexp(t, t, n);
        for (int64_t j = 0; j < n; j++) {
            float s = (x[j] < 0.0f ? t[j] : 1.0f) / (1.0f + t[j]);
            gi[j] = go[j] * s * (1.0f + x[j] * (1.0f - s));
        }
        break;
    case MP_SIN:
        cpu_vcos(t, x, n);
        for (int64_t j = 0; j < n; j++) gi[j] = go[j] * t[j];
        break;
    case MP_COS:
        cpu_vsin(t, x, n);
        for (int64_t j = 0; j < n; j++) gi[j] = -go[j] * t[j];
        break;
    case MP_DROPMASK: for (int64_t j = 0; j < n; j++) gi[j] = 0.0f; break;   /* a mask: constant in x */
    }
}

/* GELU of a 16-bit float has 65536 possible inputs: the context keeps, per
 * dtype and form, every input's rounded output and its f32 slope (0.4 MB),
 * computed once by the same code (un_f32, grad_f32 with a gradient of 1), so a
 * lookup gives the same bits as the computation, without two erf (or tanh)
 * per element (the GELU of the default GPT's bf16 step was 13% of it).
 * tests/c/test_vmath.c compares both ways on every input. NULL: no memory. */
static int gelu_tables(mp_kctx *cx, mp_dtype dt, double form, const uint16_t **out, const float **slope)
{
    int d = dt == MP_BF16, f = form != 0;
    if (!cx->gelu_out[d][f]) {
        uint16_t *o = calloc(65536 + 1, sizeof(uint16_t));   /* + a pad read by cpu_lowp_gelu's gather */
        float *sl = malloc(sizeof(float) * 65536);
        if (!o || !sl) { free(o); free(sl); return -1; }
        for (int64_t i0 = 0; i0 < 65536; i0 += MP_BLOCK) {
            uint16_t bits[MP_BLOCK];
            float x[MP_BLOCK], y[MP_BLOCK], one[MP_BLOCK];
            for (int j = 0; j < MP_BLOCK; j++) bits[j] = (uint16_t)(i0 + j), one[j] = 1.0f;
            if (d) mp_cpu_bf16_to_f32(x, bits, MP_BLOCK);
            else mp_cpu_f16_to_f32(x, bits, MP_BLOCK);
            un_f32(MP_GELU, y, x, MP_BLOCK, form);
            if (d) mp_cpu_f32_to_bf16(o + i0, y, MP_BLOCK);
            else mp_cpu_f32_to_f16(o + i0, y, MP_BLOCK);
            grad_f32(MP_GELU, sl + i0, one, x, NULL, MP_BLOCK, form);
        }
        cx->gelu_out[d][f] = o, cx->gelu_slope[d][f] = sl;
    }
    *out = cx->gelu_out[d][f], *slope = cx->gelu_slope[d][f];
    return 0;
}

void cpu_unary(mp_kctx *cx, mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p)
{
    if (cpu_unary_lowp(cx, op, dt, out, a, n, p)) return;   /* bf16/f16 fused in registers */
    const uint16_t *table;
    const float *slope;
    /* the flush count of telemetry is taken by cpu_store: that path keeps it */
    if (op == MP_GELU && (dt == MP_F16 || dt == MP_BF16) && cx && !cx->flush.on &&
        gelu_tables(cx, dt, p, &table, &slope) == 0) {
        const uint16_t *in = a;
        uint16_t *o = out;
        if (cpu_lowp_gelu(cx, dt, o, in, n, table)) return;   /* the lookups as AVX-512 gathers */
        #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] = table[in[i]];
        return;
    }
    if (dt == MP_F64) { cpu_unary_f64(op, out, a, n, p); return; }
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        if (dt == MP_F32) {
            un_f32(op, (float *)out + i, (const float *)a + i, len, p);
        } else if (dt == MP_F16 || dt == MP_BF16) {
            float x[MP_BLOCK];
            cpu_load(dt, a, i, x, len);
            un_f32(op, x, x, len, p);
            cpu_store(cx, dt, out, i, x, len);
        } else if (dt == MP_I32) {
            for (int64_t j = i; j < i + len; j++)
                ((int32_t *)out)[j] = (int32_t)(uint32_t)mp_un_int(op, ((const int32_t *)a)[j], (int64_t)p);
        } else {
            for (int64_t j = i; j < i + len; j++)
                ((uint8_t *)out)[j] = (uint8_t)mp_un_int(op, ((const uint8_t *)a)[j], (int64_t)p);
        }
    }
}

void cpu_unary_grad(mp_kctx *cx, mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x, const void *y,
                    int64_t n, double p)
{
    if (cpu_unary_grad_lowp(cx, op, dt, gin, gout, x, n, p)) return;   /* bf16/f16 fused in registers */
    const uint16_t *table;
    const float *slope;
    if (op == MP_GELU && (dt == MP_F16 || dt == MP_BF16) && cx && x && gelu_tables(cx, dt, p, &table, &slope) == 0) {
        const uint16_t *xb = x;   /* gx = g * slope(x), the product grad_f32 forms */
        if (cpu_lowp_gelu_grad(cx, dt, gin, gout, xb, n, slope)) return;   /* in AVX-512 registers */
        #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i += MP_BLOCK) {
            int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
            float g[MP_BLOCK];
            cpu_load(dt, gout, i, g, len);
            for (int64_t j = 0; j < len; j++) g[j] *= slope[xb[i + j]];
            cpu_store(cx, dt, gin, i, g, len);
        }
        return;
    }
    if (dt == MP_F64) { cpu_unary_grad_f64(op, gin, gout, x, y, n, p); return; }
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        float g[MP_BLOCK], xs[MP_BLOCK], ys[MP_BLOCK], r[MP_BLOCK];
        if (dt == MP_F32) {   /* in place: the copies through the stack were a fifth of a ReLU backward */
            const float *fx = x, *fy = y;
            grad_f32(op, (float *)gin + i, (const float *)gout + i, fx ? fx + i : xs, fy ? fy + i : ys, len, p);
            continue;
        }
        cpu_load(dt, gout, i, g, len);
        if (x) cpu_load(dt, x, i, xs, len);
        if (y) cpu_load(dt, y, i, ys, len);
        grad_f32(op, r, g, xs, ys, len, p);
        cpu_store(cx, dt, gin, i, r, len);
    }
}

void cpu_where(mp_kctx *cx, mp_dtype dt, void *out, const uint8_t *cond, const void *a, const void *b, int64_t n)
{
    size_t es = mp_dtype_size(dt);
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)out + (size_t)i * es, (const char *)(cond[i] ? a : b) + (size_t)i * es, es);
}
