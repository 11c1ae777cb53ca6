/* Checkpoints: parameters and optimizer state as safetensors files, by name. */
#include "runtime/runtime.h"
#include "io/safetensors.h"
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    return st->name && st->data && rt_read_floats(be, buf, st->data, n);
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
    if (ok && t->dp) dist_sync(t);   /* data parallel: every replica takes the file's values */
    st_free(&f);
    return ok ? TG_OK : TG_FAILED;
}

tg_status tg_save(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    WITH_TRAIN("tg_save", t, err, save(l_, path, with_optimizer, err));
}

tg_status tg_load(tg_train *t, const char *path, int with_optimizer, tg_error *err) {
    WITH_TRAIN("tg_load", t, err, load(l_, path, with_optimizer, err));
}

