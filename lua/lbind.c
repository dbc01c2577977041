/*
 * lbind.c: helpers shared by the binding files: the tensor userdata, raising
 * engine errors, pacing the garbage collector, and reading shapes, dtypes,
 * devices and option tables from Lua.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "engine/memory.h"
#include "lua/lbind.h"
#include "engine/autograd.h"

LTensor *lt_new(lua_State *L)
{
    LTensor *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->t = NULL;
    luaL_setmetatable(L, MP_TENSOR_MT);
    return u;
}

int lt_error(lua_State *L, const char *name)
{
    return luaL_error(L, "%s: %s", name, mp_error());
}

void lt_set(lua_State *L, LTensor *u, mp_tensor *t, const char *name)
{
    if (!t) lt_error(L, name);
    u->t = t;   /* the engine returned the device's errors with t (mp_checked) */
    lt_pace_gc(L, t->dev, mp_nbytes(t));
}

/* Lua's collector sees only the small userdata, not the tensor bytes behind
 * them, so the binding paces it, per device, by the bytes of new tensors it
 * hands to Lua since the last full collection ("handed"), against a threshold
 * set at that collection:
 *   due = max(1 MiB, min(what the device held right after it,
 *                        64 x the Lua heap right after it),
 *             min(the Lua heap right after it, a quarter of the device's limit))
 * - at each optimizer step (the end of a training step, when that step's
 *   temporaries are garbage unless the script kept them), a full collection
 *   once handed reaches due;
 * - at each new tensor, once handed reaches twice due (loops without an
 *   optimizer, such as an evaluation; a training step that hands more than due
 *   is collected at the same point of every step, since step ends reset it).
 * So garbage tensors never hold more than twice what the program held at the
 * last collection. A collection traverses the Lua heap: the heap term makes
 * collections more frequent, and garbage smaller, where that heap is small
 * beside the device's bytes (a training script's: ~250 KB, 0.03 ms) at a cost
 * of one heap traversal per 64 bytes of tensors per byte of heap. The last
 * term bounds the other way: a collection traverses the whole heap, so it
 * comes at most once per (twice) the heap's bytes of tensors handed, as Lua's
 * own pacing collects its objects when the heap has doubled. Without it a
 * heap larger than what the device held was traversed every time those few
 * bytes were handed again: a 44 MB heap (a vocabulary, a dataset's index in
 * tables; busted's after 60 spec files) made a loop of 20,000 1 MiB tensors
 * take 168 s instead of 0.8 s, a full collection every second tensor. The
 * device's limit caps it, so that a small limit is not reached by garbage.
 * Because due is fixed between collections and a training step hands the same
 * bytes every step, the collections fall at the same points of every period,
 * so the blocks the caching allocator holds cover every warm step and those
 * steps ask the system for nothing.
 *
 * Full collections, not incremental steps: the standalone interpreters (lua.c,
 * busted's lua5.4, mpengine) run Lua's generational mode, where a step is a
 * young collection. A tensor that lived through two of them is old and is only
 * freed by a major collection, which the small Lua heap never triggers: a loop
 * keeping 50 tensors out of a stream held 10x their bytes, and kept growing
 * (tests/lua/memory_spec.lua). */
#define COLLECT_FLOOR ((size_t)1 << 20)
#define HEAP_RATIO 64
static struct { size_t handed, due; } pace[MP_NDEVICES];
static bool stepped;   /* an optimizer step ended since the last collection at a new tensor */

/* A collection also ends a window of the caching allocators (mp_mark_cache:
 * what went unused through two windows goes back), so the windows must be
 * whole periods of the program. In a training loop they are the collections
 * at step ends (every k steps, or every step when the step also collects
 * within itself, at the same point each time: that one ends no window);
 * elsewhere (no optimizer step since the last), each collection. */
static void collect(lua_State *L, bool mark)
{
    lua_gc(L, LUA_GCCOLLECT);
    size_t heap = (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB, 0);
    for (int d = 0; d < MP_NDEVICES; d++) {
        mp_memstats m = mp_memory(d);
        size_t due = m.in_use, per_heap = heap < m.limit / 4 ? heap : m.limit / 4;
        if (due > HEAP_RATIO * heap) due = HEAP_RATIO * heap;
        if (due < per_heap) due = per_heap;
        pace[d].handed = 0;
        pace[d].due = due > COLLECT_FLOOR ? due : COLLECT_FLOOR;
        if (mark) mp_mark_cache(d);
    }
}

