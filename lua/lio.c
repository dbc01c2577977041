/*
 * lio.c: mp.save(path, tbl) and mp.load(path) -> tbl, metadata: nested Lua tables
 * of tensors, numbers, strings and booleans in a safetensors file (engine/io_safetensors.h).
 *
 * Each tensor is stored under the dotted path of its keys ("model.0.weight" for
 * tbl.model["0.weight"]), which is what other tools see. Since dotted paths are
 * ambiguous (keys with dots, integer vs string keys), the exact structure goes
 * in the metadata key "mpengine.structure" as JSON:
 *
 *   table  = [[key, value], ...]          (keys sorted, so a table gives the same bytes each time)
 *   key    = "i:<integer>" | "f:<float>" | "s:<UTF-8 text>" | "x:<hex bytes>" | "b:true" | "b:false"
 *   value  = key | table | "t:<tensor name in the file>"
 *
 * Strings that are not valid UTF-8 (or hold NUL bytes) go as hex, because JSON
 * readers of the header (Python's safetensors) accept only UTF-8. Floats are
 * written with the fewest digits that read back to the same double, plus
 * inf/-inf/nan. A file without that key (written by another tool) loads as a
 * flat table {name = tensor}.
 *
 * Both directions keep their C-side allocations in a userdata with __gc, so a
 * Lua error at any point (a bad value, out of memory) leaks nothing.
 */
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>      /* the structure description */
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/io_safetensors.h"

#define STRUCT_KEY "mpengine.structure"
#define FORMAT_KEY "mpengine.format"
#define FORMAT_VERSION "1"
#define MAX_DEPTH 200          /* nested tables; the JSON doubles it, cJSON allows 1000 */

/* ================================================================ numbers */

/* locale-independent: Lua scripts may call os.setlocale, and %g then writes "0,5" */
static void fix_point(char *s, char from, char to)
{
    for (; *s; s++)
        if (*s == from) *s = to;
}

static char locale_point(void) { return localeconv()->decimal_point[0]; }

static void fmt_float(char *buf, size_t n, double d)
{
    if (isnan(d)) { snprintf(buf, n, signbit(d) ? "-nan" : "nan"); return; }
    if (isinf(d)) { snprintf(buf, n, d < 0 ? "-inf" : "inf"); return; }
    for (int prec = 15; prec <= 17; prec++) {   /* the shortest that reads back exactly */
        snprintf(buf, n, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) break;
    }
    fix_point(buf, locale_point(), '.');
}

static int parse_float(const char *s, double *out)
{
    if (!strcmp(s, "nan") || !strcmp(s, "-nan")) return *out = s[0] == '-' ? -NAN : NAN, 0;
    if (!strcmp(s, "inf") || !strcmp(s, "-inf")) return *out = s[0] == '-' ? -INFINITY : INFINITY, 0;
    char buf[64], *end;
    if (!*s || strlen(s) >= sizeof buf || strpbrk(s, "nNiIxX")) return -1;
    strcpy(buf, s);
    fix_point(buf, '.', locale_point());
    *out = strtod(buf, &end);
    return *end ? -1 : 0;
}

static int parse_int(const char *s, lua_Integer *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno) return -1;
    *out = (lua_Integer)v;
    return 0;
}

/* ================================================================ saving */

typedef struct {
    cJSON *root;
    char *structure;          /* root printed as JSON */
    int n, cap;
    char **names;             /* malloc'd, for mp_st_save */
    mp_tensor **tensors;      /* retained */
    char path[400];           /* the key path being visited, for errors: tbl.a["b.c"][1] */
} SaveCtx;

static int save_gc(lua_State *L)
{
    SaveCtx *c = lua_touserdata(L, 1);
    for (int i = 0; i < c->n; i++) {
        free(c->names[i]);
        mp_release(c->tensors[i]);
    }
    free(c->names);
    free(c->tensors);
    cJSON_Delete(c->root);
    free(c->structure);
    memset(c, 0, sizeof *c);
    return 0;
}

/* Lua stack slots used while saving */
enum { S_PATH = 1, S_TBL, S_CTX, S_SEEN, S_USED, S_VISITING };

