/*
 * backward.h: the backward pass, and those that follow it.
 *
 * mp_backward walks the nodes reachable from a tensor (engine/graph.h) in
 * reverse creation order, calls each backward once with the summed gradient of
 * its output, frees its saved tensors, and accumulates leaf gradients into
 * `.grad` in the leaf's own dtype, in place when `.grad` exists (so gradients
 * that are views into an arena stay views). Grad mode is off during the pass,
 * and autocast's regions are inactive (engine/state.h: in_backward).
 *
 * Others follow a backward without the walk naming them: a listener registers
 * once and is called, in the order of registration, at
 *   begin      the walk starts, with its nodes in the order they will run
 *              (not called when backward starts at a leaf: there is no walk);
 *   gradients  a node's backward gave its inputs' gradients (in the node's
 *              dtypes, before they are cast back and summed);
 *   node_done  a node's turn is over: its gradients are summed into its
 *              inputs' (called for every node of the walk, run or not);
 *   end        the backward is over: it gets the result so far (0, or -1
 *              after a failure) and returns the backward's result.
 * Data parallel training (engine/dist_dp.c: buckets reduced as they are done,
 * the rest at the end) and mp.amp.diagnose (engine/observe.c: every node's
 * gradients) are listeners. Any callback may be NULL.
 */
#ifndef MP_BACKWARD_H
#define MP_BACKWARD_H

#include "engine/graph.h"

typedef struct mp_backward_listener {
    void (*begin)(mp_node *const *order, size_t n);
    void (*gradients)(const mp_node *x, mp_tensor *const *gin);
    int (*node_done)(const mp_node *x);    /* -1 (with an error) stops the walk */
    int (*end)(int rc);
    struct mp_backward_listener *next;     /* backward.c's list */
} mp_backward_listener;

/* l (static: it stays registered for the process) follows every backward from
 * now on; registering it again changes nothing */
void mp_backward_listen(mp_backward_listener *l);

/* During a node's backward: the f32 .grad that the gradient of x's edge i
 * may be added into straight away, or NULL. Given when the edge leads to an
 * autocast cast of an f32 leaf (engine/ops.h mp_cast_grad_target) that no
 * other node of the walk feeds and no one is to see between: a plain walk
 * (mp_backward_ex, neither create_graph nor hooked leaves), no hooks on the
 * cast or the leaf, no anomaly check, no listener reading gradients. The
 * backward then adds the gradient rounded to the edge's dtype, widened (the
 * bits the cast's own backward, mp_cast_backward_into, would add), bumps the
 * .grad's version, and leaves the edge's gradient NULL: the cast gets none
 * and does not run. */
mp_tensor *mp_backward_sink(mp_node *x, int i);

/* backward from t; grad NULL means ones (t must then have one element) */
int mp_backward(mp_tensor *t, mp_tensor *grad);

/*
 * What a walk keeps and builds:
 *   retain_graph  the nodes keep their saved tensors, so the graph can be
 *                 walked again (gradients then add up in the leaves' .grad);
 *   create_graph  the walk records what it computes: each node's backward runs
 *                 with grad mode on, so the gradients it returns are tensors
 *                 of a new graph and can be differentiated again. An op's
 *                 saved output is attached to its node for that (engine/op.h
 *                 mp_keep_output). An op whose backward is not built from
 *                 recording ops (mp_op.double_backward false) gives gradients
 *                 whose node raises "<op> has no second derivative" when a
 *                 backward reaches it, and only then. create_graph implies
 *                 retain_graph, as in PyTorch.
 */
typedef struct {
    bool retain_graph, create_graph;
    void *caller;                  /* handed to every gradient hook the walk runs (engine/grad_hooks.h) */
} mp_backward_opts;

/* mp_backward with opts (NULL: neither). create_graph is refused here: a
 * leaf's .grad would hold a graph that holds the leaf (use mp_autograd_grad) */
int mp_backward_ex(mp_tensor *t, mp_tensor *grad, const mp_backward_opts *opts);

/* The gradients of outs (nout of them, with the gradients gouts: NULL entries
 * mean ones for a one-element output) with respect to ins (nin tensors that
 * require grad), into res[0..nin-1] (new references), leaving every leaf's
 * .grad as it was and running only the nodes between the two. An input the
 * outputs do not depend on is an error unless allow_unused (then res[i] is
 * NULL); one they depend on but that receives no gradient gets zeros.
 * The listeners are not called: this is not a training step's backward. */
int mp_autograd_grad(int nout, mp_tensor *const *outs, mp_tensor *const *gouts, int nin, mp_tensor *const *ins,
                     const mp_backward_opts *opts, bool allow_unused, mp_tensor **res);

#endif
