/*
 * ops_attention.c: mp_attention, scaled dot-product attention as one op with
 * its own backward (the backend's fused kernels: no t x t scores in memory).
 * q {..., tq, d}, k and v {..., tk, d} with the same leading dims (batch,
 * heads); the output has q's shape. In autocast's low-precision class, as
 * PyTorch's scaled_dot_product_attention; the softmax statistics are f32.
 */
#include <math.h>
#include "engine/capture_guard.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

typedef struct {
    bool causal;
    bool scale_given;              /* else the forward sets scale to 1 / sqrt(d) */
    double scale, dropout;
    uint64_t seed, offset;         /* set by the forward when dropout > 0: the draws it reserved */
    unsigned capture;              /* reserved inside that capture (mp_capture_serial; offset relative), or 0 */
} attention_args;

/* saved: q, k, v, out, lse */
static void args_of(const mp_tensor *q, const mp_tensor *k, const attention_args *p, mp_attn_args *a)
{
    a->d = q->shape[q->ndim - 1];
    a->tq = q->shape[q->ndim - 2];
    a->tk = k->shape[k->ndim - 2];
    a->bh = q->numel / (a->tq * a->d);
    a->scale = (float)p->scale;
    a->dropout = (float)p->dropout;
    a->causal = p->causal;
    a->seed = p->seed;
    a->offset = p->offset;
    a->rng_graph = p->capture != 0;
}

static int attention_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
    const attention_args *p = MP_NODE_ARGS(n, attention_args);
    /* a captured forward's masks are each replay's: only that capture's backward can draw them again (an eager
     * forward's are fixed, and a capture may record its backward) */
    if (p->capture && p->capture != mp_capture_serial())
        return mp_fail(MP_EINVAL, "the backward of an attention with dropout whose forward was captured in a CUDA "
                                  "graph must be captured in the same graph (its dropout masks are each replay's)");
    mp_attn_args a;
    args_of(q, k, p, &a);
    mp_tensor *gc = mp_to_raw(g, q->dtype, q->dev);   /* the gradient in the op's dtype */
    mp_tensor *dq = gc ? mp_empty(q->dtype, q->dev, q->ndim, q->shape) : NULL;
    mp_tensor *dk = dq ? mp_empty(k->dtype, k->dev, k->ndim, k->shape) : NULL;
    mp_tensor *dv = dk ? mp_empty(v->dtype, v->dev, v->ndim, v->shape) : NULL;
    int rc = -1;
    if (dv) {
        if (MP_K(q, attention_grad, q->dtype, mp_data(dq), mp_data(dk), mp_data(dv), mp_data(gc), mp_data(q),
                 mp_data(k), mp_data(v), mp_data(o), mp_data(lse), &a))
            mp_kernel_oom(n->name);
        else
            gin[0] = mp_retain(dq), gin[1] = mp_retain(dk), gin[2] = mp_retain(dv), rc = 0;
    }
    mp_release(gc), mp_release(dq), mp_release(dk), mp_release(dv);
    return rc;
}

static mp_tensor *attention_fwd(mp_op_ctx *c)
{
    attention_args *args = MP_OP_ARGS(c, attention_args);
    mp_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    char b1[128], b2[128], b3[128];
    if (!mp_is_float(q->dtype))
        return mp_fail(MP_EINVAL, "q must be a float tensor (got %s)", mp_dtype_name(q->dtype)), NULL;
    if (k->dtype != q->dtype || v->dtype != q->dtype || k->dev != q->dev || v->dev != q->dev)
        return mp_fail(MP_EINVAL, "q, k and v must have one dtype and device (got %s/%s, %s/%s, %s/%s)",
                       mp_dtype_name(q->dtype), mp_device_name(q->dev), mp_dtype_name(k->dtype), mp_device_name(k->dev),
                       mp_dtype_name(v->dtype), mp_device_name(v->dev)), NULL;
    bool ok = q->ndim >= 2 && k->ndim == q->ndim && v->ndim == q->ndim;
    for (int d = 0; ok && d < q->ndim - 2; d++) ok = k->shape[d] == q->shape[d] && v->shape[d] == q->shape[d];
    ok = ok && k->shape[k->ndim - 1] == q->shape[q->ndim - 1] && v->shape[v->ndim - 1] == q->shape[q->ndim - 1] &&
         v->shape[v->ndim - 2] == k->shape[k->ndim - 2];
    if (!ok)
        return mp_fail(MP_EINVAL, "q %s, k %s and v %s do not fit: expected {..., tq, d}, {..., tk, d} and {..., tk, d} "
                                  "with the same leading dims",
                       mp_shape_str(q->ndim, q->shape, b1, sizeof b1), mp_shape_str(k->ndim, k->shape, b2, sizeof b2),
                       mp_shape_str(v->ndim, v->shape, b3, sizeof b3)), NULL;
    double scale = args->scale, p = args->dropout;
    if (!args->scale_given) args->scale = scale = 1.0 / sqrt((double)q->shape[q->ndim - 1]);
    if (!isfinite(scale)) return mp_fail(MP_EINVAL, "scale must be a finite number (got %g)", scale), NULL;
    if (!(p >= 0 && p < 1)) return mp_fail(MP_EINVAL, "dropout must be in [0, 1) (got %g)", p), NULL;
    mp_attn_args a;
    if (p > 0) {   /* reserve the draws of every (row, query, key) from the one random stream */
        /* no mask is drawn beforehand: the kernels draw their own (seed, offset); inside a capture, relative to
         * its start, and each replay draws anew (mp_rng_reserve) */
        uint64_t n = (uint64_t)(q->numel / q->shape[q->ndim - 1]) * (uint64_t)k->shape[k->ndim - 2];
        args->capture = mp_rng_reserve(n, &args->seed, &args->offset) ? mp_capture_serial() : 0;
    }
    args_of(q, k, args, &a);
    int64_t rows = a.bh * a.tq;
    mp_tensor *o = mp_empty(q->dtype, q->dev, q->ndim, q->shape), *lse = o ? mp_empty(MP_F32, q->dev, 1, &rows) : NULL;
    if (lse && MP_K(q, attention, q->dtype, mp_data(o), mp_data(lse), mp_data(q), mp_data(k), mp_data(v), &a))
        mp_release(o), o = NULL, mp_kernel_oom(c->op->name);
    if (!lse) mp_release(o), o = NULL;
    if (o && (mp_keep(c, 0, q) || mp_keep(c, 1, k) || mp_keep(c, 2, v) || mp_keep_output(c, 3, o) || mp_keep(c, 4, lse)))
        mp_release(o), o = NULL;
    mp_release(lse);
    return o;
}

static const mp_op attention_op = {.name = "attention", .ac = MP_AC_LOW, .nin = 3, .forward = attention_fwd,
                                   .backward = attention_backward, .args_size = sizeof(attention_args),
                                   .needs = {MP_BE_ENTRY(attention), MP_BE_ENTRY(attention_grad)}};
MP_OP_REGISTER(attention_op);

mp_tensor *mp_attention(mp_tensor *q, mp_tensor *k, mp_tensor *v, bool causal, const double *scale, double dropout)
{
    attention_args args = {.causal = causal, .scale_given = scale != NULL, .scale = scale ? *scale : 0, .dropout = dropout};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[3] = {q, k, v};
    return mp_apply(&attention_op, &c, 3, in);
}
