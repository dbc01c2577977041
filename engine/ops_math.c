/*
 * ops_math.c: elementwise arithmetic with numpy broadcasting, unary maths and
 * reductions. Mixed dtypes promote (f16 with bf16 gives f32, any float beats
 * an integer); integer division and the transcendental functions of integers
 * give f32, as in PyTorch. Powers of integers to integers stay integers, as in
 * PyTorch (kernels/int_rules.h, mp_ipow).
 *
 * pow has three forms: tensor ^ number is the unary MP_POW, tensor ^ tensor the
 * binary MP_POWT, and number ^ tensor MP_POWT with the number as a 0-d tensor.
 * Their backwards follow PyTorch's formulas (pow_backward, pow_backward_self,
 * pow_backward_exponent in torch 1.13), edge cases included, and are built from
 * recording ops, so a gradient taken with create_graph differentiates again.
 * The file also holds the unary ops' gradients as graphs (create_graph), below.
 */
#include <math.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

static int same_device(const mp_tensor *a, const mp_tensor *b)
{
    if (a->dev == b->dev) return 0;
    return mp_fail(MP_EINVAL, "tensors are on different devices (%s and %s)",
                   mp_device_name(a->dev), mp_device_name(b->dev));
}

int mp_broadcast(const mp_tensor *a, const mp_tensor *b, mp_bcast *bc)
{
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t sa = 1, sb = 1;
    bc->ndim = n;
    for (int i = n - 1; i >= 0; i--) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char b1[128], b2[128];
            return mp_fail(MP_EINVAL, "shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                           mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                           mp_shape_str(b->ndim, b->shape, b2, sizeof b2), i + 1,
                           (long long)da, (long long)db);
        }
        bc->shape[i] = da > db ? da : db;
        bc->sa[i] = da == 1 ? 0 : sa;
        bc->sb[i] = db == 1 ? 0 : sb;
        sa *= da, sb *= db;
    }
    return 0;
}

/* a new reference to t in dtype dt (t itself when it already is), not recorded:
 * an op's own node differentiates with respect to its original inputs */
static mp_tensor *as_dtype(mp_tensor *t, mp_dtype dt) { return mp_to_raw(t, dt, t->dev); }

/* gradient g (computed in the op's dtype) reduced to input i's shape and dtype */
static mp_tensor *to_input(mp_node *n, int i, mp_tensor *g)
{
    mp_edge *e = &n->in[i];
    mp_tensor *s = mp_sum_to(g, e->ndim, e->shape);
    if (!s || s->dtype == e->dtype) return s;
    mp_tensor *c = mp_to(s, e->dtype, e->dev);   /* recorded under create_graph */
    mp_release(s);
    return c;
}

/* t OP v for a number v, as a u8 mask (v a 0-d tensor of t's dtype) */
static mp_tensor *compare_number(mp_binop op, mp_tensor *t, double v)
{
    mp_tensor *s = mp_full(t->dtype, t->dev, 0, NULL, v), *r = s ? mp_binary(op, t, s) : NULL;
    mp_release(s);
    return r;
}

/* y = a^b (saved: a, b as the op got them, y its output). PyTorch's
 * pow_backward_self and pow_backward_exponent, in their order of operations (so
 * f16/bf16 round where PyTorch's do), with their masks:
 *   d/da = g * (b * a^(b-1)), 0 where b == 0 (x^0 is 1 everywhere, 0^0 too);
 *   d/db = g * (y * log(a)), 0 where a == 0 and b >= 0 (not 0 * -inf).
 * PyTorch masks with where; where lives above this file (ops_nn.c), so the
 * masked elements are steered instead: the exponent b - 1 becomes 0 where b == 0
 * (b * a^0 = 0), and log's argument 1 where a == 0 and b >= 0 (y * log(1) = 0,
 * y being 0 or 1 there). Every other element computes PyTorch's formula as it is. */
static int pow_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *a = n->saved[0], *b = n->saved[1], *y = n->saved[2], *ga = NULL, *gb = NULL;
    bool wa = mp_edge_wants(n, 0), wb = mp_edge_wants(n, 1);
    if (wa) {
        mp_tensor *b0 = compare_number(MP_EQ, b, 0), *bm1 = b0 ? mp_unary(MP_ADDS, b, -1) : NULL;
        mp_tensor *e = bm1 ? mp_binary(MP_ADD, bm1, b0) : NULL, *pw = e ? mp_binary(MP_POWT, a, e) : NULL;
        mp_tensor *d = pw ? mp_binary(MP_MUL, b, pw) : NULL;
        ga = d ? mp_binary(MP_MUL, g, d) : NULL;
        mp_release(b0), mp_release(bm1), mp_release(e), mp_release(pw), mp_release(d);
    }
    if (wb && (!wa || ga)) {
        mp_tensor *a0 = compare_number(MP_EQ, a, 0), *bp = a0 ? compare_number(MP_GE, b, 0) : NULL;
        mp_tensor *m = bp ? mp_binary(MP_MUL, a0, bp) : NULL, *am = m ? mp_binary(MP_ADD, a, m) : NULL;
        mp_tensor *la = am ? mp_unary(MP_LOG, am, 0) : NULL, *t = la ? mp_binary(MP_MUL, y, la) : NULL;
        gb = t ? mp_binary(MP_MUL, g, t) : NULL;
        mp_release(a0), mp_release(bp), mp_release(m), mp_release(am), mp_release(la), mp_release(t);
    }
    int rc = (wa && !ga) || (wb && !gb) ? -1 : 0;
    if (rc == 0 && wa && !(gin[0] = to_input(n, 0, ga))) rc = -1;
    if (rc == 0 && wb && !(gin[1] = to_input(n, 1, gb))) rc = -1;
    mp_release(ga);
    mp_release(gb);
    return rc;
}

