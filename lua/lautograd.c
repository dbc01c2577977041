/*
 * lautograd.c: mp.autograd.grad and the options of Tensor:backward: graphs
 * walked twice (retain_graph) and gradients of gradients (create_graph).
 * The walk itself is the engine's (engine/backward.h); this file reads Lua's
 * lists and options and hands the gradients back.
 */
#include <stdlib.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/autograd.h"

/* the tensors at i: one tensor (as a list of one), or a list of them */
static mp_tensor **tensors_at(lua_State *L, int i, const char *what, const char *name, int *n)
{
    mp_tensor *t = lt_opt(L, i);
    if (!t) return lb_tensor_list(L, i, 1 << 20, what, name, n);
    mp_tensor **one = lua_newuserdatauv(L, sizeof *one, 0);   /* freed with the call's stack */
    *one = t;
    *n = 1;
    return one;
}

/* the walk's options from the table at i (retain_graph defaults to create_graph, as in PyTorch) */
static mp_backward_opts walk_options(lua_State *L, int i)
{
    mp_backward_opts o = {.caller = L};   /* the thread the gradient hooks run on (lua/lhooks.c) */
    lua_getfield(L, i, "create_graph");
    o.create_graph = lua_toboolean(L, -1);
    lua_getfield(L, i, "retain_graph");
    o.retain_graph = lua_isnil(L, -1) ? o.create_graph : lua_toboolean(L, -1);
    lua_pop(L, 2);
    return o;
}

/* mp.autograd.grad(outputs, inputs [, {grad_outputs =, retain_graph =, create_graph =, allow_unused =}]):
 * one gradient per input, as a tensor when inputs is one tensor and as a list
 * (nil where allow_unused let an input go unused) when it is a list */
static int a_grad(lua_State *L)
{
    static const char name[] = "mp.autograd.grad";
    int nout, nin;
    lua_settop(L, 3);   /* what the calls below push goes above the arguments */
    mp_tensor **outs = tensors_at(L, 1, "outputs", name, &nout);
    mp_tensor **ins = tensors_at(L, 2, "inputs", name, &nin);
    bool single = lt_opt(L, 2) != NULL, allow_unused = false;
    mp_backward_opts o = {.caller = L};
    mp_tensor **gouts = NULL;
    if (lb_check_options(L, 3, name, "grad_outputs:any retain_graph:boolean create_graph:boolean "
                                     "allow_unused:boolean", 1)) {
        o = walk_options(L, 3);
        lua_getfield(L, 3, "allow_unused");
        allow_unused = lua_toboolean(L, -1);
        lua_getfield(L, 3, "grad_outputs");   /* a tensor, or a list with nil for "ones" */
        int gi = lua_gettop(L);
        if (!lua_isnil(L, gi)) {
            gouts = lua_newuserdatauv(L, sizeof *gouts * (size_t)nout, 0);
            if (lt_opt(L, gi)) {
                if (nout != 1) return luaL_error(L, "%s: grad_outputs is one tensor but there are %d outputs", name, nout);
                gouts[0] = lt_opt(L, gi);
            } else if (lua_istable(L, gi)) {
                /* each tensor kept alive in an anchor table that stays on the stack (a
                 * proxy's __index may hand out one nothing else holds): one slot, not
                 * one per output, which could run past the C function's stack */
                lua_createtable(L, nout, 0);
                for (int k = 0; k < nout; k++) {
                    lua_geti(L, gi, k + 1);
                    if (!lua_isnil(L, -1) && !(gouts[k] = lt_opt(L, -1)))
                        return luaL_error(L, "%s: grad_outputs[%d] is %s (expected a tensor or nil)", name, k + 1,
                                          luaL_typename(L, -1));
                    if (lua_isnil(L, -1)) gouts[k] = NULL;
                    lua_rawseti(L, -2, k + 1);
                }
            } else {
                return luaL_error(L, "%s: grad_outputs must be a tensor or a list of tensors (got %s)", name,
                                  luaL_typename(L, gi));
            }
        }
    }
    mp_tensor **res = lua_newuserdatauv(L, sizeof *res * (size_t)nin, 0);
    mp_clear_error();
    /* no retry after out of memory: the first attempt may have consumed part of the graph */
    if (mp_autograd_grad(nout, outs, gouts, nin, ins, &o, allow_unused, res)) return lt_error(L, name);
    if (!single) lua_createtable(L, nin, 0);
    for (int j = 0; j < nin; j++) {
        if (res[j]) {
            LTensor *u = lt_new(L);
            u->t = res[j];
            lt_pace_gc(L, res[j]->dev, mp_nbytes(res[j]));
        } else {
            lua_pushnil(L);
        }
        if (!single) lua_rawseti(L, -2, j + 1);
    }
    return 1;
}

/* Tensor:backward([grad] [, {retain_graph =, create_graph =}]) */
int la_backward(lua_State *L)
{
    static const char name[] = "Tensor:backward";
    mp_tensor *t = lt_check(L, 1), *g = NULL;
    int oi = 2;
    lua_settop(L, 3);
    if (lt_opt(L, 2)) g = lt_opt(L, 2), oi = 3;
    else if (lua_isnil(L, 2)) oi = 3;
    else if (!lua_isnoneornil(L, 2) && !lua_istable(L, 2))
        return luaL_error(L, "%s: grad must be a tensor (got %s)", name, luaL_typename(L, 2));
    mp_backward_opts o = {.caller = L};
    if (lb_check_options(L, oi, name, "retain_graph:boolean create_graph:boolean", 1)) o = walk_options(L, oi);
    mp_clear_error();
    /* no retry after out of memory: the first attempt has already consumed part of the graph */
    if (mp_backward_ex(t, g, &o)) return lt_error(L, name);
    return 0;
}

static const luaL_Reg funcs[] = {
    {"_autograd_grad", a_grad},
    {NULL, NULL}
};

void mp_open_autograd(lua_State *L) { luaL_setfuncs(L, funcs, 0); }
