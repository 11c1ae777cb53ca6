/* digits: train a 64-128-10 MLP on 8x8 handwritten digits with tensorgrad.
 *
 *   make build/examples/digits && build/examples/digits
 *
 * Options: --epochs N (30)  --lr X (1e-3)  --data PATH (data/digits.csv.gz)
 *          --backend NAME (library default)  --min-acc X (exit 1 if test accuracy < X)
 *          --precision f32|tf32|bf16 (f32; see tg_precision)
 *          --cnn (a small convolutional net instead of the MLP)  --save CKPT (safetensors)
 *          --plot PREFIX (the loss per epoch as PREFIX.csv and PREFIX.svg)
 *          --export DIR (the trained model as DIR/digits_model.c and .h, plain C that needs only
 *          libm, and the test rows as DIR/digits_test.csv for examples/classify.c)
 *
 * The data (UCI Optical Recognition of Handwritten Digits, CC BY 4.0, see data/README.md) is a
 * gzipped CSV: 64 pixels 0..16 then the label 0..9 on each line. Pixels are scaled by 1/16, the
 * rows are shuffled with a fixed seed and 20% are held out as the test set.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "plot.h"
#include "util.h"
#include "tensorgrad.h"

#define N_PIXELS 64
#define N_HIDDEN 128
#define N_CLASSES 10
#define BATCH 64

/* ---------------------------------------------------------------------------------------------
 * Data: rows of N_PIXELS floats in x, labels in y.
 * ------------------------------------------------------------------------------------------- */

typedef struct { float *x; int32_t *y; int n; } dataset;

static void dataset_free(dataset *d) { free(d->x); free(d->y); d->x = NULL; d->y = NULL; d->n = 0; }

/* Parses one CSV line of 64 pixels and a label. Returns 0 on success. */
static int parse_row(char *line, float *x, int32_t *y) {
    char *p = line, *end;
    for (int i = 0; i <= N_PIXELS; i++) {
        long v = strtol(p, &end, 10);
        if (end == p) return -1;
        if (i < N_PIXELS) {
            if (v < 0 || v > 16) return -1;
            x[i] = (float)v / 16.0f;
        } else {
            if (v < 0 || v >= N_CLASSES) return -1;
            *y = (int32_t)v;
        }
        p = end;
        if (i < N_PIXELS && *p++ != ',') return -1;
    }
    while (*p == ' ' || *p == '\r' || *p == '\n') p++;
    return *p == '\0' ? 0 : -1;
}

static int load_digits(const char *path, dataset *d) {
    gzFile f = gzopen(path, "rb");
    if (!f) { fprintf(stderr, "digits: cannot open %s\n", path); return -1; }
    char line[1024];
    int cap = 0, lineno = 0;
    *d = (dataset){ 0 };
    while (gzgets(f, line, sizeof line)) {
        lineno++;
        if (line[0] == '\n' || line[0] == '\0') continue;
        if (d->n == cap) {
            cap = cap ? 2 * cap : 1024;
            float *x = realloc(d->x, (size_t)cap * N_PIXELS * sizeof *x);
            if (x) d->x = x;
            int32_t *y = realloc(d->y, (size_t)cap * sizeof *y);
            if (y) d->y = y;
            if (!x || !y) { fprintf(stderr, "digits: out of memory\n"); goto fail; }
        }
        if (parse_row(line, d->x + (size_t)d->n * N_PIXELS, d->y + d->n) != 0) {
            fprintf(stderr, "digits: %s:%d: expected 64 pixels 0..16 and a label 0..9\n", path, lineno);
            goto fail;
        }
        d->n++;
    }
    int errnum;
    const char *msg = gzerror(f, &errnum);
    if (errnum != Z_OK && errnum != Z_STREAM_END) { fprintf(stderr, "digits: %s: %s\n", path, msg); goto fail; }
    gzclose(f);
    return 0;
fail:
    gzclose(f);
    dataset_free(d);
    return -1;
}

static void shuffle(int *idx, int n, uint64_t *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
        int tmp = idx[i]; idx[i] = idx[j]; idx[j] = tmp;
    }
}

/* Copies rows idx[0..n) of src into x, y (x: n * N_PIXELS floats). */
static void gather(const dataset *src, const int *idx, int n, float *x, int32_t *y) {
    for (int i = 0; i < n; i++) {
        memcpy(x + (size_t)i * N_PIXELS, src->x + (size_t)idx[i] * N_PIXELS, N_PIXELS * sizeof *x);
        y[i] = src->y[idx[i]];
    }
}

