/*
 * state.c: the engine's per-thread state (engine/state.h).
 */
#include "engine/state.h"

static _Thread_local mp_state state = {.grad_enabled = true, .next_seq = 1, .next_visit = 1};

mp_state *mp_state_get(void) { return &state; }
