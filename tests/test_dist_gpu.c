/* Data parallel on real GPUs: what tests/run_gpu_multi.sh runs on a machine with 2 (or more) GPUs
 * and NCCL.
 * Elsewhere (CI, machines with fewer GPUs) it says that it skipped and why; tests/test_dist.c
 * covers the same logic on the host backends.
 *
 * Workloads: char_gpt_small (bench/bench.c's, B = 16 sequences per GPU) and the digits CNN
 * (examples/digits.c's, B = 32 images per GPU, random pixels), 50 Adam steps, f32. Data is a pure
 * function of (step, row), so every process can make its own rows of the global batch.
 *
 * N GPUs: TG_TEST_GPUS (default 2, at most 8), one process a GPU in the multi-process runs.
 *
 *   test_dist_gpu                      one process, devices {0 .. N-1}: against one GPU at the same
 *                                      global batch: losses within BOUND at every step, all
 *                                      replicas' parameters identical after every step, devices {0}
 *                                      (a job of one) against the plain handle, checkpoints
 *                                      saved at step 25 moving N -> 1, 1 -> N and N -> N
 *   test_dist_gpu --prepare W DIR      one GPU at the global batch: DIR/W.one.txt (loss and
 *                                      parameter hash per step), DIR/W.one.safetensors at step 25
 *   test_dist_gpu --rank W DIR [--resume] [--die-at N]
 *                                      one rank of a job launched like torchrun (TG_ or torchrun's
 *                                      variables): its batch B on GPU LOCAL_RANK; DIR/W.rank<r>.txt,
 *                                      and rank 0 saves DIR/W.dp.safetensors at step 25. --resume:
 *                                      from DIR/W.one.safetensors at step 25 (W.resume.rank<r>.txt).
 *                                      --die-at N: rank 1 exits before step N; rank 0 records how
 *                                      its step failed (W.die.rank0.txt)
 *   test_dist_gpu --check W DIR        every rank agrees with rank 0 exactly (losses, parameter
 *                                      hashes), which matches one GPU within BOUND, the 1 -> N
 *                                      resume matches W.one, one GPU resumed from W.dp.safetensors
 *                                      matches rank 0
 *   test_dist_gpu --check-die W DIR    rank 0 failed within the timeout naming the cause, and its
 *                                      parameters did not change
 * BOUND (relative, per step's loss): 1e-5. cuBLAS picks other algorithms for other batch sizes
 * and the all-reduce adds in another order, so these runs differ by more than the host backends'
 * 1 ulp: 1.1e-7 over 50 steps on two H100s (2026-11-25); the observed figure is printed. TG_DIST_GPU_BACKEND=cpu runs all of it on the host instead (the
 * "devices" then count replicas), to try tests/run_gpu_multi.sh's flow without a GPU. */
#include "check.h"
#include "tensorgrad.h"
#include "dist/dist.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BOUND 1e-5
#define STEPS 50
#define SAVE_AT 25
#define MAX_GPUS 8

