/*
 * ops_select.c: ops made of other ops for selecting and masking: select (one
 * index along a dim, the dim dropped: t[i]), tril/triu (a triangle of the last
 * two dims) and masked_fill. Each part records itself, so these have no
 * backward of their own (engine/op.h), and run on every backend that runs the
 * parts.
 */
#include <math.h>
#include <stdlib.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

/* ---- select: narrow to one index, then drop the dim ---- */

typedef struct { int dim; int64_t index; } select_args;   /* both 1-based, negative from the end */

static mp_tensor *select_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0];
    const select_args *a = MP_OP_ARGS(c, select_args);
    int d = a->dim, k;
    int64_t i = a->index;
    if (mp_dim(t, d, &k)) return NULL;
    int64_t n = t->shape[k];
    if (i == 0 || i > n || i < -n)
        return mp_fail(MP_EINVAL, "index %lld out of range for dim %d of size %lld (expected 1..%lld or -%lld..-1)",
                       (long long)i, d, (long long)n, (long long)n, (long long)n), NULL;
    if (i < 0) i += n + 1;
    mp_tensor *one = mp_narrow(t, d, i, 1), *r = NULL;
    if (one) {
        int64_t shape[MP_MAXDIM];
        int nd = 0;
        for (int j = 0; j < t->ndim; j++)
            if (j != k) shape[nd++] = t->shape[j];
        r = mp_reshape(one, nd, shape);
    }
    mp_release(one);
    return r;
}

static const mp_op select_op = {.name = "select", .nin = 1, .forward = select_fwd,
                                .args_size = sizeof(select_args), .moves_bytes = true};
MP_OP_REGISTER(select_op);

mp_tensor *mp_select(mp_tensor *t, int dim, int64_t index)
{
    select_args args = {dim, index};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&select_op, &c, 1, &t);
}

/* ---- tril / triu: where(col - row <= k (tril) or >= k (triu), t, 0) ---- */

/* the u8 mask of a {rows, cols} triangle, on t's device */
static mp_tensor *triangle(mp_tensor *t, int64_t k, int lower)
{
    int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    int64_t rshape[2] = {rows, 1}, cshape[2] = {1, cols};
    mp_tensor *r = mp_arange(rows, MP_I32, t->dev), *c = r ? mp_arange(cols, MP_I32, t->dev) : NULL;
    mp_tensor *r2 = c ? mp_reshape(r, 2, rshape) : NULL, *c2 = r2 ? mp_reshape(c, 2, cshape) : NULL;
    mp_tensor *d = c2 ? mp_binary(MP_SUB, c2, r2) : NULL;   /* col - row, {rows, cols} */
    mp_tensor *kt = d ? mp_full(MP_I32, t->dev, 0, NULL, (double)k) : NULL;
    mp_tensor *m = kt ? mp_binary(lower ? MP_LE : MP_GE, d, kt) : NULL;
    mp_release(r), mp_release(c), mp_release(r2), mp_release(c2), mp_release(d), mp_release(kt);
    return m;
}

typedef struct {
    int64_t diagonal;              /* 0 the main one, > 0 above it */
    bool lower;                    /* tril keeps on and below it, triu on and above */
} tri_args;

static mp_tensor *tri_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0];
    const tri_args *a = MP_OP_ARGS(c, tri_args);
    int64_t k = a->diagonal;
    if (k < INT32_MIN || k > INT32_MAX) return mp_fail(MP_EINVAL, "diagonal %lld out of range", (long long)k), NULL;
    if (t->ndim < 2)
        return mp_fail(MP_EINVAL, "input must have at least 2 dims (got %d)", t->ndim), NULL;
    mp_tensor *m = triangle(t, k, a->lower), *zero = m ? mp_full(t->dtype, t->dev, 0, NULL, 0) : NULL;
    mp_tensor *r = zero ? mp_where(m, t, zero) : NULL;
    mp_release(m), mp_release(zero);
    return r;
}

static const mp_op tril_op = {.name = "tril", .nin = 1, .forward = tri_fwd, .args_size = sizeof(tri_args)};
static const mp_op triu_op = {.name = "triu", .nin = 1, .forward = tri_fwd, .args_size = sizeof(tri_args)};
MP_OP_REGISTER(tril_op);
MP_OP_REGISTER(triu_op);

mp_tensor *mp_tril(mp_tensor *t, int64_t k)
{
    tri_args args = {k, true};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&tril_op, &c, 1, &t);
}

