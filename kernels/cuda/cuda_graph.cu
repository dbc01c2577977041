/*
 * cuda_graph.cu: a training step captured as a CUDA graph (backend.h graph_*,
 * engine/capture.h), and the memory its kernels point at.
 *
 * Capture. graph_begin starts stream capture on the backend's one stream
 * (cudaStreamCaptureModeThreadLocal: the engine runs on one thread); every
 * kernel, copy, memset, cuBLAS and cuDNN call queued on it until graph_end is
 * recorded, not run, and graph_end instantiates the graph; graph_replay is one
 * cudaGraphLaunch on the same stream, ordered after everything queued before,
 * as any op. Nothing of the capture waits for the device.
 *
 * Memory. A captured kernel keeps the addresses it was given, so every block
 * it touches must hold the same data at each replay and nothing else may be
 * put there: the graph owns a private pool, as PyTorch's graphs do.
 * - A block asked for during the capture comes from the graph's free blocks of
 *   its class, else a free block of its class in the cache (kernels/
 *   block_cache.h), else, as the cache's own take does, a free block of one of
 *   the next classes up to twice its size, the graph's then the cache's (owned
 *   under its own class, so the block's size is its class, and lent to no
 *   one: the eager step that warmed the cache took such blocks, and a capture
 *   that took only exact classes missed where it did not), else
 *   from cudaMalloc. A capture in thread-local mode refuses cudaMalloc (it is
 *   not stream work and would not be recorded), so the call is made in relaxed
 *   mode: the block is simply the graph's from then on. So a capture of a step
 *   whose sizes the cache has not seen works (PyTorch's does too), and a warm
 *   cache makes it take no new device memory at all.
 * - A block freed during the capture (a temporary of the step, a saved tensor
 *   of autograd, one from before the capture) goes to the graph's pool: the
 *   captured work may touch it, so the cache may not hand it to anyone else;
 *   later requests of the capture take it again, in stream order, as the
 *   replay will.
 * - After the capture a block the graph owns that a tensor still holds (the
 *   loss, new gradients: the graph's outputs) comes back to the graph's pool
 *   when that tensor is freed, never to the cache.
 * - graph_free (or a failed or aborted capture) gives the pool's free blocks
 *   back to the cache and forgets the rest, which go to the cache when their
 *   tensors are freed. No replay is lost by it: the replays already queued
 *   come before any later use of the blocks on the one stream.
 * - The scratch block (mp_cuda_scratch) is dropped when a capture begins, so
 *   the one the captured kernels use is the graph's.
 * Tensors made before the capture that the step reads or writes (parameters,
 * optimizer state, the input buffer) are the caller's to keep alive: the
 * binding keeps the captured function and its results with the graph.
 * The cache itself gives nothing back during a capture (cudaFree would end
 * it): mark_cache and release_cache wait, and a block its trimming frees is
 * freed when the capture ends (mp_cuda_defer_free).
 *
 * The accounting: every block of a pool stays counted in the cache's held
 * bytes (and the peak) as in use; graph_bytes reports the pools' bytes.
 *
 * Random numbers (cuda.h mp_cuda_rng_pair). The first random draw of a capture
 * takes a block of the pool for the graph's pair {seed, base offset}, in use
 * until the graph goes; the captured random kernels read it when they run, and
 * graph_replay queues set_rng (a one-thread kernel whose arguments carry the
 * replay's seed and offset) just before the graph, on the same stream: each
 * replay's draws are those of its own generator state, and nothing waits and
 * nothing is copied from host memory that a later replay could overwrite. A
 * graph that drew nothing has no pair and ignores the seed and offset.
 */
#include <stdio.h>
#include <string.h>
#include <unordered_map>
#include <vector>
#include "kernels/cuda/cuda.h"

struct mp_cuda_graph {
    cudaGraphExec_t exec;
    std::vector<std::vector<void *>> free_blocks;   /* by class: the pool's free blocks */
    size_t bytes;                                   /* of every block it owns, free or in use */
    uint64_t *rng;                                  /* the pair {seed, base offset}, or NULL: no draws */
};

struct mp_cuda_graphs {
    mp_cuda_graph *open;   /* being captured, else NULL */
    struct owned {
        mp_cuda_graph *g;
        int k;             /* the block's class */
    };
    std::unordered_map<void *, owned> owner;   /* every block a live graph owns */
    std::vector<void *> deferred;              /* cudaFree after the capture */
    size_t bytes;                              /* of all live graphs */
};

bool mp_cuda_capturing(const mp_kctx *cx) { return cx->graphs && cx->graphs->open; }

