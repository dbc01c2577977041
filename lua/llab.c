/*
 * llab.c: the policy lab's C half: a built-in policy run without a model
 * (core._policy_sim, for mp.amp.replay) and the observer that keeps every op's
 * output and gradient (core._observe, for mp.amp.diagnose). lua/mp/amp/lab.lua
 * is the Lua side.
 */
#include <stdlib.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "lua/lscaler.h"
#include "engine/observe.h"
#include "engine/scaler_sim.h"

/* ---- core._policy_sim(policy_table, init): a built-in policy without a model
 * (engine/scaler.h), for mp.amp.replay: sim:step(reason or nil, amax) -> the
 * next step's scale, at_min; sim:scale() ---- */

#define SIM_MT "mp.PolicySim"

static mp_policy_sim **check_sim(lua_State *L)
{
    mp_policy_sim **u = luaL_checkudata(L, 1, SIM_MT);
    if (!*u) luaL_error(L, "policy simulator: freed");
    return u;
}

static int a_policy_sim(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    mp_policy p = ls_read_policy(L, 1, "mp.amp.replay");
    double init = luaL_optnumber(L, 2, p.init);
    mp_policy_sim **u = lua_newuserdatauv(L, sizeof *u, 0);
    *u = NULL;
    luaL_setmetatable(L, SIM_MT);
    mp_clear_error();
    if (!(*u = mp_policy_sim_new(&p, init))) return lt_error(L, "mp.amp.replay");
    return 1;
}

static int sim_step(lua_State *L)
{
    mp_policy_sim **u = check_sim(L);
    static const char *reasons[] = {"none", "overflow", "nan", "forward", NULL};
    int r = lua_isnoneornil(L, 2) ? 0 : luaL_checkoption(L, 2, NULL, reasons);
    int at_min = 0;
    lua_pushnumber(L, mp_policy_sim_step(*u, (mp_skip_reason)r, luaL_checknumber(L, 3), &at_min));
    lua_pushinteger(L, at_min);
    return 2;
}

static int sim_scale(lua_State *L)
{
    lua_pushnumber(L, mp_policy_sim_scale(*check_sim(L)));
    return 1;
}

static int sim_gc(lua_State *L)
{
    mp_policy_sim **u = luaL_checkudata(L, 1, SIM_MT);
    mp_policy_sim_free(*u);
    *u = NULL;
    return 0;
}

/* core._observe(true): start keeping every op's output and every backward
 * gradient (engine/observe.h); core._observe(false) stops and returns them,
 * in order: {{op =, backward =, input =, tensor =}, ...} */
static int a_observe(lua_State *L)
{
    if (lua_toboolean(L, 1)) {
        if (mp_observe_start()) return luaL_error(L, "mp.amp.diagnose: already observing (diagnose inside diagnose?)");
        return 0;
    }
    mp_observed *l;
    int n;
    mp_observe_stop(&l, &n);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_createtable(L, 0, 4);
        lua_pushstring(L, l[i].op);
        lua_setfield(L, -2, "op");
        lua_pushboolean(L, l[i].backward);
        lua_setfield(L, -2, "backward");
        lua_pushinteger(L, l[i].input + 1);
        lua_setfield(L, -2, "input");
        lt_set(L, lt_new(L), l[i].t, "mp.amp.diagnose");   /* takes the list's reference */
        lua_setfield(L, -2, "tensor");
        lua_rawseti(L, -2, i + 1);
    }
    free(l);
    return 1;
}

void mp_open_lab(lua_State *L)
{
    if (luaL_newmetatable(L, SIM_MT)) {
        static const luaL_Reg sm[] = {{"step", sim_step}, {"scale", sim_scale}, {NULL, NULL}};
        luaL_newlib(L, sm);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, sim_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    static const luaL_Reg f[] = {{"_policy_sim", a_policy_sim}, {"_observe", a_observe}, {NULL, NULL}};
    luaL_setfuncs(L, f, 0);
}
