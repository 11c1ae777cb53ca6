/* test_export: tg_export_c end to end. Each model is trained a few steps (so that its weights are
 * no longer its initial ones), exported, compiled ALONE with the system compiler
 *   cc -std=c99 -O2 -Wall -Wextra -Werror model.c main.c -lm
 * where main.c, written here, holds random inputs as literals, calls the exported forward (twice,
 * and once in its own arena: the three must agree bitwise) and prints the outputs; they must
 * equal tg_run's on the same inputs within 1e-5 relative (each element against max(|its tg_run
 * value|, the output's RMS): an element that cancels to near zero carries rounding of the
 * output's size, which summation order alone changes).
 *
 *   - the digits MLP, the digits CNN (conv, max pooling) and a GPT-style char model's batch-1
 *     forward (embedding, layernorm, causal softmax attention, GELU MLP), embedded weights;
 *   - the GPT with external weights: read at init from the file tg_export_c wrote, from a
 *     tg_save checkpoint with optimizer state, and each init error (no file, not safetensors,
 *     a missing tensor, a wrong shape or dtype, a truncated file); once built with
 *     -fsanitize=address,undefined, and with clang -pedantic where clang is installed; the CNN
 *     with OpenMP pragmas, built with -fopenmp;
 *   - one small forward per kind of kernel and fusion (products with bias, batch sums and
 *     im2col, softmax family, argmax, pooling, movement, outputs that are an input or a
 *     weight), exported side by side and linked into one program;
 *   - a forward of a training handle on the reference backend;
 *   - every error of tg_export_c, and tidy.c's pruning on its own.
 * The portable kernels themselves run every op, forward and backward, in test_backend.c. */
#include "check.h"
#include "internal.h"
#include "io/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

/* ---------------------------------------------------------------------------------------------
 * Running commands, writing the test's main.c, comparing outputs
 * ------------------------------------------------------------------------------------------- */

static char cmd_output[1 << 16];

/* Runs a shell command in dir; returns its exit code (-1 if it did not exit), output kept. */
static int run_in_dir(const char *cmd) {
    char full[8192];
    snprintf(full, sizeof full, "cd '%s' && %s 2>&1", dir, cmd);
    cmd_output[0] = 0;
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = fread(cmd_output, 1, sizeof cmd_output - 1, p);
    cmd_output[n] = 0;
    while (fgetc(p) != EOF) {}
    int st = pclose(p);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return s;
}

/* One exported forward as the test's main.c calls it. */
typedef struct {
    const char *prefix;
    const tg_data *in;
    int n_in;
    size_t n_out;
} call;

static void upper(const char *s, char *out) {
    for (; *s; s++) *out++ = (char)(*s >= 'a' && *s <= 'z' ? *s - 32 : *s);
    *out = 0;
}

/* DIR/main.c: for each call, its inputs as literals, three runs that must agree bitwise, then
 * "== prefix" and the outputs. With external weights each model's init reads argv[1]. */
static void write_main(const call *calls, int n, bool external) {
    char path[128];
    snprintf(path, sizeof path, "%s/main.c", dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "#include <stdio.h>\n#include <string.h>\n");
    for (int c = 0; c < n; c++) fprintf(f, "#include \"%s.h\"\n", calls[c].prefix);
    for (int c = 0; c < n; c++) {
        for (int i = 0; i < calls[c].n_in; i++) {
            const tg_data *d = &calls[c].in[i];
            fprintf(f, "static const %s %s_in%d[%zu] = {", d->dtype == TG_INT32 ? "int32_t" : "float", calls[c].prefix, i, d->n);
            for (size_t k = 0; k < d->n; k++) {
                if (d->dtype == TG_INT32) fprintf(f, "%s%d", k ? ", " : " ", ((const int32_t *)d->data)[k]);
                else fprintf(f, "%s%af", k ? ", " : " ", (double)((const float *)d->data)[k]);
            }
            fprintf(f, " };\n");
        }
    }
    fprintf(f, "static float out[3][1 << 16];\n\nint main(int argc, char **argv) {\n    (void)argc; (void)argv;\n");
    for (int c = 0; c < n; c++) {
        const char *p = calls[c].prefix;
        char P[64];
        upper(p, P);
        fprintf(f, "    {\n        static float arena[%s_ARENA_FLOATS + 1];\n", P);
        if (external)
            fprintf(f, "        int rc = %s_init(argv[1]);\n        if (rc != %s_OK) { printf(\"init %%d: %%s\\n\", rc, %s_init_error()); return 3; }\n",
                    p, P, p);
        for (int run = 0; run < 3; run++) {
            fprintf(f, "        %s_forward%s(%s", p, run == 2 ? "_arena" : "", run == 2 ? "arena, " : "");
            for (int i = 0; i < calls[c].n_in; i++) fprintf(f, "%s_in%d, ", p, i);
            fprintf(f, "out[%d]);\n", run);
        }
        fprintf(f, "        if (memcmp(out[0], out[1], sizeof(float) * %s_OUT_SIZE) || memcmp(out[0], out[2], sizeof(float) * %s_OUT_SIZE)) {\n"
                   "            printf(\"%s: the three calls differ\\n\");\n            return 4;\n        }\n", P, P, p);
        fprintf(f, "        printf(\"== %s\\n\");\n        for (int i = 0; i < %s_OUT_SIZE; i++) printf(\"%%.9g\\n\", out[0][i]);\n    }\n", p, P);
    }
    fprintf(f, "    return 0;\n}\n");
    fclose(f);
}

