/*
 * lcore.h: the C half of the Lua module `mp` (loaded as `mp.core`), and the
 * entries of the binding files that luaopen_mp_core gathers into it.
 * Built into build/mp/core.so for plain lua5.4 and linked into the mpengine CLI,
 * which registers it in package.preload.
 */
#ifndef MP_LCORE_H
#define MP_LCORE_H
#include <lua.h>
int luaopen_mp_core(lua_State *L);
/* the CLI names its C functions that run scripts and hold no tensors (lua/lbind.c;
 * declared here too, so that the host program needs no engine header) */
void lb_outside_binding(lua_CFunction f);

/* The binding files' entries, as Lua's lualib.h lists its libraries': each
 * adds its functions to the table on top of the stack (mp.core), called in
 * this order by luaopen_mp_core (lcore.c). */
int luaopen_mp_tensor(lua_State *L);                 /* leaves the methods table (ltensor.c) */
int lt_tostring(lua_State *L);                       /* tostring(t), ltensor_print.c (ltensor.c's __tostring) */
void mp_open_data(lua_State *L);                     /* adds mp.core._data (ldata.c) */
void mp_open_io(lua_State *L);                       /* mp.save, mp.load (lio.c) */
void mp_open_functional(lua_State *L);               /* functional ops and grad mode (lfunctional.c) */
void mp_open_math(lua_State *L);                     /* math and reductions, mp.op and t:op (lmath.c) */
void mp_open_optim(lua_State *L);                    /* the Optimizer type (loptim.c) */
void mp_open_util(lua_State *L);                     /* clock, isatty, rng state (lutil.c) */
void mp_open_lines(lua_State *L);                    /* line files and JSON for traces (llines.c) */
void mp_open_trace(lua_State *L);                    /* a trace's records and replay's trajectory, packed (ltrace.c) */
void mp_open_autocast(lua_State *L);                 /* autocast regions and op classes (lautocast.c) */
void mp_open_scaler(lua_State *L);                   /* the Scaler and the built-in policies (lscaler.c) */
void mp_open_scaler_trace(lua_State *L);             /* the Scaler's trace lines (lscaler_trace.c; after mp_open_scaler) */
void mp_open_lab(lua_State *L);                      /* replay's policy simulator, diagnose's observer (llab.c) */
void mp_open_dist(lua_State *L);                     /* mp.dist's C half (ldist.c) */
void mp_open_autograd(lua_State *L);                 /* mp.autograd.grad's C half (lautograd.c) */
int la_backward(lua_State *L);                       /* Tensor:backward (lautograd.c) */
void mp_open_function(lua_State *L);                 /* mp.autograd.Function's C half (lfunction.c) */
void mp_open_hooks(lua_State *L);                    /* Tensor:register_hook (lhooks.c; after luaopen_mp_tensor) */
void mp_open_anomaly(lua_State *L);                  /* mp.autograd's anomaly mode (lanomaly.c) */
void mp_open_shape(lua_State *L);                    /* shape and indexing ops, mp.X and Tensor:X (lshape.c; after luaopen_mp_tensor) */
void mp_open_fp8(lua_State *L);                      /* core._fp8_quantize, core._fp8_matmul (lfp8.c) */
/* mp.linear, mp.linear_gelu, mp.matmul, Tensor:matmul ask first: 1 with the FP8 result on top
 * of the stack, 0 to run the op as usual (lfp8.c; mp.fp8.autocast's matmul option) */
int lfp8_route(lua_State *L, const char *op);
void mp_open_rnn(lua_State *L);                      /* mp.lstm_cell, mp.gru_cell (lrnn.c) */
void mp_open_inplace(lua_State *L);
void mp_open_cuda_graph(lua_State *L);               /* mp.cuda.graph (lcuda_graph.c; after mp.cuda is made) */                  /* mp.clamp, Tensor:add_ and the in-place ops (linplace.c; after luaopen_mp_tensor) */
#endif
