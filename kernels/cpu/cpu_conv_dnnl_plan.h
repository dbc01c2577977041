/*
 * cpu_conv_dnnl_plan.h: what the files of oneDNN's convolutions share, and
 * no other file includes: cpu_conv_dnnl.c (forward and backward data, the
 * entries), cpu_conv_dnnl_weights.c (the weight gradient's chunks) and
 * cpu_conv_dnnl_plan.c (the plans). The plans' types and their cache, and the
 * helpers that find a plan, run it and reorder its operands (defined in
 * cpu_conv_dnnl_plan.c, where each says more).
 */
#ifndef MP_CPU_CONV_DNNL_PLAN_H
#define MP_CPU_CONV_DNNL_PLAN_H

#include "kernels/cpu/cpu_dnnl.h"

/* a ResNet step has ~30 distinct (shape, direction) pairs, each with up to 2
 * chunk plans, and in bf16 without bf16 primitives up to 2 declined ones
 * (kept, so that oneDNN is asked once): 59 in the wide ResNet's bf16 step */
#define PLANS 192
/* the weight gradient's chunks of images, at most (fewer where their partial
 * sums would pass WBYTES): cpu_conv_dnnl_weights.c */
#define WCHUNKS 8   /* 16 chunks of 2 images (batch 32) were 6% slower on a bf16 ResNet step */
#define CTHREADS 64   /* the most threads cpu_conv_dnnl.c's chunked() runs on (more: the whole batch) */

enum { FWD = CPU_CONV_FWD, BWD_DATA = CPU_CONV_BWD_DATA, BWD_WEIGHTS = CPU_CONV_BWD_WEIGHTS };

typedef struct {
    int dir, dt, odt, bias;   /* dt: the operands' oneDNN dtype; odt: the output's */
    int threads;              /* oneDNN splits the work for the thread count it was made under */
    int64_t batch;            /* weight-gradient chunk plans: the whole batch (their whole-batch reorders) */
    int64_t n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw, groups, oh, ow;
} conv_key;

/* an operand of the primitive: the tensor's plain layout, the primitive's, and
 * the reorder between them (NULL when they are the same) */
typedef struct {
    dnnl_memory_desc_t user, inner, pad;   /* pad: the reorder's scratchpad */
    dnnl_primitive_t reorder;
    int arg;                  /* DNNL_ARG_... */
    int own;                  /* 1: the reorder is cpu_conv_layout.c's transposes over layout */
    cpu_conv_layout layout;
} operand;

typedef struct {
    conv_key key;
    int used;                 /* 1: a plan; -1: oneDNN cannot do this shape well */
    dnnl_primitive_t prim;
    operand op[3];            /* the two inputs, then the output */
    operand whole[2];         /* weight-gradient chunk plans: x and gy of the whole batch into op[0..1]'s
                                 layout (cpu_conv_with_images), or no reorder where images are not outermost */
    dnnl_memory_desc_t bias, pad;   /* pad: the primitive's scratchpad */
    size_t pad_bytes;         /* the largest scratchpad of the primitive and its reorders */
} plan;

struct cpu_conv_plans {
    plan plans[PLANS];
    int next;
    dnnl_stream_t streams[WCHUNKS];   /* one per chunk of the weight gradient (WCHUNKS) */
    dnnl_stream_t tstreams[CTHREADS]; /* one per thread of chunked() */
};

/* the bytes of a plan's working buffers (the operands in its layouts), each
 * rounded up to 64 */
static inline size_t inner_bytes(const plan *p, int i)
{
    return p->op[i].reorder ? (dnnl_memory_desc_get_size(&p->op[i].inner) + 63) & ~(size_t)63 : 0;
}
static inline size_t pad_bytes(const plan *p) { return (p->pad_bytes + 63) & ~(size_t)63; }
/* the work bytes of a plan run on its own (cpu_conv_run): its operands in its layouts and its scratchpad */
static inline size_t work_bytes(const plan *p) { return inner_bytes(p, 0) + inner_bytes(p, 1) + inner_bytes(p, 2) + pad_bytes(p); }

/* cpu_conv_dnnl_plan.c: the key of direction dir over a with n images (threads:
 * the caller's, 1 for the weight gradient); the plan of a key, made if new
 * (its used: 1 a plan, -1 declined; a later find may take its slot); 1 (and
 * *out: m with n images) where images are outermost in activation layout m;
 * a plan run on stream st (0, or 1 when oneDNN failed); operand o's reorder
 * (out: out of the primitive's layout) on stream st or the context's */
void cpu_conv_key_of(conv_key *key, int dir, int dt, int odt, int64_t n, const mp_conv_args *a);
plan *cpu_conv_find(struct cpu_conv_plans *c, struct cpu_dnnl *d, const conv_key *key);
int cpu_conv_with_images(const dnnl_memory_desc_t *m, int64_t n, dnnl_memory_desc_t *out);
int cpu_conv_run(struct cpu_dnnl *d, dnnl_stream_t st, plan *p, void *ptr[3], void *const *blk, const float *bias,
                 char *work);
int cpu_conv_reorder_on(struct cpu_dnnl *d, dnnl_stream_t st, operand *o, int out, void *from, void *to, void *pad);
int cpu_conv_reorder(struct cpu_dnnl *d, operand *o, int out, void *from, void *to, void *pad);

/* the weight gradient's chunking and plans (cpu_conv_dnnl_weights.c, which
 * says why it runs in chunks) */
typedef struct {
    plan *pf, *pl;            /* the chunks' plans: the first ones, the last (pf when as long) */
    int64_t chunks, per, last;
    int whole[2];             /* x, gy: reordered for the whole batch (pf->whole) */
    const dnnl_memory_desc_t *sum;   /* the partials' layout: pf's blocked one, or the plain one */
    size_t wb, part;          /* a chunk's work bytes (scratchpad and its own blocked copies); a partial's */
} wplan;

/* cpu_conv_dnnl_weights.c: the chunking of a's weight gradient (operands of
 * oneDNN dtype dt) and its plans: 0, or 1 (decline); the bytes of x's (i 0)
 * and gy's (i 1) whole-batch copies; the weight gradient gw (plain f32) of x
 * and gy over buf: 0, or 1 when oneDNN failed */
int cpu_conv_weight_plans(struct cpu_dnnl *d, int dt, const mp_conv_args *a, wplan *w);
size_t cpu_conv_whole_bytes(const wplan *w, int i);
int cpu_conv_weights(struct cpu_dnnl *d, const wplan *w, const void *x, const void *gy, int gy_there, float *gw,
                     char *buf, const mp_conv_args *a, size_t es);

#endif
