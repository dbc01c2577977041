/*
 * lscaler.c: the Scaler userdata (engine/scaler.h) under mp.amp.GradScaler:
 * the built-in policies as tables (core._policy), a new scaler from one
 * (core._scaler), its methods (scale, unscale, step, update, set_policy, _info,
 * _restore, telemetry), and the backward pass's rounding counts that telemetry
 * reports (core._count_flush, _flush_stats, _flush_reset). lua/mp/amp/grad_scaler.lua
 * and lua/mp/amp/policy.lua build on these. The methods that write a trace's
 * lines are lscaler_trace.c's; the policy simulator of replay is llab.c's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "lua/lscaler.h"
#include "engine/scaler.h"
#include "engine/autograd.h"

typedef struct { mp_scaler *s; } LScaler;

mp_scaler *ls_check_scaler(lua_State *L, int i)
{
    LScaler *u = luaL_checkudata(L, i, LS_SCALER_MT);
    if (!u->s) luaL_argerror(L, i, "scaler was freed");
    return u->s;
}

static const char *kinds[] = {"static", "none", "dynamic", "hysteresis", "amax", "external", NULL};

/* an integer-valued field: absent leaves *v as it is */
static void int_field(lua_State *L, int t, const char *k, int64_t *v, const char *name)
{
    if (lua_getfield(L, t, k) != LUA_TNIL) {
        double d = lua_tonumber(L, -1);
        if (lua_type(L, -1) != LUA_TNUMBER || !(d >= -9.0e15 && d <= 9.0e15) || d != (double)(int64_t)d)
            luaL_error(L, "%s: %s must be a whole number (got %s)", name, k, luaL_tolstring(L, -1, NULL));
        *v = (int64_t)d;
    }
    lua_pop(L, 1);
}

/* The engine's policy from a policy table: the engine's defaults for its kind,
 * changed by the fields the table has (window is hysteresis's interval), then
 * the engine's check. The binding converts types; values are the engine's. */
mp_policy ls_read_policy(lua_State *L, int t, const char *name)
{
    t = lua_absindex(L, t);
    lua_getfield(L, t, "kind");
    int k = luaL_checkoption(L, -1, NULL, kinds);
    lua_pop(L, 1);
    mp_policy p = mp_policy_defaults((mp_policy_kind)k);
    p.init = lb_number_field(L, t, "init", p.init, name);
    p.growth = lb_number_field(L, t, "growth", p.growth, name);
    p.backoff = lb_number_field(L, t, "backoff", p.backoff, name);
    p.min = lb_number_field(L, t, "min", p.min, name);
    p.max = lb_number_field(L, t, "max", p.max, name);
    p.margin = lb_number_field(L, t, "margin", p.margin, name);
    int64_t hyst = p.hysteresis, hist = p.history;
    int_field(L, t, "interval", &p.interval, name);
    int_field(L, t, "window", &p.interval, name);
    int_field(L, t, "hysteresis", &hyst, name);
    int_field(L, t, "history", &hist, name);
    if (hyst < INT32_MIN || hyst > INT32_MAX || hist < INT32_MIN || hist > INT32_MAX)
        luaL_error(L, "%s: hysteresis and history must fit an int", name);
    p.hysteresis = (int)hyst, p.history = (int)hist;
    lua_getfield(L, t, "on_min");
    const char *on_min = lua_tostring(L, -1);
    if (!lua_isnil(L, -1) && (!on_min || (strcmp(on_min, "warn") && strcmp(on_min, "error"))))
        luaL_error(L, "%s: on_min must be \"warn\" or \"error\" (got %s)", name, luaL_tolstring(L, -1, NULL));
    p.error_at_min = on_min && strcmp(on_min, "error") == 0;
    lua_pop(L, 1);
    lua_getfield(L, t, "error_at_min");
    if (lua_toboolean(L, -1)) p.error_at_min = true;
    lua_pop(L, 1);
    return p;
}

/* a whole number as a Lua integer (65536, not 65536.0), anything else as a float */
static void push_num(lua_State *L, double v)
{
    if (v == floor(v) && fabs(v) < 9.0e15) lua_pushinteger(L, (lua_Integer)v);
    else lua_pushnumber(L, v);
}

/* core._policy(kind, opts) -> the policy table, every field the engine's: the
 * options a kind takes (checked by the one option checker), the engine's
 * defaults for the rest, the engine's check */
