/* Tracing: a user's forward or loss function called once over fresh INPUT nodes, recording the
 * graph its ops build. */
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rt_check_decls(const tg_input_decl *in, int n, tg_error *err) {
    if (n < 0 || (n > 0 && !in)) { tg_seterr(err, "inputs: %d declared but no array given", n); return false; }
    for (int i = 0; i < n; i++) {
        if (!in[i].name || !in[i].name[0]) { tg_seterr(err, "input %d has no name", i); return false; }
        if (in[i].dtype != TG_FLOAT32 && in[i].dtype != TG_INT32) { tg_seterr(err, "input '%s': unknown dtype %d", in[i].name, (int)in[i].dtype); return false; }
        for (int j = 0; j < i; j++)
            if (strcmp(in[i].name, in[j].name) == 0) { tg_seterr(err, "input '%s' is declared twice", in[i].name); return false; }
    }
    return true;
}

int rt_product_align(const tg_backend *be, tg_precision runs) {
    const char *env = getenv("TG_PAD_PRODUCTS");
    if (env && env[0]) return atoi(env) > 0 ? atoi(env) : 0;
    return runs == TG_PRECISION_F32 ? 0 : be->product_align;
}

bool rt_group_products(const tg_backend *be, tg_precision runs) {
    const char *env = getenv("TG_GROUP_PRODUCTS");
    if (env && env[0]) return atoi(env) > 0;
    return be && (be->group_products >> runs) & 1u;
}

tg_graph *rt_trace(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *in, int n, bool patchable,
                   int align, tg_error *err) {
    if (!m) { tg_seterr(err, "no model given"); return NULL; }
    if (!fn) { tg_seterr(err, "no forward/loss function given"); return NULL; }
    if (tg_model_error(m)) { tg_seterr(err, "%s", tg_model_error(m)); return NULL; }
    if (!rt_check_decls(in, n, err)) return NULL;
    tg_graph *g = ir_new(m);
    if (!g) { tg_seterr(err, "out of memory starting a trace"); return NULL; }
    g->patchable = patchable;
    g->product_align = align;
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

bool rt_precision(const tg_backend *be, tg_precision want, tg_precision *out, tg_error *err) {
    if (want == TG_PRECISION_DEFAULT) want = TG_PRECISION_F32;
    if (want != TG_PRECISION_F32 && want != TG_PRECISION_TF32 && want != TG_PRECISION_BF16) {
        tg_seterr(err, "unknown precision %d (TG_PRECISION_F32, _TF32 or _BF16)", (int)want);
        return false;
    }
    *out = be->precision ? be->precision(want) : TG_PRECISION_F32;
    return true;
}

const char *tg_precision_name(tg_precision p) {
    return p == TG_PRECISION_TF32 ? "tf32" : p == TG_PRECISION_BF16 ? "bf16" : p == TG_PRECISION_F32 ? "f32" : "default";
}
