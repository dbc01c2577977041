/*
 * cpu_dnnl.h: what the oneDNN kernel files share: one engine and stream per
 * CPU context, made on first use, and each file's cache of primitives made
 * once per shape (cpu_gemm_dnnl.c: matmul plans; cpu_conv_dnnl.c: convolution
 * plans, the weight gradient's run in cpu_conv_dnnl_weights.c).
 * cpu_dnnl_enable(0) turns every oneDNN path off (tests reach the paths that
 * stand in for it).
 */
#ifndef MP_CPU_DNNL_H
#define MP_CPU_DNNL_H

#include <oneapi/dnnl/dnnl.h>
#include "kernels/cpu/cpu.h"

struct cpu_dnnl {
    int state;                      /* 0 untried, 1 ready, -1 no engine */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct cpu_gemm_plans *gemm;    /* cpu_gemm_dnnl.c's, made on first use */
    struct cpu_conv_plans *conv;    /* cpu_conv_dnnl_plan.c's (cpu_conv_dnnl_plan.h), made on first use */
};

/* the context's engine and stream, or NULL when oneDNN is off or failed */
struct cpu_dnnl *cpu_dnnl_of(mp_kctx *cx);

/* one direction of a convolution on oneDNN's primitives (cpu_conv_dnnl.c):
 * forward y = conv(x, w) + b (in0 x, in1 w); backward data gx (in0 gy, in1 w);
 * backward weights gw (in0 x, in1 gy). 0 done, 1 declined (the caller takes
 * its own path), -1 out of memory. */
enum { CPU_CONV_FWD, CPU_CONV_BWD_DATA, CPU_CONV_BWD_WEIGHTS };
int cpu_conv_dnnl(mp_kctx *cx, int dir, mp_dtype dt, void *out, const void *in0, const void *in1, const void *b,
                  const mp_conv_args *a);
/* both gradients of a convolution (gx from gy and w, gw from x and gy; either
 * NULL: not wanted), gy reordered into oneDNN's layout once where the two
 * primitives take the same one. -1 out of memory, else which gradients were
 * written (1 gx, 2 gw): the caller takes its own path for the others. */
int cpu_conv_dnnl_grad(mp_kctx *cx, mp_dtype dt, void *gx, void *gw, const void *gy, const void *x, const void *w,
                       const mp_conv_args *a);
/* tests: 1 when direction dir of a in dt (bias: forward with one) runs on
 * oneDNN's primitives here (bf16 on the f32 ones where it has no bf16
 * kernel, as without AVX-512), 0 when cpu_conv_dnnl declines it. cpu_conv_dnnl_convs(0) declines every
 * convolution (cpu_conv.c's im2col path, GEMMs still on oneDNN); returns the
 * previous setting. */
int cpu_conv_dnnl_takes(mp_kctx *cx, int dir, mp_dtype dt, int bias, const mp_conv_args *a);
int cpu_conv_dnnl_convs(int on);
/* tests (cpu_conv_dnnl_weights.c): 0 makes the weight gradient's chunks
 * reorder their own x and gy and add their partials in the plain layout (the
 * blocked path's bits must be the same); returns the previous setting */
int cpu_conv_dnnl_blocked(int on);
/* tests: 0 runs forward and backward data on the whole batch instead of in
 * chunks of images (the bits must be the same); returns the previous setting.
 * cpu_conv_dnnl_chunk_runs: how many runs went in chunks so far. */
int cpu_conv_dnnl_chunks(int on);
long cpu_conv_dnnl_chunk_runs(void);
/* tests: 1 sends every bf16 convolution the f16 route (operands widened to
 * f32, the f32 primitive, outputs rounded once), which bf16 otherwise takes
 * only where oneDNN has no bf16 primitive; returns the previous setting.
 * cpu_conv_dnnl_widened_runs: how many bf16 directions ran on it so far. */
int cpu_conv_dnnl_bf16_widen(int on);
long cpu_conv_dnnl_widened_runs(void);

/* cpu_conv_layout.c: the activations' reorders between NCHW and oneDNN's
 * nChw16c / nhwc (AVX-512 transposes) and nChw8c (f32, AVX2 transposes).
 * Element (i, c, p) of the layout lies at i sn + (c / blk) scb + p sp +
 * c % blk (elements); padded: its last channel block holds blk lanes (zeros
 * past c). */
typedef struct {
    int64_t n, c, hw, sn, scb, sp;
    int blk;   /* 16 or 8 channels a block (nhwc: 16, its tiles) */
    int padded;
} cpu_conv_layout;
/* 1 when the processor has what the 16-lane transposes need (AVX-512 F, BW,
 * VL); cpu_conv_layout8_ok: what the 8-lane ones need (AVX2) */
int cpu_conv_layout_ok(void);
int cpu_conv_layout8_ok(void);
/* 1 (and *l) when layout m is one of those of the plain NCHW layout u, same
 * dtype (f32, bf16) and dims; else 0 (oneDNN's reorder stays) */
int cpu_conv_layout_of(const dnnl_memory_desc_t *m, const dnnl_memory_desc_t *u, cpu_conv_layout *l);
/* from -> to: layout l -> plain (to_plain) or plain -> l; es: 4 or 2 bytes */
void cpu_conv_layout_move(int to_plain, size_t es, const void *from, void *to, const cpu_conv_layout *l);
/* tests: 0 runs oneDNN's reorders instead (the results must be the same
 * bits); returns the previous setting */
int cpu_conv_dnnl_own_reorders(int on);
/* tests: how many of those reorders ran so far */
long cpu_conv_dnnl_own_runs(void);

#endif
