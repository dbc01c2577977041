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

/* The CPU backend's context (backend.h): its caching allocator, and scratch
 * space that kernels take their working memory from (grown on demand, kept
 * between calls, given back by release_cache). Slots 0-2: the GEMM's widening
 * buffers (slot 2 also the chunk sums of cpu_reduce's column sums); slot 3:
 * the row buffers of the row-wise kernels and the planes of pooling, one per
 * thread; slots 4-12: convolution's columns and f32 operands (cpu_conv.c). */
#define CPU_SCRATCH_SLOTS 13
struct mp_kctx {
    mp_block_cache cache;
    void *scratch[CPU_SCRATCH_SLOTS];
    size_t scratch_cap[CPU_SCRATCH_SLOTS];
    struct cpu_dnnl *dnnl;   /* oneDNN's engine and matmul plans (cpu_gemm_dnnl.c), made on first use */
    /* GELU of every f16/bf16 value, [bf16][tanh form] (cpu_elementwise.c):
     * the rounded output and the f32 slope, made on first use */
    uint16_t *gelu_out[2][2];
    float *gelu_slope[2][2];
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

/* n elements of float dtype dt at src+i into f32 */
static inline void cpu_load(mp_dtype dt, const void *src, int64_t i, float *dst, int64_t n)
{
    switch (dt) {
    case MP_F16: mp_cpu_f16_to_f32(dst, (const uint16_t *)src + i, n); break;
    case MP_BF16: mp_cpu_bf16_to_f32(dst, (const uint16_t *)src + i, n); break;
    default: {
        const float *s = (const float *)src + i;
        for (int64_t j = 0; j < n; j++) dst[j] = s[j];
    }
    }
}

/* counting what rounding to f16/bf16 loses (telemetry of the backward pass) */
extern int cpu_flush_counting;
void cpu_count_flush(mp_dtype dt, const float *src, const uint16_t *dst, int64_t n);

static inline void cpu_store(mp_dtype dt, void *dst, int64_t i, const float *src, int64_t n)
{
    switch (dt) {
    case MP_F16:
        mp_cpu_f32_to_f16((uint16_t *)dst + i, src, n);
        if (cpu_flush_counting) cpu_count_flush(dt, src, (uint16_t *)dst + i, n);
        break;
    case MP_BF16:
        mp_cpu_f32_to_bf16((uint16_t *)dst + i, src, n);
        if (cpu_flush_counting) cpu_count_flush(dt, src, (uint16_t *)dst + i, n);
        break;
    default: {
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
    case MP_I32: return ((const int32_t *)p)[i];
    case MP_U8: return ((const uint8_t *)p)[i];
    default: cpu_load(dt, p, i, &f, 1); return f;
    }
}

/* nbytes of the context's scratch slot (64-byte aligned), or NULL */
void *cpu_scratch(mp_kctx *cx, int slot, size_t nbytes);
size_t cpu_scratch_bytes(mp_kctx *cx);

void cpu_cast(mp_kctx *cx, void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n);
void cpu_fill(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, double value);
void cpu_arange(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n);
void cpu_rand_uniform(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset);
void cpu_rand_normal(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset);
void cpu_binary(mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b, const mp_bcast *bc);
void cpu_unary(mp_kctx *cx, mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p);
void cpu_reduce(mp_kctx *cx, mp_redop op, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner);
int cpu_gemm_bias(mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                  const void *bias, void *c);
int cpu_gemm_dnnl(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                  const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c, int64_t sc);
int cpu_dnnl_enable(int on);   /* 0: every oneDNN path declines (tests); returns the previous setting */
int cpu_gemm_dnnl_f32out(mp_kctx *cx, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                         const void *a, int64_t sa, const void *b, int64_t sb, float beta, float *c, int64_t sc);
int cpu_gemm(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
              float alpha, const void *a, int64_t sa, const void *b, int64_t sb,
              float beta, void *c, int64_t sc);
void cpu_permute(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int ndim, const int64_t *shape, const int *perm);
void cpu_gather(mp_kctx *cx, mp_dtype dt, void *out, const void *in, const int32_t *idx, int64_t nidx,
                int64_t outer, int64_t n, int64_t inner);
void cpu_scatter_add(mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx, int64_t nidx,
                     int64_t outer, int64_t n, int64_t inner);
void cpu_narrow(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,
                int64_t start, int64_t len, int64_t inner);

void cpu_unary_grad(mp_kctx *cx, mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x, const void *y,
                    int64_t n, double p);
void cpu_where(mp_kctx *cx, mp_dtype dt, void *out, const uint8_t *cond, const void *a, const void *b, int64_t n);
void cpu_narrow_put(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,
                    int64_t start, int64_t len, int64_t inner);
void cpu_put_along(mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx,
                   int64_t outer, int64_t n, int64_t inner);
int cpu_softmax(mp_kctx *cx, mp_dtype dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner, int log);
int cpu_softmax_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const void *y,
                      int64_t outer, int64_t n, int64_t inner, int log);
int cpu_cross_entropy(mp_kctx *cx, mp_dtype dt, float *loss, float *lse, const void *x, const int32_t *target,
                       int64_t rows, int64_t classes);
int cpu_cross_entropy_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *x, const float *lse,
                            const int32_t *target, const float *scale, int64_t rows, int64_t classes);
