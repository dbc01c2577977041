/*
 * ltensor_print.c: tostring(t). Values in one shared format (integers, fixed
 * point or exponent, chosen from what is shown), matrices as rows, higher dims
 * as "(i,j,.,.) =" slices as Torch prints them, and a summary line such as
 * `[f16 2x3 cpu]`. Tensors over 1000 elements show the first and last three
 * entries of each dim around "...", so printing never reads the whole tensor.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lua/lbind.h"
#include "lua/lcore.h"

#define EDGE 3

typedef struct {
    const mp_tensor *t;
    int summarise;
    double *vals;          /* values in print order */
    int64_t nvals, k;
    char fmt[16];
    int width;
    luaL_Buffer *b;        /* NULL while collecting */
    int headers;           /* slice headers written so far */
} printer;

/* number of shown entries of dim d (an ellipsis counts as one) and the k-th one (-1: ellipsis) */
static int64_t shown(const printer *p, int d)
{
    int64_t n = p->t->shape[d];
    return p->summarise && n > 2 * EDGE ? 2 * EDGE + 1 : n;
}

static int64_t entry(const printer *p, int d, int64_t k)
{
    int64_t n = p->t->shape[d];
    if (!(p->summarise && n > 2 * EDGE)) return k;
    return k < EDGE ? k : k == EDGE ? -1 : n - (2 * EDGE + 1 - k);
}

static void put_value(printer *p, double v)
{
    char s[64];
    if (isnan(v)) snprintf(s, sizeof s, "%*s", p->width, "nan");
    else if (isinf(v)) snprintf(s, sizeof s, "%*s", p->width, v > 0 ? "inf" : "-inf");
    else if (!mp_is_float(p->t->dtype)) snprintf(s, sizeof s, "%*lld", p->width, (long long)v);
    else snprintf(s, sizeof s, p->fmt, p->width, v);
    luaL_addchar(p->b, ' ');
    luaL_addstring(p->b, s);
}

/* one row of the last dim, starting at flat offset `base` */
static int row(printer *p, int64_t base)
{
    int d = p->t->ndim - 1;
    int64_t n = shown(p, d);
    if (!p->b) {
        for (int64_t k = 0; k < n; k++) {
            int64_t i = entry(p, d, k);
            if (i >= 0 && mp_read_f64(p->t, base + i, 1, &p->vals[p->nvals++])) return -1;
        }
        return 0;
    }
    for (int64_t k = 0; k < n; k++) {
        if (entry(p, d, k) < 0) luaL_addstring(p->b, " ...");
        else put_value(p, p->vals[p->k++]);
    }
    luaL_addchar(p->b, '\n');
    return 0;
}

/* dims d.. of the tensor at flat offset base; idx holds the leading indices for slice headers */
static int walk(printer *p, int d, int64_t base, int64_t *idx)
{
    const mp_tensor *t = p->t;
    int nd = t->ndim;
    if (d == nd - 1) return row(p, base);
    int64_t stride = 1;
    for (int e = d + 1; e < nd; e++) stride *= t->shape[e];
    for (int64_t k = 0, n = shown(p, d); k < n; k++) {
        int64_t i = entry(p, d, k);
        if (i < 0) {
            if (p->b) luaL_addstring(p->b, d == nd - 2 ? " ...\n" : "\n...\n");
            continue;
        }
        idx[d] = i;
        if (p->b && d == nd - 3) {   /* a slice header before each matrix, a blank line between */
            if (p->headers++) luaL_addchar(p->b, '\n');
            luaL_addchar(p->b, '(');
            for (int e = 0; e <= d; e++) {
                char s[32];
                snprintf(s, sizeof s, "%lld,", (long long)idx[e] + 1);
                luaL_addstring(p->b, s);
            }
            luaL_addstring(p->b, ".,.) =\n");
        }
        if (walk(p, d + 1, base + i * stride, idx)) return -1;
    }
    return 0;
}

