/*
 * llines.c: line files for the loss scaler's traces (lua/mp/amp/trace.lua), and JSON
 * text to Lua values.
 *
 *   core._lines_open(path, "w" | "r") -> a line file (mp.LineFile), or nil and why:
 *     f:write(s)  s and a newline, flushed at once (a crashed run's file is
 *                 readable up to its last whole line)
 *     f:read([max]) the next line without its newline and whether a newline
 *                 ended it (false only for a last line: a write cut short), or
 *                 nil at the end (a compressed file cut short ends where its data
 *                 does), or nil and why: a line longer than max bytes (default
 *                 LINES_MAX: the buffer never grows past it, whatever the file
 *                 holds; the rest of that line is not read, so close the file),
 *                 or compressed data that is corrupt (not merely cut short)
 *     f:close()   also on collection
 *   A name ending in ".gz" is written gzip-compressed (zlib, flushed with
 *   Z_SYNC_FLUSH so each line is decodable); reading takes either kind.
 *
 *   core._json_decode(s) -> the value (objects as tables with string keys,
 *     arrays as lists, null as nil), or nil and cJSON's reason
 */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "lua/lbind.h"
#include "lua/lcore.h"

#define MT "mp.LineFile"

/* the longest line f:read returns unless told otherwise */
#define LINES_MAX ((size_t)64 << 20)
/* what one gzread takes */
#define IN_SIZE 65536

typedef struct {
    gzFile f;
    int writing;
    char *buf;                /* the line being read */
    size_t cap;
    unsigned char *in;        /* what gzread gave that no line has taken yet */
    size_t in_pos, in_len;
    int at_end;
} LineFile;

static LineFile *check_file(lua_State *L)
{
    LineFile *lf = luaL_checkudata(L, 1, MT);
    if (!lf->f) luaL_error(L, "line file: already closed");
    return lf;
}

static int lf_open(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1), *mode = luaL_checkstring(L, 2);
    if (strcmp(mode, "w") != 0 && strcmp(mode, "r") != 0) return luaL_error(L, "lines_open: mode must be \"w\" or \"r\"");
    size_t n = strlen(path);
    int gz = n > 3 && strcmp(path + n - 3, ".gz") == 0, writing = mode[0] == 'w';
    LineFile *lf = lua_newuserdatauv(L, sizeof *lf, 0);
    memset(lf, 0, sizeof *lf);
    luaL_setmetatable(L, MT);
    /* "wT": zlib writes the bytes as they are; reading detects either kind */
    lf->f = gzopen(path, writing ? (gz ? "wb6" : "wbT") : "rb");
    if (!lf->f) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot open '%s' to %s", path, writing ? "write" : "read");
        return 2;
    }
    lf->writing = writing;
    return 1;
}

static int lf_write(lua_State *L)
{
    LineFile *lf = check_file(L);
    size_t n;
    const char *s = luaL_checklstring(L, 2, &n);
    if (!lf->writing) return luaL_error(L, "line file: opened for reading");
    if (n >= INT_MAX) return luaL_error(L, "line file: a line of %I bytes is too long to write", (lua_Integer)n);
    int ok = (n == 0 || gzwrite(lf->f, s, (unsigned)n) == (int)n) && gzputc(lf->f, '\n') == '\n' &&
             gzflush(lf->f, Z_SYNC_FLUSH) == Z_OK;
    if (!ok) {
        int e;
        const char *why = gzerror(lf->f, &e);
        return luaL_error(L, "line file: write failed (%s)", why ? why : "?");
    }
    return 0;
}

/* the next bytes of the file into lf->in: 1, or 0 at the end of its data, or
 * -1 with why on the stack (corrupt compressed data) */
static int fill(lua_State *L, LineFile *lf)
{
    if (lf->at_end) return 0;
    if (!lf->in && !(lf->in = malloc(IN_SIZE))) return luaL_error(L, "line file: out of memory");
    int got = gzread(lf->f, lf->in, IN_SIZE), e = Z_OK;
    const char *why = got <= 0 ? gzerror(lf->f, &e) : NULL;
    if (got < 0 || (got == 0 && e != Z_OK && e != Z_BUF_ERROR)) {   /* Z_BUF_ERROR: cut short, the end */
        lua_pushfstring(L, "cannot read it (%s)", why && *why ? why : "read error");
        lf->at_end = 1;
        return -1;
    }
    if (got == 0) lf->at_end = 1;
    lf->in_pos = 0, lf->in_len = (size_t)got;
    return got > 0;
}