int cpu_layer_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                    const void *b, int64_t rows, int64_t n, float eps);
int cpu_layer_norm_grad(mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                         const float *mean, const float *rstd, const void *w, int64_t rows, int64_t n);

int cpu_conv2d(mp_kctx *cx, mp_dtype dt, void *y, const void *x, const void *w, const void *b, const mp_conv_args *a);
int cpu_conv2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, void *gw, float *gb, const void *gy, const void *x,
                    const void *w, const mp_conv_args *a);
int cpu_max_pool2d(mp_kctx *cx, mp_dtype dt, void *y, int32_t *idx, const void *x, const mp_pool_args *a);
int cpu_max_pool2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const int32_t *idx, const mp_pool_args *a);
int cpu_avg_pool2d(mp_kctx *cx, mp_dtype dt, void *y, const void *x, const mp_pool_args *a);
int cpu_avg_pool2d_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const mp_pool_args *a);
int cpu_batch_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,
                   float *running_var, const void *x, const float *w, const float *b, int64_t n, int64_t c,
                   int64_t hw, int training, float momentum, float eps);
int cpu_batch_norm_grad(mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                        const float *mean, const float *rstd, const float *w, int64_t n, int64_t c, int64_t hw,
                        int training);

int cpu_attention(mp_kctx *cx, mp_dtype dt, void *out, float *lse, const void *q, const void *k, const void *v,
                  const mp_attn_args *a);
int cpu_attention_grad(mp_kctx *cx, mp_dtype dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                       const void *k, const void *v, const void *out, const float *lse, const mp_attn_args *a);

int cpu_topk(mp_kctx *cx, mp_dtype dt, void *values, int32_t *idx, const void *x, int64_t rows, int64_t n, int64_t k,
             int largest);

void cpu_optim_count(mp_kctx *cx, int64_t *step, const int32_t *skip);
void cpu_optim_step(mp_kctx *cx, mp_optim_kind kind, float *p, const float *g, float *s1, float *s2, int64_t n,
                    const mp_optim_args *a, const int64_t *step, const int32_t *skip, void *lowp,
                    mp_dtype lowp_dt);

void cpu_flush_slot(mp_kctx *cx, int slot);
void cpu_flush_read(mp_kctx *cx, int64_t (*counts)[3], int clear);
void cpu_unscale(mp_kctx *cx, float *g, int64_t n, mp_scale_state *st, int slot, mp_grad_stats *tel, const int64_t *seg, int nseg);
void cpu_scale_loss(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t n, mp_scale_state *st, int check);
void cpu_scale_rule(mp_kctx *cx, mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg, float value);

#endif
