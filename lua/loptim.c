/*
 * loptim.c: the Optimizer userdata (engine/optim.h) behind mp.optim.SGD/Adam/AdamW/RMSprop/Adagrad
 * (lua/mp/optim.lua adds defaults, state_dict and friends). Hyperparameters are
 * fields: opt.lr reads and writes the engine's copy.
 */
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/optim.h"
#include "engine/dist.h"

#define OPTIM_MT "mp.Optimizer"

typedef struct { mp_optim *o; } LOptim;

static mp_optim *check_optim(lua_State *L, int i)
{
    LOptim *u = luaL_checkudata(L, i, OPTIM_MT);
    if (!u->o) luaL_argerror(L, i, "optimizer was freed");
    return u->o;
}

/* the hyperparameters a table t has, over c */
static mp_optim_config read_config(lua_State *L, int t, mp_optim_config c, const char *name)
{
    c.lr = lb_number_field(L, t, "lr", c.lr, name);
    c.momentum = lb_number_field(L, t, "momentum", c.momentum, name);
    c.dampening = lb_number_field(L, t, "dampening", c.dampening, name);
    c.weight_decay = lb_number_field(L, t, "weight_decay", c.weight_decay, name);
    c.beta1 = lb_number_field(L, t, "beta1", c.beta1, name);
    c.beta2 = lb_number_field(L, t, "beta2", c.beta2, name);
    c.eps = lb_number_field(L, t, "eps", c.eps, name);
    c.alpha = lb_number_field(L, t, "alpha", c.alpha, name);
    c.lr_decay = lb_number_field(L, t, "lr_decay", c.lr_decay, name);
    c.initial_accumulator_value = lb_number_field(L, t, "initial_accumulator_value", c.initial_accumulator_value, name);
    if (lua_getfield(L, t, "nesterov") != LUA_TNIL) c.nesterov = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (lua_getfield(L, t, "centered") != LUA_TNIL) c.centered = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return c;
}

/* core._optimizer(kind, params, config [, groups]): the engine's defaults for the
 * kind (mp_optim_defaults), changed by the fields config has; with groups (a list
 * of {params = {...}, lr = ..., ...}, lua/mp/optim.lua) each group's fields over
 * those, params then unused. The engine checks them all. */
static int o_new(lua_State *L)
{
    const char *want = luaL_checkstring(L, 1);
    int kind = 0;   /* the kinds' names and titles: their descriptions (engine/optim_kinds.h) */
    while (kind < MP_NOPTIM_KINDS && strcmp(mp_optim_kinds[kind].name, want) != 0) kind++;
    if (kind == MP_NOPTIM_KINDS) return luaL_argerror(L, 1, lua_pushfstring(L, "invalid option '%s'", want));
    const char *name = mp_optim_kinds[kind].title;
    luaL_checktype(L, 3, LUA_TTABLE);
    mp_optim_config base = read_config(L, 3, mp_optim_defaults((mp_optim_kind)kind), name);
    int ng = 1, n = 0;
    mp_optim_config *cfg = &base;
    int *counts = &n;
    mp_tensor **ps;
    if (lua_isnoneornil(L, 4)) {
        ps = lb_tensor_list(L, 2, 1 << 24, "params", name, &n);
    } else {   /* every group's tensors, in order, in one list */
        luaL_checktype(L, 4, LUA_TTABLE);
        ng = lb_len(L, 4, 1 << 16, "param groups", name);
        if (ng < 1) return luaL_error(L, "%s: the list of parameter groups is empty", name);
        cfg = lua_newuserdatauv(L, sizeof *cfg * (size_t)ng, 0);
        counts = lua_newuserdatauv(L, sizeof *counts * (size_t)ng, 0);
        lua_newtable(L);   /* all tensors, kept alive here */
        int all = lua_gettop(L);
        for (int g = 0; g < ng; g++) {
            lua_geti(L, 4, g + 1);
            if (!lua_istable(L, -1)) return luaL_error(L, "%s: group %d must be a table", name, g + 1);
            cfg[g] = read_config(L, -1, base, name);
            lua_getfield(L, -1, "params");
            int m;
            mp_tensor **gp = lb_tensor_list(L, -1, 1 << 24, "params", name, &m);
            (void)gp;
            counts[g] = m;
            for (int i = 1; i <= m; i++) {   /* lb_tensor_list left its copy on the stack */
                lua_geti(L, -1, i);
                lua_rawseti(L, all, ++n);
            }
            lua_settop(L, all);
        }
        ps = lb_tensor_list(L, all, 1 << 24, "params", name, &n);
    }
    LOptim *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->o = NULL;
    luaL_setmetatable(L, OPTIM_MT);
    mp_clear_error();
    if (!(u->o = mp_optim_new_groups(ng, cfg, counts, n, ps))) {
        if (mp_errcode_last() != MP_EOOM) return lt_error(L, name);
        lua_gc(L, LUA_GCCOLLECT);
        if (!(u->o = mp_optim_new_groups(ng, cfg, counts, n, ps))) return lt_error(L, name);
    }
    return 1;
}