void lt_pace_gc(lua_State *L, mp_device d, size_t nbytes)
{
    if (!pace[d].due) pace[d].due = COLLECT_FLOOR;
    pace[d].handed += nbytes;
    if (pace[d].handed / 2 >= pace[d].due) {
        collect(L, !stepped);
        stepped = false;
    }
}

void lt_step_done(lua_State *L)
{
    bool due = false;
    for (int d = 0; d < MP_NDEVICES; d++)
        due |= pace[d].handed >= (pace[d].due ? pace[d].due : COLLECT_FLOOR);
    lb_release_pending(L);
    if (due) collect(L, true);
    stepped = true;
}

/* ---- releases that wait for the binding's C functions to return ----
 *
 * A C function of the binding holds raw pointers to the engine objects of its
 * arguments while it runs, and Lua code can run in the middle of it: a
 * metamethod of an argument (__index, __len), a finalizer started by an
 * allocation. Objects on the Lua stack cannot be collected, but that code can
 * still release one explicitly (t:free(), a <close> scope, t.grad = nil,
 * opt:free()). So an explicit release looks at the Lua call stack: while a C
 * function of this module is on it (or the caller is a coroutine, whose resumer
 * it cannot see) the object waits in `pending` until a later release, the end
 * of an optimizer step or mp.memory() finds no C function of the binding on the
 * stack. __gc needs none of this: what it collects is on no stack. */

static struct { uintptr_t lo, hi; } text;   /* this module's code: its C functions */
#define OUTSIDE_MAX 8
static lua_CFunction outside[OUTSIDE_MAX];  /* C functions in it that are not the binding's */

void lb_outside_binding(lua_CFunction f)
{
    for (int i = 0; i < OUTSIDE_MAX; i++)
        if (!outside[i] || outside[i] == f) { outside[i] = f; return; }
    /* a programming error, found the first time the program starts: a function
     * left out would have its releases deferred for as long as it runs */
    fprintf(stderr, "mpengine: lb_outside_binding: more than %d functions (raise OUTSIDE_MAX in lua/lbind.c)\n",
            OUTSIDE_MAX);
    abort();
}

static bool outside_binding(lua_CFunction f)
{
    for (int i = 0; i < OUTSIDE_MAX && outside[i]; i++)
        if (outside[i] == f) return true;
    return false;
}

static int find_text(struct dl_phdr_info *info, size_t size, void *base)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && lo <= (uintptr_t)base && (uintptr_t)base < hi) {
            text.lo = lo, text.hi = hi;
            return 1;
        }
    }
    return 0;
}

/* is a C function of the binding (not Lua's own pcall, sort, ...) on L's stack below the caller? */
static bool binding_on_stack(lua_State *L)
{
    if (!text.hi) dl_iterate_phdr(find_text, (void *)(uintptr_t)&binding_on_stack);
    if (!text.hi) return true;                          /* cannot tell: keep waiting */
    int main = lua_pushthread(L);
    lua_pop(L, 1);
    if (!main) return true;
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        lua_getinfo(L, "f", &ar);
        lua_CFunction cf = lua_tocfunction(L, -1);
        uintptr_t f = (uintptr_t)cf;
        lua_pop(L, 1);
        if (f >= text.lo && f < text.hi && !outside_binding(cf)) return true;
    }
    return false;
}

typedef struct { void (*release)(void *); void *p; } pending_release;
static struct { pending_release *v; size_t n, cap; } pending;

void lb_release_pending(lua_State *L)
{
    if (!pending.n || binding_on_stack(L)) return;
    while (pending.n) {   /* a release may run no Lua code, but take the entry off first all the same */
        pending_release r = pending.v[--pending.n];
        r.release(r.p);
    }
}

void lb_release(lua_State *L, void (*release)(void *), void *p)
{
    if (!p) return;
    if (!binding_on_stack(L)) {
        lb_release_pending(L);
        release(p);
        return;
    }
    if (pending.n == pending.cap) {
        size_t cap = pending.cap ? 2 * pending.cap : 16;
        pending_release *v = realloc(pending.v, cap * sizeof *v);
        if (!v) return;   /* out of memory: keeping the object is safe, releasing it is not */
        pending.v = v, pending.cap = cap;
    }
    pending.v[pending.n++] = (pending_release){release, p};
}