/* The outputs the program printed after "== prefix" (n of them) into v; how many were found. */
static size_t printed_outputs(const char *prefix, double *v, size_t n) {
    char mark[80];
    snprintf(mark, sizeof mark, "== %s\n", prefix);
    const char *p = strstr(cmd_output, mark);
    size_t k = 0;
    if (!p) return 0;
    p += strlen(mark);
    while (k < n && *p && strncmp(p, "==", 2) != 0) {
        char *end;
        v[k] = strtod(p, &end);
        if (end == p) break;
        k++;
        p = end;
        while (*p == '\n') p++;
    }
    return k;
}

/* |a - b| against max(|b|, RMS of b), the worst over the output (NaN sticks). */
static double worst_rel(const double *a, const float *b, size_t n) {
    double ss = 0, w = 0;
    for (size_t i = 0; i < n; i++) ss += (double)b[i] * b[i];
    double rms = sqrt(ss / (double)(n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]) / fmax(fabs(b[i]), fmax(rms, 1e-30));
        if (!(e <= w)) w = e;
    }
    return w;
}

/* The program's outputs for each call against tg_run's (expected[c], calls[c].n_out values). */
static void compare_outputs(const char *what, const call *calls, int n, float *const *expected) {
    double *v = malloc(sizeof(double) * (1 << 16));
    for (int c = 0; v && c < n; c++) {
        size_t got = printed_outputs(calls[c].prefix, v, calls[c].n_out);
        CHECK(got == calls[c].n_out, "%s %s: printed %zu of %zu outputs", what, calls[c].prefix, got, calls[c].n_out);
        if (got != calls[c].n_out) continue;
        double w = worst_rel(v, expected[c], got);
        if (getenv("TG_VERBOSE")) printf("%s %s: worst relative error %.3g over %zu outputs\n", what, calls[c].prefix, w, got);
        CHECK(w <= 1e-5, "%s %s: exported forward vs tg_run: worst relative error %.3g", what, calls[c].prefix, w);
    }
    free(v);
}

#define CC_WARN "cc -std=c99 -O2 -Wall -Wextra -Werror"

/* Compiles `files` with `flags` into DIR/prog; false (with the compiler's message printed) if it
 * fails. */
static bool build(const char *what, const char *flags, const char *files) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s main.c -o prog -lm", flags, files);
    int rc = run_in_dir(cmd);
    CHECK(rc == 0, "%s: `%s` failed (%d):\n%.3000s", what, cmd, rc, cmd_output);
    return rc == 0;
}

/* ---------------------------------------------------------------------------------------------
 * Models, trained a few steps on random data
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    tg_linear l1, l2;
    tg_conv2d_layer c1, c2;
} digits_net;

static tg_tensor mlp_logits(const void *ctx, const tg_tensor *in) {
    const digits_net *n = ctx;
    return tg_linear(&n->l2, tg_relu(tg_linear(&n->l1, in[0])));
}

static tg_tensor cnn_logits(const void *ctx, const tg_tensor *in) {   /* examples/digits.c --cnn */
    const digits_net *n = ctx;
    tg_tensor x = tg_reshape(in[0], tg_shape_of(in[0]).d[0], 1, 8, 8);
    x = tg_max_pool2d(tg_relu(tg_conv(&n->c1, x)), 2, 2, 0);
    x = tg_max_pool2d(tg_relu(tg_conv(&n->c2, x)), 2, 2, 0);
    return tg_linear(&n->l2, tg_flatten(x, 1));
}

static tg_tensor mlp_loss(const void *ctx, const tg_tensor *in) { return tg_cross_entropy(mlp_logits(ctx, in), in[1], TG_MEAN); }
static tg_tensor cnn_loss(const void *ctx, const tg_tensor *in) { return tg_cross_entropy(cnn_logits(ctx, in), in[1], TG_MEAN); }

/* A GPT-style char model (examples/chargpt.c, smaller): token + position embeddings, pre-LN
 * blocks of causal multi-head attention and a GELU MLP, a final LayerNorm, a linear head. */
#define GPT_V 29
#define GPT_T 16
#define GPT_D 32
#define GPT_H 4
#define GPT_L 2
typedef struct { tg_layernorm ln1, ln2; tg_linear qkv, proj, fc, fc_proj; } gpt_block;
typedef struct {
    tg_embedding_layer wte;
    tg_param wpe;
    gpt_block h[GPT_L];
    tg_layernorm ln_f;
    tg_linear head;
} gpt;

static void gpt_new(gpt *g, tg_model *m) {
    g->wte = tg_embedding_new(m, "wte", GPT_V, GPT_D);
    g->wpe = tg_param_new(m, "wpe", TG_SHAPE(GPT_T, GPT_D), tg_init_randn(0.02));
    for (int l = 0; l < GPT_L; l++) {
        gpt_block *b = &g->h[l];
        tg_model_push(m, "h.%d", l);
        b->ln1 = tg_layernorm_new(m, "ln1", GPT_D, 1e-5, 1);
        b->qkv = tg_linear_new(m, "attn.qkv", GPT_D, 3 * GPT_D, NULL);
        b->proj = tg_linear_new(m, "attn.proj", GPT_D, GPT_D, NULL);
        b->ln2 = tg_layernorm_new(m, "ln2", GPT_D, 1e-5, 1);
        b->fc = tg_linear_new(m, "mlp.fc", GPT_D, 4 * GPT_D, NULL);
        b->fc_proj = tg_linear_new(m, "mlp.proj", 4 * GPT_D, GPT_D, NULL);
        tg_model_pop(m);
    }
    g->ln_f = tg_layernorm_new(m, "ln_f", GPT_D, 1e-5, 1);
    g->head = tg_linear_new(m, "head", GPT_D, GPT_V, NULL);
}

