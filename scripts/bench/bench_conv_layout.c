/*
 * bench_conv_layout.c: the convolution's activation reorders on the CPU -
 * kernels/cpu/cpu_conv_layout.c's transposes against oneDNN's reorder
 * primitives - alone and inside the convolutions.
 *
 * 1. Each direction (NCHW -> the blocked layout oneDNN's f32 kernels take
 *    here, nChw16c on AVX-512 and nChw8c on AVX2, and back) on the wide
 *    ResNet's chunk shapes, one thread, buffers in L2: median us per call and
 *    GB/s (bytes read + written), oneDNN's primitive and the own transposes.
 * 2. The wide ResNet's three 3x3 convolutions (forward and both gradients,
 *    f32, batch 32 and 128) with the own reorders on and off, alternating,
 *    in one process: median ms of the set and oneDNN / own.
 *
 *   reorder plain->blk 4x32x32x32 nChw8c  onednn 56.6 us 18.5 GB/s  own 29.9 us 35.0 GB/s
 *   conv wide resnet b32 f32  own reorders 34.55 ms  onednn's 34.78 ms  onednn/own 1.007x
 *
 * Figures, not tests: the bits are test_conv's business.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_dnnl.h"
#include "scripts/bench/bench_clock.h"

#define CALLS 2000   /* reorder calls a timing */
#define SETS 12      /* convolution sets a setting (after one warm-up set) */

extern const mp_backend mp_cpu_backend;

/* oneDNN's reorder from -> to: seconds a call (CALLS calls), or -1 */
static double onednn_reorder(struct cpu_dnnl *d, const dnnl_memory_desc_t *from, void *f,
                             const dnnl_memory_desc_t *to, void *t)
{
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_memory_t mf = NULL, mt = NULL;
    double s = -1;
    if (dnnl_reorder_primitive_desc_create(&pd, from, d->engine, to, d->engine, NULL) == dnnl_success &&
        dnnl_primitive_create(&p, pd) == dnnl_success && dnnl_memory_create(&mf, from, d->engine, f) == dnnl_success &&
        dnnl_memory_create(&mt, to, d->engine, t) == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
        double t0 = now();
        for (int i = 0; i < CALLS; i++) {
            dnnl_primitive_execute(p, d->stream, 2, args);
            dnnl_stream_wait(d->stream);
        }
        s = (now() - t0) / CALLS;
    }
    if (mf) dnnl_memory_destroy(mf);
    if (mt) dnnl_memory_destroy(mt);
    if (p) dnnl_primitive_destroy(p);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return s;
}

static void reorders(struct cpu_dnnl *d, int64_t n, int64_t c, int64_t hw)
{
    int blk16 = cpu_conv_layout_ok();
    dnnl_dims_t dims = {n, c, hw, hw};
    dnnl_memory_desc_t u, m;
    dnnl_memory_desc_init_by_tag(&u, 4, dims, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&m, 4, dims, dnnl_f32, blk16 ? dnnl_aBcd16b : dnnl_aBcd8b);
    cpu_conv_layout l;
    if (!cpu_conv_layout_of(&m, &u, &l)) {
        printf("reorder %lldx%lldx%lldx%lld: no own transposes on this processor\n", (long long)n, (long long)c,
               (long long)hw, (long long)hw);
        return;
    }
    size_t ub = dnnl_memory_desc_get_size(&u), mb = dnnl_memory_desc_get_size(&m);
    float *plain = calloc(1, ub), *blk = calloc(1, mb);
    for (int to_plain = 0; to_plain < 2 && plain && blk; to_plain++) {
        double t[2];
        for (int rep = 0; rep < 2; rep++) {   /* the first round warms up both */
            t[0] = to_plain ? onednn_reorder(d, &m, blk, &u, plain) : onednn_reorder(d, &u, plain, &m, blk);
            if (t[0] < 0) {
                puts("reorder: oneDNN's primitive failed");
                free(plain), free(blk);
                return;
            }
            double t0 = now();
            for (int i = 0; i < CALLS; i++)
                cpu_conv_layout_move(to_plain, 4, to_plain ? (void *)blk : (void *)plain,
                                     to_plain ? (void *)plain : (void *)blk, &l);
            t[1] = (now() - t0) / CALLS;
        }
        printf("reorder %s %lldx%lldx%lldx%lld %s  onednn %.1f us %.1f GB/s  own %.1f us %.1f GB/s\n",
               to_plain ? "blk->plain" : "plain->blk", (long long)n, (long long)c, (long long)hw, (long long)hw,
               blk16 ? "nChw16c" : "nChw8c", t[0] * 1e6, 2.0 * (double)ub / t[0] / 1e9, t[1] * 1e6,
               2.0 * (double)ub / t[1] / 1e9);
    }
    free(plain), free(blk);
}

