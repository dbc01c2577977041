/*
 * ops_pool.c: 2-d pooling over the last two dims of {n, c, h, w} or {c, h, w}
 * tensors, as PyTorch's F.max_pool2d, F.avg_pool2d (count_include_pad, floor
 * output size) and F.adaptive_avg_pool2d. Each keeps its input's dtype
 * (autocast leaves pooling alone, as PyTorch does).
 */
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

/* Saved: the input (its shape) and, for max, the positions of the maxima. */
typedef enum { POOL_MAX, POOL_AVG, POOL_ADAPTIVE } pool_kind;
typedef struct {
    pool_kind kind;
    int64_t kernel[2], stride[2], padding[2];   /* max and avg */
    int64_t out[2];                             /* adaptive: the output's height and width */
} pool_args;

static void args_of(const mp_tensor *x, const pool_args *p, mp_pool_args *a)
{
    a->h = x->shape[x->ndim - 2], a->w = x->shape[x->ndim - 1];
    a->planes = a->h && a->w ? x->numel / (a->h * a->w) : 0;
    a->adaptive = p->kind == POOL_ADAPTIVE;
    if (a->adaptive) {
        a->oh = p->out[0], a->ow = p->out[1];
        a->kh = a->kw = a->sh = a->sw = a->ph = a->pw = 0;
        return;
    }
    a->kh = p->kernel[0], a->kw = p->kernel[1], a->sh = p->stride[0], a->sw = p->stride[1];
    a->ph = p->padding[0], a->pw = p->padding[1];
    a->oh = (a->h + 2 * a->ph - a->kh) / a->sh + 1;
    a->ow = (a->w + 2 * a->pw - a->kw) / a->sw + 1;
}

static int pool_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *idx = nd->saved[1];
    const pool_args *p = MP_NODE_ARGS(nd, pool_args);
    pool_kind kind = p->kind;
    mp_pool_args a;
    args_of(x, p, &a);
    mp_tensor *gc = mp_to_raw(g, x->dtype, x->dev);
    mp_tensor *gx = gc ? mp_empty(x->dtype, x->dev, x->ndim, x->shape) : NULL;
    int rc = -1;
    if (gx) {
        int k = kind == POOL_MAX ? MP_K(x, max_pool2d_grad, x->dtype, mp_data(gx), mp_data(gc), mp_data(idx), &a)
                                 : MP_K(x, avg_pool2d_grad, x->dtype, mp_data(gx), mp_data(gc), &a);
        if (k) mp_kernel_oom(nd->name);
        else gin[0] = mp_retain(gx), rc = 0;
    }
    mp_release(gc), mp_release(gx);
    return rc;
}