static tg_tensor gpt_logits(const void *ctx, const tg_tensor *in) {
    const gpt *g = ctx;
    static const int64_t sizes[3] = { GPT_D, GPT_D, GPT_D };
    tg_tensor x = tg_add(tg_embed(&g->wte, in[0]), tg_p(g->wpe));
    for (int l = 0; l < GPT_L; l++) {
        const gpt_block *b = &g->h[l];
        tg_tensor qkv[3];
        tg_split(tg_linear(&b->qkv, tg_layernorm(&b->ln1, x)), sizes, 3, -1, qkv);
        tg_tensor q = tg_split_heads(qkv[0], GPT_H), k = tg_split_heads(qkv[1], GPT_H), v = tg_split_heads(qkv[2], GPT_H);
        tg_tensor att = tg_mul(tg_matmul(q, tg_swapaxes(k, -2, -1)), 1.0 / sqrt(GPT_D / GPT_H));
        x = tg_add(x, tg_linear(&b->proj, tg_merge_heads(tg_matmul(tg_softmax_causal(att), v))));
        x = tg_add(x, tg_linear(&b->fc_proj, tg_gelu(tg_linear(&b->fc, tg_layernorm(&b->ln2, x)))));
    }
    return tg_linear(&g->head, tg_layernorm(&g->ln_f, x));
}

static tg_tensor gpt_loss(const void *ctx, const tg_tensor *in) { return tg_cross_entropy(gpt_logits(ctx, in), in[1], TG_MEAN); }

/* Random data for every input of decls: floats in [-1, 1], i32 in [0, i32_range). */
static tg_data *random_data(const tg_input_decl *decls, int n, int i32_range) {
    tg_data *d = calloc((size_t)n, sizeof *d);
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)tg_numel(decls[i].shape);
        void *v = malloc(4 * numel);
        for (size_t k = 0; k < numel; k++) {
            if (decls[i].dtype == TG_INT32) ((int32_t *)v)[k] = (int32_t)(check_next() % (uint64_t)i32_range);
            else ((float *)v)[k] = (float)check_uniform(-1, 1);
        }
        d[i] = (tg_data){ decls[i].name, decls[i].dtype, v, numel };
    }
    return d;
}

static void free_data(tg_data *d, int n) {
    for (int i = 0; d && i < n; i++) free((void *)d[i].data);
    free(d);
}

/* A training handle for loss over train_in, stepped `steps` times on fresh random batches. */
static tg_train *trained(tg_model *m, tg_forward_fn loss, const void *ctx, const tg_input_decl *train_in, int classes, int steps) {
    tg_error err;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss, .ctx = ctx, .inputs = train_in, .n_inputs = 2,
                                               .optimizer = tg_adam(1e-2) }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    for (int s = 0; t && s < steps; s++) {
        tg_data *d = random_data(train_in, 2, classes);
        tg_result r = tg_step(t, d, 2);
        CHECK(r.status == TG_OK, "step: %s", r.error);
        free_data(d, 2);
    }
    return t;
}

/* tg_run's output for data, copied (NULL on failure). */
static float *run_copy(tg_forward *f, const tg_data *d, int n, size_t *n_out) {
    tg_result r = tg_run(f, d, n);
    CHECK(r.status == TG_OK, "tg_run: %s", r.error);
    if (r.status != TG_OK) return NULL;
    float *o = malloc(sizeof(float) * r.output_len);
    memcpy(o, r.output, sizeof(float) * r.output_len);
    *n_out = r.output_len;
    return o;
}

/* Exports f as DIR/prefix.c (+ prefix.h), builds it alone with main.c and compares with tg_run
 * on fresh random inputs. */
static void export_and_compare(const char *what, tg_forward *f, const char *prefix, const tg_input_decl *decls, int n_in,
                               int i32_range, const tg_export_opts *opts, const char *cc) {
    char path[128], header[128], files[256];
    snprintf(path, sizeof path, "%s/%s.c", dir, prefix);
    snprintf(header, sizeof header, "%s/%s.h", dir, prefix);
    tg_export_opts o = *opts;
    o.prefix = prefix;
    o.header_path = header;
    tg_error err;
    tg_status st = tg_export_c(f, path, &o, &err);
    CHECK(st == TG_OK, "%s: tg_export_c: %s", what, err.msg);
    if (st != TG_OK) return;
    tg_data *in = random_data(decls, n_in, i32_range);
    size_t n_out = 0;
    float *expected = run_copy(f, in, n_in, &n_out);
    call c = { prefix, in, n_in, n_out };
    write_main(&c, 1, o.external_weights);
    snprintf(files, sizeof files, "%s.c", prefix);
    if (expected && build(what, cc, files)) {
        int rc = run_in_dir(o.external_weights ? "./prog weights.safetensors" : "./prog");
        CHECK(rc == 0, "%s: the program exited %d:\n%.2000s", what, rc, cmd_output);
        if (rc == 0) compare_outputs(what, &c, 1, &expected);
    }
    free(expected);
    free_data(in, n_in);
}

