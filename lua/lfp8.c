/*
 * lfp8.c: the C half of mp.fp8 (lua/mp/fp8.lua checks the options and calls
 * these): core._fp8_quantize, core._fp8_matmul and core._fp8_codes over
 * engine/ops_fp8.c.
 */
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/autocast.h"

/* _fp8_quantize(x, format, granularity, scale|nil, counts) -> q, scales, amax
 * [, saturated, flushed] (counts true) | [, counts tensor] (counts "tensor") */
static int f_quantize(lua_State *L)
{
    const char *name = "mp.fp8.quantize";
    mp_tensor *x = lb_tensor_arg(L, 1, "x", name);
    mp_dtype fmt = lb_dtype(L, 2, name);
    const char *g = luaL_checkstring(L, 3);
    mp_quant_kind kind = !strcmp(g, "tile")    ? MP_QUANT_1X128
                         : !strcmp(g, "block") ? MP_QUANT_128X128
                         : !strcmp(g, "mx")    ? MP_QUANT_MX
                                               : MP_QUANT_TENSOR;
    int on_dev = lua_type(L, 5) == LUA_TSTRING, want = !on_dev && lua_toboolean(L, 5);
    /* the given scale: a tensor, or a number made one on x's device */
    mp_tensor *s = NULL;
    if (lua_type(L, 4) == LUA_TNUMBER) {
        int64_t one = 1;
        LT_PUSH(L, name, mp_full(MP_F32, x->dev, 1, &one, lua_tonumber(L, 4)));
        lua_replace(L, 4);
    }
    if (!lua_isnoneornil(L, 4)) s = lb_tensor_arg(L, 4, "scale", name);
    lua_settop(L, 5);
    mp_fp8_counts n = {0, 0};
    mp_tensor *amax = NULL, *cd = NULL;
    LT_PUSH(L, name, mp_fp8_quantize(x, fmt, kind, s, &amax, want ? &n : NULL, on_dev ? &cd : NULL));
    mp_tensor *q = lt_check(L, lua_gettop(L));
    /* pushed first: nothing can fail between their making and here */
    LT_PUSH(L, name, amax);
    if (on_dev) LT_PUSH(L, name, cd);
    LT_PUSH(L, name, mp_retain(q->quant.scales));
    lua_rotate(L, on_dev ? -3 : -2, 1);   /* q, scales, amax [, counts] */
    if (on_dev) return 4;
    if (!want) return 3;
    lua_pushinteger(L, (lua_Integer)n.saturated);
    lua_pushinteger(L, (lua_Integer)n.flushed);
    return 5;
}

/* _fp8_matmul(a, b, out_dtype, acc_bits, promote_every, fast, acc_round) -> c
 * (acc_round: "nearest" | "truncate") */
static int f_matmul(lua_State *L)
{
    const char *name = "mp.fp8.matmul";
    mp_tensor *a = lb_tensor_arg(L, 1, "a", name), *b = lb_tensor_arg(L, 2, "b", name);
    mp_dtype out = lb_dtype(L, 3, name);
    int bits = (int)lb_integer_in(L, 4, "acc_bits", name, 0, 23);
    int64_t every = lb_integer_in(L, 5, "promote_every", name, 0, INT64_MAX);
    const char *rnd = luaL_optstring(L, 7, "nearest");
    int acc_round = !strcmp(rnd, "truncate") ? MP_FP8_ACC_TRUNCATE : !strcmp(rnd, "nearest") ? MP_FP8_ACC_NEAREST : -1;
    LT_PUSH(L, name, mp_fp8_matmul(a, b, out, bits, every, acc_round, lua_toboolean(L, 6)));
    return 1;
}

/* _fp8_codes(q) -> q's codes without their scales */
static int f_codes(lua_State *L)
{
    lb_max_args(L, 1, "mp.fp8.codes");
    mp_tensor *q = lb_tensor_arg(L, 1, "q", "mp.fp8.codes");
    LT_PUSH(L, "mp.fp8.codes", mp_fp8_codes(q));
    return 1;
}

/* The FP8 route of the functional GEMMs (mp.linear, mp.linear_gelu, mp.matmul, Tensor:matmul)
 * inside mp.fp8.autocast(..., {matmul = true}): the region installs a Lua
 * function (core._fp8_route(fn)) and removes it when the last such region
 * closes (core._fp8_route(nil)). Outside those regions the ops pay one test of
 * route_on: no Lua call, no lookup. With it on, an op of autocast's low class
 * under an active region calls fn(op, args...); a nil result (a batched
 * matmul, a region without the option) runs the op as before. */
#define ROUTE_KEY "mp.fp8_route"
static int route_on;   /* how many states have a route installed (the function itself is in each one's registry) */

int lfp8_route(lua_State *L, const char *op)
{
    if (!route_on) return 0;
    if (!mp_autocast_active(NULL) || mp_autocast_class(op) != MP_AC_LOW) return 0;
    if (lua_getfield(L, LUA_REGISTRYINDEX, ROUTE_KEY) != LUA_TFUNCTION) {
        lua_pop(L, 1);
        return 0;
    }
    int n = lua_gettop(L) - 1;
    lua_pushstring(L, op);
    for (int i = 1; i <= n; i++) lua_pushvalue(L, i);
    lua_call(L, n + 1, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return 0;
    }
    return 1;
}

/* _fp8_route(fn | nil) */
static int f_route(lua_State *L)
{
    bool on = !lua_isnoneornil(L, 1);
    if (on) luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_settop(L, 1);
    bool was = lua_getfield(L, LUA_REGISTRYINDEX, ROUTE_KEY) == LUA_TFUNCTION;
    lua_pop(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, ROUTE_KEY);
    route_on += (int)on - (int)was;   /* the states with a route installed */
    return 0;
}

static const luaL_Reg funcs[] = {{"_fp8_quantize", f_quantize}, {"_fp8_matmul", f_matmul}, {"_fp8_codes", f_codes},
                                 {"_fp8_route", f_route}, {NULL, NULL}};

void mp_open_fp8(lua_State *L) { luaL_setfuncs(L, funcs, 0); }
