/*
 * ops_matmul.c: matrix products. 2-D, batched 3-D, a batch times one matrix,
 * and 1-D operands as numpy treats them (a vector is a row on the left and a
 * column on the right, and that dim is dropped from the result).
 */
#include "engine/ops.h"
#include "engine/error.h"

mp_tensor *mp_matmul(mp_tensor *a, mp_tensor *b)
{
    char b1[128], b2[128];
    if (a->dev != b->dev)
        return mp_fail(MP_EINVAL, "tensors are on different devices (%s and %s)",
                       mp_device_name(a->dev), mp_device_name(b->dev)), NULL;
    if (a->dtype != b->dtype)
        return mp_fail(MP_EINVAL, "dtypes %s and %s differ (cast one with :to())",
                       mp_dtype_name(a->dtype), mp_dtype_name(b->dtype)), NULL;
    if (!mp_is_float(a->dtype))
        return mp_fail(MP_EINVAL, "matmul needs a float dtype (got %s)", mp_dtype_name(a->dtype)), NULL;
    if (a->ndim < 1 || a->ndim > 3 || b->ndim < 1 || b->ndim > 3)
        return mp_fail(MP_EINVAL, "matmul takes 1-, 2- or 3-d tensors (got %d-d and %d-d)",
                       a->ndim, b->ndim), NULL;
    if (a->ndim == 3 && b->ndim == 3 && a->shape[0] != b->shape[0])
        return mp_fail(MP_EINVAL, "batch sizes of %s and %s differ (%lld vs %lld)",
                       mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                       mp_shape_str(b->ndim, b->shape, b2, sizeof b2),
                       (long long)a->shape[0], (long long)b->shape[0]), NULL;

    int64_t batch = 1, m, k, k2, n, sa, sb;
    m = a->ndim == 1 ? 1 : a->shape[a->ndim - 2];
    k = a->shape[a->ndim - 1];
    k2 = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
    n = b->ndim == 1 ? 1 : b->shape[b->ndim - 1];
    if (k != k2)
        return mp_fail(MP_EINVAL, "shapes %s and %s do not match (%lld vs %lld)",
                       mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                       mp_shape_str(b->ndim, b->shape, b2, sizeof b2), (long long)k, (long long)k2), NULL;
    if (a->ndim == 3) batch = a->shape[0];
    if (b->ndim == 3) batch = b->shape[0];
    sa = a->ndim == 3 ? m * k : 0;
    sb = b->ndim == 3 ? k * n : 0;
    if (a->ndim == 3 && b->ndim < 3)   /* one big GEMM: {batch*m, k} @ {k, n} */
        m *= batch, batch = 1;

    int64_t shape[3];
    int nd = 0;
    if (a->ndim == 3 || b->ndim == 3) shape[nd++] = a->ndim == 3 ? a->shape[0] : b->shape[0];
    if (a->ndim > 1) shape[nd++] = a->ndim == 3 && b->ndim < 3 ? m / a->shape[0] : m;
    if (b->ndim > 1) shape[nd++] = n;
    mp_tensor *o = mp_empty(a->dtype, a->dev, nd, shape);
    if (o && mp_be(o)->gemm(a->dtype, 0, 0, batch, m, n, k, 1.0f, mp_data(a), sa, mp_data(b), sb,
                            0.0f, mp_data(o), m * n)) {
        mp_release(o);
        return mp_fail(MP_EOOM, "out of memory: no working memory for a %lldx%lldx%lld product",
                       (long long)m, (long long)n, (long long)k), NULL;
    }
    return o;
}
