/*
 * ops_create.c: making tensors (constants, ranges, random, from host values),
 * reading values back, and moving between dtypes and devices.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/capture_guard.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

mp_tensor *mp_full(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape, double value)
{
    if (mp_check_value(dt, value)) return NULL;
    mp_tensor *t = mp_empty(dt, dev, ndim, shape);
    if (t) MP_K(t, fill, mp_data(t), dt, t->numel, value);
    return mp_checked(t);
}

mp_tensor *mp_arange(int64_t n, mp_dtype dt, mp_device dev)
{
    if (n <= 0) return mp_fail(MP_EINVAL, "n must be positive (got %lld)", (long long)n), NULL;
    if (dt == MP_U8 && n > 256) return mp_fail(MP_EINVAL, "n = %lld does not fit in u8", (long long)n), NULL;
    mp_tensor *t = mp_empty(dt, dev, 1, &n);
    if (t) MP_K(t, arange, mp_data(t), dt, n);
    return mp_checked(t);
}

/* One global counter-based stream: a draw of n numbers takes the n counters
 * after `offset`, so (seed, offset) is the whole state of the generator.
 * Inside a capture the device draws are counted apart (graph_used), relative
 * to the capture's start, and the stream does not move: nothing of the capture
 * runs, and each replay draws at the stream's position when it is queued and
 * moves it on by graph_used (capture.c), as PyTorch's CUDA generator keeps an
 * intra-graph offset during capture and a whole-graph increment per replay. */
static uint64_t rng_seed = 0x853c49e6748fea9bULL, rng_offset;
static bool graph_open;
static uint64_t graph_used;

int mp_manual_seed(uint64_t seed)
{
    if (mp_capture_refuse("set the random seed",
                          "the replays would not set it again (seed before the capture, or between replays)"))
        return -1;
    rng_seed = seed, rng_offset = 0;
    return 0;
}

void mp_rng_get(uint64_t *seed, uint64_t *offset) { *seed = rng_seed, *offset = rng_offset; }
void mp_rng_set(uint64_t seed, uint64_t offset) { rng_seed = seed, rng_offset = offset; }

int mp_rng_restore(uint64_t seed, uint64_t offset)
{
    if (mp_capture_refuse("set the random generator's state",
                          "the replays would not set it again (set it before the capture, or between replays)"))
        return -1;
    mp_rng_set(seed, offset);
    return 0;
}

bool mp_rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset)
{
    *seed = rng_seed;
    if (graph_open) return *offset = graph_used, graph_used += n, true;
    *offset = rng_offset, rng_offset += n;
    return false;
}

void mp_rng_capture_begin(void) { graph_open = true, graph_used = 0; }

uint64_t mp_rng_capture_end(void)
{
    graph_open = false;
    return graph_used;
}

static mp_tensor *random_tensor(int normal, mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    if (!mp_is_float(dt) || mp_is_storage_only(dt))
        return mp_fail(MP_EINVAL, "random values need a float dtype that computes (got %s; draw in f32 and cast)",
                       mp_dtype_name(dt)), NULL;
    /* on the device a capture records the draw, and each replay draws anew (mp_rng_reserve) */
    if (dev == MP_CPU && mp_capture_refuse("draw random numbers on the cpu", "it would run once, now, and no replay "
                                           "would repeat it (draw them on the cuda device, or before the capture)"))
        return NULL;
    mp_tensor *t = mp_empty(dt, dev, ndim, shape);
    if (!t) return NULL;
    const mp_backend *be = mp_be(t);
    uint64_t seed, offset;
    mp_rng_reserve((uint64_t)t->numel, &seed, &offset);
    (normal ? be->rand_normal : be->rand_uniform)(be->ctx, mp_data(t), dt, t->numel, seed, offset);
    return mp_checked(t);
}

mp_tensor *mp_rand(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    return random_tensor(0, dt, dev, ndim, shape);
}

