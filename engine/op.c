/*
 * op.c: the op registry and the one path every op runs through (op.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/capture_guard.h"
#include "engine/op.h"
#include "engine/error.h"

static const mp_op **registry;     /* grows as ops register: none is ever left out */
static int nregistered, registry_cap;
static mp_arg_hook arg_hook;         /* autocast's, once a region was entered */
static mp_output_hook output_hook;   /* observe's, once a record was started */

void mp_op_set_arg_hook(mp_arg_hook hook) { arg_hook = hook; }
void mp_op_set_output_hook(mp_output_hook hook) { output_hook = hook; }

/* called by constructors while the library loads: too early to report an
 * error, and a library missing an op would fail later in ways that hide why,
 * so running out of memory for a few pointers here ends the process */
void mp_op_register(const mp_op *op)
{
    if (nregistered == registry_cap) {
        int cap = registry_cap ? 2 * registry_cap : 64;
        const mp_op **r = realloc(registry, sizeof *r * (size_t)cap);
        if (!r) {
            fprintf(stderr, "mpengine: out of memory registering op %s\n", op->name);
            abort();
        }
        registry = r, registry_cap = cap;
    }
    registry[nregistered++] = op;
}

const mp_op *mp_op_at(int i) { return i >= 0 && i < nregistered ? registry[i] : NULL; }

