/*
 * lshape.c: the shape and indexing ops (docs/API.md "Tensor ops: shape and
 * indexing"), each bound twice from one C function: as mp.<name>(x, ...) and
 * as the Tensor method x:<name>(...), which differ only in the name their
 * errors carry ("mp.gather: ..." or "Tensor:gather: ..."), upvalue 1 of each
 * closure. Split-like functions (split, chunk) return their pieces as several
 * values, as string.byte and table.unpack do.
 */
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"

/* the name called (upvalue 1), after checking the argument count (upvalue 3) */
static const char *NAME(lua_State *L)
{
    const char *name = lua_tostring(L, lua_upvalueindex(1));
    lb_max_args(L, (int)lua_tointeger(L, lua_upvalueindex(3)), name);
    return name;
}
#define RETURN_TENSOR(L, NAME_, EXPR) do { LT_PUSH(L, NAME_, EXPR); return 1; } while (0)

#define arg_tensor lb_tensor_arg

static int opt_dim(lua_State *L, int i, int dflt, const char *name)
{
    return lua_isnoneornil(L, i) ? dflt : lb_dim(L, i, name);
}

/* sizes from a table, or from the remaining arguments: (x, {2, 3}) or (x, 2, 3) */
static int shape_args(lua_State *L, int i, int64_t *shape, const char *name)
{
    char what[32];
    if (lua_istable(L, i)) {
        int n = lb_len(L, i, MP_MAXDIM, "shape", name);
        for (int d = 0; d < n; d++) {
            lua_geti(L, i, d + 1);
            snprintf(what, sizeof what, "size of dim %d", d + 1);
            shape[d] = lb_integer(L, -1, what, name);
            lua_pop(L, 1);
        }
        return n;
    }
    int n = lua_gettop(L) - i + 1;
    if (n < 0) n = 0;
    if (n > MP_MAXDIM) luaL_error(L, "%s: a tensor has at most %d dims (got %d)", name, MP_MAXDIM, n);
    for (int d = 0; d < n; d++) {
        snprintf(what, sizeof what, "size of dim %d", d + 1);
        shape[d] = lb_integer(L, i + d, what, name);
    }
    return n;
}

/* ---- sizes: size, dim, numel ---- */

/* size(x) -> the shape as a list; size(x, dim) -> that dim's size */
static int s_size(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    if (lua_isnoneornil(L, 2)) {
        lua_createtable(L, t->ndim, 0);
        for (int d = 0; d < t->ndim; d++) {
            lua_pushinteger(L, t->shape[d]);
            lua_rawseti(L, -2, d + 1);
        }
        return 1;
    }
    int d;
    mp_clear_error();
    if (mp_dim(t, lb_dim(L, 2, name), &d)) return lt_error(L, name);
    lua_pushinteger(L, t->shape[d]);
    return 1;
}

static int s_dim(lua_State *L)
{
    lua_pushinteger(L, arg_tensor(L, 1, "x", NAME(L))->ndim);
    return 1;
}

static int s_numel(lua_State *L)
{
    lua_pushinteger(L, arg_tensor(L, 1, "x", NAME(L))->numel);
    return 1;
}

/* ---- reshaping: reshape, view, unsqueeze, squeeze ---- */

static int s_reshape(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int64_t shape[MP_MAXDIM];
    int n = shape_args(L, 2, shape, name);
    RETURN_TENSOR(L, name, mp_reshape(t, n, shape));
}

/* view(x, sizes...) as reshape; view(x, dtype): the same bytes read as a
 * dtype of the same size, sharing storage (engine mp_view_dtype) */
static int s_view(lua_State *L)
{
    if (lua_type(L, 2) != LUA_TSTRING) return s_reshape(L);
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    lb_max_args(L, 2, name);
    mp_dtype dt = lb_dtype(L, 2, name);
    RETURN_TENSOR(L, name, mp_view_dtype(t, dt));
}

