/*
 * test_scaler.c: the loss scaler at the engine level (engine/scaler.h) with a
 * one-parameter SGD optimizer (engine/optim.h), and the CPU backend's unscale
 * pass (mp_cpu_backend.unscale) on constructed arrays.
 *
 * Each step writes the *scaled* gradient straight into the optimizer's gradient
 * arena, so a sequence like {OK, OK, INF, ...} decides which steps overflow. The
 * expected scales are worked out by hand from PyTorch's _amp_update_scale_ and
 * DeepSpeed's DynamicLossScaler.update_scale (see the comments by each table).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/scaler.h"
#include "engine/optim.h"
#include "engine/ops.h"
#include "engine/error.h"

#define OK 1.0
#define INF INFINITY
#define NAN_ NAN

typedef struct {
    mp_tensor *p;
    mp_optim *o;
    mp_scaler *s;
} rig;

static rig make_rig(const mp_policy *pol, int64_t n)
{
    rig r;
    r.p = mp_full(MP_F32, MP_CPU, 1, &n, 0.5);
    cr_assert(r.p, "%s", mp_error());
    r.p->requires_grad = true;
    mp_optim_config cfg = {.kind = MP_SGD, .lr = 0.25};
    r.o = mp_optim_new(&cfg, 1, &r.p);
    cr_assert(r.o, "%s", mp_error());
    r.s = mp_scaler_new(pol);
    cr_assert(r.s, "%s", mp_error());
    return r;
}

#define ST(s) mp_scaler_read(s)

static void free_rig(rig *r)
{
    mp_scaler_free(r->s);
    mp_optim_free(r->o);
    mp_release(r->p);
}

/* one step: scale(loss), gradient g (scaled; true_grad: g * scale), step, update.
 * Returns update's result; *applied says whether the optimizer ran. */
static int one_step(rig *r, double g, bool true_grad, double loss, bool *applied)
{
    mp_tensor *l = mp_full(MP_F32, MP_CPU, 0, NULL, loss);
    cr_assert(l);
    mp_tensor *sl = mp_scaler_scale(r->s, l);
    cr_assert(sl, "%s", mp_error());
    mp_release(sl);
    mp_release(l);
    float *grad = mp_data(r->o->grads);
    float v = (float)(true_grad && isfinite(g) ? g * ST(r->s)->scale : g);
    for (int64_t i = 0; i < r->o->numel; i++) grad[i] = v;
    int a;
    cr_assert_eq(mp_scaler_step(r->s, r->o, &a), 0, "%s", mp_error());
    if (applied) *applied = a;
    return mp_scaler_update(r->s);
}

static void run_seq(rig *r, const double *seq, const double *want, int n, bool true_grad, const char *what)
{
    for (int i = 0; i < n; i++) {
        cr_assert_eq(one_step(r, seq[i], true_grad, 1.0, NULL), 0, "%s step %d: %s", what, i + 1, mp_error());
        cr_assert_eq(ST(r->s)->scale, (float)want[i], "%s: after step %d the scale is %.9g, expected %.9g",
                     what, i + 1, ST(r->s)->scale, want[i]);
    }
}

static mp_policy dynamic(double init, double growth, double backoff, int64_t interval, double min, double max)
{
    return (mp_policy){.kind = MP_POLICY_DYNAMIC, .init = init, .growth = growth, .backoff = backoff,
                       .interval = interval, .min = min, .max = max};
}

static mp_policy hysteresis(double init, int64_t window, int hyst, double min, bool err)
{
    return (mp_policy){.kind = MP_POLICY_HYSTERESIS, .init = init, .growth = 2, .backoff = 0.5,
                       .interval = window, .hysteresis = hyst, .min = min, .error_at_min = err};
}

/* ---- dynamic (PyTorch GradScaler) ---- */