static void release_tensor(void *t) { mp_release(t); }
void lt_release(lua_State *L, mp_tensor *t) { lb_release(L, release_tensor, t); }

mp_tensor *lt_opt(lua_State *L, int i)
{
    LTensor *u = luaL_testudata(L, i, MP_TENSOR_MT);
    if (!u) return NULL;
    if (!u->t) luaL_argerror(L, i, "tensor was freed (used after t:free())");
    return u->t;
}

mp_tensor *lt_check(lua_State *L, int i)
{
    mp_tensor *t = lt_opt(L, i);
    if (!t) luaL_typeerror(L, i, "tensor");
    return t;
}

/* The one conversion of a Lua number to a C integer: Lua's own
 * (lua_tointegerx), which takes a float only when it is whole and within
 * int64's range, so no cast of an out-of-range double (undefined in C) ever
 * happens; a float it refuses is shown as it is (2.5, 1e+300, inf, nan). */
int64_t lb_integer(lua_State *L, int i, const char *what, const char *name)
{
    int ok = lua_type(L, i) == LUA_TNUMBER;
    lua_Integer v = ok ? lua_tointegerx(L, i, &ok) : 0;
    if (!ok) {
        if (lua_type(L, i) == LUA_TNUMBER)
            luaL_error(L, "%s: %s must be an integer (got %s)", name, what, lua_pushfstring(L, "%f", lua_tonumber(L, i)));
        luaL_error(L, "%s: %s must be an integer (got %s)", name, what, luaL_typename(L, i));
    }
    return v;
}

int64_t lb_integer_in(lua_State *L, int i, const char *what, const char *name, int64_t lo, int64_t hi)
{
    int64_t v = lb_integer(L, i, what, name);
    if (v < lo || v > hi)
        luaL_error(L, "%s: %s must be in %I..%I (got %I)", name, what, (lua_Integer)lo, (lua_Integer)hi, (lua_Integer)v);
    return v;
}

int64_t lb_integer_field(lua_State *L, int t, const char *k, int64_t dflt, const char *name)
{
    int64_t v = dflt;
    if (lua_getfield(L, t, k) != LUA_TNIL) v = lb_integer(L, -1, k, name);
    lua_pop(L, 1);
    return v;
}

double lb_number_field(lua_State *L, int t, const char *k, double dflt, const char *name)
{
    double v = dflt;
    if (lua_getfield(L, t, k) != LUA_TNIL) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "%s: %s must be a number (got %s)", name, k, luaL_typename(L, -1));
        v = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

mp_tensor **lb_tensor_list(lua_State *L, int i, int max, const char *what, const char *name, int *n)
{
    i = lua_absindex(L, i);
    if (!lua_istable(L, i)) luaL_error(L, "%s: %s must be a list of tensors (got %s)", name, what, luaL_typename(L, i));
    *n = lb_len(L, i, max, what, name);
    /* the values are copied into a fresh table that stays on the stack: a proxy's
     * __index may hand out a tensor that nothing else keeps alive */
    lua_createtable(L, *n, 0);
    mp_tensor **ts = lua_newuserdatauv(L, sizeof(mp_tensor *) * (size_t)(*n ? *n : 1), 0);
    lua_insert(L, -2);   /* pointers below the anchor table; both stay until the C function returns */
    for (int k = 0; k < *n; k++) {
        lua_geti(L, i, k + 1);
        if (!(ts[k] = lt_opt(L, -1)))
            luaL_error(L, "%s: %s[%d] is %s (expected a tensor)", name, what, k + 1, luaL_typename(L, -1));
        lua_rawseti(L, -2, k + 1);
    }
    return ts;
}

int lb_dim(lua_State *L, int i, const char *name)
{
    int64_t d = lb_integer(L, i, "dim", name);
    if (d > MP_MAXDIM || d < -MP_MAXDIM)   /* the engine's check would see a truncated int */
        luaL_error(L, "%s: dim %I out of range (tensors have at most %d dims)", name, (lua_Integer)d, MP_MAXDIM);
    return (int)d;
}

