/*
 * cuda_backend.cu: the CUDA backend's table, its memory, its errors and what it
 * counts.
 *
 * This file is built into build/mp/cuda.so, which the engine loads at run time
 * (engine/device.c) and asks for the table through mp_cuda_backend_init. On a
 * machine without a driver or a GPU that returns NULL and the engine runs on the
 * CPU alone, so one build serves both kinds of machine.
 *
 * Memory comes from the caching allocator both backends share
 * (kernels/block_cache.h): freed blocks go to a free list per size class and
 * are reused by the next allocation of that class, since cudaMalloc and
 * cudaFree are slow and synchronise the device. Every kernel and copy runs on
 * one stream, so a block reused after a free is ordered after the kernels that
 * used it. When cudaMalloc fails the cache is released and the allocation tried
 * once more; the engine then reports "out of memory" (after a garbage
 * collection and its own retry).
 *
 * Nothing on the path of an op waits for the device. The host waits only in
 * to_host (the caller reads the bytes next), synchronize, flush_read's read
 * of its totals, the cache's release (cudaFree), and from_host when all
 * of its pinned staging buffers are still being copied from (see there). The
 * counters entry reports, since load, the copies to the host, those waits
 * (cudaFree counts as one: it synchronises) and the cudaMalloc calls.
 *
 * Errors: the first CUDA error since the engine last asked (sticky), or else a
 * bad index that check_indices found on the device (cuda_check.cu), once.
 *
 * While a graph is captured (cuda_graph.cu) blocks come from the graph's pool
 * and go back to it (mp_cuda_alloc, mp_cuda_free), the cache gives nothing
 * back to the system, and whatever would wait for the device or copy host
 * memory (to_host, from_host, synchronize, the queued reads, a wait) is
 * refused with the sticky error: the engine refuses those first, naming the
 * op (engine/capture.h); this catches any other path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/cuda.h"
#include "kernels/block_cache.h"

/* The device's context: the one instance of struct mp_kctx (cuda.h), the
 * backend object's state. sys_alloc and sys_free, called by the caching
 * allocator without a context, reach the counters through it. */
static mp_kctx ctx;

/* ---- what the backend counts (the counters entry) ---- */

static void cuda_counters(mp_kctx *cx, int64_t c[3])
{
    c[0] = cx->n_to_host, c[1] = cx->n_waits, c[2] = cx->n_mallocs;
}

/* every wait for the stream goes through here */
static cudaError_t wait_stream(mp_kctx *cx)
{
    cx->n_waits++;
    return cudaStreamSynchronize(cx->stream);
}

/* while a graph is captured: the sticky error for what, which is not done (true) */
static bool refused_in_capture(mp_kctx *cx, const char *what)
{
    if (!mp_cuda_capturing(cx)) return false;
    if (!cx->has_error) {
        snprintf(cx->error_msg, sizeof cx->error_msg, "cannot %s inside a CUDA graph capture (mp.cuda.graph): it "
                 "waits for the device or copies host memory, which a replay cannot repeat", what);
        cx->has_error = true;
    }
    return true;
}

cudaError_t mp_cuda_wait(mp_kctx *cx)
{
    if (refused_in_capture(cx, "wait for the device")) return cudaSuccess;   /* the sticky error says it */
    return wait_stream(cx);
}

cudaError_t mp_cuda_malloc(mp_kctx *cx, void **p, size_t nbytes)
{
    cx->n_mallocs++;
    return cudaMalloc(p, nbytes);
}

/* ---- the sticky error ---- */

void mp_cuda_note(mp_kctx *cx, cudaError_t e, const char *what)
{
    if (e == cudaSuccess || cx->has_error) return;
    snprintf(cx->error_msg, sizeof cx->error_msg, "CUDA error in %s: %s", what, cudaGetErrorString(e));
    cx->has_error = true;
}

/* the first error since the last call (launch errors, and faults that
 * surfaced), else a bad index found by check_indices; each reported once */
static const char *cuda_error(mp_kctx *cx)
{
    mp_cuda_note(cx, cudaGetLastError(), "a kernel");
    if (cx->has_error) {
        cx->has_error = false;
        return cx->error_msg;
    }
    if (mp_cuda_fault_take(cx, cx->error_msg, sizeof cx->error_msg)) return cx->error_msg;
    return NULL;
}

/* ---- caching allocator (kernels/block_cache.h) ---- */

/* during a capture cudaMalloc is allowed only with the thread's capture mode
 * relaxed (it is not stream work), and cudaFree not at all: it waits until
 * the capture ends (cuda_graph.cu) */
