/*
 * backend.h: the one contract between the engine and its kernels.
 *
 * A backend (kernels/cpu, kernels/cuda) is an object: one mp_backend table of
 * function pointers and its context, which the table carries (ctx) and every
 * entry takes first. The context is the backend's own state, opaque to the
 * engine: the CPU's caching allocator and scratch space; on CUDA the stream, the
 * cuBLAS handle and workspace, scratch, the sticky error, the staging buffers,
 * and the room where cuDNN handles and plan caches and an NCCL communicator go.
 * Kernels take their temporary memory from it (never malloc inside a kernel),
 * and an entry that can fail for want of it returns -1, which the engine turns
 * into an error. The engine calls kernels only through the table. A kernel
 * takes raw pointers, sizes, dtypes and scalars, and trusts its caller: every
 * argument was checked once, in engine/. Nothing here knows about tensors,
 * autograd or Lua.
 *
 * Numerics (docs/DESIGN.md section 3): an op on f16/bf16 data widens its inputs to f32,
 * computes in f32 and rounds its output once. An op on f64 data computes and
 * accumulates in f64 (the CPU's; other backends decline f64 in supports).
 */
#ifndef MP_BACKEND_H
#define MP_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "kernels/fp8_scaled.h"   /* mp_fp8_operand: the fp8 entries */

#define MP_MAXDIM 8

/* a compile-time check, in C (the engine, the CPU kernels) and C++ (the CUDA kernels) */
#ifdef __cplusplus
#define MP_STATIC_ASSERT(cond, why) static_assert(cond, why)
#else
#define MP_STATIC_ASSERT(cond, why) _Static_assert(cond, why)
#endif

/* The counts are not enumerators, so that a switch over a dtype or device
 * lists the real ones and needs no default (-Wswitch then flags every switch a
 * new one must reach): a new dtype goes last and MP_NDTYPES names it; every
 * table sized by a count asserts that it has one entry per value. */
/* MP_E4M3 / MP_E5M2 are OCP FP8 (kernels/fp8.h), storage dtypes: casts, copies
 * and layout ops move them; the engine refuses them to every op that computes */
typedef enum { MP_F32, MP_F16, MP_BF16, MP_I32, MP_U8, MP_F64, MP_E4M3, MP_E5M2 } mp_dtype;
#define MP_NDTYPES (MP_E5M2 + 1)
typedef enum { MP_CPU, MP_CUDA } mp_device;
#define MP_NDEVICES (MP_CUDA + 1)

static inline size_t mp_dtype_size(mp_dtype t)
{
    static const size_t sz[] = {4, 2, 2, 4, 1, 8, 1, 1};   /* f32, f16, bf16, i32, u8, f64, e4m3, e5m2 */
    MP_STATIC_ASSERT(sizeof sz / sizeof sz[0] == MP_NDTYPES, "a size for every dtype");
    return sz[t];
}

/* Elementwise binary ops; `out = a OP b` with broadcasting described by mp_bcast.
 * MP_POWT is a^b (a tensor exponent; the unary MP_POW takes a number): floats
 * by powf in f32, integers as PyTorch's (kernels/int_rules.h). The comparisons
 * write u8 0/1 whatever the input dtype, and come last (MP_IS_CMP). */
typedef enum {
    MP_ADD, MP_SUB, MP_MUL, MP_DIV, MP_POWT, MP_GT, MP_LT, MP_GE, MP_LE, MP_EQ, MP_NE
} mp_binop;
#define MP_NBINOPS (MP_NE + 1)   /* a count, not a code: switches over mp_binop need no default */
#define MP_IS_CMP(op) ((op) >= MP_GT)

/* Elementwise unary ops; `p` is the op's scalar: x^p (MP_POW), x*p (MP_MULS),
 * x+p (MP_ADDS), p-x (MP_RSUBS), x/p (MP_DIVS), p/x (MP_RDIVS); MP_GELU uses the
 * erf form when p == 0 and the tanh approximation otherwise; MP_DROPMASK maps a
 * uniform x to 1/(1-p) when x >= p, else 0 (a dropout mask); MP_SILU is
 * x * sigmoid(x). MP_SIN and MP_COS take radians. */
typedef enum {
    MP_NEG, MP_ABS, MP_EXP, MP_LOG, MP_SQRT, MP_POW, MP_MULS, MP_ADDS, MP_RSUBS, MP_DIVS,
    MP_RDIVS, MP_RELU, MP_TANH, MP_SIGMOID, MP_GELU, MP_DROPMASK, MP_SILU, MP_SIN, MP_COS
} mp_unop;
#define MP_NUNOPS (MP_COS + 1)   /* a count, as MP_NBINOPS */

/* Reductions over the middle axis of a {outer, n, inner} view. MP_ARGMAX and
 * MP_ARGMIN write i32 indices (0-based, the first maximum or minimum); the
 * others write the input dtype. NaN wins both max and min (it propagates, and
 * arg* point at the first NaN), as in PyTorch. n >= 1. */
typedef enum { MP_SUM, MP_MEAN, MP_MAX, MP_ARGMAX, MP_MIN, MP_ARGMIN } mp_redop;
#define MP_NREDOPS (MP_ARGMIN + 1)   /* a count, as MP_NBINOPS */

/* The reductions of a collective across processes (kernels/comm.h, and the
 * backends' coll_* entries): mp.dist.all_reduce's "mean" is a sum the engine
 * then divides; AVG (the sum divided by the world's size in the same pass) is
 * for the backends' coll_all_reduce only, never MPI's */
typedef enum { MP_COLL_SUM, MP_COLL_MAX, MP_COLL_MIN, MP_COLL_AVG } mp_coll_op;

/* Broadcast description for a binary op: the output shape and, for each input,
 * its stride (in elements) along each output dim; 0 where the input broadcasts. */
typedef struct {
    int ndim;
    int64_t shape[MP_MAXDIM];
    int64_t sa[MP_MAXDIM];
    int64_t sb[MP_MAXDIM];
} mp_bcast;

/* merge adjacent dims of a broadcast that are contiguous for both inputs (fewer,
 * longer loops for any backend); returns the new ndim, at least 1 */
static inline int mp_bcast_coalesce(const mp_bcast *in, mp_bcast *bc)
{
    int n = 0;
    for (int i = 0; i < in->ndim; i++) {
        if (n > 0 && bc->sa[n - 1] == in->sa[i] * in->shape[i] && bc->sb[n - 1] == in->sb[i] * in->shape[i]) {
            bc->shape[n - 1] *= in->shape[i];
            bc->sa[n - 1] = in->sa[i];
            bc->sb[n - 1] = in->sb[i];
        } else {
            bc->shape[n] = in->shape[i], bc->sa[n] = in->sa[i], bc->sb[n] = in->sb[i];
            n++;
        }
    }
    if (n == 0) bc->shape[0] = 1, bc->sa[0] = bc->sb[0] = 0, n = 1;
    return bc->ndim = n;
}

