/*
 * cuda_backend.cu: the CUDA backend's table, its memory, its errors and what it
 * counts.
 *
 * This file is built into build/mp/cuda.so, which the engine loads at run time
 * (engine/tensor.c) and asks for the table through mp_cuda_backend_init. On a
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
 * to_host (the caller reads the bytes next), synchronize, flush_counter's read
 * of its totals, the cache's release (cudaFree), and from_host when all
 * of its pinned staging buffers are still being copied from (see there). The
 * counters entry reports, since load, the copies to the host, those waits
 * (cudaFree counts as one: it synchronises) and the cudaMalloc calls.
 *
 * Errors: the first CUDA error since the engine last asked (sticky), or else a
 * bad index that check_indices found on the device (cuda_check.cu), once.
 */
#include <stdio.h>
#include <string.h>
#include "kernels/cuda/cuda.h"
#include "kernels/block_cache.h"

cudaStream_t mp_cuda_stream;

/* ---- what the backend counts (the counters entry) ---- */

static int64_t n_to_host, n_waits, n_mallocs;

static void cuda_counters(int64_t c[3])
{
    c[0] = n_to_host, c[1] = n_waits, c[2] = n_mallocs;
}

/* every wait for the stream goes through here */
static cudaError_t wait_stream(void)
{
    n_waits++;
    return cudaStreamSynchronize(mp_cuda_stream);
}

cudaError_t mp_cuda_wait(void) { return wait_stream(); }

cudaError_t mp_cuda_malloc(void **p, size_t nbytes)
{
    n_mallocs++;
    return cudaMalloc(p, nbytes);
}

/* ---- the sticky error ---- */

static char error_msg[256];
static bool has_error;

void mp_cuda_note(cudaError_t e, const char *what)
{
    if (e == cudaSuccess || has_error) return;
    snprintf(error_msg, sizeof error_msg, "CUDA error in %s: %s", what, cudaGetErrorString(e));
    has_error = true;
}

/* the first error since the last call (launch errors, and faults that
 * surfaced), else a bad index found by check_indices; each reported once */
static const char *cuda_error(void)
{
    mp_cuda_note(cudaGetLastError(), "a kernel");
    if (has_error) {
        has_error = false;
        return error_msg;
    }
    if (mp_cuda_fault_take(error_msg, sizeof error_msg)) return error_msg;
    return NULL;
}

/* ---- caching allocator (kernels/block_cache.h) ---- */

static void *sys_alloc(size_t nbytes)
{
    void *p = NULL;
    if (mp_cuda_malloc(&p, nbytes) == cudaSuccess) return p;
    cudaGetLastError();   /* an allocation failure is reported as out of memory, not as a sticky error */
    return NULL;
}

static void sys_free(void *p, size_t nbytes)
{
    n_waits++;   /* cudaFree synchronises the device */
    cudaFree(p);
}

static mp_block_cache cache = {sys_alloc, sys_free};

static void *cuda_alloc(size_t nbytes) { return mp_cache_alloc(&cache, nbytes); }
static void cuda_free(void *p, size_t nbytes) { mp_cache_free(&cache, p, nbytes); }
static size_t cuda_cached(void) { return cache.cached; }
static void cuda_release_cache(void) { mp_cache_release(&cache); }

static void cuda_zero(void *p, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, mp_cuda_stream), "zero");
}

static void cuda_copy(void *dst, const void *src, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, mp_cuda_stream), "copy");
}

/* the host side waits: the caller reads the bytes next */
static void cuda_to_host(void *dst, const void *src, size_t nbytes)
{
    n_to_host++;
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, mp_cuda_stream), "copy to host");
    MP_CUDA_CHECK(wait_stream(), "copy to host");
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

#define STAGE_SLOTS 4
#define STAGE_BYTES ((size_t)4 << 20)

static char *stage_buf[STAGE_SLOTS];
static cudaEvent_t stage_event[STAGE_SLOTS];
static bool stage_busy[STAGE_SLOTS];
static int stage_next, stage_state;   /* state 0: not tried yet, 1: ready, -1: unavailable */

