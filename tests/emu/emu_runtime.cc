/*
 * emu_runtime.cc: the CUDA runtime calls the backend makes, on the emulated
 * device.
 *
 * Memory. Every allocation is recorded with its kind: device memory
 * (cudaMalloc), pinned host memory (cudaHostAlloc, cudaMallocHost), mapped
 * pinned memory (cudaHostAllocMapped), and the device variables (the section
 * mp_emu_device). A kernel may be handed device memory, device variables or
 * mapped memory, nothing else: a host pointer is refused at the launch with
 * the illegal-address error a GPU would give later, naming the kernel and the
 * argument. Copies check their direction against what the pointers are, and
 * that the bytes lie inside their allocations. New device memory holds 0xFF
 * bytes (NaN, -1), never the zeros of fresh pages. The device has
 * MP_EMU_MEMORY_MB of memory (8192).
 *
 * Streams. Work queued on a stream (kernels, copies, memsets, the libraries'
 * calls) runs only when the host needs its result: a synchronisation, an event
 * query or wait, a copy into pageable host memory, cudaFree. Then the other
 * streams run first, as far as their event waits let them (MP_EMU_STREAM_ORDER
 * =waited-first: the stream waited for first, the others only when it waits
 * for them). So a copy out of pinned memory that the host overwrites too soon,
 * or work on a second stream that misses its event wait, gives wrong numbers
 * here as it could on a GPU. An event query returns success after running the
 * work before the event (as a GPU that has caught up). The default stream is
 * an ordinary stream here: the backend uses none other than its own.
 *
 * Graphs. cudaStreamBeginCapture turns a stream into a recorder: what is
 * queued on it from then on (kernels, copies between device and pinned
 * memory, memsets, the libraries' calls, which are queued work here too) is
 * kept as the capture's nodes, in order, and runs nothing; cudaStreamEndCapture
 * makes them a graph, cudaGraphInstantiate an executable copy, and each
 * cudaGraphLaunch queues the nodes again on a stream, where they run as any
 * queued work (the same closures: a kernel node relaunches the kernel with the
 * arguments of its capture). What a GPU refuses while a capture is open is
 * refused here with the same codes, and invalidates the capture as there: a
 * "potentially unsafe" call from the capturing thread unless the capture or
 * the thread's mode (cudaThreadExchangeStreamCaptureMode) is relaxed
 * (cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost, cudaMemcpy, cudaMemset,
 * cudaDeviceSynchronize), and in any mode a wait for the capturing stream
 * (cudaStreamSynchronize, cudaStreamQuery), a copy from or into pageable host
 * memory on it, a query or wait of an event recorded in the capture, and a
 * wait on an event recorded outside it. One capturing stream at a time
 * (the backend captures its one stream; a fork into other streams is not
 * emulated).
 *
 * Errors. A call's error is kept for cudaGetLastError; a fault while work runs
 * (a deadlock, a refused pointer, a library failure) is sticky: every later
 * call returns it, as after an illegal address on a GPU. cudaGetErrorString
 * gives the standard text with what the emulator found in parentheses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>
#include "tests/emu/emu.h"

extern "C" char __start_mp_emu_device[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_mp_emu_device[] __attribute__((weak, visibility("hidden")));

/* the opaque handles of the runtime's headers */
struct op {
    uint64_t seq;
    const char *what;
    std::function<bool()> fn;         /* empty: an event's mark */
    CUstream_st *wait_for;            /* a wait: for this stream to pass wait_seq */
    uint64_t wait_seq;
};
/* a node of a captured graph: the work, as it would have been queued */
struct gnode {
    const char *what;
    std::function<bool()> fn;
};
/* a capture open on a stream (cudaStreamBeginCapture) */
struct capture {
    cudaStreamCaptureMode mode;
    std::vector<gnode> nodes;
    bool invalid = false;             /* a refused call ended it: EndCapture gives no graph */
};
struct CUstream_st {
    unsigned flags;
    std::deque<op> q;
    uint64_t next = 1, done = 0;
    capture *cap = NULL;              /* open capture: what is queued becomes its nodes */
};
struct CUevent_st {
    unsigned flags;
    CUstream_st *s = NULL;            /* recorded on s at seq; NULL: never recorded */
    uint64_t seq = 0;
    capture *cap = NULL;              /* last recorded in this (open) capture */
};
struct CUgraph_st {
    std::vector<gnode> nodes;
};
struct CUgraphExec_st {
    std::vector<gnode> nodes;
};