static void convolutions(int64_t batch)
{
    mp_kctx *cx = mp_cpu_backend.ctx;
    static const int64_t stage[3][2] = {{32, 32}, {64, 16}, {128, 8}};   /* channels, size */
    mp_conv_args a[3];
    float *buf[3][6] = {{NULL}};   /* x, w, y, gx, gw, gy */
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        int64_t c = stage[i][0], s = stage[i][1];
        a[i] = (mp_conv_args){.n = batch, .c = c, .h = s, .w = s, .k = c, .r = 3, .s = 3, .oh = s, .ow = s,
                              .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1};
        size_t nx = (size_t)(batch * c * s * s), nw = (size_t)(c * c * 9), len[6] = {nx, nw, nx, nx, nw, nx};
        for (int j = 0; j < 6; j++) {
            if (!(buf[i][j] = malloc(len[j] * sizeof(float)))) ok = 0;
            for (size_t e = 0; ok && e < len[j]; e++) buf[i][j][e] = (float)rand() / (float)RAND_MAX - 0.5f;
        }
    }
    double t[2][SETS];
    for (int set = 0; ok && set <= SETS; set++)
        for (int own = 1; own >= 0; own--) {   /* alternating: a noisy neighbour slows both alike */
            int was = cpu_conv_dnnl_own_reorders(own);
            double t0 = now();
            for (int i = 0; i < 3 && ok; i++)
                ok = cpu_conv_dnnl(cx, CPU_CONV_FWD, MP_F32, buf[i][2], buf[i][0], buf[i][1], NULL, &a[i]) == 0 &&
                     cpu_conv_dnnl_grad(cx, MP_F32, buf[i][3], buf[i][4], buf[i][5], buf[i][0], buf[i][1], &a[i]) == 3;
            if (set > 0) t[own][set - 1] = now() - t0;
            cpu_conv_dnnl_own_reorders(was);
        }
    if (ok) {
        double mo = median(t[1], SETS), md = median(t[0], SETS);
        printf("conv wide resnet b%lld f32 (3x3 at 32/64/128 channels, forward + both gradients)  own reorders %.2f ms  "
               "onednn's %.2f ms  onednn/own %.3fx\n", (long long)batch, mo * 1e3, md * 1e3, md / mo);
    } else {
        printf("conv wide resnet b%lld: oneDNN declined or memory ran out\n", (long long)batch);
    }
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 6; j++) free(buf[i][j]);
}

int main(void)
{
    struct cpu_dnnl *d = cpu_dnnl_of(mp_cpu_backend.ctx);
    if (!d) {
        puts("bench_conv_layout: no oneDNN context");
        return 0;
    }
    if (!cpu_conv_layout_ok() && !cpu_conv_layout8_ok()) {
        puts("bench_conv_layout: neither AVX-512 nor AVX2 here: the own reorders never run");
        return 0;
    }
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);   /* the chunks' reorders run one to a thread */
    static const int64_t shapes[][3] = {{4, 32, 32}, {8, 64, 16}, {16, 128, 8}};
    for (int i = 0; i < 3; i++) reorders(d, shapes[i][0], shapes[i][1], shapes[i][2]);
    omp_set_num_threads(threads);
    convolutions(32);
    convolutions(128);
    return 0;
}
