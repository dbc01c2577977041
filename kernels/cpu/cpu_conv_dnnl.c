/*
 * cpu_conv_dnnl.c: 2-d convolution on oneDNN's convolution primitives
 * (algorithm direct; winograd's numerics differ), forward, backward data and
 * backward weights, what PyTorch's CPU convolution runs on. f32 and bf16
 * operands go in as they are (bf16 products summed in f32 - AMX or
 * AVX512-BF16 where the processor has them - results rounded once); f16
 * operands are widened to f32 once and take the f32 primitive, rounded once
 * into f16 (the f16 route). bf16 takes the f16 route too, per shape and
 * direction, where oneDNN has no bf16 primitive but a reference one: oneDNN
 * 2.6 makes none without AVX512-BF16 (on AVX2 it has only f32 kernels), and
 * cpu_conv.c's im2col path, which would run instead, widened the columns of
 * every GEMM again. The bias is added inside the forward primitive, to the
 * f32 sums before their rounding. The weight gradient comes out in f32 and is
 * rounded here, as is every output of the f16 route and every bf16 output
 * while flush counting is on (cpu_store counts).
 *
 * Layouts: the tensors are NCHW. With NCHW throughout oneDNN offers only its
 * own im2col + GEMM (x64:gemm:jit), slower than cpu_conv.c's (ResNet step,
 * batch 32: 44.5 ms f32, 42.6 ms bf16 against 41.7 / 33.3 ms). The primitives
 * are therefore made with format `any` - oneDNN picks its blocked layouts
 * (nChw16c, OIhw16i16o, ...; its direct JIT, 1x1, depthwise and AMX kernels)
 * - and the operands are reordered into those layouts and the output back,
 * by reorder primitives made once with the plan (19.4 / 16.6 ms, reorders
 * included; 20 / 18 ms with the weight gradient's fixed chunking below). An
 * NCHW destination with blocked sources (oneDNN 2.6) also gets only the
 * im2col GEMM, so the output's reorder stays. The activations' reorders
 * (NCHW <-> nChw16c, nhwc) are cpu_conv_layout.c's AVX-512 transposes, the
 * same bits as oneDNN's (exec_reorder). The blocked copies live in scratch (cpu_scratch), as do the
 * primitives' scratchpads (user mode: oneDNN's own is shared between threads).
 * Forward and backward data run on chunks of images small enough that each
 * chunk's blocked copies stay in a core's L2 (chunk_plans()). The gradients
 * (cpu_conv_dnnl_grad) reorder gy once for both primitives where they take
 * the same layout (backward data's chunks writing their slices of the weight
 * gradient's copy); the weight gradient's chunks reorder their slices of x
 * and gy and keep their partial sums in the blocked layout, with one reorder
 * of their sum.
 *
 * Files: this one makes the plans (and keeps them), runs forward and backward
 * data and holds the entries (cpu_conv_dnnl, cpu_conv_dnnl_grad); the weight
 * gradient's chunked computation - its chunking, plans and partial sums - is
 * cpu_conv_dnnl_weights.c's, called from cpu_conv_dnnl_grad; what the two
 * share (the plans' types and cache, finding, running and reordering a plan:
 * the cpu_conv_ helpers here) is in cpu_conv_dnnl_plan.h.
 *
 * A plan (the primitive, its reorders, their buffer sizes) is made once per
 * shape, dtype, direction and thread count and kept in the CPU context. Where
 * oneDNN offers only a reference kernel for a shape, or fails in any way, the
 * shape is marked and cpu_conv.c takes its im2col path, so this file only
 * ever makes things faster.
 *
 * Numerics: each output element is one f32 sum of its K products (K = cg r s
 * forward, kg r s backward data, n oh ow backward weights) in oneDNN's order
 * (blocks of channels, taps, channels within a block; for the weight gradient
 * chunks of images, see cpu_conv_dnnl_weights.c): |sum - exact| <= (K + 2) 2^-24 sum |terms|
 * (K - 1 additions and one rounding per product, whatever the order), plus
 * one rounding into the output dtype; tests/c/test_conv.c checks it against
 * the exact convolution. The f16 route keeps that contract: widening to f32
 * is exact, and so is the product of two f16 or two bf16 values in f32 (11 +
 * 11 or 8 + 8 significant bits of 24; bf16 shares f32's exponent range, so a
 * product can still underflow or overflow it, as on the bf16 primitives), so
 * the f32 primitive sums the very products a bf16 primitive would, in f32,
 * and each output is rounded once from its f32 sum (nearest even, NaN kept:
 * cpu_store). Its bits are the f32 convolution's of the widened operands,
 * rounded once (tested). Thread count: the forward and backward-data kernels
 * give each output element to one thread, whole; the weight gradient's
 * kernels split the sum over images among threads, so it runs on
 * single-threaded plans over a chunking fixed by the shape
 * (cpu_conv_dnnl_weights.c), and
 * every output's bits are the same in 1 or 2 threads (tested).
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu_conv_dnnl_plan.h"

/* forward and backward data run on chunks of images whose blocked input and
 * output take at most CBYTES together, so that they stay in a core's L2
 * between the reorders and the kernel (chunked()) */
#define CBYTES ((size_t)1 << 20)
/* on more than one thread: at least FINE_PER chunks a thread, down to FINE_MIN images
 * a chunk (chunk_plans(); the wide ResNet's 8 x 8 stage at batch 32: 8 chunks
 * of 4 images, not 2 of 16, which left one thread waiting for the other's
 * whole chunk) */
#define FINE_MIN 4
#define FINE_PER 4

/* scratch slots (cpu.h: 4-12 are convolution's; cpu_conv.c's im2col path
 * uses them only when this file declined) */
enum { S_IN0 = 4, S_IN1, S_OUT, S_R0, S_BIAS };