static int n_gpus = 2;                                        /* TG_TEST_GPUS */
static const int all_gpus[MAX_GPUS] = { 0, 1, 2, 3, 4, 5, 6, 7 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ----- the two models ----- */

typedef struct { tg_layernorm ln1, ln2; tg_linear q, k, v, o, f1, f2; } block;
typedef struct { int V, T, d, h, L; tg_embedding_layer tok, pos; block b[2]; tg_layernorm lnf; tg_linear head; } gpt;
typedef struct { tg_conv2d_layer c1, c2; tg_linear l2; } cnn;

static tg_tensor block_forward(const gpt *g, const block *b, tg_tensor x) {
    tg_tensor y = tg_layernorm(&b->ln1, x);
    tg_tensor q = tg_split_heads(tg_linear(&b->q, y), g->h), k = tg_split_heads(tg_linear(&b->k, y), g->h);
    tg_tensor v = tg_split_heads(tg_linear(&b->v, y), g->h);
    y = tg_merge_heads(tg_attention(q, k, v, 1, 1.0 / sqrt((double)(g->d / g->h))));
    x = tg_add(x, tg_linear(&b->o, y));
    return tg_add(x, tg_linear(&b->f2, tg_gelu(tg_linear(&b->f1, tg_layernorm(&b->ln2, x)))));
}

static tg_tensor gpt_loss(const void *ctx, const tg_tensor *in) {
    const gpt *g = ctx;
    tg_tensor x = tg_add(tg_embed(&g->tok, in[0]), tg_embed(&g->pos, tg_arange(g->T, TG_INT32)));
    for (int i = 0; i < g->L; i++) x = block_forward(g, &g->b[i], x);
    return tg_cross_entropy(tg_linear(&g->head, tg_layernorm(&g->lnf, x)), in[1], TG_MEAN);
}

static tg_tensor cnn_loss(const void *ctx, const tg_tensor *in) {
    const cnn *n = ctx;
    tg_tensor x = tg_reshape(in[0], tg_shape_of(in[0]).d[0], 1, 8, 8);
    x = tg_max_pool2d(tg_relu(tg_conv(&n->c1, x)), 2, 2, 0);
    x = tg_max_pool2d(tg_relu(tg_conv(&n->c2, x)), 2, 2, 0);
    return tg_cross_entropy(tg_linear(&n->l2, tg_flatten(x, 1)), in[1], TG_MEAN);
}

typedef struct {
    const char *name;
    int per_gpu;               /* rows per GPU */
    int x_len, y_len;          /* per row */
    bool tokens;               /* x is i32 (a GPT: its embeddings' and attention's gradients, dq, are added up with
                                * atomics on CUDA, in an order that varies from run to run: no step is repeated
                                * bit for bit, and a resumed run only matches within BOUND) */
    tg_model *m;
    void *ctx;
    tg_forward_fn loss;
} workload;

static gpt the_gpt;
static cnn the_cnn;

static bool make(workload *w, const char *name) {
    memset(w, 0, sizeof *w);
    w->name = name;
    w->m = tg_model_new(3);
    if (strcmp(name, "char_gpt_small") == 0) {
        gpt *g = &the_gpt;
        *g = (gpt){ .V = 65, .T = 64, .d = 128, .h = 4, .L = 2 };
        g->tok = (tg_embedding_layer){ tg_param_new(w->m, "tok.W", TG_SHAPE(65, 128), tg_init_randn(1.0)) };
        g->pos = (tg_embedding_layer){ tg_param_new(w->m, "pos.W", TG_SHAPE(64, 128), tg_init_randn(1.0)) };
        for (int i = 0; i < g->L; i++) {
            tg_model_push(w->m, "blocks.%d", i);
            block *b = &g->b[i];
            b->ln1 = tg_layernorm_new(w->m, "ln1", 128, 1e-5, 1);
            b->q = tg_linear_new(w->m, "q", 128, 128, NULL);
            b->k = tg_linear_new(w->m, "k", 128, 128, NULL);
            b->v = tg_linear_new(w->m, "v", 128, 128, NULL);
            b->o = tg_linear_new(w->m, "o", 128, 128, NULL);
            b->ln2 = tg_layernorm_new(w->m, "ln2", 128, 1e-5, 1);
            b->f1 = tg_linear_new(w->m, "f1", 128, 512, NULL);
            b->f2 = tg_linear_new(w->m, "f2", 512, 128, NULL);
            tg_model_pop(w->m);
        }
        g->lnf = tg_layernorm_new(w->m, "lnf", 128, 1e-5, 1);
        g->head = tg_linear_new(w->m, "head", 128, 65, NULL);
        *w = (workload){ name, 16, 64, 64, true, w->m, g, gpt_loss };
    } else if (strcmp(name, "digits_cnn") == 0) {
        the_cnn.c1 = tg_conv2d_new(w->m, "c1", 1, 16, 3, 1, 1, 1);
        the_cnn.c2 = tg_conv2d_new(w->m, "c2", 16, 32, 3, 1, 1, 1);
        the_cnn.l2 = tg_linear_new(w->m, "l2", 32 * 2 * 2, 10, NULL);
        *w = (workload){ name, 32, 64, 1, false, w->m, &the_cnn, cnn_loss };
    } else {
        return false;
    }
    return true;
}

/* Rows [first, first + rows) of step s's global batch: a pure function of (step, row). */
static void batch(const workload *w, int s, int first, int rows, float *xf, int32_t *xi, int32_t *y) {
    for (int r = 0; r < rows; r++) {
        check_rng = ((uint64_t)s << 32) ^ (uint64_t)(first + r) ^ 0x5EEDull;
        for (int i = 0; i < w->x_len; i++) {
            if (w->tokens) xi[r * w->x_len + i] = (int32_t)(check_next() % 65);
            else xf[r * w->x_len + i] = (float)check_uniform(0, 16);
        }
        for (int i = 0; i < w->y_len; i++) y[r * w->y_len + i] = (int32_t)(check_next() % (w->tokens ? 65 : 10));
    }
}

typedef struct { int rows; int n_dev; const int *devices; const tg_dist_spec *dist; } setup;

/* "cuda"; TG_DIST_GPU_BACKEND=cpu runs the same flow on the host (to try the script without GPUs). */
static const char *backend(void) {
    const char *b = getenv("TG_DIST_GPU_BACKEND");
    return b && b[0] ? b : "cuda";
}

static tg_train *compile(const workload *w, setup s, tg_error *err) {
    tg_input_decl in[2] = { { "x", w->tokens ? TG_INT32 : TG_FLOAT32, { 2, { s.rows, w->x_len } } },
                            { "y", TG_INT32, { w->y_len > 1 ? 2 : 1, { s.rows, w->y_len } } } };
    return tg_compile(&(tg_train_spec){ .model = w->m, .loss = w->loss, .ctx = w->ctx, .inputs = in, .n_inputs = 2,
                                        .optimizer = tg_adam(1e-3), .backend = backend(), .devices = s.devices,
                                        .n_devices = s.n_dev, .dist = s.dist }, err);
}

static tg_result step(const workload *w, tg_train *t, int s, int first, int rows) {
    static float xf[MAX_GPUS * 32 * 64];   /* the largest global batch: 8 GPUs of 32 digits (or of 16 x 64 tokens) */
    static int32_t xi[MAX_GPUS * 32 * 64], y[MAX_GPUS * 32 * 64];
    batch(w, s, first, rows, xf, xi, y);
    size_t nx = (size_t)(rows * w->x_len), ny = (size_t)(rows * w->y_len);
    return tg_step(t, (tg_data[]){ w->tokens ? tg_i32("x", xi, nx) : tg_f32("x", xf, nx), tg_i32("y", y, ny) }, 2);
}

/* A hash of every parameter's bytes (equal hashes: identical parameters). */
static uint64_t params_hash(tg_train *t) {
    uint64_t h = 1469598103934665603ull;
    tg_error err;
    for (int i = 0; i < tg_train_n_params(t); i++) {
        size_t n = (size_t)tg_numel(tg_train_param_shape(t, i));
        float *v = malloc(sizeof(float) * n);
        if (v && tg_download_param(t, tg_train_param_name(t, i), v, n, &err) == TG_OK)
            for (size_t k = 0; k < n * sizeof(float); k++) h = (h ^ ((uint8_t *)v)[k]) * 1099511628211ull;
        free(v);
    }
    return h;
}

/* Every local replica holds replica 0's parameters, bit for bit. */
static bool replicas_identical(tg_train *t) {
    bool same = true;
    tg_error err;
    for (int i = 0; i < tg_train_n_params(t) && same; i++) {
        size_t n = (size_t)tg_numel(tg_train_param_shape(t, i));
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        same = a && b && dist_replica_param(t, 0, tg_train_param_name(t, i), a, n, &err) == TG_OK;
        for (int r = 1; r < tg_train_replicas(t) && same; r++)
            same = dist_replica_param(t, r, tg_train_param_name(t, i), b, n, &err) == TG_OK && memcmp(a, b, sizeof(float) * n) == 0;
        free(a);
        free(b);
    }
    return same;
}

typedef struct { float loss[STEPS]; uint64_t hash[STEPS]; int done; double seconds; char error[TG_ERROR_LEN + 64]; } trace;

/* Steps [from, STEPS) on rows [first, first + rows) of each global batch; a checkpoint at SAVE_AT
 * when save is given; replicas compared after every step when check_replicas. */
static void run(const workload *w, tg_train *t, int from, int first, int rows, const char *save, bool check_replicas,
                trace *out) {
    tg_error err;
    for (int s = from; s < STEPS; s++) {
        if (save && s == SAVE_AT) CHECK(tg_save(t, save, 1, &err) == TG_OK, "%s: save %s: %s", w->name, save, err.msg);
        tg_result r = step(w, t, s, first, rows);
        CHECK(r.status == TG_OK, "%s step %d: %s", w->name, s, r.error);
        if (r.status != TG_OK) return;
        out->loss[s] = r.loss;
        out->hash[s] = params_hash(t);
        out->done = s + 1;
        if (check_replicas) CHECK(replicas_identical(t), "%s step %d: the GPUs' parameters differ", w->name, s);
    }
}

static double worst_diff(const trace *a, const trace *b, int from) {
    double worst = 0;
    for (int s = from; s < STEPS; s++) {
        double d = fabs((double)a->loss[s] - b->loss[s]) / (fabs(a->loss[s]) > 1 ? fabs(a->loss[s]) : 1);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

static void compare(const char *what, const trace *a, const trace *b, int from) {
    double d = worst_diff(a, b, from);
    CHECK(a->done == STEPS && b->done == STEPS && d <= BOUND, "%s: losses differ by %.3g (bound %g)", what, d, BOUND);
    printf("test_dist_gpu: %s: largest relative loss difference %.3g over steps %d..%d\n", what, d, from + 1, STEPS);
}

/* ----- one process, N GPUs ----- */

static void single_process(const char *name, const char *dir) {
    static const int first[] = { 0 };
    workload w;
    make(&w, name);
    int global = n_gpus * w.per_gpu;
    char one_ckpt[600], dp_ckpt[600];
    snprintf(one_ckpt, sizeof one_ckpt, "%s/%s.sp.one.safetensors", dir, name);
    snprintf(dp_ckpt, sizeof dp_ckpt, "%s/%s.sp.dp.safetensors", dir, name);
    tg_error err;
    static trace one, dp, dp1, resumed;
    memset(&one, 0, sizeof one);
    memset(&dp, 0, sizeof dp);
    tg_train *t = compile(&w, (setup){ .rows = global }, &err);
    CHECK(t != NULL, "%s on one GPU: %s", name, err.msg);
    if (t) run(&w, t, 0, 0, global, one_ckpt, false, &one);
    tg_destroy(t);
    t = compile(&w, (setup){ .rows = global, .n_dev = n_gpus, .devices = all_gpus }, &err);
    CHECK(t != NULL, "%s on GPUs 0..%d: %s", name, n_gpus - 1, err.msg);
    if (t) run(&w, t, 0, 0, global, dp_ckpt, true, &dp);
    tg_destroy(t);
    compare("one process, N GPUs vs 1 GPU at the same global batch", &dp, &one, 0);
    memset(&dp1, 0, sizeof dp1);
    t = compile(&w, (setup){ .rows = global, .n_dev = 1, .devices = first }, &err);
    CHECK(t != NULL, "%s, devices {0}: %s", name, err.msg);
    if (t) run(&w, t, 0, 0, global, NULL, false, &dp1);
    tg_destroy(t);
    compare("devices {0} (a job of one) vs the plain handle", &dp1, &one, 0);
    /* checkpoints: N -> 1, 1 -> N, N -> N */
    const struct { const char *what; int n_dev; const trace *want; } moves[] = {
        { "checkpoint N GPUs -> 1", 0, &dp }, { "checkpoint 1 GPU -> N", n_gpus, &one }, { "checkpoint N -> N", n_gpus, &dp } };
    for (int k = 0; k < 3; k++) {
        const char *file = k == 1 ? one_ckpt : dp_ckpt;
        memset(&resumed, 0, sizeof resumed);
        t = compile(&w, (setup){ .rows = global, .n_dev = moves[k].n_dev, .devices = moves[k].n_dev ? all_gpus : NULL }, &err);
        CHECK(t && tg_load(t, file, 1, &err) == TG_OK, "%s: %s", moves[k].what, err.msg);
        if (t) run(&w, t, SAVE_AT, 0, global, NULL, moves[k].n_dev > 1, &resumed);
        compare(moves[k].what, &resumed, moves[k].want, SAVE_AT);
        if (k == 2 && !w.tokens) {   /* the CNN's steps are the same bits every run */
            int same = 0, apart = -1;
            for (int s = SAVE_AT; s < STEPS; s++) {
                same += resumed.loss[s] == dp.loss[s];
                if (apart < 0 && resumed.loss[s] != dp.loss[s]) apart = s;
            }
            /* where they part: the step's parameters (before it and after it) the same or not */
            CHECK(same == STEPS - SAVE_AT, "N -> N resumes the unbroken run's losses exactly (%d of %d; first apart at step %d, "
                  "parameters %s before it, %s after it)", same, STEPS - SAVE_AT, apart + 1,
                  apart > SAVE_AT && resumed.hash[apart - 1] != dp.hash[apart - 1] ? "apart" : "alike",
                  apart >= 0 && resumed.hash[apart] != dp.hash[apart] ? "apart" : "alike");
        }
        tg_destroy(t);
    }
    tg_model_free(w.m);
}

/* A step whose averaged gradients are not finite (a NaN in the last GPU's rows) fails on every
 * GPU and changes nothing: each GPU's update replaces its parameters in place only after kcheck
 * found the averaged gradients finite; the next good step trains. */
static void bad_step(void) {
    workload w;
    make(&w, "digits_cnn");
    int global = n_gpus * w.per_gpu;
    tg_error err;
    tg_train *t = compile(&w, (setup){ .rows = global, .n_dev = n_gpus, .devices = all_gpus }, &err);
    CHECK(t != NULL, "digits_cnn on GPUs 0..%d: %s", n_gpus - 1, err.msg);
    if (t) {
        CHECK(step(&w, t, 0, 0, global).status == TG_OK, "a good step");
        uint64_t before = params_hash(t);
        static float xf[MAX_GPUS * 32 * 64];
        static int32_t y[MAX_GPUS * 32];
        batch(&w, 1, 0, global, xf, NULL, y);
        xf[(global - 1) * w.x_len + 5] = NAN;
        tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xf, (size_t)(global * w.x_len)), tg_i32("y", y, (size_t)global) }, 2);
        CHECK(r.status == TG_FAILED && strstr(r.error, "unchanged"), "a NaN in the last GPU's rows fails the step: %s", r.error);
        CHECK(params_hash(t) == before && replicas_identical(t), "the failed step changed no GPU's parameters");
        CHECK(step(&w, t, 2, 0, global).status == TG_OK && params_hash(t) != before && replicas_identical(t),
              "the next good step trains every GPU");
        printf("test_dist_gpu: a NaN in one GPU's rows: %s\n", r.error);
    }
    tg_destroy(t);
    tg_model_free(w.m);
}

