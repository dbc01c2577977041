/*
 * lmath.c: the math and reduction ops in both of their forms, mp.op(x, ...)
 * and x:op(...) (docs/API.md "Tensor ops: math and reductions").
 *
 * Each op is one row: its name, the C function that reads its arguments from
 * argument 1 on, and the forms it is registered in. Both forms call the same
 * function with the name of the form the user called (`mp.exp` or
 * `Tensor:exp`), which every error carries. Where another file already gives
 * one form (ltensor.c: t:exp, t:gt, ...; lfunctional.c: mp.tanh, mp.softmax,
 * ...), the row adds only the missing one, so nothing is defined twice; the
 * reductions (sum, mean, max, argmax, ...) live here in both forms.
 *
 * Reductions: `dim` is 1-based (negative from the end); without it the whole
 * tensor is reduced to a 0-d tensor. `keepdim` (default false, as PyTorch's)
 * keeps the reduced dim with size 1.
 */
#include <math.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"

typedef struct math_row math_row;
typedef int (*math_fn)(lua_State *L, const math_row *r, const char *name);
enum { FN = 1, METH = 2, BOTH = 3 };
struct math_row {
    const char *name;
    math_fn fn;
    int op;          /* the kernel code (an mp_unop, mp_redop or mp_binop) where the row has one */
    int forms;       /* FN: mp.<name>; METH: Tensor:<name> */
    int nargs;       /* the most arguments it takes, x included */
};

/* argument i as a tensor, or an error in the caller's words */
static mp_tensor *tensor_arg(lua_State *L, int i, const char *what, const char *name)
{
    mp_tensor *t = lt_opt(L, i);
    if (!t) luaL_error(L, "%s: %s must be a Tensor (got %s)", name, what, luaL_typename(L, i));
    return t;
}

#define RETURN_TENSOR(L, NAME, EXPR) do { LT_PUSH(L, NAME, EXPR); return 1; } while (0)

/* an optional dim at i: 0 (all dims) when absent or nil */
static int opt_dim(lua_State *L, int i, const char *name)
{
    if (lua_isnoneornil(L, i)) return 0;
    int d = lb_dim(L, i, name);
    if (d == 0) luaL_error(L, "%s: dim 0 is not a dim (dims are 1-based; -1 is the last)", name);
    return d;
}

static bool opt_bool(lua_State *L, int i, const char *what, const char *name)
{
    if (lua_isnoneornil(L, i)) return false;
    if (!lua_isboolean(L, i)) luaL_error(L, "%s: %s must be a boolean (got %s)", name, what, luaL_typename(L, i));
    return lua_toboolean(L, i);
}

/* ---- elementwise ---- */

static int f_unary(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    RETURN_TENSOR(L, name, mp_unary((mp_unop)r->op, x, 0));
}

/* t:gelu([{approximate = "none" | "tanh"}]) (mp.gelu: lfunctional.c) */
static int f_gelu(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    double tanh_form = 0;
    if (lb_check_options(L, 2, name, "approximate:string", 1)) {
        lua_getfield(L, 2, "approximate");
        const char *a = lua_isnil(L, -1) ? "none" : lua_tostring(L, -1);
        if (strcmp(a, "none") && strcmp(a, "tanh"))
            return luaL_error(L, "%s: approximate must be \"none\" or \"tanh\" (got %s)", name, a);
        tanh_form = strcmp(a, "tanh") == 0;
        lua_pop(L, 1);
    }
    RETURN_TENSOR(L, name, mp_unary(MP_GELU, x, tanh_form));
}

/* t:softmax(dim), t:log_softmax(dim) (the mp. forms: lfunctional.c) */
static int f_softmax(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    if (lua_isnoneornil(L, 2)) return luaL_error(L, "%s: dim is required", name);
    RETURN_TENSOR(L, name, mp_softmax(x, lb_dim(L, 2, name), r->op));
}

