/*
 * ops_nn.c: the functional ops of neural networks, each with its backward:
 * softmax, log_softmax, cross_entropy (fused with log-softmax), mse_loss,
 * layer_norm, rms_norm, embedding, dropout, cat and where.
 *
 * Second derivatives (create_graph, engine/backward.h): a plain backward runs
 * with grad mode off and calls the fused kernels (softmax_grad,
 * cross_entropy_grad, layer_norm_grad), untouched. When a backward runs with
 * grad mode on (create_graph), softmax, log_softmax, cross_entropy,
 * layer_norm and rms_norm write the same first derivative with ops that
 * record instead (the "*_backward_ops" functions), so the gradient can be
 * differentiated again with respect to the inputs and to the incoming
 * gradient. They use the first-derivative formula rather than a recomputed
 * forward differentiated by mp_autograd_grad: a handful of elementwise ops
 * and row sums, no second walk. cat's and where's backwards are made of
 * recording ops already; mse_loss, embedding and dropout are composites.
 */
#include <math.h>
#include <string.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"
#include "engine/graph.h"

/* ---- the temporaries of a gradient written with recording ops ----
 * Each op's result is held in the scratch and released at the end; an op
 * given a NULL (an earlier step failed, its error set) gives NULL, so a
 * formula is written as one expression and checked once. */

#define SCRATCH_CAP 32
typedef struct { mp_tensor *t[SCRATCH_CAP]; int n; } scratch;

static mp_tensor *hold(scratch *s, mp_tensor *t)
{
    if (!t) return NULL;
    if (s->n == SCRATCH_CAP) {   /* a formula with more steps than the scratch: a programming error */
        mp_release(t);
        return mp_fail(MP_EINVAL, "a gradient formula of ops_nn.c holds more than %d temporaries", SCRATCH_CAP), NULL;
    }
    return s->t[s->n++] = t;
}
static mp_tensor *bin(scratch *s, mp_binop op, mp_tensor *a, mp_tensor *b)
{
    return a && b ? hold(s, mp_binary(op, a, b)) : NULL;
}
static mp_tensor *un(scratch *s, mp_unop op, mp_tensor *a, double p) { return a ? hold(s, mp_unary(op, a, p)) : NULL; }
/* op along dim (user numbering), the dim kept for broadcasting */
static mp_tensor *along(scratch *s, mp_redop op, mp_tensor *a, int dim)
{
    return a ? hold(s, mp_reduce(op, a, dim, 1)) : NULL;
}
static mp_tensor *cast(scratch *s, mp_tensor *a, mp_dtype dt) { return a ? hold(s, mp_to(a, dt, a->dev)) : NULL; }
/* r (held by s, or NULL) as a new reference, everything else released */
static mp_tensor *scratch_end(scratch *s, mp_tensor *r)
{
    if (r) mp_retain(r);
    while (s->n) mp_release(s->t[--s->n]);
    return r;
}

/* the dtype the fused kernels compute in: f32 for the half types (they load
 * rows into f32 and round once), the input's own when it is wider */
static mp_dtype wide(mp_dtype dt) { return dt == MP_F16 || dt == MP_BF16 ? MP_F32 : dt; }

static int need_float(const mp_tensor *t, const char *what)
{
    if (mp_is_float(t->dtype)) return 0;
    return mp_fail(MP_EINVAL, "%s must be a float tensor (got %s)", what, mp_dtype_name(t->dtype));
}

/* the dtype of the row statistics the kernels keep (log-sum-exp, loss, mean,
 * rstd, the weight's sums): f32, or f64 for f64 inputs, whose kernels compute
 * them in double (kernels/cpu/cpu_f64.h) and whose gradients must not round */
static mp_dtype stats_dtype(const mp_tensor *x) { return x->dtype == MP_F64 ? MP_F64 : MP_F32; }

static void split(const mp_tensor *t, int k, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = *inner = 1;
    *n = t->shape[k];
    for (int d = 0; d < t->ndim; d++) {
        if (d < k) *outer *= t->shape[d];
        if (d > k) *inner *= t->shape[d];
    }
}

/* ---- softmax / log_softmax ---- */

typedef struct {
    int dim;                       /* given: 1-based, negative from the end */
    bool log;                      /* log_softmax */
    int64_t outer, n, inner;       /* set by the forward: the {outer, n, inner} view */
} softmax_args;

