/*
 * ops_batch_norm.c: mp_batch_norm over dim 2 (channels) of {n, c, ...}, as
 * PyTorch's F.batch_norm: in training the batch's statistics normalise the
 * input and move the running buffers (running_mean, running_var: f32 {c},
 * updated in place, outside autograd) by momentum; in evaluation the running
 * statistics normalise it. Statistics are always f32. Weight and bias {c} are
 * optional, of any float dtype (widened to f32 for the kernel when not f32).
 * Under autocast the op has no class: it runs in its input's dtype, as in
 * PyTorch's CPU autocast, so a bf16 (f16) activation stays bf16 through the
 * normalisation (the kernel widens it a block at a time and rounds y once)
 * while the f32 weight, bias and running statistics are read as they are, with
 * no cast per call. y and the gradient of x take x's dtype; the gradients of
 * weight and bias are computed in f32 and take their own dtypes.
 */
#include <math.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

/* relu: batch_norm_act's ReLU (batch_norm's is always false) */
typedef struct { bool training; double momentum, eps; bool relu; } batch_norm_args;
/* the running statistics, updated in place by the forward: not kept */
typedef struct { mp_tensor *running_mean, *running_var; } running;

static void dims(const mp_tensor *x, int64_t *n, int64_t *ch, int64_t *hw)
{
    *n = x->shape[0], *ch = x->shape[1], *hw = 1;
    for (int d = 2; d < x->ndim; d++) *hw *= x->shape[d];
}

/* t as f32 for a kernel (a new reference; NULL stays NULL; *bad on failure) */
static mp_tensor *f32_of(mp_tensor *t, int *bad)
{
    if (!t) return NULL;
    mp_tensor *r = mp_to_raw(t, MP_F32, t->dev);
    if (!r) *bad = 1;
    return r;
}

/* the gradients of x, w and b (gin[0..2]) from gc, the gradient of batch
 * norm's own output (x's dtype); saved: x, w (f32 or NULL), mean, rstd */
static int bn_grads(mp_node *nd, mp_tensor *gc, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *w = nd->saved[1], *mean = nd->saved[2], *rstd = nd->saved[3];
    int64_t n, ch, hw;
    dims(x, &n, &ch, &hw);
    bool wx = mp_edge_wants(nd, 0), ww = nd->nin > 1 && mp_edge_wants(nd, 1), wb = nd->nin > 2 && mp_edge_wants(nd, 2);
    mp_tensor *gx = gc && wx ? mp_empty(x->dtype, x->dev, x->ndim, x->shape) : NULL;
    mp_tensor *gw = gc && ww ? mp_empty(MP_F32, x->dev, 1, &ch) : NULL, *gb = gc && wb ? mp_empty(MP_F32, x->dev, 1, &ch) : NULL;
    int rc = -1;
    if (gc && (!wx || gx) && (!ww || gw) && (!wb || gb)) {
        if (MP_K(x, batch_norm_grad, x->dtype, gx ? mp_data(gx) : NULL, gw ? mp_data(gw) : NULL, gb ? mp_data(gb) : NULL,
                 mp_data(gc), mp_data(x), mp_data(mean), mp_data(rstd), w ? mp_data(w) : NULL, n, ch, hw,
                 MP_NODE_ARGS(nd, batch_norm_args)->training)) {
            mp_kernel_oom(nd->name);
        } else {
            rc = 0;
            if (gx) gin[0] = mp_retain(gx);
            if (gw && !(gin[1] = mp_to_raw(gw, nd->in[1].dtype, x->dev))) rc = -1;
            if (gb && !(gin[2] = mp_to_raw(gb, nd->in[2].dtype, x->dev))) rc = -1;
        }
    }
    mp_release(gx), mp_release(gw), mp_release(gb);
    return rc;
}

static int bn_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *gc = mp_to_raw(g, x->dtype, x->dev);
    int rc = gc ? bn_grads(nd, gc, gin) : -1;
    mp_release(gc);
    return rc;
}