/* a dtype that holds the number v exactly, for comparing it with a tensor of dtype dt */
static mp_dtype scalar_dtype(mp_dtype dt, double v)
{
    if (mp_is_float(dt)) return dt;
    bool fits = (dt == MP_U8 ? v >= 0 && v <= 255 : v >= INT32_MIN && v <= INT32_MAX) && v == (double)(int64_t)v;
    return fits ? dt : MP_F32;
}

/* mp.gt(a, b), ...: b a tensor or a number; u8 0/1 (the methods: ltensor.c) */
static int f_compare(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *a = tensor_arg(L, 1, "a", name), *b = lt_opt(L, 2);
    if (b) RETURN_TENSOR(L, name, mp_binary((mp_binop)r->op, a, b));
    if (lua_type(L, 2) != LUA_TNUMBER)
        return luaL_error(L, "%s: b must be a Tensor or a number (got %s)", name, luaL_typename(L, 2));
    LTensor *u = lt_new(L);   /* the number as a 0-d tensor, kept on the stack until the result is made */
    double v = lua_tonumber(L, 2);
    lt_set(L, u, LT_CALL(L, mp_full(scalar_dtype(a->dtype, v), a->dev, 0, NULL, v)), name);
    RETURN_TENSOR(L, name, mp_binary((mp_binop)r->op, a, u->t));
}

/* ---- reductions ---- */

/* sum, mean, argmax, argmin, any, all: (x [, dim [, keepdim]]) */
static int f_reduce(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    int d = opt_dim(L, 2, name);
    bool keep = opt_bool(L, 3, "keepdim", name);
    if (d == 0 && x->ndim > 1 && (r->op == MP_ARGMAX || r->op == MP_ARGMIN)) {
        /* PyTorch's argmax without a dim: the flat index over every element */
        int64_t all = -1;
        LTensor *flat = lt_new(L);   /* a view, kept on the stack until the result is made */
        lt_set(L, flat, LT_CALL(L, mp_reshape(x, 1, &all)), name);
        RETURN_TENSOR(L, name, mp_reduce((mp_redop)r->op, flat->t, 0, false));
    }
    RETURN_TENSOR(L, name, mp_reduce((mp_redop)r->op, x, d, keep));
}

static int f_any_all(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    int d = opt_dim(L, 2, name);
    bool keep = opt_bool(L, 3, "keepdim", name);
    RETURN_TENSOR(L, name, r->op ? mp_all(x, d, keep) : mp_any(x, d, keep));
}

/* max, min: (x) -> the value as a 0-d tensor; (x, dim [, keepdim]) -> values, indices (0-based i32) */
static int f_extreme(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    int d = opt_dim(L, 2, name);
    bool keep = opt_bool(L, 3, "keepdim", name);
    bool lo = r->op == MP_MIN;
    LT_PUSH(L, name, mp_reduce(r->op, x, d, keep));
    if (d == 0) return 1;
    LT_PUSH(L, name, mp_reduce(lo ? MP_ARGMIN : MP_ARGMAX, x, d, keep));
    return 2;
}

