/*
 * ops_index.c: selecting entries by index: index_select along a dim (the
 * batching of a data loader, the forward of an embedding). Index values are
 * 0-based, like labels and class ids.
 */
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

int mp_check_indices(const mp_tensor *idx, int64_t n, const char *what)
{
    if (idx->dtype != MP_I32)
        return mp_fail(MP_EINVAL, "%s must be i32 (got %s)", what, mp_dtype_name(idx->dtype));
    /* an asynchronous backend checks them on the device and reports a bad one
     * after the op (as PyTorch's device-side asserts do): no wait here */
    const mp_backend *be = mp_be(idx);
    if (idx->dev != MP_CPU && be->check_indices) {
        be->check_indices(be->ctx, mp_data(idx), idx->numel, n, what);
        return 0;
    }
    mp_tensor *host = mp_to_raw((mp_tensor *)idx, MP_I32, MP_CPU);
    if (!host) return -1;
    const int32_t *v = mp_data(host);
    int rc = 0;
    for (int64_t j = 0; j < host->numel && rc == 0; j++)
        if (v[j] < 0 || v[j] >= n)
            rc = mp_fail(MP_EINVAL, "%s: %d at position %lld out of range [0, %lld)", what, v[j],
                         (long long)j + 1, (long long)n);
    mp_release(host);
    return rc;
}

typedef struct {
    int dim;                       /* given: 1-based, negative from the end */
    int64_t outer, n, inner;       /* set by the forward: the {outer, n, inner} view of the input */
} index_select_args;

/* the adjoint of a gather: selected rows of g add back into zeros of the
 * input's shape (e's) */
static mp_tensor *scatter_rows(mp_tensor *g, mp_tensor *idx, const mp_edge *e, const index_select_args *a)
{
    mp_tensor *r = mp_full(g->dtype, g->dev, e->ndim, e->shape, 0);
    if (r) MP_K(r, scatter_add, g->dtype, mp_data(r), mp_data(g), mp_data(idx), idx->numel, a->outer, a->n, a->inner);
    return r;
}

/* scatter_rows as an op on (g, idx), for a backward that builds a graph
 * (create_graph): it is linear in g, and its backward is the gather again */
static mp_tensor *scatter_rows_fwd(mp_op_ctx *c)
{
    mp_tensor *o = scatter_rows(c->in[0], c->in[1], c->extra, MP_OP_ARGS(c, index_select_args));
    if (o && mp_keep(c, 0, c->in[1])) mp_release(o), o = NULL;
    return o;
}

static int scatter_rows_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    gin[0] = mp_index_select(g, MP_NODE_ARGS(n, index_select_args)->dim, n->saved[0]);
    return gin[0] ? 0 : -1;
}

static const mp_op scatter_rows_op = {.name = "index_select_backward", .nin = 2, .forward = scatter_rows_fwd,
                                      .backward = scatter_rows_backward, .args_size = sizeof(index_select_args),
                                      .double_backward = true};
MP_OP_REGISTER(scatter_rows_op);

static int index_select_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    index_select_args a = *MP_NODE_ARGS(n, index_select_args);
    if (mp_grad_enabled()) {
        mp_op_ctx c = {.args = &a, .extra = &n->in[0]};
        mp_tensor *in[2] = {g, n->saved[0]};
        gin[0] = mp_apply(&scatter_rows_op, &c, 2, in);
    } else {
        gin[0] = scatter_rows(g, n->saved[0], &n->in[0], &a);
    }
    return gin[0] ? 0 : -1;
}

static mp_tensor *index_select_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0], *idx = c->in[1];
    index_select_args *args = MP_OP_ARGS(c, index_select_args);
    int dim = args->dim, k;
    if (mp_dim(t, dim, &k)) return NULL;
    if (idx->dev != t->dev)
        return mp_fail(MP_EINVAL, "indices are on %s, the tensor on %s", mp_device_name(idx->dev),
                       mp_device_name(t->dev)), NULL;
    if (idx->ndim != 1)
        return mp_fail(MP_EINVAL, "indices must be a 1-d i32 tensor (got %d dims)", idx->ndim), NULL;
    if (mp_check_indices(idx, t->shape[k], "index")) return NULL;
    int64_t outer = 1, inner = 1, shape[MP_MAXDIM];
    for (int i = 0; i < t->ndim; i++) {
        shape[i] = i == k ? idx->numel : t->shape[i];
        if (i < k) outer *= t->shape[i];
        if (i > k) inner *= t->shape[i];
    }
    mp_tensor *o = mp_empty(t->dtype, t->dev, t->ndim, shape);
    if (o) MP_K(o, gather, t->dtype, mp_data(o), mp_data(t), mp_data(idx), idx->numel, outer, t->shape[k], inner);
    args->outer = outer, args->n = t->shape[k], args->inner = inner;
    if (o && mp_keep(c, 0, idx)) mp_release(o), o = NULL;
    return o;
}

/* the indices are an input without a gradient */
static const mp_op index_select_op = {.name = "index_select", .nin = 2, .forward = index_select_fwd,
                                      .backward = index_select_backward, .args_size = sizeof(index_select_args),
                                      .double_backward = true, .moves_bytes = true};
MP_OP_REGISTER(index_select_op);

mp_tensor *mp_index_select(mp_tensor *t, int dim, mp_tensor *idx)
{
    index_select_args args = {.dim = dim};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[2] = {t, idx};
    return mp_apply(&index_select_op, &c, 2, in);
}
