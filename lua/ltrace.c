/*
 * ltrace.c: a loss-scaler trace's step records, and a replay's trajectory, held
 * packed (mp.amp.load_trace in lua/mp/amp/trace.lua, mp.amp.replay in lab.lua). A Lua table per
 * record with a 64-entry histogram table per parameter took 3.5 KB a step for
 * two parameters (7 GB for a run of 2 million steps); here such a step takes 69
 * bytes (the layout is below), in arrays that are Lua userdata (the collector
 * sees their size: collectgarbage("count") includes them).
 *
 *   core._trace_steps() -> an empty store (mp.amp.TraceSteps)
 *   core._trace_add(s, line) -> true, or false and why: one step line (the format of
 *       lua/lscaler_trace.c's push_record, documented in lua/mp/amp/trace.lua) parsed and checked
 *       field by field (types, ranges, and what the engine's counts obey: none
 *       above the parameter's n), appended; a refused line leaves s as it was
 *   core._trace_bytes(s) -> the bytes its arrays hold
 *   core._trace_fit(s): the arrays shrunk to what they hold (growth leaves slack)
 *   #s, s[i], ipairs(s), pairs(s): the i-th record as a fresh table, each
 *     histogram expanded to all MP_HIST_BINS bins (a change to it is not kept:
 *     s[i] = record keeps one, a table replay reads instead)
 *   core._trajectory(names) -> an empty trajectory (mp.amp.Trajectory)
 *   core._trajectory_add(t, step, scale, skipped, reason, unknown, under) appends
 *     a replayed step (under: the list of its parameters' underflow fractions)
 *   #t, t[i], ipairs(t), pairs(t) -> {step =, scale =, skipped =, reason =,
 *     unknown =, underflow = {[name] = fraction}}, a fresh table each time
 *
 * The parser takes the engine's JSON only: the fields it writes, each once, no
 * others (what the store cannot hold would be lost without a word), strings
 * without escapes; a line is parsed in place (no tree of its values is built,
 * so memory does not follow the line's length).
 */
#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "kernels/backend.h"

#define STEPS_MT "mp.amp.TraceSteps"
#define TRAJ_MT "mp.amp.Trajectory"
#define MAX_COUNT 9007199254740992.0   /* 2^53: the engine writes counts as exact integers */

/* ---- growable arrays in userdata (uservalue k of the object at index 1) ---- */

typedef struct {
    void *p;
    size_t n, cap, size;   /* elements used, held; bytes each */
} Arr;

/* room for `more` elements; the new block replaces the old as uservalue k */
static void *arr_reserve(lua_State *L, Arr *a, int k, size_t more)
{
    if (!more) return a->p;   /* (no arithmetic on a NULL block) */
    if (a->cap - a->n >= more) return (char *)a->p + a->n * a->size;
    size_t cap = a->cap ? a->cap + a->cap / 2 : 64;
    if (cap < a->n + more) cap = a->n + more;
    if (cap > (SIZE_MAX / 2) / a->size) luaL_error(L, "%s: too many records", STEPS_MT);
    void *p = lua_newuserdatauv(L, cap * a->size, 0);
    if (a->n) memcpy(p, a->p, a->n * a->size);
    lua_setiuservalue(L, 1, k);
    a->p = p, a->cap = cap;
    return (char *)p + a->n * a->size;
}

/* the array at its length: the slack of its growth given back */
static void arr_fit(lua_State *L, Arr *a, int k)
{
    if (a->cap == a->n) return;
    void *p = lua_newuserdatauv(L, a->n * a->size, 0);
    if (a->n) memcpy(p, a->p, a->n * a->size);
    lua_setiuservalue(L, 1, k);
    a->p = p, a->cap = a->n;
}

/* ---- the store ----
 * Each step is a run of bytes in `bytes`, from its offset in `index`: a fixed
 * head (flags: the reason in bits 0-1, a loss in bit 2; the step, an int64; the
 * scale, an f32: the engine's scale is one, and the 9 digits written give it back
 * exactly; the loss, a double; the parameter count, a uint32), then per parameter
 * its six counts as varints, amax as an f32 (the engine's is one), lo, the number
 * of bins, and the bins' counts as varints. Two parameters and a dozen bins take
 * 69 bytes a step, its offset in index included. */