Test(scaler, dynamic_interval_3)
{
    mp_policy p = dynamic(1024, 2, 0.5, 3, 0, 0);
    rig r = make_rig(&p, 1);
    /* tracker: 1, 2, 0 (grow), 1, 0 (backoff), 1, 2, 0 (backoff), 1, 2, 0 (grow), 0 (backoff, NaN) */
    double seq[] = {OK, OK, OK, OK, INF, OK, OK, INF, OK, OK, OK, NAN_};
    double want[] = {1024, 1024, 2048, 2048, 1024, 1024, 1024, 512, 512, 512, 1024, 512};
    int64_t tracker[] = {1, 2, 0, 1, 0, 1, 2, 0, 1, 2, 0, 0};
    for (int i = 0; i < 12; i++) {
        bool applied;
        cr_assert_eq(one_step(&r, seq[i], false, 1.0, &applied), 0);
        cr_assert_eq(ST(r.s)->scale, (float)want[i], "step %d: %g, expected %g", i + 1, ST(r.s)->scale, want[i]);
        cr_assert_eq(ST(r.s)->tracker, tracker[i], "step %d: tracker %lld", i + 1, (long long)ST(r.s)->tracker);
        cr_assert_eq(applied, isfinite(seq[i]), "step %d", i + 1);
    }
    cr_assert_eq(ST(r.s)->steps, 12);
    cr_assert_eq(ST(r.s)->skipped, 3);
    free_rig(&r);
}

Test(scaler, dynamic_growth_stops_at_the_f32_limit)
{
    mp_policy p = dynamic(0x1p126, 2, 0.5, 1, 0, 0);
    rig r = make_rig(&p, 1);
    double seq[] = {OK, OK, OK, INF, OK};
    double want[] = {0x1p127, 0x1p127, 0x1p127, 0x1p126, 0x1p127};
    run_seq(&r, seq, want, 5, false, "f32 limit");
    cr_assert(isfinite(ST(r.s)->scale));
    free_rig(&r);
}

Test(scaler, dynamic_min_max_clamps)
{
    mp_policy p = dynamic(4, 2, 0.5, 1, 1, 12);
    rig r = make_rig(&p, 1);
    double seq[] = {OK, OK, OK, INF, INF, INF, INF, INF, OK};
    double want[] = {8, 12, 12, 6, 3, 1.5, 1, 1, 2};
    run_seq(&r, seq, want, 9, false, "clamps");
    free_rig(&r);
}

/* ---- hysteresis (DeepSpeed DynamicLossScaler) ---- */

Test(scaler, hysteresis_window_3_counter_2)
{
    mp_policy p = hysteresis(1024, 3, 2, 1, false);
    rig r = make_rig(&p, 1);
    /* it: 0 ok (1%3), 1 ok, 2 ok (3%3: grow, refill), 3 inf (counter 2->1), 4 ok,
     * 5 inf (backoff), 6 inf (backoff), 7 ok, 8 ok, 9 ok ((9-6)%3: grow, refill),
     * 10 inf (counter 2->1), 11 inf (backoff) */
    double seq[] = {OK, OK, OK, INF, OK, INF, INF, OK, OK, OK, INF, INF};
    double want[] = {1024, 1024, 2048, 2048, 2048, 1024, 512, 512, 512, 1024, 1024, 512};
    int left[] = {2, 2, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1};
    int64_t last[] = {-1, -1, -1, 3, 3, 5, 6, 6, 6, 6, 10, 11};
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(one_step(&r, seq[i], false, 1.0, NULL), 0);
        cr_assert_eq(ST(r.s)->scale, (float)want[i], "step %d: %g, expected %g", i + 1, ST(r.s)->scale, want[i]);
        cr_assert_eq(ST(r.s)->hyst_left, left[i], "step %d: counter %d, expected %d", i + 1, ST(r.s)->hyst_left, left[i]);
        cr_assert_eq(ST(r.s)->last_overflow, last[i], "step %d: last overflow %lld", i + 1, (long long)ST(r.s)->last_overflow);
        cr_assert_eq(ST(r.s)->tracker, i + 1);
    }
    free_rig(&r);
}

