/* chargpt: a small GPT that learns to write like any text file, one byte at a time.
 *
 *   make build/examples/chargpt && build/examples/chargpt FILE
 *
 * Options: --steps N (5000)  --lr X (peak, 2e-3)  --backend NAME (library default)  --plot PREFIX
 *          --eval-every N (500)  --sample-every N (1000; 0: only at the end)  --sample-len N (300)
 *          --prompt STR ("\n")  --temperature T (0.8; 0: always the likeliest byte)
 *          --save CKPT (a safetensors checkpoint at every evaluation)  --resume CKPT
 *          --precision f32|tf32|bf16 (f32; see tg_precision)
 *
 * The vocabulary is the distinct bytes of FILE; the first 90% is for training, the last 10% is
 * held out. Each step trains on BATCH random windows of BLOCK bytes, each predicting the byte
 * after every position. The model follows nanoGPT: token + position embeddings, N_LAYER
 * pre-LayerNorm blocks of causal multi-head self-attention and a GELU MLP, a final LayerNorm and
 * a linear head. AdamW with linear warmup, cosine decay and gradient clipping at norm 1.
 *
 * Samples come from a second, forward-only graph for one window (tg_attach) that shares the
 * training parameters, so it always sees the latest step.
 *
 * The defaults are sized for the compiled cpu backend on two cores: a default run takes about
 * 3.5 minutes there (25 steps/s) and reaches a held-out loss near 1.65 nats per byte on the
 * Debian fortunes corpus, writing English-looking fortunes (see README.md).
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

#define N_EMBD 128             /* model width */
#define N_LAYER 4
#define N_HEAD 4
#define HEAD_DIM (N_EMBD / N_HEAD)
#define BLOCK 64               /* context length T */
#define BATCH 16
#define EVAL_BATCHES 8         /* held-out batches per evaluation (the same windows every time) */

/* ---------------------------------------------------------------------------------------------
 * Data: the file as token ids, and the byte each id stands for.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    int32_t *ids;              /* the whole file, one id per byte */
    long n, n_train;           /* ids[0..n_train) train, ids[n_train..n) held out */
    int vocab;
    unsigned char byte_of[256];
    int32_t id_of[256];        /* -1: byte not in the file */
} corpus;

static int load_corpus(const char *path, corpus *c) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    unsigned char *bytes = NULL;
    long n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            unsigned char *b = realloc(bytes, (size_t)cap);
            if (!b) { fprintf(stderr, "chargpt: out of memory\n"); free(bytes); fclose(f); return -1; }
            bytes = b;
        }
        size_t got = fread(bytes + n, 1, (size_t)(cap - n), f);
        n += (long)got;
        if (got == 0) break;
    }
    int read_error = ferror(f);
    fclose(f);
    if (read_error) { fprintf(stderr, "chargpt: %s: read error\n", path); free(bytes); return -1; }

    /* The held-out part must hold one window and the training part more than one. */
    long need = 10 * (BLOCK + 2);
    if (n < need) {
        fprintf(stderr, "chargpt: %s: %ld bytes is too short (needs at least %ld)\n", path, n, need);
        free(bytes);
        return -1;
    }
    *c = (corpus){ .n = n, .n_train = n * 9 / 10 };
    int seen[256] = { 0 };
    for (long i = 0; i < n; i++) seen[bytes[i]] = 1;
    for (int b = 0; b < 256; b++) {
        c->id_of[b] = seen[b] ? c->vocab : -1;
        if (seen[b]) c->byte_of[c->vocab++] = (unsigned char)b;
    }
    c->ids = malloc((size_t)n * sizeof *c->ids);
    if (!c->ids) { fprintf(stderr, "chargpt: out of memory\n"); free(bytes); return -1; }
    for (long i = 0; i < n; i++) c->ids[i] = c->id_of[bytes[i]];
    free(bytes);
    return 0;
}

