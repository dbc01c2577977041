/*
 * linplace.c: mp.clamp and the in-place tensor methods (add_, mul_, clamp_,
 * fill_, zero_, exp_, ...) over engine/ops_inplace.c. Each in-place method
 * returns self, so calls chain: w:zero_():add_(1).
 */
#include <math.h>
#include "lua/lbind.h"
#include "lua/lcore.h"

/* run an in-place engine call; on out of memory collect garbage and try once
 * more (the engine writes nothing before its allocations succeed) */
#define INPLACE_CALL(L, NAME, EXPR)                                        \
    do {                                                                   \
        mp_clear_error();                                                  \
        int rc_ = (EXPR);                                                  \
        if (rc_ && mp_errcode_last() == MP_EOOM) {                         \
            lua_gc((L), LUA_GCCOLLECT);                                    \
            mp_clear_error();                                              \
            rc_ = (EXPR);                                                  \
        }                                                                  \
        if (rc_) lt_error((L), (NAME));                                    \
    } while (0)

/* a bound of clamp: nil (absent, *has false) or a number */
static double bound(lua_State *L, int i, const char *what, const char *name, bool *has)
{
    *has = !lua_isnoneornil(L, i);
    if (!*has) return 0;
    if (lua_type(L, i) != LUA_TNUMBER)
        luaL_error(L, "%s: %s must be a number or nil (got %s)", name, what, luaL_typename(L, i));
    return lua_tonumber(L, i);
}

/* x, min, max from index i on: the engine's bound pointers */
static void bounds(lua_State *L, int i, const char *name, double v[2], const double *p[2])
{
    bool has[2];
    v[0] = bound(L, i, "min", name, &has[0]);
    v[1] = bound(L, i + 1, "max", name, &has[1]);
    p[0] = has[0] ? &v[0] : NULL;
    p[1] = has[1] ? &v[1] : NULL;
}

static int clamp_as(lua_State *L, const char *name)
{
    lb_max_args(L, 3, name);
    mp_tensor *x = lb_tensor_arg(L, 1, "x", name);
    double v[2];
    const double *p[2];
    bounds(L, 2, name, v, p);
    LT_PUSH(L, name, mp_clamp(x, p[0], p[1]));
    return 1;
}

static int m_clamp(lua_State *L) { return clamp_as(L, "mp.clamp"); }
static int t_clamp(lua_State *L) { return clamp_as(L, "Tensor:clamp"); }

static int t_clamp_(lua_State *L)
{
    lb_max_args(L, 3, "Tensor:clamp_");
    mp_tensor *x = lb_tensor_arg(L, 1, "self", "Tensor:clamp_");
    double v[2];
    const double *p[2];
    bounds(L, 2, "Tensor:clamp_", v, p);
    INPLACE_CALL(L, "Tensor:clamp_", mp_clamp_(x, p[0], p[1]));
    lua_settop(L, 1);
    return 1;
}

/* add_, sub_, mul_, div_, pow_: other a tensor or a number */
typedef struct { const char *key, *name; mp_binop op; } bin_method;
static const bin_method bin_methods[] = {
    {"add_", "Tensor:add_", MP_ADD}, {"sub_", "Tensor:sub_", MP_SUB}, {"mul_", "Tensor:mul_", MP_MUL},
    {"div_", "Tensor:div_", MP_DIV}, {"pow_", "Tensor:pow_", MP_POWT},
};

static int t_binary_(lua_State *L)
{
    const bin_method *m = lua_touserdata(L, lua_upvalueindex(1));
    lb_max_args(L, 2, m->name);
    mp_tensor *t = lb_tensor_arg(L, 1, "self", m->name), *o = lt_opt(L, 2);
    if (o) {
        INPLACE_CALL(L, m->name, mp_binary_(m->op, t, o));
    } else if (lua_type(L, 2) == LUA_TNUMBER) {
        double s = lua_tonumber(L, 2);
        INPLACE_CALL(L, m->name, mp_binary_scalar_(m->op, t, s));
    } else {
        return luaL_error(L, "%s: other must be a tensor or a number (got %s)", m->name, luaL_typename(L, 2));
    }
    lua_settop(L, 1);
    return 1;
}