static int binary_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_binop op = (mp_binop)n->op->kernel;
    if (op == MP_POWT) return pow_backward(n, g, gin);   /* reads its saved inputs itself */
    /* the inputs as the forward computed with them: cast by mp_to, so the cast
     * records under create_graph (binary_fwd keeps the inputs themselves) */
    mp_tensor *x = n->nsaved > 1 ? mp_to(n->saved[0], g->dtype, g->dev) : NULL;
    mp_tensor *y = x ? mp_to(n->saved[1], g->dtype, g->dev) : NULL, *ga = NULL, *gb = NULL, *t = NULL;
    if (n->nsaved > 1 && !y) return mp_release(x), -1;
    bool wa = mp_edge_wants(n, 0), wb = mp_edge_wants(n, 1);
    switch (op) {
    case MP_ADD: ga = wa ? mp_retain(g) : NULL; gb = wb ? mp_retain(g) : NULL; break;
    case MP_SUB: ga = wa ? mp_retain(g) : NULL; gb = wb ? mp_unary(MP_NEG, g, 0) : NULL; break;
    case MP_MUL: ga = wa ? mp_binary(MP_MUL, g, y) : NULL; gb = wb ? mp_binary(MP_MUL, g, x) : NULL; break;
    case MP_DIV:   /* d(x/y)/dy = -x/y^2 */
        ga = wa ? mp_binary(MP_DIV, g, y) : NULL;
        if (wb && (t = mp_binary(MP_MUL, y, y)) && (gb = mp_binary(MP_DIV, x, t))) {
            mp_tensor *u = mp_binary(MP_MUL, g, gb);
            mp_release(gb);
            gb = u ? mp_unary(MP_NEG, u, 0) : NULL;
            mp_release(u);
        }
        mp_release(t);
        break;
    case MP_POWT: break;   /* pow_backward, above */
    case MP_GT: case MP_LT: case MP_GE: case MP_LE: case MP_EQ: case MP_NE:
        mp_release(x), mp_release(y);
        return mp_fail(MP_EINVAL, "no gradient for comparisons");
    }
    int rc = (wa && !ga) || (wb && !gb) ? -1 : 0;
    if (rc == 0 && wa && !(gin[0] = to_input(n, 0, ga))) rc = -1;
    if (rc == 0 && wb && !(gin[1] = to_input(n, 1, gb))) rc = -1;
    mp_release(ga);
    mp_release(gb);
    mp_release(x);
    mp_release(y);
    return rc;
}

/* f32 op f16/bf16 of one shape (add, sub, mul): the low operand widened
 * inside the backend's kernel (binary_mixed) rather than cast into an f32
 * tensor first; the same bits (the widening is exact, the op binary's f32
 * op). 0: done, *out set; 1: not such a pair, or the backend declined; -1:
 * out of memory */
static int binary_mixed(mp_binop op, mp_tensor *a, mp_tensor *b, mp_dtype dt, mp_tensor **out)
{
    if ((op != MP_ADD && op != MP_SUB && op != MP_MUL) || dt != MP_F32 || a->dtype == b->dtype ||
        !mp_same_shape(a, b) || !mp_be(a)->binary_mixed)
        return 1;
    mp_dtype low = a->dtype == MP_F32 ? b->dtype : a->dtype;
    if (low != MP_BF16 && low != MP_F16) return 1;
    mp_tensor *o = mp_empty(MP_F32, a->dev, a->ndim, a->shape);
    if (!o) return -1;
    if (MP_K(o, binary_mixed, op, mp_data(o), mp_data(a), a->dtype, mp_data(b), b->dtype, a->numel) != 0) {
        mp_release(o);
        return 1;
    }
    *out = o;
    return 0;
}

