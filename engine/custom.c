/*
 * custom.c: nodes whose backward the caller supplies (engine/custom.h).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "engine/custom.h"
#include "engine/ops.h"
#include "engine/error.h"

const mp_op mp_custom_op = {.name = "function", .double_backward = true};

/* the custom node's payload */
typedef struct {
    mp_custom_fn fn;
    int nout;
    int direct;                    /* the one differentiable output, whose grad_fn is the node; -1: several */
    mp_edge *out;                  /* each output's dtype, device and shape (its node/leaf unused) */
    mp_tensor **slot;              /* with several: each output's gradient, from its own node */
    uint64_t slot_visit;           /* the walk that filled the slots (a failed walk may leave some behind) */
    bool saves_output;             /* with several: a saved tensor is a differentiable output (see below) */
} custom_node;

/* an output's node: which output of which custom node (its one input edge) */
typedef struct {
    int k;
} output_node;

static void clear_slots(custom_node *c)
{
    for (int k = 0; k < c->nout && c->slot; k++) {
        mp_release(c->slot[k]);
        c->slot[k] = NULL;
    }
}

static void custom_release(void *p)
{
    custom_node *c = p;
    clear_slots(c);
    free(c->slot);
    free(c->out);
    if (c->fn.release) c->fn.release(c->fn.payload);
    free(c);
}

/* add g into *acc, out of place (g may be held elsewhere) */
static int add_into(mp_tensor **acc, mp_tensor *g)
{
    if (!*acc) { *acc = mp_retain(g); return 0; }
    mp_tensor *s = mp_binary(MP_ADD, *acc, g);
    if (!s) return -1;
    mp_release(*acc);
    *acc = s;
    return 0;
}

static int custom_backward(mp_node *n, mp_tensor *gout, mp_tensor **gin)
{
    custom_node *c = n->payload;
    mp_tensor *small[8] = {0}, **g = c->nout <= 8 ? small : calloc((size_t)c->nout, sizeof *g);
    if (!g) return mp_fail(MP_EOOM, "out of memory in the backward of %s", n->name);
    if (c->direct >= 0) g[c->direct] = mp_retain(gout);
    else if (c->slot_visit == n->visit)   /* this walk's: the slots move into g */
        for (int k = 0; k < c->nout; k++) g[k] = c->slot[k], c->slot[k] = NULL;
    clear_slots(c);
    int rc = 0;
    /* create_graph (grad mode on in the backward): with one differentiable output
     * a saved output is attached to this node again by the walk (saved_outputs);
     * with several, each output has a node of its own, which the saved tensor
     * cannot be given back here: refuse, rather than differentiate it as a constant */
    if (c->saves_output && mp_grad_enabled())
        rc = mp_fail(MP_EINVAL, "Function %s saved one of its outputs, which cannot be differentiated again when the "
                                "Function has several differentiable outputs: save the inputs and recompute it",
                     n->name);
    for (int k = 0; k < c->nout && rc == 0; k++)   /* zeros for outputs no gradient reached */
        if (!g[k] && !(g[k] = mp_full(c->out[k].dtype, c->out[k].dev, c->out[k].ndim, c->out[k].shape, 0))) rc = -1;
    if (rc == 0) rc = c->fn.backward(c->fn.payload, n, c->nout, g, gin);
    for (int k = 0; k < c->nout; k++) mp_release(g[k]);
    if (g != small) free(g);
    return rc;
}

/* an output's gradient goes to the custom node's slot; the node gets a 0-d zero
 * so that the walk runs it (its own gradient is not read) */
static int output_backward(mp_node *n, mp_tensor *gout, mp_tensor **gin)
{
    mp_node *cn = n->in[0].node;
    custom_node *c = cn->payload;
    const output_node *o = n->payload;
    if (c->slot_visit != cn->visit) {   /* left over from a walk that failed */
        clear_slots(c);
        c->slot_visit = cn->visit;
    }
    if (add_into(&c->slot[o->k], gout)) return -1;
    gin[0] = mp_full(n->in[0].dtype, n->in[0].dev, 0, NULL, 0);
    return gin[0] ? 0 : -1;
}

