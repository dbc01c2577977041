/*
 * tensor.h: tensors and their storage.
 *
 * A tensor is a refcounted header (dtype, device, shape, offset) over a
 * refcounted storage. Tensors are always contiguous and row-major: views
 * (reshape, narrow along the first dim) share storage at an offset, every
 * other layout change makes a contiguous copy. The engine counts the bytes
 * storages hold per device (engine/memory.h) so that the binding can pace Lua's
 * garbage collector.
 */
#ifndef MP_TENSOR_H
#define MP_TENSOR_H

#include <stdbool.h>
#include "kernels/backend.h"   /* mp_dtype, mp_device, MP_MAXDIM, mp_backend */
#include "engine/device.h"     /* mp_backend_of, for MP_K */

typedef struct mp_storage {
    int refs;
    mp_device dev;
    size_t nbytes;
    void *data;
    bool arena;                    /* an optimizer's parameter arena */
    uint64_t version;              /* bumped by every in-place write (copy_, add_, an optimizer step): a
                                    * backward checks its saved tensors against it (engine/graph.h) */
    bool grad_view;                /* a view (reshape, narrow) was taken of it: while another header
                                    * holds it, in-place ops in grad mode refuse it (engine/ops_inplace.c) */
    /* an arena's f16/bf16 working copy for autocast, current when lowp_version ==
     * version: the optimizer step writes it with the masters (mp_arena_cast) */
    struct mp_tensor *lowp;
    uint64_t lowp_version;
    /* an autocast cast's f16 values widened to f32 (engine/ops_matmul.c), kept
     * for the GEMMs that read them while wide_version == version: set keep_wide
     * (the cast cache does, engine/autocast.c) and the first GEMM makes it; an
     * optimizer step that writes the storage (an arena's lowp) keeps it current
     * (engine/optim.c); it goes with the storage */
    bool keep_wide;
    struct mp_tensor *wide;
    uint64_t wide_version;
    int wide_dtype;                /* the mp_dtype wide was widened from: a view of the bytes as
                                    * another dtype (mp_view_dtype) widens them itself */
} mp_storage;

/* What a tensor holds of the node that computed it: the head every graph node
 * begins with (engine/graph.h), which says how that node is let go. Tensors are
 * the layer below the graph, so a tensor releases its grad_fn through the head
 * without knowing what a node is (and tensor.c includes nothing of autograd). */
typedef struct mp_node_head {
    void (*release)(struct mp_node_head *self);   /* drop one reference */
} mp_node_head;

/*
 * Quantization metadata: how a tensor's stored values scale to the values they
 * stand for (value = stored * scale). It is where FP8 plugs in (no FP8 dtype
 * exists yet): an e4m3 tensor is an ordinary (dtype, data) pair for every
 * backend entry, plus its scales here, so no entry's signature changes.
 * The scales are an f32 tensor (u8 E8M0 bytes for MX) on the tensor's device, never a host number:
 * delayed scaling computes them there from an amax history (as the loss
 * scaler keeps its scale on the device), so reading one must not wait.
 * A tensor holds its scales (retained) and releases them with itself; a view
 * (mp_view, a detached header) keeps them. An op reads quantized inputs only
 * when its description says so (mp_op.quantized); mp_apply refuses them for
 * every other op, so scaled values are never read as plain ones.
 */
typedef enum {
    MP_QUANT_NONE,           /* plain values (scales NULL) */
    MP_QUANT_TENSOR,         /* one scale for the whole tensor: scales {1} */
    MP_QUANT_1X128,          /* one per 1 x 128 tile along the last dim (activations, DeepSeek-V3's
                              * FP8 recipe): scales {rows, ceil(cols / 128)} */
    MP_QUANT_128X128,        /* one per 128 x 128 block (weights): scales {ceil(rows / 128), ceil(cols / 128)} */
    MP_QUANT_MX,             /* OCP MX: one per 1 x 32 block along the last dim, a u8 E8M0 byte b meaning
                              * 2^(b - 127) (0xff NaN): scales {rows, ceil(cols / 32)} */
    MP_NQUANT
} mp_quant_kind;   /* rows: the product of all dims but the last; cols: the last dim (1 for a scalar) */