/* NCHW {n, c, h, w} and weights {k, c/g, r, s} (grouped: {g, k/g, c/g, r, s}) */
static int md_act(dnnl_memory_desc_t *md, int dt, int64_t n, int64_t c, int64_t h, int64_t w, int any)
{
    dnnl_dims_t d = {n, c, h, w};
    return dnnl_memory_desc_init_by_tag(md, 4, d, dt, any ? dnnl_format_tag_any : dnnl_nchw) != dnnl_success;
}

static int md_wei(dnnl_memory_desc_t *md, int dt, const conv_key *k, int any)
{
    int64_t g = k->groups;
    dnnl_dims_t d = {g, k->k / g, k->c / g, k->r, k->s}, d1 = {k->k, k->c, k->r, k->s};
    if (g == 1) return dnnl_memory_desc_init_by_tag(md, 4, d1, dt, any ? dnnl_format_tag_any : dnnl_oihw) != dnnl_success;
    return dnnl_memory_desc_init_by_tag(md, 5, d, dt, any ? dnnl_format_tag_any : dnnl_goihw) != dnnl_success;
}

/* the convolution descriptor of a direction over memory descriptors src,
 * weights, dst (diff_* for the backward ones) */
static int desc(dnnl_convolution_desc_t *cd, const conv_key *k, int dir, const dnnl_memory_desc_t *src,
                const dnnl_memory_desc_t *wei, const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst)
{
    dnnl_dims_t st = {k->sh, k->sw}, dil = {k->dh - 1, k->dw - 1}, pl = {k->ph, k->pw};
    /* the right padding that makes the output oh x ow (oneDNN checks it) */
    dnnl_dims_t pr = {(k->oh - 1) * k->sh + (k->r - 1) * k->dh + 1 - k->h - k->ph,
                      (k->ow - 1) * k->sw + (k->s - 1) * k->dw + 1 - k->w - k->pw};
    dnnl_status_t s;
    if (dir == FWD)
        s = dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training, dnnl_convolution_direct, src, wei,
                                                       bias, dst, st, dil, pl, pr);
    else if (dir == BWD_DATA)
        s = dnnl_dilated_convolution_backward_data_desc_init(cd, dnnl_convolution_direct, src, wei, dst, st, dil, pl, pr);
    else
        s = dnnl_dilated_convolution_backward_weights_desc_init(cd, dnnl_convolution_direct, src, wei, bias, dst, st,
                                                                dil, pl, pr);
    return s != dnnl_success;
}

/* the reorder between an operand's plain layout and the primitive's (into the
 * primitive for inputs, out of it for the output) */
static int make_reorder(struct cpu_dnnl *d, operand *o, int out, const_dnnl_primitive_attr_t attr)
{
    if (dnnl_memory_desc_equal(&o->user, &o->inner)) return 0;
    dnnl_primitive_desc_t pd = NULL;
    const dnnl_memory_desc_t *from = out ? &o->inner : &o->user, *to = out ? &o->user : &o->inner, *pad;
    int ok = dnnl_reorder_primitive_desc_create(&pd, from, d->engine, to, d->engine, attr) == dnnl_success &&
             (pad = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)) != NULL &&
             dnnl_primitive_create(&o->reorder, pd) == dnnl_success;
    if (ok) o->pad = *pad;
    if (pd) dnnl_primitive_desc_destroy(pd);
    o->own = ok && cpu_conv_layout_of(&o->inner, &o->user, &o->layout);
    return !ok;
}

/* m (an activation's layout) with n images: 1 when images are outermost in
 * it - each image one contiguous slice of the same bytes, so that a chunk of
 * images is a slice of the whole batch's copy - else 0 */
int cpu_conv_with_images(const dnnl_memory_desc_t *m, int64_t n, dnnl_memory_desc_t *out)
{
    const dnnl_blocking_desc_t *b = &m->format_desc.blocking;
    if (m->format_kind != dnnl_blocked || m->ndims != 4 || m->offset0 || m->padded_offsets[0] ||
        m->padded_dims[0] != m->dims[0] || m->extra.flags)
        return 0;
    int64_t blk[4] = {1, 1, 1, 1};
    for (int i = 0; i < b->inner_nblks; i++) blk[b->inner_idxs[i]] *= b->inner_blks[i];
    if (blk[0] != 1) return 0;
    /* every other dimension's blocks lie within one image's stride */
    for (int j = 1; j < 4; j++)
        if (m->padded_dims[j] / blk[j] * b->strides[j] > b->strides[0]) return 0;
    size_t es = dnnl_data_type_size(m->data_type);
    if (dnnl_memory_desc_get_size(m) != (size_t)(m->dims[0] * b->strides[0]) * es) return 0;
    *out = *m;
    out->dims[0] = out->padded_dims[0] = n;
    return dnnl_memory_desc_get_size(out) == (size_t)(n * b->strides[0]) * es;
}

/* a weight-gradient chunk plan's reorders of x and gy of the whole batch
 * (images outermost): one threaded reorder each instead of one per chunk */
static void make_whole(struct cpu_dnnl *d, plan *p)
{
    const conv_key *k = &p->key;
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success)
        for (int i = 0; i < 2; i++) {
            operand *o = &p->whole[i], *c = &p->op[i];
            int64_t ch = i ? k->k : k->c, hh = i ? k->oh : k->h, ww = i ? k->ow : k->w;
            o->arg = c->arg;
            if (!c->reorder || !cpu_conv_with_images(&c->inner, k->batch, &o->inner) ||
                md_act(&o->user, c->user.data_type, k->batch, ch, hh, ww, 0) || make_reorder(d, o, 0, attr)) {
                memset(o, 0, sizeof *o);
                continue;
            }
            size_t b = dnnl_memory_desc_get_size(&o->pad);
            if (b > p->pad_bytes) p->pad_bytes = b;
        }
    dnnl_primitive_attr_destroy(attr);
}

