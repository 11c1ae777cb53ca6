/* The benchmark workloads of bench/peers/torch_workloads.py, in tensorgrad: the same models,
 * shapes, batch sizes, precision, Adam and learning rates. Prints one line per workload in the
 * peer's format (ms/step median and min over 5 repeats after warm-up), plus compile times, peak
 * resident memory, launches per step (CUDA) and the TFLOP/s of its products and attention.
 *
 *   bench [--backend cpu|cuda|reference] [--precision f32|tf32|bf16] [--steps-scale X] [--kernels DIR]
 *         [--devices 0,1] [--dist] [--steps-per-call N] [--batch device|host] [workload ...]
 *
 * The timed steps go through tg_steps, 16 per call (--steps-per-call; 1: tg_step each): on a GPU
 * they are queued without waiting for each loss, as the peer's CUDA-graph loop replays its graph
 * and reads the loss once per repeat. Every step reads the workload's one batch, as the peer's:
 * given once (by the warm-up steps) and kept on the device, as the peer keeps its tensors there
 * (tg_steps without inputs); --batch host passes it with every call, copied in each step.
 *
 * Data parallel: --devices 0,1 trains on those GPUs in this process, each with the workload's
 * batch (the global batch is that times the device count); --dist makes this process one rank of
 * a job launched like torchrun (torchrun --nproc_per_node 2 --no-python build/bench/bench --dist
 * ...), each rank with the workload's batch per device. Rank 0 prints, with the job's replica
 * count and samples (sequences or images) per second over the whole job.
 *
 * --kernels DIR writes each workload's generated kernel source to DIR/<workload>.<backend>.txt
 * and its graph's nodes (id, op, shape) beside it, and times nothing (to compare the code
 * generators' output across changes).
 */
#include "tensorgrad.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (every thread): with one thread, a step's time net of whatever
 * else the machine runs. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static double uniform(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (rng >> 11) * (1.0 / 9007199254740992.0);
}
static double gauss(void) { return sqrt(-2 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform()); }

/* ----- models ----- */

#define MAX_LAYERS 12
typedef struct { tg_linear l[4]; int n; } mlp;

static tg_tensor mlp_forward(const mlp *m, tg_tensor x) {
    for (int i = 0; i < m->n; i++) {
        x = tg_linear(&m->l[i], x);
        if (i < m->n - 1) x = tg_relu(x);
    }
    return x;
}

static tg_tensor sin_loss(const void *ctx, const tg_tensor *in) {
    return tg_mean(tg_square(tg_sub(mlp_forward(ctx, in[0]), in[1])), TG_ALL, 0);
}

static tg_tensor mnist_loss(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(mlp_forward(ctx, in[0]), in[1], TG_MEAN);
}

typedef struct { tg_conv2d_layer c1, c2; tg_linear f1, f2; } cnn;

static tg_tensor cnn_loss(const void *ctx, const tg_tensor *in) {
    const cnn *m = ctx;
    tg_tensor x = tg_max_pool2d(tg_relu(tg_conv(&m->c1, in[0])), 2, 2, 0);
    x = tg_max_pool2d(tg_relu(tg_conv(&m->c2, x)), 2, 2, 0);
    x = tg_relu(tg_linear(&m->f1, tg_flatten(x, 1)));
    return tg_cross_entropy(tg_linear(&m->f2, x), in[1], TG_MEAN);
}

typedef struct { tg_layernorm ln1, ln2; tg_linear q, k, v, o, f1, f2; } block;
typedef struct {
    int V, T, d, h, L;
    tg_embedding_layer tok, pos;
    block b[MAX_LAYERS];
    tg_layernorm lnf;
    tg_linear head;
} gpt;

static tg_tensor block_forward(const gpt *g, const block *b, tg_tensor x) {
    tg_tensor y = tg_layernorm(&b->ln1, x);
    tg_tensor q = tg_split_heads(tg_linear(&b->q, y), g->h);
    tg_tensor k = tg_split_heads(tg_linear(&b->k, y), g->h);
    tg_tensor v = tg_split_heads(tg_linear(&b->v, y), g->h);
    tg_tensor att = tg_mul(tg_matmul(q, tg_swapaxes(k, -1, -2)), 1.0 / sqrt((double)(g->d / g->h)));
    y = tg_merge_heads(tg_matmul(tg_softmax_causal(att), v));
    x = tg_add(x, tg_linear(&b->o, y));
    return tg_add(x, tg_linear(&b->f2, tg_gelu(tg_linear(&b->f1, tg_layernorm(&b->ln2, x)))));
}