enum { R_NONE, R_OVERFLOW, R_NAN, R_FORWARD };
static const char *const REASONS[] = {NULL, "overflow", "nan", "forward"};

enum { H_FLAGS = 0, H_STEP = 1, H_SCALE = 9, H_LOSS = 13, H_NP = 21, HEAD = 25 };
#define F_LOSS 4

typedef struct {
    Arr index, bytes;   /* uservalues 1, 2; 3: the records assigned (a table) */
} Store;

static Store *check_store(lua_State *L) { return luaL_checkudata(L, 1, STEPS_MT); }

static void put_varint(lua_State *L, Arr *a, int k, uint64_t v)
{
    unsigned char *p = arr_reserve(L, a, k, 10);
    size_t n = 0;
    while (v >= 0x80) p[n++] = (unsigned char)(v | 0x80), v >>= 7;
    p[n++] = (unsigned char)v;
    a->n += n;
}

/* n bytes into an array of bytes */
static void put_raw(lua_State *L, Arr *a, int k, const void *v, size_t n)
{
    memcpy(arr_reserve(L, a, k, n), v, n);
    a->n += n;
}

static uint64_t get_varint(const unsigned char **p)
{
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
        unsigned char c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return v;
    }
}

/* ---- the parser ---- */

typedef struct {
    const char *p, *start, *end;
    char why[200];
    char tok[64];   /* the last number read, as written: for messages */
    char point;     /* the locale's decimal point (strtod reads it) */
    /* the field being read, for messages (its name is formatted only for one) */
    uint32_t param; /* params[param] (1-based), or 0: a field of the record */
    const char *key;
    int bin;        /* hist[bin] (1-based), or 0 */
    char name[64];
} Parser;

/* the field being read: `what` when given, else params[i].key[bin] as set */
static const char *field(Parser *ps, const char *what)
{
    if (what) return what;
    if (!ps->param) return ps->key;
    if (ps->bin) snprintf(ps->name, sizeof ps->name, "params[%u].%s[%d]", (unsigned)ps->param, ps->key, ps->bin);
    else snprintf(ps->name, sizeof ps->name, "params[%u].%s", (unsigned)ps->param, ps->key);
    return ps->name;
}

static int failf(Parser *ps, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->why, sizeof ps->why, fmt, ap);
    va_end(ap);
    return 0;
}

static int syntax(Parser *ps)
{
    if (ps->p >= ps->end) return failf(ps, "not JSON (it ends early)");
    return failf(ps, "not JSON (near byte %ld)", (long)(ps->p - ps->start) + 1);
}

static void skip_ws(Parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n')) ps->p++;
}

/* the next non-blank character, not taken (0 at the end) */
static char peek(Parser *ps)
{
    skip_ws(ps);
    return ps->p < ps->end ? *ps->p : 0;
}

static int expect(Parser *ps, char c)
{
    if (peek(ps) != c) return syntax(ps);
    ps->p++;
    return 1;
}

static int take_word(Parser *ps, const char *w)
{
    size_t n = strlen(w);
    skip_ws(ps);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0) return syntax(ps);
    ps->p += n;
    return 1;
}

/* what the value that starts here is, for a message: "a string", ... */
static const char *kind_at(Parser *ps)
{
    switch (peek(ps)) {
    case '"': return "a string";
    case '[': return "a list";
    case '{': return "an object";
    case 't': case 'f': return "a boolean";
    case 'n': return "null";
    case '-': case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': case '8': case '9':
        return "a number";
    default: return NULL;
    }
}

/* the value here is not what `what` needs */
static int wrong(Parser *ps, const char *what, const char *expected)
{
    const char *k = kind_at(ps);
    if (!k) return syntax(ps);
    return failf(ps, "%s is %s (expected %s)", field(ps, what), k, expected);
}

