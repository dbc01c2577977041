/*
 * backward.c: the backward walk over the graph (engine/backward.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/backward.h"
#include "engine/op.h"
#include "engine/intern.h"
#include "engine/state.h"
#include "engine/flush_count.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/grad_hooks.h"
#include "engine/anomaly.h"

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
    leaf->grad->st->version++;   /* an in-place write, as any other */
    mp_release(c);
    return 0;
}

static int by_seq_desc(const void *a, const void *b)
{
    uint64_t x = (*(mp_node *const *)a)->seq, y = (*(mp_node *const *)b)->seq;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* every node reachable from the roots, in reverse creation order */
static mp_node **collect(mp_node *const *roots, int nroots, size_t *count)
{
    size_t cap = 64 + (size_t)nroots, n = 0, top = 0;
    mp_node **all = malloc(cap * sizeof *all), **stack = malloc(cap * sizeof *stack);
    uint64_t visit = mp_state_get()->next_visit++;
    if (!all || !stack) goto oom;
    for (int r = 0; r < nroots; r++)
        if (roots[r]->visit != visit) roots[r]->visit = visit, stack[top++] = roots[r];
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

/* a leaf with hooks, in a walk that fills .grad: its hooks run once, on the
 * sum of what its edges bring, when the last node with an edge to it is done */
typedef struct {
    mp_tensor *leaf;
    int left;                      /* edges to it in nodes whose turn has not come */
    mp_tensor *sum;
} leaf_wait;

/* What one walk does beyond the plain backward: keep the graph, build a new
 * one, or hand the gradients of chosen inputs back instead of filling .grad */
typedef struct {
    bool retain, create;
    int nin;                       /* mp_autograd_grad: its inputs, and where their gradients go */
    mp_tensor *const *ins;
    mp_tensor **res;
    void *caller;                  /* for the gradient hooks (mp_backward_opts.caller) */
    int nwait;                     /* the leaves with hooks (mp_backward_ex) */
    leaf_wait *wait;
} walk_ctx;

enum { WALK_RUN = 1, WALK_USED = 2 };   /* mp_node.walk's bits during mp_autograd_grad */

static int input_index(const walk_ctx *w, const mp_tensor *t, int from)
{
    for (int j = from; j < w->nin; j++)
        if (w->ins[j] == t) return j;
    return -1;
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

/* the backward of a gradient whose op has no second derivative */
static int no_second_derivative(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    (void)g, (void)gin;
    const char *name = n->name;    /* "<op>_backward" */
    return mp_fail(MP_EINVAL, "%.*s has no second derivative: its backward is not built from differentiable "
                              "ops (asked by a backward through a gradient made with create_graph)",
                   (int)(strlen(name) - strlen("_backward")), name);
}

/* create_graph and an op whose backward recorded nothing differentiable: *g
 * becomes a header whose node, on x's inputs and x's gradient, raises when a
 * backward reaches it (and only then) */
static int mark_not_twice(mp_node *x, mp_tensor **g)
{
    mp_tensor *gout = x->grad, *d = mp_detached(*g);
    mp_edge small[9], *e = x->nin < 9 ? small : malloc(sizeof *e * (size_t)(x->nin + 1));
    char buf[256];
    snprintf(buf, sizeof buf, "%s_backward", x->name);
    const char *name = d && e ? mp_intern(buf) : NULL;   /* read after the node is gone (engine/intern.h) */
    if (!name) {
        mp_release(d);
        if (e != small) free(e);
        return mp_fail(MP_EOOM, "out of memory in the backward of %s", x->name);
    }
    memcpy(e, x->in, sizeof *e * (size_t)x->nin);
    mp_edge *ge = &e[x->nin];
    memset(ge, 0, sizeof *ge);
    ge->dtype = gout->dtype, ge->dev = gout->dev, ge->ndim = gout->ndim;
    memcpy(ge->shape, gout->shape, sizeof ge->shape);
    if (gout->requires_grad) {
        if (gout->grad_fn) ge->node = gout->grad_fn;
        else ge->leaf = gout;
    }
    mp_node *n = mp_graph_record_edges(d, name, no_second_derivative, x->nin + 1, e);
    if (e != small) free(e);
    if (!n) {
        mp_release(d);
        return -1;
    }
    mp_release(*g);
    *g = d;
    return 0;
}

/* create_graph: x's saved outputs attached to x for its backward (att[k],
 * swapped into x->saved and back by the caller) */
static int attach_outputs(mp_node *x, mp_tensor **att)
{
    for (int k = 0; k < x->nsaved && k < 64; k++) {
        att[k] = NULL;
        if (!(x->saved_outputs >> k & 1) || !x->saved[k]) continue;
        if (!(att[k] = mp_detached(x->saved[k]))) return -1;
        att[k]->requires_grad = true;
        att[k]->grad_fn = x;
        x->refs++;
        mp_tensor *t = x->saved[k];
        x->saved[k] = att[k];
        att[k] = t;                /* att now holds the detached original, to put back */
    }
    return 0;
}

static void detach_outputs(mp_node *x, mp_tensor **att)
{
    for (int k = 0; k < x->nsaved && k < 64; k++) {
        if (!att[k]) continue;
        mp_tensor *t = x->saved[k];
        x->saved[k] = att[k];
        mp_release(t);             /* drops its reference to x */
    }
}

static int call_backward(const walk_ctx *w, mp_node *x, mp_tensor **gin)
{
    if (!w->create) return backward_counted(x, gin);
    mp_tensor *att[64] = {0};
    bool twice = x->op && x->op->double_backward;
    int rc = twice && x->saved_outputs ? attach_outputs(x, att) : 0;
    if (rc == 0) rc = backward_counted(x, gin);
    if (twice && x->saved_outputs) detach_outputs(x, att);
    for (int i = 0; i < x->nin && rc == 0 && !twice; i++)
        if (gin[i]) rc = mark_not_twice(x, &gin[i]);
    return rc;
}

static leaf_wait *wait_of(const walk_ctx *w, const mp_tensor *leaf)
{
    for (int k = 0; k < w->nwait; k++)
        if (w->wait[k].leaf == leaf) return &w->wait[k];
    return NULL;
}

/* the leaves of order's edges that have hooks, into w->wait (none: no allocation) */
static int wait_for_hooked_leaves(walk_ctx *w, mp_node *const *order, size_t n)
{
    int cap = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < order[i]->nin; k++) {
            mp_tensor *leaf = order[i]->in[k].leaf;
            if (!leaf || !leaf->hooks) continue;
            leaf_wait *lw = wait_of(w, leaf);
            if (!lw) {
                if (w->nwait == cap) {
                    leaf_wait *v = realloc(w->wait, sizeof *v * (size_t)(cap = cap ? 2 * cap : 4));
                    if (!v) return mp_fail(MP_EOOM, "out of memory starting a backward");
                    w->wait = v;
                }
                lw = &w->wait[w->nwait++];
                *lw = (leaf_wait){leaf, 0, NULL};
            }
            lw->left++;
        }
    return 0;
}

/* x's turn is over: a hooked leaf that x was the last to feed gets its hooks
 * run on its sum, which then goes into its .grad */
static int leaves_done(const walk_ctx *w, const mp_node *x)
{
    int rc = 0;
    for (int k = 0; k < x->nin; k++) {
        leaf_wait *lw = x->in[k].leaf ? wait_of(w, x->in[k].leaf) : NULL;
        if (!lw || --lw->left > 0 || !lw->sum) continue;
        if (rc == 0) rc = mp_grad_hooks_run(mp_grad_hooks_of(lw->leaf), w->caller, &lw->sum);
        if (rc == 0) rc = accumulate_leaf(lw->leaf, lw->sum);
        mp_release(lw->sum);
        lw->sum = NULL;
    }
    return rc;
}

/* the gradient g for edge e (taken): a leaf's .grad (or its sum, when it has
 * hooks), a node's sum, or an input's result in mp_autograd_grad */
static int route(const walk_ctx *w, mp_edge *e, mp_tensor *g)
{
    if (e->node) return accumulate(&e->node->grad, g);
    if (!e->leaf) return 0;
    if (!w->ins) {
        leaf_wait *lw = w->nwait ? wait_of(w, e->leaf) : NULL;
        return lw ? accumulate(&lw->sum, g) : accumulate_leaf(e->leaf, g);
    }
    int rc = 0;
    for (int j = input_index(w, e->leaf, 0); j >= 0 && rc == 0; j = input_index(w, e->leaf, j + 1))
        rc = accumulate(&w->res[j], g);
    return rc;
}

/* x a cast of an f32 leaf (autocast's weights): its gradient widened into the
 * leaf's .grad in one pass (mp_cast_backward_into), when nothing else is to
 * see the widened gradient as a tensor: a plain walk (neither create_graph
 * nor mp_autograd_grad), no hooks on the leaf, no anomaly check, no listener
 * reading gradients. 1: take the usual way; 0 done */
static int cast_into_leaf(const walk_ctx *w, mp_node *x)
{
    mp_tensor *leaf = x->nin == 1 ? x->in[0].leaf : NULL;
    if (!leaf || leaf->hooks || w->ins || w->create || w->nwait || mp_state_get()->anomaly.on) return 1;
    for (mp_backward_listener *l = listeners; l; l = l->next)
        if (l->gradients) return 1;
    return mp_cast_backward_into(x, leaf);
}

/* x a narrow (chunk, split) whose input is a node that already holds a sum
 * of gradients the walk made (no other reference to it or its storage): x's
 * gradient added into that sum in place (mp_narrow_backward_into) instead of
 * padded to the input's shape and added out of place, when nothing else is
 * to see the padded gradient: a plain walk, no anomaly check, no listener
 * reading gradients. The sum is the node's own until its turn (hooks and
 * retain_grad see it there, as before). 1: take the usual way; 0 done */
static int narrow_into_node(const walk_ctx *w, mp_node *x)
{
    mp_node *t = x->nin == 1 ? x->in[0].node : NULL;
    mp_tensor *acc = t ? t->grad : NULL;
    if (!acc || acc->refs != 1 || acc->st->refs != 1 || acc->offset != 0 || w->ins || w->create ||
        mp_state_get()->anomaly.on)
        return 1;
    for (mp_backward_listener *l = listeners; l; l = l->next)
        if (l->gradients) return 1;
    return mp_narrow_backward_into(x, acc);
}

static int run_node(const walk_ctx *w, mp_node *x)
{
    if (x->released)
        return mp_fail(MP_EINVAL, "backward through %s a second time: its saved tensors were freed "
                                  "by the first backward (pass retain_graph = true to the first)", x->name);
    if (mp_node_check_saved(x)) return -1;   /* written in place since the forward kept it */
    if (cast_into_leaf(w, x) == 0 || narrow_into_node(w, x) == 0) {
        mp_release(x->grad);
        x->grad = NULL;
        if (!w->retain) mp_node_release_saved(x);
        return 0;
    }
    mp_tensor *small[8] = {0}, **gin = x->nin <= 8 ? small : calloc((size_t)x->nin, sizeof *gin);
    if (!gin) return mp_fail(MP_EOOM, "out of memory in the backward of %s", x->name);
    int rc = call_backward(w, x, gin);
    if (rc == 0 && mp_state_get()->anomaly.on) rc = mp_anomaly_check(x, x->grad, gin);
    if (rc == 0 && !w->ins)
        for (mp_backward_listener *l = listeners; l; l = l->next)
            if (l->gradients) l->gradients(x, gin);
    mp_release(x->grad);
    x->grad = NULL;
    if (!w->retain) mp_node_release_saved(x);
    for (int i = 0; i < x->nin && rc == 0; i++) {
        if (!gin[i]) continue;
        mp_edge *e = &x->in[i];
        if (gin[i]->dtype != e->dtype || gin[i]->dev != e->dev) {   /* each input gets its own dtype back */
            mp_tensor *c = w->create ? mp_to(gin[i], e->dtype, e->dev) : mp_to_raw(gin[i], e->dtype, e->dev);
            mp_release(gin[i]);
            if (!(gin[i] = c)) { rc = -1; break; }
        }
        rc = route(w, e, gin[i]);
    }
    for (int i = 0; i < x->nin; i++) mp_release(gin[i]);
    if (gin != small) free(gin);
    return rc;
}

/* mp_autograd_grad: which nodes lead to an input (run them) and which inputs
 * the graph holds; order is in decreasing sequence, edges point to earlier
 * nodes, so one pass from the end sees a node's inputs before the node */
static void mark_paths(const walk_ctx *w, mp_node **order, size_t n, bool *used)
{
    for (size_t i = n; i-- > 0;) {
        mp_node *x = order[i];
        x->walk = 0;
        for (int k = 0; k < x->nin; k++) {
            mp_edge *e = &x->in[k];
            if (e->leaf)
                for (int j = input_index(w, e->leaf, 0); j >= 0; j = input_index(w, e->leaf, j + 1))
                    used[j] = true, x->walk |= WALK_RUN;
            if (e->node && (e->node->walk & (WALK_RUN | WALK_USED))) x->walk |= WALK_RUN;
        }
        for (int j = 0; j < w->nin; j++)
            if (w->ins[j]->grad_fn == x) used[j] = true, x->walk |= WALK_USED;
    }
}

/* the plain walk running on this thread, for mp_backward_sink; each of its
 * nodes' walk byte counts the edges to it from the walk's nodes (up to 2) */
static _Thread_local const walk_ctx *sink_walk;

mp_tensor *mp_backward_sink(mp_node *x, int i)
{
    mp_node *y = x->in[i].node;
    if (!sink_walk || !y || y->walk != 1 || y->grad || y->hooks || y->nin != 1 || !y->in[0].leaf ||
        y->in[0].leaf->hooks || (x->in[i].dtype != MP_F16 && x->in[i].dtype != MP_BF16) || mp_state_get()->anomaly.on)
        return NULL;
    for (mp_backward_listener *l = listeners; l; l = l->next)
        if (l->gradients) return NULL;
    return mp_cast_grad_target(y, y->in[0].leaf);
}

static int by_address(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(mp_tensor *const *)a, y = (uintptr_t)*(mp_tensor *const *)b;
    return x < y ? -1 : x > y;
}

/* the leaf edges of order[0..n) sorted by leaf, into *out; their number, or
 * -1 out of memory */
static long leaf_edges(mp_node *const *order, size_t n, mp_tensor ***out)
{
    size_t count = 0, j = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < order[i]->nin; k++) count += order[i]->in[k].leaf != NULL;
    mp_tensor **a = malloc((count ? count : 1) * sizeof *a);
    if (!a) return -1;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < order[i]->nin; k++)
            if (order[i]->in[k].leaf) a[j++] = order[i]->in[k].leaf;
    qsort(a, count, sizeof *a, by_address);
    *out = a;
    return (long)count;
}