/* ----- files of the multi-process runs ----- */

static bool write_trace(const char *path, const trace *t) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fprintf(f, "done %d seconds %.3f\nerror %s\n", t->done, t->seconds, t->error[0] ? t->error : "-");
    for (int s = 0; s < t->done; s++) fprintf(f, "%d %.9g %016llx\n", s, t->loss[s], (unsigned long long)t->hash[s]);
    return fclose(f) == 0;
}

static bool read_trace(const char *path, trace *t) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fscanf(f, "done %d seconds %lf\nerror ", &t->done, &t->seconds) == 2 && fgets(t->error, sizeof t->error, f);
    for (int s = 0; ok && s < t->done && s < STEPS; s++) {
        int i;
        unsigned long long h;
        float l;
        ok = fscanf(f, "%d %f %llx", &i, &l, &h) == 3 && i >= 0 && i < STEPS;
        if (ok) t->loss[i] = l, t->hash[i] = h;
    }
    fclose(f);
    return ok;
}

static void path_of(char *buf, size_t len, const char *dir, const char *w, const char *what) {
    snprintf(buf, len, "%s/%s.%s", dir, w, what);
}

/* One GPU at the global batch, for the multi-process runs to be compared with. */
static int prepare(const char *name, const char *dir) {
    workload w;
    if (!make(&w, name)) return 2;
    char ckpt[600], txt[600];
    path_of(ckpt, sizeof ckpt, dir, name, "one.safetensors");
    path_of(txt, sizeof txt, dir, name, "one.txt");
    tg_error err;
    static trace one;
    tg_train *t = compile(&w, (setup){ .rows = n_gpus * w.per_gpu }, &err);
    CHECK(t != NULL, "%s: %s", name, err.msg);
    if (t) run(&w, t, 0, 0, n_gpus * w.per_gpu, ckpt, false, &one);
    CHECK(write_trace(txt, &one), "writing %s", txt);
    tg_destroy(t);
    tg_model_free(w.m);
    return check_report("test_dist_gpu");
}

