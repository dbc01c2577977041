/*
 * grad_hooks.c: the hooks of a tensor's gradient (engine/grad_hooks.h).
 */
#include <stddef.h>
#include <stdlib.h>
#include "engine/grad_hooks.h"
#include "engine/graph.h"
#include "engine/state.h"
#include "engine/error.h"

/* One hook. Two references: its owner's list (until removed or the owner goes)
 * and the caller's handle (until dropped); the last one frees it. */
struct mp_grad_hook {
    mp_grad_hook_fn fn;
    void (*release)(void *payload);
    void *payload;
    bool removed;                  /* runs no more; payload released */
    int refs;
    mp_grad_hooks *owner;          /* NULL once the owner is gone */
    mp_grad_hook *next;
};

/* A list. A leaf's is released with the tensor, a node's with the node, both
 * through its head (tensor.c and graph.c know nothing of hooks). */
struct mp_grad_hooks {
    mp_node_head head;             /* first */
    int running;                   /* mp_grad_hooks_run calls under way on it */
    bool dirty;                    /* a hook was removed while running: unlink it after */
    bool doomed;                   /* its owner went while running: free it after */
    mp_grad_hook *first, *last;
};

_Static_assert(offsetof(mp_grad_hooks, head) == 0, "a list is released through its first member");

static void unref(mp_grad_hook *h)
{
    if (--h->refs == 0) free(h);
}

static void retire(mp_grad_hook *h)   /* no more runs; the payload goes now */
{
    if (h->removed) return;
    h->removed = true;
    if (h->release) h->release(h->payload);
    h->payload = NULL;
}

static void sweep(mp_grad_hooks *hs)   /* unlink the removed hooks (none running) */
{
    mp_grad_hook **p = &hs->first, *prev = NULL;
    while (*p) {
        mp_grad_hook *h = *p;
        if (!h->removed) { prev = h, p = &h->next; continue; }
        *p = h->next;
        h->owner = NULL;
        unref(h);
    }
    hs->last = prev;
    hs->dirty = false;
}

static void free_hooks(mp_grad_hooks *hs)
{
    if (!hs) return;
    if (hs->running) { hs->doomed = true; return; }
    for (mp_grad_hook *h = hs->first, *next; h; h = next) {
        next = h->next;
        retire(h);
        h->owner = NULL;
        unref(h);
    }
    free(hs);
}

static void release_head(mp_node_head *head) { free_hooks((mp_grad_hooks *)head); }

/* the head is the list's first member */
mp_grad_hooks *mp_node_grad_hooks(const mp_node *n) { return (mp_grad_hooks *)n->hooks; }

mp_grad_hooks *mp_grad_hooks_of(const mp_tensor *t)
{
    return t->grad_fn ? mp_node_grad_hooks(t->grad_fn) : (mp_grad_hooks *)t->hooks;
}

mp_grad_hook *mp_grad_hook_add(mp_tensor *t, mp_grad_hook_fn fn, void (*release)(void *payload), void *payload)
{
    if (!t->requires_grad)
        return mp_fail(MP_EINVAL, "cannot register a hook on a tensor that does not require grad"), NULL;
    mp_node_head **slot = t->grad_fn ? &t->grad_fn->hooks : &t->hooks;
    mp_grad_hook *h = calloc(1, sizeof *h);
    if (!h) return mp_fail(MP_EOOM, "out of memory adding a gradient hook"), NULL;
    if (!*slot) {
        mp_grad_hooks *hs = calloc(1, sizeof *hs);
        if (!hs) {
            free(h);
            return mp_fail(MP_EOOM, "out of memory adding a gradient hook"), NULL;
        }
        hs->head.release = release_head;
        *slot = &hs->head;
    }
    mp_grad_hooks *hs = (mp_grad_hooks *)*slot;
    h->fn = fn, h->release = release, h->payload = payload;
    h->refs = 2;                   /* the list's and the handle's */
    h->owner = hs;
    if (hs->last) hs->last->next = h;
    else hs->first = h;
    hs->last = h;
    return h;
}

void mp_grad_hook_remove(mp_grad_hook *h)
{
    if (!h || h->removed) return;
    retire(h);
    mp_grad_hooks *hs = h->owner;
    if (!hs) return;
    if (hs->running) hs->dirty = true;
    else sweep(hs);
}

void mp_grad_hook_drop(mp_grad_hook *h)
{
    if (h) unref(h);
}

bool mp_grad_hooks_running(void) { return mp_state_get()->hooks_running > 0; }

int mp_grad_hooks_run(mp_grad_hooks *hs, void *caller, mp_tensor **g)
{
    if (!hs || !hs->first) return 0;
    mp_state *s = mp_state_get();
    mp_grad_hook *end = hs->last;  /* hooks added from here on wait for the next gradient */
    int rc = 0;
    hs->running++;
    s->hooks_running++;
    for (mp_grad_hook *h = hs->first; h && rc == 0; h = h == end ? NULL : h->next) {
        if (h->removed) continue;
        mp_tensor was = **g;       /* its shape, dtype and device (a replaced *g is released) */
        rc = h->fn(h->payload, caller, g);
        if (rc == 0 && (!mp_same_shape(*g, &was) || (*g)->dtype != was.dtype || (*g)->dev != was.dev))
            rc = mp_fail(MP_EINVAL, "a gradient hook changed the gradient's shape, dtype or device");
    }
    s->hooks_running--;
    if (--hs->running == 0) {
        if (hs->doomed) free_hooks(hs);
        else if (hs->dirty) sweep(hs);
    }
    return rc;
}
