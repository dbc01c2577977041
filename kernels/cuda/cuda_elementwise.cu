/*
 * cuda_elementwise.cu: binary ops with broadcasting, unary maths and their
 * gradients, and where, on the GPU: the CUDA twins of kernels/cpu/cpu_elementwise.c.
 *
 * Every kernel is one thread per output element over a grid-stride loop. Float
 * dtypes widen to f32 (mp_ld), compute with the same f32 operations in the same
 * order as the CPU, and round once (mp_st, tallied for flush counting).
 *
 * Contiguous float runs take a 128-bit path: a thread moves 16 bytes of each
 * array at a time (4 f32 or 8 f16/bf16) and the first threads of the grid take
 * the tail that is not a whole vector. It is taken when every pointer it moves
 * this way is 16-byte aligned: unary, unary_grad, where, and a binary op whose
 * broadcast coalesces to one dim with each input's stride 1 or 0 (a scalar).
 * Each element goes through the same f32 function as on the one-element path,
 * so the two give the same bits. The backend is compiled with -fmad=false
 * (Makefile): a sum the CPU writes as `a + b * c` rounds twice here too, never
 * fused into one FMA (some are also written with __fadd_rn/__fsub_rn, the
 * intrinsics nvcc never fuses). Integer dtypes follow the CPU exactly:
 * computed in 64 bits and wrapped; comparisons of any dtype write u8 0/1.
 *
 * Broadcasting: the mp_bcast is first coalesced on the host as the CPU does
 * (fewer dims, fewer divisions), then passed by value to the kernel, which maps
 * the output index to an offset in each input, in 32-bit arithmetic wherever
 * the elements and offsets fit (bcast_narrow), in 64-bit otherwise.
 */
#include "kernels/cuda/cuda.h"
#include "kernels/int_rules.h"

/* ---- broadcasting ---- */

/* the offsets in a and b of output element i (row-major over bc.shape), in
 * index type I: the division and remainder per dim are the cost of a broadcast,
 * and 32-bit ones take a fraction of the instructions of 64-bit ones */
template <class I>
static __device__ __forceinline__ void bcast_offsets_in(const mp_bcast &bc, I i, int64_t *oa, int64_t *ob)
{
    if (bc.ndim == 1) { *oa = (int64_t)(i * (I)bc.sa[0]), *ob = (int64_t)(i * (I)bc.sb[0]); return; }
    I a = 0, b = 0;
#pragma unroll
    for (int d = MP_MAXDIM - 1; d >= 0; d--) {
        if (d >= bc.ndim) continue;
        I k = i % (I)bc.shape[d];
        i /= (I)bc.shape[d];
        a += k * (I)bc.sa[d], b += k * (I)bc.sb[d];
    }
    *oa = (int64_t)a, *ob = (int64_t)b;
}

/* narrow: every index and offset of the broadcast fits 32 bits (bcast_narrow) */
static __device__ __forceinline__ void bcast_offsets(const mp_bcast &bc, int64_t i, bool narrow, int64_t *oa,
                                                     int64_t *ob)
{
    if (narrow) bcast_offsets_in<uint32_t>(bc, (uint32_t)i, oa, ob);
    else bcast_offsets_in<int64_t>(bc, i, oa, ob);
}

/* whether the n elements of a coalesced broadcast and every offset into a and b
 * fit 32 unsigned bits (nearly every tensor; strides are never negative here,
 * checked anyway) */
static bool bcast_narrow(const mp_bcast &bc, int64_t n)
{
    if (n > (int64_t)UINT32_MAX) return false;
    int64_t ma = 0, mb = 0;
    for (int d = 0; d < bc.ndim; d++) {
        if (bc.sa[d] < 0 || bc.sb[d] < 0 || bc.shape[d] > (int64_t)UINT32_MAX) return false;
        if (bc.shape[d] > 0) ma += (bc.shape[d] - 1) * bc.sa[d], mb += (bc.shape[d] - 1) * bc.sb[d];
        if (ma > (int64_t)UINT32_MAX || mb > (int64_t)UINT32_MAX) return false;
    }
    return true;
}

/* ---- binary ---- */

static __device__ __forceinline__ float bin_f(mp_binop op, float x, float y)
{
    switch (op) {
    case MP_ADD: return x + y;
    case MP_SUB: return x - y;
    case MP_MUL: return x * y;
    case MP_DIV: return x / y;
    case MP_POWT: return powf(x, y);
    case MP_GT: case MP_LT: case MP_GE: case MP_LE: case MP_EQ: case MP_NE: break;   /* comparisons: cmp() */
    }
    return 0.0f;
}