namespace mp_emu {

static std::recursive_mutex mu;
#define LOCK std::lock_guard<std::recursive_mutex> lock_(mu)

/* ---- settings ---- */

static settings the_settings;
settings &config_mut()
{
    config();
    return the_settings;
}

/* a setting the emulator does not know ends the process: a test that believes
 * it ran in some order must not run in another */
static void bad_setting(const char *name, const char *value, const char *expected)
{
    fprintf(stderr, "mp-emu: %s=%s: expected %s\n", name, value, expected);
    exit(2);
}

const settings &config()
{
    settings &s = the_settings;
    static std::once_flag once;
    std::call_once(once, [&s] {
        const char *o = getenv("MP_EMU_ORDER");
        s.order = !o || !*o || !strcmp(o, "forward") ? 0 : !strcmp(o, "reverse") ? 1 : !strcmp(o, "shuffle") ? 2 : -1;
        if (s.order < 0) bad_setting("MP_EMU_ORDER", o, "forward, reverse or shuffle");
        const char *seed = getenv("MP_EMU_SEED");
        s.seed = seed ? strtoull(seed, NULL, 0) : 0x5eedull;
        const char *rc = getenv("MP_EMU_RACECHECK");
        s.racecheck = rc && *rc && strcmp(rc, "0") != 0;
        const char *so = getenv("MP_EMU_STREAM_ORDER");
        s.stream_order = !so || !*so || !strcmp(so, "others-first") ? 0 : !strcmp(so, "waited-first") ? 1 : -1;
        if (s.stream_order < 0) bad_setting("MP_EMU_STREAM_ORDER", so, "others-first or waited-first");
        const char *mb = getenv("MP_EMU_MEMORY_MB");
        char *end = NULL;
        unsigned long long m = mb && *mb ? strtoull(mb, &end, 10) : 8192;
        if (mb && *mb && (*end || m == 0 || m > (1ull << 24))) bad_setting("MP_EMU_MEMORY_MB", mb, "a number of MiB, 1..2^24");
        s.memory = (size_t)m << 20;
        s.coverage = getenv("MP_EMU_COVERAGE");
    });
    return s;
}

stats &counters()
{
    static stats s;
    return s;
}

/* ---- errors ---- */

static cudaError_t last = cudaSuccess, stuck = cudaSuccess;
/* the containers are never destroyed: the engine's exit handlers (mp.dist's
 * finalize) may still call the runtime after this object's destructors ran */
static std::map<int, std::string> &details = *new std::map<int, std::string>;

static void keep_detail(cudaError_t e, const char *fmt, va_list ap)
{
    char b[1200];
    vsnprintf(b, sizeof b, fmt, ap);
    details[(int)e] = b;
}

cudaError_t record(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    keep_detail(e, fmt, ap);
    va_end(ap);
    last = e;
    return e;
}

cudaError_t sticky(cudaError_t e, const char *fmt, ...)
{
    if (stuck != cudaSuccess) return stuck;   /* the first fault is the one */
    va_list ap;
    va_start(ap, fmt);
    keep_detail(e, fmt, ap);
    va_end(ap);
    if (getenv("MP_EMU_VERBOSE")) fprintf(stderr, "mp-emu: %s\n", details[(int)e].c_str());
    stuck = e;
    return e;
}

void describe(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    keep_detail(e, fmt, ap);
    va_end(ap);
    if (getenv("MP_EMU_VERBOSE")) fprintf(stderr, "mp-emu: %s\n", details[(int)e].c_str());
}

void report_async(cudaError_t e, const char *fmt, ...)
{
    if (last != cudaSuccess || stuck != cudaSuccess) return;
    va_list ap;
    va_start(ap, fmt);
    keep_detail(e, fmt, ap);
    va_end(ap);
    if (getenv("MP_EMU_VERBOSE")) fprintf(stderr, "mp-emu: %s\n", details[(int)e].c_str());
    last = e;
}

cudaError_t sticky_error() { return stuck; }

const char *detail_for(cudaError_t e)
{
    auto it = details.find((int)e);
    return it == details.end() ? NULL : it->second.c_str();
}

static cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudaError_t fail(cudaError_t e, const char *fmt, ...)
{
    char b[1000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    return record(e, "%s (emulated device: %s)", cudaGetErrorString_std(e), b);
}

/* ---- memory ---- */

static std::map<uintptr_t, region> &regions = *new std::map<uintptr_t, region>;   /* by base */
static size_t device_bytes;

bool find_region(const void *p, region *r)
{
    if (!p) return false;
    uintptr_t a = (uintptr_t)p;
    auto it = regions.upper_bound(a);
    if (it != regions.begin()) {
        --it;
        if (a <= it->first + it->second.size) return *r = it->second, true;
    }
    region s = symbols();
    if (s.size && (char *)p >= s.base && (char *)p <= s.base + s.size) return *r = s, true;
    return false;
}

bool device_visible(const region &r) { return (r.kind & (MEM_DEVICE | MEM_SYMBOL | MEM_MAPPED)) != 0; }

region symbols()
{
    region s = {__start_mp_emu_device, __start_mp_emu_device ? (size_t)(__stop_mp_emu_device - __start_mp_emu_device) : 0,
                MEM_SYMBOL};
    return s;
}

static const char *kind_name(const void *p)
{
    region r;
    if (!find_region(p, &r)) return "host memory";
    if (r.kind & MEM_SYMBOL) return "a device variable";
    if (r.kind & MEM_DEVICE) return "device memory";
    if (r.kind & MEM_MAPPED) return "mapped pinned host memory";
    return "pinned host memory";
}

static bool is_device(const void *p)
{
    region r;
    return find_region(p, &r) && (r.kind & (MEM_DEVICE | MEM_SYMBOL));
}

/* [p, p + n) inside its allocation (when p is in one); the error recorded otherwise */
static bool in_bounds(const char *call, const char *which, const void *p, size_t n)
{
    region r;
    if (!find_region(p, &r)) return true;   /* pageable host memory: no bounds known */
    size_t off = (size_t)((const char *)p - r.base);
    if (n <= r.size - off) return true;
    fail(cudaErrorInvalidValue, "%s: %zu bytes at %s %p run past the end of its allocation (%zu bytes from offset %zu)",
         call, n, which, p, r.size, off);
    return false;
}

/* ---- streams ---- */

static CUstream_st &default_stream = *new CUstream_st{0, {}, 1, 0};
/* the live streams, in order of creation, and events */
static std::vector<CUstream_st *> &streams = *new std::vector<CUstream_st *>{&default_stream};
static std::set<CUevent_st *> &events = *new std::set<CUevent_st *>;
static long pending;

static CUstream_st *stream_of(cudaStream_t s)
{
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &default_stream;
    return s;
}

bool stream_valid(cudaStream_t s)
{
    CUstream_st *p = stream_of(s);
    for (auto x : streams)
        if (x == p) return true;
    return false;
}

/* ---- captures ---- */

/* the thread's interaction mode with captures (cudaThreadExchangeStreamCaptureMode) */
static thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

static const char *mode_name(cudaStreamCaptureMode m)
{
    return m == cudaStreamCaptureModeRelaxed ? "relaxed" : m == cudaStreamCaptureModeThreadLocal ? "thread-local" : "global";
}

/* a refused call while s captures: the error, and the capture invalidated (EndCapture then gives no graph) */
static cudaError_t capture_refused(CUstream_st *s, cudaError_t e, const char *call, const char *why)
{
    s->cap->invalid = true;
    return fail(e, "%s while stream %p captures a graph: %s; the capture is invalidated", call, (void *)s, why);
}

/* a potentially unsafe call (it allocates, frees or waits outside stream order)
 * while a capture is open that neither its mode nor the thread's mode relaxes:
 * refused as a GPU refuses it; false when allowed */
static bool unsafe_refused(const char *call)
{
    if (thread_mode == cudaStreamCaptureModeRelaxed) return false;
    for (auto s : streams)
        if (s->cap && s->cap->mode != cudaStreamCaptureModeRelaxed) {
            char why[160];
            snprintf(why, sizeof why, "a potentially unsafe call in a %s-mode capture (relax the thread's mode with "
                     "cudaThreadExchangeStreamCaptureMode around it)", mode_name(s->cap->mode));
            capture_refused(s, cudaErrorStreamCaptureUnsupported, call, why);
            return true;
        }
    return false;
}

/* runs s's next piece of work, unless it waits for another stream; false when it cannot */
static bool step(CUstream_st *s)
{
    if (s->q.empty()) return false;
    op &o = s->q.front();
    if (o.wait_for && o.wait_for->done < o.wait_seq) return false;
    op w = std::move(o);
    s->q.pop_front();
    pending--;
    if (w.fn && stuck == cudaSuccess) w.fn();
    s->done = w.seq;
    return true;
}

static void drop_all(void)
{
    for (auto s : streams) {
        pending -= (long)s->q.size();
        if (!s->q.empty()) s->done = s->q.back().seq;
        s->q.clear();
    }
}

/* runs work until s has done everything up to seq */
static void advance(CUstream_st *s, uint64_t seq)
{
    while (s->done < seq) {
        if (stuck != cudaSuccess) return drop_all();
        bool moved = false;
        if (config().stream_order == 0) {
            for (auto o : streams)
                if (o != s)
                    while (step(o)) moved = true;
            moved |= step(s);
        } else {
            while (s->done < seq && step(s)) moved = true;
            if (s->done < seq)
                for (auto o : streams)
                    if (o != s) moved |= step(o);
        }
        if (!moved) {
            fprintf(stderr, "mp-emu: streams wait for each other in a circle (an emulator bug)\n");
            abort();
        }
    }
}

/* runs s's work up to seq and, for each wait on the way, the stream it waits
 * for only up to the point waited for: nothing any stream was not made to
 * wait for (what a collective reads, emu_nccl.cc) */
static void advance_exact(CUstream_st *s, uint64_t seq)
{
    while (s->done < seq) {
        if (stuck != cudaSuccess) return drop_all();
        op &o = s->q.front();
        if (o.wait_for && o.wait_for->done < o.wait_seq) advance_exact(o.wait_for, o.wait_seq);
        step(s);
    }
}

cudaError_t sync_stream_exact(cudaStream_t st)
{
    CUstream_st *s = stream_of(st);
    advance_exact(s, s->next - 1);
    return stuck;
}

bool enqueue(cudaStream_t st, const char *what, std::function<bool()> fn)
{
    CUstream_st *s = stream_of(st);
    if (stuck != cudaSuccess) return false;
    if (s->cap) {   /* captured: a node of the graph, run at each launch of it */
        if (s->cap->invalid) {
            record(cudaErrorStreamCaptureInvalidated, "%s (emulated device: %s queued on a stream whose capture an "
                   "earlier refused call invalidated)", cudaGetErrorString_std(cudaErrorStreamCaptureInvalidated), what);
            return false;
        }
        s->cap->nodes.push_back(gnode{what, std::move(fn)});
        return true;
    }
    s->q.push_back(op{s->next++, what, std::move(fn), NULL, 0});
    if (++pending > 100000) sync_device();   /* bounds what is held */
    return true;
}

cudaError_t sync_stream(cudaStream_t st)
{
    CUstream_st *s = stream_of(st);
    advance(s, s->next - 1);
    return stuck;
}

cudaError_t sync_device()
{
    for (auto s : streams) advance(s, s->next - 1);
    return stuck;
}

/* ---- kernels ---- */

bool launch_check(const launch_desc &d, const void *const *ptrs, const int *argi, int nptr)
{
    LOCK;
    counters().launches++;
    if (stuck != cudaSuccess) return false;
    const dim3 b = d.block, g = d.grid;
    const uint64_t threads = (uint64_t)b.x * b.y * b.z;
    if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024) {
        fail(cudaErrorInvalidConfiguration, "%s: a block of (%u,%u,%u) threads (at most 1024, and (1024,1024,64))",
             site_string(d.at), b.x, b.y, b.z);
        return false;
    }
    if (!g.x || !g.y || !g.z || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        fail(cudaErrorInvalidConfiguration, "%s: a grid of (%u,%u,%u) blocks (at most (2^31-1,65535,65535))",
             site_string(d.at), g.x, g.y, g.z);
        return false;
    }
    size_t limit = shared_limit(d.kernel);
    if (d.shared > dynamic_limit(d.kernel)) {
        fail(cudaErrorInvalidValue, "%s: %zu bytes of dynamic shared memory, over the %zu that "
             "cudaFuncAttributeMaxDynamicSharedMemorySize set", site_string(d.at), d.shared, dynamic_limit(d.kernel));
        return false;
    }
    if (static_shared(d.kernel) + d.shared > limit) {
        fail(cudaErrorInvalidValue, "%s: %zu bytes of dynamic shared memory and %zu static: over the %zu a block may "
             "have%s", site_string(d.at), d.shared, static_shared(d.kernel), limit,
             limit == (size_t)48 << 10 ? " without cudaFuncAttributeMaxDynamicSharedMemorySize" : "");
        return false;
    }
    if (!stream_valid(d.stream)) {
        fail(cudaErrorInvalidResourceHandle, "%s: stream %p is not a live stream", site_string(d.at), (void *)d.stream);
        return false;
    }
    for (int i = 0; i < nptr; i++) {
        region r;
        if (!ptrs[i] || (find_region(ptrs[i], &r) && device_visible(r))) continue;
        sticky(cudaErrorIllegalAddress,
               "an illegal memory access was encountered (emulated device: kernel %s, argument %d is %p, %s, which a "
               "kernel cannot reach)", site_string(d.at), argi[i], ptrs[i], kind_name(ptrs[i]));
        last = cudaErrorIllegalAddress;
        return false;
    }
    return true;
}

void launch_queue(const launch_desc &d, const void *const *ptrs, int nptr, std::shared_ptr<void> keep,
                  void (*body)(void *), void *arg)
{
    LOCK;
    auto k = std::make_shared<kernel_run>();
    k->d = d, k->keep = keep, k->body = body, k->arg = arg;
    k->ptrs.assign(ptrs, ptrs + nptr);
    enqueue(d.stream, "kernel", [k] { return run_kernel(*k); });
}

}  // namespace mp_emu

