/* The runtime: compiling a training spec (trace, autograd, optimizer, plan, backend), running
 * steps and forwards, and the parameter store that a training handle shares with the forward
 * graphs attached to it. */
#include "internal.h"
#include "io.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A graph made ready to run: its plan, its executor and its input buffers. The first n_inputs
 * nodes of the graph are its INPUT nodes, in declaration order (patch sites add more later). */
typedef struct {
    const tg_backend *be;
    tg_graph *g;
    void *exec;
    tg_input_decl *decls;     /* names owned by the graph's INPUT nodes */
    int n_inputs;
    void **input_buf;
} compiled;

#define MAX_SCHEDULE_CHAIN 8
#define DEFAULT_VARIANTS 8

/* One compiled form of a forward: for one value of its open dimensions (0 when it has none),
 * with or without patch sites selecting their values. */
typedef struct {
    int64_t size;
    bool patchable;
    compiled c;
    void **patch_buf;         /* per patch site of a patchable variant: its replacement buffer */
    uint64_t used;            /* the forward's call clock at its last use (LRU) */
} variant;

/* A patch set on a forward, by site name. */
typedef struct {
    char *site;
    tg_patch_mode mode;
    float *values;            /* TG_PATCH_VALUES */
    size_t n;
} patch_rule;

struct tg_forward {
    tg_train *train;
    tg_forward_fn fn;
    const void *ctx;
    tg_input_decl *decls;     /* as declared, TG_ANY kept; names owned */
    int n_inputs;
    bool open;
    int max_variants;
    variant **v;
    int n_v;
    variant *last;            /* the variant of the last call: output, captures, source */
    uint64_t clock;
    uint64_t generation;      /* the training handle's model generation its variants were traced for */
    patch_rule *patch;
    int n_patch;
    float *out;               /* the last output, and before rounding to float */
    double *host;
    int64_t out_cap;
    int64_t calls;            /* seeds randn/dropout: a new draw per call */
};

struct tg_train {
    pthread_mutex_t mu;       /* one lock for t and the forwards attached to it (they share buffers) */
    _Atomic uint64_t generation;  /* bumped when the model is replaced or t destroyed */
    async_queue *queue;       /* tg_step_submit / tg_run_submit */
    tg_model *model;
    const tg_backend *be;
    int n_params;
    void **param;             /* per model param id: backend buffers */
    void **state;             /* per optimizer state slot */
    compiled c;
    int loss;
    tg_optimizer opt;
    tg_schedule chain[MAX_SCHEDULE_CHAIN];  /* opt.lr and the schedules it points to, owned */
    int64_t sched_base;       /* the schedule's step 1 is step sched_base + 1 */
    int64_t step;
    double hyper[8];
    tg_forward **fwd;
    int n_fwd;
    tg_forward *eval;         /* the loss as a forward graph, for tg_eval_loss */
    void **wb_dst;            /* the backend's step hook: write-back targets by assign */
    tg_forward_fn loss_fn;
    const void *loss_ctx;
};

static tg_result result_of(tg_status st, const char *fmt, va_list ap) {
    tg_result r;
    memset(&r, 0, sizeof r);
    r.status = st;
    vsnprintf(r.error, sizeof r.error, fmt, ap);
    return r;
}

static tg_result failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static tg_result failed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tg_result r = result_of(TG_FAILED, fmt, ap);
    va_end(ap);
    return r;
}

static tg_result aborted(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static tg_result aborted(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tg_result r = result_of(TG_ABORTED, fmt, ap);
    va_end(ap);
    return r;
}

/* ----- live handles -----
 * Every handle handed out is registered until it is destroyed, so that a call with a destroyed
 * (or never valid) handle is refused rather than reading freed memory. */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static const void **live;
static int n_live, cap_live;

static bool registry_add(const void *h) {
    pthread_mutex_lock(&registry_mu);
    if (n_live == cap_live) {
        const void **grown = tg_realloc(live, sizeof(void *) * (size_t)(cap_live ? 2 * cap_live : 16));
        if (grown) {
            live = grown;
            cap_live = cap_live ? 2 * cap_live : 16;
        }
    }
    bool ok = n_live < cap_live;
    if (ok) live[n_live++] = h;
    pthread_mutex_unlock(&registry_mu);
    return ok;
}

static void registry_remove(const void *h) {
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < n_live; i++)
        if (live[i] == h) live[i] = live[--n_live];
    pthread_mutex_unlock(&registry_mu);
}

static bool registry_has(const void *h) {
    if (!h) return false;
    pthread_mutex_lock(&registry_mu);
    bool found = false;
    for (int i = 0; i < n_live && !found; i++) found = live[i] == h;
    pthread_mutex_unlock(&registry_mu);
    return found;
}

/* A live handle's family, locked; NULL when the handle is NULL or not live. */
static tg_train *lock_train(const tg_train *t) {
    if (!registry_has(t)) return NULL;
    pthread_mutex_lock(&((tg_train *)t)->mu);
    return (tg_train *)t;
}

static tg_train *lock_forward(const tg_forward *f) {
    if (!registry_has(f)) return NULL;
    pthread_mutex_lock(&f->train->mu);
    return f->train;
}

static void unlock(tg_train *t) { pthread_mutex_unlock(&t->mu); }

/* Why a handle was refused, for messages: "NULL training handle", "destroyed or invalid ...". */
static const char *dead(const void *h) { return h ? "destroyed or invalid" : "NULL"; }

/* ----- tracing ----- */

static bool check_decls(const tg_input_decl *in, int n, tg_error *err) {
    if (n < 0 || (n > 0 && !in)) { tg_seterr(err, "inputs: %d declared but no array given", n); return false; }
    for (int i = 0; i < n; i++) {
        if (!in[i].name || !in[i].name[0]) { tg_seterr(err, "input %d has no name", i); return false; }
        if (in[i].dtype != TG_FLOAT32 && in[i].dtype != TG_INT32) { tg_seterr(err, "input '%s': unknown dtype %d", in[i].name, (int)in[i].dtype); return false; }
        for (int j = 0; j < i; j++)
            if (strcmp(in[i].name, in[j].name) == 0) { tg_seterr(err, "input '%s' is declared twice", in[i].name); return false; }
    }
    return true;
}

/* Trace fn over fresh INPUT nodes (node i is input i) into a new graph; NULL with err set on
 * failure, including the first shape error any op recorded. */
static tg_graph *trace(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *in, int n, bool patchable,
                       tg_error *err) {
    if (!m) { tg_seterr(err, "no model given"); return NULL; }
    if (!fn) { tg_seterr(err, "no forward/loss function given"); return NULL; }
    if (tg_model_error(m)) { tg_seterr(err, "%s", tg_model_error(m)); return NULL; }
    if (!check_decls(in, n, err)) return NULL;
    tg_graph *g = ir_new(m);
    if (!g) { tg_seterr(err, "out of memory starting a trace"); return NULL; }
    g->patchable = patchable;
    for (int i = 0; i < n && ir_ok(g); i++) {
        char what[80];
        snprintf(what, sizeof what, "input '%.60s'", in[i].name);
        if (!shape_valid(g, TG_HERE, what, in[i].shape)) break;
        int id = ir_add(g, (tg_site){ "(input)", 0 }, OP_INPUT, in[i].dtype, in[i].shape, 0, NULL);
        if (id < 0) break;
        g->nodes[id].name = tg_strdup(in[i].name);
        g->nodes[id].iarg[0] = i;
        if (!g->nodes[id].name) ir_fail(g, TG_HERE, "out of memory naming input '%.60s'", in[i].name);
    }
    tg_tensor *args = tg_alloc(sizeof(tg_tensor) * (size_t)(n + 1));
    if (!args) ir_fail(g, TG_HERE, "out of memory starting a trace");
    for (int i = 0; i < n && args; i++) args[i] = mk_tensor(g, i < g->n ? i : -1);
    tg_tensor out = { NULL, -1 };
    if (ir_ok(g)) {
        tg_graph *outer = tg__trace();
        tg__set_trace(g);
        out = fn(ctx, args);
        tg__set_trace(outer);
    }
    free(args);
    if (ir_ok(g) && (out.g != g || out.id < 0 || out.id >= g->n))
        ir_fail(g, (tg_site){ "(trace)", 0 }, "the forward function returned an invalid tensor%s",
                out.g && out.g != g ? " (from another graph)" : "");
    if (!ir_ok(g)) {
        tg_seterr(err, "%s", g->error);
        ir_free(g);
        return NULL;
    }
    g->output = out.id;
    return g;
}

tg_graph *rt_trace(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *in, int n, tg_error *err) {
    return trace(m, fn, ctx, in, n, false, err);
}

