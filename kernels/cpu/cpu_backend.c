/*
 * cpu_backend.c: the CPU backend's table and its memory functions. Host memory
 * is 64-byte aligned so that SIMD loads never straddle cache lines, and comes
 * through the caching allocator (kernels/block_cache.h): the blocks a training
 * step frees serve the next step.
 */
#include <omp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <cblas.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_fp8.h"
#include "kernels/cpu/cpu_f64.h"
#include "kernels/block_cache.h"

/* One pool of threads: OpenMP's. The GEMMs run on oneDNN (cpu_gemm_dnnl.c),
 * which uses OpenMP too, and every kernel's regions fork on it; OpenBLAS, left
 * with attention's small blocks (called inside OpenMP regions) and the GEMMs
 * oneDNN declines, runs on its caller's thread. Two pools were the trouble
 * before: libgomp's idle workers spin after each region and took the cores that
 * OpenBLAS's threads needed (an MLP step of 8 ms took 132 ms with another
 * process busy), which is why OpenMP once ran on one thread. With one pool, two
 * OpenMP threads ran the GPT step in 33 ms against 49 with one, and the MLP step
 * in 0.93 ms against 1.53, another process busy or not. OMP_NUM_THREADS and
 * OPENBLAS_NUM_THREADS still decide when set. */
__attribute__((constructor)) static void cpu_threads_init(void)
{
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
}

/* The system's memory, 64-byte aligned. Large blocks are mapped and unmapped
 * directly: glibc keeps freed heap blocks, and after a large free it raises its
 * own mmap threshold so that later large blocks come from the heap too, where
 * a loop of changing sizes leaves gigabytes resident that the engine no longer
 * holds. munmap gives them back at once. */
#define MAP_FROM ((size_t)128 << 10)

static void *sys_alloc(size_t nbytes)
{
    void *p = NULL;
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded < nbytes) return NULL;
    if (rounded >= MAP_FROM) {
        p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    return posix_memalign(&p, 64, rounded) ? NULL : p;
}

static void sys_free(void *p, size_t nbytes)
{
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (!p) return;
    if (rounded >= MAP_FROM) munmap(p, rounded);
    else free(p);
}

/* The CPU backend's one context (cpu.h): the engine calls kernels from one
 * thread at a time, and a kernel's own OpenMP threads share what it took. */
static mp_kctx cpu_ctx = {.cache = {.sys_alloc = sys_alloc, .sys_free = sys_free}};

static void *cpu_alloc(mp_kctx *cx, size_t nbytes) { return mp_cache_alloc(&cx->cache, nbytes); }
static void cpu_free(mp_kctx *cx, void *p, size_t nbytes) { mp_cache_free(&cx->cache, p, nbytes); }
static size_t cpu_cached(mp_kctx *cx) { return cx->cache.cached; }
static void cpu_mark_cache(mp_kctx *cx) { mp_cache_mark(&cx->cache); }
static void cpu_release_cache(mp_kctx *cx)
{
    mp_cache_release(&cx->cache);
    for (int d = 0; d < 2; d++)   /* GELU's tables too: made again on next use */
        for (int f = 0; f < 2; f++) {
            free(cx->gelu_out[d][f]), free(cx->gelu_slope[d][f]);
            cx->gelu_out[d][f] = NULL, cx->gelu_slope[d][f] = NULL;
        }
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) {   /* scratch is kept between kernels: give it back too */
        sys_free(cx->scratch[i], cx->scratch_cap[i]);
        cx->scratch[i] = NULL, cx->scratch_cap[i] = 0;
    }
}

/* flush counting: the counts are the context's (cpu_flush.h) */
static void cpu_flush_slot(mp_kctx *cx, int slot) { cpu_flush_select(&cx->flush, slot); }
static void cpu_flush_read(mp_kctx *cx, int64_t (*counts)[3], int clear) { cpu_flush_take(&cx->flush, counts, clear); }

/* the CPU copies nothing to a host and never waits; it counts its system allocations */
static void cpu_counters(mp_kctx *cx, int64_t c[3])
{
    c[0] = 0, c[1] = 0, c[2] = cx->cache.sys_allocs;
}

static void cpu_zero(mp_kctx *cx, void *p, size_t nbytes) { memset(p, 0, nbytes); }
static void cpu_copy(mp_kctx *cx, void *dst, const void *src, size_t nbytes) { memcpy(dst, src, nbytes); }

