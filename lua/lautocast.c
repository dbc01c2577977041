/*
 * lautocast.c: autocast regions (engine/autocast.h): mp.amp.autocast's guard,
 * the op classes (mp.amp.register, mp.amp.classes), and the switch that
 * mp.amp.diagnose's FP32 run turns every region off with. lua/mp/amp/autocast_regions.lua
 * is the Lua side.
 */
#include <stdio.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/op.h"
#include "engine/autocast.h"

#define GUARD_MT "mp.AutocastGuard"

static int guard_close(lua_State *L)
{
    int *tok = luaL_checkudata(L, 1, GUARD_MT);
    if (*tok >= 0) mp_autocast_exit(*tok), *tok = -1;
    return 0;
}

/* A guard collected while its region is still open: the script created it
 * without <close> (or a close call), so autocast stayed on from there until
 * now. Collection is too late and too unpredictable a moment to end the region
 * (ops after the forgotten close already ran under it), so the region is left
 * as it is and stderr says so, once per place of creation (a loop that forgets
 * does not flood it). The guard's user value is "file:line" of its creation. */
static int guard_gc(lua_State *L)
{
    int *tok = luaL_checkudata(L, 1, GUARD_MT);
    if (*tok < 0) return 0;
    lua_getiuservalue(L, 1, 1);
    const char *where = lua_isstring(L, -1) ? lua_tostring(L, -1) : "?";
    lua_getfield(L, LUA_REGISTRYINDEX, "mp.autocast_unclosed");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "mp.autocast_unclosed");
    }
    if (lua_getfield(L, -1, where) == LUA_TNIL) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -3, where);
        fprintf(stderr,
                "mpengine: warning: an autocast region created at %s was never closed (its guard was collected "
                "while the region was still on); write `local _ <close> = mp.amp.autocast(...)`, call :close(), "
                "or pass a function: mp.amp.autocast(\"f16\", fn)\n", where);
        fflush(stderr);
    }
    *tok = -1;   /* warned: the region itself stays as the script left it */
    return 0;
}

/* mp.amp.autocast("f16" | "bf16" | false) -> a to-be-closed guard */
static int a_autocast(lua_State *L)
{
    bool on = true;
    mp_dtype dt = MP_F16;
    if (lua_isboolean(L, 1) && !lua_toboolean(L, 1)) on = false;
    else if (lua_type(L, 1) == LUA_TSTRING && strcmp(lua_tostring(L, 1), "f16") == 0) dt = MP_F16;
    else if (lua_type(L, 1) == LUA_TSTRING && strcmp(lua_tostring(L, 1), "bf16") == 0) dt = MP_BF16;
    else if (lua_type(L, 1) == LUA_TSTRING)
        return luaL_error(L, "mp.amp.autocast: dtype must be f16 or bf16, or false to turn autocast off inside a "
                             "region (got '%s')", lua_tostring(L, 1));
    else return luaL_error(L, "mp.amp.autocast: expected \"f16\", \"bf16\" or false (got %s)", luaL_typename(L, 1));
    int *tok = lua_newuserdatauv(L, sizeof(int), 1);
    *tok = -1;
    luaL_setmetatable(L, GUARD_MT);
    lb_where(L, 1);   /* "file:line: " of the script's call, for guard_gc's warning */
    lua_pushstring(L, lua_tostring(L, -1)[0] ? lua_tostring(L, -1) : "an unknown place: ");
    size_t n;
    const char *w = lua_tolstring(L, -1, &n);
    lua_pushlstring(L, w, n > 2 ? n - 2 : n);   /* without the ": " */
    lua_setiuservalue(L, -4, 1);
    lua_pop(L, 2);
    mp_clear_error();
    if ((*tok = mp_autocast_enter(on, dt)) < 0) return lt_error(L, "mp.amp.autocast");
    return 1;
}

static const char *class_names[] = {"none", "low", "f32", "promote", NULL};

/* mp.amp.register(op, "low" | "f32" | "promote" | "none") */
static int a_register(lua_State *L)
{
    const char *op = luaL_checkstring(L, 1);
    const char *c = luaL_checkstring(L, 2);
    int k = -1;
    for (int i = 0; class_names[i]; i++)
        if (strcmp(c, class_names[i]) == 0) k = i;
    if (k < 0) return luaL_error(L, "mp.amp.register: class must be \"low\", \"f32\", \"promote\" or \"none\" (got '%s')", c);
    /* a name no op has would be kept and never used: a typo that changes nothing */
    if (*op && !mp_op_find(op))
        return luaL_error(L, "mp.amp.register: no op named '%s' (mp.amp.classes() lists the ops)", op);
    mp_clear_error();
    if (mp_autocast_register(op, (mp_ac_class)k)) return lt_error(L, "mp.amp.register");
    return 0;
}

/* mp.amp.classes() -> {op = class} */
static int a_classes(lua_State *L)
{
    lua_newtable(L);
    mp_ac_class c;
    const char *name;
    for (int i = 0; (name = mp_autocast_entry(i, &c)); i++) {
        lua_pushstring(L, class_names[c]);
        lua_setfield(L, -2, name);
    }
    return 1;
}

/* core._autocast_suppress(on) -> previous: every autocast region inactive while on */
static int a_autocast_suppress(lua_State *L)
{
    lua_pushboolean(L, mp_autocast_suppress(lua_toboolean(L, 1)));
    return 1;
}

void mp_open_autocast(lua_State *L)
{
    lb_guard_metatable(L, GUARD_MT, guard_close);
    luaL_getmetatable(L, GUARD_MT);   /* unlike other guards, this one notices being forgotten */
    lua_pushcfunction(L, guard_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    static const luaL_Reg f[] = {
        {"_autocast", a_autocast}, {"_register", a_register}, {"_classes", a_classes},
        {"_autocast_suppress", a_autocast_suppress},
        {NULL, NULL}
    };
    luaL_setfuncs(L, f, 0);
}