template <typename T>
static __device__ __forceinline__ uint8_t cmp(mp_binop op, T x, T y)
{
    switch (op) {
    case MP_GT: return x > y;
    case MP_LT: return x < y;
    case MP_GE: return x >= y;
    case MP_LE: return x <= y;
    case MP_EQ: return x == y;
    case MP_NE: return x != y;
    case MP_ADD: case MP_SUB: case MP_MUL: case MP_DIV: case MP_POWT: break;   /* arithmetic: bin_f() */
    }
    return 0;
}

/* an integer element, exactly (the CPU compares in double, also exact) */
static __device__ __forceinline__ int64_t ld_int(mp_dtype dt, const void *p, int64_t i)
{
    return dt == MP_I32 ? (int64_t)((const int32_t *)p)[i] : (int64_t)((const uint8_t *)p)[i];
}

static __global__ void binary_float_k(mp_binop op, mp_dtype dt, void *out, const void *a, const void *b,
                                      mp_bcast bc, bool narrow, int64_t n, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) {
        int64_t oa, ob;
        bcast_offsets(bc, i, narrow, &oa, &ob);
        mp_stc(dt, out, i, bin_f(op, mp_ld(dt, a, oa), mp_ld(dt, b, ob)), t);
    }
    t.commit();
}

/* out = a OP b over n contiguous elements, sa/sb: 1 (contiguous) or 0 (a scalar
 * at a[0]); the 128-bit path (out and each contiguous input 16-byte aligned) */
template <class T>
static __global__ void binary_vec_k(mp_binop op, void *out, const void *a, int sa, const void *b, int sb,
                                    int64_t n, unsigned long long *fc)
{
    constexpr int G = 16 / mp_ty<T>::S;
    mp_tally t(fc);
    const float a0 = sa ? 0.0f : mp_get<T>(a, 0), b0 = sb ? 0.0f : mp_get<T>(b, 0);
    const int64_t ng = n / G;
    MP_FOR(g, ng) {
        float x[G], y[G];
        if (sa) mp_ldv<T, G>((const char *)a + g * 16, x);
        else for (int k = 0; k < G; k++) x[k] = a0;
        if (sb) mp_ldv<T, G>((const char *)b + g * 16, y);
        else for (int k = 0; k < G; k++) y[k] = b0;
#pragma unroll
        for (int k = 0; k < G; k++) x[k] = bin_f(op, x[k], y[k]);
        mp_stv<T, G>((char *)out + g * 16, x, t);
    }
    const int64_t i = ng * G + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) mp_put<T>(out, i, bin_f(op, sa ? mp_get<T>(a, i) : a0, sb ? mp_get<T>(b, i) : b0), t);
    t.commit();
}

static __global__ void binary_int_k(mp_binop op, mp_dtype dt, void *out, const void *a, const void *b,
                                    mp_bcast bc, bool narrow, int64_t n)
{
    MP_FOR(i, n) {
        int64_t oa, ob;
        bcast_offsets(bc, i, narrow, &oa, &ob);
        int64_t r = mp_bin_int(op, ld_int(dt, a, oa), ld_int(dt, b, ob));
        if (dt == MP_I32) ((int32_t *)out)[i] = (int32_t)(uint32_t)r;
        else ((uint8_t *)out)[i] = (uint8_t)r;
    }
}

static __global__ void compare_k(mp_binop op, mp_dtype dt, uint8_t *out, const void *a, const void *b,
                                 mp_bcast bc, bool narrow, int64_t n)
{
    bool ints = dt == MP_I32 || dt == MP_U8;
    MP_FOR(i, n) {
        int64_t oa, ob;
        bcast_offsets(bc, i, narrow, &oa, &ob);
        out[i] = ints ? cmp(op, ld_int(dt, a, oa), ld_int(dt, b, ob)) : cmp(op, mp_ld(dt, a, oa), mp_ld(dt, b, ob));
    }
}

