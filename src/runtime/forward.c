/* Forward handles: forward-only graphs attached to a training handle, sharing its parameter
 * buffers; their compiled variants (per open batch size, plain or patchable) and the call. */
#include "runtime/runtime.h"
#include "dist/dist.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A forward keeps its spec and compiles variants from it: one per value of its open dimensions
 * (least recently used evicted beyond max_variants), plain or patchable. Variants are traced
 * against the training handle's model of the moment: after tg_replace_model, against the new
 * one, at the next call. */

static void variant_free(const tg_backend *be, variant *v) {
    for (int i = 0; v->patch_buf && i < v->c.g->n_patches; i++)
        if (v->patch_buf[i]) be->free(v->patch_buf[i]);
    free(v->patch_buf);
    rt_compiled_free(&v->c);
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
    tg_precision runs = TG_PRECISION_F32;
    rt_precision(t->be, f->precision, &runs, err);   /* checked at attach */
    tg_graph *g = decls ? rt_trace(t->model, f->fn, f->ctx, decls, f->n_inputs, patchable, rt_product_align(t->be, runs), err)
                        : NULL;
    if (!decls) tg_seterr(err, "out of memory");
    free(decls);
    if (!g) return NULL;
    g->precision = runs;
    if (g->nodes[g->output].dtype != TG_FLOAT32) {
        tg_seterr(err, "the forward output must be f32");
        ir_free(g);
        return NULL;
    }
    variant *v = tg_alloc(sizeof *v);
    int n_keep, *keep = v ? rt_keep_list(g, &g->output, 1, &n_keep) : NULL;
    if (!keep) {
        tg_seterr(err, "out of memory");
        free(v);
        ir_free(g);
        return NULL;
    }
    v->size = size;
    v->patchable = patchable;
    bool ok = rt_compile_graph(&v->c, t->be, g, f->n_inputs, keep, n_keep, err);
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
    rt_bind_params(&v->c, t->param);
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

tg_result rt_run_locked(tg_forward *f, const tg_data *inputs, int n_inputs, bool patchable) {
    tg_result r;
    memset(&r, 0, sizeof r);
    if (n_inputs < 0 || (n_inputs > 0 && !inputs)) return rt_failed("tg_run: inputs: %d given but no array", n_inputs);
    int64_t size = open_size(f, inputs, n_inputs, r.error, sizeof r.error);
    if (size < 0) { r.status = TG_FAILED; return r; }
    tg_error err;
    variant *v = variant_for(f, size, patchable || rt_patch_any(f), &err);
    if (!v) return rt_failed("tg_run: %s", err.msg);
    v->used = ++f->clock;
    f->last = v;
    if (!rt_bind_inputs(&v->c, inputs, n_inputs, r.error, sizeof r.error)) { r.status = TG_FAILED; return r; }
    int n_hyper = v->c.g->n_hyper > 1 ? v->c.g->n_hyper : 1;
    double *hyper = tg_alloc(sizeof(double) * (size_t)n_hyper);
    if (!hyper) return rt_failed("tg_run: out of memory");
    hyper[HYPER_SEED] = rt_call_seed(f->train->model, 1, ++f->calls);
    bool ok = !v->patchable || rt_patch_apply(f, v, hyper, r.error, sizeof r.error);
    ok = ok && v->c.be->run(v->c.exec, hyper, &err);
    free(hyper);
    if (!ok && !r.error[0]) return rt_failed("tg_run: %s", err.msg);
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
            return rt_failed("tg_run: out of memory for the output");
        }
        free(f->out);
        free(f->host);
        f->out = o;
        f->host = h;
        f->out_cap = out->numel;
    }
    rt_read_node(&v->c, v->c.g->output, f->host);
    for (int64_t i = 0; i < out->numel; i++) f->out[i] = (float)f->host[i];
    r.status = TG_OK;
    r.output = f->out;
    r.output_len = (size_t)out->numel;
    r.output_shape = out->shape;
    return r;
}