static tg_tensor gpt_loss(const void *ctx, const tg_tensor *in) {
    const gpt *g = ctx;
    tg_tensor x = tg_add(tg_embed(&g->tok, in[0]), tg_embed(&g->pos, tg_arange(g->T, TG_INT32)));
    for (int i = 0; i < g->L; i++) x = block_forward(g, &g->b[i], x);
    tg_tensor logits = tg_linear(&g->head, tg_layernorm(&g->lnf, x));
    return tg_cross_entropy(logits, in[1], TG_MEAN);
}

/* ----- workloads ----- */

/* PyTorch's default initialisations, matched in variance so both libraries train the same models:
 * nn.Linear/nn.Conv2d draw U(+-1/sqrt(fan_in)) (std 1/sqrt(3 fan_in)), nn.Embedding N(0, 1). */
static tg_linear torch_linear(tg_model *m, const char *name, int64_t in, int64_t out) {
    tg_linear_opts o = { .has_init = 1, .init = tg_init_randn(1 / sqrt(3.0 * (double)in)) };
    return tg_linear_new(m, name, in, out, &o);
}

static tg_embedding_layer torch_embedding(tg_model *m, const char *name, int64_t vocab, int64_t dim) {
    tg_model_push(m, "%s", name);
    tg_embedding_layer e = { tg_param_new(m, "W", TG_SHAPE(vocab, dim), tg_init_randn(1.0)) };
    tg_model_pop(m);
    return e;
}

static tg_conv2d_layer torch_conv(tg_model *m, const char *name, int64_t in, int64_t out, int k) {
    tg_conv2d_layer c = { .has_bias = 1, .stride = 1, .padding = k / 2 };
    tg_model_push(m, "%s", name);
    c.W = tg_param_new(m, "W", TG_SHAPE(out, in, k, k), tg_init_randn(1 / sqrt(3.0 * (double)(in * k * k))));
    c.b = tg_param_new(m, "b", TG_SHAPE(out), tg_init_zeros());
    tg_model_pop(m);
    return c;
}

typedef struct {
    const char *name;
    int steps, gpu_steps;   /* per repeat, as the peer on CPU and on CUDA */
    tg_model *m;
    void *model;            /* mlp, cnn or gpt */
    tg_forward_fn loss;
    tg_input_decl in[2];
    float *x;
    int32_t *xi, *y;
    float *yf;
    double lr;
} workload;

static mlp the_mlp;
static cnn the_cnn;
static gpt the_gpt;

static void make_mlp(workload *w, const int *dims, int n) {
    w->m = tg_model_new(0);
    the_mlp.n = n - 1;
    for (int i = 0; i + 1 < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "ls.%d", i);
        the_mlp.l[i] = torch_linear(w->m, name, dims[i], dims[i + 1]);
    }
    w->model = &the_mlp;
}

