/*
 * ops_clamp.c: clamp(x, lo, hi), either bound absent (not both), as PyTorch's:
 * NaN passes through, lo > hi gives hi everywhere, and the gradient is g where
 * lo <= x <= hi, else 0 (a NaN input gets 0). Float tensors only: the integer
 * dtypes would need their own rounding of the bounds, and no caller asks.
 * Autocast leaves it alone (MP_AC_NONE): it runs in its input's dtype.
 */
#include <math.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

typedef struct { double lo, hi; } clamp_args;   /* an absent bound: an infinity */

static mp_tensor *clamp_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0];
    const clamp_args *a = MP_OP_ARGS(c, clamp_args);
    if (!mp_is_float(x->dtype))
        return mp_fail(MP_EINVAL, "x must be a float tensor (got %s)", mp_dtype_name(x->dtype)), NULL;
    mp_tensor *o = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    if (!o) return NULL;
    MP_K(o, clamp, x->dtype, mp_data(o), mp_data(x), NULL, x->numel, a->lo, a->hi);
    if (mp_keep(c, 0, x)) mp_release(o), o = NULL;
    return o;
}

/* the clamp kernel's gradient; under create_graph g times the same mask as a
 * recording product, so the gradient can be differentiated again (with respect
 * to g: the mask is piecewise constant in x) */
static int clamp_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = n->saved[0];
    const clamp_args *a = MP_NODE_ARGS(n, clamp_args);
    mp_tensor *gg = mp_to_raw(g, x->dtype, x->dev);
    if (!gg) return -1;
    bool graph = mp_grad_enabled();
    mp_tensor *ones = graph ? mp_full(x->dtype, x->dev, x->ndim, x->shape, 1) : NULL;
    mp_tensor *r = !graph || ones ? mp_empty(x->dtype, x->dev, x->ndim, x->shape) : NULL;
    if (r) MP_K(r, clamp, x->dtype, mp_data(r), mp_data(x), mp_data(graph ? ones : gg), x->numel, a->lo, a->hi);
    mp_release(ones);
    if (r && graph) {   /* r is the mask: g * mask, recorded */
        mp_tensor *p = mp_binary(MP_MUL, g, r);
        mp_release(r);
        r = p;
    }
    mp_release(gg);
    gin[0] = r;
    return r ? 0 : -1;
}

static const mp_op clamp_op = {.name = "clamp", .ac = MP_AC_NONE, .nin = 1, .forward = clamp_fwd,
                               .backward = clamp_backward, .needs = {MP_BE_ENTRY(clamp)},
                               .args_size = sizeof(clamp_args), .double_backward = true};
MP_OP_REGISTER(clamp_op);

mp_tensor *mp_clamp(mp_tensor *x, const double *lo, const double *hi)
{
    if (!lo && !hi) return mp_fail(MP_EINVAL, "give min or max (both are nil)"), NULL;
    if ((lo && isnan(*lo)) || (hi && isnan(*hi)))
        return mp_fail(MP_EINVAL, "%s must be a number, not NaN", lo && isnan(*lo) ? "min" : "max"), NULL;
    clamp_args args = {lo ? *lo : -INFINITY, hi ? *hi : INFINITY};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&clamp_op, &c, 1, &x);
}
