/*
 * graph.c: recording nodes and letting them go (engine/graph.h).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "engine/graph.h"
#include "engine/state.h"
#include "engine/error.h"

_Static_assert(offsetof(mp_node, head) == 0, "a tensor releases its grad_fn through the node's first member");

bool mp_grad_enabled(void) { return mp_state_get()->grad_enabled; }

bool mp_set_grad_enabled(bool on)
{
    mp_state *s = mp_state_get();
    bool was = s->grad_enabled;
    s->grad_enabled = on;
    return was;
}

bool mp_needs_grad(int n, mp_tensor *const *ins)
{
    if (!mp_state_get()->grad_enabled) return false;
    for (int i = 0; i < n; i++)
        if (ins[i] && ins[i]->requires_grad) return true;
    return false;
}

static void release_head(mp_node_head *head) { mp_node_release((mp_node *)head); }

/* a node with nin empty edges, numbered; in anomaly mode it knows where its
 * forward ran (the binding's provider: engine/anomaly.h) */
static mp_node *new_node(const char *name, mp_backward_fn backward, int nin)
{
    mp_node *n = calloc(1, sizeof *n + (size_t)nin * sizeof(mp_edge));
    if (!n) return mp_fail(MP_EOOM, "out of memory recording %s", name), NULL;
    mp_state *s = mp_state_get();
    n->head.release = release_head;
    n->refs = 1;
    n->name = name;
    n->backward = backward;
    n->seq = s->next_seq++;
    n->nin = nin;
    if (s->anomaly.on && s->anomaly.where) n->where = s->anomaly.where(s->anomaly.ctx);   /* NULL: unknown */
    return n;
}

mp_node *mp_graph_record(mp_tensor *out, const char *name, mp_backward_fn backward, int nin,
                         mp_tensor *const *ins)
{
    mp_node *n = mp_graph_node(name, backward, nin, ins);
    if (n) mp_graph_attach(out, n);
    return n;
}

void mp_graph_attach(mp_tensor *out, mp_node *n)
{
    out->requires_grad = true;
    out->grad_fn = n;
}

mp_node *mp_graph_node(const char *name, mp_backward_fn backward, int nin, mp_tensor *const *ins)
{
    mp_node *n = new_node(name, backward, nin);
    if (!n) return NULL;
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
    return n;
}

mp_node *mp_graph_record_edges(mp_tensor *out, const char *name, mp_backward_fn backward, int nin,
                               const mp_edge *edges)
{
    mp_node *n = new_node(name, backward, nin);
    if (!n) return NULL;
    for (int i = 0; i < nin; i++) {
        n->in[i] = edges[i];
        if (edges[i].node) edges[i].node->refs++;
        if (edges[i].leaf) mp_retain(edges[i].leaf);
    }
    mp_graph_attach(out, n);
    return n;
}

mp_tensor *mp_detached(mp_tensor *t)
{
    return mp_view(t, t->ndim, t->shape, t->offset);
}

void mp_node_release_saved(mp_node *n)
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
        mp_node_release_saved(n);
        if (n->payload_release) n->payload_release(n->payload);   /* before the edges: it may read them */
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
        if (n->saved_version != n->saved_version_small) free(n->saved_version);
        free(n->args);
        if (n->hooks) n->hooks->release(n->hooks);
        free(n->where);
        free(n);
        if (!top) break;
        n = stack[--top];
    }
    free(stack);
}

int mp_node_stamp_saved(mp_node *n)
{
    if (!n->nsaved) return 0;
    size_t small = sizeof n->saved_version_small / sizeof n->saved_version_small[0];
    uint64_t *v = n->saved_version;
    if ((size_t)n->nsaved <= small) {
        if (v != n->saved_version_small) free(v);
        v = n->saved_version_small;
    } else {
        v = realloc(v == n->saved_version_small ? NULL : v, sizeof *v * (size_t)n->nsaved);
        if (!v) return mp_fail(MP_EOOM, "out of memory recording %s", n->name);
    }
    n->saved_version = v;
    for (int k = 0; k < n->nsaved; k++) v[k] = n->saved[k] ? n->saved[k]->st->version : 0;
    return 0;
}

int mp_node_check_saved(const mp_node *n)
{
    if (!n->saved_version) return 0;   /* nothing saved, or a node that never stamped */
    for (int k = 0; k < n->nsaved; k++) {
        const mp_tensor *t = n->saved[k];
        if (!t || t->st->version == n->saved_version[k]) continue;
        char b[128];
        bool out = k < 64 && (n->saved_outputs >> k & 1);
        return mp_fail(MP_EINVAL, "one of the tensors needed for gradient computation has been modified by an "
                                  "in-place operation: %s's saved tensor %d (%s %s%s) is at version %llu, expected %llu "
                                  "(clone it before the in-place op, or do that op after the backward)",
                       n->name, k, mp_dtype_name(t->dtype), mp_shape_str(t->ndim, t->shape, b, sizeof b),
                       out ? ", its output" : "", (unsigned long long)t->st->version,
                       (unsigned long long)n->saved_version[k]);
    }
    return 0;
}

int mp_set_requires_grad(mp_tensor *t, bool on)
{
    if (on && (!mp_is_float(t->dtype) || mp_is_storage_only(t->dtype)))
        return mp_fail(MP_EINVAL, "only float tensors that compute can require grad (got %s%s)", mp_dtype_name(t->dtype),
                       mp_is_storage_only(t->dtype) ? ", which holds data only" : "");
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