static int a_policy(lua_State *L)
{
    static const char *specs[] = {
        "init:number", "",
        "init:number growth:number backoff:number interval:integer min:number max:number on_min:string",
        "init:number growth:number backoff:number window:integer hysteresis:integer min:number max:number "
        "on_min:string",
        "init:number history:integer margin:number backoff:number min:number max:number on_min:string",
    };
    static const char *names[] = {"mp.amp.policy.static", "mp.amp.policy.none", "mp.amp.policy.dynamic",
                                  "mp.amp.policy.hysteresis", "mp.amp.policy.amax"};
    int k = luaL_checkoption(L, 1, NULL, kinds);
    if (k > MP_POLICY_AMAX) return luaL_argerror(L, 1, "not a built-in policy");
    const char *name = names[k];
    lb_check_options(L, 2, name, specs[k], 2);
    lua_createtable(L, 0, 12);
    lua_pushstring(L, kinds[k]);
    lua_setfield(L, -2, "kind");
    if (lua_istable(L, 2)) {   /* the options over the kind: read_policy fills the rest */
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_settable(L, -4);
        }
    }
    mp_policy p = ls_read_policy(L, -1, name);
    mp_clear_error();
    if (mp_policy_check(&p)) return lt_error(L, name);
    lua_pop(L, 1);
    /* the table a script sees: what the engine will run */
    lua_createtable(L, 0, 12);
    lua_pushstring(L, kinds[k]);
    lua_setfield(L, -2, "kind");
    push_num(L, p.init);
    lua_setfield(L, -2, "init");
#define FIELD_NUM(K, V) (push_num(L, (V)), lua_setfield(L, -2, K))
#define FIELD_INT(K, V) (lua_pushinteger(L, (V)), lua_setfield(L, -2, K))
    if (k == MP_POLICY_DYNAMIC || k == MP_POLICY_HYSTERESIS) FIELD_NUM("growth", p.growth);
    if (k >= MP_POLICY_DYNAMIC) {
        FIELD_NUM("backoff", p.backoff);
        FIELD_NUM("min", p.min);
        if (p.max > 0) FIELD_NUM("max", p.max);
        lua_pushstring(L, p.error_at_min ? "error" : "warn");
        lua_setfield(L, -2, "on_min");
    }
    if (k == MP_POLICY_DYNAMIC) FIELD_INT("interval", p.interval);
    if (k == MP_POLICY_HYSTERESIS) FIELD_INT("window", p.interval), FIELD_INT("hysteresis", p.hysteresis);
    if (k == MP_POLICY_AMAX) FIELD_INT("history", p.history), FIELD_NUM("margin", p.margin);
#undef FIELD_NUM
#undef FIELD_INT
    return 1;
}

/* core._scale_ok(v): the engine's test of a loss scale */
static int a_scale_ok(lua_State *L)
{
    lua_pushboolean(L, lua_type(L, 1) == LUA_TNUMBER && mp_scale_ok(lua_tonumber(L, 1)));
    return 1;
}

static int s_new(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    mp_policy p = ls_read_policy(L, 1, "mp.amp.GradScaler");
    LScaler *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->s = NULL;
    luaL_setmetatable(L, LS_SCALER_MT);
    mp_clear_error();
    if (!(u->s = mp_scaler_new(&p))) return lt_error(L, "mp.amp.GradScaler");
    return 1;
}

static int s_gc(lua_State *L)
{
    LScaler *u = luaL_checkudata(L, 1, LS_SCALER_MT);
    mp_scaler_free(u->s);
    u->s = NULL;
    return 0;
}

/* s:set_policy(policy, scale): scale is nil (keep the current one), a number,
 * or "init" (the policy's own init, the engine's default where it has none);
 * the Lua side (GradScaler:set_policy) has checked the option's type */
static int s_set_policy(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    mp_policy p = ls_read_policy(L, 2, "GradScaler:set_policy");
    static const char *const from_init[] = {"init", NULL};
    double v = p.init;
    if (lua_type(L, 3) == LUA_TNUMBER) v = lua_tonumber(L, 3);
    else if (!lua_isnil(L, 3)) luaL_checkoption(L, 3, NULL, from_init);
    mp_clear_error();
    if (mp_scaler_set_policy(s, &p, lua_isnil(L, 3) ? NULL : &v)) return lt_error(L, "GradScaler:set_policy");
    return 0;
}

static int s_scale(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    mp_tensor *loss = lt_check(L, 2);
    LT_PUSH(L, "GradScaler:scale", mp_scaler_scale(s, loss));
    return 1;
}

static mp_optim *optim_arg(lua_State *L, int i, const char *name)
{
    void **u = luaL_testudata(L, i, "mp.Optimizer");
    if (!u || !*u) luaL_error(L, "%s: expected an optimizer (got %s)", name, luaL_typename(L, i));
    return *u;
}

static int s_unscale(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    mp_optim *o = optim_arg(L, 2, "GradScaler:unscale");
    mp_clear_error();
    if (mp_scaler_unscale(s, o)) return lt_error(L, "GradScaler:unscale");
    return 0;
}