/* create_graph: the kernel's formulas with recording ops on the output y
 * (attached to this node again, so they differentiate through softmax):
 * softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g) */
static int softmax_backward_ops(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    const softmax_args *a = MP_NODE_ARGS(nd, softmax_args);
    scratch s = {0};
    mp_dtype dt = wide(g->dtype);
    mp_tensor *y = cast(&s, nd->saved[0], dt), *gw = cast(&s, g, dt), *r;
    if (a->log) r = bin(&s, MP_SUB, gw, bin(&s, MP_MUL, un(&s, MP_EXP, y, 0), along(&s, MP_SUM, gw, a->dim)));
    else r = bin(&s, MP_MUL, y, bin(&s, MP_SUB, gw, along(&s, MP_SUM, bin(&s, MP_MUL, gw, y), a->dim)));
    gin[0] = scratch_end(&s, cast(&s, r, g->dtype));
    return gin[0] ? 0 : -1;
}

static int softmax_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    if (mp_grad_enabled()) return softmax_backward_ops(nd, g, gin);
    mp_tensor *y = nd->saved[0], *r = mp_empty(g->dtype, g->dev, g->ndim, g->shape);
    if (!r) return -1;
    const softmax_args *a = MP_NODE_ARGS(nd, softmax_args);
    if (MP_K(r, softmax_grad, g->dtype, mp_data(r), mp_data(g), mp_data(y), a->outer, a->n, a->inner, a->log)) {
        mp_release(r);
        return mp_kernel_oom(nd->name);
    }
    gin[0] = r;
    return 0;
}

static mp_tensor *softmax_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0];
    softmax_args *a = MP_OP_ARGS(c, softmax_args);
    int k, log = a->log;
    if (need_float(x, "input") || mp_dim(x, a->dim, &k)) return NULL;
    int64_t outer, n, inner;
    split(x, k, &outer, &n, &inner);
    a->outer = outer, a->n = n, a->inner = inner;
    mp_tensor *y = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    if (y && MP_K(y, softmax, x->dtype, mp_data(y), mp_data(x), outer, n, inner, log))
        mp_release(y), y = NULL, mp_kernel_oom(c->op->name);
    if (y && mp_keep_output(c, 0, y)) mp_release(y), y = NULL;
    return y;
}

static const mp_op softmax_op = {.name = "softmax", .ac = MP_AC_F32, .nin = 1, .forward = softmax_fwd,
                                 .backward = softmax_backward, .args_size = sizeof(softmax_args),
                                 .double_backward = true};
static const mp_op log_softmax_op = {.name = "log_softmax", .ac = MP_AC_F32, .nin = 1, .forward = softmax_fwd,
                                     .backward = softmax_backward, .args_size = sizeof(softmax_args),
                                     .double_backward = true};
MP_OP_REGISTER(softmax_op);
MP_OP_REGISTER(log_softmax_op);

mp_tensor *mp_softmax(mp_tensor *x, int dim, int log)
{
    softmax_args args = {.dim = dim, .log = log != 0};
    mp_op_ctx c = {.args = &args};
    return mp_apply(log ? &log_softmax_op : &softmax_op, &c, 1, &x);
}

/* ---- cross_entropy ---- */

typedef struct {
    mp_reduction red;
    int64_t rows, classes;         /* set by the forward */
} cross_entropy_args;

/* create_graph: (softmax(x) - onehot(target)) * g, over the rows for the
 * mean, with recording ops: softmax recomputed from the saved logits (the
 * saved log-sum-exp is not differentiable), the one-hot rows a comparison of
 * the targets with 0..classes-1 (a constant: targets have no gradient) */
static int ce_backward_ops(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *target = nd->saved[1];
    const cross_entropy_args *a = MP_NODE_ARGS(nd, cross_entropy_args);
    scratch s = {0};
    mp_dtype dt = wide(x->dtype);
    int64_t shape[MP_MAXDIM];   /* the targets' shape and a 1: one column per row */
    memcpy(shape, target->shape, sizeof(int64_t) * (size_t)target->ndim);
    shape[target->ndim] = 1;
    mp_tensor *column = hold(&s, mp_reshape(target, target->ndim + 1, shape));
    mp_tensor *classes = hold(&s, mp_arange(a->classes, MP_I32, x->dev));
    mp_tensor *hit = bin(&s, MP_EQ, column, classes), *onehot = hit ? hold(&s, mp_to_raw(hit, dt, x->dev)) : NULL;
    mp_tensor *p = cast(&s, x, dt);
    p = p ? hold(&s, mp_softmax(p, -1, 0)) : NULL;
    mp_tensor *scale = cast(&s, g, dt);   /* each row's factor */
    if (scale && a->red == MP_REDUCE_NONE) scale = hold(&s, mp_reshape(scale, target->ndim + 1, shape));
    else if (a->red == MP_REDUCE_MEAN) scale = un(&s, MP_DIVS, scale, (double)a->rows);
    mp_tensor *r = bin(&s, MP_MUL, bin(&s, MP_SUB, p, onehot), scale);
    gin[0] = scratch_end(&s, cast(&s, r, x->dtype));
    return gin[0] ? 0 : -1;
}