tg_graph *rt_trace_patchable(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *in, int n,
                             tg_error *err) {
    return trace(m, fn, ctx, in, n, true, err);
}

/* ----- compiled graphs ----- */

static bool compile_graph(compiled *c, const tg_backend *be, tg_graph *g, int n_inputs, const int *keep, int n_keep,
                          tg_error *err) {
    memset(c, 0, sizeof *c);
    c->be = be;
    c->g = g;
    c->n_inputs = n_inputs;
    c->decls = tg_alloc(sizeof(tg_input_decl) * (size_t)(n_inputs + 1));
    c->input_buf = tg_alloc(sizeof(void *) * (size_t)(n_inputs + 1));
    if (!c->decls || !c->input_buf) { tg_seterr(err, "out of memory compiling the graph"); return false; }
    c->exec = be->prepare(g, keep, n_keep, err);
    if (!c->exec) return false;
    for (int i = 0; i < n_inputs; i++) {
        const tg_node *n = &g->nodes[i];
        c->decls[i] = (tg_input_decl){ n->name, n->dtype, n->shape };
        c->input_buf[i] = be->alloc((size_t)n->numel);
        if (!c->input_buf[i]) { tg_seterr(err, "out of memory for input '%s'", n->name); return false; }
        be->bind(c->exec, i, c->input_buf[i]);
    }
    return true;
}

/* Frees what compile_graph made, also after it failed halfway. */
static void compiled_free(compiled *c) {
    for (int i = 0; i < c->n_inputs && c->input_buf; i++)
        if (c->input_buf[i]) c->be->free(c->input_buf[i]);
    free(c->input_buf);
    free(c->decls);
    if (c->exec) c->be->release(c->exec);
    ir_free(c->g);
}

static void bind_params(compiled *c, void **param) {
    for (int i = 0; i < c->g->n_params; i++)
        if (c->g->param_node[i] >= 0) c->be->bind(c->exec, c->g->param_node[i], param[i]);
}

/* One node's values on the host (n doubles). */
static void read_node(const compiled *c, int node, double *dst) {
    const tg_node *n = &c->g->nodes[node];
    c->be->read(c->be->node_buf(c->exec, node), n->dtype, dst, (size_t)n->numel);
}

static const char *dtype_name(tg_dtype d) { return d == TG_INT32 ? "i32" : d == TG_FLOAT32 ? "f32" : "an unknown dtype"; }

/* Copy a call's data into the input buffers, checking names, dtypes and element counts. */
static bool bind_inputs(compiled *c, const tg_data *data, int n, char *err, size_t errlen) {
    if (n < 0 || (n > 0 && !data)) { snprintf(err, errlen, "inputs: %d given but no array", n); return false; }
    for (int k = 0; k < n; k++) {
        int i = 0;
        while (i < c->n_inputs && !(data[k].name && strcmp(data[k].name, c->decls[i].name) == 0)) i++;
        if (i == c->n_inputs) { snprintf(err, errlen, "unknown input '%s'", data[k].name ? data[k].name : "(null)"); return false; }
        for (int j = 0; j < k; j++)
            if (data[j].name && strcmp(data[j].name, data[k].name) == 0) { snprintf(err, errlen, "input '%s' given twice", data[k].name); return false; }
        const tg_node *node = &c->g->nodes[i];
        if (data[k].dtype != node->dtype) {
            snprintf(err, errlen, "input '%s': expected %s data, got %s", node->name, dtype_name(node->dtype), dtype_name(data[k].dtype));
            return false;
        }
        if (data[k].n != (size_t)node->numel || !data[k].data) {
            char sh[96];
            snprintf(err, errlen, "input '%s': expected %lld elements (shape %s), got %zu%s", node->name,
                     (long long)node->numel, shape_str(node->shape, sh), data[k].n, data[k].data ? "" : " (NULL data)");
            return false;
        }
    }
    if (n != c->n_inputs) {
        for (int i = 0; i < c->n_inputs; i++) {
            int k = 0;
            while (k < n && strcmp(data[k].name, c->decls[i].name) != 0) k++;
            if (k == n) { snprintf(err, errlen, "missing input '%s'", c->decls[i].name); return false; }
        }
    }
    for (int k = 0; k < n; k++) {
        int i = 0;
        while (strcmp(data[k].name, c->decls[i].name) != 0) i++;
        c->be->upload(c->input_buf[i], data[k].dtype, data[k].data, data[k].n);
    }
    return true;
}

/* The nodes a compiled graph keeps readable after a run: `first` (outputs, gradients), then its
 * captures and, in a patchable graph, the values arriving at its patch sites (tg_patch_from).
 * NULL when memory runs out. */
static int *keep_list(const tg_graph *g, const int *first, int n_first, int *n_keep) {
    int *keep = tg_alloc(sizeof(int) * (size_t)(n_first + g->n_captures + g->n_patches + 1));
    int n = 0;
    if (!keep) return NULL;
    for (int i = 0; i < n_first; i++) keep[n++] = first[i];
    for (int i = 0; i < g->n_captures; i++) keep[n++] = g->captures[i].node;
    for (int i = 0; g->patchable && i < g->n_patches; i++) keep[n++] = g->patches[i].node;
    *n_keep = n;
    return keep;
}

/* ----- training handles ----- */

static void copy_schedule(tg_train *t, const tg_schedule *s) {
    int k = 0;
    for (const tg_schedule *p = s; p && k < MAX_SCHEDULE_CHAIN; p = p->after) t->chain[k++] = *p;
    for (int i = 0; i < k; i++) t->chain[i].after = i + 1 < k ? &t->chain[i + 1] : NULL;
    t->opt.lr = t->chain[0];
}

/* Persistent buffers for parameters (from the model's init) and optimizer state (zeros). */
static bool alloc_store(tg_train *t, tg_error *err) {
    const tg_graph *g = t->c.g;
    t->param = tg_alloc(sizeof(void *) * (size_t)(t->n_params + 1));
    t->state = tg_alloc(sizeof(void *) * (size_t)(g->n_state + 1));
    if (!t->param || !t->state) { tg_seterr(err, "out of memory for the parameter table"); return false; }
    for (int i = 0; i < t->n_params; i++) {
        t->param[i] = t->be->alloc((size_t)shape_numel(model_param(t->model, i)->shape));
        if (!t->param[i]) { tg_seterr(err, "out of memory for parameter '%s'", model_param(t->model, i)->name); return false; }
    }
    for (int i = 0; i < g->n_state; i++) {
        t->state[i] = t->be->alloc((size_t)g->nodes[g->state_shape_node[i]].numel);
        if (!t->state[i]) { tg_seterr(err, "out of memory for optimizer state"); return false; }
    }
    return true;
}

static void free_store(tg_train *t) {
    for (int i = 0; t->state && i < t->c.g->n_state; i++)
        if (t->state[i]) t->be->free(t->state[i]);
    free(t->state);
    for (int i = 0; t->param && i < t->n_params; i++)
        if (t->param[i]) t->be->free(t->param[i]);
    free(t->param);
    t->state = t->param = NULL;
}

/* The largest parameter's element count: the host buffer init and reset need. */
static size_t max_param_numel(const tg_train *t) {
    size_t max = 1;
    for (int i = 0; i < t->n_params; i++) {
        size_t n = (size_t)shape_numel(model_param(t->model, i)->shape);
        if (n > max) max = n;
    }
    return max;
}

/* Parameters from the model's init; false (nothing changed) when memory runs out. */
static bool init_params(tg_train *t) {
    double *v = tg_alloc(sizeof(double) * max_param_numel(t));
    if (!v) return false;
    for (int i = 0; i < t->n_params; i++) {
        size_t n = (size_t)shape_numel(model_param(t->model, i)->shape);
        model_init_param(t->model, i, v);
        t->be->write(t->param[i], TG_FLOAT32, v, n);
    }
    free(v);
    return true;
}

/* Everything of a training handle but its lock, queue and forwards: trace, gradients, optimizer,
 * compile, parameters initialized. NULL with err set on failure. */
