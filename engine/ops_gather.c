/*
 * ops_gather.c: gather and scatter along a dim, PyTorch's gather, scatter
 * and scatter_add (out of place). The index is an i32 tensor of x's number of
 * dims whose values (0-based, as index_select's) pick places along dim; in
 * every other dim it may be smaller than x (and than src), and only that
 * corner takes part. Gradients: gather's is the scatter_add of the gradient
 * into zeros; scatter's for x is the gradient with the scattered places zeroed
 * and for src the gather of the gradient; scatter_add's for x the gradient
 * itself. Each backward is built of these ops, so it records under
 * create_graph (double backward).
 */
#include <string.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

typedef struct {
    int dim;                       /* given: 1-based, negative from the end */
    int add;                       /* scatter: 0 sets, 1 adds */
} along_args;

/* the kernel's description for x (contiguous) and idx; *k: dim, 0-based */
static void describe(const mp_tensor *x, const mp_tensor *idx, int k, mp_along_args *a)
{
    memset(a, 0, sizeof *a);
    a->ndim = idx->ndim, a->dim = k, a->n = x->shape[k];
    int64_t s = 1;
    for (int d = x->ndim - 1; d >= 0; d--) a->xs[d] = s, s *= x->shape[d];
    for (int d = 0; d < idx->ndim; d++) a->shape[d] = idx->shape[d];
}

/* the index against x: i32, x's device and number of dims, no larger than x
 * in the dims but dim, values in [0, x's size along dim) */
static int check_index(const mp_tensor *x, const mp_tensor *idx, int dim, int *k)
{
    char b1[128], b2[128];
    if (mp_dim(x, dim, k)) return -1;
    if (idx->dtype != MP_I32) return mp_fail(MP_EINVAL, "index must be i32 (got %s)", mp_dtype_name(idx->dtype));
    if (idx->dev != x->dev)
        return mp_fail(MP_EINVAL, "index is on %s, the tensor on %s", mp_device_name(idx->dev), mp_device_name(x->dev));
    if (idx->ndim != x->ndim)
        return mp_fail(MP_EINVAL, "index must have as many dims as the tensor (%d, got %d)", x->ndim, idx->ndim);
    for (int d = 0; d < x->ndim; d++)
        if (d != *k && idx->shape[d] > x->shape[d])
            return mp_fail(MP_EINVAL, "index %s is larger than the tensor %s in dim %d (only dim %d may be larger)",
                           mp_shape_str(idx->ndim, idx->shape, b1, sizeof b1),
                           mp_shape_str(x->ndim, x->shape, b2, sizeof b2), d + 1, *k + 1);
    return mp_check_indices(idx, x->shape[*k], "index");
}

/* ---- gather ---- */

static int gather_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    const along_args *a = MP_NODE_ARGS(n, along_args);
    mp_tensor *z = mp_full(g->dtype, g->dev, n->in[0].ndim, n->in[0].shape, 0);
    gin[0] = z ? mp_scatter(z, a->dim, n->saved[0], g, true) : NULL;
    mp_release(z);
    return gin[0] ? 0 : -1;
}

static mp_tensor *gather_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *idx = c->in[1];
    int k;
    if (check_index(x, idx, MP_OP_ARGS(c, along_args)->dim, &k)) return NULL;
    mp_along_args a;
    describe(x, idx, k, &a);
    mp_tensor *o = mp_empty(x->dtype, x->dev, idx->ndim, idx->shape);
    if (o) MP_K(o, gather_along, x->dtype, mp_data(o), mp_data(x), mp_data(idx), &a);
    if (o && mp_keep(c, 0, idx)) mp_release(o), o = NULL;
    return o;
}

/* the index is an input without a gradient */
static const mp_op gather_op = {.name = "gather", .nin = 2, .forward = gather_fwd, .backward = gather_backward,
                                .needs = {MP_BE_ENTRY(gather_along), MP_BE_ENTRY(scatter_along)},
                                .args_size = sizeof(along_args), .double_backward = true};
MP_OP_REGISTER(gather_op);

mp_tensor *mp_gather(mp_tensor *x, int dim, mp_tensor *idx)
{
    along_args args = {.dim = dim};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[2] = {x, idx};
    return mp_apply(&gather_op, &c, 2, in);
}

/* ---- scatter and scatter_add: inputs x, index, src (src the index's shape) ---- */