static mp_tensor *binary_fwd(mp_op_ctx *c)
{
    mp_binop op = (mp_binop)c->op->kernel;
    mp_tensor *a = c->in[0], *b = c->in[1];
    mp_bcast bc;
    if (same_device(a, b) || mp_broadcast(a, b, &bc)) return NULL;
    mp_dtype dt = mp_promote(a->dtype, b->dtype);
    if (op == MP_DIV && !mp_is_float(dt)) dt = MP_F32;
    mp_tensor *x = NULL, *y = NULL, *o = NULL;
    int mixed = binary_mixed(op, a, b, dt, &o);
    if (mixed < 0) return NULL;
    if (mixed == 1) {
        x = as_dtype(a, dt), y = x ? as_dtype(b, dt) : NULL;
        if (y) o = mp_empty(MP_IS_CMP(op) ? MP_U8 : dt, a->dev, bc.ndim, bc.shape);
        if (o) MP_K(o, binary, op, dt, mp_data(o), mp_data(x), mp_data(y), &bc);
    }
    /* the inputs, not their casts: a cast kept here would be a tensor without
     * a graph, and create_graph would lose the gradient through it; the same
     * tensors when no cast was needed, and less memory when one was */
    if (o && (op == MP_MUL || op == MP_DIV) && (mp_keep(c, 0, a) || mp_keep(c, 1, b))) mp_release(o), o = NULL;
    /* pow keeps its inputs as they came too, and its output */
    if (o && op == MP_POWT && (mp_keep(c, 0, a) || mp_keep(c, 1, b) || mp_keep_output(c, 2, o)))
        mp_release(o), o = NULL;
    mp_release(x);
    mp_release(y);
    return o;
}

#define BINOP(K, NAME, AC, BW, ...) [K] = {.name = NAME, .ac = AC, .nin = 2, .forward = binary_fwd, .backward = BW, \
                                           .kernel = K, __VA_ARGS__}
static const mp_op binary_ops[] = {
    BINOP(MP_ADD, "add", MP_AC_PROMOTE, binary_backward, .double_backward = true),
    BINOP(MP_SUB, "sub", MP_AC_PROMOTE, binary_backward, .double_backward = true),
    BINOP(MP_MUL, "mul", MP_AC_PROMOTE, binary_backward, .double_backward = true),
    BINOP(MP_DIV, "div", MP_AC_PROMOTE, binary_backward, .double_backward = true),
    BINOP(MP_POWT, "pow", MP_AC_F32, binary_backward, .double_backward = true),   /* f32 as PyTorch's autocast */
    BINOP(MP_GT, "gt", MP_AC_NONE, NULL), BINOP(MP_LT, "lt", MP_AC_NONE, NULL), BINOP(MP_GE, "ge", MP_AC_NONE, NULL),
    BINOP(MP_LE, "le", MP_AC_NONE, NULL), BINOP(MP_EQ, "eq", MP_AC_NONE, NULL), BINOP(MP_NE, "ne", MP_AC_NONE, NULL),
};
MP_OP_REGISTER_ARRAY(binary_ops, MP_NBINOPS);

mp_tensor *mp_binary(mp_binop op, mp_tensor *a, mp_tensor *b)
{
    if ((unsigned)op >= MP_NBINOPS) return mp_fail(MP_EINVAL, "bad binary op"), NULL;
    mp_op_ctx c = {0};
    mp_tensor *in[2] = {a, b};
    return mp_apply(&binary_ops[op], &c, 2, in);
}

static int is_integral(double s) { return isfinite(s) && s == floor(s) && fabs(s) < 2147483648.0; }

/* dtype of a unary op's result: maths that leaves the integers gives f32 */
static mp_dtype unary_dtype(mp_unop op, mp_dtype dt, double p)
{
    if (mp_is_float(dt)) return dt;
    switch (op) {
    case MP_NEG: case MP_ABS: case MP_RELU: return dt;
    case MP_MULS: case MP_ADDS: case MP_RSUBS: return is_integral(p) ? dt : MP_F32;
    case MP_POW: return is_integral(p) && p >= 0 ? dt : MP_F32;   /* a negative one: refused by unary_fwd */
    case MP_EXP: case MP_LOG: case MP_SQRT: case MP_DIVS: case MP_RDIVS: case MP_TANH: case MP_SIGMOID:
    case MP_GELU: case MP_DROPMASK: case MP_SILU: case MP_SIN: case MP_COS: break;
    }
    return MP_F32;
}

/* the unary ops' scalar: x^p, x*p, ..., dropout's probability (kernels/backend.h) */
typedef struct { double p; } unary_args;

/* d(x^p)/dx = g * (p * x^(p-1)), 0 for p = 0 (x^0 is 1 everywhere, 0^0 too):
 * PyTorch's pow_backward, in its order of operations, from recording ops */
