/*
 * gpu_kernels.c: the CUDA backend's loss-scaler pass and fused AdamW step as
 * GB/s, against a device-to-device copy measured in the same run (part b of
 * `make bench-gpu`, scripts/bench/gpu/run.sh). The backend table is called
 * directly, as scripts/bench/bench_scaler.c does for the CPU backend: no Lua, no
 * tensors, no autograd.
 *
 *   build/bench/gpu_kernels [N]      N f32 values per array (default 2^28: 1 GiB arrays)
 *
 * Variants, each over N f32 values in device memory:
 *   copy       be->copy of 4N bytes: 8N bytes moved (read + written)
 *   unscale    be->unscale(be->ctx, g, N, st, 0, NULL, NULL, 0): g *= 1/scale with the inf/NaN
 *              count and amax into st->slot[0]; 8N bytes (g read and written)
 *   unscale_tel the same with telemetry over an arena of 256 parameters (zeros, f16
 *              under/overflow, histogram, per parameter and in the slot); 8N bytes
 *   adamw      be->optim_count(be->ctx, step, NULL) + be->optim_step(be->ctx, MP_ADAMW, p, g, m, v, N, ...):
 *              p, g, m, v read, p, m, v written: 28N bytes
 *   adamw_lowp the same, also writing the parameters' f16 working copy (lowp, as a
 *              step under autocast does): 30N bytes
 * The loss scaler's state lives in device memory (filled on the host, copied with
 * from_host). Two states alternate, scale 2^16 and 2^-16, so that g goes back and
 * forth between the same two sets of values (both factors are exact) instead of
 * drifting into subnormals and zeros.
 *
 * Timing: be->synchronize(be->ctx), REPS calls, be->synchronize(be->ctx), wall clock; TRIALS such
 * trials per variant, the variants interleaved trial by trial (a slower stretch of
 * the run slows all of them alike), after one warm-up trial each; the median trial.
 *
 * Output: '#' lines for people, and `ROW <key> <value> <unit>` lines for run.sh.
 * Without a CUDA backend (no GPU) it prints one "skipped" line and exits 0.
 * MP_BENCH_SMOKE=1 runs the same code on the CPU backend with small arrays (a
 * check that the program works, not a measurement).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/tensor.h"   /* mp_backend_of */
#include "scripts/bench/bench_clock.h"

#define TRIALS 11
#define NSEG 256   /* parameters in the arena, for the telemetry pass */
#define MAX_TRIALS 32

enum { V_COPY, V_UNSCALE, V_UNSCALE_TEL, V_ADAMW, V_ADAMW_LOWP, NV };
static const char *vname[NV] = {"copy", "unscale", "unscale_tel", "adamw", "adamw_lowp"};
static const double vbytes[NV] = {8, 8, 8, 28, 30};   /* bytes moved per value */

static const mp_backend *be;

static float half_to_float(uint16_t h)
{
    int e = (h >> 10) & 31, mant = h & 1023;
    float v = e == 0 ? ldexpf((float)mant, -24) : e == 31 ? (mant ? NAN : INFINITY) : ldexpf((float)(mant | 1024), e - 25);
    return h >> 15 ? -v : v;
}

static void sync_dev(void)
{
    if (be->synchronize) be->synchronize(be->ctx);
}

static void check_error(const char *where)
{
    const char *e = be->error ? be->error(be->ctx) : NULL;
    if (e) {
        fprintf(stderr, "gpu_kernels: %s: %s\n", where, e);
        exit(1);
    }
}

static void *dev_alloc(size_t nbytes, const char *what)
{
    void *p = be->alloc(be->ctx, nbytes);
    if (!p) {
        fprintf(stderr, "gpu_kernels: out of memory allocating %s (%.2f GiB)\n", what, (double)nbytes / (1 << 30));
        exit(1);
    }
    return p;
}

/* the arrays and states of one run */
static int64_t n;
static float *g, *p, *m, *v, *dst;
static void *lowp;
static mp_scale_state *st[2];
static mp_grad_stats *tel;
static int64_t *seg;
static int64_t *step;
static mp_optim_args args;
static int flip;

