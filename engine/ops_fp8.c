/*
 * ops_fp8.c: scaled FP8 (kernels/fp8_scaled.h): fp8_quantize, f32/f16/bf16 x
 * -> an e4m3/e5m2 tensor carrying its decode scales (t->quant: value = code
 * x scale, one per tensor, 1x128 tile or 128x128 block along the last dim,
 * or an E8M0 power of two per 1x32 OCP MX block)
 * and x's amax as an f32 {1} tensor on x's device (no wait: delayed scaling
 * keeps its amax history there); and fp8_matmul, a {m, k} b {n, k} -> a b^T
 * {m, n} of two such tensors, both read along k (the layout FP8 tensor cores
 * take), accumulated in f32, by the device's fast accumulation, or by the
 * CPU's modelled accumulator (kernels/cpu/cpu_fp8_gemm.c).
 *
 * Neither records a gradient: FP8 tensors hold data only (mp_is_storage_only)
 * and a recipe's backward is its own business. Both read FP8 codes
 * themselves, so fp8_matmul's description says moves_bytes (mp_apply lets
 * the data-only dtypes through) and quantized (the scales are its to read).
 */
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

typedef struct {
    mp_dtype fmt;
    mp_quant_kind kind;
} quant_args;

typedef struct {
    mp_tensor **amax;
    mp_fp8_counts *counts;
    mp_tensor **counts_dev;   /* NULL: not wanted; else an f32 {2} tensor on x's device */
} quant_out;

/* the kernels' granularity of a quantization kind (0 where there is none) */
static int gran_of(mp_quant_kind k, mp_fp8_gran *g)
{
    switch (k) {
    case MP_QUANT_TENSOR: *g = MP_FP8_TENSOR; return 1;
    case MP_QUANT_1X128: *g = MP_FP8_TILE; return 1;
    case MP_QUANT_128X128: *g = MP_FP8_BLOCK; return 1;
    case MP_QUANT_MX: *g = MP_FP8_MX; return 1;
    case MP_QUANT_NONE: case MP_NQUANT: break;
    }
    return 0;
}

static mp_tensor *quantize_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *given = c->in[1];
    const quant_args *a = MP_OP_ARGS(c, quant_args);
    const quant_out *out = c->extra;
    char b1[128];
    mp_fp8_gran g;
    if (x->dtype != MP_F32 && x->dtype != MP_F16 && x->dtype != MP_BF16)
        return mp_fail(MP_EINVAL, "x must be f32, f16 or bf16 (got %s)", mp_dtype_name(x->dtype)), NULL;
    if (x->ndim < 1) return mp_fail(MP_EINVAL, "x must have at least one dimension"), NULL;
    if (a->fmt != MP_E4M3 && a->fmt != MP_E5M2)
        return mp_fail(MP_EINVAL, "format must be e4m3 or e5m2 (got %s)", mp_dtype_name(a->fmt)), NULL;
    if (!gran_of(a->kind, &g)) return mp_fail(MP_EINVAL, "no such granularity"), NULL;
    if (given && (a->kind != MP_QUANT_TENSOR || given->dtype != MP_F32 || given->numel != 1 || given->dev != x->dev))
        return mp_fail(MP_EINVAL, "scale must be one f32 value on %s with the tensor granularity (got %s %s on %s, "
                       "granularity %s)", mp_device_name(x->dev), mp_dtype_name(given->dtype),
                       mp_shape_str(given->ndim, given->shape, b1, sizeof b1), mp_device_name(given->dev),
                       mp_quant_name(a->kind)), NULL;
    int64_t k = x->shape[x->ndim - 1], rows = k ? x->numel / k : 0, one = 1, sshape[2] = {1, 1}, block[2];
    mp_quant_block(a->kind, block);
    int sdim = 1;
    if (block[0]) {
        sshape[0] = (rows + block[0] - 1) / block[0], sshape[1] = (k + block[1] - 1) / block[1];
        sdim = 2;
    }
    mp_dtype sdt = a->kind == MP_QUANT_MX ? MP_U8 : MP_F32;   /* MX: E8M0 bytes */
    mp_tensor *q = mp_empty(a->fmt, x->dev, x->ndim, x->shape), *sc = q ? mp_empty(sdt, x->dev, sdim, sshape) : NULL;
    int64_t eight = 8, two = 2;
    mp_tensor *st = sc ? mp_empty(MP_I32, x->dev, 1, &eight) : NULL;   /* four u64 words */
    mp_tensor *am = st ? mp_empty(MP_F32, x->dev, 1, &one) : NULL;
    mp_tensor *cd = am && out->counts_dev ? mp_empty(MP_F32, x->dev, 1, &two) : NULL;
    if (am && out->counts_dev && !cd) mp_release(am), am = NULL;
    int r = am ? 0 : -1;
    if (am && x->numel) {
        r = MP_K(x, fp8_quantize, x->dtype, mp_data(x), rows, k, a->fmt, (int)g, given ? mp_data(given) : NULL,
                 mp_data(q), mp_data(sc), mp_data(st));
        if (r == -1) mp_fail(MP_EOOM, "out of memory");
    } else if (am) {   /* nothing to read: the scales stay 1 (E8M0 127), the amax is 0 */
        MP_K(sc, fill, mp_data(sc), sdt, sc->numel, sdt == MP_U8 ? 127.0 : 1.0);
        MP_K(am, fill, mp_data(am), MP_F32, 1, 0.0);
        if (cd) MP_K(cd, fill, mp_data(cd), MP_F32, 2, 0.0);
    }
    if (r == 0 && x->numel) {
        const mp_backend *be = mp_be(x);
        be->copy(be->ctx, mp_data(am), mp_data(st), 4);   /* word 0's low half: the amax's bits (little-endian) */
        if (cd) be->copy(be->ctx, mp_data(cd), (char *)mp_data(st) + 24, 8);   /* word 3: the counts as two f32 */
        if (out->counts) {
            unsigned long long w[3];
            be->to_host(be->ctx, w, mp_data(st), sizeof w);
            out->counts->saturated = (int64_t)w[1], out->counts->flushed = (int64_t)w[2];
        }
    }
    if (r == 0) r = mp_set_quant(q, a->kind, sc);
    mp_release(sc), mp_release(st);
    if (r) {
        mp_release(q), mp_release(am), mp_release(cd);
        return NULL;
    }
    *out->amax = am;
    if (out->counts_dev) *out->counts_dev = cd;
    return q;
}

