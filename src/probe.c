/* A test hook: one traced graph, with optional gradients with respect to every f32 input and
 * every parameter, run on the reference interpreter in double (or emulated f32) precision. It
 * is how op tests compare with float64 expectations and finite differences. */
#include "internal.h"

#include <stdlib.h>

struct tg_probe {
    tg_graph *g;
    tg_plan plan;
    ref_exec *exec;
    int n_inputs;
    double **input;       /* per input */
    double **param;       /* per model param id, NULL if unused */
    int *input_grad;      /* per input: gradient node or -1 */
};

tg_probe *tg_probe_new(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *inputs,
                       int n_inputs, bool grads, bool round_f32, tg_error *err) {
    tg_graph *g = rt_trace(m, fn, ctx, inputs, n_inputs, err);
    if (!g) return NULL;
    tg_probe *p = tg_xmalloc(sizeof *p);
    p->g = g;
    p->n_inputs = n_inputs;
    p->input_grad = tg_xmalloc(sizeof(int) * (size_t)(n_inputs + 1));
    for (int i = 0; i < n_inputs; i++) p->input_grad[i] = -1;
    int *keep = tg_xmalloc(sizeof(int) * (size_t)(n_inputs + g->n_params + 1));
    int n_keep = 0;
    if (grads) {
        int *wrt = tg_xmalloc(sizeof(int) * (size_t)(n_inputs + g->n_params + 1));
        int n_wrt = 0;
        for (int i = 0; i < n_inputs; i++)
            if (g->nodes[i].dtype == TG_FLOAT32) wrt[n_wrt++] = i;
        for (int i = 0; i < g->n_params; i++)
            if (g->param_node[i] >= 0) wrt[n_wrt++] = g->param_node[i];
        bool ok = grad_build(g, g->output, wrt, n_wrt, keep);
        free(wrt);
        if (!ok) {
            tg_seterr(err, "%s", g->error);
            free(keep);
            p->n_inputs = 0;
            tg_probe_free(p);
            return NULL;
        }
        int k = 0;
        for (int i = 0; i < n_inputs; i++)
            if (g->nodes[i].dtype == TG_FLOAT32) p->input_grad[i] = keep[k++];
        for (int i = 0; i < g->n_params; i++)
            if (g->param_node[i] >= 0) g->grad_of_param[i] = keep[k++];
        n_keep = k;
    }
    keep[n_keep++] = g->output;
    plan_build(g, keep, n_keep, &p->plan);
    free(keep);
    p->exec = ref_exec_new(g, &p->plan, round_f32);
    p->input = tg_xmalloc(sizeof(double *) * (size_t)(n_inputs + 1));
    for (int i = 0; i < n_inputs; i++) {
        p->input[i] = tg_xmalloc(sizeof(double) * (size_t)g->nodes[i].numel);
        ref_exec_bind(p->exec, i, p->input[i]);
    }
    p->param = tg_xmalloc(sizeof(double *) * (size_t)(g->n_params + 1));
    for (int i = 0; i < g->n_params; i++) {
        if (g->param_node[i] < 0) continue;
        p->param[i] = tg_xmalloc(sizeof(double) * (size_t)g->nodes[g->param_node[i]].numel);
        model_init_param(m, i, p->param[i]);
        ref_exec_bind(p->exec, g->param_node[i], p->param[i]);
    }
    return p;
}

double *tg_probe_input(tg_probe *p, int i) { return i >= 0 && i < p->n_inputs ? p->input[i] : NULL; }
double *tg_probe_param(tg_probe *p, int id) { return id >= 0 && id < p->g->n_params ? p->param[id] : NULL; }
void tg_probe_run(tg_probe *p) { ref_exec_run(p->exec, NULL); }
const double *tg_probe_output(tg_probe *p) { return ref_exec_value(p->exec, p->g->output); }
tg_shape tg_probe_output_shape(tg_probe *p) { return p->g->nodes[p->g->output].shape; }
const tg_graph *tg_probe_graph(tg_probe *p) { return p->g; }

const double *tg_probe_input_grad(tg_probe *p, int i) {
    return i >= 0 && i < p->n_inputs && p->input_grad[i] >= 0 ? ref_exec_value(p->exec, p->input_grad[i]) : NULL;
}

const double *tg_probe_param_grad(tg_probe *p, int id) {
    return id >= 0 && id < p->g->n_params && p->g->grad_of_param[id] >= 0 ? ref_exec_value(p->exec, p->g->grad_of_param[id]) : NULL;
}

void tg_probe_free(tg_probe *p) {
    if (!p) return;
    for (int i = 0; i < p->n_inputs; i++) free(p->input[i]);
    free(p->input);
    if (p->param)
        for (int i = 0; i < p->g->n_params; i++) free(p->param[i]);
    free(p->param);
    free(p->input_grad);
    ref_exec_free(p->exec);
    plan_free(&p->plan);
    ir_free(p->g);
    free(p);
}
