/* The training session API beyond a single step: forwards with open dimensions (variants per
 * size, LRU), captures, activation patching, replacing the model, live-handle checks, threads,
 * async calls, several steps per call, single flight and kernel-source inspection. Each runs on
 * the reference interpreter and the compiled CPU backend (TG_SESSION_BACKENDS overrides:
 * "reference" alone under ThreadSanitizer, whose runtime does not see inside OpenMP).
 *
 * Expected values are computed here in double from downloaded parameters; the library computes
 * in f32, so they agree to 1e-5 relative to the magnitudes involved. */
#include "tensorgrad.h"
#include "check.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN = 5, HID = 7, OUT = 3, B = 4 };

static const char *backend;
static tg_error err;

/* A two-layer MLP: h = relu(x W1 + b1) (a capture and a patch site), y = h W2 + b2. */
typedef struct { tg_linear l1, l2; } mlp;

static tg_tensor mlp_out(const mlp *n, tg_tensor x) {
    tg_tensor h = tg_capture("h", tg_relu(tg_linear(&n->l1, x)));
    return tg_linear(&n->l2, tg_patch("h", h));
}
static tg_tensor mlp_forward(const void *ctx, const tg_tensor *in) { return mlp_out(ctx, in[0]); }
static tg_tensor mlp_loss(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(mlp_out(ctx, in[0]), in[1], TG_MEAN);
}
/* The same forward with no capture and no patch site. */
static tg_tensor mlp_plain(const void *ctx, const tg_tensor *in) {
    const mlp *n = ctx;
    return tg_linear(&n->l2, tg_relu(tg_linear(&n->l1, in[0])));
}

static tg_model *mlp_model(mlp *n, uint64_t seed, int hid) {
    tg_model *m = tg_model_new(seed);
    tg_linear_opts o = { .init = tg_init_randn(0.5), .has_init = 1 };
    n->l1 = tg_linear_new(m, "l1", IN, hid, &o);
    n->l2 = tg_linear_new(m, "l2", hid, OUT, &o);
    return m;
}

static const tg_input_decl TRAIN_IN[] = { TG_F32("x", B, IN), TG_I32("y", B) };

static tg_train *mlp_train(mlp *n, tg_model *m) {
    err.msg[0] = 0;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .ctx = n, .inputs = TRAIN_IN, .n_inputs = 2,
                                              .optimizer = tg_adam(1e-2), .backend = backend }, &err);
    CHECK(t != NULL, "%s: compile: %s", backend, err.msg);
    return t;
}

static void fill(float *x, int n, double lo, double hi) {
    for (int i = 0; i < n; i++) x[i] = (float)check_uniform(lo, hi);
}

/* The host's copy of the MLP's parameters, to compute expectations. */
typedef struct { int hid; float W1[IN * 16], b1[16], W2[16 * OUT], b2[OUT]; } host_mlp;

static void download_mlp(tg_train *t, host_mlp *p, int hid) {
    p->hid = hid;
    CHECK(tg_download_param(t, "l1.W", p->W1, (size_t)IN * hid, &err) == TG_OK &&
          tg_download_param(t, "l1.b", p->b1, (size_t)hid, &err) == TG_OK &&
          tg_download_param(t, "l2.W", p->W2, (size_t)hid * OUT, &err) == TG_OK &&
          tg_download_param(t, "l2.b", p->b2, OUT, &err) == TG_OK, "download: %s", err.msg);
}

static void host_hidden(const host_mlp *p, const float *x, double *h) {
    for (int j = 0; j < p->hid; j++) {
        double a = p->b1[j];
        for (int k = 0; k < IN; k++) a += (double)x[k] * p->W1[k * p->hid + j];
        h[j] = a > 0 ? a : 0;
    }
}

static void host_out(const host_mlp *p, const double *h, double *y) {
    for (int o = 0; o < OUT; o++) {
        double a = p->b2[o];
        for (int j = 0; j < p->hid; j++) a += h[j] * p->W2[j * OUT + o];
        y[o] = a;
    }
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-5 * fmax(1.0, fmax(fabs(a), fabs(b))); }

/* Output rows [rows, OUT] against y computed on the host from each row's hidden values. */
static int out_mismatches(const float *got, const double *h_rows, const host_mlp *p, int rows) {
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        double y[OUT];
        host_out(p, h_rows + r * p->hid, y);
        for (int o = 0; o < OUT; o++) bad += !near(got[r * OUT + o], y[o]);
    }
    return bad;
}

/* ----- open dimensions ----- */