/* whether every finite value shown reads back from fmt as the same double */
static bool round_trips(const printer *p, const char *fmt)
{
    for (int64_t i = 0; i < p->nvals; i++) {
        char s[64];
        double v = p->vals[i];
        if (!isfinite(v)) continue;
        snprintf(s, sizeof s, fmt, 0, v);
        if (strtod(s, NULL) != v) return false;
    }
    return true;
}

/* f64 is the dtype of exact checks: its values show as many digits as they
 * need to read back exactly (4 at least, as the other dtypes; at most 20
 * decimals in fixed point, 16 in the exponent form, which always suffice) */
static void widen_f64_format(printer *p)
{
    bool expo = strchr(p->fmt, 'e') != NULL;
    for (int d = 4; d <= (expo ? 16 : 20); d++) {
        snprintf(p->fmt, sizeof p->fmt, expo ? "%%*.%de" : "%%*.%df", d);
        if (round_trips(p, p->fmt)) return;
    }
}

/* one format for every finite value shown, and the width of the widest */
static void choose_format(printer *p)
{
    double mx = 0, mn = INFINITY;
    int integral = 1;
    for (int64_t i = 0; i < p->nvals; i++) {
        double v = fabs(p->vals[i]);
        if (!isfinite(v)) continue;
        if (v > mx) mx = v;
        if (v > 0 && v < mn) mn = v;
        if (v != floor(v)) integral = 0;
    }
    if (integral && mx < 1e8) strcpy(p->fmt, "%*.0f");
    else if (mx >= 1e5 || mn < 1e-4) strcpy(p->fmt, "%*.4e");
    else strcpy(p->fmt, "%*.4f");
    if (p->t->dtype == MP_F64 && !(integral && mx < 1e8)) widen_f64_format(p);
    p->width = 3;   /* room for nan/inf */
    for (int64_t i = 0; i < p->nvals; i++) {
        char s[64];
        double v = p->vals[i];
        int w = !isfinite(v) ? (v < 0 ? 4 : 3)
              : !mp_is_float(p->t->dtype) ? snprintf(s, sizeof s, "%lld", (long long)v)
              : snprintf(s, sizeof s, p->fmt, 0, v);
        if (w > p->width) p->width = w;
    }
}

int lt_tostring(lua_State *L)
{
    LTensor *u = luaL_checkudata(L, 1, MP_TENSOR_MT);
    if (!u->t) { lua_pushliteral(L, "[freed tensor]"); return 1; }
    const mp_tensor *t = u->t;
    printer p = {.t = t, .summarise = t->numel > 1000};
    int64_t cap = 1;
    for (int d = 0; d < t->ndim; d++) cap *= shown(&p, d);
    p.vals = lua_newuserdatauv(L, sizeof(double) * (size_t)cap, 0);
    int64_t idx[MP_MAXDIM];
    mp_clear_error();
    if (t->ndim == 0 ? mp_read_f64(t, 0, 1, p.vals) : walk(&p, 0, 0, idx)) return lt_error(L, "tostring");
    if (t->ndim == 0) p.nvals = 1;
    choose_format(&p);

    luaL_Buffer b;
    luaL_buffinit(L, &b);
    p.b = &b;
    if (t->ndim == 0) { put_value(&p, p.vals[0]); luaL_addchar(&b, '\n'); }
    else walk(&p, 0, 0, idx);
    luaL_addchar(&b, '[');
    luaL_addstring(&b, mp_dtype_name(t->dtype));
    luaL_addchar(&b, ' ');
    if (t->ndim == 0) luaL_addstring(&b, "scalar");
    for (int d = 0; d < t->ndim; d++) {
        char s[32];
        snprintf(s, sizeof s, d ? "x%lld" : "%lld", (long long)t->shape[d]);
        luaL_addstring(&b, s);
    }
    luaL_addchar(&b, ' ');
    luaL_addstring(&b, mp_device_name(t->dev));
    luaL_addchar(&b, ']');
    luaL_pushresult(&b);
    return 1;
}
