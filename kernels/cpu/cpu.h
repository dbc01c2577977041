/*
 * cpu.h: what the CPU kernel files share: moving blocks of any float dtype to
 * and from f32, so that every low-precision kernel widens, computes in f32 and
 * rounds once; and the per-file kernels that cpu_backend.c puts in the table.
 */
#ifndef MP_CPU_H
#define MP_CPU_H

#include "kernels/backend.h"
#include "kernels/block_cache.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_flush.h"
#include "kernels/cpu/cpu_fp8_cast.h"

/* The CPU backend's context (backend.h): its caching allocator, and scratch
 * space that kernels take their working memory from (grown on demand, kept
 * between calls, given back by release_cache). Slots 0-2: the GEMM's widening
 * buffers (slot 2 also the chunk sums of cpu_reduce's column sums); slot 3:
 * the row buffers of the row-wise kernels, the planes of pooling and batch
 * norm's widened channels, one per thread; slots 4-12: convolution's columns
 * and f32 operands (cpu_conv.c), or its oneDNN operands, blocked copies and
 * scratchpads (cpu_conv_dnnl.c). The FP8 GEMM (cpu_fp8_gemm.c) takes 0-8:
 * decoded chunks, chunk sums, its f32 C, widened operands, chunk scales.
 * flush: flush counting's switch and counts (cpu_flush.h), which cpu_store
 * adds to at every rounding to f16/bf16 while counting is on. */
#define CPU_SCRATCH_SLOTS 13
struct mp_kctx {
    mp_block_cache cache;
    void *scratch[CPU_SCRATCH_SLOTS];
    size_t scratch_cap[CPU_SCRATCH_SLOTS];
    struct cpu_dnnl *dnnl;   /* oneDNN's engine, matmul and convolution plans (cpu_dnnl.h), made on first use */
    /* GELU of every f16/bf16 value, [bf16][tanh form] (cpu_elementwise.c):
     * the rounded output and the f32 slope, made on first use */
    uint16_t *gelu_out[2][2];
    float *gelu_slope[2][2];
    cpu_flush flush;
};

/* Hot loops are compiled for AVX-512, AVX2 and plain x86-64, and the loader
 * picks the best the processor has (GCC function multiversioning): one binary
 * is fast on this machine and still runs on an older one. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MP_SIMD __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define MP_SIMD
#endif

/* elements per block that a kernel widens to f32 at a time (fits in L1) */
#define MP_BLOCK 1024
/* Below this many elements a kernel runs on one thread: forking a team costs
 * more than it saves on small tensors. (With one thread pool, 2^16 ran the GPT
 * and MLP steps no faster than 2^18.) */
#define MP_PAR_MIN ((int64_t)1 << 18)
/* The same for the memory passes that mixed precision adds around the GEMMs
 * (f16/bf16 <-> f32 conversions, the fused f16/bf16 elementwise kernels, the
 * loss scaler's unscale, a cast gradient added into .grad): a few loads and
 * stores an element, each element on its own, so the split cannot change a
 * bit. The f16 MLP step's activations (32K-400K elements) ran on one thread
 * below 2^18 while the other waited; split from 2^15, its step took 2.30 ->
 * 2.10 ms on 2 threads (2 threads convert 64K f16 in 3.2 us, 1 in 5.4 us). */
#define MP_PAR_MIN_MEM ((int64_t)1 << 15)

/* The switches over mp_dtype here and in the kernel files have no default: a
 * new dtype is a compile error (-Wswitch) at each place that must learn it. */

/* n elements of float dtype dt at src+i into f32 (the integer dtypes are
 * widened by their callers, cpu_get_f64; here they would move as f32 words).
 * f64 narrows here only for kernels that cpu_supports declines in f64 (the
 * f64 kernels compute in double on their own paths, cpu_f64.h). */
static inline void cpu_load(mp_dtype dt, const void *src, int64_t i, float *dst, int64_t n)
{
    switch (dt) {
    case MP_F16: mp_cpu_f16_to_f32(dst, (const uint16_t *)src + i, n); break;
    case MP_BF16: mp_cpu_bf16_to_f32(dst, (const uint16_t *)src + i, n); break;
    case MP_F64: {
        const double *s = (const double *)src + i;
        for (int64_t j = 0; j < n; j++) dst[j] = (float)s[j];
        break;
    }
    case MP_E4M3:
    case MP_E5M2: cpu_fp8_decode(dt, (const uint8_t *)src + i, dst, n); break;
    case MP_F32:
    case MP_I32:
    case MP_U8: {
        const float *s = (const float *)src + i;
        for (int64_t j = 0; j < n; j++) dst[j] = s[j];
    }
    }
}

/* n f32 values rounded into float dtype dt at dst+i; while the context counts
 * flushes (cx->flush, cpu_flush.h), each rounding to f16/bf16 is counted (cx
 * may be NULL: a kernel called outside a backend, in tests, counts nothing) */