static void *sys_alloc(size_t nbytes)
{
    void *p = NULL;
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    bool capturing = mp_cuda_capturing(&ctx);
    if (capturing) cudaThreadExchangeStreamCaptureMode(&m);
    cudaError_t e = mp_cuda_malloc(&ctx, &p, nbytes);
    if (capturing) cudaThreadExchangeStreamCaptureMode(&m);
    if (e == cudaSuccess) return p;
    cudaGetLastError();   /* an allocation failure is reported as out of memory, not as a sticky error */
    return NULL;
}

static void sys_free(void *p, size_t nbytes)
{
    if (mp_cuda_capturing(&ctx)) return mp_cuda_defer_free(&ctx, p);
    ctx.n_waits++;   /* cudaFree synchronises the device */
    cudaFree(p);
}

/* blocks of the cache, or of a graph's pool (cuda_graph.cu) */
static void *cuda_alloc(mp_kctx *cx, size_t nbytes) { return mp_cuda_alloc(cx, nbytes); }
static void cuda_free(mp_kctx *cx, void *p, size_t nbytes) { mp_cuda_free(cx, p, nbytes); }
static size_t cuda_cached(mp_kctx *cx) { return cx->cache.cached; }
/* neither gives back anything during a capture (cudaFree would end it): the next mark or release does */
static void cuda_mark_cache(mp_kctx *cx)
{
    if (!mp_cuda_capturing(cx)) mp_cache_mark(&cx->cache);
}
static void cuda_release_cache(mp_kctx *cx)
{
    if (mp_cuda_capturing(cx)) return;
    if (cx->scratch) mp_cuda_free(cx, cx->scratch, cx->scratch_cap);   /* scratch goes back too */
    cx->scratch = NULL, cx->scratch_cap = 0;
    mp_cache_release(&cx->cache);
}

/* scratch: a block of the cache, kept and grown; the stream orders its uses.
 * NULL only when memory runs out: 0 bytes are a block too (an empty attention
 * backward asked for 0 and took the NULL for "out of memory") */
void *mp_cuda_scratch(mp_kctx *cx, size_t nbytes)
{
    if (nbytes == 0) nbytes = 1;
    if (nbytes <= cx->scratch_cap) return cx->scratch;
    if (cx->scratch) mp_cuda_free(cx, cx->scratch, cx->scratch_cap);
    cx->scratch = mp_cuda_alloc(cx, nbytes);
    cx->scratch_cap = cx->scratch ? nbytes : 0;
    return cx->scratch;
}

static void cuda_zero(mp_kctx *cx, void *p, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, cx->stream), "zero");
}

static void cuda_copy(mp_kctx *cx, void *dst, const void *src, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cx->stream), "copy");
}

/* the host side waits: the caller reads the bytes next */
static void cuda_to_host(mp_kctx *cx, void *dst, const void *src, size_t nbytes)
{
    if (refused_in_capture(cx, "copy device memory to the host")) return (void)memset(dst, 0, nbytes);
    cx->n_to_host++;
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, cx->stream), "copy to host");
    MP_CUDA_CHECK(wait_stream(cx), "copy to host");
}

/* ---- copies from the host, through pinned staging buffers ----
 * The caller may free or change its buffer as soon as from_host returns, and a
 * cudaMemcpyAsync from pageable memory may still be reading it then. So the
 * bytes are first copied on the host into one of STAGE_SLOTS pinned buffers,
 * which the device copies from asynchronously; an event recorded after that
 * copy tells when the buffer may be written again. The host waits only when it
 * comes back to a buffer whose copy has not finished (counted as a wait): a
 * copy of a few MiB a step never waits. Without pinned memory (cudaHostAlloc
 * failed) each copy waits for the stream, as a plain synchronous copy. */

#define STAGE_SLOTS MP_CUDA_STAGE_SLOTS
#define STAGE_BYTES ((size_t)4 << 20)


