/*
 * repl.h: the mpengine REPL (repl.c), for the host program (mpengine.c).
 */
#ifndef MP_REPL_H
#define MP_REPL_H
#include <lua.h>

/* Reads, runs and prints until the end of input, with SIGINT and SIGWINCH
 * its own while it waits for a line. docall runs each chunk (the host's: a
 * protected call that Ctrl-C stops, with a traceback). */
void repl_run(lua_State *L, int (*docall)(lua_State *L, int narg, int nres));
/* names the REPL's C functions that run user code (print, _PROMPT) to
 * lb_outside_binding: they hold no tensors */
void repl_outside_binding(void);
#endif
