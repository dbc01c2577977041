/*
 * emu_sched.cc: how the emulated device runs a kernel.
 *
 * The blocks of a grid run one after the other on the host thread that needs
 * the kernel's results (emu_runtime.cc decides when). Within a block every CUDA
 * thread is a fiber (emu_fiber.cc). A round runs each ready thread, in the
 * round's order, until it finishes or stops at a barrier or a warp operation;
 * then the scheduler releases what can be released: a warp operation once
 * every lane its mask names has reached it (the results computed from all of
 * their operands at once; a WMMA collective needs all 32 lanes and is carried
 * out by emu_wmma.cc), a __syncthreads once every thread of the block has.
 * When nothing is ready and nothing can be released, the block is deadlocked:
 * the kernel stops and the context gets a sticky error that names the kernel,
 * the block and where its threads wait, instead of a hang.
 *
 * Thread orders: forward, reverse or shuffled (a seeded permutation per round,
 * and of the blocks), MP_EMU_ORDER. With MP_EMU_RACECHECK=1 each kernel runs in
 * all three, each time from the same memory (every allocation it was handed,
 * the device variables, mapped host memory: saved before, put back between)
 * and with shared memory poisoned with a different byte, and the results are
 * compared byte for byte: a difference is a race, or a read of shared memory
 * no thread wrote, and is reported with the kernel, the argument and the
 * offset. A launch marked MP_LAUNCH_UNORDERED whose threads made floating-point
 * atomic adds may differ (the numerics documentation names those sums).
 *
 * Shared memory: __shared__ variables live in the section mp_emu_shared, the
 * dynamic shared memory in a buffer of the launch; both are filled with poison
 * before each block (0xFF: NaN for floats, -1 for integers). A kernel whose
 * first block wrote no byte of the section is not poisoned again in that
 * launch. The bytes of the section a kernel's first block writes are its
 * static shared memory as far as the emulator can tell (a lower bound of what
 * ptxas allots), checked with the dynamic bytes against 48 KiB or the opt-in.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <map>
#include <mutex>
#include <string>
#include <vector>
#include "tests/emu/emu.h"

extern "C" char __start_mp_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_mp_emu_shared[] __attribute__((weak, visibility("hidden")));

namespace mp_emu {

thread_state *cur;
uint3 cur_tid;
uint3 block_idx, block_dim, grid_dim;
unsigned long long float_atomics;

enum { READY, AT_BARRIER, AT_WARP, DONE };

struct thread_state {
    fiber *f;
    uint3 tid;
    unsigned lane, warp;
    int st;
    const char *file;            /* where it waits */
    int line;
    warp_op op;
    unsigned mask;
    uint64_t val;
    int size, arg, width;
    bool sgn;
    uint64_t res;
};

static thread_state threads[1024];
/* fibers no thread holds, the most recently used last (never destroyed: the
 * fibers live as long as the process) */
static std::vector<fiber *> &idle = *new std::vector<fiber *>;
static std::vector<int> perm;        /* this round's order (empty: forward) */
static int round_n, round_pos;       /* the round runs perm[round_pos..round_n) next */
static void (*body_fn)(void *);
static void *body_arg;
static const launch_desc *running;   /* the launch whose blocks run */
static std::vector<char> dyn_shared;   /* the launch's dynamic shared memory, 128 bytes more */
static size_t dyn_bytes;                /* what the launch asked for */
static char fault[900];              /* why the block stopped, when it did */

static const char *op_name(warp_op op)
{
    static const char *n[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
                              "__any_sync", "__all_sync", "__match_any_sync", "__reduce_add_sync", "__reduce_min_sync",
                              "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
                              "__activemask", "__syncwarp", "wmma::load_matrix_sync", "wmma::store_matrix_sync",
                              "wmma::mma_sync"};
    return n[op];
}

/* ---- names ---- */

/* the maps below are never destroyed: write_coverage uses them at exit, after
 * function-local statics made later than its atexit would have been */