/* for mp_backward_sink: each node's walk byte set to the number of edges to it
 * from the walk's nodes (up to 2), and a cast of a leaf whose leaf other edges
 * feed too (another cast of it, or an op on it) to 2 as well. The sum of
 * several gradients into a .grad depends on their order; a cast's only
 * consumer is recorded right after it (autocast casts inside the consumer's
 * apply), so its turn is next to the cast's and the order would stay, but a
 * leaf fed once needs no such argument. */
static void count_feeds(mp_node *const *order, size_t n)
{
    for (size_t i = 0; i < n; i++) order[i]->walk = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < order[i]->nin; k++) {
            mp_node *y = order[i]->in[k].node;
            if (y && y->walk < 2) y->walk++;
        }
    mp_tensor **leaves = NULL;
    long nl = leaf_edges(order, n, &leaves);
    for (size_t i = 0; i < n; i++) {
        mp_node *y = order[i];
        mp_tensor *leaf = y->nin == 1 ? y->in[0].leaf : NULL;
        if (y->walk != 1 || !leaf) continue;
        mp_tensor **hit = nl > 0 ? bsearch(&leaf, leaves, (size_t)nl, sizeof *leaves, by_address) : NULL;
        if (!hit || (hit > leaves && hit[-1] == leaf) || (hit + 1 < leaves + nl && hit[1] == leaf))
            y->walk = 2;   /* fed by other edges too (or unknown: out of memory) */
    }
    free(leaves);
}

