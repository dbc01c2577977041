/*
 * emu_nccl.cc: the NCCL calls of kernels/cuda/cuda_nccl.cu on the emulated
 * device. The backend dlopens NCCL; with MP_NCCL_LIBRARY naming
 * build/tests/emu_cuda.so it finds these definitions instead.
 *
 * A group of one rank, and groups of several processes on one machine (ranks
 * started by mpirun, each with its emulated device): the unique id names a
 * POSIX shared-memory segment that the ranks attach to in ncclCommInitRank,
 * with one slot of data per rank. A collective is one or more steps (slots of
 * 4 MiB at a time): each rank waits until every rank has read the last step,
 * writes its part, waits until every rank has written, computes its result
 * from all the parts in rank order, and marks the step read. Sums run in f32
 * in rank order and round once to the buffer's type (with two ranks that is
 * NCCL's one rounding); ncclAvg, as NCCL's for floats, multiplies each part by
 * 1/nranks before the sum (integers: the sum divided). A rank that
 * does not arrive within MP_EMU_NCCL_TIMEOUT seconds (120) ends the wait with
 * an error instead of a hang.
 *
 * When a collective runs. It is checked when called (a live communicator, a
 * live stream, buffers in device memory and inside their allocations, a type
 * and an operation NCCL has) and then runs at once, after everything its
 * stream was given before it and, through its event waits, exactly what those
 * wait for on other streams (not the rest of their queued work), not later with
 * the rest of the lazily run work: two processes each waiting in their host
 * code (an MPI call) for a collective that the other's device has not run would
 * otherwise wait forever, where real GPUs run independently. So work that a
 * collective's stream forgot to wait for, or waited for at an event recorded
 * too early, is still missing when the collective reads its buffer (a wrong sum
 * shows it); what the main stream forgets to wait for after a collective is
 * not seen.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <atomic>
#include <set>
#include <string>
#include <nccl.h>
#include "tests/emu/emu.h"
extern "C" {
#include "kernels/half.h"
}

using namespace mp_emu;

#define MAX_RANKS 16
#define SLOT ((size_t)4 << 20)

struct shared_area {
    std::atomic<int> joined;
    std::atomic<uint64_t> written[MAX_RANKS];   /* the last step each rank wrote */
    std::atomic<uint64_t> read[MAX_RANKS];      /* the last step each rank finished reading */
    char slot[MAX_RANKS][SLOT];
};

struct ncclComm {
    int rank, size;
    shared_area *area;                          /* NULL for one rank */
    size_t bytes;
    char name[96];
    uint64_t step;
};

static std::set<ncclComm *> &comms = *new std::set<ncclComm *>;   /* never destroyed: see emu_runtime.cc */
static char why[600];

