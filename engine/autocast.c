/*
 * autocast.c: the region stack, the op-class table and the per-region cast
 * cache (the stack and the cache are this thread's: engine/state.h).
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "engine/autocast.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/graph.h"
#include "engine/state.h"

/* The class of each op by name: seeded, on first use, from the ops' own
 * descriptions (engine/op.h), then changed and extended by mp_autocast_register.
 * It grows as names come: no op is left out for want of room. */
typedef struct { char name[32]; mp_ac_class c; } op_class;
static op_class *ops;
static int nops = -1, ops_cap;

/* room for one more entry: 0, or -1 when memory runs out */
static int grow(void)
{
    if (nops < ops_cap) return 0;
    int cap = ops_cap ? 2 * ops_cap : 128;
    op_class *o = realloc(ops, sizeof *o * (size_t)cap);
    if (!o) return -1;
    ops = o, ops_cap = cap;
    return 0;
}

static int find(const char *name)
{
    for (int i = 0; i < nops; i++)
        if (strcmp(ops[i].name, name) == 0) return i;
    return -1;
}

/* 0, or -1 out of memory (the table stays unseeded, to be tried again) */
static int seed(void)
{
    if (nops >= 0) return 0;
    nops = 0;
    const mp_op *op;
    for (int i = 0; (op = mp_op_at(i)); i++) {
        if (op->ac == MP_AC_NONE || find(op->name) >= 0) continue;
        if (grow()) return nops = -1, mp_fail(MP_EOOM, "autocast: out of memory for the op classes");
        snprintf(ops[nops].name, sizeof ops[nops].name, "%s", op->name);
        ops[nops++].c = op->ac;
    }
    return 0;
}

/* the cast cache (this thread's: engine/state.h): (leaf, dtype) -> its cast,
 * alive for the outermost region */
static void clear_cache(mp_state *s)
{
    for (int i = 0; i < s->autocast.ncache; i++) {
        mp_release(s->autocast.cache[i].src);
        mp_release(s->autocast.cache[i].cast);
    }
    s->autocast.ncache = 0;
}

/* keep r as src's cast (retained); without room (out of memory) the cast is
 * only not cached: the next use casts again, as correct and slower */
static void cache_add(mp_state *s, mp_tensor *src, mp_tensor *r)
{
    if (s->autocast.ncache == s->autocast.cache_cap) {
        int cap = s->autocast.cache_cap ? 2 * s->autocast.cache_cap : 64;
        mp_cast_entry *c = realloc(s->autocast.cache, sizeof *c * (size_t)cap);
        if (!c) return;
        s->autocast.cache = c, s->autocast.cache_cap = cap;
    }
    s->autocast.cache[s->autocast.ncache++] =
        (mp_cast_entry){.src = mp_retain(src), .cast = mp_retain(r), .version = src->st->version};
    /* a weight read by a GEMM in the forward and again in the backward: the
     * GEMMs keep its values widened once (engine/ops_matmul.c) */
    if (r->dtype == MP_F16 || r->dtype == MP_BF16) r->st->keep_wide = true;
}

static int enter(bool enabled, mp_dtype dt, bool backward)
{
    mp_state *s = mp_state_get();
    if (s->autocast.depth == MP_AUTOCAST_MAX_DEPTH)
        return mp_fail(MP_EINVAL, "autocast regions nested deeper than %d", MP_AUTOCAST_MAX_DEPTH);
    if (enabled && dt != MP_F16 && dt != MP_BF16)
        return mp_fail(MP_EINVAL, "autocast dtype must be f16 or bf16 (got %s)", mp_dtype_name(dt));
    mp_op_set_arg_hook(mp_autocast_arg);   /* from the first region on, mp_apply asks */
    s->autocast.stack[s->autocast.depth].on = enabled;
    s->autocast.stack[s->autocast.depth].dt = dt;
    s->autocast.stack[s->autocast.depth].backward =
        backward || (s->autocast.depth > 0 && s->autocast.stack[s->autocast.depth - 1].backward);
    return s->autocast.depth++;
}

int mp_autocast_enter(bool enabled, mp_dtype dt) { return enter(enabled, dt, false); }

int mp_autocast_enter_state(mp_autocast_state st) { return enter(st.on, st.dt, true); }

mp_autocast_state mp_autocast_now(void)
{
    mp_autocast_state st = {.on = false, .dt = MP_F16};
    st.on = mp_autocast_active(&st.dt);
    return st;
}

