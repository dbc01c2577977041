/*
 * op.h: an op, described once.
 *
 * Every differentiable tensor operation of the engine is one mp_op: its name
 * (the one string that autocast's table, error messages, backward telemetry,
 * a tensor's grad_fn and the Lua binding use), its autocast class, its number
 * of tensor inputs, its forward and its backward. The public C function of an
 * op (ops.h) puts the op's scalars in an mp_ctx and calls mp_apply, which
 *   1. casts each float input as the op's autocast class asks (autocast.h),
 *   2. runs the forward, which validates, allocates and calls the backend, and
 *      keeps what the backward needs (mp_keep) when a node will be recorded,
 *   3. records the autograd node (mp_finish), or releases the output when it
 *      cannot: the one place that does.
 * An op built from other ops (mse_loss, dropout) has no backward: its parts
 * record themselves.
 *
 * Descriptions register themselves when the library loads (MP_OP_REGISTER), so
 * adding an op touches no list: autocast's table and the binding's generated
 * functions (mp_op_bind) find it by walking the registry.
 */
#ifndef MP_OP_H
#define MP_OP_H

#include "engine/autograd.h"
#include "engine/autocast.h"

/* How the Lua binding exposes an op without code of its own:
 * MP_BIND_UNARY: mp.<name>(x) and x:<name>() over mp_unary with the op's kernel. */
typedef enum { MP_BIND_NONE, MP_BIND_UNARY } mp_bind;

typedef struct mp_ctx {
    /* set by the caller: the op's scalars, read by forward and kept for backward */
    double f[4];
    int64_t i[6];
    const void *arg;               /* anything more the forward reads (a shape), not kept */
    /* set by mp_apply */
    const struct mp_op *op;
    int nin;
    mp_tensor *const *in;          /* the inputs after autocast (entries may be NULL) */
    bool record;                   /* a node will be recorded: keep what backward needs */
    int nsaved;
    mp_tensor **saved;             /* mp_keep's tensors, moved into the node */
} mp_ctx;

struct mp_op {
    const char *name;
    mp_ac_class ac;
    int nin;                       /* tensor inputs; -1: any number (cat) */
    mp_tensor *(*forward)(mp_ctx *c);
    mp_backward_fn backward;       /* NULL: composed of ops that record themselves */
    int kernel;                    /* the op's code in its backend family (an mp_unop, ...) */
    /* the backend entries the op calls that a backend may leave NULL
     * (MP_BE_ENTRY(conv2d), ...; 0 ends the list): mp_apply declines the op on
     * a backend without one of them, as when its supports says no */
    unsigned short needs[4];
    mp_bind bind;
};

/* run op on nin inputs with the scalars in c (see above); a new tensor, or
 * NULL with mp_error() set */
mp_tensor *mp_apply(const mp_op *op, mp_ctx *c, int nin, mp_tensor *const *in);
/* keep t (retained; NULL allowed) in backward's slot (node->saved[slot]); only
 * when c->record. -1 out of memory */
int mp_keep(mp_ctx *c, int slot, mp_tensor *t);
/* keep the op's own output: a detached header, so the graph has no cycle */
int mp_keep_output(mp_ctx *c, int slot, mp_tensor *out);

/* Record op's node for o (computed from ins) when a gradient is wanted, or
 * release o when that fails: o itself, or NULL. *node: the node or NULL. */
mp_tensor *mp_finish(mp_tensor *o, const mp_op *op, int nin, mp_tensor *const *ins, mp_node **node);

/* a kernel could not get its working memory from its backend's context:
 * an out-of-memory error naming the op (-1; the binding collects garbage and
 * retries once, as for any allocation) */
int mp_kernel_oom(const char *op);

/* the registry */
void mp_op_register(const mp_op *op);
const mp_op *mp_op_at(int i);          /* i from 0; NULL past the end */
const mp_op *mp_op_find(const char *name);

#define MP_OP_REGISTER(var) \
    __attribute__((constructor)) static void mp_register_##var(void) { mp_op_register(&var); }
/* a family of ops in an array (the unary ops, indexed by kernel code) */
#define MP_OP_REGISTER_ARRAY(arr, n) \
    __attribute__((constructor)) static void mp_register_##arr(void) \
    { for (int k_ = 0; k_ < (n); k_++) if ((arr)[k_].name) mp_op_register(&(arr)[k_]); }

#endif