static const mp_op quantize_op = {.name = "fp8_quantize", .ac = MP_AC_NONE, .nin = 2, .forward = quantize_fwd,
                                  .needs = {MP_BE_ENTRY(fp8_quantize)}, .args_size = sizeof(quant_args)};
MP_OP_REGISTER(quantize_op);

mp_tensor *mp_fp8_quantize(mp_tensor *x, mp_dtype fmt, mp_quant_kind kind, mp_tensor *scale, mp_tensor **amax,
                           mp_fp8_counts *counts, mp_tensor **counts_dev)
{
    quant_args args = {fmt, kind};
    mp_tensor *am = NULL, *cd = NULL, *in[2] = {x, scale};
    quant_out out = {&am, counts, counts_dev ? &cd : NULL};
    mp_op_ctx c = {.args = &args, .extra = &out};
    mp_tensor *q = mp_apply(&quantize_op, &c, 2, in);
    if (!q) {
        mp_release(am), mp_release(cd);
        am = cd = NULL;
    }
    if (amax) *amax = am;
    else mp_release(am);
    if (counts_dev) *counts_dev = cd;
    return q;
}

mp_tensor *mp_fp8_codes(mp_tensor *q)
{
    if (q->quant.kind == MP_QUANT_NONE || (q->dtype != MP_E4M3 && q->dtype != MP_E5M2))
        return mp_fail(MP_EINVAL, "q must be a quantized e4m3 or e5m2 tensor (got %s%s)",
                       q->quant.kind == MP_QUANT_NONE ? "plain " : "", mp_dtype_name(q->dtype)), NULL;
    mp_tensor *v = mp_view(q, q->ndim, q->shape, 0);   /* the same storage; the scales dropped below */
    if (v && mp_set_quant(v, MP_QUANT_NONE, NULL)) mp_release(v), v = NULL;
    return v;
}

typedef struct {
    mp_dtype out;
    int acc_bits, fast, acc_round;
    int64_t promote_every;
} mm_args;

/* the kernels' operand of an FP8 tensor, or an error naming it */
static int operand_of(mp_tensor *t, const char *what, mp_fp8_operand *o)
{
    if (t->dtype != MP_E4M3 && t->dtype != MP_E5M2)
        return mp_fail(MP_EINVAL, "%s must be an e4m3 or e5m2 tensor (got %s)", what, mp_dtype_name(t->dtype));
    if (t->ndim != 2) return mp_fail(MP_EINVAL, "%s must be 2-D (got %d dims)", what, t->ndim);
    if (!gran_of(t->quant.kind, &o->g))
        return mp_fail(MP_EINVAL, "%s carries no scales (make it with fp8_quantize)", what);
    o->q = mp_data(t), o->fmt = t->dtype == MP_E5M2 ? MP_FP8_E5M2 : MP_FP8_E4M3, o->scales = mp_data(t->quant.scales);
    return 0;
}