std::string kernel_name(const site *at)
{
    static auto &names = *new std::map<const site *, std::string>;
    auto it = names.find(at);
    if (it != names.end()) return it->second;
    std::string s;
    int depth = 0;
    for (const char *p = at->text; *p; p++) {
        if (*p == '<' || *p == '(') depth++;
        else if (*p == '>' || *p == ')') depth--;
        else if (*p == ',' && depth == 0) break;
        if (*p != ' ' || depth > 0) s += *p;
    }
    return names[at] = s;
}

const char *site_string(const site *at)
{
    static auto &names = *new std::map<const site *, std::string>;
    auto it = names.find(at);
    if (it != names.end()) return it->second.c_str();
    const char *f = strstr(at->file, "kernels/");
    std::string s = std::string(f ? f : at->file) + ":" + std::to_string(at->line) + " " + kernel_name(at);
    return (names[at] = s).c_str();
}

/* ---- what the threads call ---- */

static thread_state *need_thread(const char *what, const char *file, int line)
{
    if (!cur) {
        fprintf(stderr, "mp-emu: %s at %s:%d called outside a kernel\n", what, file, line);
        abort();
    }
    return cur;
}

void syncthreads(const char *file, int line)
{
    thread_state *t = need_thread("__syncthreads", file, line);
    t->st = AT_BARRIER, t->file = file, t->line = line;
    switch_back(t->f);
}

uint64_t warp(const char *file, int line, warp_op op, unsigned mask, uint64_t val, int size, bool sgn, int arg,
              int width)
{
    thread_state *t = need_thread(op_name(op), file, line);
    t->st = AT_WARP, t->file = file, t->line = line;
    t->op = op, t->mask = mask, t->val = val, t->size = size, t->sgn = sgn, t->arg = arg, t->width = width;
    switch_back(t->f);
    return t->res;
}

/* 128-byte aligned, as the hardware's shared window is (WMMA's loads and
 * stores need 32 bytes) */
void *dynamic_shared()
{
    return dyn_bytes ? (void *)(((uintptr_t)dyn_shared.data() + 127) & ~(uintptr_t)127) : NULL;
}

/* the round's next thread if it is ready and has not started (it can run on
 * the fiber that asks, without a switch); NULL when the next one to run is a
 * thread waiting on a fiber of its own, or the round is over */
static thread_state *next_fresh(void)
{
    while (round_pos < round_n) {
        thread_state *t = &threads[perm.empty() ? round_pos : perm[(size_t)round_pos]];
        if (t->st != READY) {
            round_pos++;
            continue;
        }
        if (t->f) return NULL;
        round_pos++;
        return t;
    }
    return NULL;
}

/* A fiber runs CUDA threads one after the other: when its thread ends, it
 * takes the round's next thread if that one has not started, so a kernel
 * without barriers runs a whole block on one fiber and one hot stack. A thread
 * that stops at a barrier keeps its fiber until it ends. */
static void thread_main(void)
{
    for (;;) {
        thread_state *t = cur;
        body_fn(body_arg);
        t->st = DONE;
        fiber *f = t->f;
        t->f = NULL;
        thread_state *n = next_fresh();
        if (n) {
            n->f = f, cur = n, cur_tid = n->tid;
            continue;
        }
        idle.push_back(f);
        switch_back(f);
    }
}

/* ---- faults ---- */

static void set_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_fault(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fault, sizeof fault, fmt, ap);
    va_end(ap);
}

