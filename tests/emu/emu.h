/*
 * emu.h: what the parts of the emulated CUDA device share (tests/emu).
 *
 *   emu_device.h   the device language for the host compiler (force-included
 *                  into each .cu file of kernels/cuda)
 *   emu_fiber.cc   one fiber per CUDA thread: stacks and the context switch
 *   emu_sched.cc   running a kernel: blocks, thread orders, barriers and warp
 *                  operations, deadlocks, the comparison of thread orders
 *   emu_wmma.cc    the WMMA collectives (load, store, mma_sync of fragments)
 *   emu_runtime.cc the CUDA runtime: memory and what kind each byte is,
 *                  streams that run their work only when the host needs it,
 *                  events, copies, errors, device properties, stream
 *                  capture into graphs and their launches
 *   emu_cublas.cc, emu_cublaslt.cc, emu_cudnn.cc, emu_nccl.cc
 *                  the library calls the backend makes, checked as the
 *                  libraries' manuals specify and computed with the CPU
 *                  backend's kernels
 */
#ifndef MP_EMU_H
#define MP_EMU_H

#include <cublas_api.h>   /* cublasStatus_t: blas_refused */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "tests/emu/emu_device.h"

namespace mp_emu {

/* ---- fibers (emu_fiber.cc) ---- */
struct fiber;
fiber *fiber_new(void (*entry)(void));
void fiber_reset(fiber *f);            /* its next switch_to starts entry afresh */
void switch_to(fiber *f);              /* from the scheduler into f */
void switch_back(fiber *f);            /* from f (the running fiber) to the scheduler */

/* ---- memory (emu_runtime.cc) ---- */
enum mem_kind { MEM_DEVICE = 1, MEM_PINNED = 2, MEM_MAPPED = 4, MEM_SYMBOL = 8 };
struct region {
    char *base;
    size_t size;
    int kind;
};
/* the allocation p points into (or one past), false when none */
bool find_region(const void *p, region *r);
bool device_visible(const region &r);  /* kernels may touch it */
/* the device-variable section (MP_DEVICE_GLOBAL) */
region symbols();

/* ---- errors (emu_runtime.cc) ----
 * record: the error of the API call that returns it (cudaGetLastError takes
 * it); sticky: a fault on the device, which every later call returns (as
 * after an illegal address). Both keep their text, which cudaGetErrorString
 * gives for that code. They return e. */
cudaError_t record(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t sticky(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t sticky_error();            /* cudaSuccess while the context is sound */
/* a fault found while work runs that does not break the context (a race
 * report): cudaGetLastError returns it once */
void report_async(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the text cudaGetErrorString(e) gives next, for a library's failure that the
 * backend turns into e (cuBLAS, cuDNN), without setting the last error */
void describe(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the text of the last error recorded with code e */
const char *detail_for(cudaError_t e);

/* ---- streams (emu_runtime.cc) ----
 * Work queued on a stream runs when the host needs it (a synchronisation, a
 * copy to pageable memory, an event query), streams other than the one waited
 * for first, as far as their events let them. fn runs on the host thread that
 * waits; what it returns: false when it failed (its error set). */
bool enqueue(cudaStream_t s, const char *what, std::function<bool()> fn);
cudaError_t sync_stream(cudaStream_t s);
/* s's work, and of the other streams only what s waits for */
cudaError_t sync_stream_exact(cudaStream_t s);
cudaError_t sync_device();
bool stream_valid(cudaStream_t s);
/* the queueing of every library product on s (emu_cublas.cc): cuBLAS's gemms
 * and cuBLASLt's matmuls (emu_cublaslt.cc) go through it alike */
bool queue_product(cudaStream_t s, const char *what, std::function<bool()> fn);
/* a refused cuBLAS / cuBLASLt call: its status, described as the nearest CUDA
 * error (lib: "cuBLAS" or "cuBLASLt"; emu_cublas.cc) */
cublasStatus_t blas_refused(const char *lib, cublasStatus_t s, const char *call, const char *fmt, va_list ap);

/* ---- kernels (emu_sched.cc) ---- */
struct kernel_run {
    launch_desc d;
    std::shared_ptr<void> keep;
    void (*body)(void *);
    void *arg;
    std::vector<const void *> ptrs;
};
bool run_kernel(kernel_run &k);
/* cudaFuncAttributeMaxDynamicSharedMemorySize, and what a block of the kernel may have */
int set_max_dynamic(const void *kernel, int bytes);
size_t shared_limit(const void *kernel);
size_t dynamic_limit(const void *kernel);
size_t static_shared(const void *kernel);   /* as far as its first block showed */
/* the kernel's name from its site's text, as written (up to the first top-level comma) */
std::string kernel_name(const site *at);
const char *site_string(const site *at);   /* "kernels/cuda/x.cu:123 k_name" */

/* ---- settings (emu_runtime.cc): from the environment, once ---- */
struct settings {
    int order;              /* 0 forward, 1 reverse, 2 shuffle */
    uint64_t seed;
    bool racecheck;         /* run each kernel in three orders and compare */
    int stream_order;       /* 0: other streams first, 1: the waited-for stream first */
    size_t memory;          /* bytes of device memory */
    const char *coverage;   /* file that launches are appended to, at exit */
};
const settings &config();
settings &config_mut();     /* the emulator's own tests change them */

/* counts for the emulator's own tests (extern "C" mp_emu_stats) */
struct stats {
    long live_streams, live_events, live_allocs, live_pinned, live_blas, live_dnn, live_nccl;
    size_t device_bytes;
    long launches, kernel_runs, order_diffs_allowed;
    long live_graphs;       /* captured graphs and their executable copies */
};
stats &counters();

}  // namespace mp_emu

extern "C" const char *cudaGetErrorString_std(cudaError_t e);   /* the runtime's own text for e */

#endif