static void test_digits_models(void) {
    static const tg_input_decl train_in[] = { TG_F32("x", 8, 64), TG_I32("y", 8) };
    static const tg_input_decl one[] = { TG_F32("x", 1, 64) };
    for (int cnn = 0; cnn < 2; cnn++) {
        tg_model *m = tg_model_new(7);
        digits_net n;
        memset(&n, 0, sizeof n);
        if (cnn) {
            n.c1 = tg_conv2d_new(m, "c1", 1, 16, 3, 1, 1, 1);
            n.c2 = tg_conv2d_new(m, "c2", 16, 32, 3, 1, 1, 1);
            n.l2 = tg_linear_new(m, "l2", 32 * 2 * 2, 10, NULL);
        } else {
            n.l1 = tg_linear_new(m, "l1", 64, 128, NULL);
            n.l2 = tg_linear_new(m, "l2", 128, 10, NULL);
        }
        tg_forward_fn logits = cnn ? cnn_logits : mlp_logits;
        tg_error err;
        tg_train *t = trained(m, cnn ? cnn_loss : mlp_loss, &n, train_in, 10, 0);
        tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = logits, .ctx = &n, .inputs = one, .n_inputs = 1 }, &err) : NULL;
        CHECK(!t || f, "attach: %s", err.msg);
        if (f) {
            /* Trained weights differ from the initial ones: the export must carry the current. */
            tg_data *probe = random_data(one, 1, 0);
            size_t n0, n1;
            float *before = run_copy(f, probe, 1, &n0);
            for (int s = 0; s < 5; s++) {
                tg_data *d = random_data(train_in, 2, 10);
                CHECK(tg_step(t, d, 2).status == TG_OK, "step");
                free_data(d, 2);
            }
            float *after = run_copy(f, probe, 1, &n1);
            CHECK(before && after && memcmp(before, after, sizeof(float) * n0) != 0, "training changed the outputs");
            free(before);
            free(after);
            free_data(probe, 1);
            export_and_compare(cnn ? "digits CNN" : "digits MLP", f, cnn ? "cnn" : "mlp", one, 1, 0, &(tg_export_opts){ 0 }, CC_WARN);
            if (cnn) {   /* with OpenMP pragmas, built with -fopenmp; none in the plain file */
                char path[128];
                snprintf(path, sizeof path, "%s/cnn.c", dir);
                char *text = slurp(path, NULL);
                const char *gen = text ? strstr(text, "----- generated kernels") : NULL;
                CHECK(gen && !strstr(gen, "#pragma"), "the plain export's kernels have no pragmas");
                CHECK(text && strstr(text, "#define TGK_USE_MATMUL\n#define TGK_USE_MAXPOOL\n/*"),
                      "the CNN compiles in the product and pooling kernels, and no other");
                free(text);
                export_and_compare("digits CNN, OpenMP", f, "cnn_omp", one, 1, 0, &(tg_export_opts){ .openmp = 1 },
                                   CC_WARN " -fopenmp");
                snprintf(path, sizeof path, "%s/cnn_omp.c", dir);
                text = slurp(path, NULL);
                CHECK(text && strstr(text, "#pragma omp"), "the OpenMP export keeps its pragmas");
                free(text);
            } else {   /* an open batch dimension, exported at 3 */
                static const tg_input_decl open[] = { TG_F32("x", TG_ANY, 64) }, three[] = { TG_F32("x", 3, 64) };
                tg_forward *fo = tg_attach(t, &(tg_forward_spec){ .forward = logits, .ctx = &n, .inputs = open, .n_inputs = 1 }, &err);
                CHECK(fo != NULL, "attach open: %s", err.msg);
                if (fo) export_and_compare("digits MLP, batch 3", fo, "mlp3", three, 1, 0, &(tg_export_opts){ .open_size = 3 }, CC_WARN);
            }
        }
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The GPT: embedded weights, then external ones and every init error
 * ------------------------------------------------------------------------------------------- */

/* Writes DIR/name: the tensors of the safetensors file `from` (read whole), with tensor `tweak`
 * changed by how: 's' another shape (its elements kept), 'd' dtype I32. */
static void tweaked_weights(const char *from, const char *name, const char *tweak, char how) {
    st_file f;
    tg_error err;
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(st_read(from, &f, &err), "read %s: %s", from, err.msg);
    for (int i = 0; i < f.n; i++) {
        if (strcmp(f.t[i].name, tweak) != 0) continue;
        if (how == 'd') f.t[i].dtype = TG_INT32;
        else f.t[i].shape = TG_SHAPE(tg_numel(f.t[i].shape));
    }
    CHECK(st_write(path, f.t, f.n, NULL, NULL, 0, &err), "write %s: %s", path, err.msg);
    st_free(&f);
}

