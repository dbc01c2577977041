/*
 * ldata.c: the C half of mp.data, registered by mp_open_data as the table
 * `_data` inside mp.core. lua/mp/data.lua wraps it into the public functions
 * (mp.data.read_idx, mp.data.fashion_mnist, mp.data.loader, mp.data.text); the underscore
 * marks these as building blocks, not API. Errors carry the public name.
 */
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/data_idx.h"
#include "engine/data_file.h"
#include "engine/data_vocab.h"
#include "engine/data_perm.h"

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

/* _data.read_bytes(path, max_bytes [, name]) -> the file's bytes as a u8
 * tensor, or nil for an empty file (engine/data_file.c: regular files only, at
 * most max_bytes); errors start with `name`, by default mp.data.text */
static int d_read_bytes(lua_State *L)
{
    const char *name = luaL_optstring(L, 3, "mp.data.text");
    if (lua_type(L, 1) != LUA_TSTRING)
        return luaL_error(L, "%s: path must be a string (got %s)", name, luaL_typename(L, 1));
    if (!lua_isinteger(L, 2))
        return luaL_error(L, "%s: max_bytes must be an integer (got %s)", name, luaL_typename(L, 2));
    const char *path = lua_tostring(L, 1);
    int64_t max_bytes = lua_tointeger(L, 2);
    LTensor *u = lt_new(L);   /* before the read: a failing lt_new leaks no tensor */
    mp_tensor *t;
    mp_clear_error();
    int rc = mp_read_file_bytes(path, max_bytes, &t);
    if (rc && mp_errcode_last() == MP_EOOM) {   /* as LT_CALL: collect, then once more */
        lua_gc(L, LUA_GCCOLLECT);
        mp_clear_error();
        rc = mp_read_file_bytes(path, max_bytes, &t);
    }
    if (rc) return lt_error(L, name);
    if (!t) {
        lua_pushnil(L);
        return 1;
    }
    lt_set(L, u, t, name);
    return 1;
}

/* _data.byte_ids(src [, vocab [, name]]) -> i32 ids [, vocab]: src is a string or
 * a 1-d u8 cpu tensor. With vocab (a string of distinct bytes) each byte's index
 * there; without, the vocabulary is src's distinct bytes in increasing order and
 * comes back as a string after the ids. */
static int d_byte_ids(lua_State *L)
{
    const char *name = luaL_optstring(L, 3, "mp.data.text");
    const unsigned char *p;
    size_t n;
    mp_tensor *t = lt_opt(L, 1);
    if (t) {
        if (t->dtype != MP_U8 || t->dev != MP_CPU || t->ndim != 1)
            return luaL_error(L, "%s: bytes must be a 1-d u8 cpu tensor (got %s %dd on %s)", name,
                              mp_dtype_name(t->dtype), t->ndim, mp_device_name(t->dev));
        p = mp_data(t), n = (size_t)t->numel;
    } else if (lua_type(L, 1) == LUA_TSTRING) {
        p = (const unsigned char *)lua_tolstring(L, 1, &n);
    } else {
        return luaL_error(L, "%s: bytes must be a string or a u8 tensor (got %s)", name, luaL_typename(L, 1));
    }
    unsigned char own[256];
    const unsigned char *vocab = own;
    size_t nvocab;
    int given = !lua_isnoneornil(L, 2);
    if (given) {
        if (lua_type(L, 2) != LUA_TSTRING)
            return luaL_error(L, "%s: vocab must be a string (got %s)", name, luaL_typename(L, 2));
        vocab = (const unsigned char *)lua_tolstring(L, 2, &nvocab);
    } else {
        nvocab = (size_t)mp_byte_vocab(p, (int64_t)n, own);
    }
    LT_PUSH(L, name, mp_byte_ids(p, (int64_t)n, vocab, nvocab > 256 ? 257 : (int)nvocab));
    if (given) return 1;
    lua_pushlstring(L, (const char *)own, nvocab);
    return 2;
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

/* _data.draw_seed() -> integer drawn from the global stream (see engine/data_perm.h) */
static int d_draw_seed(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)mp_draw_seed());
    return 1;
}

static const luaL_Reg data_funcs[] = {
    {"read_idx", d_read_idx}, {"read_bytes", d_read_bytes}, {"byte_ids", d_byte_ids},
    {"randperm", d_randperm},  {"draw_seed", d_draw_seed},   {NULL, NULL}
};

void mp_open_data(lua_State *L)
{
    luaL_newlib(L, data_funcs);
    lua_setfield(L, -2, "_data");
}