static tg_train *train_build(const tg_train_spec *spec, tg_error *err) {
    const tg_backend *be = backend_find(spec->backend, err);
    if (!be) return NULL;
    tg_graph *g = rt_trace(spec->model, spec->loss, spec->ctx, spec->inputs, spec->n_inputs, err);
    if (!g) return NULL;
    int loss = g->output;
    int *wrt = tg_alloc(sizeof(int) * (size_t)(g->n_params + 1));
    int *grads = tg_alloc(sizeof(int) * (size_t)(g->n_params + 2));
    int n_wrt = 0;
    for (int i = 0; wrt && i < g->n_params; i++)
        if (g->param_node[i] >= 0) wrt[n_wrt++] = g->param_node[i];
    if (!wrt || !grads) ir_fail(g, TG_HERE, "out of memory deriving gradients");
    bool ok = ir_ok(g) && grad_build(g, loss, wrt, n_wrt, grads);
    for (int i = 0, k = 0; ok && i < g->n_params; i++)
        if (g->param_node[i] >= 0) g->grad_of_param[i] = grads[k++];
    ok = ok && optim_build(g, &spec->optimizer, !be->checks_writebacks);
    free(wrt);
    if (!ok) {
        tg_seterr(err, "%s", g->error);
        free(grads);
        ir_free(g);
        return NULL;
    }
    tg_train *t = tg_alloc(sizeof *t);
    if (!t) {
        tg_seterr(err, "out of memory for the training handle");
        free(grads);
        ir_free(g);
        return NULL;
    }
    t->model = spec->model;
    t->be = be;
    t->loss = loss;
    t->loss_fn = spec->loss;
    t->loss_ctx = spec->ctx;
    t->opt = spec->optimizer;
    t->n_params = g->n_params;
    copy_schedule(t, &spec->optimizer.lr);
    grads[n_wrt] = loss;
    grads[n_wrt + 1] = g->guard;   /* read after every step: kept to the end */
    int n_keep, *keep = keep_list(g, grads, n_wrt + 2, &n_keep);
    ok = keep && compile_graph(&t->c, be, g, spec->n_inputs, keep, n_keep, err) && alloc_store(t, err);
    if (!keep) {
        tg_seterr(err, "out of memory compiling the graph");
        t->c.g = g;   /* for compiled_free below */
    }
    free(keep);
    free(grads);
    if (ok && !init_params(t)) {
        tg_seterr(err, "out of memory initialising the parameters");
        ok = false;
    }
    if (!ok) {
        free_store(t);
        compiled_free(&t->c);
        free(t);
        return NULL;
    }
    bind_params(&t->c, t->param);
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == OP_STATE) be->bind(t->c.exec, i, t->state[g->nodes[i].iarg[0]]);
    return t;
}

static void destroy_unregistered(tg_train *t);

tg_train *tg_compile(const tg_train_spec *spec, tg_error *err) {
    if (!spec) { tg_seterr(err, "tg_compile: no spec"); return NULL; }
    tg_train *t = train_build(spec, err);
    if (!t) return NULL;
    pthread_mutexattr_t attr;   /* recursive: tg_eval_loss attaches and runs under the lock it holds */
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&t->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    t->queue = async_new();   /* its worker thread starts at the first submit */
    if (!t->queue || !registry_add(t)) {
        tg_seterr(err, "tg_compile: out of memory");
        destroy_unregistered(t);
        return NULL;
    }
    return t;
}

static void *leaf_storage(tg_train *t, const tg_node *n) {
    return n->op == OP_PARAM ? t->param[n->iarg[0]] : t->state[n->iarg[0]];
}

/* The random seed of one call: a function of the model's seed, the kind of handle and the call
 * number, kept below 2^53 so a double (the hyper slot) holds it exactly. */
static double call_seed(const tg_model *m, uint64_t kind, int64_t call) {
    uint64_t z = rng_mix(tg_model_seed(m) * 2 + kind) ^ rng_mix((uint64_t)call);
    return (double)(z >> 11);
}

static int64_t sched_step(const tg_train *t) { return t->step + 1 - t->sched_base; }

double tg_train_lr(const tg_train *t) {
    tg_train *l = lock_train(t);
    if (!l) return 0;
    double lr = tg_schedule_at(&l->opt.lr, sched_step(l));
    unlock(l);
    return lr;
}

int64_t tg_train_step_count(const tg_train *t) {
    tg_train *l = lock_train(t);
    if (!l) return 0;
    int64_t step = l->step;
    unlock(l);
    return step;
}

/* A step whose guard was not finite changed nothing; its message names the first parameter, in
 * declaration order, whose gradient went non-finite (the gradients are kept nodes, still
 * readable after the run). */
static tg_result nonfinite_step(tg_train *t, double loss) {
    const tg_graph *g = t->c.g;
    const char *name = NULL, *what = NULL;
    for (int i = 0; i < t->n_params && !name; i++) {
        int node = g->grad_of_param[i];
        if (node < 0) continue;
        size_t n = (size_t)g->nodes[node].numel;
        double *v = tg_alloc(sizeof(double) * n);
        if (!v) break;   /* the step still fails; the message just names no parameter */
        read_node(&t->c, node, v);
        for (size_t k = 0; k < n && !name; k++)
            if (!isfinite(v[k])) {
                name = model_param(t->model, i)->name;
                what = isnan(v[k]) ? "NaN" : "infinite";
            }
        free(v);
    }
    long long step = (long long)t->step + 1;
    if (!isfinite(loss) && name)
        return failed("loss is %s at step %lld (first non-finite gradient: '%s'); parameters were left unchanged",
                      isnan(loss) ? "NaN" : "infinite", step, name);
    if (!isfinite(loss))
        return failed("loss is %s at step %lld; parameters were left unchanged", isnan(loss) ? "NaN" : "infinite", step);
    return failed("gradient of '%s' is not finite (%s) at step %lld; parameters were left unchanged", name ? name : "?",
                  what ? what : "NaN", step);
}

static tg_result step_locked(tg_train *t, const tg_data *inputs, int n_inputs) {
    tg_result r;
    memset(&r, 0, sizeof r);
    if (!bind_inputs(&t->c, inputs, n_inputs, r.error, sizeof r.error)) { r.status = TG_FAILED; return r; }
    double lr = tg_schedule_at(&t->opt.lr, sched_step(t));   /* tg_set_lr / tg_set_schedule take any double */
    if (!(lr >= 0 && isfinite(lr)))
        return failed("learning rate %g at step %lld is negative or not finite; nothing was changed", lr, (long long)t->step + 1);
    optim_hyper(&t->opt, t->step + 1, lr, t->hyper);
    t->hyper[HYPER_SEED] = call_seed(t->model, 0, t->step + 1);
    tg_error err;
    double loss, guard;
    const tg_graph *g = t->c.g;
    if (t->be->step) {
        if (!t->wb_dst) {   /* the write-back targets, in the graph's order */
            t->wb_dst = tg_alloc(sizeof(void *) * (size_t)(g->n_assigns + 1));
            if (!t->wb_dst) return failed("tg_step: out of memory for the write-back table");
            for (int k = 0; k < g->n_assigns; k++) t->wb_dst[k] = leaf_storage(t, &g->nodes[g->assigns[k].dst]);
        }
        if (!t->be->step(t->c.exec, t->hyper, t->loss, g->guard, g->assigns, g->n_assigns, t->wb_dst, &loss, &guard, &err))
            return failed("tg_step: %s", err.msg);
    } else {
        if (!t->be->run(t->c.exec, t->hyper, &err)) return failed("tg_step: %s", err.msg);
        read_node(&t->c, t->loss, &loss);
        read_node(&t->c, g->guard, &guard);
        for (int k = 0; k < g->n_assigns && isfinite(guard); k++) {
            const tg_node *dst = &g->nodes[g->assigns[k].dst];
            t->be->copy(leaf_storage(t, dst), t->be->node_buf(t->c.exec, g->assigns[k].src), (size_t)dst->numel);
        }
    }
    if (!isfinite(guard)) return nonfinite_step(t, loss);
    t->step++;
    r.status = TG_OK;
    r.loss = (float)loss;
    r.step = t->step;
    return r;
}

tg_result tg_step(tg_train *t, const tg_data *inputs, int n_inputs) {
    tg_train *l = lock_train(t);
    if (!l) return failed("tg_step: %s training handle", dead(t));
    tg_result r = step_locked(l, inputs, n_inputs);
    unlock(l);
    return r;
}

/* ----- forward graphs -----
 * A forward keeps its spec and compiles variants from it: one per value of its open dimensions
 * (least recently used evicted beyond max_variants), plain or patchable. Variants are traced
 * against the training handle's model of the moment: after tg_replace_model, against the new
 * one, at the next call. */

static void variant_free(const tg_backend *be, variant *v) {
    for (int i = 0; v->patch_buf && i < v->c.g->n_patches; i++)
        if (v->patch_buf[i]) be->free(v->patch_buf[i]);
    free(v->patch_buf);
    compiled_free(&v->c);
    free(v);
}