static std::string where_threads_wait(int n)
{
    struct grp { int st; warp_op op; const char *file; int line; int count; };
    std::vector<grp> g;
    for (int i = 0; i < n; i++) {
        thread_state &t = threads[i];
        bool found = false;
        for (auto &x : g)
            if (x.st == t.st && (t.st == DONE || (x.file == t.file && x.line == t.line && x.op == t.op))) {
                x.count++, found = true;
                break;
            }
        if (!found) g.push_back({t.st, t.op, t.file, t.line, 1});
    }
    std::string s;
    for (auto &x : g) {
        char b[200];
        const char *f = x.file ? strstr(x.file, "kernels/") : NULL;
        if (!f) f = x.file ? x.file : "?";
        if (x.st == DONE) snprintf(b, sizeof b, "%d exited", x.count);
        else if (x.st == AT_BARRIER) snprintf(b, sizeof b, "%d at __syncthreads (%s:%d)", x.count, f, x.line);
        else snprintf(b, sizeof b, "%d at %s (%s:%d)", x.count, op_name(x.op), f, x.line);
        if (!s.empty()) s += ", ";
        s += b;
    }
    return s;
}

/* ---- releasing warps and barriers ---- */

static bool same_point(const thread_state &a, const thread_state &b)
{
    return a.st == AT_WARP && b.st == AT_WARP && a.op == b.op && a.file == b.file && a.line == b.line;
}

/* lane l of the group gets its result; mask: the group's lanes (bit i: lane i) */
static uint64_t warp_result(thread_state *w, unsigned mask, int l, bool *bad)
{
    thread_state &t = w[l];
    int width = t.width;
    auto from = [&](int src) -> uint64_t {
        if (src == l) return t.val;
        if (!(mask >> src & 1u)) {
            set_fault("%s at %s:%d: lane %d reads lane %d, which is not among the lanes taking part (mask 0x%08x; "
                      "exited or absent lanes do not)", op_name(t.op), t.file, t.line, l, src, t.mask);
            *bad = true;
            return 0;
        }
        return w[src].val;
    };
    switch (t.op) {
    case W_SHFL: return from((l & ~(width - 1)) | (t.arg & (width - 1)));
    case W_SHFL_UP: return (l & (width - 1)) >= t.arg ? from(l - t.arg) : t.val;
    case W_SHFL_DOWN: return (l & (width - 1)) + t.arg < width ? from(l + t.arg) : t.val;
    case W_SHFL_XOR: {   /* PTX's bfly: a lane may read its own group or an earlier one */
        int src = l ^ (t.arg & 31);
        return src <= ((l & ~(width - 1)) | (width - 1)) ? from(src) : t.val;
    }
    default: break;
    }
    uint64_t r = 0;
    for (int j = 0; j < 32; j++) {
        if (!(mask >> j & 1u)) continue;
        uint64_t v = w[j].val;
        switch (t.op) {
        case W_BALLOT: r |= (uint64_t)(v != 0) << j; break;
        case W_ANY: r |= v != 0; break;
        case W_ALL: if (j == __builtin_ctz(mask)) r = 1; r &= v != 0; break;
        case W_MATCH_ANY: r |= (uint64_t)(memcmp(&v, &t.val, 8) == 0) << j; break;
        case W_REDUCE_ADD: r = (uint32_t)(r + v); break;
        case W_REDUCE_AND: r = j == __builtin_ctz(mask) ? v : (r & v); break;
        case W_REDUCE_OR: r |= v; break;
        case W_REDUCE_XOR: r ^= v; break;
        case W_REDUCE_MIN:
        case W_REDUCE_MAX: {
            bool first = j == __builtin_ctz(mask);
            bool less = t.sgn ? (int64_t)v < (int64_t)r : v < r;
            if (first || (t.op == W_REDUCE_MIN ? less : !less && v != r)) r = v;
            break;
        }
        default: break;
        }
    }
    if (t.op == W_REDUCE_MIN || t.op == W_REDUCE_MAX || t.op == W_REDUCE_AND) r = (uint32_t)r;
    return r;
}

/* 1: released some, 0: none can be, -1: a fault. The lanes that take part are
 * those of the mask that exist and have not exited (CUDA: "all non-exited
 * threads named in mask must execute the same intrinsic"); reading a value
 * from any other lane is the fault (warp_result) */