static void test_open_batch(void) {
    mlp n;
    tg_model *m = mlp_model(&n, 11, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    const tg_input_decl open_in[] = { TG_F32("x", TG_ANY, IN) };
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = open_in, .n_inputs = 1,
                                                     .max_variants = 2 }, &err);
    CHECK(f != NULL, "%s: attach with an open dimension: %s", backend, err.msg);
    if (!f) { tg_destroy(t); tg_model_free(m); return; }
    CHECK(tg_forward_n_variants(f) == 0 && tg_forward_graph(f) == NULL, "an open forward compiles at its first call");
    host_mlp p;
    download_mlp(t, &p, HID);
    float x[7 * IN];
    fill(x, 7 * IN, -1, 1);
    double h[7 * HID];
    for (int r = 0; r < 7; r++) host_hidden(&p, x + r * IN, h + r * HID);
    const int sizes[] = { 1, 3, 3, 7, 3, 1 };
    const int variants_after[] = { 1, 2, 2, 2, 2, 2 };
    const tg_graph *g3 = NULL;
    for (int k = 0; k < 6; k++) {
        tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", x, (size_t)sizes[k] * IN) }, 1);
        CHECK(r.status == TG_OK && r.output_shape.ndim == 2 && r.output_shape.d[0] == sizes[k] && r.output_len == (size_t)sizes[k] * OUT,
              "%s: run with batch %d: %s", backend, sizes[k], r.error);
        if (r.status == TG_OK) CHECK(out_mismatches(r.output, h, &p, sizes[k]) == 0, "%s: batch %d values", backend, sizes[k]);
        CHECK(tg_forward_n_variants(f) == variants_after[k], "%s: %d variants after call %d (LRU of 2)", backend,
              tg_forward_n_variants(f), k);
        if (k == 1) g3 = tg_forward_graph(f);
        if (k == 2) CHECK(tg_forward_graph(f) == g3, "the second call of a size reuses its variant");
    }
    /* Errors at the call: a count that fits no size, and open dimensions that disagree. */
    tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", x, 2 * IN + 1) }, 1);
    CHECK(r.status == TG_FAILED && strstr(r.error, "do not fill"), "indivisible count: %s", r.error);
    r = tg_run(f, (tg_data[]){ tg_f32("x", x, 0) }, 1);
    CHECK(r.status == TG_FAILED && strstr(r.error, "positive"), "zero rows: %s", r.error);
    const tg_input_decl two_in[] = { TG_F32("x", TG_ANY, IN), TG_F32("w", TG_ANY) };
    tg_forward *f2 = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = two_in, .n_inputs = 2 }, &err);
    r = tg_run(f2, (tg_data[]){ tg_f32("x", x, 3 * IN), tg_f32("w", x, 4) }, 2);
    CHECK(r.status == TG_FAILED && strstr(r.error, "disagree") && strstr(r.error, "'w' gives 4"), "disagreeing dims: %s", r.error);
    r = tg_run(f2, (tg_data[]){ tg_f32("x", x, 3 * IN), tg_f32("w", x, 3) }, 2);
    CHECK(r.status == TG_OK && r.output_shape.d[0] == 3, "agreeing dims: %s", r.error);
    /* A training step is visible to every variant. */
    int32_t y[B] = { 0, 1, 2, 1 };
    CHECK(tg_step(t, (tg_data[]){ tg_f32("x", x, B * IN), tg_i32("y", y, B) }, 2).status == TG_OK, "step");
    download_mlp(t, &p, HID);
    for (int r2 = 0; r2 < 7; r2++) host_hidden(&p, x + r2 * IN, h + r2 * HID);
    r = tg_run(f, (tg_data[]){ tg_f32("x", x, 3 * IN) }, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, h, &p, 3) == 0, "%s: a cached variant sees the step", backend);
    tg_destroy(t);
    tg_model_free(m);
}

/* ----- captures ----- */