static void drop_variants(tg_forward *f) {
    for (int i = 0; i < f->n_v; i++) variant_free(f->train->be, f->v[i]);
    f->n_v = 0;
    f->last = NULL;
}

static bool dims_open(const tg_input_decl *d) {
    for (int k = 0; k < d->shape.ndim; k++)
        if (d->shape.d[k] == TG_ANY) return true;
    return false;
}

/* The declarations with the open dimensions set to `size`; NULL when memory runs out. */
static tg_input_decl *concrete_decls(const tg_forward *f, int64_t size) {
    tg_input_decl *d = tg_alloc(sizeof(tg_input_decl) * (size_t)(f->n_inputs + 1));
    for (int i = 0; d && i < f->n_inputs; i++) {
        d[i] = f->decls[i];
        for (int k = 0; k < d[i].shape.ndim; k++)
            if (d[i].shape.d[k] == TG_ANY) d[i].shape.d[k] = size;
    }
    return d;
}

static variant *variant_compile(tg_forward *f, int64_t size, bool patchable, tg_error *err) {
    tg_train *t = f->train;
    tg_input_decl *decls = concrete_decls(f, size);
    tg_graph *g = decls ? trace(t->model, f->fn, f->ctx, decls, f->n_inputs, patchable, err) : NULL;
    if (!decls) tg_seterr(err, "out of memory");
    free(decls);
    if (!g) return NULL;
    if (g->nodes[g->output].dtype != TG_FLOAT32) {
        tg_seterr(err, "the forward output must be f32");
        ir_free(g);
        return NULL;
    }
    variant *v = tg_alloc(sizeof *v);
    int n_keep, *keep = v ? keep_list(g, &g->output, 1, &n_keep) : NULL;
    if (!keep) {
        tg_seterr(err, "out of memory");
        free(v);
        ir_free(g);
        return NULL;
    }
    v->size = size;
    v->patchable = patchable;
    bool ok = compile_graph(&v->c, t->be, g, f->n_inputs, keep, n_keep, err);
    free(keep);
    if (ok && patchable) {
        v->patch_buf = tg_alloc(sizeof(void *) * (size_t)(g->n_patches + 1));
        if (!v->patch_buf) tg_seterr(err, "out of memory");
        ok = v->patch_buf != NULL;
        for (int i = 0; ok && i < g->n_patches; i++) {
            int in = g->patches[i].input;
            v->patch_buf[i] = t->be->alloc((size_t)g->nodes[in].numel);
            if (!v->patch_buf[i]) tg_seterr(err, "out of memory for patch site '%s'", g->patches[i].name);
            else v->c.be->bind(v->c.exec, in, v->patch_buf[i]);
            ok = v->patch_buf[i] != NULL;
        }
    }
    if (!ok) {
        variant_free(t->be, v);
        return NULL;
    }
    bind_params(&v->c, t->param);
    return v;
}

/* The variant for this size, compiled if need be (evicting the least recently used). */
static variant *variant_for(tg_forward *f, int64_t size, bool patchable, tg_error *err) {
    if (f->generation != atomic_load(&f->train->generation)) {   /* the model was replaced */
        drop_variants(f);
        f->generation = atomic_load(&f->train->generation);
    }
    for (int i = 0; i < f->n_v; i++)
        if (f->v[i]->size == size && f->v[i]->patchable == patchable) return f->v[i];
    variant **grown = tg_realloc(f->v, sizeof(variant *) * (size_t)(f->n_v + 1));
    if (!grown) {
        tg_seterr(err, "out of memory");
        return NULL;
    }
    f->v = grown;
    variant *v = variant_compile(f, size, patchable, err);
    if (!v) return NULL;
    if (f->n_v == f->max_variants) {
        int lru = 0;
        for (int i = 1; i < f->n_v; i++)
            if (f->v[i]->used < f->v[lru]->used) lru = i;
        if (f->last == f->v[lru]) f->last = NULL;
        variant_free(f->train->be, f->v[lru]);
        f->v[lru] = f->v[--f->n_v];
    }
    f->v[f->n_v++] = v;
    return v;
}

/* The value of the open dimensions in this call's data (from each open input's element count;
 * all must agree), 0 when there are none; -1 with err set. Inputs missing or of the wrong dtype
 * are left for bind_inputs to report. */
static int64_t open_size(const tg_forward *f, const tg_data *data, int n, char *err, size_t len) {
    int64_t size = 0;
    const char *from = NULL;
    for (int i = 0; f->open && i < f->n_inputs; i++) {
        const tg_input_decl *d = &f->decls[i];
        int k = 0;
        while (k < n && !(data && data[k].name && strcmp(data[k].name, d->name) == 0)) k++;
        if (k == n || !dims_open(d)) continue;
        int64_t fixed = 1;
        int n_open = 0;
        bool overflow = false;   /* bad fixed dimensions are the trace's to report; only no UB here */
        for (int a = 0; a < d->shape.ndim; a++) {
            if (d->shape.d[a] == TG_ANY) n_open++;
            else overflow |= __builtin_mul_overflow(fixed, d->shape.d[a] > 0 ? d->shape.d[a] : 1, &fixed);
        }
        int64_t count = (int64_t)data[k].n, s = llround(pow((double)count / (double)fixed, 1.0 / n_open));
        int64_t p = fixed;
        for (int a = 0; a < n_open && s > 0; a++) overflow |= __builtin_mul_overflow(p, s, &p);
        if (s < 1 || overflow || p != count) {
            char sh[96];
            snprintf(err, len, "input '%s': %lld elements do not fill shape %s (-1 open) with a positive size", d->name,
                     (long long)count, shape_str(d->shape, sh));
            return -1;
        }
        if (from && s != size) {
            snprintf(err, len, "open dimensions disagree: input '%s' gives %lld, input '%s' gives %lld", from,
                     (long long)size, d->name, (long long)s);
            return -1;
        }
        size = s;
        from = d->name;
    }
    return size;
}

static patch_rule *find_rule(const tg_forward *f, const char *site) {
    for (int i = 0; i < f->n_patch; i++)
        if (strcmp(f->patch[i].site, site) == 0) return &f->patch[i];
    return NULL;
}

static bool any_patch(const tg_forward *f) {
    for (int i = 0; i < f->n_patch; i++)
        if (f->patch[i].mode != TG_PATCH_OFF) return true;
    return false;
}

/* A patchable variant's per-call settings: each site's two hyper flags and, for replaced
 * values, its replacement buffer. */
static bool apply_patches(tg_forward *f, variant *v, double *hyper, char *err, size_t len) {
    const tg_graph *g = v->c.g;
    for (int r = 0; r < f->n_patch; r++) {
        int i = 0;
        while (i < g->n_patches && strcmp(g->patches[i].name, f->patch[r].site) != 0) i++;
        if (i == g->n_patches && f->patch[r].mode != TG_PATCH_OFF) {
            snprintf(err, len, "no patch site named '%s' in the forward", f->patch[r].site);
            return false;
        }
    }
    for (int i = 0; i < g->n_patches; i++) {
        const tg_named *site = &g->patches[i];
        const patch_rule *rule = find_rule(f, site->name);
        tg_patch_mode mode = rule ? rule->mode : TG_PATCH_OFF;
        size_t numel = (size_t)g->nodes[site->input].numel;
        hyper[site->hyper] = mode == TG_PATCH_ZERO || mode == TG_PATCH_VALUES;
        hyper[site->hyper + 1] = mode == TG_PATCH_MEAN;
        if (mode == TG_PATCH_VALUES && rule->n != numel) {
            snprintf(err, len, "patch '%s' holds %zu values, the site has %zu in this call", site->name, rule->n, numel);
            return false;
        }
        if (mode == TG_PATCH_VALUES) {
            v->c.be->upload(v->patch_buf[i], TG_FLOAT32, rule->values, numel);
        } else if (mode == TG_PATCH_ZERO) {
            double *zeros = tg_alloc(sizeof(double) * numel);
            if (!zeros) {
                snprintf(err, len, "out of memory zeroing patch '%s'", site->name);
                return false;
            }
            v->c.be->write(v->patch_buf[i], TG_FLOAT32, zeros, numel);
            free(zeros);
        }
    }
    return true;
}

/* One call: the variant for the data, inputs and patches set, the graph run, the output read. A
 * patchable variant is used while any patch is set, or when `patchable` asks for one. */