static int ce_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    if (mp_grad_enabled()) return ce_backward_ops(nd, g, gin);
    mp_tensor *x = nd->saved[0], *target = nd->saved[1], *lse = nd->saved[2];
    const cross_entropy_args *a = MP_NODE_ARGS(nd, cross_entropy_args);
    int64_t rows = a->rows, classes = a->classes;
    mp_reduction red = a->red;
    /* each row's factor: the incoming gradient, over rows for the mean */
    mp_tensor *g32 = mp_to_raw(g, stats_dtype(x), g->dev), *scale;
    if (!g32) return -1;
    if (red == MP_REDUCE_NONE) {
        scale = mp_retain(g32);
    } else {
        scale = mp_expand(g32, 1, &rows);
        if (scale && red == MP_REDUCE_MEAN) {
            mp_tensor *s = mp_unary(MP_DIVS, scale, (double)rows);
            mp_release(scale);
            scale = s;
        }
    }
    mp_release(g32);
    if (!scale) return -1;
    mp_tensor *r = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    if (r && MP_K(r, cross_entropy_grad, x->dtype, mp_data(r), mp_data(x), mp_data(lse), mp_data(target),
                  mp_data(scale), rows, classes))
        mp_release(r), r = NULL, mp_kernel_oom(nd->name);
    mp_release(scale);
    gin[0] = r;
    return r ? 0 : -1;
}

static mp_tensor *cross_entropy_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *target = c->in[1];
    cross_entropy_args *args = MP_OP_ARGS(c, cross_entropy_args);
    mp_reduction red = args->red;
    char b1[128], b2[128];
    if (need_float(x, "logits")) return NULL;
    if (target->dtype != MP_I32)
        return mp_fail(MP_EINVAL, "targets must be i32 class indices (got %s)", mp_dtype_name(target->dtype)), NULL;
    if (x->dev != target->dev)
        return mp_fail(MP_EINVAL, "logits are on %s, targets on %s", mp_device_name(x->dev),
                       mp_device_name(target->dev)), NULL;
    bool ok = x->ndim >= 1 && target->ndim == x->ndim - 1;
    for (int d = 0; ok && d < target->ndim; d++) ok = target->shape[d] == x->shape[d];
    if (!ok)
        return mp_fail(MP_EINVAL, "logits %s and targets %s do not match (targets must be the logits' "
                                  "shape without the last dim)",
                       mp_shape_str(x->ndim, x->shape, b1, sizeof b1),
                       mp_shape_str(target->ndim, target->shape, b2, sizeof b2)), NULL;
    int64_t classes = x->shape[x->ndim - 1], rows = x->numel / classes;
    if (mp_check_indices(target, classes, "target")) return NULL;
    mp_dtype sd = stats_dtype(x);
    mp_tensor *loss = mp_empty(sd, x->dev, 1, &rows), *lse = mp_empty(sd, x->dev, 1, &rows), *o = NULL;
    if (loss && lse && MP_K(x, cross_entropy, x->dtype, mp_data(loss), mp_data(lse), mp_data(x), mp_data(target),
                            rows, classes)) {
        mp_kernel_oom(c->op->name);
    } else if (loss && lse) {
        if (red == MP_REDUCE_NONE) o = mp_reshape(loss, target->ndim, target->shape);
        else o = mp_reduce(red == MP_REDUCE_MEAN ? MP_MEAN : MP_SUM, loss, 0, 0);
    }
    mp_release(loss);
    args->rows = rows, args->classes = classes;
    if (o && (mp_keep(c, 0, x) || mp_keep(c, 1, target) || mp_keep(c, 2, lse))) mp_release(o), o = NULL;
    mp_release(lse);
    return o;
}