static bool stage_ready(void)
{
    if (stage_state) return stage_state > 0;
    stage_state = -1;
    void *p = NULL;
    if (cudaHostAlloc(&p, STAGE_SLOTS * STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    for (int i = 0; i < STAGE_SLOTS; i++) {
        if (cudaEventCreateWithFlags(&stage_event[i], cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            while (i-- > 0) cudaEventDestroy(stage_event[i]);
            cudaFreeHost(p);
            return false;
        }
        stage_buf[i] = (char *)p + i * STAGE_BYTES;
    }
    stage_state = 1;
    return true;
}

/* waits (counted) until the device has finished copying out of slot s */
static void stage_claim(int s)
{
    if (!stage_busy[s]) return;
    cudaError_t e = cudaEventQuery(stage_event[s]);
    if (e == cudaErrorNotReady) {
        /* not an error: keep it out of the sticky error, but not one before it */
        cudaError_t last = cudaGetLastError();
        if (last != cudaSuccess && last != cudaErrorNotReady) mp_cuda_note(last, "a kernel");
        n_waits++;
        e = cudaEventSynchronize(stage_event[s]);
    }
    MP_CUDA_CHECK(e, "copy from host");
    stage_busy[s] = false;
}

static void cuda_from_host(void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0) return;
    if (!stage_ready()) {
        MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, mp_cuda_stream), "copy from host");
        MP_CUDA_CHECK(wait_stream(), "copy from host");
        return;
    }
    for (size_t off = 0; off < nbytes; off += STAGE_BYTES) {
        size_t len = nbytes - off < STAGE_BYTES ? nbytes - off : STAGE_BYTES;
        int s = stage_next;
        stage_next = (s + 1) % STAGE_SLOTS;
        stage_claim(s);
        memcpy(stage_buf[s], (const char *)src + off, len);
        MP_CUDA_CHECK(cudaMemcpyAsync((char *)dst + off, stage_buf[s], len, cudaMemcpyHostToDevice, mp_cuda_stream),
                      "copy from host");
        MP_CUDA_CHECK(cudaEventRecord(stage_event[s], mp_cuda_stream), "copy from host");
        stage_busy[s] = true;
    }
}

static void cuda_synchronize(void)
{
    MP_CUDA_CHECK(wait_stream(), "synchronize");
}

/* ---- flush counting (backend.h; the kernels' side is in cuda.h) ----
 * The three totals live in device memory, added to by the kernels while
 * mp_cuda_flush points at them, and come back to the host only here, when the
 * engine asks for them (one copy and one wait). fill's one rounding is made on
 * the host and counted in flush_host. */

unsigned long long *mp_cuda_flush;
static __device__ unsigned long long mp_flush_totals[3];
static unsigned long long *flush_dev;   /* mp_flush_totals' address, once known */
static int64_t flush_host[3];

void mp_cuda_flush_host(int64_t n, int64_t zero, int64_t inf)
{
    if (!mp_cuda_flush) return;
    flush_host[0] += n, flush_host[1] += zero, flush_host[2] += inf;
}

static void cuda_flush_counter(int on, int64_t counts[3])
{
    if (counts) {
        unsigned long long d[3] = {0, 0, 0};
        if (flush_dev) {
            n_to_host++;
            MP_CUDA_CHECK(cudaMemcpyAsync(d, flush_dev, sizeof d, cudaMemcpyDeviceToHost, mp_cuda_stream),
                          "flush_counter");
            MP_CUDA_CHECK(wait_stream(), "flush_counter");
        }
        for (int k = 0; k < 3; k++) counts[k] = (int64_t)d[k] + flush_host[k];
    }
    if (on) {
        if (!flush_dev) {
            void *p = NULL;
            MP_CUDA_CHECK(cudaGetSymbolAddress(&p, mp_flush_totals), "flush_counter");
            flush_dev = (unsigned long long *)p;
        }
        if (flush_dev) MP_CUDA_CHECK(cudaMemsetAsync(flush_dev, 0, 3 * sizeof *flush_dev, mp_cuda_stream), "flush_counter");
        memset(flush_host, 0, sizeof flush_host);
    }
    mp_cuda_flush = on ? flush_dev : NULL;
}

static mp_backend table;

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
    e = cudaStreamCreateWithFlags(&mp_cuda_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(why, cap, "cudaStreamCreate: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    table.name = "cuda";
    table.alloc = cuda_alloc;
    table.free = cuda_free;
    table.cached = cuda_cached;
    table.release_cache = cuda_release_cache;
    table.zero = cuda_zero;
    table.copy = cuda_copy;
    table.to_host = cuda_to_host;
    table.from_host = cuda_from_host;
    table.error = cuda_error;
    table.synchronize = cuda_synchronize;
    table.cast = mp_cuda_cast;
    table.fill = mp_cuda_fill;
    table.arange = mp_cuda_arange;
    table.rand_uniform = mp_cuda_rand_uniform;
    table.rand_normal = mp_cuda_rand_normal;
    table.binary = mp_cuda_binary;
    table.unary = mp_cuda_unary;
    table.unary_grad = mp_cuda_unary_grad;
    table.reduce = mp_cuda_reduce;
    table.put_along = mp_cuda_put_along;
    table.scale_loss = mp_cuda_scale_loss;
    table.unscale = mp_cuda_unscale;
    table.scale_rule = mp_cuda_scale_rule;
    table.flush_counter = cuda_flush_counter;
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
    /* without mapped host memory for the fault record, the engine checks indices itself */
    table.check_indices = mp_cuda_check_init() ? mp_cuda_check_indices : NULL;
    table.permute = mp_cuda_permute;
    table.gather = mp_cuda_gather;
    table.scatter_add = mp_cuda_scatter_add;
    table.narrow = mp_cuda_narrow;
    table.narrow_put = mp_cuda_narrow_put;
    return &table;
}
