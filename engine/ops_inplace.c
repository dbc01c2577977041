/*
 * ops_inplace.c: the in-place ops (add_, mul_, exp_, clamp_, fill_, ...), all
 * through one mechanism: the op runs out of place, as usual (autocast, the
 * backend's checks, and, when a gradient is wanted, its node), and its result
 * is written into self's storage, whose version goes up. So every in-place op
 * has the same dtypes, kernels and gradient as its out-of-place twin, at the
 * cost of one temporary and one copy (without autograd, add_, sub_, mul_ and
 * div_ of one float dtype skip both: direct(), below).
 *
 * Autograd, as PyTorch:
 *   - grad mode, self a leaf that requires grad: refused (the leaf's .grad
 *     would be the gradient of a value it no longer holds). Under no_grad it is
 *     allowed: that is how weights are initialised.
 *   - grad mode, self with history (or other requires grad): the op's node
 *     becomes self's grad_fn (the history is rebased): self now stands for the
 *     result. Where the node kept self's storage for its backward (mul_ keeps
 *     the old self for other's gradient), that tensor is cloned first, as
 *     PyTorch's in-place derivatives keep "original self".
 *   - grad mode, self's storage shared by a view recorded for autograd (a
 *     reshape or narrow of a tensor that requires grad, or the tensor such a
 *     view was taken of): refused. The other header's history would not learn
 *     of the write (PyTorch rewrites it with CopySlices; this engine does not).
 *   - any mode: a node that saved self's storage earlier finds its version
 *     changed when its backward runs, and fails naming its op (graph.h).
 */
#include <stdlib.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"
#include "engine/state.h"

/* how the result is computed: one of the kinds below */
typedef struct {
    enum { BIN, BIN_SCALAR, UNARY, CLAMP, FILL } kind;
    mp_binop bop;
    mp_unop uop;
    mp_tensor *other;
    double s;
    const double *lo, *hi;
} how;

static mp_tensor *fill_fwd(mp_op_ctx *c);
static int fill_backward(mp_node *n, mp_tensor *g, mp_tensor **gin);
typedef struct { double v; } fill_args;
/* fill_ on a tensor with history: a node whose gradient to that history is
 * zero (no gradient at all: the walk sends nothing down the edge) */
static const mp_op fill_op = {.name = "fill_", .nin = 1, .forward = fill_fwd, .backward = fill_backward,
                              .args_size = sizeof(fill_args)};
MP_OP_REGISTER(fill_op);

static mp_tensor *fill_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0];
    return mp_full(x->dtype, x->dev, x->ndim, x->shape, MP_OP_ARGS(c, fill_args)->v);
}

static int fill_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    (void)n, (void)g;
    gin[0] = NULL;
    return 0;
}

static mp_tensor *compute(const how *h, mp_tensor *self)
{
    switch (h->kind) {
    case BIN: return mp_binary(h->bop, self, h->other);
    case BIN_SCALAR: return mp_binary_scalar(h->bop, self, h->s, 0);
    case UNARY: return mp_unary(h->uop, self, h->s);
    case CLAMP: return mp_clamp(self, h->lo, h->hi);
    case FILL: {
        fill_args a = {h->s};
        mp_op_ctx c = {.args = &a};
        return mp_apply(&fill_op, &c, 1, &self);
    }
    }
    return mp_fail(MP_EINVAL, "bad in-place op"), NULL;
}

/* a raw copy of t (not recorded) */
static mp_tensor *copy_of(mp_tensor *t)
{
    mp_tensor *c = mp_empty(t->dtype, t->dev, t->ndim, t->shape);
    if (c) MP_K(c, copy, mp_data(c), mp_data(t), mp_nbytes(t));
    return c;
}

/* the nodes recorded for this op (sequence >= first) that kept self's storage
 * for their backward keep a copy instead: the write must not change them */
static int protect_saved(mp_node *n, const mp_storage *st, uint64_t first)
{
    if (!n || n->seq < first) return 0;
    for (int k = 0; k < n->nsaved; k++) {
        mp_tensor *t = n->saved[k];
        if (!t || t->st != st) continue;
        mp_tensor *c = copy_of(t);
        if (!c) return -1;
        mp_release(t);
        n->saved[k] = c;
        if (n->saved_version) n->saved_version[k] = c->st->version;
    }
    for (int i = 0; i < n->nin; i++)
        if (protect_saved(n->in[i].node, st, first)) return -1;
    return 0;
}

/* The common case without autograd (a manual update under no_grad, a mask on
 * activations in eval): add, sub, mul, div of a float self by a number or by a
 * tensor of its dtype and device that does not share its storage, run by the
 * op's kernel straight into self: no temporary, no copy. The same kernel on the
 * same values as the general path (these ops' autocast class, promote, changes
 * nothing for one dtype), so the same bits. true: done; false: take the general
 * path (which also reports every error). */
