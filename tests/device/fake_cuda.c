/*
 * fake_cuda.c: a test double for the CUDA backend, built as
 * build/tests/fake_cuda.so. With MP_CUDA_BACKEND pointing at it the engine
 * loads it as the "cuda" device on a machine without a GPU, so that CI runs
 * what only a GPU machine would otherwise run: the engine's paths for a
 * second device (copies between devices, reads of device memory by the host,
 * the scaler's state and the optimizer's step count in device memory), and
 * every Lua spec with MP_DEVICE=cuda. It is no substitute for the real
 * backend: its kernels are the CPU's.
 *
 * What it imitates of a GPU:
 * - Device memory the host cannot touch. Blocks come from one arena that is
 *   mapped PROT_NONE except while one of the table's entries runs, so engine or
 *   binding code that reads or writes device memory directly (which would
 *   fault on a GPU) dies here with SIGSEGV instead.
 * - A caching allocator (kernels/block_cache.h) and the counters of the real
 *   backend: copies to the host, waits, system allocations. New blocks hold
 *   garbage (0xFF bytes), never the zeros of fresh pages.
 * - A planted device fault: MP_FAKE_CUDA_FAULT=N makes the N-th copy to the
 *   host find the device broken, as after an illegal memory access. That copy
 *   and every later one deliver garbage (0xA5 bytes), and error() reports
 *   "fake device fault" every time it is asked from then on, as CUDA's sticky
 *   errors do. The engine must raise that error, never return the garbage.
 * MP_FAKE_CUDA_STATS=1 prints, at exit, how much of the arena was used.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "kernels/backend.h"
#include "kernels/block_cache.h"

#define ARENA ((size_t)8 << 30)   /* address space reserved; pages are used as touched */
#define PAGE ((size_t)4096)

static char *arena;
static size_t used;                /* bytes handed out from the start of the arena */
static int64_t n_to_host, n_waits;
static long fault_at, n_reads;
static int faulted;

/* the arena is readable and writable only inside an entry */
static int protect;   /* MP_FAKE_CUDA_PROTECT=1 */

static void open_mem(void)
{
    if (protect && used) mprotect(arena, used, PROT_READ | PROT_WRITE);
}

static void close_mem(void)
{
    if (protect && used) mprotect(arena, used, PROT_NONE);
}

/* blocks of a page or more start on a page, so that their pages can be dropped */
static void *sys_alloc(size_t nbytes)
{
    size_t align = nbytes >= PAGE ? PAGE : 256;
    size_t start = (used + align - 1) & ~(align - 1);
    if (nbytes > ARENA - start) return NULL;
    used = start + nbytes;
    return arena + start;
}

/* the arena never shrinks: a released block's space is not reused (a test double) */
static void sys_free(void *p, size_t nbytes) { (void)p, (void)nbytes; }

static mp_block_cache cache = {.sys_alloc = sys_alloc, .sys_free = sys_free};

/* a new block holds garbage, as cudaMalloc's and a reused block's do (0xFF
 * bytes: NaN as floats, -1 as integers), so that an engine path or kernel that
 * reads what it never wrote gives NaN here instead of the zeros of fresh pages */
static void *f_alloc(mp_kctx *cx, size_t nbytes)
{
    void *p = mp_cache_alloc(&cache, nbytes);
    if (p) {
        open_mem();
        memset(p, 0xFF, nbytes);
        close_mem();
    }
    return p;
}
/* A freed block keeps its place in the cache but not its pages: mprotect's cost
 * grows with the pages present in the arena, so only live tensors keep any */
static void f_free(mp_kctx *cx, void *p, size_t nbytes)
{
    if (protect && p && nbytes >= PAGE) madvise(p, nbytes & ~(PAGE - 1), MADV_DONTNEED);
    mp_cache_free(&cache, p, nbytes);
}
static size_t f_cached(mp_kctx *cx) { return cache.cached; }
static void f_release_cache(mp_kctx *cx) { mp_cache_release(&cache); }
static void f_mark_cache(mp_kctx *cx) { mp_cache_mark(&cache); }

static void f_counters(mp_kctx *cx, int64_t c[3]) { c[0] = n_to_host, c[1] = n_waits, c[2] = cache.sys_allocs; }

/* indices are checked "on the device", as the real backend does: a bad one is
 * reported by the next error() and the kernels that take indices leave the
 * op out meanwhile (the CPU kernels would read out of bounds) */
static char index_fault[256];

