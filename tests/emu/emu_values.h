/*
 * emu_values.h: the library shims' (emu_cublas.cc, emu_cudnn.cc) view of the
 * values they compute on: an element of a float dtype as f32, an f32 rounded
 * into one, and TF32, what tensor cores make of f32 operands where a math mode
 * allows it.
 */
#ifndef MP_EMU_VALUES_H
#define MP_EMU_VALUES_H

#include <string.h>
extern "C" {
#include "kernels/backend.h"
#include "kernels/half.h"
}
#include "kernels/fp8.h"


namespace mp_emu {

inline float load_f32(mp_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case MP_F16: return mp_f16_to_f32(((const uint16_t *)p)[i]);
    case MP_BF16: return mp_bf16_to_f32(((const uint16_t *)p)[i]);
    case MP_F32:
    case MP_I32:   /* (never asked: moved as f32 words, as the CPU's cpu_load does) */
    case MP_U8: return ((const float *)p)[i];
    case MP_F64: return (float)((const double *)p)[i];   /* (never asked: CUDA declines f64) */
    case MP_E4M3: return mp_fp8_to_f32(((const uint8_t *)p)[i], MP_FP8_E4M3);   /* (never asked: data only) */
    case MP_E5M2: return mp_fp8_to_f32(((const uint8_t *)p)[i], MP_FP8_E5M2);
    }
    return 0.0f;   /* not a dtype */
}

inline void store_f32(mp_dtype dt, void *p, size_t i, float v)
{
    switch (dt) {
    case MP_F16: ((uint16_t *)p)[i] = mp_f32_to_f16(v); break;
    case MP_BF16: ((uint16_t *)p)[i] = mp_f32_to_bf16(v); break;
    case MP_F32:
    case MP_I32:
    case MP_U8: ((float *)p)[i] = v; break;
    case MP_F64: ((double *)p)[i] = v; break;   /* (never asked: CUDA declines f64) */
    case MP_E4M3: ((uint8_t *)p)[i] = mp_f32_to_fp8(v, MP_FP8_E4M3, 0); break;   /* (never asked: data only) */
    case MP_E5M2: ((uint8_t *)p)[i] = mp_f32_to_fp8(v, MP_FP8_E5M2, 0); break;
    }
}

/* f32 rounded to dt and back */
inline float round_to(mp_dtype dt, float v)
{
    return dt == MP_F16 ? mp_f16_to_f32(mp_f32_to_f16(v)) : dt == MP_BF16 ? mp_bf16_to_f32(mp_f32_to_bf16(v)) : v;
}

/* f32 to TF32 (10 stored significand bits), round to nearest even */
inline float tf32(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&v, &u, 4);
    return v;
}

}  // namespace mp_emu

#endif
