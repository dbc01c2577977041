/*
 * emu_cudnn.cc: the cuDNN calls of kernels/cuda/cuda_conv.cu on the emulated
 * device (cuDNN 9's legacy convolution API).
 *
 * Descriptors are checked when set and again when used, as the manual states:
 * positive sizes, padding >= 0, strides and dilations > 0, a group count that
 * divides the channels; x, w and y of one data type, and a compute type that
 * goes with it (FLOAT for FLOAT, HALF and BFLOAT16 data: the engine's f32
 * accumulation; true-half and double are not emulated), NCHW layouts, the
 * output dims that the input, filter and convolution give; the algorithm one
 * that the heuristics offered for this configuration, a workspace of at least
 * what it needs, in device memory; x, w, y in device memory and inside their
 * allocations; alpha and beta on the host.
 *
 * The heuristics (cudnnGet*Algorithm_v7) answer as cuDNN does for these
 * configurations: every algorithm, in a ranked list, some of them
 * non-deterministic (ranked first for the backward passes, as they often are),
 * some not supported for the shape. The mathType of each result is the one
 * cuDNN reports: for float data under CUDNN_FMA_MATH the FMA-only algorithms
 * come labelled CUDNN_DEFAULT_MATH, and with tensor ops allowed the TF32
 * tensor-core ones come first, labelled CUDNN_TENSOR_OP_MATH.
 *
 * What runs is computed by the CPU backend's convolution (f32 accumulation,
 * one rounding). The math type set on the descriptor when it runs decides the
 * numbers for float data: FMA_MATH is exact f32, any other lets TF32 round the
 * operands (10 significand bits), as cuDNN does on sm_80 and newer. A
 * non-deterministic algorithm sums its parts (images for the filter gradient,
 * output channels for the data gradient) in an order that changes from call
 * to call, so its last bits do too.
 */
#include <stdio.h>
#include <string.h>
#include <map>
#include <set>
#include <string>
#include <vector>
#include <cudnn.h>
#include "tests/emu/emu.h"
#include "tests/emu/emu_values.h"

struct cudnnContext { cudaStream_t stream; };
struct cudnnTensorStruct {
    bool set;
    cudnnTensorFormat_t fmt;
    cudnnDataType_t dt;
    int n, c, h, w;
};
struct cudnnFilterStruct {
    bool set;
    cudnnDataType_t dt;
    cudnnTensorFormat_t fmt;
    int k, c, r, s;
};
struct cudnnConvolutionStruct {
    bool set;
    int ph, pw, sh, sw, dh, dw, groups;
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math;
};

using namespace mp_emu;

static std::set<void *> &live = *new std::set<void *>;   /* handles and descriptors (never destroyed) */
static std::map<int, std::string> &texts = *new std::map<int, std::string>;
static long calls;              /* orders the parts of non-deterministic algorithms */