static int subset(const dataset *src, const int *idx, int n, dataset *dst) {
    dst->x = malloc((size_t)n * N_PIXELS * sizeof *dst->x);
    dst->y = malloc((size_t)n * sizeof *dst->y);
    dst->n = n;
    if (!dst->x || !dst->y) { dataset_free(dst); return -1; }
    gather(src, idx, n, dst->x, dst->y);
    return 0;
}

/* Shuffles all rows with a fixed seed; the first 20% (rounded up: 360 of 1797) are the test set. */
static int split(const dataset *all, dataset *train, dataset *test) {
    int *idx = malloc((size_t)all->n * sizeof *idx);
    if (!idx) return -1;
    for (int i = 0; i < all->n; i++) idx[i] = i;
    uint64_t rng = 1234;
    shuffle(idx, all->n, &rng);
    int n_test = (all->n + 4) / 5;
    int rc = subset(all, idx, n_test, test);
    if (rc == 0 && (rc = subset(all, idx + n_test, all->n - n_test, train)) != 0) dataset_free(test);
    free(idx);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Model: logits = relu(x W1 + b1) W2 + b2.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    int cnn;
    tg_linear l1, l2;              /* the MLP */
    tg_conv2d_layer c1, c2;        /* the CNN: two 3x3 convolutions, pooling, then l2 */
} net;

static net make_net(tg_model *m, int cnn) {
    net n = { .cnn = cnn };
    if (cnn) {
        n.c1 = tg_conv2d_new(m, "c1", 1, 16, 3, 1, 1, 1);
        n.c2 = tg_conv2d_new(m, "c2", 16, 32, 3, 1, 1, 1);
        n.l2 = tg_linear_new(m, "l2", 32 * 2 * 2, N_CLASSES, NULL);
    } else {
        n.l1 = tg_linear_new(m, "l1", N_PIXELS, N_HIDDEN, NULL);
        n.l2 = tg_linear_new(m, "l2", N_HIDDEN, N_CLASSES, NULL);
    }
    return n;
}

static tg_tensor logits(const net *n, tg_tensor x) {
    if (!n->cnn) return tg_linear(&n->l2, tg_relu(tg_linear(&n->l1, x)));
    tg_shape s = tg_shape_of(x);
    x = tg_reshape(x, s.d[0], 1, 8, 8);                                   /* [B, 1, 8, 8] */
    x = tg_max_pool2d(tg_relu(tg_conv(&n->c1, x)), 2, 2, 0);              /* [B, 16, 4, 4] */
    x = tg_max_pool2d(tg_relu(tg_conv(&n->c2, x)), 2, 2, 0);              /* [B, 32, 2, 2] */
    return tg_linear(&n->l2, tg_flatten(x, 1));
}

/* Forward functions: ctx is the net, in[0] the pixels, in[1] the labels. */
static tg_tensor loss_fn(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(logits(ctx, in[0]), in[1], TG_MEAN);
}

static tg_tensor logits_fn(const void *ctx, const tg_tensor *in) {
    return logits(ctx, in[0]);
}

/* One pass over the training rows in a fresh order, full batches only; *mean_loss gets the mean
 * of the step losses. Returns 0, or -1 after printing the error of a failed step. */
static int train_epoch(tg_train *t, const dataset *train, int *order, uint64_t *rng, double *mean_loss) {
    static float xb[BATCH * N_PIXELS];
    static int32_t yb[BATCH];
    int n_batches = train->n / BATCH;
    double sum = 0;
    shuffle(order, train->n, rng);
    for (int b = 0; b < n_batches; b++) {
        gather(train, order + b * BATCH, BATCH, xb, yb);
        tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xb, BATCH * N_PIXELS), tg_i32("y", yb, BATCH) }, 2);
        if (r.status != TG_OK) { fprintf(stderr, "digits: tg_step: %s\n", r.error); return -1; }
        sum += r.loss;
    }
    *mean_loss = sum / n_batches;
    return 0;
}

/* Runs the forward graph over the whole test set and fills confusion[true][predicted].
 * Returns the accuracy, or -1 after printing an error. */
