/*
 * autograd.c: recording nodes and walking them backwards.
 */
#include <stdlib.h>
#include <string.h>
#include "engine/dist.h"
#include "engine/autograd.h"
#include "engine/observe.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/autocast.h"
#include "engine/op.h"

static bool grad_on = true;
static uint64_t next_seq = 1, next_visit = 1;

bool mp_grad_enabled(void) { return grad_on; }

bool mp_set_grad_enabled(bool on)
{
    bool was = grad_on;
    grad_on = on;
    return was;
}

bool mp_needs_grad(int n, mp_tensor *const *ins)
{
    if (!grad_on) return false;
    for (int i = 0; i < n; i++)
        if (ins[i] && ins[i]->requires_grad) return true;
    return false;
}

int mp_record(mp_tensor *out, const mp_op *op, int nin, mp_tensor *const *ins, mp_node **node)
{
    *node = NULL;
    if (!op->backward || !mp_needs_grad(nin, ins) || !mp_is_float(out->dtype)) return 0;   /* integers cut the graph */
    mp_node *n = calloc(1, sizeof *n + (size_t)nin * sizeof(mp_edge));
    if (!n) return mp_fail(MP_EOOM, "out of memory recording %s", op->name);
    n->refs = 1;
    n->op = op;
    n->name = op->name;
    n->seq = next_seq++;
    n->nin = nin;
    for (int i = 0; i < nin; i++) {
        mp_tensor *t = ins[i];
        mp_edge *e = &n->in[i];
        if (!t) continue;
        e->dtype = t->dtype, e->dev = t->dev, e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof e->shape);
        if (!t->requires_grad) continue;
        if (t->grad_fn) (e->node = t->grad_fn)->refs++;
        else e->leaf = mp_retain(t);
    }
    out->requires_grad = true;
    out->grad_fn = n;
    *node = n;
    return 0;
}

mp_tensor *mp_detached(mp_tensor *t)
{
    return mp_view(t, t->ndim, t->shape, t->offset);
}

int mp_save(mp_node *n, int slot, mp_tensor *t)
{
    if (slot >= n->nsaved) {
        mp_tensor **s = realloc(n->saved, sizeof *s * (size_t)(slot + 1));
        if (!s) return mp_fail(MP_EOOM, "out of memory recording %s", n->name);
        for (int i = n->nsaved; i <= slot; i++) s[i] = NULL;
        n->saved = s, n->nsaved = slot + 1;
    }
    mp_release(n->saved[slot]);
    n->saved[slot] = t ? mp_retain(t) : NULL;
    return 0;
}

/* a node that saved nothing can be walked again (a cached autocast cast, reused
 * by the next step's graph); one whose saved tensors are gone cannot */
static void release_saved(mp_node *n)
{
    for (int i = 0; i < n->nsaved; i++) {
        if (!n->saved[i]) continue;
        mp_release(n->saved[i]);
        n->saved[i] = NULL;
        n->released = true;
    }
}

/* Free a node whose last reference went away, and every node that this frees
 * in turn, with an explicit stack: a chain of a million nodes (a long RNN, a
 * training loop that never drops its graph) must not recurse a million deep. */
void mp_node_release(mp_node *n)
{
    if (!n || --n->refs > 0) return;
    size_t cap = 0, top = 0;
    mp_node **stack = NULL;
    for (;;) {
        release_saved(n);
        mp_release(n->grad);
        for (int i = 0; i < n->nin; i++) {
            mp_release(n->in[i].leaf);
            mp_node *next = n->in[i].node;
            if (!next || --next->refs > 0) continue;
            if (top == cap) {
                mp_node **s = realloc(stack, (cap = cap ? 2 * cap : 16) * sizeof *s);
                if (!s) { next->refs = 1; mp_node_release(next); cap /= 2; continue; }
                stack = s;
            }
            stack[top++] = next;
        }
        free(n->saved);
        free(n->args);
        free(n);
        if (!top) break;
        n = stack[--top];
    }
    free(stack);
}