void mp_cuda_binary(mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b, const mp_bcast *bc0)
{
    mp_bcast bc;
    int nd = mp_bcast_coalesce(bc0, &bc);
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= bc.shape[d];
    if (n <= 0) return;
    unsigned blocks = mp_blocks(n);
    const bool narrow = bcast_narrow(bc, n);
    if (MP_IS_CMP(op)) {
        MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, compare_k, op, dt, (uint8_t *)out, a, b, bc, narrow, n);
        MP_LAUNCHED("binary (compare)");
    } else if (dt == MP_I32 || dt == MP_U8) {
        MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, binary_int_k, op, dt, out, a, b, bc, narrow, n);
        MP_LAUNCHED("binary (integer)");
    } else if (nd == 1 && (bc.sa[0] == 0 || bc.sa[0] == 1) && (bc.sb[0] == 0 || bc.sb[0] == 1) && mp_al16(out) &&
               (bc.sa[0] == 0 || mp_al16(a)) && (bc.sb[0] == 0 || mp_al16(b))) {
        const int sa = (int)bc.sa[0], sb = (int)bc.sb[0];
        const int64_t g = n / (16 / (int64_t)mp_dtype_size(dt));
        MP_BY_FLOAT(dt, T, MP_LAUNCH(mp_blocks(g), MP_THREADS, 0, cx->stream, binary_vec_k<T>, op, out, a, sa, b, sb, n,
                                     cx->flush));
        MP_LAUNCHED("binary");
    } else {
        MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, binary_float_k, op, dt, out, a, b, bc, narrow, n, cx->flush);
        MP_LAUNCHED("binary");
    }
}

/* ---- unary ---- */

/* GELU's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
/* 1 / (1 + e^-x), or e^x / (1 + e^x) for x < 0: e <= 1 keeps it within 2 ulp
 * (the CPU's formula, kernels/cpu/cpu_elementwise.c) */
static __device__ __forceinline__ float stable_sigmoid(float x)
{
    float t = expf(-fabsf(x));
    return (x < 0.0f ? t : 1.0f) / (1.0f + t);
}

static __device__ __forceinline__ float gelu_tanh_arg(float v)
{
    return 0.79788456080286536f * __fadd_rn(v, 0.044715f * v * v * v);
}

/* op(x); erf_form selects GELU's exact form (the CPU's p == 0 in double) */
static __device__ float un_f(mp_unop op, float x, float p, int erf_form)
{
    switch (op) {
    case MP_NEG: return -x;
    case MP_ABS: return fabsf(x);
    case MP_EXP: return expf(x);
    case MP_LOG: return logf(x);
    case MP_SQRT: return sqrtf(x);
    case MP_POW: return p == 2.0f ? x * x : powf(x, p);
    case MP_MULS: return x * p;
    case MP_ADDS: return x + p;
    case MP_RSUBS: return p - x;
    case MP_DIVS: return x / p;
    case MP_RDIVS: return p / x;
    case MP_RELU: return x < 0.0f ? 0.0f : x;
    case MP_TANH: return tanhf(x);
    case MP_SIGMOID: return stable_sigmoid(x);
    case MP_GELU:
        if (erf_form) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
        return 0.5f * x * (1.0f + tanhf(gelu_tanh_arg(x)));
    case MP_DROPMASK: return x >= p ? 1.0f / (1.0f - p) : 0.0f;
    case MP_SILU: {   /* x sigmoid(x), in the CPU's order of roundings */
        float t = expf(-fabsf(x));
        return x * (x < 0.0f ? t : 1.0f) / (1.0f + t);
    }
    case MP_SIN: return sinf(x);
    case MP_COS: return cosf(x);
    }
    return 0.0f;   /* every code returned above: for compilers that do not see it */
}

static __global__ void unary_float_k(mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, float p,
                                     int erf_form, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) mp_stc(dt, out, i, un_f(op, mp_ld(dt, a, i), p, erf_form), t);
    t.commit();
}

/* the 128-bit path: out and a 16-byte aligned */
template <class T>
static __global__ void unary_vec_k(mp_unop op, void *out, const void *a, int64_t n, float p, int erf_form,
                                   unsigned long long *fc)
{
    constexpr int G = 16 / mp_ty<T>::S;
    mp_tally t(fc);
    const int64_t ng = n / G;
    MP_FOR(g, ng) {
        float x[G];
        mp_ldv<T, G>((const char *)a + g * 16, x);
#pragma unroll
        for (int k = 0; k < G; k++) x[k] = un_f(op, x[k], p, erf_form);
        mp_stv<T, G>((char *)out + g * 16, x, t);
    }
    const int64_t i = ng * G + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) mp_put<T>(out, i, un_f(op, mp_get<T>(a, i), p, erf_form), t);
    t.commit();
}

