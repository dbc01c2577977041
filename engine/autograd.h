/*
 * autograd.h: dynamic reverse-mode differentiation, for the engine's users
 * (the Lua binding, tests): the graph (engine/graph.h: nodes, recording, grad
 * mode, leaves' .grad), the backward pass (engine/backward.h) and its flush
 * telemetry (engine/flush_count.h).
 *
 * Inside the engine each file includes the part it needs: the ops only the
 * graph (through engine/op.h), since the backward pass runs ops.
 */
#ifndef MP_AUTOGRAD_H
#define MP_AUTOGRAD_H

#include "engine/graph.h"
#include "engine/backward.h"
#include "engine/flush_count.h"

#endif
