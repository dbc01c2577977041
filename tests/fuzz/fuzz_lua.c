/*
 * fuzz_lua.c: four libFuzzer targets through the Lua binding, in one Lua state
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
 *   is a finding like a crash;
 * - FUZZ_TRACE: mp.amp.load_trace on the bytes after the first, as they are or
 *   (the first byte odd) gzip-compressed here, so that mutations of the JSON go
 *   through the gzip reader too; every record of an accepted trace is read and
 *   the trace replayed under a built-in and a Lua policy.
 * A Lua error is an answer; a crash, a sanitizer report or a leak is a finding,
 * and so is, for FUZZ_TRACE, a refusal that does not name the function, the file
 * and the line, or an accepted trace that replay cannot run (for FUZZ_TEXT and
 * FUZZ_TRACE the driver returns such findings as a string).
 */
#include <stdlib.h>
#include <zlib.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include "tests/fuzz/fuzz_input.h"
#include "lua/lcore.h"

static lua_State *L;

#ifdef FUZZ_TRACE
#define FUZZ_EXT ".jsonl"
#else
#define FUZZ_EXT ".st"
#endif

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
    fuzz_path(FUZZ_EXT);   /* sets the memory limit */
#ifdef FUZZ_API
    if (luaL_dofile(L, MP_ROOT "/tests/fuzz/api_driver.lua")) fail_lua("api_driver.lua");
    lua_setglobal(L, "FUZZ_RUN");
#elif defined FUZZ_TEXT
    if (luaL_dofile(L, MP_ROOT "/tests/fuzz/text_driver.lua")) fail_lua("text_driver.lua");
    lua_setglobal(L, "FUZZ_RUN");
#elif defined FUZZ_TRACE
    if (luaL_dostring(L, "local mp = require 'mp'\n"
                         "local lua_policy = {update = function(_, info) return info.found_inf and info.scale / 2 or info.scale end}\n"
                         "FUZZ_RUN = function(path)\n"
                         "  local ok, tr = pcall(mp.amp.load_trace, path)\n"
                         "  if not ok then\n"
                         "    local at = type(tr) == 'string' and tr:find(\"mp.amp.load_trace: '\" .. path .. \"' line \", 1, true)\n"
                         "    if not (at and tr:find('^%d+: ', at + #path + 27)) then return 'a refusal without the file and line: ' .. tostring(tr) end\n"
                         "    return\n"
                         "  end\n"
                         "  for i, r in ipairs(tr.steps) do\n"
                         "    if type(r.step) ~= 'number' or #r.params > 0 and #r.params[1].hist ~= 64 then return 'record ' .. i .. ' is not as documented' end\n"
                         "  end\n"
                         "  for _, pol in ipairs{mp.amp.policy.dynamic{}, lua_policy} do\n"
                         "    local ok2, e = pcall(mp.amp.replay, tr, pol)\n"
                         "    if not ok2 then return 'replay of an accepted trace failed: ' .. tostring(e) end\n"
                         "    if #e ~= #tr.steps then return 'replay gave ' .. #e .. ' steps of ' .. #tr.steps end\n"
                         "    for _, x in ipairs(e) do local _ = x.underflow end\n"
                         "  end\n"
                         "end"))
        fail_lua("trace driver");
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

#ifdef FUZZ_TRACE
/* the input after its first byte as a file: as it is, or gzip-compressed when
 * the first byte is odd */
static const char *trace_file(const uint8_t *data, size_t size)
{
    if (size == 0 || !(data[0] & 1)) return fuzz_file(size ? data + 1 : data, size ? size - 1 : 0, FUZZ_EXT);
    const char *path = fuzz_path(FUZZ_EXT);
    gzFile f = gzopen(path, "wb6");
    if (!f || (size > 1 && gzwrite(f, data + 1, (unsigned)(size - 1)) != (int)(size - 1)) || gzclose(f) != Z_OK) abort();
    return path;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!L) setup();
    lua_getglobal(L, "FUZZ_RUN");
#if defined FUZZ_API
    lua_pushlstring(L, (const char *)data, size);
    int nargs = 1;
#elif defined FUZZ_TEXT
    lua_pushstring(L, fuzz_file(data, size, FUZZ_EXT));
    lua_pushlstring(L, (const char *)data, size);
    int nargs = 2;
#elif defined FUZZ_TRACE
    lua_pushstring(L, trace_file(data, size));
    int nargs = 1;
#else
    lua_pushstring(L, fuzz_file(data, size, FUZZ_EXT));
    int nargs = 1;
#endif
    if (lua_pcall(L, nargs, 1, 0) != LUA_OK) {
        if (lua_type(L, -1) != LUA_TSTRING) fail_lua("an error that is not a message");
    }
#if defined FUZZ_TEXT || defined FUZZ_TRACE
    else if (lua_type(L, -1) == LUA_TSTRING) fail_lua("a finding: the driver's own check failed");
#endif
    lua_pop(L, 1);
    lua_gc(L, LUA_GCCOLLECT);
    return 0;
}