int mp_set_requires_grad(mp_tensor *t, bool on)
{
    if (on && !mp_is_float(t->dtype))
        return mp_fail(MP_EINVAL, "only float tensors can require grad (got %s)", mp_dtype_name(t->dtype));
    if (t->grad_fn)
        return mp_fail(MP_EINVAL, "requires_grad can only be set on a leaf tensor (this one was computed by %s; "
                                  "use detach())", t->grad_fn->name);
    t->requires_grad = on;
    return 0;
}

int mp_set_grad(mp_tensor *t, mp_tensor *g, mp_tensor **old)
{
    *old = NULL;
    if (g && (!mp_same_shape(g, t) || g->dev != t->dev || g->dtype != t->dtype))
        return mp_fail(MP_EINVAL, "must be nil or a tensor of the tensor's shape, dtype (%s) and device (%s)",
                       mp_dtype_name(t->dtype), mp_device_name(t->dev));
    if (g && (g == t || g->grad || g->requires_grad))
        return mp_fail(MP_EINVAL, "must be a plain tensor (not the tensor itself, not one that requires grad "
                                  "or has a .grad; use :detach():clone())");
    *old = t->grad;
    t->grad = g ? mp_retain(g) : NULL;
    return 0;
}

/* ---- helpers for backward functions ---- */

mp_tensor *mp_sum_to(mp_tensor *g, int ndim, const int64_t *shape)
{
    mp_tensor *cur = mp_retain(g);
    int lead = g->ndim - ndim;
    for (int d = 0; d < g->ndim && cur; d++) {
        bool extra = d < lead, bcast = !extra && shape[d - lead] == 1 && g->shape[d] != 1;
        if (!extra && !bcast) continue;
        mp_tensor *r = mp_reduce(MP_SUM, cur, d + 1, 1);
        mp_release(cur);
        cur = r;
    }
    if (!cur) return NULL;
    mp_tensor *r = mp_reshape(cur, ndim, shape);
    mp_release(cur);
    return r;
}

mp_tensor *mp_expand(mp_tensor *g, int ndim, const int64_t *shape)
{
    mp_tensor *z = mp_full(g->dtype, g->dev, ndim, shape, 0);
    if (!z) return NULL;
    mp_tensor *r = mp_binary(MP_ADD, z, g);
    mp_release(z);
    return r;
}

/* ---- the backward walk ---- */

/* add g into *acc, out of place (g may alias gradients held elsewhere) */
static int accumulate(mp_tensor **acc, mp_tensor *g)
{
    if (!*acc) { *acc = mp_retain(g); return 0; }
    mp_tensor *s = mp_binary(MP_ADD, *acc, g);
    if (!s) return -1;
    mp_release(*acc);
    *acc = s;
    return 0;
}

/* into leaf->grad in the leaf's dtype, in place when it exists (it may be a
 * view into an optimizer's gradient arena, which must stay a view) */
static int accumulate_leaf(mp_tensor *leaf, mp_tensor *g)
{
    if (!leaf->grad) {   /* a copy: g may alias a gradient that is still in use */
        leaf->grad = g->dtype == leaf->dtype && g->dev == leaf->dev ? mp_clone(g)
                                                                    : mp_to_raw(g, leaf->dtype, leaf->dev);
        return leaf->grad ? 0 : -1;
    }
    if (!mp_same_shape(leaf->grad, g))
        return mp_fail(MP_EINVAL, "gradient shape does not match the leaf's .grad");
    mp_tensor *c = mp_to_raw(g, leaf->grad->dtype, leaf->grad->dev);
    if (!c) return -1;
    mp_bcast bc;
    mp_broadcast(leaf->grad, c, &bc);
    MP_K(c, binary, MP_ADD, c->dtype, mp_data(leaf->grad), mp_data(leaf->grad), mp_data(c), &bc);
    mp_release(c);
    return 0;
}