/* a string without escapes: its bytes in [*s, *s + *n) */
static int take_string(Parser *ps, const char **s, size_t *n)
{
    if (!expect(ps, '"')) return 0;
    const char *b = ps->p;
    while (ps->p < ps->end && *ps->p != '"') {
        if (*ps->p == '\\' || (unsigned char)*ps->p < 0x20)
            return failf(ps, "a string with an escape or a control character (near byte %ld; the engine writes none)",
                         (long)(ps->p - ps->start) + 1);
        ps->p++;
    }
    if (ps->p >= ps->end) return syntax(ps);
    *s = b, *n = (size_t)(ps->p - b);
    ps->p++;
    return 1;
}

/* a finite JSON number (its syntax checked here: strtod takes more, "0x1p3", "inf") */
static int take_number(Parser *ps, const char *what, const char *expected, double *v)
{
    skip_ws(ps);
    const char *b = ps->p, *q = ps->p, *e = ps->end;
    if (q < e && *q == '-') q++;
    if (q < e && *q == '0') q++;
    else if (q < e && *q >= '1' && *q <= '9') while (q < e && *q >= '0' && *q <= '9') q++;
    else return wrong(ps, what, expected);
    if (q < e && *q == '.') {
        q++;
        if (!(q < e && *q >= '0' && *q <= '9')) { ps->p = q; return syntax(ps); }
        while (q < e && *q >= '0' && *q <= '9') q++;
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < e && (*q == '+' || *q == '-')) q++;
        if (!(q < e && *q >= '0' && *q <= '9')) { ps->p = q; return syntax(ps); }
        while (q < e && *q >= '0' && *q <= '9') q++;
    }
    char t[sizeof ps->tok];
    if ((size_t)(q - b) >= sizeof t) return failf(ps, "%s is a number of more than 63 characters", field(ps, what));
    memcpy(t, b, (size_t)(q - b));
    t[q - b] = 0;
    memcpy(ps->tok, t, sizeof t);
    char *dot = strchr(t, '.');
    if (dot && ps->point) *dot = ps->point;   /* strtod reads the locale's decimal point */
    *v = strtod(t, NULL);
    if (!isfinite(*v))
        return failf(ps, "%s is %s, beyond a double's range (expected %s)", field(ps, what), ps->tok, expected);
    ps->p = q;
    return 1;
}

/* a number, or one of the strings "nan", "inf", "-inf" (how the engine writes those) */
static int take_real(Parser *ps, const char *what, double *v)
{
    const char *expected = "a number, or \"nan\", \"inf\" or \"-inf\"";
    if (peek(ps) != '"') return take_number(ps, what, expected, v);
    const char *s;
    size_t n;
    if (!take_string(ps, &s, &n)) return 0;
    if (n == 3 && !memcmp(s, "nan", 3)) *v = NAN;
    else if (n == 3 && !memcmp(s, "inf", 3)) *v = INFINITY;
    else if (n == 4 && !memcmp(s, "-inf", 4)) *v = -INFINITY;
    else return failf(ps, "%s is \"%.*s\" (expected %s)", field(ps, what), n > 40 ? 40 : (int)n, s, expected);
    return 1;
}

/* an integer count in [0, max] */
static int take_count(Parser *ps, const char *what, double max, int64_t *out)
{
    double v;
    if (!take_number(ps, what, max == MAX_COUNT ? "an integer from 0 to 2^53" : "an integer from 0 to 63", &v)) return 0;
    if (!(v >= 0 && v <= max && v == floor(v)))
        return failf(ps, "%s is %s (expected an integer from 0 to %.17g)", field(ps, what), ps->tok, max);
    *out = (int64_t)v;
    return 1;
}

/* the next key of an object: its index in names, or -1 with why set */
static int take_key(Parser *ps, const char *const *names, int count, unsigned *seen, const char *where)
{
    const char *s;
    size_t n;
    if (!take_string(ps, &s, &n) || !expect(ps, ':')) return -1;
    for (int i = 0; i < count; i++) {
        if (strlen(names[i]) == n && !memcmp(names[i], s, n)) {
            if (*seen & (1u << i)) return failf(ps, "%s has the field '%s' twice", where, names[i]), -1;
            *seen |= 1u << i;
            return i;
        }
    }
    return failf(ps, "%s has a field '%.*s' that a trace's records do not have", where, n > 40 ? 40 : (int)n, s), -1;
}