static void make_gpt(workload *w, int V, int T, int d, int h, int L, int B) {
    gpt *g = &the_gpt;
    *g = (gpt){ .V = V, .T = T, .d = d, .h = h, .L = L };
    w->m = tg_model_new(0);
    g->tok = torch_embedding(w->m, "tok", V, d);
    g->pos = torch_embedding(w->m, "pos", T, d);
    for (int i = 0; i < L; i++) {
        tg_model_push(w->m, "blocks.%d", i);
        block *b = &g->b[i];
        b->ln1 = tg_layernorm_new(w->m, "ln1", d, 1e-5, 1);
        b->q = torch_linear(w->m, "q", d, d);
        b->k = torch_linear(w->m, "k", d, d);
        b->v = torch_linear(w->m, "v", d, d);
        b->o = torch_linear(w->m, "o", d, d);
        b->ln2 = tg_layernorm_new(w->m, "ln2", d, 1e-5, 1);
        b->f1 = torch_linear(w->m, "f1", d, 4 * d);
        b->f2 = torch_linear(w->m, "f2", 4 * d, d);
        tg_model_pop(w->m);
    }
    g->lnf = tg_layernorm_new(w->m, "lnf", d, 1e-5, 1);
    g->head = torch_linear(w->m, "head", d, V);
    w->model = g;
    w->loss = gpt_loss;
    w->in[0] = (tg_input_decl)TG_I32("x", B, T);
    w->in[1] = (tg_input_decl)TG_I32("y", B, T);
    w->xi = malloc(sizeof(int32_t) * (size_t)(B * T));
    w->y = malloc(sizeof(int32_t) * (size_t)(B * T));
    for (int i = 0; i < B * T; i++) {
        w->xi[i] = (int32_t)(uniform() * V);
        w->y[i] = (int32_t)(uniform() * V);
    }
    w->lr = 1e-3;
}

/* Data parallel: this process's devices, a rank of a multi-process job, and its batch multiple
 * (every workload's batch is per replica). */
static int devices[16], n_devices;
static bool distributed;
static int batch_mult = 1;
static int per_call = 16;   /* timed steps per tg_steps call (--steps-per-call) */
static bool batch_host;     /* --batch host: the batch passed to every call, not kept on the device */

static bool make(workload *w, const char *name) {
    memset(w, 0, sizeof *w);
    w->name = name;
    const int m = batch_mult;
    if (strcmp(name, "sin_mlp") == 0) {
        make_mlp(w, (int[]){ 1, 64, 64, 1 }, 4);
        w->loss = sin_loss;
        w->in[0] = (tg_input_decl)TG_F32("x", 256 * m, 1);
        w->in[1] = (tg_input_decl)TG_F32("y", 256 * m, 1);
        w->x = malloc(sizeof(float) * 256 * m);
        w->yf = malloc(sizeof(float) * 256 * m);
        for (int i = 0; i < 256 * m; i++) {
            w->x[i] = (float)(uniform() * 2 * M_PI - M_PI);
            w->yf[i] = sinf(w->x[i]);
        }
        w->lr = 5e-3;
        w->steps = 200;
        w->gpu_steps = 500;
    } else if (strcmp(name, "mnist_mlp") == 0) {
        make_mlp(w, (int[]){ 784, 512, 512, 10 }, 4);
        w->loss = mnist_loss;
        w->in[0] = (tg_input_decl)TG_F32("x", 128 * m, 784);
        w->in[1] = (tg_input_decl)TG_I32("y", 128 * m);
        w->x = malloc(sizeof(float) * 128 * m * 784);
        w->y = malloc(sizeof(int32_t) * 128 * m);
        for (int i = 0; i < 128 * m * 784; i++) w->x[i] = (float)gauss();
        for (int i = 0; i < 128 * m; i++) w->y[i] = (int32_t)(uniform() * 10);
        w->lr = 1e-3;
        w->steps = 100;
        w->gpu_steps = 500;
    } else if (strcmp(name, "cifar_cnn") == 0) {
        w->m = tg_model_new(0);
        the_cnn.c1 = torch_conv(w->m, "c1", 3, 32, 3);
        the_cnn.c2 = torch_conv(w->m, "c2", 32, 64, 3);
        the_cnn.f1 = torch_linear(w->m, "f1", 64 * 8 * 8, 256);
        the_cnn.f2 = torch_linear(w->m, "f2", 256, 10);
        w->model = &the_cnn;
        w->loss = cnn_loss;
        w->in[0] = (tg_input_decl)TG_F32("x", 64 * m, 3, 32, 32);
        w->in[1] = (tg_input_decl)TG_I32("y", 64 * m);
        w->x = malloc(sizeof(float) * 64 * m * 3 * 32 * 32);
        w->y = malloc(sizeof(int32_t) * 64 * m);
        for (int i = 0; i < 64 * m * 3 * 32 * 32; i++) w->x[i] = (float)gauss();
        for (int i = 0; i < 64 * m; i++) w->y[i] = (int32_t)(uniform() * 10);
        w->lr = 1e-3;
        w->steps = 20;
        w->gpu_steps = 200;
    } else if (strcmp(name, "char_gpt_small") == 0) {
        make_gpt(w, 65, 64, 128, 4, 2, 16 * m);
        w->steps = 20;
        w->gpu_steps = 200;
    } else if (strcmp(name, "char_gpt") == 0) {
        make_gpt(w, 65, 256, 384, 6, 6, 64 * m);
        w->steps = 10;
        w->gpu_steps = 50;
    } else if (strcmp(name, "gpt2_small") == 0) {   /* GPT-2 small's shape (124M parameters): the scaling runs */
        make_gpt(w, 50257, 512, 768, 12, 12, 8 * m);
        w->steps = 2;
        w->gpu_steps = 20;
    } else {
        return false;
    }
    return true;
}