static void test_captures(void) {
    mlp n;
    tg_model *m = mlp_model(&n, 12, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    host_mlp p;
    download_mlp(t, &p, HID);
    float x[B * IN];
    int32_t y[B] = { 2, 0, 1, 1 };
    fill(x, B * IN, -1, 1);
    double h[B * HID];
    for (int r = 0; r < B; r++) host_hidden(&p, x + r * IN, h + r * HID);
    tg_shape shape;
    CHECK(tg_step(t, (tg_data[]){ tg_f32("x", x, B * IN), tg_i32("y", y, B) }, 2).status == TG_OK, "step");
    float got[B * HID];
    CHECK(tg_train_capture(t, "h", got, B * HID, &shape, &err) == TG_OK && shape.ndim == 2 && shape.d[0] == B &&
          shape.d[1] == HID, "%s: train capture: %s", backend, err.msg);
    int bad = 0;
    for (int i = 0; i < B * HID; i++) bad += !near(got[i], h[i]);
    CHECK(bad == 0, "%s: the step's capture holds the forward's values (before the update): %d differ", backend, bad);
    CHECK(tg_train_capture(t, "nope", got, B * HID, NULL, &err) == TG_FAILED && strstr(err.msg, "no capture named 'nope'"),
          "unknown capture: %s", err.msg);
    CHECK(tg_train_capture(t, "h", got, 3, NULL, &err) == TG_FAILED && strstr(err.msg, "elements"), "wrong count: %s", err.msg);
    CHECK(tg_train_capture(t, "h", NULL, 0, &shape, &err) == TG_OK && shape.d[1] == HID, "shape only");

    /* A forward's captures, and a capture adds no node: it only keeps a value readable. */
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    tg_forward *plain = tg_attach(t, &(tg_forward_spec){ .forward = mlp_plain, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    CHECK(f && plain, "attach: %s", err.msg);
    if (f && plain) {
        CHECK(tg_graph_n_nodes(tg_forward_graph(f)) == tg_graph_n_nodes(tg_forward_graph(plain)),
              "captures and inactive patch sites add no node (%d vs %d)", tg_graph_n_nodes(tg_forward_graph(f)),
              tg_graph_n_nodes(tg_forward_graph(plain)));
        int node = -1;
        CHECK(tg_graph_n_captures(tg_forward_graph(f)) == 1 && strcmp(tg_graph_capture(tg_forward_graph(f), 0, &node), "h") == 0 &&
              node >= 0 && tg_graph_n_captures(tg_forward_graph(plain)) == 0, "capture listed in the graph");
        CHECK(tg_forward_capture(f, "h", got, B * HID, NULL, &err) == TG_OK, "a forward's capture is readable before a run too (stale values): %s", err.msg);
        download_mlp(t, &p, HID);
        for (int r = 0; r < B; r++) host_hidden(&p, x + r * IN, h + r * HID);
        tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", x, B * IN) }, 1);
        CHECK(r.status == TG_OK && tg_forward_capture(f, "h", got, B * HID, NULL, &err) == TG_OK, "run + capture: %s", err.msg);
        bad = 0;
        for (int i = 0; i < B * HID; i++) bad += !near(got[i], h[i]);
        CHECK(bad == 0, "%s: forward capture values: %d differ", backend, bad);
    }
    tg_destroy(t);
    tg_model_free(m);
}

/* Attention maps [B, H, T, T]: captured, then split by head. */
typedef struct { int heads; } att_ctx;
static tg_tensor attention(const void *ctx, const tg_tensor *in) {
    const att_ctx *a = ctx;
    tg_tensor q = tg_split_heads(in[0], a->heads);
    tg_tensor att = tg_capture("att", tg_softmax_causal(tg_matmul(q, tg_swapaxes(q, -1, -2))));
    return tg_merge_heads(tg_matmul(att, q));
}

static void test_capture_heads(void) {
    enum { BB = 2, H = 3, T = 4, D = 2 };
    mlp n;
    tg_model *m = mlp_model(&n, 21, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    att_ctx a = { H };
    const tg_input_decl in[] = { TG_F32("x", BB, T, H * D) };
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = attention, .ctx = &a, .inputs = in, .n_inputs = 1 }, &err);
    float x[BB * T * H * D], att[BB * H * T * T], head[BB * T * T];
    fill(x, BB * T * H * D, -1, 1);
    tg_shape shape, hs;
    tg_result r = f ? tg_run(f, (tg_data[]){ tg_f32("x", x, BB * T * H * D) }, 1) : (tg_result){ .status = TG_FAILED };
    CHECK(r.status == TG_OK && tg_forward_capture(f, "att", att, BB * H * T * T, &shape, &err) == TG_OK && shape.ndim == 4 &&
          shape.d[1] == H, "%s: attention capture: %s %s", backend, r.error, err.msg);
    /* Head 1 of batch element 1, by hand: softmax over keys <= query of q.k. */
    CHECK(tg_capture_head(att, shape, 1, head, BB * T * T, &hs, &err) == TG_OK && hs.ndim == 3 && hs.d[0] == BB && hs.d[1] == T &&
          hs.d[2] == T, "capture_head: %s", err.msg);
    int bad = 0;
    for (int i = 0; i < T; i++) {
        double s[T], z = 0, mx = -1e300;
        for (int j = 0; j <= i; j++) {
            s[j] = 0;
            for (int d = 0; d < D; d++) s[j] += (double)x[(T + i) * H * D + D + d] * x[(T + j) * H * D + D + d];
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j <= i; j++) z += exp(s[j] - mx);
        for (int j = 0; j < T; j++) bad += !near(head[T * T + i * T + j], j <= i ? exp(s[j] - mx) / z : 0.0);
    }
    CHECK(bad == 0, "%s: head 1 of the captured attention matches the hand computation (%d differ)", backend, bad);
    CHECK(tg_capture_head(att, shape, H, head, BB * T * T, &hs, &err) == TG_FAILED && strstr(err.msg, "head 3 of 3"),
          "head out of range: %s", err.msg);
    CHECK(tg_capture_head(att, TG_SHAPE(BB, T), 0, head, 1, &hs, &err) == TG_FAILED, "rank 2 refused");
    CHECK(tg_capture_head(att, shape, 0, head, 5, &hs, &err) == TG_FAILED, "wrong count refused");
    tg_destroy(t);
    tg_model_free(m);
}

/* ----- patching ----- */

static void test_patching(void) {
    mlp n;
    tg_model *m = mlp_model(&n, 13, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    tg_forward *plain = tg_attach(t, &(tg_forward_spec){ .forward = mlp_plain, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    if (!f || !plain) { CHECK(0, "attach: %s", err.msg); tg_destroy(t); tg_model_free(m); return; }
    const char *src_f = tg_forward_kernel_source(f), *src_plain = tg_forward_kernel_source(plain);
    if (strcmp(backend, "reference") == 0) CHECK(src_f == NULL, "the reference interpreter has no kernels");
    else CHECK(src_f && src_plain && strcmp(src_f, src_plain) == 0,
               "a capture of a value in memory anyway and an inactive patch site cost nothing: identical kernels");
    host_mlp p;
    download_mlp(t, &p, HID);
    float x[B * IN], x2[B * IN];
    fill(x, B * IN, -1, 1);
    fill(x2, B * IN, -1, 1);
    double h[B * HID], h2[B * HID];
    for (int r = 0; r < B; r++) {
        host_hidden(&p, x + r * IN, h + r * HID);
        host_hidden(&p, x2 + r * IN, h2 + r * HID);
    }
    tg_data in = tg_f32("x", x, B * IN);
    tg_result r = tg_run(f, &in, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, h, &p, B) == 0 && tg_forward_n_variants(f) == 1,
          "%s: no patch set: the plain variant, values unchanged", backend);

    /* Zero-ablation of the whole site: y = b2, by hand. */
    CHECK(tg_patch_set(f, "h", TG_PATCH_ZERO, NULL, 0, &err) == TG_OK, "patch zero: %s", err.msg);
    double zeros[B * HID] = { 0 };
    r = tg_run(f, &in, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, zeros, &p, B) == 0, "%s: zero-ablation gives b2: %s", backend, r.error);
    CHECK(tg_forward_n_variants(f) == 2, "a patchable variant beside the plain one");
    /* Ablating hidden unit 2 only (VALUES), against the hand computation. */
    float hv[B * HID];
    double ablated[B * HID];
    for (int i = 0; i < B * HID; i++) ablated[i] = i % HID == 2 ? 0 : h[i];
    for (int i = 0; i < B * HID; i++) hv[i] = (float)ablated[i];
    CHECK(tg_patch_set(f, "h", TG_PATCH_VALUES, hv, B * HID, &err) == TG_OK, "patch values");
    r = tg_run(f, &in, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, ablated, &p, B) == 0, "%s: unit ablation", backend);
    /* The batch mean. */
    double mean[B * HID];
    for (int j = 0; j < HID; j++) {
        double s = 0;
        for (int b = 0; b < B; b++) s += h[b * HID + j];
        for (int b = 0; b < B; b++) mean[b * HID + j] = s / B;
    }
    CHECK(tg_patch_set(f, "h", TG_PATCH_MEAN, NULL, 0, &err) == TG_OK, "patch mean");
    r = tg_run(f, &in, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, mean, &p, B) == 0, "%s: mean-ablation", backend);
    /* Values from another input: the site takes x2's hidden values while running on x. */
    CHECK(tg_patch_from(f, "h", (tg_data[]){ tg_f32("x", x2, B * IN) }, 1, &err) == TG_OK, "patch from: %s", err.msg);
    r = tg_run(f, &in, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, h2, &p, B) == 0, "%s: patched from another input", backend);
    CHECK(tg_forward_n_variants(f) == 2, "changing patches recompiles nothing (%d variants)", tg_forward_n_variants(f));
    /* Off again: the plain values; errors for unknown sites and wrong counts. */
    tg_patch_clear(f);
    r = tg_run(f, &in, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, h, &p, B) == 0, "cleared");
    CHECK(tg_patch_set(f, "nope", TG_PATCH_ZERO, NULL, 0, &err) == TG_OK, "names are checked at the call");
    r = tg_run(f, &in, 1);
    CHECK(r.status == TG_FAILED && strstr(r.error, "no patch site named 'nope'"), "unknown site: %s", r.error);
    tg_patch_clear(f);
    CHECK(tg_patch_set(f, "h", TG_PATCH_VALUES, hv, 5, &err) == TG_OK, "set 5 values");
    r = tg_run(f, &in, 1);
    CHECK(r.status == TG_FAILED && strstr(r.error, "holds 5 values"), "wrong count: %s", r.error);
    CHECK(tg_patch_set(f, "h", TG_PATCH_VALUES, NULL, 5, &err) == TG_FAILED && strstr(err.msg, "no values"), "NULL values");
    CHECK(tg_patch_set(f, "h", (tg_patch_mode)9, NULL, 0, &err) == TG_FAILED && strstr(err.msg, "unknown mode"), "bad mode");
    tg_patch_clear(f);
    CHECK(tg_patch_from(f, "nope", &in, 1, &err) == TG_FAILED && strstr(err.msg, "no patch site"), "patch_from unknown site");
    tg_patch_clear(f);
    tg_detach(plain);
    CHECK(tg_run(plain, &in, 1).status == TG_FAILED, "a detached forward is refused");
    tg_destroy(t);
    tg_model_free(m);
}