static int missing(Parser *ps, const char *const *names, int count, unsigned seen, const char *where)
{
    for (int i = 0; i < count; i++)
        if (!(seen & (1u << i))) return failf(ps, "%s has no field '%s'", where, names[i]);
    return 1;
}

/* the members of an object, each through the code given, to its closing brace */
#define EACH_MEMBER(ps, ...)                           \
    do {                                               \
        if (!expect(ps, '{')) return 0;                \
        if (peek(ps) == '}') { (ps)->p++; break; }     \
        for (;;) {                                     \
            __VA_ARGS__                                \
            if (peek(ps) == '}') { (ps)->p++; break; } \
            if (!expect(ps, ',')) return 0;            \
        }                                              \
    } while (0)

static const char *const PARAM_KEYS[] = {"n", "amax", "nan", "inf", "zeros", "underflow", "overflow", "lo", "hist"};
enum { K_N, K_AMAX, K_NAN, K_INF, K_ZEROS, K_UNDER, K_OVER, K_LO, K_HIST, N_PARAM_KEYS };

/* one parameter's object, appended to the store's bytes */
static int parse_param(lua_State *L, Store *st, Parser *ps, uint32_t index)
{
    char where[48];
    snprintf(where, sizeof where, "params[%u]", (unsigned)index);
    ps->param = index, ps->bin = 0;
    unsigned seen = 0;
    int64_t counts[N_PARAM_KEYS] = {0}, bins[MP_HIST_BINS], lo = 0;
    int nb = 0;
    double amax = 0;
    EACH_MEMBER(ps, {
        int k = take_key(ps, PARAM_KEYS, N_PARAM_KEYS, &seen, where);
        if (k < 0) return 0;
        ps->key = PARAM_KEYS[k];
        if (k == K_AMAX) {
            if (!take_real(ps, NULL, &amax)) return 0;
            if (amax < 0 || (isfinite(amax) && amax > FLT_MAX))
                return failf(ps, "%s is %s (expected a magnitude, >= 0, that an f32 holds)", field(ps, NULL), ps->tok);
        } else if (k == K_LO) {
            if (!take_count(ps, NULL, MP_HIST_BINS - 1, &lo)) return 0;
        } else if (k == K_HIST) {
            if (peek(ps) != '[') return wrong(ps, NULL, "a list of counts");
            ps->p++;
            if (peek(ps) == ']') ps->p++;
            else
                for (;;) {
                    if (nb == MP_HIST_BINS)
                        return failf(ps, "%s has more than the trace's %d bins", field(ps, NULL), MP_HIST_BINS);
                    ps->bin = nb + 1;
                    if (!take_count(ps, NULL, MAX_COUNT, &bins[nb])) return 0;
                    nb++;
                    if (peek(ps) == ']') { ps->p++; break; }
                    if (!expect(ps, ',')) return 0;
                }
            ps->bin = 0;
        } else if (!take_count(ps, NULL, MAX_COUNT, &counts[k])) {
            return 0;
        }
    });
    if (!missing(ps, PARAM_KEYS, N_PARAM_KEYS, seen, where)) return 0;
    int64_t n = counts[K_N];
    static const int bounded[] = {K_NAN, K_INF, K_ZEROS, K_UNDER, K_OVER};
    for (size_t i = 0; i < sizeof bounded / sizeof *bounded; i++)
        if (counts[bounded[i]] > n)
            return failf(ps, "%s.%s is %lld, more than its n (%lld)", where, PARAM_KEYS[bounded[i]],
                         (long long)counts[bounded[i]], (long long)n);
    if (lo + nb > MP_HIST_BINS)
        return failf(ps, "%s.hist: %d bins from bin %lld run past the trace's %d", where, nb, (long long)lo, MP_HIST_BINS);
    int64_t sum = 0;
    for (int b = 0; b < nb; b++)
        if ((sum += bins[b]) > n)   /* each <= 2^53, at most 64 of them: no overflow */
            return failf(ps, "%s.hist counts more values than its n (%lld)", where, (long long)n);
    static const int order[] = {K_N, K_NAN, K_INF, K_ZEROS, K_UNDER, K_OVER};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) put_varint(L, &st->bytes, 2, (uint64_t)counts[order[i]]);
    float a = (float)amax;
    unsigned char shape[2] = {(unsigned char)lo, (unsigned char)nb};
    put_raw(L, &st->bytes, 2, &a, sizeof a);
    put_raw(L, &st->bytes, 2, shape, 2);
    for (int b = 0; b < nb; b++) put_varint(L, &st->bytes, 2, (uint64_t)bins[b]);
    return 1;
}

