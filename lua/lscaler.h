/*
 * lscaler.h: what lscaler.c shares with the binding files that add to the
 * Scaler userdata (lscaler_trace.c: its trace methods) or read a policy table
 * (llab.c: replay's policy simulator).
 */
#ifndef MP_LSCALER_H
#define MP_LSCALER_H

#include <lua.h>
#include "engine/scaler.h"

#define LS_SCALER_MT "mp.Scaler"

/* the scaler of the Scaler userdata at i; an argument error once freed */
mp_scaler *ls_check_scaler(lua_State *L, int i);
/* The engine's policy from a policy table: the engine's defaults for its kind,
 * changed by the fields the table has; errors name `name` */
mp_policy ls_read_policy(lua_State *L, int t, const char *name);

#endif
