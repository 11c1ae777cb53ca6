/* test_models: small but real models trained end to end on the reference and compiled CPU backends, each asserting
 * that its loss falls below a stated bound within a fixed number of steps:
 *
 *   1. cnn:  conv-relu-maxpool x2 -> flatten -> linear on the 8x8 digits (data/digits.csv.gz,
 *            tests run from the repo root); cross-entropy, Adam; held-out accuracy via tg_attach.
 *   2. gpt:  a 2-block pre-LayerNorm decoder (causal multi-head attention from split_heads /
 *            softmax_causal / merge_heads, GELU MLP) learning a repeating character sequence, with
 *            an untied head and a head tied to the token embedding, and (compiled backends) the
 *            untied one at bf16; greedy sampling from an attached B=1 forward must reproduce the
 *            continuation.
 *   3. ae:   a conv autoencoder (maxpool down, nearest_upsample2d up, sigmoid out) on the digits
 *            with an MSE loss.
 *
 * The step counts and bounds are stated next to each test. TG_TEST_QUICK=1 (for slow builds, e.g.
 * under sanitizers) cuts the step counts and asserts the weaker bounds given beside the full ones.
 * TG_VERBOSE=1 prints the loss curves. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "tensorgrad.h"

static int quick, verbose;

/* ---------------------------------------------------------------------------------------------
 * Digits: 1797 rows of 64 pixels (0..16, scaled by 1/16) and a label; shuffled with a fixed seed,
 * the first 20% held out.
 * ------------------------------------------------------------------------------------------- */

#define PIX 64
typedef struct { float *x; int32_t *y; int n; } rows;
static rows all_rows, train_set, test_set;

static int load_digits(const char *path) {
    gzFile f = gzopen(path, "rb");
    if (!f) return -1;
    char line[1024];
    int cap = 0, ok = 1;
    while (ok && gzgets(f, line, sizeof line)) {
        if (line[0] == '\n' || line[0] == '\0') continue;
        if (all_rows.n == cap) {
            cap = cap ? 2 * cap : 2048;
            float *x = realloc(all_rows.x, (size_t)cap * PIX * sizeof *x);
            if (x) all_rows.x = x;
            int32_t *y = realloc(all_rows.y, (size_t)cap * sizeof *y);
            if (y) all_rows.y = y;
            if (!x || !y) { ok = 0; break; }
        }
        char *p = line, *end;
        float *x = all_rows.x + (size_t)all_rows.n * PIX;
        for (int i = 0; ok && i <= PIX; i++, p = end + 1) {   /* 64 pixels, then the label */
            long v = strtol(p, &end, 10);
            ok = end != p && v >= 0 && v <= (i < PIX ? 16 : 9) && (i == PIX || *end == ',');
            if (i < PIX) x[i] = (float)v / 16.0f;
            else all_rows.y[all_rows.n] = (int32_t)v;
        }
        all_rows.n += ok;
    }
    gzclose(f);
    return ok && all_rows.n > 0 ? 0 : -1;
}

static void shuffle(int *idx, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(check_next() % (uint64_t)(i + 1));
        int t = idx[i]; idx[i] = idx[j]; idx[j] = t;
    }
}

/* Copies rows idx[0..n) of src into x (n*PIX floats) and y (n labels; may be NULL). */
static void gather(const rows *src, const int *idx, int n, float *x, int32_t *y) {
    for (int i = 0; i < n; i++) {
        memcpy(x + (size_t)i * PIX, src->x + (size_t)idx[i] * PIX, PIX * sizeof *x);
        if (y) y[i] = src->y[idx[i]];
    }
}