static int make_plan_(struct cpu_dnnl *d, plan *p);

/* oneDNN sizes its work split by the thread count when a primitive is made */
static int make_plan(struct cpu_dnnl *d, plan *p)
{
    int was = omp_get_max_threads();
    if (p->key.threads != was) omp_set_num_threads(p->key.threads);
    int r = make_plan_(d, p);
    if (p->key.threads != was) omp_set_num_threads(was);
    /* the whole-batch reorders are threaded: made under the caller's count */
    if (r == 1 && p->key.batch) make_whole(d, p);
    return r;
}

static int make_plan_(struct cpu_dnnl *d, plan *p)
{
    const conv_key *k = &p->key;
    int any = 1, f32 = dnnl_f32;
    /* the forward descriptor: the primitive itself, or the hint the backward ones need */
    dnnl_memory_desc_t src, wei, dst, bias, fsrc, fwei, fdst;
    dnnl_convolution_desc_t fd, bd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    const char *impl = "";
    /* scratchpads are the caller's: the weight gradient runs plans on several
     * threads at once, and oneDNN's own scratchpad is shared */
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return -1;
    int in_dt = k->dt, sdt = k->dir == BWD_DATA ? k->odt : in_dt, ddt = k->dir == FWD ? k->odt : in_dt;
    int wdt = k->dir == BWD_WEIGHTS ? k->odt : in_dt;
    int ok = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
             !md_act(&src, sdt, k->n, k->c, k->h, k->w, any) && !md_wei(&wei, wdt, k, any) &&
             !md_act(&dst, ddt, k->n, k->k, k->oh, k->ow, any) &&
             !md_act(&fsrc, in_dt, k->n, k->c, k->h, k->w, any) && !md_wei(&fwei, in_dt, k, any) &&
             !md_act(&fdst, in_dt, k->n, k->k, k->oh, k->ow, any);
    if (ok && k->bias) {
        dnnl_dims_t bd1 = {k->k};
        ok = dnnl_memory_desc_init_by_tag(&bias, 1, bd1, f32, dnnl_a) == dnnl_success;
    }
    ok = ok && !desc(&fd, k, FWD, k->dir == FWD ? &src : &fsrc, k->dir == FWD ? &wei : &fwei,
                     k->dir == FWD && k->bias ? &bias : NULL, k->dir == FWD ? &dst : &fdst) &&
         dnnl_primitive_desc_create(&fpd, &fd, attr, d->engine, NULL) == dnnl_success;
    if (ok && k->dir != FWD)
        ok = !desc(&bd, k, k->dir, &src, &wei, k->dir == BWD_WEIGHTS && k->bias ? &bias : NULL, &dst) &&
             dnnl_primitive_desc_create(&pd, &bd, attr, d->engine, fpd) == dnnl_success;
    dnnl_primitive_desc_t use = k->dir == FWD ? fpd : pd;
    ok = ok && dnnl_primitive_desc_query(use, dnnl_query_impl_info_str, 0, &impl) == dnnl_success;
    /* oneDNN's reference kernels are slower than cpu_conv.c's im2col path */
    ok = ok && strncmp(impl, "ref", 3) != 0 && !strstr(impl, "gemm:ref") && dnnl_primitive_create(&p->prim, use) == dnnl_success;
    /* the operands, the primitive's layouts, the reorders */
    static const int args[3][3] = {
        {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
        {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
        {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS},
    };
    for (int i = 0; i < 3 && ok; i++) {
        operand *o = &p->op[i];
        o->arg = args[k->dir][i];
        const dnnl_memory_desc_t *m = dnnl_primitive_desc_query_md(use, dnnl_query_exec_arg_md, o->arg);
        ok = m != NULL;
        if (!ok) break;
        o->inner = *m;
        int64_t nn = k->n, ch = k->c, hh = k->h, ww = k->w, dt = o->arg == DNNL_ARG_DIFF_SRC ? k->odt : in_dt;
        if (o->arg == DNNL_ARG_DST || o->arg == DNNL_ARG_DIFF_DST) ch = k->k, hh = k->oh, ww = k->ow;
        if (o->arg == DNNL_ARG_DST) dt = k->odt;
        ok = (o->arg == DNNL_ARG_WEIGHTS || o->arg == DNNL_ARG_DIFF_WEIGHTS
                  ? !md_wei(&o->user, o->arg == DNNL_ARG_DIFF_WEIGHTS ? k->odt : in_dt, k, 0)
                  : !md_act(&o->user, (int)dt, nn, ch, hh, ww, 0)) &&
             !make_reorder(d, o, i == 2, attr);
        size_t b = o->reorder ? dnnl_memory_desc_get_size(&o->pad) : 0;
        if (b > p->pad_bytes) p->pad_bytes = b;
    }
    const dnnl_memory_desc_t *pad = ok ? dnnl_primitive_desc_query_md(use, dnnl_query_scratchpad_md, 0) : NULL;
    ok = ok && pad;
    if (ok) {
        p->pad = *pad;
        size_t b = dnnl_memory_desc_get_size(pad);
        if (b > p->pad_bytes) p->pad_bytes = b;
    }
    if (k->bias) p->bias = bias;
    dnnl_primitive_attr_destroy(attr);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (!ok) {
        if (p->prim) dnnl_primitive_destroy(p->prim);
        for (int i = 0; i < 3; i++) if (p->op[i].reorder) dnnl_primitive_destroy(p->op[i].reorder);
        p->prim = NULL;
        memset(p->op, 0, sizeof p->op);
    }
    return ok ? 1 : -1;
}

static void drop(plan *p)
{
    if (p->used != 1) return;
    dnnl_primitive_destroy(p->prim);
    for (int i = 0; i < 3; i++) if (p->op[i].reorder) dnnl_primitive_destroy(p->op[i].reorder);
    for (int i = 0; i < 2; i++) if (p->whole[i].reorder) dnnl_primitive_destroy(p->whole[i].reorder);
}

plan *cpu_conv_find(struct cpu_conv_plans *c, struct cpu_dnnl *d, const conv_key *key)
{
    for (int i = 0; i < PLANS; i++)
        if (c->plans[i].used && !memcmp(&c->plans[i].key, key, sizeof *key)) return &c->plans[i];
    plan *p = &c->plans[c->next];
    c->next = (c->next + 1) % PLANS;
    drop(p);
    memset(p, 0, sizeof *p);
    p->key = *key;
    p->used = make_plan(d, p);
    return p;
}

static int mem(dnnl_memory_t *m, const dnnl_memory_desc_t *md, struct cpu_dnnl *d, void *ptr)
{
    return dnnl_memory_create(m, md, d->engine, ptr) != dnnl_success;
}

/* a primitive with its arguments and its scratchpad (md pad over buffer at) */
static int exec(struct cpu_dnnl *d, dnnl_stream_t st, dnnl_primitive_t prim, int na, dnnl_exec_arg_t *args,
                const dnnl_memory_desc_t *pad, void *at)
{
    dnnl_memory_t pm = NULL;
    int ok = !mem(&pm, pad, d, at);
    if (ok) {
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, pm};
        ok = dnnl_primitive_execute(prim, st, na, args) == dnnl_success;
    }
    if (pm) dnnl_memory_destroy(pm);
    return !ok;
}

/* tests: 0 runs oneDNN's reorders where cpu_conv_layout.c's would run */
static int own_on = 1;
int cpu_conv_dnnl_own_reorders(int on)
{
    int was = own_on;
    own_on = on;
    return was;
}

/* operand o's reorder (out: out of the primitive's layout) from -> to */
static int exec_reorder(struct cpu_dnnl *d, dnnl_stream_t st, operand *o, int out, dnnl_memory_t from, dnnl_memory_t to,
                        void *pad)
{
    if (o->own && own_on) {
        void *f = NULL, *t = NULL;
        /* the primitive before it has finished (a CPU stream runs in order) */
        if (dnnl_stream_wait(st) != dnnl_success || dnnl_memory_get_data_handle(from, &f) != dnnl_success ||
            dnnl_memory_get_data_handle(to, &t) != dnnl_success)
            return 1;
        cpu_conv_layout_move(out, dnnl_data_type_size(o->user.data_type), f, t, &o->layout);
        return 0;
    }
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    return exec(d, st, o->reorder, 2, args, &o->pad, pad);
}

/* the bytes of a plan's working buffers: the operands in its layouts
 * (inner_bytes) and the scratchpads (pad_bytes), each rounded up to 64 */
static size_t work_bytes(const plan *p) { return inner_bytes(p, 0) + inner_bytes(p, 1) + inner_bytes(p, 2) + pad_bytes(p); }

/* run a plan on stream st over the operands' plain buffers ptr[0..2] and the
 * bias, with work (work_bytes) for the operands in the plan's layouts: 0, or 1
 * when oneDNN failed. blk (or NULL): operands already in the plan's layout
 * elsewhere - an input there, reordered by the caller; the output left there
 * in the plan's layout - or NULL where run reorders. */
int cpu_conv_run(struct cpu_dnnl *d, dnnl_stream_t st, plan *p, void *ptr[3], void *const *blk, const float *bias,
                 char *work)
{
    dnnl_memory_t user[3] = {NULL, NULL, NULL}, inner[3] = {NULL, NULL, NULL}, bm = NULL;
    char *pad = work;   /* the scratchpads first, then the operands */
    int ok = 1, moved[3] = {0, 0, 0};   /* moved: reordered here */
    work += pad_bytes(p);
    for (int i = 0; i < 3 && ok; i++) {
        operand *o = &p->op[i];
        if (o->reorder && blk && blk[i]) {
            ok = !mem(&inner[i], &o->inner, d, blk[i]);
            continue;
        }
        ok = !mem(&user[i], &o->user, d, ptr[i]);
        if (!ok || !o->reorder) continue;
        moved[i] = 1;
        ok = !mem(&inner[i], &o->inner, d, work) && (i == 2 || !exec_reorder(d, st, o, 0, user[i], inner[i], pad));
        work += inner_bytes(p, i);
    }
    if (ok && p->key.bias) ok = !mem(&bm, &p->bias, d, (void *)bias);
    if (ok) {
        dnnl_exec_arg_t args[5];
        int na = 0;
        for (int i = 0; i < 3; i++) args[na++] = (dnnl_exec_arg_t){p->op[i].arg, inner[i] ? inner[i] : user[i]};
        if (bm) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, bm};
        ok = !exec(d, st, p->prim, na, args, &p->pad, pad) &&
             (!moved[2] || !exec_reorder(d, st, &p->op[2], 1, inner[2], user[2], pad)) &&
             dnnl_stream_wait(st) == dnnl_success;
    }
    for (int i = 0; i < 3; i++) {
        if (user[i]) dnnl_memory_destroy(user[i]);
        if (inner[i]) dnnl_memory_destroy(inner[i]);
    }
    if (bm) dnnl_memory_destroy(bm);
    return ok ? 0 : 1;
}

