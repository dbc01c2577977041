/*
 * grad_hooks.h: hooks on a tensor's gradient (PyTorch's Tensor.register_hook).
 *
 * A hook is a C callback with an opaque payload (the Lua binding's is a
 * function in its registry: lua/lhooks.c) and the payload's release. The
 * backward walk (engine/backward.c) runs a tensor's hooks, in the order they
 * were added, on the gradient of that tensor once it is complete:
 *   a computed tensor   its hooks live on the node that made it and run on the
 *                       node's summed gradient before the node's backward uses
 *                       it (and before mp_autograd_grad takes it as a result);
 *   a leaf              its hooks live on the tensor (mp_tensor.hooks, released
 *                       with it through their head, as grad_fn is) and run on
 *                       the sum of what every edge to it brought in this walk,
 *                       before it is added into .grad (or, in
 *                       mp_autograd_grad, handed back).
 * A hook may replace the gradient: it then leaves in *grad a new reference of
 * the same shape, dtype and device, and has released the old one.
 *
 * The handle mp_grad_hook_add returns outlives the hook's owner: removing it
 * after the tensor or node is gone does nothing, as does removing it twice.
 * A hook removed while hooks run is skipped; one added while they run first
 * runs at the next gradient.
 */
#ifndef MP_GRAD_HOOKS_H
#define MP_GRAD_HOOKS_H

#include "engine/tensor.h"

/* 0, or -1 with an error (the walk then stops). caller: what started the walk
 * (mp_backward_opts.caller: for the binding, the Lua thread that called backward) */
typedef int (*mp_grad_hook_fn)(void *payload, void *caller, mp_tensor **grad);

typedef struct mp_grad_hook mp_grad_hook;
typedef struct mp_grad_hooks mp_grad_hooks;   /* a tensor's or a node's list */

/* add a hook to t's gradient (t must require grad). Returns the handle, which
 * the caller gives up with mp_grad_hook_drop; NULL with an error, the payload
 * then still the caller's (release not called) */
mp_grad_hook *mp_grad_hook_add(mp_tensor *t, mp_grad_hook_fn fn, void (*release)(void *payload), void *payload);
/* the hook runs no more and its payload is released (now); twice is harmless */
void mp_grad_hook_remove(mp_grad_hook *h);
/* the caller's handle goes (the hook stays, as PyTorch's handle going away
 * does not remove its hook) */
void mp_grad_hook_drop(mp_grad_hook *h);

/* the hooks of t's gradient: its node's for a computed tensor, its own for a
 * leaf; those of node n's output (NULL: none) */
mp_grad_hooks *mp_grad_hooks_of(const mp_tensor *t);
struct mp_node;
mp_grad_hooks *mp_node_grad_hooks(const struct mp_node *n);
/* run hs on *g (engine/backward.c); NULL hs runs nothing */
int mp_grad_hooks_run(mp_grad_hooks *hs, void *caller, mp_tensor **g);
/* true while any hook runs on this thread: a backward may not start then */
bool mp_grad_hooks_running(void);

#endif
