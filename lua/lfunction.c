/*
 * lfunction.c: the C half of mp.autograd.Function (lua/mp/autograd.lua is the
 * Lua half): a call's outputs get one custom node (engine/custom.h) whose
 * backward calls back into Lua.
 *
 * What the node keeps of Lua is one registry reference to the call's record
 * (its ctx, the Function, the Lua function that runs the backward), released
 * when the node is freed. Nodes can be freed by engine code with no Lua caller
 * in sight (a tensor's finalizer, the walk releasing a graph), so the payload
 * reaches Lua through the state's main thread, and a node freed after the
 * state closed (held by something outside Lua) touches no Lua: every payload
 * shares a small "world" record whose sentinel userdata, made when mp.core
 * opens and so finalized after every tensor made later, marks it closed.
 *
 * The backward runs on the main thread too (the walk does not know which Lua
 * thread called backward), in a protected call: a Lua error never crosses the
 * engine's walk, it becomes the walk's error message. The tensors handed to
 * the Lua backward (the output gradients, ctx.saved_tensors) are invalidated
 * when it returns, so the saved tensors are freed when the node runs (with the
 * node's own references, engine/backward.c), not when the collector finds the
 * wrappers.
 */
#include <stdlib.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/custom.h"
#include "engine/intern.h"
#include "engine/autocast.h"

#define WORLD_MT "mp.FunctionWorld"

typedef struct {
    lua_State *L;                  /* the main thread */
    int refs;                      /* the state (until it closes) and each payload */
    bool closed;
} world;

typedef struct {
    world *w;
    int ref;                       /* the record in the registry */
    const char *name;              /* the Function's name: the nodes' (interned: engine/intern.h) */
    mp_autocast_state ac;          /* the state its backward runs in */
} payload;

static const char WORLD_KEY = 0;   /* registry: the sentinel, a world ** */

static void world_drop(world *w)
{
    if (--w->refs == 0) free(w);
}

static int world_gc(lua_State *L)
{
    world **pw = luaL_checkudata(L, 1, WORLD_MT);
    if (*pw) (*pw)->closed = true, world_drop(*pw), *pw = NULL;
    return 0;
}

static void payload_release(void *pp)
{
    payload *p = pp;
    if (!p->w->closed && lua_checkstack(p->w->L, 2)) luaL_unref(p->w->L, LUA_REGISTRYINDEX, p->ref);
    world_drop(p->w);
    free(p);
}

/* a wrapper for t (a new reference), listed in the table at `wrappers` */
static void push_wrapper(lua_State *L, int wrappers, mp_tensor *t)
{
    LTensor *u = lt_new(L);
    u->t = mp_retain(t);
    lua_pushvalue(L, -1);
    lua_rawseti(L, wrappers, (lua_Integer)lua_rawlen(L, wrappers) + 1);
}

typedef struct {
    payload *p;
    mp_node *n;
    int nout;
    mp_tensor *const *gout;
    mp_tensor **gin;
} backward_call;

static bool same_shape(const mp_edge *e, const mp_tensor *t)
{
    if (e->ndim != t->ndim) return false;
    for (int d = 0; d < t->ndim; d++)
        if (e->shape[d] != t->shape[d]) return false;
    return true;
}