/* One rank of an N-process job. */
static int rank_main(const char *name, const char *dir, bool resume, int die_at) {
    workload w;
    if (!make(&w, name)) return 2;
    tg_error err;
    tg_train *t = compile(&w, (setup){ .rows = w.per_gpu, .dist = &(tg_dist_spec){ 0 } }, &err);
    if (!t) {
        fprintf(stderr, "test_dist_gpu --rank: %s\n", err.msg);
        return 1;
    }
    int rank = tg_train_rank(t);
    static trace tr;
    char ckpt[600], txt[600], what[64];
    path_of(ckpt, sizeof ckpt, dir, name, resume ? "one.safetensors" : "dp.safetensors");
    if (resume && tg_load(t, ckpt, 1, &err) != TG_OK) {
        fprintf(stderr, "test_dist_gpu --rank: %s\n", err.msg);
        return 1;
    }
    for (int s = resume ? SAVE_AT : 0; s < STEPS; s++) {
        if (!resume && rank == 0 && s == SAVE_AT && !die_at && tg_save(t, ckpt, 1, &err) != TG_OK) snprintf(tr.error, sizeof tr.error, "%s", err.msg);
        if (die_at && s == die_at && rank == 1) _exit(0);   /* a rank that dies: no goodbye */
        uint64_t before = params_hash(t);
        double t0 = now();
        tg_result r = step(&w, t, s, rank * w.per_gpu, w.per_gpu);
        if (r.status != TG_OK) {
            tr.seconds = now() - t0;
            snprintf(tr.error, sizeof tr.error, "step %d: %s | unchanged %d", s, r.error, params_hash(t) == before);
            break;
        }
        tr.loss[s] = r.loss;
        tr.hash[s] = params_hash(t);
        tr.done = s + 1;
    }
    snprintf(what, sizeof what, "%s.rank%d.txt", die_at ? "die" : resume ? "resume" : "run", rank);
    path_of(txt, sizeof txt, dir, name, what);
    bool ok = write_trace(txt, &tr);
    tg_destroy(t);
    tg_model_free(w.m);
    return ok && (!tr.error[0] || die_at) ? 0 : 1;
}