Test(scaler, hysteresis_floor_warns_once)
{
    mp_policy p = hysteresis(4, 100, 2, 1, false);
    rig r = make_rig(&p, 1);
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    cr_assert(tmp && saved >= 0);
    dup2(fileno(tmp), 2);
    double seq[] = {INF, INF, INF, INF, INF, INF};
    double want[] = {4, 2, 1, 1, 1, 1};
    int rc[6];
    float got[6];
    for (int i = 0; i < 6; i++) {
        rc[i] = one_step(&r, seq[i], false, 1.0, NULL);
        got[i] = ST(r.s)->scale;
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(rc[i], 0, "step %d", i + 1);
        cr_assert_eq(got[i], (float)want[i], "step %d: %g, expected %g", i + 1, got[i], want[i]);
    }
    rewind(tmp);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
    int count = 0;
    for (char *q = buf; (q = strstr(q, "minimum")); q++) count++;
    cr_assert_eq(count, 1, "expected one warning, stderr was:\n%s", buf);
    free_rig(&r);
}

Test(scaler, hysteresis_floor_error)
{
    mp_policy p = hysteresis(2, 100, 1, 1, true);
    rig r = make_rig(&p, 1);
    cr_assert_eq(one_step(&r, INF, false, 1.0, NULL), 0);
    cr_assert_eq(ST(r.s)->scale, 1.0f);
    mp_clear_error();
    cr_assert_eq(one_step(&r, INF, false, 1.0, NULL), -1);
    cr_assert(strstr(mp_error(), "minimum"), "%s", mp_error());
    cr_assert_eq(ST(r.s)->scale, 1.0f);
    /* the step ended: a clean step afterwards works */
    bool applied;
    cr_assert_eq(one_step(&r, OK, false, 1.0, &applied), 0);
    cr_assert(applied);
    free_rig(&r);
}

/* ---- amax ---- */

Test(scaler, amax_history_2_margin_1)
{
    mp_policy p = {.kind = MP_POLICY_AMAX, .init = 1024, .backoff = 0.5, .min = 1, .max = 0x1p24,
                   .history = 2, .margin = 1};
    rig r = make_rig(&p, 1);
    /* true gradients; scale = 2^floor(log2(65504 / max of the last 2) - 1) */
    double seq[] = {0.5, 4, 0.25, 0.25, INF, 0x1p-10, 0x1p-12, 0x1p-12};
    double want[] = {32768, 4096, 4096, 65536, 32768, 65536, 0x1p24, 0x1p24};
    run_seq(&r, seq, want, 8, true, "amax");
    free_rig(&r);
}

/* ---- skips, reasons, unscale ---- */

Test(scaler, skip_leaves_values_and_reasons)
{
    mp_policy p = {.kind = MP_POLICY_STATIC, .init = 8};
    rig r = make_rig(&p, 3);
    const float *v = mp_data(r.o->values);
    float before[3];
    memcpy(before, v, sizeof before);
    bool applied;

    cr_assert_eq(one_step(&r, INF, false, 1.0, &applied), 0);
    cr_assert(!applied);
    cr_assert_eq(mp_scaler_reason(ST(r.s)), MP_SKIP_OVERFLOW);
    cr_assert_eq(r.s->first_bad, 0);
    cr_assert_eq(memcmp(before, v, sizeof before), 0);

    cr_assert_eq(one_step(&r, NAN_, false, 1.0, &applied), 0);
    cr_assert(!applied);
    cr_assert_eq(mp_scaler_reason(ST(r.s)), MP_SKIP_NAN);

    cr_assert_eq(one_step(&r, OK, false, INFINITY, &applied), 0);
    cr_assert(!applied);
    cr_assert_eq(mp_scaler_reason(ST(r.s)), MP_SKIP_FORWARD);
    cr_assert_eq(r.s->first_bad, -1);
    cr_assert_eq(memcmp(before, v, sizeof before), 0);
    int64_t step = -1;
    cr_assert_eq(mp_optim_get_step(r.o, &step), 0);
    cr_assert_eq(step, 0);

    cr_assert_eq(one_step(&r, 8.0, false, 1.0, &applied), 0);   /* unscaled: 1; SGD lr 0.25 */
    cr_assert(applied);
    cr_assert_eq(mp_scaler_reason(ST(r.s)), MP_SKIP_NONE);
    for (int i = 0; i < 3; i++) cr_assert_eq(v[i], 0.25f);
    cr_assert_eq(ST(r.s)->skipped, 3);
    cr_assert_eq(ST(r.s)->steps, 4);
    cr_assert_str_eq(mp_skip_reason_name(MP_SKIP_FORWARD), "forward");
    free_rig(&r);
}