/* the unary ones: exp_, relu_, ... */
typedef struct { const char *key, *name; mp_unop op; } un_method;
static const un_method un_methods[] = {
    {"neg_", "Tensor:neg_", MP_NEG}, {"abs_", "Tensor:abs_", MP_ABS}, {"exp_", "Tensor:exp_", MP_EXP},
    {"log_", "Tensor:log_", MP_LOG}, {"sqrt_", "Tensor:sqrt_", MP_SQRT}, {"relu_", "Tensor:relu_", MP_RELU},
    {"tanh_", "Tensor:tanh_", MP_TANH}, {"sigmoid_", "Tensor:sigmoid_", MP_SIGMOID},
};

static int t_unary_(lua_State *L)
{
    const un_method *m = lua_touserdata(L, lua_upvalueindex(1));
    mp_tensor *t = lb_tensor_arg(L, 1, "self", m->name);
    if (!lua_isnone(L, 2)) return luaL_error(L, "%s: takes no arguments", m->name);
    INPLACE_CALL(L, m->name, mp_unary_(m->op, t, 0));
    lua_settop(L, 1);
    return 1;
}

static int t_fill_(lua_State *L)
{
    lb_max_args(L, 2, "Tensor:fill_");
    mp_tensor *t = lb_tensor_arg(L, 1, "self", "Tensor:fill_");
    if (lua_type(L, 2) != LUA_TNUMBER)
        return luaL_error(L, "Tensor:fill_: value must be a number (got %s)", luaL_typename(L, 2));
    double v = lua_tonumber(L, 2);
    INPLACE_CALL(L, "Tensor:fill_", mp_fill_(t, v));
    lua_settop(L, 1);
    return 1;
}

static int t_zero_(lua_State *L)
{
    lb_max_args(L, 1, "Tensor:zero_");
    mp_tensor *t = lb_tensor_arg(L, 1, "self", "Tensor:zero_");
    INPLACE_CALL(L, "Tensor:zero_", mp_fill_(t, 0));
    lua_settop(L, 1);
    return 1;
}

/* t:_version(): t's storage version (PyTorch's t._version): what in-place writes bump */
static int t_version(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    lua_pushinteger(L, (lua_Integer)t->st->version);
    return 1;
}

void mp_open_inplace(lua_State *L)
{
    lua_pushcfunction(L, m_clamp);
    lua_setfield(L, -2, "clamp");
    lua_getfield(L, -1, "Tensor");   /* the methods table (luaopen_mp_core) */
    lua_pushcfunction(L, t_clamp), lua_setfield(L, -2, "clamp");
    lua_pushcfunction(L, t_clamp_), lua_setfield(L, -2, "clamp_");
    lua_pushcfunction(L, t_fill_), lua_setfield(L, -2, "fill_");
    lua_pushcfunction(L, t_zero_), lua_setfield(L, -2, "zero_");
    lua_pushcfunction(L, t_version), lua_setfield(L, -2, "_version");
    for (size_t i = 0; i < sizeof bin_methods / sizeof *bin_methods; i++) {
        lua_pushlightuserdata(L, (void *)&bin_methods[i]);
        lua_pushcclosure(L, t_binary_, 1);
        lua_setfield(L, -2, bin_methods[i].key);
    }
    for (size_t i = 0; i < sizeof un_methods / sizeof *un_methods; i++) {
        lua_pushlightuserdata(L, (void *)&un_methods[i]);
        lua_pushcclosure(L, t_unary_, 1);
        lua_setfield(L, -2, un_methods[i].key);
    }
    lua_pop(L, 1);
}