static int by_seq_desc(const void *a, const void *b)
{
    uint64_t x = (*(mp_node *const *)a)->seq, y = (*(mp_node *const *)b)->seq;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* every node reachable from root, in reverse creation order */
static mp_node **collect(mp_node *root, size_t *count)
{
    size_t cap = 64, n = 0, top = 0;
    mp_node **all = malloc(cap * sizeof *all), **stack = malloc(cap * sizeof *stack);
    uint64_t visit = next_visit++;
    if (!all || !stack) goto oom;
    stack[top++] = root;
    root->visit = visit;
    while (top) {
        mp_node *x = stack[--top];
        if (n == cap || top + (size_t)x->nin >= cap) {
            while (top + (size_t)x->nin >= cap) cap *= 2;
            if (n == cap) cap *= 2;
            mp_node **a = realloc(all, cap * sizeof *all), **s = a ? realloc(stack, cap * sizeof *stack) : NULL;
            if (a) all = a;
            if (!s) goto oom;
            stack = s;
        }
        all[n++] = x;
        for (int i = 0; i < x->nin; i++) {
            mp_node *y = x->in[i].node;
            if (y && y->visit != visit) y->visit = visit, stack[top++] = y;
        }
    }
    free(stack);
    qsort(all, n, sizeof *all, by_seq_desc);
    *count = n;
    return all;
oom:
    free(all);
    free(stack);
    mp_fail(MP_EOOM, "out of memory walking the graph");
    return NULL;
}

/* Flush counting: each backward op's name has a slot (MP_FLUSH_SLOTS of them);
 * while a node's backward runs, its device's backend counts into the slot of
 * its name, in the backend's own memory (device memory on a GPU), and the
 * counts come to the host only when asked for (flush_collect): a counted
 * backward waits for nothing. Ops past the last slot are not counted. */
static bool count_flush;
static struct { const char *name; int64_t c[3]; } flush[MP_FLUSH_SLOTS];
static int nflush;
static unsigned flush_devices;   /* bit d: device d counted since its slots were last read */

void mp_autograd_count_flush(bool on) { count_flush = on; }

/* the devices' slots added into flush[] (one read each), which they then zero */
static void flush_collect(void)
{
    static int64_t c[MP_FLUSH_SLOTS][3];
    for (int d = 0; d < MP_NDEVICES; d++) {
        if (!(flush_devices >> d & 1u)) continue;
        const mp_backend *be = mp_backend_of((mp_device)d);
        be->flush_read(be->ctx, c, 1);
        for (int i = 0; i < nflush; i++)
            for (int k = 0; k < 3; k++) flush[i].c[k] += c[i][k];
    }
    flush_devices = 0;
}

/* forgets the names and the counts; the devices' slots are zeroed without a read */
void mp_autograd_flush_reset(void)
{
    for (int d = 0; d < MP_NDEVICES; d++) {
        if (!(flush_devices >> d & 1u)) continue;
        const mp_backend *be = mp_backend_of((mp_device)d);
        be->flush_read(be->ctx, NULL, 1);
    }
    flush_devices = 0;
    nflush = 0;
}

const char *mp_autograd_flush_entry(int i, int64_t counts[3])
{
    if (i == 0) flush_collect();
    if (i < 0 || i >= nflush) return NULL;
    memcpy(counts, flush[i].c, sizeof flush[i].c);
    return flush[i].name;
}

/* the slot of an op's name, made when new; -1 when every slot is taken */
static int flush_slot_of(const char *name)
{
    int i = 0;
    while (i < nflush && strcmp(flush[i].name, name) != 0) i++;
    if (i == MP_FLUSH_SLOTS) return -1;
    if (i == nflush) {
        flush[nflush].name = name;
        memset(flush[nflush++].c, 0, sizeof flush[0].c);
    }
    return i;
}

static int backward_counted(mp_node *x, mp_tensor **gin)
{
    const mp_backend *be = mp_backend_of(x->grad->dev);
    int slot = count_flush && be->flush_slot ? flush_slot_of(x->name) : -1;
    if (slot < 0) return x->op->backward(x, x->grad, gin);
    flush_devices |= 1u << x->grad->dev;
    be->flush_slot(be->ctx, slot);
    int rc = x->op->backward(x, x->grad, gin);
    be->flush_slot(be->ctx, -1);
    return rc;
}

static int run_node(mp_node *x)
{
    if (x->released)
        return mp_fail(MP_EINVAL, "backward through %s a second time: its saved tensors were freed "
                                  "by the first backward", x->name);
    mp_tensor *small[8] = {0}, **gin = x->nin <= 8 ? small : calloc((size_t)x->nin, sizeof *gin);
    if (!gin) return mp_fail(MP_EOOM, "out of memory in the backward of %s", x->name);
    int rc = backward_counted(x, gin);
    if (rc == 0 && mp_observing())
        for (int i = 0; i < x->nin; i++) mp_observe(x->name, true, i, gin[i]);
    mp_release(x->grad);
    x->grad = NULL;
    release_saved(x);
    for (int i = 0; i < x->nin && rc == 0; i++) {
        if (!gin[i]) continue;
        mp_edge *e = &x->in[i];
        if (gin[i]->dtype != e->dtype || gin[i]->dev != e->dev) {   /* each input gets its own dtype back */
            mp_tensor *c = mp_to_raw(gin[i], e->dtype, e->dev);
            mp_release(gin[i]);
            if (!(gin[i] = c)) { rc = -1; break; }
        }
        if (e->node) rc = accumulate(&e->node->grad, gin[i]);
        else if (e->leaf) rc = accumulate_leaf(e->leaf, gin[i]);
    }
    for (int i = 0; i < x->nin; i++) mp_release(gin[i]);
    if (gin != small) free(gin);
    return rc;
}

int mp_backward(mp_tensor *t, mp_tensor *grad)
{
    if (!t->requires_grad)
        return mp_fail(MP_EINVAL, "tensor does not require grad and has no grad_fn");
    mp_tensor *g;
    if (grad) {
        if (!mp_same_shape(grad, t)) {
            char b1[128], b2[128];
            return mp_fail(MP_EINVAL, "grad shape %s does not match the tensor's %s",
                           mp_shape_str(grad->ndim, grad->shape, b1, sizeof b1),
                           mp_shape_str(t->ndim, t->shape, b2, sizeof b2));
        }
        g = mp_to_raw(grad, t->dtype, t->dev);
    } else {
        if (t->numel != 1)
            return mp_fail(MP_EINVAL, "backward() without a gradient needs a tensor with one element "
                                      "(this one has %lld); pass a gradient", (long long)t->numel);
        g = mp_full(t->dtype, t->dev, t->ndim, t->shape, 1);
    }
    if (!g) return -1;
    bool was = mp_set_grad_enabled(false);
    int ac = mp_autocast_enter(false, MP_F32);   /* backward ops run in their own dtypes */
    if (ac < 0) {
        mp_release(g);
        mp_set_grad_enabled(was);
        return -1;
    }
    int rc = 0;
    if (!t->grad_fn) {
        rc = accumulate_leaf(t, g);
        mp_release(g);
    } else {
        size_t n = 0;
        mp_node **order = collect(t->grad_fn, &n);
        if (!order) rc = -1;
        else mp_dist_backward_begin(order, n);   /* data parallel: which gradients each node finishes */
        mp_tensor *prev = t->grad_fn->grad;
        t->grad_fn->grad = g;
        mp_release(prev);
        bool obs = mp_observe_in_backward(true);
        for (size_t i = 0; i < n && rc == 0; i++) {
            if (order[i]->grad) rc = run_node(order[i]);
            if (rc == 0) rc = mp_dist_backward_node(order[i]);   /* buckets reduced as they are done */
        }
        mp_observe_in_backward(obs);
        for (size_t i = 0; i < n; i++) {   /* after a failure, drop partial sums */
            mp_release(order[i]->grad);
            order[i]->grad = NULL;
        }
        free(order);
    }
    mp_autocast_exit(ac);
    mp_set_grad_enabled(was);
    if (rc == 0 && t->dev != MP_CPU) rc = mp_device_error(t->dev);   /* mp_checked */
    /* data parallel: the gradients averaged over the ranks, as PyTorch's DDP leaves them
     * (the rest of the buckets, and the device's second stream waited for) */
    if (rc == 0) rc = mp_dist_after_backward();
    return rc;
}