Test(scaler, unscale_once_per_step)
{
    mp_policy p = {.kind = MP_POLICY_STATIC, .init = 4};
    rig r = make_rig(&p, 2);
    mp_tensor *l = mp_full(MP_F32, MP_CPU, 0, NULL, 1.0);
    mp_release(mp_scaler_scale(r.s, l));
    float *g = mp_data(r.o->grads);
    g[0] = 12, g[1] = -2;
    cr_assert_eq(mp_scaler_unscale(r.s, r.o), 0);
    mp_clear_error();
    cr_assert_eq(mp_scaler_unscale(r.s, r.o), -1);
    cr_assert(strstr(mp_error(), "unscale"), "%s", mp_error());
    cr_assert_eq(g[0], 3.0f);
    cr_assert_eq(g[1], -0.5f);
    int applied;
    cr_assert_eq(mp_scaler_step(r.s, r.o, &applied), 0);
    cr_assert(applied);
    cr_assert_eq(g[0], 3.0f, "step unscaled a second time: %g", g[0]);
    const float *v = mp_data(r.o->values);
    cr_assert_eq(v[0], 0.5f - 0.25f * 3.0f);
    cr_assert_eq(mp_scaler_update(r.s), 0);
    mp_release(mp_scaler_scale(r.s, l));
    cr_assert_eq(mp_scaler_unscale(r.s, r.o), 0);
    mp_release(l);
    free_rig(&r);
}

/* outside a step a swap's scale applies at once; inside one (after scale())
 * the step keeps the scale it ran at and the new one applies from the next */
Test(scaler, set_policy_scale_outside_and_inside_a_step)
{
    mp_policy p = dynamic(1024, 2, 0.5, 1000, 0, 0);
    rig r = make_rig(&p, 1);
    cr_assert_eq(one_step(&r, OK, false, 1.0, NULL), 0);
    mp_policy q = {.kind = MP_POLICY_STATIC};
    double v32 = 32, v8 = 8, v4 = 4;
    cr_assert_eq(mp_scaler_set_policy(r.s, &q, &v32), 0);
    cr_assert_eq(ST(r.s)->scale, 32.0f);
    mp_tensor *l = mp_full(MP_F32, MP_CPU, 0, NULL, 1.0);
    mp_tensor *sl = mp_scaler_scale(r.s, l);
    double v;
    cr_assert_eq(mp_read_f64(sl, 0, 1, &v), 0);
    cr_assert_eq(v, 32.0);
    mp_release(sl);
    /* inside the step: the scale stays 32 until the step ends */
    cr_assert_eq(mp_scaler_set_policy(r.s, &q, &v8), 0);
    cr_assert_eq(ST(r.s)->scale, 32.0f);
    cr_assert_eq(mp_scaler_update(r.s), 0);
    sl = mp_scaler_scale(r.s, l);
    cr_assert_eq(mp_read_f64(sl, 0, 1, &v), 0);
    cr_assert_eq(v, 8.0);
    mp_release(sl);
    cr_assert_eq(mp_scaler_update(r.s), 0);
    /* NULL keeps the current scale; counters start fresh */
    mp_policy d = dynamic(65536, 2, 0.5, 3, 0, 0);
    cr_assert_eq(mp_scaler_set_policy(r.s, &d, NULL), 0);
    cr_assert_eq(ST(r.s)->scale, 8.0f);
    cr_assert_eq(ST(r.s)->tracker, 0);
    /* an explicit scale below the policy's min is refused, and nothing changes */
    mp_policy m = dynamic(65536, 2, 0.5, 3, 0, 0);
    m.min = 16;
    cr_assert_eq(mp_scaler_set_policy(r.s, &m, &v4), -1);
    cr_assert(strstr(mp_error(), "min"), "%s", mp_error());
    cr_assert_eq(r.s->policy.min, d.min);
    cr_assert_eq(ST(r.s)->scale, 8.0f);
    mp_policy bad = dynamic(8, 1, 0.5, 10, 0, 0);
    cr_assert_eq(mp_scaler_set_policy(r.s, &bad, &v8), -1);
    cr_assert_eq(r.s->policy.kind, MP_POLICY_DYNAMIC);
    mp_release(l);
    free_rig(&r);
}

