/* sin: fit y = sin(x) on [-pi, pi] with a 1-64-64-1 tanh MLP, mean squared error and Adam.
 *
 *   make build/examples/sin && build/examples/sin
 *
 * Options: --steps N (2000)  --lr X (1e-2, cosine-decayed to 0)  --backend NAME (library default)  --plot PREFIX
 *
 * The MSE falls below 1e-3 within about 300 steps (half a second on the reference backend).
 * Each step draws a fresh batch of 256 x uniformly from [-pi, pi] with a small PRNG. At the end an
 * attached forward graph (tg_attach / tg_run), which shares the trained parameters, predicts sin
 * on an even grid; a few rows are printed with the largest absolute error over the whole grid.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plot.h"
#include "util.h"
#include "tensorgrad.h"

#define BATCH 256
#define HIDDEN 64
#define GRID 201   /* points of the final check, -pi..pi */
#define PI 3.14159265358979323846

/* ---------------------------------------------------------------------------------------------
 * Model: y = tanh(tanh(x W1 + b1) W2 + b2) W3 + b3, x and y of shape [N, 1].
 * ------------------------------------------------------------------------------------------- */

typedef struct { tg_linear l1, l2, l3; } mlp;

static tg_tensor mlp_forward(const mlp *net, tg_tensor x) {
    tg_tensor h = tg_tanh(tg_linear(&net->l1, x));
    h = tg_tanh(tg_linear(&net->l2, h));
    return tg_linear(&net->l3, h);
}

/* ctx is the mlp; in[0] is x [BATCH, 1], in[1] is sin(x) [BATCH, 1]. */
static tg_tensor loss_fn(const void *ctx, const tg_tensor *in) {
    return tg_mean(tg_square(tg_sub(mlp_forward(ctx, in[0]), in[1])), TG_ALL, 0);
}

static tg_tensor predict_fn(const void *ctx, const tg_tensor *in) { return mlp_forward(ctx, in[0]); }

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

typedef struct { int steps; double lr; const char *backend, *plot; } options;

static void print_usage(FILE *out, const char *prog) {
    fprintf(out, "usage: %s [--steps N] [--lr X] [--backend NAME] [--plot PREFIX]\n", prog);
}

