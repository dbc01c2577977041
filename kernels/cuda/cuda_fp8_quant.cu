/*
 * cuda_fp8_quant.cu: f32/f16/bf16 -> scaled FP8 codes on the device, the
 * CUDA side of kernels/cpu/cpu_fp8_quant.c with the same contract (the codes
 * from kernels/fp8.h's conversion, saturating; the scales from the same f32
 * divisions; the OCP MX rule), so both give the same bytes.
 *
 * One thread block per group for tiles (128 threads, one element each), 128
 * x 128 blocks (128 threads, one column of the block each) and MX blocks (32
 * threads): the group's amax by a shared-memory reduction, its scale, then
 * its codes, from one read of the group. The tensor granularity reads x twice
 * (amax_k, then quant_k) unless the caller gives the scale (delayed scaling:
 * one pass, the amax comes with the codes).
 *
 * Statistics (device words the caller reads when it wants them): st[0] the
 * amax's f32 bits (|x| bits order as the values do, and a NaN's bits are
 * above inf's, so an atomic max of bits is the amax, NaN when any x is NaN),
 * st[1] the saturated count, st[2] the flushed count, zeroed here first;
 * st[3] the two counts as f32 {saturated, flushed}, written by counts_k once
 * the group kernels are done (the engine copies them into a device tensor:
 * counts without a host wait).
 */
#include "kernels/cuda/cuda.h"
extern "C" {
#include "kernels/fp8_scaled.h"
}

struct q_stats {
    unsigned long long amax, sat, flushed;
    float counts[2];
};

/* st[3] from st[1] and st[2] (one thread, after the kernels that count) */
static __global__ void counts_k(q_stats *st)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        st->counts[0] = (float)st->sat, st->counts[1] = (float)st->flushed;
}

/* the multiplier that takes a group of amax a to the format's largest value (cpu_fp8_quant.c's scale_of) */
static __device__ __forceinline__ float scale_of(float a, float fmax)
{
    if (!(a > 0.0f) || !isfinite(a)) return 1.0f;
    const float s = fmax / a;
    return isfinite(s) ? s : 3.402823466e38f;
}

/* one element: its code, counted */
static __device__ __forceinline__ uint8_t quant1(float x, float s, mp_fp8_format fmt, float fmax, unsigned *sat,
                                                 unsigned *flu)
{
    const float v = x * s;
    const uint8_t c = mp_f32_to_fp8(v, fmt, 1);
    if (fabsf(v) > fmax) *sat += (mp_f32_to_fp8(v, fmt, 0) & 0x7f) == fmt.overflow;   /* rounds past it */
    *flu += x != 0.0f && isfinite(x) && (c & 0x7f) == 0;
    return c;
}

static __device__ __forceinline__ void commit(q_stats *st, unsigned amax_bits, unsigned sat, unsigned flu)
{
    if (amax_bits) atomicMax(&st->amax, (unsigned long long)amax_bits);
    if (sat) atomicAdd(&st->sat, (unsigned long long)sat);
    if (flu) atomicAdd(&st->flushed, (unsigned long long)flu);
}

static __global__ void amax_k(mp_dtype dt, const void *x, int64_t n, q_stats *st)
{
    unsigned m = 0;
    MP_FOR(i, n) {
        const unsigned b = __float_as_uint(fabsf(mp_ld(dt, x, i)));
        m = b > m ? b : m;
    }
    commit(st, m, 0, 0);
}

/* the tensor's codes with s = the given scale, or from the amax in st */
static __global__ void quant_k(mp_dtype dt, const void *x, int64_t n, const float *given, mp_fp8_format fmt, float fmax,
                               uint8_t *q, float *d, q_stats *st)
{
    const float s = given ? *given : scale_of(__uint_as_float((unsigned)st->amax), fmax);
    if (blockIdx.x == 0 && threadIdx.x == 0) d[0] = 1.0f / s;
    unsigned m = 0, sat = 0, flu = 0;
    MP_FOR(i, n) {
        const float v = mp_ld(dt, x, i);
        const unsigned b = __float_as_uint(fabsf(v));
        m = b > m ? b : m;
        q[i] = quant1(v, s, fmt, fmax, &sat, &flu);
    }
    commit(st, given ? m : 0, sat, flu);
}

/* the max of every thread's v over the block (blockDim.x a power of two, at most 128) */
static __device__ unsigned block_max(unsigned v, unsigned *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w && sh[threadIdx.x + w] > sh[threadIdx.x]) sh[threadIdx.x] = sh[threadIdx.x + w];
        __syncthreads();
    }
    const unsigned r = sh[0];
    __syncthreads();
    return r;
}