/* the targets are an input without a gradient (integers cut the graph).
 * widens_itself: the kernels read 16-bit logits and sum in f32 (the loss and
 * the row's log-sum-exp are f32), and write dlogits in the logits' dtype from
 * the same f32 values, so under autocast the f16/bf16 logits of a large
 * vocabulary are neither copied to f32 forward nor given an f32 gradient
 * backward (two {rows, vocab} f32 tensors that were both alive during the
 * backward), with the values of the cast: the same loss, and the gradient
 * rounded once to the logits' dtype as the cast's backward rounded it */
static const mp_op cross_entropy_op = {.name = "cross_entropy", .ac = MP_AC_F32, .nin = 2,
                                       .forward = cross_entropy_fwd, .backward = ce_backward,
                                       .args_size = sizeof(cross_entropy_args), .double_backward = true,
                                       .widens_itself = true};
MP_OP_REGISTER(cross_entropy_op);

mp_tensor *mp_cross_entropy(mp_tensor *x, mp_tensor *target, mp_reduction red)
{
    cross_entropy_args args = {.red = red};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[2] = {x, target};
    return mp_apply(&cross_entropy_op, &c, 2, in);
}

/* ---- mse_loss: mean((a - b)^2), composed so autograd follows ---- */

static mp_tensor *mse_loss_fwd(mp_op_ctx *c)
{
    mp_tensor *a = c->in[0], *b = c->in[1];
    char b1[128], b2[128];
    if (!mp_same_shape(a, b))
        return mp_fail(MP_EINVAL, "shapes %s and %s differ", mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                       mp_shape_str(b->ndim, b->shape, b2, sizeof b2)), NULL;
    if (need_float(a, "input") || need_float(b, "target")) return NULL;
    mp_tensor *d = mp_binary(MP_SUB, a, b), *sq = d ? mp_unary(MP_POW, d, 2) : NULL;
    mp_tensor *m = sq ? mp_reduce(MP_MEAN, sq, 0, 0) : NULL;
    mp_release(d);
    mp_release(sq);
    return m;
}

/* composed of ops that record themselves: no backward of its own */
static const mp_op mse_loss_op = {.name = "mse_loss", .ac = MP_AC_F32, .nin = 2, .forward = mse_loss_fwd};
MP_OP_REGISTER(mse_loss_op);

mp_tensor *mp_mse_loss(mp_tensor *a, mp_tensor *b)
{
    mp_op_ctx c = {0};
    mp_tensor *in[2] = {a, b};
    return mp_apply(&mse_loss_op, &c, 2, in);
}

/* ---- layer_norm and rms_norm over the last dim ---- */

/* rms_norm is layer norm without centring: the same kernels with mean NULL
 * (kernels/backend.h), the same backward, no bias input */
typedef struct { double eps; } layer_norm_args;
typedef layer_norm_args rms_norm_args;

/* create_graph: the kernel's formulas (kernels/cpu/cpu_nn.c) with recording
 * ops, the statistics recomputed from x (the saved ones are not
 * differentiable) in the kernel's dtype:
 *   xhat = (x - mean) * rstd, rstd = 1 / sqrt(mean((x - mean)^2) + eps)
 *   gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)),
 *   gw = sum g * xhat, gb = sum g   (rows summed);
 * RMS norm: no centring (mean 0) and no mean(g*w) term */