static int check_main(const char *name, const char *dir) {
    workload w;
    if (!make(&w, name)) return 2;
    static trace r0, rk, one, res0, resk, back;
    char p[600], what[64];
    path_of(p, sizeof p, dir, name, "run.rank0.txt");
    CHECK(read_trace(p, &r0), "read %s", p);
    path_of(p, sizeof p, dir, name, "one.txt");
    CHECK(read_trace(p, &one), "read %s", p);
    path_of(p, sizeof p, dir, name, "resume.rank0.txt");
    CHECK(read_trace(p, &res0), "read %s", p);
    for (int k = 1; k < n_gpus; k++) {   /* every rank against rank 0 */
        snprintf(what, sizeof what, "run.rank%d.txt", k);
        path_of(p, sizeof p, dir, name, what);
        CHECK(read_trace(p, &rk), "read %s", p);
        int same = 0;
        for (int s = 0; s < STEPS; s++) same += r0.loss[s] == rk.loss[s] && r0.hash[s] == rk.hash[s];
        CHECK(r0.done == STEPS && same == STEPS,
              "N processes: rank %d reports rank 0's loss and parameters after every step (%d of %d)", k, same, STEPS);
        snprintf(what, sizeof what, "resume.rank%d.txt", k);
        path_of(p, sizeof p, dir, name, what);
        CHECK(read_trace(p, &resk), "read %s", p);
        same = 0;
        for (int s = SAVE_AT; s < STEPS; s++) same += res0.hash[s] == resk.hash[s];
        CHECK(same == STEPS - SAVE_AT, "N processes resumed from one GPU's checkpoint: rank %d's parameters are rank 0's (%d of %d)",
              k, same, STEPS - SAVE_AT);
    }
    compare("N processes vs 1 GPU at the same global batch", &r0, &one, 0);
    compare("checkpoint 1 GPU -> N processes", &res0, &one, SAVE_AT);
    /* N processes -> one GPU */
    tg_error err;
    path_of(p, sizeof p, dir, name, "dp.safetensors");
    tg_train *t = compile(&w, (setup){ .rows = n_gpus * w.per_gpu }, &err);
    CHECK(t && tg_load(t, p, 1, &err) == TG_OK, "one GPU loads %s: %s", p, err.msg);
    if (t) run(&w, t, SAVE_AT, 0, n_gpus * w.per_gpu, NULL, false, &back);
    compare("checkpoint N processes -> 1 GPU", &back, &r0, SAVE_AT);
    tg_destroy(t);
    tg_model_free(w.m);
    return check_report("test_dist_gpu");
}