static int s_unsqueeze(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = lb_dim(L, 2, name);
    RETURN_TENSOR(L, name, mp_unsqueeze(t, d));
}

/* squeeze(x [, dim]): dim absent: every size-1 dim */
static int s_squeeze(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = opt_dim(L, 2, 0, name);
    if (!lua_isnoneornil(L, 2) && d == 0)
        return luaL_error(L, "%s: dim 0 is not a dim (dims are 1-based; -1 is the last)", name);
    RETURN_TENSOR(L, name, mp_squeeze(t, d));
}

/* ---- reordering and copying: transpose, permute, expand, contiguous, clone, detach, to ---- */

static int s_transpose(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d1 = lb_dim(L, 2, name), d2 = lb_dim(L, 3, name);
    RETURN_TENSOR(L, name, mp_transpose(t, d1, d2));
}

/* permute(x, d1, d2, ...) or permute(x, {d1, d2, ...}) */
static int s_permute(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int64_t d64[MP_MAXDIM];
    int dims[MP_MAXDIM];
    int n = shape_args(L, 2, d64, name);
    for (int i = 0; i < n; i++) {
        if (d64[i] > MP_MAXDIM || d64[i] < -MP_MAXDIM)
            return luaL_error(L, "%s: dim %I out of range (tensors have at most %d dims)", name, (lua_Integer)d64[i],
                              MP_MAXDIM);
        dims[i] = (int)d64[i];
    }
    RETURN_TENSOR(L, name, mp_permute(t, n, dims));
}

/* expand(x, s1, s2, ...) or expand(x, {s1, ...}): -1 keeps a size */
static int s_expand(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int64_t sizes[MP_MAXDIM];
    int n = shape_args(L, 2, sizes, name);
    RETURN_TENSOR(L, name, mp_expand_sizes(t, n, sizes));
}

/* tensors here are always contiguous: x itself */
static int s_contiguous(lua_State *L)
{
    arg_tensor(L, 1, "x", NAME(L));
    lua_settop(L, 1);
    return 1;
}

static int s_clone(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    RETURN_TENSOR(L, name, mp_clone(t));
}

/* a new tensor sharing the storage, with no history */
static int s_detach(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    RETURN_TENSOR(L, name, mp_view(t, t->ndim, t->shape, t->offset));
}

/* to(x, dtype), to(x, device), to(x, dtype, device) in either order, and an
 * options table last: {saturate = false}, a cast into FP8's overflow rule */
static int s_to(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    mp_dtype dt = t->dtype;
    mp_device dev = t->dev;
    int top = lua_gettop(L);
    bool saturate = false;
    if (top >= 3 && lua_istable(L, top)) {   /* after a dtype or device: to({}) is a wrong argument */
        lb_check_options(L, top, name, "saturate:boolean", 1);
        lua_getfield(L, top, "saturate");
        saturate = lua_toboolean(L, -1);
        lua_settop(L, --top);
    }
    if (top < 2) return luaL_error(L, "%s: expected a dtype or a device name", name);
    if (top > 3) return luaL_error(L, "%s: expected at most a dtype and a device (got %d arguments)", name, top - 1);
    for (int i = 2; i <= top; i++) {
        if (lua_type(L, i) != LUA_TSTRING)
            return luaL_error(L, "%s: expected a dtype or a device name, a string (got %s)", name, luaL_typename(L, i));
        const char *s = lua_tostring(L, i);
        if (mp_dtype_parse(s, &dt) && mp_device_parse(s, &dev))
            return luaL_error(L, "%s: '%s' is neither a dtype (f32, f16, bf16, f64, i32, u8, e4m3, e5m2) nor a device "
                              "(cpu, cuda)", name, s);
    }
    RETURN_TENSOR(L, name, mp_to_sat(t, dt, dev, saturate));
}

/* ---- slicing: narrow, select, split, chunk ---- */

static int s_narrow(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = lb_dim(L, 2, name);
    int64_t start = lb_integer(L, 3, "start", name), len = lb_integer(L, 4, "length", name);
    RETURN_TENSOR(L, name, mp_narrow(t, d, start, len));
}

