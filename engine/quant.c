/*
 * quant.c: a tensor's quantization metadata (engine/tensor.h, mp_quant): the
 * kinds' names and block shapes, and attaching scales to a tensor. Holding
 * and dropping them with the tensor and its views is tensor.c's (mp_view,
 * mp_release); refusing them in ops that do not read them is op.c's.
 */
#include "engine/tensor.h"
#include "engine/error.h"

const char *mp_quant_name(mp_quant_kind k)
{
    switch (k) {
    case MP_QUANT_NONE: return "none";
    case MP_QUANT_TENSOR: return "tensor";
    case MP_QUANT_1X128: return "1x128";
    case MP_QUANT_128X128: return "128x128";
    case MP_QUANT_MX: return "mx";
    case MP_NQUANT: break;
    }
    return "?";
}

void mp_quant_block(mp_quant_kind k, int64_t block[2])
{
    block[0] = block[1] = 0;
    switch (k) {
    case MP_QUANT_NONE: case MP_QUANT_TENSOR: case MP_NQUANT: break;
    case MP_QUANT_1X128: block[0] = 1, block[1] = 128; break;
    case MP_QUANT_128X128: block[0] = block[1] = 128; break;
    case MP_QUANT_MX: block[0] = 1, block[1] = 32; break;
    }
}

int mp_set_quant(mp_tensor *t, mp_quant_kind kind, mp_tensor *scales)
{
    char b1[128], b2[128], b3[128];
    if ((unsigned)kind >= MP_NQUANT) return mp_fail(MP_EINVAL, "bad quantization kind %d", (int)kind);
    if (kind == MP_QUANT_NONE ? scales != NULL : scales == NULL)
        return mp_fail(MP_EINVAL, "%s quantization %s scales", mp_quant_name(kind),
                       kind == MP_QUANT_NONE ? "takes no" : "needs");
    if (scales) {
        if (scales == t || scales->st == t->st) return mp_fail(MP_EINVAL, "a tensor cannot hold its own scales");
        mp_dtype want_dt = kind == MP_QUANT_MX ? MP_U8 : MP_F32;   /* MX: E8M0 bytes */
        if (scales->dtype != want_dt || scales->dev != t->dev || scales->quant.kind != MP_QUANT_NONE)
            return mp_fail(MP_EINVAL, "%s scales must be plain %s on %s (got %s%s on %s)", mp_quant_name(kind),
                           mp_dtype_name(want_dt), mp_device_name(t->dev),
                           scales->quant.kind != MP_QUANT_NONE ? "quantized " : "", mp_dtype_name(scales->dtype),
                           mp_device_name(scales->dev));
        int64_t block[2], cols = t->ndim ? t->shape[t->ndim - 1] : 1, rows = cols ? t->numel / cols : 0;
        mp_quant_block(kind, block);
        int64_t want[2] = {1, 1};
        int nd = 1;
        if (block[0]) {
            want[0] = (rows + block[0] - 1) / block[0], want[1] = (cols + block[1] - 1) / block[1];
            nd = 2;
        }
        if (scales->ndim != nd || scales->shape[0] != want[0] || (nd == 2 && scales->shape[1] != want[1]))
            return mp_fail(MP_EINVAL, "%s scales of a %s tensor must be %s (got %s)", mp_quant_name(kind),
                           mp_shape_str(t->ndim, t->shape, b1, sizeof b1), mp_shape_str(nd, want, b2, sizeof b2),
                           mp_shape_str(scales->ndim, scales->shape, b3, sizeof b3));
        mp_retain(scales);
    }
    mp_release(t->quant.scales);
    t->quant.kind = kind;
    t->quant.scales = scales;
    mp_quant_block(kind, t->quant.block);
    return 0;
}