/* o:_group(i) -> {lr =, ..., nesterov =, size = parameters} of group i (1-based) */
static int o_group(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    lua_Integer g = luaL_checkinteger(L, 2);
    if (g < 1 || g > o->ngroups) return luaL_error(L, "Optimizer: group %I out of range 1..%d", g, o->ngroups);
    const mp_optim_config *c = &o->group[g - 1];
    lua_createtable(L, 0, 13);
    const double v[10] = {c->lr, c->momentum, c->dampening, c->weight_decay, c->beta1, c->beta2, c->eps,
                          c->alpha, c->lr_decay, c->initial_accumulator_value};
    static const char *k[10] = {"lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps",
                                "alpha", "lr_decay", "initial_accumulator_value"};
    for (int i = 0; i < 10; i++) lua_pushnumber(L, v[i]), lua_setfield(L, -2, k[i]);
    lua_pushboolean(L, c->nesterov), lua_setfield(L, -2, "nesterov");
    lua_pushboolean(L, c->centered), lua_setfield(L, -2, "centered");
    lua_pushinteger(L, o->first[g] - o->first[g - 1]), lua_setfield(L, -2, "size");
    return 1;
}

/* o:_set_group(i, {lr = ..., ...}): the fields given, checked by the engine; nothing changes on failure */
static int o_set_group(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    lua_Integer g = luaL_checkinteger(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    if (g < 1 || g > o->ngroups) return luaL_error(L, "Optimizer: group %I out of range 1..%d", g, o->ngroups);
    mp_optim_config c = read_config(L, 3, o->group[g - 1], "Optimizer");
    mp_clear_error();
    if (mp_optim_set_group(o, (int)g - 1, &c)) return lt_error(L, "Optimizer");
    return 0;
}

static int o_gc(lua_State *L)
{
    LOptim *u = luaL_checkudata(L, 1, OPTIM_MT);
    mp_optim_free(u->o);
    u->o = NULL;
    return 0;
}

/* opt:free(): the optimizer waits while a C function of the binding may be using it (lbind.c) */
static void release_optim(void *o) { mp_optim_free(o); }
static int o_free(lua_State *L)
{
    LOptim *u = luaL_checkudata(L, 1, OPTIM_MT);
    mp_optim *o = u->o;
    u->o = NULL;
    lb_release(L, release_optim, o);
    return 0;
}

static int o_step(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    mp_clear_error();
    if (mp_optim_step(o))
        return lt_error(L, "Optimizer:step");
    lt_step_done(L);
    return 0;
}

static int o_zero_grad(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    mp_clear_error();
    if (mp_optim_zero_grad(o)) return lt_error(L, "Optimizer:zero_grad");
    return 0;
}

/* o:_views(which) -> list of per-parameter views of an arena ("values", "grads",
 * "state1", "state2", "state3"), creating the state arenas when asked for */
static int o_views(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    static const char *which[] = {"values", "grads", "state1", "state2", "state3", NULL};
    int w = luaL_checkoption(L, 2, NULL, which);
    if (w >= 2 && mp_optim_ensure_state(o)) return lt_error(L, "Optimizer:_views");
    mp_tensor *arena = w == 0 ? o->values : w == 1 ? o->grads : w == 2 ? o->state1 : w == 3 ? o->state2 : o->state3;
    if (!arena) { lua_pushnil(L); return 1; }
    lua_createtable(L, o->n, 0);
    for (int i = 0; i < o->n; i++) {
        LT_PUSH(L, "Optimizer:_views", mp_optim_view(o, arena, i));
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* the hyperparameter k of a config (a copy the binding changes and hands to
 * mp_optim_set_config, or the optimizer's own for reading) */
static double *config_field(mp_optim_config *c, const char *k)
{
    if (strcmp(k, "lr") == 0) return &c->lr;
    if (strcmp(k, "momentum") == 0) return &c->momentum;
    if (strcmp(k, "dampening") == 0) return &c->dampening;
    if (strcmp(k, "weight_decay") == 0) return &c->weight_decay;
    if (strcmp(k, "beta1") == 0) return &c->beta1;
    if (strcmp(k, "beta2") == 0) return &c->beta2;
    if (strcmp(k, "eps") == 0) return &c->eps;
    if (strcmp(k, "alpha") == 0) return &c->alpha;
    if (strcmp(k, "lr_decay") == 0) return &c->lr_decay;
    if (strcmp(k, "initial_accumulator_value") == 0) return &c->initial_accumulator_value;
    return NULL;
}

static int o_index(lua_State *L)
{
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
    mp_optim *o = check_optim(L, 1);
    const char *k = luaL_checkstring(L, 2);
    double *f = config_field(&o->cfg, k);
    if (f) lua_pushnumber(L, *f);
    else if (strcmp(k, "step_count") == 0) {
        int64_t step;
        mp_clear_error();
        if (mp_optim_get_step(o, &step)) return lt_error(L, "Optimizer.step_count");
        lua_pushinteger(L, step);
    }
    else if (strcmp(k, "nesterov") == 0) lua_pushboolean(L, o->cfg.nesterov);
    else if (strcmp(k, "centered") == 0) lua_pushboolean(L, o->cfg.centered);
    else if (strcmp(k, "kind") == 0) lua_pushstring(L, mp_optim_kinds[o->cfg.kind].name);
    else if (strcmp(k, "state_names") == 0) {   /* state1.. as state_dict names them (the kind's description) */
        const mp_optim_desc *d = &mp_optim_kinds[o->cfg.kind];
        lua_createtable(L, d->nstates, 0);
        for (int i = 0; i < d->nstates; i++) lua_pushstring(L, d->state_names[i]), lua_rawseti(L, -2, i + 1);
    }
    else if (strcmp(k, "state_wanted") == 0) {   /* state1.. needed by the hyperparameters now */
        const mp_optim_desc *d = &mp_optim_kinds[o->cfg.kind];
        lua_createtable(L, d->nstates, 0);
        for (int i = 0; i < d->nstates; i++) lua_pushboolean(L, mp_optim_state_wanted(o, i)), lua_rawseti(L, -2, i + 1);
    }
    else if (strcmp(k, "numel") == 0) lua_pushinteger(L, o->numel);
    else if (strcmp(k, "ngroups") == 0) lua_pushinteger(L, o->ngroups);
    else lua_pushnil(L);
    return 1;
}

static int o_newindex(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    const char *k = luaL_checkstring(L, 2);
    mp_optim_config c = o->cfg;   /* changed here, checked and set by the engine */
    if (strcmp(k, "nesterov") == 0 || strcmp(k, "centered") == 0) {
        if (k[0] == 'n') c.nesterov = lua_toboolean(L, 3);
        else c.centered = lua_toboolean(L, 3);
        mp_clear_error();
        if (mp_optim_set_config(o, &c)) return lt_error(L, "Optimizer");
        return 0;
    }
    if (strcmp(k, "step_count") == 0) {
        lua_Integer s = luaL_checkinteger(L, 3);
        if (s < 0) return luaL_error(L, "Optimizer.step_count: must be >= 0 (got %I)", (lua_Integer)s);
        mp_optim_set_step(o, s);
        return 0;
    }
    double *f = config_field(&c, k);
    if (!f) return luaL_error(L, "Optimizer: no field '%s' to set", k);
    if (lua_type(L, 3) != LUA_TNUMBER)
        return luaL_error(L, "Optimizer.%s: must be a number (got %s)", k, luaL_typename(L, 3));
    *f = lua_tonumber(L, 3);
    mp_clear_error();
    if (mp_optim_set_config(o, &c)) return lt_error(L, "Optimizer");
    return 0;
}

/* core._dist_attach(opt, bucket_bytes): data parallel (engine/dist.h) */
static int o_dist_attach(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    int64_t bytes = lb_integer(L, 2, "bucket bytes", "dist");
    mp_clear_error();
    if (mp_dist_attach(o, bytes)) return lt_error(L, "dist");
    return 0;
}

/* core._dist_reduce_grads(opt): the data-parallel gradient average alone
 * (what each backward ends with), for benchmarks */
static int o_dist_reduce(lua_State *L)
{
    mp_optim *o = check_optim(L, 1);
    mp_clear_error();
    if (mp_dist_reduce_grads(o)) return lt_error(L, "dist");
    return 0;
}

static int o_clip_grad_norm(lua_State *L)
{
    double max_norm = luaL_checknumber(L, 2), total;
    int n;
    mp_tensor **ps = lb_tensor_list(L, 1, 1 << 24, "params", "mp.optim.clip_grad_norm", &n);
    mp_clear_error();
    if (mp_clip_grad_norm(n, ps, max_norm, &total)) return lt_error(L, "mp.optim.clip_grad_norm");
    lua_pushnumber(L, total);
    return 1;
}

static int o_clip_grad_value(lua_State *L)
{
    double clip = luaL_checknumber(L, 2);
    int n;
    mp_tensor **ps = lb_tensor_list(L, 1, 1 << 24, "params", "mp.optim.clip_grad_value", &n);
    mp_clear_error();
    if (mp_clip_grad_value(n, ps, clip)) return lt_error(L, "mp.optim.clip_grad_value");
    return 0;
}

static const luaL_Reg meth[] = {
    {"step", o_step}, {"zero_grad", o_zero_grad}, {"_views", o_views}, {"free", o_free},
    {"_group", o_group}, {"_set_group", o_set_group}, {NULL, NULL}
};

void mp_open_optim(lua_State *L)
{
    luaL_newmetatable(L, OPTIM_MT);
    luaL_newlib(L, meth);
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, "_optim_methods");   /* lua/mp/optim.lua adds state_dict & co. */
    lua_pushcclosure(L, o_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, o_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, o_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    lua_pushcfunction(L, o_new);
    lua_setfield(L, -2, "_optimizer");
    lua_pushcfunction(L, o_clip_grad_norm);
    lua_setfield(L, -2, "_clip_grad_norm");
    lua_pushcfunction(L, o_clip_grad_value);
    lua_setfield(L, -2, "_clip_grad_value");
    lua_pushcfunction(L, o_dist_attach);
    lua_setfield(L, -2, "_dist_attach");
    lua_pushcfunction(L, o_dist_reduce);
    lua_setfield(L, -2, "_dist_reduce_grads");
}
