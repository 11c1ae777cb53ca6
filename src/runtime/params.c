/* A training handle's parameters by name: counts, shapes, values and gradients in and out. */
#include "runtime/runtime.h"
#include "dist/dist.h"

#include <math.h>
#include <stdlib.h>

int tg_train_n_params(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    int n = l ? l->n_params : 0;
    if (l) rt_unlock(l);
    return n;
}

const char *tg_train_param_name(const tg_train *t, int i) {
    tg_train *l = rt_lock_train(t);
    const char *name = l ? tg_model_param_name(l->model, i) : NULL;
    if (l) rt_unlock(l);
    return name;
}

int64_t tg_train_param_total(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    int64_t total = 0;
    for (int i = 0; l && i < l->n_params; i++) total += shape_numel(model_param(l->model, i)->shape);
    if (l) rt_unlock(l);
    return total;
}

tg_shape tg_train_param_shape(const tg_train *t, int i) {
    tg_train *l = rt_lock_train(t);
    tg_shape shape = l ? tg_model_param_shape(l->model, i) : TG_SHAPE0;
    if (l) rt_unlock(l);
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
bool rt_read_floats(const tg_backend *be, const void *buf, float *dst, size_t n) {
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
    if (!rt_read_floats(t->be, t->param[id], dst, n)) { tg_seterr(err, "tg_download_param: out of memory"); return TG_FAILED; }
    return TG_OK;
}

static tg_status download_param_grad(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    int id = find_param(t, "tg_download_param_grad", name, n, err);
    if (id < 0) return TG_FAILED;
    if (!dst) { tg_seterr(err, "tg_download_param_grad: NULL destination"); return TG_FAILED; }
    int node = t->c.g->grad_of_param[id];
    if (node < 0) { tg_seterr(err, "tg_download_param_grad: '%s' does not affect the loss", name); return TG_FAILED; }
    if (!rt_read_floats(t->be, t->be->node_buf(t->c.exec, node), dst, n)) {
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
    if (t->dp) dist_sync(t);   /* data parallel: every replica takes them */
    return TG_OK;
}

tg_status tg_download_param(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    WITH_TRAIN("tg_download_param", t, err, download_param(l_, name, dst, n, err));
}

tg_status tg_download_param_grad(tg_train *t, const char *name, float *dst, size_t n, tg_error *err) {
    WITH_TRAIN("tg_download_param_grad", t, err, download_param_grad(l_, name, dst, n, err));
}

tg_status tg_upload_params(tg_train *t, const tg_data *params, int n, tg_error *err) {
    WITH_TRAIN("tg_upload_params", t, err, upload_params(l_, params, n, err));
}