mp_tensor *mp_triu(mp_tensor *t, int64_t k)
{
    tri_args args = {k, false};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&triu_op, &c, 1, &t);
}

/* ---- masked_fill: value where mask is nonzero, t elsewhere ---- */

typedef struct { double value; } masked_fill_args;

static mp_tensor *masked_fill_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0], *mask = c->in[1];
    double v = MP_OP_ARGS(c, masked_fill_args)->value;
    if (mask->dtype != MP_U8 && mask->dtype != MP_I32)
        return mp_fail(MP_EINVAL, "mask must be u8 or i32 (got %s; a comparison such as t:gt(0) gives u8)",
                       mp_dtype_name(mask->dtype)), NULL;
    if (mask->dev != t->dev)
        return mp_fail(MP_EINVAL, "mask is on %s, the tensor on %s", mp_device_name(mask->dev),
                       mp_device_name(t->dev)), NULL;
    mp_bcast bc;
    if (mp_broadcast(t, mask, &bc)) return NULL;
    if (bc.ndim != t->ndim) return mp_fail(MP_EINVAL, "mask has more dims than the tensor"), NULL;
    for (int d = 0; d < t->ndim; d++)
        if (bc.shape[d] != t->shape[d])
            return mp_fail(MP_EINVAL, "mask does not broadcast to the tensor's shape (dim %d)", d + 1), NULL;
    if (mp_check_value(t->dtype, v)) return NULL;
    mp_tensor *fill = mp_full(t->dtype, t->dev, 0, NULL, v), *r = fill ? mp_where(mask, fill, t) : NULL;
    mp_release(fill);
    return r;
}

/* the mask is an input without a gradient */
static const mp_op masked_fill_op = {.name = "masked_fill", .nin = 2, .forward = masked_fill_fwd,
                                     .args_size = sizeof(masked_fill_args)};
MP_OP_REGISTER(masked_fill_op);

mp_tensor *mp_masked_fill(mp_tensor *t, mp_tensor *mask, double value)
{
    masked_fill_args args = {value};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[2] = {t, mask};
    return mp_apply(&masked_fill_op, &c, 2, in);
}

/* ---- randint: uniform integers in [lo, hi) ---- */

mp_tensor *mp_randint(int64_t lo, int64_t hi, mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    if (hi <= lo) return mp_fail(MP_EINVAL, "high (%lld) must be greater than low (%lld)", (long long)hi, (long long)lo), NULL;
    /* from a 24-bit uniform in [0, 1): exact and unbiased while the range fits
     * 2^24; the width in unsigned arithmetic (hi - lo overflows int64 for
     * the widest arguments) */
    uint64_t width = (uint64_t)hi - (uint64_t)lo;
    if (width > (uint64_t)1 << 24)
        return mp_fail(MP_EINVAL, "high - low must be at most 2^24 (got %llu)", (unsigned long long)width), NULL;
    if (dt != MP_I32 && dt != MP_F32)
        return mp_fail(MP_EINVAL, "dtype must be i32 or f32 (got %s)", mp_dtype_name(dt)), NULL;
    if (lo < INT32_MIN || hi - 1 > INT32_MAX) return mp_fail(MP_EINVAL, "low and high must fit i32"), NULL;
    mp_tensor *u = mp_rand(MP_F32, dev, ndim, shape);
    mp_tensor *s = u ? mp_unary(MP_MULS, u, (double)(hi - lo)) : NULL;   /* in [0, hi - lo): exact */
    mp_tensor *f = s ? mp_to_raw(s, MP_I32, dev) : NULL;                   /* truncation: floor of a value >= 0 */
    mp_tensor *r = f && lo != 0 ? mp_unary(MP_ADDS, f, (double)lo) : (f ? mp_retain(f) : NULL);
    mp_tensor *out = r && dt != MP_I32 ? mp_to_raw(r, dt, dev) : (r ? mp_retain(r) : NULL);
    mp_release(u), mp_release(s), mp_release(f), mp_release(r);
    return out;
}

/* ---- topk and sort along the last dim (the public functions move any dim there) ---- */

typedef struct {
    int64_t k;                     /* values kept per row (sort: all of them) */
    bool largest;                  /* the largest first (sort: descending) */
    int64_t rows, n;               /* set by the forward: rows of n values */
} topk_args;

