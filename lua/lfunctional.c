/*
 * lfunctional.c: mp.softmax, mp.cross_entropy ... (docs/API.md "Functional ops"), the
 * functions that op descriptions ask for (mp.relu, mp.tanh, ...: bind_described),
 * and grad mode (mp.no_grad, mp.set_grad_enabled, mp.is_grad_enabled).
 */
#include <math.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/autograd.h"
#include "engine/op.h"

#define RETURN_TENSOR(L, NAME, EXPR) do { LT_PUSH(L, NAME, EXPR); return 1; } while (0)

/* mp.<name>(x) for every op whose description asks for it (MP_BIND_UNARY):
 * upvalue 1 is the op, upvalue 2 its Lua name for errors */
static int f_described_unary(lua_State *L)
{
    const mp_op *op = lua_touserdata(L, lua_upvalueindex(1));
    const char *name = lua_tostring(L, lua_upvalueindex(2));
    mp_tensor *x = lt_check(L, 1);
    RETURN_TENSOR(L, name, mp_unary((mp_unop)op->kernel, x, 0));
}

static void bind_described(lua_State *L)
{
    const mp_op *op;
    for (int i = 0; (op = mp_op_at(i)); i++) {
        if (op->bind != MP_BIND_UNARY) continue;
        lua_pushlightuserdata(L, (void *)op);
        lua_pushfstring(L, "mp.%s", op->name);
        lua_pushcclosure(L, f_described_unary, 2);
        lua_setfield(L, -2, op->name);
    }
}

/* GELU's options table at index i of the function name: 1 for approximate =
 * "tanh", 0 for "none" or none given; raises on anything else */
static int gelu_form(lua_State *L, int i, const char *name)
{
    int tanh_form = 0;
    if (lb_check_options(L, i, name, "approximate:string", 1)) {
        lua_getfield(L, i, "approximate");
        const char *a = lua_isnil(L, -1) ? "none" : lua_tostring(L, -1);
        if (!a || (strcmp(a, "none") && strcmp(a, "tanh")))
            return luaL_error(L, "%s: approximate must be \"none\" or \"tanh\" (got %s)", name,
                              a ? a : luaL_typename(L, -1));
        tanh_form = strcmp(a, "tanh") == 0;
        lua_pop(L, 1);
    }
    return tanh_form;
}

/* mp.gelu(x [, {approximate="none"|"tanh"}]) */
static int f_gelu(lua_State *L)
{
    mp_tensor *x = lt_check(L, 1);
    double tanh_form = gelu_form(L, 2, "mp.gelu");
    RETURN_TENSOR(L, "mp.gelu", mp_unary(MP_GELU, x, tanh_form));
}

static int dim_arg(lua_State *L, int i, const char *name) { return lb_dim(L, i, name); }

static int f_softmax(lua_State *L)
{
    mp_tensor *x = lt_check(L, 1);
    int d = dim_arg(L, 2, "mp.softmax");
    RETURN_TENSOR(L, "mp.softmax", mp_softmax(x, d, 0));
}

static int f_log_softmax(lua_State *L)
{
    mp_tensor *x = lt_check(L, 1);
    int d = dim_arg(L, 2, "mp.log_softmax");
    RETURN_TENSOR(L, "mp.log_softmax", mp_softmax(x, d, 1));
}

static int f_linear(lua_State *L)
{
    if (lfp8_route(L, "linear")) return 1;
    mp_tensor *x = lt_check(L, 1), *w = lt_check(L, 2), *b = lua_isnoneornil(L, 3) ? NULL : lt_check(L, 3);
    RETURN_TENSOR(L, "mp.linear", mp_linear(x, w, b));
}

/* mp.linear_gelu(x, w [, b] [, {approximate="none"|"tanh"}]) */
static int f_linear_gelu(lua_State *L)
{
    if (lfp8_route(L, "linear_gelu")) return 1;
    mp_tensor *x = lt_check(L, 1), *w = lt_check(L, 2), *b = lua_isnoneornil(L, 3) ? NULL : lt_check(L, 3);
    int tanh_form = gelu_form(L, 4, "mp.linear_gelu");
    RETURN_TENSOR(L, "mp.linear_gelu", mp_linear_gelu(x, w, b, tanh_form));
}

