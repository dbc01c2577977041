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

typedef struct { bool training; double momentum, eps; } batch_norm_args;
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

/* saved: x, w (f32 or NULL), mean, rstd */
static int bn_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *w = nd->saved[1], *mean = nd->saved[2], *rstd = nd->saved[3];
    int64_t n, ch, hw;
    dims(x, &n, &ch, &hw);
    bool wx = mp_edge_wants(nd, 0), ww = nd->nin > 1 && mp_edge_wants(nd, 1), wb = nd->nin > 2 && mp_edge_wants(nd, 2);
    mp_tensor *gc = mp_to_raw(g, x->dtype, x->dev);
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
    mp_release(gc), mp_release(gx), mp_release(gw), mp_release(gb);
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

static mp_tensor *bn_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    const running *run = c->extra;
    const batch_norm_args *a = MP_OP_ARGS(c, batch_norm_args);
    bool training = a->training;
    double momentum = a->momentum, eps = a->eps;
    char b1[128];
    if (!mp_is_float(x->dtype))
        return mp_fail(MP_EINVAL, "input must be a float tensor (got %s)", mp_dtype_name(x->dtype)), NULL;
    if (x->ndim < 2)
        return mp_fail(MP_EINVAL, "input must have at least 2 dims {n, c, ...} (got %s)",
                       mp_shape_str(x->ndim, x->shape, b1, sizeof b1)), NULL;
    int64_t n, ch, hw;
    dims(x, &n, &ch, &hw);
    if (check_channels(run->running_mean, x, ch, "running_mean", true) ||
        check_channels(run->running_var, x, ch, "running_var", true) || check_channels(w, x, ch, "weight", false) ||
        check_channels(b, x, ch, "bias", false))
        return NULL;
    if (!training && (!run->running_mean || !run->running_var))
        return mp_fail(MP_EINVAL, "evaluation (training = false) needs running_mean and running_var"), NULL;
    if ((run->running_mean == NULL) != (run->running_var == NULL))
        return mp_fail(MP_EINVAL, "running_mean and running_var go together (one of them is nil)"), NULL;
    if (training && n * hw <= 1)
        return mp_fail(MP_EINVAL, "training needs more than one value per channel (input %s)",
                       mp_shape_str(x->ndim, x->shape, b1, sizeof b1)), NULL;
    if (!(momentum >= 0 && momentum <= 1)) return mp_fail(MP_EINVAL, "momentum must be in [0, 1] (got %g)", momentum), NULL;
    if (!(eps > 0) || !isfinite(eps)) return mp_fail(MP_EINVAL, "eps must be positive (got %g)", eps), NULL;
    int bad = 0;
    mp_tensor *wf = f32_of(w, &bad), *bf = f32_of(b, &bad), *y = NULL;
    mp_tensor *mean = bad ? NULL : mp_empty(MP_F32, x->dev, 1, &ch), *rstd = mean ? mp_empty(MP_F32, x->dev, 1, &ch) : NULL;
    if (rstd) y = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    mp_tensor *rm = run->running_mean, *rv = run->running_var;
    if (y && MP_K(x, batch_norm, x->dtype, mp_data(y), mp_data(mean), mp_data(rstd), rm ? mp_data(rm) : NULL,
                  rv ? mp_data(rv) : NULL, mp_data(x), wf ? mp_data(wf) : NULL, bf ? mp_data(bf) : NULL, n, ch, hw,
                  training, (float)momentum, (float)eps))
        mp_release(y), y = NULL, mp_kernel_oom(c->op->name);
    if (y && (mp_keep(c, 0, x) || mp_keep(c, 1, wf) || mp_keep(c, 2, mean) || mp_keep(c, 3, rstd)))
        mp_release(y), y = NULL;
    mp_release(wf), mp_release(bf), mp_release(mean), mp_release(rstd);
    return y;
}

static const mp_op batch_norm_op = {.name = "batch_norm", .ac = MP_AC_NONE, .nin = 3, .forward = bn_fwd,
                                    .backward = bn_backward, .args_size = sizeof(batch_norm_args),
                                    .needs = {MP_BE_ENTRY(batch_norm), MP_BE_ENTRY(batch_norm_grad)}};
MP_OP_REGISTER(batch_norm_op);

mp_tensor *mp_batch_norm(mp_tensor *x, mp_tensor *running_mean, mp_tensor *running_var, mp_tensor *w, mp_tensor *b,
                         bool training, double momentum, double eps)
{
    running run = {running_mean, running_var};
    batch_norm_args args = {training, momentum, eps};
    mp_op_ctx c = {.args = &args, .extra = &run};
    mp_tensor *in[3] = {x, w, b};
    return mp_apply(&batch_norm_op, &c, 3, in);
}