static void run(int variant)
{
    switch (variant) {
    case V_COPY: be->copy(be->ctx, dst, p, sizeof(float) * (size_t)n); break;
    case V_UNSCALE: be->unscale(be->ctx, g, n, st[flip ^= 1], 0, NULL, NULL, 0); break;
    case V_UNSCALE_TEL: be->unscale(be->ctx, g, n, st[flip ^= 1], 0, tel, seg, NSEG); break;
    case V_ADAMW:
        be->optim_count(be->ctx, step, NULL);
        be->optim_step(be->ctx, MP_ADAMW, p, g, m, v, n, &args, step, NULL, NULL, MP_F32, NULL);   /* no low-precision copy */
        break;
    case V_ADAMW_LOWP:
        be->optim_count(be->ctx, step, NULL);
        be->optim_step(be->ctx, MP_ADAMW, p, g, m, v, n, &args, step, NULL, lowp, MP_F16, NULL);
        break;
    }
}

int main(int argc, char **argv)
{
    const char *smoke_env = getenv("MP_BENCH_SMOKE");
    int smoke = smoke_env && *smoke_env && strcmp(smoke_env, "0") != 0;
    be = smoke ? mp_backend_of(MP_CPU) : mp_backend_of(MP_CUDA);
    if (!be) {
        printf("# gpu_kernels: skipped: no GPU (no CUDA backend on this machine)\n");
        return 0;
    }
    n = argc > 1 ? atoll(argv[1]) : smoke ? (int64_t)1 << 16 : (int64_t)1 << 28;
    int reps = smoke ? 3 : 20, trials = smoke ? 3 : TRIALS;
    if (n < NSEG) {
        fprintf(stderr, "gpu_kernels: N must be a count of values of at least %d\n", NSEG);
        return 2;
    }
    size_t bytes = sizeof(float) * (size_t)n;

    g = dev_alloc(bytes, "g");
    p = dev_alloc(bytes, "p");
    m = dev_alloc(bytes, "m");
    v = dev_alloc(bytes, "v");
    dst = dev_alloc(bytes, "the copy's destination");
    lowp = dev_alloc(bytes / 2, "the f16 working copy");
    be->rand_normal(be->ctx, g, MP_F32, n, 1, 0);
    be->rand_normal(be->ctx, p, MP_F32, n, 2, 0);
    be->zero(be->ctx, m, bytes);
    be->zero(be->ctx, v, bytes);
    be->zero(be->ctx, dst, bytes);

    /* the loss scaler's states, set up on the host: scale 2^16 (and 2^-16), all else 0 */
    mp_scale_state *hs = calloc(1, sizeof *hs);
    if (!hs) return fprintf(stderr, "gpu_kernels: out of memory\n"), 1;
    for (int i = 0; i < 2; i++) {
        memset(hs, 0, sizeof *hs);
        hs->scale = hs->stats_scale = i == 0 ? 65536.0f : 1.0f / 65536.0f;
        st[i] = dev_alloc(sizeof *hs, "the scaler state");
        be->from_host(be->ctx, st[i], hs, sizeof *hs);
    }
    /* telemetry over NSEG parameters of equal size (the last takes the rest) */
    tel = dev_alloc(sizeof *tel * NSEG, "the telemetry");
    be->zero(be->ctx, tel, sizeof *tel * NSEG);
    int64_t hseg[NSEG + 1];
    for (int i = 0; i < NSEG; i++) hseg[i] = n / NSEG * i;
    hseg[NSEG] = n;
    seg = dev_alloc(sizeof hseg, "the parameters' offsets");
    be->from_host(be->ctx, seg, hseg, sizeof hseg);
    step = dev_alloc(sizeof *step, "the step count");
    be->zero(be->ctx, step, sizeof *step);

    /* AdamW as the engine fills it (PyTorch's defaults, weight decay 0.01) */
    const double lr = 1e-3, wd = 0.01, b1 = 0.9, b2 = 0.999;
    memset(&args, 0, sizeof args);
    args.lr = (float)lr, args.weight_decay = (float)wd, args.beta1 = (float)b1, args.beta2 = (float)b2;
    args.eps = 1e-8f, args.momentum = 0;
    args.one_minus_dampening = 1, args.one_minus_beta1 = (float)(1 - b1), args.one_minus_beta2 = (float)(1 - b2);
    args.decay = (float)(1 - lr * wd);
    args.lr_d = lr, args.beta1_d = b1, args.beta2_d = b2, args.nesterov = 0;
    sync_dev();
    check_error("setup");

    static double t[NV][MAX_TRIALS];
    if (trials > MAX_TRIALS) trials = MAX_TRIALS;
    for (int tr = -1; tr < trials; tr++)   /* trial -1: the warm-up */
        for (int k = 0; k < NV; k++) {
            sync_dev();
            double t0 = now();
            for (int r = 0; r < reps; r++) run(k);
            sync_dev();
            double dt = (now() - t0) / reps;
            if (tr >= 0) t[k][tr] = dt;
        }
    check_error("the timed runs");

    /* read back what the kernels counted: a check that they ran over every value */
    int64_t steps = 0;
    be->to_host(be->ctx, &steps, step, sizeof steps);
    int64_t seen = 0, bad = 0;
    for (int i = 0; i < 2; i++) {
        be->to_host(be->ctx, hs, st[i], sizeof *hs);
        seen += hs->slot[0].n;
        bad += hs->slot[0].nan + hs->slot[0].inf;
    }
    float probe[1];
    uint16_t lprobe[1];
    be->to_host(be->ctx, probe, p + n / 2, sizeof probe);
    be->to_host(be->ctx, lprobe, (uint16_t *)lowp + n / 2, sizeof lprobe);
    float lp = half_to_float(lprobe[0]);
    check_error("the read-back");
    int64_t calls = (int64_t)(trials + 1) * reps;
    int ok = steps == 2 * calls && seen == 2 * calls * n && bad == 0 && isfinite(probe[0])
             && fabsf(lp - probe[0]) <= 1e-3f * fabsf(probe[0]) + 1e-7f;
    free(hs);

    double s[NV], gbs[NV];
    for (int k = 0; k < NV; k++) {
        s[k] = median(t[k], trials);
        gbs[k] = vbytes[k] * (double)n / s[k] / 1e9;
    }
    printf("# gpu_kernels on %s: %lld f32 values (%.2f GiB per array), median of %d trials x %d calls after a warm-up%s\n",
           be->name ? be->name : "?", (long long)n, (double)bytes / (1 << 30), trials, reps,
           smoke ? " (MP_BENCH_SMOKE: CPU backend, small arrays: not a measurement)" : "");
    for (int k = 0; k < NV; k++)
        printf("# %-12s %8.3f ms  %8.1f GB/s  (%2.0f B per value)\n", vname[k], s[k] * 1e3, gbs[k], vbytes[k]);
    printf("# unscale / copy %.2fx, unscale with telemetry / copy %.2fx, AdamW / copy %.2fx, AdamW writing the f16 "
           "copy / copy %.2fx (target >= 0.8x for unscale and AdamW)\n", gbs[V_UNSCALE] / gbs[V_COPY],
           gbs[V_UNSCALE_TEL] / gbs[V_COPY], gbs[V_ADAMW] / gbs[V_COPY], gbs[V_ADAMW_LOWP] / gbs[V_COPY]);
    printf("# check: %lld optimizer steps counted (expected %lld), %lld values unscaled (expected %lld), "
           "%lld inf/NaN, p[n/2] = %g, its f16 copy %g: %s\n",
           (long long)steps, (long long)(2 * calls), (long long)seen, (long long)(2 * calls * n), (long long)bad,
           (double)probe[0], (double)lp, ok ? "ok" : "MISMATCH");
    for (int k = 0; k < NV; k++) printf("ROW %s_gbs %.6g GB/s\n", vname[k], gbs[k]);

    be->free(be->ctx, g, bytes), be->free(be->ctx, p, bytes), be->free(be->ctx, m, bytes), be->free(be->ctx, v, bytes), be->free(be->ctx, dst, bytes);
    be->free(be->ctx, lowp, bytes / 2);
    be->free(be->ctx, st[0], sizeof *st[0]), be->free(be->ctx, st[1], sizeof *st[1]);
    be->free(be->ctx, tel, sizeof *tel * NSEG), be->free(be->ctx, seg, sizeof(int64_t) * (NSEG + 1)), be->free(be->ctx, step, sizeof *step);
    return ok ? 0 : 1;
}