static int ln_backward_ops(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *w = nd->saved[1];
    bool centred = nd->saved[2] != NULL;   /* the mean is kept by layer_norm, not by rms_norm */
    double eps = MP_NODE_ARGS(nd, layer_norm_args)->eps;
    int64_t n = x->shape[x->ndim - 1];
    scratch s = {0};
    mp_dtype dt = wide(x->dtype);
    mp_tensor *xf = cast(&s, x, dt), *xc = xf;
    if (centred) xc = bin(&s, MP_SUB, xf, along(&s, MP_MEAN, xf, -1));
    mp_tensor *var = along(&s, MP_MEAN, bin(&s, MP_MUL, xc, xc), -1);
    mp_tensor *rstd = un(&s, MP_RDIVS, un(&s, MP_SQRT, un(&s, MP_ADDS, var, eps), 0), 1);
    mp_tensor *xhat = bin(&s, MP_MUL, xc, rstd), *gf = cast(&s, g, dt);
    mp_tensor *gw = w ? bin(&s, MP_MUL, gf, cast(&s, w, dt)) : gf;
    mp_tensor *t = bin(&s, MP_SUB, gw, bin(&s, MP_MUL, xhat, along(&s, MP_MEAN, bin(&s, MP_MUL, gw, xhat), -1)));
    if (centred) t = bin(&s, MP_SUB, t, along(&s, MP_MEAN, gw, -1));
    mp_tensor *gx = cast(&s, bin(&s, MP_MUL, rstd, t), x->dtype);
    int rc = gx ? 0 : -1;
    for (int i = 1; i < nd->nin && rc == 0; i++) {   /* weight: sum g * xhat; bias: sum g */
        if (!mp_edge_wants(nd, i)) continue;
        mp_tensor *rows = i == 1 ? bin(&s, MP_MUL, gf, xhat) : gf;
        mp_tensor *sum = rows ? cast(&s, hold(&s, mp_sum_to(rows, 1, &n)), nd->in[i].dtype) : NULL;
        if (!sum) rc = -1;
        else gin[i] = mp_retain(sum);
    }
    gin[0] = rc == 0 ? mp_retain(gx) : NULL;
    scratch_end(&s, NULL);
    return rc;
}

static int ln_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    if (mp_grad_enabled()) return ln_backward_ops(nd, g, gin);
    mp_tensor *x = nd->saved[0], *w = nd->saved[1], *mean = nd->saved[2], *rstd = nd->saved[3];
    int64_t n = x->shape[x->ndim - 1], rows = x->numel / n;
    bool ww = nd->nin > 1 && mp_edge_wants(nd, 1), wb = nd->nin > 2 && mp_edge_wants(nd, 2);
    mp_tensor *gx = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    mp_dtype sd = stats_dtype(x);
    mp_tensor *gw = ww ? mp_empty(sd, x->dev, 1, &n) : NULL, *gb = wb ? mp_empty(sd, x->dev, 1, &n) : NULL;
    int rc = -1;
    if (gx && (!ww || gw) && (!wb || gb) &&
        MP_K(x, layer_norm_grad, x->dtype, mp_data(gx), gw ? mp_data(gw) : NULL, gb ? mp_data(gb) : NULL,
             mp_data(g), mp_data(x), mean ? mp_data(mean) : NULL, mp_data(rstd), w ? mp_data(w) : NULL, rows, n)) {
        mp_kernel_oom(nd->name);
    } else if (gx && (!ww || gw) && (!wb || gb)) {
        gin[0] = mp_retain(gx);
        rc = 0;
        if (gw && !(gin[1] = mp_to_raw(gw, nd->in[1].dtype, x->dev))) rc = -1;
        if (gb && !(gin[2] = mp_to_raw(gb, nd->in[2].dtype, x->dev))) rc = -1;
    }
    mp_release(gx), mp_release(gw), mp_release(gb);
    return rc;
}

/* layer norm, or RMS norm when not centred (no bias, no mean) */
static mp_tensor *norm_fwd(mp_op_ctx *c, bool centred)
{
    mp_tensor *x = c->in[0], *w = c->in[1], *b = centred ? c->in[2] : NULL;
    double eps = MP_OP_ARGS(c, layer_norm_args)->eps;
    char b1[128], b2[128];
    if (need_float(x, "input")) return NULL;
    if (x->ndim < 1) return mp_fail(MP_EINVAL, "input must have at least one dim"), NULL;
    int64_t n = x->shape[x->ndim - 1], rows = x->numel / n;
    mp_tensor *pw[2] = {w, b};
    const char *what[2] = {"weight", "bias"};
    for (int i = 0; i < 2; i++) {
        mp_tensor *p = pw[i];
        if (!p) continue;
        if (p->ndim != 1 || p->shape[0] != n)
            return mp_fail(MP_EINVAL, "%s %s does not match input %s (expected {%lld})", what[i],
                           mp_shape_str(p->ndim, p->shape, b1, sizeof b1),
                           mp_shape_str(x->ndim, x->shape, b2, sizeof b2), (long long)n), NULL;
        if (p->dtype != x->dtype || p->dev != x->dev)
            return mp_fail(MP_EINVAL, "%s is %s on %s, input %s on %s", what[i], mp_dtype_name(p->dtype),
                           mp_device_name(p->dev), mp_dtype_name(x->dtype), mp_device_name(x->dev)), NULL;
    }
    if (!(eps > 0) || !isfinite(eps)) return mp_fail(MP_EINVAL, "eps must be positive (got %g)", eps), NULL;
    mp_tensor *y = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    mp_dtype sd = stats_dtype(x);
    mp_tensor *mean = centred ? mp_empty(sd, x->dev, 1, &rows) : NULL, *rstd = mp_empty(sd, x->dev, 1, &rows);
    if (!y || (centred && !mean) || !rstd)
        mp_release(y), y = NULL;
    else if (MP_K(x, layer_norm, x->dtype, mp_data(y), mean ? mp_data(mean) : NULL, mp_data(rstd), mp_data(x),
                  w ? mp_data(w) : NULL, b ? mp_data(b) : NULL, rows, n, (float)eps))
        mp_release(y), y = NULL, mp_kernel_oom(c->op->name);
    if (y && (mp_keep(c, 0, x) || mp_keep(c, 1, w) || mp_keep(c, 2, mean) || mp_keep(c, 3, rstd)))
        mp_release(y), y = NULL;
    mp_release(mean), mp_release(rstd);
    return y;
}

