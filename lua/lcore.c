/*
 * lcore.c: luaopen_mp_core, the C half of the `mp` module: tensor
 * constructors, the random seed, devices, memory figures and functional
 * aliases of tensor methods (mp.matmul). lua/mp/init.lua builds on it.
 */
#include <string.h>
#include "engine/capture.h"
#include "engine/memory.h"
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/autograd.h"

/* ---- mp.tensor(data [, opts]) ---- */

/* the shape of nested tables, following the first element at each level */
static int nested_shape(lua_State *L, int i, int64_t *shape)
{
    int nd = 0;
    lua_Integer total = 1;
    lua_pushvalue(L, i);
    while (lua_istable(L, -1)) {
        if (nd == MP_MAXDIM) luaL_error(L, "mp.tensor: data nested deeper than %d levels", MP_MAXDIM);
        lua_Integer n = lb_length(L, -1, "data", "mp.tensor");
        if (n <= 0) luaL_error(L, "mp.tensor: empty table in data (sizes must be positive)");
        if (n > ((lua_Integer)1 << 40) / total)   /* a table cannot really hold that much: a lying __len */
            luaL_error(L, "mp.tensor: data too large (%I entries at level %d)", n, nd + 1);
        total *= n;
        shape[nd++] = n;
        lua_geti(L, -1, 1);
        lua_remove(L, -2);
    }
    lua_pop(L, 1);
    return nd;
}

/* copy nested tables into v, checking that every level has the same shape */
static void nested_values(lua_State *L, int i, const int64_t *shape, int nd, int d, double *v,
                          int64_t *k, char *path, size_t plen)
{
    if (d == nd) {
        if (lua_type(L, i) != LUA_TNUMBER)
            luaL_error(L, "mp.tensor: data%s is %s (expected a number)", path, luaL_typename(L, i));
        v[(*k)++] = lua_tonumber(L, i);
        return;
    }
    if (!lua_istable(L, i))
        luaL_error(L, "mp.tensor: ragged data: data%s is %s (expected a table of %I)", path,
                   luaL_typename(L, i), (lua_Integer)shape[d]);
    lua_Integer n = lb_length(L, i, "data", "mp.tensor");
    if (n != shape[d])
        luaL_error(L, "mp.tensor: ragged data: data%s has %I elements (expected %I)", path,
                   (lua_Integer)n, (lua_Integer)shape[d]);
    luaL_checkstack(L, 2, "nested data");
    for (lua_Integer j = 1; j <= n; j++) {
        size_t len = strlen(path);
        snprintf(path + len, plen - len, "[%lld]", (long long)j);
        lua_geti(L, i, j);
        nested_values(L, lua_gettop(L), shape, nd, d + 1, v, k, path, plen);
        lua_pop(L, 1);
        path[len] = 0;
    }
}

static int m_tensor(lua_State *L)
{
    mp_tensor *src = lt_opt(L, 1);
    if (src) {   /* a copy of a tensor, in the dtype/device asked for */
        lb_opts o = lb_options_def(L, 2, "mp.tensor", (lb_opts){src->dtype, src->dev, 0});
        LTensor *u = lt_new(L);
        bool was = mp_set_grad_enabled(false);   /* a new leaf, as torch.tensor(t) makes */
        mp_tensor *t = LT_CALL(L, src->dtype == o.dtype && src->dev == o.device ? mp_clone(src)
                                                                               : mp_to(src, o.dtype, o.device));
        mp_set_grad_enabled(was);   /* before lt_set, which may raise */
        lt_set(L, u, t, "mp.tensor");
        lb_apply_options(L, &o, "mp.tensor");
        return 1;
    }
    lb_opts o = lb_options(L, 2, "mp.tensor");
    int64_t shape[MP_MAXDIM];
    int nd = 0;
    if (lua_type(L, 1) == LUA_TTABLE) nd = nested_shape(L, 1, shape);
    else if (lua_type(L, 1) != LUA_TNUMBER)
        return luaL_error(L, "mp.tensor: data must be a number or nested tables of numbers (got %s)",
                          luaL_typename(L, 1));
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    /* the values are staged as doubles on the host before the tensor is made: a
     * lying __len must not start a staging buffer and tensor beyond the memory limit */
    if ((double)n * (sizeof(double) + mp_dtype_size(o.dtype)) > (double)mp_memory(MP_CPU).limit)
        return luaL_error(L, "mp.tensor: data claims %I values: staging them and the tensor exceeds the cpu memory "
                             "limit (%I bytes)", (lua_Integer)n, (lua_Integer)mp_memory(MP_CPU).limit);
    double *v = lua_newuserdatauv(L, sizeof(double) * (size_t)n, 0);
    int64_t k = 0;
    char path[256] = "";
    nested_values(L, 1, shape, nd, 0, v, &k, path, sizeof path);
    LT_PUSH(L, "mp.tensor", mp_from_f64(o.dtype, o.device, nd, shape, v));
    lb_apply_options(L, &o, "mp.tensor");
    return 1;
}