mp_tensor *mp_randn(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    return random_tensor(1, dt, dev, ndim, shape);
}

mp_tensor *mp_from_f64(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape, const double *v)
{
    int64_t n;
    if (mp_check_shape(ndim, shape, &n)) return NULL;
    for (int64_t i = 0; i < n; i++)
        if (!mp_value_fits(dt, v[i]))
            return mp_fail(MP_EINVAL, "element %lld is %.17g, which does not fit a %s tensor (whole numbers only, in range)",
                           (long long)i + 1, v[i], mp_dtype_name(dt)), NULL;
    /* convert on the host: f64 exactly, other floats through f32, integers exactly (checked above) */
    mp_tensor *host = mp_empty(dt, MP_CPU, ndim, shape);
    if (!host) return NULL;
    void *p = mp_data(host);
    for (int64_t i = 0; i < n; i++) {
        double x = v[i];
        switch (dt) {
        case MP_F32: ((float *)p)[i] = (float)x; break;
        case MP_F64: ((double *)p)[i] = x; break;
        case MP_I32: ((int32_t *)p)[i] = (int32_t)x; break;
        case MP_U8: ((uint8_t *)p)[i] = (uint8_t)x; break;
        case MP_F16: case MP_BF16: case MP_E4M3: case MP_E5M2:   /* FP8 as :to() rounds: not saturating */
            mp_cpu_backend.cast(mp_cpu_backend.ctx, (char *)p + mp_dtype_size(dt) * i, dt, &x, MP_F64, 1, 0);
            break;
        }
    }
    if (dev == MP_CPU) return host;
    mp_tensor *t = mp_to_raw(host, dt, dev);
    mp_release(host);
    return t;
}

int mp_read_f64(const mp_tensor *t, int64_t start, int64_t count, double *out)
{
    if (start < 0 || count < 0 || start + count > t->numel)
        return mp_fail(MP_EINVAL, "read of elements [%lld, %lld) outside %lld",
                       (long long)start, (long long)(start + count), (long long)t->numel);
    size_t es = mp_dtype_size(t->dtype);
    enum { CHUNK = 4096 };
    unsigned char raw[CHUNK * 8];   /* the widest dtype: f64 */
    float f[CHUNK];
    for (int64_t done = 0; done < count; done += CHUNK) {
        int64_t m = count - done < CHUNK ? count - done : CHUNK;
        const char *src = (const char *)mp_data(t) + (size_t)(start + done) * es;
        if (mp_host_read(t->dev, raw, src, (size_t)m * es)) return -1;
        if (t->dtype == MP_F16 || t->dtype == MP_BF16 || t->dtype == MP_E4M3 || t->dtype == MP_E5M2)
            mp_cpu_backend.cast(mp_cpu_backend.ctx, f, MP_F32, raw, t->dtype, m, 0);
        for (int64_t i = 0; i < m; i++) {
            switch (t->dtype) {
            case MP_F32: out[done + i] = ((float *)raw)[i]; break;
            case MP_F64: out[done + i] = ((double *)raw)[i]; break;
            case MP_I32: out[done + i] = ((int32_t *)raw)[i]; break;
            case MP_U8: out[done + i] = raw[i]; break;
            case MP_F16: case MP_BF16: case MP_E4M3: case MP_E5M2: out[done + i] = f[i]; break;
            }
        }
    }
    return 0;
}

mp_dtype mp_promote(mp_dtype a, mp_dtype b)
{
    if (a == b) return a;
    if (a == MP_F64 && mp_is_float(b)) return a;           /* f64 with any float: f64, as PyTorch */
    if (b == MP_F64 && mp_is_float(a)) return b;
    if (mp_is_float(a) && mp_is_float(b)) return MP_F32;   /* f16+bf16, or either with f32 */
    if (mp_is_float(a)) return a;
    if (mp_is_float(b)) return b;
    return MP_I32;                                          /* i32 with u8 */
}