static double evaluate(tg_forward *f, const dataset *test, int confusion[N_CLASSES][N_CLASSES]) {
    tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", test->x, (size_t)test->n * N_PIXELS) }, 1);
    if (r.status != TG_OK) { fprintf(stderr, "digits: tg_run: %s\n", r.error); return -1; }
    if (!r.output || r.output_len != (size_t)test->n * N_CLASSES) {
        fprintf(stderr, "digits: tg_run: expected %d logits, got %zu\n", test->n * N_CLASSES, r.output_len);
        return -1;
    }
    memset(confusion, 0, sizeof(int[N_CLASSES][N_CLASSES]));
    int correct = 0;
    for (int i = 0; i < test->n; i++) {
        const float *logits = r.output + (size_t)i * N_CLASSES;
        int pred = 0;
        for (int c = 1; c < N_CLASSES; c++) if (logits[c] > logits[pred]) pred = c;
        confusion[test->y[i]][pred]++;
        correct += pred == test->y[i];
    }
    return (double)correct / test->n;
}

static void print_confusion(int confusion[N_CLASSES][N_CLASSES]) {
    printf("confusion matrix (rows: true digit, columns: predicted)\n     ");
    for (int c = 0; c < N_CLASSES; c++) printf("%4d", c);
    printf("\n");
    for (int t = 0; t < N_CLASSES; t++) {
        printf("  %d: ", t);
        for (int c = 0; c < N_CLASSES; c++) printf("%4d", confusion[t][c]);
        printf("\n");
    }
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------------
 * Export: the trained model as one C file, for a program that links nothing but it.
 * ------------------------------------------------------------------------------------------- */

/* The test rows as CSV, in the data set's own form (pixels 0..16, then the label). */
static int write_csv(const dataset *d, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "digits: cannot write %s\n", path); return -1; }
    for (int i = 0; i < d->n; i++) {
        for (int k = 0; k < N_PIXELS; k++) fprintf(f, "%d,", (int)lround(d->x[(size_t)i * N_PIXELS + k] * 16));
        fprintf(f, "%d\n", d->y[i]);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* Writes DIR/digits_model.c (.h) from a batch-1 forward, prints its size, and the time tg_run
 * takes per sample one row at a time (classify prints the exported file's). Returns 0 or -1. */
static int export_model(tg_train *t, const net *model, const dataset *test, const char *dir) {
    char path[4096], header[4096], csv[4096];
    snprintf(path, sizeof path, "%s/digits_model.c", dir);
    snprintf(header, sizeof header, "%s/digits_model.h", dir);
    snprintf(csv, sizeof csv, "%s/digits_test.csv", dir);
    tg_error err;
    tg_forward *one = tg_attach(t, &(tg_forward_spec){ .forward = logits_fn, .ctx = model,
        .inputs = (tg_input_decl[]){ TG_F32("x", 1, N_PIXELS) }, .n_inputs = 1 }, &err);
    if (!one) { fprintf(stderr, "digits: tg_attach: %s\n", err.msg); return -1; }
    if (tg_export_c(one, path, &(tg_export_opts){ .prefix = "digits", .header_path = header }, &err) != TG_OK) {
        fprintf(stderr, "digits: %s\n", err.msg);
        return -1;
    }
    if (write_csv(test, csv) != 0) return -1;
    double t0 = now_s();
    for (int i = 0; i < test->n; i++) {
        tg_result r = tg_run(one, (tg_data[]){ tg_f32("x", test->x + (size_t)i * N_PIXELS, N_PIXELS) }, 1);
        if (r.status != TG_OK) { fprintf(stderr, "digits: tg_run: %s\n", r.error); return -1; }
    }
    double per_sample = (now_s() - t0) / test->n;
    FILE *f = fopen(path, "rb");
    long size = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (f) fclose(f);
    printf("exported %s (%ld bytes) and %s, the test rows as %s\n", path, size, header, csv);
    printf("tg_run, one row at a time: %.2f us per sample\n", 1e6 * per_sample);
    return 0;
}

typedef struct {
    int epochs, cnn;
    double lr, min_acc;
    const char *data, *backend, *save, *plot, *export_dir;
    tg_precision precision;
} options;

static void print_usage(FILE *out, const char *prog) {
    fprintf(out, "usage: %s [--epochs N] [--lr X] [--data PATH] [--backend NAME] [--min-acc X] [--cnn]\n"
                 "       [--save CKPT] [--plot PREFIX] [--export DIR] [--precision f32|tf32|bf16]\n", prog);
}

/* Returns 0 to run, 1 after printing --help, -1 after printing the usage for a bad argument. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){ .epochs = 30, .lr = 1e-3, .min_acc = 0, .data = "data/digits.csv.gz", .backend = NULL };
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { print_usage(stdout, argv[0]); return 1; }
        if (!strcmp(a, "--cnn")) { o->cnn = 1; i--; continue; }   /* a flag: no value */
        if (!v) goto usage;
        if (!strcmp(a, "--epochs")) { o->epochs = (int)strtol(v, &end, 10); if (o->epochs < 1) goto usage; }
        else if (!strcmp(a, "--lr")) { o->lr = strtod(v, &end); if (!(o->lr > 0)) goto usage; }
        else if (!strcmp(a, "--min-acc")) o->min_acc = strtod(v, &end);
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--save")) o->save = v;
        else if (!strcmp(a, "--plot")) o->plot = v;
        else if (!strcmp(a, "--precision")) { if (!(o->precision = parse_precision(v))) goto usage; }
        else if (!strcmp(a, "--export")) o->export_dir = v;
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

    dataset all, train = { 0 }, test = { 0 };
    if (load_digits(opt.data, &all) != 0) return 1;
    rc = split(&all, &train, &test);
    dataset_free(&all);
    if (rc != 0 || train.n < BATCH) { fprintf(stderr, "digits: too few rows or out of memory\n"); return 1; }

    rc = 1;
    plot_history hist = { 0 };
    tg_error err = { { 0 } };
    tg_train *t = NULL;
    int *order = malloc((size_t)train.n * sizeof *order);
    tg_model *m = tg_model_new(42);
    if (!order || !m) { fprintf(stderr, "digits: out of memory\n"); goto out; }
    net model = make_net(m, opt.cnn);
    if (tg_model_error(m)) { fprintf(stderr, "digits: model: %s\n", tg_model_error(m)); goto out; }

    t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss_fn, .ctx = &model,
        .inputs = (tg_input_decl[]){ TG_F32("x", BATCH, N_PIXELS), TG_I32("y", BATCH) }, .n_inputs = 2,
        .optimizer = tg_adam(opt.lr), .backend = opt.backend, .precision = opt.precision }, &err);
    if (!t) { fprintf(stderr, "digits: tg_compile: %s\n", err.msg); goto out; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = logits_fn, .ctx = &model,
        .inputs = (tg_input_decl[]){ TG_F32("x", test.n, N_PIXELS) }, .n_inputs = 1 }, &err);
    if (!f) { fprintf(stderr, "digits: tg_attach: %s\n", err.msg); goto out; }

    printf("digits: %d train / %d test rows, %s (%ld parameters), adam lr %g, batch %d, backend %s, %s\n", train.n, test.n,
           opt.cnn ? "CNN conv3x3(16)-pool-conv3x3(32)-pool-linear" : "MLP 64-128-10", (long)tg_train_param_total(t), opt.lr, BATCH,
           opt.backend ? opt.backend : "default", tg_precision_name(tg_train_precision(t)));

    uint64_t rng = 42;
    for (int i = 0; i < train.n; i++) order[i] = i;
    if (opt.plot && plot_check(opt.plot) != 0) goto out;
    double t0 = now_s();
    for (int epoch = 1; epoch <= opt.epochs; epoch++) {
        double loss;
        if (train_epoch(t, &train, order, &rng, &loss) != 0) goto out;
        double elapsed = now_s() - t0;
        printf("epoch %3d/%d  loss %.4f  %6.0f steps/s  elapsed %6.2fs  eta %6.2fs\n", epoch, opt.epochs, loss,
               epoch * (train.n / BATCH) / elapsed, elapsed, elapsed / epoch * (opt.epochs - epoch));
        fflush(stdout);
        if (opt.plot && plot_add(&hist, epoch, loss, NAN) != 0) { fprintf(stderr, "digits: out of memory\n"); goto out; }
    }
    if (opt.plot && plot_write(&hist, opt.plot, "digits: mean training loss per epoch", 1) != 0) goto out;
    if (opt.save && tg_save(t, opt.save, 1, &err) != TG_OK) { fprintf(stderr, "digits: %s\n", err.msg); goto out; }

    int confusion[N_CLASSES][N_CLASSES];
    double acc = evaluate(f, &test, confusion);
    if (acc < 0) goto out;
    printf("test accuracy %.2f%% (%d/%d)\n", 100 * acc, (int)lround(acc * test.n), test.n);
    print_confusion(confusion);
    if (opt.export_dir && export_model(t, &model, &test, opt.export_dir) != 0) goto out;
    if (acc < opt.min_acc) fprintf(stderr, "digits: test accuracy %.4f is below --min-acc %.4f\n", acc, opt.min_acc);
    else rc = 0;

out:
    plot_free(&hist);
    if (t) tg_destroy(t);   /* also frees the attached forward graph */
    if (m) tg_model_free(m);
    free(order);
    dataset_free(&train);
    dataset_free(&test);
    return rc;
}