static int split_digits(void) {
    int n = all_rows.n, n_test = (n + 4) / 5, *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return -1;
    for (int i = 0; i < n; i++) idx[i] = i;
    shuffle(idx, n);
    rows *parts[2] = { &test_set, &train_set };
    int counts[2] = { n_test, n - n_test }, offs[2] = { 0, n_test };
    for (int k = 0; k < 2; k++) {
        parts[k]->n = counts[k];
        parts[k]->x = malloc((size_t)counts[k] * PIX * sizeof(float));
        parts[k]->y = malloc((size_t)counts[k] * sizeof(int32_t));
        if (!parts[k]->x || !parts[k]->y) { free(idx); return -1; }
        gather(&all_rows, idx + offs[k], counts[k], parts[k]->x, parts[k]->y);
    }
    free(idx);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * 1. CNN on digits [N,1,8,8]: conv3x3(1->8, pad 1)-relu-maxpool2 -> [8,4,4]
 *    -> conv3x3(8->16, pad 1)-relu-maxpool2 -> [16,2,2] -> flatten (64) -> linear -> 10.
 * ------------------------------------------------------------------------------------------- */

#define CNN_BATCH 32
typedef struct { tg_conv2d_layer c1, c2; tg_linear fc; } cnn;

static tg_tensor cnn_logits(const cnn *net, tg_tensor x) {
    tg_tensor h = tg_reshape(x, -1, 1, 8, 8);
    h = tg_max_pool2d(tg_relu(tg_conv(&net->c1, h)), 2, 2, 0);
    h = tg_max_pool2d(tg_relu(tg_conv(&net->c2, h)), 2, 2, 0);
    return tg_linear(&net->fc, tg_flatten(h, 1));
}
static tg_tensor cnn_loss_fn(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(cnn_logits(ctx, in[0]), in[1], TG_MEAN);
}
static tg_tensor cnn_logits_fn(const void *ctx, const tg_tensor *in) { return cnn_logits(ctx, in[0]); }

static void test_cnn(void) {
    /* Full: 6 epochs of batch 32 (6 x 44 = 264 Adam steps, lr 5e-3); the mean step loss of the
     * last epoch must be < 0.3 and the held-out accuracy >= 0.90.
     * Quick: 2 epochs (88 steps); last-epoch loss < 0.9 and accuracy >= 0.80. */
    const int epochs = quick ? 2 : 6;
    const double loss_bound = quick ? 0.9 : 0.3, acc_bound = quick ? 0.80 : 0.90;

    tg_model *m = tg_model_new(7);
    cnn net = { tg_conv2d_new(m, "c1", 1, 8, 3, 1, 1, 1), tg_conv2d_new(m, "c2", 8, 16, 3, 1, 1, 1),
                tg_linear_new(m, "fc", 16 * 2 * 2, 10, NULL) };
    CHECK(!tg_model_error(m), "cnn model: %s", tg_model_error(m));
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = cnn_loss_fn, .ctx = &net,
        .inputs = (tg_input_decl[]){ TG_F32("x", CNN_BATCH, 1, 8, 8), TG_I32("y", CNN_BATCH) }, .n_inputs = 2,
        .optimizer = tg_adam(5e-3) }, &err);
    CHECK(t != NULL, "cnn compile: %s", err.msg);
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = cnn_logits_fn, .ctx = &net,
        .inputs = (tg_input_decl[]){ TG_F32("x", test_set.n, 1, 8, 8) }, .n_inputs = 1 }, &err) : NULL;
    CHECK(f != NULL, "cnn attach: %s", err.msg);
    if (!t || !f) goto out;

    int *order = malloc((size_t)train_set.n * sizeof *order);
    if (!order) goto out;
    for (int i = 0; i < train_set.n; i++) order[i] = i;
    float xb[CNN_BATCH * PIX];
    int32_t yb[CNN_BATCH];
    int n_batches = train_set.n / CNN_BATCH, failed_steps = 0;
    double first = NAN, epoch_loss = NAN;
    for (int e = 0; e < epochs; e++) {
        shuffle(order, train_set.n);
        double sum = 0;
        for (int b = 0; b < n_batches; b++) {
            gather(&train_set, order + b * CNN_BATCH, CNN_BATCH, xb, yb);
            tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xb, CNN_BATCH * PIX), tg_i32("y", yb, CNN_BATCH) }, 2);
            if (r.status != TG_OK && failed_steps++ == 0) CHECK(0, "cnn step: %s", r.error);
            if (e == 0 && b == 0) first = r.loss;
            sum += r.loss;
        }
        epoch_loss = sum / n_batches;
        if (verbose) printf("cnn: epoch %d loss %.4f\n", e + 1, epoch_loss);
    }
    free(order);
    CHECK(failed_steps == 0, "cnn: %d steps failed", failed_steps);
    /* An untrained 10-class classifier starts near ln 10 = 2.30. */
    CHECK(first > 1.8 && first < 2.8, "cnn: first step loss %g, expected near ln 10", first);
    CHECK(epoch_loss < loss_bound, "cnn: last-epoch loss %g after %d epochs, bound %g", epoch_loss, epochs, loss_bound);

    tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", test_set.x, (size_t)test_set.n * PIX) }, 1);
    CHECK(r.status == TG_OK, "cnn run: %s", r.error);
    int shape_ok = r.status == TG_OK && r.output && r.output_len == (size_t)test_set.n * 10 &&
                   r.output_shape.ndim == 2 && r.output_shape.d[0] == test_set.n && r.output_shape.d[1] == 10;
    CHECK(shape_ok, "cnn run: output of %zu values, ndim %d", r.output_len, r.output_shape.ndim);
    if (shape_ok) {
        int correct = 0;
        for (int i = 0; i < test_set.n; i++) {
            const float *l = r.output + (size_t)i * 10;
            int pred = 0;
            for (int c = 1; c < 10; c++) if (l[c] > l[pred]) pred = c;
            correct += pred == test_set.y[i];
        }
        double acc = (double)correct / test_set.n;
        CHECK(acc >= acc_bound, "cnn: held-out accuracy %.4f after %d epochs, bound %g", acc, epochs, acc_bound);
        printf("cnn: %d steps, first loss %.4f, last-epoch loss %.4f (< %g), held-out accuracy %.4f (>= %g)\n",
               epochs * n_batches, first, epoch_loss, loss_bound, acc, acc_bound);
    }