using namespace mp_emu;

/* ---- the runtime API ---- */

#define GUARD                                                                                      \
    LOCK;                                                                                          \
    if (stuck != cudaSuccess) return last = stuck

extern "C" {

/* the standard text of an error code */
const char *cudaGetErrorString_std(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureIsolation: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "unknown error";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    LOCK;
    const char *d = detail_for(e);
    return d ? d : cudaGetErrorString_std(e);
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorLaunchTimeout: return "cudaErrorLaunchTimeout";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidSymbol: return "cudaErrorInvalidSymbol";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaGetLastError(void)
{
    LOCK;
    if (stuck != cudaSuccess) return stuck;
    cudaError_t e = last;
    last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    LOCK;
    return stuck != cudaSuccess ? stuck : last;
}

/* ---- the device ---- */

static int device_count(void)
{
    const char *n = getenv("MP_EMU_DEVICES");
    return n ? atoi(n) : 1;
}
static int current_device;

cudaError_t cudaGetDeviceCount(int *count)
{
    LOCK;
    *count = device_count();
    if (*count < 1) return fail(cudaErrorNoDevice, "MP_EMU_DEVICES=%s", getenv("MP_EMU_DEVICES"));
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    LOCK;
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d) of %d devices", d, device_count());
    current_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    LOCK;
    *d = current_device;
    return cudaSuccess;
}

/* an H200's figures, where the backend could ask */
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    LOCK;
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d)", d);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "mpengine emulated CUDA device (sm_90 limits, host fibers)");
    p->totalGlobalMem = config().memory;
    p->sharedMemPerBlock = (size_t)48 << 10;
    p->sharedMemPerBlockOptin = 232448;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->unifiedAddressing = 1;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    p->totalConstMem = 65536;
    p->l2CacheSize = 60 << 20;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int d)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, d);
    if (e != cudaSuccess) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
    }
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    LOCK;
    if (unsafe_refused("cudaDeviceSynchronize")) return last;
    return sync_device();
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    LOCK;
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > 232448)
            return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: %d bytes of dynamic shared memory (at most 232448)",
                        value);
        set_max_dynamic(func, value);
    }
    return cudaSuccess;
}