static SaveCtx *save_ctx(lua_State *L) { return lua_touserdata(L, S_CTX); }

static void *check_mem(lua_State *L, void *p)
{
    if (!p) luaL_error(L, "mp.save: out of memory");
    return p;
}

static void add_json(lua_State *L, cJSON *arr, cJSON *item)
{
    if (!item) luaL_error(L, "mp.save: out of memory");
    if (!cJSON_AddItemToArray(arr, item)) {
        cJSON_Delete(item);
        luaL_error(L, "mp.save: out of memory");
    }
}

static void hex_encode(luaL_Buffer *b, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        luaL_addchar(b, hex[(unsigned char)s[i] >> 4]);
        luaL_addchar(b, hex[(unsigned char)s[i] & 15]);
    }
}

/* pushes the atom for the number, string or boolean at idx; 0 for other types */
static int push_atom(lua_State *L, int idx)
{
    char num[64];
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN:
        lua_pushstring(L, lua_toboolean(L, idx) ? "b:true" : "b:false");
        return 1;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) lua_pushfstring(L, "i:%I", (LUAI_UACINT)lua_tointeger(L, idx));
        else fmt_float(num, sizeof num, lua_tonumber(L, idx)), lua_pushfstring(L, "f:%s", num);
        return 1;
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        if (mp_utf8_valid(s, len)) luaL_addstring(&b, "s:"), luaL_addlstring(&b, s, len);
        else luaL_addstring(&b, "x:"), hex_encode(&b, s, len);
        luaL_pushresult(&b);
        return 1;
    }
    default:
        return 0;
    }
}

/* a key as a name segment: "0.weight", "1", "true", "0.5" */
static void push_segment(lua_State *L, int idx)
{
    char num[64];
    if (lua_type(L, idx) == LUA_TNUMBER && !lua_isinteger(L, idx)) {
        fmt_float(num, sizeof num, lua_tonumber(L, idx));
        lua_pushstring(L, num);
    } else if (lua_type(L, idx) == LUA_TBOOLEAN) {
        lua_pushstring(L, lua_toboolean(L, idx) ? "true" : "false");
    } else {
        lua_pushvalue(L, idx);
        lua_tostring(L, -1);      /* integers become their digits */
    }
}

/* appends the key at idx to the error path, as Lua source would write it */
static size_t path_push(lua_State *L, SaveCtx *c, int idx)
{
    size_t old = strlen(c->path), room = sizeof c->path - old;
    char num[64];
    const char *s;
    size_t len;
    int ident = 0;
    if (lua_type(L, idx) == LUA_TSTRING) {
        s = lua_tolstring(L, idx, &len);
        ident = len > 0 && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789") == len &&
                !(s[0] >= '0' && s[0] <= '9');
        if (ident) snprintf(c->path + old, room, ".%s", s);
        else snprintf(c->path + old, room, "[\"%.*s\"]", (int)(len > 60 ? 60 : len), s);
    } else if (lua_type(L, idx) == LUA_TNUMBER && !lua_isinteger(L, idx)) {
        fmt_float(num, sizeof num, lua_tonumber(L, idx));
        snprintf(c->path + old, room, "[%s]", num);
    } else {
        snprintf(c->path + old, room, "[%s]", luaL_tolstring(L, idx, NULL));
        lua_pop(L, 1);
    }
    return old;
}

/* valid UTF-8 with every bad byte replaced by '?': tensor names go in the JSON header */
static void push_clean_name(lua_State *L, const char *s, size_t len)
{
    if (mp_utf8_valid(s, len)) { lua_pushlstring(L, s, len); return; }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (size_t i = 0; i < len;) {
        size_t n = 1;
        while (n < 4 && i + n < len && ((unsigned char)s[i + n] & 0xC0) == 0x80) n++;
        if (mp_utf8_valid(s + i, n)) luaL_addlstring(&b, s + i, n), i += n;
        else luaL_addchar(&b, '?'), i++;
    }
    luaL_pushresult(&b);
}