static const char *const STEP_KEYS[] = {"step", "scale", "applied", "reason", "loss", "params"};
enum { S_STEP, S_SCALE, S_APPLIED, S_REASON, S_LOSS, S_PARAMS, N_STEP_KEYS };

/* one step line, appended to the store's bytes (its head first, filled in last) */
static int parse_step(lua_State *L, Store *st, Parser *ps)
{
    unsigned seen = 0;
    int applied = 0, has_loss = 0;
    uint8_t reason = R_NONE;
    int64_t step = 0;
    double scale = 0, loss = 0;
    uint32_t np = 0;
    size_t at = st->bytes.n;
    arr_reserve(L, &st->bytes, 2, HEAD);
    st->bytes.n += HEAD;
    if (peek(ps) != '{') return kind_at(ps) ? failf(ps, "the line is %s, not a step record", kind_at(ps)) : syntax(ps);
    EACH_MEMBER(ps, {
        int k = take_key(ps, STEP_KEYS, N_STEP_KEYS, &seen, "the record");
        if (k < 0) return 0;
        const char *s;
        size_t n;
        switch (k) {
        case S_STEP:
            if (!take_count(ps, "step", MAX_COUNT, &step)) return 0;
            break;
        case S_SCALE:
            if (!take_number(ps, "scale", "a finite number > 0", &scale)) return 0;
            if (!(scale > 0 && scale <= FLT_MAX && (float)scale > 0))
                return failf(ps, "scale is %s (expected a finite number > 0 that an f32 holds)", ps->tok);
            break;
        case S_APPLIED:
            if (peek(ps) == 't' && take_word(ps, "true")) applied = 1;
            else if (peek(ps) == 'f' && take_word(ps, "false")) applied = 0;
            else return *ps->why ? 0 : wrong(ps, "applied", "true or false");
            break;
        case S_REASON:
            if (peek(ps) == 'n') {
                if (!take_word(ps, "null")) return 0;
                break;
            }
            if (peek(ps) != '"') return wrong(ps, "reason", "null or a string");
            if (!take_string(ps, &s, &n)) return 0;
            for (int i = 1; i <= R_FORWARD; i++)
                if (strlen(REASONS[i]) == n && !memcmp(REASONS[i], s, n)) reason = (uint8_t)i;
            if (!reason)
                return failf(ps, "reason is \"%.*s\" (expected null, \"overflow\", \"nan\" or \"forward\")",
                             n > 40 ? 40 : (int)n, s);
            break;
        case S_LOSS:
            if (peek(ps) == 'n') {
                if (!take_word(ps, "null")) return 0;
                has_loss = 0;
            } else {
                if (!take_real(ps, "loss", &loss)) return 0;
                has_loss = 1;
            }
            break;
        case S_PARAMS:
            if (peek(ps) != '[') return wrong(ps, "params", "a list");
            ps->p++;
            if (peek(ps) == ']') { ps->p++; break; }
            for (;;) {
                if (np == UINT32_MAX) return failf(ps, "params: too many");
                if (!parse_param(L, st, ps, np + 1)) return 0;
                ps->param = 0;
                np++;
                if (peek(ps) == ']') { ps->p++; break; }
                if (!expect(ps, ',')) return 0;
            }
            break;
        }
    });
    if (!missing(ps, STEP_KEYS, N_STEP_KEYS, seen, "the record")) return 0;
    if (applied != (reason == R_NONE))
        return failf(ps, applied ? "applied is true with a reason to skip" : "applied is false with no reason");
    skip_ws(ps);
    if (ps->p != ps->end) return failf(ps, "more after the record's closing brace (near byte %ld)", (long)(ps->p - ps->start) + 1);
    unsigned char *h = (unsigned char *)st->bytes.p + at;
    float sc = (float)scale;
    h[H_FLAGS] = (unsigned char)(reason | (has_loss ? F_LOSS : 0));
    memcpy(h + H_STEP, &step, 8), memcpy(h + H_SCALE, &sc, 4), memcpy(h + H_LOSS, &loss, 8), memcpy(h + H_NP, &np, 4);
    return 1;
}