static mp_tensor *layer_norm_fwd(mp_op_ctx *c) { return norm_fwd(c, true); }
static mp_tensor *rms_norm_fwd(mp_op_ctx *c) { return norm_fwd(c, false); }

static const mp_op layer_norm_op = {.name = "layer_norm", .ac = MP_AC_F32, .nin = 3, .forward = layer_norm_fwd,
                                    .backward = ln_backward, .args_size = sizeof(layer_norm_args),
                                    .double_backward = true};
MP_OP_REGISTER(layer_norm_op);
static const mp_op rms_norm_op = {.name = "rms_norm", .ac = MP_AC_F32, .nin = 2, .forward = rms_norm_fwd,
                                  .backward = ln_backward, .args_size = sizeof(rms_norm_args),
                                  .double_backward = true};
MP_OP_REGISTER(rms_norm_op);

mp_tensor *mp_layer_norm(mp_tensor *x, mp_tensor *w, mp_tensor *b, double eps)
{
    layer_norm_args args = {eps};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[3] = {x, w, b};
    return mp_apply(&layer_norm_op, &c, 3, in);
}

mp_tensor *mp_rms_norm(mp_tensor *x, mp_tensor *w, double eps)
{
    rms_norm_args args = {eps};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[2] = {x, w};
    return mp_apply(&rms_norm_op, &c, 2, in);
}

/* ---- embedding: rows of w at i32 indices of any shape ---- */

static mp_tensor *embedding_fwd(mp_op_ctx *c)
{
    mp_tensor *idx = c->in[0], *w = c->in[1];
    char b1[128];
    if (w->ndim != 2)
        return mp_fail(MP_EINVAL, "weight must be 2-d {n, d} (got %s)", mp_shape_str(w->ndim, w->shape, b1, sizeof b1)), NULL;
    if (idx->dtype != MP_I32)
        return mp_fail(MP_EINVAL, "indices must be i32 (got %s)", mp_dtype_name(idx->dtype)), NULL;
    if (idx->ndim + 1 > MP_MAXDIM) return mp_fail(MP_EINVAL, "indices have too many dims"), NULL;
    int64_t flat = idx->numel, shape[MP_MAXDIM];
    mp_tensor *f = mp_view(idx, 1, &flat, idx->offset);
    mp_tensor *rows = f ? mp_index_select(w, 1, f) : NULL, *r = NULL;
    mp_release(f);
    if (rows) {
        memcpy(shape, idx->shape, sizeof(int64_t) * idx->ndim);
        shape[idx->ndim] = w->shape[1];
        r = mp_reshape(rows, idx->ndim + 1, shape);
    }
    mp_release(rows);
    return r;
}

/* an index_select and a reshape, which record themselves */
static const mp_op embedding_op = {.name = "embedding", .nin = 2, .forward = embedding_fwd};
MP_OP_REGISTER(embedding_op);

mp_tensor *mp_embedding(mp_tensor *idx, mp_tensor *w)
{
    mp_op_ctx c = {0};
    mp_tensor *in[2] = {idx, w};
    return mp_apply(&embedding_op, &c, 2, in);
}

/* ---- dropout: x * mask, the mask 1/(1-p) where kept and 0 where dropped ---- */

typedef struct { double p; bool training; } dropout_args;