lua_Integer lb_length(lua_State *L, int i, const char *what, const char *name)
{
    lua_len(L, i);   /* may run a __len */
    int ok = lua_type(L, -1) == LUA_TNUMBER;
    lua_Integer n = ok ? lua_tointegerx(L, -1, &ok) : 0;
    if (!ok) luaL_error(L, "%s: the length of %s must be an integer (got %s %s)", name, what,
                        lua_type(L, -1) == LUA_TNUMBER ? "the fraction" : "a", 
                        lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
    lua_pop(L, 1);
    if (n < 0) luaL_error(L, "%s: the length of %s is negative (%I)", name, what, n);
    return n;
}

int lb_len(lua_State *L, int i, int max, const char *what, const char *name)
{
    lua_Integer n = lb_length(L, i, what, name);
    if (n > max) luaL_error(L, "%s: %s has %I entries (at most %d)", name, what, n, max);
    return (int)n;
}

int lb_shape(lua_State *L, int i, int64_t *shape, const char *name)
{
    if (lua_type(L, i) == LUA_TNUMBER) {
        shape[0] = lb_integer(L, i, "size", name);
        if (shape[0] <= 0) luaL_error(L, "%s: size must be positive (got %I)", name, (lua_Integer)shape[0]);
        return 1;
    }
    if (!lua_istable(L, i)) luaL_error(L, "%s: shape must be a table of sizes (got %s)", name, luaL_typename(L, i));
    int n = lb_len(L, i, MP_MAXDIM, "shape", name);
    for (int d = 0; d < n; d++) {
        lua_geti(L, i, d + 1);
        char what[32];
        snprintf(what, sizeof what, "size of dim %d", d + 1);
        shape[d] = lb_integer(L, -1, what, name);
        lua_pop(L, 1);
    }
    return n;
}

mp_dtype lb_dtype(lua_State *L, int i, const char *name)
{
    mp_dtype dt;
    if (lua_type(L, i) != LUA_TSTRING) luaL_error(L, "%s: dtype must be a string (got %s)", name, luaL_typename(L, i));
    if (mp_dtype_parse(lua_tostring(L, i), &dt)) lt_error(L, name);
    return dt;
}

mp_device lb_device(lua_State *L, int i, const char *name)
{
    mp_device d;
    if (lua_type(L, i) != LUA_TSTRING) luaL_error(L, "%s: device must be a string (got %s)", name, luaL_typename(L, i));
    if (mp_device_parse(lua_tostring(L, i), &d) || mp_device_check(d)) lt_error(L, name);
    return d;
}

static const char DEVICE_KEY = 0;   /* registry key of the default device */

mp_device lb_default_device(lua_State *L)
{
    lua_rawgetp(L, LUA_REGISTRYINDEX, &DEVICE_KEY);
    mp_device d = lua_isinteger(L, -1) ? (mp_device)lua_tointeger(L, -1) : MP_CPU;
    lua_pop(L, 1);
    return d;
}

int lb_set_default_device(lua_State *L)
{
    mp_device d = lb_device(L, 1, "mp.set_default_device");
    lua_pushinteger(L, d);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &DEVICE_KEY);
    return 0;
}

/* ---- the one option-table checker ----
 * spec: "key:type ..." in the order an error lists them; type: number, integer,
 * boolean, string, table, function or any. Raw reads (lua_next): an option
 * table's metamethods run no code here. */
static bool opt_type_ok(lua_State *L, int v, const char *type, size_t tlen)
{
#define IS(T) (tlen == sizeof T - 1 && memcmp(type, T, tlen) == 0)
    int t = lua_type(L, v);
    if (IS("any")) return true;
    if (IS("number")) return t == LUA_TNUMBER;
    if (IS("integer")) {   /* lb_integer's test: whole and within int64 */
        int ok = t == LUA_TNUMBER;
        if (ok) lua_tointegerx(L, v, &ok);
        return ok;
    }
    if (IS("boolean")) return t == LUA_TBOOLEAN;
    if (IS("string")) return t == LUA_TSTRING;
    if (IS("table")) return t == LUA_TTABLE;
    if (IS("function")) return t == LUA_TFUNCTION;
    return false;
#undef IS
}

static int opt_error(lua_State *L, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    luaL_where(L, level);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_concat(L, 2);
    return lua_error(L);
}

mp_tensor *lb_tensor_arg(lua_State *L, int i, const char *what, const char *name)
{
    mp_tensor *t = lt_opt(L, i);
    if (!t) {
        if (i == 1 && strncmp(name, "Tensor:", 7) == 0) what = "self";
        luaL_error(L, "%s: %s must be a tensor (got %s)", name, what, luaL_typename(L, i));
    }
    return t;
}

void lb_max_args(lua_State *L, int n, const char *name)
{
    int top = lua_gettop(L);
    if (top <= n) return;
    lt_opt(L, 1);   /* a freed tensor says so first, whatever else is wrong */
    luaL_error(L, "%s: too many arguments (at most %d, got %d)", name, n, top);
}

