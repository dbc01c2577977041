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
 * (NCHW <-> nChw16c, nhwc; nChw8c on AVX2) are cpu_conv_layout.c's
 * transposes, the same bits as oneDNN's (exec_reorder). The blocked copies live in scratch (cpu_scratch), as do the
 * primitives' scratchpads (user mode: oneDNN's own is shared between threads).
 * Forward and backward data run on chunks of images small enough that each
 * chunk's blocked copies stay in a core's L2 (chunk_plans()). The gradients
 * (cpu_conv_dnnl_grad) reorder gy once for both primitives where they take
 * the same layout (backward data's chunks writing their slices of the weight
 * gradient's copy); the weight gradient's chunks reorder their slices of x
 * and gy and keep their partial sums in the blocked layout, with one reorder
 * of their sum.
 *
 * Files: this one runs forward and backward data (in chunks of images) and
 * holds the entries (cpu_conv_dnnl, cpu_conv_dnnl_grad); the weight
 * gradient's chunked computation - its chunking, plans and partial sums - is
 * cpu_conv_dnnl_weights.c's, called from cpu_conv_dnnl_grad; both take their
 * plans from cpu_conv_dnnl_plan.c (making, keeping, finding and running a
 * plan, reordering its operands), declared with the types they share in
 * cpu_conv_dnnl_plan.h. The arrows run one way: this file -> weights ->
 * plans.
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
 * between the reorders and the kernel (chunked()). 1 MB is more than a Zen 3
 * core's L2 (512 KB), but 512 KB there, twice the chunks and reorder calls,
 * measured no faster on the wide ResNet (batch 32 and 128, alternating runs
 * within the machine's noise), so one figure serves both kinds of machine */
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
     * dynamic hand-out can even out threads running at different speeds.
     * Measured first on AVX2; on AVX-512 (Zen 4 VM, 2 threads, steps of the
     * bench's ResNets alternating in one process) the wide bf16 batch-32 step
     * was 1.5-2% faster in four runs while the VM was slow (75 ms steps: the
     * threads' speeds differ most then) and no different while it was quiet
     * (61 ms: 1.002, 1.004), the other rows within +-1% (finer still: 2
     * images, or 8 chunks a thread, was no better) */
    if (nt > 1)
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