/* pushes the tensor's name in the file: the dotted path at name_idx, made
 * valid UTF-8 and unique with ~2, ~3, ... (tbl["a.b"] and tbl.a.b both say "a.b") */
static void push_unique_name(lua_State *L, int name_idx)
{
    size_t len;
    const char *s = lua_tolstring(L, name_idx, &len);
    push_clean_name(L, s, len);                 /* the base */
    lua_pushvalue(L, -1);                       /* the candidate */
    for (int k = 2;; k++) {
        lua_pushvalue(L, -1);
        int used = lua_rawget(L, S_USED) != LUA_TNIL;
        lua_pop(L, 1);
        if (!used) break;
        lua_pop(L, 1);
        lua_pushfstring(L, "%s~%d", lua_tostring(L, -1), k);
    }
    lua_remove(L, -2);
    lua_pushvalue(L, -1);
    lua_pushboolean(L, 1);
    lua_rawset(L, S_USED);
}

static void add_tensor(lua_State *L, SaveCtx *c, mp_tensor *t, const char *name)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        c->names = check_mem(L, realloc(c->names, sizeof *c->names * (size_t)cap));
        c->tensors = check_mem(L, realloc(c->tensors, sizeof *c->tensors * (size_t)cap));
        c->cap = cap;
    }
    char *name_copy = check_mem(L, strdup(name));
    c->names[c->n] = name_copy;
    c->tensors[c->n++] = mp_retain(t);
}

/* pushes the atom "t:name" for the tensor userdata at idx; a tensor that
 * occurs twice is stored once and both places refer to it */
static void push_tensor_atom(lua_State *L, SaveCtx *c, int idx, int name_idx)
{
    LTensor *u = luaL_testudata(L, idx, MP_TENSOR_MT);
    if (!u->t) luaL_error(L, "mp.save: %s is a freed tensor", c->path);
    lua_pushvalue(L, idx);
    if (lua_rawget(L, S_SEEN) == LUA_TSTRING) return;
    lua_pop(L, 1);
    push_unique_name(L, name_idx);
    add_tensor(L, c, u->t, lua_tostring(L, -1));
    lua_pushfstring(L, "t:%s", lua_tostring(L, -1));
    lua_remove(L, -2);
    lua_pushvalue(L, idx);
    lua_pushvalue(L, -2);
    lua_rawset(L, S_SEEN);
}

/* keys in a fixed order (numbers, then false/true, then strings bytewise), so
 * the same table always gives the same file */
typedef struct {
    int rank;                 /* 0 number, 1 boolean, 2 string */
    int is_int;
    double num;
    lua_Integer i;
    const char *s;
    size_t len;
    lua_Integer slot;         /* where the key sits in the keys sequence */
} key_ord;

static int cmp_key(const void *pa, const void *pb)
{
    const key_ord *a = pa, *b = pb;
    if (a->rank != b->rank) return a->rank - b->rank;
    if (a->rank < 2) {
        if (a->num != b->num) return a->num < b->num ? -1 : 1;
        if (a->is_int != b->is_int) return b->is_int - a->is_int;
        return (a->i > b->i) - (a->i < b->i);   /* integers that round to one double */
    }
    size_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(a->s, b->s, n);
    return r ? r : (a->len > b->len) - (a->len < b->len);
}

/* pushes the table's keys as a sequence and, above it, their sorted order;
 * raises on keys that cannot be saved */