/* Optimizer updates over flat f32 arrays (masters, gradients, state). The step
 * count lives in the backend's memory next to the state (see optim_count), so
 * that a step the loss scaler skips on the device is not counted; the bias
 * corrections that depend on it are computed by the kernel from the doubles
 * below, as PyTorch computes them in Python (kernels/step_rules.h). */
typedef enum { MP_SGD, MP_ADAM, MP_ADAMW, MP_RMSPROP, MP_ADAGRAD } mp_optim_kind;
/* the number of kinds: a new kind goes last and this names it. The engine's
 * descriptor of each kind (engine/optim.h: mp_optim_kinds) is checked against
 * it, and the kernels' switches over the kind have no default: a new kind is
 * a compile error (-Wswitch) at each step rule that must learn it */
#define MP_NOPTIM_KINDS (MP_ADAGRAD + 1)
typedef struct {
    float lr, momentum, weight_decay, beta1, beta2, eps;
    /* 1 - x factors, computed in double and rounded once as PyTorch does in Python */
    float one_minus_dampening, one_minus_beta1, one_minus_beta2, decay;   /* decay: 1 - lr*wd */
    double lr_d, beta1_d, beta2_d; /* for Adam's bias corrections */
    int nesterov;
    /* RMSprop: alpha and 1 - alpha; centered keeps grad_avg in s3. Adagrad:
     * lr / (1 + (step - 1) * lr_decay) from lr_d and lr_decay_d at the step */
    float alpha, one_minus_alpha;
    int centered;
    double lr_decay_d;
    /* a third state array (RMSprop's grad_avg when centered; NULL: none), in
     * the same backend memory as s1 and s2, at the same offset as p */
    float *s3;
} mp_optim_args;

/* What the loss scaler's unscale pass measures over a run of scaled f32
 * gradients: non-finite values, the largest magnitude, and with telemetry the
 * values that are zero, that would round to zero (|x| <= 2^-25) or to inf
 * (|x| >= 65520) in f16 at the current scale, and a log2 histogram of |x|:
 * bin i counts 2^(i+MP_HIST_LO) <= |x| < 2^(i+1+MP_HIST_LO), clamped at both ends. */
/* the slots of flush counting (flush_slot): backward ops with distinct names */
#define MP_FLUSH_SLOTS 64

#define MP_HIST_BINS 64
#define MP_HIST_LO (-48)
typedef struct {
    int64_t n, nan, inf, zeros, underflow, overflow;
    float amax;                    /* of the finite scaled values */
    int64_t hist[MP_HIST_BINS];
} mp_grad_stats;

/* ---- the loss scaler's state (docs/DESIGN.md section 6) ----
 * It lives in the backend's memory (device memory on a GPU): the scale, what a
 * step found, the skip decision and the built-in policies' counters are read
 * and written by kernels only, so a training step with a built-in policy never
 * waits for the device. The host reads it back only when a script asks. */
typedef enum {
    MP_POLICY_STATIC, MP_POLICY_NONE, MP_POLICY_DYNAMIC, MP_POLICY_HYSTERESIS, MP_POLICY_AMAX,
    MP_POLICY_EXTERNAL
} mp_policy_kind;

typedef struct {
    mp_policy_kind kind;
    double init, growth, backoff, min, max;   /* min/max: 0 means unbounded */
    int64_t interval;                         /* dynamic: growth interval; hysteresis: window */
    int hysteresis;                           /* hysteresis: overflows tolerated before a backoff */
    bool error_at_min;                        /* on_min = "error": raise at the floor, else warn once */
    int history;                              /* amax: steps of history */
    double margin;                            /* amax: powers of two below f16's max */
} mp_policy;

#define MP_AMAX_HISTORY_MAX 1024
#define MP_SCALER_MAX_OPTIMS 16

typedef struct {
    float scale;                   /* what scale_loss multiplies by and unscale divides by */
    float stats_scale;             /* the scale of this step's statistics */
    int32_t loss_bad;              /* this step: a loss given to scale_loss was inf/NaN */
    int32_t skip;                  /* the last DECIDE: the optimizer step is skipped */
    int32_t at_min;                /* at its floor and still overflowing: 1 (warn), 2 (on_min = "error") */
    int32_t warned_at_min;
    int32_t hyst_left, amax_count, amax_pos;
    int32_t last_skip;             /* why the last skipped step was skipped: 1 overflow, 2 NaN, 3 forward */
    int64_t tracker;               /* dynamic: clean steps in a row; hysteresis: iteration */
    int64_t last_overflow;         /* hysteresis: iteration of the last overflow */
    int64_t steps, skipped;
    float amax_hist[MP_AMAX_HISTORY_MAX];
    mp_grad_stats slot[MP_SCALER_MAX_OPTIMS];   /* this step, per optimizer, of the scaled gradients */
    /* data parallel: what this rank found (MP_SCALE_EXPORT), reduced with max
     * over the ranks in place, then taken back (MP_SCALE_IMPORT): loss_bad, and
     * per slot nan > 0, inf > 0 and amax */
    float found[1 + 3 * MP_SCALER_MAX_OPTIMS];
} mp_scale_state;

/* the small state operations, run once per step (kernels/step_rules.h) */
typedef enum {
    MP_SCALE_BEGIN,    /* a new step: clear its findings */
    MP_SCALE_DECIDE,   /* skip = loss_bad or slot[arg] not finite; count the step */
    MP_SCALE_UPDATE,   /* the built-in policy's rule */
    MP_SCALE_SET,      /* scale = value */
    MP_SCALE_EXPORT,   /* found = what this step found so far */
    MP_SCALE_IMPORT    /* the findings from found (reduced over the ranks) */
} mp_scale_op;

/* scaled dot-product attention over bh heads of {t, d} rows (kernels/cpu/cpu_attention.c) */
typedef struct {
    int64_t bh, tq, tk, d;   /* heads (batch x heads), query rows, key rows, head dim */
    float scale;             /* of the scores q . k */
    int causal;              /* query i sees keys j <= i */
    float dropout;           /* p: probabilities dropped with Philox draws at (seed, offset + (r*tq + i)*tk + j) */
    uint64_t seed, offset;
    int rng_graph;           /* the draws are the open capture's: offset relative to its start, the seed that of
                                each replay (graph_replay below); 0: seed and offset as given */
} mp_attn_args;

/* 2-d convolution over NCHW tensors (kernels/cpu/cpu_conv.c): x {n, c, h, w},
 * w {k, c / groups, r, s}, y {n, k, oh, ow}; output pixel (i, j) reads input row
 * i * sh - ph + u * dh and column j * sw - pw + v * dw for kernel tap (u, v);
 * taps outside the input read zeros */
typedef struct {
    int64_t n, c, h, w;      /* input */
    int64_t k, r, s;         /* output channels, kernel rows and columns */
    int64_t oh, ow;          /* output rows and columns */
    int64_t sh, sw, ph, pw, dh, dw, groups;
} mp_conv_args;

