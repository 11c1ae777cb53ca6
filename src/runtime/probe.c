/* A test hook: one traced graph, with optional gradients with respect to every f32 input and
 * every parameter, run on any backend with values exchanged as doubles. Op tests use it on the
 * reference in double precision (against float64 expectations and finite differences) and to
 * compare another backend with the reference. */
#include "runtime/probe.h"
#include "runtime/runtime.h"
#include "runtime/backend.h"
#include "compile/compile.h"

#include <stdlib.h>

struct tg_probe {
    const tg_backend *be;
    tg_graph *g;
    void *exec;
    int n_inputs;
    double **input, **param;            /* host values, written to the backend at each run */
    void **input_buf, **param_buf;      /* backend buffers; param entries NULL if unused */
    int *input_grad;                    /* per input: gradient node or -1 */
    double *output, **input_grad_host, **param_grad_host;
    double hyper[1];                    /* the random seed */
};

static double *host_array(int64_t n) { return tg_alloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); }

/* Gradient nodes w.r.t. every f32 input and used parameter; false with err set on failure. */
static bool add_grads(tg_probe *p, tg_error *err) {
    tg_graph *g = p->g;
    int *wrt = tg_alloc(sizeof(int) * (size_t)(p->n_inputs + g->n_params + 1));
    int *grad = tg_alloc(sizeof(int) * (size_t)(p->n_inputs + g->n_params + 1));
    int n_wrt = 0;
    if (!wrt || !grad) ir_fail(g, TG_HERE, "out of memory deriving gradients");
    for (int i = 0; wrt && i < p->n_inputs; i++)
        if (g->nodes[i].dtype == TG_FLOAT32) wrt[n_wrt++] = i;
    for (int i = 0; wrt && i < g->n_params; i++)
        if (g->param_node[i] >= 0) wrt[n_wrt++] = g->param_node[i];
    bool ok = ir_ok(g) && grad_build(g, g->output, wrt, n_wrt, grad);
    if (ok) {
        int k = 0;
        for (int i = 0; i < p->n_inputs; i++)
            if (g->nodes[i].dtype == TG_FLOAT32) p->input_grad[i] = grad[k++];
        for (int i = 0; i < g->n_params; i++)
            if (g->param_node[i] >= 0) g->grad_of_param[i] = grad[k++];
    } else {
        tg_seterr(err, "%s", g->error);
    }
    free(wrt);
    free(grad);
    return ok;
}

/* The host arrays and backend buffers of inputs and used parameters; false when memory runs
 * out (tg_probe_free frees what was made). */
static bool alloc_buffers(tg_probe *p, tg_model *m) {
    const tg_graph *g = p->g;
    int n_inputs = p->n_inputs;
    p->input = tg_alloc(sizeof(double *) * (size_t)(n_inputs + 1));
    p->input_buf = tg_alloc(sizeof(void *) * (size_t)(n_inputs + 1));
    p->input_grad_host = tg_alloc(sizeof(double *) * (size_t)(n_inputs + 1));
    p->param = tg_alloc(sizeof(double *) * (size_t)(g->n_params + 1));
    p->param_buf = tg_alloc(sizeof(void *) * (size_t)(g->n_params + 1));
    p->param_grad_host = tg_alloc(sizeof(double *) * (size_t)(g->n_params + 1));
    p->output = host_array(g->nodes[g->output].numel);
    if (!p->input || !p->input_buf || !p->input_grad_host || !p->param || !p->param_buf || !p->param_grad_host || !p->output)
        return false;
    for (int i = 0; i < n_inputs; i++) {
        p->input[i] = host_array(g->nodes[i].numel);
        p->input_buf[i] = p->be->alloc((size_t)g->nodes[i].numel);
        if (p->input_grad[i] >= 0) p->input_grad_host[i] = host_array(g->nodes[i].numel);
        if (!p->input[i] || !p->input_buf[i] || (p->input_grad[i] >= 0 && !p->input_grad_host[i])) return false;
        p->be->bind(p->exec, i, p->input_buf[i]);
    }
    for (int i = 0; i < g->n_params; i++) {
        if (g->param_node[i] < 0) continue;
        int64_t n = g->nodes[g->param_node[i]].numel;
        p->param[i] = host_array(n);
        p->param_buf[i] = p->be->alloc((size_t)n);
        if (g->grad_of_param[i] >= 0) p->param_grad_host[i] = host_array(n);
        if (!p->param[i] || !p->param_buf[i] || (g->grad_of_param[i] >= 0 && !p->param_grad_host[i])) return false;
        model_init_param(m, i, p->param[i]);
        p->be->bind(p->exec, g->param_node[i], p->param_buf[i]);
    }
    return true;
}