static key_ord *push_sorted_keys(lua_State *L, int tbl, lua_Integer *count)
{
    SaveCtx *c = save_ctx(L);
    lua_Integer n = 0;
    lua_newtable(L);
    int keys = lua_gettop(L);
    for (lua_pushnil(L); lua_next(L, tbl); lua_pop(L, 1)) {
        int t = lua_type(L, -2);
        if (t != LUA_TNUMBER && t != LUA_TSTRING && t != LUA_TBOOLEAN)
            luaL_error(L, "mp.save: %s has a key that is a %s (keys must be strings, numbers or booleans)",
                       c->path, luaL_typename(L, -2));
        lua_pushvalue(L, -2);
        lua_rawseti(L, keys, ++n);
    }
    key_ord *ord = lua_newuserdatauv(L, sizeof *ord * (size_t)(n ? n : 1), 0);
    for (lua_Integer k = 1; k <= n; k++) {
        key_ord *o = &ord[k - 1];
        int t = lua_rawgeti(L, keys, k);
        *o = (key_ord){.rank = t == LUA_TNUMBER ? 0 : t == LUA_TBOOLEAN ? 1 : 2, .slot = k, .s = ""};
        if (t == LUA_TNUMBER) {
            o->num = lua_tonumber(L, -1);
            o->is_int = lua_isinteger(L, -1);
            o->i = o->is_int ? lua_tointeger(L, -1) : 0;
        } else if (t == LUA_TBOOLEAN) {
            o->num = lua_toboolean(L, -1);
        } else {
            o->s = lua_tolstring(L, -1, &o->len);   /* kept alive by the keys sequence */
        }
        lua_pop(L, 1);
    }
    qsort(ord, (size_t)n, sizeof *ord, cmp_key);
    *count = n;
    return ord;
}

static void encode_table(lua_State *L, cJSON *arr, int tbl, int name_idx, int depth);

/* appends the encoding of the value at idx to pair; c->path names it for
 * errors and the string at name_idx is its dotted name */
static void encode_value(lua_State *L, cJSON *pair, int idx, int name_idx, int depth)
{
    SaveCtx *c = save_ctx(L);
    if (lua_type(L, idx) == LUA_TTABLE) {
        cJSON *sub = cJSON_CreateArray();
        add_json(L, pair, sub);
        encode_table(L, sub, idx, name_idx, depth + 1);
        return;
    }
    if (luaL_testudata(L, idx, MP_TENSOR_MT)) push_tensor_atom(L, c, idx, name_idx);
    else if (!push_atom(L, idx))
        luaL_error(L, "mp.save: %s is a %s (expected tensors, numbers, strings, booleans or tables)", c->path,
                   luaL_typename(L, idx));
    add_json(L, pair, cJSON_CreateString(lua_tostring(L, -1)));
    lua_pop(L, 1);
}

/* the dotted name of a child: "key" at the root, "parent.key" below */
static void push_child_name(lua_State *L, int name_idx, int key_idx)
{
    if (lua_rawlen(L, name_idx) > 0) {
        lua_pushvalue(L, name_idx);
        lua_pushliteral(L, ".");
        push_segment(L, key_idx);
        lua_concat(L, 3);
    } else {
        push_segment(L, key_idx);
    }
}

static void encode_table(lua_State *L, cJSON *arr, int tbl, int name_idx, int depth)
{
    SaveCtx *c = save_ctx(L);
    if (depth > MAX_DEPTH) luaL_error(L, "mp.save: %s nests tables more than %d deep", c->path, MAX_DEPTH);
    luaL_checkstack(L, 16, "mp.save: nested tables");
    lua_pushvalue(L, tbl);
    if (lua_rawget(L, S_VISITING) != LUA_TNIL)
        luaL_error(L, "mp.save: %s refers back to a table that contains it (a cycle)", c->path);
    lua_pop(L, 1);
    lua_pushvalue(L, tbl);
    lua_pushboolean(L, 1);
    lua_rawset(L, S_VISITING);

    lua_Integer n;
    key_ord *ord = push_sorted_keys(L, tbl, &n);
    int keys = lua_gettop(L) - 1;
    for (lua_Integer j = 0; j < n; j++) {
        lua_rawgeti(L, keys, ord[j].slot);
        int k = lua_gettop(L);
        size_t old = path_push(L, c, k);
        cJSON *pair = cJSON_CreateArray();
        add_json(L, arr, pair);
        push_atom(L, k);
        add_json(L, pair, cJSON_CreateString(lua_tostring(L, -1)));
        lua_pop(L, 1);
        push_child_name(L, name_idx, k);
        lua_pushvalue(L, k);
        lua_rawget(L, tbl);
        encode_value(L, pair, k + 2, k + 1, depth);
        lua_pop(L, 3);
        c->path[old] = 0;
    }
    lua_pop(L, 2);
    lua_pushvalue(L, tbl);
    lua_pushnil(L);
    lua_rawset(L, S_VISITING);
}