/* 2-d pooling over the planes of {n * c, h, w} (kernels/cpu/cpu_pool.c): window
 * (i, j) covers input rows i * sh - ph + [0, kh) and columns j * sw - pw + [0, kw)
 * clipped to the input; adaptive: rows [floor(i h / oh), ceil((i + 1) h / oh)) and
 * the same for columns (kh, kw, sh, sw, ph, pw unused). Average pooling divides
 * by kh * kw (padding counted, PyTorch's default), adaptive by the window's size. */
typedef struct {
    int64_t planes, h, w, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw;
    int adaptive;
} mp_pool_args;

/* gather/scatter along dim (PyTorch's gather, scatter, scatter_add): the index
 * is a contiguous i32 array of shape shape[0..ndim); its element at coordinates
 * c stands for x's element at sum over d != dim of c[d] * xs[d], plus idx[c] *
 * xs[dim] (xs: x's strides in elements, x contiguous and at least as large as
 * the index in every dim but dim). n is x's size along dim: values outside [0,
 * n) are left out by asynchronous backends (check_indices reports them) */
typedef struct {
    int ndim, dim;
    int64_t shape[MP_MAXDIM];
    int64_t xs[MP_MAXDIM];
    int64_t n;
} mp_along_args;

/* a backend's context: each backend defines struct mp_kctx for itself */
typedef struct mp_kctx mp_kctx;

/* ---- the entries ----
 * Each entry of the contract is written here once, as
 *   X(return type, name, (parameters), (the parameters' names))
 * and everything else is generated from this list: the function type of each
 * entry (mp_be_<name>_fn, with which a backend declares its kernels:
 * `mp_be_gemm_fn cpu_gemm;`, so the compiler checks each against the
 * contract), the table's fields, and any generic wrapper of a whole table
 * (tests/device/fake_cuda.c forwards every entry through the names). Every
 * entry takes the backend's context first. An entry a backend leaves NULL it
 * does not have; the engine declines an op whose entry is NULL (engine/op.h:
 * mp_op's needs) with the same error as a no from supports.
 *
 * The entries are typed, one per kind of kernel, rather than one entry that
 * dispatches on an op description (ggml's graph_compute): a kernel's arguments
 * are raw pointers, sizes and small argument structs, so kernels stay free of
 * the engine's tensors, and the compiler checks every call and every kernel
 * against its signature. */