/* a reorder (operand o's, either way) between buffers from and to over pad, on stream st */
int cpu_conv_reorder_on(struct cpu_dnnl *d, dnnl_stream_t st, operand *o, int out, void *from, void *to, void *pad)
{
    dnnl_memory_t f = NULL, t = NULL;
    int ok = !mem(&f, out ? &o->inner : &o->user, d, from) && !mem(&t, out ? &o->user : &o->inner, d, to) &&
             !exec_reorder(d, st, o, out, f, t, pad) && dnnl_stream_wait(st) == dnnl_success;
    if (f) dnnl_memory_destroy(f);
    if (t) dnnl_memory_destroy(t);
    return !ok;
}

int cpu_conv_reorder(struct cpu_dnnl *d, operand *o, int out, void *from, void *to, void *pad)
{
    return cpu_conv_reorder_on(d, d->stream, o, out, from, to, pad);
}

void cpu_conv_key_of(conv_key *key, int dir, int dt, int odt, int64_t n, const mp_conv_args *a)
{
    memset(key, 0, sizeof *key);   /* the padding too: keys are compared whole */
    key->dir = dir, key->dt = dt, key->odt = odt, key->n = n;
    key->c = a->c, key->h = a->h, key->w = a->w, key->k = a->k, key->r = a->r, key->s = a->s;
    key->sh = a->sh, key->sw = a->sw, key->ph = a->ph, key->pw = a->pw, key->dh = a->dh, key->dw = a->dw;
    key->groups = a->groups, key->oh = a->oh, key->ow = a->ow;
    /* backward weights runs single-threaded plans on chunks of images */
    key->threads = dir == BWD_WEIGHTS ? 1 : omp_get_max_threads();
    if (dir == BWD_WEIGHTS) key->batch = a->n;
}