/* Returns 0 to run, 1 after printing --help, -1 after printing the usage for a bad argument. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){ .steps = 2000, .lr = 1e-2 };
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { print_usage(stdout, argv[0]); return 1; }
        if (!v) goto usage;
        if (!strcmp(a, "--steps")) { o->steps = (int)strtol(v, &end, 10); if (o->steps < 1) goto usage; }
        else if (!strcmp(a, "--lr")) { o->lr = strtod(v, &end); if (!(o->lr > 0)) goto usage; }
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--plot")) o->plot = v;
        else goto usage;
        if (end && *end) goto usage;
    }
    return 0;
usage:
    print_usage(stderr, argv[0]);
    return -1;
}

int main(int argc, char **argv) {
    options opt;
    int rc = parse_args(argc, argv, &opt);
    if (rc != 0) return rc > 0 ? 0 : 2;
    if (opt.plot && plot_check(opt.plot) != 0) return 1;

    rc = 1;
    tg_error err = { { 0 } };
    tg_train *t = NULL;
    plot_history hist = { 0 };
    tg_model *m = tg_model_new(42);
    if (!m) { fprintf(stderr, "sin: out of memory\n"); return 1; }
    /* tanh layers start from N(0, 1/fan_in) weights (Kaiming with gain 1), not the default 0.02. */
    tg_linear_opts init = { .init = tg_init_kaiming(1.0), .has_init = 1 };
    mlp net = { tg_linear_new(m, "l1", 1, HIDDEN, &init), tg_linear_new(m, "l2", HIDDEN, HIDDEN, &init),
                tg_linear_new(m, "l3", HIDDEN, 1, &init) };
    if (tg_model_error(m)) { fprintf(stderr, "sin: model: %s\n", tg_model_error(m)); goto out; }

    tg_optimizer adam = tg_adam(opt.lr);
    adam.lr = tg_lr_cosine(opt.lr, 0, opt.steps);   /* decayed to 0 along a cosine over the run */
    t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss_fn, .ctx = &net,
        .inputs = (tg_input_decl[]){ TG_F32("x", BATCH, 1), TG_F32("y", BATCH, 1) }, .n_inputs = 2,
        .optimizer = adam, .backend = opt.backend }, &err);
    if (!t) { fprintf(stderr, "sin: tg_compile: %s\n", err.msg); goto out; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = predict_fn, .ctx = &net,
        .inputs = (tg_input_decl[]){ TG_F32("x", GRID, 1) }, .n_inputs = 1 }, &err);
    if (!f) { fprintf(stderr, "sin: tg_attach: %s\n", err.msg); goto out; }

    printf("sin: MLP 1-%d-%d-1 tanh, MSE, adam lr %g cosine to 0, batch %d, %d steps, backend %s\n",
           HIDDEN, HIDDEN, opt.lr, BATCH, opt.steps, opt.backend ? opt.backend : "default");

    static float xb[BATCH], yb[BATCH];
    uint64_t rng = 1;
    int every = opt.steps >= 20 ? opt.steps / 20 : 1;   /* about 20 progress lines */
    double t0 = now_s(), sum = 0;
    for (int step = 1; step <= opt.steps; step++) {
        for (int i = 0; i < BATCH; i++) {
            xb[i] = (float)(PI * (2 * rng_uniform(&rng) - 1));
            yb[i] = sinf(xb[i]);
        }
        tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xb, BATCH), tg_f32("y", yb, BATCH) }, 2);
        if (r.status != TG_OK) { fprintf(stderr, "sin: tg_step: %s\n", r.error); goto out; }
        if (opt.plot && plot_add(&hist, step, r.loss, NAN) != 0) { fprintf(stderr, "sin: out of memory\n"); goto out; }
        sum += r.loss;
        if (step % every == 0 || step == opt.steps) {
            int n = step % every ? step % every : every;   /* steps since the last line */
            double elapsed = now_s() - t0;
            printf("step %5d/%d  loss %.3e  %6.0f steps/s  elapsed %6.2fs  eta %6.2fs\n", step, opt.steps, sum / n,
                   step / elapsed, elapsed, elapsed / step * (opt.steps - step));
            fflush(stdout);
            sum = 0;
        }
    }

    /* The trained net on an even grid, through the attached forward graph. */
    static float xg[GRID];
    for (int i = 0; i < GRID; i++) xg[i] = (float)(-PI + 2 * PI * i / (GRID - 1));
    tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", xg, GRID) }, 1);
    if (r.status != TG_OK) { fprintf(stderr, "sin: tg_run: %s\n", r.error); goto out; }
    if (!r.output || r.output_len != GRID) { fprintf(stderr, "sin: tg_run: expected %d outputs, got %zu\n", GRID, r.output_len); goto out; }
    printf("\n        x     sin(x)       pred\n");
    double max_err = 0, worst_x = 0;
    for (int i = 0; i < GRID; i++) {
        double e = fabs(r.output[i] - sin(xg[i]));
        if (isnan(e) || e > max_err) { max_err = e; worst_x = xg[i]; }   /* a NaN, once seen, stays */
        if (i % 25 == 0) printf("  %7.4f  %9.6f  %9.6f\n", xg[i], sin(xg[i]), r.output[i]);
    }
    printf("max abs error %.6f over %d points in [-pi, pi] (at x = %.4f)\n", max_err, GRID, worst_x);
    if (opt.plot && plot_write(&hist, opt.plot, "sin: MLP 1-64-64-1, MSE per step", 1) != 0) goto out;
    rc = 0;

out:
    if (t) tg_destroy(t);   /* also frees the attached forward graph */
    tg_model_free(m);
    plot_free(&hist);
    return rc;
}