/* BATCH random windows from ids[lo..hi): x the window, y the same shifted by one. */
static void get_batch(const corpus *c, long lo, long hi, uint64_t *rng, int32_t *x, int32_t *y) {
    for (int b = 0; b < BATCH; b++) {
        long start = lo + (long)(rng_next(rng) % (uint64_t)(hi - lo - BLOCK));
        memcpy(x + b * BLOCK, c->ids + start, BLOCK * sizeof *x);
        memcpy(y + b * BLOCK, c->ids + start + 1, BLOCK * sizeof *y);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    tg_layernorm ln1, ln2;
    tg_linear qkv, proj;       /* attention: x -> q, k, v (one matmul); heads -> x */
    tg_linear fc, fc_proj;     /* MLP: x -> 4x -> x */
} block;

typedef struct {
    tg_embedding_layer wte;    /* token embedding [vocab, N_EMBD] */
    tg_param wpe;              /* position embedding [BLOCK, N_EMBD] */
    block h[N_LAYER];
    tg_layernorm ln_f;
    tg_linear head;            /* [N_EMBD, vocab] */
} gpt;

static void gpt_new(gpt *g, tg_model *m, int vocab) {
    /* nanoGPT's init: N(0, 0.02) weights, with the projections into the residual stream scaled
     * down by sqrt(2 * N_LAYER) so the stream's variance does not grow with depth. */
    tg_linear_opts resid = { .init = tg_init_randn(0.02 / sqrt(2.0 * N_LAYER)), .has_init = 1 };
    g->wte = tg_embedding_new(m, "wte", vocab, N_EMBD);
    g->wpe = tg_param_new(m, "wpe", TG_SHAPE(BLOCK, N_EMBD), tg_init_randn(0.02));
    for (int l = 0; l < N_LAYER; l++) {
        block *b = &g->h[l];
        tg_model_push(m, "h.%d", l);
        b->ln1 = tg_layernorm_new(m, "ln1", N_EMBD, 1e-5, 1);
        b->qkv = tg_linear_new(m, "attn.qkv", N_EMBD, 3 * N_EMBD, NULL);
        b->proj = tg_linear_new(m, "attn.proj", N_EMBD, N_EMBD, &resid);
        b->ln2 = tg_layernorm_new(m, "ln2", N_EMBD, 1e-5, 1);
        b->fc = tg_linear_new(m, "mlp.fc", N_EMBD, 4 * N_EMBD, NULL);
        b->fc_proj = tg_linear_new(m, "mlp.proj", 4 * N_EMBD, N_EMBD, &resid);
        tg_model_pop(m);
    }
    g->ln_f = tg_layernorm_new(m, "ln_f", N_EMBD, 1e-5, 1);
    g->head = tg_linear_new(m, "head", N_EMBD, vocab, NULL);
}

/* Causal self-attention on x [B, T, C]. */
static tg_tensor attention(const block *b, tg_tensor x) {
    static const int64_t sizes[3] = { N_EMBD, N_EMBD, N_EMBD };
    tg_tensor qkv[3];
    tg_split(tg_linear(&b->qkv, x), sizes, 3, -1, qkv);
    tg_tensor q = tg_split_heads(qkv[0], N_HEAD);             /* [B, H, T, HEAD_DIM] */
    tg_tensor k = tg_split_heads(qkv[1], N_HEAD);
    tg_tensor v = tg_split_heads(qkv[2], N_HEAD);
    tg_tensor att = tg_mul(tg_matmul(q, tg_swapaxes(k, -2, -1)), 1.0 / sqrt(HEAD_DIM));   /* [B, H, T, T] */
    tg_tensor y = tg_matmul(tg_softmax_causal(att), v);      /* [B, H, T, HEAD_DIM] */
    return tg_linear(&b->proj, tg_merge_heads(y));           /* [B, T, C] */
}

/* Token ids [B, T] -> logits [B, T, vocab]. */
static tg_tensor gpt_logits(const gpt *g, tg_tensor idx) {
    tg_tensor x = tg_add(tg_embed(&g->wte, idx), tg_p(g->wpe));
    for (int l = 0; l < N_LAYER; l++) {
        const block *b = &g->h[l];
        x = tg_add(x, attention(b, tg_layernorm(&b->ln1, x)));
        x = tg_add(x, tg_linear(&b->fc_proj, tg_gelu(tg_linear(&b->fc, tg_layernorm(&b->ln2, x)))));
    }
    return tg_linear(&g->head, tg_layernorm(&g->ln_f, x));
}

/* Forward functions: ctx is the gpt, in[0] the ids, in[1] the next ids (training only). */
static tg_tensor loss_fn(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(gpt_logits(ctx, in[0]), in[1], TG_MEAN);
}

static tg_tensor logits_fn(const void *ctx, const tg_tensor *in) { return gpt_logits(ctx, in[0]); }

/* ---------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------- */

/* Picks an id from logits / temperature (temperature <= 0: the likeliest id). */
static int pick(const float *logits, int vocab, double temperature, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < vocab; i++) if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    double p[256], sum = 0;
    for (int i = 0; i < vocab; i++) sum += p[i] = exp((logits[i] - logits[best]) / temperature);
    double u = rng_uniform(rng) * sum;
    for (int i = 0; i < vocab; i++) if ((u -= p[i]) < 0) return i;
    return best;   /* only reached through rounding */
}