/* Forward and backward data in chunks of images. Their kernels give each
 * output element to one thread, whole, in an order that is the same whatever
 * batch or thread count the plan was made for, so the batch can go in
 * chunks with the same bits (tests/c/test_conv.c checks them against the
 * whole batch's). A chunk holds the most images, a power of two, whose
 * blocked input and output take at most CBYTES together; each is run by one thread on a single-threaded plan:
 * its input reordered into the thread's buffer, the kernel, its output
 * reordered out, all within the core's L2. On the whole batch each of those
 * passes went through memory (batch 128: 16 MiB an activation of the wide
 * ResNet's first stage), the reorders' share of a step growing with the
 * batch. The weights go into the plan's layout once, for all chunks. The
 * chunking depends on the shape only; where it leaves fewer chunks than
 * threads the whole batch runs on threaded plans as before. */
typedef struct {
    plan *pf, *pl;            /* the chunks' plans: the first ones, the last (pf when as long) */
    int64_t chunks, per, last;
    size_t wb, each;          /* the weights' blocked copy (0: none); a thread's work bytes */
    conv_key kf, kl;          /* pf's and pl's keys (a later find may take their slots) */
} cplan;

/* cp's plans still in their slots */
static int chunks_kept(const cplan *cp)
{
    return !memcmp(&cp->pf->key, &cp->kf, sizeof cp->kf) && !memcmp(&cp->pl->key, &cp->kl, sizeof cp->kl);
}

/* tests: 0 takes the whole batch (whose bits the chunks must give) */
static int chunks_on = 1;
static long chunk_runs;
int cpu_conv_dnnl_chunks(int on)
{
    int was = chunks_on;
    chunks_on = on;
    return was;
}
long cpu_conv_dnnl_chunk_runs(void) { return chunk_runs; }

/* the chunking of direction dir (FWD, BWD_DATA) of a and its plans: 0, or 1
 * (the whole batch instead) */
static int chunk_plans(struct cpu_dnnl *d, int dir, int dt, int odt, int bias, const mp_conv_args *a, cplan *cp)
{
    struct cpu_conv_plans *c = d->conv;
    int nt = omp_get_max_threads();
    size_t es = dt == dnnl_bf16 ? 2 : 4, oes = odt == dnnl_bf16 ? 2 : 4;
    size_t x = (size_t)((a->c + 15) / 16 * 16 * a->h * a->w), y = (size_t)((a->k + 15) / 16 * 16 * a->oh * a->ow);
    size_t img = dir == FWD ? x * es + y * oes : y * es + x * oes;
    /* a power of two: the usual batches split evenly among the threads
     * (5 images a chunk left batch 32 at 4 chunks against 3 on 2 threads) */
    int64_t per = 1;
    while (per < a->n && (size_t)(2 * per) * img <= CBYTES) per *= 2;
    if (!chunks_on || nt > CTHREADS || per >= a->n || (a->n + per - 1) / per < nt) return 1;
    /* where each thread would get few chunks, smaller ones, so that the
     * dynamic hand-out can even out threads running at different speeds
     * (measured on AVX2 only: AVX-512 machines keep their chunks) */
    if (nt > 1 && !__builtin_cpu_supports("avx512f"))
        while (per > FINE_MIN && (a->n + per - 1) / per < FINE_PER * nt) per /= 2;
    cp->per = per, cp->chunks = (a->n + per - 1) / per;
    int64_t last = cp->last = a->n - (cp->chunks - 1) * per;
    conv_key *kf = &cp->kf, *kl = &cp->kl;
    cpu_conv_key_of(kf, dir, dt, odt, per, a);
    cpu_conv_key_of(kl, dir, dt, odt, last, a);
    kf->threads = kl->threads = 1, kf->bias = kl->bias = bias;
    plan *pf = cp->pf = cpu_conv_find(c, d, kf), *pl = cp->pl = last == per ? pf : cpu_conv_find(c, d, kl);
    /* the second find may have taken the first's slot */
    if (pf->used != 1 || pl->used != 1 || !chunks_kept(cp) ||
        !pf->op[1].reorder != !pl->op[1].reorder || !dnnl_memory_desc_equal(&pf->op[1].inner, &pl->op[1].inner))
        return 1;
    for (int t = 0; t < nt; t++)
        if (!c->tstreams[t] && dnnl_stream_create(&c->tstreams[t], d->engine, dnnl_stream_default_flags) != dnnl_success)
            return 1;
    cp->wb = inner_bytes(pf, 1), cp->each = 0;
    for (int j = 0; j < 2; j++) {
        plan *p = j ? pl : pf;
        size_t b = pad_bytes(p) + inner_bytes(p, 0) + inner_bytes(p, 2);
        if (b > cp->each) cp->each = b;
    }
    return 0;
}

