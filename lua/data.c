/*
 * data.c: the C half of mp.data, registered by mp_open_data as the table
 * `_data` inside mp.core. lua/mp/data.lua wraps it into the public functions
 * (mp.data.read_idx, mp.data.fashion_mnist, mp.data.loader); the underscore
 * marks these as building blocks, not API. Errors carry the public name.
 */
#include "lua/bind.h"
#include "engine/data.h"

/* _data.read_idx(path [, name]) -> tensor; errors start with `name`, by
 * default the public mp.data.read_idx (fashion_mnist passes its own) */
static int d_read_idx(lua_State *L)
{
    const char *name = luaL_optstring(L, 2, "mp.data.read_idx");
    if (lua_type(L, 1) != LUA_TSTRING)
        return luaL_error(L, "%s: path must be a string (got %s)", name, luaL_typename(L, 1));
    const char *path = lua_tostring(L, 1);
    LT_PUSH(L, name, mp_read_idx(path));
    return 1;
}

/* _data.randperm(n, seed) -> i32 tensor, a permutation of 0..n-1 */
static int d_randperm(lua_State *L)
{
    if (!lua_isinteger(L, 1) || !lua_isinteger(L, 2))
        return luaL_error(L, "mp.data.loader: randperm needs integer n and seed (got %s and %s)",
                          luaL_typename(L, 1), luaL_typename(L, 2));
    int64_t n = lua_tointeger(L, 1);
    uint64_t seed = (uint64_t)lua_tointeger(L, 2);
    LT_PUSH(L, "mp.data.loader", mp_randperm(n, seed));
    return 1;
}

/* _data.draw_seed() -> integer drawn from the global stream (see engine/data.h) */
static int d_draw_seed(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)mp_draw_seed());
    return 1;
}

static const luaL_Reg data_funcs[] = {
    {"read_idx", d_read_idx}, {"randperm", d_randperm}, {"draw_seed", d_draw_seed}, {NULL, NULL}
};

void mp_open_data(lua_State *L)
{
    luaL_newlib(L, data_funcs);
    lua_setfield(L, -2, "_data");
}
