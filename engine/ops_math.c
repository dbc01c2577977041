/*
 * ops_math.c: elementwise arithmetic with numpy broadcasting, unary maths and
 * reductions. Mixed dtypes promote (f16 with bf16 gives f32, any float beats
 * an integer); integer division and the transcendental functions of integers
 * give f32, as in PyTorch.
 */
#include <math.h>
#include "engine/ops.h"
#include "engine/error.h"

static int same_device(const mp_tensor *a, const mp_tensor *b)
{
    if (a->dev == b->dev) return 0;
    return mp_fail(MP_EINVAL, "tensors are on different devices (%s and %s)",
                   mp_device_name(a->dev), mp_device_name(b->dev));
}

int mp_broadcast(const mp_tensor *a, const mp_tensor *b, mp_bcast *bc)
{
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t sa = 1, sb = 1;
    bc->ndim = n;
    for (int i = n - 1; i >= 0; i--) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char b1[128], b2[128];
            return mp_fail(MP_EINVAL, "shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                           mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                           mp_shape_str(b->ndim, b->shape, b2, sizeof b2), i + 1,
                           (long long)da, (long long)db);
        }
        bc->shape[i] = da > db ? da : db;
        bc->sa[i] = da == 1 ? 0 : sa;
        bc->sb[i] = db == 1 ? 0 : sb;
        sa *= da, sb *= db;
    }
    return 0;
}

/* a new reference to t in dtype dt (t itself when it already is) */
static mp_tensor *as_dtype(mp_tensor *t, mp_dtype dt) { return mp_to(t, dt, t->dev); }

mp_tensor *mp_binary(mp_binop op, mp_tensor *a, mp_tensor *b)
{
    mp_bcast bc;
    if ((unsigned)op >= MP_NBINOPS) return mp_fail(MP_EINVAL, "bad binary op"), NULL;
    if (same_device(a, b) || mp_broadcast(a, b, &bc)) return NULL;
    mp_dtype dt = mp_promote(a->dtype, b->dtype);
    if (op == MP_DIV && !mp_is_float(dt)) dt = MP_F32;
    mp_tensor *x = as_dtype(a, dt), *y = x ? as_dtype(b, dt) : NULL, *o = NULL;
    if (y) o = mp_empty(dt, a->dev, bc.ndim, bc.shape);
    if (o) mp_be(o)->binary(op, dt, mp_data(o), mp_data(x), mp_data(y), &bc);
    mp_release(x);
    mp_release(y);
    return o;
}

static int is_integral(double s) { return isfinite(s) && s == floor(s) && fabs(s) < 2147483648.0; }

/* dtype of a unary op's result: maths that leaves the integers gives f32 */
static mp_dtype unary_dtype(mp_unop op, mp_dtype dt, double p)
{
    if (mp_is_float(dt)) return dt;
    switch (op) {
    case MP_NEG: case MP_ABS: case MP_RELU: return dt;
    case MP_MULS: case MP_ADDS: case MP_RSUBS: return is_integral(p) ? dt : MP_F32;
    default: return MP_F32;
    }
}

mp_tensor *mp_unary(mp_unop op, mp_tensor *a, double p)
{
    if ((unsigned)op >= MP_NUNOPS) return mp_fail(MP_EINVAL, "bad unary op"), NULL;
    mp_dtype dt = unary_dtype(op, a->dtype, p);
    mp_tensor *x = as_dtype(a, dt), *o = x ? mp_empty(dt, a->dev, a->ndim, a->shape) : NULL;
    if (o) mp_be(o)->unary(op, dt, mp_data(o), mp_data(x), a->numel, p);
    mp_release(x);
    return o;
}

mp_tensor *mp_binary_scalar(mp_binop op, mp_tensor *a, double s, int scalar_first)
{
    switch (op) {
    case MP_ADD: return mp_unary(MP_ADDS, a, s);
    case MP_MUL: return mp_unary(MP_MULS, a, s);
    case MP_SUB: return scalar_first ? mp_unary(MP_RSUBS, a, s) : mp_unary(MP_ADDS, a, -s);
    case MP_DIV: return mp_unary(scalar_first ? MP_RDIVS : MP_DIVS, a, s);
    default: return mp_fail(MP_EINVAL, "bad binary op"), NULL;
    }
}

mp_tensor *mp_reduce(mp_redop op, mp_tensor *a, int dim, int keepdim)
{
    int k = -1;
    if ((unsigned)op >= MP_NREDOPS) return mp_fail(MP_EINVAL, "bad reduction"), NULL;
    if (dim != 0 && mp_dim(a, dim, &k)) return NULL;
    if (dim == 0 && op == MP_ARGMAX && a->ndim > 1)
        return mp_fail(MP_EINVAL, "argmax needs a dim for a %d-d tensor", a->ndim), NULL;
    int64_t outer = 1, n = a->numel, inner = 1, shape[MP_MAXDIM];
    int nd = 0;
    if (k >= 0) {
        n = a->shape[k];
        for (int i = 0; i < a->ndim; i++) {
            if (i < k) outer *= a->shape[i];
            if (i > k) inner *= a->shape[i];
            if (i != k || keepdim) shape[nd++] = i == k ? 1 : a->shape[i];
        }
    } else if (keepdim) {
        for (int i = 0; i < a->ndim; i++) shape[nd++] = 1;
    }
    /* integer sums accumulate into i32; integer means are f32 */
    mp_dtype in = a->dtype;
    if (op == MP_MEAN && !mp_is_float(in)) in = MP_F32;
    if (op == MP_SUM && in == MP_U8) in = MP_I32;
    mp_dtype out = op == MP_ARGMAX ? MP_I32 : in;
    mp_tensor *x = as_dtype(a, in), *o = x ? mp_empty(out, a->dev, nd, shape) : NULL;
    if (o) mp_be(o)->reduce(op, in, mp_data(o), mp_data(x), outer, n, inner);
    mp_release(x);
    return o;
}
