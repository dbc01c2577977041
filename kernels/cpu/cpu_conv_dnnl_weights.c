/*
 * cpu_conv_dnnl_weights.c: a convolution's weight gradient on oneDNN's
 * backward-weights primitives, in chunks of images. Its plans come from
 * cpu_conv_dnnl_plan.c; cpu_conv_dnnl.c runs the other directions and calls
 * in here from cpu_conv_dnnl_grad, and its head comment gives the layouts,
 * reorders and numerics. What the three files share is in
 * cpu_conv_dnnl_plan.h.
 *
 * Why chunks: oneDNN's kernels split the sum over images among the
 * threads they were made for, so their bits would depend on the thread
 * count. Instead the images go in WCHUNKS chunks (fewer when the partial sums
 * would pass WBYTES), each summed by a single-threaded plan into its own f32
 * partial, the chunks in parallel; the partials are then added in chunk
 * order. The chunking depends on the shape only.
 * Where images are outermost in the chunk plans' layouts
 * (cpu_conv_with_images), x and gy have copies for the whole batch in them
 * (gy's may come from backward data), each chunk reordering its slice just
 * before its kernel reads it, while it is in cache (one threaded reorder of
 * the whole batch before the chunks went through memory at batch 128). The
 * partials stay in the plans' blocked layout of the gradient, are added there
 * element by element (the same f32 additions in the same order as in the plain layout:
 * the same bits; padding lanes are added too, and dropped by the one reorder
 * of the sum into the plain gradient).
 *
 * Why x is laid out again here rather than kept from the forward, whose
 * chunks lay out the same x in the same layout: keeping that copy with the
 * autograd node (tried: backend entries that let the forward write it into a
 * buffer saved with the node and hand it back here; same bits, tested)
 * measured 1.5-2.3% off the wide ResNet's bf16 batch-32 step, 0-1.3% in f32,
 * 1.0% / 0.2% at batch 128 and nothing on the small ResNet (steps alternating
 * in one process), for 15-19% more peak RSS on the wide ResNet and 33% on the
 * small one at batch 128: the copy lives from forward to backward beside the
 * plain x, which other nodes keep anyway (the ReLU before it saves it).
 */
#include <string.h>
#include "kernels/cpu/cpu_conv_dnnl_plan.h"

/* the chunks' partial sums together, at most (WCHUNKS: fewer chunks where they would pass it) */
#define WBYTES ((size_t)64 << 20)

static size_t up64(size_t b) { return (b + 63) & ~(size_t)63; }

/* tests: 0 takes the plain path (each chunk reorders its own x and gy, and
 * its partial into the plain layout, where the partials are added; gy not
 * shared), whose bits the blocked path must give */
static int blocked_on = 1;
int cpu_conv_dnnl_blocked(int on)
{
    int was = blocked_on;
    blocked_on = on;
    return was;
}

/* the chunking of a's weight gradient and its plans: 0, or 1 (decline) */
int cpu_conv_weight_plans(struct cpu_dnnl *d, int dt, const mp_conv_args *a, wplan *w)
{
    struct cpu_conv_plans *c = d->conv;
    int64_t nw = a->k * (a->c / a->groups) * a->r * a->s;
    int64_t chunks = a->n < WCHUNKS ? a->n : WCHUNKS;
    while (chunks > 1 && (size_t)chunks * (size_t)nw * 4 > WBYTES) chunks--;
    int64_t per = (a->n + chunks - 1) / chunks;
    w->chunks = (a->n + per - 1) / per, w->per = per, w->last = a->n - (w->chunks - 1) * per;
    conv_key kf, kl;
    cpu_conv_key_of(&kf, BWD_WEIGHTS, dt, dnnl_f32, per, a);
    cpu_conv_key_of(&kl, BWD_WEIGHTS, dt, dnnl_f32, w->last, a);
    w->pf = cpu_conv_find(c, d, &kf), w->pl = w->last == per ? w->pf : cpu_conv_find(c, d, &kl);
    /* the second find may have taken the first's slot */
    if (w->pf->used != 1 || w->pl->used != 1 || memcmp(&w->pf->key, &kf, sizeof kf)) return 1;
    for (int64_t i = 0; i < w->chunks; i++)
        if (!c->streams[i] && dnnl_stream_create(&c->streams[i], d->engine, dnnl_stream_default_flags) != dnnl_success)
            return 1;
    plan *pf = w->pf, *pl = w->pl;
    for (int i = 0; i < 2; i++) {
        dnnl_memory_desc_t m;
        w->whole[i] = blocked_on && pf->whole[i].reorder &&
                      (pl == pf || (cpu_conv_with_images(&pf->whole[i].inner, w->last, &m) &&
                                    dnnl_memory_desc_equal(&m, &pl->op[i].inner)));
    }
    int blocked = blocked_on && pf->op[2].reorder && (pl == pf || dnnl_memory_desc_equal(&pf->op[2].inner, &pl->op[2].inner));
    w->sum = blocked ? &pf->op[2].inner : &pf->op[2].user;
    w->part = up64(dnnl_memory_desc_get_size(w->sum));
    w->wb = 0;
    for (int j = 0; j < 2; j++) {
        plan *p = j ? pl : pf;
        size_t b = pad_bytes(p) + (w->whole[0] ? 0 : inner_bytes(p, 0)) + (w->whole[1] ? 0 : inner_bytes(p, 1)) +
                   (blocked ? 0 : inner_bytes(p, 2));
        if (b > w->wb) w->wb = b;
    }
    return 0;
}

