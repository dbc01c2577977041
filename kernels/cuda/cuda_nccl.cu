/*
 * cuda_nccl.cu: the CUDA backend's collectives (backend.h, coll_*) over NCCL,
 * on the backend's stream.
 *
 * NCCL is loaded with dlopen the first time a group is made (mp.dist with
 * CUDA tensors), not linked: a program that never uses mp.dist on a GPU does
 * not need libnccl, nor pay for loading it. Its types come from the toolkit's
 * nccl.h at compile time. The communicator lives in the context (cx->nccl).
 * Collectives run on the backend's stream, or between coll_fork and
 * coll_merge on a second one (the data-parallel buckets during backward).
 * Failures go to the sticky error with NCCL's own message, as a kernel's do.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <nccl.h>
#include "kernels/cuda/cuda.h"

static struct {
    bool tried;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_version)(int *);
    char why[512];
} lib;

/* libnccl's entries, once; false with the reason in lib.why. MP_NCCL_LIBRARY
 * names another library to take them from (a particular NCCL build; the
 * emulated device's, tests/emu) */
static bool load(void)
{
    if (lib.tried) return lib.all_reduce != NULL;
    lib.tried = true;
    const char *want = getenv("MP_NCCL_LIBRARY");
    void *h = want && *want ? dlopen(want, RTLD_NOW | RTLD_LOCAL) : dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h && !(want && *want)) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lib.why, sizeof lib.why, "NCCL cannot be loaded (%.200s): %s", want && *want ? want : "libnccl.so.2",
                 dlerror());
        return false;
    }
#define SYM(field, name)                                                                         \
    if (!(*(void **)&lib.field = dlsym(h, name))) {                                              \
        snprintf(lib.why, sizeof lib.why, "libnccl.so.2 has no %s", name);                       \
        lib.all_reduce = NULL;                                                                   \
        return false;                                                                            \
    }
    SYM(get_unique_id, "ncclGetUniqueId")
    SYM(comm_init_rank, "ncclCommInitRank")
    SYM(broadcast, "ncclBroadcast")
    SYM(all_gather, "ncclAllGather")
    SYM(comm_destroy, "ncclCommDestroy")
    SYM(error_string, "ncclGetErrorString")
    SYM(get_version, "ncclGetVersion")
    SYM(all_reduce, "ncclAllReduce")   /* last: it marks the library as loaded */
#undef SYM
    return true;
}

static void note(mp_kctx *cx, ncclResult_t r, const char *what)
{
    if (r == ncclSuccess || cx->has_error) return;
    snprintf(cx->error_msg, sizeof cx->error_msg, "NCCL error in %s: %s", what, lib.error_string(r));
    cx->has_error = true;
}

static ncclDataType_t nccl_type(mp_dtype dt)
{
    switch (dt) {
    case MP_F16: return ncclFloat16;
    case MP_BF16: return ncclBfloat16;
    case MP_I32: return ncclInt32;
    case MP_U8: return ncclUint8;
    case MP_F32: return ncclFloat32;
    case MP_F64: return ncclFloat64;
    case MP_E4M3:   /* moved as bytes: FP8 is reduced by no collective */
    case MP_E5M2: return ncclUint8;
    }
    return ncclFloat32;   /* not a dtype */
}

int mp_cuda_coll_id(mp_kctx *cx, void *id, size_t cap, char *why, size_t why_cap)
{
    if (!load()) return snprintf(why, why_cap, "%s", lib.why), -1;
    if (cap < sizeof(ncclUniqueId)) return snprintf(why, why_cap, "no room for NCCL's unique id"), -1;
    ncclUniqueId u;
    ncclResult_t r = lib.get_unique_id(&u);
    if (r != ncclSuccess) return snprintf(why, why_cap, "ncclGetUniqueId: %s", lib.error_string(r)), -1;
    memcpy(id, &u, sizeof u);
    return (int)sizeof u;
}

