/*
 * ops_conv.c: mp_conv2d, 2-d convolution over NCHW tensors with stride,
 * padding, dilation and groups, as PyTorch's F.conv2d: x {n, c, h, w},
 * w {k, c / groups, r, s}, optional b {k}; output {n, k, oh, ow} with
 * oh = (h + 2 ph - dh (r - 1) - 1) / sh + 1 (ow likewise). In autocast's
 * low-precision class, as in PyTorch.
 */
#include <stdio.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

/* Saved: x, w. */
typedef struct { int64_t stride[2], padding[2], dilation[2], groups; } conv2d_args;

static void args_of(const mp_tensor *x, const mp_tensor *w, const conv2d_args *p, mp_conv_args *a)
{
    a->n = x->shape[0], a->c = x->shape[1], a->h = x->shape[2], a->w = x->shape[3];
    a->k = w->shape[0], a->r = w->shape[2], a->s = w->shape[3];
    a->sh = p->stride[0], a->sw = p->stride[1], a->ph = p->padding[0], a->pw = p->padding[1];
    a->dh = p->dilation[0], a->dw = p->dilation[1];
    a->groups = p->groups;
    a->oh = (a->h + 2 * a->ph - a->dh * (a->r - 1) - 1) / a->sh + 1;
    a->ow = (a->w + 2 * a->pw - a->dw * (a->s - 1) - 1) / a->sw + 1;
}

static int conv_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *w = nd->saved[1];
    mp_conv_args a;
    args_of(x, w, MP_NODE_ARGS(nd, conv2d_args), &a);
    bool wx = mp_edge_wants(nd, 0), ww = mp_edge_wants(nd, 1), wb = nd->nin > 2 && mp_edge_wants(nd, 2);
    mp_tensor *gc = mp_to_raw(g, x->dtype, x->dev);
    mp_tensor *gx = gc && wx ? mp_empty(x->dtype, x->dev, 4, x->shape) : NULL;
    mp_tensor *gw = gc && ww ? mp_empty(w->dtype, w->dev, 4, w->shape) : NULL;
    mp_tensor *gb = gc && wb ? mp_empty(MP_F32, x->dev, 1, &a.k) : NULL;
    int rc = -1;
    if (gc && (!wx || gx) && (!ww || gw) && (!wb || gb)) {
        if (MP_K(x, conv2d_grad, x->dtype, gx ? mp_data(gx) : NULL, gw ? mp_data(gw) : NULL, gb ? mp_data(gb) : NULL,
                 mp_data(gc), mp_data(x), mp_data(w), &a)) {
            mp_kernel_oom(nd->name);
        } else {
            rc = 0;
            if (gx) gin[0] = mp_retain(gx);
            if (gw) gin[1] = mp_retain(gw);
            if (gb && !(gin[2] = mp_to_raw(gb, nd->in[2].dtype, x->dev))) rc = -1;
        }
    }
    mp_release(gc), mp_release(gx), mp_release(gw), mp_release(gb);
    return rc;
}

