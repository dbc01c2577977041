/*
 * lbind.h: what the binding files share. A tensor userdata holds one reference
 * to an engine tensor (NULL once freed). Engine failures become Lua errors
 * prefixed with the Lua name of the function; an allocation failure first runs
 * a full collection and retries once.
 */
#ifndef MP_LBIND_H
#define MP_LBIND_H

#include <lua.h>
#include <lauxlib.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "lerror.h"   /* luaL_error and luaL_where at the user's line */

#define MP_TENSOR_MT "mp.Tensor"

typedef struct { mp_tensor *t; } LTensor;

/* a new userdata holding no tensor yet, so an error before it is filled leaks nothing */
LTensor *lt_new(lua_State *L);
/* fill a new userdata with an engine result; raises `name: message` on failure */
void lt_set(lua_State *L, LTensor *u, mp_tensor *t, const char *name);
mp_tensor *lt_check(lua_State *L, int i);
mp_tensor *lt_opt(lua_State *L, int i);             /* NULL when not a tensor */
int lt_error(lua_State *L, const char *name);       /* raise the engine's error */
int lt_pow(lua_State *L, const char *name);         /* base ^ exponent, tensors or numbers (ltensor.c) */
/* An explicit release (t:free(), <close>, t.grad = x, opt:free()): done now, or,
 * while a C function of the binding is on the stack and may hold the object's
 * raw pointer, later (lbind.c); lb_release_pending does the waiting ones once
 * none is. Finalizers (__gc) release at once: what they collect is on no stack. */
void lb_release(lua_State *L, void (*release)(void *), void *p);
void lt_release(lua_State *L, mp_tensor *t);
void lb_release_pending(lua_State *L);
/* a C function linked with the binding that holds no engine pointers while Lua
 * runs under it (the CLI's main function), so releases under it need not wait */
void lb_outside_binding(lua_CFunction f);
/* GC pacing (lbind.c): a new tensor of nbytes on device d given to Lua; and the
 * end of an optimizer step */
void lt_pace_gc(lua_State *L, mp_device d, size_t nbytes);
void lt_step_done(lua_State *L);
/* a scope guard's metatable (autocast, no_grad, no_sync): close runs at the end
 * of a <close> scope and as guard:close(); no __gc, so only those end it */
void lb_guard_metatable(lua_State *L, const char *tname, lua_CFunction close);

/* Run an engine call that returns a new tensor; on out-of-memory collect
 * garbage and try once more. Evaluates EXPR up to twice. */
#define LT_CALL(L, EXPR)                                                   \
    ({                                                                     \
        mp_clear_error();                                                  \
        mp_tensor *r_ = (EXPR);                                            \
        if (!r_ && mp_errcode_last() == MP_EOOM) {                         \
            lua_gc((L), LUA_GCCOLLECT);                                    \
            mp_clear_error();                                              \
            r_ = (EXPR);                                                   \
        }                                                                  \
        r_;                                                                \
    })
/* push a new tensor userdata holding the result of EXPR */
#define LT_PUSH(L, NAME, EXPR)                                             \
    do {                                                                   \
        LTensor *u_ = lt_new(L);                                           \
        lt_set((L), u_, LT_CALL((L), (EXPR)), (NAME));                     \
    } while (0)

/* shapes, dtypes, devices and options from Lua values */
/* Lua numbers to C integers, always through these (lbind.c): 3 and 3.0, not
 * "3", 2.5 or 1e300; _in adds a range; _field reads t.k (dflt when nil) */
int64_t lb_integer(lua_State *L, int i, const char *what, const char *name);
int64_t lb_integer_in(lua_State *L, int i, const char *what, const char *name, int64_t lo, int64_t hi);
int64_t lb_integer_field(lua_State *L, int t, const char *k, int64_t dflt, const char *name);
double lb_number_field(lua_State *L, int t, const char *k, double dflt, const char *name);   /* t.k or dflt */
/* the tensors of a Lua list, kept alive on the stack until the C function returns */
mp_tensor **lb_tensor_list(lua_State *L, int i, int max, const char *what, const char *name, int *n);
int lb_dim(lua_State *L, int i, const char *name);      /* an integer within +-MP_MAXDIM */
/* #t through __len: an integer >= 0 (and <= max for lb_len), or a clear error */
lua_Integer lb_length(lua_State *L, int i, const char *what, const char *name);
int lb_len(lua_State *L, int i, int max, const char *what, const char *name);
int lb_shape(lua_State *L, int i, int64_t *shape, const char *name);   /* returns ndim */
mp_dtype lb_dtype(lua_State *L, int i, const char *name);
mp_device lb_device(lua_State *L, int i, const char *name);
mp_device lb_default_device(lua_State *L);
typedef struct { mp_dtype dtype; mp_device device; int requires_grad; } lb_opts;
int lb_set_default_device(lua_State *L);
/* The one option-table checker: the table at i (none or nil: no options, 0)
 * holds only the keys of spec ("key:type ...", type: number, integer, boolean,
 * string, table, function or any), each of its type; else an error naming the
 * function and the option, positioned at `level` (as error()'s, counted from
 * the C function). Returns 1 when there is a table. */
int lb_check_options(lua_State *L, int i, const char *name, const char *spec, int level);
/* at most n arguments (a method's self counts): more is an error naming name, never
 * ignored (x:add_(g, -lr), PyTorch's alpha, would otherwise update wrongly) */
void lb_max_args(lua_State *L, int n, const char *name);
/* the tensor at i, or an error naming it: "what", or "self" for argument 1 of a
 * method (a name "Tensor:...") */
mp_tensor *lb_tensor_arg(lua_State *L, int i, const char *what, const char *name);
int lb_options_lua(lua_State *L);   /* core._options(name, opts, spec [, level]) */
lb_opts lb_options(lua_State *L, int i, const char *name);
lb_opts lb_options_def(lua_State *L, int i, const char *name, lb_opts defaults);
/* apply opts.requires_grad to the new tensor on top of the stack */
void lb_apply_options(lua_State *L, const lb_opts *o, const char *name);

#endif