static int s_add(lua_State *L)
{
    Store *st = check_store(L);
    size_t n;
    const char *line = luaL_checklstring(L, 2, &n);
    Parser ps = {.p = line, .start = line, .end = line + n, .point = localeconv()->decimal_point[0]};
    size_t at = st->bytes.n;
    if (!parse_step(L, st, &ps)) {
        st->bytes.n = at;   /* what the line added, taken back */
        lua_pushboolean(L, 0);
        lua_pushstring(L, ps.why[0] ? ps.why : "not a step record");
        return 2;
    }
    *(uint64_t *)arr_reserve(L, &st->index, 1, 1) = at;
    st->index.n++;
    lua_pushboolean(L, 1);
    return 1;
}

/* ---- records as tables ---- */

static void set_num(lua_State *L, const char *k, double v) { lua_pushnumber(L, v); lua_setfield(L, -2, k); }
static void set_int(lua_State *L, const char *k, int64_t v) { lua_pushinteger(L, (lua_Integer)v); lua_setfield(L, -2, k); }

static void push_record(lua_State *L, const Store *st, size_t i)
{
    const unsigned char *h = (const unsigned char *)st->bytes.p + ((const uint64_t *)st->index.p)[i];
    int64_t step;
    float scale;
    double loss;
    uint32_t np;
    memcpy(&step, h + H_STEP, 8), memcpy(&scale, h + H_SCALE, 4), memcpy(&loss, h + H_LOSS, 8), memcpy(&np, h + H_NP, 4);
    int reason = h[H_FLAGS] & 3;
    lua_createtable(L, 0, 6);
    set_int(L, "step", step);
    set_num(L, "scale", scale);
    lua_pushboolean(L, reason == R_NONE); lua_setfield(L, -2, "applied");
    if (reason) { lua_pushstring(L, REASONS[reason]); lua_setfield(L, -2, "reason"); }
    if (h[H_FLAGS] & F_LOSS) set_num(L, "loss", loss);
    lua_createtable(L, (int)(np < 1u << 20 ? np : 1u << 20), 0);
    const unsigned char *p = h + HEAD;
    for (uint32_t k = 0; k < np; k++) {
        lua_createtable(L, 0, 9);
        static const char *const order[] = {"n", "nan", "inf", "zeros", "underflow", "overflow"};
        for (int c = 0; c < 6; c++) set_int(L, order[c], (int64_t)get_varint(&p));
        float amax;
        memcpy(&amax, p, 4);
        set_num(L, "amax", amax);
        int lo = p[4], nb = p[5];
        p += 6;
        set_int(L, "lo", lo);
        lua_createtable(L, MP_HIST_BINS, 0);
        for (int b = 0; b < MP_HIST_BINS; b++) {
            lua_pushinteger(L, b >= lo && b < lo + nb ? (lua_Integer)get_varint(&p) : 0);
            lua_rawseti(L, -2, b + 1);
        }
        lua_setfield(L, -2, "hist");
        lua_rawseti(L, -2, (lua_Integer)k + 1);
    }
    lua_setfield(L, -2, "params");
}

/* an index 1..n from the key at 2, or 0 */
static size_t index_of(lua_State *L, size_t n)
{
    int isint;
    lua_Integer i = lua_tointegerx(L, 2, &isint);
    return isint && i >= 1 && (lua_Unsigned)i <= n ? (size_t)i : 0;
}

