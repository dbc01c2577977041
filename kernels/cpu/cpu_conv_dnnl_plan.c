/*
 * cpu_conv_dnnl_plan.c: the plans of oneDNN's convolutions - a primitive for
 * one shape, dtype, direction and thread count, the reorders of its operands
 * between the tensors' NCHW and its blocked layouts, their buffer sizes - made
 * once and kept in the CPU context (struct cpu_conv_plans), found by key, run
 * on a stream over the operands' buffers, and the operands' reorders on their
 * own. cpu_conv_dnnl.c (forward and backward data, the entries) and
 * cpu_conv_dnnl_weights.c (the weight gradient) run their chunks on these;
 * cpu_conv_dnnl.c's head comment gives the layouts and the numerics.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu_conv_dnnl_plan.h"

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

/* tests: 0 runs oneDNN's reorders where cpu_conv_layout.c's would run; the
 * count of those that ran */
static int own_on = 1;
static long own_runs;
int cpu_conv_dnnl_own_reorders(int on)
{
    int was = own_on;
    own_on = on;
    return was;
}
long cpu_conv_dnnl_own_runs(void) { return __atomic_load_n(&own_runs, __ATOMIC_RELAXED); }

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
        __atomic_add_fetch(&own_runs, 1, __ATOMIC_RELAXED);
        return 0;
    }
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    return exec(d, st, o->reorder, 2, args, &o->pad, pad);
}

/* the bytes of a plan's working buffers: the operands in its layouts
 * (inner_bytes) and the scratchpads (pad_bytes), each rounded up to 64 */

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