static int pow_scalar_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    double p = MP_NODE_ARGS(n, unary_args)->p;
    mp_tensor *x = n->saved[0], *d = NULL;
    if (p == 0) {
        gin[0] = mp_full(g->dtype, g->dev, g->ndim, g->shape, 0);
    } else if (p == 1) {   /* p * x^0 is 1 for every x, NaN included */
        gin[0] = mp_retain(g);
    } else {
        mp_tensor *pw = p == 2 ? mp_retain(x) : mp_unary(MP_POW, x, p - 1);   /* x^1 is x */
        d = pw ? mp_unary(MP_MULS, pw, p) : NULL;
        gin[0] = d ? mp_binary(MP_MUL, g, d) : NULL;
        mp_release(pw);
        mp_release(d);
    }
    return gin[0] ? 0 : -1;
}

/* ---- the unary ops' gradients as a graph ----
 *
 * For a backward that builds a graph (create_graph: engine/backward.h), the
 * unary ops' gradients are built from recording ops; a plain backward keeps
 * the fused unary_grad kernel (unary_backward). The formulas are the kernel's
 * (kernels/cpu/cpu_elementwise.c, grad_f32), step by step, so that each step
 * records and the gradient can be differentiated again, with respect to the
 * incoming gradient as well as the input.
 *
 * relu, abs and gelu have ops of their own instead, <op>_backward(g, x) =
 * g * op'(x) computed by that same kernel (so their values are the plain
 * backward's, NaN and inf included): gelu's derivative needs erf, which is no
 * op of the engine, and relu's and abs's derivatives are masks, which a graph
 * of ops would cut from x (comparisons have no gradient), where PyTorch's
 * threshold_backward keeps x as an input with a zero derivative. Their
 * backward is the same op again for g, and g * op''(x) for x.
 * (In this file, not one of its own: they are made of mp_unary and mp_binary,
 * which use them, and engine/'s files depend on each other without circles.)
 */

/* A formula's intermediate tensors: each step's result is held here and
 * released by done(); after a failed step the later ones are not run. */
enum { MAX_STEPS = 32 };
typedef struct {
    mp_tensor *t[MAX_STEPS];
    int n;
    bool failed;
} steps;

static mp_tensor *step(steps *s, mp_tensor *t)
{
    if (t && s->n == MAX_STEPS) {   /* a formula longer than the room: a programming error */
        mp_release(t);
        t = NULL;
        mp_fail(MP_EINVAL, "a gradient formula has more than %d steps", MAX_STEPS);
    }
    if (!t) s->failed = true;
    else s->t[s->n++] = t;
    return t;
}

/* r (one of the steps, or NULL) as a new reference, the steps released */
static mp_tensor *done(steps *s, mp_tensor *r)
{
    r = s->failed || !r ? NULL : mp_retain(r);
    for (int i = 0; i < s->n; i++) mp_release(s->t[i]);
    s->n = 0;
    return r;
}

/* each runs only while every earlier step succeeded */
#define STEP(s, expr) ((s)->failed ? NULL : step((s), (expr)))
static mp_tensor *bin(steps *s, mp_binop op, mp_tensor *a, mp_tensor *b) { return STEP(s, mp_binary(op, a, b)); }
static mp_tensor *un(steps *s, mp_unop op, mp_tensor *a, double p) { return STEP(s, mp_unary(op, a, p)); }
static mp_tensor *mul(steps *s, mp_tensor *a, mp_tensor *b) { return bin(s, MP_MUL, a, b); }

/* ---- slope ops: <op>_backward(g, x) = g * op'(x) by the kernel ---- */

typedef struct { double p; } slope_args;   /* the unary op's scalar (gelu: 0 the erf form, else the tanh one) */

/* gelu''(x) from ops of x (each differentiable again):
 *   erf:  pdf(x) (2 - x^2), pdf(x) = e^(-x^2/2) / sqrt(2 pi)
 *   tanh: with u = k (x + c x^3), t = tanh(u), u' = k (1 + 3 c x^2):
 *         gelu'(x) = (1 + t) / 2 + x (1 - t^2) u' / 2, so
 *         gelu''(x) = (1 - t^2) (u' - x t u'^2 + 3 k c x^2)            */
static mp_tensor *gelu_second(steps *s, mp_tensor *x, double form)
{
    mp_tensor *x2 = mul(s, x, x);
    if (form == 0) {
        mp_tensor *e = un(s, MP_EXP, un(s, MP_MULS, x2, -0.5), 0);
        mp_tensor *pdf = un(s, MP_MULS, e, 0.39894228040143268);
        return mul(s, pdf, un(s, MP_RSUBS, x2, 2));
    }
    const double k = 0.79788456080286536, c = 0.044715;
    mp_tensor *u = un(s, MP_MULS, bin(s, MP_ADD, x, un(s, MP_MULS, mul(s, x2, x), c)), k);
    mp_tensor *t = un(s, MP_TANH, u, 0), *sech2 = un(s, MP_RSUBS, mul(s, t, t), 1);
    mp_tensor *du = un(s, MP_MULS, un(s, MP_ADDS, un(s, MP_MULS, x2, 3 * c), 1), k);
    mp_tensor *lead = bin(s, MP_ADD, du, un(s, MP_MULS, x2, 3 * k * c));
    mp_tensor *inner = bin(s, MP_SUB, lead, mul(s, mul(s, x, t), mul(s, du, du)));
    return mul(s, sech2, inner);
}