/* ---- constructors from a shape ---- */

/* mp.zeros/ones/rand/randn(shape [, opts]) and mp.full(shape, value [, opts]) */
enum { ZEROS, ONES, FULL, RAND, RANDN };

static int from_shape(lua_State *L, int kind, const char *name)
{
    int64_t shape[MP_MAXDIM];
    int nd = lb_shape(L, 1, shape, name), oi = 2;
    double v = kind == ONES;
    if (kind == FULL) {
        if (lua_type(L, 2) != LUA_TNUMBER)
            return luaL_error(L, "%s: value must be a number (got %s)", name, luaL_typename(L, 2));
        v = lua_tonumber(L, 2);
        oi = 3;
    }
    lb_opts o = lb_options(L, oi, name);
    LT_PUSH(L, name, kind == RAND ? mp_rand(o.dtype, o.device, nd, shape)
                   : kind == RANDN ? mp_randn(o.dtype, o.device, nd, shape)
                   : mp_full(o.dtype, o.device, nd, shape, v));
    lb_apply_options(L, &o, name);
    return 1;
}

static int m_zeros(lua_State *L) { return from_shape(L, ZEROS, "mp.zeros"); }
static int m_ones(lua_State *L) { return from_shape(L, ONES, "mp.ones"); }
static int m_full(lua_State *L) { return from_shape(L, FULL, "mp.full"); }
static int m_rand(lua_State *L) { return from_shape(L, RAND, "mp.rand"); }
static int m_randn(lua_State *L) { return from_shape(L, RANDN, "mp.randn"); }

static int m_arange(lua_State *L)
{
    int64_t n = lb_integer(L, 1, "n", "mp.arange");
    lb_opts o = lb_options(L, 2, "mp.arange");
    LT_PUSH(L, "mp.arange", mp_arange(n, o.dtype, o.device));
    lb_apply_options(L, &o, "mp.arange");
    return 1;
}

/* mp.randint(low, high, shape [, opts]): uniform integers in [low, high), i32 unless opts.dtype says f32 */
static int m_randint(lua_State *L)
{
    const char *name = "mp.randint";
    int64_t lo = lb_integer(L, 1, "low", name), hi = lb_integer(L, 2, "high", name), shape[MP_MAXDIM];
    int nd = lb_shape(L, 3, shape, name);
    lb_opts o = lb_options_def(L, 4, name, (lb_opts){MP_I32, lb_default_device(L), 0});
    if (o.requires_grad) return luaL_error(L, "%s: integers cannot require grad", name);
    LT_PUSH(L, name, mp_randint(lo, hi, o.dtype, o.device, nd, shape));
    return 1;
}

static int m_manual_seed(lua_State *L)
{
    if (!lua_isinteger(L, 1))
        return luaL_error(L, "mp.manual_seed: seed must be an integer (got %s)", luaL_typename(L, 1));
    mp_clear_error();
    if (mp_manual_seed((uint64_t)lua_tointeger(L, 1))) return lt_error(L, "mp.manual_seed");
    return 0;
}

static int m_matmul(lua_State *L)
{
    if (lfp8_route(L, "matmul")) return 1;
    mp_tensor *a = lt_check(L, 1), *b = lt_check(L, 2);
    LT_PUSH(L, "mp.matmul", mp_matmul(a, b));
    return 1;
}

/* ---- devices and memory ---- */

static void push_memory(lua_State *L, mp_device d)
{
    mp_memstats s = mp_memory(d);
    lua_createtable(L, 0, 6);
    lua_pushstring(L, mp_device_name(d));
    lua_setfield(L, -2, "device");
    lua_pushinteger(L, (lua_Integer)s.in_use);
    lua_setfield(L, -2, "in_use");
    lua_pushinteger(L, (lua_Integer)s.peak);
    lua_setfield(L, -2, "peak");
    lua_pushinteger(L, (lua_Integer)(s.limit > (size_t)LUA_MAXINTEGER ? LUA_MAXINTEGER : s.limit));
    lua_setfield(L, -2, "limit");
    lua_pushinteger(L, s.allocs);
    lua_setfield(L, -2, "storages");
    lua_pushinteger(L, (lua_Integer)s.cached);
    lua_setfield(L, -2, "cached");
}

/* mp.memory([device]) -> {device=, in_use=, peak=, limit=, storages=, cached=} in
 * bytes, of the default device unless one is named */
static int m_memory(lua_State *L)
{
    mp_device d = lua_isnoneornil(L, 1) ? lb_default_device(L) : lb_device(L, 1, "mp.memory");
    lb_release_pending(L);   /* what a free() inside a callback left waiting counts no more */
    push_memory(L, d);
    return 1;
}

/* mp.reset_peak_memory([device]): the peak of mp.memory() starts again from what
 * is in use now (PyTorch's torch.cuda.reset_peak_memory_stats) */
static int m_reset_peak_memory(lua_State *L)
{
    mp_device d = lua_isnoneornil(L, 1) ? lb_default_device(L) : lb_device(L, 1, "mp.reset_peak_memory");
    mp_reset_peak_memory(d);
    return 0;
}