static int resolve_warps(int n)
{
    int released = 0;
    for (int w0 = 0; w0 < n; w0 += 32) {
        thread_state *w = threads + w0;
        const int lanes = n - w0 < 32 ? n - w0 : 32;
        unsigned alive = 0;
        for (int j = 0; j < lanes; j++) alive |= (unsigned)(w[j].st != DONE) << j;
        for (int l = 0; l < lanes; l++) {
            thread_state &t = w[l];
            if (t.st != AT_WARP) continue;
            unsigned m;
            if (t.op == W_ACTIVEMASK) {   /* the lanes that stand at this same call: converged ones */
                m = 0;
                for (int j = 0; j < lanes; j++) m |= (unsigned)same_point(w[j], t) << j;
                for (int j = 0; j < lanes; j++)
                    if (m >> j & 1u) w[j].res = m, w[j].st = READY;
                released = 1;
                continue;
            }
            if (!(t.mask >> l & 1u)) {
                set_fault("%s at %s:%d: lane %d calls it with mask 0x%08x, which leaves the lane itself out", op_name(t.op),
                          t.file, t.line, l, t.mask);
                return -1;
            }
            const bool wmma = t.op == W_WMMA_LOAD || t.op == W_WMMA_STORE || t.op == W_WMMA_MMA;
            if (wmma && (lanes != 32 || alive != 0xffffffffu)) {   /* a collective of the whole warp */
                int gone = lanes;
                for (int j = lanes - 1; j >= 0; j--)
                    if (!(alive >> j & 1u)) gone = j;
                set_fault("%s at %s:%d: lane %d %s: every lane of the warp must call it", op_name(t.op), t.file, t.line,
                          gone, gone < lanes ? "has exited" : "does not exist (the block's last warp is partial)");
                return -1;
            }
            m = t.mask & alive;   /* the lanes that take part */
            bool ready = true;
            for (int j = 0; j < lanes; j++) {
                if (!(m >> j & 1u)) continue;
                thread_state &o = w[j];
                bool meets = t.op == W_SYNCWARP ? o.st == AT_WARP && o.op == W_SYNCWARP : same_point(o, t);
                if (!meets || o.mask != t.mask) ready = false;
            }
            if (!ready) continue;
            if (wmma) {   /* the whole warp's call at once (emu_wmma.cc) */
                wmma_call *calls[32];
                for (int j = 0; j < 32; j++) calls[j] = (wmma_call *)(uintptr_t)w[j].val;
                if (const char *why = wmma_run(t.op, calls)) {
                    set_fault("%s at %s:%d: %s", op_name(t.op), t.file, t.line, why);
                    return -1;
                }
                for (int j = 0; j < 32; j++) w[j].res = 0, w[j].st = READY;
                released = 1;
                continue;
            }
            bool bad = false;
            for (int j = 0; j < lanes; j++)
                if (m >> j & 1u) w[j].res = t.op == W_SYNCWARP ? 0 : warp_result(w, m, j, &bad);
            if (bad) return -1;
            for (int j = 0; j < lanes; j++)
                if (m >> j & 1u) w[j].st = READY;
            released = 1;
        }
    }
    return released;
}

static int resolve_barrier(int n)
{
    int alive = 0, first_done = -1;
    const thread_state *at = NULL;
    for (int i = 0; i < n; i++) {
        thread_state &t = threads[i];
        if (t.st == DONE) {
            if (first_done < 0) first_done = i;
            continue;
        }
        if (t.st != AT_BARRIER) return 0;   /* a warp waits: a deadlock, reported by the caller */
        alive++;
        if (!at) at = &t;
        else if (at->file != t.file || at->line != t.line) {
            set_fault("threads wait at different barriers: %s", where_threads_wait(n).c_str());
            return -1;
        }
    }
    if (!at) return 0;
    if (first_done >= 0) {
        set_fault("__syncthreads at %s:%d is not reached by %d threads that exited (thread %d the first): %s", at->file,
                  at->line, n - alive, first_done, where_threads_wait(n).c_str());
        return -1;
    }
    for (int i = 0; i < n; i++) threads[i].st = READY;
    return 1;
}

