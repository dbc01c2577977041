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
    mp_tensor *g = lt_check(L, 1), *c = lt_check(L, 2);
    lua_settop(L, 2);
    LT_PUSH(L, name, mp_lstm_cell(g, c));
    mp_tensor *hc = lt_check(L, 3);
    LT_PUSH(L, name, mp_select(hc, 1, 1));
    LT_PUSH(L, name, mp_select(hc, 1, 2));
    return 2;
}

/* mp.gru_cell(gi, gh, h_prev) -> h */
static int f_gru_cell(lua_State *L)
{
    mp_tensor *gi = lt_check(L, 1), *gh = lt_check(L, 2), *h = lt_check(L, 3);
    LT_PUSH(L, "mp.gru_cell", mp_gru_cell(gi, gh, h));
    return 1;
}

static const luaL_Reg funcs[] = {{"lstm_cell", f_lstm_cell}, {"gru_cell", f_gru_cell}, {NULL, NULL}};

void mp_open_rnn(lua_State *L) { luaL_setfuncs(L, funcs, 0); }