static void save_file(lua_State *L, SaveCtx *c, const char *path, const char *structure)
{
    const char *keys[2] = {FORMAT_KEY, STRUCT_KEY}, *values[2] = {FORMAT_VERSION, structure};
    mp_clear_error();
    int rc = mp_st_save(path, c->n, (const char *const *)c->names, c->tensors, 2, keys, values);
    if (rc && mp_errcode_last() == MP_EOOM) {   /* a device copy may fit after a collection */
        lua_gc(L, LUA_GCCOLLECT);
        mp_clear_error();
        rc = mp_st_save(path, c->n, (const char *const *)c->names, c->tensors, 2, keys, values);
    }
    if (rc) lt_error(L, "mp.save");
}

/* mp.save(path, tbl): everything is checked before the file is touched */
static int m_save(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TSTRING)
        return luaL_error(L, "mp.save: path must be a string (got %s)", luaL_typename(L, 1));
    if (strlen(lua_tostring(L, 1)) != lua_rawlen(L, 1)) return luaL_error(L, "mp.save: path contains a NUL byte");
    if (lua_type(L, 2) != LUA_TTABLE)
        return luaL_error(L, "mp.save: tbl must be a table (got %s)", luaL_typename(L, 2));
    lua_settop(L, 2);
    SaveCtx *c = lua_newuserdatauv(L, sizeof *c, 0);
    memset(c, 0, sizeof *c);
    luaL_setmetatable(L, "mp.io.save");
    lua_newtable(L);                                    /* S_SEEN: tensor userdata -> "t:name" */
    lua_newtable(L);                                    /* S_USED: names taken */
    lua_pushboolean(L, 1);
    lua_setfield(L, S_USED, "__metadata__");
    lua_newtable(L);                                    /* S_VISITING: tables on the current path */
    strcpy(c->path, "tbl");
    c->root = check_mem(L, cJSON_CreateArray());
    lua_pushliteral(L, "");
    encode_table(L, c->root, S_TBL, lua_gettop(L), 0);
    c->structure = check_mem(L, cJSON_PrintUnformatted(c->root));
    save_file(L, c, lua_tostring(L, S_PATH), c->structure);
    lua_pushcfunction(L, save_gc);
    lua_pushvalue(L, S_CTX);
    lua_call(L, 1, 0);
    return 0;
}

/* ================================================================ loading */

typedef struct {
    mp_stfile *f;
    cJSON *json;
} LoadCtx;

static int load_gc(lua_State *L)
{
    LoadCtx *c = lua_touserdata(L, 1);
    mp_st_free(c->f);
    cJSON_Delete(c->json);
    c->f = NULL;
    c->json = NULL;
    return 0;
}

/* Lua stack slots used while loading */
enum { L_PATH = 1, L_CTX, L_BYNAME, L_META, L_REFD };

static int bad_structure(lua_State *L, const char *what)
{
    return luaL_error(L, "mp.load: '%s': bad %s metadata: %s", lua_tostring(L, L_PATH), STRUCT_KEY, what);
}