void mp_autocast_exit(int token)
{
    mp_state *s = mp_state_get();
    if (token < 0 || token >= s->autocast.depth) return;   /* already closed (regions close innermost first) */
    s->autocast.depth = token;
    if (token == 0) clear_cache(s);
}

bool mp_autocast_suppress(bool on)
{
    mp_state *s = mp_state_get();
    bool was = s->autocast.suppressed;
    s->autocast.suppressed = on;
    return was;
}

bool mp_autocast_active(mp_dtype *dt)
{
    mp_state *s = mp_state_get();
    int depth = s->autocast.depth;
    if (s->autocast.suppressed || depth == 0 || !s->autocast.stack[depth - 1].on) return false;
    if (s->in_backward && !s->autocast.stack[depth - 1].backward) return false;
    if (dt) *dt = s->autocast.stack[depth - 1].dt;
    return true;
}

int mp_autocast_register(const char *op, mp_ac_class c)
{
    if (seed()) return -1;
    if (!op || !*op || strlen(op) >= sizeof ops[0].name)
        return mp_fail(MP_EINVAL, "op name must be 1 to %zu characters", sizeof ops[0].name - 1);
    for (int i = 0; i < nops; i++)
        if (strcmp(ops[i].name, op) == 0) return ops[i].c = c, 0;
    if (grow()) return mp_fail(MP_EOOM, "mp_autocast_register: out of memory");
    strcpy(ops[nops].name, op);
    ops[nops++].c = c;
    return 0;
}

mp_ac_class mp_autocast_class(const char *op)
{
    seed();
    for (int i = 0; i < nops; i++)
        if (strcmp(ops[i].name, op) == 0) return ops[i].c;
    return MP_AC_NONE;
}

const char *mp_autocast_entry(int i, mp_ac_class *c)
{
    seed();
    if (i < 0 || i >= nops) return NULL;
    *c = ops[i].c;
    return ops[i].name;
}

mp_tensor *mp_autocast_arg(const mp_op *op, mp_tensor *t)
{
    mp_dtype low;
    /* f64 is left alone, as PyTorch's autocast casts only f32/f16/bf16 inputs:
     * a script that asked for f64 keeps it, for low-precision and f32 ops both */
    if (!t || !mp_autocast_active(&low) || !mp_is_float(t->dtype) || t->dtype == MP_F64)
        return t ? mp_retain(t) : NULL;
    if (seed()) return NULL;
    mp_ac_class c = mp_autocast_class(op->name);
    /* an f32 op that widens 16-bit inputs in its kernels: the values of an f32
     * cast (widening is exact) without the f32 copy, and its gradient rounded
     * once to the input's dtype as the cast's backward would */
    if (c == MP_AC_F32 && op->widens_itself && (t->dtype == MP_F16 || t->dtype == MP_BF16)) return mp_retain(t);
    mp_dtype want = c == MP_AC_LOW ? low : c == MP_AC_F32 ? MP_F32 : t->dtype;
    if (want == t->dtype) return mp_retain(t);
    /* a master weight, cast while recording: a cast made under no_grad has no
     * history and must not stand in for one that needs it */
    mp_state *s = mp_state_get();
    bool cacheable = t->requires_grad && !t->grad_fn && s->grad_enabled;
    mp_cast_entry *cache = s->autocast.cache;
    if (cacheable)
        for (int i = 0; i < s->autocast.ncache; i++)
            if (cache[i].src == t && cache[i].cast->dtype == want) {
                if (cache[i].version == t->st->version) return mp_retain(cache[i].cast);
                /* the master changed since (an optimizer step inside the region): cast again */
                mp_release(cache[i].src);
                mp_release(cache[i].cast);
                cache[i--] = cache[--s->autocast.ncache];
            }
    /* recorded: the gradient flows back in t's dtype; a master weight of an
     * optimizer comes from the working copy the optimizer step wrote */
    mp_tensor *r = cacheable ? mp_arena_cast(t, want) : mp_to(t, want, t->dev);
    if (r && cacheable) cache_add(s, t, r);
    /* data (no gradient wanted): a GEMM's input in the forward and again in the
     * weight gradient's GEMM, kept widened once between them (engine/ops_matmul.c),
     * for 4 bytes an element, what the f32 data it was cast from costs */
    else if (r && !t->requires_grad && (want == MP_F16 || want == MP_BF16)) r->st->keep_wide = true;
    return r;
}