static mp_tensor *dropout_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0];
    const dropout_args *a = MP_OP_ARGS(c, dropout_args);
    double p = a->p;
    bool training = a->training;
    if (!(p >= 0 && p <= 1)) return mp_fail(MP_EINVAL, "p must be in [0, 1] (got %g)", p), NULL;
    if (need_float(x, "input")) return NULL;
    if (!training || p == 0) return mp_retain(x);
    mp_tensor *mask;
    if (p == 1) mask = mp_full(x->dtype, x->dev, x->ndim, x->shape, 0);
    else {
        mp_tensor *u = mp_rand(MP_F32, x->dev, x->ndim, x->shape);
        mask = u ? mp_unary(MP_DROPMASK, u, p) : NULL;
        mp_release(u);
        if (mask && mask->dtype != x->dtype) {
            mp_tensor *m = mp_to_raw(mask, x->dtype, x->dev);
            mp_release(mask);
            mask = m;
        }
    }
    mp_tensor *y = mask ? mp_binary(MP_MUL, x, mask) : NULL;
    mp_release(mask);
    return y;
}

/* a mask and a mul, which records itself */
static const mp_op dropout_op = {.name = "dropout", .nin = 1, .forward = dropout_fwd,
                                 .args_size = sizeof(dropout_args)};
MP_OP_REGISTER(dropout_op);

mp_tensor *mp_dropout(mp_tensor *x, double p, bool training)
{
    dropout_args args = {p, training};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&dropout_op, &c, 1, &x);
}

/* ---- cat along a dim ---- */

typedef struct { int dim; } cat_args;   /* 1-based and positive (mp_cat resolves it) */

static int cat_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    int dim = MP_NODE_ARGS(nd, cat_args)->dim;
    int64_t start = 1;
    for (int i = 0; i < nd->nin; i++) {
        int64_t len = nd->in[i].shape[dim - 1];
        if (mp_edge_wants(nd, i) && !(gin[i] = mp_narrow(g, dim, start, len))) return -1;
        start += len;
    }
    return 0;
}

static mp_tensor *cat_fwd(mp_op_ctx *c)
{
    int n = c->nin, dim = MP_OP_ARGS(c, cat_args)->dim, k = dim - 1;
    mp_tensor *const *ts = c->in;
    mp_dtype dt = ts[0]->dtype;
    for (int i = 1; i < n; i++) dt = mp_promote(dt, ts[i]->dtype);
    int64_t shape[MP_MAXDIM], outer, len, inner, total = 0;
    memcpy(shape, ts[0]->shape, sizeof shape);
    for (int i = 0; i < n; i++) total += ts[i]->shape[k];
    shape[k] = total;
    mp_tensor *o = mp_empty(dt, ts[0]->dev, ts[0]->ndim, shape);
    int64_t start = 0;
    for (int i = 0; o && i < n; i++) {
        mp_tensor *c = mp_to_raw(ts[i], dt, ts[i]->dev);
        if (!c) { mp_release(o); return NULL; }
        split(c, k, &outer, &len, &inner);
        MP_K(o, narrow_put, dt, mp_data(o), mp_data(c), outer, total, start, len, inner);
        start += len;
        mp_release(c);
    }
    return o;
}

/* its backward is narrow, which records under create_graph */
static const mp_op cat_op = {.name = "cat", .ac = MP_AC_PROMOTE, .nin = -1, .forward = cat_fwd,
                             .backward = cat_backward, .args_size = sizeof(cat_args), .double_backward = true};
MP_OP_REGISTER(cat_op);

mp_tensor *mp_cat(int n, mp_tensor *const *ts, int dim)
{
    char b1[128], b2[128];
    if (n < 1) return mp_fail(MP_EINVAL, "needs at least one tensor"), NULL;
    int k;
    if (mp_dim(ts[0], dim, &k)) return NULL;
    for (int i = 1; i < n; i++) {
        const mp_tensor *t = ts[i];
        bool ok = t->ndim == ts[0]->ndim;
        for (int d = 0; ok && d < t->ndim; d++) ok = d == k || t->shape[d] == ts[0]->shape[d];
        if (!ok)
            return mp_fail(MP_EINVAL, "tensor %d %s does not match tensor 1 %s outside dim %d", i + 1,
                           mp_shape_str(t->ndim, t->shape, b1, sizeof b1),
                           mp_shape_str(ts[0]->ndim, ts[0]->shape, b2, sizeof b2), dim), NULL;
        if (t->dev != ts[0]->dev)
            return mp_fail(MP_EINVAL, "tensor %d is on %s, tensor 1 on %s", i + 1, mp_device_name(t->dev),
                           mp_device_name(ts[0]->dev)), NULL;
    }
    cat_args args = {k + 1};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&cat_op, &c, n, ts);
}