/* Five sites in a chain (eleven hyper scalars: more than the optimizer's slots). */
static tg_tensor chain5(const void *ctx, const tg_tensor *in) {
    static const char *names[5] = { "p0", "p1", "p2", "p3", "p4" };
    tg_tensor y = in[0];
    for (int k = 0; k < 5; k++) y = tg_patch(names[k], tg_mul(y, 2.0));
    return y;
}

static void test_many_sites(void) {
    mlp n;
    tg_model *m = mlp_model(&n, 22, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = chain5, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    float x[B * IN], v[B * IN];
    fill(x, B * IN, -1, 1);
    for (int i = 0; i < B * IN; i++) v[i] = (float)i;
    CHECK(f && tg_patch_set(f, "p3", TG_PATCH_VALUES, v, B * IN, &err) == TG_OK, "set p3: %s", err.msg);
    CHECK(tg_patch_set(f, "p1", TG_PATCH_MEAN, NULL, 0, &err) == TG_OK, "set p1");
    tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", x, B * IN) }, 1);
    int bad = r.status != TG_OK;
    for (int i = 0; r.status == TG_OK && i < B * IN; i++) bad += !near(r.output[i], 2.0 * v[i]);   /* p3 = v, then p4 doubles */
    CHECK(bad == 0, "%s: the fourth of five sites replaced: %s", backend, r.error);
    tg_patch_set(f, "p3", TG_PATCH_OFF, NULL, 0, &err);
    r = tg_run(f, (tg_data[]){ tg_f32("x", x, B * IN) }, 1);
    bad = r.status != TG_OK;
    for (int i = 0; r.status == TG_OK && i < B * IN; i++) {   /* p1: the batch mean of 4x, then x8 */
        double mean = 0;
        for (int b = 0; b < B; b++) mean += 4.0 * x[b * IN + i % IN] / B;
        bad += !near(r.output[i], 8.0 * mean);
    }
    CHECK(bad == 0, "%s: the second of five sites takes the batch mean", backend);
    tg_destroy(t);
    tg_model_free(m);
}

/* ----- replacing the model ----- */

static void test_replace(void) {
    mlp n;
    tg_model *m = mlp_model(&n, 14, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    float x[B * IN];
    int32_t y[B] = { 1, 1, 0, 2 };
    fill(x, B * IN, -1, 1);
    tg_data in[2] = { tg_f32("x", x, B * IN), tg_i32("y", y, B) };
    for (int k = 0; k < 3; k++) tg_step(t, in, 2);
    CHECK(tg_train_step_count(t) == 3, "3 steps");
    /* A model that fails to declare (a duplicate name) leaves t as it was. */
    tg_model *broken = tg_model_new(1);
    tg_param_new(broken, "a", TG_SHAPE(2), tg_init_zeros());
    tg_param_new(broken, "a", TG_SHAPE(2), tg_init_zeros());
    CHECK(tg_replace_model(t, broken, NULL, &err) == TG_FAILED && strstr(err.msg, "tg_replace_model"), "broken model: %s", err.msg);
    CHECK(tg_train_step_count(t) == 3 && tg_step(t, in, 2).status == TG_OK, "t unchanged after a failed replace");
    tg_model_free(broken);
    CHECK(tg_replace_model(t, NULL, NULL, &err) == TG_FAILED, "NULL model");

    mlp wide;
    tg_model *m2 = mlp_model(&wide, 15, 11);
    n = wide;   /* the loss and forward functions read the layers through ctx */
    tg_optimizer sgd = tg_sgd(0.05, 0, 0, 0);
    CHECK(tg_replace_model(t, m2, &sgd, &err) == TG_OK, "%s: replace: %s", backend, err.msg);
    CHECK(tg_train_step_count(t) == 0 && fabs(tg_train_lr(t) - 0.05) < 1e-12, "step count reset, new optimizer");
    CHECK(tg_train_n_params(t) == 4 && tg_train_param_shape(t, 0).d[1] == 11 &&
          tg_train_param_total(t) == IN * 11 + 11 + 11 * OUT + OUT && tg_numel(tg_train_param_shape(t, 2)) == 11 * OUT,
          "the new model's parameters");
    host_mlp p;
    download_mlp(t, &p, 11);
    mlp twin_n;
    tg_model *twin_m = mlp_model(&twin_n, 15, 11);   /* same seed: the same initial values */
    float twin_w[IN * 11];
    tg_train *twin = tg_compile(&(tg_train_spec){ .model = twin_m, .loss = mlp_loss, .ctx = &twin_n, .inputs = TRAIN_IN, .n_inputs = 2,
                                                 .optimizer = sgd, .backend = backend }, &err);
    CHECK(twin && tg_download_param(twin, "l1.W", twin_w, IN * 11, &err) == TG_OK && memcmp(twin_w, p.W1, sizeof twin_w) == 0,
          "initialized from the new model's seed");
    /* The attached forward recompiles lazily against the new model. */
    double h[B * 11];
    for (int r = 0; r < B; r++) host_hidden(&p, x + r * IN, h + r * 11);
    tg_result r = tg_run(f, in, 1);
    CHECK(r.status == TG_OK && out_mismatches(r.output, h, &p, B) == 0, "%s: attached forward after replace: %s", backend, r.error);
    tg_result a = tg_step(t, in, 2), b = tg_step(twin, in, 2);
    CHECK(a.status == TG_OK && b.status == TG_OK && a.loss == b.loss && a.step == 1, "stepping the replaced model = a fresh compile");
    tg_destroy(twin);
    tg_destroy(t);
    tg_model_free(twin_m);
    tg_model_free(m2);
    tg_model_free(m);
}

/* ----- destroyed handles, threads, async ----- */

static void test_dead_handles(void) {
    mlp n;
    tg_model *m = mlp_model(&n, 16, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    float x[B * IN] = { 1 };
    tg_destroy(t);
    tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, B * IN) }, 1);
    CHECK(r.status == TG_FAILED && strstr(r.error, "destroyed"), "step on a destroyed handle: %s", r.error);
    r = tg_run(f, (tg_data[]){ tg_f32("x", x, B * IN) }, 1);
    CHECK(r.status == TG_FAILED && strstr(r.error, "destroyed"), "run on a forward of a destroyed handle: %s", r.error);
    CHECK(tg_download_param(t, "l1.b", x, HID, &err) == TG_FAILED && strstr(err.msg, "destroyed"), "download: %s", err.msg);
    CHECK(tg_train_n_params(t) == 0 && tg_train_graph(t) == NULL && tg_step_submit(t, NULL, 0) == NULL, "getters");
    tg_destroy(t);   /* twice: a no-op */
    tg_detach(f);
    tg_model_free(m);
}

