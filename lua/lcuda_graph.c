/*
 * lcuda_graph.c: mp.cuda.graph(fn), a training step captured once as a CUDA
 * graph and replayed (engine/capture.h), PyTorch's torch.cuda.graph.
 *
 *   step()                           -- warm-up: lazy state exists (see below)
 *   local g = mp.cuda.graph(step)    -- records step's device work; runs none
 *   for _, b in ipairs(batches) do
 *     x:copy_(b)                     -- the step reads x: a fixed input buffer
 *     local loss = g:replay()        -- step's results, rewritten by each replay
 *   end
 *
 * fn runs once, on the host, with the device recording: its ops do their
 * host-side work (shapes, autograd, the optimizer's and scaler's bookkeeping)
 * and queue their kernels into the graph. What fn returns are the graph's
 * outputs: the same tensors, which every replay rewrites; g:replay() returns
 * them. The graph keeps fn (so the tensors its upvalues reach, the model, the
 * optimizer, the input buffer, stay alive) and the outputs until g:free() or
 * its collection.
 *
 * Warm-up: the capture must find what a step creates lazily already made: the
 * optimizer's state (made, and zeroed, at its first step: a zeroing captured
 * would zero it again at every replay), the scaler's state, the cuBLAS handle
 * and workspace. One eager step of the same function before the capture makes
 * them, as PyTorch asks for warm-up iterations before torch.cuda.graph (no
 * side stream is needed: everything runs on the backend's one stream). The
 * blocks of the warm-up's garbage, collected before the capture, are what the
 * capture then takes for its pool, so it needs no new device memory.
 *
 * Frozen at capture: host numbers an op passes to its kernels (the learning
 * rate, a scale given as a number): a schedule that changes the learning rate
 * after the capture is not seen by the replays. The step count, the loss scale
 * and the skip decision live on the device (GradScaler{sync = false}) and do
 * advance with each replay.
 *
 * Random numbers (dropout, mp.rand, attention's dropout) are recorded: each
 * replay draws what the eager step would at the generator's state when it is
 * queued, and moves the state on as that step would; the capture itself leaves
 * it where it was (engine/capture.c). mp.manual_seed inside fn is refused.
 *
 * A failed capture (fn raised an error, e.g. a refused :item()) is dropped: the
 * error names mp.cuda.graph and what failed, no memory stays reserved, the
 * tensors fn made hold unspecified values, and the device queue is as before.
 */
#include "engine/capture.h"
#include "engine/device.h"
#include "engine/error.h"
#include "lua/lbind.h"
#include "lua/lcore.h"
#include <lauxlib.h>

#define GRAPH_MT "mp.cuda.Graph"

/* the userdata: the graph; its user values are 1: fn, 2: the table of outputs {n = count, ...} */
typedef struct { mp_capture *g; } LGraph;

static int graph_free(lua_State *L)
{
    LGraph *u = luaL_checkudata(L, 1, GRAPH_MT);
    mp_capture_free(u->g);
    u->g = NULL;
    lua_pushnil(L), lua_setiuservalue(L, 1, 1);
    lua_pushnil(L), lua_setiuservalue(L, 1, 2);
    return 0;
}

/* the outputs, as fn returned them */
static int push_outputs(lua_State *L, int ud)
{
    lua_getiuservalue(L, ud, 2);
    int t = lua_gettop(L);
    lua_getfield(L, t, "n");
    int n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    luaL_checkstack(L, n, "graph outputs");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, t, i);
    return n;
}

static int graph_replay(lua_State *L)
{
    LGraph *u = luaL_checkudata(L, 1, GRAPH_MT);
    if (!u->g) return luaL_error(L, "mp.cuda.graph: replay of a freed graph (g:free() was called)");
    mp_clear_error();
    if (mp_capture_replay(u->g)) return lt_error(L, "mp.cuda.graph: replay");
    return push_outputs(L, 1);
}

static int graph_tostring(lua_State *L)
{
    LGraph *u = luaL_checkudata(L, 1, GRAPH_MT);
    if (!u->g) return lua_pushliteral(L, "mp.cuda.graph (freed)"), 1;
    int n = push_outputs(L, 1);
    lua_pushfstring(L, "mp.cuda.graph (%d output%s)", n, n == 1 ? "" : "s");
    return 1;
}

/* mp.cuda.graph(fn) -> graph */
static int cuda_graph(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TFUNCTION)
        return luaL_error(L, "mp.cuda.graph: fn must be a function (got %s)", luaL_typename(L, 1));
    lua_settop(L, 1);
    mp_clear_error();
    if (mp_device_check(MP_CUDA)) return lt_error(L, "mp.cuda.graph");
    /* earlier garbage back to the cache first: freed during the capture it would be the graph's */
    lb_release_pending(L);
    lua_gc(L, LUA_GCCOLLECT);
    LGraph *u = lua_newuserdatauv(L, sizeof *u, 2);   /* 2 */
    u->g = NULL;
    luaL_setmetatable(L, GRAPH_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, 2, 1);
    if (mp_capture_begin(MP_CUDA)) return lt_error(L, "mp.cuda.graph");
    lua_pushvalue(L, 1);
    if (lua_pcall(L, 0, LUA_MULTRET, 0) != LUA_OK) {
        lb_release_pending(L);
        mp_capture_end(true);
        const char *m = lua_tostring(L, -1);
        return luaL_error(L, "mp.cuda.graph: the capture failed and was dropped: %s",
                          m ? m : luaL_typename(L, -1));
    }
    int n = lua_gettop(L) - 2;
    lua_createtable(L, n, 1);
    for (int i = 1; i <= n; i++) lua_pushvalue(L, 2 + i), lua_rawseti(L, -2, i);
    lua_pushinteger(L, n);
    lua_setfield(L, -2, "n");
    lua_setiuservalue(L, 2, 2);
    /* releases that waited for a binding function go now, into the graph's pool if theirs */
    lb_release_pending(L);
    mp_clear_error();
    if (!(u->g = mp_capture_end(false))) return lt_error(L, "mp.cuda.graph");
    lua_settop(L, 2);
    return 1;
}

static const luaL_Reg graph_methods[] = {
    {"replay", graph_replay}, {"free", graph_free}, {NULL, NULL}
};

void mp_open_cuda_graph(lua_State *L)
{
    /* cuda_graph holds no engine pointer while fn runs: explicit releases in fn need not wait (lbind.c) */
    lb_outside_binding(cuda_graph);
    luaL_newmetatable(L, GRAPH_MT);
    luaL_newlib(L, graph_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, graph_free);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, graph_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    lua_getfield(L, -1, "cuda");
    lua_pushcfunction(L, cuda_graph);
    lua_setfield(L, -2, "graph");
    lua_pop(L, 1);
}
