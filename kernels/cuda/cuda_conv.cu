/*
 * cuda_conv.cu: 2-d convolution through cuDNN 9's convolution calls (the
 * legacy API it still ships), forward, backward data and backward filter, with
 * f32 compute for every dtype. For f32 the math is FMA only (no TF32: f32 means
 * f32 here, as on the CPU); f16/bf16 may use tensor cores.
 *
 * A plan per shape (descriptors and the three algorithms, chosen once by
 * cuDNN's heuristics among the deterministic ones whose workspace fits) is kept
 * in the context (cx->cudnn_plans); workspaces come from the context's scratch
 * (the caching allocator), so a warm step makes no cudaMalloc and no wait. The
 * handle and plans live as long as the context, as the cuBLAS handle does.
 *
 * The bias, in the one rounding: y is first filled with the bias (exact: it has
 * y's dtype) and cuDNN then blends, y = conv(x, w) + 1 * y, in its f32 compute
 * type before it rounds y once, as the CPU adds the bias to its f32 sums. (A
 * bias added by a kernel after cuDNN had rounded y would round twice: an ulp
 * off in f16/bf16, which conv_spec on the emulated device showed.) The bias
 * gradient is our own reduction: f64 sums per channel in a fixed order.
 */
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/cuda.h"

#define PLANS 32
#define WS_LIMIT ((size_t)1 << 30)   /* the largest workspace an algorithm may ask for */

typedef struct {
    int used;
    mp_dtype dt;
    mp_conv_args a;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv[3];   /* per pass: its algorithm's math type */
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t ws[3];
} plan;

typedef struct {
    plan p[PLANS];
    int next;
} plans;

static void note(mp_kctx *cx, cudnnStatus_t s, const char *what)
{
    if (s == CUDNN_STATUS_SUCCESS || cx->has_error) return;
    snprintf(cx->error_msg, sizeof cx->error_msg, "%s: %s", what, cudnnGetErrorString(s));
    cx->has_error = true;
}

/* the context's cuDNN handle on its stream, made on first use; NULL (error noted) */
static cudnnHandle_t handle(mp_kctx *cx)
{
    if (!cx->cudnn) {
        cudnnHandle_t h;
        cudnnStatus_t s = cudnnCreate(&h);
        if (s != CUDNN_STATUS_SUCCESS) return note(cx, s, "conv2d: cudnnCreate"), (cudnnHandle_t)NULL;
        cx->cudnn = h;
        cx->cudnn_plans = calloc(1, sizeof(plans));
        if (!cx->cudnn_plans) return note(cx, CUDNN_STATUS_ALLOC_FAILED, "conv2d: plans"), (cudnnHandle_t)NULL;
    }
    cudnnHandle_t h = (cudnnHandle_t)cx->cudnn;
    cudnnStatus_t s = cudnnSetStream(h, cx->stream);
    if (s != CUDNN_STATUS_SUCCESS) return note(cx, s, "conv2d: cudnnSetStream"), (cudnnHandle_t)NULL;
    return h;
}

static cudnnDataType_t cudnn_type(mp_dtype dt)
{
    return dt == MP_F16 ? CUDNN_DATA_HALF : dt == MP_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static void drop(plan *p)
{
    if (!p->used) return;
    cudnnDestroyTensorDescriptor(p->x), cudnnDestroyTensorDescriptor(p->y);
    cudnnDestroyFilterDescriptor(p->w);
    for (int i = 0; i < 3; i++) cudnnDestroyConvolutionDescriptor(p->conv[i]);
    memset(p, 0, sizeof *p);
}

/* An algorithm from cuDNN's ranked list: the first that works, is
 * deterministic and fits WS_LIMIT. For f32 the list was asked for with the
 * descriptor at CUDNN_FMA_MATH, so what cuDNN offers runs with FMA only,
 * whatever mathType label its result carries (cuDNN reports such algorithms
 * as CUDNN_DEFAULT_MATH, which set on the descriptor would let them use TF32
 * on sm_80 and newer): the descriptor keeps FMA_MATH. f16/bf16 take the math
 * type their result was ranked with (tensor cores). When none qualifies, what
 * was offered goes into `offered` for the error. */
template <class PERF, class ALGO>
static cudnnStatus_t pick(const PERF *perf, int n, bool f32, ALGO *algo, size_t *ws, cudnnMathType_t *math,
                          char *offered, size_t cap)
{
    size_t at = 0;
    offered[0] = 0;
    for (int i = 0; i < n; i++) {
        const PERF &p = perf[i];
        if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC && p.memory <= WS_LIMIT) {
            *algo = p.algo, *ws = p.memory, *math = f32 ? CUDNN_FMA_MATH : p.mathType;
            return CUDNN_STATUS_SUCCESS;
        }
        if (at < cap)
            at += (size_t)snprintf(offered + at, cap - at, "%salgo %d (%s, %s, %zu bytes)", i ? ", " : "", (int)p.algo,
                                   p.status == CUDNN_STATUS_SUCCESS ? "works" : cudnnGetErrorString(p.status),
                                   p.determinism == CUDNN_DETERMINISTIC ? "deterministic" : "non-deterministic",
                                   p.memory);
    }
    if (!n) snprintf(offered, cap, "nothing");
    return CUDNN_STATUS_NOT_SUPPORTED;
}

