/* Built-in layers: parameter declarations under a scope, and their forward functions written
 * with the public ops (so shape errors name the caller's line). */
#include "graph/graph.h"

#include <math.h>

/* A layer used through a NULL pointer records an error in the graph being traced (and gives an
 * invalid tensor) instead of crashing. */
static bool layer_ok(tg_site s, const void *layer, const char *what) {
    if (layer) return true;
    tg_graph *g = tg__trace();
    if (g) ir_fail(g, s, "%s: NULL layer", what);
    return false;
}
static const tg_tensor NO_TENSOR = { NULL, -1 };

/* The scope a layer declares its parameters under; a NULL name is an error on the model. */
static void layer_scope(tg_model *m, const char *name) {
    tg_model_push(m, "%s", name ? name : "");
    if (!name || !name[0]) tg_param_new(m, NULL, TG_SHAPE(1), tg_init_zeros());   /* records "empty name" */
}

tg_linear tg_linear_new(tg_model *m, const char *name, int64_t in, int64_t out, const tg_linear_opts *opts) {
    tg_linear l = { { m, -1 }, { m, -1 }, !(opts && opts->no_bias) };
    tg_init w_init = opts && opts->has_init ? opts->init : tg_init_randn(0.02);
    layer_scope(m, name);
    l.W = tg_param_new(m, "W", TG_SHAPE(in, out), w_init);
    if (l.has_bias) l.b = tg_param_new(m, "b", TG_SHAPE(out), tg_init_zeros());
    tg_model_pop(m);
    return l;
}

tg_tensor tg_linear_at(tg_site s, const tg_linear *l, tg_tensor x) {
    if (!layer_ok(s, l, "tg_linear")) return NO_TENSOR;
    tg_tensor y = tg_matmul_at(s, x, tg_p_at(s, l->W));
    return l->has_bias ? tg_add_at(s, y, tg_p_at(s, l->b)) : y;
}

tg_embedding_layer tg_embedding_new(tg_model *m, const char *name, int64_t vocab, int64_t dim) {
    tg_embedding_layer e;
    layer_scope(m, name);
    e.W = tg_param_new(m, "W", TG_SHAPE(vocab, dim), tg_init_randn(0.02));
    tg_model_pop(m);
    return e;
}

tg_tensor tg_embed_at(tg_site s, const tg_embedding_layer *e, tg_tensor idx) {
    if (!layer_ok(s, e, "tg_embed")) return NO_TENSOR;
    return tg_embedding_at(s, tg_p_at(s, e->W), idx);
}

tg_layernorm tg_layernorm_new(tg_model *m, const char *name, int64_t dim, double eps, int bias) {
    tg_layernorm ln = { { m, -1 }, { m, -1 }, bias != 0, eps > 0 ? eps : 1e-5 };
    layer_scope(m, name);
    ln.g = tg_param_new(m, "g", TG_SHAPE(dim), tg_init_ones());
    if (ln.has_bias) ln.b = tg_param_new(m, "b", TG_SHAPE(dim), tg_init_zeros());
    tg_model_pop(m);
    return ln;
}

/* (x - mean) / sqrt(var + eps) * g + b over the last axis, with the biased variance (PyTorch). */
tg_tensor tg_layernorm_at(tg_site s, const tg_layernorm *ln, tg_tensor x) {
    if (!layer_ok(s, ln, "tg_layernorm")) return NO_TENSOR;
    tg_tensor mu = tg_mean_at(s, x, -1, 1);
    tg_tensor xc = tg_sub_at(s, x, mu);
    tg_tensor var = tg_mean_at(s, tg_square_at(s, xc), -1, 1);
    tg_tensor y = tg_mul_at(s, tg_mul_at(s, xc, tg_rsqrt_at(s, tg_add_at(s, var, tg_scalar_at(s, ln->eps)))), tg_p_at(s, ln->g));
    return ln->has_bias ? tg_add_at(s, y, tg_p_at(s, ln->b)) : y;
}

tg_rmsnorm tg_rmsnorm_new(tg_model *m, const char *name, int64_t dim, double eps) {
    tg_rmsnorm l = { { m, -1 }, eps > 0 ? eps : 1e-6 };
    layer_scope(m, name);
    l.g = tg_param_new(m, "g", TG_SHAPE(dim), tg_init_ones());
    tg_model_pop(m);
    return l;
}

tg_tensor tg_rmsnorm_at(tg_site s, const tg_rmsnorm *l, tg_tensor x) {
    if (!layer_ok(s, l, "tg_rmsnorm")) return NO_TENSOR;
    tg_tensor ms = tg_mean_at(s, tg_square_at(s, x), -1, 1);
    tg_tensor scale = tg_rsqrt_at(s, tg_add_at(s, ms, tg_scalar_at(s, l->eps)));
    return tg_mul_at(s, tg_mul_at(s, x, scale), tg_p_at(s, l->g));
}

tg_conv2d_layer tg_conv2d_new(tg_model *m, const char *name, int64_t in, int64_t out, int k, int stride,
                              int padding, int bias) {
    tg_conv2d_layer l = { { m, -1 }, { m, -1 }, bias != 0, stride, padding };
    layer_scope(m, name);
    l.W = tg_param_new(m, "W", TG_SHAPE(out, in, k, k), tg_init_randn(sqrt(2.0 / (double)(in * k * k))));
    if (l.has_bias) l.b = tg_param_new(m, "b", TG_SHAPE(out), tg_init_zeros());
    tg_model_pop(m);
    return l;
}

tg_tensor tg_conv_at(tg_site s, const tg_conv2d_layer *l, tg_tensor x) {
    if (!layer_ok(s, l, "tg_conv")) return NO_TENSOR;
    tg_tensor y = tg_conv2d_at(s, x, tg_p_at(s, l->W), l->stride, l->padding);
    if (!l->has_bias) return y;
    tg_shape bs = tg_model_param_shape(l->b.model, l->b.id);
    return tg_add_at(s, y, tg_reshape_at(s, tg_p_at(s, l->b), TG_SHAPE(1, bs.d[0], 1, 1)));
}