Test(scaler, policy_check_refuses_bad_values)
{
    mp_policy ok = dynamic(65536, 2, 0.5, 2000, 0, 0);
    cr_assert_eq(mp_policy_check(&ok), 0);
    mp_policy bad[] = {
        dynamic(0, 2, 0.5, 10, 0, 0), dynamic(-1, 2, 0.5, 10, 0, 0), dynamic(INFINITY, 2, 0.5, 10, 0, 0),
        dynamic(1e39, 2, 0.5, 10, 0, 0), dynamic(8, 1, 0.5, 10, 0, 0), dynamic(8, NAN, 0.5, 10, 0, 0),
        dynamic(8, 2, 0, 10, 0, 0), dynamic(8, 2, 1, 10, 0, 0), dynamic(8, 2, 0.5, 0, 0, 0),
        dynamic(8, 2, 0.5, 10, 4, 2), dynamic(8, 2, 0.5, 10, -1, 0),
        hysteresis(8, 0, 2, 1, false), hysteresis(8, 10, 0, 1, false),
        {.kind = MP_POLICY_AMAX, .init = 8, .backoff = 0.5, .history = 0, .margin = 1},
        {.kind = MP_POLICY_AMAX, .init = 8, .backoff = 0.5, .history = MP_AMAX_HISTORY_MAX + 1, .margin = 1},
        {.kind = MP_POLICY_AMAX, .init = 8, .backoff = 0.5, .history = 4, .margin = -1},
        {.kind = MP_POLICY_AMAX, .init = 8, .backoff = 2, .history = 4, .margin = 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(mp_policy_check(&bad[i]), -1, "bad policy %zu was accepted", i);
        cr_assert_null(mp_scaler_new(&bad[i]), "bad policy %zu made a scaler", i);
    }
}

Test(scaler, set_scale_refuses_bad_values)
{
    mp_policy p = {.kind = MP_POLICY_EXTERNAL, .init = 16};
    rig r = make_rig(&p, 1);
    double bad[] = {0, -1, INFINITY, NAN, 1e39};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(mp_scaler_set_scale(r.s, bad[i]), -1, "%g", bad[i]);
        cr_assert_eq(ST(r.s)->scale, 16.0f);
    }
    cr_assert_eq(mp_scaler_set_scale(r.s, 3), 0);
    cr_assert_eq(ST(r.s)->scale, 3.0f);
    free_rig(&r);
}

/* Two scalers read their states back in two threads at once (an engine error
 * is per thread; a scaler is its caller's): each must get its own state.
 * pull() once landed every read in one static buffer, so the copy to one
 * scaler could carry the other's scale; now each scaler has its own. */
typedef struct {
    mp_scaler *s;
    float want;
    volatile int *go;
    int wrong;
} puller;

static void *pull_loop(void *arg)
{
    puller *p = arg;
    while (!*p->go) {}
    for (int i = 0; i < 1000000; i++) {
        p->s->h_fresh = false;   /* the next read goes to the backend's copy */
        const mp_scale_state *h = mp_scaler_read(p->s);
        if (!h || h->scale != p->want) p->wrong++;
    }
    return NULL;
}

Test(scaler, two_scalers_reading_in_two_threads_keep_their_own_state)
{
    mp_policy pa = mp_policy_defaults(MP_POLICY_DYNAMIC), pb = pa;
    pa.init = 2, pb.init = 4;
    mp_scaler *a = mp_scaler_new(&pa), *b = mp_scaler_new(&pb);
    cr_assert(a && b, "%s", mp_error());
    /* an update places each state in the CPU backend's memory (no growth: 1 of 2000 steps) */
    cr_assert_eq(mp_scaler_update(a), 0, "%s", mp_error());
    cr_assert_eq(mp_scaler_update(b), 0, "%s", mp_error());
    volatile int go = 0;
    puller pa_ = {.s = a, .want = 2, .go = &go}, pb_ = {.s = b, .want = 4, .go = &go};
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, pull_loop, &pa_), 0);
    cr_assert_eq(pthread_create(&tb, NULL, pull_loop, &pb_), 0);
    go = 1;
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(pa_.wrong, 0, "scaler a read another state %d times", pa_.wrong);
    cr_assert_eq(pb_.wrong, 0, "scaler b read another state %d times", pb_.wrong);
    mp_scaler_free(a);
    mp_scaler_free(b);
}