static void f_check_indices(mp_kctx *cx, const int32_t *idx, int64_t n, int64_t limit, const char *what)
{
    open_mem();
    for (int64_t i = 0; i < n && !index_fault[0]; i++)
        if (idx[i] < 0 || idx[i] >= limit)
            snprintf(index_fault, sizeof index_fault, "%s: %d at position %lld out of range [0, %lld)", what, idx[i],
                     (long long)i + 1, (long long)limit);
    close_mem();
}

static const char *f_error(mp_kctx *cx)
{
    static char msg[256];
    if (faulted) return "fake device fault: an illegal memory access was encountered (planted by MP_FAKE_CUDA_FAULT)";
    if (!index_fault[0]) return NULL;
    snprintf(msg, sizeof msg, "%s", index_fault);
    index_fault[0] = 0;
    return msg;
}

static void f_synchronize(mp_kctx *cx) { n_waits++; }

static void f_to_host(mp_kctx *cx, void *dst, const void *src, size_t nbytes)
{
    n_to_host++, n_waits++;
    if (fault_at > 0 && ++n_reads >= fault_at) faulted = 1;
    if (faulted) {   /* what a failed copy leaves: not the data */
        memset(dst, 0xA5, nbytes);
        return;
    }
    open_mem();
    memcpy(dst, src, nbytes);
    close_mem();
}

/* asynchronous reads: the copy happens at once (the fake device has no queue),
 * counted as neither a copy to the host nor a wait, as a queued copy is not;
 * marks are always passed */
static void *f_host_alloc(mp_kctx *cx, size_t nbytes) { return malloc(nbytes ? nbytes : 1); }
static void f_host_free(mp_kctx *cx, void *p, size_t nbytes) { free(p); }
static void f_to_host_async(mp_kctx *cx, void *dst, const void *src, size_t nbytes)
{
    open_mem();
    memcpy(dst, src, nbytes);
    close_mem();
}
static int mark_token;
static void *f_mark(mp_kctx *cx) { return &mark_token; }
static void f_mark_wait(mp_kctx *cx, void *mark) { (void)mark; }

/* Collectives (MP_FAKE_CUDA_COLL=1): a world of one, as NCCL with one rank is:
 * the group's id is 8 bytes, a reduction or a broadcast leaves the data as it
 * is, a gather copies; each is counted (n_coll, printed with MP_FAKE_CUDA_STATS)
 * and none waits or copies to the host. Without the variable the entries are
 * NULL, and the engine stages the bytes through host memory and MPI. */
static int64_t n_coll;
static int f_coll_id(mp_kctx *cx, void *id, size_t cap, char *why, size_t why_cap)
{
    if (cap < 8) return snprintf(why, why_cap, "fake_cuda: no room for the id"), -1;
    memcpy(id, "fakecoll", 8);
    return 8;
}
static int f_coll_join(mp_kctx *cx, const void *id, size_t nbytes, int rank, int size, char *why, size_t why_cap)
{
    if (nbytes != 8 || memcmp(id, "fakecoll", 8) != 0) return snprintf(why, why_cap, "fake_cuda: not its id"), -1;
    if (size != 1 || rank != 0) return snprintf(why, why_cap, "fake_cuda: its collectives are a world of one (got %d of %d)", rank, size), -1;
    return 0;
}
static void f_coll_all_reduce(mp_kctx *cx, mp_dtype dt, void *buf, int64_t n, mp_coll_op op) { n_coll++; }
static void f_coll_broadcast(mp_kctx *cx, void *buf, size_t nbytes, int root) { n_coll++; }
static void f_coll_all_gather(mp_kctx *cx, const void *send, void *recv, size_t nbytes)
{
    n_coll++;
    open_mem();
    memcpy(recv, send, nbytes);
    close_mem();
}
static void f_coll_leave(mp_kctx *cx) {}
/* the second stream: the fake device has no queue, so forks are only counted,
 * and a fork must be merged before the next backward (a merge without a fork
 * is allowed, as the CUDA backend's is) */
static int64_t n_fork, n_unmerged_max;
static int64_t unmerged;
static void f_coll_fork(mp_kctx *cx) { n_fork++, unmerged++; if (unmerged > n_unmerged_max) n_unmerged_max = unmerged; }
static void f_coll_merge(mp_kctx *cx) { unmerged = 0; }

/* every other entry: the CPU kernel, with the arena open while it runs (IDX:
 * an entry that takes indices, left out while a bad index is pending) */
#define CPU mp_cpu_backend
#define UNPAREN(...) __VA_ARGS__
#define WRAP_IF(cond, name, params, args)             \
    static void f_##name(mp_kctx *cx, UNPAREN params) \
    {                                                 \
        if (!(cond)) return;                          \
        open_mem();                                   \
        CPU.name(CPU.ctx, UNPAREN args);              \
        close_mem();                                  \
    }