/* chunked()'s bytes of work */
static size_t chunk_bytes(const cplan *cp) { return cp->wb + (size_t)omp_get_max_threads() * cp->each; }

/* the chunks of cp over in0 and out (plain; in_img, out_img: an image's
 * bytes) with the weights in1 (plain) and the bias, in buf (chunk_bytes).
 * share (or NULL): where the blocked input goes - the whole batch's copy, in
 * the plans' layout with images outermost (share_img bytes an image) - for a
 * later use (the weight gradient's gy). 0, or 1 when oneDNN failed. */
static int chunked(struct cpu_dnnl *d, const cplan *cp, const void *in0, const void *in1, void *out, size_t in_img,
                   size_t out_img, const float *bias, char *buf, char *share, size_t share_img)
{
    struct cpu_conv_plans *c = d->conv;
    char *wblk = buf, *work = buf + cp->wb;
    if (cp->wb && cpu_conv_reorder(d, &cp->pf->op[1], 0, (void *)in1, wblk, work)) return 1;
    int failed = 0;
    chunk_runs++;
    /* handed out one at a time: a thread slowed by anything (the other
     * process on its core, its caches) takes fewer chunks instead of the
     * other waiting for it at the end (static halves left one thread idle
     * ~1/4 of a 2-thread step's convolution time on a shared VM). The bits
     * do not depend on which thread runs a chunk. */
    #pragma omp parallel for schedule(dynamic, 1) reduction(|: failed)
    for (int64_t i = 0; i < cp->chunks; i++) {
        int t = omp_get_thread_num();
        plan *p = i == cp->chunks - 1 ? cp->pl : cp->pf;
        char *mine = work + (size_t)t * cp->each;
        void *ptr[3] = {(char *)in0 + (size_t)(i * cp->per) * in_img, (void *)in1,
                        (char *)out + (size_t)(i * cp->per) * out_img};
        void *blk[3] = {share ? share + (size_t)(i * cp->per) * share_img : NULL, cp->wb ? wblk : NULL, NULL};
        if (share && cpu_conv_reorder_on(d, c->tstreams[t], &p->op[0], 0, ptr[0], blk[0], mine)) {
            failed |= 1;
            continue;
        }
        failed |= cpu_conv_run(d, c->tstreams[t], p, ptr, blk, bias, mine);
    }
    return failed;
}

/* tests: 0 declines every convolution here (cpu_conv.c's im2col path runs,
 * its GEMMs still on oneDNN); returns the previous setting */
static int convs_on = 1;
int cpu_conv_dnnl_convs(int on)
{
    int was = convs_on;
    convs_on = on;
    return was;
}

/* the engine (its plans' cache ready) when a convolution of dt over a may go
 * to oneDNN at all, else NULL: the checks every entry makes before its plans */
static struct cpu_dnnl *usable(mp_kctx *cx, mp_dtype dt, const mp_conv_args *a)
{
    struct cpu_dnnl *d = convs_on ? cpu_dnnl_of(cx) : NULL;
    if (!d || (dt != MP_F32 && dt != MP_BF16 && dt != MP_F16) || a->n == 0 || a->c == 0 || a->k == 0) return NULL;
    if (!d->conv && !(d->conv = calloc(1, sizeof *d->conv))) return NULL;
    return d;
}

/* bf16 where oneDNN has no bf16 primitive for a shape and direction (no
 * AVX512-BF16 or AMX: oneDNN 2.6 makes none on AVX2) takes the f16 route:
 * operands widened to f32 once, the f32 primitive, outputs rounded once. A
 * tests' switch (1) takes that route for every bf16 convolution, so that it
 * is tested on processors with bf16 primitives too; widened_runs counts the
 * directions run on it. */
static int widen_all;
static long widened_runs;
int cpu_conv_dnnl_bf16_widen(int on)
{
    int was = widen_all;
    widen_all = on;
    return was;
}
long cpu_conv_dnnl_widened_runs(void) { return widened_runs; }

/* the primitive's operand dtype (kdt) and output dtype (odt) for tensors of
 * dt; wide: operands widened to f32 (f16 always, bf16 on the f16 route).
 * bf16 results come straight from the primitive except while flush counting
 * is on (cpu_store counts); the weight gradient's f32 sums are always
 * rounded here (cpu_conv_weight_plans). */
static void dtypes(mp_kctx *cx, mp_dtype dt, int wide, int *kdt, int *odt)
{
    *kdt = dt == MP_BF16 && !wide ? dnnl_bf16 : dnnl_f32;
    *odt = *kdt == dnnl_bf16 && !cx->flush.on ? dnnl_bf16 : dnnl_f32;
}

/* direction dir's (FWD, BWD_DATA) plans for operands of oneDNN dtype kdt and
 * output odt: in chunks (*chunks, cp) or on the whole batch (*p, its key).
 * 0, or 1 where oneDNN has no (non-reference) primitive for them. */
static int plans_of(struct cpu_dnnl *d, int dir, int kdt, int odt, int bias, const mp_conv_args *a, cplan *cp,
                    int *chunks, plan **p, conv_key *key)
{
    *p = NULL;
    *chunks = !chunk_plans(d, dir, kdt, odt, bias, a, cp);
    if (*chunks) return 0;
    cpu_conv_key_of(key, dir, kdt, odt, a->n, a);
    key->bias = bias;
    *p = cpu_conv_find(d->conv, d, key);
    if ((*p)->used == 1) return 0;
    *p = NULL;
    return 1;
}