/* Prints the prompt and n sampled bytes after it. f runs the model on one window of BLOCK ids.
 * The context is the last BLOCK ids; a shorter one is padded on the right, which the causal
 * mask keeps from influencing the logits at its last real position. Returns 0 or -1. */
static int sample(tg_forward *f, const corpus *c, const int32_t *prompt, int n_prompt, int n,
                  double temperature, uint64_t *rng) {
    int32_t *ctx = malloc((size_t)(n_prompt + n) * sizeof *ctx), window[BLOCK];
    if (!ctx) { fprintf(stderr, "chargpt: out of memory\n"); return -1; }
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    for (int i = 0; i < n_prompt; i++) putchar(c->byte_of[prompt[i]]);
    int len = n_prompt;
    for (int i = 0; i < n; i++) {
        int start = len > BLOCK ? len - BLOCK : 0, used = len - start;
        for (int j = 0; j < BLOCK; j++) window[j] = ctx[start + (j < used ? j : 0)];
        tg_result r = tg_run(f, (tg_data[]){ tg_i32("idx", window, BLOCK) }, 1);
        if (r.status != TG_OK) { fprintf(stderr, "\nchargpt: tg_run: %s\n", r.error); free(ctx); return -1; }
        ctx[len] = pick(r.output + (size_t)(used - 1) * c->vocab, c->vocab, temperature, rng);
        putchar(c->byte_of[ctx[len++]]);
    }
    putchar('\n');
    fflush(stdout);
    free(ctx);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    const char *file, *backend, *plot, *prompt, *save, *resume;
    int steps, eval_every, sample_every, sample_len;
    double lr, temperature;
    tg_precision precision;
} options;

static void print_usage(FILE *out, const char *prog) {
    fprintf(out, "usage: %s FILE [--steps N] [--lr X] [--backend NAME] [--plot PREFIX] [--eval-every N]\n"
                 "       [--sample-every N] [--sample-len N] [--prompt STR] [--temperature T]\n"
                 "       [--save CKPT] [--resume CKPT] [--precision f32|tf32|bf16]\n", prog);
}