static int hex_digit(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

static void push_hex(lua_State *L, const char *s)
{
    size_t n = strlen(s);
    if (n % 2) bad_structure(L, "odd-length hex string");
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (size_t i = 0; i < n; i += 2) {
        int hi = hex_digit(s[i]), lo = hex_digit(s[i + 1]);
        if (hi < 0 || lo < 0) bad_structure(L, "bad hex string");
        luaL_addchar(&b, (char)(hi << 4 | lo));
    }
    luaL_pushresult(&b);
}

/* the tensor a "t:" atom names; each one must be in the file */
static void push_named_tensor(lua_State *L, const char *name)
{
    if (lua_getfield(L, L_BYNAME, name) == LUA_TNIL) {
        lua_pushfstring(L, "tensor '%s' is not in the file", name);
        bad_structure(L, lua_tostring(L, -1));
    }
    lua_pushboolean(L, 1);
    lua_setfield(L, L_REFD, name);
}

/* pushes the value of an atom; tensors only where a value (not a key) may stand */
static void push_decoded_atom(lua_State *L, const cJSON *atom, int is_key)
{
    const char *s = cJSON_IsString(atom) ? atom->valuestring : NULL;
    if (!s || strlen(s) < 2 || s[1] != ':') bad_structure(L, "an entry is not a typed atom or table");
    const char *v = s + 2;
    lua_Integer i = 0;
    double d = 0;
    switch (s[0]) {
    case 'i':
        if (parse_int(v, &i)) bad_structure(L, "bad integer");
        lua_pushinteger(L, i);
        return;
    case 'f':
        if (parse_float(v, &d) || (is_key && isnan(d))) bad_structure(L, "bad float");
        lua_pushnumber(L, d);
        return;
    case 's': lua_pushstring(L, v); return;
    case 'x': push_hex(L, v); return;
    case 'b':
        if (strcmp(v, "true") && strcmp(v, "false")) bad_structure(L, "bad boolean");
        lua_pushboolean(L, v[0] == 't');
        return;
    case 't':
        if (is_key) bad_structure(L, "a tensor as a key");
        push_named_tensor(L, v);
        return;
    default:
        bad_structure(L, "unknown atom type");
    }
}

static void decode_table(lua_State *L, const cJSON *arr, int tbl, int depth)
{
    if (depth > MAX_DEPTH) bad_structure(L, "tables nested too deep");
    luaL_checkstack(L, 8, "mp.load: nested tables");
    for (const cJSON *pair = arr->child; pair; pair = pair->next) {
        const cJSON *k = cJSON_IsArray(pair) && cJSON_GetArraySize(pair) == 2 ? pair->child : NULL;
        if (!k) bad_structure(L, "a table entry is not a [key, value] pair");
        push_decoded_atom(L, k, 1);
        lua_pushvalue(L, -1);
        if (lua_rawget(L, tbl) != LUA_TNIL) bad_structure(L, "a key occurs twice in one table");
        lua_pop(L, 1);
        if (cJSON_IsArray(k->next)) {
            lua_newtable(L);
            decode_table(L, k->next, lua_gettop(L), depth + 1);
        } else {
            push_decoded_atom(L, k->next, 0);
        }
        lua_rawset(L, tbl);
    }
}

/* the nested table the structure describes; every tensor in the file must be in it */
static void push_structured(lua_State *L, LoadCtx *c, const char *structure)
{
    const char *format = mp_st_meta(c->f, FORMAT_KEY);
    if (format && strcmp(format, FORMAT_VERSION))
        luaL_error(L, "mp.load: '%s': written in mpengine format %s (this version reads %s)",
                   lua_tostring(L, L_PATH), format, FORMAT_VERSION);
    lua_newtable(L);                                    /* L_REFD */
    c->json = cJSON_Parse(structure);
    if (!cJSON_IsArray(c->json)) bad_structure(L, "not a JSON array");
    lua_newtable(L);
    decode_table(L, c->json, lua_gettop(L), 0);
    for (int i = 0; i < c->f->ntensors; i++)
        if (lua_getfield(L, L_REFD, c->f->names[i]) == LUA_TNIL) {
            lua_pushfstring(L, "tensor '%s' is in the file but not in the structure", c->f->names[i]);
            bad_structure(L, lua_tostring(L, -1));
        } else {
            lua_pop(L, 1);
        }
}

static void push_metadata(lua_State *L, const mp_stfile *f)
{
    lua_createtable(L, 0, f->nmeta);
    for (int i = 0; i < f->nmeta; i++) {
        lua_pushstring(L, f->meta_values[i]);
        lua_setfield(L, -2, f->meta_keys[i]);
    }
}

/* mp.load(path) -> tbl, metadata */
static int m_load(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TSTRING)
        return luaL_error(L, "mp.load: path must be a string (got %s)", luaL_typename(L, 1));
    if (strlen(lua_tostring(L, 1)) != lua_rawlen(L, 1)) return luaL_error(L, "mp.load: path contains a NUL byte");
    lua_settop(L, 1);
    LoadCtx *c = lua_newuserdatauv(L, sizeof *c, 0);
    memset(c, 0, sizeof *c);
    luaL_setmetatable(L, "mp.io.load");
    mp_clear_error();
    c->f = mp_st_load(lua_tostring(L, L_PATH));
    if (!c->f && mp_errcode_last() == MP_EOOM) {
        lua_gc(L, LUA_GCCOLLECT);
        mp_clear_error();
        c->f = mp_st_load(lua_tostring(L, L_PATH));
    }
    if (!c->f) return lt_error(L, "mp.load");
    lua_createtable(L, 0, c->f->ntensors);              /* L_BYNAME */
    for (int i = 0; i < c->f->ntensors; i++) {
        LTensor *u = lt_new(L);
        u->t = c->f->tensors[i];                        /* the userdata owns it from here */
        c->f->tensors[i] = NULL;
        lt_pace_gc(L, u->t->dev, mp_nbytes(u->t));
        lua_setfield(L, L_BYNAME, c->f->names[i]);
    }
    push_metadata(L, c->f);                             /* L_META */
    const char *structure = mp_st_meta(c->f, STRUCT_KEY);
    if (structure) push_structured(L, c, structure);
    else lua_pushvalue(L, L_BYNAME);                    /* another tool's file: flat */
    lua_pushvalue(L, L_META);
    lua_pushcfunction(L, load_gc);
    lua_pushvalue(L, L_CTX);
    lua_call(L, 1, 0);
    return 2;
}