/* select(x, dim, i): the slice at index i (1-based, negative from the end), that dim dropped */
static int s_select(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = lb_dim(L, 2, name);
    int64_t i = lb_integer(L, 3, "index", name);
    RETURN_TENSOR(L, name, mp_select(t, d, i));
}

/* the narrows of t along dim d with the given lengths, as count values
 * (views where the dim is the first) */
static int push_pieces(lua_State *L, mp_tensor *t, int d, const int64_t *len, int count, const char *name)
{
    luaL_checkstack(L, count + 2, "too many pieces to return");
    int64_t start = 1;
    for (int i = 0; i < count; i++) {
        LT_PUSH(L, name, mp_narrow(t, d, start, len[i]));
        start += len[i];
    }
    return count;
}

/* split(x, size [, dim]) -> pieces of size along dim (default 1), the last smaller;
 * split(x, {s1, s2, ...} [, dim]) -> pieces of those sizes, which must add up to the dim */
static int s_split(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = opt_dim(L, 3, 1, name), k;
    mp_clear_error();
    if (mp_dim(t, d, &k)) return lt_error(L, name);
    int64_t n = t->shape[k], total = 0;
    int count;
    int64_t *len;
    if (lua_type(L, 2) == LUA_TTABLE) {
        count = lb_len(L, 2, 1 << 20, "sizes", name);
        if (count < 1) return luaL_error(L, "%s: sizes must not be empty", name);
        len = lua_newuserdatauv(L, sizeof *len * (size_t)count, 0);
        for (int i = 0; i < count; i++) {
            lua_geti(L, 2, i + 1);
            len[i] = lb_integer(L, -1, "size", name);
            lua_pop(L, 1);
            if (len[i] < 1) return luaL_error(L, "%s: size %d must be positive (got %I)", name, i + 1, (lua_Integer)len[i]);
            if (len[i] > n - total) return luaL_error(L, "%s: sizes add up to more than dim %d's %I", name, d, (lua_Integer)n);
            total += len[i];
        }
        if (total != n) return luaL_error(L, "%s: sizes add up to %I, dim %d has %I", name, (lua_Integer)total, d, (lua_Integer)n);
    } else {
        int64_t size = lb_integer(L, 2, "size", name);
        if (size < 1) return luaL_error(L, "%s: size must be positive (got %I)", name, (lua_Integer)size);
        int64_t c = n > 0 ? 1 + (n - 1) / size : 0;   /* ceil(n / size), without n + size overflowing */
        if (c > 1 << 20) return luaL_error(L, "%s: %I pieces (at most %d)", name, (lua_Integer)c, 1 << 20);
        count = (int)c;
        len = lua_newuserdatauv(L, sizeof *len * (size_t)count, 0);
        for (int i = 0; i < count; i++) len[i] = i < count - 1 ? size : n - size * (count - 1);
    }
    return push_pieces(L, t, d, len, count, name);
}

/* chunk(x, n [, dim]) -> n pieces as even as split makes them (ceil(size / n) each), fewer when the dim is short */
static int s_chunk(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int64_t c = lb_integer(L, 2, "chunks", name);
    int d = opt_dim(L, 3, 1, name), k;
    if (c < 1) return luaL_error(L, "%s: chunks must be positive (got %I)", name, (lua_Integer)c);
    mp_clear_error();
    if (mp_dim(t, d, &k)) return lt_error(L, name);
    /* ceil(n / c) and ceil(n / size), written so that no sum overflows (c may be near 2^63) */
    int64_t n = t->shape[k], size = n > 0 ? 1 + (n - 1) / c : 1, count = n > 0 ? 1 + (n - 1) / size : 0;
    if (count > 1 << 20) return luaL_error(L, "%s: %I pieces (at most %d)", name, (lua_Integer)count, 1 << 20);
    int64_t *len = lua_newuserdatauv(L, sizeof *len * (size_t)count, 0);
    for (int64_t i = 0; i < count; i++) len[i] = i < count - 1 ? size : n - size * (count - 1);
    return push_pieces(L, t, d, len, (int)count, name);
}