static void release(workload *w) {
    free(w->x);
    free(w->xi);
    free(w->y);
    free(w->yf);
    tg_model_free(w->m);
}

static tg_precision precision = TG_PRECISION_F32;

static tg_train *compile(workload *w, const char *backend, double *seconds) {
    tg_error err;
    double t0 = now();
    tg_train *t = tg_compile(&(tg_train_spec){ .model = w->m, .loss = w->loss, .ctx = w->model, .inputs = w->in,
                                               .n_inputs = 2, .optimizer = tg_adam(w->lr), .backend = backend,
                                               .precision = precision, .devices = n_devices ? devices : NULL,
                                               .n_devices = n_devices, .dist = distributed ? &(tg_dist_spec){ 0 } : NULL },
                             &err);
    *seconds = now() - t0;
    if (!t) fprintf(stderr, "%s: compile failed: %s\n", w->name, err.msg);
    return t;
}

/* The FLOPs of a step's matrix products and attention, from the graph's shapes: 2 M N K per
 * product; attention 4 T S D forward (two products) and 10 T S D for its three gradients (five),
 * counted dense (a causal mask halves the useful work; the graph API does not say which are
 * causal). T is the last axis of the row statistics (the forward's next node, the gradients'
 * sixth input) whether or not the heads are interleaved in q, k and v, and numel(k) = batch S D. */
