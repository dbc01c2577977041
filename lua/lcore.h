/*
 * lcore.h: the C half of the Lua module `mp` (loaded as `mp.core`).
 * Built into build/mp/core.so for plain lua5.4 and linked into the mpengine CLI,
 * which registers it in package.preload.
 */
#ifndef MP_LCORE_H
#define MP_LCORE_H
#include <lua.h>
int luaopen_mp_core(lua_State *L);
/* the CLI names its C functions that run scripts and hold no tensors (lua/lbind.c) */
void lb_outside_binding(lua_CFunction f);
#endif