static int f_layer_norm(lua_State *L)
{
    mp_tensor *x = lt_check(L, 1);
    mp_tensor *w = lua_isnoneornil(L, 2) ? NULL : lt_check(L, 2), *b = lua_isnoneornil(L, 3) ? NULL : lt_check(L, 3);
    double eps = luaL_optnumber(L, 4, MP_LAYER_NORM_EPS);
    RETURN_TENSOR(L, "mp.layer_norm", mp_layer_norm(x, w, b, eps));
}

/* mp.rms_norm(x, weight [, eps]): weight may be nil; eps nil is MP_RMS_NORM_EPS */
static int f_rms_norm(lua_State *L)
{
    mp_tensor *x = lt_check(L, 1), *w = lua_isnoneornil(L, 2) ? NULL : lt_check(L, 2);
    double eps = luaL_optnumber(L, 3, MP_RMS_NORM_EPS);   /* before RETURN_TENSOR pushes its result's slot */
    RETURN_TENSOR(L, "mp.rms_norm", mp_rms_norm(x, w, eps));
}

static int f_embedding(lua_State *L)
{
    mp_tensor *idx = lt_check(L, 1), *w = lt_check(L, 2);
    RETURN_TENSOR(L, "mp.embedding", mp_embedding(idx, w));
}

static int f_dropout(lua_State *L)
{
    mp_tensor *x = lt_check(L, 1);
    if (lua_type(L, 2) != LUA_TNUMBER)
        return luaL_error(L, "mp.dropout: p must be a number (got %s)", luaL_typename(L, 2));
    double p = lua_tonumber(L, 2);
    bool training = lua_isnone(L, 3) ? true : lua_toboolean(L, 3);
    RETURN_TENSOR(L, "mp.dropout", mp_dropout(x, p, training));
}

/* mp.cross_entropy(logits, targets [, {reduction="mean"|"sum"|"none"}]) */
static int f_cross_entropy(lua_State *L)
{
    mp_tensor *x = lt_check(L, 1), *t = lt_check(L, 2);
    mp_reduction red = MP_REDUCE_MEAN;
    if (lb_check_options(L, 3, "mp.cross_entropy", "reduction:string", 1)) {
        lua_getfield(L, 3, "reduction");
        if (!lua_isnil(L, -1)) {
            const char *r = lua_tostring(L, -1);
            if (r && strcmp(r, "mean") == 0) red = MP_REDUCE_MEAN;
            else if (r && strcmp(r, "sum") == 0) red = MP_REDUCE_SUM;
            else if (r && strcmp(r, "none") == 0) red = MP_REDUCE_NONE;
            else return luaL_error(L, "mp.cross_entropy: reduction must be \"mean\", \"sum\" or \"none\" (got %s)",
                                   r ? r : luaL_typename(L, -1));
        }
        lua_pop(L, 1);
    }
    RETURN_TENSOR(L, "mp.cross_entropy", mp_cross_entropy(x, t, red));
}

static int f_mse_loss(lua_State *L)
{
    mp_tensor *a = lt_check(L, 1), *b = lt_check(L, 2);
    RETURN_TENSOR(L, "mp.mse_loss", mp_mse_loss(a, b));
}

/* mp.cat({t1, t2, ...}, dim) */
static int f_cat(lua_State *L)
{
    int n, d = dim_arg(L, 2, "mp.cat");
    mp_tensor **ts = lb_tensor_list(L, 1, 1 << 20, "list", "mp.cat", &n);
    if (n < 1) return luaL_error(L, "mp.cat: the list is empty");
    RETURN_TENSOR(L, "mp.cat", mp_cat(n, ts, d));
}

/* mp.pow(base, exponent): either may be a number, as Tensor:pow and ^ */
static int f_pow(lua_State *L) { return lt_pow(L, "mp.pow"); }