static bool stage_ready(mp_kctx *cx)
{
    if (cx->stage_state) return cx->stage_state > 0;
    cx->stage_state = -1;
    void *p = NULL;
    if (cudaHostAlloc(&p, STAGE_SLOTS * STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    for (int i = 0; i < STAGE_SLOTS; i++) {
        if (cudaEventCreateWithFlags(&cx->stage_event[i], cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            while (i-- > 0) cudaEventDestroy(cx->stage_event[i]);
            cudaFreeHost(p);
            return false;
        }
        cx->stage_buf[i] = (char *)p + i * STAGE_BYTES;
    }
    cx->stage_state = 1;
    return true;
}

/* waits (counted) until the device has finished copying out of slot s */
static void stage_claim(mp_kctx *cx, int s)
{
    if (!cx->stage_busy[s]) return;
    cudaError_t e = cudaEventQuery(cx->stage_event[s]);
    if (e == cudaErrorNotReady) {
        /* not an error: keep it out of the sticky error, but not one before it */
        cudaError_t last = cudaGetLastError();
        if (last != cudaSuccess && last != cudaErrorNotReady) mp_cuda_note(cx, last, "a kernel");
        cx->n_waits++;
        e = cudaEventSynchronize(cx->stage_event[s]);
    }
    MP_CUDA_CHECK(e, "copy from host");
    cx->stage_busy[s] = false;
}

static void cuda_from_host(mp_kctx *cx, void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0 || refused_in_capture(cx, "copy host memory to the device")) return;
    if (!stage_ready(cx)) {
        MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, cx->stream), "copy from host");
        MP_CUDA_CHECK(wait_stream(cx), "copy from host");
        return;
    }
    for (size_t off = 0; off < nbytes; off += STAGE_BYTES) {
        size_t len = nbytes - off < STAGE_BYTES ? nbytes - off : STAGE_BYTES;
        int s = cx->stage_next;
        cx->stage_next = (s + 1) % STAGE_SLOTS;
        stage_claim(cx, s);
        memcpy(cx->stage_buf[s], (const char *)src + off, len);
        MP_CUDA_CHECK(cudaMemcpyAsync((char *)dst + off, cx->stage_buf[s], len, cudaMemcpyHostToDevice, cx->stream),
                      "copy from host");
        MP_CUDA_CHECK(cudaEventRecord(cx->stage_event[s], cx->stream), "copy from host");
        cx->stage_busy[s] = true;
    }
}

static void cuda_synchronize(mp_kctx *cx)
{
    if (refused_in_capture(cx, "synchronize")) return;
    MP_CUDA_CHECK(wait_stream(cx), "synchronize");
}

/* ---- asynchronous reads (backend.h): pinned host memory, queued copies, events ---- */

static void *cuda_host_alloc(mp_kctx *cx, size_t nbytes)
{
    if (refused_in_capture(cx, "allocate pinned host memory")) return NULL;
    void *p = NULL;
    if (cudaMallocHost(&p, nbytes ? nbytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();   /* no sticky error: the caller says what failed */
        return NULL;
    }
    return p;
}

static void cuda_host_free(mp_kctx *cx, void *p, size_t nbytes)
{
    if (p) MP_CUDA_CHECK(cudaFreeHost(p), "free pinned host memory");
}

static void cuda_to_host_async(mp_kctx *cx, void *dst, const void *src, size_t nbytes)
{
    if (refused_in_capture(cx, "queue a copy to the host")) return;
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, cx->stream), "copy to host (queued)");
}

static void *cuda_mark(mp_kctx *cx)
{
    if (refused_in_capture(cx, "mark a point to wait for")) return NULL;
    cudaEvent_t e;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    MP_CUDA_CHECK(cudaEventRecord(e, cx->stream), "mark");
    return (void *)e;
}

static void cuda_mark_wait(mp_kctx *cx, void *mark)
{
    cudaEvent_t e = (cudaEvent_t)mark;
    if (!e || refused_in_capture(cx, "wait for a mark")) return;
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaErrorNotReady) {   /* not passed yet: a real wait, counted */
        (void)cudaGetLastError();
        cx->n_waits++;
        MP_CUDA_CHECK(cudaEventSynchronize(e), "wait for a mark");
    } else {
        MP_CUDA_CHECK(q, "wait for a mark");
    }
    MP_CUDA_CHECK(cudaEventDestroy(e), "free a mark");
}

/* ---- flush counting (backend.h; the kernels' side is in cuda.h) ----
 * The totals live in device memory, one row of three per slot, added to by the
 * kernels while cx->flush points at a row, and come back to the host only in
 * flush_read, when the engine asks for them (one copy and one wait): a counted
 * backward reads nothing per op. fill's one rounding is made on the host and
 * counted in flush_host. */

/* the device's own counters (a singleton of the device, as __device__ state is) */
static MP_DEVICE_GLOBAL unsigned long long mp_flush_totals[MP_FLUSH_SLOTS][3];