void rt_forward_free(tg_forward *f) {
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
    if (!rt_check_decls(spec->inputs, spec->n_inputs, err)) return NULL;
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
    tg_precision precision = spec->precision ? spec->precision : t->precision, runs;
    tg_error e;
    if (!rt_precision(t->be, precision, &runs, &e)) { tg_seterr(err, "tg_attach: %s", e.msg); return NULL; }
    tg_forward *f = tg_alloc(sizeof *f);
    if (!f) { tg_seterr(err, "tg_attach: out of memory"); return NULL; }
    f->train = t;
    f->fn = spec->forward;
    f->ctx = spec->ctx;
    f->precision = precision;
    f->n_inputs = spec->n_inputs;
    f->max_variants = spec->max_variants ? spec->max_variants : DEFAULT_VARIANTS;
    f->generation = atomic_load(&t->generation);
    f->decls = forward_decls(spec, &f->open, err);
    if (!f->decls) {
        f->n_inputs = 0;
        rt_forward_free(f);
        return NULL;
    }
    if (!f->open) {   /* compiled now, so that trace errors come back from tg_attach */
        if (!variant_for(f, 0, false, &e)) {
            tg_seterr(err, "tg_attach: %s", e.msg);
            rt_forward_free(f);
            return NULL;
        }
        f->last = f->v[0];
    }
    tg_forward **fwd = tg_realloc(t->fwd, sizeof(tg_forward *) * (size_t)(t->n_fwd + 1));
    if (fwd) t->fwd = fwd;
    if (!fwd || !rt_registry_add(f)) {
        tg_seterr(err, "tg_attach: out of memory");
        rt_forward_free(f);
        return NULL;
    }
    t->fwd[t->n_fwd++] = f;
    return f;
}

tg_forward *tg_attach(tg_train *t, const tg_forward_spec *spec, tg_error *err) {
    tg_train *l = rt_lock_train(t);
    if (!l) { tg_seterr(err, "tg_attach: %s training handle", rt_dead(t)); return NULL; }
    tg_forward *f = attach_locked(l, spec, err);
    rt_unlock(l);
    return f;
}

tg_result tg_run(tg_forward *f, const tg_data *inputs, int n_inputs) {
    tg_train *t = rt_lock_forward(f);
    if (!t) return rt_failed("tg_run: %s forward handle", rt_dead(f));
    tg_result r = rt_run_locked(f, inputs, n_inputs, false);
    rt_unlock(t);
    return r;
}

/* Under t's lock: unregister and free a forward (its queued calls abort). */
static void detach_locked(tg_train *t, tg_forward *f) {
    rt_registry_remove(f);
    async_abort(t->queue, f, "the forward handle was detached");
    for (int i = 0; i < t->n_fwd; i++)
        if (t->fwd[i] == f) t->fwd[i] = t->fwd[--t->n_fwd];
    if (t->eval == f) t->eval = NULL;
    rt_forward_free(f);
}

void tg_detach(tg_forward *f) {
    tg_train *t = rt_lock_forward(f);
    if (!t) return;
    detach_locked(t, f);
    rt_unlock(t);
}

tg_result tg_eval_loss(tg_train *t, const tg_data *inputs, int n_inputs) {
    tg_train *l = rt_lock_train(t);
    if (!l) return rt_failed("tg_eval_loss: %s training handle", rt_dead(t));
    if (!l->eval) {
        tg_error err;
        /* Data parallel: at the declared shapes (the whole batch), on replica 0's device. */
        int n = l->c.n_inputs;
        const tg_input_decl *decls = l->dp ? dist_decls(l->dp, &n) : l->c.decls;
        tg_forward_spec spec = { .forward = l->loss_fn, .ctx = l->loss_ctx, .inputs = decls, .n_inputs = n };
        l->eval = attach_locked(l, &spec, &err);
        if (!l->eval) {
            rt_unlock(l);
            return rt_failed("tg_eval_loss: %s", err.msg);
        }
    }
    tg_result r = rt_run_locked(l->eval, inputs, n_inputs, false);
    if (r.status == TG_OK && !isfinite(r.output[0]))   /* as tg_step: a non-finite loss is a failure */
        r = rt_failed("tg_eval_loss: loss is %s", isnan(r.output[0]) ? "NaN" : "infinite");
    if (r.status == TG_OK) {
        r.loss = r.output[0];
        r.step = l->step;
        r.output = NULL;
        r.output_len = 0;
    }
    rt_unlock(l);
    return r;
}