static tg_result run_locked(tg_forward *f, const tg_data *inputs, int n_inputs, bool patchable) {
    tg_result r;
    memset(&r, 0, sizeof r);
    if (n_inputs < 0 || (n_inputs > 0 && !inputs)) return failed("tg_run: inputs: %d given but no array", n_inputs);
    int64_t size = open_size(f, inputs, n_inputs, r.error, sizeof r.error);
    if (size < 0) { r.status = TG_FAILED; return r; }
    tg_error err;
    variant *v = variant_for(f, size, patchable || any_patch(f), &err);
    if (!v) return failed("tg_run: %s", err.msg);
    v->used = ++f->clock;
    f->last = v;
    if (!bind_inputs(&v->c, inputs, n_inputs, r.error, sizeof r.error)) { r.status = TG_FAILED; return r; }
    int n_hyper = v->c.g->n_hyper > 1 ? v->c.g->n_hyper : 1;
    double *hyper = tg_alloc(sizeof(double) * (size_t)n_hyper);
    if (!hyper) return failed("tg_run: out of memory");
    hyper[HYPER_SEED] = call_seed(f->train->model, 1, ++f->calls);
    bool ok = !v->patchable || apply_patches(f, v, hyper, r.error, sizeof r.error);
    ok = ok && v->c.be->run(v->c.exec, hyper, &err);
    free(hyper);
    if (!ok && !r.error[0]) return failed("tg_run: %s", err.msg);
    if (!ok) {
        r.status = TG_FAILED;
        return r;
    }
    const tg_node *out = &v->c.g->nodes[v->c.g->output];
    if (out->numel > f->out_cap) {   /* grown for the largest output so far */
        float *o = tg_alloc(sizeof(float) * (size_t)out->numel);
        double *h = tg_alloc(sizeof(double) * (size_t)out->numel);
        if (!o || !h) {
            free(o);
            free(h);
            return failed("tg_run: out of memory for the output");
        }
        free(f->out);
        free(f->host);
        f->out = o;
        f->host = h;
        f->out_cap = out->numel;
    }
    read_node(&v->c, v->c.g->output, f->host);
    for (int64_t i = 0; i < out->numel; i++) f->out[i] = (float)f->host[i];
    r.status = TG_OK;
    r.output = f->out;
    r.output_len = (size_t)out->numel;
    r.output_shape = out->shape;
    return r;
}

static void forward_free(tg_forward *f) {
    drop_variants(f);
    free(f->v);
    for (int i = 0; i < f->n_inputs; i++) free((char *)f->decls[i].name);
    free(f->decls);
    for (int i = 0; i < f->n_patch; i++) {
        free(f->patch[i].site);
        free(f->patch[i].values);
    }
    free(f->patch);
    free(f->out);
    free(f->host);
    free(f);
}

/* Declarations as a forward keeps them: checked (open dimensions as size 1), names copied. */
static tg_input_decl *forward_decls(const tg_forward_spec *spec, bool *open, tg_error *err) {
    if (!check_decls(spec->inputs, spec->n_inputs, err)) return NULL;
    tg_input_decl *d = tg_alloc(sizeof(tg_input_decl) * (size_t)(spec->n_inputs + 1));
    *open = false;
    bool ok = d != NULL;
    for (int i = 0; ok && i < spec->n_inputs; i++) {
        d[i] = spec->inputs[i];
        ok = (d[i].name = tg_strdup(spec->inputs[i].name)) != NULL;
        *open |= dims_open(&d[i]);
    }
    if (!ok) {
        for (int i = 0; d && i < spec->n_inputs; i++) free((char *)d[i].name);
        free(d);
        tg_seterr(err, "tg_attach: out of memory");
        return NULL;
    }
    return d;
}

static tg_forward *attach_locked(tg_train *t, const tg_forward_spec *spec, tg_error *err) {
    if (!spec) { tg_seterr(err, "tg_attach: NULL spec"); return NULL; }
    if (!spec->forward) { tg_seterr(err, "tg_attach: no forward function given"); return NULL; }
    if (spec->max_variants < 0) { tg_seterr(err, "tg_attach: max_variants is %d", spec->max_variants); return NULL; }
    tg_forward *f = tg_alloc(sizeof *f);
    if (!f) { tg_seterr(err, "tg_attach: out of memory"); return NULL; }
    f->train = t;
    f->fn = spec->forward;
    f->ctx = spec->ctx;
    f->n_inputs = spec->n_inputs;
    f->max_variants = spec->max_variants ? spec->max_variants : DEFAULT_VARIANTS;
    f->generation = atomic_load(&t->generation);
    f->decls = forward_decls(spec, &f->open, err);
    if (!f->decls) {
        f->n_inputs = 0;
        forward_free(f);
        return NULL;
    }
    if (!f->open) {   /* compiled now, so that trace errors come back from tg_attach */
        tg_error e;
        if (!variant_for(f, 0, false, &e)) {
            tg_seterr(err, "tg_attach: %s", e.msg);
            forward_free(f);
            return NULL;
        }
        f->last = f->v[0];
    }
    tg_forward **fwd = tg_realloc(t->fwd, sizeof(tg_forward *) * (size_t)(t->n_fwd + 1));
    if (fwd) t->fwd = fwd;
    if (!fwd || !registry_add(f)) {
        tg_seterr(err, "tg_attach: out of memory");
        forward_free(f);
        return NULL;
    }
    t->fwd[t->n_fwd++] = f;
    return f;
}

tg_forward *tg_attach(tg_train *t, const tg_forward_spec *spec, tg_error *err) {
    tg_train *l = lock_train(t);
    if (!l) { tg_seterr(err, "tg_attach: %s training handle", dead(t)); return NULL; }
    tg_forward *f = attach_locked(l, spec, err);
    unlock(l);
    return f;
}

tg_result tg_run(tg_forward *f, const tg_data *inputs, int n_inputs) {
    tg_train *t = lock_forward(f);
    if (!t) return failed("tg_run: %s forward handle", dead(f));
    tg_result r = run_locked(f, inputs, n_inputs, false);
    unlock(t);
    return r;
}

/* Under t's lock: unregister and free a forward (its queued calls abort). */
static void detach_locked(tg_train *t, tg_forward *f) {
    registry_remove(f);
    async_abort(t->queue, f, "the forward handle was detached");
    for (int i = 0; i < t->n_fwd; i++)
        if (t->fwd[i] == f) t->fwd[i] = t->fwd[--t->n_fwd];
    if (t->eval == f) t->eval = NULL;
    forward_free(f);
}

void tg_detach(tg_forward *f) {
    tg_train *t = lock_forward(f);
    if (!t) return;
    detach_locked(t, f);
    unlock(t);
}

tg_result tg_eval_loss(tg_train *t, const tg_data *inputs, int n_inputs) {
    tg_train *l = lock_train(t);
    if (!l) return failed("tg_eval_loss: %s training handle", dead(t));
    if (!l->eval) {
        tg_error err;
        tg_forward_spec spec = { .forward = l->loss_fn, .ctx = l->loss_ctx, .inputs = l->c.decls, .n_inputs = l->c.n_inputs };
        l->eval = attach_locked(l, &spec, &err);
        if (!l->eval) {
            unlock(l);
            return failed("tg_eval_loss: %s", err.msg);
        }
    }
    tg_result r = run_locked(l->eval, inputs, n_inputs, false);
    if (r.status == TG_OK && !isfinite(r.output[0]))   /* as tg_step: a non-finite loss is a failure */
        r = failed("tg_eval_loss: loss is %s", isnan(r.output[0]) ? "NaN" : "infinite");
    if (r.status == TG_OK) {
        r.loss = r.output[0];
        r.step = l->step;
        r.output = NULL;
        r.output_len = 0;
    }
    unlock(l);
    return r;
}

/* ----- replacing the model ----- */

tg_status tg_replace_model(tg_train *t, tg_model *m, const tg_optimizer *opt, tg_error *err) {
    if (!registry_has(t)) { tg_seterr(err, "tg_replace_model: %s training handle", dead(t)); return TG_FAILED; }
    /* Calls queued for the old model abort first: else the worker, draining the queue, could
     * keep the lock from this call until they all ran. */
    async_abort(t->queue, NULL, "the model was replaced");
    tg_train *l = lock_train(t);
    if (!l) { tg_seterr(err, "tg_replace_model: %s training handle", dead(t)); return TG_FAILED; }
    tg_train_spec spec = { .model = m, .loss = l->loss_fn, .ctx = l->loss_ctx, .inputs = l->c.decls,
                           .n_inputs = l->c.n_inputs, .optimizer = opt ? *opt : l->opt, .backend = l->be->name };
    tg_error e;
    tg_train *n = m ? train_build(&spec, &e) : NULL;
    if (!n) {
        tg_seterr(err, "tg_replace_model: %s", m ? e.msg : "no model given");
        unlock(l);
        return TG_FAILED;
    }
    /* Calls queued since, or in flight, belong to the old model: they abort too. */
    atomic_fetch_add(&l->generation, 1);
    async_abort(l->queue, NULL, "the model was replaced");
    free_store(l);
    compiled_free(&l->c);
    free(l->wb_dst);
    l->model = n->model;
    l->n_params = n->n_params;
    l->param = n->param;
    l->state = n->state;
    l->c = n->c;
    l->loss = n->loss;
    l->opt = n->opt;
    copy_schedule(l, &n->opt.lr);
    l->sched_base = l->step = 0;
    l->wb_dst = NULL;
    free(n);
    unlock(l);
    return TG_OK;
}