/* ---- the backend's unscale pass ---- */

/* the backend's pass with the state it reads: the scale 1/inv (exact powers of
 * two here), accumulating into *st through slot 2; with telemetry the record
 * must see exactly what the slot saw */
static void unscale_with(float *g, int64_t n, float inv, int tele, mp_grad_stats *st)
{
    static mp_scale_state s;   /* large: not on the stack */
    memset(&s, 0, sizeof s);
    s.scale = 1.0f / inv;
    s.slot[2] = *st;
    mp_grad_stats tel;
    memset(&tel, 0, sizeof tel);
    bool fresh = st->n == 0;
    int64_t seg[2] = {0, n};
    mp_cpu_backend.unscale(mp_cpu_backend.ctx, g, n, &s, 2, tele ? &tel : NULL, seg, 1);
    if (tele && fresh) cr_assert_eq(memcmp(&tel, &s.slot[2], sizeof tel), 0, "telemetry record and slot differ");
    for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++)
        if (k != 2) cr_assert_eq(s.slot[k].n, 0, "slot %d touched", k);
    *st = s.slot[2];
}

/* bin (0-based) of |x| as the header defines it: 2^(i+LO) <= |x| < 2^(i+1+LO), clamped */
static int bin_of(double a)
{
    int e = (int)floor(log2(a)) - MP_HIST_LO;
    return e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e;
}

Test(unscale_kernel, telemetry_counts_amax_histogram)
{
    float g[] = {0.0f, -0.0f, 0.0f, 0x1p-25f, 0x1p-30f, -0x1p-26f, 65520.0f, -70000.0f, 1.0f, -3.0f,
                 0x1p-24f, 65504.0f, 0x1p-60f};
    int n = sizeof g / sizeof g[0];
    float orig[sizeof g / sizeof g[0]];
    memcpy(orig, g, sizeof g);
    mp_grad_stats st;
    memset(&st, 0, sizeof st);
    unscale_with(g, n, 0x1p-10f, 1, &st);
    cr_assert_eq(st.n, n);
    cr_assert_eq(st.zeros, 3);
    cr_assert_eq(st.underflow, 4, "2^-25, 2^-30, 2^-26, 2^-60 (2^-24 is f16's smallest and stays): %lld",
                 (long long)st.underflow);
    cr_assert_eq(st.overflow, 2, "65520 and 70000 (65504 is f16's max and stays): %lld", (long long)st.overflow);
    cr_assert_eq(st.nan, 0);
    cr_assert_eq(st.inf, 0);
    cr_assert_eq(st.amax, 70000.0f);
    int64_t want[MP_HIST_BINS] = {0};
    for (int i = 0; i < n; i++)
        if (orig[i] != 0) want[bin_of(fabs(orig[i]))]++;
    for (int b = 0; b < MP_HIST_BINS; b++)
        cr_assert_eq(st.hist[b], want[b], "bin %d: %lld, expected %lld", b, (long long)st.hist[b], (long long)want[b]);
    /* by hand */
    cr_assert_eq(st.hist[48], 1);        /* 1.0 */
    cr_assert_eq(st.hist[49], 1);        /* 3.0 */
    cr_assert_eq(st.hist[23], 1);        /* 2^-25 */
    cr_assert_eq(st.hist[24], 1);        /* 2^-24 */
    cr_assert_eq(st.hist[0], 1);         /* 2^-60, clamped */
    cr_assert_eq(st.hist[63], 3);        /* 65504, 65520 (2^15..2^16), 70000 clamped */
    for (int i = 0; i < n; i++)
        cr_assert_eq(g[i], orig[i] * 0x1p-10f, "element %d: %g", i, g[i]);
    cr_assert(signbit(g[1]));
}

