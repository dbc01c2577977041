/*
 * ops_unary_grad.h: the unary ops' gradients as a graph (ops_unary_grad.c),
 * for engine/ops_math.c's unary backward when it builds one (create_graph).
 * Not in ops.h: no caller but that backward has a use for it.
 */
#ifndef MP_OPS_UNARY_GRAD_H
#define MP_OPS_UNARY_GRAD_H

#include "engine/tensor.h"

/* g * op'(x) from recording ops, so that it can be differentiated again (with
 * respect to g, x and y): x the op's input and y its output (the node's saved
 * output, attached to the node again: engine/backward.c), each NULL when the
 * op's backward does not keep it; p the op's scalar. A new tensor, or NULL with
 * an error. */
mp_tensor *mp_unary_grad_graph(mp_unop op, mp_tensor *g, mp_tensor *x, mp_tensor *y, double p);

#endif