/* ---- memory ---- */

cudaError_t cudaMalloc(void **p, size_t n)
{
    GUARD;
    *p = NULL;
    if (unsafe_refused("cudaMalloc")) return last;
    if (n == 0) return cudaSuccess;
    if (n > config().memory - device_bytes)
        return record(cudaErrorMemoryAllocation, "out of memory (emulated device: %zu bytes asked, %zu of %zu in use)", n,
                      device_bytes, config().memory);
    void *m = NULL;
    if (posix_memalign(&m, 256, n) != 0) return record(cudaErrorMemoryAllocation, "out of memory (emulated device: the host's)");
    memset(m, 0xFF, n);
    regions[(uintptr_t)m] = region{(char *)m, n, MEM_DEVICE};
    device_bytes += n;
    counters().live_allocs++;
    counters().device_bytes = device_bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    LOCK;
    if (!p) return cudaSuccess;
    if (unsafe_refused("cudaFree")) return last;
    sync_device();   /* cudaFree waits for the device */
    auto it = regions.find((uintptr_t)p);
    if (it == regions.end() || !(it->second.kind & MEM_DEVICE))
        return fail(cudaErrorInvalidValue, "cudaFree(%p): %s, not the start of a cudaMalloc allocation", p, kind_name(p));
    device_bytes -= it->second.size;
    regions.erase(it);
    counters().live_allocs--;
    counters().device_bytes = device_bytes;
    free(p);
    return stuck;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    LOCK;
    *p = NULL;
    if (unsafe_refused("cudaHostAlloc")) return last;
    void *m = NULL;
    if (posix_memalign(&m, 4096, n ? n : 1) != 0) return record(cudaErrorMemoryAllocation, "out of memory (pinned)");
    regions[(uintptr_t)m] = region{(char *)m, n, MEM_PINNED | ((flags & cudaHostAllocMapped) ? MEM_MAPPED : 0)};
    counters().live_pinned++;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void *p)
{
    LOCK;
    if (!p) return cudaSuccess;
    if (unsafe_refused("cudaFreeHost")) return last;
    sync_device();
    auto it = regions.find((uintptr_t)p);
    if (it == regions.end() || !(it->second.kind & MEM_PINNED))
        return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): %s, not the start of a cudaHostAlloc allocation", p,
                    kind_name(p));
    regions.erase(it);
    counters().live_pinned--;
    free(p);
    return stuck;
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags)
{
    LOCK;
    region r;
    if (!find_region(h, &r) || !(r.kind & MEM_MAPPED))
        return fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer(%p): %s, not memory allocated with "
                    "cudaHostAllocMapped", h, kind_name(h));
    *d = h;   /* unified addressing: the same address */
    return cudaSuccess;
}