/* the walk over order (n nodes), whose roots' gradients are set */
static int walk(const walk_ctx *w, mp_node **order, size_t n)
{
    int rc = 0;
    const walk_ctx *was_sink = sink_walk;
    bool plain = !w->ins && !w->create && !w->nwait;
    sink_walk = plain ? w : NULL;
    if (plain) count_feeds(order, n);
    if (!w->ins)
        for (mp_backward_listener *l = listeners; l; l = l->next)
            if (l->begin) l->begin(order, n);
    for (size_t i = 0; i < n && rc == 0; i++) {
        mp_node *x = order[i];
        /* the hooks of x's output see its whole gradient first, when x runs or
         * its gradient is a result */
        if (x->hooks && x->grad && (!w->ins || (x->walk & (WALK_RUN | WALK_USED))))
            rc = mp_grad_hooks_run(mp_node_grad_hooks(x), w->caller, &x->grad);
        if (rc == 0 && w->ins) {   /* an input computed here: its gradient is this node's sum */
            for (int j = 0; j < w->nin && x->grad; j++)
                if (w->ins[j]->grad_fn == x) rc = accumulate(&w->res[j], x->grad);
            if (!(x->walk & WALK_RUN)) {
                mp_release(x->grad);
                x->grad = NULL;
                continue;
            }
        }
        if (rc == 0 && x->grad) rc = run_node(w, x);
        if (rc == 0 && w->nwait) rc = leaves_done(w, x);
        for (mp_backward_listener *l = listeners; l && rc == 0 && !w->ins; l = l->next)
            if (l->node_done) rc = l->node_done(x);
    }
    sink_walk = was_sink;
    for (size_t i = 0; i < n; i++) {   /* after a failure, drop partial sums */
        mp_release(order[i]->grad);
        order[i]->grad = NULL;
    }
    for (int k = 0; k < w->nwait; k++) mp_release(w->wait[k].sum), w->wait[k].sum = NULL;
    return rc;
}