static int lf_read(lua_State *L)
{
    LineFile *lf = check_file(L);
    if (lf->writing) return luaL_error(L, "line file: opened for writing");
    lua_Integer mx = luaL_optinteger(L, 2, (lua_Integer)LINES_MAX);
    luaL_argcheck(L, mx >= 0, 2, "the longest line must be >= 0");
    size_t max = (size_t)mx, len = 0;
    for (;;) {
        if (lf->in_pos == lf->in_len) {
            int r = fill(L, lf);
            if (r < 0) {
                lua_pushnil(L);
                lua_insert(L, -2);
                return 2;
            }
            if (r == 0) break;
        }
        const unsigned char *s = lf->in + lf->in_pos;
        size_t avail = lf->in_len - lf->in_pos;
        const unsigned char *nl = memchr(s, '\n', avail);
        size_t take = nl ? (size_t)(nl - s) : avail;
        if (take > max - len) {
            lf->in_pos += take;   /* the line is not read further: the caller closes the file */
            lua_pushnil(L);
            lua_pushfstring(L, "a line longer than %I bytes", (lua_Integer)max);
            return 2;
        }
        if (lf->cap - len < take) {
            size_t cap = lf->cap ? 2 * lf->cap : 4096;
            if (cap < len + take) cap = len + take;
            if (cap > max) cap = max > len + take ? max : len + take;
            char *b = realloc(lf->buf, cap ? cap : 1);
            if (!b) return luaL_error(L, "line file: out of memory");
            lf->buf = b, lf->cap = cap;
        }
        if (take) memcpy(lf->buf + len, s, take);
        len += take;
        lf->in_pos += take + (nl != NULL);
        if (nl) {
            lua_pushlstring(L, lf->buf, len);
            lua_pushboolean(L, 1);
            return 2;
        }
    }
    if (len == 0) return 0;
    lua_pushlstring(L, lf->buf, len);   /* a last line without its newline */
    lua_pushboolean(L, 0);
    return 2;
}

static int lf_close(lua_State *L)
{
    LineFile *lf = luaL_checkudata(L, 1, MT);
    if (lf->f) gzclose(lf->f);
    lf->f = NULL;
    free(lf->buf);
    free(lf->in);
    lf->buf = NULL, lf->cap = 0, lf->in = NULL, lf->in_pos = lf->in_len = 0;
    return 0;
}

/* ---- JSON ---- */

#define MAX_DEPTH 200

static int depth_of(const cJSON *v)
{
    int d = 0;
    for (const cJSON *e = v->child; e && d <= MAX_DEPTH; e = e->next) {
        int k = depth_of(e);
        d = k > d ? k : d;
    }
    return d + 1;
}

/* v as a Lua value (its depth checked first, the stack grown: nothing here raises) */
static void push_json(lua_State *L, const cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d > -9007199254740992.0 && d < 9007199254740992.0 && d == (double)(lua_Integer)d)   /* range first: */
                                                                                             /* a cast out of it is undefined */
            lua_pushinteger(L, (lua_Integer)d);
        else
            lua_pushnumber(L, d);
    } else if (cJSON_IsString(v)) {
        lua_pushstring(L, v->valuestring);
    } else if (cJSON_IsBool(v)) {
        lua_pushboolean(L, cJSON_IsTrue(v));
    } else if (cJSON_IsArray(v)) {
        lua_createtable(L, cJSON_GetArraySize(v), 0);
        lua_Integer i = 1;
        for (const cJSON *e = v->child; e; e = e->next, i++) {
            push_json(L, e);
            lua_rawseti(L, -2, i);
        }
    } else if (cJSON_IsObject(v)) {
        lua_createtable(L, 0, 4);
        for (const cJSON *e = v->child; e; e = e->next) {
            push_json(L, e);
            lua_setfield(L, -2, e->string);
        }
    } else {
        lua_pushnil(L);
    }
}

static int json_decode(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!v) {
        lua_pushnil(L);
        lua_pushfstring(L, "not JSON (near byte %d)", end ? (int)(end - s) + 1 : 1);
        return 2;
    }
    if (depth_of(v) > MAX_DEPTH || !lua_checkstack(L, 2 * MAX_DEPTH + 8)) {
        cJSON_Delete(v);
        lua_pushnil(L);
        lua_pushstring(L, "JSON nested too deeply");
        return 2;
    }
    push_json(L, v);
    cJSON_Delete(v);
    return 1;
}

static const luaL_Reg methods[] = {{"write", lf_write}, {"read", lf_read}, {"close", lf_close}, {NULL, NULL}};
static const luaL_Reg funcs[] = {{"_lines_open", lf_open}, {"_json_decode", json_decode}, {NULL, NULL}};

void mp_open_lines(lua_State *L)
{
    if (luaL_newmetatable(L, MT)) {
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, lf_close);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, lf_close);
        lua_setfield(L, -2, "__close");
    }
    lua_pop(L, 1);
    luaL_setfuncs(L, funcs, 0);
}
