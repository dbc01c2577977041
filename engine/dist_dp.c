/*
 * dist_dp.c: data-parallel gradients (engine/dist.h): the optimizers attached
 * with dist = true, their buckets, and the average of each bucket as soon as
 * backward has finished its gradients.
 *
 * Buckets are runs of whole parameters, about bucket_bytes each, made from
 * the last parameter back (backward reaches the last layers first), as
 * PyTorch's DDP makes them. At the start of a backward every parameter counts
 * the edges of the graph that will add to its gradient; after each node's
 * turn its leaf edges count down, and a parameter at zero is final. A bucket
 * whose parameters are all final is reduced once every bucket before it is:
 * the order is the same on every rank, so the collectives match. What was not
 * reached (parameters the graph does not use) goes at the end.
 */
#include <stdlib.h>
#include <string.h>
#include "engine/dist.h"
#include "engine/dist_agree.h"
#include "engine/backward.h"
#include "engine/error.h"

typedef struct {
    mp_optim *o;
    int nb;
    int *lo, *hi;             /* bucket k: parameters lo[k] .. hi[k]-1, k = 0 the last ones */
    int *bucket_of;           /* each parameter's bucket */
    int *pending;             /* this backward: edges still to add to each parameter */
    int *left;                /* this backward: parameters of each bucket not final yet */
    int next;                 /* the next bucket to reduce */
    bool following;           /* this backward's gradients are followed node by node */
} dp_opt;

/* the optimizers attached with dist = true, and mp.dist.no_sync's depth */
static struct {
    dp_opt *v;
    int n, cap;
    int no_sync;
} data_parallel;

static mp_backward_listener listener;   /* below: begin, node_done, end */

static void dp_free(dp_opt *d)
{
    free(d->lo), free(d->hi), free(d->bucket_of), free(d->pending), free(d->left);
    memset(d, 0, sizeof *d);
}

int mp_dist_attach(mp_optim *o, int64_t bucket_bytes)
{
    if (!mp_dist_initialized()) return mp_fail(MP_EINVAL, "call mp.dist.init() first");
    if (bucket_bytes < 4) return mp_fail(MP_EINVAL, "the bucket size must be at least 4 bytes (got %lld)", (long long)bucket_bytes);
    for (int i = 0; i < data_parallel.n; i++)
        if (data_parallel.v[i].o == o) return mp_fail(MP_EINVAL, "the optimizer is data parallel already");
    if (data_parallel.n == data_parallel.cap) {
        int cap = data_parallel.cap ? 2 * data_parallel.cap : 4;
        dp_opt *p = realloc(data_parallel.v, sizeof *p * (size_t)cap);
        if (!p) return mp_fail(MP_EOOM, "out of memory");
        data_parallel.v = p, data_parallel.cap = cap;
    }
    dp_opt d = {.o = o};
    size_t n = (size_t)o->n;
    if (!(d.lo = malloc(sizeof(int) * n)) || !(d.hi = malloc(sizeof(int) * n)) ||
        !(d.bucket_of = malloc(sizeof(int) * n)) || !(d.pending = calloc(n, sizeof(int))) ||
        !(d.left = calloc(n, sizeof(int)))) {
        dp_free(&d);
        return mp_fail(MP_EOOM, "out of memory");
    }
    int64_t cap = bucket_bytes / 4;
    for (int hi = o->n; hi > 0; d.nb++) {   /* from the last parameter back */
        int lo = hi - 1;
        int64_t size = o->params[lo]->numel;
        while (lo > 0 && size + o->params[lo - 1]->numel <= cap) size += o->params[--lo]->numel;
        d.lo[d.nb] = lo, d.hi[d.nb] = hi;
        for (int i = lo; i < hi; i++) d.bucket_of[i] = d.nb;
        hi = lo;
    }
    int64_t np = o->n;
    if (mp_dist_agree(MP_DK_ATTACH, d.nb, o->values->dtype, o->values->dev, 1, &np) ||
        mp_dist_broadcast(o->values, 0)) {   /* every rank starts from rank 0's parameters */
        dp_free(&d);
        return -1;
    }
    o->on_free = mp_dist_detach;   /* freeing the optimizer detaches it first */
    mp_backward_listen(&listener);
    data_parallel.v[data_parallel.n++] = d;
    return 0;
}

void mp_dist_detach(mp_optim *o)
{
    for (int i = 0; i < data_parallel.n; i++)
        if (data_parallel.v[i].o == o) {
            dp_free(&data_parallel.v[i]);
            data_parallel.v[i] = data_parallel.v[--data_parallel.n];
            break;
        }
    if (o->on_free == mp_dist_detach) o->on_free = NULL;
}

static int reduce(dp_opt *d, int k, bool side)
{
    mp_optim *o = d->o;
    int64_t lo = o->offsets[d->lo[k]], hi = d->hi[k] < o->n ? o->offsets[d->hi[k]] : o->numel;
    return mp_dist_reduce_bucket(o->grads->dev, (float *)mp_data(o->grads) + lo, hi - lo, side);
}