static mp_tensor *slope(mp_unop op, mp_tensor *g, mp_tensor *x, double p);

/* linear in g: the same op on h; in x: h g op''(x), where relu's and abs's
 * op'' is 0 (no gradient: the walk gives zeros where one is asked) */
static int slope_backward(mp_node *n, mp_tensor *h, mp_tensor **gin)
{
    mp_unop op = (mp_unop)n->op->kernel;
    mp_tensor *g = n->saved[0], *x = n->saved[1];
    double p = MP_NODE_ARGS(n, slope_args)->p;
    if (mp_edge_wants(n, 0) && !(gin[0] = slope(op, h, x, p))) return -1;
    if (mp_edge_wants(n, 1) && op == MP_GELU) {
        steps s = {0};
        gin[1] = done(&s, mul(&s, mul(&s, h, g), gelu_second(&s, x, p)));
        if (!gin[1]) return -1;
    }
    return 0;
}

static mp_tensor *slope_fwd(mp_op_ctx *c)
{
    mp_tensor *g = c->in[0], *x = c->in[1];
    if (g->dtype != x->dtype || g->dev != x->dev || !mp_same_shape(g, x))
        return mp_fail(MP_EINVAL, "%s: the gradient and the input differ in dtype, device or shape", c->op->name), NULL;
    mp_tensor *o = mp_empty(g->dtype, g->dev, g->ndim, g->shape);
    if (o) MP_K(o, unary_grad, (mp_unop)c->op->kernel, g->dtype, mp_data(o), mp_data(g), mp_data(x), NULL, g->numel,
                MP_OP_ARGS(c, slope_args)->p);
    if (o && (mp_keep(c, 0, g) || mp_keep(c, 1, x))) mp_release(o), o = NULL;
    return o;
}

#define SLOPE(K, NAME) {.name = NAME, .nin = 2, .forward = slope_fwd, .backward = slope_backward, .kernel = K, \
                        .args_size = sizeof(slope_args), .double_backward = true}
static const mp_op relu_slope = SLOPE(MP_RELU, "relu_backward"), abs_slope = SLOPE(MP_ABS, "abs_backward"),
                   gelu_slope = SLOPE(MP_GELU, "gelu_backward");
MP_OP_REGISTER(relu_slope);
MP_OP_REGISTER(abs_slope);
MP_OP_REGISTER(gelu_slope);

static mp_tensor *slope(mp_unop op, mp_tensor *g, mp_tensor *x, double p)
{
    slope_args args = {p};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[2] = {g, x};
    return mp_apply(op == MP_RELU ? &relu_slope : op == MP_ABS ? &abs_slope : &gelu_slope, &c, 2, in);
}

mp_tensor *mp_gelu_backward(mp_tensor *g, mp_tensor *x, double form) { return slope(MP_GELU, g, x, form); }

/* ---- the formulas: grad_f32's, one op a step ---- */

/* g * op'(x) from recording ops, so that it can be differentiated again (with
 * respect to g, x and y): x the op's input and y its output (the node's saved
 * output, attached to the node again), each NULL when the op's backward does
 * not keep it */
static mp_tensor *unary_grad_graph(mp_unop op, mp_tensor *g, mp_tensor *x, mp_tensor *y, double p)
{
    steps s = {0};
    mp_tensor *r = NULL;
    switch (op) {
    case MP_NEG: r = un(&s, MP_NEG, g, 0); break;
    case MP_ABS: case MP_RELU: case MP_GELU: return slope(op, g, x, p);
    case MP_EXP: r = mul(&s, g, y); break;
    case MP_LOG: r = bin(&s, MP_DIV, g, x); break;
    case MP_SQRT: r = bin(&s, MP_DIV, g, un(&s, MP_MULS, y, 2)); break;
    case MP_POW:
        if (p == 0) return mp_full(g->dtype, g->dev, g->ndim, g->shape, 0);   /* x^0 is constant: no graph, as PyTorch */
        r = mul(&s, un(&s, MP_MULS, g, p), p == 2 ? x : un(&s, MP_POW, x, p - 1));
        break;
    case MP_MULS: r = un(&s, MP_MULS, g, p); break;
    case MP_ADDS: return mp_retain(g);
    case MP_RSUBS: r = un(&s, MP_NEG, g, 0); break;
    case MP_DIVS: r = un(&s, MP_DIVS, g, p); break;
    case MP_RDIVS: r = bin(&s, MP_DIV, mul(&s, un(&s, MP_NEG, g, 0), y), x); break;   /* -g y / x, y = p / x */
    case MP_TANH: r = mul(&s, g, un(&s, MP_RSUBS, mul(&s, y, y), 1)); break;
    case MP_SIGMOID: r = mul(&s, mul(&s, g, y), un(&s, MP_RSUBS, y, 1)); break;
    case MP_SILU: {   /* g s (1 + x (1 - s)), s = sigmoid(x) */
        mp_tensor *sg = un(&s, MP_SIGMOID, x, 0);
        r = mul(&s, mul(&s, g, sg), un(&s, MP_ADDS, mul(&s, x, un(&s, MP_RSUBS, sg, 1)), 1));
        break;
    }
    case MP_SIN: r = mul(&s, g, un(&s, MP_COS, x, 0)); break;
    case MP_COS: r = un(&s, MP_NEG, mul(&s, g, un(&s, MP_SIN, x, 0)), 0); break;
    case MP_DROPMASK: return mp_fail(MP_EINVAL, "dropout_mask has no gradient"), NULL;
    }
    return done(&s, r);
}

