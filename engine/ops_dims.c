/*
 * ops_dims.c: dims added, dropped, reordered and repeated: unsqueeze and
 * squeeze (reshapes, so views sharing storage), permute (a contiguous copy,
 * as transpose: tensors here are contiguous), expand (PyTorch's sizes, a
 * copy; its backward sums back, mp_sum_to) and stack (unsqueeze each, then
 * cat). Dims are 1-based, negative from the end, as everywhere (ops.h).
 */
#include <stdlib.h>
#include <string.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

/* ---- unsqueeze, squeeze ---- */

/* a new dim's place: 1..ndim+1, or -1 (after the last) to -(ndim+1) */
static int new_dim(const mp_tensor *t, int d, int *out)
{
    int n = t->ndim + 1;
    if (d == 0 || d > n || d < -n)
        return mp_fail(MP_EINVAL, "dim %d out of range for a new dim of a %d-d tensor (expected 1..%d or -%d..-1)", d,
                       t->ndim, n, n);
    if (n > MP_MAXDIM) return mp_fail(MP_EINVAL, "a tensor has at most %d dims (this one has %d)", MP_MAXDIM, t->ndim);
    *out = d > 0 ? d - 1 : n + d;
    return 0;
}

mp_tensor *mp_unsqueeze(mp_tensor *t, int dim)
{
    int k;
    if (new_dim(t, dim, &k)) return NULL;
    int64_t shape[MP_MAXDIM];
    for (int i = 0, j = 0; i <= t->ndim; i++) shape[i] = i == k ? 1 : t->shape[j++];
    return mp_reshape(t, t->ndim + 1, shape);
}

mp_tensor *mp_squeeze(mp_tensor *t, int dim)
{
    int64_t shape[MP_MAXDIM];
    int n = 0, k = -1;
    if (dim != 0 && mp_dim(t, dim, &k)) return NULL;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != 1 || (k >= 0 && i != k)) shape[n++] = t->shape[i];
    return mp_reshape(t, n, shape);
}

/* ---- permute ---- */

typedef struct {
    int n;
    int perm[MP_MAXDIM];           /* output dim d is input dim perm[d], 0-based (set by the forward) */
    int given[MP_MAXDIM];          /* as the caller gave them: 1-based, negative from the end */
} permute_args;

static int permute_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    const permute_args *a = MP_NODE_ARGS(n, permute_args);
    int inv[MP_MAXDIM];
    for (int d = 0; d < a->n; d++) inv[a->perm[d]] = d + 1;
    gin[0] = mp_permute(g, a->n, inv);
    return gin[0] ? 0 : -1;
}

static mp_tensor *permute_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0];
    permute_args *a = MP_OP_ARGS(c, permute_args);
    if (a->n != t->ndim)
        return mp_fail(MP_EINVAL, "expected %d dims for a %d-d tensor (got %d)", t->ndim, t->ndim, a->n), NULL;
    bool seen[MP_MAXDIM] = {false};
    int64_t shape[MP_MAXDIM];
    for (int d = 0; d < a->n; d++) {
        if (mp_dim(t, a->given[d], &a->perm[d])) return NULL;
        if (seen[a->perm[d]])
            return mp_fail(MP_EINVAL, "dim %d is repeated (each dim once)", a->perm[d] + 1), NULL;
        seen[a->perm[d]] = true;
        shape[d] = t->shape[a->perm[d]];
    }
    if (t->ndim == 0) return mp_view(t, 0, NULL, t->offset);
    mp_tensor *o = mp_empty(t->dtype, t->dev, t->ndim, shape);
    if (o) MP_K(o, permute, t->dtype, mp_data(o), mp_data(t), t->ndim, t->shape, a->perm);
    return o;
}

static const mp_op permute_op = {.name = "permute", .nin = 1, .forward = permute_fwd, .backward = permute_backward,
                                 .args_size = sizeof(permute_args), .double_backward = true, .moves_bytes = true};
MP_OP_REGISTER(permute_op);

mp_tensor *mp_permute(mp_tensor *t, int n, const int *dims)
{
    if (n < 0 || n > MP_MAXDIM)
        return mp_fail(MP_EINVAL, "expected %d dims for a %d-d tensor (got %d)", t->ndim, t->ndim, n), NULL;
    permute_args args = {.n = n};
    for (int d = 0; d < n; d++) args.given[d] = dims[d];
    mp_op_ctx c = {.args = &args};
    return mp_apply(&permute_op, &c, 1, &t);
}

/* ---- expand ---- */

typedef struct { int ndim; int64_t shape[MP_MAXDIM]; } expand_to;

