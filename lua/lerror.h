/*
 * lerror.h: errors at the user's line. A C function of the binding that fails
 * raises `file:line: message` where file:line is the first frame outside the
 * Lua library lua/mp/ (a Lua file that `require "mp...."` resolves to), not the
 * library line that called it: `model(x)` in a script reports that script's line
 * even when nn's Lua code made the failing call. Where the caller already is
 * user code (or a C function such as pcall), the position is luaL_where's.
 *
 * Every binding file includes this through lbind.h, which makes luaL_error and
 * luaL_where these. The Lua side (lua/mp/errors.lua) raises through the same
 * walk, exposed as mp.core._where(level).
 */
#ifndef MP_LERROR_H
#define MP_LERROR_H

#include <lua.h>
#include <lauxlib.h>

/* push "file:line: " of the first non-library Lua frame at or above level
 * (levels as luaL_where's); "" when there is none */
void lb_where(lua_State *L, int level);
/* luaL_error with lb_where(L, 1) as the position */
int lb_error(lua_State *L, const char *fmt, ...);
/* mp.core._where */
void mp_open_errors(lua_State *L);

#define luaL_where lb_where
#define luaL_error lb_error

#endif