int mp_cuda_coll_join(mp_kctx *cx, const void *id, size_t nbytes, int rank, int size, char *why,
                                 size_t why_cap)
{
    if (!load()) return snprintf(why, why_cap, "%s", lib.why), -1;
    if (nbytes != sizeof(ncclUniqueId)) return snprintf(why, why_cap, "NCCL's unique id has %zu bytes, not %zu", sizeof(ncclUniqueId), nbytes), -1;
    if (cx->nccl) return 0;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t comm;
    ncclResult_t r = lib.comm_init_rank(&comm, size, u, rank);
    if (r != ncclSuccess) return snprintf(why, why_cap, "ncclCommInitRank: %s", lib.error_string(r)), -1;
    cx->nccl = comm;
    return 0;
}

/* the stream collectives run on: the second one between coll_fork and coll_merge */
static cudaStream_t coll_stream(mp_kctx *cx) { return cx->coll_on_side ? cx->coll_stream : cx->stream; }

void mp_cuda_coll_all_reduce(mp_kctx *cx, mp_dtype dt, void *buf, int64_t n, mp_coll_op op)
{
    ncclRedOp_t o = op == MP_COLL_MAX ? ncclMax : op == MP_COLL_MIN ? ncclMin : op == MP_COLL_AVG ? ncclAvg : ncclSum;
    note(cx, lib.all_reduce(buf, buf, (size_t)n, nccl_type(dt), o, (ncclComm_t)cx->nccl, coll_stream(cx)), "all_reduce");
}

/* the second stream, made at the first fork, waits for the main stream as it
 * is now (the event is recorded again each time: a wait takes the event's
 * state at the call) */
void mp_cuda_coll_fork(mp_kctx *cx)
{
    if (!cx->coll_stream) {
        cudaStream_t s;
        cudaEvent_t e;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            MP_CUDA_CHECK(cudaGetLastError(), "coll_fork: cudaStreamCreate");
            return;   /* the collectives stay on the main stream */
        }
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
            MP_CUDA_CHECK(cudaGetLastError(), "coll_fork: cudaEventCreate");
            cudaStreamDestroy(s);
            return;
        }
        cx->coll_stream = s, cx->coll_event = e;
    }
    MP_CUDA_CHECK(cudaEventRecord(cx->coll_event, cx->stream), "coll_fork: cudaEventRecord");
    MP_CUDA_CHECK(cudaStreamWaitEvent(cx->coll_stream, cx->coll_event, 0), "coll_fork: cudaStreamWaitEvent");
    cx->coll_on_side = true;
}

/* the main stream waits for everything the second one was given */
void mp_cuda_coll_merge(mp_kctx *cx)
{
    if (!cx->coll_on_side) return;
    MP_CUDA_CHECK(cudaEventRecord(cx->coll_event, cx->coll_stream), "coll_merge: cudaEventRecord");
    MP_CUDA_CHECK(cudaStreamWaitEvent(cx->stream, cx->coll_event, 0), "coll_merge: cudaStreamWaitEvent");
    cx->coll_on_side = false;
}

void mp_cuda_coll_broadcast(mp_kctx *cx, void *buf, size_t nbytes, int root)
{
    note(cx, lib.broadcast(buf, buf, nbytes, ncclUint8, root, (ncclComm_t)cx->nccl, coll_stream(cx)), "broadcast");
}

void mp_cuda_coll_all_gather(mp_kctx *cx, const void *send, void *recv, size_t nbytes)
{
    note(cx, lib.all_gather(send, recv, nbytes, ncclUint8, (ncclComm_t)cx->nccl, coll_stream(cx)), "all_gather");
}

/* the group ends, and the second stream and its event with it */
void mp_cuda_coll_leave(mp_kctx *cx)
{
    if (!cx->nccl) return;
    mp_cuda_coll_merge(cx);
    MP_CUDA_CHECK(mp_cuda_wait(cx), "coll_leave");   /* what is queued on the communicator ends first */
    lib.comm_destroy((ncclComm_t)cx->nccl);
    cx->nccl = NULL;
    if (cx->coll_stream) MP_CUDA_CHECK(cudaStreamDestroy(cx->coll_stream), "coll_leave: cudaStreamDestroy");
    if (cx->coll_event) MP_CUDA_CHECK(cudaEventDestroy(cx->coll_event), "coll_leave: cudaEventDestroy");
    cx->coll_stream = NULL, cx->coll_event = NULL;
}