/* Returns 0 to run, 1 after printing --help, -1 after printing the usage for a bad argument. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){ .steps = 5000, .eval_every = 500, .sample_every = 1000, .sample_len = 300, .lr = 2e-3,
                    .temperature = 0.8 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { print_usage(stdout, argv[0]); return 1; }
        if (strncmp(a, "--", 2) != 0) {   /* the one positional argument */
            if (o->file) goto usage;
            o->file = a;
            continue;
        }
        if (!v) goto usage;
        i++;
        if (!strcmp(a, "--steps")) { o->steps = (int)strtol(v, &end, 10); if (o->steps < 1) goto usage; }
        else if (!strcmp(a, "--lr")) { o->lr = strtod(v, &end); if (!(o->lr > 0)) goto usage; }
        else if (!strcmp(a, "--eval-every")) { o->eval_every = (int)strtol(v, &end, 10); if (o->eval_every < 1) goto usage; }
        else if (!strcmp(a, "--sample-every")) { o->sample_every = (int)strtol(v, &end, 10); if (o->sample_every < 0) goto usage; }
        else if (!strcmp(a, "--sample-len")) { o->sample_len = (int)strtol(v, &end, 10); if (o->sample_len < 0) goto usage; }
        else if (!strcmp(a, "--temperature")) { o->temperature = strtod(v, &end); if (!(o->temperature >= 0)) goto usage; }
        else if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--plot")) o->plot = v;
        else if (!strcmp(a, "--save")) o->save = v;
        else if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--precision")) { if (!(o->precision = parse_precision(v))) goto usage; }
        else goto usage;
        if (end && *end) goto usage;
    }
    if (o->file) return 0;
usage:
    print_usage(stderr, argv[0]);
    return -1;
}