static inline void cpu_store(mp_kctx *cx, mp_dtype dt, void *dst, int64_t i, const float *src, int64_t n)
{
    switch (dt) {
    case MP_F16:
        mp_cpu_f32_to_f16((uint16_t *)dst + i, src, n);
        if (cx && cx->flush.on) cpu_flush_count(&cx->flush, dt, src, (uint16_t *)dst + i, n);
        break;
    case MP_BF16:
        mp_cpu_f32_to_bf16((uint16_t *)dst + i, src, n);
        if (cx && cx->flush.on) cpu_flush_count(&cx->flush, dt, src, (uint16_t *)dst + i, n);
        break;
    case MP_F64: {
        double *d = (double *)dst + i;
        for (int64_t j = 0; j < n; j++) d[j] = src[j];
        break;
    }
    case MP_E4M3:   /* not saturating, as PyTorch's .to(); casts choose (cpu_cast) */
    case MP_E5M2: cpu_fp8_encode(dt, (uint8_t *)dst + i, src, n, 0); break;
    case MP_F32:
    case MP_I32:
    case MP_U8: {
        float *d = (float *)dst + i;
        for (int64_t j = 0; j < n; j++) d[j] = src[j];
    }
    }
}

/* one element of any dtype as a double (slow paths: strided, integer, comparisons) */
static inline double cpu_get_f64(mp_dtype dt, const void *p, int64_t i)
{
    float f;
    switch (dt) {
    case MP_F32: return ((const float *)p)[i];
    case MP_F64: return ((const double *)p)[i];
    case MP_I32: return ((const int32_t *)p)[i];
    case MP_U8: return ((const uint8_t *)p)[i];
    case MP_F16:
    case MP_BF16:
    case MP_E4M3:
    case MP_E5M2: cpu_load(dt, p, i, &f, 1); return f;
    }
    return 0;   /* not reached: every dtype returns above */
}

/* nbytes of the context's scratch slot (64-byte aligned), or NULL */
void *cpu_scratch(mp_kctx *cx, int slot, size_t nbytes);
size_t cpu_scratch_bytes(mp_kctx *cx);
float *cpu_scratch_f32(mp_kctx *cx, int slot, mp_dtype dt, const void *src, int64_t n);
void cpu_store_f32(mp_kctx *cx, mp_dtype dt, void *dst, const float *src, int64_t n);

/* the entries each kernel file provides, declared by their types
 * (mp_be_<entry>_fn): the signatures are written once, in kernels/backend.h */
mp_be_cast_fn cpu_cast;
mp_be_fill_fn cpu_fill;
mp_be_arange_fn cpu_arange;
mp_be_rand_uniform_fn cpu_rand_uniform;
mp_be_rand_normal_fn cpu_rand_normal;
mp_be_binary_fn cpu_binary;
mp_be_unary_fn cpu_unary;
mp_be_reduce_fn cpu_reduce;
mp_be_gemm_bias_fn cpu_gemm_bias;
int cpu_gemm_dnnl(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                  const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c, int64_t sc);
int cpu_dnnl_enable(int on);   /* 0: every oneDNN path declines (tests); returns the previous setting */
int cpu_gemm_dnnl_has_bf16(void);   /* oneDNN has bf16 GEMM kernels on this processor (AVX512-core) */
int cpu_gemm_widens(mp_dtype dt);   /* cpu_gemm widens dt's operands whole: gemm_wide takes dt */
int cpu_gemm_dnnl_f32out(mp_kctx *cx, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                         const void *a, int64_t sa, const void *b, int64_t sb, float beta, float *c, int64_t sc);
mp_be_gemm_fn cpu_gemm;
mp_be_gemm_wide_fn cpu_gemm_wide;
mp_be_add_widened_fn cpu_add_widened;
mp_be_permute_fn cpu_permute;
mp_be_gather_fn cpu_gather;
mp_be_scatter_add_fn cpu_scatter_add;
mp_be_narrow_fn cpu_narrow;

mp_be_unary_grad_fn cpu_unary_grad;
/* cpu_elementwise_lowp.c: the cheap bf16/f16 ops fused in AVX-512 registers;
 * 1 when done, 0 when declined (the caller's general path then does the op) */
int cpu_unary_lowp(mp_kctx *cx, mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p);
int cpu_unary_grad_lowp(mp_kctx *cx, mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x,
                        int64_t n, double p);
int cpu_binary_lowp(mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b,
                    const mp_bcast *bc0);
/* out = a + b (b: a run, ib 1, or one value, ib 0) on the calling thread, the
 * bits of cpu_binary's add (cpu_elementwise.c); the fused bf16/f16 form of it
 * (1 when done, as above) */
