/*
 * tensor.c: the names of dtypes, tensor headers and their refcounted storage,
 * shapes. Which backend serves a device is engine/device.c;
 * the bytes a storage holds are counted by engine/memory.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include "engine/tensor.h"
#include "engine/memory.h"
#include "engine/error.h"

/* tables indexed by an enum are sized by their entries and checked against
 * the enum's count: a new dtype or device without its name does not compile */
static const char *dtype_names[] = {"f32", "f16", "bf16", "i32", "u8", "f64", "e4m3", "e5m2"};
_Static_assert(sizeof dtype_names / sizeof *dtype_names == MP_NDTYPES, "a name for every dtype");
static const struct { const char *alias; mp_dtype t; } dtype_aliases[] = {
    {"float32", MP_F32}, {"float", MP_F32}, {"float16", MP_F16}, {"half", MP_F16},
    {"bfloat16", MP_BF16}, {"int32", MP_I32}, {"int", MP_I32}, {"uint8", MP_U8},
    {"byte", MP_U8}, {"float64", MP_F64}, {"double", MP_F64},
    {"float8_e4m3fn", MP_E4M3}, {"float8_e5m2", MP_E5M2},   /* PyTorch's and ml_dtypes' names */
};

const char *mp_dtype_name(mp_dtype t) { return (unsigned)t < MP_NDTYPES ? dtype_names[t] : "?"; }
bool mp_is_float(mp_dtype t)
{
    switch (t) {   /* no default: a new dtype must say */
    case MP_F32: case MP_F16: case MP_BF16: case MP_F64: case MP_E4M3: case MP_E5M2: return true;
    case MP_I32: case MP_U8: break;
    }
    return false;
}

bool mp_is_storage_only(mp_dtype t) { return t == MP_E4M3 || t == MP_E5M2; }

/* the whole numbers an integer dtype holds */
static void int_range(mp_dtype dt, double *lo, double *hi)
{
    *lo = dt == MP_U8 ? 0 : -2147483648.0;
    *hi = dt == MP_U8 ? 255 : 2147483647.0;
}

bool mp_value_fits(mp_dtype dt, double v)
{
    if (mp_is_float(dt)) return true;
    double lo, hi;
    int_range(dt, &lo, &hi);
    return v >= lo && v <= hi && v == floor(v);   /* NaN fails the range */
}

int mp_check_value(mp_dtype dt, double v)
{
    if (mp_value_fits(dt, v)) return 0;
    double lo, hi;
    int_range(dt, &lo, &hi);
    return mp_fail(MP_EINVAL, "value %.17g does not fit a %s tensor (whole numbers in %.0f..%.0f)", v,
                   mp_dtype_name(dt), lo, hi);
}

int mp_dtype_parse(const char *name, mp_dtype *out)
{
    for (int i = 0; i < MP_NDTYPES; i++)
        if (strcmp(name, dtype_names[i]) == 0) return *out = i, 0;
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof *dtype_aliases; i++)
        if (strcmp(name, dtype_aliases[i].alias) == 0) return *out = dtype_aliases[i].t, 0;
    return mp_fail(MP_EINVAL, "unknown dtype '%s' (expected f32, f16, bf16, f64, i32, u8, e4m3 or e5m2)", name);
}

mp_tensor *mp_checked(mp_tensor *t)
{
    if (t && t->dev != MP_CPU && mp_device_error(t->dev)) {
        mp_release(t);
        return NULL;
    }
    return t;
}

/* ---- storage ---- */

static mp_storage *storage_new(mp_device dev, size_t nbytes)
{
    const mp_backend *be = mp_backend_of(dev);
    if (!be) return mp_device_check(dev), NULL;
    if (mp_memory_admit(dev, nbytes)) return NULL;
    mp_storage *st = malloc(sizeof *st);
    void *data = st ? be->alloc(be->ctx, nbytes ? nbytes : 1) : NULL;
    if (!data) {
        free(st);
        mp_fail(MP_EOOM, "out of memory: cannot allocate %zu bytes on %s", nbytes, mp_device_name(dev));
        return NULL;
    }
    *st = (mp_storage){.refs = 1, .dev = dev, .nbytes = nbytes, .data = data};
    mp_memory_allocated(dev, nbytes);
    return st;
}

void mp_storage_release(mp_storage *st)
{
    if (--st->refs > 0) return;
    mp_release(st->lowp);
    mp_release(st->wide);
    mp_backend_of(st->dev)->free(mp_backend_of(st->dev)->ctx, st->data, st->nbytes);
    mp_memory_freed(st->dev, st->nbytes);
    free(st);
}