/* saturate: an FP8 result's overflow rule (kernels/fp8.h); other dtypes ignore it */
static mp_tensor *to_raw(mp_tensor *t, mp_dtype dt, mp_device dev, int saturate)
{
    if (t->dtype == dt && t->dev == dev) return mp_retain(t);
    if (mp_device_check(dev)) return NULL;
    if (t->dev == dev) {
        mp_tensor *o = mp_empty(dt, dev, t->ndim, t->shape);
        if (o) MP_K(o, cast, mp_data(o), dt, mp_data(t), t->dtype, t->numel, saturate);
        return mp_checked(o);
    }
    /* across devices: move the bytes as they are, then cast on the destination */
    if (mp_capture_refuse(dev != MP_CPU ? "copy host memory to the device" : "copy device memory to the host",
                          dev != MP_CPU ? "a replay would copy whatever the host buffer then holds (fill the graph's "
                                          "input tensors with copy_ before each replay)"
                                        : "it waits for the device, and a replay would not repeat it"))
        return NULL;
    mp_tensor *o = mp_empty(t->dtype, dev, t->ndim, t->shape);
    if (!o) return NULL;
    if (dev != MP_CPU) MP_K(o, from_host, mp_data(o), mp_data(t), mp_nbytes(t));
    else if (mp_host_read(t->dev, mp_data(o), mp_data(t), mp_nbytes(t))) return mp_release(o), NULL;
    if (dt == t->dtype) return mp_checked(o);
    mp_tensor *c = to_raw(o, dt, dev, saturate);
    mp_release(o);
    return c;
}

mp_tensor *mp_to_raw(mp_tensor *t, mp_dtype dt, mp_device dev) { return to_raw(t, dt, dev, 0); }

static const mp_op to_op;

/* the gradient of a cast or a copy: back to the input's dtype and device */
static int to_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    gin[0] = mp_to(g, n->in[0].dtype, n->in[0].dev);   /* recorded under create_graph */
    return gin[0] ? 0 : -1;
}

/* The backward of a cast of an f32 leaf into f16/bf16 (autocast's weights,
 * mp_arena_cast) straight into the leaf's .grad: n's gradient widened and
 * added in one pass (kernels/backend.h add_widened), where to_backward made a
 * widened tensor that the backward then added (an allocation and a pass over
 * 4 bytes an element more). Bit-identical: the widening is exact and the add
 * is the same f32 add. 1 when n is no such cast, .grad is not there to add
 * into, or the backend has no add_widened (the caller takes the usual way);
 * 0 done. engine/backward.c decides when nothing else is to see the widened
 * gradient. */
int mp_cast_backward_into(mp_node *n, mp_tensor *leaf)
{
    mp_tensor *g = n->grad, *acc = leaf->grad;
    if (n->op != &to_op || n->nin != 1 || !g || !acc) return 1;
    if ((g->dtype != MP_F16 && g->dtype != MP_BF16) || n->in[0].dtype != MP_F32 || acc->dtype != MP_F32 ||
        n->in[0].dev != g->dev || acc->dev != g->dev || !mp_same_shape(acc, g) || !mp_be(acc)->add_widened)
        return 1;
    MP_K(acc, add_widened, mp_data(acc), mp_data(g), g->dtype, g->numel);
    acc->st->version++;   /* an in-place write, as the add it stands for */
    return 0;
}

mp_tensor *mp_cast_grad_target(const mp_node *n, const mp_tensor *leaf)
{
    mp_tensor *acc = leaf->grad;
    const mp_edge *e = &n->in[0];
    if (n->op != &to_op || n->nin != 1 || e->leaf != leaf || !acc || e->dtype != MP_F32 || acc->dtype != MP_F32 ||
        acc->dev != e->dev || acc->ndim != e->ndim || memcmp(acc->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim))
        return NULL;
    return acc;
}

typedef struct { mp_dtype dtype; mp_device dev; int saturate; } to_args;