void *cpu_scratch(mp_kctx *cx, int slot, size_t nbytes)
{
    if (nbytes > cx->scratch_cap[slot]) {
        sys_free(cx->scratch[slot], cx->scratch_cap[slot]);
        cx->scratch_cap[slot] = 0;
        cx->scratch[slot] = sys_alloc(nbytes);
        if (!cx->scratch[slot]) return NULL;
        cx->scratch_cap[slot] = nbytes;
    }
    return cx->scratch[slot];
}

/* src (dtype dt, n values) as f32: src itself for f32, else widened into
 * scratch slot `slot` (threaded past MP_PAR_MIN); NULL when memory runs out.
 * The convolution paths (im2col and oneDNN) share it. */
float *cpu_scratch_f32(mp_kctx *cx, int slot, mp_dtype dt, const void *src, int64_t n)
{
    if (dt == MP_F32) return (float *)src;
    float *f = cpu_scratch(cx, slot, sizeof(float) * (size_t)(n ? n : 1));
    if (!f) return NULL;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) cpu_load(dt, src, i, f + i, n - i < MP_BLOCK ? n - i : MP_BLOCK);
    return f;
}

/* n f32 values rounded once into dst of dtype dt (flushes counted by cpu_store) */
void cpu_store_f32(mp_kctx *cx, mp_dtype dt, void *dst, const float *src, int64_t n)
{
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) cpu_store(cx, dt, dst, i, src + i, n - i < MP_BLOCK ? n - i : MP_BLOCK);
}

size_t cpu_scratch_bytes(mp_kctx *cx)
{
    size_t n = 0;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) n += cx->scratch_cap[i];
    return n;
}

mp_be_gather_along_fn cpu_gather_along;     /* cpu_gather.c */
mp_be_scatter_along_fn cpu_scatter_along;

const mp_backend mp_cpu_backend = {
    .name = "cpu",
    .ctx = &cpu_ctx,
    .supports = cpu_supports,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .cached = cpu_cached,
    .release_cache = cpu_release_cache,
    .mark_cache = cpu_mark_cache,
    .counters = cpu_counters,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .cast = cpu_cast,
    .fill = cpu_fill,
    .arange = cpu_arange,
    .rand_uniform = cpu_rand_uniform,
    .rand_normal = cpu_rand_normal,
    .binary = cpu_binary,
    .unary = cpu_unary,
    .unary_grad = cpu_unary_grad,
    .clamp = cpu_clamp,
    .reduce = cpu_reduce,
    .put_along = cpu_put_along,
    .scan = cpu_scan,
    .where = cpu_where,
    .optim_count = cpu_optim_count,
    .optim_step = cpu_optim_step,
    .scale_loss = cpu_scale_loss,
    .unscale = cpu_unscale,
    .scale_rule = cpu_scale_rule,
    .flush_slot = cpu_flush_slot,
    .flush_read = cpu_flush_read,
    .softmax = cpu_softmax,
    .softmax_grad = cpu_softmax_grad,
    .cross_entropy = cpu_cross_entropy,
    .cross_entropy_grad = cpu_cross_entropy_grad,
    .layer_norm = cpu_layer_norm,
    .layer_norm_grad = cpu_layer_norm_grad,
    .gemm = cpu_gemm,
    .gemm_wide = cpu_gemm_wide,
    .add_widened = cpu_add_widened,
    .gemm_bias = cpu_gemm_bias,
    .fp8_quantize = cpu_fp8_quantize_entry,
    .fp8_gemm = cpu_fp8_gemm_entry,
    .attention = cpu_attention,
    .conv2d = cpu_conv2d,
    .conv2d_grad = cpu_conv2d_grad,
    .max_pool2d = cpu_max_pool2d,
    .max_pool2d_grad = cpu_max_pool2d_grad,
    .avg_pool2d = cpu_avg_pool2d,
    .avg_pool2d_grad = cpu_avg_pool2d_grad,
    .batch_norm = cpu_batch_norm,
    .batch_norm_grad = cpu_batch_norm_grad,
    .batch_norm_act = cpu_batch_norm_act,
    .topk = cpu_topk,
    .attention_grad = cpu_attention_grad,
    .lstm_cell = cpu_lstm_cell,
    .lstm_cell_grad = cpu_lstm_cell_grad,
    .gru_cell = cpu_gru_cell,
    .gru_cell_grad = cpu_gru_cell_grad,
    .permute = cpu_permute,
    .narrow = cpu_narrow,
    .narrow_put = cpu_narrow_put,
    .narrow_pad = cpu_narrow_pad,
    .binary_mixed = cpu_binary_mixed,
    .gather = cpu_gather,
    .scatter_add = cpu_scatter_add,
    .gather_along = cpu_gather_along,
    .scatter_along = cpu_scatter_along,
};