/* ----- async calls -----
 * A job runs under the family lock on the worker thread; one whose model generation moved on
 * before or while it ran resolves TG_ABORTED. */

static tg_result job_end(tg_train *t, uint64_t generation, tg_result r) {
    if (generation != atomic_load(&t->generation)) return aborted("the model was replaced or the handle destroyed");
    return r;
}

static tg_result step_job(void *family, void *handle, const tg_data *in, int n, uint64_t generation, float **out) {
    tg_train *t = family;
    pthread_mutex_lock(&t->mu);
    tg_result r = generation == atomic_load(&t->generation) ? step_locked(t, in, n) : aborted("the model was replaced");
    r = job_end(t, generation, r);
    pthread_mutex_unlock(&t->mu);
    return r;
}

static tg_result run_job(void *family, void *handle, const tg_data *in, int n, uint64_t generation, float **out) {
    tg_train *t = family;
    pthread_mutex_lock(&t->mu);
    tg_result r;
    if (!registry_has(handle)) r = aborted("the forward handle was detached or destroyed");
    else r = job_end(t, generation, run_locked(handle, in, n, false));
    if (r.status == TG_OK) {   /* the job's own copy: the handle's buffer belongs to its next call */
        *out = tg_alloc(sizeof(float) * (r.output_len + 1));
        if (*out) memcpy(*out, r.output, sizeof(float) * r.output_len);
        r = *out ? r : failed("out of memory copying the output");
        r.output = *out;
    }
    pthread_mutex_unlock(&t->mu);
    return r;
}

/* Submitting takes no handle lock, so that it returns at once while a call runs. */
tg_job *tg_step_submit(tg_train *t, const tg_data *inputs, int n_inputs) {
    if (!registry_has(t)) return NULL;
    return async_submit(t->queue, step_job, t, t, inputs, n_inputs, atomic_load(&t->generation));
}

tg_job *tg_run_submit(tg_forward *f, const tg_data *inputs, int n_inputs) {
    if (!registry_has(f)) return NULL;
    tg_train *t = f->train;
    return async_submit(t->queue, run_job, t, f, inputs, n_inputs, atomic_load(&t->generation));
}

