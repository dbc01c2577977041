/*
 * lhooks.c: Tensor:register_hook (PyTorch's Tensor.register_hook): a Lua
 * function run on a tensor's gradient during backward, which may return a
 * replacement. The engine keeps and runs the hooks (engine/grad_hooks.h); this
 * file keeps each function in the registry, calls it on the Lua thread that
 * started the backward (mp_backward_opts.caller, lua/lautograd.c), and lets it
 * go when the hook is removed or its tensor (or node) is freed.
 */
#include <stdio.h>
#include <stdlib.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/autograd.h"
#include "engine/grad_hooks.h"

#define HANDLE_MT "mp.HookHandle"
#define HOME_KEY "mp.hook_home"

/* The Lua state the hooks belong to: its main thread, for the releases the
 * engine makes when a tensor or node goes (no Lua call may be under way then,
 * or one on a coroutine), and whether the state still exists. A hook can
 * outlive lua_close when something outside Lua held its tensor; its release
 * then has no registry left to clear. */
typedef struct {
    lua_State *main;
    bool closed;
    int refs;                      /* the registry's anchor and each hook's */
} hook_home;

typedef struct {
    hook_home *home;
    int ref;                       /* the function, in the registry */
} lua_hook;

static void home_unref(hook_home *h)
{
    if (--h->refs == 0) free(h);
}

static int home_gc(lua_State *L)
{
    hook_home **p = lua_touserdata(L, 1);
    if (*p) (*p)->closed = true, home_unref(*p), *p = NULL;
    return 0;
}

static hook_home *home_of(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, HOME_KEY);
    hook_home **p = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return p ? *p : NULL;
}

static void release_hook(void *payload)
{
    lua_hook *h = payload;
    if (!h->home->closed) luaL_unref(h->home->main, LUA_REGISTRYINDEX, h->ref);
    home_unref(h->home);
    free(h);
}

/* "the function at file:line", for errors */
static const char *hook_where(lua_State *L, int ref, char *buf, size_t len)
{
    lua_Debug ar;
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    if (lua_getinfo(L, ">S", &ar) && ar.linedefined > 0) snprintf(buf, len, "%s:%d", ar.short_src, ar.linedefined);
    else snprintf(buf, len, "%s", ar.short_src);
    return buf;
}

typedef struct {
    lua_hook *h;
    mp_tensor **g;
} hook_call;

/* under lua_pcall: fn(grad), and its answer (nil, or a tensor of grad's shape
 * cast to grad's dtype and device) into *g */
static int call_hook(lua_State *L)
{
    hook_call *c = lua_touserdata(L, 1);
    mp_tensor *g = *c->g;
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->h->ref);
    LTensor *u = lt_new(L);
    u->t = mp_retain(g);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1)) return 0;
    mp_tensor *r = lt_opt(L, -1);
    if (!r) return luaL_error(L, "returned %s (expected a tensor or nil)", luaL_typename(L, -1));
    if (!mp_same_shape(r, g)) {
        char b1[128], b2[128];
        return luaL_error(L, "returned a gradient of shape %s for a gradient of shape %s",
                          mp_shape_str(r->ndim, r->shape, b1, sizeof b1), mp_shape_str(g->ndim, g->shape, b2, sizeof b2));
    }
    mp_clear_error();
    /* in the gradient's dtype and device, as backward's own grad argument is
     * cast; recorded only under create_graph (grad mode is on only then) */
    mp_tensor *c2 = mp_grad_enabled() ? mp_to(r, g->dtype, g->dev) : mp_to_raw(r, g->dtype, g->dev);
    if (!c2) return luaL_error(L, "its result could not be cast to %s: %s", mp_dtype_name(g->dtype), mp_error());
    if (!mp_grad_enabled() && c2->requires_grad) {   /* outside create_graph a gradient is plain data */
        mp_tensor *d = mp_detached(c2);
        mp_release(c2);
        if (!(c2 = d)) return luaL_error(L, "%s", mp_error());
    }
    mp_release(*c->g);
    *c->g = c2;
    return 0;
}

