/*
 * custom.h: nodes whose backward the caller supplies (an autograd Function
 * written in Lua: lua/lfunction.c; the engine knows no Lua).
 *
 * A custom node is recorded once for all the outputs of one call, as PyTorch
 * records one node for a torch.autograd.Function: its backward gets one
 * gradient per output and gives one per input. The graph's nodes have one
 * output each (engine/graph.h), so with several differentiable outputs each
 * output's grad_fn is a small node of its own that hands its gradient to the
 * custom node (kept there until that node runs) and sends the custom node a
 * 0-d zero, so that the walk runs it after every output's gradient is in. With
 * one differentiable output, that output's grad_fn is the custom node itself.
 *
 * Outputs no gradient reached get zeros of their shape, dtype and device
 * (PyTorch's materialize_grads), so the callee's backward always gets tensors.
 * The node keeps the saved tensors in node->saved, so the backward pass frees
 * them when the node runs, as for a built-in op, and its payload (what the
 * caller needs to run the backward) is released, by the caller's function,
 * when the node is freed. Its op says its backward is built from recording
 * ops (double_backward): what the callee computes with engine ops is
 * differentiable again under create_graph.
 */
#ifndef MP_CUSTOM_H
#define MP_CUSTOM_H

#include "engine/op.h"

/* the gradients of the node's inputs (n->nin of them; n->in[i] says whether
 * input i wants one and its shape) from those of its nout outputs: set gin[i]
 * to a new reference or leave it NULL; 0, or -1 with mp_fail's message */
typedef int (*mp_custom_backward_fn)(void *payload, mp_node *n, int nout, mp_tensor *const *gout, mp_tensor **gin);

typedef struct {
    const char *name;              /* the nodes' name; must live as long as payload */
    mp_custom_backward_fn backward;
    void *payload;
    void (*release)(void *payload);   /* frees payload (NULL: nothing to free) */
} mp_custom_fn;

/* the op of every custom node (its name is "function"; each node has its own) */
extern const mp_op mp_custom_op;

/* Record one custom node for outs (computed from ins), saving saved[0..nsaved)
 * (retained; NULL entries allowed): each outs[k] with diff[k] true and a float
 * dtype gets a grad_fn and requires grad. The outputs must be fresh tensors
 * (no grad_fn, not requiring grad) that are not among ins. The payload is the
 * node's from this call on: fn->release frees it with the node, or at once
 * when no output is differentiable or recording fails. 0, or -1 (out of
 * memory; the outputs are then left as they were). */
int mp_custom_record(const mp_custom_fn *fn, int nin, mp_tensor *const *ins, int nout, mp_tensor *const *outs,
                     const bool *diff, int nsaved, mp_tensor *const *saved);

#endif