out:
    if (t) tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * 2. GPT-style decoder on a repeating character sequence.
 * ------------------------------------------------------------------------------------------- */

#define GPT_T 16
#define GPT_D 32
#define GPT_H 2
#define GPT_BATCH 8
#define GPT_LAYERS 2
static const char gpt_pattern[] = "hello world! ";

typedef struct { tg_layernorm ln1, ln2; tg_linear q, k, v, o, fc1, fc2; } gpt_block;
typedef struct {
    tg_embedding_layer tok, pos;
    gpt_block blocks[GPT_LAYERS];
    tg_layernorm lnf;
    tg_linear head;
    int tied, vocab;
} gpt;

static tg_tensor gpt_attention(const gpt_block *b, tg_tensor x) {
    tg_tensor q = tg_split_heads(tg_linear(&b->q, x), GPT_H);   /* [B, H, T, Dh] */
    tg_tensor k = tg_split_heads(tg_linear(&b->k, x), GPT_H);
    tg_tensor v = tg_split_heads(tg_linear(&b->v, x), GPT_H);
    tg_tensor att = tg_mul(tg_matmul(q, tg_swapaxes(k, -2, -1)), 1.0 / sqrt(GPT_D / GPT_H));   /* [B, H, T, T] */
    tg_tensor y = tg_matmul(tg_softmax_causal(att), v);                                          /* [B, H, T, Dh] */
    return tg_linear(&b->o, tg_merge_heads(y));                                                  /* [B, T, D] */
}

