/* Captures (values kept readable after a call) and activation patches (values replaced per
 * call at named sites). */
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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
    rt_read_node(c, g->captures[i].node, v);
    for (size_t k = 0; k < n; k++) dst[k] = (float)v[k];
    free(v);
    return TG_OK;
}

tg_status tg_train_capture(tg_train *t, const char *name, float *dst, size_t n, tg_shape *shape, tg_error *err) {
    tg_train *l = rt_lock_train(t);
    if (!l) { tg_seterr(err, "tg_train_capture: %s training handle", rt_dead(t)); return TG_FAILED; }
    tg_status st = read_capture(&l->c, "tg_train_capture", name, dst, n, shape, err);
    rt_unlock(l);
    return st;
}

tg_status tg_forward_capture(tg_forward *f, const char *name, float *dst, size_t n, tg_shape *shape, tg_error *err) {
    tg_train *l = rt_lock_forward(f);
    if (!l) { tg_seterr(err, "tg_forward_capture: %s forward handle", rt_dead(f)); return TG_FAILED; }
    tg_status st = read_capture(f->last ? &f->last->c : NULL, "tg_forward_capture", name, dst, n, shape, err);
    rt_unlock(l);
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

static patch_rule *find_rule(const tg_forward *f, const char *site) {
    for (int i = 0; i < f->n_patch; i++)
        if (strcmp(f->patch[i].site, site) == 0) return &f->patch[i];
    return NULL;
}

bool rt_patch_any(const tg_forward *f) {
    for (int i = 0; i < f->n_patch; i++)
        if (f->patch[i].mode != TG_PATCH_OFF) return true;
    return false;
}

/* A patchable variant's per-call settings: each site's two hyper flags and, for replaced
 * values, its replacement buffer. */
bool rt_patch_apply(tg_forward *f, variant *v, double *hyper, char *err, size_t len) {
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
    tg_train *l = rt_lock_forward(f);
    if (!l) { tg_seterr(err, "tg_patch_set: %s forward handle", rt_dead(f)); return TG_FAILED; }
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
    rt_unlock(l);
    return st;
}

tg_status tg_patch_from(tg_forward *f, const char *site, const tg_data *inputs, int n_inputs, tg_error *err) {
    tg_train *l = rt_lock_forward(f);
    if (!l) { tg_seterr(err, "tg_patch_from: %s forward handle", rt_dead(f)); return TG_FAILED; }
    tg_result r = site ? rt_run_locked(f, inputs, n_inputs, true) : rt_failed("no site name given");
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
            rt_read_node(&f->last->c, g->patches[i].node, v);
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
    rt_unlock(l);
    return st;
}

void tg_patch_clear(tg_forward *f) {
    tg_train *l = rt_lock_forward(f);
    if (!l) return;
    for (int i = 0; i < f->n_patch; i++) {   /* in place: never fails */
        free(f->patch[i].values);
        f->patch[i] = (patch_rule){ f->patch[i].site, TG_PATCH_OFF, NULL, 0 };
    }
    rt_unlock(l);
}