void mp_cuda_defer_free(mp_kctx *cx, void *p) { cx->graphs->deferred.push_back(p); }

static void own(mp_cuda_graphs *gs, mp_cuda_graph *g, void *p, int k)
{
    gs->owner[p] = {g, k};
    g->bytes += mp_cache_size(k);
    gs->bytes += mp_cache_size(k);
}

/* a free block of class k exactly from the cache (its bookkeeping as mp_cache_take's) */
static void *take_exact(mp_block_cache *c, int k)
{
    mp_cache_list *l = &c->list[k];
    if (!l->n) return NULL;
    void *p = l->p[--l->n];
    if (l->n < l->low) l->low = l->n;
    l->used = ++c->tick;
    c->cached -= mp_cache_size(k);
    return p;
}

void *mp_cuda_alloc(mp_kctx *cx, size_t nbytes)
{
    mp_cuda_graphs *gs = cx->graphs;
    if (!gs || !gs->open) return mp_cache_alloc(&cx->cache, nbytes);
    mp_cuda_graph *g = gs->open;
    size_t size;
    int k = mp_cache_class(nbytes, &size);
    if (k < 0) return NULL;
    int top = k + MP_CACHE_LEND_CLASSES < MP_CACHE_CLASSES - 1 ? k + MP_CACHE_LEND_CLASSES : MP_CACHE_CLASSES - 1;
    for (int j = k; j <= top; j++)   /* the pool's own (owned already), the exact class first */
        if ((size_t)j < g->free_blocks.size() && !g->free_blocks[j].empty()) {
            void *p = g->free_blocks[j].back();
            g->free_blocks[j].pop_back();
            return p;
        }
    void *p = NULL;
    for (int j = k; j <= top && !p; j++)   /* then the cache's */
        if ((p = take_exact(&cx->cache, j))) k = j;   /* owned below under its own class */
    if (!p) {
        /* a miss: cudaMalloc, which the capture allows only with the thread's mode relaxed */
        cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&m);
        cudaError_t e = mp_cuda_malloc(cx, &p, size);
        cudaThreadExchangeStreamCaptureMode(&m);
        if (e != cudaSuccess) {
            cudaGetLastError();   /* out of memory, not a sticky error (as sys_alloc) */
            return NULL;
        }
        cx->cache.held += size;
        cx->cache.sys_allocs++;
        if (cx->cache.held - cx->cache.cached > cx->cache.peak) cx->cache.peak = cx->cache.held - cx->cache.cached;
    }
    own(gs, g, p, k);
    return p;
}

static void pool_put(mp_cuda_graph *g, void *p, int k)
{
    if ((size_t)k >= g->free_blocks.size()) g->free_blocks.resize((size_t)k + 1);
    g->free_blocks[k].push_back(p);
}

void mp_cuda_free(mp_kctx *cx, void *p, size_t nbytes)
{
    if (!p) return;
    mp_cuda_graphs *gs = cx->graphs;
    if (gs) {
        auto it = gs->owner.find(p);
        if (it != gs->owner.end()) return pool_put(it->second.g, p, it->second.k);
        if (gs->open) {   /* freed during the capture: the graph's from now on */
            int k = mp_cache_unlend(&cx->cache, p);   /* a block lent to a smaller class: its own */
            size_t size;
            if (k < 0) k = mp_cache_class(nbytes, &size);
            if (k < 0) return;
            own(gs, gs->open, p, k);
            return pool_put(gs->open, p, k);
        }
    }
    mp_cache_free(&cx->cache, p, nbytes);
}

#define RNG_PAIR_BYTES (2 * sizeof(uint64_t))

int mp_cuda_rng_pair(mp_kctx *cx, bool graph, const uint64_t **pair, const char *what)
{
    *pair = NULL;
    if (!graph) return 0;
    mp_cuda_graph *g = cx->graphs ? cx->graphs->open : NULL;
    if (!g) {   /* the engine asks only inside a capture: a draw relative to none has no seed */
        MP_CUDA_CHECK(cudaErrorInvalidValue, what);
        return -1;
    }
    if (!g->rng && !(g->rng = (uint64_t *)mp_cuda_alloc(cx, RNG_PAIR_BYTES))) {
        MP_CUDA_CHECK(cudaErrorMemoryAllocation, what);
        return -1;
    }
    *pair = g->rng;
    return 0;
}

/* the replay's generator state into the graph's pair, queued before the graph */
static __global__ void set_rng_k(uint64_t *pair, uint64_t seed, uint64_t offset)
{
    pair[0] = seed, pair[1] = offset;
}