/* Everything of t once no call can reach it any more. */
static void destroy_unregistered(tg_train *t) {
    async_free(t->queue, "the training handle was destroyed");
    for (int i = 0; i < t->n_fwd; i++) forward_free(t->fwd[i]);
    free(t->fwd);
    free_store(t);
    free(t->wb_dst);
    compiled_free(&t->c);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void tg_destroy(tg_train *t) {
    if (!registry_has(t)) return;
    registry_remove(t);
    atomic_fetch_add(&t->generation, 1);
    async_free(t->queue, "the training handle was destroyed");   /* outside the lock: its job in flight needs it */
    t->queue = NULL;
    pthread_mutex_lock(&t->mu);   /* a call another thread is making finishes first */
    for (int i = 0; i < t->n_fwd; i++) registry_remove(t->fwd[i]);
    pthread_mutex_unlock(&t->mu);
    destroy_unregistered(t);
}

/* ----- captures and patches ----- */

/* The values of capture `name` of compiled graph c (after its last run). */
static tg_status read_capture(const compiled *c, const char *what, const char *name, float *dst, size_t n, tg_shape *shape,
                              tg_error *err) {
    const tg_graph *g = c ? c->g : NULL;
    int i = 0;
    while (g && name && i < g->n_captures && strcmp(g->captures[i].name, name) != 0) i++;
    if (!g || !name || i == g->n_captures) {
        tg_seterr(err, "%s: no capture named '%s'%s", what, name ? name : "(null)", g ? "" : " (no call yet)");
        return TG_FAILED;
    }
    const tg_node *node = &g->nodes[g->captures[i].node];
    if (shape) *shape = node->shape;
    if (!dst) return TG_OK;
    if (n != (size_t)node->numel) {
        tg_seterr(err, "%s: capture '%s' has %lld elements, not %zu", what, name, (long long)node->numel, n);
        return TG_FAILED;
    }
    double *v = tg_alloc(sizeof(double) * (n + 1));
    if (!v) {
        tg_seterr(err, "%s: out of memory", what);
        return TG_FAILED;
    }
    read_node(c, g->captures[i].node, v);
    for (size_t k = 0; k < n; k++) dst[k] = (float)v[k];
    free(v);
    return TG_OK;
}

tg_status tg_train_capture(tg_train *t, const char *name, float *dst, size_t n, tg_shape *shape, tg_error *err) {
    tg_train *l = lock_train(t);
    if (!l) { tg_seterr(err, "tg_train_capture: %s training handle", dead(t)); return TG_FAILED; }
    tg_status st = read_capture(&l->c, "tg_train_capture", name, dst, n, shape, err);
    unlock(l);
    return st;
}

tg_status tg_forward_capture(tg_forward *f, const char *name, float *dst, size_t n, tg_shape *shape, tg_error *err) {
    tg_train *l = lock_forward(f);
    if (!l) { tg_seterr(err, "tg_forward_capture: %s forward handle", dead(f)); return TG_FAILED; }
    tg_status st = read_capture(f->last ? &f->last->c : NULL, "tg_forward_capture", name, dst, n, shape, err);
    unlock(l);
    return st;
}

tg_status tg_capture_head(const float *values, tg_shape shape, int head, float *dst, size_t n, tg_shape *head_shape,
                          tg_error *err) {
    if (!values || !dst) { tg_seterr(err, "tg_capture_head: NULL %s", values ? "destination" : "values"); return TG_FAILED; }
    if (shape.ndim != 3 && shape.ndim != 4) { tg_seterr(err, "tg_capture_head: needs [B, H, T, S] or [H, T, S], got rank %d", shape.ndim); return TG_FAILED; }
    int ax = shape.ndim - 3;
    int64_t batch = ax ? shape.d[0] : 1, heads = shape.d[ax], block = shape.d[ax + 1] * shape.d[ax + 2];
    if (head < 0 || head >= heads) { tg_seterr(err, "tg_capture_head: head %d of %lld", head, (long long)heads); return TG_FAILED; }
    if (n != (size_t)(batch * block)) { tg_seterr(err, "tg_capture_head: a head has %lld elements, not %zu", (long long)(batch * block), n); return TG_FAILED; }
    for (int64_t b = 0; b < batch; b++) memcpy(dst + b * block, values + (b * heads + head) * block, sizeof(float) * (size_t)block);
    if (head_shape) {
        *head_shape = shape;
        head_shape->ndim--;
        for (int k = ax; k < head_shape->ndim; k++) head_shape->d[k] = shape.d[k + 1];
    }
    return TG_OK;
}

/* The rule for a site, created off if new; NULL when memory runs out. */
static patch_rule *rule_for(tg_forward *f, const char *site) {
    patch_rule *r = find_rule(f, site);
    if (r) return r;
    patch_rule *grown = tg_realloc(f->patch, sizeof(patch_rule) * (size_t)(f->n_patch + 1));
    char *name = tg_strdup(site);
    if (grown) f->patch = grown;
    if (!grown || !name) {
        free(name);
        return NULL;
    }
    r = &f->patch[f->n_patch++];
    *r = (patch_rule){ name, TG_PATCH_OFF, NULL, 0 };
    return r;
}

/* Sets site's rule, taking ownership of values; false (values freed) when memory runs out. */
static bool set_rule(tg_forward *f, const char *site, tg_patch_mode mode, float *values, size_t n) {
    patch_rule *r = rule_for(f, site);
    if (!r) {
        free(values);
        return false;
    }
    free(r->values);
    r->mode = mode;
    r->values = values;
    r->n = n;
    return true;
}

tg_status tg_patch_set(tg_forward *f, const char *site, tg_patch_mode mode, const float *values, size_t n, tg_error *err) {
    tg_train *l = lock_forward(f);
    if (!l) { tg_seterr(err, "tg_patch_set: %s forward handle", dead(f)); return TG_FAILED; }
    tg_status st = TG_FAILED;
    if (!site || !site[0]) tg_seterr(err, "tg_patch_set: no site name given");
    else if (mode < TG_PATCH_OFF || mode > TG_PATCH_VALUES) tg_seterr(err, "tg_patch_set: unknown mode %d", (int)mode);
    else if (mode == TG_PATCH_VALUES && (!values || n == 0)) tg_seterr(err, "tg_patch_set: '%s': no values given", site);
    else st = TG_OK;
    float *copy = st == TG_OK && mode == TG_PATCH_VALUES ? tg_alloc(sizeof(float) * n) : NULL;
    if (copy) memcpy(copy, values, sizeof(float) * n);
    if (st == TG_OK && ((mode == TG_PATCH_VALUES && !copy) || !set_rule(f, site, mode, copy, copy ? n : 0))) {
        tg_seterr(err, "tg_patch_set: out of memory");
        st = TG_FAILED;
    }
    unlock(l);
    return st;
}

tg_status tg_patch_from(tg_forward *f, const char *site, const tg_data *inputs, int n_inputs, tg_error *err) {
    tg_train *l = lock_forward(f);
    if (!l) { tg_seterr(err, "tg_patch_from: %s forward handle", dead(f)); return TG_FAILED; }
    tg_result r = site ? run_locked(f, inputs, n_inputs, true) : failed("no site name given");
    const tg_graph *g = r.status == TG_OK ? f->last->c.g : NULL;
    int i = 0;
    while (g && i < g->n_patches && strcmp(g->patches[i].name, site) != 0) i++;
    if (r.status != TG_OK) tg_seterr(err, "tg_patch_from: %s", r.error);
    else if (i == g->n_patches) tg_seterr(err, "tg_patch_from: no patch site named '%s' in the forward", site);
    tg_status st = r.status == TG_OK && i < g->n_patches ? TG_OK : TG_FAILED;
    if (st == TG_OK) {   /* the value arriving at the site (not its patched value) */
        size_t n = (size_t)g->nodes[g->patches[i].node].numel;
        double *v = tg_alloc(sizeof(double) * n);
        float *values = tg_alloc(sizeof(float) * n);
        bool ok = v && values;
        if (ok) {
            read_node(&f->last->c, g->patches[i].node, v);
            for (size_t k = 0; k < n; k++) values[k] = (float)v[k];
        } else {
            free(values);
        }
        free(v);
        if (!ok || !set_rule(f, site, TG_PATCH_VALUES, values, n)) {
            tg_seterr(err, "tg_patch_from: out of memory");
            st = TG_FAILED;
        }
    }
    unlock(l);
    return st;
}

void tg_patch_clear(tg_forward *f) {
    tg_train *l = lock_forward(f);
    if (!l) return;
    for (int i = 0; i < f->n_patch; i++) {   /* in place: never fails */
        free(f->patch[i].values);
        f->patch[i] = (patch_rule){ f->patch[i].site, TG_PATCH_OFF, NULL, 0 };
    }
    unlock(l);
}

/* ----- parameters ----- */

int tg_train_n_params(const tg_train *t) {
    tg_train *l = lock_train(t);
    int n = l ? l->n_params : 0;
    if (l) unlock(l);
    return n;
}

const char *tg_train_param_name(const tg_train *t, int i) {
    tg_train *l = lock_train(t);
    const char *name = l ? tg_model_param_name(l->model, i) : NULL;
    if (l) unlock(l);
    return name;
}

int64_t tg_train_param_total(const tg_train *t) {
    tg_train *l = lock_train(t);
    int64_t total = 0;
    for (int i = 0; l && i < l->n_params; i++) total += shape_numel(model_param(l->model, i)->shape);
    if (l) unlock(l);
    return total;
}

tg_shape tg_train_param_shape(const tg_train *t, int i) {
    tg_train *l = lock_train(t);
    tg_shape shape = l ? tg_model_param_shape(l->model, i) : TG_SHAPE0;
    if (l) unlock(l);
    return shape;
}

/* The param named `name` with exactly n elements, or -1 with err set. */
static int find_param(const tg_train *t, const char *what, const char *name, size_t n, tg_error *err) {
    int id = model_find(t->model, name);
    if (id < 0) { tg_seterr(err, "%s: no parameter named '%s'", what, name ? name : "(null)"); return -1; }
    int64_t numel = shape_numel(model_param(t->model, id)->shape);
    if ((int64_t)n != numel) {
        tg_seterr(err, "%s: parameter '%s' has %lld elements, not %zu", what, name, (long long)numel, n);
        return -1;
    }
    return id;
}

/* A backend buffer of n values into the caller's floats; false when memory runs out. */
static bool read_floats(const tg_backend *be, const void *buf, float *dst, size_t n) {
    double *v = tg_alloc(sizeof(double) * n);
    if (!v) return false;
    be->read(buf, TG_FLOAT32, v, n);
    for (size_t i = 0; i < n; i++) dst[i] = (float)v[i];
    free(v);
    return true;
}

static tg_status download_param(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    int id = find_param(t, "tg_download_param", name, n, err);
    if (id < 0) return TG_FAILED;
    if (!dst) { tg_seterr(err, "tg_download_param: NULL destination"); return TG_FAILED; }
    if (!read_floats(t->be, t->param[id], dst, n)) { tg_seterr(err, "tg_download_param: out of memory"); return TG_FAILED; }
    return TG_OK;
}

static tg_status download_param_grad(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    int id = find_param(t, "tg_download_param_grad", name, n, err);
    if (id < 0) return TG_FAILED;
    if (!dst) { tg_seterr(err, "tg_download_param_grad: NULL destination"); return TG_FAILED; }
    int node = t->c.g->grad_of_param[id];
    if (node < 0) { tg_seterr(err, "tg_download_param_grad: '%s' does not affect the loss", name); return TG_FAILED; }
    if (!read_floats(t->be, t->be->node_buf(t->c.exec, node), dst, n)) {
        tg_seterr(err, "tg_download_param_grad: out of memory");
        return TG_FAILED;
    }
    return TG_OK;
}

static tg_status upload_params(tg_train *t, const tg_data *params, int n, tg_error *err) {
    if (n < 0 || (n > 0 && !params)) { tg_seterr(err, "tg_upload_params: %d given but no array", n); return TG_FAILED; }
    for (int k = 0; k < n; k++) {   /* check every entry first, so a bad one changes nothing */
        if (find_param(t, "tg_upload_params", params[k].name, params[k].n, err) < 0) return TG_FAILED;
        if (params[k].dtype != TG_FLOAT32 || !params[k].data) {
            tg_seterr(err, "tg_upload_params: '%s' needs f32 data", params[k].name);
            return TG_FAILED;
        }
        const float *v = params[k].data;   /* a NaN or infinite parameter could never train */
        for (size_t i = 0; i < params[k].n; i++)
            if (!isfinite(v[i])) {
                tg_seterr(err, "tg_upload_params: '%s' element %zu is %s", params[k].name, i, isnan(v[i]) ? "NaN" : "infinite");
                return TG_FAILED;
            }
    }
    for (int k = 0; k < n; k++)
        t->be->upload(t->param[model_find(t->model, params[k].name)], TG_FLOAT32, params[k].data, params[k].n);
    return TG_OK;
}

static tg_status reset(tg_train *t, int params, int optimizer) {
    /* All or nothing: the host buffers first (state slots have their parameters' shapes). */
    double *zeros = optimizer ? tg_alloc(sizeof(double) * max_param_numel(t)) : NULL;
    if ((optimizer && !zeros) || (params && !init_params(t))) {
        free(zeros);
        return TG_FAILED;
    }
    if (optimizer) {
        const tg_graph *g = t->c.g;
        for (int i = 0; i < g->n_state; i++)
            t->be->write(t->state[i], TG_FLOAT32, zeros, (size_t)g->nodes[g->state_shape_node[i]].numel);
        t->step = 0;
        t->sched_base = 0;
    }
    free(zeros);
    return TG_OK;
}

static void set_schedule(tg_train *t, const tg_schedule *s) {
    if (!s) return;
    copy_schedule(t, s);
    t->sched_base = t->step;
}

/* ----- inspection ----- */

const tg_graph *tg_train_graph(const tg_train *t) {
    tg_train *l = lock_train(t);
    const tg_graph *g = l ? l->c.g : NULL;
    if (l) unlock(l);
    return g;
}

/* A forward's graph and kernels are those of its last call's variant. */
const tg_graph *tg_forward_graph(const tg_forward *f) {
    tg_train *l = lock_forward(f);
    const tg_graph *g = l && f->last ? f->last->c.g : NULL;
    if (l) unlock(l);
    return g;
}

size_t tg_train_planned_bytes(const tg_train *t) {
    tg_train *l = lock_train(t);
    size_t bytes = l ? l->be->planned_bytes(l->c.exec) : 0;
    if (l) unlock(l);
    return bytes;
}

int tg_forward_n_variants(const tg_forward *f) {
    tg_train *l = lock_forward(f);
    int n = l ? f->n_v : 0;
    if (l) unlock(l);
    return n;
}

static const char *source_of(const compiled *c) { return c && c->be->source ? c->be->source(c->exec) : NULL; }

const char *tg_train_kernel_source(const tg_train *t) {
    tg_train *l = lock_train(t);
    const char *src = l ? source_of(&l->c) : NULL;
    if (l) unlock(l);
    return src;
}

const char *tg_forward_kernel_source(const tg_forward *f) {
    tg_train *l = lock_forward(f);
    const char *src = l && f->last ? source_of(&f->last->c) : NULL;
    if (l) unlock(l);
    return src;
}

/* ----- checkpoints ----- */

/* The parameter an optimizer state slot belongs to, and its index among that param's slots. */
static int state_owner(const tg_graph *g, int slot, int *k) {
    int pnode = g->state_shape_node[slot];
    *k = 0;
    for (int i = 0; i < slot; i++) *k += g->state_shape_node[i] == pnode;
    return (int)g->nodes[pnode].iarg[0];
}

static void state_name(const tg_train *t, int slot, char *buf, size_t len) {
    int k, owner = state_owner(t->c.g, slot, &k);
    snprintf(buf, len, "optimizer.%s.%d", model_param(t->model, owner)->name, k);
}

/* A persistent buffer's values as a host float tensor named `name`; false when memory runs out
 * (what was allocated is in *st for the caller to free). */
static bool host_tensor(const tg_backend *be, const void *buf, const char *name, tg_shape shape, st_tensor *st) {
    size_t n = (size_t)shape_numel(shape);
    *st = (st_tensor){ tg_strdup(name), TG_FLOAT32, shape, tg_alloc(sizeof(float) * n), sizeof(float) * n };
    return st->name && st->data && read_floats(be, buf, st->data, n);
}

static tg_status save(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    if (!path) { tg_seterr(err, "tg_save: NULL path"); return TG_FAILED; }
    const tg_graph *g = t->c.g;
    int n = t->n_params + (with_optimizer ? g->n_state : 0);
    st_tensor *ts = tg_alloc(sizeof(st_tensor) * (size_t)(n + 1));
    if (!ts) { tg_seterr(err, "tg_save: out of memory"); return TG_FAILED; }
    bool held = true;   /* every tensor copied to the host */
    for (int i = 0; i < t->n_params; i++) {
        const tg_param_spec *p = model_param(t->model, i);
        held &= host_tensor(t->be, t->param[i], p->name, p->shape, &ts[i]);
    }
    char name[600], step[32], base[32];
    for (int s = 0; with_optimizer && s < g->n_state; s++) {
        state_name(t, s, name, sizeof name);
        held &= host_tensor(t->be, t->state[s], name, g->nodes[g->state_shape_node[s]].shape, &ts[t->n_params + s]);
    }
    if (!held) tg_seterr(err, "tg_save: out of memory copying %s", path);
    snprintf(step, sizeof step, "%lld", (long long)t->step);
    snprintf(base, sizeof base, "%lld", (long long)t->sched_base);
    const char *keys[] = { "format", "tensorgrad.step", "tensorgrad.schedule_base" };
    const char *vals[] = { "pt", step, base };
    bool ok = held && st_write(path, ts, n, keys, vals, with_optimizer ? 3 : 1, err);
    for (int i = 0; i < n; i++) {
        free(ts[i].name);
        free(ts[i].data);
    }
    free(ts);
    return ok ? TG_OK : TG_FAILED;
}

/* The file's tensor `name`, checked against the shape it must have; NULL with err set. */
static const st_tensor *expect(const st_file *f, const char *path, const char *name, tg_shape shape, tg_error *err) {
    const st_tensor *st = st_find(f, name);
    char a[96], b[96];
    if (!st) tg_seterr(err, "tg_load: %s has no tensor '%s'", path, name);
    else if (st->dtype != TG_FLOAT32) tg_seterr(err, "tg_load: %s: '%s' is i32, expected f32", path, name);
    else if (shape_numel(st->shape) != shape_numel(shape) || st->shape.ndim != shape.ndim ||
             memcmp(st->shape.d, shape.d, sizeof(int64_t) * (size_t)shape.ndim) != 0)
        tg_seterr(err, "tg_load: %s: '%s' has shape %s, the model's is %s", path, name, shape_str(st->shape, a),
                  shape_str(shape, b));
    else return st;
    return NULL;
}

static bool parse_count(const char *s, int64_t *out) {
    char *end;
    long long v = s ? strtoll(s, &end, 10) : -1;
    if (!s || *end || v < 0) return false;
    *out = v;
    return true;
}

static tg_status load(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    if (!path) { tg_seterr(err, "tg_load: NULL path"); return TG_FAILED; }
    st_file f;
    if (!st_read(path, &f, err)) return TG_FAILED;
    const tg_graph *g = t->c.g;
    bool ok = true;
    int64_t step = 0, base = 0;
    char name[600];
    /* Check everything first: a bad file changes nothing. */
    for (int i = 0; ok && i < t->n_params; i++)
        ok = expect(&f, path, model_param(t->model, i)->name, model_param(t->model, i)->shape, err) != NULL;
    for (int s = 0; ok && with_optimizer && s < g->n_state; s++) {
        state_name(t, s, name, sizeof name);
        ok = expect(&f, path, name, g->nodes[g->state_shape_node[s]].shape, err) != NULL;
    }
    if (ok && with_optimizer && (!parse_count(st_meta(&f, "tensorgrad.step"), &step) ||
                                 !parse_count(st_meta(&f, "tensorgrad.schedule_base"), &base))) {
        tg_seterr(err, "tg_load: %s has no optimizer step count (saved without optimizer state?)", path);
        ok = false;
    }
    for (int i = 0; ok && i < t->n_params; i++) {
        const st_tensor *st = st_find(&f, model_param(t->model, i)->name);
        t->be->upload(t->param[i], TG_FLOAT32, st->data, (size_t)shape_numel(st->shape));
    }
    for (int s = 0; ok && with_optimizer && s < g->n_state; s++) {
        state_name(t, s, name, sizeof name);
        const st_tensor *st = st_find(&f, name);
        t->be->upload(t->state[s], TG_FLOAT32, st->data, (size_t)shape_numel(st->shape));
    }
    if (ok && with_optimizer) {
        t->step = step;
        t->sched_base = base;
    }
    st_free(&f);
    return ok ? TG_OK : TG_FAILED;
}

/* ----- the locked entry points of the functions above ----- */

/* Runs `body` with t's family locked, or sets err and fails when t is not a live handle. */
#define WITH_TRAIN(what, t, err, body)                                                    \
    do {                                                                                  \
        tg_train *l_ = lock_train(t);                                                     \
        if (!l_) { tg_seterr(err, "%s: %s training handle", what, dead(t)); return TG_FAILED; } \
        tg_status st_ = body;                                                             \
        unlock(l_);                                                                       \
        return st_;                                                                       \
    } while (0)

tg_status tg_download_param(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    WITH_TRAIN("tg_download_param", t, err, download_param(l_, name, dst, n, err));
}

tg_status tg_download_param_grad(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    WITH_TRAIN("tg_download_param_grad", t, err, download_param_grad(l_, name, dst, n, err));
}

tg_status tg_upload_params(tg_train *t, const tg_data *params, int n, tg_error *err) {
    WITH_TRAIN("tg_upload_params", t, err, upload_params(l_, params, n, err));
}

tg_status tg_save(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    WITH_TRAIN("tg_save", t, err, save(l_, path, with_optimizer, err));
}

tg_status tg_load(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    WITH_TRAIN("tg_load", t, err, load(l_, path, with_optimizer, err));
}

tg_status tg_reset(tg_train *t, int params, int optimizer) {
    tg_train *l = lock_train(t);
    if (!l) return TG_FAILED;
    tg_status st = reset(l, params, optimizer);
    unlock(l);
    return st;
}

void tg_set_schedule(tg_train *t, const tg_schedule *s) {
    tg_train *l = lock_train(t);
    if (!l) return;
    set_schedule(l, s);
    unlock(l);
}

void tg_set_lr(tg_train *t, double lr) {
    tg_schedule s = tg_lr_constant(lr);
    tg_set_schedule(t, &s);
}