/* the bytes of x's and gy's whole-batch copies (0 where chunks reorder their own) */
size_t cpu_conv_whole_bytes(const wplan *w, int i)
{
    return w->whole[i] ? up64(dnnl_memory_desc_get_size(&w->pf->whole[i].inner)) : 0;
}

/* the weight gradient gw (plain f32) of x and gy (plain) over buf: gy's and
 * x's whole-batch copies (cpu_conv_whole_bytes; gy_there: gy's is there
 * already), then each chunk's work and partial (wb + part). 0, or 1 when
 * oneDNN failed. */
int cpu_conv_weights(struct cpu_dnnl *d, const wplan *w, const void *x, const void *gy, int gy_there, float *gw,
                   char *buf, const mp_conv_args *a, size_t es)
{
    struct cpu_conv_plans *c = d->conv;
    plan *pf = w->pf, *pl = w->pl;
    int64_t chw = a->c * a->h * a->w, kohw = a->k * a->oh * a->ow;
    size_t each = w->wb + w->part;
    char *whole[2] = {buf + cpu_conv_whole_bytes(w, 1), buf}, *part = whole[0] + cpu_conv_whole_bytes(w, 0);
    size_t img[2];   /* an image's bytes in the whole-batch copies */
    for (int i = 0; i < 2; i++)
        if (w->whole[i]) img[i] = dnnl_memory_desc_get_size(&pf->whole[i].inner) / (size_t)a->n;
    int blocked = w->sum != &pf->op[2].user, failed = 0;
    /* dynamic, as in cpu_conv_dnnl.c's chunked(): each chunk has its own
     * stream and partial, so the sums are the same whichever thread runs it */
    #pragma omp parallel for schedule(dynamic, 1) reduction(|: failed)
    for (int64_t i = 0; i < w->chunks; i++) {
        char *mine = part + (size_t)i * each;
        plan *p = i == w->chunks - 1 ? pl : pf;
        void *ptr[3] = {(char *)x + (size_t)(i * w->per * chw) * es, (char *)gy + (size_t)(i * w->per * kohw) * es, mine + w->wb};
        void *blk[3] = {w->whole[0] ? whole[0] + (size_t)(i * w->per) * img[0] : NULL,
                        w->whole[1] ? whole[1] + (size_t)(i * w->per) * img[1] : NULL, blocked ? mine + w->wb : NULL};
        /* the chunk's slices of the copies, just before its kernel reads them */
        int bad = 0;
        for (int j = 0; j < 2 && !bad; j++)
            bad = blk[j] && !(j == 1 && gy_there) &&
                  cpu_conv_reorder_on(d, c->streams[i], &p->op[j], 0, ptr[j], blk[j], mine);
        failed |= bad || cpu_conv_run(d, c->streams[i], p, ptr, blk, NULL, mine);
    }
    if (failed) return 1;
    /* the partials added in chunk order, into the first (blocked) or into gw */
    int64_t nw = (int64_t)(dnnl_memory_desc_get_size(w->sum) / 4);
    float *sum = blocked ? (float *)(part + w->wb) : gw;
    #pragma omp parallel for if (nw * w->chunks >= MP_PAR_MIN) schedule(static)
    for (int64_t e = 0; e < nw; e += MP_BLOCK) {
        int64_t len = nw - e < MP_BLOCK ? nw - e : MP_BLOCK;
        float *s = sum + e;
        if (!blocked) memcpy(s, part + w->wb + e * 4, sizeof(float) * (size_t)len);
        for (int64_t i = 1; i < w->chunks; i++) {
            const float *q = (const float *)(part + (size_t)i * each + w->wb) + e;
            for (int64_t l = 0; l < len; l++) s[l] += q[l];
        }
    }
    return blocked && cpu_conv_reorder(d, &pf->op[2], 1, sum, gw, part);
}