/* ---- where(cond, a, b), broadcasting all three ---- */

static int where_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *cond = nd->saved[0], *zero = mp_full(g->dtype, g->dev, 0, NULL, 0);
    if (!zero) return -1;
    int rc = 0;
    for (int i = 1; i <= 2 && rc == 0; i++) {
        if (!mp_edge_wants(nd, i)) continue;
        mp_tensor *sel = mp_where(cond, i == 1 ? g : zero, i == 1 ? zero : g), *s = NULL;
        if (sel) s = mp_sum_to(sel, nd->in[i].ndim, nd->in[i].shape);
        if (s && s->dtype != nd->in[i].dtype) {
            mp_tensor *c = mp_to(s, nd->in[i].dtype, s->dev);   /* recorded under create_graph */
            mp_release(s);
            s = c;
        }
        mp_release(sel);
        if (!(gin[i] = s)) rc = -1;
    }
    mp_release(zero);
    return rc;
}

/* the condition is an input without a gradient */
static mp_tensor *where_fwd(mp_op_ctx *c)
{
    mp_tensor *cond = c->in[0], *a = c->in[1], *b = c->in[2];
    mp_bcast ab, abc;
    if (cond->dev != a->dev || a->dev != b->dev)
        return mp_fail(MP_EINVAL, "cond, a and b must be on one device"), NULL;
    if (mp_broadcast(a, b, &ab)) return NULL;
    mp_tensor shape_ab = {.ndim = ab.ndim};
    memcpy(shape_ab.shape, ab.shape, sizeof ab.shape);
    if (mp_broadcast(&shape_ab, cond, &abc)) return NULL;
    mp_dtype dt = mp_promote(a->dtype, b->dtype);
    /* materialise all three at the output shape, then one select pass */
    mp_tensor *c8 = NULL, *ce = NULL, *ax = NULL, *bx = NULL, *o = NULL;
    mp_tensor *cn = mp_to_raw(cond, cond->dtype, cond->dev);
    if (cn) {   /* nonzero is true, whatever cond's dtype */
        mp_tensor *z = mp_full(cond->dtype, cond->dev, 0, NULL, 0);
        c8 = z ? mp_binary(MP_NE, cn, z) : NULL;
        mp_release(z);
    }
    bool was = mp_set_grad_enabled(false);
    if (c8) ce = mp_expand(c8, abc.ndim, abc.shape);
    mp_tensor *ac = ce ? mp_to_raw(a, dt, a->dev) : NULL, *bc = ac ? mp_to_raw(b, dt, b->dev) : NULL;
    if (bc) ax = mp_expand(ac, abc.ndim, abc.shape);
    if (ax) bx = mp_expand(bc, abc.ndim, abc.shape);
    mp_set_grad_enabled(was);
    if (bx && ce->dtype != MP_U8) {   /* the expand of a u8 mask stays u8 */
        mp_tensor *u = mp_to_raw(ce, MP_U8, ce->dev);
        mp_release(ce);
        ce = u;
    }
    if (bx && ce) {
        o = mp_empty(dt, a->dev, abc.ndim, abc.shape);
        if (o) MP_K(o, where, dt, mp_data(o), mp_data(ce), mp_data(ax), mp_data(bx), o->numel);
    }
    if (o && mp_keep(c, 0, ce)) mp_release(o), o = NULL;
    mp_release(cn), mp_release(c8), mp_release(ce), mp_release(ac), mp_release(bc), mp_release(ax), mp_release(bx);
    return o;
}

static const mp_op where_op = {.name = "where", .ac = MP_AC_PROMOTE, .nin = 3, .forward = where_fwd,
                               .backward = where_backward, .double_backward = true};
MP_OP_REGISTER(where_op);

mp_tensor *mp_where(mp_tensor *cond, mp_tensor *a, mp_tensor *b)
{
    mp_op_ctx c = {0};
    mp_tensor *in[3] = {cond, a, b};
    return mp_apply(&where_op, &c, 3, in);
}