static int check_channels(const mp_tensor *t, const mp_tensor *x, int64_t ch, const char *what, bool must_f32)
{
    char b1[128], b2[128];
    if (!t) return 0;
    if (t->ndim != 1 || t->shape[0] != ch)
        return mp_fail(MP_EINVAL, "%s %s does not match the input's %lld channels (input %s)", what,
                       mp_shape_str(t->ndim, t->shape, b1, sizeof b1), (long long)ch,
                       mp_shape_str(x->ndim, x->shape, b2, sizeof b2));
    if (t->dev != x->dev)
        return mp_fail(MP_EINVAL, "%s is on %s, input on %s", what, mp_device_name(t->dev), mp_device_name(x->dev));
    if (must_f32 ? t->dtype != MP_F32 : !mp_is_float(t->dtype))
        return mp_fail(MP_EINVAL, "%s must be %s (got %s)", what, must_f32 ? "f32" : "a float tensor",
                       mp_dtype_name(t->dtype));
    return 0;
}

/* the forward's arguments checked (0), or -1 with the error set */
static int bn_check(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    const running *run = c->extra;
    const batch_norm_args *a = MP_OP_ARGS(c, batch_norm_args);
    double momentum = a->momentum, eps = a->eps;
    char b1[128];
    if (!mp_is_float(x->dtype))
        return mp_fail(MP_EINVAL, "input must be a float tensor (got %s)", mp_dtype_name(x->dtype));
    if (x->ndim < 2)
        return mp_fail(MP_EINVAL, "input must have at least 2 dims {n, c, ...} (got %s)",
                       mp_shape_str(x->ndim, x->shape, b1, sizeof b1));
    int64_t n, ch, hw;
    dims(x, &n, &ch, &hw);
    if (check_channels(run->running_mean, x, ch, "running_mean", true) ||
        check_channels(run->running_var, x, ch, "running_var", true) || check_channels(w, x, ch, "weight", false) ||
        check_channels(b, x, ch, "bias", false))
        return -1;
    if (!a->training && (!run->running_mean || !run->running_var))
        return mp_fail(MP_EINVAL, "evaluation (training = false) needs running_mean and running_var");
    if ((run->running_mean == NULL) != (run->running_var == NULL))
        return mp_fail(MP_EINVAL, "running_mean and running_var go together (one of them is nil)");
    if (a->training && n * hw <= 1)
        return mp_fail(MP_EINVAL, "training needs more than one value per channel (input %s)",
                       mp_shape_str(x->ndim, x->shape, b1, sizeof b1));
    if (!(momentum >= 0 && momentum <= 1)) return mp_fail(MP_EINVAL, "momentum must be in [0, 1] (got %g)", momentum);
    if (!(eps > 0) || !isfinite(eps)) return mp_fail(MP_EINVAL, "eps must be positive (got %g)", eps);
    return 0;
}

/* batch norm's forward, and with act its output pass followed by + z and
 * ReLU (the batch_norm_act entry); keeps x, w, mean, rstd in slots 0-3 */
static mp_tensor *bn_run(mp_op_ctx *c, bool act, mp_tensor *z, bool relu)
{
    mp_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    const running *run = c->extra;
    const batch_norm_args *a = MP_OP_ARGS(c, batch_norm_args);
    if (bn_check(c)) return NULL;
    int64_t n, ch, hw;
    dims(x, &n, &ch, &hw);
    int bad = 0;
    mp_tensor *wf = f32_of(w, &bad), *bf = f32_of(b, &bad), *y = NULL;
    mp_tensor *mean = bad ? NULL : mp_empty(MP_F32, x->dev, 1, &ch), *rstd = mean ? mp_empty(MP_F32, x->dev, 1, &ch) : NULL;
    if (rstd) y = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    mp_tensor *rm = run->running_mean, *rv = run->running_var;
    float *pm = rm ? mp_data(rm) : NULL, *pv = rv ? mp_data(rv) : NULL, *pw = wf ? mp_data(wf) : NULL,
          *pb = bf ? mp_data(bf) : NULL;
    if (y && (act ? MP_K(x, batch_norm_act, x->dtype, mp_data(y), mp_data(mean), mp_data(rstd), pm, pv, mp_data(x), pw,
                         pb, z ? mp_data(z) : NULL, n, ch, hw, a->training, (float)a->momentum, (float)a->eps, relu)
                  : MP_K(x, batch_norm, x->dtype, mp_data(y), mp_data(mean), mp_data(rstd), pm, pv, mp_data(x), pw, pb,
                         n, ch, hw, a->training, (float)a->momentum, (float)a->eps)))
        mp_release(y), y = NULL, mp_kernel_oom(c->op->name);
    if (y && (mp_keep(c, 0, x) || mp_keep(c, 1, wf) || mp_keep(c, 2, mean) || mp_keep(c, 3, rstd)))
        mp_release(y), y = NULL;
    mp_release(wf), mp_release(bf), mp_release(mean), mp_release(rstd);
    return y;
}