/* true (applied), false (skipped), or nil with sync off: the decision stayed on the device */
static int s_step(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    mp_optim *o = optim_arg(L, 2, "GradScaler:step");
    int applied;
    mp_clear_error();
    if (mp_scaler_step(s, o, &applied)) return lt_error(L, "GradScaler:step");
    lt_step_done(L);
    if (applied < 0) lua_pushnil(L);
    else lua_pushboolean(L, applied);
    return 1;
}

static int s_set_sync(lua_State *L)
{
    mp_scaler_set_sync(ls_check_scaler(L, 1), lua_toboolean(L, 2));
    return 0;
}

static int s_update(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    mp_clear_error();
    if (lua_isnoneornil(L, 2) ? mp_scaler_update(s) : mp_scaler_set_scale(s, luaL_checknumber(L, 2)))
        return lt_error(L, "GradScaler:update");
    return 0;
}

/* s:_share(): data parallel: the step's findings made the same on every rank
 * (before a Lua policy reads them) */
static int s_share(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    mp_clear_error();
    if (mp_scaler_share(s)) return lt_error(L, "GradScaler:update");
    return 0;
}

static void push_stats(lua_State *L, const mp_grad_stats *st, double scale)
{
    lua_createtable(L, 0, 14);
    lua_pushinteger(L, st->n); lua_setfield(L, -2, "n");
    lua_pushinteger(L, st->nan); lua_setfield(L, -2, "nan");
    lua_pushinteger(L, st->inf); lua_setfield(L, -2, "inf");
    lua_pushnumber(L, st->amax / scale); lua_setfield(L, -2, "amax");          /* of the true gradient */
    lua_pushnumber(L, st->amax); lua_setfield(L, -2, "scaled_amax");
    double n = st->n ? (double)st->n : 1;
    lua_pushnumber(L, st->zeros / n); lua_setfield(L, -2, "zero_frac");
    lua_pushnumber(L, st->underflow / n); lua_setfield(L, -2, "underflow_frac");
    lua_pushnumber(L, st->overflow / n); lua_setfield(L, -2, "overflow_frac");
    lua_pushinteger(L, st->zeros); lua_setfield(L, -2, "zeros");
    lua_pushinteger(L, st->underflow); lua_setfield(L, -2, "underflow");
    lua_pushinteger(L, st->overflow); lua_setfield(L, -2, "overflow");
    lua_createtable(L, MP_HIST_BINS, 0);
    for (int b = 0; b < MP_HIST_BINS; b++) {
        lua_pushinteger(L, st->hist[b]);
        lua_rawseti(L, -2, b + 1);
    }
    lua_setfield(L, -2, "hist");
    lua_pushinteger(L, MP_HIST_LO); lua_setfield(L, -2, "hist_lo");
}

/* s:_info() -> the current step's findings and the policy counters (reads the
 * state back from the device) */
