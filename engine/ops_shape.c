/*
 * ops_shape.c: reshape/view, transpose and narrow. Tensors are contiguous, so
 * reshape is always a view; narrow along dim 1 is a view at an offset; transpose
 * and narrow along other dims make contiguous copies.
 */
#include <string.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

int mp_dim(const mp_tensor *t, int d, int *out)
{
    int n = t->ndim;
    if (n == 0) return mp_fail(MP_EINVAL, "dim %d out of range for a 0-d tensor", d);
    if (d == 0 || d > n || d < -n)
        return mp_fail(MP_EINVAL, "dim %d out of range for a %d-d tensor (expected 1..%d or -%d..-1)",
                       d, n, n, n);
    *out = d > 0 ? d - 1 : n + d;
    return 0;
}

static int reshape_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    gin[0] = mp_reshape(g, n->in[0].ndim, n->in[0].shape);
    return gin[0] ? 0 : -1;
}

typedef struct { int d1, d2; } transpose_args;
typedef struct {
    int dim;                       /* given: 1-based, negative from the end */
    int64_t start, len;            /* given: 1-based start */
    int64_t outer, n, start0, inner;   /* set by the forward: the {outer, n, inner} view, 0-based start */
} narrow_args;

static int transpose_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    const transpose_args *a = MP_NODE_ARGS(n, transpose_args);
    gin[0] = mp_transpose(g, a->d1, a->d2);
    return gin[0] ? 0 : -1;
}

/* the slice's gradient g written into zeros of the input's shape (e's): in
 * one pass where the backend has narrow_pad (zeros only outside the slice) */
static mp_tensor *narrow_pad(mp_tensor *g, const mp_edge *e, const narrow_args *a)
{
    if (mp_be(g)->narrow_pad) {
        mp_tensor *r = mp_empty(g->dtype, g->dev, e->ndim, e->shape);
        if (r) MP_K(r, narrow_pad, g->dtype, mp_data(r), mp_data(g), a->outer, a->n, a->start0, a->len, a->inner, 0);
        return r;
    }
    mp_tensor *r = mp_full(g->dtype, g->dev, e->ndim, e->shape, 0);
    if (r) MP_K(r, narrow_put, g->dtype, mp_data(r), mp_data(g), a->outer, a->n, a->start0, a->len, a->inner);
    return r;
}

/* narrow_pad as an op, for a backward that builds a graph (create_graph): it
 * is linear, and its backward is the narrow it undoes */
static mp_tensor *narrow_pad_fwd(mp_op_ctx *c) { return narrow_pad(c->in[0], c->extra, MP_OP_ARGS(c, narrow_args)); }

static int narrow_pad_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    const narrow_args *a = MP_NODE_ARGS(n, narrow_args);
    gin[0] = mp_narrow(g, a->dim, a->start, a->len);
    return gin[0] ? 0 : -1;
}

static const mp_op narrow_pad_op = {.name = "narrow_backward", .nin = 1, .forward = narrow_pad_fwd,
                                    .backward = narrow_pad_backward, .args_size = sizeof(narrow_args),
                                    .double_backward = true};
MP_OP_REGISTER(narrow_pad_op);

static int narrow_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    narrow_args a = *MP_NODE_ARGS(n, narrow_args);
    if (mp_grad_enabled()) {
        mp_op_ctx c = {.args = &a, .extra = &n->in[0]};
        gin[0] = mp_apply(&narrow_pad_op, &c, 1, &g);
    } else {
        gin[0] = narrow_pad(g, &n->in[0], &a);
    }
    return gin[0] ? 0 : -1;
}

static const mp_op narrow_op;

/* n a narrow: its gradient added into acc, the sum its input's node holds so
 * far (of the input's shape and dtype), in place: acc + 0 outside the slice
 * and acc + g inside, the additions accumulate() makes of acc and the padded
 * gradient, element by element, so the same bits (the sign of a zero
 * included: -0 + 0 is +0 either way), without the padded tensor (a fill, a
 * put, and an add reading two tensors into a third: chunk(3)'s backward did
 * that twice over {B,T,3C}). engine/backward.c decides when acc is the walk's
 * own and nothing else is to see the padded gradient. 1: declined (another
 * op, dtype or shape, no backend entry); 0 done. */
int mp_narrow_backward_into(mp_node *n, mp_tensor *acc)
{
    mp_tensor *g = n->grad;
    if (n->op != &narrow_op || n->nin != 1 || !g || !acc || !mp_be(acc)->narrow_pad) return 1;
    const mp_edge *e = &n->in[0];
    if (g->dtype != e->dtype || acc->dtype != e->dtype || g->dev != e->dev || acc->dev != e->dev ||
        acc->ndim != e->ndim || memcmp(acc->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim))
        return 1;
    const narrow_args *a = MP_NODE_ARGS(n, narrow_args);
    if (g->numel != a->outer * a->len * a->inner) return 1;
    MP_K(acc, narrow_pad, acc->dtype, mp_data(acc), mp_data(g), a->outer, a->n, a->start0, a->len, a->inner, 1);
    acc->st->version++;   /* an in-place write */
    return 0;
}

/* the new shape is not kept (the backward reshapes to the input's) */
typedef struct { int ndim; const int64_t *shape; } reshape_to;