/* ---- orders ---- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ULL, x ^= x >> 33;
    return x;
}

static void order_threads(int order, int n, uint64_t salt, std::vector<int> &p)
{
    p.resize(n);
    for (int i = 0; i < n; i++) p[i] = order == 1 ? n - 1 - i : i;
    if (order != 2) return;
    uint64_t s = mix(config().seed ^ salt);
    for (int i = n - 1; i > 0; i--) {
        s = mix(s + 0x9E3779B97F4A7C15ULL);
        int j = (int)(s % (uint64_t)(i + 1));
        int t = p[i];
        p[i] = p[j], p[j] = t;
    }
}

static uint64_t gcd(uint64_t a, uint64_t b) { return b ? gcd(b, a % b) : a; }

/* ---- one block ---- */

static bool run_block(int n, int order, uint64_t salt)
{
    for (int i = 0; i < n; i++) {
        thread_state &t = threads[i];
        t.st = READY;
        t.tid.x = (unsigned)i % block_dim.x;
        t.tid.y = (unsigned)i / block_dim.x % block_dim.y;
        t.tid.z = (unsigned)i / (block_dim.x * block_dim.y);
        t.lane = (unsigned)i % 32, t.warp = (unsigned)i / 32;
        t.file = NULL, t.line = 0;
    }
    for (int round = 0;; round++) {
        if (order != 0) order_threads(order, n, salt * 1000003u + (uint64_t)round, perm);
        else perm.clear();
        round_n = n, round_pos = 0;
        while (round_pos < n) {
            thread_state &t = threads[perm.empty() ? round_pos : perm[(size_t)round_pos]];
            round_pos++;
            if (t.st != READY) continue;
            if (!t.f) {
                if (idle.empty()) idle.push_back(fiber_new(thread_main));
                t.f = idle.back();
                idle.pop_back();
            }
            cur = &t, cur_tid = t.tid;
            switch_to(t.f);
        }
        cur = NULL;
        int done = 0;
        for (int i = 0; i < n; i++) done += threads[i].st == DONE;
        if (done == n) return true;
        int r = resolve_warps(n);
        if (r == 0) r = resolve_barrier(n);
        if (r > 0) continue;
        if (r == 0)
            set_fault("deadlock: no thread can go on (%s)", where_threads_wait(n).c_str());
        /* the threads left stop where they are: their fibers start afresh */
        for (int i = 0; i < n; i++)
            if (threads[i].f) {
                fiber_reset(threads[i].f);
                idle.push_back(threads[i].f);
                threads[i].f = NULL;
            }
        return false;
    }
}

/* ---- shared memory ---- */

struct kernel_info {
    int uses_shared = -1;      /* -1 not known yet, 0 no, 1 yes */
    size_t static_bytes = 0;   /* bytes of the shared section its first block wrote */
    int max_dynamic = -1;      /* cudaFuncAttributeMaxDynamicSharedMemorySize, -1: not set */
};
static std::map<const void *, kernel_info> &kinfo = *new std::map<const void *, kernel_info>;

static size_t section_bytes() { return __start_mp_emu_shared ? (size_t)(__stop_mp_emu_shared - __start_mp_emu_shared) : 0; }

static void poison_shared(unsigned char b, bool section)
{
    if (section && section_bytes()) memset(__start_mp_emu_shared, b, section_bytes());
    if (!dyn_shared.empty()) memset(dyn_shared.data(), b, dyn_shared.size());
}

static size_t shared_written(unsigned char b)
{
    size_t n = 0;
    for (size_t i = 0; i < section_bytes(); i++) n += (unsigned char)__start_mp_emu_shared[i] != b;
    return n;
}

