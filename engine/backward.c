/*
 * backward.c: the backward walk over the graph (engine/backward.h).
 */
#include <stdlib.h>
#include <string.h>
#include "engine/backward.h"
#include "engine/state.h"
#include "engine/flush_count.h"
#include "engine/ops.h"
#include "engine/error.h"

static mp_backward_listener *listeners;

void mp_backward_listen(mp_backward_listener *l)
{
    mp_backward_listener **p = &listeners;
    for (; *p; p = &(*p)->next)
        if (*p == l) return;
    l->next = NULL;
    *p = l;   /* at the end: called in the order of registration */
}

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
    uint64_t visit = mp_state_get()->next_visit++;
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

/* x's backward, its flushes counted under its name when flush counting is on */
static int backward_counted(mp_node *x, mp_tensor **gin)
{
    bool counting;
    if (mp_flush_count_begin(x->grad->dev, x->name, &counting)) return -1;
    int rc = x->backward(x, x->grad, gin);
    if (counting) mp_flush_count_end(x->grad->dev);
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
    if (rc == 0)
        for (mp_backward_listener *l = listeners; l; l = l->next)
            if (l->gradients) l->gradients(x, gin);
    mp_release(x->grad);
    x->grad = NULL;
    mp_node_release_saved(x);
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

/* the nodes from t's, with t's gradient g (taken) */
static int walk(mp_tensor *t, mp_tensor *g)
{
    size_t n = 0;
    int rc = 0;
    mp_node **order = collect(t->grad_fn, &n);
    if (!order) rc = -1;
    else
        for (mp_backward_listener *l = listeners; l; l = l->next)
            if (l->begin) l->begin(order, n);
    mp_tensor *prev = t->grad_fn->grad;
    t->grad_fn->grad = g;
    mp_release(prev);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (order[i]->grad) rc = run_node(order[i]);
        for (mp_backward_listener *l = listeners; l && rc == 0; l = l->next)
            if (l->node_done) rc = l->node_done(order[i]);
    }
    for (size_t i = 0; i < n; i++) {   /* after a failure, drop partial sums */
        mp_release(order[i]->grad);
        order[i]->grad = NULL;
    }
    free(order);
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
    mp_state *s = mp_state_get();
    bool was = s->grad_enabled, was_in = s->in_backward;
    s->grad_enabled = false;
    s->in_backward = true;   /* backward ops run in their own dtypes, unobserved */
    int rc;
    if (!t->grad_fn) {
        rc = accumulate_leaf(t, g);
        mp_release(g);
    } else {
        rc = walk(t, g);
    }
    s->in_backward = was_in;
    s->grad_enabled = was;
    if (rc == 0 && t->dev != MP_CPU) rc = mp_device_error(t->dev);   /* mp_checked */
    for (mp_backward_listener *l = listeners; l; l = l->next)
        if (l->end) rc = l->end(rc);
    return rc;
}
