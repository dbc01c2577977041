/*
 * ops_select.c: ops made of other ops for selecting and masking: select (one
 * index along a dim, the dim dropped: t[i]), tril/triu (a triangle of the last
 * two dims) and masked_fill. Each part records itself, so these have no
 * backward of their own (engine/op.h), and run on every backend that runs the
 * parts.
 */
#include <math.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

/* ---- select: narrow to one index, then drop the dim ---- */

static mp_tensor *select_fwd(mp_ctx *c)
{
    mp_tensor *t = c->in[0];
    int d = (int)c->i[0], k;
    int64_t i = c->i[1];
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

static const mp_op select_op = {.name = "select", .nin = 1, .forward = select_fwd};
MP_OP_REGISTER(select_op)

mp_tensor *mp_select(mp_tensor *t, int dim, int64_t index)
{
    mp_ctx c = {.i = {dim, index}};
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

static mp_tensor *tri_fwd(mp_ctx *c)
{
    mp_tensor *t = c->in[0];
    int64_t k = c->i[0];
    if (k < INT32_MIN || k > INT32_MAX) return mp_fail(MP_EINVAL, "diagonal %lld out of range", (long long)k), NULL;
    if (t->ndim < 2)
        return mp_fail(MP_EINVAL, "input must have at least 2 dims (got %d)", t->ndim), NULL;
    mp_tensor *m = triangle(t, k, c->op->kernel), *zero = m ? mp_full(t->dtype, t->dev, 0, NULL, 0) : NULL;
    mp_tensor *r = zero ? mp_where(m, t, zero) : NULL;
    mp_release(m), mp_release(zero);
    return r;
}

/* kernel: 1 lower, 0 upper */
static const mp_op tril_op = {.name = "tril", .nin = 1, .forward = tri_fwd, .kernel = 1};
static const mp_op triu_op = {.name = "triu", .nin = 1, .forward = tri_fwd, .kernel = 0};
MP_OP_REGISTER(tril_op)
MP_OP_REGISTER(triu_op)

mp_tensor *mp_tril(mp_tensor *t, int64_t k)
{
    mp_ctx c = {.i = {k}};
    return mp_apply(&tril_op, &c, 1, &t);
}

mp_tensor *mp_triu(mp_tensor *t, int64_t k)
{
    mp_ctx c = {.i = {k}};
    return mp_apply(&triu_op, &c, 1, &t);
}

/* ---- masked_fill: value where mask is nonzero, t elsewhere ---- */

static mp_tensor *masked_fill_fwd(mp_ctx *c)
{
    mp_tensor *t = c->in[0], *mask = c->in[1];
    double v = c->f[0];
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
    if (!mp_is_float(t->dtype) && (!isfinite(v) || v != floor(v)))
        return mp_fail(MP_EINVAL, "value %g does not fit a %s tensor", v, mp_dtype_name(t->dtype)), NULL;
    mp_tensor *fill = mp_full(t->dtype, t->dev, 0, NULL, v), *r = fill ? mp_where(mask, fill, t) : NULL;
    mp_release(fill);
    return r;
}

/* the mask is an input without a gradient */
static const mp_op masked_fill_op = {.name = "masked_fill", .nin = 2, .forward = masked_fill_fwd};
MP_OP_REGISTER(masked_fill_op)

mp_tensor *mp_masked_fill(mp_tensor *t, mp_tensor *mask, double value)
{
    mp_ctx c = {.f = {value}};
    mp_tensor *in[2] = {t, mask};
    return mp_apply(&masked_fill_op, &c, 2, in);
}

/* ---- randint: uniform integers in [lo, hi) ---- */

mp_tensor *mp_randint(int64_t lo, int64_t hi, mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    if (hi <= lo) return mp_fail(MP_EINVAL, "high (%lld) must be greater than low (%lld)", (long long)hi, (long long)lo), NULL;
    /* from a 24-bit uniform in [0, 1): exact and unbiased while the range fits 2^24 */
    if (hi - lo > (int64_t)1 << 24)
        return mp_fail(MP_EINVAL, "high - low must be at most 2^24 (got %lld)", (long long)(hi - lo)), NULL;
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