/* grad mode and autocast as a walk wants them, restored by walk_leave */
typedef struct { bool grad, in_backward; } walk_saved;

static walk_saved walk_enter(const walk_ctx *w)
{
    mp_state *s = mp_state_get();
    walk_saved was = {s->grad_enabled, s->in_backward};
    s->grad_enabled = w->create;   /* create_graph: the backward's ops record */
    s->in_backward = true;         /* backward ops run in their own dtypes, unobserved */
    return was;
}

static void walk_leave(walk_saved was)
{
    mp_state *s = mp_state_get();
    s->in_backward = was.in_backward;
    s->grad_enabled = was.grad;
}

/* the gradient to start from for t: grad (cast to t's dtype), or ones */
static mp_tensor *seed(mp_tensor *t, mp_tensor *grad, bool create, const char *what, int index)
{
    if (grad) {
        if (!mp_same_shape(grad, t)) {
            char b1[128], b2[128];
            mp_fail(MP_EINVAL, "grad shape %s does not match the %s's %s",
                    mp_shape_str(grad->ndim, grad->shape, b1, sizeof b1), what,
                    mp_shape_str(t->ndim, t->shape, b2, sizeof b2));
            return NULL;
        }
        return create ? mp_to(grad, t->dtype, t->dev) : mp_to_raw(grad, t->dtype, t->dev);
    }
    if (t->numel != 1) {
        if (index > 0)
            mp_fail(MP_EINVAL, "output %d has %lld elements: give its gradient in grad_outputs", index,
                    (long long)t->numel);
        else
            mp_fail(MP_EINVAL, "backward() without a gradient needs a tensor with one element "
                               "(this one has %lld); pass a gradient", (long long)t->numel);
        return NULL;
    }
    return mp_full(t->dtype, t->dev, t->ndim, t->shape, 1);
}