/* tests: 1 when direction dir of a in dt (with a bias: forward) would run on
 * oneDNN's primitives here (bf16 as it is or on the f16 route), 0 when
 * cpu_conv_dnnl declines it (oneDNN off, no images, only a reference kernel
 * in f32 too). The same plans as the entries', tried in their order (made
 * here if new), so the answer is theirs. */
int cpu_conv_dnnl_takes(mp_kctx *cx, int dir, mp_dtype dt, int bias, const mp_conv_args *a)
{
    struct cpu_dnnl *d = usable(cx, dt, a);
    if (!d) return 0;
    for (int wide = dt == MP_F16 || (dt == MP_BF16 && widen_all); wide < 2; wide++) {
        int kdt, odt, chunks;
        dtypes(cx, dt, wide, &kdt, &odt);
        wplan w;
        cplan cp;
        plan *p;
        conv_key key;
        if (dir == BWD_WEIGHTS ? !cpu_conv_weight_plans(d, kdt, a, &w)
                               : !plans_of(d, dir, kdt, odt, dir == FWD && bias, a, &cp, &chunks, &p, &key))
            return 1;
        if (dt != MP_BF16) break;   /* only bf16 has a second way */
    }
    return 0;
}

/* the gradients of a convolution through oneDNN (dt: the tensors' dtype):
 * gx from gy and w, gw from x and gy (either NULL: not wanted). gy goes into
 * oneDNN's layout once when both primitives take the same one. Each gradient
 * takes the f16 route (operands widened) on its own where oneDNN has no bf16
 * primitive for its direction. Returns -1 when out of memory, else which
 * gradients were written (1 gx, 2 gw); the caller takes its own path for the
 * others. */
int cpu_conv_dnnl_grad(mp_kctx *cx, mp_dtype dt, void *gx, void *gw, const void *gy, const void *x, const void *w,
                       const mp_conv_args *a)
{
    struct cpu_dnnl *d = usable(cx, dt, a);
    if (!d) return 0;
    /* xwide, wwide: backward data's, the weight gradient's operands widened */
    int xwide = dt == MP_F16 || (dt == MP_BF16 && widen_all), wwide = xwide, kdt, odt;
    dtypes(cx, dt, xwide, &kdt, &odt);
    int64_t nx = a->n * a->c * a->h * a->w, ny = a->n * a->k * a->oh * a->ow, nw = a->k * (a->c / a->groups) * a->r * a->s;
    plan *p = NULL;
    conv_key key;
    cplan cp;
    int chunks = 0;
    if (gx && plans_of(d, BWD_DATA, kdt, odt, 0, a, &cp, &chunks, &p, &key) && dt == MP_BF16 && !xwide) {
        xwide = 1;
        dtypes(cx, dt, xwide, &kdt, &odt);
        plans_of(d, BWD_DATA, kdt, odt, 0, a, &cp, &chunks, &p, &key);
    }
    int direct = dt == MP_F32 || odt == dnnl_bf16;
    wplan wp;
    int wkdt = dt == MP_BF16 && !wwide ? dnnl_bf16 : dnnl_f32, wok = gw && !cpu_conv_weight_plans(d, wkdt, a, &wp);
    if (gw && !wok && wkdt == dnnl_bf16) {
        wwide = 1, wkdt = dnnl_f32;
        wok = !cpu_conv_weight_plans(d, wkdt, a, &wp);
    }
    /* the weights' plans may have taken backward data's slots */
    if (p && memcmp(&p->key, &key, sizeof key)) p = NULL;
    if (chunks && !chunks_kept(&cp)) chunks = 0;
    if (!p && !chunks && !wok) return 0;
    /* gy's blocked copy, shared where backward data's layout is the weight
     * gradient's chunks' (in chunks: each chunk's slice of it; the layouts
     * equal, so are their dtypes: both widened or neither) */
    int share = 0;
    if (p) share = wok && wp.whole[1] && p->op[0].reorder && dnnl_memory_desc_equal(&p->op[0].inner, &wp.pf->whole[1].inner);
    if (chunks && wok && wp.whole[1] && cp.pf->op[0].reorder) {
        dnnl_memory_desc_t m;
        share = cpu_conv_with_images(&wp.pf->whole[1].inner, cp.per, &m) &&
                dnnl_memory_desc_equal(&m, &cp.pf->op[0].inner) &&
                cpu_conv_with_images(&wp.pf->whole[1].inner, cp.last, &m) &&
                dnnl_memory_desc_equal(&m, &cp.pl->op[0].inner);
    }
    size_t gyb = share ? cpu_conv_whole_bytes(&wp, 1) : 0, need = 0;
    if (p) need = gyb + pad_bytes(p) + (share ? 0 : inner_bytes(p, 0)) + inner_bytes(p, 1) + inner_bytes(p, 2);
    if (chunks) need = gyb + chunk_bytes(&cp);
    if (wok && cpu_conv_whole_bytes(&wp, 0) + cpu_conv_whole_bytes(&wp, 1) + (wp.wb + wp.part) * (size_t)wp.chunks > need)
        need = cpu_conv_whole_bytes(&wp, 0) + cpu_conv_whole_bytes(&wp, 1) + (wp.wb + wp.part) * (size_t)wp.chunks;
    /* laid out [gy's copy | the rest]: backward data's work, then the weights' */
    char *buf = cpu_scratch(cx, S_R0, need + 64);
    /* gy widened once for whichever direction takes it so */
    const void *gy32 = ((p || chunks) && xwide) || (wok && wwide) ? cpu_scratch_f32(cx, S_IN0, dt, gy, ny) : gy;
    if (!buf || !gy32) return -1;
    int wrote = 0;
    if (p || chunks) {
        const void *gyx = xwide ? gy32 : gy, *w32 = xwide ? cpu_scratch_f32(cx, S_IN1, dt, w, nw) : w;
        void *out = direct ? gx : cpu_scratch(cx, S_OUT, sizeof(float) * (size_t)nx);
        if (!w32 || !out) return -1;
        int failed;
        if (chunks) {
            size_t img = share ? dnnl_memory_desc_get_size(&wp.pf->whole[1].inner) / (size_t)a->n : 0;
            failed = chunked(d, &cp, gyx, w32, out, (size_t)(a->k * a->oh * a->ow) * (kdt == dnnl_bf16 ? 2 : 4),
                             (size_t)(a->c * a->h * a->w) * (odt == dnnl_bf16 ? 2 : 4), NULL, buf + gyb,
                             share ? buf : NULL, img);
            /* a failed chunk may have left its slice of gy's copy unwritten */
            if (failed) share = 0;
        } else {
            void *ptr[3] = {(void *)gyx, (void *)w32, out}, *blk[3] = {share ? buf : NULL, NULL, NULL};
            if (share && cpu_conv_reorder(d, &p->op[0], 0, (void *)gyx, buf, buf + gyb)) share = 0, blk[0] = NULL;
            failed = cpu_conv_run(d, d->stream, p, ptr, blk, NULL, buf + gyb);
        }
        if (!failed) {
            if (!direct) cpu_store_f32(cx, dt, gx, out, nx);
            if (dt == MP_BF16 && xwide) widened_runs++;
            wrote |= 1;
        }
    }
    if (wok) {
        const void *gyw = wwide ? gy32 : gy, *x32 = wwide ? cpu_scratch_f32(cx, S_IN1, dt, x, nx) : x;
        float *out = dt == MP_F32 ? gw : cpu_scratch(cx, S_OUT, sizeof(float) * (size_t)nw);
        if (!x32 || !out) return -1;
        if (!cpu_conv_weights(d, &wp, x32, gyw, share, out, buf, a, wkdt == dnnl_bf16 ? 2 : 4)) {
            if (dt != MP_F32) cpu_store_f32(cx, dt, gw, out, nw);
            if (dt == MP_BF16 && wwide) widened_runs++;
            wrote |= 2;
        }
    }
    return wrote;
}