void mp_cuda_flush_host(mp_kctx *cx, int64_t n, int64_t zero, int64_t inf)
{
    if (!cx->flush) return;
    int64_t *h = cx->flush_host[cx->flush_at];
    h[0] += n, h[1] += zero, h[2] += inf;
}

static void cuda_flush_slot(mp_kctx *cx, int slot)
{
    if (slot >= 0 && slot < MP_FLUSH_SLOTS && !cx->flush_dev) {
        void *p = NULL;
        MP_CUDA_CHECK(cudaGetSymbolAddress(&p, mp_flush_totals), "flush_slot");
        cx->flush_dev = (unsigned long long *)p;
    }
    cx->flush_at = slot >= 0 && slot < MP_FLUSH_SLOTS ? slot : 0;
    cx->flush = slot >= 0 && slot < MP_FLUSH_SLOTS && cx->flush_dev ? cx->flush_dev + 3 * slot : NULL;
}

static void cuda_flush_read(mp_kctx *cx, int64_t (*counts)[3], int clear)
{
    const size_t bytes = sizeof(unsigned long long) * 3 * MP_FLUSH_SLOTS;
    if (refused_in_capture(cx, "read the flush counts")) {
        if (counts) memset(counts, 0, sizeof(int64_t) * 3 * MP_FLUSH_SLOTS);
        return;
    }
    if (counts) {
        static unsigned long long d[MP_FLUSH_SLOTS][3];
        memset(d, 0, sizeof d);
        if (cx->flush_dev) {
            cx->n_to_host++;
            MP_CUDA_CHECK(cudaMemcpyAsync(d, cx->flush_dev, bytes, cudaMemcpyDeviceToHost, cx->stream), "flush_read");
            MP_CUDA_CHECK(wait_stream(cx), "flush_read");
        }
        for (int s = 0; s < MP_FLUSH_SLOTS; s++)
            for (int k = 0; k < 3; k++) counts[s][k] = (int64_t)d[s][k] + cx->flush_host[s][k];
    }
    if (clear) {
        if (cx->flush_dev) MP_CUDA_CHECK(cudaMemsetAsync(cx->flush_dev, 0, bytes, cx->stream), "flush_read");
        memset(cx->flush_host, 0, sizeof cx->flush_host);
    }
}

/* the device's backend object (its entries and &ctx), filled once by init */
static mp_backend table;

/* every op in every dtype but f64: its kernels are f32 arithmetic with f16/bf16
 * storage, and f64 is the CPU's dtype of checking. Asked for "tensor" (engine/
 * tensor.c, before any f64 tensor is made on CUDA), so an f64 tensor never
 * reaches these kernels: mp.zeros(n, "f64") on cuda and t:to("cuda") of an f64
 * tensor are refused, naming the dtype and the device */
mp_be_gather_along_fn mp_cuda_gather_along;     /* cuda_gather.cu */
mp_be_scatter_along_fn mp_cuda_scatter_along;

static bool cuda_supports(mp_kctx *cx, const char *op, mp_dtype dt) { return dt != MP_F64; }