static tg_tensor gpt_logits(const gpt *g, tg_tensor idx) {
    tg_tensor x = tg_add(tg_embed(&g->tok, idx), tg_embed(&g->pos, tg_arange(GPT_T, TG_INT32)));   /* [B, T, D] */
    for (int l = 0; l < GPT_LAYERS; l++) {
        const gpt_block *b = &g->blocks[l];
        x = tg_add(x, gpt_attention(b, tg_layernorm(&b->ln1, x)));
        x = tg_add(x, tg_linear(&b->fc2, tg_gelu(tg_linear(&b->fc1, tg_layernorm(&b->ln2, x)))));
    }
    x = tg_layernorm(&g->lnf, x);
    return g->tied ? tg_matmul(x, tg_swapaxes(tg_p(g->tok.W), 0, 1)) : tg_linear(&g->head, x);
}
/* Position 0 sees a single char, and 'l', 'o' and ' ' recur in the pattern, so its next char is
 * ambiguous (0.47 nats on average, a floor of 0.029 on a mean over all T positions). From position
 * 1 on every bigram of the pattern is unique, so the loss averages positions 1..T-1, where zero is
 * reachable. */
static tg_tensor gpt_loss_fn(const void *ctx, const tg_tensor *in) {
    tg_tensor per_token = tg_cross_entropy(gpt_logits(ctx, in[0]), in[1], TG_NONE);   /* [B, T] */
    return tg_mean(tg_narrow(per_token, 1, 1, GPT_T - 1), TG_ALL, 0);
}
static tg_tensor gpt_logits_fn(const void *ctx, const tg_tensor *in) { return gpt_logits(ctx, in[0]); }