static void gpt_external(tg_train *t, tg_forward *f, const tg_input_decl *one) {
    char path[128], weights[128], ckpt[128];
    snprintf(path, sizeof path, "%s/gptx.c", dir);
    snprintf(weights, sizeof weights, "%s/weights.safetensors", dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", dir);
    tg_export_opts o = { .external_weights = 1, .weights_path = weights };
    export_and_compare("GPT, external weights", f, "gptx", one, 1, GPT_V, &o, CC_WARN);
    char *text = slurp(path, NULL);
    CHECK(text && strlen(text) < 100000, "external weights keep the file small (%zu bytes)", text ? strlen(text) : 0);
    free(text);

    /* The same program on a checkpoint with optimizer state, and under the sanitizers. */
    tg_error err;
    CHECK(tg_save(t, ckpt, 1, &err) == TG_OK, "tg_save: %s", err.msg);
    tg_data *in = random_data(one, 1, GPT_V);
    size_t n_out = 0;
    float *expected = run_copy(f, in, 1, &n_out);
    call c = { "gptx", in, 1, n_out };
    write_main(&c, 1, true);
    const char *san = "cc -std=c99 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined -fno-sanitize-recover=all";
    if (expected && build("GPT, external weights, ASan + UBSan", san, "gptx.c")) {
        int rc = run_in_dir("./prog weights.safetensors");
        CHECK(rc == 0, "sanitized program exited %d:\n%.3000s", rc, cmd_output);
        if (rc == 0) compare_outputs("GPT under ASan + UBSan", &c, 1, &expected);
        rc = run_in_dir("./prog checkpoint.safetensors");
        CHECK(rc == 0, "from a tg_save checkpoint: exited %d:\n%.3000s", rc, cmd_output);
        if (rc == 0) compare_outputs("GPT from a tg_save checkpoint", &c, 1, &expected);

        /* Init errors: a code and a message, never a crash (the sanitizers watch the reader). */
        FILE *g = fopen("/tmp/tg_export_not_st", "w");
        if (g) { fputs("{\"this is\": \"not safetensors\"}", g); fclose(g); }
        char truncate[300];
        snprintf(truncate, sizeof truncate, "head -c 5000 weights.safetensors > short.safetensors");
        run_in_dir(truncate);
        tweaked_weights(weights, "shape.safetensors", "h.1.mlp.fc.W", 's');
        tweaked_weights(weights, "dtype.safetensors", "wpe", 'd');
        st_file all;
        if (st_read(weights, &all, &err)) {   /* every tensor but the head's weight */
            st_tensor *kept = malloc(sizeof(st_tensor) * (size_t)all.n);
            int k = 0;
            for (int i = 0; kept && i < all.n; i++)
                if (strcmp(all.t[i].name, "head.W") != 0) kept[k++] = all.t[i];
            char p2[128];
            snprintf(p2, sizeof p2, "%s/missing.safetensors", dir);
            CHECK(kept && st_write(p2, kept, k, NULL, NULL, 0, &err), "write %s: %s", p2, err.msg);
            free(kept);
            st_free(&all);
        }
        static const struct { const char *file, *code, *says; } bad[] = {
            { "no-such-file.safetensors", "init -1", "cannot open" },
            { "/tmp/tg_export_not_st", "init -2", "not a safetensors file" },
            { "missing.safetensors", "init -3", "no tensor 'head.W'" },
            { "shape.safetensors", "init -4", "'h.1.mlp.fc.W' has shape [4096], expected [32,128]" },
            { "dtype.safetensors", "init -4", "'wpe' has dtype I32" },
            { "short.safetensors", "init -5", "ends inside tensor" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char cmd[300];
            snprintf(cmd, sizeof cmd, "./prog '%s'", bad[i].file);
            rc = run_in_dir(cmd);
            CHECK(rc == 3 && strstr(cmd_output, bad[i].code) && strstr(cmd_output, bad[i].says),
                  "init from %s: exit %d, expected 3 with '%s' and '%s':\n%.2000s", bad[i].file, rc, bad[i].code, bad[i].says,
                  cmd_output);
        }
        remove("/tmp/tg_export_not_st");
    }
    /* Another compiler, stricter still, where one is installed. */
    if (expected && system("command -v clang > /dev/null 2>&1") == 0 &&
        build("GPT, external weights, clang -pedantic", "clang -std=c99 -pedantic -O2 -Wall -Wextra -Werror", "gptx.c")) {
        int rc = run_in_dir("./prog weights.safetensors");
        CHECK(rc == 0, "clang build exited %d:\n%.3000s", rc, cmd_output);
        if (rc == 0) compare_outputs("GPT built by clang", &c, 1, &expected);
    }
    free(expected);
    free_data(in, 1);
}

static void test_gpt(void) {
    static const tg_input_decl train_in[] = { TG_I32("idx", 2, GPT_T), TG_I32("y", 2, GPT_T) };
    static const tg_input_decl one[] = { TG_I32("idx", 1, GPT_T) };
    tg_model *m = tg_model_new(3);
    static gpt g;
    gpt_new(&g, m);
    tg_train *t = trained(m, gpt_loss, &g, train_in, GPT_V, 5);
    tg_error err;
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = gpt_logits, .ctx = &g, .inputs = one, .n_inputs = 1 }, &err) : NULL;
    CHECK(!t || f, "attach: %s", err.msg);
    if (f) {
        export_and_compare("GPT batch 1", f, "gpt", one, 1, GPT_V, &(tg_export_opts){ 0 }, CC_WARN);
        gpt_external(t, f, one);
    }
    tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * One forward per kind of kernel, linked into one program
 * ------------------------------------------------------------------------------------------- */

typedef struct { const char *name; int n_in; tg_input_decl in[3]; } op_case;
static tg_param op_weight;   /* [2, 3], of the dummy model */

static tg_tensor op_fwd(const void *ctx, const tg_tensor *in) {
    const op_case *c = ctx;
    tg_tensor x = in[0], y = c->n_in > 1 ? in[1] : in[0], z = c->n_in > 2 ? in[2] : in[0];
    const char *n = c->name;
    if (!strcmp(n, "matmul")) return tg_matmul(x, y);
    if (!strcmp(n, "matmul batched")) return tg_matmul(x, y);
    if (!strcmp(n, "matmul broadcast")) return tg_matmul(x, tg_swapaxes(y, -1, -2));
    if (!strcmp(n, "matmul + bias per column")) return tg_add(tg_matmul(x, y), z);
    if (!strcmp(n, "matmul + bias per row")) return tg_add(tg_matmul(x, y), z);
    if (!strcmp(n, "batch sum of products")) return tg_sum(tg_matmul(x, y), 0, 0);
    if (!strcmp(n, "softmax")) return tg_softmax(x, -1);
    if (!strcmp(n, "softmax middle axis")) return tg_softmax(x, 1);
    if (!strcmp(n, "log_softmax axis 0")) return tg_log_softmax(x, 0);
    if (!strcmp(n, "causal attention")) {
        tg_tensor q = tg_split_heads(x, 2), k = tg_split_heads(y, 2);
        return tg_merge_heads(tg_matmul(tg_softmax_causal(tg_mul(tg_matmul(q, tg_swapaxes(k, -1, -2)), 0.5)), k));
    }
    if (!strcmp(n, "where_causal")) return tg_where_causal(x, -3.0);
    if (!strcmp(n, "argmax")) return tg_mul(tg_one_hot(tg_argmax(x, 1), 5), x);
    if (!strcmp(n, "sums")) return tg_add(tg_sum(tg_exp(x), 0, 1), tg_mean(tg_mul(x, x), -1, 1));
    if (!strcmp(n, "sum over all, long")) return tg_sum(x, TG_ALL, 0);
    if (!strcmp(n, "movement")) return tg_concat((tg_tensor[]){ tg_narrow(x, 1, 1, 2), tg_swapaxes(y, 0, 1) }, 2, 1);
    if (!strcmp(n, "embedding, one_hot")) return tg_add(tg_embedding(x, z), tg_sum(tg_one_hot(z, 4), -1, 1));
    if (!strcmp(n, "take_along_axis")) return tg_take_along_axis(x, z, 1);
    if (!strcmp(n, "conv2d pad 1")) return tg_conv2d(x, y, 1, 1);
    if (!strcmp(n, "conv2d stride 2")) return tg_relu(tg_conv2d(x, y, 2, 0));
    if (!strcmp(n, "max_pool2d")) return tg_max_pool2d(x, 2, 2, 0);
    if (!strcmp(n, "max_pool2d pad")) return tg_max_pool2d(x, 3, 2, 1);
    if (!strcmp(n, "upsample")) return tg_nearest_upsample2d(x, 2);
    if (!strcmp(n, "elementwise")) {
        tg_tensor a = tg_add(tg_gelu_tanh(x), tg_silu(y));
        return tg_where(tg_greater(x, 0.0), tg_clamp(tg_div(a, tg_add(tg_square(y), 1.0)), -0.5, 0.7), tg_sigmoid(tg_tanh(a)));
    }
    if (!strcmp(n, "builders")) return tg_add(tg_mul(x, tg_arange(6, TG_FLOAT32)), tg_ones(TG_FLOAT32, 4, 6));
    if (!strcmp(n, "output is an input")) return x;
    if (!strcmp(n, "output is a reshaped input")) return tg_reshape(x, 6, 2);
    if (!strcmp(n, "output is a weight")) return tg_reshape(tg_p(op_weight), 6);
    return x;
}

#define F(name, ...) TG_F32(name, __VA_ARGS__)
#define I(name, ...) TG_I32(name, __VA_ARGS__)
static const op_case OPS[] = {
    { "matmul", 2, { F("x", 5, 7), F("y", 7, 3) } },
    { "matmul batched", 2, { F("x", 2, 3, 4), F("y", 4, 5) } },
    { "matmul broadcast", 2, { F("x", 2, 1, 3, 4), F("y", 3, 5, 4) } },
    { "matmul + bias per column", 3, { F("x", 45, 70), F("y", 70, 33), F("b", 33) } },
    { "matmul + bias per row", 3, { F("x", 6, 9), F("y", 9, 5), F("b", 6, 1) } },
    { "batch sum of products", 2, { F("x", 3, 4, 5), F("y", 3, 5, 6) } },
    { "softmax", 1, { F("x", 3, 6) } },
    { "softmax middle axis", 1, { F("x", 2, 5, 3) } },
    { "log_softmax axis 0", 1, { F("x", 4, 3) } },
    { "causal attention", 2, { F("x", 2, 5, 8), F("y", 2, 5, 8) } },
    { "where_causal", 1, { F("x", 3, 4, 4) } },
    { "argmax", 1, { F("x", 3, 5) } },
    { "sums", 1, { F("x", 6, 5) } },
    { "sum over all, long", 1, { F("x", 3000, 3) } },
    { "movement", 2, { F("x", 3, 4), F("y", 5, 3) } },
    { "embedding, one_hot", 3, { F("x", 6, 4), F("unused", 1), I("z", 2, 3) } },
    { "take_along_axis", 3, { F("x", 3, 5, 2), F("unused", 1), I("z", 3, 4, 2) } },
    { "conv2d pad 1", 2, { F("x", 2, 3, 5, 6), F("y", 4, 3, 3, 3) } },
    { "conv2d stride 2", 2, { F("x", 2, 2, 7, 5), F("y", 3, 2, 2, 2) } },
    { "max_pool2d", 1, { F("x", 2, 3, 6, 4) } },
    { "max_pool2d pad", 1, { F("x", 1, 2, 5, 7) } },
    { "upsample", 1, { F("x", 2, 2, 3, 4) } },
    { "elementwise", 2, { F("x", 4, 5), F("y", 5) } },
    { "builders", 1, { F("x", 4, 6) } },
    { "output is an input", 1, { F("x", 3, 4) } },
    { "output is a reshaped input", 1, { F("x", 3, 4) } },
    { "output is a weight", 1, { F("x", 1) } },
};
#define N_OPS ((int)(sizeof OPS / sizeof OPS[0]))

static tg_tensor dummy_loss(const void *ctx, const tg_tensor *in) {
    return tg_sum(tg_mul(tg_p(op_weight), in[0]), TG_ALL, 0);
}

static void test_ops(void) {
    tg_model *m = tg_model_new(5);
    op_weight = tg_param_new(m, "w", TG_SHAPE(2, 3), tg_init_randn(1.0));
    tg_error err;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = dummy_loss, .optimizer = tg_sgd(0.1, 0, 0, 0),
                                               .inputs = (tg_input_decl[]){ TG_F32("x", 2, 3) }, .n_inputs = 1 }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    call calls[N_OPS];
    memset(calls, 0, sizeof calls);
    float *expected[N_OPS];
    tg_data *data[N_OPS];
    char names[N_OPS][16], files[N_OPS * 16 + 1] = "";
    int n = 0;
    for (int i = 0; t && i < N_OPS; i++) {
        tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = op_fwd, .ctx = &OPS[i], .inputs = OPS[i].in,
                                                          .n_inputs = OPS[i].n_in }, &err);
        CHECK(f != NULL, "%s: attach: %s", OPS[i].name, err.msg);
        if (!f) continue;
        char path[128], header[128];
        snprintf(names[n], sizeof names[n], "op%d", i);
        snprintf(path, sizeof path, "%s/op%d.c", dir, i);
        snprintf(header, sizeof header, "%s/op%d.h", dir, i);
        tg_status st = tg_export_c(f, path, &(tg_export_opts){ .prefix = names[n], .header_path = header }, &err);
        CHECK(st == TG_OK, "%s: tg_export_c: %s", OPS[i].name, err.msg);
        if (st != TG_OK) continue;
        data[n] = random_data(OPS[i].in, OPS[i].n_in, !strcmp(OPS[i].name, "take_along_axis") ? 5 : 6);
        expected[n] = run_copy(f, data[n], OPS[i].n_in, &calls[n].n_out);
        if (!expected[n]) {
            free_data(data[n], OPS[i].n_in);
            continue;
        }
        calls[n] = (call){ names[n], data[n], OPS[i].n_in, calls[n].n_out };
        snprintf(files + strlen(files), 17, "%s.c ", names[n]);
        n++;
    }
    write_main(calls, n, false);
    if (n && build("op forwards", CC_WARN, files)) {
        int rc = run_in_dir("./prog");
        CHECK(rc == 0, "the op program exited %d:\n%.2000s", rc, cmd_output);
        if (rc == 0) compare_outputs("op", calls, n, expected);
    }
    for (int c = 0; c < n; c++) {
        free(expected[c]);
        free_data(data[c], calls[c].n_in);
    }
    tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