/* the fused unary_grad kernel; with grad mode on (a backward that builds a
 * graph: create_graph) the same formula from recording ops instead, so the
 * gradient can be differentiated again (above) */
static int unary_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    if (n->op->kernel == MP_POW) return pow_scalar_backward(n, g, gin);
    mp_tensor *x = n->nsaved > 0 ? n->saved[0] : NULL, *y = n->nsaved > 1 ? n->saved[1] : NULL;
    double p = MP_NODE_ARGS(n, unary_args)->p;
    if (mp_grad_enabled()) {
        gin[0] = unary_grad_graph((mp_unop)n->op->kernel, g, x, y, p);
        return gin[0] ? 0 : -1;
    }
    mp_tensor *r = mp_empty(g->dtype, g->dev, g->ndim, g->shape);
    if (!r) return -1;
    MP_K(r, unary_grad, (mp_unop)n->op->kernel, g->dtype, mp_data(r), mp_data(g), x ? mp_data(x) : NULL,
                         y ? mp_data(y) : NULL, g->numel, p);
    gin[0] = r;
    return 0;
}

/* what each unary op's backward reads: its input x, its output y */
static bool needs_x(mp_unop op)
{
    return op == MP_ABS || op == MP_LOG || op == MP_POW || op == MP_RDIVS || op == MP_RELU || op == MP_GELU ||
           op == MP_SILU || op == MP_SIN || op == MP_COS;
}
static bool needs_y(mp_unop op)
{
    return op == MP_EXP || op == MP_SQRT || op == MP_TANH || op == MP_SIGMOID || op == MP_RDIVS;
}

static mp_tensor *unary_fwd(mp_op_ctx *c)
{
    mp_unop op = (mp_unop)c->op->kernel;
    mp_tensor *a = c->in[0];
    double p = MP_OP_ARGS(c, unary_args)->p;
    if (op == MP_POW && !mp_is_float(a->dtype) && is_integral(p) && p < 0)   /* as PyTorch */
        return mp_fail(MP_EINVAL, "an integer tensor to a negative integer power (%g) is not allowed: "
                       "convert the tensor to a float dtype", p), NULL;
    mp_dtype dt = unary_dtype(op, a->dtype, p);
    mp_tensor *x = as_dtype(a, dt), *o = x ? mp_empty(dt, a->dev, a->ndim, a->shape) : NULL;
    if (o) MP_K(o, unary, op, dt, mp_data(o), mp_data(x), a->numel, p);
    if (o && ((needs_x(op) && mp_keep(c, 0, x)) || (needs_y(op) && mp_keep_output(c, 1, o)))) mp_release(o), o = NULL;
    mp_release(x);
    return o;
}

#define UNOP(K, NAME, AC, ...) [K] = {.name = NAME, .ac = AC, .nin = 1, .forward = unary_fwd, \
                                      .backward = unary_backward, .kernel = K, \
                                      .args_size = sizeof(unary_args), .double_backward = true, __VA_ARGS__}
static const mp_op unary_ops[] = {
    UNOP(MP_NEG, "neg", MP_AC_NONE), UNOP(MP_ABS, "abs", MP_AC_NONE), UNOP(MP_EXP, "exp", MP_AC_F32),
    UNOP(MP_LOG, "log", MP_AC_F32), UNOP(MP_SQRT, "sqrt", MP_AC_NONE),
    UNOP(MP_POW, "pow", MP_AC_F32),
    UNOP(MP_MULS, "mul", MP_AC_PROMOTE), UNOP(MP_ADDS, "add", MP_AC_PROMOTE), UNOP(MP_RSUBS, "rsub", MP_AC_NONE),
    UNOP(MP_DIVS, "div", MP_AC_PROMOTE), UNOP(MP_RDIVS, "rdiv", MP_AC_NONE),
    UNOP(MP_RELU, "relu", MP_AC_NONE, .bind = MP_BIND_UNARY), UNOP(MP_TANH, "tanh", MP_AC_NONE, .bind = MP_BIND_UNARY),
    UNOP(MP_SIGMOID, "sigmoid", MP_AC_NONE, .bind = MP_BIND_UNARY), UNOP(MP_GELU, "gelu", MP_AC_NONE),
    UNOP(MP_SILU, "silu", MP_AC_NONE, .bind = MP_BIND_UNARY),
    UNOP(MP_SIN, "sin", MP_AC_NONE), UNOP(MP_COS, "cos", MP_AC_NONE),   /* bound by lua/lmath.c */
    [MP_DROPMASK] = {.name = "dropout_mask", .nin = 1, .forward = unary_fwd, .kernel = MP_DROPMASK,
                     .args_size = sizeof(unary_args)},
};
MP_OP_REGISTER_ARRAY(unary_ops, MP_NUNOPS);