static void test_gpt(int tied, tg_precision precision) {
    /* Full: 300 Adam steps at lr 3e-3 (batch 8 random windows of T = 16); the mean loss of the
     * last 10 steps must be < 0.02 (from ln 9 = 2.2), and greedy sampling must reproduce the
     * next 2 periods (26 chars) exactly.
     * Quick: 150 steps; mean of the last 10 < 0.05, and the 26 sampled chars must still be right. */
    const int steps = quick ? 150 : 300;
    const double loss_bound = quick ? 0.05 : 0.02;
    const char *name = tied ? "gpt(tied)" : precision == TG_PRECISION_BF16 ? "gpt(bf16)" : "gpt";

    enum { PERIOD = sizeof gpt_pattern - 1, LEN = PERIOD * 12, GEN = 2 * PERIOD };
    char text[LEN + 1], vocab[32];
    int n_vocab = 0;
    int32_t ids[LEN];
    for (int i = 0; i < LEN; i++) {
        text[i] = gpt_pattern[i % PERIOD];
        const char *at = memchr(vocab, text[i], (size_t)n_vocab);
        if (!at) vocab[n_vocab++] = text[i];
        ids[i] = at ? (int32_t)(at - vocab) : n_vocab - 1;
    }
    text[LEN] = '\0';

    tg_model *m = tg_model_new(tied ? 12 : 11);
    gpt g = { .tied = tied, .vocab = n_vocab };
    g.tok = tg_embedding_new(m, "tok", n_vocab, GPT_D);
    g.pos = tg_embedding_new(m, "pos", GPT_T, GPT_D);
    for (int l = 0; l < GPT_LAYERS; l++) {
        gpt_block *b = &g.blocks[l];
        tg_model_push(m, "blocks.%d", l);
        b->ln1 = tg_layernorm_new(m, "ln1", GPT_D, 0, 1);
        b->q = tg_linear_new(m, "q", GPT_D, GPT_D, NULL);
        b->k = tg_linear_new(m, "k", GPT_D, GPT_D, NULL);
        b->v = tg_linear_new(m, "v", GPT_D, GPT_D, NULL);
        b->o = tg_linear_new(m, "o", GPT_D, GPT_D, NULL);
        b->ln2 = tg_layernorm_new(m, "ln2", GPT_D, 0, 1);
        b->fc1 = tg_linear_new(m, "fc1", GPT_D, 4 * GPT_D, NULL);
        b->fc2 = tg_linear_new(m, "fc2", 4 * GPT_D, GPT_D, NULL);
        tg_model_pop(m);
    }
    g.lnf = tg_layernorm_new(m, "lnf", GPT_D, 0, 1);
    if (!tied) g.head = tg_linear_new(m, "head", GPT_D, n_vocab, NULL);
    CHECK(!tg_model_error(m), "%s model: %s", name, tg_model_error(m));

    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = gpt_loss_fn, .ctx = &g,
        .inputs = (tg_input_decl[]){ TG_I32("x", GPT_BATCH, GPT_T), TG_I32("y", GPT_BATCH, GPT_T) }, .n_inputs = 2,
        .optimizer = tg_adam(3e-3), .precision = precision }, &err);
    CHECK(t != NULL, "%s compile: %s", name, err.msg);
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = gpt_logits_fn, .ctx = &g,
        .inputs = (tg_input_decl[]){ TG_I32("x", 1, GPT_T) }, .n_inputs = 1 }, &err) : NULL;
    CHECK(f != NULL, "%s attach: %s", name, err.msg);
    if (!t || !f) goto out;
    /* Tied: the head adds no parameter (tok, pos, 2 x 16 per block, lnf g and b). */
    int expect_params = 2 + GPT_LAYERS * 16 + 2 + (tied ? 0 : 2);
    CHECK(tg_train_n_params(t) == expect_params, "%s: %d parameters, expected %d", name, tg_train_n_params(t), expect_params);

    int32_t xb[GPT_BATCH * GPT_T], yb[GPT_BATCH * GPT_T];
    double first = NAN, tail = 0;
    int failed_steps = 0;
    for (int s = 0; s < steps; s++) {
        for (int b = 0; b < GPT_BATCH; b++) {
            int start = (int)(check_next() % (uint64_t)(LEN - GPT_T - 1));
            memcpy(xb + b * GPT_T, ids + start, sizeof(int32_t) * GPT_T);
            memcpy(yb + b * GPT_T, ids + start + 1, sizeof(int32_t) * GPT_T);
        }
        tg_result r = tg_step(t, (tg_data[]){ tg_i32("x", xb, GPT_BATCH * GPT_T), tg_i32("y", yb, GPT_BATCH * GPT_T) }, 2);
        if (r.status != TG_OK && failed_steps++ == 0) CHECK(0, "%s step: %s", name, r.error);
        if (s == 0) first = r.loss;
        if (s >= steps - 10) tail += r.loss / 10;
        if (verbose && (s + 1) % 25 == 0) printf("%s: step %d loss %.4f\n", name, s + 1, r.loss);
    }
    CHECK(failed_steps == 0, "%s: %d steps failed", name, failed_steps);
    double ln_v = log((double)n_vocab);
    CHECK(fabs(first - ln_v) < 0.5, "%s: first step loss %g, expected near ln %d = %g", name, first, n_vocab, ln_v);
    CHECK(tail < loss_bound, "%s: mean loss of the last 10 of %d steps %g, bound %g", name, steps, tail, loss_bound);

    /* Greedy sampling: a window of T chars in, the argmax at the last position appended. */
    int32_t ctx_ids[GPT_T + GEN];
    memcpy(ctx_ids, ids, sizeof(int32_t) * GPT_T);
    char sampled[GEN + 1] = { 0 };
    int run_ok = 1;
    for (int i = 0; i < GEN && run_ok; i++) {
        tg_result r = tg_run(f, (tg_data[]){ tg_i32("x", ctx_ids + i, GPT_T) }, 1);
        run_ok = r.status == TG_OK && r.output && r.output_len == (size_t)GPT_T * n_vocab && r.output_shape.ndim == 3;
        CHECK(run_ok, "%s run: status %d, %zu values: %s", name, (int)r.status, r.output_len, r.error);
        if (!run_ok) break;
        const float *l = r.output + (size_t)(GPT_T - 1) * n_vocab;
        int best = 0;
        for (int c = 1; c < n_vocab; c++) if (l[c] > l[best]) best = c;
        ctx_ids[GPT_T + i] = best;
        sampled[i] = vocab[best];
    }
    if (run_ok) {
        CHECK(memcmp(sampled, text + GPT_T, GEN) == 0, "%s: sampled \"%s\", expected \"%.*s\"", name, sampled, (int)GEN,
              text + GPT_T);
        printf("%s: %d steps, first loss %.4f, last-10 loss %.4f (< %g), sampled \"%s\"\n", name, steps, first, tail,
               loss_bound, sampled);
    }