static tg_tensor with_dropout(const void *ctx, const tg_tensor *in) { return tg_dropout(tg_relu(in[0]), 0.1); }
static tg_tensor with_randn(const void *ctx, const tg_tensor *in) { return tg_add(in[0], tg_randn(2, 3)); }
static tg_tensor plain(const void *ctx, const tg_tensor *in) { return tg_mul(in[0], tg_p(op_weight)); }

/* tg_export_c fails with a message holding `says`, and path is not written. */
static void expect_error(const char *what, tg_forward *f, const char *path, const tg_export_opts *o, const char *says) {
    tg_error err = { "" };
    if (path) remove(path);
    tg_status st = tg_export_c(f, path, o, &err);
    CHECK(st == TG_FAILED && strstr(err.msg, says), "%s: status %d, message '%s' (expected '%s')", what, st, err.msg, says);
    CHECK(!path || access(path, F_OK) != 0, "%s: %s was written", what, path);
}

static void test_errors(void) {
    tg_model *m = tg_model_new(5);
    op_weight = tg_param_new(m, "w", TG_SHAPE(2, 3), tg_init_randn(1.0));
    tg_error err;
    static const tg_input_decl in[] = { TG_F32("x", 2, 3) }, open[] = { TG_F32("x", TG_ANY, 3) };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = dummy_loss, .optimizer = tg_sgd(0.1, 0, 0, 0),
                                               .inputs = in, .n_inputs = 1 }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    if (!t) { tg_model_free(m); return; }
    char path[128];
    snprintf(path, sizeof path, "%s/err.c", dir);
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = plain, .inputs = in, .n_inputs = 1 }, &err);
    tg_forward *fo = tg_attach(t, &(tg_forward_spec){ .forward = plain, .inputs = open, .n_inputs = 1 }, &err);
    tg_forward *fd = tg_attach(t, &(tg_forward_spec){ .forward = with_dropout, .inputs = in, .n_inputs = 1 }, &err);
    tg_forward *fr = tg_attach(t, &(tg_forward_spec){ .forward = with_randn, .inputs = in, .n_inputs = 1 }, &err);
    tg_forward *gone = tg_attach(t, &(tg_forward_spec){ .forward = plain, .inputs = in, .n_inputs = 1 }, &err);
    CHECK(f && fo && fd && fr && gone, "attach: %s", err.msg);
    tg_detach(gone);
    tg_export_opts none = { 0 };
    expect_error("NULL forward", NULL, path, &none, "NULL forward handle");
    expect_error("detached forward", gone, path, &none, "destroyed or invalid forward handle");
    expect_error("NULL path", f, NULL, &none, "NULL path");
    expect_error("prefix with a dash", f, path, &(tg_export_opts){ .prefix = "my-model" }, "not a C identifier");
    expect_error("prefix with a digit first", f, path, &(tg_export_opts){ .prefix = "9lives" }, "not a C identifier");
    expect_error("open dimension", fo, path, &none, "input 'x' has an open dimension (TG_ANY)");
    expect_error("negative open_size", fo, path, &(tg_export_opts){ .open_size = -2 }, "open_size is -2");
    expect_error("dropout", fd, path, &none, "dropout draws a new random mask on every call");
    expect_error("randn", fr, path, &none, "randn draws new random numbers");
    expect_error("weights_path alone", f, path, &(tg_export_opts){ .weights_path = "w.safetensors" }, "external_weights is not");
    expect_error("unwritable path", f, "/nonexistent-dir/model.c", &none, "cannot write /nonexistent-dir/model.c");
    expect_error("unwritable header", f, path, &(tg_export_opts){ .header_path = "/nonexistent-dir/model.h" },
                 "cannot write /nonexistent-dir/model.h");
    expect_error("unwritable weights", f, path,
                 &(tg_export_opts){ .external_weights = 1, .weights_path = "/nonexistent-dir/w.safetensors" },
                 "/nonexistent-dir/w.safetensors");
    /* The failures leave the handles usable: the same forwards export once the call is right. */
    CHECK(tg_export_c(fo, path, &(tg_export_opts){ .open_size = 2 }, &err) == TG_OK, "open forward at 2: %s", err.msg);
    CHECK(tg_export_c(f, path, NULL, &err) == TG_OK, "NULL opts: %s", err.msg);
    char *text = slurp(path, NULL);
    CHECK(text && strstr(text, "void model_forward(const float *in_x, float *out)"), "NULL opts: prefix 'model'");
    CHECK(text && !strstr(text, "#define TGK_USE_"), "no library kernel is compiled in where none is called");
    free(text);
    tg_destroy(t);
    tg_model_free(m);
}

