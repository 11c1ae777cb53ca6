/* The runtime: compiling a training spec (trace, autograd, optimizer, plan, backend), running
 * steps and forwards, and the parameter store that a training handle shares with the forward
 * graphs attached to it. */
#include "internal.h"
#include "io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A graph made ready to run: its plan, its executor and its input buffers. The first n_inputs
 * nodes of the graph are its INPUT nodes, in declaration order. */
typedef struct {
    const tg_backend *be;
    tg_graph *g;
    void *exec;
    tg_input_decl *decls;     /* names owned by the graph's INPUT nodes */
    int n_inputs;
    void **input_buf;
} compiled;

#define MAX_SCHEDULE_CHAIN 8

struct tg_forward {
    tg_train *train;
    compiled c;
    float *out;
    double *host;             /* the output read back, before rounding to float */
    int64_t calls;            /* seeds randn/dropout: a new draw per call */
};

struct tg_train {
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

static tg_result failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static tg_result failed(const char *fmt, ...) {
    tg_result r;
    memset(&r, 0, sizeof r);
    r.status = TG_FAILED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.error, sizeof r.error, fmt, ap);
    va_end(ap);
    return r;
}

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
tg_graph *rt_trace(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *in, int n, tg_error *err) {
    if (!m) { tg_seterr(err, "no model given"); return NULL; }
    if (!fn) { tg_seterr(err, "no forward/loss function given"); return NULL; }
    if (tg_model_error(m)) { tg_seterr(err, "%s", tg_model_error(m)); return NULL; }
    if (!check_decls(in, n, err)) return NULL;
    tg_graph *g = ir_new(m);
    if (!g) { tg_seterr(err, "out of memory starting a trace"); return NULL; }
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

tg_train *tg_compile(const tg_train_spec *spec, tg_error *err) {
    if (!spec) { tg_seterr(err, "tg_compile: no spec"); return NULL; }
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
    ok = ok && optim_build(g, &spec->optimizer);
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
    ok = compile_graph(&t->c, be, g, spec->n_inputs, grads, n_wrt + 2, err) && alloc_store(t, err);
    free(grads);
    if (ok && !init_params(t)) {
        tg_seterr(err, "out of memory initialising the parameters");
        ok = false;
    }
    if (!ok) {
        tg_destroy(t);
        return NULL;
    }
    bind_params(&t->c, t->param);
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == OP_STATE) be->bind(t->c.exec, i, t->state[g->nodes[i].iarg[0]]);
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

double tg_train_lr(const tg_train *t) { return t ? tg_schedule_at(&t->opt.lr, sched_step(t)) : 0; }
int64_t tg_train_step_count(const tg_train *t) { return t ? t->step : 0; }

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

tg_result tg_step(tg_train *t, const tg_data *inputs, int n_inputs) {
    if (!t) return failed("tg_step: NULL training handle");
    tg_result r;
    memset(&r, 0, sizeof r);
    if (!bind_inputs(&t->c, inputs, n_inputs, r.error, sizeof r.error)) { r.status = TG_FAILED; return r; }
    double lr = tg_train_lr(t);   /* tg_set_lr / tg_set_schedule take any double: checked here */
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

/* ----- forward graphs ----- */

static void forward_free(tg_forward *f);

tg_forward *tg_attach(tg_train *t, const tg_forward_spec *spec, tg_error *err) {
    if (!t || !spec) { tg_seterr(err, "tg_attach: NULL %s", t ? "spec" : "training handle"); return NULL; }
    tg_graph *g = rt_trace(t->model, spec->forward, spec->ctx, spec->inputs, spec->n_inputs, err);
    if (!g) return NULL;
    if (g->nodes[g->output].dtype != TG_FLOAT32) {
        tg_seterr(err, "tg_attach: the forward output must be f32");
        ir_free(g);
        return NULL;
    }
    tg_forward *f = tg_alloc(sizeof *f);
    if (!f) {
        tg_seterr(err, "tg_attach: out of memory");
        ir_free(g);
        return NULL;
    }
    f->train = t;
    if (!compile_graph(&f->c, t->be, g, spec->n_inputs, &g->output, 1, err)) {
        forward_free(f);
        return NULL;
    }
    bind_params(&f->c, t->param);
    f->out = tg_alloc(sizeof(float) * (size_t)g->nodes[g->output].numel);
    f->host = tg_alloc(sizeof(double) * (size_t)g->nodes[g->output].numel);
    tg_forward **fwd = f->out && f->host ? tg_realloc(t->fwd, sizeof(tg_forward *) * (size_t)(t->n_fwd + 1)) : NULL;
    if (!fwd) {
        tg_seterr(err, "tg_attach: out of memory for the output");
        forward_free(f);
        return NULL;
    }
    t->fwd = fwd;
    t->fwd[t->n_fwd++] = f;
    return f;
}

tg_result tg_run(tg_forward *f, const tg_data *inputs, int n_inputs) {
    if (!f) return failed("tg_run: NULL forward handle");
    tg_result r;
    memset(&r, 0, sizeof r);
    if (!bind_inputs(&f->c, inputs, n_inputs, r.error, sizeof r.error)) { r.status = TG_FAILED; return r; }
    double hyper[1] = { call_seed(f->train->model, 1, ++f->calls) };
    tg_error err;
    if (!f->c.be->run(f->c.exec, hyper, &err)) return failed("tg_run: %s", err.msg);
    const tg_node *out = &f->c.g->nodes[f->c.g->output];
    read_node(&f->c, f->c.g->output, f->host);
    for (int64_t i = 0; i < out->numel; i++) f->out[i] = (float)f->host[i];
    r.status = TG_OK;
    r.output = f->out;
    r.output_len = (size_t)out->numel;
    r.output_shape = out->shape;
    return r;
}

tg_result tg_eval_loss(tg_train *t, const tg_data *inputs, int n_inputs) {
    if (!t) return failed("tg_eval_loss: NULL training handle");
    if (!t->eval) {
        tg_error err;
        tg_forward_spec spec = { t->loss_fn, t->loss_ctx, t->c.decls, t->c.n_inputs };
        t->eval = tg_attach(t, &spec, &err);
        if (!t->eval) return failed("tg_eval_loss: %s", err.msg);
    }
    tg_result r = tg_run(t->eval, inputs, n_inputs);
    if (r.status == TG_OK && !isfinite(r.output[0]))   /* as tg_step: a non-finite loss is a failure */
        return failed("tg_eval_loss: loss is %s", isnan(r.output[0]) ? "NaN" : "infinite");
    if (r.status == TG_OK) {
        r.loss = r.output[0];
        r.step = t->step;
        r.output = NULL;
        r.output_len = 0;
    }
    return r;
}

static void forward_free(tg_forward *f) {
    compiled_free(&f->c);
    free(f->out);
    free(f->host);
    free(f);
}

void tg_destroy(tg_train *t) {
    if (!t) return;
    for (int i = 0; i < t->n_fwd; i++) forward_free(t->fwd[i]);
    free(t->fwd);
    for (int i = 0; t->state && i < t->c.g->n_state; i++)
        if (t->state[i]) t->be->free(t->state[i]);
    free(t->state);
    for (int i = 0; t->param && i < t->n_params; i++)
        if (t->param[i]) t->be->free(t->param[i]);
    free(t->param);
    free(t->wb_dst);
    compiled_free(&t->c);
    free(t);
}

/* ----- parameters ----- */

int tg_train_n_params(const tg_train *t) { return t ? t->n_params : 0; }
const char *tg_train_param_name(const tg_train *t, int i) { return t ? tg_model_param_name(t->model, i) : NULL; }
tg_shape tg_train_param_shape(const tg_train *t, int i) { return t ? tg_model_param_shape(t->model, i) : TG_SHAPE0; }

/* The param named `name` with exactly n elements, or -1 with err set. */
static int find_param(const tg_train *t, const char *what, const char *name, size_t n, tg_error *err) {
    if (!t) { tg_seterr(err, "%s: NULL training handle", what); return -1; }
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

tg_status tg_download_param(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    int id = find_param(t, "tg_download_param", name, n, err);
    if (id < 0) return TG_FAILED;
    if (!dst) { tg_seterr(err, "tg_download_param: NULL destination"); return TG_FAILED; }
    if (!read_floats(t->be, t->param[id], dst, n)) { tg_seterr(err, "tg_download_param: out of memory"); return TG_FAILED; }
    return TG_OK;
}

tg_status tg_download_param_grad(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
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

tg_status tg_upload_params(tg_train *t, const tg_data *params, int n, tg_error *err) {
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

tg_status tg_reset(tg_train *t, int params, int optimizer) {
    if (!t) return TG_FAILED;
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

void tg_set_lr(tg_train *t, double lr) {
    if (!t) return;
    tg_schedule s = tg_lr_constant(lr);
    tg_set_schedule(t, &s);
}

void tg_set_schedule(tg_train *t, const tg_schedule *s) {
    if (!t || !s) return;
    copy_schedule(t, s);
    t->sched_base = t->step;
}

/* ----- inspection ----- */

const tg_graph *tg_train_graph(const tg_train *t) { return t ? t->c.g : NULL; }
const tg_graph *tg_forward_graph(const tg_forward *f) { return f ? f->c.g : NULL; }
size_t tg_train_planned_bytes(const tg_train *t) { return t ? t->be->planned_bytes(t->c.exec) : 0; }

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

tg_status tg_save(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    if (!t || !path) { tg_seterr(err, "tg_save: NULL %s", t ? "path" : "training handle"); return TG_FAILED; }
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

tg_status tg_load(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    if (!t || !path) { tg_seterr(err, "tg_load: NULL %s", t ? "path" : "training handle"); return TG_FAILED; }
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