/* one direction of a convolution through oneDNN: out = dir(in0, in1) (+ bias
 * forward). dt: the tensors' dtype; the output is rounded once into it.
 * Returns 0 when done, 1 when the caller should take its own path, -1 when
 * out of memory. */
int cpu_conv_dnnl(mp_kctx *cx, int dir, mp_dtype dt, void *out, const void *in0, const void *in1, const void *b,
                  const mp_conv_args *a)
{
    if (dir != FWD) {
        int r = dir == BWD_DATA ? cpu_conv_dnnl_grad(cx, dt, out, NULL, in0, NULL, in1, a)
                                : cpu_conv_dnnl_grad(cx, dt, NULL, out, in1, in0, NULL, a);
        return r < 0 ? -1 : !r;
    }
    struct cpu_dnnl *d = usable(cx, dt, a);
    if (!d) return 1;
    int wide = dt == MP_F16 || (dt == MP_BF16 && widen_all), kdt, odt, chunks;
    dtypes(cx, dt, wide, &kdt, &odt);
    cplan cp;
    conv_key key;
    plan *p;
    if (plans_of(d, FWD, kdt, odt, b != NULL, a, &cp, &chunks, &p, &key)) {
        /* no bf16 primitive for this shape: the f16 route */
        if (dt != MP_BF16 || wide) return 1;
        wide = 1;
        dtypes(cx, dt, wide, &kdt, &odt);
        if (plans_of(d, FWD, kdt, odt, b != NULL, a, &cp, &chunks, &p, &key)) return 1;
    }
    int direct = dt == MP_F32 || odt == dnnl_bf16;
    int64_t nx = a->n * a->c * a->h * a->w, ny = a->n * a->k * a->oh * a->ow, nw = a->k * (a->c / a->groups) * a->r * a->s;
    void *ptr[3];
    ptr[0] = wide ? cpu_scratch_f32(cx, S_IN0, dt, in0, nx) : (void *)in0;
    ptr[1] = wide ? cpu_scratch_f32(cx, S_IN1, dt, in1, nw) : (void *)in1;
    ptr[2] = direct ? out : cpu_scratch(cx, S_OUT, sizeof(float) * (size_t)ny);
    if (!ptr[0] || !ptr[1] || !ptr[2]) return -1;
    float *bias = NULL;
    if (b) {
        bias = dt == MP_F32 ? (float *)b : cpu_scratch(cx, S_BIAS, sizeof(float) * (size_t)a->k);
        if (!bias) return -1;
        if (dt != MP_F32) cpu_load(dt, b, 0, bias, a->k);
    }
    char *work = cpu_scratch(cx, S_R0, (chunks ? chunk_bytes(&cp) : work_bytes(p)) + 64);
    if (!work) return -1;
    size_t ies = kdt == dnnl_bf16 ? 2 : 4, oes = odt == dnnl_bf16 ? 2 : 4;
    if (chunks ? chunked(d, &cp, ptr[0], ptr[1], ptr[2], (size_t)(a->c * a->h * a->w) * ies,
                         (size_t)(a->k * a->oh * a->ow) * oes, bias, work, NULL, 0)
               : cpu_conv_run(d, d->stream, p, ptr, NULL, bias, work))
        return 1;
    if (!direct) cpu_store_f32(cx, dt, out, ptr[2], ny);
    if (dt == MP_BF16 && wide) widened_runs++;
    return 0;
}
