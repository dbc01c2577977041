/*
 * op.h: an op, described once.
 *
 * Every differentiable tensor operation of the engine is one mp_op: its name
 * (the one string that autocast's table, error messages, backward telemetry,
 * a tensor's grad_fn and the Lua binding use), its autocast class, its number
 * of tensor inputs, its forward and its backward. The public C function of an
 * op (ops.h) fills the op's argument struct (its scalars, named: see "Arguments"
 * below), points an mp_op_ctx at it and calls mp_apply, which
 *   0. refuses a quantized input unless the op says it reads quantized data
 *      (engine/tensor.h, mp_quant),
 *   1. hands each input to the argument hook, which casts it as the op's
 *      autocast class asks (engine/autocast.c installs it),
 *   2. runs the forward, which validates, allocates and calls the backend, and
 *      keeps what the backward needs (mp_keep) when a node will be recorded,
 *   3. records the autograd node (mp_finish), or releases the output when it
 *      cannot: the one place that does; the node keeps a copy of the op's
 *      arguments for the backward,
 *   4. hands the output to the output hook (engine/observe.c installs it).
 * op.c names neither autocast nor observe: each installs its hook when first
 * used (one slot each, for the process), and without them the inputs go in
 * as they are and nothing watches.
 * An op built from other ops (mse_loss, dropout) has no backward: its parts
 * record themselves.
 *
 * Arguments: each op kind with scalars declares a struct of its own in its
 * ops file, e.g.
 *     typedef struct { int dim; bool keepdim; int k; } reduce_args;   (k: set by the forward)
 * and its size in the description (.args_size = sizeof(reduce_args)). The
 * public function fills one and sets c.args; the forward reads and may
 * complete it (what it works out for the backward: a 0-based dim, a seed) with
 * MP_OP_ARGS(c, reduce_args); mp_apply copies it into the node, whose backward
 * reads it with MP_NODE_ARGS(n, reduce_args). Both accessors check the size
 * against the description, so a struct that does not belong to the op stops
 * the program instead of being read as the wrong fields.
 *
 * Descriptions register themselves when the library loads (MP_OP_REGISTER(x);),
 * so adding an op touches no list: autocast's table and the binding's generated
 * functions (mp_op_bind) find it by walking the registry.
 */
#ifndef MP_OP_H
#define MP_OP_H

#include "engine/graph.h"

typedef struct mp_op mp_op;

/* An op's autocast class (engine/autocast.h says what each does) */
typedef enum { MP_AC_NONE, MP_AC_LOW, MP_AC_F32, MP_AC_PROMOTE } mp_ac_class;

/* How the Lua binding exposes an op without code of its own:
 * MP_BIND_UNARY: mp.<name>(x) and x:<name>() over mp_unary with the op's kernel. */
typedef enum { MP_BIND_NONE, MP_BIND_UNARY } mp_bind;

/* an op's code read its arguments as a struct of another size: a programming
 * error, reported with the op's name, and the program stops */
_Noreturn void mp_op_args_mismatch(const mp_op *op, size_t size, bool given);

typedef struct mp_op_ctx {
    /* set by the caller */
    void *args;                    /* the op's argument struct (op->args_size bytes; NULL when 0):
                                    * read by the forward, completed by it, copied into the node */
    const void *extra;             /* anything more the forward reads (a shape, an output slot): not kept */
    /* set by mp_apply */
    const struct mp_op *op;
    int nin;
    mp_tensor *const *in;          /* the inputs after autocast (entries may be NULL) */
    bool record;                   /* a node will be recorded: keep what backward needs */
    int nsaved;
    mp_tensor **saved;             /* mp_keep's tensors, moved into the node */
    uint64_t saved_outputs;        /* the slots mp_keep_output filled (bit k: slot k) */
} mp_op_ctx;