#define WRAP(name, params, args) WRAP_IF(1, name, params, args)
#define WRAP_IDX(name, params, args) WRAP_IF(!index_fault[0], name, params, args)
/* the entries that can fail for want of working memory */
#define WRAP_RC_IF(cond, name, params, args)         \
    static int f_##name(mp_kctx *cx, UNPAREN params) \
    {                                                \
        if (!(cond)) return 0;                       \
        open_mem();                                  \
        int rc = CPU.name(CPU.ctx, UNPAREN args);    \
        close_mem();                                 \
        return rc;                                   \
    }
#define WRAP_RC(name, params, args) WRAP_RC_IF(1, name, params, args)
#define WRAP_RC_IDX(name, params, args) WRAP_RC_IF(!index_fault[0], name, params, args)

WRAP(zero, (void *p, size_t n), (p, n))
WRAP(copy, (void *d, const void *s, size_t n), (d, s, n))
WRAP(from_host, (void *d, const void *s, size_t n), (d, s, n))
WRAP(cast, (void *d, mp_dtype dd, const void *s, mp_dtype sd, int64_t n), (d, dd, s, sd, n))
WRAP(fill, (void *d, mp_dtype dt, int64_t n, double v), (d, dt, n, v))
WRAP(arange, (void *d, mp_dtype dt, int64_t n), (d, dt, n))
WRAP(rand_uniform, (void *d, mp_dtype dt, int64_t n, uint64_t s, uint64_t o), (d, dt, n, s, o))
WRAP(rand_normal, (void *d, mp_dtype dt, int64_t n, uint64_t s, uint64_t o), (d, dt, n, s, o))
WRAP(binary, (mp_binop op, mp_dtype dt, void *o, const void *a, const void *b, const mp_bcast *bc),
     (op, dt, o, a, b, bc))
WRAP(unary, (mp_unop op, mp_dtype dt, void *o, const void *a, int64_t n, double p), (op, dt, o, a, n, p))
WRAP(unary_grad, (mp_unop op, mp_dtype dt, void *gi, const void *go, const void *x, const void *y, int64_t n, double p),
     (op, dt, gi, go, x, y, n, p))
WRAP(reduce, (mp_redop op, mp_dtype dt, void *o, const void *a, int64_t ou, int64_t n, int64_t in),
     (op, dt, o, a, ou, n, in))
WRAP_IDX(put_along, (mp_dtype dt, void *o, const void *s, const int32_t *idx, int64_t ou, int64_t n, int64_t in),
     (dt, o, s, idx, ou, n, in))
WRAP(scale_loss, (mp_dtype dt, void *o, const void *in, int64_t n, mp_scale_state *st, int check),
     (dt, o, in, n, st, check))
WRAP(unscale, (float *g, int64_t n, mp_scale_state *st, int slot, mp_grad_stats *tel, const int64_t *seg, int nseg),
     (g, n, st, slot, tel, seg, nseg))
WRAP(scale_rule, (mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg, float v), (op, st, p, arg, v))
WRAP(optim_count, (int64_t *step, const int32_t *skip), (step, skip))
WRAP(optim_step, (mp_optim_kind k, float *p, const float *g, float *s1, float *s2, int64_t n, const mp_optim_args *a,
                  const int64_t *step, const int32_t *skip, void *lowp, mp_dtype ldt),
     (k, p, g, s1, s2, n, a, step, skip, lowp, ldt))
WRAP(where, (mp_dtype dt, void *o, const uint8_t *c, const void *a, const void *b, int64_t n), (dt, o, c, a, b, n))
WRAP_RC(softmax, (mp_dtype dt, void *y, const void *x, int64_t ou, int64_t n, int64_t in, int lg), (dt, y, x, ou, n, in, lg))
WRAP_RC(softmax_grad, (mp_dtype dt, void *gx, const void *gy, const void *y, int64_t ou, int64_t n, int64_t in, int lg),
     (dt, gx, gy, y, ou, n, in, lg))
WRAP_RC_IDX(cross_entropy, (mp_dtype dt, float *l, float *lse, const void *x, const int32_t *t, int64_t r, int64_t c),
     (dt, l, lse, x, t, r, c))
WRAP_RC_IDX(cross_entropy_grad, (mp_dtype dt, void *gx, const void *x, const float *lse, const int32_t *t, const float *s,
                          int64_t r, int64_t c),
     (dt, gx, x, lse, t, s, r, c))