static mp_tensor *reshape_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0];
    const reshape_to *to = c->extra;
    int ndim = to->ndim;
    const int64_t *shape = to->shape;
    if (ndim < 0 || ndim > MP_MAXDIM)
        return mp_fail(MP_EINVAL, "a tensor has at most %d dims (got %d)", MP_MAXDIM, ndim), NULL;
    int64_t s[MP_MAXDIM], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1) {
            if (infer >= 0) return mp_fail(MP_EINVAL, "only one dim may be -1"), NULL;
            infer = i;
        } else if (s[i] <= 0) {
            return mp_fail(MP_EINVAL, "size of dim %d must be positive or -1 (got %lld)", i + 1,
                           (long long)s[i]), NULL;
        } else if (s[i] > t->numel / known) {   /* can't match; and known * s[i] might overflow */
            known = t->numel + 1;
        } else {
            known *= s[i];
        }
    }
    char b1[128], b2[128];
    if (infer >= 0) {
        if (known > t->numel || t->numel % known)
            return mp_fail(MP_EINVAL, "cannot reshape %s (%lld elements) to %s",
                           mp_shape_str(t->ndim, t->shape, b1, sizeof b1), (long long)t->numel,
                           mp_shape_str(ndim, shape, b2, sizeof b2)), NULL;
        s[infer] = t->numel / known;
        known *= s[infer];
    }
    if (known != t->numel)
        return mp_fail(MP_EINVAL, "cannot reshape %s (%lld elements) to %s",
                       mp_shape_str(t->ndim, t->shape, b1, sizeof b1), (long long)t->numel,
                       mp_shape_str(ndim, shape, b2, sizeof b2)), NULL;
    mp_tensor *o = mp_view(t, ndim, s, t->offset);
    if (o) o->st->grad_view = true;   /* two headers over one storage: engine/ops_inplace.c */
    return o;
}

static const mp_op reshape_op = {.name = "reshape", .nin = 1, .forward = reshape_fwd, .backward = reshape_backward,
                                  .double_backward = true, .moves_bytes = true};
MP_OP_REGISTER(reshape_op);

mp_tensor *mp_reshape(mp_tensor *t, int ndim, const int64_t *shape)
{
    reshape_to to = {ndim, shape};
    mp_op_ctx c = {.extra = &to};
    return mp_apply(&reshape_op, &c, 1, &t);
}

static mp_tensor *transpose_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0];
    const transpose_args *args = MP_OP_ARGS(c, transpose_args);
    int d1 = args->d1, d2 = args->d2, a, b;
    if (mp_dim(t, d1, &a) || mp_dim(t, d2, &b)) return NULL;
    int perm[MP_MAXDIM];
    int64_t shape[MP_MAXDIM];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    perm[a] = b, perm[b] = a;
    for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[perm[i]];
    mp_tensor *o = mp_empty(t->dtype, t->dev, t->ndim, shape);
    if (o) MP_K(o, permute, t->dtype, mp_data(o), mp_data(t), t->ndim, t->shape, perm);
    return o;
}

static const mp_op transpose_op = {.name = "transpose", .nin = 1, .forward = transpose_fwd,
                                   .backward = transpose_backward, .args_size = sizeof(transpose_args),
                                   .double_backward = true, .moves_bytes = true};
MP_OP_REGISTER(transpose_op);

mp_tensor *mp_transpose(mp_tensor *t, int d1, int d2)
{
    transpose_args args = {d1, d2};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&transpose_op, &c, 1, &t);
}

static mp_tensor *narrow_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0];
    narrow_args *args = MP_OP_ARGS(c, narrow_args);
    int d = args->dim, k;
    int64_t start = args->start, len = args->len;
    if (mp_dim(t, d, &k)) return NULL;
    int64_t n = t->shape[k];
    if (start < 1 || start > n)
        return mp_fail(MP_EINVAL, "start %lld out of range for dim %d of size %lld (expected 1..%lld)",
                       (long long)start, d, (long long)n, (long long)n), NULL;
    if (len < 1 || len > n - (start - 1))
        return mp_fail(MP_EINVAL, "length %lld out of range: dim %d has %lld elements from %lld",
                       (long long)len, d, (long long)(n - start + 1), (long long)start), NULL;
    int64_t shape[MP_MAXDIM], outer = 1, inner = 1;
    for (int i = 0; i < t->ndim; i++) {
        shape[i] = i == k ? len : t->shape[i];
        if (i < k) outer *= t->shape[i];
        if (i > k) inner *= t->shape[i];
    }
    mp_tensor *o;
    if (outer == 1) {   /* a contiguous slab: share storage */
        o = mp_view(t, t->ndim, shape, t->offset + (start - 1) * inner);
        if (o) o->st->grad_view = true;
    } else {
        o = mp_empty(t->dtype, t->dev, t->ndim, shape);
        if (o) MP_K(o, narrow, t->dtype, mp_data(o), mp_data(t), outer, n, start - 1, len, inner);
    }
    args->outer = outer, args->n = n, args->start0 = start - 1, args->inner = inner;
    return o;
}

static const mp_op narrow_op = {.name = "narrow", .nin = 1, .forward = narrow_fwd, .backward = narrow_backward,
                                .args_size = sizeof(narrow_args), .double_backward = true, .moves_bytes = true};
MP_OP_REGISTER(narrow_op);

mp_tensor *mp_narrow(mp_tensor *t, int d, int64_t start, int64_t len)
{
    narrow_args args = {.dim = d, .start = start, .len = len};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&narrow_op, &c, 1, &t);
}