mp_tensor *mp_unary(mp_unop op, mp_tensor *a, double p)
{
    if ((unsigned)op >= MP_NUNOPS || !unary_ops[op].name) return mp_fail(MP_EINVAL, "bad unary op"), NULL;
    unary_args args = {.p = p};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&unary_ops[op], &c, 1, &a);
}

/* s ^ x: s as a 0-d tensor in x's dtype, as PyTorch's wrapped scalar (a float
 * x keeps its dtype, so 1e6 ^ an f16 x overflows as there), unless x is an
 * integer tensor and s not an integer of its range: then f32 */
static mp_tensor *scalar_pow(double s, mp_tensor *x)
{
    bool fits = mp_is_float(x->dtype) ||
                (is_integral(s) && (x->dtype == MP_U8 ? s >= 0 && s <= 255 : s >= INT32_MIN && s <= INT32_MAX));
    mp_tensor *base = mp_full(fits ? x->dtype : MP_F32, x->dev, 0, NULL, s);
    mp_tensor *r = base ? mp_binary(MP_POWT, base, x) : NULL;
    mp_release(base);
    return r;
}

mp_tensor *mp_binary_scalar(mp_binop op, mp_tensor *a, double s, int scalar_first)
{
    switch (op) {
    case MP_POWT: return scalar_first ? scalar_pow(s, a) : mp_unary(MP_POW, a, s);
    case MP_ADD: return mp_unary(MP_ADDS, a, s);
    case MP_MUL: return mp_unary(MP_MULS, a, s);
    case MP_SUB: return scalar_first ? mp_unary(MP_RSUBS, a, s) : mp_unary(MP_ADDS, a, -s);
    case MP_DIV: return mp_unary(scalar_first ? MP_RDIVS : MP_DIVS, a, s);
    case MP_GT: case MP_LT: case MP_GE: case MP_LE: case MP_EQ: case MP_NE: break;
    }
    return mp_fail(MP_EINVAL, "bad binary op"), NULL;
}

typedef struct {
    int dim;                       /* 1-based, negative from the end; 0: all */
    bool keepdim;
    int k;                         /* set by the forward: the 0-based dim, or -1 for all */
} reduce_args;

static int reduce_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_edge *e = &n->in[0];
    mp_redop op = (mp_redop)n->op->kernel;
    int k = MP_NODE_ARGS(n, reduce_args)->k;
    int64_t keep[MP_MAXDIM];
    for (int d = 0; d < e->ndim; d++) keep[d] = k < 0 || d == k ? 1 : e->shape[d];
    if (op == MP_MAX || op == MP_MIN) {   /* the gradient goes to the (first) maximum or minimum */
        mp_tensor *r = mp_full(g->dtype, g->dev, e->ndim, e->shape, 0);
        if (!r) return -1;
        int64_t outer = 1, len = r->numel, inner = 1;
        if (k >= 0) {
            len = e->shape[k];
            for (int d = 0; d < e->ndim; d++) {
                if (d < k) outer *= e->shape[d];
                if (d > k) inner *= e->shape[d];
            }
        }
        MP_K(r, put_along, g->dtype, mp_data(r), mp_data(g), mp_data(n->saved[0]), outer, len, inner);
        gin[0] = r;
        return 0;
    }
    mp_tensor *gk = mp_reshape(g, e->ndim, keep), *s = gk;
    if (gk && op == MP_MEAN) {
        double cnt = 1;
        for (int d = 0; d < e->ndim; d++) cnt *= k < 0 || d == k ? (double)e->shape[d] : 1.0;
        s = mp_unary(MP_DIVS, gk, cnt);
        mp_release(gk);
    }
    if (!s) return -1;
    gin[0] = mp_expand(s, e->ndim, e->shape);
    mp_release(s);
    return gin[0] ? 0 : -1;
}