static mp_tensor *to_fwd(mp_op_ctx *c)
{
    const to_args *a = MP_OP_ARGS(c, to_args);
    return to_raw(c->in[0], a->dtype, a->dev, a->saturate);
}

static mp_tensor *clone_fwd(mp_op_ctx *c)
{
    mp_tensor *t = c->in[0], *o = mp_empty(t->dtype, t->dev, t->ndim, t->shape);
    if (o) MP_K(o, copy, mp_data(o), mp_data(t), mp_nbytes(t));
    return o;
}

static const mp_op to_op = {.name = "to", .nin = 1, .forward = to_fwd, .backward = to_backward,
                            .args_size = sizeof(to_args), .double_backward = true, .moves_bytes = true};
static const mp_op clone_op = {.name = "clone", .nin = 1, .forward = clone_fwd, .backward = to_backward,
                               .double_backward = true, .moves_bytes = true};
MP_OP_REGISTER(to_op);
MP_OP_REGISTER(clone_op);

/* A parameter of an optimizer's arena in f16/bf16: a view of the arena's working
 * copy, which the optimizer step keeps current in the same pass as the masters
 * (so a step under autocast does not cast the weights again); cast here only
 * when the copy is missing or stale (the masters were written some other way). */
mp_tensor *mp_arena_cast(mp_tensor *t, mp_dtype dt)
{
    mp_storage *st = t->st;
    if (!st->arena || t->dtype != MP_F32 || (dt != MP_F16 && dt != MP_BF16)) return mp_to(t, dt, t->dev);
    int64_t numel = (int64_t)(st->nbytes / sizeof(float));
    if (!st->lowp || st->lowp->dtype != dt) {
        mp_tensor *w = mp_empty(dt, t->dev, 1, &numel);
        if (!w) return NULL;
        mp_release(st->lowp);
        st->lowp = w;
        st->lowp_version = st->version - 1;
    }
    if (st->lowp_version != st->version) {
        MP_K(t, cast, mp_data(st->lowp), dt, st->data, MP_F32, numel, 0);
        st->lowp_version = st->version;
        st->lowp->st->version++;   /* rewritten in place: casts saved by a graph are stale */
    }
    mp_node *n;
    return mp_finish(mp_view(st->lowp, t->ndim, t->shape, t->offset), &to_op, 1, &t, &n);
}

mp_tensor *mp_to_sat(mp_tensor *t, mp_dtype dt, mp_device dev, bool saturate)
{
    if (t->dtype == dt && t->dev == dev) return mp_retain(t);
    /* casts to integers and FP8 are not differentiable: they cut the graph (mp_finish) */
    to_args args = {dt, dev, saturate};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&to_op, &c, 1, &t);
}

mp_tensor *mp_to(mp_tensor *t, mp_dtype dt, mp_device dev) { return mp_to_sat(t, dt, dev, false); }

mp_tensor *mp_clone(mp_tensor *t)
{
    mp_op_ctx c = {0};
    return mp_apply(&clone_op, &c, 1, &t);
}

int mp_copy_(mp_tensor *dst, mp_tensor *src)
{
    char b1[128], b2[128];
    if (!mp_same_shape(dst, src))
        return mp_fail(MP_EINVAL, "shapes %s and %s differ", mp_shape_str(dst->ndim, dst->shape, b1, sizeof b1),
                       mp_shape_str(src->ndim, src->shape, b2, sizeof b2));
    if (dst->requires_grad && mp_grad_enabled())
        return mp_fail(MP_EINVAL, "in-place copy into a tensor that requires grad (use it inside mp.no_grad())");
    mp_tensor *c = mp_to_raw(src, dst->dtype, dst->dev);
    if (!c) return -1;
    if (c->st != dst->st || c->offset != dst->offset) MP_K(dst, copy, mp_data(dst), mp_data(c), mp_nbytes(dst));
    dst->st->version++;
    mp_release(c);
    return 0;
}