static int check_die(const char *name, const char *dir) {
    static trace d0;
    char p[600];
    path_of(p, sizeof p, dir, name, "die.rank0.txt");
    CHECK(read_trace(p, &d0), "read %s", p);
    double timeout = getenv("TG_DIST_TIMEOUT") ? atof(getenv("TG_DIST_TIMEOUT")) : DIST_DEFAULT_TIMEOUT;
    printf("test_dist_gpu: rank 1 died: rank 0's step failed after %.1f s: %s", d0.seconds, d0.error);
    CHECK(strstr(d0.error, "step ") && strstr(d0.error, "unchanged 1"), "rank 0 failed a step and changed nothing: %s", d0.error);
    CHECK(d0.seconds < timeout + 10, "within the timeout (%.1f s, timeout %g s)", d0.seconds, timeout);
    return check_report("test_dist_gpu");
}

int main(int argc, char **argv) {
    const char *g = getenv("TG_TEST_GPUS");
    if (g && atoi(g) >= 2 && atoi(g) <= MAX_GPUS) n_gpus = atoi(g);
    if (argc >= 4 && strcmp(argv[1], "--prepare") == 0) return prepare(argv[2], argv[3]);
    if (argc >= 4 && strcmp(argv[1], "--check") == 0) return check_main(argv[2], argv[3]);
    if (argc >= 4 && strcmp(argv[1], "--check-die") == 0) return check_die(argv[2], argv[3]);
    if (argc >= 4 && strcmp(argv[1], "--rank") == 0) {
        bool resume = false;
        int die_at = 0;
        for (int i = 4; i < argc; i++) {
            if (strcmp(argv[i], "--resume") == 0) resume = true;
            else if (strcmp(argv[i], "--die-at") == 0 && i + 1 < argc) die_at = atoi(argv[++i]);
        }
        return rank_main(argv[2], argv[3], resume, die_at);
    }
    char why[TG_ERROR_LEN];
    workload w;
    tg_error err;
    bool can = tg_distributed_available(backend(), why, sizeof why);
    if (can && make(&w, "digits_cnn")) {   /* N GPUs? */
        tg_train *t = compile(&w, (setup){ .rows = 32 * n_gpus, .n_dev = n_gpus, .devices = all_gpus }, &err);
        if (!t) snprintf(why, sizeof why, "%s", err.msg);
        can = t != NULL;
        tg_destroy(t);
        tg_model_free(w.m);
    }
    if (!can) {
        printf("test_dist_gpu: skipped, needs %d CUDA devices and NCCL (%s); tests/run_gpu_multi.sh runs it\n", n_gpus, why);
        return check_report("test_dist_gpu");
    }
    char dir[] = "/tmp/tg_test_dist_gpu_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    single_process("char_gpt_small", dir);
    single_process("digits_cnn", dir);
    bad_step();
    return check_report("test_dist_gpu");
}