cudaError_t cudaGetSymbolAddress(void **p, const void *symbol)
{
    LOCK;
    region s = symbols();
    if (!s.size || (const char *)symbol < s.base || (const char *)symbol >= s.base + s.size)
        return fail(cudaErrorInvalidSymbol, "cudaGetSymbolAddress(%p): not a device variable (MP_DEVICE_GLOBAL)", symbol);
    *p = (void *)symbol;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    LOCK;
    *free_b = config().memory - device_bytes, *total = config().memory;
    return cudaSuccess;
}

static const char *kind_text(cudaMemcpyKind k)
{
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
    }
}

/* the checks of a copy; false with the error recorded */
static bool copy_ok(const char *call, void *dst, const void *src, size_t n, cudaMemcpyKind *kind)
{
    bool dd = is_device(dst), sd = is_device(src);
    cudaMemcpyKind want = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                             : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    if (*kind == cudaMemcpyDefault) *kind = want;
    if ((int)*kind < 0 || (int)*kind > 4) {
        fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d", call, (int)*kind);
        return false;
    }
    if (*kind != want) {
        bool dst_wrong = (*kind == cudaMemcpyHostToDevice || *kind == cudaMemcpyDeviceToDevice) != dd;
        fail(cudaErrorInvalidValue, "%s with %s: the %s %p is %s", call, kind_text(*kind),
             dst_wrong ? "destination" : "source", dst_wrong ? dst : src, kind_name(dst_wrong ? dst : src));
        return false;
    }
    return in_bounds(call, "destination", dst, n) && in_bounds(call, "source", src, n);
}