/* the gradient of each kept value goes back to where it was taken from */
static int topk_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *idx = nd->saved[0];
    const topk_args *a = MP_NODE_ARGS(nd, topk_args);
    int64_t rows = a->rows, n = a->n, k = a->k, rshape[2] = {rows, 1}, flatn = rows * k;
    mp_edge *e = &nd->in[0];
    mp_tensor *r = mp_arange(rows, MP_I32, g->dev), *base = r ? mp_unary(MP_MULS, r, (double)n) : NULL;
    mp_tensor *b2 = base ? mp_reshape(base, 2, rshape) : NULL, *i2 = NULL, *flat = NULL, *out = NULL, *gc = NULL;
    int64_t ishape[2] = {rows, k};
    if (b2) i2 = mp_reshape(idx, 2, ishape);
    mp_tensor *sum = i2 ? mp_binary(MP_ADD, i2, b2) : NULL;   /* row * n + position: one index into all rows */
    if (sum) flat = mp_reshape(sum, 1, &flatn);
    if (flat) out = mp_full(g->dtype, g->dev, e->ndim, e->shape, 0);
    if (out) gc = mp_to_raw(g, g->dtype, g->dev);
    if (gc) MP_K(out, scatter_add, g->dtype, mp_data(out), mp_data(gc), mp_data(flat), flatn, 1, rows * n, 1);
    mp_release(r), mp_release(base), mp_release(b2), mp_release(i2), mp_release(sum), mp_release(flat), mp_release(gc);
    if (!gc) { mp_release(out); return -1; }
    gin[0] = out;
    return 0;
}

/* extra: where the indices go (mp_tensor **) */
static mp_tensor *topk_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], **indices = (mp_tensor **)c->extra;
    topk_args *args = MP_OP_ARGS(c, topk_args);
    int64_t k = args->k;
    if (x->ndim < 1) return mp_fail(MP_EINVAL, "input must have at least one dim"), NULL;
    if (x->dtype == MP_U8) return mp_fail(MP_EINVAL, "input must not be u8"), NULL;
    int64_t n = x->shape[x->ndim - 1], rows = x->numel / n;
    if (k < 1 || k > n)
        return mp_fail(MP_EINVAL, "k must be in 1..%lld (the size of the dim; got %lld)", (long long)n, (long long)k), NULL;
    if (n > INT32_MAX || rows * n > INT32_MAX) return mp_fail(MP_EINVAL, "input too large for i32 indices"), NULL;
    int64_t shape[MP_MAXDIM];
    for (int d = 0; d < x->ndim; d++) shape[d] = d == x->ndim - 1 ? k : x->shape[d];
    mp_tensor *v = mp_empty(x->dtype, x->dev, x->ndim, shape), *idx = v ? mp_empty(MP_I32, x->dev, x->ndim, shape) : NULL;
    if (idx && MP_K(x, topk, x->dtype, mp_data(v), mp_data(idx), mp_data(x), rows, n, k, args->largest))
        mp_release(idx), idx = NULL, mp_kernel_oom(c->op->name);
    if (!idx || mp_keep(c, 0, idx)) {
        mp_release(v), mp_release(idx);
        return NULL;
    }
    args->rows = rows, args->n = n;
    *indices = idx;
    return v;
}

static const mp_op topk_op = {.name = "topk", .nin = 1, .forward = topk_fwd, .backward = topk_backward,
                              .args_size = sizeof(topk_args), .needs = {MP_BE_ENTRY(topk)}};
static const mp_op sort_op = {.name = "sort", .nin = 1, .forward = topk_fwd, .backward = topk_backward,
                              .args_size = sizeof(topk_args), .needs = {MP_BE_ENTRY(topk)}};
MP_OP_REGISTER(topk_op);
MP_OP_REGISTER(sort_op);

/* along dim: move it last (a copy when it is not), run the op, move it back */
static mp_tensor *along(const mp_op *op, mp_tensor *x, int64_t k, int dim, bool largest, mp_tensor **indices)
{
    int kd;
    *indices = NULL;
    if (mp_dim(x, dim, &kd)) return NULL;
    int last = x->ndim;
    if (op == &sort_op) k = x->shape[kd];
    mp_tensor *xt = kd == last - 1 ? mp_retain(x) : mp_transpose(x, kd + 1, last), *idx = NULL;
    topk_args args = {.k = k, .largest = largest};
    mp_op_ctx c = {.args = &args, .extra = &idx};
    mp_tensor *v = xt ? mp_apply(op, &c, 1, &xt) : NULL;
    mp_release(xt);
    if (v && kd != last - 1) {
        mp_tensor *vb = mp_transpose(v, kd + 1, last), *ib = vb ? mp_transpose(idx, kd + 1, last) : NULL;
        mp_release(v), mp_release(idx);
        v = vb, idx = ib;
        if (!ib) mp_release(vb), v = NULL;
    }
    if (!v) { mp_release(idx); return NULL; }
    *indices = idx;
    return v;
}