typedef struct {
    mp_quant_kind kind;
    struct mp_tensor *scales;      /* f32 (u8 for MX), on the tensor's device, retained; NULL for MP_QUANT_NONE */
    int64_t block[2];              /* the rows and columns one scale covers (0 for a per-tensor scale) */
} mp_quant;

typedef struct mp_tensor {
    int refs;
    mp_dtype dtype;
    mp_device dev;
    int ndim;                      /* 0 for a scalar */
    int64_t shape[MP_MAXDIM];
    int64_t numel;
    int64_t offset;                /* in elements, into the storage */
    mp_storage *st;
    /* autograd (engine/graph.h): a leaf that requires grad accumulates into
     * `grad`; a tensor computed from one has the node that made it, whose
     * first member is its mp_node_head */
    bool requires_grad;
    struct mp_tensor *grad;
    struct mp_node *grad_fn;
    /* a leaf's gradient hooks (engine/grad_hooks.h), NULL when none: released
     * with the tensor through their head, as grad_fn is */
    mp_node_head *hooks;
    mp_quant quant;                /* plain values unless quant.kind says otherwise (above) */
} mp_tensor;

const char *mp_dtype_name(mp_dtype t);
int mp_dtype_parse(const char *name, mp_dtype *out);        /* accepts aliases; -1 if unknown */
bool mp_is_float(mp_dtype t);
/* FP8 (e4m3, e5m2): data only, as in PyTorch: casts, copies and layout ops
 * (the ops marked moves_bytes, engine/op.h) take it; mp_apply refuses it to
 * every other op */
bool mp_is_storage_only(mp_dtype t);
/* v stored in a dt tensor without changing its value: any number for a
 * floating dtype (rounding to it is the dtype's nature), a whole number in
 * range for i32 and u8; else -1 with an error saying so (never saturated) */
int mp_check_value(mp_dtype dt, double v);
bool mp_value_fits(mp_dtype dt, double v);                  /* the same test, without an error */

/* t, after the engine queued work for it on an asynchronous device: NULL (t
 * released) with that device's error when it reported one. Every engine call
 * that queues work returns its device's errors this way (ops through mp_apply,
 * creation, copies, backward, optimizer and scaler steps): callers need not ask. */
mp_tensor *mp_checked(mp_tensor *t);

/* quantization metadata (mp_quant above): "tensor", "1x128", "128x128", "mx" ("none") */
const char *mp_quant_name(mp_quant_kind k);
/* the rows and columns one scale of kind k covers (0 for per-tensor and none) */
void mp_quant_block(mp_quant_kind k, int64_t block[2]);
/* mark t's values as quantized by kind with scales (retained; the ones before
 * released), or plain with MP_QUANT_NONE and NULL. scales must be a plain f32
 * tensor (u8 for MP_QUANT_MX) on t's device shaped as the kind says. -1 +
 * error otherwise */
int mp_set_quant(mp_tensor *t, mp_quant_kind kind, mp_tensor *scales);

mp_tensor *mp_empty(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape);
mp_tensor *mp_view(mp_tensor *t, int ndim, const int64_t *shape, int64_t offset);
/* t's bytes read as dtype dt, of the same size (u8 / e4m3 / e5m2, f16 / bf16,
 * f32 / i32): a header over the same storage, without history (as detach) */
mp_tensor *mp_view_dtype(mp_tensor *t, mp_dtype dt);
mp_tensor *mp_retain(mp_tensor *t);
void mp_storage_release(mp_storage *st);
void mp_release(mp_tensor *t);

int mp_check_shape(int ndim, const int64_t *shape, int64_t *numel);
int mp_same_shape(const mp_tensor *a, const mp_tensor *b);
/* "{2,3}" into buf (for error messages) */
const char *mp_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

static inline size_t mp_nbytes(const mp_tensor *t) { return (size_t)t->numel * mp_dtype_size(t->dtype); }
static inline void *mp_data(const mp_tensor *t)
{
    return (char *)t->st->data + (size_t)t->offset * mp_dtype_size(t->dtype);
}
static inline const mp_backend *mp_be(const mp_tensor *t) { return mp_backend_of(t->dev); }
/* run kernel entry fn of t's backend, its context first (kernels/backend.h) */
#define MP_K(t, fn, ...) (mp_be(t)->fn(mp_be(t)->ctx, __VA_ARGS__))

#endif