/* the backward, protected: record.run(record, saved, gout...) -> {gradient per tensor input} */
static int protected_backward(lua_State *L)
{
    backward_call *b = lua_touserdata(L, 1);
    payload *p = b->p;
    mp_node *n = b->n;
    luaL_checkstack(L, b->nout + 8, "mp.autograd.Function");
    lua_newtable(L);                                   /* 2: the wrappers handed out */
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->ref);         /* 3: the record */
    lua_getfield(L, 3, "run");
    lua_pushvalue(L, 3);
    lua_createtable(L, n->nsaved, 1);
    for (int i = 0; i < n->nsaved; i++) {
        if (!n->saved[i]) continue;
        push_wrapper(L, 2, n->saved[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushinteger(L, n->nsaved);
    lua_setfield(L, -2, "n");
    for (int k = 0; k < b->nout; k++) push_wrapper(L, 2, b->gout[k]);
    mp_clear_error();
    int tok = mp_autocast_enter_state(p->ac);
    if (tok < 0) return lt_error(L, p->name);
    int rc = lua_pcall(L, 2 + b->nout, 1, 0);
    mp_autocast_exit(tok);
    if (rc == LUA_OK) {   /* the gradients, before the wrappers they may be go */
        if (!lua_istable(L, -1)) lua_pushfstring(L, "%s: backward's gradients are not a table", p->name), rc = -1;
        for (int i = 0; i < n->nin && rc == LUA_OK; i++) {
            lua_geti(L, -1, i + 1);
            mp_tensor *t = lt_opt(L, -1);
            if (t && !same_shape(&n->in[i], t)) {
                lua_pushfstring(L, "%s: the gradient of tensor input %d does not have its shape", p->name, i + 1);
                rc = -1;
            } else if (!t && !lua_isnil(L, -1)) {
                lua_pushfstring(L, "%s: the gradient of tensor input %d is a %s", p->name, i + 1, luaL_typename(L, -1));
                rc = -1;
            } else {
                b->gin[i] = t ? mp_retain(t) : NULL;
                lua_pop(L, 1);
            }
        }
    }
    lua_Integer nw = (lua_Integer)lua_rawlen(L, 2);
    for (lua_Integer i = 1; i <= nw; i++) {   /* nothing the backward kept holds these tensors now */
        lua_rawgeti(L, 2, i);
        LTensor *u = lua_touserdata(L, -1);
        mp_tensor *t = u->t;
        u->t = NULL;
        lt_release(L, t);
        lua_pop(L, 1);
    }
    if (rc != LUA_OK) return lua_error(L);
    return 0;
}

static int fn_backward(void *pp, mp_node *n, int nout, mp_tensor *const *gout, mp_tensor **gin)
{
    payload *p = pp;
    if (p->w->closed) return mp_fail(MP_EINVAL, "%s: the Lua state of this Function was closed", p->name);
    lua_State *L = p->w->L;
    if (!lua_checkstack(L, 4)) return mp_fail(MP_EOOM, "%s: out of Lua stack for the backward", p->name);
    int top = lua_gettop(L);
    backward_call b = {p, n, nout, gout, gin};
    lua_pushcfunction(L, protected_backward);
    lua_pushlightuserdata(L, &b);
    int rc = lua_pcall(L, 1, 0, 0);
    if (rc != LUA_OK) {
        const char *m = lua_tostring(L, -1);
        mp_fail(rc == LUA_ERRMEM ? MP_EOOM : MP_EINVAL, "%s", m ? m : "(an error object that is not a string)");
    }
    lua_settop(L, top);
    return rc == LUA_OK ? 0 : -1;
}

/* core._function_record(record|nil, name, inputs, outputs, diff, saved, nsaved, forward_autocast)
 * -> {output...}: each output as a new tensor of the same storage; with a
 * record, the differentiable ones get the call's node */
static int f_record(lua_State *L)
{
    const char *fname = "mp.autograd.Function";
    const char *name = luaL_checkstring(L, 2);
    int nin, nout, nsaved = (int)luaL_checkinteger(L, 7);
    mp_tensor **ins = lb_tensor_list(L, 3, 1 << 20, "inputs", fname, &nin);
    mp_tensor **outs = lb_tensor_list(L, 4, 1 << 20, "outputs", fname, &nout);
    luaL_checktype(L, 5, LUA_TTABLE);
    luaL_checktype(L, 6, LUA_TTABLE);
    if (nsaved < 0 || nsaved > 1 << 20) return luaL_error(L, "%s: bad count of saved tensors", fname);
    int base = lua_gettop(L);
    /* the new outputs, kept in a table before any of them takes the node */
    lua_createtable(L, nout, 0);
    mp_tensor **fresh = lua_newuserdatauv(L, sizeof *fresh * (size_t)(nout ? nout : 1), 0);
    bool *diff = lua_newuserdatauv(L, sizeof *diff * (size_t)(nout ? nout : 1), 0);
    mp_tensor **saved = lua_newuserdatauv(L, sizeof *saved * (size_t)(nsaved ? nsaved : 1), 0);
    for (int i = 0; i < nsaved; i++) {
        lua_geti(L, 6, i + 1);
        saved[i] = lt_opt(L, -1);   /* kept alive by the saved table, an argument */
        lua_pop(L, 1);
    }
    for (int k = 0; k < nout; k++) {
        LTensor *u = lt_new(L);
        mp_clear_error();
        lt_set(L, u, mp_detached(outs[k]), fname);
        fresh[k] = u->t;
        lua_rawseti(L, base + 1, k + 1);
        lua_geti(L, 5, k + 1);
        diff[k] = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    if (lua_isnil(L, 1)) {
        lua_settop(L, base + 1);
        return 1;
    }
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &WORLD_KEY);
    world *w = *(world **)luaL_checkudata(L, -1, WORLD_MT);
    lua_pop(L, 1);
    payload *p = calloc(1, sizeof *p);
    /* interned: flush counts and diagnose's record read a node's name after the node is gone */
    const char *pname = p ? mp_intern(name) : NULL;
    if (!pname) {
        free(p);
        return luaL_error(L, "%s: out of memory", fname);
    }
    lua_pushvalue(L, 1);
    p->ref = luaL_ref(L, LUA_REGISTRYINDEX);
    p->w = w, w->refs++;
    p->name = pname;
    p->ac = mp_autocast_now();
    if (!lua_toboolean(L, 8)) p->ac.on = false;   /* cast_inputs: the forward ran with autocast off */
    mp_custom_fn fn = {.name = p->name, .backward = fn_backward, .payload = p, .release = payload_release};
    mp_clear_error();
    if (mp_custom_record(&fn, nin, ins, nout, fresh, diff, nsaved, saved)) return lt_error(L, fname);
    lua_settop(L, base + 1);
    return 1;
}

/* core._function_autocast() -> active, dtype */
static int f_autocast(lua_State *L)
{
    mp_autocast_state st = mp_autocast_now();
    lua_pushboolean(L, st.on);
    lua_pushstring(L, mp_dtype_name(st.dt));
    return 2;
}

void mp_open_function(lua_State *L)
{
    if (luaL_newmetatable(L, WORLD_MT)) {
        lua_pushcfunction(L, world_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &WORLD_KEY);
    bool have = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (!have) {   /* once per Lua state (mp.core may be opened again) */
        world **pw = lua_newuserdatauv(L, sizeof *pw, 0);
        *pw = NULL;
        luaL_setmetatable(L, WORLD_MT);
        world *w = calloc(1, sizeof *w);
        if (!w) luaL_error(L, "mp.core: out of memory");
        lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
        w->L = lua_tothread(L, -1);
        lua_pop(L, 1);
        w->refs = 1;
        *pw = w;
        lua_rawsetp(L, LUA_REGISTRYINDEX, &WORLD_KEY);
    }
    static const luaL_Reg f[] = {
        {"_function_record", f_record}, {"_function_autocast", f_autocast},
        {NULL, NULL}
    };
    luaL_setfuncs(L, f, 0);
}