static __global__ void unary_int_k(mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, int64_t p)
{
    MP_FOR(i, n) {
        if (dt == MP_I32) ((int32_t *)out)[i] = (int32_t)(uint32_t)mp_un_int(op, ((const int32_t *)a)[i], p);
        else ((uint8_t *)out)[i] = (uint8_t)mp_un_int(op, ((const uint8_t *)a)[i], p);
    }
}

void mp_cuda_unary(mp_kctx *cx, mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p)
{
    if (n <= 0) return;
    if (dt == MP_I32 || dt == MP_U8) {
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, unary_int_k, op, dt, out, a, n, (int64_t)p);
        MP_LAUNCHED("unary (integer)");
    } else if (mp_al16(out) && mp_al16(a)) {
        const int64_t g = n / (16 / (int64_t)mp_dtype_size(dt));
        MP_BY_FLOAT(dt, T, MP_LAUNCH(mp_blocks(g), MP_THREADS, 0, cx->stream, unary_vec_k<T>, op, out, a, n, (float)p,
                                     p == 0, cx->flush));
        MP_LAUNCHED("unary");
    } else {
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, unary_float_k, op, dt, out, a, n, (float)p, p == 0,
                  cx->flush);
        MP_LAUNCHED("unary");
    }
}

/* ---- unary gradients ---- */

/* GELU's derivative, exact form: Phi(x) + x phi(x) */
static __device__ __forceinline__ float gelu_erf_grad(float v)
{
    float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
    return __fadd_rn(cdf, v * pdf);
}

/* GELU's derivative, tanh approximation */
static __device__ __forceinline__ float gelu_tanh_grad(float v)
{
    float k = 0.79788456080286536f, t = tanhf(gelu_tanh_arg(v));
    float du = __fadd_rn(1.0f, 3.0f * 0.044715f * v * v);
    return __fadd_rn(0.5f * (1.0f + t), 0.5f * v * __fsub_rn(1.0f, t * t) * k * du);
}

/* gi = go * op'(x), with the forward output y where that is cheaper */
static __device__ float grad_f(mp_unop op, float go, float x, float y, float p, int erf_form)
{
    switch (op) {
    case MP_NEG: return -go;
    case MP_ABS: return x > 0 ? go : x < 0 ? -go : 0.0f;
    case MP_EXP: return go * y;
    case MP_LOG: return go / x;
    case MP_SQRT: return go / (2.0f * y);
    case MP_POW:
        if (p == 2.0f) return go * 2.0f * x;
        return p == 0.0f ? 0.0f : go * p * powf(x, p - 1.0f);
    case MP_MULS: return go * p;
    case MP_ADDS: return go;
    case MP_RSUBS: return -go;
    case MP_DIVS: return go / p;
    case MP_RDIVS: return -go * y / x;
    case MP_RELU: return x > 0.0f ? go : 0.0f;
    case MP_TANH: return go * __fsub_rn(1.0f, y * y);
    case MP_SIGMOID: return go * y * (1.0f - y);
    case MP_GELU: return go * (erf_form ? gelu_erf_grad(x) : gelu_tanh_grad(x));
    case MP_SILU: {   /* s (1 + x (1 - s)), s = sigmoid(x) */
        float s = stable_sigmoid(x);
        return go * s * (1.0f + x * (1.0f - s));
    }
    case MP_DROPMASK: return 0.0f;   /* a mask: constant in x */
    case MP_SIN: return go * cosf(x);
    case MP_COS: return -go * sinf(x);
    }
    return 0.0f;   /* every code returned above: for compilers that do not see it */
}

/* x or y may be NULL when the op does not need it */
static __global__ void unary_grad_k(mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x,
                                    const void *y, int64_t n, float p, int erf_form, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) {
        float xv = x ? mp_ld(dt, x, i) : 0.0f, yv = y ? mp_ld(dt, y, i) : 0.0f;
        mp_stc(dt, gin, i, grad_f(op, mp_ld(dt, gout, i), xv, yv, p, erf_form), t);
    }
    t.commit();
}