/* the graph goes: its free blocks back to the cache, its blocks in use forgotten */
static void drop(mp_kctx *cx, mp_cuda_graph *g)
{
    mp_cuda_graphs *gs = cx->graphs;
    if (g->rng) mp_cuda_free(cx, g->rng, RNG_PAIR_BYTES);   /* into the pool's free blocks, given back below */
    for (size_t k = 0; k < g->free_blocks.size(); k++)
        for (void *p : g->free_blocks[k]) mp_cache_free(&cx->cache, p, mp_cache_size((int)k));
    for (auto it = gs->owner.begin(); it != gs->owner.end();)
        it = it->second.g == g ? gs->owner.erase(it) : std::next(it);
    gs->bytes -= g->bytes;
    if (g->exec) MP_CUDA_CHECK(cudaGraphExecDestroy(g->exec), "graph free");
    delete g;
}

int mp_cuda_graph_begin(mp_kctx *cx, char *why, size_t cap)
{
    if (!cx->graphs) cx->graphs = new mp_cuda_graphs();
    mp_cuda_graphs *gs = cx->graphs;
    if (gs->open) return snprintf(why, cap, "a capture is open already"), -1;
    /* the scratch block of earlier work: the capture takes its own */
    if (cx->scratch) mp_cuda_free(cx, cx->scratch, cx->scratch_cap);
    cx->scratch = NULL, cx->scratch_cap = 0;
    cudaError_t e = cudaStreamBeginCapture(cx->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return snprintf(why, cap, "cudaStreamBeginCapture: %s", cudaGetErrorString(e)), -1;
    }
    gs->open = new mp_cuda_graph();
    return 0;
}

void *mp_cuda_graph_end(mp_kctx *cx, int abort, char *why, size_t cap)
{
    mp_cuda_graphs *gs = cx->graphs;
    mp_cuda_graph *g = gs ? gs->open : NULL;
    if (!g) return snprintf(why, cap, "no capture is open"), (void *)NULL;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cx->stream, &graph);
    const char *what = "cudaStreamEndCapture";
    gs->open = NULL;
    for (void *p : gs->deferred) {   /* what the cache gave back during the capture */
        cx->n_waits++;   /* cudaFree synchronises */
        cudaFree(p);
    }
    gs->deferred.clear();
    size_t n = 0;
    if (!abort && e == cudaSuccess) e = cudaGraphGetNodes(graph, NULL, &n), what = "cudaGraphGetNodes";
    if (!abort && e == cudaSuccess && n > 0) e = cudaGraphInstantiate(&g->exec, graph, 0), what = "cudaGraphInstantiate";
    if (graph) cudaGraphDestroy(graph);
    if (abort || e != cudaSuccess || n == 0) {
        if (abort) why[0] = 0;
        else if (e == cudaSuccess) snprintf(why, cap, "nothing was queued on the CUDA device during the capture");
        else snprintf(why, cap, "%s: %s%s%s", what, cudaGetErrorString(e), cx->has_error ? "; first: " : "",
                      cx->has_error ? cx->error_msg : "");
        /* nothing of the capture ran: its errors are not the device's */
        cudaGetLastError();
        cx->has_error = false;
        g->exec = NULL;
        drop(cx, g);
        return NULL;
    }
    return g;
}

int mp_cuda_graph_replay(mp_kctx *cx, void *graph, uint64_t seed, uint64_t offset, char *why, size_t cap)
{
    if (mp_cuda_capturing(cx)) return snprintf(why, cap, "a capture is open"), -1;
    mp_cuda_graph *g = (mp_cuda_graph *)graph;
    cudaError_t e = cudaSuccess;
    const char *what = "cudaGraphLaunch";
    if (g->rng) {
        MP_LAUNCH(1, 1, 0, cx->stream, set_rng_k, g->rng, seed, offset);
        e = cudaGetLastError(), what = "the replay's random state (set_rng)";
    }
    if (e == cudaSuccess) e = cudaGraphLaunch(g->exec, cx->stream), what = "cudaGraphLaunch";
    if (e != cudaSuccess) {
        cudaGetLastError();
        return snprintf(why, cap, "%s: %s", what, cudaGetErrorString(e)), -1;
    }
    return 0;
}

void mp_cuda_graph_free(mp_kctx *cx, void *graph) { drop(cx, (mp_cuda_graph *)graph); }

size_t mp_cuda_graph_bytes(mp_kctx *cx) { return cx->graphs ? cx->graphs->bytes : 0; }