static bool direct(mp_tensor *self, const how *h)
{
    static const char *const names[] = {"add", "sub", "mul", "div"};   /* the ops' names, for supports */
    if (h->kind != BIN && h->kind != BIN_SCALAR) return false;
    if (h->bop > MP_DIV || !mp_is_float(self->dtype) || mp_is_storage_only(self->dtype) ||
        self->quant.kind != MP_QUANT_NONE)
        return false;   /* FP8: mp_apply's refusal, on the general path */
    if (mp_grad_enabled() && (self->requires_grad || (h->kind == BIN && h->other->requires_grad))) return false;
    const mp_backend *be = mp_be(self);
    const char *name = h->kind == BIN_SCALAR && h->bop == MP_SUB ? "add" : names[h->bop];   /* x - s is x + -s */
    if (be->supports && !be->supports(be->ctx, name, self->dtype)) return false;
    if (h->kind == BIN_SCALAR) {
        mp_unop u = h->bop == MP_MUL ? MP_MULS : h->bop == MP_DIV ? MP_DIVS : MP_ADDS;
        MP_K(self, unary, u, self->dtype, mp_data(self), mp_data(self), self->numel, h->bop == MP_SUB ? -h->s : h->s);
        return true;
    }
    mp_tensor *o = h->other;
    mp_bcast bc;
    if (o->dtype != self->dtype || o->dev != self->dev || o->st == self->st || o->quant.kind != MP_QUANT_NONE ||
        o->ndim > self->ndim || mp_broadcast(self, o, &bc))
        return mp_clear_error(), false;
    for (int d = 0; d < self->ndim; d++)
        if (bc.shape[d] != self->shape[d]) return false;
    MP_K(self, binary, h->bop, self->dtype, mp_data(self), mp_data(self), mp_data(o), &bc);
    return true;
}

static int inplace(mp_tensor *self, const how *h)
{
    if (direct(self, h)) {
        self->st->version++;
        return mp_device_error(self->dev);
    }
    bool grad = mp_grad_enabled();
    if (self->quant.kind != MP_QUANT_NONE)
        return mp_fail(MP_EINVAL, "a quantized tensor (%s) cannot be written in place", mp_quant_name(self->quant.kind));
    if (grad && self->requires_grad && !self->grad_fn)
        return mp_fail(MP_EINVAL, "a leaf tensor that requires grad is used in an in-place operation (do it inside "
                                  "mp.no_grad(), as when initialising weights, or on a clone())");
    uint64_t first = mp_state_get()->next_seq;
    mp_tensor *r = compute(h, self);
    if (!r) return -1;
    char b1[128], b2[128];
    int rc = 0;
    if (!mp_same_shape(r, self))
        rc = mp_fail(MP_EINVAL, "the result's shape %s differs from self's %s (the other operand broadcasts into "
                                "self's shape only)", mp_shape_str(r->ndim, r->shape, b1, sizeof b1),
                     mp_shape_str(self->ndim, self->shape, b2, sizeof b2));
    else if (mp_is_float(r->dtype) && !mp_is_float(self->dtype))
        rc = mp_fail(MP_EINVAL, "the result is %s, which an %s tensor cannot hold (convert self to a float dtype "
                                "first)", mp_dtype_name(r->dtype), mp_dtype_name(self->dtype));
    else if (r->grad_fn && self->st->grad_view && self->st->refs > 1)
        /* another header over this storage (a view, or the tensor it was taken
         * from) would take the values without the history: PyTorch carries the
         * write into the other tensor's graph (CopySlices); this engine refuses */
        rc = mp_fail(MP_EINVAL, "in grad mode, self shares its storage with a view recorded for autograd (reshape, "
                                "narrow, ... of another tensor): the other tensor's history would not "
                                "see the write; work on a clone(), or inside mp.no_grad()");
    if (rc == 0 && r->grad_fn && r->dtype != self->dtype) {   /* the history goes through the cast back */
        mp_tensor *c = mp_to(r, self->dtype, self->dev);
        mp_release(r);
        if (!(r = c)) return -1;
    }
    if (rc == 0 && r->grad_fn) rc = protect_saved(r->grad_fn, self->st, first);
    if (rc == 0) {
        mp_tensor *c = r->dtype == self->dtype ? mp_retain(r) : mp_to_raw(r, self->dtype, self->dev);
        if (!c) rc = -1;
        else MP_K(self, copy, mp_data(self), mp_data(c), mp_nbytes(self));
        mp_release(c);
    }
    if (rc == 0) {
        self->st->version++;
        if (r->grad_fn) {   /* rebase: self is now the op's result */
            mp_node *old = self->grad_fn;
            self->grad_fn = r->grad_fn;
            r->grad_fn->refs++;
            self->requires_grad = true;
            mp_node_release(old);
        }
    }
    mp_release(r);
    return rc == 0 ? mp_device_error(self->dev) : rc;
}

int mp_binary_(mp_binop op, mp_tensor *self, mp_tensor *other)
{
    if (op > MP_POWT) return mp_fail(MP_EINVAL, "bad in-place op (comparisons have none)");
    how h = {.kind = BIN, .bop = op, .other = other};
    return inplace(self, &h);
}

int mp_binary_scalar_(mp_binop op, mp_tensor *self, double s)
{
    if (op > MP_POWT) return mp_fail(MP_EINVAL, "bad in-place op (comparisons have none)");
    how h = {.kind = BIN_SCALAR, .bop = op, .s = s};
    return inplace(self, &h);
}

int mp_unary_(mp_unop op, mp_tensor *self, double p)
{
    how h = {.kind = UNARY, .uop = op, .s = p};
    return inplace(self, &h);
}

int mp_clamp_(mp_tensor *self, const double *lo, const double *hi)
{
    how h = {.kind = CLAMP, .lo = lo, .hi = hi};
    return inplace(self, &h);
}

int mp_fill_(mp_tensor *self, double v)
{
    if (mp_check_value(self->dtype, v)) return -1;
    /* nothing to record: the kernel writes self directly */
    if (!(mp_grad_enabled() && self->requires_grad) && self->quant.kind == MP_QUANT_NONE) {
        MP_K(self, fill, mp_data(self), self->dtype, self->numel, v);
        self->st->version++;
        return mp_device_error(self->dev);
    }
    how h = {.kind = FILL, .s = v};
    return inplace(self, &h);
}