/* mp.stale_saves(path [, {remove = true, before_start = true}]) -> list of the
 * temporary files that interrupted saves to path left (removed when asked;
 * before_start: only those last written before this process loaded the
 * engine; mp.save removes them too, mp.load those from before the start) */
typedef struct { char **v; int n, cap; } FileList;

static void add_file(const char *file, void *ud)
{
    FileList *l = ud;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        char **v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) return;
        l->v = v, l->cap = cap;
    }
    if ((l->v[l->n] = strdup(file))) l->n++;
}

static int m_stale_saves(lua_State *L)
{
    const char *name = "mp.stale_saves";
    if (lua_type(L, 1) != LUA_TSTRING) return luaL_error(L, "%s: path must be a string (got %s)", name, luaL_typename(L, 1));
    if (strlen(lua_tostring(L, 1)) != lua_rawlen(L, 1)) return luaL_error(L, "%s: path contains a NUL byte", name);
    bool remove = false, before_start = false;
    if (lb_check_options(L, 2, name, "remove:boolean before_start:boolean", 1)) {
        lua_getfield(L, 2, "remove");
        remove = lua_toboolean(L, -1);
        lua_getfield(L, 2, "before_start");
        before_start = lua_toboolean(L, -1);
        lua_pop(L, 2);
    }
    FileList l = {0};
    mp_clear_error();
    int n = mp_st_stale_temps(lua_tostring(L, 1), remove, before_start, add_file, &l);
    lua_createtable(L, l.n, 0);   /* memory errors past here would leak l: push first, free, then check */
    for (int i = 0; i < l.n; i++) {
        lua_pushstring(L, l.v[i]);
        lua_rawseti(L, -2, i + 1);
    }
    for (int i = 0; i < l.n; i++) free(l.v[i]);
    free(l.v);
    if (n < 0) return lt_error(L, name);
    return 1;
}

/* ================================================================ registration */

void mp_open_io(lua_State *L)
{
    luaL_newmetatable(L, "mp.io.save");
    lua_pushcfunction(L, save_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    luaL_newmetatable(L, "mp.io.load");
    lua_pushcfunction(L, load_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    lua_pushcfunction(L, m_save);
    lua_setfield(L, -2, "save");
    lua_pushcfunction(L, m_load);
    lua_setfield(L, -2, "load");
    lua_pushcfunction(L, m_stale_saves);
    lua_setfield(L, -2, "stale_saves");
}
