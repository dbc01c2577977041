/*
 * ops_scan.c: cumsum, the inclusive prefix sum along one dim.
 *
 * One description with a direction: the forward scan runs from the start of
 * the dim, and its backward is the same op run from the end (the gradient of
 * y_i = sum_{j<=i} x_j is gx_j = sum_{i>=j} gy_i), so a gradient taken with
 * create_graph differentiates again. The kernel (the backends' scan entry)
 * accumulates in double and rounds each output once. Integer tensors give f32,
 * as sum does here (there is no 64-bit integer dtype; PyTorch gives int64).
 * Autocast runs it in f32, as PyTorch's autocast does (cumsum is on its f32 list).
 */
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

typedef struct {
    int dim;          /* as given: 1-based, negative from the end */
    int reverse;      /* 1: from the end of the dim (the backward) */
} scan_args;

static mp_tensor *scan(mp_tensor *x, int dim, int reverse);

static int scan_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    const scan_args *a = MP_NODE_ARGS(n, scan_args);
    /* g has the input's dtype: only a float input records a node, and its output kept it */
    return (gin[0] = scan(g, a->dim, !a->reverse)) ? 0 : -1;
}

static mp_tensor *scan_fwd(mp_op_ctx *c)
{
    mp_tensor *a = c->in[0];
    scan_args *args = MP_OP_ARGS(c, scan_args);
    int k;
    if (mp_dim(a, args->dim, &k)) return NULL;
    int64_t outer = 1, inner = 1, n = a->ndim ? a->shape[k] : 1;
    for (int i = 0; i < a->ndim; i++) {
        if (i < k) outer *= a->shape[i];
        if (i > k) inner *= a->shape[i];
    }
    mp_dtype dt = mp_is_float(a->dtype) ? a->dtype : MP_F32;
    mp_tensor *x = mp_to_raw(a, dt, a->dev), *o = x ? mp_empty(dt, a->dev, a->ndim, a->shape) : NULL;
    if (o && a->numel > 0) MP_K(o, scan, dt, mp_data(o), mp_data(x), outer, n, inner, args->reverse);
    mp_release(x);
    return o;
}

static const mp_op cumsum_op = {.name = "cumsum", .ac = MP_AC_F32, .nin = 1, .forward = scan_fwd,
                                .backward = scan_backward, .needs = {MP_BE_ENTRY(scan)},
                                .args_size = sizeof(scan_args), .double_backward = true};
MP_OP_REGISTER(cumsum_op);

static mp_tensor *scan(mp_tensor *x, int dim, int reverse)
{
    scan_args args = {.dim = dim, .reverse = reverse};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&cumsum_op, &c, 1, &x);
}

mp_tensor *mp_cumsum(mp_tensor *x, int dim) { return scan(x, dim, 0); }