static int expand_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    gin[0] = mp_sum_to(g, n->in[0].ndim, n->in[0].shape);
    return gin[0] ? 0 : -1;
}

/* each value times one, broadcast: exact in every dtype, -0 and NaN kept;
 * FP8, which computes nothing, as its bytes (u8, times one) */
static mp_tensor *expand_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0];
    mp_dtype dt = mp_is_storage_only(t->dtype) ? MP_U8 : t->dtype;
    const expand_to *to = c->extra;
    mp_bcast bc = {.ndim = to->ndim};
    int lead = to->ndim - t->ndim;
    int64_t s = 1;
    for (int d = to->ndim - 1; d >= 0; d--) {
        bc.shape[d] = to->shape[d];
        int i = d - lead;
        bc.sa[d] = i >= 0 && t->shape[i] != 1 ? s : 0;
        if (i >= 0) s *= t->shape[i];
        bc.sb[d] = 0;
    }
    mp_tensor *one = mp_full(dt, t->dev, 0, NULL, 1);
    mp_tensor *o = one ? mp_empty(dt, t->dev, to->ndim, to->shape) : NULL;
    if (o) {
        mp_bcast m;
        mp_bcast_coalesce(&bc, &m);
        MP_K(o, binary, MP_MUL, dt, mp_data(o), mp_data(t), mp_data(one), &m);
        o->dtype = t->dtype;   /* a new tensor: its bytes are t's dtype's */
    }
    mp_release(one);
    return o;
}

static const mp_op expand_op = {.name = "expand", .nin = 1, .forward = expand_fwd, .backward = expand_backward,
                                .double_backward = true, .moves_bytes = true};
MP_OP_REGISTER(expand_op);

mp_tensor *mp_expand_sizes(mp_tensor *t, int ndim, const int64_t *sizes)
{
    char b1[128], b2[128];
    if (ndim < t->ndim)
        return mp_fail(MP_EINVAL, "%d sizes for a %d-d tensor (at least as many as its dims)", ndim, t->ndim), NULL;
    if (ndim > MP_MAXDIM) return mp_fail(MP_EINVAL, "a tensor has at most %d dims (got %d)", MP_MAXDIM, ndim), NULL;
    expand_to to = {.ndim = ndim};
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t s = sizes[d], have = d >= lead ? t->shape[d - lead] : 1;
        if (s == -1 && d < lead)
            return mp_fail(MP_EINVAL, "size -1 in new dim %d (-1 keeps a dim the tensor has)", d + 1), NULL;
        if (s == -1) s = have;
        if (s < 1) return mp_fail(MP_EINVAL, "size of dim %d must be positive or -1 (got %lld)", d + 1, (long long)s), NULL;
        if (have != 1 && s != have)
            return mp_fail(MP_EINVAL, "cannot expand %s to %s: dim %d has size %lld (only size 1 expands)",
                           mp_shape_str(t->ndim, t->shape, b1, sizeof b1), mp_shape_str(ndim, sizes, b2, sizeof b2),
                           d + 1, (long long)have), NULL;
        to.shape[d] = s;
    }
    mp_op_ctx c = {.extra = &to};
    return mp_apply(&expand_op, &c, 1, &t);
}

/* ---- stack ---- */

mp_tensor *mp_stack(int n, mp_tensor *const *ts, int dim)
{
    char b1[128], b2[128];
    if (n < 1) return mp_fail(MP_EINVAL, "needs at least one tensor"), NULL;
    int k;
    if (new_dim(ts[0], dim, &k)) return NULL;
    for (int i = 1; i < n; i++)
        if (ts[i]->ndim != ts[0]->ndim || memcmp(ts[i]->shape, ts[0]->shape, sizeof(int64_t) * (size_t)ts[0]->ndim))
            return mp_fail(MP_EINVAL, "tensor %d is %s, tensor 1 %s (stack needs one shape)", i + 1,
                           mp_shape_str(ts[i]->ndim, ts[i]->shape, b1, sizeof b1),
                           mp_shape_str(ts[0]->ndim, ts[0]->shape, b2, sizeof b2)), NULL;
    mp_tensor *small[16], **u = n <= 16 ? small : calloc((size_t)n, sizeof *u);
    if (!u) return mp_fail(MP_EOOM, "out of memory"), NULL;
    int made = 0;
    for (; made < n; made++)
        if (!(u[made] = mp_unsqueeze(ts[made], k + 1))) break;
    mp_tensor *o = made == n ? mp_cat(n, u, k + 1) : NULL;
    for (int i = 0; i < made; i++) mp_release(u[i]);
    if (u != small) free(u);
    return o;
}