/* the engine's callback: the Lua function on the thread that started the walk */
static int run_hook(void *payload, void *caller, mp_tensor **g)
{
    lua_hook *h = payload;
    lua_State *L = caller;
    if (!L) return mp_fail(MP_EINVAL, "a Lua gradient hook runs only in a backward started from Lua");
    if (!lua_checkstack(L, 8)) return mp_fail(MP_EOOM, "no Lua stack left to run a gradient hook");
    hook_call c = {h, g};
    int top = lua_gettop(L);
    lua_pushcfunction(L, call_hook);
    lua_pushlightuserdata(L, &c);
    int rc = 0;
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        /* no __tostring: it could raise, and nothing here may jump over the engine's walk */
        char obj[64];
        const char *msg = lua_tostring(L, -1);
        if (!msg) snprintf(obj, sizeof obj, "(an error object: %s)", luaL_typename(L, -1)), msg = obj;
        char where[256];
        rc = mp_fail(MP_EINVAL, "gradient hook (the function at %s): %s", hook_where(L, h->ref, where, sizeof where),
                     msg);
    }
    lua_settop(L, top);
    return rc;
}

typedef struct { mp_grad_hook *h; } hook_handle;

/* Tensor:register_hook(fn) -> handle (handle:remove()) */
static int t_register_hook(lua_State *L)
{
    static const char name[] = "Tensor:register_hook";
    mp_tensor *t = lt_check(L, 1);
    if (!lua_isfunction(L, 2))
        return luaL_error(L, "%s: fn must be a function (got %s)", name, luaL_typename(L, 2));
    if (!t->requires_grad)
        return luaL_error(L, "%s: cannot register a hook on a tensor that does not require grad", name);
    hook_handle *hd = lua_newuserdatauv(L, sizeof *hd, 0);   /* first: an error below leaks nothing */
    hd->h = NULL;
    luaL_setmetatable(L, HANDLE_MT);
    lua_pushvalue(L, 2);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_hook *h = malloc(sizeof *h);
    hook_home *home = home_of(L);
    if (!h || !home) {
        free(h);
        luaL_unref(L, LUA_REGISTRYINDEX, ref);
        return luaL_error(L, "%s: out of memory", name);
    }
    h->home = home, h->ref = ref;
    home->refs++;
    mp_clear_error();
    if (!(hd->h = mp_grad_hook_add(t, run_hook, release_hook, h))) {
        release_hook(h);
        return lt_error(L, name);
    }
    return 1;
}

/* handle:remove(): the hook runs no more and its function is let go (again: nothing) */
static int handle_remove(lua_State *L)
{
    hook_handle *hd = luaL_checkudata(L, 1, HANDLE_MT);
    mp_grad_hook_remove(hd->h);
    return 0;
}

static int handle_gc(lua_State *L)
{
    hook_handle *hd = luaL_checkudata(L, 1, HANDLE_MT);
    mp_grad_hook_drop(hd->h);
    hd->h = NULL;
    return 0;
}

static int handle_tostring(lua_State *L)
{
    luaL_checkudata(L, 1, HANDLE_MT);
    lua_pushliteral(L, "mp.HookHandle");
    return 1;
}

void mp_open_hooks(lua_State *L)
{
    hook_home **p = lua_newuserdatauv(L, sizeof *p, 0);
    *p = NULL;
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, home_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    if (!(*p = calloc(1, sizeof **p))) luaL_error(L, "mp: out of memory");
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    (*p)->main = lua_tothread(L, -1);
    lua_pop(L, 1);
    (*p)->refs = 1;
    lua_setfield(L, LUA_REGISTRYINDEX, HOME_KEY);

    if (luaL_newmetatable(L, HANDLE_MT)) {
        lua_pushcfunction(L, handle_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, handle_tostring);
        lua_setfield(L, -2, "__tostring");
        lua_createtable(L, 0, 1);
        lua_pushcfunction(L, handle_remove);
        lua_setfield(L, -2, "remove");
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);

    lua_getfield(L, -1, "Tensor");   /* the methods table (luaopen_mp_core) */
    lua_pushcfunction(L, t_register_hook);
    lua_setfield(L, -2, "register_hook");
    lua_pop(L, 1);
}
