/* lerror.c: see lerror.h */
#include "lerror.h"

#include <stdarg.h>
#include <string.h>

/* lauxlib's own functions here, under the ones the header puts in their place */
#undef luaL_where
#undef luaL_error

/* Is the Lua chunk named src ("@path") a file of the mp library? It is when its
 * path has a ".../mp/<rest>.lua" tail and package.searchpath("mp.<rest>") finds
 * that same path: a user's script that merely sits in a folder named mp is not.
 * The answer is kept per source in a registry table. */
static int is_library(lua_State *L, const char *src)
{
    if (src[0] != '@') return 0;
    const char *path = src + 1, *tail = NULL;
    size_t n = strlen(path);
    if (n < 8 || strcmp(path + n - 4, ".lua") != 0) return 0;
    if (strncmp(path, "mp/", 3) == 0) tail = path;
    for (const char *p = strstr(path, "/mp/"); p; p = strstr(p + 1, "/mp/")) tail = p + 1;
    if (!tail) return 0;

    int top = lua_gettop(L), r = 0;
    lua_getfield(L, LUA_REGISTRYINDEX, "mp.library_sources");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "mp.library_sources");
    }
    if (lua_getfield(L, -1, src) != LUA_TNIL) {
        r = lua_toboolean(L, -1);
        lua_settop(L, top);
        return r;
    }
    lua_pop(L, 1);
    /* "mp/nn/layers.lua" -> "mp.nn.layers" */
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (const char *p = tail; p < path + n - 4; p++) luaL_addchar(&b, *p == '/' ? '.' : *p);
    luaL_pushresult(&b);
    int name = lua_gettop(L);
    if (lua_getglobal(L, "package") == LUA_TTABLE && lua_getfield(L, -1, "searchpath") == LUA_TFUNCTION) {
        lua_pushvalue(L, name);
        lua_getfield(L, -3, "path");
        if (lua_isstring(L, -1) && lua_pcall(L, 2, 1, 0) == LUA_OK && lua_isstring(L, -1))
            r = strcmp(lua_tostring(L, -1), path) == 0;
    }
    lua_settop(L, name - 1);
    lua_pushboolean(L, r);
    lua_setfield(L, -2, src);
    lua_settop(L, top);
    return r;
}

void lb_where(lua_State *L, int level)
{
    lua_Debug ar;
    if (lua_getstack(L, level, &ar) && lua_getinfo(L, "Sl", &ar) && ar.currentline > 0 && is_library(L, ar.source)) {
        /* the library called: the first Lua frame above it outside the library
         * (C frames between, such as a pcall the library made, are passed) */
        for (int l = level + 1; lua_getstack(L, l, &ar); l++) {
            if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;
            if (is_library(L, ar.source)) continue;
            lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
            return;
        }
        /* no such frame: the caller tail-called the library (`return
         * mp.nn.LSTM(0, 4)`, as the REPL runs an expression) and is gone
         * from the stack; no position beats the library's own line */
        lua_pushliteral(L, "");
        return;
    }
    luaL_where(L, level);
}

int lb_error(lua_State *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lb_where(L, 1);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_concat(L, 2);
    return lua_error(L);
}

/* mp.core._where([level]) -> "file:line: " of the first frame at or above level
 * (1, the default: the function calling _where) outside the library */
static int l_where(lua_State *L)
{
    int level = (int)luaL_optinteger(L, 1, 1);
    lb_where(L, level);
    return 1;
}

void mp_open_errors(lua_State *L)
{
    lua_pushcfunction(L, l_where);
    lua_setfield(L, -2, "_where");
}
