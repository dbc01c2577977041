/*
 * anomaly.c: anomaly mode's state and its check of a node's gradients
 * (engine/anomaly.h).
 */
#include <math.h>
#include "engine/anomaly.h"
#include "engine/state.h"
#include "engine/ops.h"
#include "engine/error.h"

bool mp_set_detect_anomaly(bool on)
{
    mp_state *s = mp_state_get();
    bool was = s->anomaly.on;
    s->anomaly.on = on;
    return was;
}

bool mp_anomaly_enabled(void) { return mp_state_get()->anomaly.on; }

void mp_anomaly_where(char *(*where)(void *ctx), void *ctx)
{
    mp_state *s = mp_state_get();
    s->anomaly.where = where;
    s->anomaly.ctx = ctx;
}

/* *bad = t holds an inf or a NaN, with the engine's own ops so that it works on
 * every device and float dtype: x * 0 is 0 for every finite x and NaN for
 * inf and NaN, and a sum of zeros is 0 (one number read back) */
static int nonfinite(mp_tensor *t, bool *bad)
{
    mp_tensor *z = mp_unary(MP_MULS, t, 0.0), *sum = z ? mp_reduce(MP_SUM, z, 0, 0) : NULL;
    double v = 0;
    int rc = sum ? mp_read_f64(sum, 0, 1, &v) : -1;
    mp_release(z);
    mp_release(sum);
    *bad = rc == 0 && v != 0;
    return rc;
}

/* "inf", "NaN" or "inf and NaN": t's values read back (the error's path only) */
static const char *what_nonfinite(const mp_tensor *t)
{
    double buf[1024];
    bool inf = false, nan = false;
    for (int64_t i = 0; i < t->numel && !(inf && nan); i += 1024) {
        int64_t m = t->numel - i < 1024 ? t->numel - i : 1024;
        if (mp_read_f64(t, i, m, buf)) break;
        for (int64_t j = 0; j < m; j++) inf |= isinf(buf[j]), nan |= isnan(buf[j]);
    }
    return inf && nan ? "inf and NaN" : nan ? "NaN" : "inf";
}

int mp_anomaly_check(const mp_node *x, mp_tensor *gout, mp_tensor *const *gin)
{
    bool was = mp_set_grad_enabled(false);   /* the check's ops are no part of any graph */
    bool bad = false;
    int rc = nonfinite(gout, &bad);
    if (rc == 0 && bad) goto done;           /* not this node's doing: it got a non-finite gradient */
    for (int i = 0; i < x->nin && rc == 0; i++) {
        if (!gin[i] || (rc = nonfinite(gin[i], &bad)) || !bad) continue;
        const char *what = what_nonfinite(gin[i]);
        if (x->where)
            rc = mp_fail(MP_EINVAL, "anomaly: the backward of %s (forward at %s) produced %s from finite inputs "
                                    "(in the gradient of its input %d)", x->name, x->where, what, i + 1);
        else
            rc = mp_fail(MP_EINVAL, "anomaly: the backward of %s produced %s from finite inputs (in the gradient "
                                    "of its input %d; its forward ran before anomaly mode was on, so its line "
                                    "is unknown)", x->name, what, i + 1);
    }
done:
    mp_set_grad_enabled(was);
    return rc;
}