#define MP_BACKEND_ENTRIES(X)                                                                                           \
    /* whether this backend runs the op of that name (engine/op.h) on inputs of                                         \
     * dtype dt; the engine asks before each op and turns a no into an error                                            \
     * naming op, dtype and device. NULL: every op in every dtype. Asked for the                                        \
     * op "tensor" before a tensor of dtype dt is made on the backend: a no                                             \
     * means no tensor of that dtype at all (CUDA and f64) */                                                           \
    X(bool, supports, (mp_kctx *cx, const char *op, mp_dtype dt), (cx, op, dt))                                         \
    /* memory: alloc returns NULL on failure; bytes are device bytes. Both go                                           \
     * through the backend's caching allocator (kernels/block_cache.h): cached                                          \
     * says how many bytes it holds in free blocks, release_cache gives them all                                        \
     * back to the system, mark_cache ends a window of allocations and gives                                            \
     * back the free blocks that went unused through it and the one before                                              \
     * (mp_cache_mark; NULL: nothing to give back) */                                                                   \
    X(void *, alloc, (mp_kctx *cx, size_t nbytes), (cx, nbytes))                                                        \
    X(void, free, (mp_kctx *cx, void *p, size_t nbytes), (cx, p, nbytes))                                               \
    X(size_t, cached, (mp_kctx *cx), (cx))                                                                              \
    X(void, release_cache, (mp_kctx *cx), (cx))                                                                         \
    X(void, mark_cache, (mp_kctx *cx), (cx))                                                                            \
    X(void, zero, (mp_kctx *cx, void *p, size_t nbytes), (cx, p, nbytes))                                               \
    X(void, copy, (mp_kctx *cx, void *dst, const void *src, size_t nbytes), (cx, dst, src, nbytes))   /* same device */ \
    X(void, to_host, (mp_kctx *cx, void *host_dst, const void *src, size_t nbytes), (cx, host_dst, src, nbytes))        \
    X(void, from_host, (mp_kctx *cx, void *dst, const void *host_src, size_t nbytes),                                   \
      (cx, dst, host_src, nbytes))                                                                                      \
    /* asynchronous backends: the first error since the last call, or NULL; and a                                       \
     * wait for all queued work (NULL entries: nothing to report or wait for) */                                        \
    X(const char *, error, (mp_kctx *cx), (cx))                                                                         \
    X(void, synchronize, (mp_kctx *cx), (cx))                                                                           \
    /* Asynchronous reads (asynchronous backends; NULL: to_host is the only way).                                       \
     * host_alloc gives host memory that to_host_async may copy into (pinned);                                          \
     * to_host_async queues the copy on the stream and returns at once; mark                                            \
     * records a point after everything queued so far (NULL on failure) and                                             \
     * mark_wait waits for it (a wait only if it has not passed: the counters                                           \
     * count that) and frees it. A trace's per-step snapshot uses them. */                                              \
    X(void *, host_alloc, (mp_kctx *cx, size_t nbytes), (cx, nbytes))                                                   \
    X(void, host_free, (mp_kctx *cx, void *p, size_t nbytes), (cx, p, nbytes))                                          \
    X(void, to_host_async, (mp_kctx *cx, void *host_dst, const void *src, size_t nbytes),                               \
      (cx, host_dst, src, nbytes))                                                                                      \
    X(void *, mark, (mp_kctx *cx), (cx))                                                                                \
    X(void, mark_wait, (mp_kctx *cx, void *mark), (cx, mark))                                                           \
    /* Graphs of device work (engine/capture.h; NULL: the backend cannot capture).                                      \
     * graph_begin: from now on the work queued on the stream is recorded, not                                          \
     * run, and alloc hands out blocks of the graph's own pool, which stay the                                          \
     * graph's (free blocks are kept for it, and so are blocks freed during the                                         \
     * capture) until graph_free: 0, or -1 with the reason in why. graph_end                                            \
     * closes the capture: the graph ready to replay, or NULL with the reason                                           \
     * (abort: dropped, no reason), its pool then given back. graph_replay queues                                       \
     * the recorded work again (0, or -1 with why); graph_bytes: the bytes the                                          \
     * live graphs' pools hold, in use or free.                                                                         \
     * Random numbers of a capture: a draw queued while a capture is open                                               \
     * (rand_uniform, rand_normal; attention and attention_grad whose args say                                          \
     * rng_graph) ignores its seed and takes its offset as relative to the                                              \
     * capture's start; each replay draws at the seed and offset graph_replay is                                        \
     * given plus that relative offset, as the same draws made eagerly at that                                          \
     * generator state would (PyTorch's philox state of a captured graph) */                                            \
    X(int, graph_begin, (mp_kctx *cx, char *why, size_t cap), (cx, why, cap))                                           \
    X(void *, graph_end, (mp_kctx *cx, int abort, char *why, size_t cap), (cx, abort, why, cap))                        \
    X(int, graph_replay, (mp_kctx *cx, void *graph, uint64_t seed, uint64_t offset, char *why, size_t cap),             \
      (cx, graph, seed, offset, why, cap))                                                                              \
    X(void, graph_free, (mp_kctx *cx, void *graph), (cx, graph))                                                        \
    X(size_t, graph_bytes, (mp_kctx *cx), (cx))                                                                         \
    /* Collectives across processes on this device's memory, queued on the                                              \
     * backend's stream (CUDA: NCCL, loaded when first used). NULL entries: the                                         \
     * engine stages the bytes through host memory and MPI (kernels/comm.h).                                            \
     * coll_id writes the bytes that name a new group (NCCL's unique id, at most                                        \
     * cap) and returns their count, or -1 with the reason in why; every process                                        \
     * then calls coll_join with the same bytes, its rank and the world's size                                          \
     * (0, or -1 with the reason). The collectives report their failures through                                        \
     * error(), as kernels do: all_reduce works in place on n elements of dt;                                           \
     * broadcast sends root's nbytes to every process; all_gather puts each                                             \
     * process's nbytes of send at recv + rank * nbytes. coll_leave ends the                                            \
     * group (at finalize). */                                                                                          \
    X(int, coll_id, (mp_kctx *cx, void *id, size_t cap, char *why, size_t why_cap), (cx, id, cap, why, why_cap))        \
    X(int, coll_join, (mp_kctx *cx, const void *id, size_t nbytes, int rank, int size, char *why,                       \
      size_t why_cap),                                                                                                  \
      (cx, id, nbytes, rank, size, why, why_cap))                                                                       \
    X(void, coll_all_reduce, (mp_kctx *cx, mp_dtype dt, void *buf, int64_t n, mp_coll_op op),                           \
      (cx, dt, buf, n, op))                                                                                             \
    X(void, coll_broadcast, (mp_kctx *cx, void *buf, size_t nbytes, int root), (cx, buf, nbytes, root))                 \
    X(void, coll_all_gather, (mp_kctx *cx, const void *send, void *recv, size_t nbytes),                                \
      (cx, send, recv, nbytes))                                                                                         \
    X(void, coll_leave, (mp_kctx *cx), (cx))                                                                            \
    /* Overlap (NULL: collectives stay on the main stream): after coll_fork the                                         \
     * collectives run on a second stream, each after what was queued on the                                            \
     * main stream up to its own coll_fork (a data-parallel bucket, reduced                                             \
     * while backward goes on); coll_merge makes the main stream wait for them                                          \
     * and brings the collectives back to it. */                                                                        \
    X(void, coll_fork, (mp_kctx *cx), (cx))                                                                             \
    X(void, coll_merge, (mp_kctx *cx), (cx))                                                                            \
    /* n elements of src (dtype sd) converted into dst (dtype dd); saturate: an FP8 destination's overflow           \
     * becomes its largest finite value rather than NaN (e4m3) or inf (e5m2), kernels/fp8.h; ignored otherwise */       \
    X(void, cast, (mp_kctx *cx, void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n, int saturate),        \
      (cx, dst, dd, src, sd, n, saturate))                                                                              \
    X(void, fill, (mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, double value), (cx, dst, dt, n, value))              \
    X(void, arange, (mp_kctx *cx, void *dst, mp_dtype dt, int64_t n), (cx, dst, dt, n))                                 \
    /* counter-based random numbers: element i depends only on (seed, offset + i),                                      \
     * so every backend draws the same stream (inside a capture: see graph_replay) */                                   \
    X(void, rand_uniform, (mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset),             \
      (cx, dst, dt, n, seed, offset))                                                                                   \
    X(void, rand_normal, (mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset),              \
      (cx, dst, dt, n, seed, offset))                                                                                   \
    X(void, binary, (mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b,                    \
      const mp_bcast *bc),                                                                                              \
      (cx, op, dt, out, a, b, bc))                                                                                      \
    X(void, unary, (mp_kctx *cx, mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p),               \
      (cx, op, dt, out, a, n, p))                                                                                       \
    /* gin = gout * d op(x)/dx, given the input x and the output y of the forward */                                    \
    X(void, unary_grad, (mp_kctx *cx, mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x,              \
      const void *y, int64_t n, double p),                                                                              \
      (cx, op, dt, gin, gout, x, y, n, p))                                                                              \
    /* clamp (engine/ops_clamp.c): without g, out = x limited to [lo, hi] (NaN stays NaN;                             \
     * lo > hi gives hi, as PyTorch); with g, its gradient: out = g where lo <= x <= hi,                                  \
     * else 0. An absent bound is an infinity. Float dtypes (f64 where the backend has it) */                           \
    X(void, clamp, (mp_kctx *cx, mp_dtype dt, void *out, const void *x, const void *g, int64_t n, double lo,            \
      double hi),                                                                                                       \
      (cx, dt, out, x, g, n, lo, hi))                                                                                   \
    X(void, reduce, (mp_kctx *cx, mp_redop op, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n,         \
      int64_t inner),                                                                                                   \
      (cx, op, dt, out, a, outer, n, inner))                                                                            \
    /* out[o, idx[o,i], i] = src[o, i] on a zeroed {outer, n, inner} out (max's backward) */                            \
    X(void, put_along, (mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx,                       \
      int64_t outer, int64_t n, int64_t inner),                                                                         \
      (cx, dt, out, src, idx, outer, n, inner))                                                                         \
    /* inclusive prefix sums along the middle axis of {outer, n, inner} (reverse:                                       \
     * from the end: cumsum's backward), accumulated in double, each output                                             \
     * rounded to dt (a float dtype). NULL: the backend has none. */                                                    \
    X(void, scan, (mp_kctx *cx, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner,         \
      int reverse),                                                                                                     \
      (cx, dt, out, a, outer, n, inner, reverse))                                                                       \
    /* The loss scaler, all on state in this backend's memory:                                                          \
     * scale_loss: out = in * st->scale (out may be NULL) and, when check, loss_bad                                     \
     *   = 1 if any input value is inf/NaN;                                                                             \
     * unscale: g *= 1/st->scale over n values (an optimizer's gradient arena),                                         \
     *   adding what it sees (n, inf, NaN, amax of the scaled values) to                                                \
     *   st->slot[slot]; with telemetry (tel not NULL) also the zeros, f16                                              \
     *   under/overflow and histogram, into the slot and per parameter: seg                                             \
     *   (backend memory) holds nseg + 1 offsets, 0 = seg[0] < ... < seg[nseg] = n,                                     \
     *   and tel[i] (nseg records, backend memory) gets the statistics of                                               \
     *   g[seg[i] .. seg[i+1]);                                                                                         \
     * scale_rule: one of the state operations above (arg: DECIDE's slot). */                                           \
    X(void, scale_loss, (mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t n, mp_scale_state *st,            \
      int check),                                                                                                       \
      (cx, dt, out, in, n, st, check))                                                                                  \
    X(void, unscale, (mp_kctx *cx, float *g, int64_t n, mp_scale_state *st, int slot, mp_grad_stats *tel,               \
      const int64_t *seg, int nseg),                                                                                    \
      (cx, g, n, st, slot, tel, seg, nseg))                                                                             \
    X(void, scale_rule, (mp_kctx *cx, mp_scale_op op, mp_scale_state *st, const mp_policy *p, int arg,                  \
      float value),                                                                                                     \
      (cx, op, st, p, arg, value))                                                                                      \
    /* Counting, at every rounding of f32 results to f16/bf16, the values rounded,                                      \
     * those that were nonzero and became zero and those that were finite and                                           \
     * became inf, per backward op: after flush_slot(cx, i) the roundings count                                         \
     * into slot i (0 <= i < MP_FLUSH_SLOTS), after flush_slot(cx, -1) into none.                                       \
     * The counts stay in the backend's memory (on a GPU, device memory that the                                        \
     * kernels add to: nothing is read per op). flush_read copies every slot's                                          \
     * totals into counts (when not NULL: one read, a wait on an asynchronous                                           \
     * device) and then zeroes them when clear (queued, no wait). */                                                    \
    X(void, flush_slot, (mp_kctx *cx, int slot), (cx, slot))                                                            \
    X(void, flush_read, (mp_kctx *cx, int64_t (*counts)[3], int clear), (cx, counts, clear))                            \
    /* an optimizer's step: optim_count adds 1 to *step (an int64 in this backend's                                     \
     * memory) unless skip (backend memory, NULL: never) is set; optim_step then                                        \
     * updates n parameters p with gradients g and state s1, s2 at that step count,                                     \
     * and writes the new values rounded to lowp_dt into lowp (the parameters'                                          \
     * low-precision working copy for autocast; NULL: none) and, given wide (f32,                                       \
     * NULL: none; only with lowp), those rounded values widened back exactly                                           \
     * (the copy's widening that gemm_wide takes), or leaves everything as it is                                        \
     * when skip is set. The engine passes wide only where supports(cx,                                                 \
     * "gemm_wide", lowp_dt) says yes: a backend without gemm_wide ignores it */                                        \
    X(void, optim_count, (mp_kctx *cx, int64_t *step, const int32_t *skip), (cx, step, skip))                           \
    X(void, optim_step, (mp_kctx *cx, mp_optim_kind kind, float *p, const float *g, float *s1, float *s2,               \
      int64_t n, const mp_optim_args *a, const int64_t *step, const int32_t *skip, void *lowp,                          \
      mp_dtype lowp_dt, float *wide),                                                                                   \
      (cx, kind, p, g, s1, s2, n, a, step, skip, lowp, lowp_dt, wide))                                                  \
    /* since the backend loaded: the copies to the host and the waits for the                                           \
     * device (asynchronous backends; 0 on the CPU), and the allocations its                                            \
     * caching allocator asked the system for (cudaMalloc, posix_memalign) */                                           \
    X(void, counters, (mp_kctx *cx, int64_t c[3]), (cx, c))                                                             \
    /* out = cond ? a : b elementwise, all contiguous of n elements; cond is u8 */                                      \
    X(void, where, (mp_kctx *cx, mp_dtype dt, void *out, const uint8_t *cond, const void *a, const void *b,             \
      int64_t n),                                                                                                       \
      (cx, dt, out, cond, a, b, n))                                                                                     \
    /* The row-wise kernels below return 0, or -1 when they could not get their                                         \
     * working memory from the context (nothing was written then). */                                                   \
    /* softmax (or log-softmax when log) over the middle axis of {outer, n, inner} */                                   \
    X(int, softmax, (mp_kctx *cx, mp_dtype dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner,         \
      int log),                                                                                                         \
      (cx, dt, y, x, outer, n, inner, log))                                                                             \
    X(int, softmax_grad, (mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const void *y, int64_t outer,             \
      int64_t n, int64_t inner, int log),                                                                               \
      (cx, dt, gx, gy, y, outer, n, inner, log))                                                                        \
    /* cross-entropy of rows x {rows, classes} against 0-based targets: loss[r] and                                     \
     * the row's log-sum-exp (both f32); the gradient gx = (softmax(x) - onehot) * scale[r] */                          \
    X(int, cross_entropy, (mp_kctx *cx, mp_dtype dt, float *loss, float *lse, const void *x,                            \
      const int32_t *target, int64_t rows, int64_t classes),                                                            \
      (cx, dt, loss, lse, x, target, rows, classes))                                                                    \
    X(int, cross_entropy_grad, (mp_kctx *cx, mp_dtype dt, void *gx, const void *x, const float *lse,                    \
      const int32_t *target, const float *scale, int64_t rows, int64_t classes),                                        \
      (cx, dt, gx, x, lse, target, scale, rows, classes))                                                               \
    /* layer norm over the last dim of {rows, n}: y = (x - mean) * rstd * w + b, with                                   \
     * mean and rstd (f32, one per row) kept for the backward; w or b may be NULL.                                      \
     * mean NULL: RMS norm, no centring (rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w;                              \
     * the engine passes b NULL); f32 sums and one rounding, as layer norm */                                           \
    X(int, layer_norm, (mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, const void *x,                     \
      const void *w, const void *b, int64_t rows, int64_t n, float eps),                                                \
      (cx, dt, y, mean, rstd, x, w, b, rows, n, eps))                                                                   \
    /* gx, and gw/gb (f32 sums over rows, may be NULL). mean NULL: RMS norm's, with                                     \
     * xhat = x * rstd: gx = rstd * (gy*w - xhat * mean(gy*w*xhat)), gw = sum gy*xhat */                                \
    X(int, layer_norm_grad, (mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy,                  \
      const void *x, const float *mean, const float *rstd, const void *w, int64_t rows, int64_t n),                     \
      (cx, dt, gx, gw, gb, gy, x, mean, rstd, w, rows, n))                                                              \
    /* Attention: out{bh,tq,d} = softmax(q k^T * scale [causal]) v, and each row's                                      \
     * log-sum-exp (f32, -inf for a row that sees no key) for the backward, which                                       \
     * writes dq, dk, dv from dout; no tq x tk scores are stored. q, k, v, out of                                       \
     * dtype dt, contiguous {bh, t, d}. NULL: the backend has none (supports says no). */                               \
    X(int, attention, (mp_kctx *cx, mp_dtype dt, void *out, float *lse, const void *q, const void *k,                   \
      const void *v, const mp_attn_args *a),                                                                            \
      (cx, dt, out, lse, q, k, v, a))                                                                                   \
    X(int, attention_grad, (mp_kctx *cx, mp_dtype dt, void *dq, void *dk, void *dv, const void *dout,                   \
      const void *q, const void *k, const void *v, const void *out, const float *lse, const mp_attn_args *a),           \
      (cx, dt, dq, dk, dv, dout, q, k, v, out, lse, a))                                                                 \
    /* Recurrent cells, f32 math inside (kernels/cpu/cpu_rnn.c), b rows of h units:                                   \
     * lstm_cell: gates {b, 4h} (pre-activations, PyTorch's order i, f, g, o) and                                        \
     * c_prev {b, h} give c = f * c_prev + i * g and h = o * tanh(c), as hc {2, b, h} = {h, c}.                         \
     * Its backward reads dhc {2, b, h} (dh, dc), recomputes the gates' activations                                     \
     * and writes dgates {b, 4h} and dc_prev {b, h}.                                                                     \
     * gru_cell: gi = x W_ih^T + b_ih and gh = h_prev W_hh^T + b_hh, both {b, 3h} in                                     \
     * order r, z, n: r = sig(gi_r + gh_r), z = sig(gi_z + gh_z),                                                      \
     * n = tanh(gi_n + r * gh_n), h = (1 - z) * n + z * h_prev. Its backward writes                                     \
     * dgi, dgh {b, 3h} and dh_prev {b, h} from dh. NULL: no recurrent cells. */                                        \
    X(void, lstm_cell, (mp_kctx *cx, mp_dtype dt, void *hc, const void *gates, const void *c_prev, int64_t b,          \
      int64_t h),                                                                                                       \
      (cx, dt, hc, gates, c_prev, b, h))                                                                                \
    X(void, lstm_cell_grad, (mp_kctx *cx, mp_dtype dt, void *dgates, void *dc_prev, const void *dhc,                   \
      const void *gates, const void *c_prev, int64_t b, int64_t h),                                                     \
      (cx, dt, dgates, dc_prev, dhc, gates, c_prev, b, h))                                                              \
    X(void, gru_cell, (mp_kctx *cx, mp_dtype dt, void *hy, const void *gi, const void *gh, const void *h_prev,         \
      int64_t b, int64_t h),                                                                                            \
      (cx, dt, hy, gi, gh, h_prev, b, h))                                                                               \
    X(void, gru_cell_grad, (mp_kctx *cx, mp_dtype dt, void *dgi, void *dgh, void *dh_prev, const void *dhy,            \
      const void *gi, const void *gh, const void *h_prev, int64_t b, int64_t h),                                        \
      (cx, dt, dgi, dgh, dh_prev, dhy, gi, gh, h_prev, b, h))                                                           \
    /* Convolution (mp_conv_args): y = conv(x, w) + b (b may be NULL), summed in                                        \
     * f32 and rounded once. The backward writes any of gx, gw (x's dtype) and gb                                       \
     * (f32 sums over n, oh, ow) that is not NULL. NULL entries: no convolution. */                                     \
    X(int, conv2d, (mp_kctx *cx, mp_dtype dt, void *y, const void *x, const void *w, const void *b,                     \
      const mp_conv_args *a),                                                                                           \
      (cx, dt, y, x, w, b, a))                                                                                          \
    X(int, conv2d_grad, (mp_kctx *cx, mp_dtype dt, void *gx, void *gw, float *gb, const void *gy,                       \
      const void *x, const void *w, const mp_conv_args *a),                                                             \
      (cx, dt, gx, gw, gb, gy, x, w, a))                                                                                \
    /* Pooling (mp_pool_args). Max: y and the 0-based position in its plane                                             \
     * (h * w) of each window's maximum (the first of equals; a NaN wins, the                                           \
     * last one, as in PyTorch); a window with no input gives -inf and position                                         \
     * -1. Its backward adds gy at those positions into gx (zeroed by the                                               \
     * kernel). Average: the mean of each window (f32 sums); its backward                                               \
     * spreads gy evenly. */                                                                                            \
    X(int, max_pool2d, (mp_kctx *cx, mp_dtype dt, void *y, int32_t *idx, const void *x, const mp_pool_args *a),         \
      (cx, dt, y, idx, x, a))                                                                                           \
    X(int, max_pool2d_grad, (mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const int32_t *idx,                    \
      const mp_pool_args *a),                                                                                           \
      (cx, dt, gx, gy, idx, a))                                                                                         \
    X(int, avg_pool2d, (mp_kctx *cx, mp_dtype dt, void *y, const void *x, const mp_pool_args *a),                       \
      (cx, dt, y, x, a))                                                                                                \
    X(int, avg_pool2d_grad, (mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const mp_pool_args *a),                \
      (cx, dt, gx, gy, a))                                                                                              \
    /* Batch norm over channels of {n, c, hw}: training: each channel's batch mean                                      \
     * and biased variance (f32) normalise x, are written to mean and rstd                                              \
     * (1 / sqrt(var + eps)) for the backward, and move running_mean and                                                \
     * running_var (unbiased variance) by momentum, when those are not NULL;                                            \
     * otherwise the running statistics normalise x and mean/rstd get them.                                             \
     * w and b (f32, may be NULL) scale and shift. The backward writes gx and                                           \
     * gw/gb (f32, may be NULL); training says whether the statistics were the                                          \
     * batch's (their gradient flows into gx) or fixed. */                                                              \
    X(int, batch_norm, (mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,               \
      float *running_var, const void *x, const float *w, const float *b, int64_t n, int64_t c, int64_t hw,              \
      int training, float momentum, float eps),                                                                         \
      (cx, dt, y, mean, rstd, running_mean, running_var, x, w, b, n, c, hw, training, momentum, eps))                   \
    X(int, batch_norm_grad, (mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy,                  \
      const void *x, const float *mean, const float *rstd, const float *w, int64_t n, int64_t c, int64_t hw,            \
      int training),                                                                                                    \
      (cx, dt, gx, gw, gb, gy, x, mean, rstd, w, n, c, hw, training))                                                   \
    /* batch_norm with the block's next steps in its output pass: y = relu(bn(x) + z)                                   \
     * (z {n, c, hw} of dtype dt, or NULL: none; relu 0: no ReLU), the same bits as                                     \
     * batch_norm, then the binary add, then the unary ReLU (each rounded to dt                                         \
     * as those kernels round); mean, rstd and the running statistics as                                                \
     * batch_norm; dt f32, f16 or bf16. NULL: the backend has none (the engine                                          \
     * runs the three). */                                                                                              \
    X(int, batch_norm_act, (mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, float *running_mean,           \
      float *running_var, const void *x, const float *w, const float *b, const void *z, int64_t n, int64_t c,           \
      int64_t hw, int training, float momentum, float eps, int relu),                                                   \
      (cx, dt, y, mean, rstd, running_mean, running_var, x, w, b, z, n, c, hw, training, momentum, eps, relu))          \
    /* the k largest (largest) or smallest values of each of rows rows of n, in                                         \
     * order, into values {rows, k} (dtype dt) and their 0-based positions into                                         \
     * idx {rows, k}; ties in index order, NaN above every number (PyTorch's                                            \
     * order). NULL: the backend has none (supports says no). */                                                        \
    X(int, topk, (mp_kctx *cx, mp_dtype dt, void *values, int32_t *idx, const void *x, int64_t rows, int64_t n,         \
      int64_t k, int largest),                                                                                          \
      (cx, dt, values, idx, x, rows, n, k, largest))                                                                    \
    /* Batched C = alpha * op(A) @ op(B) + beta * C, row-major, all of dtype dt;                                        \
     * A is {m,k} (or {k,m} when ta), B is {k,n} (or {n,k} when tb), C is {m,n};                                        \
     * sA, sB, sC are the element strides between batch items (0 broadcasts).                                           \
     * Returns 0, or -1 when the kernel could not get its working memory. */                                            \
    X(int, gemm, (mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,             \
      float alpha, const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c, int64_t sc),              \
      (cx, dt, ta, tb, batch, m, n, k, alpha, a, sa, b, sb, beta, c, sc))                                               \
    /* gemm (above) in dtype dt with operands given already widened: A when wa,                                         \
     * B when wb, is an f32 array holding that operand's dt values exactly (the                                         \
     * engine keeps an autocast weight's widened copy for as long as its values                                         \
     * stay: engine/ops_matmul.c), the other operands and C are dt. The same f32                                        \
     * sums as gemm on the dt operands and the same one rounding into C, without                                        \
     * widening those operands again. Returns 0, 1 when declined (the engine then                                       \
     * calls gemm), -1 for want of working memory. NULL: the backend has none;                                          \
     * supports(cx, "gemm_wide", dt) says for which dt the engine should keep                                           \
     * widened copies (those whose gemm widens: f16 on the CPU). With batch 1,                                          \
     * two epilogues (NULL: none): bias (dt, {n}) starts every row's f32 sums                                           \
     * from the bias, beta ignored: the values of C filled with 0 + bias (dt's                                          \
     * add) and then beta 1, without C written and widened back; acc (f32,                                              \
     * {m,n}) takes C's values instead of C (c unused): acc += C rounded to dt,                                         \
     * widened, an f32 add: the values of writing C then add_widened, without C                                         \
     * written and read back (a weight gradient into its f32 .grad). */                                                 \
    X(int, gemm_wide, (mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,        \
      float alpha, const void *a, int wa, int64_t sa, const void *b, int wb, int64_t sb, float beta, void *c,           \
      int64_t sc, const void *bias, float *acc),                                                                        \
      (cx, dt, ta, tb, batch, m, n, k, alpha, a, wa, sa, b, wb, sb, beta, c, sc, bias, acc))                            \
    /* acc{n} (f32) += x{n} widened from dt (f16/bf16), in one pass: the gradient                                       \
     * of an f32 leaf's cast added into its .grad (engine/backward.c) without a                                         \
     * widened tensor between. The widening is exact and the add is binary's f32                                        \
     * add, so .grad is bit-identical to a cast then an add. NULL: the engine                                           \
     * does exactly that. */                                                                                            \
    X(void, add_widened, (mp_kctx *cx, float *acc, const void *x, mp_dtype dt, int64_t n), (cx, acc, x, dt, n))         \
    /* A linear layer's product with its bias in the GEMM's epilogue:                                                   \
     * C{m,n} = A{m,k} @ B^T + bias{n} on every row (B is {n,k}), summed in f32                                         \
     * and rounded once, in one pass over C. Returns 0; 1 when declined (the                                            \
     * engine then fills C with the bias and accumulates a gemm onto it); -1 for                                        \
     * want of working memory. NULL: the backend has none. */                                                           \
    X(int, gemm_bias, (mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, const void *b,         \
      const void *bias, void *c),                                                                                       \
      (cx, dt, m, n, k, a, b, bias, c))                                                                                 \
    /* linear_gelu's product with its bias and GELU in the GEMM's epilogue:                                             \
     * pre{m,n} = A{m,k} @ B^T + bias{n} (B is {n,k}) summed in f32, rounded once                                       \
     * to dt and written (the backward's input), and C = GELU of the f32 sum                                            \
     * rounded to dt (form: 0 the erf form, 1 the tanh approximation), in one                                           \
     * pass. C may differ from GELU of the rounded pre by that rounding (half an                                        \
     * ulp of pre times GELU's slope, < 1.13). Returns 0; 1 when declined (the                                          \
     * engine then runs gemm_bias and the unary GELU); -1 for want of working                                           \
     * memory. NULL: the backend has none. */                                                                           \
    X(int, gemm_bias_gelu, (mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, const void *b,    \
      const void *bias, double form, void *c, void *pre),                                                               \
      (cx, dt, m, n, k, a, b, bias, form, c, pre))                                                                      \
    /* linear's weight gradient with its bias gradient in the GEMM's epilogue:                                          \
     * dw{n,k} = g{m,n}^T @ x{m,k} and db{n} = g's column sums over its m rows,                                         \
     * each summed in f32 and rounded once to dt (cuBLASLt's BGRADB), so g is                                           \
     * not read again by a reduce. Returns 0; 1 when declined (the engine runs                                          \
     * the GEMM and a reduce over the rows); -1 for want of working memory.                                             \
     * NULL: the backend has none. */                                                                                   \
    X(int, gemm_wgrad_bias, (mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *g, const void *x,   \
      void *dw, void *db),                                                                                              \
      (cx, dt, m, n, k, g, x, dw, db))                                                                                  \
    /* asynchronous backends: check n indices (i32, this device) against [0, limit)                                     \
     * on the device, without waiting: a bad one is reported by error() later, as                                       \
     * "<what>: <value> at position <i> out of range [0, limit)", and the gather,                                       \
     * scatter_add, put_along and cross-entropy kernels leave it out meanwhile                                          \
     * (what must be a string that outlives the process, a literal). NULL: the                                          \
     * engine reads the indices and checks them itself, before the op. */                                               \
    X(void, check_indices, (mp_kctx *cx, const int32_t *idx, int64_t n, int64_t limit, const char *what),               \
      (cx, idx, n, limit, what))                                                                                        \
    /* out = in with dims permuted: out dim d is in dim perm[d] (contiguous copy) */                                    \
    X(void, permute, (mp_kctx *cx, mp_dtype dt, void *out, const void *in, int ndim, const int64_t *shape,              \
      const int *perm),                                                                                                 \
      (cx, dt, out, in, ndim, shape, perm))                                                                             \
    /* out[o, j, i] = in[o, idx[j], i] for an {outer, n, inner} input and nidx indices                                  \
     * (0-based, already checked to lie in [0, n)); idx is an i32 array on this device */                               \
    X(void, gather, (mp_kctx *cx, mp_dtype dt, void *out, const void *in, const int32_t *idx, int64_t nidx,             \
      int64_t outer, int64_t n, int64_t inner),                                                                         \
      (cx, dt, out, in, idx, nidx, outer, n, inner))                                                                    \
    /* out[o, idx[j], i] += src[o, j, i]: the adjoint of gather, in index order */                                      \
    X(void, scatter_add, (mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx,                     \
      int64_t nidx, int64_t outer, int64_t n, int64_t inner),                                                           \
      (cx, dt, out, src, idx, nidx, outer, n, inner))                                                                   \
    /* copy a {outer, len, inner} block starting at `start` of an {outer, n, inner} source */                           \
    X(void, narrow, (mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,                     \
      int64_t start, int64_t len, int64_t inner),                                                                       \
      (cx, dt, out, in, outer, n, start, len, inner))                                                                   \
    /* the reverse: write a {outer, len, inner} source into an {outer, n, inner} out at `start` */                      \
    X(void, narrow_put, (mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,                 \
      int64_t start, int64_t len, int64_t inner),                                                                       \
      (cx, dt, out, in, outer, n, start, len, inner))                                                                 \
    /* out{n} (f32) = a op b for add/sub/mul of two contiguous runs of n, one of                                       \
     * them f32 and the other f16/bf16 (da, db): the low operand widened in                                             \
     * registers, not into a tensor first. Widening is exact and the op is                                              \
     * binary's f32 op, so the bits of a cast then binary (engine/ops_math.c).                                          \
     * Returns 0, 1 when declined (the engine then casts); NULL: none. */                                               \
    X(int, binary_mixed, (mp_kctx *cx, mp_binop op, float *out, const void *a, mp_dtype da, const void *b,              \
      mp_dtype db, int64_t n),                                                                                          \
      (cx, op, out, a, da, b, db, n))                                                                                   \
    /* narrow's gradient into an {outer, n, inner} out from its {outer, len,                                             \
     * inner} source at `start`: add 0: zeros outside the slice and the source                                          \
     * inside (the padded gradient, without zeroing the slice first); add 1, in                                         \
     * place: out + 0 outside and out + in inside, the additions binary's add                                           \
     * of out and that padded gradient makes, element by element (so -0 + 0 is                                          \
     * +0 there too), without the padded tensor (engine/backward.c). NULL: the                                          \
     * engine fills zeros, puts and adds. */                                                                            \
    X(void, narrow_pad, (mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,                 \
      int64_t start, int64_t len, int64_t inner, int add),                                                              \
      (cx, dt, out, in, outer, n, start, len, inner, add))                                                              \
    /* gather and scatter along one dim (mp_along_args): out (contiguous, the                                           \
     * index's shape) = x at the indexed places; and x at the indexed places =                                          \
     * src (contiguous, the index's shape), or += src when add, in index order                                          \
     * along each line of dim: a repeated index keeps the last value (add: sums                                         \
     * in that order, f16/bf16 rounded at each add as the CPU's scatter_add).                                           \
     * NULL: the backend has none. */                                                                                   \
    X(void, gather_along, (mp_kctx *cx, mp_dtype dt, void *out, const void *x, const int32_t *idx,                      \
      const mp_along_args *a),                                                                                          \
      (cx, dt, out, x, idx, a))                                                                                         \
    X(void, scatter_along, (mp_kctx *cx, mp_dtype dt, void *x, const void *src, const int32_t *idx,                     \
      const mp_along_args *a, int add),                                                                                 \
      (cx, dt, x, src, idx, a, add))                                                                                    \
    /* Scaled FP8 (kernels/fp8_scaled.h: granularities, layouts, the operands). fp8_quantize: x {rows, k}              \
     * (f32/f16/bf16) -> codes q of fmt (MP_E4M3 / MP_E5M2), saturating, and the decode scales of granularity g;      \
     * given: a device f32 quantization scale (tensor granularity) or NULL (from each group's amax); st: four          \
     * device words, written: the amax's f32 bits, the saturated and the flushed counts (u64), and in word 3 the two   \
     * counts again as f32 {saturated, flushed} (rounded to nearest: exact below 2^24), which the engine copies into   \
     * a device tensor without a host wait. fp8_gemm: C {m, n} (out:                                                   \
     * f32/bf16/f16) = A {m, k} B {n, k}^T dequantized; acc_bits 0: f32 sums (fast: the device's own limited          \
     * accumulation, where it has one), else the CPU's modelled accumulator (kernels/cpu/cpu_fp8_gemm.c) with          \
     * promote_every and acc_round (mp_fp8_acc_round: partial sums to nearest even or truncated toward zero). 0,      \
     * 1 declined (the engine names what), -1 out of memory. NULL: no FP8 arithmetic. */                               \
    X(int, fp8_quantize, (mp_kctx *cx, mp_dtype dt, const void *x, int64_t rows, int64_t k, mp_dtype fmt, int g,        \
      const float *given, uint8_t *q, void *scales, unsigned long long *st),                                            \
      (cx, dt, x, rows, k, fmt, g, given, q, scales, st))                                                               \
    X(int, fp8_gemm, (mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a,                            \
      const mp_fp8_operand *b, int acc_bits, int64_t promote_every, int acc_round, int fast, mp_dtype out, void *c),    \
      (cx, m, n, k, a, b, acc_bits, promote_every, acc_round, fast, out, c))