Test(unscale_kernel, nonfinite_counted_and_excluded_from_amax)
{
    for (int tele = 0; tele <= 1; tele++) {
        float g[] = {2.0f, INFINITY, -INFINITY, NAN, -8.0f, 0.5f};
        mp_grad_stats st;
        memset(&st, 0, sizeof st);
        unscale_with(g, 6, 0.5f, tele, &st);
        cr_assert_eq(st.n, 6);
        cr_assert_eq(st.inf, 2, "telemetry %d: inf %lld", tele, (long long)st.inf);
        cr_assert_eq(st.nan, 1, "telemetry %d", tele);
        cr_assert_eq(st.amax, 8.0f, "telemetry %d: amax %g", tele, st.amax);
        cr_assert_eq(g[0], 1.0f);
        cr_assert(isinf(g[1]) && g[1] > 0);
        cr_assert(isnan(g[3]));
        cr_assert_eq(g[4], -4.0f);
    }
}

Test(unscale_kernel, plain_pass_long_array_and_accumulation)
{
    /* long enough for the vector loop and its tail */
    int64_t n = 1037;
    float *g = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) g[i] = (float)((i % 17) - 8) * 0x1p12f;
    g[700] = -123456.0f;
    mp_grad_stats st;
    memset(&st, 0, sizeof st);
    unscale_with(g, n, 0x1p-12f, 0, &st);
    cr_assert_eq(st.n, n);
    cr_assert_eq(st.nan + st.inf, 0);
    cr_assert_eq(st.amax, 123456.0f);
    for (int64_t i = 0; i < n; i++)
        if (i != 700) cr_assert_eq(g[i], (float)((i % 17) - 8), "element %lld", (long long)i);
    /* a second call adds to the same stats; amax is the max of both */
    float h[3] = {1, 2, 3};
    unscale_with(h, 3, 1.0f, 0, &st);
    cr_assert_eq(st.n, n + 3);
    cr_assert_eq(st.amax, 123456.0f);
    free(g);
}

/* The vectorised, threaded telemetry against the definition, value by value in
 * double, over an arena of several parameters (short ones, and long ones that
 * the pass splits over threads) holding every kind of value: zeros, subnormals,
 * values at the flush and overflow edges, inf and NaN; on 1 and 2 threads. */
static void reference_stats(const float *g, int64_t n, float inv, mp_grad_stats *st)
{
    memset(st, 0, sizeof *st);
    st->n = n;
    for (int64_t i = 0; i < n; i++) {
        double a = fabs((double)g[i]), y = (double)(g[i] * inv);
        if (isnan(y)) st->nan++;
        if (isinf(y)) st->inf++;
        if (!isfinite(a)) continue;
        if ((float)a > st->amax) st->amax = (float)a;
        if (a == 0) { st->zeros++; continue; }
        if (a <= ldexp(1, -25)) st->underflow++;
        if (a >= 65520.0) st->overflow++;
        st->hist[bin_of(a < ldexp(1, -126) ? ldexp(1, -126) : a)]++;   /* subnormals: bin of 2^-126, clamped to 0 */
    }
}