mp_tensor *mp_topk(mp_tensor *x, int64_t k, int dim, bool largest, mp_tensor **indices)
{
    return along(&topk_op, x, k, dim, largest, indices);
}

mp_tensor *mp_sort(mp_tensor *x, int dim, bool descending, mp_tensor **indices)
{
    return along(&sort_op, x, 0, dim, descending, indices);
}

/* ---- multinomial: draws from the rows of a probability table ---- */

mp_tensor *mp_multinomial(mp_tensor *probs, int64_t n, bool replacement)
{
    if (!mp_is_float(probs->dtype))
        return mp_fail(MP_EINVAL, "probabilities must be a float tensor (got %s)", mp_dtype_name(probs->dtype)), NULL;
    if (probs->ndim < 1 || probs->ndim > 2)
        return mp_fail(MP_EINVAL, "probabilities must be 1-d or 2-d (got %d dims)", probs->ndim), NULL;
    int64_t classes = probs->shape[probs->ndim - 1], rows = probs->numel / classes;
    if (n < 1) return mp_fail(MP_EINVAL, "the number of draws must be positive (got %lld)", (long long)n), NULL;
    if (!replacement && n > classes)
        return mp_fail(MP_EINVAL, "cannot draw %lld of %lld categories without replacement", (long long)n,
                       (long long)classes), NULL;
    if (classes > INT32_MAX) return mp_fail(MP_EINVAL, "too many categories for i32 indices"), NULL;
    /* on the host, from the one random stream (a row's draws are few: sampling) */
    mp_tensor *p = mp_to_raw(probs, MP_F32, MP_CPU), *u = p ? mp_rand(MP_F32, MP_CPU, 1, (int64_t[]){rows * n}) : NULL;
    int64_t shape[2] = {rows, n};
    mp_tensor *out = u ? mp_empty(MP_I32, MP_CPU, probs->ndim, probs->ndim == 1 ? shape + 1 : shape) : NULL;
    double *w = out ? malloc(sizeof(double) * (size_t)classes) : NULL;
    int rc = w ? 0 : (out ? mp_fail(MP_EOOM, "out of memory") : -1);
    const float *pv = p && rc == 0 ? mp_data(p) : NULL, *uv = pv ? mp_data(u) : NULL;
    int32_t *ov = uv ? mp_data(out) : NULL;
    for (int64_t r = 0; ov && r < rows && rc == 0; r++) {
        double total = 0;
        for (int64_t j = 0; j < classes && rc == 0; j++) {
            double x = pv[r * classes + j];
            if (!(x >= 0) || isinf(x)) rc = mp_fail(MP_EINVAL, "row %lld has a probability that is negative, inf or NaN", (long long)r + 1);
            w[j] = x, total += x;
        }
        if (rc == 0 && !(total > 0)) rc = mp_fail(MP_EINVAL, "row %lld sums to 0", (long long)r + 1);
        for (int64_t s = 0; s < n && rc == 0; s++) {   /* the first category whose running sum passes u * total */
            double target = uv[r * n + s] * total, run = 0;
            int64_t pick = -1;
            for (int64_t j = 0; j < classes; j++) {
                if (w[j] <= 0) continue;
                run += w[j], pick = j;
                if (run > target) break;
            }
            if (pick < 0) {   /* every weight drawn already (a total left over from rounding) */
                rc = mp_fail(MP_EINVAL, "row %lld has fewer than %lld categories of nonzero probability",
                             (long long)r + 1, (long long)n);
                break;
            }
            ov[r * n + s] = (int32_t)pick;
            if (!replacement) total -= w[pick], w[pick] = 0;   /* drawn once at most */
            if (!replacement && s + 1 < n && !(total > 0))
                rc = mp_fail(MP_EINVAL, "row %lld has fewer than %lld categories of nonzero probability", (long long)r + 1, (long long)n);
        }
    }
    free(w);
    mp_release(p), mp_release(u);
    if (rc) { mp_release(out); return NULL; }
    if (!out || probs->dev == MP_CPU) return out;
    mp_tensor *d = mp_to_raw(out, MP_I32, probs->dev);
    mp_release(out);
    return d;
}