static mp_tensor *conv_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    const conv2d_args *p = MP_OP_ARGS(c, conv2d_args);
    char b1[128], b2[128];
    if (!mp_is_float(x->dtype))
        return mp_fail(MP_EINVAL, "input must be a float tensor (got %s)", mp_dtype_name(x->dtype)), NULL;
    if (x->ndim != 4)
        return mp_fail(MP_EINVAL, "input must be 4-d {n, c, h, w} (got %s)", mp_shape_str(x->ndim, x->shape, b1, sizeof b1)), NULL;
    if (w->ndim != 4)
        return mp_fail(MP_EINVAL, "weight must be 4-d {out channels, in channels / groups, kh, kw} (got %s)",
                       mp_shape_str(w->ndim, w->shape, b1, sizeof b1)), NULL;
    mp_tensor *pw[2] = {w, b};
    const char *what[2] = {"weight", "bias"};
    for (int i = 0; i < 2; i++)
        if (pw[i] && (pw[i]->dtype != x->dtype || pw[i]->dev != x->dev))
            return mp_fail(MP_EINVAL, "%s is %s on %s, input %s on %s", what[i], mp_dtype_name(pw[i]->dtype),
                           mp_device_name(pw[i]->dev), mp_dtype_name(x->dtype), mp_device_name(x->dev)), NULL;
    const char *pn[3] = {"stride", "padding", "dilation"};
    const int64_t *pv[3] = {p->stride, p->padding, p->dilation};
    for (int i = 0; i < 6; i++) {
        int64_t v = pv[i / 2][i % 2], lo = i / 2 == 1 ? 0 : 1;
        if (v < lo || v > (int64_t)1 << 30)
            return mp_fail(MP_EINVAL, "%s must be in [%lld, 2^30] (got %lld)", pn[i / 2], (long long)lo, (long long)v),
                   NULL;
    }
    int64_t groups = p->groups, ch = x->shape[1], k = w->shape[0];   /* in [1, 2^30]: mp_conv2d */
    if (groups > ch)
        return mp_fail(MP_EINVAL, "groups must be a positive integer no larger than the input's %lld channels (got %lld)",
                       (long long)ch, (long long)groups), NULL;
    if (ch % groups || k % groups)
        return mp_fail(MP_EINVAL, "groups (%lld) must divide the input's channels (%lld) and the output's (%lld)",
                       (long long)groups, (long long)ch, (long long)k), NULL;
    if (w->shape[1] * groups != ch)
        return mp_fail(MP_EINVAL, "weight %s expects %lld input channels, input %s has %lld",
                       mp_shape_str(w->ndim, w->shape, b1, sizeof b1), (long long)(w->shape[1] * groups),
                       mp_shape_str(x->ndim, x->shape, b2, sizeof b2), (long long)ch), NULL;
    if (b && (b->ndim != 1 || b->shape[0] != k))
        return mp_fail(MP_EINVAL, "bias %s does not match the weight's %lld output channels",
                       mp_shape_str(b->ndim, b->shape, b1, sizeof b1), (long long)k), NULL;
    for (int d = 0; d < 2; d++) {
        int64_t in = x->shape[2 + d] + 2 * p->padding[d], span = p->dilation[d] * (w->shape[2 + d] - 1) + 1;
        if (span > in)
            return mp_fail(MP_EINVAL, "kernel %s (dilated: %lld) is larger than the padded input (%lld) along %s",
                           mp_shape_str(2, w->shape + 2, b1, sizeof b1), (long long)span, (long long)in,
                           d ? "the width" : "the height"), NULL;
    }
    mp_conv_args a;
    args_of(x, w, p, &a);
    int64_t shape[4] = {a.n, a.k, a.oh, a.ow};
    mp_tensor *y = mp_empty(x->dtype, x->dev, 4, shape);
    if (y && MP_K(x, conv2d, x->dtype, mp_data(y), mp_data(x), mp_data(w), b ? mp_data(b) : NULL, &a))
        mp_release(y), y = NULL, mp_kernel_oom(c->op->name);
    if (y && (mp_keep(c, 0, x) || mp_keep(c, 1, w))) mp_release(y), y = NULL;
    return y;
}

static const mp_op conv2d_op = {.name = "conv2d", .ac = MP_AC_LOW, .nin = 3, .forward = conv_fwd,
                                .backward = conv_backward, .args_size = sizeof(conv2d_args),
                                .needs = {MP_BE_ENTRY(conv2d), MP_BE_ENTRY(conv2d_grad)}};
MP_OP_REGISTER(conv2d_op);

mp_tensor *mp_conv2d(mp_tensor *x, mp_tensor *w, mp_tensor *b, const int64_t stride[2], const int64_t padding[2],
                     const int64_t dilation[2], int64_t groups)
{
    /* checked before the op so that the forward's message about the channels
     * (which divides by it) never sees 0 or a negative count */
    if (groups < 1 || groups > (int64_t)1 << 30)
        return mp_fail(MP_EINVAL, "groups must be in [1, 2^30] (got %lld)", (long long)groups), NULL;
    conv2d_args args = {{stride[0], stride[1]}, {padding[0], padding[1]}, {dilation[0], dilation[1]}, groups};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[3] = {x, w, b};
    return mp_apply(&conv2d_op, &c, 3, in);
}
