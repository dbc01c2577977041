/*
 * lscaler_trace.c: a trace's step lines, built in C because they are built
 * every step: the Scaler's methods _trace_record (the line of the step just
 * taken), and _trace_async, _trace_snap, _trace_take (an asynchronous device's
 * snapshot, turned into its line a step later). lua/mp/amp/trace.lua writes the
 * lines and documents their format; lua/ltrace.c reads them back.
 */
#include <math.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "lua/lscaler.h"
#include "engine/scaler_trace.h"

/* a JSON number (non-finite ones as the strings "nan", "inf", "-inf") */
static void add_num(luaL_Buffer *b, double v)
{
    char t[40];
    if (isnan(v)) snprintf(t, sizeof t, "\"nan\"");
    else if (isinf(v)) snprintf(t, sizeof t, v > 0 ? "\"inf\"" : "\"-inf\"");
    else if (v == (double)(long long)v && fabs(v) < 9007199254740992.0) snprintf(t, sizeof t, "%lld", (long long)v);
    else snprintf(t, sizeof t, "%.9g", v);
    luaL_addstring(b, t);
}

static void add_field(luaL_Buffer *b, const char *key, double v)
{
    luaL_addchar(b, '"');
    luaL_addstring(b, key);
    luaL_addstring(b, "\":");
    add_num(b, v);
}

/* s:_trace_record(loss or nil) -> this step's line of a trace (lua/mp/amp/trace.lua
 * documents it), written here because it runs every step: the scale the step
 * ran at, the decision, the loss, and per parameter the counts and the
 * histogram's non-empty stretch */
static void push_record(lua_State *L, const mp_scale_state *h, const mp_grad_stats *pp, int n, bool has_loss,
                        double loss)
{
    mp_skip_reason reason = mp_scaler_reason(h);
    float at = h->stats_scale > 0 ? h->stats_scale : h->scale;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addchar(&b, '{');
    add_field(&b, "step", (double)h->steps);
    luaL_addchar(&b, ',');
    add_field(&b, "scale", h->scale);
    luaL_addstring(&b, reason != MP_SKIP_NONE ? ",\"applied\":false,\"reason\":\"" : ",\"applied\":true,\"reason\":null");
    if (reason != MP_SKIP_NONE) luaL_addstring(&b, mp_skip_reason_name(reason)), luaL_addchar(&b, '"');
    luaL_addstring(&b, ",\"loss\":");
    if (!has_loss) luaL_addstring(&b, "null");
    else add_num(&b, loss);
    luaL_addstring(&b, ",\"params\":[");
    for (int i = 0; pp && i < n; i++) {
        const mp_grad_stats *st = &pp[i];
        int lo = -1, hi = -1;
        for (int k = 0; k < MP_HIST_BINS; k++)
            if (st->hist[k]) hi = k, lo = lo < 0 ? k : lo;
        if (i) luaL_addchar(&b, ',');
        luaL_addchar(&b, '{');
        add_field(&b, "n", (double)st->n), luaL_addchar(&b, ',');
        add_field(&b, "amax", st->amax / at), luaL_addchar(&b, ',');
        add_field(&b, "nan", (double)st->nan), luaL_addchar(&b, ',');
        add_field(&b, "inf", (double)st->inf), luaL_addchar(&b, ',');
        add_field(&b, "zeros", (double)st->zeros), luaL_addchar(&b, ',');
        add_field(&b, "underflow", (double)st->underflow), luaL_addchar(&b, ',');
        add_field(&b, "overflow", (double)st->overflow), luaL_addchar(&b, ',');
        add_field(&b, "lo", lo < 0 ? 0 : lo);   /* the first non-empty bin, 0-based */
        luaL_addstring(&b, ",\"hist\":[");
        for (int k = lo; lo >= 0 && k <= hi; k++) {
            if (k > lo) luaL_addchar(&b, ',');
            add_num(&b, (double)st->hist[k]);
        }
        luaL_addstring(&b, "]}");
    }
    luaL_addstring(&b, "]}");
    luaL_pushresult(&b);
}

static int s_trace_record(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    bool has_loss = !lua_isnoneornil(L, 2);
    double loss = has_loss ? luaL_checknumber(L, 2) : 0;
    mp_clear_error();
    const mp_scale_state *h = mp_scaler_read(s);
    if (!h) return lt_error(L, "GradScaler:trace (reading the scaler's state)");
    int n = 0;
    const mp_grad_stats *pp = s->telemetry ? mp_scaler_per_param(s, &n) : NULL;
    if (n < 0) return lt_error(L, "GradScaler:trace (reading its telemetry)");
    push_record(L, h, pp, n, has_loss, loss);
    return 1;
}

/* s:_trace_async() -> whether the device snapshots without a wait;
 * s:_trace_snap(loss tensor or nil) queues this step's snapshot;
 * s:_trace_take(latest_too) -> the line of the snapshot before the latest (or
 * the latest), or nil when there is none */
static int s_trace_async(lua_State *L)
{
    lua_pushboolean(L, mp_scaler_snapshot_async(ls_check_scaler(L, 1)));
    return 1;
}

static int s_trace_snap(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    mp_tensor *loss = lua_isnoneornil(L, 2) ? NULL : lt_check(L, 2);
    mp_clear_error();
    if (mp_scaler_snapshot(s, loss)) return lt_error(L, "GradScaler:trace");
    return 0;
}

static int s_trace_take(lua_State *L)
{
    mp_scaler *s = ls_check_scaler(L, 1);
    const mp_scale_state *h;
    const mp_grad_stats *pp;
    int n;
    double loss;
    mp_clear_error();
    int rc = mp_scaler_snapshot_take(s, lua_toboolean(L, 2), &h, &pp, &n, &loss);
    if (rc < 0) return lt_error(L, "GradScaler:trace");
    if (rc > 0) return 0;
    push_record(L, h, n ? pp : NULL, n, loss == loss, loss);
    return 1;
}

/* adds the methods to the Scaler's (mp_open_scaler made it: opened before this) */
void mp_open_scaler_trace(lua_State *L)
{
    static const luaL_Reg m[] = {
        {"_trace_record", s_trace_record}, {"_trace_async", s_trace_async}, {"_trace_snap", s_trace_snap},
        {"_trace_take", s_trace_take},
        {NULL, NULL}
    };
    luaL_getmetatable(L, LS_SCALER_MT);
    lua_getfield(L, -1, "__index");
    luaL_setfuncs(L, m, 0);
    lua_pop(L, 2);
}