static bool pinned(const void *p)
{
    region r;
    return find_region(p, &r) && (r.kind & MEM_PINNED);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s)
{
    GUARD;
    if (!stream_valid(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: stream %p", (void *)s);
    if (n == 0) return cudaSuccess;
    if (!copy_ok("cudaMemcpyAsync", dst, src, n, &kind)) return last;
    CUstream_st *cs = stream_of(s);
    if (cs->cap && ((kind == cudaMemcpyHostToDevice && !pinned(src)) ||
                    ((kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost) && !pinned(dst))))
        return capture_refused(cs, cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync",
                               "a copy from or into pageable host memory (it would be synchronous)");
    if (kind == cudaMemcpyHostToDevice && !pinned(src)) {
        /* from pageable memory: the bytes are taken now (the caller may reuse its buffer) */
        auto bytes = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        enqueue(s, "copy from host", [dst, bytes] { memcpy(dst, bytes->data(), bytes->size()); return true; });
        return cudaSuccess;
    }
    enqueue(s, "copy", [dst, src, n] { memmove(dst, src, n); return true; });
    if ((kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost) && !pinned(dst)) sync_stream(s);   /* pageable: synchronous */
    return stuck;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    GUARD;
    if (n == 0) return cudaSuccess;
    if (!copy_ok("cudaMemcpy", dst, src, n, &kind)) return last;
    if (unsafe_refused("cudaMemcpy")) return last;
    sync_device();
    if (stuck == cudaSuccess) memmove(dst, src, n);
    return stuck;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    GUARD;
    if (!stream_valid(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream %p", (void *)s);
    if (n == 0) return cudaSuccess;
    if (!is_device(p)) return fail(cudaErrorInvalidValue, "cudaMemsetAsync(%p): %s, not device memory", p, kind_name(p));
    if (!in_bounds("cudaMemsetAsync", "destination", p, n)) return last;
    enqueue(s, "memset", [p, v, n] { memset(p, v, n); return true; });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    {
        LOCK;
        if (unsafe_refused("cudaMemset")) return last;
    }
    cudaError_t e = cudaMemsetAsync(p, v, n, NULL);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e;
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    LOCK;
    CUstream_st *n = new CUstream_st();
    n->flags = flags;
    streams.push_back(n);
    counters().live_streams++;
    *s = n;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    LOCK;
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread || !stream_valid(s))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a stream made by cudaStreamCreate",
                    (void *)s);
    if (s->cap) return capture_refused(s, cudaErrorStreamCaptureUnsupported, "cudaStreamDestroy", "it is capturing");
    sync_stream(s);   /* its work still runs, as on a GPU */
    for (auto ev : events)
        if (ev->s == s) ev->s = &default_stream, ev->seq = 0;   /* passed */
    for (auto &x : streams)
        for (auto &o : x->q)
            if (o.wait_for == s) o.wait_for = NULL;
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) streams.erase(streams.begin() + (long)i);
    delete s;
    counters().live_streams--;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    LOCK;
    if (!stream_valid(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize(%p)", (void *)s);
    if (stream_of(s)->cap)
        return capture_refused(stream_of(s), cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize", "a wait for it");
    return sync_stream(s);
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    LOCK;
    if (!stream_valid(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery(%p)", (void *)s);
    if (stream_of(s)->cap)
        return capture_refused(stream_of(s), cudaErrorStreamCaptureUnsupported, "cudaStreamQuery", "a query of it");
    return sync_stream(s);   /* caught up: done */
}

static bool event_valid(cudaEvent_t e) { return events.count(e) != 0; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    LOCK;
    CUevent_st *n = new CUevent_st();
    n->flags = flags;
    events.insert(n);
    counters().live_events++;
    *e = n;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    LOCK;
    if (!event_valid(e)) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event", (void *)e);
    events.erase(e);
    delete e;
    counters().live_events--;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st)
{
    GUARD;
    if (!event_valid(e)) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord(%p): not a live event", (void *)e);
    if (!stream_valid(st)) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: stream %p", (void *)st);
    CUstream_st *s = stream_of(st);
    if (s->cap) {   /* a point of the capture: on its one stream an event node orders nothing more */
        e->s = NULL, e->seq = 0, e->cap = s->cap;
        return cudaSuccess;
    }
    e->s = s, e->seq = s->next, e->cap = NULL;
    enqueue(st, "event", std::function<bool()>());
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned int flags)
{
    GUARD;
    if (!event_valid(e)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: event %p", (void *)e);
    if (!stream_valid(st)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: stream %p", (void *)st);
    CUstream_st *s = stream_of(st);
    if (s->cap && e->cap != s->cap)
        return capture_refused(s, cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent",
                               "a wait on an event recorded outside the capture");
    if (!s->cap && e->cap)
        return capture_refused(*std::find_if(streams.begin(), streams.end(), [e](CUstream_st *x) { return x->cap == e->cap; }),
                               cudaErrorStreamCaptureUnsupported, "cudaStreamWaitEvent",
                               "another stream joining the capture (a fork into other streams is not emulated)");
    if (s->cap) return cudaSuccess;   /* its own point: already in order */
    if (!e->s) return cudaSuccess;   /* never recorded: nothing to wait for */
    s->q.push_back(op{s->next++, "wait", std::function<bool()>(), e->s, e->seq});
    pending++;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    LOCK;
    if (!event_valid(e)) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery(%p)", (void *)e);
    if (e->cap) return fail(cudaErrorCapturedEvent, "cudaEventQuery(%p): recorded in an open capture", (void *)e);
    if (e->s) advance(e->s, e->seq);   /* the device catches up: the event has passed */
    return stuck;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    LOCK;
    if (!event_valid(e)) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize(%p)", (void *)e);
    if (e->cap) return fail(cudaErrorCapturedEvent, "cudaEventSynchronize(%p): recorded in an open capture", (void *)e);
    if (e->s) advance(e->s, e->seq);
    return stuck;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    LOCK;
    if (!event_valid(a) || !event_valid(b)) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime");
    if ((a->flags | b->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event made with cudaEventDisableTiming");
    *ms = 0;   /* the emulator keeps no device time */
    return cudaSuccess;
}

/* ---- stream capture and graphs ---- */

static std::set<CUgraph_st *> &graphs = *new std::set<CUgraph_st *>;
static std::set<CUgraphExec_st *> &execs = *new std::set<CUgraphExec_st *>;

cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode mode)
{
    GUARD;
    if (!stream_valid(st)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture: stream %p", (void *)st);
    CUstream_st *s = stream_of(st);
    if (s == &default_stream)
        return fail(cudaErrorStreamCaptureImplicit, "cudaStreamBeginCapture: the default stream cannot capture");
    if (s->cap) return fail(cudaErrorIllegalState, "cudaStreamBeginCapture(%p): the stream is capturing already", (void *)st);
    for (auto x : streams)
        if (x->cap)
            return fail(cudaErrorNotSupported, "cudaStreamBeginCapture(%p): stream %p captures already (the emulator "
                        "keeps one capture at a time)", (void *)st, (void *)x);
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode %d", (int)mode);
    s->cap = new capture();
    s->cap->mode = mode;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *g)
{
    LOCK;
    *g = NULL;
    if (!stream_valid(st)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture: stream %p", (void *)st);
    CUstream_st *s = stream_of(st);
    if (!s->cap) return fail(cudaErrorIllegalState, "cudaStreamEndCapture(%p): the stream is not capturing", (void *)st);
    capture *c = s->cap;
    s->cap = NULL;
    for (auto e : events)
        if (e->cap == c) e->cap = NULL;   /* never recorded outside it */
    bool invalid = c->invalid;
    if (!invalid) {
        *g = new CUgraph_st{std::move(c->nodes)};
        graphs.insert(*g);
        counters().live_graphs++;
    }
    delete c;
    if (invalid)
        return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture(%p): a refused call invalidated the capture",
                    (void *)st);
    return stuck;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, cudaStreamCaptureStatus *status)
{
    LOCK;
    if (!stream_valid(st)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing: stream %p", (void *)st);
    capture *c = stream_of(st)->cap;
    *status = !c ? cudaStreamCaptureStatusNone : c->invalid ? cudaStreamCaptureStatusInvalidated
                                                            : cudaStreamCaptureStatusActive;
    return stuck;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode)
{
    LOCK;
    cudaStreamCaptureMode m = *mode;
    if (m != cudaStreamCaptureModeGlobal && m != cudaStreamCaptureModeThreadLocal && m != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: mode %d", (int)m);
    *mode = thread_mode;
    thread_mode = m;
    return cudaSuccess;
}

/* the count only (nodes NULL): the emulator has no node handles */
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n)
{
    LOCK;
    if (!graphs.count(g)) return fail(cudaErrorInvalidValue, "cudaGraphGetNodes(%p): not a live graph", (void *)g);
    if (nodes) return fail(cudaErrorNotSupported, "cudaGraphGetNodes: node handles are not emulated (pass NULL)");
    *n = g->nodes.size();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags)
{
    GUARD;
    *x = NULL;
    if (!graphs.count(g)) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate(%p): not a live graph", (void *)g);
    if (flags) return fail(cudaErrorNotSupported, "cudaGraphInstantiate: flags %llu are not emulated", flags);
    *x = new CUgraphExec_st{g->nodes};   /* its own copy: the graph may go first */
    execs.insert(*x);
    counters().live_graphs++;
    return cudaSuccess;
}

/* the nodes queued on st in their captured order, as that work was queued */
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t st)
{
    GUARD;
    if (!execs.count(x)) return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch(%p): not a live executable graph", (void *)x);
    if (!stream_valid(st)) return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: stream %p", (void *)st);
    if (stream_of(st)->cap)
        return fail(cudaErrorNotSupported, "cudaGraphLaunch into a capturing stream (a child graph) is not emulated");
    for (auto &n : x->nodes) enqueue(st, n.what, n.fn);
    return stuck;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    LOCK;
    if (!execs.count(x)) return fail(cudaErrorInvalidResourceHandle, "cudaGraphExecDestroy(%p): not a live executable graph", (void *)x);
    execs.erase(x);
    delete x;   /* launches already queued keep their own copies of the nodes */
    counters().live_graphs--;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    LOCK;
    if (!graphs.count(g)) return fail(cudaErrorInvalidValue, "cudaGraphDestroy(%p): not a live graph", (void *)g);
    graphs.erase(g);
    delete g;
    counters().live_graphs--;
    return cudaSuccess;
}

/* MP_EMU_STATS=1: what ran and what is still alive, at exit (the backend keeps
 * its stream, its staging events and its handles for the life of the process) */
static void print_stats(void)
{
    const stats &c = counters();
    fprintf(stderr, "mp-emu: %ld launches, %ld kernel runs; live at exit: %ld streams, %ld events, %ld device "
            "allocations (%zu bytes), %ld pinned, %ld cuBLAS handles, %ld cuDNN handles, %ld NCCL communicators, %ld graphs\n",
            c.launches, c.kernel_runs, c.live_streams, c.live_events, c.live_allocs, c.device_bytes, c.live_pinned,
            c.live_blas, c.live_dnn, c.live_nccl, c.live_graphs);
}

__attribute__((constructor)) static void stats_at_exit(void)
{
    const char *s = getenv("MP_EMU_STATS");
    if (s && *s && strcmp(s, "0") != 0) atexit(print_stats);
}

/* the emulator's own counts, for its tests (tests/emu/test_emu.cc, the backend's tests) */
void mp_emu_stats(mp_emu::stats *out)
{
    LOCK;
    *out = counters();
}

/* leaves a faulted context usable again, as a new process would find it (tests only) */
void mp_emu_clear_fault(void)
{
    LOCK;
    stuck = last = cudaSuccess;
}

}  // extern "C"
