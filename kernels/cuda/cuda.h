/*
 * cuda.h: what the CUDA kernel files share.
 *
 * - Loading and storing every dtype as f32: f16/bf16 in, f32 compute, one
 *   rounding out, the same numerics as the CPU backend (DESIGN.md section 3).
 * - Launch sizes and a grid-stride loop.
 * - The one stream every kernel and copy of this backend runs on.
 * - The sticky error: a kernel launch cannot return an error to its caller, so
 *   each file notes the first CUDA error and the engine collects it after the op.
 *
 * Each .cu file defines the kernels behind some entries of the mp_backend table
 * (kernels/backend.h); cuda_backend.cu assembles the table. Nothing here knows
 * about the engine.
 */
#ifndef MP_CUDA_H
#define MP_CUDA_H

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

extern "C" {
#include "kernels/backend.h"
}

extern cudaStream_t mp_cuda_stream;

/* remember the first error since the engine last asked */
void mp_cuda_note(cudaError_t e, const char *what);
#define MP_CUDA_CHECK(call, what) mp_cuda_note((call), (what))
#define MP_LAUNCHED(what) mp_cuda_note(cudaGetLastError(), (what))

#define MP_THREADS 256

static inline unsigned mp_blocks(int64_t n)
{
    int64_t b = (n + MP_THREADS - 1) / MP_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* grid-stride loop over [0, n) */
#define MP_FOR(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float mp_ld(mp_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case MP_F32: return ((const float *)p)[i];
    case MP_F16: return __half2float(((const __half *)p)[i]);
    case MP_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case MP_I32: return (float)((const int32_t *)p)[i];
    default: return (float)((const uint8_t *)p)[i];
    }
}

/* f32 -> dtype: round to nearest even for f16/bf16; integers saturate, NaN -> 0 */
__device__ __forceinline__ void mp_st(mp_dtype dt, void *p, int64_t i, float v)
{
    switch (dt) {
    case MP_F32: ((float *)p)[i] = v; break;
    case MP_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case MP_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case MP_I32:
        ((int32_t *)p)[i] = isnan(v) ? 0 : v >= 2147483647.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : (int32_t)v;
        break;
    default: ((uint8_t *)p)[i] = isnan(v) || v <= 0.0f ? 0 : v >= 255.0f ? 255 : (uint8_t)v; break;
    }
}

/* the entries each .cu file provides (same signatures as the backend table) */
void mp_cuda_cast(void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n);
void mp_cuda_fill(void *dst, mp_dtype dt, int64_t n, double value);
void mp_cuda_arange(void *dst, mp_dtype dt, int64_t n);
void mp_cuda_rand_uniform(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset);
void mp_cuda_rand_normal(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset);
void mp_cuda_binary(mp_binop op, mp_dtype dt, void *out, const void *a, const void *b, const mp_bcast *bc);
void mp_cuda_unary(mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p);
void mp_cuda_unary_grad(mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x, const void *y,
                        int64_t n, double p);
void mp_cuda_where(mp_dtype dt, void *out, const uint8_t *cond, const void *a, const void *b, int64_t n);
void mp_cuda_reduce(mp_redop op, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner);
void mp_cuda_put_along(mp_dtype dt, void *out, const void *src, const int32_t *idx, int64_t outer, int64_t n,
                       int64_t inner);
void mp_cuda_permute(mp_dtype dt, void *out, const void *in, int ndim, const int64_t *shape, const int *perm);
void mp_cuda_narrow(mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n, int64_t start, int64_t len,
                    int64_t inner);
void mp_cuda_narrow_put(mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n, int64_t start,
                        int64_t len, int64_t inner);
void mp_cuda_gather(mp_dtype dt, void *out, const void *in, const int32_t *idx, int64_t nidx, int64_t outer,
                    int64_t n, int64_t inner);
void mp_cuda_scatter_add(mp_dtype dt, void *out, const void *src, const int32_t *idx, int64_t nidx,
                         int64_t outer, int64_t n, int64_t inner);
int mp_cuda_gemm(mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                 const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c, int64_t sc);
void mp_cuda_softmax(mp_dtype dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner, int log);
void mp_cuda_softmax_grad(mp_dtype dt, void *gx, const void *gy, const void *y, int64_t outer, int64_t n,
                          int64_t inner, int log);
void mp_cuda_cross_entropy(mp_dtype dt, float *loss, float *lse, const void *x, const int32_t *target,
                           int64_t rows, int64_t classes);
void mp_cuda_cross_entropy_grad(mp_dtype dt, void *gx, const void *x, const float *lse, const int32_t *target,
                                const float *scale, int64_t rows, int64_t classes);
void mp_cuda_layer_norm(mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                        const void *b, int64_t rows, int64_t n, float eps);
void mp_cuda_layer_norm_grad(mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                             const float *mean, const float *rstd, const void *w, int64_t rows, int64_t n);
/* cuda_optim.cu: the loss scaler and the optimizers, on state in device memory */
void mp_cuda_scale_loss(mp_dtype dt, void *out, const void *in, int64_t n, mp_scale_state *st, int check);
void mp_cuda_unscale(float *g, int64_t n, mp_scale_state *st, int slot, mp_grad_stats *tel);
void mp_cuda_scale_rule(mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg, float value);
void mp_cuda_optim_count(int64_t *step, const int32_t *skip);
void mp_cuda_optim_step(mp_optim_kind kind, float *p, const float *g, float *s1, float *s2, int64_t n,
                        const mp_optim_args *a, const int64_t *step, const int32_t *skip);

#endif