out:
    if (t) tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * 3. Conv autoencoder on the digits: conv(1->8, 3, pad 1)-relu-maxpool2 -> [8,4,4]
 *    -> conv(8->4, 3, pad 1)-relu -> [4,4,4] (the code) -> nearest_upsample2d(2) -> [4,8,8]
 *    -> conv(4->8, 3, pad 1)-relu -> conv(8->1, 3, pad 1) -> sigmoid; MSE against the input.
 * ------------------------------------------------------------------------------------------- */

#define AE_BATCH 32
typedef struct { tg_conv2d_layer e1, e2, d1, d2; } autoenc;

static tg_tensor ae_recon(const autoenc *a, tg_tensor x) {
    tg_tensor h = tg_max_pool2d(tg_relu(tg_conv(&a->e1, x)), 2, 2, 0);
    h = tg_relu(tg_conv(&a->e2, h));
    h = tg_relu(tg_conv(&a->d1, tg_nearest_upsample2d(h, 2)));
    return tg_sigmoid(tg_conv(&a->d2, h));
}
static tg_tensor ae_loss_fn(const void *ctx, const tg_tensor *in) {
    return tg_mean(tg_square(tg_sub(ae_recon(ctx, in[0]), in[0])), TG_ALL, 0);
}
static tg_tensor ae_recon_fn(const void *ctx, const tg_tensor *in) { return ae_recon(ctx, in[0]); }