/* a and b are the same values: one storage, offset, dtype and shape (an
 * output is handed out as a new header over the forward's result) */
static bool same_view(const mp_tensor *a, const mp_tensor *b)
{
    return a->st == b->st && a->offset == b->offset && a->dtype == b->dtype && mp_same_shape(a, b);
}

/* undo what was attached to outs[0..k) (a failure partway) */
static void detach_outputs(int k, mp_tensor *const *outs)
{
    for (int i = 0; i < k; i++) {
        if (!outs[i]->grad_fn) continue;
        mp_node *n = outs[i]->grad_fn;
        outs[i]->grad_fn = NULL;
        outs[i]->requires_grad = false;
        mp_node_release(n);
    }
}

int mp_custom_record(const mp_custom_fn *fn, int nin, mp_tensor *const *ins, int nout, mp_tensor *const *outs,
                     const bool *diff, int nsaved, mp_tensor *const *saved)
{
    int ndiff = 0, direct = -1;
    for (int k = 0; k < nout; k++)
        if (diff[k] && mp_is_float(outs[k]->dtype)) ndiff++, direct = k;
    custom_node *c = ndiff ? calloc(1, sizeof *c) : NULL;
    if (c) {
        c->out = calloc((size_t)(nout ? nout : 1), sizeof *c->out);
        c->slot = calloc((size_t)(nout ? nout : 1), sizeof *c->slot);
    }
    if (!ndiff || !c || !c->out || !c->slot) {
        if (c) free(c->out), free(c->slot), free(c);
        if (fn->release) fn->release(fn->payload);
        return ndiff ? mp_fail(MP_EOOM, "out of memory recording %s", fn->name) : 0;
    }
    c->fn = *fn;
    c->nout = nout;
    c->direct = ndiff == 1 ? direct : -1;
    for (int k = 0; k < nout; k++) {
        mp_edge *e = &c->out[k];
        e->dtype = outs[k]->dtype, e->dev = outs[k]->dev, e->ndim = outs[k]->ndim;
        memcpy(e->shape, outs[k]->shape, sizeof e->shape);
    }
    mp_node *n = mp_graph_node(fn->name, custom_backward, nin, ins);
    if (!n) return custom_release(c), -1;
    n->op = &mp_custom_op;
    n->payload = c, n->payload_release = custom_release;
    if (nsaved && !(n->saved = calloc((size_t)nsaved, sizeof *n->saved))) goto oom;
    n->nsaved = nsaved;
    for (int i = 0; i < nsaved; i++) {
        n->saved[i] = saved[i] ? mp_retain(saved[i]) : NULL;
        for (int k = 0; k < nout && saved[i]; k++)   /* a saved output: the same values as outs[k] */
            if (diff[k] && same_view(saved[i], outs[k])) {
                if (k == c->direct && i < 64) n->saved_outputs |= (uint64_t)1 << i;
                else c->saves_output = true;
            }
    }
    if (mp_node_stamp_saved(n)) goto oom;   /* ctx:save_for_backward's tensors are version-checked too */
    if (c->direct >= 0) {
        mp_graph_attach(outs[c->direct], n);
        return 0;
    }
    for (int k = 0; k < nout; k++) {
        if (!diff[k] || !mp_is_float(outs[k]->dtype)) continue;
        mp_tensor *none[1] = {NULL};
        mp_node *o = mp_graph_node(fn->name, output_backward, 1, none);
        output_node *p = o ? malloc(sizeof *p) : NULL;
        if (!p) {
            if (o) mp_node_release(o);
            detach_outputs(k, outs);
            goto oom;
        }
        p->k = k;
        o->op = &mp_custom_op;
        o->payload = p, o->payload_release = free;
        /* the 0-d zero it sends: on the output's device */
        mp_edge *e = &o->in[0];
        e->node = n, n->refs++;
        e->dtype = MP_F32, e->dev = outs[k]->dev, e->ndim = 0;
        mp_graph_attach(outs[k], o);
    }
    mp_node_release(n);   /* the output nodes hold it now */
    return 0;
oom:
    mp_node_release(n);
    return mp_fail(MP_EOOM, "out of memory recording %s", fn->name);
}