int lb_check_options(lua_State *L, int i, const char *name, const char *spec, int level)
{
    if (lua_isnoneornil(L, i)) return 0;
    if (!lua_istable(L, i)) return opt_error(L, level, "%s: options must be a table (got %s)", name, luaL_typename(L, i));
    i = lua_absindex(L, i);
    lua_pushnil(L);
    while (lua_next(L, i)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        size_t klen = k ? strlen(k) : 0;
        const char *type = NULL, *p = spec;
        size_t tlen = 0;
        while (k && *p) {   /* find "k:" among the words of spec */
            const char *colon = strchr(p, ':'), *end = colon ? colon + strcspn(colon, " ") : p + strlen(p);
            if (colon && (size_t)(colon - p) == klen && memcmp(p, k, klen) == 0) {
                type = colon + 1, tlen = (size_t)(end - colon - 1);
                break;
            }
            p = *end ? end + 1 : end;
        }
        if (!type) {   /* name every option, in spec's order: "a, b or c" */
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            int n = 0, total = 0;
            for (const char *q = spec; *q; q++) total += *q == ':';
            for (p = spec; *p;) {
                const char *colon = strchr(p, ':'), *end = colon + strcspn(colon, " ");
                if (n++) luaL_addstring(&b, n == total ? " or " : ", ");
                luaL_addlstring(&b, p, (size_t)(colon - p));
                p = *end ? end + 1 : end;
            }
            luaL_pushresult(&b);
            return opt_error(L, level, "%s: unknown option %s%s%s (expected %s)", name, k ? "'" : "",
                      k ? k : luaL_typename(L, -3), k ? "'" : "", lua_tostring(L, -1));
        }
        if (!opt_type_ok(L, -1, type, tlen)) {
            char tn[16];
            snprintf(tn, sizeof tn, "%.*s", (int)tlen, type);
            const char *got = lua_type(L, -1) == LUA_TNUMBER && strcmp(tn, "integer") == 0
                                  ? lua_pushfstring(L, "%f", lua_tonumber(L, -1)) : luaL_typename(L, -1);
            return opt_error(L, level, "%s: option %s must be %s %s (got %s)", name, k, tn[0] == 'i' ? "an" : "a", tn, got);
        }
        lua_pop(L, 1);
    }
    return 1;
}

/* core._options(name, opts, spec [, level]) -> opts or {}: the checker above for
 * the Lua library; level as error()'s, counted from the caller of core._options */
int lb_options_lua(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1), *spec = luaL_checkstring(L, 3);
    int level = (int)luaL_optinteger(L, 4, 2);
    if (!lb_check_options(L, 2, name, spec, level)) {
        lua_newtable(L);
        return 1;
    }
    lua_settop(L, 2);
    return 1;
}

lb_opts lb_options(lua_State *L, int i, const char *name)
{
    return lb_options_def(L, i, name, (lb_opts){MP_F32, lb_default_device(L), 0});
}

lb_opts lb_options_def(lua_State *L, int i, const char *name, lb_opts o)
{
    if (!lb_check_options(L, i, name, "dtype:any device:any requires_grad:any", 1)) return o;
    i = lua_absindex(L, i);
    if (lua_getfield(L, i, "dtype") != LUA_TNIL) o.dtype = lb_dtype(L, -1, name);
    if (lua_getfield(L, i, "device") != LUA_TNIL) o.device = lb_device(L, -1, name);
    if (lua_getfield(L, i, "requires_grad") != LUA_TNIL) o.requires_grad = lua_toboolean(L, -1);
    lua_pop(L, 3);
    return o;
}

void lb_apply_options(lua_State *L, const lb_opts *o, const char *name)
{
    if (!o->requires_grad) return;
    LTensor *u = luaL_checkudata(L, -1, MP_TENSOR_MT);
    mp_clear_error();
    if (mp_set_requires_grad(u->t, true)) lt_error(L, name);
}

void lb_guard_metatable(lua_State *L, const char *tname, lua_CFunction close)
{
    if (luaL_newmetatable(L, tname)) {
        lua_pushcfunction(L, close);
        lua_setfield(L, -2, "__close");
        lua_createtable(L, 0, 1);
        lua_pushcfunction(L, close);
        lua_setfield(L, -2, "close");
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
}