tg_probe *tg_probe_new_at(const char *backend, tg_precision precision, tg_model *m, tg_forward_fn fn, const void *ctx,
                          const tg_input_decl *inputs, int n_inputs, bool grads, tg_error *err) {
    const tg_backend *be = backend_find(backend, err);
    tg_precision runs;
    if (!be || !rt_precision(be, precision, &runs, err)) return NULL;
    tg_graph *g = rt_trace(m, fn, ctx, inputs, n_inputs, false, 0, err);
    if (!g) return NULL;
    g->precision = runs;
    g->group_products = rt_group_products(NULL, runs);
    tg_probe *p = tg_alloc(sizeof *p);
    if (!p) {
        tg_seterr(err, "out of memory for the probe");
        ir_free(g);
        return NULL;
    }
    p->be = be;
    p->g = g;
    p->n_inputs = n_inputs;
    p->input_grad = tg_alloc(sizeof(int) * (size_t)(n_inputs + 1));
    if (!p->input_grad) ir_fail(g, TG_HERE, "out of memory for the probe");
    for (int i = 0; p->input_grad && i < n_inputs; i++) p->input_grad[i] = -1;
    if (!ir_ok(g) || (grads && !add_grads(p, err))) {
        tg_seterr(err, "%s", g->error);
        tg_probe_free(p);
        return NULL;
    }
    int *keep = tg_alloc(sizeof(int) * (size_t)(n_inputs + g->n_params + 1));
    int n_keep = 0;
    if (keep) {
        keep[n_keep++] = g->output;
        for (int i = 0; i < n_inputs; i++)
            if (p->input_grad[i] >= 0) keep[n_keep++] = p->input_grad[i];
        for (int i = 0; i < g->n_params; i++)
            if (g->grad_of_param[i] >= 0) keep[n_keep++] = g->grad_of_param[i];
        p->exec = be->prepare(g, keep, n_keep, err);
    } else {
        tg_seterr(err, "out of memory for the probe");
    }
    free(keep);
    if (!p->exec) {
        tg_probe_free(p);
        return NULL;
    }
    if (!alloc_buffers(p, m)) {
        tg_seterr(err, "out of memory for the probe's buffers");
        tg_probe_free(p);
        return NULL;
    }
    return p;
}

tg_probe *tg_probe_new_on(const char *backend, tg_model *m, tg_forward_fn fn, const void *ctx,
                          const tg_input_decl *inputs, int n_inputs, bool grads, tg_error *err) {
    return tg_probe_new_at(backend, TG_PRECISION_F32, m, fn, ctx, inputs, n_inputs, grads, err);
}

tg_probe *tg_probe_new(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *inputs,
                       int n_inputs, bool grads, bool round_f32, tg_error *err) {
    return tg_probe_new_on(round_f32 ? "reference" : "reference-f64", m, fn, ctx, inputs, n_inputs, grads, err);
}

double *tg_probe_input(tg_probe *p, int i) { return i >= 0 && i < p->n_inputs ? p->input[i] : NULL; }
double *tg_probe_param(tg_probe *p, int id) { return id >= 0 && id < p->g->n_params ? p->param[id] : NULL; }
void tg_probe_set_seed(tg_probe *p, uint64_t seed) { p->hyper[HYPER_SEED] = (double)(seed & ((1ull << 53) - 1)); }
const double *tg_probe_output(tg_probe *p) { return p->output; }
tg_shape tg_probe_output_shape(tg_probe *p) { return p->g->nodes[p->g->output].shape; }
const tg_graph *tg_probe_graph(tg_probe *p) { return p->g; }

static void read_back(tg_probe *p, int node, double *dst) {
    const tg_node *n = &p->g->nodes[node];
    p->be->read(p->be->node_buf(p->exec, node), n->dtype, dst, (size_t)n->numel);
}

bool tg_probe_run(tg_probe *p) {
    const tg_graph *g = p->g;
    for (int i = 0; i < p->n_inputs; i++)
        p->be->write(p->input_buf[i], g->nodes[i].dtype, p->input[i], (size_t)g->nodes[i].numel);
    for (int i = 0; i < g->n_params; i++)
        if (p->param_buf[i]) p->be->write(p->param_buf[i], TG_FLOAT32, p->param[i], (size_t)g->nodes[g->param_node[i]].numel);
    tg_error err;
    if (!p->be->run(p->exec, p->hyper, &err)) return false;
    read_back(p, g->output, p->output);
    for (int i = 0; i < p->n_inputs; i++)
        if (p->input_grad[i] >= 0) read_back(p, p->input_grad[i], p->input_grad_host[i]);
    for (int i = 0; i < g->n_params; i++)
        if (p->param_grad_host[i]) read_back(p, g->grad_of_param[i], p->param_grad_host[i]);
    return true;
}

const double *tg_probe_input_grad(tg_probe *p, int i) {
    return i >= 0 && i < p->n_inputs && p->input_grad[i] >= 0 ? p->input_grad_host[i] : NULL;
}

const double *tg_probe_param_grad(tg_probe *p, int id) {
    return id >= 0 && id < p->g->n_params ? p->param_grad_host[id] : NULL;
}

void tg_probe_free(tg_probe *p) {
    if (!p) return;
    for (int i = 0; p->input && p->input_buf && p->input_grad_host && i < p->n_inputs; i++) {
        free(p->input[i]);
        free(p->input_grad_host[i]);
        if (p->input_buf[i]) p->be->free(p->input_buf[i]);
    }
    for (int i = 0; p->param && p->param_buf && p->param_grad_host && i < p->g->n_params; i++) {
        free(p->param[i]);
        free(p->param_grad_host[i]);
        if (p->param_buf[i]) p->be->free(p->param_buf[i]);
    }
    free(p->input);
    free(p->input_buf);
    free(p->input_grad_host);
    free(p->param);
    free(p->param_buf);
    free(p->param_grad_host);
    free(p->input_grad);
    free(p->output);
    if (p->exec) p->be->release(p->exec);
    ir_free(p->g);
    free(p);
}
