/*
 * fuzz_lua.c: three libFuzzer targets through the Lua binding, in one Lua state
 * kept across inputs (a full collection after each, so a freed tensor's
 * finalizer runs while the fuzzer still watches):
 * - FUZZ_LOAD: mp.load on any bytes (the structure description in the
 *   metadata included), then every loaded value touched;
 * - FUZZ_API: tests/fuzz/api_driver.lua turns the bytes into a program of API
 *   calls with random arguments and hostile metatables (lying __len, __index
 *   that frees tensors mid-call), each call under pcall;
 * - FUZZ_TEXT: mp.data.text on any bytes as a file, then encode, decode and
 *   mp.data.windows on the result (tests/fuzz/text_driver.lua), which also
 *   checks what they promise: a broken promise comes back as a string and
 *   is a finding like a crash.
 * A Lua error is an answer; a crash, a sanitizer report or a leak is a finding.
 */
#include <stdlib.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include "tests/fuzz/fuzz_input.h"
#include "lua/mp_core.h"

static lua_State *L;

static void fail_lua(const char *what)
{
    fprintf(stderr, "fuzz_lua: %s: %s\n", what, lua_tostring(L, -1));
    abort();
}

static void setup(void)
{
    L = luaL_newstate();
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_mp_core);
    lua_setfield(L, -2, "mp.core");
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_pushstring(L, MP_ROOT "/lua/?.lua;" MP_ROOT "/lua/?/init.lua");
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    fuzz_path(".st");   /* sets the memory limit */
#if defined FUZZ_API
    if (luaL_dofile(L, MP_ROOT "/tests/fuzz/api_driver.lua")) fail_lua("api_driver.lua");
    lua_setglobal(L, "FUZZ_RUN");
#elif defined FUZZ_TEXT
    if (luaL_dofile(L, MP_ROOT "/tests/fuzz/text_driver.lua")) fail_lua("text_driver.lua");
    lua_setglobal(L, "FUZZ_RUN");
#else
    if (luaL_dostring(L, "local mp = require 'mp'\n"
                         "local function touch(v, depth)\n"
                         "  if depth > 40 then return end\n"
                         "  if type(v) == 'table' then for k, x in pairs(v) do touch(k, depth + 1); touch(x, depth + 1) end\n"
                         "  elseif type(v) == 'userdata' then local _ = tostring(v); v:sum():item() end\n"
                         "end\n"
                         "FUZZ_RUN = function(path) local t, meta = mp.load(path); touch(t, 0); touch(meta, 0) end"))
        fail_lua("load driver");
#endif
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!L) setup();
    lua_getglobal(L, "FUZZ_RUN");
#if defined FUZZ_API
    lua_pushlstring(L, (const char *)data, size);
    int nargs = 1;
#elif defined FUZZ_TEXT
    lua_pushstring(L, fuzz_file(data, size, ".st"));
    lua_pushlstring(L, (const char *)data, size);
    int nargs = 2;
#else
    lua_pushstring(L, fuzz_file(data, size, ".st"));
    int nargs = 1;
#endif
    if (lua_pcall(L, nargs, 1, 0) != LUA_OK) {
        if (lua_type(L, -1) != LUA_TSTRING) fail_lua("an error that is not a message");
    }
#ifdef FUZZ_TEXT
    else if (lua_type(L, -1) == LUA_TSTRING) fail_lua("text_driver.lua: a broken promise");
#endif
    lua_pop(L, 1);
    lua_gc(L, LUA_GCCOLLECT);
    return 0;
}
