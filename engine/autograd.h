/*
 * autograd.h: dynamic reverse-mode differentiation.
 *
 * An op whose inputs require grad (with grad mode on) records a node: its
 * backward function, edges to where each input's gradient goes (the node that
 * made the input, or the input itself when it is a leaf), the tensors and
 * scalars its backward needs, and a sequence number. mp_backward walks the
 * nodes reachable from a tensor in reverse creation order, calls each backward
 * once with the summed gradient of its output, frees its saved tensors, and
 * accumulates leaf gradients into `.grad` in the leaf's own dtype, in place
 * when `.grad` exists (so gradients that are views into an arena stay views).
 *
 * Nodes point only backwards (to earlier nodes and leaves) and save outputs
 * detached, so the graph has no reference cycles; it lives as long as the
 * tensors computed from it.
 */
#ifndef MP_AUTOGRAD_H
#define MP_AUTOGRAD_H

#include "engine/tensor.h"

typedef struct mp_node mp_node;
typedef struct mp_op mp_op;      /* engine/op.h */

/* gradients of the node's inputs from the gradient of its output: set gin[i] to
 * a new tensor shaped like input i (NULL where not needed); 0 or -1 */
typedef int (*mp_backward_fn)(mp_node *n, mp_tensor *gout, mp_tensor **gin);

typedef struct {
    mp_node *node;                 /* the input was computed: its gradient goes here */
    mp_tensor *leaf;               /* the input is a leaf that requires grad */
    mp_dtype dtype;                /* the input's dtype, device and shape */
    mp_device dev;
    int ndim;
    int64_t shape[MP_MAXDIM];
} mp_edge;

struct mp_node {
    int refs;
    const mp_op *op;
    const char *name;              /* op->name */
    uint64_t seq, visit;
    bool released;                 /* saved tensors already freed by a backward pass */
    void *args;                    /* a copy of the op's argument struct (engine/op.h MP_NODE_ARGS), owned */
    mp_tensor *grad;               /* gradient of the output, summed during backward */
    int nsaved;
    mp_tensor **saved;             /* what the backward needs, any number (NULL entries allowed) */
    int nin;
    mp_edge in[];                  /* one per input, as many as the op has */
};

bool mp_grad_enabled(void);
bool mp_set_grad_enabled(bool on);            /* returns the previous mode */

/* true when an op on these inputs must record a node */
bool mp_needs_grad(int n, mp_tensor *const *ins);

/* Record a node of op for out (computed from ins) when mp_needs_grad; *node is
 * the new node or NULL when nothing was recorded. Returns -1 only on allocation
 * failure. Ops call it through mp_finish (engine/op.h). */
int mp_record(mp_tensor *out, const mp_op *op, int nin, mp_tensor *const *ins, mp_node **node);
/* keep t for the backward pass in saved[slot], growing the list (a detached
 * header when t is the op's output); -1 out of memory */
int mp_save(mp_node *n, int slot, mp_tensor *t);
mp_tensor *mp_detached(mp_tensor *t);            /* new header, same storage, no grad_fn */
/* true when input i of n wants a gradient */
static inline bool mp_edge_wants(const mp_node *n, int i) { return n->in[i].node || n->in[i].leaf; }

void mp_node_release(mp_node *n);

/* backward from t; grad NULL means ones (t must then have one element) */
int mp_backward(mp_tensor *t, mp_tensor *grad);
int mp_set_requires_grad(mp_tensor *t, bool on);
/* t.grad = g (NULL clears it): g must have t's shape, dtype and device and be
 * plain data (not t, no .grad, not requiring grad: anything else could make a
 * reference cycle that is never freed). On success *old is the previous
 * gradient, which the caller releases (retained g is now t's). */
int mp_set_grad(mp_tensor *t, mp_tensor *g, mp_tensor **old);

/* Telemetry of the backward pass: when on, every backward records how many values
 * it rounded to f16/bf16, how many nonzero ones became zero and how many finite
 * ones became inf, summed per op name (the first MP_FLUSH_SLOTS names) until
 * reset. The counts stay on their device until read: entry 0 reads them (one
 * wait on an asynchronous device); reset reads nothing. */
void mp_autograd_count_flush(bool on);
void mp_autograd_flush_reset(void);
/* the i-th op's sums (i from 0); NULL past the end */
const char *mp_autograd_flush_entry(int i, int64_t counts[3]);

/* helpers for backward functions */
mp_tensor *mp_sum_to(mp_tensor *g, int ndim, const int64_t *shape);   /* undo broadcasting */
mp_tensor *mp_expand(mp_tensor *g, int ndim, const int64_t *shape);   /* broadcast copy */

#endif
