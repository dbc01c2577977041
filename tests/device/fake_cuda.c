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
 * MP_FAKE_CUDA_STATS=1 prints, at exit, the top of the arena in use.
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
static int opened;    /* within open_mem() ... close_mem() */

/* With transparent huge pages (huge = 1) the arena is made of 2 MiB pages where
 * the kernel can: mprotect then changes one entry per 2 MiB instead of one per
 * 4 KiB page, and the range it is given ends on a huge page (VMA boundaries
 * there, so that the last one can be huge too) */
#define HUGE ((size_t)2 << 20)
static int huge;

static size_t span(void) { return huge ? (used + HUGE - 1) & ~(HUGE - 1) : used; }

static void open_mem(void)
{
    opened = 1;
    if (protect && used) mprotect(arena, span(), PROT_READ | PROT_WRITE);
}

static void close_mem(void)
{
    opened = 0;
    if (protect && used) mprotect(arena, span(), PROT_NONE);
}

/* The space of blocks the cache gave back, reused first fit. mprotect walks
 * the page tables of the whole range it is given, twice an entry, so the cost
 * of every entry grew with every byte the arena ever handed out: before, the
 * space was never reused and the fake device's pass of make test took 2.5x the
 * sum of its spec files run one at a time (autograd_spec 4.3 s alone, 10.5 s
 * after amp_wide_spec had taken 37 MB of the arena and given it back). Holes
 * are sorted, disjoint and never touch one another or the top; a hole reaching
 * the top lowers it, and the page tables above the new top are dropped. */
#define NHOLES 4096
static struct { size_t lo, hi; } holes[NHOLES];
static int nholes;

/* the pages of [lo, hi) mapped anew: they go, and so do the page tables of
 * the whole 2 MiB ranges within */