Test(unscale_kernel, telemetry_matches_the_definition_on_long_arenas_and_any_thread_count)
{
    const int64_t seg[] = {0, 7, 4100, 90000, 90001, 300000};
    const int nseg = 5;
    int64_t n = seg[nseg];
    float *g = malloc(sizeof *g * (size_t)n), *g0 = malloc(sizeof *g0 * (size_t)n);
    unsigned r = 12345;
    const float edges[] = {0.0f, -0.0f, 0x1p-25f, 0x1p-24f, 0x1p-149f, 0x1p-130f, 65504.0f, 65520.0f, 1e30f,
                           INFINITY, -INFINITY, NAN, 3.4e38f};
    for (int64_t i = 0; i < n; i++) {
        r = r * 1103515245u + 12345u;
        float v = ldexpf((float)((r >> 8) & 0xffff) / 65536.0f + 0.5f, (int)((r >> 3) % 80) - 50);
        g0[i] = (r & 0x80000000u) ? -v : v;
        if (((r >> 24) & 63) == 0) g0[i] = edges[(r >> 12) % (sizeof edges / sizeof *edges)];
    }
    static mp_scale_state s;
    mp_grad_stats tel[5], want;
    int was = omp_get_max_threads();
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        memcpy(g, g0, sizeof *g * (size_t)n);
        memset(&s, 0, sizeof s);
        memset(tel, 0, sizeof tel);
        s.scale = 4.0f;
        mp_cpu_backend.unscale(mp_cpu_backend.ctx, g, n, &s, 0, tel, seg, nseg);
        for (int p = 0; p < nseg; p++) {
            reference_stats(g0 + seg[p], seg[p + 1] - seg[p], 0.25f, &want);
            cr_assert_eq(memcmp(&tel[p], &want, sizeof want), 0,
                         "%d threads, parameter %d: n %lld/%lld nan %lld/%lld inf %lld/%lld zeros %lld/%lld under "
                         "%lld/%lld over %lld/%lld amax %g/%g", threads, p, (long long)tel[p].n, (long long)want.n,
                         (long long)tel[p].nan, (long long)want.nan, (long long)tel[p].inf, (long long)want.inf,
                         (long long)tel[p].zeros, (long long)want.zeros, (long long)tel[p].underflow,
                         (long long)want.underflow, (long long)tel[p].overflow, (long long)want.overflow,
                         tel[p].amax, want.amax);
        }
        for (int64_t i = 0; i < n; i++)
            cr_assert(g[i] == g0[i] * 0.25f || (isnan(g[i]) && isnan(g0[i])), "value %lld not unscaled", (long long)i);
    }
    omp_set_num_threads(was);
    free(g), free(g0);
}

/* The plain pass (no telemetry) splits a long arena over the threads: the
 * unscaled values, amax and the inf/NaN counts are the same bits on 1 and 2
 * threads, and match the definition (amax over finite values, counts of the
 * unscaled inf/NaN, one of them made by the unscaling). */
Test(unscale_kernel, plain_pass_same_on_1_and_2_threads)
{
    const int64_t n = 200003;   /* past the split, with a tail */
    float *g = malloc(sizeof *g * (size_t)n), *g0 = malloc(sizeof *g0 * (size_t)n);
    unsigned r = 777;
    for (int64_t i = 0; i < n; i++) {
        r = r * 1103515245u + 12345u;
        float v = ldexpf((float)((r >> 8) & 0xffff) / 65536.0f + 0.5f, (int)((r >> 3) % 60) - 30);
        g0[i] = (r & 0x80000000u) ? -v : v;
    }
    g0[5] = NAN, g0[150000] = -INFINITY, g0[199999] = 3.0e38f;   /* * 4 overflows to inf */
    g0[120000] = -0x1p40f;                                         /* the largest finite magnitude */
    static mp_scale_state s;
    mp_grad_stats got[2];
    float *out[2] = {malloc(sizeof *g * (size_t)n), malloc(sizeof *g * (size_t)n)};
    int was = omp_get_max_threads();
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        memcpy(g, g0, sizeof *g * (size_t)n);
        memset(&s, 0, sizeof s);
        s.scale = 0.25f;
        mp_cpu_backend.unscale(mp_cpu_backend.ctx, g, n, &s, 1, NULL, NULL, 0);
        got[threads - 1] = s.slot[1];
        memcpy(out[threads - 1], g, sizeof *g * (size_t)n);
    }
    omp_set_num_threads(was);
    for (int t = 0; t < 2; t++) {
        cr_assert_eq(got[t].n, n);
        cr_assert_eq(got[t].nan, 1, "%d threads: nan %lld", t + 1, (long long)got[t].nan);
        cr_assert_eq(got[t].inf, 2, "%d threads: inf %lld", t + 1, (long long)got[t].inf);
        cr_assert_eq(got[t].amax, 3.0e38f, "%d threads: amax %g", t + 1, got[t].amax);
    }
    cr_assert_eq(memcmp(out[0], out[1], sizeof *g * (size_t)n), 0, "1 and 2 threads unscale differently");
    for (int64_t i = 0; i < n; i++)
        cr_assert(out[1][i] == g0[i] * 4.0f || (isnan(out[1][i]) && isnan(g0[i])), "value %lld", (long long)i);
    free(g), free(g0), free(out[0]), free(out[1]);
}