static int s_info(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    mp_clear_error();
    const mp_scale_state *h = mp_scaler_read(s);
    if (!h) return lt_error(L, "GradScaler (reading its state)");
    mp_skip_reason reason = mp_scaler_reason(h);
    mp_grad_stats total;
    mp_scaler_total(h, &total);
    lua_createtable(L, 0, 16);
    lua_pushnumber(L, h->scale); lua_setfield(L, -2, "scale");
    lua_pushboolean(L, reason != MP_SKIP_NONE); lua_setfield(L, -2, "found_inf");
    lua_pushstring(L, reason ? mp_skip_reason_name(reason) : NULL); lua_setfield(L, -2, "reason");
    lua_pushinteger(L, s->first_bad + 1); lua_setfield(L, -2, "first_bad");   /* 1-based, 0 if none */
    lua_pushstring(L, h->last_skip ? mp_skip_reason_name((mp_skip_reason)h->last_skip) : NULL);
    lua_setfield(L, -2, "last_skip_reason");
    lua_pushinteger(L, h->steps); lua_setfield(L, -2, "steps");
    lua_pushinteger(L, h->skipped); lua_setfield(L, -2, "skipped");
    lua_pushboolean(L, s->unscaled); lua_setfield(L, -2, "unscaled");
    lua_pushinteger(L, h->tracker); lua_setfield(L, -2, "tracker");
    lua_pushinteger(L, h->last_overflow); lua_setfield(L, -2, "last_overflow");
    lua_pushinteger(L, h->hyst_left); lua_setfield(L, -2, "hysteresis_left");
    lua_pushboolean(L, h->warned_at_min); lua_setfield(L, -2, "warned_at_min");
    lua_createtable(L, h->amax_count, 0);
    for (int i = 0; i < h->amax_count; i++) {
        lua_pushnumber(L, h->amax_hist[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "amax_history");
    lua_pushinteger(L, h->amax_pos); lua_setfield(L, -2, "amax_pos");
    float at = h->stats_scale > 0 ? h->stats_scale : h->scale;
    push_stats(L, &total, at);
    lua_setfield(L, -2, "total");
    int n = 0;
    const mp_grad_stats *pp = s->telemetry ? mp_scaler_per_param(s, &n) : NULL;
    if (n < 0) return lt_error(L, "GradScaler (reading its telemetry)");
    if (pp) {
        lua_createtable(L, n, 0);
        for (int i = 0; i < n; i++) {
            push_stats(L, &pp[i], at);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, "per_param");
    }
    return 1;
}

/* s:_restore{scale=, tracker=, last_overflow=, hysteresis_left=, amax_history=, amax_pos=, steps=, skipped=} */
static int s_restore(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    const char *name = "GradScaler:load_state_dict";
    mp_clear_error();
    const mp_scale_state *h = mp_scaler_read(s);
    if (!h) return lt_error(L, name);
    /* numbers out of the table; the engine checks them (mp_scaler_restore) */
    mp_scaler_saved v = {
        .scale = lb_number_field(L, 2, "scale", h->scale, name),
        .tracker = lb_number_field(L, 2, "tracker", 0, name),
        .last_overflow = lb_number_field(L, 2, "last_overflow", -1, name),
        .hysteresis_left = lb_number_field(L, 2, "hysteresis_left", s->policy.hysteresis, name),
        .steps = lb_number_field(L, 2, "steps", 0, name),
        .skipped = lb_number_field(L, 2, "skipped", 0, name),
        .amax_pos = lb_number_field(L, 2, "amax_pos", 0, name),
    };
    lua_getfield(L, 2, "warned_at_min");
    v.warned_at_min = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, 2, "amax_history");
    v.amax_count = lua_istable(L, -1) ? lb_len(L, -1, MP_AMAX_HISTORY_MAX, "amax_history", name) : 0;
    for (int i = 0; i < v.amax_count; i++) {
        lua_geti(L, -1, i + 1);
        if (lua_type(L, -1) != LUA_TNUMBER)
            return luaL_error(L, "%s: amax_history[%d] must be a number (got %s)", name, i + 1, luaL_typename(L, -1));
        v.amax_hist[i] = lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    mp_clear_error();
    if (mp_scaler_restore(s, &v)) return lt_error(L, name);
    return 0;
}

static int s_telemetry(lua_State *L)
{
    mp_scaler_set_telemetry(ls_check_scaler(L, 1), lua_toboolean(L, 2));
    return 0;
}

/* core._count_flush(on): count roundings in the backward pass; core._flush_stats([reset])
 * -> {op = {rounded=, flushed=, overflowed=}} (a read of the devices' counts);
 * core._flush_reset(): zero them without a read (a new step) */
static int a_count_flush(lua_State *L)
{
    mp_autograd_count_flush(lua_toboolean(L, 1));
    mp_autograd_flush_reset();
    return 0;
}

static int a_flush_reset(lua_State *L)
{
    mp_autograd_flush_reset();
    return 0;
}

static int a_flush_stats(lua_State *L)
{
    int64_t c[3];
    const char *name;
    lua_newtable(L);
    for (int i = 0; (name = mp_autograd_flush_entry(i, c)); i++) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, c[0]); lua_setfield(L, -2, "rounded");
        lua_pushinteger(L, c[1]); lua_setfield(L, -2, "flushed");
        lua_pushinteger(L, c[2]); lua_setfield(L, -2, "overflowed");
        lua_setfield(L, -2, name);
    }
    if (lua_toboolean(L, 1)) mp_autograd_flush_reset();
    return 1;
}

static const luaL_Reg smeth[] = {
    {"scale", s_scale}, {"unscale", s_unscale}, {"step", s_step}, {"update", s_update}, {"_share", s_share},
    {"set_policy", s_set_policy}, {"_info", s_info}, {"_restore", s_restore}, {"telemetry", s_telemetry},
    {"set_sync", s_set_sync},
    {NULL, NULL}
};

void mp_open_scaler(lua_State *L)
{
    luaL_newmetatable(L, LS_SCALER_MT);
    luaL_newlib(L, smeth);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, s_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    static const luaL_Reg f[] = {
        {"_scaler", s_new}, {"_policy", a_policy}, {"_scale_ok", a_scale_ok},
        {"_count_flush", a_count_flush}, {"_flush_stats", a_flush_stats}, {"_flush_reset", a_flush_reset},
        {NULL, NULL}
    };
    luaL_setfuncs(L, f, 0);
    lua_pushnumber(L, MP_MIN_SCALE);
    lua_setfield(L, -2, "_MIN_SCALE");
}