WRAP_RC(layer_norm, (mp_dtype dt, void *y, float *m, float *rs, const void *x, const void *w, const void *b, int64_t r,
                  int64_t n, float eps),
     (dt, y, m, rs, x, w, b, r, n, eps))
WRAP_RC(layer_norm_grad, (mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x, const float *m,
                       const float *rs, const void *w, int64_t r, int64_t n),
     (dt, gx, gw, gb, gy, x, m, rs, w, r, n))
WRAP(permute, (mp_dtype dt, void *o, const void *in, int nd, const int64_t *sh, const int *perm), (dt, o, in, nd, sh, perm))
WRAP_IDX(gather, (mp_dtype dt, void *o, const void *in, const int32_t *idx, int64_t ni, int64_t ou, int64_t n, int64_t in_),
     (dt, o, in, idx, ni, ou, n, in_))
WRAP_IDX(scatter_add, (mp_dtype dt, void *o, const void *s, const int32_t *idx, int64_t ni, int64_t ou, int64_t n, int64_t in),
     (dt, o, s, idx, ni, ou, n, in))
WRAP(narrow, (mp_dtype dt, void *o, const void *in, int64_t ou, int64_t n, int64_t st, int64_t len, int64_t in_),
     (dt, o, in, ou, n, st, len, in_))
WRAP(narrow_put, (mp_dtype dt, void *o, const void *in, int64_t ou, int64_t n, int64_t st, int64_t len, int64_t in_),
     (dt, o, in, ou, n, st, len, in_))

WRAP_RC(attention, (mp_dtype dt, void *o, float *lse, const void *q, const void *k, const void *v, const mp_attn_args *a),
        (dt, o, lse, q, k, v, a))
WRAP_RC(attention_grad, (mp_dtype dt, void *dq, void *dk, void *dv, const void *g, const void *q, const void *k,
                         const void *v, const void *o, const float *lse, const mp_attn_args *a),
        (dt, dq, dk, dv, g, q, k, v, o, lse, a))

WRAP_RC(conv2d, (mp_dtype dt, void *y, const void *x, const void *w, const void *b, const mp_conv_args *a),
        (dt, y, x, w, b, a))
WRAP_RC(conv2d_grad, (mp_dtype dt, void *gx, void *gw, float *gb, const void *gy, const void *x, const void *w,
                      const mp_conv_args *a), (dt, gx, gw, gb, gy, x, w, a))
WRAP_RC(max_pool2d, (mp_dtype dt, void *y, int32_t *idx, const void *x, const mp_pool_args *a), (dt, y, idx, x, a))
WRAP_RC(max_pool2d_grad, (mp_dtype dt, void *gx, const void *gy, const int32_t *idx, const mp_pool_args *a),
        (dt, gx, gy, idx, a))
WRAP_RC(avg_pool2d, (mp_dtype dt, void *y, const void *x, const mp_pool_args *a), (dt, y, x, a))
WRAP_RC(avg_pool2d_grad, (mp_dtype dt, void *gx, const void *gy, const mp_pool_args *a), (dt, gx, gy, a))
WRAP_RC(batch_norm, (mp_dtype dt, void *y, float *m, float *rs, float *rm, float *rv, const void *x, const float *w,
                     const float *b, int64_t n, int64_t c, int64_t hw, int tr, float mo, float eps),
        (dt, y, m, rs, rm, rv, x, w, b, n, c, hw, tr, mo, eps))
WRAP_RC(batch_norm_grad, (mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x, const float *m,
                          const float *rs, const float *w, int64_t n, int64_t c, int64_t hw, int tr),
        (dt, gx, gw, gb, gy, x, m, rs, w, n, c, hw, tr))
WRAP_RC(topk, (mp_dtype dt, void *vals, int32_t *idx, const void *x, int64_t rows, int64_t n, int64_t k, int largest),
        (dt, vals, idx, x, rows, n, k, largest))

static int f_gemm(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                  const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c, int64_t sc)
{
    open_mem();
    int rc = CPU.gemm(CPU.ctx, dt, ta, tb, batch, m, n, k, alpha, a, sa, b, sb, beta, c, sc);
    close_mem();
    return rc;
}

static int f_gemm_bias(mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                       const void *bias, void *c)
{
    open_mem();
    int rc = CPU.gemm_bias(CPU.ctx, dt, m, n, k, a, b, bias, c);
    close_mem();
    return rc;
}

/* the flush counts live on the host here; the CPU's entry keeps them */
static void f_flush_slot(mp_kctx *cx, int slot) { CPU.flush_slot(CPU.ctx, slot); }
static void f_flush_read(mp_kctx *cx, int64_t (*counts)[3], int clear) { CPU.flush_read(CPU.ctx, counts, clear); }