int set_max_dynamic(const void *kernel, int bytes)
{
    kinfo[kernel].max_dynamic = bytes;
    return 0;
}

/* what a block may have in all: 48 KiB, or 227 KiB once the kernel opted in */
size_t shared_limit(const void *kernel)
{
    auto it = kinfo.find(kernel);
    return it != kinfo.end() && it->second.max_dynamic >= 0 ? (size_t)227 << 10 : (size_t)48 << 10;
}

/* the dynamic shared memory a launch may ask for: what the opt-in set, else no cap of its own */
size_t dynamic_limit(const void *kernel)
{
    auto it = kinfo.find(kernel);
    return it != kinfo.end() && it->second.max_dynamic >= 0 ? (size_t)it->second.max_dynamic : SIZE_MAX;
}

size_t static_shared(const void *kernel)
{
    auto it = kinfo.find(kernel);
    return it != kinfo.end() ? it->second.static_bytes : 0;
}

/* ---- a grid ---- */

static bool run_grid(kernel_run &k, int order, unsigned char poison)
{
    const launch_desc &d = k.d;
    grid_dim = d.grid, block_dim = d.block;
    body_fn = k.body, body_arg = k.arg;
    const int n = (int)(d.block.x * d.block.y * d.block.z);
    const uint64_t nb = (uint64_t)d.grid.x * d.grid.y * d.grid.z;
    dyn_bytes = d.shared;
    dyn_shared.assign(d.shared ? d.shared + 128 : 0, (char)poison);
    kernel_info &ki = kinfo[d.kernel];
    /* blocks in order, reversed, or permuted by b -> (b * mul + add) mod nb */
    uint64_t mul = 1, add = 0;
    if (order == 2 && nb > 1) {
        uint64_t s = mix(config().seed ^ (uint64_t)counters().kernel_runs);
        mul = s % nb | 1;
        while (gcd(mul, nb) != 1) mul += 2;
        add = mix(s) % nb;
    }
    fault[0] = 0;
    float_atomics = 0;
    for (uint64_t i = 0; i < nb; i++) {
        uint64_t b = order == 0 ? i : order == 1 ? nb - 1 - i : (i * mul + add) % nb;
        block_idx.x = (unsigned)(b % d.grid.x);
        block_idx.y = (unsigned)(b / d.grid.x % d.grid.y);
        block_idx.z = (unsigned)(b / ((uint64_t)d.grid.x * d.grid.y));
        const bool first = ki.uses_shared < 0;
        poison_shared(poison, ki.uses_shared != 0);
        bool ok = run_block(n, order, i);
        if (first) {
            ki.static_bytes = shared_written(poison);
            ki.uses_shared = ki.static_bytes > 0;
            if (ki.static_bytes + d.shared > shared_limit(d.kernel)) {
                sticky(cudaErrorInvalidValue,
                       "too many resources requested for launch (emulated device: %s uses %zu bytes of static shared "
                       "memory, at least, and %zu of dynamic: over the %zu bytes a block may have%s)",
                       site_string(d.at), ki.static_bytes, d.shared, shared_limit(d.kernel),
                       shared_limit(d.kernel) == (size_t)48 << 10 ? " without cudaFuncAttributeMaxDynamicSharedMemorySize"
                                                                   : "");
                return false;
            }
        }
        if (!ok) {
            bool hang = strncmp(fault, "deadlock", 8) == 0;
            sticky(hang ? cudaErrorLaunchTimeout : cudaErrorLaunchFailure,
                   "%s (emulated device: kernel %s, block (%u,%u,%u) of (%u,%u,%u), %d threads: %s)",
                   hang ? "the launch timed out and was terminated" : "unspecified launch failure", site_string(d.at),
                   block_idx.x, block_idx.y, block_idx.z, d.grid.x, d.grid.y, d.grid.z, n, fault);
            return false;
        }
    }
    return true;
}