static mp_tensor *pool_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0];
    const pool_args *p = MP_OP_ARGS(c, pool_args);
    pool_kind kind = p->kind;
    char b1[128];
    if (!mp_is_float(x->dtype))
        return mp_fail(MP_EINVAL, "input must be a float tensor (got %s)", mp_dtype_name(x->dtype)), NULL;
    if (x->ndim != 3 && x->ndim != 4)
        return mp_fail(MP_EINVAL, "input must be 3-d {c, h, w} or 4-d {n, c, h, w} (got %s)",
                       mp_shape_str(x->ndim, x->shape, b1, sizeof b1)), NULL;
    int64_t h = x->shape[x->ndim - 2], w = x->shape[x->ndim - 1];
    if (kind == POOL_ADAPTIVE) {
        for (int d = 0; d < 2; d++)
            if (p->out[d] < 1 || p->out[d] > (int64_t)1 << 30)
                return mp_fail(MP_EINVAL, "output size must be in [1, 2^30] (got %lld)", (long long)p->out[d]), NULL;
        if (h < 1 || w < 1)
            return mp_fail(MP_EINVAL, "input %s has an empty plane", mp_shape_str(x->ndim, x->shape, b1, sizeof b1)), NULL;
    } else {
        const char *pn[3] = {"kernel size", "stride", "padding"};
        const int64_t *pv[3] = {p->kernel, p->stride, p->padding};
        for (int i = 0; i < 6; i++) {
            int64_t v = pv[i / 2][i % 2], lo = i / 2 == 2 ? 0 : 1;
            if (v < lo || v > (int64_t)1 << 30)
                return mp_fail(MP_EINVAL, "%s must be in [%lld, 2^30] (got %lld)", pn[i / 2], (long long)lo,
                               (long long)v), NULL;
        }
        for (int d = 0; d < 2; d++) {
            if (2 * p->padding[d] > p->kernel[d])   /* PyTorch's rule: every window holds at least one input */
                return mp_fail(MP_EINVAL, "padding (%lld) must be at most half the kernel size (%lld)",
                               (long long)p->padding[d], (long long)p->kernel[d]), NULL;
            int64_t in = (d ? w : h) + 2 * p->padding[d];
            if (p->kernel[d] > in)
                return mp_fail(MP_EINVAL, "kernel size %lld is larger than the padded input (%lld) along %s",
                               (long long)p->kernel[d], (long long)in, d ? "the width" : "the height"), NULL;
        }
    }
    mp_pool_args a;
    args_of(x, p, &a);
    int64_t shape[4];
    for (int d = 0; d < x->ndim - 2; d++) shape[d] = x->shape[d];
    shape[x->ndim - 2] = a.oh, shape[x->ndim - 1] = a.ow;
    mp_tensor *y = mp_empty(x->dtype, x->dev, x->ndim, shape), *idx = NULL;
    if (y && kind == POOL_MAX && !(idx = mp_empty(MP_I32, x->dev, x->ndim, shape))) mp_release(y), y = NULL;
    if (y) {
        int k = kind == POOL_MAX ? MP_K(x, max_pool2d, x->dtype, mp_data(y), mp_data(idx), mp_data(x), &a)
                                 : MP_K(x, avg_pool2d, x->dtype, mp_data(y), mp_data(x), &a);
        if (k) mp_release(y), y = NULL, mp_kernel_oom(c->op->name);
    }
    if (y && (mp_keep(c, 0, x) || mp_keep(c, 1, idx))) mp_release(y), y = NULL;
    mp_release(idx);
    return y;
}

#define MAX_NEEDS {MP_BE_ENTRY(max_pool2d), MP_BE_ENTRY(max_pool2d_grad)}
#define AVG_NEEDS {MP_BE_ENTRY(avg_pool2d), MP_BE_ENTRY(avg_pool2d_grad)}
#define POOL_OP(NAME, NEEDS) {.name = NAME, .nin = 1, .forward = pool_fwd, .backward = pool_backward, \
                              .args_size = sizeof(pool_args), .needs = NEEDS}
static const mp_op max_pool2d_op = POOL_OP("max_pool2d", MAX_NEEDS);
static const mp_op avg_pool2d_op = POOL_OP("avg_pool2d", AVG_NEEDS);
static const mp_op adaptive_avg_pool2d_op = POOL_OP("adaptive_avg_pool2d", AVG_NEEDS);
MP_OP_REGISTER(max_pool2d_op);
MP_OP_REGISTER(avg_pool2d_op);
MP_OP_REGISTER(adaptive_avg_pool2d_op);

static mp_tensor *pool(const mp_op *op, pool_args *args, mp_tensor *x)
{
    mp_op_ctx c = {.args = args};
    return mp_apply(op, &c, 1, &x);
}

mp_tensor *mp_max_pool2d(mp_tensor *x, const int64_t k[2], const int64_t stride[2], const int64_t padding[2])
{
    pool_args a = {POOL_MAX, {k[0], k[1]}, {stride[0], stride[1]}, {padding[0], padding[1]}, {0, 0}};
    return pool(&max_pool2d_op, &a, x);
}

mp_tensor *mp_avg_pool2d(mp_tensor *x, const int64_t k[2], const int64_t stride[2], const int64_t padding[2])
{
    pool_args a = {POOL_AVG, {k[0], k[1]}, {stride[0], stride[1]}, {padding[0], padding[1]}, {0, 0}};
    return pool(&avg_pool2d_op, &a, x);
}

mp_tensor *mp_adaptive_avg_pool2d(mp_tensor *x, const int64_t out[2])
{
    pool_args a = {.kind = POOL_ADAPTIVE, .out = {out[0], out[1]}};
    return pool(&adaptive_avg_pool2d_op, &a, x);
}