/* ---- masks and triangles ---- */

/* tril(x [, k]), triu(x [, k]): a triangle of the last two dims from diagonal k (default 0) */
static int s_tril(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int64_t k = lua_isnoneornil(L, 2) ? 0 : lb_integer(L, 2, "diagonal", name);
    RETURN_TENSOR(L, name, mp_tril(t, k));
}

static int s_triu(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int64_t k = lua_isnoneornil(L, 2) ? 0 : lb_integer(L, 2, "diagonal", name);
    RETURN_TENSOR(L, name, mp_triu(t, k));
}

static int s_masked_fill(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name), *m = arg_tensor(L, 2, "mask", name);
    if (lua_type(L, 3) != LUA_TNUMBER)
        return luaL_error(L, "%s: value must be a number (got %s)", name, luaL_typename(L, 3));
    RETURN_TENSOR(L, name, mp_masked_fill(t, m, lua_tonumber(L, 3)));
}

/* ---- indexing: index_select, gather, scatter, scatter_add ---- */

static int s_index_select(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = lb_dim(L, 2, name);
    mp_tensor *idx = arg_tensor(L, 3, "index", name);
    RETURN_TENSOR(L, name, mp_index_select(t, d, idx));
}

static int s_gather(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = lb_dim(L, 2, name);
    mp_tensor *idx = arg_tensor(L, 3, "index", name);
    RETURN_TENSOR(L, name, mp_gather(t, d, idx));
}

/* scatter(x, dim, index, src) with src a tensor or a number; scatter_add (upvalue 2 true): a tensor */
static int s_scatter(lua_State *L)
{
    const char *name = NAME(L);
    bool add = lua_toboolean(L, lua_upvalueindex(2));
    mp_tensor *t = arg_tensor(L, 1, "x", name);
    int d = lb_dim(L, 2, name);
    mp_tensor *idx = arg_tensor(L, 3, "index", name), *src = lt_opt(L, 4);
    if (!src && (add || lua_type(L, 4) != LUA_TNUMBER))
        return luaL_error(L, "%s: src must be a tensor%s (got %s)", name, add ? "" : " or a number",
                          luaL_typename(L, 4));
    if (src) RETURN_TENSOR(L, name, mp_scatter(t, d, idx, src, add));
    RETURN_TENSOR(L, name, mp_scatter_value(t, d, idx, lua_tonumber(L, 4)));
}

/* ---- values and indices: topk, sort ---- */

/* push values and indices (or raise with the engine's error) */
static int push_two(lua_State *L, const char *name, mp_tensor *v, mp_tensor *idx)
{
    LTensor *a = lt_new(L);
    if (!v) lt_error(L, name);
    lt_set(L, a, v, name);
    LTensor *b = lt_new(L);
    lt_set(L, b, idx, name);
    return 2;
}

/* topk(x, k [, dim = -1 [, {largest = true}]]) -> values, indices (0-based) */
static int s_topk(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name), *idx = NULL;
    int64_t k = lb_integer(L, 2, "k", name);
    int d = opt_dim(L, 3, -1, name);
    bool largest = true;
    if (lb_check_options(L, 4, name, "largest:boolean", 1)) {
        lua_getfield(L, 4, "largest");
        largest = lua_isnil(L, -1) || lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    mp_clear_error();
    mp_tensor *v = mp_topk(t, k, d, largest, &idx);
    if (!v && mp_errcode_last() == MP_EOOM) lua_gc(L, LUA_GCCOLLECT), mp_clear_error(), v = mp_topk(t, k, d, largest, &idx);
    return push_two(L, name, v, idx);
}

