/*
 * ops_unary_grad.c: the unary ops' gradients built from recording ops, for a
 * backward that builds a graph (create_graph: engine/backward.h). A plain
 * backward keeps the fused unary_grad kernel (engine/ops_math.c): this is the
 * same formula as that kernel (kernels/cpu/cpu_elementwise.c, grad_f32), step
 * by step, so that each step records and the gradient can be differentiated
 * again, with respect to the incoming gradient as well as the input.
 *
 * relu, abs and gelu have ops of their own here instead, <op>_backward(g, x)
 * = g * op'(x) computed by that same kernel (so their values are the plain
 * backward's, NaN and inf included): gelu's derivative needs erf, which is no
 * op of the engine, and relu's and abs's derivatives are masks, which a graph
 * of ops would cut from x (comparisons have no gradient), where PyTorch's
 * threshold_backward keeps x as an input with a zero derivative. Their
 * backward is the same op again for g, and g * op''(x) for x.
 */
#include <math.h>
#include "engine/ops_unary_grad.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

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

/* ---- the formulas: grad_f32's, one op a step ---- */

mp_tensor *mp_unary_grad_graph(mp_unop op, mp_tensor *g, mp_tensor *x, mp_tensor *y, double p)
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
    case MP_DROPMASK: return mp_fail(MP_EINVAL, "dropout_mask has no gradient"), NULL;
    }
    return done(&s, r);
}