static int s_index(lua_State *L)
{
    Store *st = check_store(L);
    size_t i = index_of(L, st->index.n);
    if (!i) return 0;
    lua_getiuservalue(L, 1, 3);   /* a record assigned to this index */
    if (lua_type(L, -1) == LUA_TTABLE) {
        lua_pushvalue(L, 2);
        if (lua_rawget(L, -2) != LUA_TNIL) return 1;
    }
    push_record(L, st, i - 1);
    return 1;
}

/* steps[i] = record: replay reads it in place of the recorded one */
static int s_newindex(lua_State *L)
{
    Store *st = check_store(L);
    size_t i = index_of(L, st->index.n);
    if (!i) return luaL_error(L, "%s: only a step 1..%I can be assigned", STEPS_MT, (lua_Integer)st->index.n);
    if (!lua_istable(L, 3)) return luaL_error(L, "%s: a step is assigned a record (a table)", STEPS_MT);
    if (lua_getiuservalue(L, 1, 3) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setiuservalue(L, 1, 3);
    }
    lua_pushinteger(L, (lua_Integer)i);
    lua_pushvalue(L, 3);
    lua_rawset(L, -3);
    return 0;
}

static int s_len(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)check_store(L)->index.n);
    return 1;
}

/* the bytes the records take (the arrays as held) */
static int s_bytes(lua_State *L)
{
    Store *st = check_store(L);
    size_t b = sizeof *st + st->index.cap * st->index.size + st->bytes.cap * st->bytes.size;
    lua_pushinteger(L, (lua_Integer)b);
    return 1;
}

/* core._trace_fit(s): the arrays at their length (the file is read) */
static int s_fit(lua_State *L)
{
    Store *st = check_store(L);
    arr_fit(L, &st->index, 1);
    arr_fit(L, &st->bytes, 2);
    return 0;
}

static int s_tostring(lua_State *L)
{
    lua_pushfstring(L, "%s (%I steps)", STEPS_MT, (lua_Integer)check_store(L)->index.n);
    return 1;
}

static int new_store(lua_State *L)
{
    Store *st = lua_newuserdatauv(L, sizeof *st, 3);
    memset(st, 0, sizeof *st);
    st->index.size = sizeof(uint64_t), st->bytes.size = 1;
    luaL_setmetatable(L, STEPS_MT);
    return 1;
}

/* ---- a replay's trajectory ---- */

typedef struct {
    int64_t step;
    double scale;
    uint64_t u0;
    uint32_t np;
    uint8_t skipped, reason, unknown;
} TStep;

typedef struct {
    Arr steps, under;   /* uservalues 1, 2; 3: the parameters' names */
} Traj;

static Traj *check_traj(lua_State *L) { return luaL_checkudata(L, 1, TRAJ_MT); }

static int new_traj(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    Traj *t = lua_newuserdatauv(L, sizeof *t, 3);
    memset(t, 0, sizeof *t);
    t->steps.size = sizeof(TStep), t->under.size = sizeof(double);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 3);
    luaL_setmetatable(L, TRAJ_MT);
    return 1;
}