static mp_tensor *bn_fwd(mp_op_ctx *c) { return bn_run(c, false, NULL, false); }

static const mp_op batch_norm_op = {.name = "batch_norm", .ac = MP_AC_NONE, .nin = 3, .forward = bn_fwd,
                                    .backward = bn_backward, .args_size = sizeof(batch_norm_args),
                                    .needs = {MP_BE_ENTRY(batch_norm), MP_BE_ENTRY(batch_norm_grad)}};
MP_OP_REGISTER(batch_norm_op);

mp_tensor *mp_batch_norm(mp_tensor *x, mp_tensor *running_mean, mp_tensor *running_var, mp_tensor *w, mp_tensor *b,
                         bool training, double momentum, double eps)
{
    running run = {running_mean, running_var};
    batch_norm_args args = {training, momentum, eps, false};
    mp_op_ctx c = {.args = &args, .extra = &run};
    mp_tensor *in[3] = {x, w, b};
    return mp_apply(&batch_norm_op, &c, 3, in);
}

/* ---- batch_norm_act: relu(batch_norm(x) + z), one op ----
 *
 * A ResNet block's batch norm and what follows it, conv -> bn -> relu and
 * relu(bn(conv(x)) + shortcut), as one op, so that a backend can finish each
 * piece of batch norm's output pass with the sum and the ReLU (the
 * batch_norm_act entry) in place of two more passes over memory, reading and
 * writing whole activations. Its values are those of mp_batch_norm, then
 * mp_binary(MP_ADD) with z, then mp_unary(MP_RELU), bit for bit, in every
 * dtype (the entry's contract). Where the backend has no such entry, or z is
 * not of x's shape, dtype and device (broadcast, promoted: cases the fused
 * pass does not cover), mp_batch_norm_act runs those three ops themselves,
 * which record their own nodes: the same values, and the same errors.
 *
 * Autocast class: none, as batch norm's (the add of two tensors of one dtype
 * and ReLU keep it too). Saved: batch norm's x, w, mean and rstd, and with the
 * ReLU its output y, whose sign is the pre-activation's (y > 0 exactly where
 * bn(x) + z > 0; a NaN stays NaN), so the ReLU's mask comes from y, as the
 * unfused ReLU's came from its input. Backward: gs = g where y > 0, else 0
 * (unary_grad's ReLU, the same kernel as relu's backward), then gs is z's
 * gradient and batch norm's output gradient, as the add's backward passes it
 * to both. */

/* saved: x, w, mean, rstd, y (with the ReLU) */
static int bn_act_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0];
    mp_tensor *gc = mp_to_raw(g, x->dtype, x->dev), *gs = gc;
    if (gc && MP_NODE_ARGS(nd, batch_norm_args)->relu) {   /* the ReLU's backward */
        mp_tensor *y = nd->saved[4];
        gs = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
        if (gs) MP_K(gs, unary_grad, MP_RELU, x->dtype, mp_data(gs), mp_data(gc), mp_data(y), NULL, gs->numel, 0.0);
        mp_release(gc);
    }
    if (!gs) return -1;
    int rc = 0;
    if (mp_edge_wants(nd, 3)) gin[3] = mp_retain(gs);   /* the add's: z has x's dtype and shape */
    if (mp_edge_wants(nd, 0) || mp_edge_wants(nd, 1) || mp_edge_wants(nd, 2)) rc = bn_grads(nd, gs, gin);
    mp_release(gs);
    return rc;
}