static mp_tensor *matmul_fwd(mp_op_ctx *c)
{
    mp_tensor *a = c->in[0], *b = c->in[1];
    const mm_args *g = MP_OP_ARGS(c, mm_args);
    mp_fp8_operand oa, ob;
    if (operand_of(a, "a", &oa) || operand_of(b, "b", &ob)) return NULL;
    /* MX blocks multiply with MX blocks only: the CUDA path decodes both with their
     * power-of-two scales; refused alike on every device */
    if ((oa.g == MP_FP8_MX) != (ob.g == MP_FP8_MX))
        return mp_fail(MP_EINVAL, "%s is mx-scaled but %s is %s-scaled: an mx operand multiplies only with another",
                       oa.g == MP_FP8_MX ? "a" : "b", oa.g == MP_FP8_MX ? "b" : "a",
                       mp_quant_name(oa.g == MP_FP8_MX ? b->quant.kind : a->quant.kind)), NULL;
    if (a->dev != b->dev)
        return mp_fail(MP_EINVAL, "a is on %s and b on %s", mp_device_name(a->dev), mp_device_name(b->dev)), NULL;
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[0];
    if (b->shape[1] != k)
        return mp_fail(MP_EINVAL, "a {m, k} and b {n, k} must share k: {%lld, %lld} and {%lld, %lld}", (long long)m,
                       (long long)k, (long long)n, (long long)b->shape[1]), NULL;
    if (g->out != MP_F32 && g->out != MP_BF16 && g->out != MP_F16)
        return mp_fail(MP_EINVAL, "out_dtype must be f32, bf16 or f16 (got %s)", mp_dtype_name(g->out)), NULL;
    if (g->acc_bits < 0 || g->acc_bits > 23 || g->promote_every < 0)
        return mp_fail(MP_EINVAL, "acc_bits must be 1..23 and promote_every >= 0 (got %d, %lld)", g->acc_bits,
                       (long long)g->promote_every), NULL;
    if (g->acc_round != MP_FP8_ACC_NEAREST && g->acc_round != MP_FP8_ACC_TRUNCATE)
        return mp_fail(MP_EINVAL, "acc_round must be nearest (0) or truncate (1) (got %d)", g->acc_round), NULL;
    /* the model applies tile and block scales at promotion: no interval may straddle two */
    if (g->acc_bits && (oa.g == MP_FP8_TILE || oa.g == MP_FP8_BLOCK || ob.g == MP_FP8_TILE || ob.g == MP_FP8_BLOCK) &&
        (g->promote_every == 0 || 128 % g->promote_every))
        return mp_fail(MP_EINVAL, "promote_every must divide 128 with 1x128 or 128x128 scales (got %lld)",
                       (long long)g->promote_every), NULL;
    int64_t shape[2] = {m, n};
    mp_tensor *o = mp_empty(g->out, a->dev, 2, shape);
    if (!o) return NULL;
    int r = MP_K(a, fp8_gemm, m, n, k, &oa, &ob, g->acc_bits, g->promote_every, g->acc_round, g->fast, g->out,
                 mp_data(o));
    if (r) {
        mp_release(o);
        if (r == -1) return mp_fail(MP_EOOM, "out of memory"), NULL;
        return mp_fail(MP_EINVAL, "the %s backend cannot compute this product (%s; k = %lld)", mp_device_name(a->dev),
                       g->acc_bits ? "the modelled accumulator runs on the cpu only"
                                   : "its FP8 GEMM takes m, n and k below 2^31",
                       (long long)k), NULL;
    }
    return o;
}

static const mp_op matmul_op = {.name = "fp8_matmul", .ac = MP_AC_NONE, .nin = 2, .forward = matmul_fwd,
                                .needs = {MP_BE_ENTRY(fp8_gemm)}, .args_size = sizeof(mm_args), .quantized = true,
                                .moves_bytes = true};
MP_OP_REGISTER(matmul_op);

mp_tensor *mp_fp8_matmul(mp_tensor *a, mp_tensor *b, mp_dtype out, int acc_bits, int64_t promote_every,
                         int acc_round, bool fast)
{
    mm_args args = {out, acc_bits, fast ? 1 : 0, acc_round, promote_every};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[2] = {a, b};
    return mp_apply(&matmul_op, &c, 2, in);
}