/* the 128-bit path: gin, gout and the x, y given 16-byte aligned */
template <class T>
static __global__ void unary_grad_vec_k(mp_unop op, void *gin, const void *gout, const void *x, const void *y,
                                        int64_t n, float p, int erf_form, unsigned long long *fc)
{
    constexpr int G = 16 / mp_ty<T>::S;
    mp_tally t(fc);
    const int64_t ng = n / G;
    MP_FOR(g, ng) {
        float go[G], xv[G], yv[G];
        mp_ldv<T, G>((const char *)gout + g * 16, go);
        if (x) mp_ldv<T, G>((const char *)x + g * 16, xv);
        else for (int k = 0; k < G; k++) xv[k] = 0.0f;
        if (y) mp_ldv<T, G>((const char *)y + g * 16, yv);
        else for (int k = 0; k < G; k++) yv[k] = 0.0f;
#pragma unroll
        for (int k = 0; k < G; k++) go[k] = grad_f(op, go[k], xv[k], yv[k], p, erf_form);
        mp_stv<T, G>((char *)gin + g * 16, go, t);
    }
    const int64_t i = ng * G + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float xv = x ? mp_get<T>(x, i) : 0.0f, yv = y ? mp_get<T>(y, i) : 0.0f;
        mp_put<T>(gin, i, grad_f(op, mp_get<T>(gout, i), xv, yv, p, erf_form), t);
    }
    t.commit();
}

void mp_cuda_unary_grad(mp_kctx *cx, mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x, const void *y,
                        int64_t n, double p)
{
    if (n <= 0) return;
    if ((dt == MP_F32 || dt == MP_F16 || dt == MP_BF16) && mp_al16(gin) && mp_al16(gout) && (!x || mp_al16(x)) &&
        (!y || mp_al16(y))) {
        const int64_t g = n / (16 / (int64_t)mp_dtype_size(dt));
        MP_BY_FLOAT(dt, T, MP_LAUNCH(mp_blocks(g), MP_THREADS, 0, cx->stream, unary_grad_vec_k<T>, op, gin, gout, x, y,
                                     n, (float)p, p == 0, cx->flush));
    } else {
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, unary_grad_k, op, dt, gin, gout, x, y, n, (float)p, p == 0,
                  cx->flush);
    }
    MP_LAUNCHED("unary_grad");
}

/* ---- where ---- */

/* T: an unsigned integer of the dtype's size; the bytes are copied as they are */
template <typename T>
static __global__ void where_k(T *out, const uint8_t *cond, const T *a, const T *b, int64_t n)
{
    MP_FOR(i, n) out[i] = cond[i] ? a[i] : b[i];
}

/* the 128-bit path for elements of S bytes: 16 bytes of out, a and b and the
 * 16/S condition bytes that go with them (all four pointers 16-byte aligned) */
template <int S>
static __global__ void where_vec_k(void *out, const uint8_t *cond, const void *a, const void *b, int64_t n)
{
    constexpr int G = 16 / S;
    typedef typename mp_word<S>::W W;
    const int64_t ng = n / G;
    MP_FOR(g, ng) {
        uint32_t c[G], x[G], y[G];
        mp_ldbits<1, G>(cond + g * G, c);
        mp_ldbits<S, G>((const char *)a + g * 16, x);
        mp_ldbits<S, G>((const char *)b + g * 16, y);
#pragma unroll
        for (int k = 0; k < G; k++) x[k] = c[k] ? x[k] : y[k];
        mp_stbits<S, G>((char *)out + g * 16, x);
    }
    const int64_t i = ng * G + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ((W *)out)[i] = cond[i] ? ((const W *)a)[i] : ((const W *)b)[i];
}

void mp_cuda_where(mp_kctx *cx, mp_dtype dt, void *out, const uint8_t *cond, const void *a, const void *b, int64_t n)
{
    if (n <= 0) return;
    const size_t es = mp_dtype_size(dt);
    if (mp_al16(out) && mp_al16(cond) && mp_al16(a) && mp_al16(b)) {
        const unsigned blocks = mp_blocks(n / (int64_t)(16 / es));
        if (es == 4) MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, where_vec_k<4>, out, cond, a, b, n);
        else if (es == 2) MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, where_vec_k<2>, out, cond, a, b, n);
        else MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, where_vec_k<1>, out, cond, a, b, n);
        MP_LAUNCHED("where");
        return;
    }
    unsigned blocks = mp_blocks(n);
#define WHERE(W) MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, where_k<W>, (W *)out, cond, (const W *)a, (const W *)b, n)
    switch (es) {
    case 4: WHERE(uint32_t); break;
    case 2: WHERE(uint16_t); break;
    default: WHERE(uint8_t); break;
    }
#undef WHERE
    MP_LAUNCHED("where");
}
