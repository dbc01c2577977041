/*
 * ops_stats.c: var, std, norm, any and all, composed of the reductions and
 * elementwise ops of ops_math.c (their gradients come from those parts), but
 * for the 2-norm, which has its own backward.
 *
 * Precision: f16 and bf16 inputs are widened to f32 first (a recorded cast),
 * the statistic is computed there and rounded once to the input's dtype at
 * the end, so a variance of f16 data never squares or sums in f16. f32 and
 * f64 compute in their own dtype (the sums inside accumulate in double on the
 * CPU). Integer inputs are refused, as in PyTorch.
 *
 * The 2-norm's gradient is x / ||x|| * g, and 0 where the norm is 0 (PyTorch's
 * subgradient), not the 0/0 = NaN that sqrt(sum(x^2)) composed would give.
 * p = 1 and p = inf compose abs with sum and max: abs's slope at 0 is 0, and
 * max's gradient goes to the first of equal maxima (PyTorch spreads it over
 * all of them). Other p > 0 compose pow; their gradient at an all-zero input
 * is NaN.
 */
#include <math.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/graph.h"
#include "engine/op.h"

/* x as the statistics compute it: f32 for f16/bf16 (recorded), else x itself */
static mp_tensor *widened(mp_tensor *x)
{
    if (x->dtype == MP_F16 || x->dtype == MP_BF16) return mp_to(x, MP_F32, x->dev);
    return mp_retain(x);
}

/* r (a new reference) rounded once to dt, recorded; r is released */
static mp_tensor *narrowed(mp_tensor *r, mp_dtype dt)
{
    if (!r || r->dtype == dt) return r;
    mp_tensor *o = mp_to(r, dt, r->dev);
    mp_release(r);
    return o;
}

static int need_float(const mp_tensor *x)
{
    if (mp_is_float(x->dtype)) return 0;
    return mp_fail(MP_EINVAL, "x must be a float tensor (got %s)", mp_dtype_name(x->dtype));
}

/* the 0-based dim k (-1 for all when dim is 0) and the count it reduces */
static int reduced(const mp_tensor *x, int dim, int *k, int64_t *count)
{
    *k = -1;
    if (dim != 0 && mp_dim(x, dim, k)) return -1;
    *count = *k >= 0 ? x->shape[*k] : x->numel;
    return 0;
}

/* the variance in the widened dtype */
static mp_tensor *var_wide(mp_tensor *x, int dim, double correction, bool keepdim)
{
    int k;
    int64_t count;
    if (need_float(x) || reduced(x, dim, &k, &count)) return NULL;
    if (!(correction >= 0) || isinf(correction))
        return mp_fail(MP_EINVAL, "correction must be a finite number >= 0 (got %g)", correction), NULL;
    double denom = (double)count - correction;
    mp_tensor *w = widened(x), *m = w ? mp_reduce(MP_MEAN, w, dim, 1) : NULL;
    mp_tensor *d = m ? mp_binary(MP_SUB, w, m) : NULL, *sq = d ? mp_binary(MP_MUL, d, d) : NULL;
    mp_tensor *s = sq ? mp_reduce(MP_SUM, sq, dim, keepdim) : NULL;
    /* count <= correction: PyTorch divides by max(0, count - correction), giving inf or NaN */
    mp_tensor *v = s ? mp_unary(MP_DIVS, s, denom > 0 ? denom : 0) : NULL;
    mp_release(w), mp_release(m), mp_release(d), mp_release(sq), mp_release(s);
    return v;
}

mp_tensor *mp_var(mp_tensor *x, int dim, double correction, bool keepdim)
{
    return narrowed(var_wide(x, dim, correction, keepdim), x->dtype);
}

mp_tensor *mp_std(mp_tensor *x, int dim, double correction, bool keepdim)
{
    mp_tensor *v = var_wide(x, dim, correction, keepdim), *s = v ? mp_unary(MP_SQRT, v, 0) : NULL;
    mp_release(v);
    return narrowed(s, x->dtype);
}

/* ---- the 2-norm, with PyTorch's gradient at 0 ---- */

typedef struct {
    int dim;           /* as given; 0: all */
    bool keepdim;
    int k;             /* set by the forward: the 0-based dim, or -1 */
} norm_args;

