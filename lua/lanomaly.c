/*
 * lanomaly.c: anomaly mode (mp.autograd.detect_anomaly, set_detect_anomaly,
 * is_anomaly_enabled). The engine checks the backward (engine/anomaly.h); this
 * file tells it where each node's forward ran: the first Lua line on the stack
 * that is not the mp library's own (so an op run by nn.Linear names the line
 * of the script that called the module).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/anomaly.h"

#define GUARD_MT "mp.AnomalyGuard"
#define THREAD_KEY "mp.anomaly_thread"

/* The thread whose stack is read: the one that last turned the mode on
 * (anchored in the registry, so it stays valid). The engine gives the
 * provider no Lua state; ops run on another coroutine get the line at which
 * that thread resumed it. */
static lua_State *thread;
/* the mp library's own sources begin with this ("@/path/lua/mp/"), from
 * package.searchpath("mp", package.path); empty when not found */
static char library[1024];

static bool in_library(const char *source)
{
    size_t n = strlen(library);
    return n && strncmp(source, library, n) == 0;
}

static char *where(void *ctx)
{
    lua_State *L = ctx;
    lua_Debug ar;
    char first[512] = "";
    for (int level = 0; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;   /* a C function */
        char buf[512];
        snprintf(buf, sizeof buf, "%s:%d", ar.short_src, ar.currentline);
        if (!in_library(ar.source)) return strdup(buf);
        if (!*first) memcpy(first, buf, sizeof buf);
    }
    return strdup(*first ? first : "?");   /* only the library's lines (or none): the innermost */
}

static void find_library(lua_State *L)
{
    if (*library) return;
    int top = lua_gettop(L);
    if (lua_getglobal(L, "package") == LUA_TTABLE && lua_getfield(L, -1, "searchpath") == LUA_TFUNCTION) {
        lua_pushliteral(L, "mp");
        lua_getfield(L, -3, "path");
        if (lua_pcall(L, 2, 1, 0) == LUA_OK && lua_type(L, -1) == LUA_TSTRING) {
            const char *path = lua_tostring(L, -1), *slash = strrchr(path, '/');
            if (slash) snprintf(library, sizeof library, "@%.*s", (int)(slash - path + 1), path);
        }
    }
    lua_settop(L, top);
}

/* the mode goes on: lines are read from L's stack from now on */
static void provide(lua_State *L)
{
    find_library(L);
    lua_pushthread(L);
    lua_setfield(L, LUA_REGISTRYINDEX, THREAD_KEY);
    thread = L;
    mp_anomaly_where(where, thread);
}

static int guard_close(lua_State *L)
{
    int *prev = luaL_checkudata(L, 1, GUARD_MT);
    if (*prev >= 0) mp_set_detect_anomaly(*prev), *prev = -1;
    return 0;
}

/* local _ <close> = mp.autograd.detect_anomaly(): the mode on until the variable goes out of scope */
static int a_detect_anomaly(lua_State *L)
{
    int *prev = lua_newuserdatauv(L, sizeof(int), 0);
    *prev = -1;
    luaL_setmetatable(L, GUARD_MT);
    provide(L);
    *prev = mp_set_detect_anomaly(true);
    return 1;
}

/* mp.autograd.set_detect_anomaly(on) -> the previous mode */
static int a_set_detect_anomaly(lua_State *L)
{
    if (!lua_isboolean(L, 1))
        return luaL_error(L, "mp.autograd.set_detect_anomaly: mode must be a boolean (got %s)", luaL_typename(L, 1));
    bool on = lua_toboolean(L, 1);
    if (on) provide(L);
    lua_pushboolean(L, mp_set_detect_anomaly(on));
    return 1;
}

static int a_is_anomaly_enabled(lua_State *L)
{
    lua_pushboolean(L, mp_anomaly_enabled());
    return 1;
}

static const luaL_Reg funcs[] = {
    {"_autograd_detect_anomaly", a_detect_anomaly},
    {"_autograd_set_detect_anomaly", a_set_detect_anomaly},
    {"_autograd_is_anomaly_enabled", a_is_anomaly_enabled},
    {NULL, NULL}
};

/* the state closes: the engine must not read its stacks any more */
static int forget_state(lua_State *L)
{
    (void)L;
    if (thread) mp_anomaly_where(NULL, NULL), thread = NULL;
    return 0;
}

void mp_open_anomaly(lua_State *L)
{
    lua_newuserdatauv(L, 0, 0);   /* anchored in the registry: collected at lua_close only */
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, forget_state);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, "mp.anomaly_state");
    lb_guard_metatable(L, GUARD_MT, guard_close);
    luaL_setfuncs(L, funcs, 0);
}