/* the table, or NULL with the reason in why (for mp.cuda.is_available()) */
extern "C" const mp_backend *mp_cuda_backend_init(char *why, size_t cap)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        if (e != cudaSuccess) snprintf(why, cap, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        else snprintf(why, cap, "the NVIDIA driver sees no GPU");
        cudaGetLastError();
        return NULL;
    }
    /* MP_CUDA_DEVICE: which GPU (mod the count); a launcher's local rank sets it
     * (engine/device.c), so the processes on one machine take one GPU each */
    const char *want = getenv("MP_CUDA_DEVICE");
    if (want && *want) {
        int idx = atoi(want);
        e = cudaSetDevice((idx < 0 ? 0 : idx) % count);
        if (e != cudaSuccess) {
            snprintf(why, cap, "cudaSetDevice(%d): %s", (idx < 0 ? 0 : idx) % count, cudaGetErrorString(e));
            cudaGetLastError();
            return NULL;
        }
    }
    ctx.cache.sys_alloc = sys_alloc, ctx.cache.sys_free = sys_free;
    e = cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(why, cap, "cudaStreamCreate: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    table.name = "cuda";
    table.ctx = &ctx;
    table.supports = cuda_supports;
    table.alloc = cuda_alloc;
    table.free = cuda_free;
    table.cached = cuda_cached;
    table.release_cache = cuda_release_cache;
    table.mark_cache = cuda_mark_cache;
    table.zero = cuda_zero;
    table.copy = cuda_copy;
    table.to_host = cuda_to_host;
    table.from_host = cuda_from_host;
    table.error = cuda_error;
    table.synchronize = cuda_synchronize;
    table.host_alloc = cuda_host_alloc;
    table.host_free = cuda_host_free;
    table.to_host_async = cuda_to_host_async;
    table.mark = cuda_mark;
    table.mark_wait = cuda_mark_wait;
    table.cast = mp_cuda_cast;
    table.fill = mp_cuda_fill;
    table.arange = mp_cuda_arange;
    table.rand_uniform = mp_cuda_rand_uniform;
    table.rand_normal = mp_cuda_rand_normal;
    table.binary = mp_cuda_binary;
    table.unary = mp_cuda_unary;
    table.unary_grad = mp_cuda_unary_grad;
    table.clamp = mp_cuda_clamp;
    table.reduce = mp_cuda_reduce;
    table.put_along = mp_cuda_put_along;
    table.scan = mp_cuda_scan;
    table.scale_loss = mp_cuda_scale_loss;
    table.unscale = mp_cuda_unscale;
    table.scale_rule = mp_cuda_scale_rule;
    table.flush_slot = cuda_flush_slot;
    table.flush_read = cuda_flush_read;
    table.optim_count = mp_cuda_optim_count;
    table.optim_step = mp_cuda_optim_step;
    table.counters = cuda_counters;
    table.where = mp_cuda_where;
    table.softmax = mp_cuda_softmax;
    table.softmax_grad = mp_cuda_softmax_grad;
    table.cross_entropy = mp_cuda_cross_entropy;
    table.cross_entropy_grad = mp_cuda_cross_entropy_grad;
    table.layer_norm = mp_cuda_layer_norm;
    table.layer_norm_grad = mp_cuda_layer_norm_grad;
    table.gemm = mp_cuda_gemm;
    table.gemm_bias = mp_cuda_gemm_bias;
    table.gemm_bias_gelu = mp_cuda_gemm_bias_gelu;
    table.gemm_wgrad_bias = mp_cuda_gemm_wgrad_bias;
    table.fp8_quantize = mp_cuda_fp8_quantize_entry;
    table.fp8_gemm = mp_cuda_fp8_gemm_entry;
    table.attention = mp_cuda_attention;
    table.attention_grad = mp_cuda_attention_grad;
    table.lstm_cell = mp_cuda_lstm_cell;
    table.lstm_cell_grad = mp_cuda_lstm_cell_grad;
    table.gru_cell = mp_cuda_gru_cell;
    table.gru_cell_grad = mp_cuda_gru_cell_grad;
    table.conv2d = mp_cuda_conv2d;
    table.conv2d_grad = mp_cuda_conv2d_grad;
    table.max_pool2d = mp_cuda_max_pool2d;
    table.max_pool2d_grad = mp_cuda_max_pool2d_grad;
    table.avg_pool2d = mp_cuda_avg_pool2d;
    table.avg_pool2d_grad = mp_cuda_avg_pool2d_grad;
    table.batch_norm = mp_cuda_batch_norm;
    table.batch_norm_grad = mp_cuda_batch_norm_grad;
    table.topk = mp_cuda_topk;
    /* without mapped host memory for the fault record, the engine checks indices itself */
    table.check_indices = mp_cuda_check_init(&ctx) ? mp_cuda_check_indices : NULL;
    table.permute = mp_cuda_permute;
    table.gather = mp_cuda_gather;
    table.scatter_add = mp_cuda_scatter_add;
    table.narrow = mp_cuda_narrow;
    table.narrow_put = mp_cuda_narrow_put;
    table.narrow_pad = mp_cuda_narrow_pad;
    table.gather_along = mp_cuda_gather_along;
    table.scatter_along = mp_cuda_scatter_along;
    table.coll_id = mp_cuda_coll_id;
    table.coll_join = mp_cuda_coll_join;
    table.coll_all_reduce = mp_cuda_coll_all_reduce;
    table.coll_broadcast = mp_cuda_coll_broadcast;
    table.coll_all_gather = mp_cuda_coll_all_gather;
    table.coll_leave = mp_cuda_coll_leave;
    table.coll_fork = mp_cuda_coll_fork;
    table.coll_merge = mp_cuda_coll_merge;
    table.graph_begin = mp_cuda_graph_begin;
    table.graph_end = mp_cuda_graph_end;
    table.graph_replay = mp_cuda_graph_replay;
    table.graph_free = mp_cuda_graph_free;
    table.graph_bytes = mp_cuda_graph_bytes;
    return &table;
}