/* sort(x [, dim = -1 [, {descending = false}]]) -> values, indices (0-based) */
static int s_sort(lua_State *L)
{
    const char *name = NAME(L);
    mp_tensor *t = arg_tensor(L, 1, "x", name), *idx = NULL;
    int d = opt_dim(L, 2, -1, name);
    bool desc = false;
    if (lb_check_options(L, 3, name, "descending:boolean", 1)) {
        lua_getfield(L, 3, "descending");
        desc = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    mp_clear_error();
    mp_tensor *v = mp_sort(t, d, desc, &idx);
    if (!v && mp_errcode_last() == MP_EOOM) lua_gc(L, LUA_GCCOLLECT), mp_clear_error(), v = mp_sort(t, d, desc, &idx);
    return push_two(L, name, v, idx);
}

/* ---- functions of a list: stack (mp.stack only: its first argument is no tensor) ---- */

/* stack(list [, dim = 1]): dim may be one past the last (-1) */
static int s_stack(lua_State *L)
{
    const char *name = NAME(L);
    int d = opt_dim(L, 2, 1, name), n;
    mp_tensor **ts = lb_tensor_list(L, 1, 1 << 20, "list", name, &n);
    if (n < 1) return luaL_error(L, "%s: the list is empty", name);
    RETURN_TENSOR(L, name, mp_stack(n, ts, d));
}

/* each row: both forms unless mp_only; add: upvalue 2; nargs: the most arguments
 * it takes, x included (upvalue 3, checked by NAME) */
typedef struct { const char *name; lua_CFunction f; bool mp_only, add; int nargs; } shape_fn;
#define BOTH(n, f, k) {n, f, false, false, k}
#define DIMS 64   /* x and sizes or dims: their own check names the limit of MP_MAXDIM */
static const shape_fn shape_fns[] = {
    BOTH("size", s_size, 2), BOTH("dim", s_dim, 1), BOTH("numel", s_numel, 1),
    BOTH("reshape", s_reshape, DIMS), BOTH("view", s_view, DIMS), BOTH("unsqueeze", s_unsqueeze, 2),
    BOTH("squeeze", s_squeeze, 2), BOTH("transpose", s_transpose, 3), BOTH("permute", s_permute, DIMS),
    BOTH("expand", s_expand, DIMS), BOTH("contiguous", s_contiguous, 1), BOTH("clone", s_clone, 1),
    BOTH("detach", s_detach, 1), BOTH("to", s_to, 4), BOTH("narrow", s_narrow, 4), BOTH("select", s_select, 3),
    BOTH("split", s_split, 3), BOTH("chunk", s_chunk, 3), BOTH("tril", s_tril, 2), BOTH("triu", s_triu, 2),
    BOTH("masked_fill", s_masked_fill, 3), BOTH("index_select", s_index_select, 3), BOTH("gather", s_gather, 3),
    BOTH("scatter", s_scatter, 4), {"scatter_add", s_scatter, false, true, 4},
    BOTH("topk", s_topk, 4), BOTH("sort", s_sort, 3),
    {"stack", s_stack, true, false, 2},
};
#undef BOTH
#undef DIMS

/* on the table on top of the stack (mp.core, with its Tensor methods table) */
void mp_open_shape(lua_State *L)
{
    lua_getfield(L, -1, "Tensor");   /* the methods table (luaopen_mp_core) */
    for (size_t i = 0; i < sizeof shape_fns / sizeof *shape_fns; i++) {
        const shape_fn *r = &shape_fns[i];
        lua_pushfstring(L, "mp.%s", r->name);
        lua_pushboolean(L, r->add);
        lua_pushinteger(L, r->nargs);
        lua_pushcclosure(L, r->f, 3);
        lua_setfield(L, -3, r->name);
        if (r->mp_only) continue;
        lua_pushfstring(L, "Tensor:%s", r->name);
        lua_pushboolean(L, r->add);
        lua_pushinteger(L, r->nargs);
        lua_pushcclosure(L, r->f, 3);
        lua_setfield(L, -2, r->name);
    }
    lua_pop(L, 1);
}