static cudnnStatus_t bad(cudnnStatus_t s, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cudnnStatus_t bad(cudnnStatus_t s, const char *call, const char *fmt, ...)
{
    char b[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    const char *name = s == CUDNN_STATUS_BAD_PARAM ? "CUDNN_STATUS_BAD_PARAM"
                       : s == CUDNN_STATUS_NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED"
                       : s == CUDNN_STATUS_NOT_INITIALIZED ? "CUDNN_STATUS_NOT_INITIALIZED" : "CUDNN_STATUS_INTERNAL_ERROR";
    texts[(int)s] = std::string(name) + " (emulated cuDNN: " + call + ": " + b + ")";
    if (getenv("MP_EMU_VERBOSE")) fprintf(stderr, "mp-emu: %s\n", texts[(int)s].c_str());
    return s;
}

template <class T> static T *made(T *p) { return p && live.count(p) ? p : NULL; }

static mp_dtype dtype_of(cudnnDataType_t t) { return t == CUDNN_DATA_HALF ? MP_F16 : t == CUDNN_DATA_BFLOAT16 ? MP_BF16 : MP_F32; }

extern "C" {

const char *cudnnGetErrorString(cudnnStatus_t s)
{
    auto it = texts.find((int)s);
    if (it != texts.end()) return it->second.c_str();
    return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    cudnnContext *c = new cudnnContext();
    c->stream = NULL;
    live.insert(c);
    counters().live_dnn++;
    *h = c;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t h)
{
    if (!made(h)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy", "not a live handle");
    sync_stream(h->stream);
    live.erase(h);
    delete h;
    counters().live_dnn--;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s)
{
    if (!made(h)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream", "not a live handle");
    if (!stream_valid(s)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream", "stream %p is not live", (void *)s);
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}

#define DESCRIPTOR(T, create, destroy)                                                            \
    cudnnStatus_t create(T **d)                                                                   \
    {                                                                                             \
        *d = new T();                                                                             \
        live.insert(*d);                                                                          \
        return CUDNN_STATUS_SUCCESS;                                                              \
    }                                                                                             \
    cudnnStatus_t destroy(T *d)                                                                   \
    {                                                                                             \
        if (!made(d)) return bad(CUDNN_STATUS_BAD_PARAM, #destroy, "not a live descriptor");     \
        live.erase(d);                                                                            \
        delete d;                                                                                 \
        return CUDNN_STATUS_SUCCESS;                                                              \
    }
DESCRIPTOR(cudnnTensorStruct, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor)
DESCRIPTOR(cudnnFilterStruct, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor)
DESCRIPTOR(cudnnConvolutionStruct, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor)

static bool type_ok(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16; }

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t fmt, cudnnDataType_t t, int n,
                                         int c, int h, int w)
{
    if (!made(d)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor", "not a live descriptor");
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0)
        return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor", "dims %d %d %d %d: each must be positive", n, c,
                   h, w);
    if (fmt != CUDNN_TENSOR_NCHW)
        return bad(CUDNN_STATUS_NOT_SUPPORTED, "cudnnSetTensor4dDescriptor", "format %d: only NCHW is emulated", (int)fmt);
    if (!type_ok(t)) return bad(CUDNN_STATUS_NOT_SUPPORTED, "cudnnSetTensor4dDescriptor", "data type %d", (int)t);
    *d = cudnnTensorStruct{true, fmt, t, n, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t fmt, int k,
                                         int c, int h, int w)
{
    if (!made(d)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor", "not a live descriptor");
    if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
        return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor", "dims %d %d %d %d: each must be positive", k, c,
                   h, w);
    if (fmt != CUDNN_TENSOR_NCHW)
        return bad(CUDNN_STATUS_NOT_SUPPORTED, "cudnnSetFilter4dDescriptor", "format %d: only NCHW is emulated", (int)fmt);
    if (!type_ok(t)) return bad(CUDNN_STATUS_NOT_SUPPORTED, "cudnnSetFilter4dDescriptor", "data type %d", (int)t);
    *d = cudnnFilterStruct{true, t, fmt, k, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int sh, int sw, int dh,
                                              int dw, cudnnConvolutionMode_t mode, cudnnDataType_t compute)
{
    if (!made(d)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor", "not a live descriptor");
    if (ph < 0 || pw < 0 || sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0)
        return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor",
                   "padding %d %d (>= 0), stride %d %d and dilation %d %d (> 0)", ph, pw, sh, sw, dh, dw);
    if (mode != CUDNN_CROSS_CORRELATION && mode != CUDNN_CONVOLUTION)
        return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor", "mode %d", (int)mode);
    int groups = d->set ? d->groups : 1;
    cudnnMathType_t math = d->set ? d->math : CUDNN_DEFAULT_MATH;
    *d = cudnnConvolutionStruct{true, ph, pw, sh, sw, dh, dw, groups, mode, compute, math};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups)
{
    if (!made(d)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount", "not a live descriptor");
    if (groups < 1) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount", "%d groups", groups);
    if (!d->set) *d = cudnnConvolutionStruct{false, 0, 0, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT,
                                             CUDNN_DEFAULT_MATH};
    d->groups = groups;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m)
{
    if (!made(d)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType", "not a live descriptor");
    if ((int)m < 0 || (int)m > 3) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType", "math type %d", (int)m);
    if (!d->set) *d = cudnnConvolutionStruct{false, 0, 0, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT, m};
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"

/* ---- one convolution's configuration, checked ---- */

struct config_t {
    mp_dtype dt;
    mp_conv_args a;
    bool f32, exact;   /* float data; FMA math (no TF32) */
};

static cudnnStatus_t check(const char *call, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                           cudnnConvolutionDescriptor_t cv, cudnnTensorDescriptor_t y, config_t *out)
{
    if (!made(x) || !made(w) || !made(cv) || !made(y)) return bad(CUDNN_STATUS_BAD_PARAM, call, "a descriptor is not live");
    if (!x->set || !w->set || !cv->set || !y->set) return bad(CUDNN_STATUS_BAD_PARAM, call, "a descriptor was never set");
    if (x->dt != w->dt || x->dt != y->dt)
        return bad(CUDNN_STATUS_BAD_PARAM, call, "data types x %d, w %d, y %d differ", (int)x->dt, (int)w->dt, (int)y->dt);
    if (cv->compute != CUDNN_DATA_FLOAT)
        return bad(CUDNN_STATUS_NOT_SUPPORTED, call, "compute type %d with data type %d: only FLOAT compute (f32 "
                   "accumulation) is emulated", (int)cv->compute, (int)x->dt);
    if (cv->mode != CUDNN_CROSS_CORRELATION)
        return bad(CUDNN_STATUS_NOT_SUPPORTED, call, "CUDNN_CONVOLUTION (flipped filters) is not emulated");
    const int g = cv->groups;
    if (x->c != w->c * g || w->k % g)
        return bad(CUDNN_STATUS_BAD_PARAM, call, "x has %d channels, the filter %d x %d groups; %d output channels "
                   "in %d groups", x->c, w->c, g, w->k, g);
    const int oh = (x->h + 2 * cv->ph - cv->dh * (w->r - 1) - 1) / cv->sh + 1;
    const int ow = (x->w + 2 * cv->pw - cv->dw * (w->s - 1) - 1) / cv->sw + 1;
    if (oh <= 0 || ow <= 0) return bad(CUDNN_STATUS_BAD_PARAM, call, "the output would be %d x %d", oh, ow);
    if (y->n != x->n || y->c != w->k || y->h != oh || y->w != ow)
        return bad(CUDNN_STATUS_BAD_PARAM, call, "y is {%d,%d,%d,%d}; this convolution gives {%d,%d,%d,%d}", y->n, y->c,
                   y->h, y->w, x->n, w->k, oh, ow);
    out->dt = dtype_of(x->dt);
    out->a = mp_conv_args{x->n, x->c, x->h, x->w, w->k, w->r, w->s, oh, ow, cv->sh, cv->sw, cv->ph, cv->pw, cv->dh, cv->dw, g};
    out->f32 = x->dt == CUDNN_DATA_FLOAT;
    out->exact = !out->f32 || cv->math == CUDNN_FMA_MATH;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the heuristics ---- */

struct algo { int id; bool ok, det, tensor; size_t ws; };

static size_t im2col_bytes(const config_t &c)
{
    return mp_dtype_size(c.dt) * (size_t)(c.a.c / c.a.groups) * c.a.r * c.a.s * c.a.oh * c.a.ow;
}

/* pass 0 forward, 1 backward data, 2 backward filter: the ranked list */
static std::vector<algo> ranked(int pass, const config_t &c, cudnnMathType_t math)
{
    const bool tensor_ok = !(c.f32 && math == CUDNN_FMA_MATH);
    const bool wino = c.a.r == 3 && c.a.s == 3 && c.a.sh == 1 && c.a.sw == 1 && c.a.dh == 1 && c.a.dw == 1;
    const bool fft = c.a.sh == 1 && c.a.sw == 1 && c.a.dh == 1 && c.a.dw == 1 && c.a.groups == 1;
    const size_t big = (size_t)c.a.n * c.a.c * (c.a.h + c.a.r) * (c.a.w + c.a.s) * 8;
    std::vector<algo> v;
    if (pass == 0) {
        if (tensor_ok) v.push_back({CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, true, true, 4096});
        v.push_back({CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, true, false, 4096});
        v.push_back({CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true, true, false, 0});
        v.push_back({CUDNN_CONVOLUTION_FWD_ALGO_GEMM, true, true, false, im2col_bytes(c)});
        v.push_back({CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, wino, true, tensor_ok, big});
        v.push_back({CUDNN_CONVOLUTION_FWD_ALGO_FFT, fft, true, false, big});
        v.push_back({CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, false, true, false, 0});
    } else if (pass == 1) {
        v.push_back({CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, true, false, false, 0});
        if (tensor_ok) v.push_back({CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, true, true, 0});
        v.push_back({CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, true, false, 0});
        v.push_back({CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, fft, true, false, big});
        v.push_back({CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, wino, true, tensor_ok, big});
    } else {
        v.push_back({CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, true, false, false, 0});
        v.push_back({CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, true, false, false, 1 << 16});
        if (tensor_ok) v.push_back({CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, true, true, im2col_bytes(c)});
        v.push_back({CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, true, false, im2col_bytes(c)});
        v.push_back({CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, fft, true, false, big});
    }
    return v;
}

template <class PERF>
static cudnnStatus_t heuristics(const char *call, int pass, cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t cv, cudnnTensorDescriptor_t y,
                                int want, int *got, PERF *perf)
{
    if (!made(h)) return bad(CUDNN_STATUS_BAD_PARAM, call, "not a live handle");
    if (want < 1 || !got || !perf) return bad(CUDNN_STATUS_BAD_PARAM, call, "requestedAlgoCount %d", want);
    config_t c;
    cudnnStatus_t s = check(call, x, w, cv, y, &c);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    std::vector<algo> v = ranked(pass, c, cv->math);
    int n = 0;
    for (auto &a : v) {
        if (n == want) break;
        PERF p;
        memset(&p, 0, sizeof p);
        p.algo = (decltype(p.algo))a.id;
        p.status = a.ok ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
        p.time = a.ok ? 0.1f * (float)(n + 1) : -1.0f;
        p.memory = a.ws;
        p.determinism = a.det ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
        p.mathType = a.tensor ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH;
        perf[n++] = p;
    }
    *got = n;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- running one ---- */

/* the algorithm is one the heuristics offer for this configuration, and the
 * workspace holds what it needs; *det: it is deterministic */
static cudnnStatus_t algo_ok(const char *call, int pass, const config_t &c, cudnnMathType_t math, int id, const void *ws,
                             size_t ws_bytes, bool *det)
{
    for (auto &a : ranked(pass, c, math)) {
        if (a.id != id || !a.ok) continue;
        if (ws_bytes < a.ws)
            return bad(CUDNN_STATUS_BAD_PARAM, call, "algorithm %d needs %zu bytes of workspace, %zu given", id, a.ws,
                       ws_bytes);
        region r;
        if (a.ws && (!find_region(ws, &r) || !(r.kind & MEM_DEVICE)))
            return bad(CUDNN_STATUS_BAD_PARAM, call, "the workspace %p is not device memory", ws);
        if (a.ws && ws_bytes > r.size - (size_t)((const char *)ws - r.base))
            return bad(CUDNN_STATUS_BAD_PARAM, call, "the workspace's %zu bytes run past the end of its allocation",
                       ws_bytes);
        *det = a.det;
        return CUDNN_STATUS_SUCCESS;
    }
    return bad(CUDNN_STATUS_NOT_SUPPORTED, call, "algorithm %d is not offered for this configuration", id);
}

static bool in_device(const void *p, size_t bytes)
{
    region r;
    return find_region(p, &r) && (r.kind & MEM_DEVICE) && bytes <= r.size - (size_t)((const char *)p - r.base);
}

static cudnnStatus_t scalars(const char *call, const void *alpha, const void *beta, float *a, float *b)
{
    region r;
    if (!alpha || !beta || (find_region(alpha, &r) && (r.kind & MEM_DEVICE)) || (find_region(beta, &r) && (r.kind & MEM_DEVICE)))
        return bad(CUDNN_STATUS_BAD_PARAM, call, "alpha and beta must be host pointers");
    *a = *(const float *)alpha, *b = *(const float *)beta;
    return CUDNN_STATUS_SUCCESS;
}

/* n values of dtype dt as f32 (TF32-rounded when tf) */
static std::vector<float> widen(mp_dtype dt, const void *p, size_t n, bool tf)
{
    std::vector<float> v(n + 1);
    for (size_t i = 0; i < n; i++) v[i] = tf ? tf32(load_f32(dt, p, i)) : load_f32(dt, p, i);
    return v;
}

/* out = alpha * r + beta * out, r f32, rounded once into dt */
static void blend(mp_dtype dt, void *out, const float *r, size_t n, float alpha, float beta)
{
    for (size_t i = 0; i < n; i++) store_f32(dt, out, i, alpha * r[i] + (beta != 0.0f ? beta * load_f32(dt, out, i) : 0.0f));
}

static void cpu_failed(void)
{
    sticky(cudaErrorLaunchFailure, "unspecified launch failure (emulated cuDNN: the CPU convolution found no working "
           "memory)");
}

/* forward, exact math in dt: the CPU's own kernel, one rounding */
static bool forward(const config_t c, const void *x, const void *w, void *y, float alpha, float beta)
{
    const mp_backend &cpu = mp_cpu_backend;
    size_t ny = (size_t)(c.a.n * c.a.k * c.a.oh * c.a.ow);
    if (c.exact && alpha == 1.0f && beta == 0.0f)
        return cpu.conv2d(cpu.ctx, c.dt, y, x, w, NULL, &c.a) == 0 ? true : (cpu_failed(), false);
    size_t nx = (size_t)(c.a.n * c.a.c * c.a.h * c.a.w), nw = (size_t)(c.a.k * (c.a.c / c.a.groups) * c.a.r * c.a.s);
    std::vector<float> xf = widen(c.dt, x, nx, !c.exact), wf = widen(c.dt, w, nw, !c.exact), r(ny + 1);
    if (cpu.conv2d(cpu.ctx, MP_F32, r.data(), xf.data(), wf.data(), NULL, &c.a) != 0) return cpu_failed(), false;
    blend(c.dt, y, r.data(), ny, alpha, beta);
    return true;
}

/* the images in parts (deterministic: one part), each part's filter gradient
 * in f32, added in an order that turns with each call */
static bool backward_filter(const config_t c, const void *x, const void *gy, void *gw, float alpha, float beta, bool det)
{
    const mp_backend &cpu = mp_cpu_backend;
    const mp_conv_args &a = c.a;
    size_t nx = (size_t)(a.n * a.c * a.h * a.w), nw = (size_t)(a.k * (a.c / a.groups) * a.r * a.s);
    size_t ny = (size_t)(a.n * a.k * a.oh * a.ow);
    if (det && c.exact && alpha == 1.0f && beta == 0.0f) {
        std::vector<char> wz(mp_dtype_size(c.dt) * nw + 1, 0);   /* the gradient does not read w */
        return cpu.conv2d_grad(cpu.ctx, c.dt, NULL, gw, NULL, gy, x, wz.data(), &a) == 0 ? true : (cpu_failed(), false);
    }
    std::vector<float> xf = widen(c.dt, x, nx, !c.exact), gf = widen(c.dt, gy, ny, !c.exact), wz(nw + 1, 0.0f);
    int parts = det || a.n < 3 ? 1 : 3;
    std::vector<std::vector<float>> part((size_t)parts, std::vector<float>(nw + 1));
    for (int p = 0; p < parts; p++) {
        int64_t i0 = a.n * p / parts, i1 = a.n * (p + 1) / parts;
        mp_conv_args s = a;
        s.n = i1 - i0;
        if (cpu.conv2d_grad(cpu.ctx, MP_F32, NULL, part[(size_t)p].data(), NULL, gf.data() + (size_t)i0 * a.k * a.oh * a.ow,
                            xf.data() + (size_t)i0 * a.c * a.h * a.w, wz.data(), &s) != 0)
            return cpu_failed(), false;
    }
    std::vector<float> sum(nw + 1, 0.0f);
    for (int q = 0; q < parts; q++) {
        const std::vector<float> &pp = part[(size_t)((q + calls) % parts)];
        for (size_t i = 0; i < nw; i++) sum[i] += pp[i];
    }
    blend(c.dt, gw, sum.data(), nw, alpha, beta);
    return true;
}

/* output channels in parts (groups of 1; deterministic: one part), each
 * part's data gradient in f32, added in an order that turns with each call */
static bool backward_data(const config_t c, const void *w, const void *gy, void *gx, float alpha, float beta, bool det)
{
    const mp_backend &cpu = mp_cpu_backend;
    const mp_conv_args &a = c.a;
    size_t nx = (size_t)(a.n * a.c * a.h * a.w), nw = (size_t)(a.k * (a.c / a.groups) * a.r * a.s);
    size_t ohw = (size_t)(a.oh * a.ow), ny = (size_t)a.n * a.k * ohw;
    if (det && c.exact && alpha == 1.0f && beta == 0.0f)
        return cpu.conv2d_grad(cpu.ctx, c.dt, gx, NULL, NULL, gy, NULL, w, &a) == 0 ? true : (cpu_failed(), false);
    std::vector<float> wf = widen(c.dt, w, nw, !c.exact), gf = widen(c.dt, gy, ny, !c.exact);
    int parts = det || a.groups != 1 || a.k < 3 ? 1 : 3;
    std::vector<std::vector<float>> part((size_t)parts, std::vector<float>(nx + 1));
    size_t crs = (size_t)(a.c * a.r * a.s);
    for (int p = 0; p < parts; p++) {
        int64_t k0 = a.k * p / parts, k1 = a.k * (p + 1) / parts;
        mp_conv_args s = a;
        s.k = k1 - k0;
        std::vector<float> gs((size_t)a.n * (size_t)s.k * ohw + 1);
        for (int64_t i = 0; i < a.n; i++)
            memcpy(&gs[(size_t)i * (size_t)s.k * ohw], &gf[((size_t)i * a.k + (size_t)k0) * ohw], sizeof(float) * (size_t)s.k * ohw);
        if (cpu.conv2d_grad(cpu.ctx, MP_F32, part[(size_t)p].data(), NULL, NULL, gs.data(), NULL, wf.data() + (size_t)k0 * crs,
                            &s) != 0)
            return cpu_failed(), false;
    }
    std::vector<float> sum(nx + 1, 0.0f);
    for (int q = 0; q < parts; q++) {
        const std::vector<float> &pp = part[(size_t)((q + calls) % parts)];
        for (size_t i = 0; i < nx; i++) sum[i] += pp[i];
    }
    blend(c.dt, gx, sum.data(), nx, alpha, beta);
    return true;
}

extern "C" {

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t cv,
                                                     const cudnnTensorDescriptor_t y, const int want, int *got,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf)
{
    return heuristics("cudnnGetConvolutionForwardAlgorithm_v7", 0, h, x, w, cv, y, want, got, perf);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t cv,
                                                          const cudnnTensorDescriptor_t dx, const int want, int *got,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf)
{
    return heuristics("cudnnGetConvolutionBackwardDataAlgorithm_v7", 1, h, dx, w, cv, dy, want, got, perf);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t dy,
                                                            const cudnnConvolutionDescriptor_t cv,
                                                            const cudnnFilterDescriptor_t dw, const int want, int *got,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perf)
{
    return heuristics("cudnnGetConvolutionBackwardFilterAlgorithm_v7", 2, h, x, dw, cv, dy, want, got, perf);
}

/* the three passes share their checks; which: 0 forward, 1 data, 2 filter */
static cudnnStatus_t run(const char *call, int pass, cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd,
                         const void *x, cudnnFilterDescriptor_t wd, const void *w, cudnnConvolutionDescriptor_t cv,
                         int id, void *ws, size_t ws_bytes, const void *beta, cudnnTensorDescriptor_t yd, const void *y,
                         void *out)
{
    if (!made(h)) return bad(CUDNN_STATUS_BAD_PARAM, call, "not a live handle");
    config_t c;
    cudnnStatus_t s = check(call, xd, wd, cv, yd, &c);
    bool det = true;
    if (s == CUDNN_STATUS_SUCCESS) s = algo_ok(call, pass, c, cv->math, id, ws, ws_bytes, &det);
    float fa = 0, fb = 0;
    if (s == CUDNN_STATUS_SUCCESS) s = scalars(call, alpha, beta, &fa, &fb);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    const size_t es = mp_dtype_size(c.dt);
    const size_t bx = es * (size_t)(c.a.n * c.a.c * c.a.h * c.a.w), bw = es * (size_t)(c.a.k * (c.a.c / c.a.groups) * c.a.r * c.a.s);
    const size_t by = es * (size_t)(c.a.n * c.a.k * c.a.oh * c.a.ow);
    const void *in1 = pass == 1 ? w : x, *in2 = pass == 0 ? w : y;
    size_t b1 = pass == 1 ? bw : bx, b2 = pass == 0 ? bw : by, bo = pass == 0 ? by : pass == 1 ? bx : bw;
    if (!in_device(in1, b1) || !in_device(in2, b2) || !in_device(out, bo))
        return bad(CUDNN_STATUS_BAD_PARAM, call, "an operand (%p %zu bytes, %p %zu bytes, %p %zu bytes) is not device "
                   "memory, or runs past its allocation", in1, b1, in2, b2, out, bo);
    calls++;
    /* queued, or a graph node while the stream captures (emu_runtime.cc) */
    bool queued = enqueue(h->stream, call, [=] {
        switch (pass) {
        case 0: return forward(c, x, w, out, fa, fb);
        case 1: return backward_data(c, w, y, out, fa, fb, det);
        default: return backward_filter(c, x, y, out, fa, fb, det);
        }
    });
    if (!queued && sticky_error() == cudaSuccess)
        return bad(CUDNN_STATUS_EXECUTION_FAILED, call, "its stream's capture was invalidated by an earlier call");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t xd, const void *x,
                                      const cudnnFilterDescriptor_t wd, const void *w,
                                      const cudnnConvolutionDescriptor_t cv, cudnnConvolutionFwdAlgo_t algo, void *ws,
                                      size_t ws_bytes, const void *beta, const cudnnTensorDescriptor_t yd, void *y)
{
    return run("cudnnConvolutionForward", 0, h, alpha, xd, x, wd, w, cv, (int)algo, ws, ws_bytes, beta, yd, NULL, y);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, const cudnnFilterDescriptor_t wd,
                                           const void *w, const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const cudnnConvolutionDescriptor_t cv, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t ws_bytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxd, void *dx)
{
    return run("cudnnConvolutionBackwardData", 1, h, alpha, dxd, NULL, wd, w, cv, (int)algo, ws, ws_bytes, beta, dyd, dy,
               dx);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t xd,
                                             const void *x, const cudnnTensorDescriptor_t dyd, const void *dy,
                                             const cudnnConvolutionDescriptor_t cv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *ws, size_t ws_bytes,
                                             const void *beta, const cudnnFilterDescriptor_t dwd, void *dw)
{
    return run("cudnnConvolutionBackwardFilter", 2, h, alpha, xd, x, dwd, NULL, cv, (int)algo, ws, ws_bytes, beta, dyd, dy,
               dw);
}

}  // extern "C"