/* var, std: (x [, dim] [, {correction = 1, keepdim = false}]) */
static int f_var_std(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    int o = lua_istable(L, 2) ? 2 : 3;   /* the options may follow x directly */
    int d = o == 3 ? opt_dim(L, 2, name) : 0;
    double correction = 1;
    bool keep = false;
    if (lb_check_options(L, o, name, "correction:number keepdim:boolean", 1)) {
        correction = lb_number_field(L, o, "correction", 1, name);
        lua_getfield(L, o, "keepdim");
        keep = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    if (!lua_isnone(L, o + 1)) return luaL_error(L, "%s: too many arguments (options go in one table)", name);
    RETURN_TENSOR(L, name, r->op ? mp_std(x, d, correction, keep) : mp_var(x, d, correction, keep));
}

/* norm: (x [, p = 2 [, dim [, keepdim]]]); p a number (math.huge for inf) */
static int f_norm(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    double p = 2;
    if (!lua_isnoneornil(L, 2)) {
        if (lua_type(L, 2) != LUA_TNUMBER)
            return luaL_error(L, "%s: p must be a number (got %s; math.huge for the inf-norm)", name,
                              luaL_typename(L, 2));
        p = lua_tonumber(L, 2);
    }
    int d = opt_dim(L, 3, name);
    bool keep = opt_bool(L, 4, "keepdim", name);
    RETURN_TENSOR(L, name, mp_norm(x, p, d, keep));
}

/* cumsum: (x, dim) */
static int f_cumsum(lua_State *L, const math_row *r, const char *name)
{
    mp_tensor *x = tensor_arg(L, 1, "x", name);
    if (lua_isnoneornil(L, 2)) return luaL_error(L, "%s: dim is required", name);
    RETURN_TENSOR(L, name, mp_cumsum(x, lb_dim(L, 2, name)));
}

static const math_row rows[] = {
    {"neg", f_unary, MP_NEG, BOTH, 1}, {"sin", f_unary, MP_SIN, BOTH, 1}, {"cos", f_unary, MP_COS, BOTH, 1},
    {"exp", f_unary, MP_EXP, FN, 1}, {"log", f_unary, MP_LOG, FN, 1}, {"abs", f_unary, MP_ABS, FN, 1},
    {"sqrt", f_unary, MP_SQRT, FN, 1},
    {"tanh", f_unary, MP_TANH, METH, 1}, {"relu", f_unary, MP_RELU, METH, 1}, {"sigmoid", f_unary, MP_SIGMOID, METH, 1},
    {"silu", f_unary, MP_SILU, METH, 1}, {"gelu", f_gelu, 0, METH, 2},
    {"softmax", f_softmax, 0, METH, 2}, {"log_softmax", f_softmax, 1, METH, 2},
    {"gt", f_compare, MP_GT, FN, 2}, {"lt", f_compare, MP_LT, FN, 2}, {"ge", f_compare, MP_GE, FN, 2},
    {"le", f_compare, MP_LE, FN, 2}, {"eq", f_compare, MP_EQ, FN, 2}, {"ne", f_compare, MP_NE, FN, 2},
    {"sum", f_reduce, MP_SUM, BOTH, 3}, {"mean", f_reduce, MP_MEAN, BOTH, 3},
    {"max", f_extreme, MP_MAX, BOTH, 3}, {"min", f_extreme, MP_MIN, BOTH, 3},
    {"argmax", f_reduce, MP_ARGMAX, BOTH, 3}, {"argmin", f_reduce, MP_ARGMIN, BOTH, 3},
    {"any", f_any_all, 0, BOTH, 3}, {"all", f_any_all, 1, BOTH, 3},
    {"var", f_var_std, 0, BOTH, 3}, {"std", f_var_std, 1, BOTH, 3}, {"norm", f_norm, 0, BOTH, 4},
    {"cumsum", f_cumsum, 0, BOTH, 2},
};

/* upvalue 1: the row; upvalue 2: the form's name for errors */
static int call_row(lua_State *L)
{
    const math_row *r = lua_touserdata(L, lua_upvalueindex(1));
    const char *name = lua_tostring(L, lua_upvalueindex(2));
    lb_max_args(L, r->nargs, name);
    return r->fn(L, r, name);
}

static void add(lua_State *L, const math_row *r, const char *prefix)
{
    lua_pushlightuserdata(L, (void *)r);
    lua_pushfstring(L, "%s%s", prefix, r->name);
    lua_pushcclosure(L, call_row, 2);
    lua_setfield(L, -2, r->name);
}

/* into the mp table on top of the stack, after luaopen_mp_tensor (mp.Tensor) */
void mp_open_math(lua_State *L)
{
    lua_getfield(L, -1, "Tensor");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].forms & METH) add(L, &rows[i], "Tensor:");
        if (rows[i].forms & FN) {
            lua_pushvalue(L, -2);
            add(L, &rows[i], "mp.");
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
}