static void drop_tables(size_t lo, size_t hi)
{
    lo = (lo + PAGE - 1) & ~(PAGE - 1);
    if (lo < hi)
        mmap(arena + lo, hi - lo, protect && !opened ? PROT_NONE : PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}

static void hole_add(size_t lo, size_t hi)
{
    if (lo >= hi) return;
    if (hi == used) {   /* the top comes down, over the hole below it if they touch */
        if (nholes && holes[nholes - 1].hi == lo) lo = holes[--nholes].lo;
        drop_tables(lo, used);
        used = lo;
        return;
    }
    int i = 0;
    while (i < nholes && holes[i].lo < lo) i++;
    bool prev = i > 0 && holes[i - 1].hi == lo, next = i < nholes && holes[i].lo == hi;
    if (prev && next) {
        holes[i - 1].hi = holes[i].hi;
        memmove(&holes[i], &holes[i + 1], sizeof holes[0] * (size_t)(nholes - i - 1));
        nholes--;
    } else if (prev) holes[i - 1].hi = hi;
    else if (next) holes[i].lo = lo;
    else if (nholes < NHOLES) {   /* when full, the space is lost: the arena is large */
        memmove(&holes[i + 1], &holes[i], sizeof holes[0] * (size_t)(nholes - i));
        holes[i].lo = lo, holes[i].hi = hi;
        nholes++;
    }
}

/* blocks of a page or more start on a page, so that their pages can be dropped */
static void *sys_alloc(size_t nbytes)
{
    size_t align = nbytes >= PAGE ? PAGE : 256;
    for (int i = 0; i < nholes; i++) {
        size_t lo = holes[i].lo, hi = holes[i].hi, start = (lo + align - 1) & ~(align - 1);
        if (start > hi || hi - start < nbytes) continue;
        memmove(&holes[i], &holes[i + 1], sizeof holes[0] * (size_t)(nholes - i - 1));
        nholes--;
        hole_add(lo, start);
        hole_add(start + nbytes, hi);
        return arena + start;
    }
    size_t start = (used + align - 1) & ~(align - 1), old = used;
    if (nbytes > ARENA - start) return NULL;
    used = start + nbytes;
    hole_add(old, start);
    return arena + start;
}

static void sys_free(void *p, size_t nbytes)
{
    size_t lo = (size_t)((char *)p - arena);
    hole_add(lo, lo + nbytes);
}

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
 * grows with the pages present in the arena, so only live tensors keep any
 * (with huge pages, mprotect's cost is per 2 MiB, and dropping 4 KiB pages
 * would split them) */
static void f_free(mp_kctx *cx, void *p, size_t nbytes)
{
    if (protect && !huge && p && nbytes >= PAGE) madvise(p, nbytes & ~(PAGE - 1), MADV_DONTNEED);
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

/* Every other entry: the CPU's, with the arena open while it runs. The
 * wrappers are generated from the contract's one list (kernels/backend.h), so
 * a new entry needs no line here. held_open opens the arena and, as the
 * variable goes out of scope after the CPU entry has returned, closes it
 * (GCC's cleanup attribute); `return CPU.name args` forwards a void result
 * too (GNU C). The gated variant leaves an entry that takes indices out while
 * a bad index is pending, as the real backend's kernels do (the CPU kernels
 * would read out of bounds). */
#define CPU mp_cpu_backend
static int open_scope(void) { open_mem(); return 0; }
static void close_scope(int *unused) { (void)unused, close_mem(); }
#define HELD_OPEN __attribute__((cleanup(close_scope))) int held_open = open_scope(); (void)held_open
#define WRAP(ret, name, params, args) \
    __attribute__((unused)) static ret w_##name params { HELD_OPEN; return CPU.name args; }
#define WRAP_GATED(ret, name, params, args)                    \
    __attribute__((unused)) static ret g_##name params         \
    {                                                          \
        if (index_fault[0]) return (ret)0;                     \
        HELD_OPEN;                                             \
        return CPU.name args;                                  \
    }
MP_BACKEND_ENTRIES(WRAP)
MP_BACKEND_ENTRIES(WRAP_GATED)

/* MP_FAKE_CUDA_DECLINE="op:dtype,...": this device declines those ops in those
 * dtypes (as a backend without a kernel for them would), for the tests of the
 * engine's error */
static const char *decline;
/* MP_FAKE_CUDA_WITHOUT="entry,...": this device leaves those entries of its
 * table NULL (as a backend without those kernels), for the tests of the
 * engine's refusal of an op whose entry is missing (engine/op.h: needs) */
static const char *without;

/* whether the comma-separated list has the item want */
static bool listed(const char *list, const char *want)
{
    size_t n = strlen(want);
    for (const char *p = list; p && (p = strstr(p, want)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

static bool f_supports(mp_kctx *cx, const char *op, mp_dtype dt)
{
    static const char *names[] = {"f32", "f16", "bf16", "i32", "u8", "f64", "e4m3", "e5m2"};
    MP_STATIC_ASSERT(sizeof names / sizeof names[0] == MP_NDTYPES, "a name for every dtype");
    char want[64];
    snprintf(want, sizeof want, "%s:%s", op, (unsigned)dt < MP_NDTYPES ? names[dt] : "?");
    /* and what the CPU's kernels, which it runs, decline (f64 convolution, say) */
    return !listed(decline, want) && mp_cpu_backend.supports(mp_cpu_backend.ctx, op, dt);
}

static mp_backend table;

const mp_backend *mp_cuda_backend_init(char *why, size_t cap)
{
    const char *pr = getenv("MP_FAKE_CUDA_PROTECT");
    protect = pr && *pr && strcmp(pr, "0") != 0;
    arena = mmap(NULL, ARENA + HUGE, protect ? PROT_NONE : PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED) {
        snprintf(why, cap, "fake_cuda: cannot reserve its arena");
        return NULL;
    }
    arena = (char *)(((uintptr_t)arena + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (protect) {
        FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
        char mode[64] = "";
        if (thp) fgets(mode, sizeof mode, thp), fclose(thp);
        huge = !strstr(mode, "[never]") && mode[0] && madvise(arena, ARENA, MADV_HUGEPAGE) == 0;
    }
    const char *f = getenv("MP_FAKE_CUDA_FAULT");
    fault_at = f ? atol(f) : 0;
    decline = getenv("MP_FAKE_CUDA_DECLINE");
    without = getenv("MP_FAKE_CUDA_WITHOUT");
    /* the CPU's entries, wrapped; then what this device does its own way */
    table = (mp_backend){.name = "cuda", .ctx = CPU.ctx};
#define INSTALL(ret, name, params, args) table.name = CPU.name ? w_##name : NULL;
    MP_BACKEND_ENTRIES(INSTALL)
#undef INSTALL
    table.put_along = g_put_along, table.gather = g_gather, table.scatter_add = g_scatter_add;
    table.cross_entropy = g_cross_entropy, table.cross_entropy_grad = g_cross_entropy_grad;
    table.gather_along = g_gather_along, table.scatter_along = g_scatter_along;
    table.supports = f_supports;
    table.alloc = f_alloc, table.free = f_free, table.cached = f_cached, table.release_cache = f_release_cache;
    table.mark_cache = f_mark_cache, table.counters = f_counters;
    table.to_host = f_to_host, table.error = f_error, table.synchronize = f_synchronize;
    table.host_alloc = f_host_alloc, table.host_free = f_host_free, table.to_host_async = f_to_host_async;
    table.mark = f_mark, table.mark_wait = f_mark_wait, table.check_indices = f_check_indices;
    const char *coll = getenv("MP_FAKE_CUDA_COLL");
    if (coll && strcmp(coll, "1") == 0) {
        table.coll_id = f_coll_id, table.coll_join = f_coll_join, table.coll_all_reduce = f_coll_all_reduce;
        table.coll_broadcast = f_coll_broadcast, table.coll_all_gather = f_coll_all_gather, table.coll_leave = f_coll_leave;
        table.coll_fork = f_coll_fork, table.coll_merge = f_coll_merge;
    }
#define DROP(ret, name, params, args) if (listed(without, #name)) table.name = NULL;
    MP_BACKEND_ENTRIES(DROP)
#undef DROP
    return &table;
}
__attribute__((destructor)) static void fake_stats(void)
{
    if (getenv("MP_FAKE_CUDA_STATS"))
        fprintf(stderr, "fake_cuda: arena top %zu bytes, %lld system allocations, %lld collectives, %lld forks (%lld unmerged at exit)\n",
                used, (long long)cache.sys_allocs, (long long)n_coll, (long long)n_fork, (long long)unmerged);
}
