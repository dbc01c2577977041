/*
 * lrnn.c: mp.lstm_cell and mp.gru_cell (docs/API.md "Recurrent layers"), the fused
 * cells under mp.nn.LSTM and mp.nn.GRU (lua/mp/nn/rnn.lua), for a model that
 * runs its own time loop.
 */
#include "lua/lbind.h"
#include "lua/lcore.h"

/* mp.lstm_cell(gates, c_prev) -> h, c: the engine's op gives them stacked
 * {2, b, h}; two selects (recorded, so gradients flow) take them apart */
static int f_lstm_cell(lua_State *L)
{
    const char *name = "mp.lstm_cell";
    lb_max_args(L, 2, name);
    mp_tensor *g = lb_tensor_arg(L, 1, "gates", name), *c = lb_tensor_arg(L, 2, "c_prev", name);
    LT_PUSH(L, name, mp_lstm_cell(g, c));
    mp_tensor *hc = lt_check(L, 3);
    LT_PUSH(L, name, mp_select(hc, 1, 1));
    LT_PUSH(L, name, mp_select(hc, 1, 2));
    return 2;
}

/* mp.gru_cell(gi, gh, h_prev) -> h */
static int f_gru_cell(lua_State *L)
{
    lb_max_args(L, 3, "mp.gru_cell");
    mp_tensor *gi = lb_tensor_arg(L, 1, "gi", "mp.gru_cell"), *gh = lb_tensor_arg(L, 2, "gh", "mp.gru_cell"),
              *h = lb_tensor_arg(L, 3, "h_prev", "mp.gru_cell");
    LT_PUSH(L, "mp.gru_cell", mp_gru_cell(gi, gh, h));
    return 1;
}

static const luaL_Reg funcs[] = {{"lstm_cell", f_lstm_cell}, {"gru_cell", f_gru_cell}, {NULL, NULL}};

void mp_open_rnn(lua_State *L) { luaL_setfuncs(L, funcs, 0); }