/* mp.where(cond, a, b): a and b may be numbers */
static int f_where(lua_State *L)
{
    mp_tensor *c = lt_check(L, 1), *ab[2];
    LTensor *tmp[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        if (lua_type(L, i + 2) == LUA_TNUMBER) {
            mp_tensor *ref = lt_opt(L, 3 - i) ? lt_opt(L, 3 - i) : NULL;
            double v = lua_tonumber(L, i + 2);
            mp_dtype dt = ref ? ref->dtype : MP_F32;
            if (!mp_is_float(dt) && (!(v >= INT32_MIN && v <= INT32_MAX) || v != (double)(int64_t)v)) dt = MP_F32;   /* range first: the cast of 2^63 is undefined */
            tmp[i] = lt_new(L);   /* keeps the scalar tensor alive until the call ends */
            lt_set(L, tmp[i], LT_CALL(L, mp_full(dt, c->dev, 0, NULL, lua_tonumber(L, i + 2))), "mp.where");
            ab[i] = tmp[i]->t;
        } else {
            ab[i] = lt_check(L, i + 2);
        }
    }
    RETURN_TENSOR(L, "mp.where", mp_where(c, ab[0], ab[1]));
}

/* mp.attention(q, k, v [, {causal=false, scale=1/sqrt(d), dropout=0}]) */
static int f_attention(lua_State *L)
{
    const char *name = "mp.attention";
    mp_tensor *q = lt_check(L, 1), *k = lt_check(L, 2), *v = lt_check(L, 3);
    bool causal = false;
    double scale = 0, dropout = 0;
    bool has_scale = false;
    if (lb_check_options(L, 4, name, "causal:boolean scale:number dropout:number", 1)) {
        lua_getfield(L, 4, "causal");
        causal = lua_toboolean(L, -1);
        lua_pop(L, 1);
        lua_getfield(L, 4, "scale");
        has_scale = !lua_isnil(L, -1);
        lua_pop(L, 1);
        scale = lb_number_field(L, 4, "scale", 0, name);
        dropout = lb_number_field(L, 4, "dropout", 0, name);
    }
    RETURN_TENSOR(L, name, mp_attention(q, k, v, causal, has_scale ? &scale : NULL, dropout));
}

/* ---- convolution, pooling, batch norm ---- */

/* the value at i as a {rows, columns} pair: an integer (both) or a list of two */
static void pair_at(lua_State *L, int i, const char *what, const char *name, int64_t out[2])
{
    i = lua_absindex(L, i);
    if (lua_type(L, i) == LUA_TNUMBER) {
        out[0] = out[1] = lb_integer(L, i, what, name);
        return;
    }
    if (!lua_istable(L, i) || lua_rawlen(L, i) != 2)
        luaL_error(L, "%s: %s must be an integer or a pair {rows, columns} (got %s)", name, what,
                   lua_istable(L, i) ? "a table that is not a pair" : luaL_typename(L, i));
    for (int k = 0; k < 2; k++) {
        lua_rawgeti(L, i, k + 1);
        out[k] = lb_integer(L, -1, what, name);
        lua_pop(L, 1);
    }
}

/* option key of the table at t as a pair, or dflt when absent */
static void pair_field(lua_State *L, int t, const char *key, const int64_t dflt[2], const char *name, int64_t out[2])
{
    if (lua_getfield(L, t, key) == LUA_TNIL) out[0] = dflt[0], out[1] = dflt[1];
    else pair_at(L, -1, key, name, out);
    lua_pop(L, 1);
}