#define MP_BE_FN_TYPE(ret, name, params, args) typedef ret mp_be_##name##_fn params;
MP_BACKEND_ENTRIES(MP_BE_FN_TYPE)
#undef MP_BE_FN_TYPE

typedef struct mp_backend {
    const char *name;
    mp_kctx *ctx;
#define MP_BE_FIELD(ret, name, params, args) mp_be_##name##_fn *name;
    MP_BACKEND_ENTRIES(MP_BE_FIELD)
#undef MP_BE_FIELD
} mp_backend;

/* An entry named by its place in the table, so that a description can list the
 * entries it calls (engine/op.h: mp_op's needs): MP_BE_ENTRY(conv2d). 0 is no
 * entry (the table's name). mp_backend_has says whether be fills the entry. */
#define MP_BE_ENTRY(entry) ((unsigned short)offsetof(mp_backend, entry))
static inline bool mp_backend_has(const mp_backend *be, unsigned short entry)
{
    void (*fn)(void);   /* every entry is a function pointer: read it as one */
    memcpy(&fn, (const char *)be + entry, sizeof fn);
    return fn != NULL;
}
/* whether be fills every entry of a list of n (ended early by a 0) */
static inline bool mp_backend_has_all(const mp_backend *be, const unsigned short *entries, int n)
{
    for (int i = 0; i < n && entries[i]; i++)
        if (!mp_backend_has(be, entries[i])) return false;
    return true;
}

extern const mp_backend mp_cpu_backend;

#endif