typedef struct {
    tg_train *t;
    tg_forward *f;
    const float *x;
    const int32_t *y;
    int iters, ok, bad_output;
    float first_out;
} worker_arg;

static void *stepper(void *p) {
    worker_arg *a = p;
    for (int i = 0; i < a->iters; i++)
        a->ok += tg_step(a->t, (tg_data[]){ tg_f32("x", a->x, B * IN), tg_i32("y", a->y, B) }, 2).status == TG_OK;
    return NULL;
}

static void *previewer(void *p) {
    worker_arg *a = p;
    for (int i = 0; i < a->iters; i++) {
        tg_result r = tg_run(a->f, (tg_data[]){ tg_f32("x", a->x, B * IN) }, 1);
        a->ok += r.status == TG_OK;
        for (size_t k = 0; r.status == TG_OK && k < r.output_len; k++) a->bad_output += !isfinite(r.output[k]);
    }
    return NULL;
}

/* Two threads stepping and two running previews on one handle: every call succeeds, every step
 * counts. (Under ThreadSanitizer this is the data-race test.) */
static void test_threads(void) {
    mlp n;
    tg_model *m = mlp_model(&n, 17, HID);
    tg_train *t = mlp_train(&n, m);
    if (!t) { tg_model_free(m); return; }
    float x[B * IN];
    int32_t y[B] = { 0, 2, 1, 0 };
    fill(x, B * IN, -1, 1);
    worker_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        /* Each preview thread its own forward: a run's output is its handle's buffer. */
        tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
        args[i] = (worker_arg){ t, f, x, y, 25, 0, 0, 0 };
        pthread_create(&th[i], NULL, i < 2 ? stepper : previewer, &args[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    CHECK(args[0].ok == 25 && args[1].ok == 25 && args[2].ok == 25 && args[3].ok == 25 && args[2].bad_output + args[3].bad_output == 0,
          "%s: concurrent calls: %d %d %d %d ok", backend, args[0].ok, args[1].ok, args[2].ok, args[3].ok);
    CHECK(tg_train_step_count(t) == 50, "%s: every step counted once: %lld", backend, (long long)tg_train_step_count(t));
    tg_destroy(t);
    tg_model_free(m);
}

/* A heavier family for tests that need the worker busy: loss = mean((X W)^2) with X [64, 256] a
 * parameter too, so that a queued step copies no input; the forward is x W. */
typedef struct { tg_linear l; tg_param X; } heavy;
static tg_tensor heavy_loss(const void *ctx, const tg_tensor *in) {
    const heavy *h = ctx;
    return tg_mean(tg_square(tg_linear(&h->l, tg_p(h->X))), TG_ALL, 0);
}
static tg_tensor heavy_forward(const void *ctx, const tg_tensor *in) { return tg_linear(&((const heavy *)ctx)->l, in[0]); }
enum { HR = 64, HC = 256 };

static tg_model *heavy_model(heavy *h, uint64_t seed) {
    tg_model *m = tg_model_new(seed);
    h->l = tg_linear_new(m, "l", HC, HC, NULL);
    h->X = tg_param_new(m, "X", TG_SHAPE(HR, HC), tg_init_randn(1.0));
    return m;
}

static tg_train *heavy_train(heavy *h, tg_model **m) {
    *m = heavy_model(h, 3);
    tg_train *t = tg_compile(&(tg_train_spec){ .model = *m, .loss = heavy_loss, .ctx = h, .n_inputs = 0,
                                              .optimizer = tg_sgd(1e-3, 0, 0, 0), .backend = backend }, &err);
    CHECK(t != NULL, "heavy compile: %s", err.msg);
    return t;
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Queue about `ms` milliseconds of steps on t (timed on synchronous steps); *n gets their count. */
static tg_job **busy_steps(tg_train *t, double ms, int *n) {
    double step = 1e9;
    for (int k = 0; k < 3; k++) {   /* the fastest of three */
        double t0 = seconds();
        tg_step(t, NULL, 0);
        step = fmin(step, seconds() - t0);
    }
    *n = (int)(ms * 1e-3 / (step > 1e-6 ? step : 1e-6)) + 2;
    tg_job **jobs = malloc(sizeof(tg_job *) * (size_t)*n);
    for (int k = 0; k < *n; k++) jobs[k] = tg_step_submit(t, NULL, 0);
    return jobs;
}

static void free_jobs(tg_job **jobs, int n, int *ok, int *aborted) {
    *ok = *aborted = 0;
    for (int k = 0; k < n; k++) {
        tg_result r = tg_wait(jobs[k]);
        *ok += r.status == TG_OK;
        *aborted += r.status == TG_ABORTED;
        tg_job_free(jobs[k]);
    }
    free(jobs);
}

/* Two training handles, one thread each, at once: identical twins must stay identical (no
 * interference through shared backend state: the CUDA stream, the kernel cache). */
typedef struct { tg_train *t; const float *x; const int32_t *y; float loss[20]; int ok; } twin_arg;

static void *twin_steps(void *p) {
    twin_arg *a = p;
    for (int i = 0; i < 20; i++) {
        tg_result r = tg_step(a->t, (tg_data[]){ tg_f32("x", a->x, B * IN), tg_i32("y", a->y, B) }, 2);
        a->loss[i] = r.loss;
        a->ok += r.status == TG_OK;
    }
    return NULL;
}

static void test_two_families(void) {
    mlp n1, n2;
    tg_model *m1 = mlp_model(&n1, 23, HID), *m2 = mlp_model(&n2, 23, HID);
    float x[B * IN];
    int32_t y[B] = { 1, 0, 2, 2 };
    fill(x, B * IN, -1, 1);
    twin_arg a = { 0 }, b = { 0 };
    pthread_t ta, tb;
    /* Compiled in their threads' stead here, then stepped at once. */
    a.t = mlp_train(&n1, m1);
    b.t = mlp_train(&n2, m2);
    a.x = b.x = x;
    a.y = b.y = y;
    if (a.t && b.t) {
        pthread_create(&ta, NULL, twin_steps, &a);
        pthread_create(&tb, NULL, twin_steps, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        CHECK(a.ok == 20 && b.ok == 20 && memcmp(a.loss, b.loss, sizeof a.loss) == 0, "%s: twins stepped at once agree (%d, %d ok)",
              backend, a.ok, b.ok);
    }
    tg_destroy(a.t);
    tg_destroy(b.t);
    tg_model_free(m1);
    tg_model_free(m2);
}

static void test_async(void) {
    mlp n, n2;
    tg_model *m = mlp_model(&n, 18, HID), *m2 = mlp_model(&n2, 18, HID);
    tg_train *t = mlp_train(&n, m), *twin = mlp_train(&n2, m2);
    if (!t || !twin) { tg_destroy(t); tg_destroy(twin); tg_model_free(m); tg_model_free(m2); return; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = mlp_forward, .ctx = &n, .inputs = TRAIN_IN, .n_inputs = 1 }, &err);
    float x[B * IN];
    int32_t y[B] = { 2, 2, 0, 1 };
    fill(x, B * IN, -1, 1);
    /* Submitted steps run in order, with the inputs as they were at submit. */
    enum { K = 6 };
    tg_job *jobs[K];
    float xs[K][B * IN];
    for (int k = 0; k < K; k++) {
        jobs[k] = tg_step_submit(t, (tg_data[]){ tg_f32("x", x, B * IN), tg_i32("y", y, B) }, 2);
        memcpy(xs[k], x, sizeof x);
        x[0] += 1.0f;   /* the job holds its own copy */
    }
    int same = 0;
    for (int k = 0; k < K; k++) {
        tg_result a = tg_wait(jobs[k]);
        tg_result b = tg_step(twin, (tg_data[]){ tg_f32("x", xs[k], B * IN), tg_i32("y", y, B) }, 2);
        bool eq = a.status == TG_OK && b.status == TG_OK && a.loss == b.loss && a.step == k + 1;
        if (!eq) fprintf(stderr, "step %d: async %d %.9g (%s), sync %d %.9g (%s)\n", k + 1, a.status, a.loss, a.error, b.status,
                         b.loss, b.error);
        same += eq;
        tg_job_free(jobs[k]);
    }
    CHECK(same == K, "%s: async steps equal synchronous ones, in order (%d of %d)", backend, same, K);
    tg_job *j = tg_run_submit(f, (tg_data[]){ tg_f32("x", x, B * IN) }, 1);
    tg_result r = tg_wait(j);
    tg_result sync = tg_run(f, (tg_data[]){ tg_f32("x", x, B * IN) }, 1);
    CHECK(r.status == TG_OK && sync.status == TG_OK && r.output != sync.output && r.output_len == B * OUT &&
          memcmp(r.output, sync.output, sizeof(float) * B * OUT) == 0, "async run: its own output copy");
    tg_job_free(j);
    j = tg_step_submit(t, NULL, 3);
    r = tg_wait(j);
    CHECK(r.status == TG_FAILED && strstr(r.error, "no array"), "a bad async call fails at wait: %s", r.error);
    tg_job_free(j);

    tg_destroy(twin);
    tg_model_free(m2);

    /* Replacing the model, or destroying the handle, aborts the calls still queued. */
    heavy hv;
    tg_model *hm;
    tg_train *ht = heavy_train(&hv, &hm);
    float *hx = malloc(sizeof(float) * HR * HC);
    fill(hx, HR * HC, -1, 1);
    int n_jobs, ok, ab;
    tg_job **q = busy_steps(ht, 200, &n_jobs);
    tg_model *hm2 = heavy_model(&hv, 4);
    CHECK(tg_replace_model(ht, hm2, NULL, &err) == TG_OK, "replace: %s", err.msg);
    free_jobs(q, n_jobs, &ok, &ab);
    CHECK(ok + ab == n_jobs && ab >= 1 && tg_train_step_count(ht) == 0, "%s: replace: %d done, %d aborted, step count %lld", backend,
          ok, ab, (long long)tg_train_step_count(ht));
    q = busy_steps(ht, 200, &n_jobs);
    tg_destroy(ht);
    free_jobs(q, n_jobs, &ok, &ab);
    CHECK(ok + ab == n_jobs && ab >= 1, "%s: destroy: %d done, %d aborted", backend, ok, ab);
    free(hx);
    tg_model_free(hm);
    tg_model_free(hm2);
    tg_destroy(t);
    CHECK(tg_wait(NULL).status == TG_FAILED, "wait on NULL");
    tg_model_free(m);
}

/* ----- several steps per call (tg_steps) ----- */

/* Parameters of two handles that differ by more than near() allows. */
static int param_mismatches(tg_train *a, tg_train *b) {
    host_mlp pa, pb;
    download_mlp(a, &pa, HID);
    download_mlp(b, &pb, HID);
    int bad = 0;
    for (int i = 0; i < IN * HID; i++) bad += !near(pa.W1[i], pb.W1[i]);
    for (int i = 0; i < HID; i++) bad += !near(pa.b1[i], pb.b1[i]);
    for (int i = 0; i < HID * OUT; i++) bad += !near(pa.W2[i], pb.W2[i]);
    for (int i = 0; i < OUT; i++) bad += !near(pa.b2[i], pb.b2[i]);
    return bad;
}

/* Steps first..first+k-1 of the batches one tg_step each on twin; how many losses differ. */
static int step_in_turn(tg_train *twin, const float *xs, const int32_t *ys, int first, int k, const float *losses) {
    int bad = 0;
    for (int s = first; s < first + k; s++) {
        tg_result b = tg_step(twin, (tg_data[]){ tg_f32("x", xs + s * B * IN, B * IN), tg_i32("y", ys + s * B, B) }, 2);
        bad += b.status != TG_OK || !near(losses[s - first], b.loss);
    }
    return bad;
}

/* Two handles built alike from one seed: t driven by tg_steps, twin one tg_step at a time. */
typedef struct { mlp n, n2; tg_model *m, *m2; tg_train *t, *twin; } twins;

static void twins_close(twins *w) {
    tg_destroy(w->t);
    tg_destroy(w->twin);
    tg_model_free(w->m);
    tg_model_free(w->m2);
}

static bool twins_open(twins *w, uint64_t seed) {
    w->m = mlp_model(&w->n, seed, HID);
    w->m2 = mlp_model(&w->n2, seed, HID);
    w->t = mlp_train(&w->n, w->m);
    w->twin = mlp_train(&w->n2, w->m2);
    if (w->t && w->twin) return true;
    twins_close(w);
    return false;
}

static void test_steps(void) {
    enum { K = 7 };   /* more than the CUDA backend's queue depth */
    twins w;
    if (!twins_open(&w, 21)) return;
    tg_train *t = w.t, *twin = w.twin;
    static float xs[K * B * IN];
    static int32_t ys[K * B];
    fill(xs, K * B * IN, -1, 1);
    for (int i = 0; i < K * B; i++) ys[i] = (int32_t)(i * 7 % OUT);
    float losses[K];
    tg_result r = tg_steps(t, (tg_data[]){ tg_f32("x", xs, K * B * IN), tg_i32("y", ys, K * B) }, 2, K, losses);
    CHECK(r.status == TG_OK && r.step == K && tg_train_step_count(t) == K && r.loss == losses[K - 1],
          "%s: tg_steps of %d: %s (step %lld)", backend, K, r.error, (long long)r.step);
    int bad = step_in_turn(twin, xs, ys, 0, K, losses);
    CHECK(bad == 0 && param_mismatches(t, twin) == 0, "%s: tg_steps equals %d tg_step calls (%d losses differ)", backend, K, bad);

    /* A batch with a NaN: the steps before it count, it and those after change nothing. */
    xs[3 * B * IN + 1] = NAN;
    float l2[K];
    for (int k = 0; k < K; k++) l2[k] = -1;
    r = tg_steps(t, (tg_data[]){ tg_f32("x", xs, K * B * IN), tg_i32("y", ys, K * B) }, 2, K, l2);
    CHECK(r.status == TG_FAILED && strstr(r.error, "step 4 of 7") && strstr(r.error, "NaN") && tg_train_step_count(t) == K + 3,
          "%s: a NaN in the 4th batch: %s (step count %lld)", backend, r.error, (long long)tg_train_step_count(t));
    bad = step_in_turn(twin, xs, ys, 0, 3, l2);
    CHECK(bad == 0 && l2[3] == -1 && l2[6] == -1 && param_mismatches(t, twin) == 0,
          "%s: the 3 steps before it as tg_step gives them, none after (%d losses differ)", backend, bad);
    /* The next call goes on from there: nothing of the failed one is left behind. */
    xs[3 * B * IN + 1] = 0.5f;
    r = tg_steps(t, (tg_data[]){ tg_f32("x", xs, 2 * B * IN), tg_i32("y", ys, 2 * B) }, 2, 2, l2);
    bad = step_in_turn(twin, xs, ys, 0, 2, l2);
    CHECK(r.status == TG_OK && bad == 0 && param_mismatches(t, twin) == 0 && tg_train_step_count(t) == K + 5,
          "%s: after a failed call, tg_steps goes on: %s", backend, r.error);

    /* Calls that are wrong change nothing. */
    int64_t before = tg_train_step_count(t);
    r = tg_steps(t, (tg_data[]){ tg_f32("x", xs, K * B * IN - 1), tg_i32("y", ys, K * B) }, 2, K, NULL);
    CHECK(r.status == TG_FAILED && strstr(r.error, "input 'x' holds"), "%s: a short input: %s", backend, r.error);
    r = tg_steps(t, (tg_data[]){ tg_f32("x", xs, B * IN), tg_i32("y", ys, B) }, 2, 0, NULL);
    CHECK(r.status == TG_FAILED && strstr(r.error, "n_steps is 0"), "%s: no steps: %s", backend, r.error);
    r = tg_steps(t, NULL, 2, 1, NULL);
    CHECK(r.status == TG_FAILED && strstr(r.error, "no array"), "%s: no inputs: %s", backend, r.error);
    r = tg_steps(t, (tg_data[]){ tg_f32("x", xs, B * IN), tg_f32("z", xs, B) }, 2, 1, NULL);
    CHECK(r.status == TG_FAILED && strstr(r.error, "'z'"), "%s: an unknown input: %s", backend, r.error);
    CHECK(tg_train_step_count(t) == before, "%s: wrong calls take no step", backend);
    twins_close(&w);
}

/* No inputs: the steps run on the batch the previous step left on the device, as tg_step with
 * that batch again would; before any batch, an error that takes no step. */
static void test_kept_batch(void) {
    enum { K = 5 };   /* more than the CUDA backend's queue depth */
    twins w;
    if (!twins_open(&w, 23)) return;
    tg_train *t = w.t, *twin = w.twin;
    static float xs[(K + 2) * B * IN];
    static int32_t ys[(K + 2) * B];
    fill(xs, B * IN, -1, 1);
    for (int i = 0; i < B; i++) ys[i] = (int32_t)(i * 5 % OUT);
    for (int s = 1; s < K + 2; s++) {   /* the same batch K + 2 times, for the twin */
        memcpy(xs + s * B * IN, xs, sizeof(float) * B * IN);
        memcpy(ys + s * B, ys, sizeof(int32_t) * B);
    }
    tg_result r = tg_step(t, NULL, 0);
    CHECK(r.status == TG_FAILED && strstr(r.error, "no earlier step left a batch") && tg_train_step_count(t) == 0,
          "%s: no inputs before any batch: %s", backend, r.error);
    r = tg_steps(t, NULL, 0, 3, NULL);
    CHECK(r.status == TG_FAILED && strstr(r.error, "no earlier step left a batch") && tg_train_step_count(t) == 0,
          "%s: tg_steps without inputs before any batch: %s", backend, r.error);
    float losses[K + 2];
    r = tg_steps(t, (tg_data[]){ tg_f32("x", xs, B * IN), tg_i32("y", ys, B) }, 2, 1, losses);   /* queued on a GPU */
    CHECK(r.status == TG_OK, "%s: the batch given to tg_steps: %s", backend, r.error);
    r = tg_step(t, NULL, 0);
    losses[1] = r.loss;
    CHECK(r.status == TG_OK && tg_train_step_count(t) == 2, "%s: a step on the kept batch: %s", backend, r.error);
    r = tg_steps(t, NULL, 0, K, losses + 2);
    CHECK(r.status == TG_OK && tg_train_step_count(t) == K + 2, "%s: tg_steps of %d on the kept batch: %s", backend, K, r.error);
    int bad = step_in_turn(twin, xs, ys, 0, K + 2, losses);
    CHECK(bad == 0 && param_mismatches(t, twin) == 0, "%s: steps on the kept batch equal steps given it (%d losses differ)",
          backend, bad);
    twins_close(&w);
}

/* Single flight: with the worker busy, a queued preview is displaced by a newer one. */
typedef struct { tg_flight *fl; const float *x; tg_result r; float *out; } flight_arg;

static void *flight_caller(void *p) {
    flight_arg *a = p;
    a->r = tg_flight_run(a->fl, (tg_data[]){ tg_f32("x", a->x, HR * HC) }, 1, a->out, HR * HC);
    return NULL;
}

static void sleep_ms(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static void test_single_flight(void) {
    heavy h;
    tg_model *m;
    tg_train *t = heavy_train(&h, &m);
    if (!t) { tg_model_free(m); return; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = heavy_forward, .ctx = &h, .inputs = (tg_input_decl[]){ TG_F32("x", HR, HC) },
                                                     .n_inputs = 1 }, &err);
    float *x = malloc(sizeof(float) * HR * HC), *outs = malloc(sizeof(float) * 3 * HR * HC);
    fill(x, HR * HC, -1, 1);
    tg_flight *fl = tg_flight_new(f);
    flight_arg solo = { fl, x, { 0 }, outs }, a = { fl, x, { 0 }, outs + HR * HC }, b = { fl, x, { 0 }, outs + 2 * HR * HC };
    flight_caller(&solo);
    tg_result sync = tg_run(f, (tg_data[]){ tg_f32("x", x, HR * HC) }, 1);
    CHECK(solo.r.status == TG_OK && solo.r.output == solo.out && memcmp(solo.out, sync.output, sizeof(float) * HR * HC) == 0,
          "a lone flight call runs: %s", solo.r.error);
    /* Steps keep the worker busy for ~400 ms; a preview queues behind them; 20 ms later, while
     * the last step is still pending (checked), a newer preview displaces it. */
    int n_busy, ok, ab;
    tg_job **busy = busy_steps(t, 400, &n_busy);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, flight_caller, &a);
    sleep_ms(20);
    bool first_waits = !tg_job_done(busy[n_busy - 1]);
    pthread_create(&tb, NULL, flight_caller, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    free_jobs(busy, n_busy, &ok, &ab);
    bool displaced = a.r.status == TG_ABORTED && strstr(a.r.error, "displaced");
    CHECK(b.r.status == TG_OK && memcmp(b.out, solo.out, sizeof(float) * HR * HC) != 0, "%s: the newer preview runs after the steps: %s",
          backend, b.r.error);
    CHECK(first_waits && displaced, "%s: the waiting preview was displaced (steps pending: %d): %d %s", backend, first_waits,
          a.r.status, a.r.error);
    float small[2];
    tg_result r = tg_flight_run(fl, (tg_data[]){ tg_f32("x", x, HR * HC) }, 1, small, 2);
    CHECK(r.status == TG_FAILED && strstr(r.error, "out holds 2"), "flight output too small: %s", r.error);
    tg_flight_free(fl);
    free(x);
    free(outs);
    tg_destroy(t);
    tg_model_free(m);
}

int main(void) {
    const char *env = getenv("TG_SESSION_BACKENDS");
    char list[64];
    snprintf(list, sizeof list, "%s", env ? env : "reference cpu");
    for (char *save = NULL, *b = strtok_r(list, " ", &save); b; b = strtok_r(NULL, " ", &save)) {
        backend = b;
        check_rng = 1234;
        test_open_batch();
        test_captures();
        test_capture_heads();
        test_patching();
        test_many_sites();
        test_replace();
        test_dead_handles();
        test_threads();
        test_two_families();
        test_async();
        test_steps();
        test_kept_batch();
        test_single_flight();
    }
    return check_report("test_session");
}