static double step_flops(const tg_graph *g) {
    double flops = 0;
    for (int i = 0; i < tg_graph_n_nodes(g); i++) {
        tg_node_info n = tg_graph_node(g, i);
        if (!strcmp(n.op, "matmul")) {
            tg_shape a = tg_graph_node(g, n.inputs[0]).shape;
            int64_t M = n.shape.d[n.shape.ndim - 2], a0 = a.d[a.ndim - 2], a1 = a.d[a.ndim - 1];
            flops += 2.0 * (double)tg_numel(n.shape) * (double)(a0 == M ? a1 : a0);
        } else if (!strcmp(n.op, "attention") || !strcmp(n.op, "attention_backward")) {
            bool fwd = !strcmp(n.op, "attention");
            tg_shape lse = tg_graph_node(g, fwd ? i + 1 : n.inputs[5]).shape;   /* tg_attention puts it there */
            double tsd = (double)tg_numel(tg_graph_node(g, n.inputs[1]).shape) * (double)lse.d[lse.ndim - 1];   /* batch S D times T */
            int64_t qkv = 0;   /* a gradient node as large as q, k and v together holds all three (packed) */
            for (int k = 0; k < 3; k++) qkv += tg_numel(tg_graph_node(g, n.inputs[k]).shape);
            flops += fwd ? 4 * tsd : 10.0 / 3 * tsd * (tg_numel(n.shape) == qkv ? 3 : 1);
        }
    }
    return flops;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The generated kernels of a compiled workload, to DIR/<workload>.<backend>.txt. */
static int dump_kernels(tg_train *t, const char *dir, const char *name, const char *backend) {
    printf("%s: %.1f GFLOP per step in products and attention\n", name, step_flops(tg_train_graph(t)) / 1e9);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s.txt", dir, name, backend);
    const char *src = tg_train_kernel_source(t);
    FILE *f = fopen(path, "w");
    if (!f || !src || fputs(src, f) < 0) {
        fprintf(stderr, "%s: cannot write %s\n", name, path);
        if (f) fclose(f);
        return 1;
    }
    if (fclose(f) != 0) return 1;
    snprintf(path, sizeof path, "%s/%s.%s.nodes.txt", dir, name, backend);   /* what k<id> computes, from which nodes */
    const tg_graph *g = tg_train_graph(t);
    if (!(f = fopen(path, "w"))) return 1;
    for (int i = 0; i < tg_graph_n_nodes(g); i++) {
        tg_node_info n = tg_graph_node(g, i);
        fprintf(f, "%d %s", i, n.op);
        for (int k = 0; k < n.shape.ndim; k++) fprintf(f, "%s%lld", k ? "x" : " ", (long long)n.shape.d[k]);
        for (int k = 0; k < n.n_inputs; k++) fprintf(f, "%s%d", k ? " " : " <- ", n.inputs[k]);
        if (n.name) fprintf(f, " (%s)", n.name);
        fprintf(f, "\n");
    }
    return fclose(f) != 0;
}

static int run(const char *name, const char *backend, double scale, const char *kernels_dir) {
    workload w;
    if (!make(&w, name)) {
        fprintf(stderr, "unknown workload %s\n", name);
        return 1;
    }
    double cold, warm;
    tg_train *t = compile(&w, backend, &cold);
    if (!t) return 1;
    if (kernels_dir) {
        int rc = dump_kernels(t, kernels_dir, name, backend);
        tg_destroy(t);
        release(&w);
        return rc;
    }
    tg_destroy(t);
    t = compile(&w, backend, &warm);   /* the same graph again: a kernel-cache hit */
    if (!t) return 1;
    int64_t bt = tg_numel(w.in[0].shape), by = tg_numel(w.in[1].shape);
    tg_data data[2] = {
        w.x ? tg_f32("x", w.x, (size_t)bt) : tg_i32("x", w.xi, (size_t)bt),
        w.yf ? tg_f32("y", w.yf, (size_t)by) : tg_i32("y", w.y, (size_t)by),
    };
    /* Warm-up: five steps (the peer's), and on for at least a fifth of a second, so that a
     * workload of microseconds a step starts its repeats warm too */
    tg_result r = { 0 };
    double w0 = now();
    for (int i = 0; (i < 5 || now() - w0 < 0.2) && (i == 0 || r.status == TG_OK); i++) {
        r = i < 5 ? tg_step(t, data, 2) : tg_step(t, NULL, 0);
        if (getenv("TG_BENCH_LOSSES") && i < 5) fprintf(stderr, "%s warm-up step %d: loss %.4f\n", name, i + 1, r.loss);
    }
    /* --batch host: per_call copies of the batch back to back, for tg_steps (else it stays on the device) */
    int copies = batch_host ? per_call : 1;
    char *many[2] = { malloc((size_t)bt * 4 * copies), malloc((size_t)by * 4 * copies) };
    if (!many[0] || !many[1]) r = (tg_result){ .status = TG_FAILED, .error = "out of memory for the batches" };
    for (int k = 0; k < copies && many[0] && many[1]; k++) {
        memcpy(many[0] + (size_t)k * bt * 4, data[0].data, (size_t)bt * 4);
        memcpy(many[1] + (size_t)k * by * 4, data[1].data, (size_t)by * 4);
    }
    int base = strcmp(backend, "cuda") == 0 ? w.gpu_steps : w.steps;
    int steps = (int)(base * scale) > 0 ? (int)(base * scale) : 1;
    double times[5], cpu[5];
    for (int k = 0; k < 5 && r.status == TG_OK; k++) {
        double t0 = now(), c0 = cpu_now();
        for (int i = 0; i < steps && r.status == TG_OK; i += per_call) {
            int m = steps - i < per_call ? steps - i : per_call;
            tg_data batches[2] = { data[0], data[1] };
            batches[0].data = many[0];
            batches[0].n *= (size_t)m;
            batches[1].data = many[1];
            batches[1].n *= (size_t)m;
            if (batch_host) r = per_call == 1 ? tg_step(t, data, 2) : tg_steps(t, batches, 2, m, NULL);
            else r = per_call == 1 ? tg_step(t, NULL, 0) : tg_steps(t, NULL, 0, m, NULL);
        }
        times[k] = (now() - t0) / steps * 1e3;
        cpu[k] = (cpu_now() - c0) / steps * 1e3;
    }
    free(many[0]);
    free(many[1]);
    if (r.status != TG_OK) {
        fprintf(stderr, "%s: step failed: %s\n", name, r.error);
        return 1;
    }
    double sorted[5];
    memcpy(sorted, times, sizeof times);
    qsort(sorted, 5, sizeof(double), cmp_double);
    qsort(cpu, 5, sizeof(double), cmp_double);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    /* Everything the step keeps in (device) memory: the planned intermediates, the parameters
     * with Adam's two moments, and the inputs. */
    double state_mb = (tg_train_planned_bytes(t) + 4.0 * (3 * tg_train_param_total(t) + bt + by)) / 1048576.0;
    char kernels[32] = "", dp[96] = "";
    if (tg_train_launch_count(t) >= 0) snprintf(kernels, sizeof kernels, " kernels=%d", tg_train_launch_count(t));
    double tflops = step_flops(tg_train_graph(t)) / (sorted[2] * 1e-3) / 1e12;
    /* samples per second over the whole job: every replica's batch per step */
    int local = n_devices ? n_devices : 1;
    snprintf(dp, sizeof dp, " replicas=%d processes=%d samples/s=%.1f", tg_train_replicas(t), tg_train_replicas(t) / local,
             (double)w.in[0].shape.d[0] / local * tg_train_replicas(t) * 1e3 / sorted[2]);
    if (tg_train_rank(t) != 0) {   /* every rank measured; rank 0 speaks for the job */
        tg_destroy(t);
        release(&w);
        return 0;
    }
    printf("%-16s %-4s %-8s params=%9lld ms/step median=%8.3f min=%8.3f loss=%.4f compile cold=%.2fs warm=%.3fs "
           "planned=%.1fMB allocated=%.1fMB peak_rss=%.1fMB cpu_ms/step=%.3f%s precision=%s tflops=%.1f%s steps/call=%d batch=%s\n",
           name, backend, "tg", (long long)tg_train_param_total(t), sorted[2], sorted[0], r.loss, cold, warm,
           tg_train_planned_bytes(t) / 1048576.0, state_mb, ru.ru_maxrss / 1024.0, cpu[2], kernels,
           tg_precision_name(tg_train_precision(t)), tflops, dp, per_call, batch_host ? "host" : "device");
    fflush(stdout);
    tg_destroy(t);
    release(&w);
    return 0;
}

int main(int argc, char **argv) {
    const char *backend = "cpu";
    double scale = 1;
    const char *kernels_dir = NULL;
    const char *names[8];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
        else if (strcmp(argv[i], "--steps-scale") == 0 && i + 1 < argc) scale = atof(argv[++i]);
        else if (strcmp(argv[i], "--kernels") == 0 && i + 1 < argc) kernels_dir = argv[++i];
        else if (strcmp(argv[i], "--dist") == 0) distributed = true;
        else if (strcmp(argv[i], "--steps-per-call") == 0 && i + 1 < argc) per_call = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch_host = strcmp(argv[++i], "host") == 0;
        else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc) {
            for (char *p = argv[++i]; *p && n_devices < 16; p += *p == ',') devices[n_devices++] = (int)strtol(p, &p, 10);
        }
        else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
            const char *p = argv[++i];
            precision = !strcmp(p, "tf32") ? TG_PRECISION_TF32 : !strcmp(p, "bf16") ? TG_PRECISION_BF16 : TG_PRECISION_F32;
        }
        else if (n < 8) names[n++] = argv[i];
    }
    batch_mult = n_devices ? n_devices : 1;
    if (n == 0) {
        static const char *all[] = { "sin_mlp", "mnist_mlp", "cifar_cnn", "char_gpt_small" };
        for (n = 0; n < 4; n++) names[n] = all[n];
    }
    int rc = 0;
    for (int i = 0; i < n; i++) rc |= run(names[i], backend, scale, kernels_dir);
    return rc;
}