/* ---- comparing thread orders ---- */

struct saved {
    region r;
    int arg;                 /* 0: the device variables or mapped memory */
    std::vector<char> bytes;
};

static std::vector<saved> save_regions(const kernel_run &k)
{
    std::vector<saved> v;
    auto add = [&](const region &r, int arg) {
        for (auto &s : v)
            if (s.r.base == r.base) return;
        v.push_back({r, arg, std::vector<char>(r.base, r.base + r.size)});
    };
    for (size_t i = 0; i < k.ptrs.size(); i++) {
        region r;
        if (k.ptrs[i] && find_region(k.ptrs[i], &r) && device_visible(r)) add(r, (int)i + 1);
    }
    region s = symbols();
    if (s.size) add(s, 0);
    return v;
}

static void restore(const std::vector<saved> &v)
{
    for (auto &s : v) memcpy(s.r.base, s.bytes.data(), s.r.size);
}

/* the first byte where the memory now differs from `then`, reported; true when equal */
static bool same_as(const std::vector<saved> &then, const kernel_run &k, const char *a, const char *b, bool allowed)
{
    for (auto &s : then) {
        const char *now = s.r.base;
        for (size_t i = 0; i < s.r.size; i++) {
            if (now[i] == s.bytes[i]) continue;
            if (allowed) return false;
            char which[64];
            if (s.arg) snprintf(which, sizeof which, "the allocation of pointer argument %d", s.arg);
            else snprintf(which, sizeof which, "the device variables");
            report_async(cudaErrorLaunchFailure,
                         "unspecified launch failure (emulated device: kernel %s gives different results with threads "
                         "run %s and %s: byte %zu of %s (%zu bytes) differs; a race between threads, or a read of "
                         "shared memory that no thread wrote)",
                         site_string(k.d.at), a, b, i, which, s.r.size);
            return false;
        }
    }
    return true;
}

static std::vector<saved> snapshot(std::vector<saved> v)
{
    for (auto &s : v) memcpy(s.bytes.data(), s.r.base, s.r.size);
    return v;
}

/* ---- coverage: which launch sites ran, written at exit ---- */

static std::map<const site *, long> &ran = *new std::map<const site *, long>;

/* one write() on an O_APPEND descriptor: the lines of processes that end
 * together (mpirun's ranks, Criterion's workers) do not interleave */
static void write_coverage(void)
{
    const char *path = config().coverage;
    if (!path || !*path) return;
    std::string text;
    for (auto &x : ran) text += std::string(site_string(x.first)) + " " + std::to_string(x.second) + "\n";
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return;
    if (write(fd, text.data(), text.size()) < 0) { /* coverage is information only */ }
    close(fd);
}

bool run_kernel(kernel_run &k)
{
    static std::once_flag once;
    std::call_once(once, [] { atexit(write_coverage); });
    ran[k.d.at]++;
    counters().kernel_runs++;
    running = &k.d;
    bool ok;
    if (!config().racecheck) {
        ok = run_grid(k, config().order, 0xFF);
    } else {
        std::vector<saved> before = save_regions(k);
        ok = run_grid(k, 0, 0xFF);
        if (ok) {
            std::vector<saved> fwd = snapshot(before);
            unsigned long long fa = float_atomics;
            static const char *names[3] = {"forward", "in reverse", "shuffled"};
            static const unsigned char poison[3] = {0xFF, 0x7F, 0xA5};
            for (int o = 1; o <= 2 && ok; o++) {
                restore(before);
                ok = run_grid(k, o, poison[o]);
                bool allowed = k.d.at->unordered && (fa > 0 || float_atomics > 0);
                if (ok && !same_as(fwd, k, names[0], names[o], allowed)) {
                    if (!allowed) break;
                    counters().order_diffs_allowed++;
                }
            }
        }
    }
    running = NULL;
    return ok;
}

}  // namespace mp_emu