static mp_tensor *bn_act_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *z = c->in[3];
    bool relu = MP_OP_ARGS(c, batch_norm_args)->relu;
    /* mp_batch_norm_act sends only the cases the entry covers */
    if (z && (z->dtype != x->dtype || z->dev != x->dev || !mp_same_shape(z, x)))
        return mp_fail(MP_EINVAL, "batch_norm_act: z must have the input's shape, dtype and device"), NULL;
    mp_tensor *y = bn_run(c, true, z, relu);
    if (y && relu && mp_keep_output(c, 4, y)) mp_release(y), y = NULL;
    return y;
}

static const mp_op batch_norm_act_op = {.name = "batch_norm_act", .ac = MP_AC_NONE, .nin = 4, .forward = bn_act_fwd,
                                        .backward = bn_act_backward, .args_size = sizeof(batch_norm_args),
                                        .needs = {MP_BE_ENTRY(batch_norm_act), MP_BE_ENTRY(batch_norm_grad)}};
MP_OP_REGISTER(batch_norm_act_op);

/* the entry's cases: a backend with it, a dtype its f32 blocks compute
 * exactly (not f64), z of x's shape, dtype and device */
static bool act_fusable(const mp_tensor *x, const mp_tensor *z)
{
    if (!mp_be(x)->batch_norm_act || (x->dtype != MP_F32 && x->dtype != MP_F16 && x->dtype != MP_BF16)) return false;
    return !z || (z->dtype == x->dtype && z->dev == x->dev && mp_same_shape(z, x));
}

/* z fits: a float tensor on x's device whose sum with x keeps x's shape
 * (checked before batch norm runs, so that a bad z moves no running statistic) */
static int check_residual(const mp_tensor *x, const mp_tensor *z)
{
    char b1[128], b2[128];
    mp_bcast bc;
    if (!mp_is_float(z->dtype))
        return mp_fail(MP_EINVAL, "residual must be a float tensor (got %s)", mp_dtype_name(z->dtype));
    if (z->dev != x->dev)
        return mp_fail(MP_EINVAL, "residual is on %s, input on %s", mp_device_name(z->dev), mp_device_name(x->dev));
    bool fits = mp_broadcast(x, z, &bc) == 0 && bc.ndim == x->ndim;
    for (int d = 0; fits && d < x->ndim; d++) fits = bc.shape[d] == x->shape[d];
    if (!fits)
        return mp_fail(MP_EINVAL, "residual %s does not broadcast to the input's shape %s",
                       mp_shape_str(z->ndim, z->shape, b1, sizeof b1), mp_shape_str(x->ndim, x->shape, b2, sizeof b2));
    return 0;
}

mp_tensor *mp_batch_norm_act(mp_tensor *x, mp_tensor *running_mean, mp_tensor *running_var, mp_tensor *w, mp_tensor *b,
                             mp_tensor *z, bool relu, bool training, double momentum, double eps)
{
    if (!z && !relu) return mp_batch_norm(x, running_mean, running_var, w, b, training, momentum, eps);
    if (z && check_residual(x, z)) return NULL;
    if (act_fusable(x, z)) {
        running run = {running_mean, running_var};
        batch_norm_args args = {training, momentum, eps, relu};
        mp_op_ctx c = {.args = &args, .extra = &run};
        mp_tensor *in[4] = {x, w, b, z};
        return mp_apply(&batch_norm_act_op, &c, 4, in);
    }
    /* the three ops, each recording itself */
    mp_tensor *y = mp_batch_norm(x, running_mean, running_var, w, b, training, momentum, eps), *s = y;
    if (y && z) s = mp_binary(MP_ADD, y, z), mp_release(y);
    if (!s || !relu) return s;
    mp_tensor *r = mp_unary(MP_RELU, s, 0.0);
    mp_release(s);
    return r;
}