void cpu_add_serial(mp_kctx *cx, mp_dtype dt, void *out, const void *a, const void *b, int64_t ib, int64_t n);
int cpu_lowp_add_serial(mp_kctx *cx, mp_dtype dt, void *out, const void *a, const void *b, int64_t ib, int64_t n);
/* GELU of bf16/f16 through gelu_tables' lookups (table: 65537 entries, the
 * last a pad for the 32-bit gather); 1 when done, as above */
int cpu_lowp_gelu(mp_kctx *cx, mp_dtype dt, uint16_t *out, const uint16_t *a, int64_t n, const uint16_t *table);
int cpu_lowp_gelu_grad(mp_kctx *cx, mp_dtype dt, uint16_t *gin, const uint16_t *gout, const uint16_t *x, int64_t n,
                       const float *slope);
/* 1 where the fused 16-bit kernels run for dt: AVX-512BW (and its f16
 * conversions for f16), flush counting off, not switched off */
int cpu_lowp_usable(mp_kctx *cx, mp_dtype dt);
/* batch norm's passes over a piece of n f16/bf16 values widened in registers
 * (cpu_batch_norm_lowp.c): the sums of cpu_batch_norm.c's lanes (x; (x - m)^2;
 * g and g (x - m), added into *sg and *sgd), y = relu(x a + b + z) and
 * gx = a g + b + k (x - m) rounded into the dtype; cpu_lowp_bn gives the
 * dtype's, or NULL where cpu_lowp_usable does not hold */
typedef struct {
    double (*sum)(const uint16_t *x, int64_t n);
    double (*sumsq_dev)(const uint16_t *x, int64_t n, float m);
    void (*sum_dot_dev)(const uint16_t *g, const uint16_t *x, int64_t n, float m, double *sg, double *sgd);
    /* z and the ReLU optional (NULL, 0); each step rounded as the separate kernels round it */
    void (*affine_act)(uint16_t *y, const uint16_t *x, const uint16_t *z, int64_t n, float a, float b, int relu);
    void (*grad)(uint16_t *gx, const uint16_t *g, const uint16_t *x, int64_t n, float a, float b, float k, float m);
} cpu_bn_lowp;
const cpu_bn_lowp *cpu_lowp_bn(mp_kctx *cx, mp_dtype dt);
int cpu_lowp_fused_enable(int on);   /* 0: every fused path declines (tests); returns the previous setting */
mp_be_clamp_fn cpu_clamp;
mp_be_where_fn cpu_where;
mp_be_narrow_put_fn cpu_narrow_put;
mp_be_narrow_pad_fn cpu_narrow_pad;
mp_be_binary_mixed_fn cpu_binary_mixed;   /* cpu_elementwise_lowp.c */
mp_be_put_along_fn cpu_put_along;
mp_be_scan_fn cpu_scan;
mp_be_softmax_fn cpu_softmax;
mp_be_softmax_grad_fn cpu_softmax_grad;
mp_be_cross_entropy_fn cpu_cross_entropy;
mp_be_cross_entropy_grad_fn cpu_cross_entropy_grad;
mp_be_layer_norm_fn cpu_layer_norm;
mp_be_layer_norm_grad_fn cpu_layer_norm_grad;

mp_be_conv2d_fn cpu_conv2d;
mp_be_conv2d_grad_fn cpu_conv2d_grad;
mp_be_max_pool2d_fn cpu_max_pool2d;
mp_be_max_pool2d_grad_fn cpu_max_pool2d_grad;
mp_be_avg_pool2d_fn cpu_avg_pool2d;
mp_be_avg_pool2d_grad_fn cpu_avg_pool2d_grad;
mp_be_batch_norm_fn cpu_batch_norm;
mp_be_batch_norm_grad_fn cpu_batch_norm_grad;
mp_be_batch_norm_act_fn cpu_batch_norm_act;
int cpu_batch_norm_wide_enable(int on);   /* 0: f16/bf16 channels widened blockwise, as before (tests) */
int cpu_pool_avx512_enable(int on);        /* 0: max pooling's 2 x 2 rows without the AVX-512 form (tests) */

mp_be_attention_fn cpu_attention;
mp_be_attention_grad_fn cpu_attention_grad;
mp_be_lstm_cell_fn cpu_lstm_cell;               /* cpu_rnn.c */
mp_be_lstm_cell_grad_fn cpu_lstm_cell_grad;
mp_be_gru_cell_fn cpu_gru_cell;
mp_be_gru_cell_grad_fn cpu_gru_cell_grad;

mp_be_topk_fn cpu_topk;

mp_be_optim_count_fn cpu_optim_count;
mp_be_optim_step_fn cpu_optim_step;

mp_be_unscale_fn cpu_unscale;
mp_be_scale_loss_fn cpu_scale_loss;
mp_be_scale_rule_fn cpu_scale_rule;

#endif