static int scatter_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    const along_args *a = MP_NODE_ARGS(n, along_args);
    mp_tensor *idx = n->saved[0];
    if (mp_edge_wants(n, 0)) {
        if (a->add) {
            gin[0] = mp_retain(g);
        } else {   /* the places src overwrote take no gradient */
            mp_tensor *z = mp_full(g->dtype, g->dev, idx->ndim, idx->shape, 0);
            gin[0] = z ? mp_scatter(g, a->dim, idx, z, false) : NULL;
            mp_release(z);
        }
        if (!gin[0]) return -1;
    }
    if (mp_edge_wants(n, 2) && !(gin[2] = mp_gather(g, a->dim, idx))) return -1;
    return 0;
}

static mp_tensor *scatter_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *idx = c->in[1], *src = c->in[2];
    const along_args *args = MP_OP_ARGS(c, along_args);
    int k;
    if (check_index(x, idx, args->dim, &k)) return NULL;
    if (src->dtype != x->dtype)
        return mp_fail(MP_EINVAL, "src is %s and the tensor %s (one dtype for both)", mp_dtype_name(src->dtype),
                       mp_dtype_name(x->dtype)), NULL;
    if (src->dev != x->dev)
        return mp_fail(MP_EINVAL, "src is on %s, the tensor on %s", mp_device_name(src->dev),
                       mp_device_name(x->dev)), NULL;
    mp_along_args a;
    describe(x, idx, k, &a);
    mp_tensor *o = mp_empty(x->dtype, x->dev, x->ndim, x->shape);   /* x's copy, not recorded (mp_clone would be) */
    if (o) MP_K(o, copy, mp_data(o), mp_data(x), (size_t)x->numel * mp_dtype_size(x->dtype));
    if (o) MP_K(o, scatter_along, x->dtype, mp_data(o), mp_data(src), mp_data(idx), &a, args->add);
    if (o && mp_keep(c, 0, idx)) mp_release(o), o = NULL;
    return o;
}

static const mp_op scatter_op = {.name = "scatter", .nin = 3, .forward = scatter_fwd, .backward = scatter_backward,
                                 .needs = {MP_BE_ENTRY(gather_along), MP_BE_ENTRY(scatter_along)},
                                 .args_size = sizeof(along_args), .double_backward = true};
MP_OP_REGISTER(scatter_op);
static const mp_op scatter_add_op = {.name = "scatter_add", .nin = 3, .forward = scatter_fwd,
                                     .backward = scatter_backward,
                                     .needs = {MP_BE_ENTRY(gather_along), MP_BE_ENTRY(scatter_along)},
                                     .args_size = sizeof(along_args), .double_backward = true};
MP_OP_REGISTER(scatter_add_op);

mp_tensor *mp_scatter(mp_tensor *x, int dim, mp_tensor *idx, mp_tensor *src, bool add)
{
    char b1[128], b2[128];
    if (src->ndim != idx->ndim)
        return mp_fail(MP_EINVAL, "src must have as many dims as index (%d, got %d)", idx->ndim, src->ndim), NULL;
    /* a src larger than the index takes part by its corner: narrowed first (a
     * recorded view or copy, so its gradient is padded back with zeros) */
    mp_tensor *s = mp_retain(src);
    for (int d = 0; d < idx->ndim && s; d++) {
        if (idx->shape[d] > src->shape[d]) {
            mp_release(s);
            return mp_fail(MP_EINVAL, "index %s is larger than src %s in dim %d",
                           mp_shape_str(idx->ndim, idx->shape, b1, sizeof b1),
                           mp_shape_str(src->ndim, src->shape, b2, sizeof b2), d + 1), NULL;
        }
        if (idx->shape[d] == src->shape[d]) continue;
        mp_tensor *r = mp_narrow(s, d + 1, 1, idx->shape[d]);
        mp_release(s);
        s = r;
    }
    if (!s) return NULL;
    along_args args = {.dim = dim, .add = add};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[3] = {x, idx, s};
    mp_tensor *o = mp_apply(add ? &scatter_add_op : &scatter_op, &c, 3, in);
    mp_release(s);
    return o;
}

mp_tensor *mp_scatter_value(mp_tensor *x, int dim, mp_tensor *idx, double value)
{
    mp_tensor *s = mp_full(x->dtype, x->dev, idx->ndim, idx->shape, value);
    mp_tensor *o = s ? mp_scatter(x, dim, idx, s, false) : NULL;
    mp_release(s);
    return o;
}
