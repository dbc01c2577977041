/*
 * observe.c: the op-by-op record of a step (observe.h).
 */
#include <stdlib.h>
#include "engine/observe.h"

static bool on, in_backward;
static mp_observed *list;
static int n, cap;

static void drop_list(void)
{
    for (int i = 0; i < n; i++) mp_release(list[i].t);
    free(list);
    list = NULL, n = cap = 0;
}

int mp_observe_start(void)
{
    if (on) return -1;
    drop_list();
    on = true;
    return 0;
}

void mp_observe_stop(mp_observed **out, int *count)
{
    on = false;
    *out = list, *count = n;
    list = NULL, n = cap = 0;
}

bool mp_observing(void) { return on; }

bool mp_observe_in_backward(bool b)
{
    bool was = in_backward;
    in_backward = b;
    return was;
}

void mp_observe(const char *op, bool backward, int input, mp_tensor *t)
{
    if (!on || !t || (in_backward && !backward)) return;
    if (n == cap) {
        int c = cap ? 2 * cap : 256;
        mp_observed *l = realloc(list, sizeof *l * (size_t)c);
        if (!l) { on = false; return; }   /* the record ends here; what it has stays valid */
        list = l, cap = c;
    }
    list[n++] = (mp_observed){op, backward, input, mp_retain(t)};
}