static mp_tensor *reduce_fwd(mp_op_ctx *c)
{
    mp_redop op = (mp_redop)c->op->kernel;
    mp_tensor *a = c->in[0];
    reduce_args *args = MP_OP_ARGS(c, reduce_args);
    int dim = args->dim, keepdim = args->keepdim;
    int k = -1;
    if (dim != 0 && mp_dim(a, dim, &k)) return NULL;
    bool arg = op == MP_ARGMAX || op == MP_ARGMIN;
    if (dim == 0 && arg && a->ndim > 1)
        return mp_fail(MP_EINVAL, "%s needs a dim for a %d-d tensor", c->op->name, a->ndim), NULL;
    if ((op == MP_MAX || op == MP_MIN || arg) && (k >= 0 ? a->shape[k] : a->numel) == 0)
        return mp_fail(MP_EINVAL, "%s of an empty %s (no identity to return)", c->op->name,
                       k >= 0 ? "dim" : "tensor"), NULL;
    int64_t outer = 1, n = a->numel, inner = 1, shape[MP_MAXDIM];
    int nd = 0;
    if (k >= 0) {
        n = a->shape[k];
        for (int i = 0; i < a->ndim; i++) {
            if (i < k) outer *= a->shape[i];
            if (i > k) inner *= a->shape[i];
            if (i != k || keepdim) shape[nd++] = i == k ? 1 : a->shape[i];
        }
    } else if (keepdim) {
        for (int i = 0; i < a->ndim; i++) shape[nd++] = 1;
    }
    /* integer sums and means are f32 (accumulated in double, rounded once): there is
     * no 64-bit integer dtype, and an i32 total would wrap silently (the pixels of
     * Fashion-MNIST add up to 3.4e9) */
    mp_dtype in = a->dtype;
    if ((op == MP_MEAN || op == MP_SUM) && !mp_is_float(in)) in = MP_F32;
    mp_dtype out = arg ? MP_I32 : in;
    mp_tensor *x = as_dtype(a, in), *o = x ? mp_empty(out, a->dev, nd, shape) : NULL;
    if (o) MP_K(o, reduce, op, in, mp_data(o), mp_data(x), outer, n, inner);
    args->k = k;
    if (o && (op == MP_MAX || op == MP_MIN) && c->record) {   /* where each extreme was, for the backward */
        mp_tensor *idx = mp_empty(MP_I32, a->dev, nd, shape);
        if (idx) MP_K(idx, reduce, op == MP_MAX ? MP_ARGMAX : MP_ARGMIN, in, mp_data(idx), mp_data(x), outer, n, inner);
        if (!idx || mp_keep(c, 0, idx)) mp_release(o), o = NULL;
        mp_release(idx);
    }
    mp_release(x);
    return o;
}

#define REDOP(K, NAME, AC, BW) [K] = {.name = NAME, .ac = AC, .nin = 1, .forward = reduce_fwd, .backward = BW, \
                                      .kernel = K, .args_size = sizeof(reduce_args), \
                                      .double_backward = K == MP_SUM || K == MP_MEAN}
static const mp_op reduce_ops[] = {
    REDOP(MP_SUM, "sum", MP_AC_F32, reduce_backward), REDOP(MP_MEAN, "mean", MP_AC_F32, reduce_backward),
    REDOP(MP_MAX, "max", MP_AC_NONE, reduce_backward), REDOP(MP_ARGMAX, "argmax", MP_AC_NONE, NULL),
    REDOP(MP_MIN, "min", MP_AC_NONE, reduce_backward), REDOP(MP_ARGMIN, "argmin", MP_AC_NONE, NULL),
};
MP_OP_REGISTER_ARRAY(reduce_ops, MP_NREDOPS);

mp_tensor *mp_reduce(mp_redop op, mp_tensor *a, int dim, int keepdim)
{
    if ((unsigned)op >= MP_NREDOPS) return mp_fail(MP_EINVAL, "bad reduction"), NULL;
    reduce_args args = {.dim = dim, .keepdim = keepdim != 0};
    mp_op_ctx c = {.args = &args};
    return mp_apply(&reduce_ops[op], &c, 1, &a);
}

/* ---- broadcasting undone and done, for backward functions ---- */

mp_tensor *mp_sum_to(mp_tensor *g, int ndim, const int64_t *shape)
{
    mp_tensor *cur = mp_retain(g);
    int lead = g->ndim - ndim;
    for (int d = 0; d < g->ndim && cur; d++) {
        bool extra = d < lead, bcast = !extra && shape[d - lead] == 1 && g->shape[d] != 1;
        if (!extra && !bcast) continue;
        mp_tensor *r = mp_reduce(MP_SUM, cur, d + 1, 1);
        mp_release(cur);
        cur = r;
    }
    if (!cur) return NULL;
    mp_tensor *r = mp_reshape(cur, ndim, shape);
    mp_release(cur);
    return r;
}

mp_tensor *mp_expand(mp_tensor *g, int ndim, const int64_t *shape)
{
    mp_tensor *z = mp_full(g->dtype, g->dev, ndim, shape, 0);
    if (!z) return NULL;
    mp_tensor *r = mp_binary(MP_ADD, z, g);
    mp_release(z);
    return r;
}
