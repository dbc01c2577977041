/*
 * ldist.c: mp.dist, processes that train together (engine/dist.h): the world,
 * its collectives on tensors, and the guard that keeps gradients local
 * (gradient accumulation). lua/mp/dist.lua adds what is plain Lua.
 */
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/dist.h"

/* mp.dist.init([{device_collectives = false, timeout = 1800}]) -> rank, size */
static int d_init(lua_State *L)
{
    bool self = false;
    if (lb_check_options(L, 1, "mp.dist.init", "device_collectives:boolean timeout:number", 1)) {
        lua_getfield(L, 1, "device_collectives");
        self = lua_toboolean(L, -1);
        if (lua_getfield(L, 1, "timeout") != LUA_TNIL) {
            double s = lua_tonumber(L, -1);
            if (!(s > 0)) return luaL_error(L, "mp.dist.init: option timeout must be a number of seconds > 0 (got %s)",
                                            lua_tostring(L, -1));
            mp_dist_set_timeout(s);
        }
        lua_pop(L, 2);
    }
    mp_clear_error();
    if (mp_dist_init(self)) return lt_error(L, "mp.dist.init");
    lua_pushinteger(L, mp_dist_rank());
    lua_pushinteger(L, mp_dist_size());
    return 2;
}

static int d_rank(lua_State *L) { lua_pushinteger(L, mp_dist_rank()); return 1; }
static int d_size(lua_State *L) { lua_pushinteger(L, mp_dist_size()); return 1; }
static int d_local_rank(lua_State *L) { lua_pushinteger(L, mp_dist_local_rank()); return 1; }
static int d_local_size(lua_State *L) { lua_pushinteger(L, mp_dist_local_size()); return 1; }
static int d_backend(lua_State *L) { lua_pushstring(L, mp_dist_backend()); return 1; }
static int d_is_initialized(lua_State *L) { lua_pushboolean(L, mp_dist_initialized()); return 1; }
static int d_timeout(lua_State *L) { lua_pushnumber(L, mp_dist_timeout()); return 1; }

/* mp.dist.all_reduce(t [, "sum"|"mean"|"max"|"min"]) -> t, reduced in place */
static int d_all_reduce(lua_State *L)
{
    static const char *ops[] = {"sum", "mean", "max", "min", NULL};
    mp_tensor *t = lt_check(L, 1);
    if (!lua_isnoneornil(L, 2) && lua_type(L, 2) != LUA_TSTRING)
        return luaL_error(L, "mp.dist.all_reduce: op must be \"sum\", \"mean\", \"max\" or \"min\" (got %s)", luaL_typename(L, 2));
    const char *op = luaL_optstring(L, 2, "sum");
    int k = 0;
    while (ops[k] && strcmp(ops[k], op) != 0) k++;
    if (!ops[k]) return luaL_error(L, "mp.dist.all_reduce: op must be \"sum\", \"mean\", \"max\" or \"min\" (got '%s')", op);
    mp_clear_error();
    if (mp_dist_all_reduce(t, (mp_dist_op)k)) return lt_error(L, "mp.dist.all_reduce");
    lua_settop(L, 1);
    return 1;
}

/* mp.dist.broadcast(t [, root = 0]) -> t, root's values on every rank */
static int d_broadcast(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    int64_t root = lua_isnoneornil(L, 2) ? 0 : lb_integer(L, 2, "root", "mp.dist.broadcast");
    if (root < 0 || root > 1 << 30) return luaL_error(L, "mp.dist.broadcast: root %I is not a rank (0..%d)", (lua_Integer)root, mp_dist_size() - 1);
    mp_clear_error();
    if (mp_dist_broadcast(t, (int)root)) return lt_error(L, "mp.dist.broadcast");
    lua_settop(L, 1);
    return 1;
}

/* mp.dist.all_gather(t) -> {size, t's shape...} */
static int d_all_gather(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    LT_PUSH(L, "mp.dist.all_gather", mp_dist_all_gather(t));
    return 1;
}

static int d_barrier(lua_State *L)
{
    mp_clear_error();
    if (mp_dist_barrier()) return lt_error(L, "mp.dist.barrier");
    return 0;
}

static int d_finalize(lua_State *L)
{
    mp_clear_error();
    if (mp_dist_finalize()) return lt_error(L, "mp.dist.finalize");
    return 0;
}

/* local _ <close> = mp.dist.no_sync(): backward leaves gradients local until
 * the scope ends (gradient accumulation; the next backward outside averages
 * everything accumulated) */
static int guard_close(lua_State *L)
{
    int *on = luaL_checkudata(L, 1, "mp.NoSyncGuard");
    if (*on) mp_dist_no_sync(-1), *on = 0;
    return 0;
}

static int d_no_sync(lua_State *L)
{
    int *on = lua_newuserdatauv(L, sizeof(int), 0);
    *on = 1;
    luaL_setmetatable(L, "mp.NoSyncGuard");
    mp_dist_no_sync(1);
    return 1;
}

static const luaL_Reg funcs[] = {
    {"init", d_init}, {"rank", d_rank}, {"size", d_size}, {"local_rank", d_local_rank},
    {"local_size", d_local_size}, {"backend", d_backend}, {"is_initialized", d_is_initialized}, {"timeout", d_timeout},
    {"all_reduce", d_all_reduce}, {"broadcast", d_broadcast}, {"all_gather", d_all_gather},
    {"barrier", d_barrier}, {"finalize", d_finalize}, {"no_sync", d_no_sync}, {NULL, NULL}
};

void mp_open_dist(lua_State *L)
{
    lb_guard_metatable(L, "mp.NoSyncGuard", guard_close);
    luaL_newlib(L, funcs);
    lua_setfield(L, -2, "_dist");
}