/* A forward on the reference backend exports the same way: the weights are read from any
 * backend's buffers, and the file follows the CPU schedule regardless. */
static void test_reference_backend(void) {
    tg_model *m = tg_model_new(5);
    op_weight = tg_param_new(m, "w", TG_SHAPE(2, 3), tg_init_randn(1.0));
    static const tg_input_decl in[] = { TG_F32("x", 2, 3) };
    tg_error err;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = dummy_loss, .optimizer = tg_sgd(0.1, 0, 0, 0), .inputs = in,
                                               .n_inputs = 1, .backend = "reference" }, &err);
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = plain, .inputs = in, .n_inputs = 1 }, &err) : NULL;
    CHECK(f != NULL, "reference backend: %s", err.msg);
    if (f) export_and_compare("reference backend", f, "ref", in, 1, 0, &(tg_export_opts){ 0 }, CC_WARN);
    tg_destroy(t);
    tg_model_free(m);
}

/* tidy.c alone: what it removes and what it keeps. */
static void test_tidy(void) {
    const char *src =
        "static inline float keep(float x) { float unused = x; return x; }\n"
        "static inline float twice(float x) { return keep(x) + keep(x); }\n"
        "static inline double only_called_by_unused(double x) {\n"
        "    return x;\n"
        "}\n"
        "static inline double dead(double x) { return only_called_by_unused(x); }\n"
        "static void k1(float *A) {\n"
        "    #pragma omp simd\n"
        "    for (uint32_t i = 0; i < 4; i++) {\n"
        "        const float t0 = A[i];\n"
        "        const int64_t c1 = i / 2, c2 = i % 2;\n"
        "        const float t3 = t0 * 2.0f;\n"
        "        const float t4 = t3 + (float)c2;\n"
        "        const float t5 = t3 - 1.0f;\n"
        "        A[i] = twice(t4);\n"
        "    }\n"
        "}\n";
    char *plain = export_tidy(src, false), *omp = export_tidy(src, true);
    CHECK(plain && omp, "export_tidy returned NULL");
    if (plain && omp) {
        CHECK(!strstr(plain, "c1") && strstr(plain, "const int64_t c2 = i % 2;"), "a multi-declarator line loses c1 only:\n%s", plain);
        CHECK(!strstr(plain, "t5") && strstr(plain, "t0") && strstr(plain, "t3") && strstr(plain, "t4"), "t5 goes, t0 t3 t4 stay:\n%s",
              plain);
        CHECK(strstr(plain, "float unused = x;") && strstr(plain, "twice(float x)"), "helpers called stay whole:\n%s", plain);
        CHECK(!strstr(plain, "only_called_by_unused") && !strstr(plain, "double dead"), "helpers not called go:\n%s", plain);
        CHECK(!strstr(plain, "#pragma") && strstr(omp, "    #pragma omp simd\n"), "pragmas dropped only without OpenMP");
    }
    free(plain);
    free(omp);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tg_test_export_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_tidy();
    test_errors();
    test_reference_backend();
    test_digits_models();
    test_gpt();
    test_ops();
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!check_failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_report("test_export");
}