/* core._trajectory_add(t, step, scale, skipped, reason, unknown, under) */
static int t_add(lua_State *L)
{
    Traj *t = check_traj(L);
    TStep s = {.step = (int64_t)luaL_checkinteger(L, 2), .scale = luaL_checknumber(L, 3),
               .skipped = (uint8_t)lua_toboolean(L, 4), .unknown = (uint8_t)lua_toboolean(L, 6)};
    const char *r = luaL_optstring(L, 5, NULL);
    for (int i = 1; r && i <= R_FORWARD; i++)
        if (!strcmp(r, REASONS[i])) s.reason = (uint8_t)i;
    luaL_checktype(L, 7, LUA_TTABLE);
    lua_Integer np = (lua_Integer)lua_rawlen(L, 7);   /* the entries it holds, not what a __len claims */
    luaL_argcheck(L, np < UINT32_MAX, 7, "too many parameters");
    s.np = (uint32_t)np, s.u0 = t->under.n;
    double *u = arr_reserve(L, &t->under, 2, (size_t)np);
    for (lua_Integer k = 1; k <= np; k++) {
        lua_rawgeti(L, 7, k);
        u[k - 1] = lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    t->under.n += (size_t)np;
    *(TStep *)arr_reserve(L, &t->steps, 1, 1) = s;
    t->steps.n++;
    return 0;
}

static int t_index(lua_State *L)
{
    Traj *t = check_traj(L);
    size_t i = index_of(L, t->steps.n);
    if (!i) return 0;
    const TStep *s = (const TStep *)t->steps.p + (i - 1);
    lua_createtable(L, 0, 6);
    set_int(L, "step", s->step);
    set_num(L, "scale", s->scale);
    lua_pushboolean(L, s->skipped); lua_setfield(L, -2, "skipped");
    if (s->reason) { lua_pushstring(L, REASONS[s->reason]); lua_setfield(L, -2, "reason"); }
    if (s->unknown) { lua_pushboolean(L, 1); lua_setfield(L, -2, "unknown"); }
    lua_getiuservalue(L, 1, 3);   /* the names */
    lua_createtable(L, 0, (int)s->np);
    const double *u = s->np ? (const double *)t->under.p + s->u0 : NULL;   /* (no arithmetic on NULL) */
    for (uint32_t k = 0; k < s->np; k++) {
        if (lua_rawgeti(L, -2, (lua_Integer)k + 1) != LUA_TSTRING) {
            lua_pop(L, 1);
            lua_pushfstring(L, "param %I", (lua_Integer)k + 1);
        }
        lua_pushnumber(L, u[k]);
        lua_rawset(L, -3);
    }
    lua_setfield(L, -3, "underflow");
    lua_pop(L, 1);
    return 1;
}

static int t_len(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)check_traj(L)->steps.n);
    return 1;
}

static int t_newindex(lua_State *L)
{
    return luaL_error(L, "%s: a replay's trajectory is read-only", TRAJ_MT);
}

static int t_tostring(lua_State *L)
{
    lua_pushfstring(L, "%s (%I steps)", TRAJ_MT, (lua_Integer)check_traj(L)->steps.n);
    return 1;
}

/* pairs() over either, as over the list it stands for */
static int seq_next(lua_State *L)
{
    lua_Integer i = luaL_checkinteger(L, 2);
    if (i < 0 || i == LUA_MAXINTEGER) return 0;   /* no entry after it (and i + 1 would overflow) */
    lua_pushinteger(L, ++i);
    return lua_geti(L, 1, i) == LUA_TNIL ? 1 : 2;
}

static int seq_pairs(lua_State *L)
{
    lua_pushcfunction(L, seq_next);
    lua_pushvalue(L, 1);
    lua_pushinteger(L, 0);
    return 3;
}

static const luaL_Reg store_meta[] = {{"__index", s_index}, {"__newindex", s_newindex}, {"__len", s_len},
                                      {"__pairs", seq_pairs}, {"__tostring", s_tostring}, {NULL, NULL}};
static const luaL_Reg traj_meta[] = {{"__index", t_index}, {"__newindex", t_newindex}, {"__len", t_len},
                                     {"__pairs", seq_pairs}, {"__tostring", t_tostring}, {NULL, NULL}};
static const luaL_Reg funcs[] = {{"_trace_steps", new_store}, {"_trace_add", s_add}, {"_trace_bytes", s_bytes},
                                 {"_trace_fit", s_fit},
                                 {"_trajectory", new_traj}, {"_trajectory_add", t_add}, {NULL, NULL}};

void mp_open_trace(lua_State *L)
{
    if (luaL_newmetatable(L, STEPS_MT)) luaL_setfuncs(L, store_meta, 0);
    lua_pop(L, 1);
    if (luaL_newmetatable(L, TRAJ_MT)) luaL_setfuncs(L, traj_meta, 0);
    lua_pop(L, 1);
    luaL_setfuncs(L, funcs, 0);
}