struct mp_op {
    const char *name;
    mp_ac_class ac;
    int nin;                       /* tensor inputs; -1: any number (cat) */
    mp_tensor *(*forward)(mp_op_ctx *c);
    mp_backward_fn backward;       /* NULL: composed of ops that record themselves */
    int kernel;                    /* the op's code in its backend family (an mp_unop, ...) */
    /* the backend entries the op calls that a backend may leave NULL
     * (MP_BE_ENTRY(conv2d), ...; 0 ends the list): mp_apply declines the op on
     * a backend without one of them, as when its supports says no */
    unsigned short needs[4];
    mp_bind bind;
    size_t args_size;              /* sizeof the op's argument struct; 0: it has none */
    bool quantized;                /* the forward reads quantized inputs (t->quant) itself;
                                    * false: mp_apply refuses them */
    bool double_backward;          /* its backward is built from recording ops, so create_graph can
                                    * differentiate it again (engine/backward.c) */
    bool moves_bytes;              /* a cast, copy or layout op: takes the data-only dtypes (FP8,
                                    * mp_is_storage_only); false: mp_apply refuses them */
    bool widens_itself;            /* an f32-class op whose kernels read f16/bf16 inputs and compute
                                    * in f32 themselves (f32 results; a gradient of the input's dtype
                                    * rounded once from f32): autocast hands it a 16-bit input as
                                    * it is, with no f32 copy (engine/autocast.c) */
};

/* the op's argument struct, checked against the description's args_size */
static inline void *mp_op_args_checked(const mp_op *op, void *args, size_t size)
{
    if (!args || op->args_size != size) mp_op_args_mismatch(op, size, args != NULL);
    return args;
}
#define MP_OP_ARGS(c, type) ((type *)mp_op_args_checked((c)->op, (c)->args, sizeof(type)))
#define MP_NODE_ARGS(n, type) ((const type *)mp_op_args_checked((n)->op, (n)->args, sizeof(type)))

/* run op on nin inputs with the arguments in c (see above); a new tensor, or
 * NULL with mp_error() set */
mp_tensor *mp_apply(const mp_op *op, mp_op_ctx *c, int nin, mp_tensor *const *in);
/* keep t (retained; NULL allowed) in backward's slot (node->saved[slot]); only
 * when c->record. -1 out of memory */
int mp_keep(mp_op_ctx *c, int slot, mp_tensor *t);
/* keep the op's own output: a detached header, so the graph has no cycle.
 * The slot (< 64) is marked as the output's: a backward that builds a graph
 * (create_graph) sees it attached to the node again (engine/backward.c) */
int mp_keep_output(mp_op_ctx *c, int slot, mp_tensor *out);

/* Record op's node for o (computed from ins) when a gradient is wanted, or
 * release o when that fails: o itself, or NULL. *node: the node or NULL. */
mp_tensor *mp_finish(mp_tensor *o, const mp_op *op, int nin, mp_tensor *const *ins, mp_node **node);

/* a kernel could not get its working memory from its backend's context:
 * an out-of-memory error naming the op (-1; the binding collects garbage and
 * retries once, as for any allocation) */
int mp_kernel_oom(const char *op);

/* the hooks of mp_apply (see above): an input as op should take it (a new
 * reference; NULL with an error), and an op's output (not kept) */
typedef mp_tensor *(*mp_arg_hook)(const mp_op *op, mp_tensor *t);
typedef void (*mp_output_hook)(const mp_op *op, mp_tensor *out);
void mp_op_set_arg_hook(mp_arg_hook hook);
void mp_op_set_output_hook(mp_output_hook hook);

/* the registry */
void mp_op_register(const mp_op *op);
const mp_op *mp_op_at(int i);          /* i from 0; NULL past the end */
const mp_op *mp_op_find(const char *name);

/* Used as a statement, `MP_OP_REGISTER(x);`, so that tools reading the file
 * (ctags, cscope, an editor's outline) see a declaration end there: each macro
 * ends in a _Static_assert that takes the semicolon and checks its argument. */
#define MP_OP_REGISTER(var) \
    __attribute__((constructor)) static void mp_register_##var(void) { mp_op_register(&var); } \
    _Static_assert(__builtin_types_compatible_p(__typeof__(var), const mp_op), #var " is a const mp_op")
/* a family of ops in an array (the unary ops, indexed by kernel code), n of them */
#define MP_OP_REGISTER_ARRAY(arr, n) \
    __attribute__((constructor)) static void mp_register_##arr(void) \
    { for (int k_ = 0; k_ < (n); k_++) if ((arr)[k_].name) mp_op_register(&(arr)[k_]); } \
    _Static_assert(sizeof(arr) / sizeof((arr)[0]) == (n), #arr " holds " #n " ops")

#endif