static void test_autoencoder(void) {
    /* Full: 300 Adam steps (lr 3e-3, batch 32 random rows); the mean loss of the last 10 steps
     * must be < 25% of the first step's loss, and the held-out reconstruction MSE < 40% of that
     * of the training-set mean image (the best constant output, so a model that ignores its input
     * cannot pass).
     * Quick: 100 steps; < 50% of the first loss, held-out MSE < 80% of the mean-image MSE. */
    const int steps = quick ? 100 : 300;
    const double frac_first = quick ? 0.5 : 0.25, frac_mean = quick ? 0.8 : 0.4;

    tg_model *m = tg_model_new(5);
    autoenc a = { tg_conv2d_new(m, "e1", 1, 8, 3, 1, 1, 1), tg_conv2d_new(m, "e2", 8, 4, 3, 1, 1, 1),
                  tg_conv2d_new(m, "d1", 4, 8, 3, 1, 1, 1), tg_conv2d_new(m, "d2", 8, 1, 3, 1, 1, 1) };
    CHECK(!tg_model_error(m), "ae model: %s", tg_model_error(m));
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = ae_loss_fn, .ctx = &a,
        .inputs = (tg_input_decl[]){ TG_F32("x", AE_BATCH, 1, 8, 8) }, .n_inputs = 1, .optimizer = tg_adam(3e-3) }, &err);
    CHECK(t != NULL, "ae compile: %s", err.msg);
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = ae_recon_fn, .ctx = &a,
        .inputs = (tg_input_decl[]){ TG_F32("x", test_set.n, 1, 8, 8) }, .n_inputs = 1 }, &err) : NULL;
    CHECK(f != NULL, "ae attach: %s", err.msg);
    if (!t || !f) goto out;

    float xb[AE_BATCH * PIX];
    int idx[AE_BATCH], failed_steps = 0;
    double first = NAN, tail = 0;
    for (int s = 0; s < steps; s++) {
        for (int b = 0; b < AE_BATCH; b++) idx[b] = (int)(check_next() % (uint64_t)train_set.n);
        gather(&train_set, idx, AE_BATCH, xb, NULL);
        tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xb, AE_BATCH * PIX) }, 1);
        if (r.status != TG_OK && failed_steps++ == 0) CHECK(0, "ae step: %s", r.error);
        if (s == 0) first = r.loss;
        if (s >= steps - 10) tail += r.loss / 10;
        if (verbose && (s + 1) % 25 == 0) printf("ae: step %d loss %.5f\n", s + 1, r.loss);
    }
    CHECK(failed_steps == 0, "ae: %d steps failed", failed_steps);
    CHECK(tail < frac_first * first, "ae: mean loss of the last 10 of %d steps %g, bound %g x first %g", steps, tail,
          frac_first, first);

    /* Held out: reconstruction MSE vs the MSE of the training-set mean image. */
    double mean_img[PIX] = { 0 }, mse = 0, mse_mean = 0;
    for (int i = 0; i < train_set.n; i++)
        for (int p = 0; p < PIX; p++) mean_img[p] += train_set.x[(size_t)i * PIX + p] / train_set.n;
    tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", test_set.x, (size_t)test_set.n * PIX) }, 1);
    int shape_ok = r.status == TG_OK && r.output && r.output_len == (size_t)test_set.n * PIX && r.output_shape.ndim == 4 &&
                   r.output_shape.d[0] == test_set.n && r.output_shape.d[1] == 1 && r.output_shape.d[2] == 8 &&
                   r.output_shape.d[3] == 8;
    CHECK(shape_ok, "ae run: status %d, %zu values, ndim %d: %s", (int)r.status, r.output_len, r.output_shape.ndim, r.error);
    if (shape_ok) {
        for (size_t i = 0; i < (size_t)test_set.n * PIX; i++) {
            double x = test_set.x[i];
            mse += (r.output[i] - x) * (r.output[i] - x);
            mse_mean += (mean_img[i % PIX] - x) * (mean_img[i % PIX] - x);
        }
        mse /= (double)test_set.n * PIX;
        mse_mean /= (double)test_set.n * PIX;
        CHECK(mse < frac_mean * mse_mean, "ae: held-out MSE %g, bound %g x mean-image MSE %g", mse, frac_mean, mse_mean);
        printf("ae: %d steps, first loss %.5f, last-10 loss %.5f (< %g x first), held-out MSE %.5f (< %g x mean-image %.5f)\n",
               steps, first, tail, frac_first, mse, frac_mean, mse_mean);
    }
out:
    if (t) tg_destroy(t);
    tg_model_free(m);
}

int main(void) {
    const char *q = getenv("TG_TEST_QUICK");
    quick = q && *q && strcmp(q, "0") != 0;
    verbose = getenv("TG_VERBOSE") != NULL;
    if (quick) printf("test_models: TG_TEST_QUICK set: fewer steps, weaker bounds\n");

    int have = load_digits("data/digits.csv.gz") == 0 && split_digits() == 0;
    CHECK(have && all_rows.n == 1797, "data/digits.csv.gz: loaded %d rows, expected 1797 (run from the repo root)",
          all_rows.n);
    /* Every model trains on the reference interpreter, the compiled CPU backend and, where a GPU
     * is available, CUDA. */
    static const char *const backends[] = { "reference", "cpu", "cuda" };
    for (int b = 0; b < 3; b++) {
        if (b == 2 && !tg_backend_available("cuda", NULL, 0)) break;
        setenv("TG_BACKEND", backends[b], 1);
        printf("test_models: backend %s\n", backends[b]);
        if (have) {
            test_cnn();
            test_autoencoder();
        }
        test_gpt(0, TG_PRECISION_DEFAULT);
        test_gpt(1, TG_PRECISION_DEFAULT);
        /* bf16 where it runs as such: the compiled backends' bf16 activations, attention's among
         * them (a wrong rounded copy of a gradient leaves the loss at ln |vocab|) */
        if (b > 0) test_gpt(0, TG_PRECISION_BF16);
    }

    free(all_rows.x); free(all_rows.y);
    free(train_set.x); free(train_set.y);
    free(test_set.x); free(test_set.y);
    return check_report("test_models");
}
