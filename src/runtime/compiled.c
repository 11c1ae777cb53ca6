/* A traced graph made ready to run on a backend, and what training handles and forwards do
 * with one alike: bind parameters and inputs, read a node back. */
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rt_compile_graph(compiled *c, const tg_backend *be, tg_graph *g, int n_inputs, const int *keep, int n_keep,
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
void rt_compiled_free(compiled *c) {
    for (int i = 0; i < c->n_inputs && c->input_buf; i++)
        if (c->input_buf[i]) c->be->free(c->input_buf[i]);
    free(c->input_buf);
    free(c->decls);
    if (c->exec) c->be->release(c->exec);
    ir_free(c->g);
}

void rt_bind_params(compiled *c, void **param) {
    for (int i = 0; i < c->g->n_params; i++)
        if (c->g->param_node[i] >= 0) c->be->bind(c->exec, c->g->param_node[i], param[i]);
}

/* One node's values on the host (n doubles). */
void rt_read_node(const compiled *c, int node, double *dst) {
    const tg_node *n = &c->g->nodes[node];
    c->be->read(c->be->node_buf(c->exec, node), n->dtype, dst, (size_t)n->numel);
}

static const char *dtype_name(tg_dtype d) { return d == TG_INT32 ? "i32" : d == TG_FLOAT32 ? "f32" : "an unknown dtype"; }

/* Check a call's data against the declared inputs: names, dtypes and element counts. */
bool rt_check_inputs(const compiled *c, const tg_data *data, int n, char *err, size_t errlen) {
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
    return true;
}

int rt_input_index(const compiled *c, const char *name) {
    for (int i = 0; i < c->n_inputs; i++)
        if (strcmp(name, c->decls[i].name) == 0) return i;
    return -1;
}

bool rt_bind_inputs(compiled *c, const tg_data *data, int n, char *err, size_t errlen) {
    if (!rt_check_inputs(c, data, n, err, errlen)) return false;
    for (int k = 0; k < n; k++) {
        int i = rt_input_index(c, data[k].name);
        c->be->upload(c->input_buf[i], data[k].dtype, data[k].data, data[k].n);
    }
    c->holds_batch = true;
    return true;
}

bool rt_bind_batch(compiled *c, const tg_data *data, int n, char *err, size_t errlen) {
    if (n != 0 || c->n_inputs == 0) return rt_bind_inputs(c, data, n, err, errlen);
    if (!c->holds_batch)
        snprintf(err, errlen, "missing input '%s': no inputs given, and no earlier step left a batch to run on again",
                 c->decls[0].name);
    return c->holds_batch;
}

/* The nodes a compiled graph keeps readable after a run: `first` (outputs, gradients), then its
 * captures and, in a patchable graph, the values arriving at its patch sites (tg_patch_from).
 * NULL when memory runs out. */
int *rt_keep_list(const tg_graph *g, const int *first, int n_first, int *n_keep) {
    int *keep = tg_alloc(sizeof(int) * (size_t)(n_first + g->n_captures + g->n_patches + 1));
    int n = 0;
    if (!keep) return NULL;
    for (int i = 0; i < n_first; i++) keep[n++] = first[i];
    for (int i = 0; i < g->n_captures; i++) keep[n++] = g->captures[i].node;
    for (int i = 0; g->patchable && i < g->n_patches; i++) keep[n++] = g->patches[i].node;
    *n_keep = n;
    return keep;
}