/* g * x / y, with 0 where y == 0; g and y in the reduced shape (kept dims: broadcast) */
static int norm2_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = n->saved[0], *y = n->saved[1];
    int k = MP_NODE_ARGS(n, norm_args)->k;
    int64_t keep[MP_MAXDIM];
    for (int d = 0; d < x->ndim; d++) keep[d] = k < 0 || d == k ? 1 : x->shape[d];
    mp_tensor *gk = mp_reshape(g, x->ndim, keep), *yk = gk ? mp_reshape(y, x->ndim, keep) : NULL;
    mp_tensor *zero = yk ? mp_full(y->dtype, y->dev, 0, NULL, 0) : NULL;
    mp_tensor *at0 = zero ? mp_binary(MP_EQ, yk, zero) : NULL, *q = at0 ? mp_binary(MP_DIV, gk, yk) : NULL;
    mp_tensor *sc = q ? mp_masked_fill(q, at0, 0) : NULL;
    gin[0] = sc ? mp_binary(MP_MUL, x, sc) : NULL;
    mp_release(gk), mp_release(yk), mp_release(zero), mp_release(at0), mp_release(q), mp_release(sc);
    return gin[0] ? 0 : -1;
}

static mp_tensor *norm2_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0];
    norm_args *a = MP_OP_ARGS(c, norm_args);
    int64_t count;
    if (reduced(x, a->dim, &a->k, &count)) return NULL;
    bool was = mp_set_grad_enabled(false);   /* the parts are not the graph: this op's node is */
    mp_tensor *sq = mp_binary(MP_MUL, x, x), *s = sq ? mp_reduce(MP_SUM, sq, a->dim, a->keepdim) : NULL;
    mp_tensor *o = s ? mp_unary(MP_SQRT, s, 0) : NULL;
    mp_set_grad_enabled(was);
    mp_release(sq), mp_release(s);
    if (o && (mp_keep(c, 0, x) || mp_keep_output(c, 1, o))) mp_release(o), o = NULL;
    return o;
}

static const mp_op norm2_op = {.name = "norm", .ac = MP_AC_F32, .nin = 1, .forward = norm2_fwd,
                               .backward = norm2_backward, .args_size = sizeof(norm_args),
                               .double_backward = true};
MP_OP_REGISTER(norm2_op);

static mp_tensor *norm_wide(mp_tensor *w, double p, int dim, bool keepdim)
{
    if (p == 2) {
        norm_args args = {.dim = dim, .keepdim = keepdim};
        mp_op_ctx c = {.args = &args};
        return mp_apply(&norm2_op, &c, 1, &w);
    }
    mp_tensor *a = mp_unary(MP_ABS, w, 0), *r = NULL;
    if (!a) return NULL;
    if (p == 1) r = mp_reduce(MP_SUM, a, dim, keepdim);
    else if (isinf(p)) r = mp_reduce(p > 0 ? MP_MAX : MP_MIN, a, dim, keepdim);
    else {
        mp_tensor *ap = mp_unary(MP_POW, a, p), *s = ap ? mp_reduce(MP_SUM, ap, dim, keepdim) : NULL;
        r = s ? mp_unary(MP_POW, s, 1 / p) : NULL;
        mp_release(ap), mp_release(s);
    }
    mp_release(a);
    return r;
}

mp_tensor *mp_norm(mp_tensor *x, double p, int dim, bool keepdim)
{
    int k;
    int64_t count;
    if (need_float(x) || reduced(x, dim, &k, &count)) return NULL;
    if (!(p > 0 || p == -INFINITY))
        return mp_fail(MP_EINVAL, "p must be > 0, inf or -inf (got %g)", p), NULL;
    if (isinf(p) && count == 0)
        return mp_fail(MP_EINVAL, "the %s-norm of an empty %s is not defined", p > 0 ? "inf" : "-inf",
                       k >= 0 ? "dim" : "tensor"), NULL;
    mp_tensor *w = widened(x), *r = w ? norm_wide(w, p, dim, keepdim) : NULL;
    mp_release(w);
    return narrowed(r, x->dtype);
}

/* ---- any, all: u8, not differentiable ---- */

static mp_tensor *any_all(mp_tensor *x, int dim, bool keepdim, bool all)
{
    int k;
    int64_t count;
    if (reduced(x, dim, &k, &count)) return NULL;
    if (count == 0) {   /* nothing to look at: any is false and all is true, as in PyTorch */
        int64_t shape[MP_MAXDIM];
        int nd = 0;
        for (int i = 0; i < x->ndim; i++)
            if (keepdim || (k >= 0 && i != k)) shape[nd++] = k < 0 || i == k ? 1 : x->shape[i];
        return mp_full(MP_U8, x->dev, nd, shape, all);
    }
    mp_tensor *zero = mp_full(x->dtype, x->dev, 0, NULL, 0);
    mp_tensor *nz = zero ? mp_binary(MP_NE, x, zero) : NULL;   /* NaN counts as true */
    mp_tensor *r = nz ? mp_reduce(all ? MP_MIN : MP_MAX, nz, dim, keepdim) : NULL;
    mp_release(zero), mp_release(nz);
    return r;
}

mp_tensor *mp_any(mp_tensor *x, int dim, bool keepdim) { return any_all(x, dim, keepdim, false); }
mp_tensor *mp_all(mp_tensor *x, int dim, bool keepdim) { return any_all(x, dim, keepdim, true); }