int mp_dist_reduce_grads(mp_optim *o)
{
    if (!mp_dist_spans(o->grads->dev)) return 0;
    if (mp_optim_sync_grads(o)) return -1;
    for (int i = 0; i < data_parallel.n; i++)
        if (data_parallel.v[i].o == o) {
            for (int k = 0; k < data_parallel.v[i].nb; k++)
                if (reduce(&data_parallel.v[i], k, false)) return -1;
            return 0;
        }
    return mp_fail(MP_EINVAL, "the optimizer is not data parallel");
}

/* the attached optimizer whose parameter leaf is, and its index, or NULL */
static dp_opt *owner(const mp_tensor *leaf, int *idx)
{
    for (int j = 0; j < data_parallel.n; j++) {
        mp_optim *o = data_parallel.v[j].o;
        if (leaf->st != o->values->st) continue;
        int lo = 0, hi = o->n - 1;   /* offsets ascend with the parameters */
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            if (o->offsets[mid] < leaf->offset) lo = mid + 1;
            else if (o->offsets[mid] > leaf->offset) hi = mid - 1;
            else {
                if (o->params[mid] != leaf) return NULL;
                *idx = mid;
                return &data_parallel.v[j];
            }
        }
    }
    return NULL;
}

/* every bucket that is ready, in order */
static int reduce_ready(dp_opt *d)
{
    while (d->next < d->nb && d->left[d->next] == 0)
        if (reduce(d, d->next++, true)) return -1;
    return 0;
}

/* ---- the backward listener: buckets reduced as backward finishes them ---- */

/* with the nodes backward will run in order: which gradients each node finishes */
static void backward_begin(mp_node *const *order, size_t n)
{
    if (data_parallel.n == 0) return;   /* no data-parallel optimizer: nothing to follow */
    for (int j = 0; j < data_parallel.n; j++) {
        dp_opt *d = &data_parallel.v[j];
        mp_optim *o = d->o;
        d->following = false;
        if (data_parallel.no_sync > 0 || !mp_dist_spans(o->grads->dev)) continue;
        /* a .grad that is not the arena's view (replaced, or set to nil) takes
         * the end's whole-arena path, which brings it back into the arena */
        bool views = true;
        for (int i = 0; i < o->n && views; i++) {
            mp_tensor *g = o->params[i]->grad;
            views = g && g->st == o->grads->st && g->offset == o->offsets[i];
        }
        if (!views) continue;
        memset(d->pending, 0, sizeof(int) * (size_t)o->n);
        d->next = 0;
        d->following = true;
    }
    for (size_t k = 0; k < n; k++) {
        const mp_node *x = order[k];
        for (int i = 0; i < x->nin; i++) {
            int idx;
            dp_opt *d = x->in[i].leaf ? owner(x->in[i].leaf, &idx) : NULL;
            if (d && d->following) d->pending[idx]++;
        }
    }
    for (int j = 0; j < data_parallel.n; j++) {
        dp_opt *d = &data_parallel.v[j];
        if (!d->following) continue;
        for (int k = 0; k < d->nb; k++) {   /* a bucket the graph does not reach is ready in its turn */
            d->left[k] = 0;
            for (int i = d->lo[k]; i < d->hi[k]; i++) d->left[k] += d->pending[i] > 0;
        }
    }
}

/* after each node's turn (run or not: it adds nothing after) */
static int backward_node_done(const mp_node *x)
{
    if (data_parallel.n == 0) return 0;
    for (int i = 0; i < x->nin; i++) {
        int idx;
        dp_opt *d = x->in[i].leaf ? owner(x->in[i].leaf, &idx) : NULL;
        if (!d || !d->following || d->pending[idx] == 0) continue;
        if (--d->pending[idx] == 0 && --d->left[d->bucket_of[idx]] == 0 && reduce_ready(d)) return -1;
    }
    return 0;
}

/* at the end: what is left reduced, the second stream waited for (the average
 * is done when backward returns), as PyTorch's DDP leaves the gradients */
static int backward_end(int rc)
{
    if (rc) return rc;
    for (int j = 0; j < data_parallel.n && !rc; j++) {
        dp_opt *d = &data_parallel.v[j];
        mp_optim *o = d->o;
        if (data_parallel.no_sync > 0 || !mp_dist_spans(o->grads->dev)) continue;
        if (!d->following) {
            rc = mp_dist_reduce_grads(o);
        } else {   /* what the graph did not reach, in order */
            while (!rc && d->next < d->nb) rc = reduce(d, d->next++, true);
        }
        d->following = false;
        mp_dist_reduce_done(o->grads->dev);
    }
    return rc;
}

static mp_backward_listener listener = {.begin = backward_begin, .node_done = backward_node_done,
                                        .end = backward_end};

void mp_dist_no_sync(int delta)
{
    data_parallel.no_sync += delta;
    if (data_parallel.no_sync < 0) data_parallel.no_sync = 0;
}