/* ---- shapes ---- */

int mp_check_shape(int ndim, const int64_t *shape, int64_t *numel)
{
    if (ndim < 0 || ndim > MP_MAXDIM)
        return mp_fail(MP_EINVAL, "a tensor has at most %d dims (got %d)", MP_MAXDIM, ndim);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return mp_fail(MP_EINVAL, "size of dim %d must be positive (got %lld)", i + 1,
                           (long long)shape[i]);
        if (n > INT64_MAX / 16 / shape[i])
            return mp_fail(MP_EOOM, "out of memory: shape too large to allocate");
        n *= shape[i];
    }
    if (numel) *numel = n;
    return 0;
}

int mp_same_shape(const mp_tensor *a, const mp_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *mp_shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t k = (size_t)snprintf(buf, len, "{");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, "}");
    return buf;
}

/* ---- tensors ---- */

static mp_tensor *header(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape, int64_t numel)
{
    mp_tensor *t = calloc(1, sizeof *t);
    if (!t) return mp_fail(MP_EOOM, "out of memory"), NULL;
    t->refs = 1;
    t->dtype = dt;
    t->dev = dev;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * ndim);
    t->numel = numel;
    return t;
}

mp_tensor *mp_empty(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    int64_t n;
    if ((unsigned)dt >= MP_NDTYPES) return mp_fail(MP_EINVAL, "bad dtype"), NULL;
    if (mp_check_shape(ndim, shape, &n) || mp_device_check(dev)) return NULL;
    /* a backend may hold no tensors of a dtype at all (CUDA and f64): asked for
     * "tensor", so that no kernel of its is ever handed one (backend.h: supports) */
    const mp_backend *be = mp_backend_of(dev);
    if (be && be->supports && !be->supports(be->ctx, "tensor", dt))
        return mp_fail(MP_EINVAL, "%s tensors are not available on %s (the backend declines them)", mp_dtype_name(dt),
                       mp_device_name(dev)), NULL;
    mp_storage *st = storage_new(dev, (size_t)n * mp_dtype_size(dt));
    if (!st) return NULL;
    mp_tensor *t = header(dt, dev, ndim, shape, n);
    if (!t) return mp_storage_release(st), NULL;
    t->st = st;
    return t;
}

mp_tensor *mp_view(mp_tensor *src, int ndim, const int64_t *shape, int64_t offset)
{
    int64_t n;
    if (mp_check_shape(ndim, shape, &n)) return NULL;
    if (offset < 0 || (size_t)(offset + n) * mp_dtype_size(src->dtype) > src->st->nbytes)
        return mp_fail(MP_EINVAL, "view out of bounds of its storage"), NULL;
    mp_tensor *t = header(src->dtype, src->dev, ndim, shape, n);
    if (!t) return NULL;
    t->offset = offset;
    t->st = src->st;
    t->st->refs++;
    t->quant = src->quant;   /* a view of quantized values is quantized alike */
    if (t->quant.scales) mp_retain(t->quant.scales);
    return t;
}

mp_tensor *mp_view_dtype(mp_tensor *src, mp_dtype dt)
{
    size_t a = mp_dtype_size(src->dtype), b = (unsigned)dt < MP_NDTYPES ? mp_dtype_size(dt) : 0;
    if (a != b)
        return mp_fail(MP_EINVAL, "%s elements are %zu bytes and %s ones %zu: a view as another dtype keeps the "
                       "element size (u8, e4m3, e5m2; f16, bf16; f32, i32)", mp_dtype_name(src->dtype), a,
                       mp_dtype_name(dt), b), NULL;
    if (src->quant.kind != MP_QUANT_NONE)
        return mp_fail(MP_EINVAL, "a quantized tensor's values are not its bits alone (dequantize it first)"), NULL;
    mp_tensor *t = mp_view(src, src->ndim, src->shape, src->offset);
    if (t) t->dtype = dt;   /* same size: the same bytes, bounds and offset */
    return t;
}

mp_tensor *mp_retain(mp_tensor *t)
{
    t->refs++;
    return t;
}

void mp_release(mp_tensor *t)
{
    if (!t || --t->refs > 0) return;
    mp_release(t->grad);
    if (t->grad_fn) {
        mp_node_head *node = (mp_node_head *)t->grad_fn;   /* a node begins with its head */
        node->release(node);
    }
    if (t->hooks) t->hooks->release(t->hooks);
    mp_release(t->quant.scales);
    mp_storage_release(t->st);
    free(t);
}