/* a walk started from a gradient hook would use the sums of the walk that runs it */
static int refuse_in_hook(const char *what)
{
    if (!mp_grad_hooks_running()) return 0;
    return mp_fail(MP_EINVAL, "%s cannot start inside a gradient hook (the backward that runs the hook holds "
                              "the graph's partial gradients)", what);
}

int mp_backward_ex(mp_tensor *t, mp_tensor *grad, const mp_backward_opts *opts)
{
    walk_ctx w = {.retain = opts && (opts->retain_graph || opts->create_graph), .caller = opts ? opts->caller : NULL};
    if (refuse_in_hook("backward")) return -1;
    if (opts && opts->create_graph)
        return mp_fail(MP_EINVAL, "create_graph is not supported by backward: the leaves' .grad would hold a "
                                  "graph that holds the leaves; use mp.autograd.grad(..., {create_graph = true})");
    if (!t->requires_grad)
        return mp_fail(MP_EINVAL, "tensor does not require grad and has no grad_fn");
    mp_tensor *g = seed(t, grad, false, "tensor", 0);
    if (!g) return -1;
    walk_saved was = walk_enter(&w);
    int rc;
    if (!t->grad_fn) {
        rc = mp_grad_hooks_run(mp_grad_hooks_of(t), w.caller, &g);
        if (rc == 0) rc = accumulate_leaf(t, g);
        mp_release(g);
    } else {
        size_t n = 0;
        mp_node **order = collect(&t->grad_fn, 1, &n);
        mp_tensor *prev = t->grad_fn->grad;
        t->grad_fn->grad = g;
        mp_release(prev);
        bool walked = false;
        rc = order ? wait_for_hooked_leaves(&w, order, n) : -1;
        if (rc == 0) rc = walk(&w, order, n), walked = true;
        free(w.wait);
        if (!walked) {   /* the walk drops its sums itself */
            mp_release(t->grad_fn->grad);
            t->grad_fn->grad = NULL;
        }
        free(order);
    }
    walk_leave(was);
    if (rc == 0 && t->dev != MP_CPU) rc = mp_device_error(t->dev);   /* mp_checked */
    for (mp_backward_listener *l = listeners; l; l = l->next)
        if (l->end) rc = l->end(rc);
    return rc;
}