/* the descriptors and the three algorithms of a plan; on failure, which pass
 * found no algorithm and what cuDNN offered for it, in why */
static cudnnStatus_t make(cudnnHandle_t h, plan *p, mp_dtype dt, const mp_conv_args *a, char *why, size_t cap)
{
    cudnnDataType_t t = cudnn_type(dt);
    int f32 = dt == MP_F32;
    p->dt = dt, p->a = *a;
    cudnnStatus_t s = cudnnCreateTensorDescriptor(&p->x);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnCreateTensorDescriptor(&p->y);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnCreateFilterDescriptor(&p->w);
    for (int i = 0; i < 3 && s == CUDNN_STATUS_SUCCESS; i++) s = cudnnCreateConvolutionDescriptor(&p->conv[i]);
    p->used = 1;   /* from here on drop() frees what was made */
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, t, (int)a->n, (int)a->c, (int)a->h, (int)a->w);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, t, (int)a->n, (int)a->k, (int)a->oh, (int)a->ow);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnSetFilter4dDescriptor(p->w, t, CUDNN_TENSOR_NCHW, (int)a->k, (int)(a->c / a->groups), (int)a->r,
                                       (int)a->s);
    for (int i = 0; i < 3 && s == CUDNN_STATUS_SUCCESS; i++) {
        s = cudnnSetConvolution2dDescriptor(p->conv[i], (int)a->ph, (int)a->pw, (int)a->sh, (int)a->sw, (int)a->dh,
                                            (int)a->dw, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetConvolutionGroupCount(p->conv[i], (int)a->groups);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnSetConvolutionMathType(p->conv[i], f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
    }
    cudnnMathType_t math[3] = {CUDNN_FMA_MATH, CUDNN_FMA_MATH, CUDNN_FMA_MATH};
    char offered[400];
    int n = 0;
    if (s == CUDNN_STATUS_SUCCESS) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        s = cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->conv[0], p->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                   &n, perf);
        if (s == CUDNN_STATUS_SUCCESS && pick(perf, n, f32, &p->fwd, &p->ws[0], &math[0], offered, sizeof offered))
            return snprintf(why, cap, "the forward pass; cuDNN offered %s", offered), CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (s == CUDNN_STATUS_SUCCESS) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        s = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y, p->conv[1], p->x,
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf);
        if (s == CUDNN_STATUS_SUCCESS && pick(perf, n, f32, &p->bwd_data, &p->ws[1], &math[1], offered, sizeof offered))
            return snprintf(why, cap, "the data gradient; cuDNN offered %s", offered), CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (s == CUDNN_STATUS_SUCCESS) {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        s = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->x, p->y, p->conv[2], p->w,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf);
        if (s == CUDNN_STATUS_SUCCESS && pick(perf, n, f32, &p->bwd_filter, &p->ws[2], &math[2], offered, sizeof offered))
            return snprintf(why, cap, "the filter gradient; cuDNN offered %s", offered), CUDNN_STATUS_NOT_SUPPORTED;
    }
    /* each pass runs with the math type chosen for it */
    for (int i = 0; i < 3 && s == CUDNN_STATUS_SUCCESS; i++) s = cudnnSetConvolutionMathType(p->conv[i], math[i]);
    if (s != CUDNN_STATUS_SUCCESS) snprintf(why, cap, "%s", cudnnGetErrorString(s));
    return s;
}

/* the plan for (dt, a), made on first use; NULL (error noted) */
static plan *plan_for(mp_kctx *cx, cudnnHandle_t h, mp_dtype dt, const mp_conv_args *a)
{
    plans *ps = (plans *)cx->cudnn_plans;
    for (int i = 0; i < PLANS; i++)
        if (ps->p[i].used && ps->p[i].dt == dt && !memcmp(&ps->p[i].a, a, sizeof *a)) return &ps->p[i];
    plan *p = &ps->p[ps->next];
    ps->next = (ps->next + 1) % PLANS;
    drop(p);
    char why[400];
    if (make(h, p, dt, a, why, sizeof why) != CUDNN_STATUS_SUCCESS) {
        drop(p);
        if (!cx->has_error) {
            snprintf(cx->error_msg, sizeof cx->error_msg, "conv2d: no deterministic cuDNN algorithm within %d MiB of "
                     "workspace for %s", (int)(WS_LIMIT >> 20), why);
            cx->has_error = true;
        }
        return NULL;
    }
    return p;
}

