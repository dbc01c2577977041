/*
 * graph.h: the autograd graph: nodes, their edges, recording and release.
 *
 * An op whose inputs require grad (with grad mode on) records a node: its
 * backward function, edges to where each input's gradient goes (the node that
 * made the input, or the input itself when it is a leaf), the tensors and
 * scalars its backward needs, and a sequence number. The graph knows tensors
 * and nothing of ops: engine/op.c decides when a node is recorded and fills in
 * what the op keeps; engine/backward.c walks the nodes.
 *
 * Nodes point only backwards (to earlier nodes and leaves) and save outputs
 * detached, so the graph has no reference cycles; it lives as long as the
 * tensors computed from it. A tensor holds its node through the node's head
 * (engine/tensor.h), which carries the node's release.
 *
 * Grad mode and the sequence counter are this thread's (engine/state.h).
 */
#ifndef MP_GRAPH_H
#define MP_GRAPH_H

#include "engine/tensor.h"

typedef struct mp_node mp_node;
struct mp_op;                      /* engine/op.h: the op that recorded a node, for its backward */

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
    mp_node_head head;             /* first: what the tensor it made releases it by */
    int refs;
    const struct mp_op *op;        /* the op that recorded it (its backward reads the op's kernel) */
    const char *name;              /* op->name */
    mp_backward_fn backward;       /* op->backward */
    uint64_t seq, visit;
    bool released;                 /* saved tensors already freed by a backward pass */
    void *args;                    /* a copy of the op's argument struct (engine/op.h MP_NODE_ARGS), owned */
    mp_tensor *grad;               /* gradient of the output, summed during backward */
    int nsaved;
    mp_tensor **saved;             /* what the backward needs, any number (NULL entries allowed) */
    uint64_t saved_outputs;        /* bit k: saved[k] is the node's own output, detached (engine/op.h
                                    * mp_keep_output); create_graph attaches it again for the backward */
    uint64_t *saved_version;       /* saved[k]'s storage version when it was kept (mp_node_stamp_saved):
                                    * a backward refuses a saved tensor written since; points into
                                    * saved_version_small for up to 4 (no allocation per op), else owned */
    uint64_t saved_version_small[4];
    unsigned char walk;            /* scratch of the walk that holds the node (engine/backward.c) */
    void *payload;                 /* a custom node's own data (engine/custom.h), freed with the node by */
    void (*payload_release)(void *payload);   /* this (NULL: nothing to free) */
    mp_node_head *hooks;           /* hooks on its output's gradient (engine/grad_hooks.h), owned and
                                    * released through their head: the graph knows nothing of them */
    char *where;                   /* anomaly mode: where its forward ran ("train.lua:12"), owned */
    int nin;
    mp_edge in[];                  /* one per input, as many as the op has */
};

bool mp_grad_enabled(void);
bool mp_set_grad_enabled(bool on);            /* returns the previous mode */

/* true when an op on these inputs must record a node */
bool mp_needs_grad(int n, mp_tensor *const *ins);

/* Record a node named name for out, computed from ins (the caller has decided
 * that one is wanted: engine/op.c's mp_finish): out then requires grad and its
 * grad_fn is the node. NULL with an error only when out of memory. */
mp_node *mp_graph_record(mp_tensor *out, const char *name, mp_backward_fn backward, int nin,
                         mp_tensor *const *ins);
/* Record a node for out whose inputs are given as edges (copied, their nodes
 * and leaves retained): what a backward that builds a graph records when a
 * node stands for work done on gradients rather than on tensors */
mp_node *mp_graph_record_edges(mp_tensor *out, const char *name, mp_backward_fn backward, int nin,
                               const mp_edge *edges);
/* the same node made for no output yet (engine/custom.c: a node with several
 * outputs): its one reference is the caller's, until mp_graph_attach gives it
 * to an output (which must have no grad_fn) */
mp_node *mp_graph_node(const char *name, mp_backward_fn backward, int nin, mp_tensor *const *ins);
void mp_graph_attach(mp_tensor *out, mp_node *n);
mp_tensor *mp_detached(mp_tensor *t);            /* new header, same storage, no grad_fn */
/* true when input i of n wants a gradient */
static inline bool mp_edge_wants(const mp_node *n, int i) { return n->in[i].node || n->in[i].leaf; }

/* drop one reference to n (what a tensor's head release does); the last frees
 * n and every node only it kept, without recursion */
void mp_node_release(mp_node *n);
/* free what n's backward needed (a backward ran it): a node that saved nothing
 * can be walked again, one whose saved tensors are gone cannot (n->released) */
void mp_node_release_saved(mp_node *n);

/* Version counters (engine/tensor.h, mp_storage.version; PyTorch's): note the
 * version of each saved tensor's storage now (after the forward kept them), and
 * before a backward uses them, fail when one was written in place since,
 * naming the node's op, the slot and both versions. -1 out of memory / changed */
int mp_node_stamp_saved(mp_node *n);
int mp_node_check_saved(const mp_node *n);

int mp_set_requires_grad(mp_tensor *t, bool on);
/* t.grad = g (NULL clears it): g must have t's shape, dtype and device and be
 * plain data (not t, no .grad, not requiring grad: anything else could make a
 * reference cycle that is never freed). On success *old is the previous
 * gradient, which the caller releases (retained g is now t's). */
int mp_set_grad(mp_tensor *t, mp_tensor *g, mp_tensor **old);

#endif