static ncclResult_t bad(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t bad(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (getenv("MP_EMU_VERBOSE")) fprintf(stderr, "mp-emu: NCCL: %s\n", why);
    return r;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double timeout_s(void)
{
    const char *t = getenv("MP_EMU_NCCL_TIMEOUT");
    return t ? atof(t) : 120.0;
}

/* waits until every rank's counter reaches v; false after the timeout */
static bool wait_all(ncclComm *c, std::atomic<uint64_t> *ctr, uint64_t v, const char *what)
{
    double t0 = now();
    for (int spins = 0;; spins++) {
        int q = 0;
        while (q < c->size && ctr[q].load(std::memory_order_acquire) >= v) q++;
        if (q == c->size) return true;
        if (now() - t0 > timeout_s()) {
            sticky(cudaErrorLaunchFailure, "unspecified launch failure (emulated NCCL: rank %d waited %.0f s for rank %d "
                   "to %s step %llu of its collectives: the ranks did not call the same collectives)", c->rank,
                   timeout_s(), q, what, (unsigned long long)v);
            return false;
        }
        if (spins > 1000) usleep(50);
    }
}

extern "C" {

ncclResult_t ncclGetVersion(int *v)
{
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    static char b[700];
    const char *base = r == ncclSuccess ? "no error" : r == ncclInvalidArgument ? "invalid argument"
                       : r == ncclInvalidUsage ? "invalid usage" : r == ncclSystemError ? "unhandled system error"
                       : "internal error";
    snprintf(b, sizeof b, "%s (emulated NCCL: %s)", base, why);
    return r == ncclSuccess ? "no error" : b;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    static unsigned n;
    snprintf(id->internal, sizeof id->internal, "/mp-emu-nccl-%d-%u-%lx", (int)getpid(), n++, (unsigned long)(now() * 1e6));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int size, ncclUniqueId id, int rank)
{
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size)
        return bad(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d (the emulator has at most %d)", rank, size, MAX_RANKS);
    if (strncmp(id.internal, "/mp-emu-nccl-", 13) != 0)
        return bad(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
    ncclComm *c = new ncclComm();
    c->rank = rank, c->size = size;
    snprintf(c->name, sizeof c->name, "%.90s", id.internal);
    if (size > 1) {
        int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
        if (fd < 0) {
            delete c;
            return bad(ncclSystemError, "shm_open(%s): %s", id.internal, strerror(errno));
        }
        c->bytes = sizeof(shared_area);
        if (ftruncate(fd, (off_t)c->bytes) != 0) {
            close(fd);
            delete c;
            return bad(ncclSystemError, "ftruncate: %s", strerror(errno));
        }
        void *m = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) {
            delete c;
            return bad(ncclSystemError, "mmap: %s", strerror(errno));
        }
        c->area = (shared_area *)m;
        c->area->joined.fetch_add(1);
        double t0 = now();
        while (c->area->joined.load() < size) {   /* every rank attached: the name can go */
            if (now() - t0 > timeout_s()) {
                int joined = c->area->joined.load();
                munmap(m, c->bytes);
                delete c;
                return bad(ncclSystemError, "ncclCommInitRank: only %d of %d ranks joined", joined, size);
            }
            usleep(100);
        }
        if (rank == 0) shm_unlink(c->name);
    }
    comms.insert(c);
    counters().live_nccl++;
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!comms.count(c)) return bad(ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
    comms.erase(c);
    if (c->area) munmap(c->area, c->bytes);
    delete c;
    counters().live_nccl--;
    return ncclSuccess;
}

}  // extern "C"

/* ---- the collectives ---- */

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static double get(ncclDataType_t t, const char *p, size_t i)
{
    switch (t) {
    case ncclFloat16: return mp_f16_to_f32(((const uint16_t *)p)[i]);
    case ncclBfloat16: return mp_bf16_to_f32(((const uint16_t *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    default: return (double)((const uint64_t *)p)[i];
    }
}

static void put(ncclDataType_t t, char *p, size_t i, double v)
{
    switch (t) {
    case ncclFloat16: ((uint16_t *)p)[i] = mp_f32_to_f16((float)v); break;
    case ncclBfloat16: ((uint16_t *)p)[i] = mp_f32_to_bf16((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)(int64_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)(int64_t)v; break;
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)(int64_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: ((uint64_t *)p)[i] = (uint64_t)v; break;
    }
}

static bool is_float(ncclDataType_t t) { return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64; }

/* one step: every rank's `len` bytes of `mine` into the shared slots, then
 * `use` reads them all (slot q: rank q's bytes) */
template <class F> static bool exchange(ncclComm *c, const void *mine, size_t len, F use)
{
    uint64_t s = ++c->step;
    if (!wait_all(c, c->area->read, s - 1, "finish reading")) return false;
    memcpy(c->area->slot[c->rank], mine, len);
    c->area->written[c->rank].store(s, std::memory_order_release);
    if (!wait_all(c, c->area->written, s, "write")) return false;
    use();
    c->area->read[c->rank].store(s, std::memory_order_release);
    return true;
}

static bool all_reduce(ncclComm *c, const char *send, char *recv, size_t count, ncclDataType_t t, ncclRedOp_t op)
{
    const size_t es = type_size(t), per = SLOT / es;
    std::vector<char> res(es * (count < per ? count : per) + 1);
    for (size_t i0 = 0; i0 < count || (i0 == 0 && count == 0); i0 += per) {
        size_t n = count - i0 < per ? count - i0 : per;
        auto reduce = [&](int parts) {
            for (size_t i = 0; i < n; i++) {
                double v = 0;
                const bool premul = op == ncclAvg && is_float(t);
                for (int q = 0; q < parts; q++) {
                    /* one rank: its own buffer; several: each rank's part in its slot */
                    double x = get(t, parts == 1 ? send + i0 * es : c->area->slot[q], i);
                    if (premul) x = t == ncclFloat64 ? x / c->size : (double)((float)x * (1.0f / (float)c->size));
                    if (q == 0) v = x;
                    else if (op == ncclMax) v = x > v || x != x ? x : v;
                    else if (op == ncclMin) v = x < v || x != x ? x : v;
                    else if (op == ncclProd) v = is_float(t) && t != ncclFloat64 ? (double)((float)v * (float)x) : v * x;
                    else v = is_float(t) && t != ncclFloat64 ? (double)((float)v + (float)x) : v + x;
                }
                if (op == ncclAvg && !premul) v = (double)((int64_t)v / c->size);
                put(t, res.data(), i, v);
            }
            memcpy(recv + i0 * es, res.data(), n * es);
        };
        if (c->size == 1) reduce(1);
        else if (!exchange(c, send + i0 * es, n * es, [&] { reduce(c->size); })) return false;
        if (count == 0) break;
    }
    return true;
}

static bool broadcast(ncclComm *c, const char *send, char *recv, size_t bytes, int root)
{
    if (c->size == 1) {
        memmove(recv, send, bytes);
        return true;
    }
    for (size_t o = 0; o < bytes || (o == 0 && bytes == 0); o += SLOT) {
        size_t n = bytes - o < SLOT ? bytes - o : SLOT;
        std::vector<char> tmp(n + 1);
        if (!exchange(c, c->rank == root ? send + o : tmp.data(), n, [&] { memcpy(tmp.data(), c->area->slot[root], n); }))
            return false;
        memcpy(recv + o, tmp.data(), n);
        if (bytes == 0) break;
    }
    return true;
}

static bool all_gather(ncclComm *c, const char *send, char *recv, size_t bytes)
{
    if (c->size == 1) {
        memmove(recv, send, bytes);
        return true;
    }
    for (size_t o = 0; o < bytes || (o == 0 && bytes == 0); o += SLOT) {
        size_t n = bytes - o < SLOT ? bytes - o : SLOT;
        std::vector<char> tmp((size_t)c->size * n + 1);
        if (!exchange(c, send + o, n, [&] {
                for (int q = 0; q < c->size; q++) memcpy(tmp.data() + (size_t)q * n, c->area->slot[q], n);
            }))
            return false;
        for (int q = 0; q < c->size; q++) memcpy(recv + (size_t)q * bytes + o, tmp.data() + (size_t)q * n, n);
        if (bytes == 0) break;
    }
    return true;
}

static bool on_device(const void *p, size_t bytes)
{
    region r;
    return find_region(p, &r) && (r.kind & MEM_DEVICE) && bytes <= r.size - (size_t)((const char *)p - r.base);
}

/* checked now; run now, after what its stream was given (see the top) */
template <class F> static ncclResult_t collective(const char *call, ncclComm_t c, cudaStream_t s, F body)
{
    if (!comms.count(c)) return bad(ncclInvalidArgument, "%s: not a live communicator", call);
    if (!stream_valid(s)) return bad(ncclInvalidArgument, "%s: stream %p is not live", call, (void *)s);
    if (sticky_error() != cudaSuccess) return bad(ncclUnhandledCudaError, "%s: the device has failed", call);
    sync_stream_exact(s);   /* what its stream was made to wait for, and no more */
    if (!body()) return bad(ncclSystemError, "%s: %s", call, cudaGetErrorString(sticky_error()));
    return ncclSuccess;
}

extern "C" {

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s)
{
    size_t es = type_size(t);
    if (!es || (int)op < 0 || (int)op > ncclAvg) return bad(ncclInvalidArgument, "ncclAllReduce: type %d, op %d", (int)t, (int)op);
    if (count && (!on_device(send, count * es) || !on_device(recv, count * es)))
        return bad(ncclInvalidArgument, "ncclAllReduce: %zu elements at %p and %p: not inside device memory", count, send, recv);
    return collective("ncclAllReduce", c, s, [=] { return all_reduce(c, (const char *)send, (char *)recv, count, t, op); });
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s)
{
    size_t es = type_size(t);
    if (!es || !comms.count(c) || root < 0 || root >= c->size)
        return bad(ncclInvalidArgument, "ncclBroadcast: type %d, root %d", (int)t, root);
    if (count && ((c->rank == root && !on_device(send, count * es)) || !on_device(recv, count * es)))
        return bad(ncclInvalidArgument, "ncclBroadcast: %zu elements at %p and %p: not inside device memory", count, send, recv);
    return collective("ncclBroadcast", c, s, [=] { return broadcast(c, (const char *)send, (char *)recv, count * es, root); });
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t s)
{
    size_t es = type_size(t);
    if (!es || !comms.count(c)) return bad(ncclInvalidArgument, "ncclAllGather: type %d", (int)t);
    if (count && (!on_device(send, count * es) || !on_device(recv, count * es * (size_t)c->size)))
        return bad(ncclInvalidArgument, "ncclAllGather: %zu elements at %p, %d x into %p: not inside device memory", count,
                   send, c->size, recv);
    return collective("ncclAllGather", c, s, [=] { return all_gather(c, (const char *)send, (char *)recv, count * es); });
}

}  // extern "C"
