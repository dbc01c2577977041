/*
 * op.c: the op registry and the one path every op runs through (op.h).
 */
#include <stdlib.h>
#include <string.h>
#include "engine/op.h"
#include "engine/observe.h"
#include "engine/error.h"

#define MAX_OPS 256

static const mp_op *registry[MAX_OPS];
static int nregistered;

/* called by constructors while the library loads: too early to report an
 * error, so the capacity is checked by a test (tests/c/test_ops.c) */
void mp_op_register(const mp_op *op)
{
    if (nregistered < MAX_OPS) registry[nregistered++] = op;
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

int mp_keep(mp_ctx *c, int slot, mp_tensor *t)
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

int mp_keep_output(mp_ctx *c, int slot, mp_tensor *out)
{
    if (!c->record) return 0;
    mp_tensor *d = mp_detached(out);
    if (!d) return -1;
    int rc = mp_keep(c, slot, d);
    mp_release(d);
    return rc;
}

mp_tensor *mp_finish(mp_tensor *o, const mp_op *op, int nin, mp_tensor *const *ins, mp_node **node)
{
    *node = NULL;
    if (o && mp_record(o, op, nin, ins, node)) {
        mp_release(o);
        return NULL;
    }
    return o;
}

mp_tensor *mp_apply(const mp_op *op, mp_ctx *c, int nin, mp_tensor *const *in)
{
    mp_tensor *small[8] = {0}, **cast = nin <= 8 ? small : calloc((size_t)nin, sizeof *cast), *o = NULL;
    if (!cast) return mp_fail(MP_EOOM, "%s: out of memory", op->name), NULL;
    int ok = 1;
    for (int k = 0; k < nin && ok; k++)
        if (in[k] && !(cast[k] = mp_autocast_arg(op, in[k]))) ok = 0;
    /* the backend of the first input may decline the op in that dtype, or lack
     * an entry it needs */
    for (int k = 0; k < nin && ok; k++) {
        if (!cast[k]) continue;
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
        if (o && mp_observing()) mp_observe(op->name, false, 0, o);
        if (nd) {   /* the node takes the scalars and the kept tensors */
            memcpy(nd->f, c->f, sizeof nd->f);
            memcpy(nd->i, c->i, sizeof nd->i);
            nd->saved = c->saved, nd->nsaved = c->nsaved;
            c->saved = NULL, c->nsaved = 0;
        }
    }
    for (int k = 0; k < c->nsaved; k++) mp_release(c->saved[k]);
    free(c->saved);
    c->saved = NULL, c->nsaved = 0;
    for (int k = 0; k < nin; k++) mp_release(cast[k]);
    if (cast != small) free(cast);
    return o;
}
