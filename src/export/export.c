/* tg_export_c: a forward handle's function, traced at its concrete input shapes, written out as
 * one C99 file that needs nothing but libm (emit.c says what is in it).
 *
 * The file follows the CPU backend exactly up to the text: the same trace, fuse.c's schedule and
 * the CPU refinements (products absorb their bias adds), the same buffer plan, and the CPU
 * generator's kernels (codegen_c_standalone), so an exported forward computes what tg_run
 * computes on the cpu backend, with portable library kernels in place of the library's fast
 * ones. The weights are the training handle's at the time of the call. */
#include "export/export.h"
#include "cpu/cpu.h"
#include "io/safetensors.h"
#include "runtime/runtime.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A C identifier, short enough that the API's names stay readable. */
static bool valid_prefix(const char *p) {
    if (!p || !(p[0] == '_' || (p[0] >= 'a' && p[0] <= 'z') || (p[0] >= 'A' && p[0] <= 'Z'))) return false;
    size_t n = 0;
    for (; p[n]; n++)
        if (!(p[n] == '_' || (p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z') || (p[n] >= '0' && p[n] <= '9')))
            return false;
    return n <= 64;
}

/* The forward's declarations with open dimensions set to open_size; NULL with err set when one
 * is open and no size was given (or memory runs out). */
static tg_input_decl *concrete_inputs(const tg_forward *f, int64_t open_size, tg_error *err) {
    tg_input_decl *d = tg_alloc(sizeof(tg_input_decl) * (size_t)(f->n_inputs + 1));
    if (!d) { tg_seterr(err, "tg_export_c: out of memory"); return NULL; }
    for (int i = 0; i < f->n_inputs; i++) {
        d[i] = f->decls[i];
        for (int k = 0; k < d[i].shape.ndim; k++) {
            if (d[i].shape.d[k] != TG_ANY) continue;
            if (open_size <= 0) {
                tg_seterr(err, "tg_export_c: input '%s' has an open dimension (TG_ANY): an exported forward has fixed shapes; "
                          "set opts.open_size to the size to export (1 for one sample at a time)", d[i].name);
                free(d);
                return NULL;
            }
            d[i].shape.d[k] = open_size;
        }
    }
    return d;
}

/* Ops an exported file cannot compute: those that draw random numbers per call (from a seed the
 * runtime passes in) or read per-call scalars. */
static bool exportable(const tg_graph *g, tg_error *err) {
    for (int i = 0; i < g->n; i++) {
        const tg_node *n = &g->nodes[i];
        const char *why = n->op == OP_DROPOUT ? "draws a new random mask on every call; trace the forward without dropout "
                                                "(p = 0), as for evaluation"
                          : n->op == OP_RANDN ? "draws new random numbers on every call"
                          : n->op == OP_HYPER || n->op == OP_STATE ? "reads values the runtime sets per call"
                                                                    : NULL;
        if (why) {
            tg_seterr(err, "tg_export_c: %s:%d: %s %s: an exported forward computes a fixed function of its inputs",
                      n->site.file ? n->site.file : "?", n->site.line, op_name(n->op), why);
            return false;
        }
    }
    if (g->nodes[g->output].dtype != TG_FLOAT32) {
        tg_seterr(err, "tg_export_c: the forward output must be f32");
        return false;
    }
    return true;
}

/* What one export holds while it is being built. */
typedef struct {
    tg_graph *g;
    bool *mat;
    int *alias, *inplace;
    tg_plan plan;
    char *kernels;
    float **values;
    int n_values;
} build;

static void build_free(build *b) {
    for (int i = 0; b->values && i < b->n_values; i++) free(b->values[i]);
    free(b->values);
    free(b->kernels);
    plan_free(&b->plan);
    free(b->mat);
    free(b->alias);
    free(b->inplace);
    ir_free(b->g);
}

/* The CPU backend's schedule, plan and kernels for b->g (see cpu_prepare), standalone. */
static bool generate(build *b, bool openmp, tg_error *err) {
    const tg_graph *g = b->g;
    size_t n = (size_t)g->n + 1;
    int keep = g->output;
    b->mat = tg_alloc(sizeof(bool) * n);
    b->alias = tg_alloc(sizeof(int) * n);
    b->inplace = tg_alloc(sizeof(int) * n);
    bool ok = b->mat && b->alias && b->inplace;
    if (ok) {
        fuse_schedule(g, &keep, 1, true, 0, b->mat, b->alias);
        codegen_c_refine(g, &keep, 1, b->mat, b->alias, b->inplace);
        ok = plan_build(g, &keep, 1, b->mat, b->alias, NULL, NULL, NULL, &b->plan);
    }
    int unsupported = -1;
    char *source = ok ? codegen_c_standalone(g, b->mat, &b->plan, openmp ? CPU_PARALLEL_MIN : INT_MAX, &unsupported) : NULL;
    b->kernels = source ? export_tidy(source, openmp) : NULL;
    free(source);
    if (unsupported >= 0)
        tg_seterr(err, "tg_export_c: op '%s' (node %d) has no exportable kernel", op_name(g->nodes[unsupported].op), unsupported);
    else if (!b->kernels)
        tg_seterr(err, "tg_export_c: out of memory generating the kernels of %d nodes", g->n);
    return b->kernels != NULL;
}

/* The values of every parameter the graph reads, from the training handle's buffers. */
static bool read_values(build *b, const tg_train *t, tg_error *err) {
    const tg_graph *g = b->g;
    b->values = tg_alloc(sizeof(float *) * (size_t)(g->n_params + 1));
    if (!b->values) { tg_seterr(err, "tg_export_c: out of memory"); return false; }
    b->n_values = g->n_params;
    for (int i = 0; i < g->n_params; i++) {
        if (g->param_node[i] < 0) continue;
        size_t numel = (size_t)g->nodes[g->param_node[i]].numel;
        b->values[i] = tg_alloc(sizeof(float) * (numel ? numel : 1));
        if (!b->values[i] || !rt_read_floats(t->be, t->param[i], b->values[i], numel)) {
            tg_seterr(err, "tg_export_c: out of memory reading the weights");
            return false;
        }
    }
    return true;
}

/* text into path, through a temporary file renamed over it: path is whole or untouched. */
static bool write_text(const char *path, const char *text, tg_error *err) {
    size_t len = strlen(path) + 16;
    char *tmp = tg_alloc(len);
    if (!tmp) { tg_seterr(err, "tg_export_c: out of memory"); return false; }
    snprintf(tmp, len, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(text, 1, strlen(text), f) == strlen(text);
    int e = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        tg_seterr(err, "tg_export_c: cannot write %s: %s", path, strerror(e));
        if (f) unlink(tmp);
    }
    free(tmp);
    return ok;
}

/* The weights the graph reads as a safetensors file, named as the model names them. */
static bool write_weights(const build *b, const char *path, tg_error *err) {
    const tg_graph *g = b->g;
    st_tensor *ts = tg_alloc(sizeof(st_tensor) * (size_t)(g->n_params + 1));
    if (!ts) { tg_seterr(err, "tg_export_c: out of memory"); return false; }
    int n = 0;
    for (int i = 0; i < g->n_params; i++) {
        const tg_node *p = g->param_node[i] >= 0 ? &g->nodes[g->param_node[i]] : NULL;
        if (p) ts[n++] = (st_tensor){ (char *)p->name, TG_FLOAT32, p->shape, b->values[i], sizeof(float) * (size_t)p->numel };
    }
    const char *key = "format", *val = "pt";
    tg_error e;
    bool ok = st_write(path, ts, n, &key, &val, 1, &e);
    if (!ok) tg_seterr(err, "tg_export_c: %s", e.msg);
    free(ts);
    return ok;
}

/* The export under the forward's family lock. */
static tg_status export_locked(tg_forward *f, const char *path, const tg_export_opts *o, tg_error *err) {
    build b;
    memset(&b, 0, sizeof b);
    tg_input_decl *decls = concrete_inputs(f, o->open_size, err);
    if (!decls) return TG_FAILED;
    tg_error e;
    b.g = rt_trace(f->train->model, f->fn, f->ctx, decls, f->n_inputs, false, 0, &e);
    free(decls);
    if (!b.g) tg_seterr(err, "tg_export_c: %s", e.msg);
    bool ok = b.g && exportable(b.g, err) && generate(&b, o->openmp, err) && read_values(&b, f->train, err);
    export_model m = { b.g, &b.plan, b.kernels, b.values, o->prefix ? o->prefix : "model", o->external_weights != 0,
                       o->openmp != 0 };
    char *source = ok ? export_source(&m) : NULL, *header = ok && o->header_path ? export_header(&m) : NULL;
    if (ok && (!source || (o->header_path && !header))) {
        tg_seterr(err, "tg_export_c: out of memory writing the source");
        ok = false;
    }
    ok = ok && (!o->external_weights || !o->weights_path || write_weights(&b, o->weights_path, err));
    ok = ok && (!header || write_text(o->header_path, header, err));
    ok = ok && write_text(path, source, err);
    free(source);
    free(header);
    build_free(&b);
    return ok ? TG_OK : TG_FAILED;
}

tg_status tg_export_c(tg_forward *f, const char *path, const tg_export_opts *opts, tg_error *err) {
    tg_export_opts o = opts ? *opts : (tg_export_opts){ 0 };
    if (!path) { tg_seterr(err, "tg_export_c: NULL path"); return TG_FAILED; }
    if (o.prefix && !valid_prefix(o.prefix)) {
        tg_seterr(err, "tg_export_c: prefix '%.100s' is not a C identifier of at most 64 characters", o.prefix);
        return TG_FAILED;
    }
    if (o.open_size < 0) {
        tg_seterr(err, "tg_export_c: open_size is %lld", (long long)o.open_size);
        return TG_FAILED;
    }
    if (o.weights_path && !o.external_weights) {
        tg_seterr(err, "tg_export_c: weights_path is set but external_weights is not (embedded weights need no file)");
        return TG_FAILED;
    }
    tg_train *t = rt_lock_forward(f);
    if (!t) { tg_seterr(err, "tg_export_c: %s forward handle", rt_dead(f)); return TG_FAILED; }
    tg_status st = export_locked(f, path, &o, err);
    rt_unlock(t);
    return st;
}