/* mp.conv2d(x, w [, b], {stride = 1, padding = 0, dilation = 1, groups = 1}) */
static int f_conv2d(lua_State *L)
{
    const char *name = "mp.conv2d";
    mp_tensor *x = lt_check(L, 1), *w = lt_check(L, 2), *b = NULL;
    int o = 3;   /* the options: after b, or in b's place when b is left out */
    if (lt_opt(L, 3)) b = lt_check(L, 3), o = 4;
    else if (lua_isnil(L, 3)) o = 4;
    else if (!lua_isnone(L, 3) && !lua_istable(L, 3))
        return luaL_error(L, "%s: bias must be a tensor or nil (got %s)", name, luaL_typename(L, 3));
    static const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1}, groups = 1;
    if (lb_check_options(L, o, name, "stride:any padding:any dilation:any groups:integer", 1)) {
        pair_field(L, o, "stride", one, name, stride);
        pair_field(L, o, "padding", zero, name, padding);
        pair_field(L, o, "dilation", one, name, dilation);
        groups = lb_integer_field(L, o, "groups", 1, name);
    }
    RETURN_TENSOR(L, name, mp_conv2d(x, w, b, stride, padding, dilation, groups));
}

/* mp.max_pool2d(x, k [, {stride = k, padding = 0}]) and mp.avg_pool2d */
static int pool2d(lua_State *L, const char *name, int max)
{
    mp_tensor *x = lt_check(L, 1);
    int64_t k[2], stride[2], padding[2] = {0, 0};
    static const int64_t zero[2] = {0, 0};
    pair_at(L, 2, "kernel size", name, k);
    stride[0] = k[0], stride[1] = k[1];
    if (lb_check_options(L, 3, name, "stride:any padding:any", 1)) {
        pair_field(L, 3, "stride", k, name, stride);
        pair_field(L, 3, "padding", zero, name, padding);
    }
    RETURN_TENSOR(L, name, max ? mp_max_pool2d(x, k, stride, padding) : mp_avg_pool2d(x, k, stride, padding));
}

static int f_max_pool2d(lua_State *L) { return pool2d(L, "mp.max_pool2d", 1); }
static int f_avg_pool2d(lua_State *L) { return pool2d(L, "mp.avg_pool2d", 0); }

/* mp.adaptive_avg_pool2d(x, size): size an integer or {rows, columns} */
static int f_adaptive_avg_pool2d(lua_State *L)
{
    const char *name = "mp.adaptive_avg_pool2d";
    mp_tensor *x = lt_check(L, 1);
    int64_t out[2];
    pair_at(L, 2, "output size", name, out);
    RETURN_TENSOR(L, name, mp_adaptive_avg_pool2d(x, out));
}

/* mp.batch_norm(x, running_mean, running_var [, w, b], {training = false, momentum = 0.1, eps = 1e-5,
 * residual = z, activation = "relu"}): relu(batch_norm(x) + z) with those two, one op where the backend fuses them */
static int f_batch_norm(lua_State *L)
{
    const char *name = "mp.batch_norm";
    mp_tensor *x = lt_check(L, 1), *t[4] = {NULL, NULL, NULL, NULL}, *z = NULL;
    for (int i = 0; i < 4; i++)
        if (!lua_isnoneornil(L, 2 + i)) t[i] = lt_check(L, 2 + i);
    bool training = false, relu = false;
    double momentum = MP_BATCH_NORM_MOMENTUM, eps = MP_BATCH_NORM_EPS;
    if (lb_check_options(L, 6, name,
                         "training:boolean momentum:number eps:number residual:any activation:string", 1)) {
        lua_getfield(L, 6, "training");
        training = lua_toboolean(L, -1);
        lua_pop(L, 1);
        momentum = lb_number_field(L, 6, "momentum", momentum, name);
        eps = lb_number_field(L, 6, "eps", eps, name);
        lua_getfield(L, 6, "residual");   /* the option table keeps it alive */
        if (!lua_isnil(L, -1)) z = lb_tensor_arg(L, lua_gettop(L), "option 'residual'", name);
        lua_pop(L, 1);
        lua_getfield(L, 6, "activation");
        const char *act = lua_tostring(L, -1);
        if (act && strcmp(act, "relu") == 0) relu = true;
        else if (act && strcmp(act, "none") != 0)
            return luaL_error(L, "%s: option 'activation' must be \"relu\" or \"none\" (got \"%s\")", name, act);
        lua_pop(L, 1);
    }
    RETURN_TENSOR(L, name, mp_batch_norm_act(x, t[0], t[1], t[2], t[3], z, relu, training, momentum, eps));
}