/* MP_FAKE_CUDA_DECLINE="op:dtype,...": this device declines those ops in those
 * dtypes (as a backend without a kernel for them would), for the tests of the
 * engine's error */
static const char *decline;

static bool f_supports(mp_kctx *cx, const char *op, mp_dtype dt)
{
    static const char *names[MP_NDTYPES] = {"f32", "f16", "bf16", "i32", "u8"};
    if (!decline) return true;
    char want[64];
    snprintf(want, sizeof want, "%s:%s", op, (unsigned)dt < MP_NDTYPES ? names[dt] : "?");
    size_t n = strlen(want);
    for (const char *p = decline; (p = strstr(p, want)); p += n)
        if ((p == decline || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return false;
    return true;
}

static mp_backend table;

const mp_backend *mp_cuda_backend_init(char *why, size_t cap)
{
    const char *pr = getenv("MP_FAKE_CUDA_PROTECT");
    protect = pr && *pr && strcmp(pr, "0") != 0;
    arena = mmap(NULL, ARENA, protect ? PROT_NONE : PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED) {
        snprintf(why, cap, "fake_cuda: cannot reserve its arena");
        return NULL;
    }
    const char *f = getenv("MP_FAKE_CUDA_FAULT");
    fault_at = f ? atol(f) : 0;
    decline = getenv("MP_FAKE_CUDA_DECLINE");
    table = (mp_backend){
        .name = "cuda", .ctx = CPU.ctx, .supports = f_supports,
        .alloc = f_alloc, .free = f_free, .cached = f_cached, .release_cache = f_release_cache,
        .mark_cache = f_mark_cache,
        .zero = f_zero, .copy = f_copy, .to_host = f_to_host, .from_host = f_from_host,
        .error = f_error, .synchronize = f_synchronize, .counters = f_counters,
        .host_alloc = f_host_alloc, .host_free = f_host_free, .to_host_async = f_to_host_async, .mark = f_mark,
        .mark_wait = f_mark_wait,
        .cast = f_cast, .fill = f_fill, .arange = f_arange, .rand_uniform = f_rand_uniform,
        .rand_normal = f_rand_normal, .binary = f_binary, .unary = f_unary, .unary_grad = f_unary_grad,
        .reduce = f_reduce, .put_along = f_put_along, .scale_loss = f_scale_loss, .unscale = f_unscale,
        .scale_rule = f_scale_rule, .flush_slot = f_flush_slot, .flush_read = f_flush_read, .optim_count = f_optim_count,
        .optim_step = f_optim_step, .where = f_where, .softmax = f_softmax, .softmax_grad = f_softmax_grad,
        .cross_entropy = f_cross_entropy, .cross_entropy_grad = f_cross_entropy_grad,
        .layer_norm = f_layer_norm, .layer_norm_grad = f_layer_norm_grad, .gemm = f_gemm, .gemm_bias = f_gemm_bias,
        .attention = f_attention, .attention_grad = f_attention_grad, .topk = f_topk,
        .conv2d = f_conv2d, .conv2d_grad = f_conv2d_grad, .max_pool2d = f_max_pool2d,
        .max_pool2d_grad = f_max_pool2d_grad, .avg_pool2d = f_avg_pool2d, .avg_pool2d_grad = f_avg_pool2d_grad,
        .batch_norm = f_batch_norm, .batch_norm_grad = f_batch_norm_grad,
        .permute = f_permute, .gather = f_gather, .scatter_add = f_scatter_add, .narrow = f_narrow,
        .narrow_put = f_narrow_put, .check_indices = f_check_indices,
    };
    const char *coll = getenv("MP_FAKE_CUDA_COLL");
    if (coll && strcmp(coll, "1") == 0) {
        table.coll_id = f_coll_id, table.coll_join = f_coll_join, table.coll_all_reduce = f_coll_all_reduce;
        table.coll_broadcast = f_coll_broadcast, table.coll_all_gather = f_coll_all_gather, table.coll_leave = f_coll_leave;
        table.coll_fork = f_coll_fork, table.coll_merge = f_coll_merge;
    }
    return &table;
}
__attribute__((destructor)) static void fake_stats(void)
{
    if (getenv("MP_FAKE_CUDA_STATS"))
        fprintf(stderr, "fake_cuda: arena used %zu bytes, %lld system allocations, %lld collectives, %lld forks (%lld unmerged at exit)\n",
                used, (long long)cache.sys_allocs, (long long)n_coll, (long long)n_fork, (long long)unmerged);
}