const mp_op *mp_op_find(const char *name)
{
    for (int i = 0; i < nregistered; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

int mp_kernel_oom(const char *op)
{
    return mp_fail(MP_EOOM, "out of memory: no working memory for the %s kernel", op);
}

_Noreturn void mp_op_args_mismatch(const mp_op *op, size_t size, bool given)
{
    if (!given)
        fprintf(stderr, "mpengine: op %s was run without its arguments (%zu bytes)\n", op->name, op->args_size);
    else
        fprintf(stderr, "mpengine: op %s's arguments read as %zu bytes, but its description says %zu\n", op->name,
                size, op->args_size);
    abort();
}

int mp_keep(mp_op_ctx *c, int slot, mp_tensor *t)
{
    if (!c->record) return 0;
    if (slot >= c->nsaved) {
        mp_tensor **s = realloc(c->saved, sizeof *s * (size_t)(slot + 1));
        if (!s) return mp_fail(MP_EOOM, "out of memory keeping tensors for the backward");
        for (int i = c->nsaved; i <= slot; i++) s[i] = NULL;
        c->saved = s, c->nsaved = slot + 1;
    }
    mp_release(c->saved[slot]);
    c->saved[slot] = t ? mp_retain(t) : NULL;
    return 0;
}

int mp_keep_output(mp_op_ctx *c, int slot, mp_tensor *out)
{
    if (!c->record) return 0;
    if (slot < 0 || slot >= 64) return mp_fail(MP_EINVAL, "%s keeps its output in slot %d (0-63 allowed)", c->op->name, slot);
    c->saved_outputs |= (uint64_t)1 << slot;
    mp_tensor *d = mp_detached(out);
    if (!d) return -1;
    int rc = mp_keep(c, slot, d);
    mp_release(d);
    return rc;
}

mp_tensor *mp_finish(mp_tensor *o, const mp_op *op, int nin, mp_tensor *const *ins, mp_node **node)
{
    *node = NULL;
    /* integers and the data-only FP8 cut the graph (no gradient flows in them) */
    if (!o || !op->backward || !mp_needs_grad(nin, ins) || !mp_is_float(o->dtype) || mp_is_storage_only(o->dtype))
        return o;
    if (!(*node = mp_graph_record(o, op->name, op->backward, nin, ins))) {
        mp_release(o);
        return NULL;
    }
    (*node)->op = op;
    return o;
}

/* an op that does not read quantized data refuses it (tensor.h, mp_quant): the
 * one check that keeps scaled values from being read as plain ones, before
 * autocast, which would cast the raw values */
static int check_quantized(const mp_op *op, int nin, mp_tensor *const *in)
{
    if (op->quantized) return 0;
    for (int k = 0; k < nin; k++)
        if (in[k] && in[k]->quant.kind != MP_QUANT_NONE)
            return mp_fail(MP_EINVAL, "%s does not take quantized tensors (input %d is %s-quantized %s)", op->name,
                           k + 1, mp_quant_name(in[k]->quant.kind), mp_dtype_name(in[k]->dtype));
    return 0;
}

/* FP8 tensors are data only, as in PyTorch: ops that compute refuse them
 * here, the one check, before autocast could widen them unseen */
static int check_storage_only(const mp_op *op, int nin, mp_tensor *const *in)
{
    if (op->moves_bytes) return 0;
    for (int k = 0; k < nin; k++)
        if (in[k] && mp_is_storage_only(in[k]->dtype))
            return mp_fail(MP_EINVAL, "%s does not take %s tensors, which hold data only (input %d); convert with "
                           ":to('bf16') or :to('f32') first", op->name, mp_dtype_name(in[k]->dtype), k + 1);
    return 0;
}

mp_tensor *mp_apply(const mp_op *op, mp_op_ctx *c, int nin, mp_tensor *const *in)
{
    if (check_storage_only(op, nin, in) || check_quantized(op, nin, in)) return NULL;
    mp_tensor *small[8] = {0}, **cast = nin <= 8 ? small : calloc((size_t)nin, sizeof *cast), *o = NULL;
    if (!cast) return mp_fail(MP_EOOM, "%s: out of memory", op->name), NULL;
    int ok = 1;
    for (int k = 0; k < nin && ok; k++)
        if (in[k] && !(cast[k] = arg_hook ? arg_hook(op, in[k]) : mp_retain(in[k]))) ok = 0;
    /* the backend of the first input may decline the op in that dtype, or lack
     * an entry it needs */
    for (int k = 0; k < nin && ok; k++) {
        if (!cast[k]) continue;
        if (cast[k]->dev == MP_CPU && mp_capturing()) {   /* engine/capture_guard.h */
            char what[96];
            snprintf(what, sizeof what, "run %s on a cpu tensor", op->name);
            ok = 0, mp_capture_refuse(what, "it would run once, now, and no replay would repeat it");
            break;
        }
        const mp_backend *be = mp_be(cast[k]);
        if (!mp_backend_has_all(be, op->needs, (int)(sizeof op->needs / sizeof *op->needs)) ||
            (be->supports && !be->supports(be->ctx, op->name, cast[k]->dtype)))
            ok = 0, mp_fail(MP_EINVAL, "%s is not available for %s tensors on %s (the backend declines it)",
                            op->name, mp_dtype_name(cast[k]->dtype), mp_device_name(cast[k]->dev));
        break;
    }
    if (ok) {
        c->op = op, c->nin = nin, c->in = cast;
        c->record = op->backward && mp_needs_grad(nin, cast);
        o = mp_checked(op->forward(c));
        mp_node *nd;
        o = mp_finish(o, op, nin, cast, &nd);
        if (nd) {   /* the node takes the kept tensors and a copy of the arguments */
            nd->saved = c->saved, nd->nsaved = c->nsaved, nd->saved_outputs = c->saved_outputs;
            c->saved = NULL, c->nsaved = 0;
            if (mp_node_stamp_saved(nd))
                mp_release(o), o = NULL;
            else if (op->args_size && !(nd->args = malloc(op->args_size)))
                mp_release(o), o = NULL, mp_fail(MP_EOOM, "out of memory recording %s", op->name);
            else if (op->args_size)
                memcpy(nd->args, mp_op_args_checked(op, c->args, op->args_size), op->args_size);
        }
        if (o && output_hook) output_hook(op, o);
    }
    for (int k = 0; k < c->nsaved; k++) mp_release(c->saved[k]);
    free(c->saved);
    c->saved = NULL, c->nsaved = 0;
    for (int k = 0; k < nin; k++) mp_release(cast[k]);
    if (cast != small) free(cast);
    return o;
}
