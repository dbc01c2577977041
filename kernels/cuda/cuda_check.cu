/*
 * cuda_check.cu: index checks on the device (mp_backend.check_indices), so that
 * a training step never waits for the GPU to learn that its indices are good.
 *
 * check_indices queues two kernels and returns at once:
 * - k_check_find: every thread compares its indices with [0, limit) and the
 *   bad ones take the smallest position with atomicMin on a device word, so the
 *   index reported is the first bad one, as the CPU's check reports it;
 * - k_check_report, one thread: when a bad index was found and no fault is
 *   waiting to be reported, it writes the fault (value, position, limit and the
 *   caller's `what` pointer) into a record in mapped, pinned host memory, then
 *   __threadfence_system(), then the record's flag; and it resets the device
 *   word for the next check.
 * Every kernel of this backend runs on one stream, so the one-thread kernels of
 * successive checks never run at the same time: the record has one writer on
 * the device, and the host (mp_cuda_fault_take, from the backend's error entry)
 * reads it only once the flag is set and clears the flag last. No copy and no
 * synchronisation is involved; the error is raised by the first error() call
 * after the check has run on the device. Meanwhile the kernels that take
 * indices (gather, scatter_add, put_along, cross-entropy) leave a bad one out.
 */
#include <stdio.h>
#include <string.h>
#include "kernels/cuda/cuda.h"

namespace {

/* the record in mapped host memory: flag 0 (empty) or 1 (a fault to report) */
struct Fault {
    int32_t flag;
    int32_t value;
    int64_t pos;      /* 0-based */
    int64_t limit;
    uint64_t what;    /* the caller's string, as an integer */
};

/* the record lives in the context: cx->fault_host (the host's view, NULL when
 * unavailable) and cx->fault_dev (the device's) */

#define NO_BAD (~0ull)

}  // namespace

/* the first bad position of the check in flight, NO_BAD when none: the device's
 * own state (one check is in flight at a time on the context's stream) */
static MP_DEVICE_GLOBAL unsigned long long mp_check_first = NO_BAD;

static __global__ void k_check_find(const int32_t *idx, int64_t n, int64_t limit)
{
    MP_FOR(i, n) {
        int32_t v = idx[i];
        if ((v < 0 || v >= limit) && (unsigned long long)i < mp_check_first)
            atomicMin(&mp_check_first, (unsigned long long)i);
    }
}

static __global__ void k_check_report(const int32_t *idx, int64_t limit, uint64_t what, Fault *f)
{
    unsigned long long p = mp_check_first;
    if (p == NO_BAD) return;
    mp_check_first = NO_BAD;
    volatile Fault *vf = f;
    if (vf->flag) return;   /* an earlier fault still waits to be reported: it stays the one */
    vf->value = idx[p];
    vf->pos = (int64_t)p;
    vf->limit = limit;
    vf->what = what;
    __threadfence_system();   /* the fields reach the host before the flag */
    vf->flag = 1;
}

bool mp_cuda_check_init(mp_kctx *cx)
{
    void *h = NULL, *d = NULL;
    if (cudaHostAlloc(&h, sizeof(Fault), cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeHost(h);
        return false;
    }
    memset(h, 0, sizeof(Fault));
    cx->fault_host = h;
    cx->fault_dev = d;
    return true;
}

void mp_cuda_check_indices(mp_kctx *cx, const int32_t *idx, int64_t n, int64_t limit, const char *what)
{
    if (n <= 0 || !cx->fault_dev) return;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, k_check_find, idx, n, limit);
    MP_LAUNCHED("check_indices");
    MP_LAUNCH(1, 1, 0, cx->stream, k_check_report, idx, limit, (uint64_t)(uintptr_t)what, (Fault *)cx->fault_dev);
    MP_LAUNCHED("check_indices (report)");
}

/* a recorded fault as the CPU's check words it (position 1-based), once */
bool mp_cuda_fault_take(mp_kctx *cx, char *msg, size_t cap)
{
    if (!cx->fault_host) return false;
    volatile Fault *f = (Fault *)cx->fault_host;
    if (!f->flag) return false;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);   /* the fields are read after the flag */
    int32_t value = f->value;
    int64_t pos = f->pos, limit = f->limit;
    const char *what = (const char *)(uintptr_t)f->what;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    f->flag = 0;
    snprintf(msg, cap, "%s: %d at position %lld out of range [0, %lld)", what ? what : "index", (int)value,
             (long long)pos + 1, (long long)limit);
    return true;
}
