/*
 * ltensor.c: the Tensor userdata: its methods, properties and metamethods.
 * Methods live in `meth`, metamethods in `metameth`; __index looks up a method
 * first and then a property (shape, dtype, device). __close and free() share
 * one function, which may defer the release (lbind.c); __gc releases at once.
 */
#include <math.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"
#include "engine/autograd.h"

#define TENSOR_RETURN(L, NAME, EXPR) do { LT_PUSH(L, NAME, EXPR); return 1; } while (0)

static void push_shape(lua_State *L, const mp_tensor *t)
{
    lua_createtable(L, t->ndim, 0);
    for (int d = 0; d < t->ndim; d++) {
        lua_pushinteger(L, t->shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
}

static int t_gc(lua_State *L)
{
    LTensor *u = luaL_checkudata(L, 1, MP_TENSOR_MT);
    mp_release(u->t);
    u->t = NULL;
    return 0;
}

/* __close and free(): the userdata lets go at once; the tensor waits while a C
 * function of the binding may be using it (lbind.c) */
static int t_close(lua_State *L)
{
    LTensor *u = luaL_checkudata(L, 1, MP_TENSOR_MT);
    mp_tensor *t = u->t;
    u->t = NULL;
    lt_release(L, t);
    return 0;
}

static void push_value(lua_State *L, mp_dtype dt, double v)
{
    if (mp_is_float(dt)) lua_pushnumber(L, v);
    else lua_pushinteger(L, (lua_Integer)v);
}

static int t_item(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    double v;
    if (t->numel != 1)
        return luaL_error(L, "Tensor:item: tensor has %I elements (expected exactly 1)", (lua_Integer)t->numel);
    mp_clear_error();
    if (mp_read_f64(t, 0, 1, &v)) return lt_error(L, "Tensor:item");
    push_value(L, t->dtype, v);
    return 1;
}

/* nested tables of dim d from values v (row-major), advancing *k */
static void push_nested(lua_State *L, const mp_tensor *t, const double *v, int d, int64_t *k)
{
    luaL_checkstack(L, 4, "tensor too deep");
    lua_createtable(L, (int)t->shape[d], 0);
    for (int64_t i = 0; i < t->shape[d]; i++) {
        if (d == t->ndim - 1) push_value(L, t->dtype, v[(*k)++]);
        else push_nested(L, t, v, d + 1, k);
        lua_rawseti(L, -2, i + 1);
    }
}

static int t_totable(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    double *v = lua_newuserdatauv(L, sizeof(double) * (size_t)t->numel, 0);   /* freed by GC */
    mp_clear_error();
    if (mp_read_f64(t, 0, t->numel, v)) return lt_error(L, "Tensor:totable");
    int64_t k = 0;
    if (t->ndim == 0) push_value(L, t->dtype, v[0]);
    else push_nested(L, t, v, 0, &k);
    return 1;
}

static int t_free(lua_State *L)
{
    LTensor *u = luaL_checkudata(L, 1, MP_TENSOR_MT);
    if (!u->t) return luaL_error(L, "Tensor:free: tensor was already freed");
    return t_close(L);
}

/* t:f32(), t:f16(), t:bf16(), t:cpu(), t:cuda(): t:to with one of dtype or device
 * fixed. One function for all, a closure over its row (upvalue 1) */
#define KEEP (-1)   /* the tensor's own dtype or device */
typedef struct { const char *method, *name; int dtype, dev; } cast_method;
static const cast_method cast_methods[] = {
    {"f32", "Tensor:f32", MP_F32, KEEP}, {"f16", "Tensor:f16", MP_F16, KEEP}, {"bf16", "Tensor:bf16", MP_BF16, KEEP},
    {"f64", "Tensor:f64", MP_F64, KEEP},
    {"cpu", "Tensor:cpu", KEEP, MP_CPU}, {"cuda", "Tensor:cuda", KEEP, MP_CUDA},
};

static int t_cast(lua_State *L)
{
    const cast_method *m = lua_touserdata(L, lua_upvalueindex(1));
    mp_tensor *t = lt_check(L, 1);
    mp_dtype dt = m->dtype == KEEP ? t->dtype : (mp_dtype)m->dtype;
    mp_device dev = m->dev == KEEP ? t->dev : (mp_device)m->dev;
    TENSOR_RETURN(L, m->name, mp_to(t, dt, dev));
}

static int t_copy_(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1), *src = lt_check(L, 2);
    mp_clear_error();
    if (mp_copy_(t, src)) return lt_error(L, "Tensor:copy_");
    lua_settop(L, 1);
    return 1;
}

/* arithmetic: tensor OP tensor, tensor OP number, number OP tensor */
static int arith(lua_State *L, mp_binop op, const char *name)
{
    mp_tensor *a = lt_opt(L, 1), *b = lt_opt(L, 2);
    if (a && b) TENSOR_RETURN(L, name, mp_binary(op, a, b));
    if (a && lua_type(L, 2) == LUA_TNUMBER) TENSOR_RETURN(L, name, mp_binary_scalar(op, a, lua_tonumber(L, 2), 0));
    if (b && lua_type(L, 1) == LUA_TNUMBER) TENSOR_RETURN(L, name, mp_binary_scalar(op, b, lua_tonumber(L, 1), 1));
    return luaL_error(L, "%s: expected tensors or numbers (got %s and %s)", name, luaL_typename(L, 1),
                      luaL_typename(L, 2));
}

static int t_add(lua_State *L) { return arith(L, MP_ADD, "Tensor:__add"); }
static int t_sub(lua_State *L) { return arith(L, MP_SUB, "Tensor:__sub"); }
static int t_mul(lua_State *L) { return arith(L, MP_MUL, "Tensor:__mul"); }
static int t_div(lua_State *L) { return arith(L, MP_DIV, "Tensor:__div"); }

static int t_unm(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    TENSOR_RETURN(L, "Tensor:__unm", mp_unary(MP_NEG, t, 0));
}

/* t:abs(), t:exp(), t:log(), t:sqrt(): one function, a closure over its row */
typedef struct { const char *method, *name; mp_unop op; } unary_method;
static const unary_method unary_methods[] = {
    {"abs", "Tensor:abs", MP_ABS}, {"exp", "Tensor:exp", MP_EXP}, {"log", "Tensor:log", MP_LOG},
    {"sqrt", "Tensor:sqrt", MP_SQRT},
};

static int t_unary(lua_State *L)
{
    const unary_method *m = lua_touserdata(L, lua_upvalueindex(1));
    mp_tensor *t = lt_check(L, 1);
    TENSOR_RETURN(L, m->name, mp_unary(m->op, t, 0));
}

/* base ^ exponent (arguments 1 and 2) where either may be a number: tensor ^
 * number is the unary pow, number ^ tensor and tensor ^ tensor the binary one
 * (engine/ops_math.c); name is the caller's Lua name. A numeric string is
 * refused, not converted: Lua's string arithmetic would hand `"2" ^ t` here. */
int lt_pow(lua_State *L, const char *name)
{
    mp_tensor *a = lt_opt(L, 1), *b = lt_opt(L, 2);
    bool na = lua_type(L, 1) == LUA_TNUMBER, nb = lua_type(L, 2) == LUA_TNUMBER;
    if (!a && !na) return luaL_error(L, "%s: base must be a Tensor or a number (got %s)", name, luaL_typename(L, 1));
    if (!b && !nb)
        return luaL_error(L, "%s: exponent must be a Tensor or a number (got %s)", name, luaL_typename(L, 2));
    if (na && nb) return luaL_error(L, "%s: base or exponent must be a Tensor (got two numbers)", name);
    if (a && b && a->dev != b->dev)
        return luaL_error(L, "%s: base is on %s and exponent on %s (one device for both)", name,
                          mp_device_name(a->dev), mp_device_name(b->dev));
    if (a && b) TENSOR_RETURN(L, name, mp_binary(MP_POWT, a, b));
    if (a) TENSOR_RETURN(L, name, mp_binary_scalar(MP_POWT, a, lua_tonumber(L, 2), 0));
    TENSOR_RETURN(L, name, mp_binary_scalar(MP_POWT, b, lua_tonumber(L, 1), 1));
}

static int t_pow(lua_State *L) { return lt_pow(L, "Tensor:pow"); }
static int t_pow_mm(lua_State *L) { return lt_pow(L, "Tensor:__pow"); }

/* sum, mean, max, argmax (and min, argmin, ...) with their keepdim: lua/lmath.c */

static int t_matmul(lua_State *L)
{
    if (lfp8_route(L, "matmul")) return 1;
    mp_tensor *a = lt_check(L, 1), *b = lt_check(L, 2);
    TENSOR_RETURN(L, "Tensor:matmul", mp_matmul(a, b));
}

/* a dtype that holds the number v exactly, for comparing it with a tensor of dtype dt */
static mp_dtype scalar_dtype(mp_dtype dt, double v)
{
    if (mp_is_float(dt)) return dt;
    /* the range first: casting inf, NaN or 2^63 to an integer is undefined */
    bool fits = (dt == MP_U8 ? v >= 0 && v <= 255 : v >= INT32_MIN && v <= INT32_MAX) && v == (double)(int64_t)v;
    return fits ? dt : MP_F32;
}

/* t:gt(u), lt, ge, le, eq, ne, against a tensor or a number: one function, a
 * closure over its row */
typedef struct { const char *method, *name; mp_binop op; } compare_method;
static const compare_method compare_methods[] = {
    {"gt", "Tensor:gt", MP_GT}, {"lt", "Tensor:lt", MP_LT}, {"ge", "Tensor:ge", MP_GE},
    {"le", "Tensor:le", MP_LE}, {"eq", "Tensor:eq", MP_EQ}, {"ne", "Tensor:ne", MP_NE},
};

static int t_compare(lua_State *L)
{
    const compare_method *m = lua_touserdata(L, lua_upvalueindex(1));
    mp_tensor *a = lt_check(L, 1), *b = lt_opt(L, 2);
    if (b) TENSOR_RETURN(L, m->name, mp_binary(m->op, a, b));
    if (lua_type(L, 2) != LUA_TNUMBER)
        return luaL_error(L, "%s: expected a tensor or a number (got %s)", m->name, luaL_typename(L, 2));
    LTensor *u = lt_new(L);   /* the number as a 0-d tensor, kept on the stack until the result is made */
    double v = lua_tonumber(L, 2);
    lt_set(L, u, LT_CALL(L, mp_full(scalar_dtype(a->dtype, v), a->dev, 0, NULL, v)), m->name);
    TENSOR_RETURN(L, m->name, mp_binary(m->op, a, u->t));
}

/* t:requires_grad() -> boolean; t:requires_grad(flag) sets it and returns t */
static int t_requires_grad(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    if (lua_isnone(L, 2)) { lua_pushboolean(L, t->requires_grad); return 1; }
    mp_clear_error();
    if (mp_set_requires_grad(t, lua_toboolean(L, 2))) return lt_error(L, "Tensor:requires_grad");
    lua_settop(L, 1);
    return 1;
}

/* a new userdata for an engine tensor the caller holds a reference to already */
static void push_ref(lua_State *L, mp_tensor *t)
{
    if (!t) { lua_pushnil(L); return; }
    LTensor *u = lt_new(L);
    u->t = mp_retain(t);
}

static int t_newindex(lua_State *L)
{
    mp_tensor *t = lt_check(L, 1);
    const char *k = lua_tostring(L, 2);
    if (k && strcmp(k, "grad") == 0) {
        mp_tensor *g = lua_isnil(L, 3) ? NULL : lt_check(L, 3), *old;
        mp_clear_error();
        if (mp_set_grad(t, g, &old)) return lt_error(L, "Tensor.grad");
        lt_release(L, old);
        return 0;
    }
    return luaL_error(L, "Tensor: cannot set field '%s' (tensors have no writable fields but grad)",
                      k ? k : luaL_typename(L, 2));
}

/* t[i]: the slice at index i along dim 1 (1-based, negative from the end), as
 * t:select(1, i); t.name: a method or a field; anything else is an error, never
 * a silent nil */
static int t_index(lua_State *L)
{
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;   /* a method */
    if (lua_type(L, 2) == LUA_TNUMBER) {
        mp_tensor *t = lt_check(L, 1);
        int64_t i = lb_integer(L, 2, "index", "Tensor[]");
        TENSOR_RETURN(L, "Tensor[]", mp_select(t, 1, i));
    }
    if (lua_type(L, 2) != LUA_TSTRING)
        return luaL_error(L, "Tensor: cannot index a tensor with a %s (integers select along dim 1; names are "
                             "methods and fields)", luaL_typename(L, 2));
    const char *k = lua_tostring(L, 2);
    mp_tensor *t = lt_check(L, 1);
    if (strcmp(k, "shape") == 0) push_shape(L, t);
    else if (strcmp(k, "dtype") == 0) lua_pushstring(L, mp_dtype_name(t->dtype));
    else if (strcmp(k, "device") == 0) lua_pushstring(L, mp_device_name(t->dev));
    else if (strcmp(k, "grad") == 0) push_ref(L, t->grad);
    else if (strcmp(k, "is_leaf") == 0) lua_pushboolean(L, t->grad_fn == NULL);
    else if (strcmp(k, "grad_fn") == 0) {
        if (t->grad_fn) lua_pushstring(L, t->grad_fn->name);
        else lua_pushnil(L);
    }
    else return luaL_error(L, "Tensor: no method or field '%s'", k);
    return 1;
}

/* identity, as for tables: use t:eq(u) for elementwise equality */
static int t_eq(lua_State *L)
{
    LTensor *a = luaL_testudata(L, 1, MP_TENSOR_MT), *b = luaL_testudata(L, 2, MP_TENSOR_MT);
    lua_pushboolean(L, a && b && a->t && a->t == b->t);
    return 1;
}

static const luaL_Reg meth[] = {
    {"item", t_item}, {"totable", t_totable}, {"free", t_free}, {"copy_", t_copy_}, {"matmul", t_matmul},
    {"requires_grad", t_requires_grad}, {"backward", la_backward},
    {"pow", t_pow},
    {NULL, NULL}
};

static const luaL_Reg metameth[] = {
    {"__gc", t_gc}, {"__close", t_close}, {"__tostring", lt_tostring},
    {"__add", t_add}, {"__sub", t_sub}, {"__mul", t_mul}, {"__div", t_div}, {"__pow", t_pow_mm}, {"__unm", t_unm},
    {"__eq", t_eq}, {"__newindex", t_newindex}, {"__index", NULL}, {NULL, NULL}
};

/* the methods of a table of rows: each a closure of f over its row */
#define ADD_ROWS(L, rows, f) add_rows((L), (rows), sizeof (rows)[0], sizeof (rows) / sizeof (rows)[0], (f))
static void add_rows(lua_State *L, const void *rows, size_t size, size_t n, lua_CFunction f)
{
    for (size_t i = 0; i < n; i++) {
        const void *row = (const char *)rows + i * size;
        lua_pushlightuserdata(L, (void *)row);
        lua_pushcclosure(L, f, 1);
        lua_setfield(L, -2, *(const char *const *)row);   /* each row starts with its method's name */
    }
}

int luaopen_mp_tensor(lua_State *L)
{
    luaL_newmetatable(L, MP_TENSOR_MT);
    luaL_setfuncs(L, metameth, 0);
    luaL_newlib(L, meth);
    ADD_ROWS(L, cast_methods, t_cast);
    ADD_ROWS(L, unary_methods, t_unary);
    ADD_ROWS(L, compare_methods, t_compare);
    lua_pushvalue(L, -1);
    lua_pushcclosure(L, t_index, 1);
    lua_setfield(L, -3, "__index");
    lua_remove(L, -2);
    return 1;
}