/* y[n, k, :] = b[k]: the bias, which cuDNN then adds to its sums (beta = 1) */
__global__ void k_fill_bias(mp_dtype dt, void *y, const void *b, int64_t total, int64_t k, int64_t hw)
{
    MP_FOR(i, total) mp_st(dt, y, i, mp_ld(dt, b, i / hw % k));
}

/* gb[ch] = sum over images and pixels of gy (f64, a fixed tree): one block per channel */
__global__ void k_bias_grad(mp_dtype dt, float *gb, const void *gy, int64_t n, int64_t k, int64_t hw)
{
    __shared__ double sh[MP_THREADS];
    for (int64_t ch = blockIdx.x; ch < k; ch += gridDim.x) {
        double s = 0;
        for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x) s += mp_ld(dt, gy, (e / hw * k + ch) * hw + e % hw);
        sh[threadIdx.x] = s;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w /= 2) {
            if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
            __syncthreads();
        }
        if (threadIdx.x == 0) gb[ch] = (float)sh[0];
        __syncthreads();
    }
}

int mp_cuda_conv2d(mp_kctx *cx, mp_dtype dt, void *y, const void *x, const void *w, const void *b,
                   const mp_conv_args *a)
{
    if (a->n == 0) return 0;
    cudnnHandle_t h = handle(cx);
    plan *p = h ? plan_for(cx, h, dt, a) : NULL;
    if (!p) return 0;   /* the error is noted: the engine raises it after the op */
    void *ws = p->ws[0] ? mp_cuda_scratch(cx, p->ws[0]) : NULL;
    if (p->ws[0] && !ws) return -1;
    float one = 1.0f, zero = 0.0f;
    if (b) {
        int64_t total = a->n * a->k * a->oh * a->ow;
        MP_LAUNCH(mp_blocks(total), MP_THREADS, 0, cx->stream, k_fill_bias, dt, y, b, total, a->k, a->oh * a->ow);
        MP_LAUNCHED("conv2d bias");
    }
    note(cx, cudnnConvolutionForward(h, &one, p->x, x, p->w, w, p->conv[0], p->fwd, ws, p->ws[0], b ? &one : &zero, p->y,
                                     y),
         "conv2d: cudnnConvolutionForward");
    return 0;
}

int mp_cuda_conv2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, void *gw, float *gb, const void *gy,
                        const void *x, const void *w, const mp_conv_args *a)
{
    int64_t hw = a->oh * a->ow;
    if (gb) {
        if (a->n == 0) MP_CUDA_CHECK(cudaMemsetAsync(gb, 0, sizeof(float) * (size_t)a->k, cx->stream), "conv2d gb");
        else {
            MP_LAUNCH(mp_blocks(a->k * MP_THREADS), MP_THREADS, 0, cx->stream, k_bias_grad, dt, gb, gy, a->n, a->k, hw);
            MP_LAUNCHED("conv2d bias grad");
        }
    }
    if ((!gx && !gw) || a->n == 0) {
        if (gw && a->n == 0)
            MP_CUDA_CHECK(cudaMemsetAsync(gw, 0, mp_dtype_size(dt) * (size_t)(a->k * (a->c / a->groups) * a->r * a->s),
                                          cx->stream), "conv2d gw");
        return 0;
    }
    cudnnHandle_t h = handle(cx);
    plan *p = h ? plan_for(cx, h, dt, a) : NULL;
    if (!p) return 0;
    float one = 1.0f, zero = 0.0f;
    if (gx) {
        void *ws = p->ws[1] ? mp_cuda_scratch(cx, p->ws[1]) : NULL;
        if (p->ws[1] && !ws) return -1;
        note(cx, cudnnConvolutionBackwardData(h, &one, p->w, w, p->y, gy, p->conv[1], p->bwd_data, ws, p->ws[1], &zero,
                                              p->x, gx),
             "conv2d: cudnnConvolutionBackwardData");
    }
    if (gw) {
        void *ws = p->ws[2] ? mp_cuda_scratch(cx, p->ws[2]) : NULL;
        if (p->ws[2] && !ws) return -1;
        note(cx, cudnnConvolutionBackwardFilter(h, &one, p->x, x, p->y, gy, p->conv[2], p->bwd_filter, ws, p->ws[2],
                                                &zero, p->w, gw),
             "conv2d: cudnnConvolutionBackwardFilter");
    }
    return 0;
}