/* mp.multinomial(probs, n [, {replacement = false}]) -> i32 categories (0-based) */
/* mp.multinomial(probs, n [, opts]) and probs:multinomial(n [, opts]): upvalue 1 is the name called */
static int f_multinomial(lua_State *L)
{
    const char *name = lua_tostring(L, lua_upvalueindex(1));
    mp_tensor *p = lt_check(L, 1);
    int64_t n = lb_integer(L, 2, "n", name);
    bool repl = false;
    if (lb_check_options(L, 3, name, "replacement:boolean", 1)) {
        lua_getfield(L, 3, "replacement");
        repl = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    RETURN_TENSOR(L, name, mp_multinomial(p, n, repl));
}

/* ---- grad mode ---- */

static int guard_close(lua_State *L)
{
    int *prev = luaL_checkudata(L, 1, "mp.GradGuard");
    if (*prev >= 0) mp_set_grad_enabled(*prev), *prev = -1;
    return 0;
}

/* local _ <close> = mp.no_grad(): grad mode off until the variable goes out of scope */
static int f_no_grad(lua_State *L)
{
    int *prev = lua_newuserdatauv(L, sizeof(int), 0);
    *prev = -1;
    luaL_setmetatable(L, "mp.GradGuard");
    *prev = mp_set_grad_enabled(false);
    return 1;
}

static int f_set_grad_enabled(lua_State *L)
{
    lua_pushboolean(L, mp_set_grad_enabled(lua_toboolean(L, 1)));
    return 1;
}

static int f_is_grad_enabled(lua_State *L)
{
    lua_pushboolean(L, mp_grad_enabled());
    return 1;
}

static const luaL_Reg funcs[] = {
    {"gelu", f_gelu},
    {"softmax", f_softmax}, {"log_softmax", f_log_softmax}, {"linear", f_linear}, {"linear_gelu", f_linear_gelu},
    {"layer_norm", f_layer_norm}, {"rms_norm", f_rms_norm}, {"embedding", f_embedding}, {"dropout", f_dropout},
    {"cross_entropy", f_cross_entropy}, {"mse_loss", f_mse_loss}, {"cat", f_cat}, {"where", f_where}, {"pow", f_pow},
    {"attention", f_attention}, {"conv2d", f_conv2d}, {"max_pool2d", f_max_pool2d}, {"avg_pool2d", f_avg_pool2d},
    {"adaptive_avg_pool2d", f_adaptive_avg_pool2d}, {"batch_norm", f_batch_norm},
    {"no_grad", f_no_grad}, {"set_grad_enabled", f_set_grad_enabled}, {"is_grad_enabled", f_is_grad_enabled},
    {NULL, NULL}
};

void mp_open_functional(lua_State *L)
{
    lua_pushnumber(L, MP_LAYER_NORM_EPS);
    lua_setfield(L, -2, "_LAYER_NORM_EPS");
    lua_pushnumber(L, MP_RMS_NORM_EPS);
    lua_setfield(L, -2, "_RMS_NORM_EPS");
    lua_pushnumber(L, MP_BATCH_NORM_EPS);
    lua_setfield(L, -2, "_BATCH_NORM_EPS");
    lua_pushnumber(L, MP_BATCH_NORM_MOMENTUM);
    lua_setfield(L, -2, "_BATCH_NORM_MOMENTUM");
    lb_guard_metatable(L, "mp.GradGuard", guard_close);
    luaL_setfuncs(L, funcs, 0);
    bind_described(L);
    lua_pushliteral(L, "mp.multinomial");
    lua_pushcclosure(L, f_multinomial, 1);
    lua_setfield(L, -2, "multinomial");
    lua_getfield(L, -1, "Tensor");
    lua_pushliteral(L, "Tensor:multinomial");
    lua_pushcclosure(L, f_multinomial, 1);
    lua_setfield(L, -2, "multinomial");
    lua_pop(L, 1);
}
