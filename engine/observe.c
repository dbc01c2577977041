/*
 * observe.c: the op-by-op record of a step (observe.h). The record is this
 * thread's (engine/state.h); it reaches mp_apply's outputs through the op
 * layer's output hook and the nodes' gradients as a backward listener, both
 * installed by the first mp_observe_start.
 */
#include <stdlib.h>
#include "engine/observe.h"
#include "engine/op.h"
#include "engine/backward.h"
#include "engine/state.h"

static void drop_list(mp_state *s)
{
    for (int i = 0; i < s->observe.n; i++) mp_release(s->observe.list[i].t);
    free(s->observe.list);
    s->observe.list = NULL, s->observe.n = s->observe.cap = 0;
}

static void output_seen(const mp_op *op, mp_tensor *out) { mp_observe(op->name, false, 0, out); }

static void gradients_seen(const mp_node *x, mp_tensor *const *gin)
{
    if (!mp_state_get()->observe.on) return;
    for (int i = 0; i < x->nin; i++) mp_observe(x->name, true, i, gin[i]);
}

static mp_backward_listener listener = {.gradients = gradients_seen};

int mp_observe_start(void)
{
    mp_state *s = mp_state_get();
    if (s->observe.on) return -1;
    drop_list(s);
    mp_op_set_output_hook(output_seen);
    mp_backward_listen(&listener);
    s->observe.on = true;
    return 0;
}

void mp_observe_stop(mp_observed **out, int *count)
{
    mp_state *s = mp_state_get();
    s->observe.on = false;
    *out = s->observe.list, *count = s->observe.n;
    s->observe.list = NULL, s->observe.n = s->observe.cap = 0;
}

bool mp_observing(void) { return mp_state_get()->observe.on; }

void mp_observe(const char *op, bool backward, int input, mp_tensor *t)
{
    mp_state *s = mp_state_get();
    if (!s->observe.on || !t || (s->in_backward && !backward)) return;
    if (s->observe.n == s->observe.cap) {
        int c = s->observe.cap ? 2 * s->observe.cap : 256;
        mp_observed *l = realloc(s->observe.list, sizeof *l * (size_t)c);
        if (!l) { s->observe.on = false; return; }   /* the record ends here; what it has stays valid */
        s->observe.list = l, s->observe.cap = c;
    }
    s->observe.list[s->observe.n++] = (mp_observed){op, backward, input, mp_retain(t)};
}