/* mp.empty_cache([device]): the caching allocator's free blocks back to the
 * system (PyTorch's torch.cuda.empty_cache), of the default device unless named */
static int m_empty_cache(lua_State *L)
{
    mp_device d = lua_isnoneornil(L, 1) ? lb_default_device(L) : lb_device(L, 1, "mp.empty_cache");
    lb_release_pending(L);
    mp_release_cache(d);
    return 0;
}

static int cuda_empty_cache(lua_State *L)
{
    if (mp_device_check(MP_CUDA)) return lt_error(L, "mp.cuda.empty_cache");
    mp_release_cache(MP_CUDA);
    return 0;
}

static int m_default_device(lua_State *L)
{
    lua_pushstring(L, mp_device_name(lb_default_device(L)));
    return 1;
}

/* true, or false and why not (no driver, a library that failed to load, ...) */
static int cuda_is_available(lua_State *L)
{
    const char *why = mp_device_why_not(MP_CUDA);
    lua_pushboolean(L, why == NULL);
    if (!why) return 1;
    lua_pushstring(L, why);
    return 2;
}

/* mp.memory's figures and graphs = the bytes live CUDA graphs keep in their pools (lcuda_graph.c) */
static int cuda_memory(lua_State *L)
{
    if (mp_device_check(MP_CUDA)) return lt_error(L, "mp.cuda.memory");
    push_memory(L, MP_CUDA);
    lua_pushinteger(L, (lua_Integer)mp_capture_bytes(MP_CUDA));
    lua_setfield(L, -2, "graphs");
    return 1;
}

static int cuda_synchronize(lua_State *L)
{
    mp_clear_error();
    if (mp_device_synchronize(MP_CUDA)) return lt_error(L, "mp.cuda.synchronize");
    return 0;
}

/* mp.counters([device]) -> {host_reads=, device_to_host=, device_waits=,
 * device_mallocs=}: totals since start, the last three of the default device
 * unless one is named (device_mallocs: what its caching allocator asked the
 * system for); a warm training step should add none */
static int m_counters(lua_State *L)
{
    mp_device d = lua_isnoneornil(L, 1) ? lb_default_device(L) : lb_device(L, 1, "mp.counters");
    int64_t c[3];
    mp_device_counters(d, c);
    lua_createtable(L, 0, 5);
    lua_pushstring(L, mp_device_name(d)); lua_setfield(L, -2, "device");
    lua_pushinteger(L, mp_host_reads()); lua_setfield(L, -2, "host_reads");
    lua_pushinteger(L, c[0]); lua_setfield(L, -2, "device_to_host");
    lua_pushinteger(L, c[1]); lua_setfield(L, -2, "device_waits");
    lua_pushinteger(L, c[2]); lua_setfield(L, -2, "device_mallocs");
    return 1;
}

static const luaL_Reg funcs[] = {
    {"tensor", m_tensor}, {"zeros", m_zeros}, {"ones", m_ones}, {"full", m_full},
    {"arange", m_arange}, {"randint", m_randint}, {"rand", m_rand}, {"randn", m_randn}, {"manual_seed", m_manual_seed},
    {"matmul", m_matmul}, {"memory", m_memory}, {"counters", m_counters}, {"empty_cache", m_empty_cache},
    {"reset_peak_memory", m_reset_peak_memory},
    {"set_default_device", lb_set_default_device}, {"default_device", m_default_device},
    {"_options", lb_options_lua},   /* the one option checker, for the Lua library */
    {NULL, NULL}
};

static const luaL_Reg cuda_funcs[] = {
    {"is_available", cuda_is_available}, {"memory", cuda_memory}, {"synchronize", cuda_synchronize},
    {"empty_cache", cuda_empty_cache},
    {NULL, NULL}
};

int luaopen_mp_core(lua_State *L)
{
    luaL_newlib(L, funcs);
    mp_open_errors(L);
    luaopen_mp_tensor(L);
    lua_setfield(L, -2, "Tensor");        /* the methods table, for Lua extensions */
    luaL_newlib(L, cuda_funcs);
    lua_setfield(L, -2, "cuda");
    lua_pushliteral(L, MP_VERSION);
    lua_setfield(L, -2, "version");
    mp_open_data(L);
    mp_open_io(L);
    mp_open_functional(L);
    mp_open_math(L);
    mp_open_optim(L);
    mp_open_util(L);
    mp_open_lines(L);
    mp_open_trace(L);
    mp_open_autocast(L);
    mp_open_scaler(L);
    mp_open_scaler_trace(L);
    mp_open_lab(L);
    mp_open_dist(L);
    mp_open_autograd(L);
    mp_open_function(L);
    mp_open_hooks(L);
    mp_open_anomaly(L);
    mp_open_shape(L);
    mp_open_rnn(L);
    mp_open_fp8(L);
    mp_open_inplace(L);
    mp_open_cuda_graph(L);
    return 1;
}