int main(int argc, char **argv) {
    options opt;
    int rc = parse_args(argc, argv, &opt);
    if (rc != 0) return rc > 0 ? 0 : 2;
    if (opt.plot && plot_check(opt.plot) != 0) return 1;
    corpus c;
    if (load_corpus(opt.file, &c) != 0) return 1;

    /* The prompt as ids, without the bytes the file never contains; when that leaves nothing (a
     * file without newlines and the default prompt), the file's first byte. */
    const char *text = opt.prompt ? opt.prompt : "\n";
    int n_prompt = 0;
    int32_t *prompt = malloc((strlen(text) + 1) * sizeof *prompt);
    if (!prompt) { fprintf(stderr, "chargpt: out of memory\n"); free(c.ids); return 1; }
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        if (c.id_of[*p] >= 0) prompt[n_prompt++] = c.id_of[*p];
    if (opt.prompt && n_prompt < (int)strlen(text)) fprintf(stderr, "chargpt: dropped prompt bytes that %s never contains\n", opt.file);
    if (n_prompt == 0) prompt[n_prompt++] = c.ids[0];

    rc = 1;
    tg_error err = { { 0 } };
    tg_train *t = NULL;
    plot_history hist = { 0 };
    tg_model *m = tg_model_new(1337);
    if (!m) { fprintf(stderr, "chargpt: out of memory\n"); goto out; }
    gpt g;
    gpt_new(&g, m, c.vocab);
    if (tg_model_error(m)) { fprintf(stderr, "chargpt: model: %s\n", tg_model_error(m)); goto out; }

    /* AdamW (nanoGPT's settings): linear warmup over the first 5% of the steps, then a cosine down
     * to a tenth of the peak; gradients clipped to global norm 1. */
    int warmup = opt.steps / 20;
    tg_schedule cosine = tg_lr_cosine(opt.lr, opt.lr / 10, opt.steps - warmup);
    tg_optimizer adamw = tg_adamw(opt.lr, 0.1);
    adamw.lr = tg_lr_warmup(opt.lr, warmup, &cosine);
    adamw.b2 = 0.99;
    adamw.clip_norm = 1.0;
    t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss_fn, .ctx = &g,
        .inputs = (tg_input_decl[]){ TG_I32("idx", BATCH, BLOCK), TG_I32("targets", BATCH, BLOCK) }, .n_inputs = 2,
        .optimizer = adamw, .backend = opt.backend, .precision = opt.precision }, &err);
    if (!t) { fprintf(stderr, "chargpt: tg_compile: %s\n", err.msg); goto out; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = logits_fn, .ctx = &g,
        .inputs = (tg_input_decl[]){ TG_I32("idx", 1, BLOCK) }, .n_inputs = 1 }, &err);
    if (!f) { fprintf(stderr, "chargpt: tg_attach: %s\n", err.msg); goto out; }
    /* Resuming restores the parameters, AdamW's moments and the step count (so the schedule goes
     * on where it stopped): the run continues exactly as if it had never been interrupted. */
    int first = 1;
    if (opt.resume) {
        if (tg_load(t, opt.resume, 1, &err) != TG_OK) { fprintf(stderr, "chargpt: %s\n", err.msg); goto out; }
        first = (int)tg_train_step_count(t) + 1;
        printf("chargpt: resumed from %s at step %d\n", opt.resume, first);
    }

    printf("chargpt: %s: %ld bytes, vocab %d, %ld train / %ld held-out\n", opt.file, c.n, c.vocab, c.n_train, c.n - c.n_train);
    printf("model: d %d, %d layers, %d heads, context %d (%ld parameters); batch %d, adamw lr %g, "
           "warmup %d, cosine to %g, %d steps, backend %s, %s\n", N_EMBD, N_LAYER, N_HEAD, BLOCK, (long)tg_train_param_total(t),
           BATCH, opt.lr, warmup, opt.lr / 10, opt.steps, opt.backend ? opt.backend : "default",
           tg_precision_name(tg_train_precision(t)));

    /* The held-out windows: drawn once, so every evaluation measures the same text. */
    static int32_t x[BATCH * BLOCK], y[BATCH * BLOCK], hx[EVAL_BATCHES][BATCH * BLOCK], hy[EVAL_BATCHES][BATCH * BLOCK];
    uint64_t rng = 1, held_rng = 2, sample_rng = 3;
    for (int e = 0; e < EVAL_BATCHES; e++) get_batch(&c, c.n_train, c.n, &held_rng, hx[e], hy[e]);

    double t0 = now_s(), sum = 0;
    int in_sum = 0;
    for (int step = first; step <= opt.steps; step++) {
        get_batch(&c, 0, c.n_train, &rng, x, y);
        tg_result r = tg_step(t, (tg_data[]){ tg_i32("idx", x, BATCH * BLOCK), tg_i32("targets", y, BATCH * BLOCK) }, 2);
        if (r.status != TG_OK) { fprintf(stderr, "chargpt: tg_step: %s\n", r.error); goto out; }
        sum += r.loss;
        in_sum++;

        double held = NAN;
        if (step % opt.eval_every == 0 || step == opt.steps) {
            held = 0;
            for (int e = 0; e < EVAL_BATCHES; e++) {
                tg_result h = tg_eval_loss(t, (tg_data[]){ tg_i32("idx", hx[e], BATCH * BLOCK), tg_i32("targets", hy[e], BATCH * BLOCK) }, 2);
                if (h.status != TG_OK) { fprintf(stderr, "chargpt: tg_eval_loss: %s\n", h.error); goto out; }
                held += h.loss / EVAL_BATCHES;
            }
            double elapsed = now_s() - t0;
            printf("step %5d/%d  loss %.4f  held-out %.4f  lr %.2e  %5.1f steps/s  elapsed %6.1fs  eta %6.1fs\n",
                   step, opt.steps, sum / in_sum, held, tg_schedule_at(&adamw.lr, step), (step - first + 1) / elapsed,
                   elapsed, elapsed / (step - first + 1) * (opt.steps - step));
            fflush(stdout);
            sum = 0;
            in_sum = 0;
            if (opt.save && tg_save(t, opt.save, 1, &err) != TG_OK) { fprintf(stderr, "chargpt: %s\n", err.msg); goto out; }
        }
        if (opt.plot && plot_add(&hist, step, r.loss, held) != 0) { fprintf(stderr, "chargpt: out of memory\n"); goto out; }

        if (step == opt.steps || (opt.sample_every > 0 && step % opt.sample_every == 0)) {
            printf("--- sample at step %d (temperature %g) ---\n", step, opt.temperature);
            if (sample(f, &c, prompt, n_prompt, opt.sample_len, opt.temperature, &sample_rng) != 0) goto out;
            printf("---\n");
        }
    }
    if (opt.plot && plot_write(&hist, opt.plot, "chargpt: cross-entropy per byte (nats)", 0) != 0) goto out;
    rc = 0;

out:
    if (t) tg_destroy(t);   /* also frees the attached forward graph */
    tg_model_free(m);
    plot_free(&hist);
    free(prompt);
    free(c.ids);
    return rc;
}
