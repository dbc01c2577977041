/*
 * lutil.c: small host services for scripts: a monotonic clock for timing,
 * whether stdout is a terminal (progress bars), and the random generator's
 * state for checkpoints.
 */
#include <time.h>
#include <unistd.h>
#include "engine/error.h"
#include "lua/lbind.h"
#include "lua/lcore.h"

/* mp.clock() -> seconds from an arbitrary start, monotonic, sub-microsecond */
static int u_clock(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
    return 1;
}

/* mp.isatty([fd=1]) */
static int u_isatty(lua_State *L)
{
    lua_pushboolean(L, isatty(lua_isnoneornil(L, 1) ? 1 : (int)lb_integer_in(L, 1, "fd", "mp.isatty", 0, INT32_MAX)));
    return 1;
}

/* mp.get_rng_state() -> {seed=, offset=}: the whole state of the counter-based generator */
static int u_get_rng_state(lua_State *L)
{
    uint64_t seed, offset;
    mp_rng_get(&seed, &offset);
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, (lua_Integer)seed);
    lua_setfield(L, -2, "seed");
    lua_pushinteger(L, (lua_Integer)offset);
    lua_setfield(L, -2, "offset");
    return 1;
}

static int u_set_rng_state(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "seed");
    lua_getfield(L, 1, "offset");
    if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1))
        return luaL_error(L, "mp.set_rng_state: expected {seed = integer, offset = integer}");
    mp_clear_error();
    if (mp_rng_restore((uint64_t)lua_tointeger(L, -2), (uint64_t)lua_tointeger(L, -1)))
        return lt_error(L, "mp.set_rng_state");
    return 0;
}

static const luaL_Reg funcs[] = {
    {"clock", u_clock}, {"isatty", u_isatty}, {"get_rng_state", u_get_rng_state},
    {"set_rng_state", u_set_rng_state}, {NULL, NULL}
};

void mp_open_util(lua_State *L) { luaL_setfuncs(L, funcs, 0); }
