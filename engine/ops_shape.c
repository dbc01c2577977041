/*
 * ops_shape.c: reshape/view, transpose and narrow. Tensors are contiguous, so
 * reshape is always a view; narrow along dim 1 is a view at an offset; transpose
 * and narrow along other dims make contiguous copies.
 */
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/autograd.h"

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

static mp_tensor *recorded(mp_tensor *o, const char *name, mp_backward_fn fn, mp_tensor *in, mp_node **n)
{
    *n = NULL;
    if (o && mp_record(o, name, fn, 1, &in, n)) {
        mp_release(o);
        return NULL;
    }
    return o;
}

static int reshape_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    gin[0] = mp_reshape(g, n->in[0].ndim, n->in[0].shape);
    return gin[0] ? 0 : -1;
}

static int transpose_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    gin[0] = mp_transpose(g, (int)n->i[0], (int)n->i[1]);
    return gin[0] ? 0 : -1;
}

/* the slice's gradient written into zeros of the input's shape */
static int narrow_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_edge *e = &n->in[0];
    mp_tensor *r = mp_full(g->dtype, g->dev, e->ndim, e->shape, 0);
    if (!r) return -1;
    mp_be(r)->narrow_put(g->dtype, mp_data(r), mp_data(g), n->i[0], n->i[1], n->i[2], n->i[3], n->i[4]);
    gin[0] = r;
    return 0;
}

mp_tensor *mp_reshape(mp_tensor *t, int ndim, const int64_t *shape)
{
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
    mp_node *n;
    return recorded(mp_view(t, ndim, s, t->offset), "reshape", reshape_backward, t, &n);
}

mp_tensor *mp_transpose(mp_tensor *t, int d1, int d2)
{
    int a, b;
    if (mp_dim(t, d1, &a) || mp_dim(t, d2, &b)) return NULL;
    if (a == b) return mp_clone(t);
    int perm[MP_MAXDIM];
    int64_t shape[MP_MAXDIM];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    perm[a] = b, perm[b] = a;
    for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[perm[i]];
    mp_tensor *o = mp_empty(t->dtype, t->dev, t->ndim, shape);
    if (o) mp_be(o)->permute(t->dtype, mp_data(o), mp_data(t), t->ndim, t->shape, perm);
    mp_node *n;
    o = recorded(o, "transpose", transpose_backward, t, &n);
    if (n) n->i[0] = d1, n->i[1] = d2;
    return o;
}

mp_tensor *mp_narrow(mp_tensor *t, int d, int64_t start, int64_t len)
{
    int k;
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
    } else {
        o = mp_empty(t->dtype, t->dev, t->ndim, shape);
        if (o) mp_be(o)->narrow(t->dtype, mp_data(o), mp_data(t), outer, n, start - 1, len, inner);
    }
    mp_node *node;
    o = recorded(o, "narrow", narrow_backward, t, &node);
    if (node) node->i[0] = outer, node->i[1] = n, node->i[2] = start - 1, node->i[3] = len, node->i[4] = inner;
    return o;
}