/* one group per block: rows r0 .. r0 + nr - 1 (nr: 1 or 128), columns j0 ..
 * j0 + blockDim.x - 1 of x {rows, k}; thread t owns column j0 + t */
static __global__ void group_k(mp_dtype dt, const void *x, int64_t rows, int64_t k, int g, mp_fp8_format fmt,
                               float fmax, int emax, uint8_t *q, void *scales, q_stats *st)
{
    __shared__ unsigned sh[128];
    const int64_t w = blockDim.x, nk = (k + w - 1) / w, gr = blockIdx.x / nk, gc = blockIdx.x % nk;
    const int64_t nr = g == MP_FP8_BLOCK ? MP_FP8_BLOCK_ROWS : 1, r0 = gr * nr, j = gc * w + threadIdx.x;
    const int64_t r1 = r0 + nr < rows ? r0 + nr : rows;
    unsigned m = 0;
    if (j < k)
        for (int64_t r = r0; r < r1; r++) {
            const unsigned b = __float_as_uint(fabsf(mp_ld(dt, x, r * k + j)));
            m = b > m ? b : m;
        }
    const float a = __uint_as_float(block_max(m, sh));
    float s;
    if (g == MP_FP8_MX) {
        uint8_t e8;
        int e = 0;
        if (!isfinite(a)) e8 = 0xff, s = 1.0f;
        else if (a == 0.0f) e8 = 127, s = 1.0f;
        else {
            frexpf(a, &e);
            e = e - 1 - emax;
            e = e < -127 ? -127 : e > 127 ? 127 : e;
            e8 = (uint8_t)(e + 127), s = ldexpf(1.0f, -e);
        }
        if (threadIdx.x == 0) ((uint8_t *)scales)[blockIdx.x] = e8;
    } else {
        s = scale_of(a, fmax);
        if (threadIdx.x == 0) ((float *)scales)[blockIdx.x] = 1.0f / s;
    }
    unsigned sat = 0, flu = 0;
    if (j < k)
        for (int64_t r = r0; r < r1; r++) q[r * k + j] = quant1(mp_ld(dt, x, r * k + j), s, fmt, fmax, &sat, &flu);
    commit(st, threadIdx.x == 0 ? __float_as_uint(a) : 0, sat, flu);
}

/* codes q {rows, k} and scales (kernels/fp8_scaled.h's layouts) of x on the
 * device; given_scale: a device f32 (tensor granularity only) or NULL;
 * st: four device words for the statistics (the head). 0, or -1 for a
 * granularity that does not exist. */
extern "C" int mp_cuda_fp8_quantize(mp_kctx *cx, mp_dtype dt, const void *x, int64_t rows, int64_t k,
                                    mp_fp8_format fmt, mp_fp8_gran g, const float *given_scale, uint8_t *q,
                                    void *scales, unsigned long long *st)
{
    q_stats *s = (q_stats *)st;
    MP_CUDA_CHECK(cudaMemsetAsync(st, 0, sizeof(q_stats), cx->stream), "fp8_quantize: memset");
    const int64_t n = rows * k;
    if (n <= 0) return 0;
    const float fmax = mp_fp8_to_f32(fmt.maxcode, fmt);
    int emax = 0;
    frexpf(fmax, &emax);
    emax -= 1;   /* 8 for e4m3, 15 for e5m2 */
    if (g == MP_FP8_TENSOR) {
        if (!given_scale) MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, amax_k, dt, x, n, s);
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, quant_k, dt, x, n, given_scale, fmt, fmax, q,
                  (float *)scales, s);
    } else {
        const int64_t w = g == MP_FP8_MX ? MP_FP8_MX_K : MP_FP8_TILE_K;
        const int64_t groups = mp_fp8_nscales(g, rows, k);
        if (groups > INT32_MAX) return -1;
        MP_LAUNCH((unsigned)groups, (unsigned)w, 0, cx->stream, group_k, dt, x, rows, k, (int)g, fmt, fmax, emax, q,
                  scales, s);
    }
    MP_LAUNCH(1, 1, 0, cx->stream, counts_k, s);
    MP_LAUNCHED("fp8_quantize");
    return 0;
}

/* the backend's fp8_quantize (kernels/backend.h) */
int mp_cuda_fp8_quantize_entry(mp_kctx *cx, mp_dtype dt, const void *x, int64_t rows, int64_t k, mp_dtype fmt, int g,
                               const float *given, uint8_t *q, void *scales, unsigned long long *st)
{
    return mp_cuda_fp8_quantize(cx, dt, x, rows, k, fmt == MP_E5M2 ? MP_FP8_E5M2 : MP_FP8_E4M3, (mp_fp8_gran)g, given,
                                q, scales, st);
}