int mp_backward(mp_tensor *t, mp_tensor *grad) { return mp_backward_ex(t, grad, NULL); }

int mp_autograd_grad(int nout, mp_tensor *const *outs, mp_tensor *const *gouts, int nin, mp_tensor *const *ins,
                     const mp_backward_opts *opts, bool allow_unused, mp_tensor **res)
{
    walk_ctx w = {.retain = opts && (opts->retain_graph || opts->create_graph),
                  .create = opts && opts->create_graph, .nin = nin, .ins = ins, .res = res,
                  .caller = opts ? opts->caller : NULL};
    for (int j = 0; j < nin; j++) res[j] = NULL;
    if (refuse_in_hook("mp_autograd_grad")) return -1;
    if (nout < 1) return mp_fail(MP_EINVAL, "outputs: give at least one tensor");
    if (nin < 1) return mp_fail(MP_EINVAL, "inputs: give at least one tensor");
    for (int k = 0; k < nout; k++)
        if (!outs[k]->requires_grad)
            return mp_fail(MP_EINVAL, "output %d does not require grad and has no grad_fn", k + 1);
    for (int j = 0; j < nin; j++)
        if (!ins[j]->requires_grad)
            return mp_fail(MP_EINVAL, "input %d does not require grad: no gradient can reach it", j + 1);
    bool small_used[16] = {0}, *used = nin <= 16 ? small_used : calloc((size_t)nin, sizeof *used);
    mp_node **roots = malloc(sizeof *roots * (size_t)nout), **order = NULL;
    if (!used || !roots) {
        if (used != small_used) free(used);
        free(roots);
        return mp_fail(MP_EOOM, "out of memory starting a backward");
    }
    walk_saved was = walk_enter(&w);
    int rc = 0, nroots = 0;
    size_t n = 0;
    for (int k = 0; k < nout; k++)
        if (outs[k]->grad_fn) roots[nroots++] = outs[k]->grad_fn;
    if (nroots && !(order = collect(roots, nroots, &n))) rc = -1;
    if (rc == 0) mark_paths(&w, order, n, used);
    for (int k = 0; k < nout && rc == 0; k++) {   /* the outputs' gradients, in their dtypes */
        mp_tensor *g = seed(outs[k], gouts ? gouts[k] : NULL, w.create, "output", k + 1);
        if (!g) rc = -1;
        else if (outs[k]->grad_fn) rc = accumulate(&outs[k]->grad_fn->grad, g);
        else   /* a leaf output: its gradient is the seed, when it is an input */
            for (int j = input_index(&w, outs[k], 0); j >= 0 && rc == 0; j = input_index(&w, outs[k], j + 1))
                used[j] = true, rc = accumulate(&res[j], g);
        mp_release(g);
    }
    if (rc == 0) rc = walk(&w, order, n);
    for (size_t i = 0; i < n; i++) order[i]->walk = 0, mp_release(order[i]->grad), order[i]->grad = NULL;
    for (int j = 0; j < nin && rc == 0; j++) {   /* a leaf input's hooks, on its whole gradient */
        if (!res[j] || ins[j]->grad_fn || !ins[j]->hooks) continue;
        int first = input_index(&w, ins[j], 0);
        if (first == j) {
            rc = mp_grad_hooks_run(mp_grad_hooks_of(ins[j]), w.caller, &res[j]);
        } else {                                 /* the same input again: the same result */
            mp_release(res[j]);
            res[j] = mp_retain(res[first]);
        }
    }
    walk_leave(was);
    for (int j = 0; j < nin && rc == 0; j++) {
        if (res[j]) continue;
        if (!used[j] && !allow_unused)
            rc = mp_fail(MP_EINVAL, "input %d is not used by the outputs' graph (pass allow_unused = true to "
                                    "get nil for it)", j + 1);
        else if (used[j] && !(res[j] = mp_full(ins[j]->dtype, ins[j]->dev, ins[j]->ndim, ins[j]->shape, 0)))
            rc = -1;
    }
    if (rc == 0)
        for (int k = 0; k < nout && rc == 0; k++)
            if (outs[k]->dev != MP_CPU) rc = mp_device_error(outs[k]->dev);
    if (rc)
        for (int j = 0; j < nin; j++) mp_release(res[j]), res[j] = NULL;
    free(order);
    free(roots);
    if (used != small_used) free(used);
    return rc;
}
