/* The data-parallel training handle: several replicas of one model, each on its share of the
 * batch, whose gradients are averaged before one identical update.
 *
 * A replica's step is two graphs instead of the single-replica handle's one:
 *   grad    the loss traced at the replica's share of the inputs and its gradients, kept;
 *   update  the optimizer (clipping, the guard, every parameter's update and write-backs) over
 *           leaves: an INPUT for the loss and one per gradient, bound to grad's buffers.
 * Between them the communicator averages the loss and every gradient, in place, over all replicas
 * of the job; so the update graph, and whatever it computes from them (the global norm that
 * clipping uses, the non-finite guard), sees the same averaged values on every replica, and every
 * replica skips or applies the step together. A step whose averaging fails changes nothing: the
 * update graph only runs after the average is complete.
 *
 * Replica 0 is the handle's own: t->c is its grad graph (with the optimizer state's layout copied
 * in, for checkpoints and resets), t->param and t->state its buffers, t->be its device's table,
 * so forwards, parameters, captures and checkpoints work unchanged on it; changes to its
 * parameters or state are copied to the other local replicas (dist_sync).
 *
 * Device backends (CUDA) run a step through their dp_step, with NCCL inside; the host backends
 * (cpu, reference) run the replicas one after another here, add their values on the host and
 * average those over the processes through TCP. A job of one replica takes the same path with
 * nothing to average, which is how every machine tests it. */
#include "dist/dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const tg_backend *be;
    compiled *grad;            /* replica 0: &t->c; the others: &own */
    compiled own;
    tg_graph *ug;              /* the update graph */
    void *update;              /* its executor */
    void **param, **state;     /* replica 0: t's */
    void **wb_dst;             /* update's write-back targets */
    double hyper[8];
} replica;

struct dist_state {
    dist_settings s;
    int n;                     /* local replicas */
    replica *rep;
    tg_input_decl *decls;      /* as declared: the process's whole batch */
    int n_inputs;
    dist_comm *comm;
    size_t red_total;          /* host path: elements averaged (the loss and every gradient) */
    double *acc, *tmp;         /* host path: their sum, one node's values */
    double *sync_buf;          /* dist_sync: the largest parameter */
    tg_data *share;            /* a call's inputs as one replica sees them */
    dp_replica *dpr;
    char broken[TG_ERROR_LEN]; /* replicas may differ (a local failure after the average) */
};

const char *dist_update_source(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    const char *src = l && l->dp && l->be->source ? l->be->source(l->dp->rep[0].update) : NULL;
    if (l) rt_unlock(l);
    return src;
}

int dist_rank(const dist_state *d) { return d->s.rank; }
size_t dist_update_bytes(const dist_state *d) { return d->rep[0].be->planned_bytes(d->rep[0].update); }
int dist_update_launches(const dist_state *d) {
    return d->rep[0].be->launches ? d->rep[0].be->launches(d->rep[0].update) : 0;
}
int dist_replicas(const dist_state *d) { return d->s.world * d->n; }

const tg_input_decl *dist_decls(const dist_state *d, int *n) {
    *n = d->n_inputs;
    return d->decls;
}

/* ----- building ----- */

/* The declared inputs, names copied, and each replica's share: the first dimension divided by
 * the local replica count, which must divide it. */
static bool split_decls(dist_state *d, const tg_train_spec *spec, tg_input_decl **local, tg_error *err) {
    if (!rt_check_decls(spec->inputs, spec->n_inputs, err)) return false;
    d->n_inputs = spec->n_inputs;
    d->decls = tg_alloc(sizeof(tg_input_decl) * (size_t)(spec->n_inputs + 1));
    *local = tg_alloc(sizeof(tg_input_decl) * (size_t)(spec->n_inputs + 1));
    if (!d->decls || !*local) {
        tg_seterr(err, "out of memory");
        return false;
    }
    for (int i = 0; i < spec->n_inputs; i++) {
        const tg_input_decl *in = &spec->inputs[i];
        d->decls[i] = (*local)[i] = *in;
        if (!(d->decls[i].name = tg_strdup(in->name))) {
            tg_seterr(err, "out of memory");
            return false;
        }
        char sh[96];
        if (in->shape.ndim == 0 || in->shape.d[0] <= 0) {
            tg_seterr(err, "input '%s' (shape %s) has no batch dimension to split over %d replicas", in->name,
                      shape_str(in->shape, sh), d->n);
            return false;
        }
        if (in->shape.d[0] % d->n) {
            tg_seterr(err, "input '%s': its first dimension (%lld, shape %s) does not split evenly over %d devices", in->name,
                      (long long)in->shape.d[0], shape_str(in->shape, sh), d->n);
            return false;
        }
        (*local)[i].shape.d[0] /= d->n;
    }
    return true;
}

/* The optimizer as a graph of its own: an INPUT leaf for the loss and one per gradient (bound,
 * later, to a grad graph's buffers), the PARAM nodes, then optim_build's update, clipping and
 * guard over them. */
static tg_graph *update_graph(const tg_graph *gg, const tg_optimizer *opt, bool guard, tg_error *err) {
    tg_graph *g = ir_new(gg->model);
    if (!g) {
        tg_seterr(err, "out of memory for the optimizer's graph");
        return NULL;
    }
    g->precision = gg->precision;
    int leaf = 0;
    for (int i = -1; i < gg->n_params && ir_ok(g); i++) {   /* -1: the loss */
        int node = i < 0 ? gg->output : gg->grad_of_param[i];
        if (node < 0) continue;
        char name[600];
        snprintf(name, sizeof name, i < 0 ? "loss" : "grad:%s", i < 0 ? "" : model_param(gg->model, i)->name);
        int id = ir_add(g, (tg_site){ "(data parallel)", 0 }, OP_INPUT, TG_FLOAT32, gg->nodes[node].shape, 0, NULL);
        if (id < 0) break;
        g->nodes[id].iarg[0] = leaf++;
        if (!(g->nodes[id].name = tg_strdup(name))) ir_fail(g, TG_HERE, "out of memory naming '%s'", name);
        if (i < 0) g->output = id;
        else g->grad_of_param[i] = id;
    }
    tg_graph *outer = tg__trace();
    tg__set_trace(g);
    for (int i = 0; i < gg->n_params && ir_ok(g); i++)
        if (gg->grad_of_param[i] >= 0) tg_p_at(TG_HERE, (tg_param){ gg->model, i });
    tg__set_trace(outer);
    if (!ir_ok(g) || !optim_build(g, opt, guard)) {
        tg_seterr(err, "%s", g->error);
        ir_free(g);
        return NULL;
    }
    return g;
}

/* The optimizer state's layout (slots and the parameters they belong to) into the grad graph,
 * where the store, checkpoints and resets look for it. */
static bool copy_state_layout(tg_graph *gg, const tg_graph *ug, tg_error *err) {
    gg->state_shape_node = tg_alloc(sizeof(int) * (size_t)(ug->n_state + 1));
    if (!gg->state_shape_node) {
        tg_seterr(err, "out of memory");
        return false;
    }
    for (int s = 0; s < ug->n_state; s++)
        gg->state_shape_node[s] = gg->param_node[ug->nodes[ug->state_shape_node[s]].iarg[0]];
    gg->n_state = ug->n_state;
    return true;
}

/* Replica r's grad graph compiled, and its update graph prepared. */
static bool build_replica(tg_train *t, int r, const tg_train_spec *spec, const tg_input_decl *local, tg_precision runs,
                          tg_error *err) {
    replica *rp = &t->dp->rep[r];
    tg_graph *g = rt_trace_grads(spec, local, runs, rp->be, err);
    if (!g) return false;
    int n_keep, *keep = rt_grad_keep(g, &g->output, 1, &n_keep);
    bool ok = keep && rt_compile_graph(rp->grad, rp->be, g, spec->n_inputs, keep, n_keep, err);
    if (!keep) {
        tg_seterr(err, "out of memory compiling the graph");
        rp->grad->g = g;
    }
    free(keep);
    if (ok) ok = (rp->ug = update_graph(g, &spec->optimizer, !rp->be->checks_writebacks, err)) != NULL;
    int ukeep[2] = { ok ? rp->ug->output : 0, ok ? rp->ug->guard : 0 };
    if (ok) ok = (rp->update = rp->be->prepare(rp->ug, ukeep, 2, err)) != NULL;
    return ok;
}

/* Parameter and state buffers of replicas 1..n-1 (replica 0's are t's, from rt_alloc_store). */
static bool alloc_replica_store(tg_train *t, replica *rp, tg_error *err) {
    const tg_graph *g = t->c.g;
    rp->param = tg_alloc(sizeof(void *) * (size_t)(t->n_params + 1));
    rp->state = tg_alloc(sizeof(void *) * (size_t)(g->n_state + 1));
    rp->wb_dst = tg_alloc(sizeof(void *) * (size_t)(rp->ug->n_assigns + 1));
    bool ok = rp->param && rp->state && rp->wb_dst;
    for (int i = 0; ok && i < t->n_params; i++)
        ok = (rp->param[i] = rp->be->alloc((size_t)shape_numel(model_param(t->model, i)->shape))) != NULL;
    for (int i = 0; ok && i < g->n_state; i++)
        ok = (rp->state[i] = rp->be->alloc((size_t)g->nodes[g->state_shape_node[i]].numel)) != NULL;
    if (!ok) tg_seterr(err, "out of memory for a replica's parameters");
    return ok;
}

/* Bind a replica's leaves: parameters in both graphs, state and the averaged values in update. */
static void bind_replica(const tg_train *t, replica *rp) {
    rt_bind_params(rp->grad, rp->param);
    const tg_graph *gg = rp->grad->g, *ug = rp->ug;
    for (int i = 0; i < ug->n; i++) {
        const tg_node *n = &ug->nodes[i];
        if (n->op == OP_PARAM) rp->be->bind(rp->update, i, rp->param[n->iarg[0]]);
        if (n->op == OP_STATE) rp->be->bind(rp->update, i, rp->state[n->iarg[0]]);
    }
    rp->be->bind(rp->update, ug->output, rp->be->node_buf(rp->grad->exec, gg->output));
    for (int i = 0; i < gg->n_params; i++)
        if (gg->grad_of_param[i] >= 0)
            rp->be->bind(rp->update, ug->grad_of_param[i], rp->be->node_buf(rp->grad->exec, gg->grad_of_param[i]));
    for (int k = 0; k < ug->n_assigns; k++) {
        const tg_node *dst = &ug->nodes[ug->assigns[k].dst];
        rp->wb_dst[k] = dst->op == OP_PARAM ? rp->param[dst->iarg[0]] : rp->state[dst->iarg[0]];
    }
}

/* What the averaged values are: the loss, then each gradient, in parameter order. */
static int reduced_node(const tg_graph *gg, int k) {
    if (k == 0) return gg->output;
    for (int i = 0; i < gg->n_params; i++)
        if (gg->grad_of_param[i] >= 0 && --k == 0) return gg->grad_of_param[i];
    return -1;
}

/* Host buffers the step and dist_sync use, sized once so neither can fail later. */
static bool alloc_host(tg_train *t, tg_error *err) {
    dist_state *d = t->dp;
    const tg_graph *gg = t->c.g;
    size_t most = 1, total = 0;
    for (int k = 0, node; (node = reduced_node(gg, k)) >= 0; k++) {
        total += (size_t)gg->nodes[node].numel;
        if ((size_t)gg->nodes[node].numel > most) most = (size_t)gg->nodes[node].numel;
    }
    d->red_total = total;
    d->acc = tg_alloc(sizeof(double) * (total + 1));
    d->tmp = tg_alloc(sizeof(double) * most);
    d->sync_buf = tg_alloc(sizeof(double) * most);   /* every parameter and state slot has a gradient's size */
    d->share = tg_alloc(sizeof(tg_data) * (size_t)(d->n_inputs + 1));
    d->dpr = tg_alloc(sizeof(dp_replica) * (size_t)d->n);
    if (!d->acc || !d->tmp || !d->sync_buf || !d->share || !d->dpr) {
        tg_seterr(err, "out of memory for the data-parallel step");
        return false;
    }
    return true;
}

/* Device backends: each replica's averaged buffers, for NCCL. */
static bool register_spans(tg_train *t, tg_error *err) {
    dist_state *d = t->dp;
    dist_span *spans = tg_alloc(sizeof(dist_span) * (size_t)(t->n_params + 2));
    bool ok = spans != NULL;
    for (int r = 0; ok && r < d->n; r++) {
        const tg_graph *gg = d->rep[r].grad->g;
        int n = 0;
        for (int node; (node = reduced_node(gg, n)) >= 0; n++)
            spans[n] = (dist_span){ d->rep[r].be->node_buf(d->rep[r].grad->exec, node), (size_t)gg->nodes[node].numel };
        ok = dist_comm_set_spans(d->comm, r, spans, n, err);
    }
    if (!spans) tg_seterr(err, "out of memory for the all-reduce list");
    free(spans);
    return ok;
}

/* What every rank must agree on: replicas per process, the parameters (names and shapes), the
 * inputs as this process declares them, the backend, and whether NCCL runs inside the graph. */
static uint64_t fingerprint(const tg_train *t, const dist_state *d) {
    uint64_t h = 1469598103934665603ull;
#define MIX(p, len) for (size_t i_ = 0; i_ < (len); i_++) h = (h ^ ((const uint8_t *)(p))[i_]) * 1099511628211ull
    MIX(&d->n, sizeof d->n);
    MIX(t->be->name, strlen(t->be->name));
    for (int i = 0; i < t->n_params; i++) {
        const tg_param_spec *p = model_param(t->model, i);
        MIX(p->name, strlen(p->name) + 1);
        MIX(p->shape.d, sizeof(int64_t) * (size_t)p->shape.ndim);
    }
    for (int i = 0; i < d->n_inputs; i++) {
        MIX(d->decls[i].name, strlen(d->decls[i].name) + 1);
        MIX(&d->decls[i].dtype, sizeof d->decls[i].dtype);
        MIX(d->decls[i].shape.d, sizeof(int64_t) * (size_t)d->decls[i].shape.ndim);
    }
    const char *g = getenv("TG_NCCL_GRAPH");
    MIX(g ? g : "", g ? strlen(g) : 0);
#undef MIX
    return h;
}

void dist_free(dist_state *d) {
    if (!d) return;
    for (int r = 0; d->rep && r < d->n; r++) {
        replica *rp = &d->rep[r];
        if (rp->update) rp->be->release(rp->update);
        ir_free(rp->ug);
        free(rp->wb_dst);
        if (r == 0) continue;   /* replica 0's grad graph and buffers are the handle's */
        for (int i = 0; rp->param && i < rp->grad->g->n_params; i++)
            if (rp->param[i]) rp->be->free(rp->param[i]);
        for (int i = 0; rp->state && rp->grad->g && i < rp->grad->g->n_state; i++)
            if (rp->state[i]) rp->be->free(rp->state[i]);
        free(rp->param);
        free(rp->state);
        rt_compiled_free(&rp->own);
    }
    dist_comm_free(d->comm);   /* after every graph that captured its NCCL calls */
    for (int i = 0; d->decls && i < d->n_inputs; i++) free((char *)d->decls[i].name);
    free(d->decls);
    free(d->rep);
    free(d->acc);
    free(d->tmp);
    free(d->sync_buf);
    free(d->share);
    free(d->dpr);
    free(d);
}

/* Undo a build that failed halfway: replica 0's parts are t's. */
static void build_failed(tg_train *t) {
    dist_state *d = t->dp;
    rt_free_store(t);
    rt_compiled_free(&t->c);
    dist_free(d);
    free(t);
}

/* A handle whose fields a single-replica build would set, before any graph exists. */
static tg_train *handle_new(const tg_train_spec *spec, const dist_settings *s, tg_error *err) {
    tg_train *t = tg_alloc(sizeof *t);
    dist_state *d = t ? tg_alloc(sizeof *d) : NULL;
    if (d) d->rep = tg_alloc(sizeof(replica) * (size_t)s->n_local);
    if (!t || !d || !d->rep) {
        tg_seterr(err, "out of memory for the training handle");
        if (d) free(d->rep);
        free(d);
        free(t);
        return NULL;
    }
    d->s = *s;
    d->n = s->n_local;
    t->dp = d;
    t->model = spec->model;
    t->loss_fn = spec->loss;
    t->loss_ctx = spec->ctx;
    t->opt = spec->optimizer;
    t->precision = spec->precision ? spec->precision : TG_PRECISION_F32;
    rt_copy_schedule(t, &spec->optimizer.lr);
    for (int r = 0; r < d->n; r++) d->rep[r].grad = r == 0 ? &t->c : &d->rep[r].own;
    return t;
}

/* Every replica's backend table: its device's, or the one table for virtual replicas. */
static bool pick_backends(dist_state *d, const tg_backend *be, tg_error *err) {
    for (int r = 0; r < d->n; r++) {
        d->rep[r].be = be->on_device ? be->on_device(d->s.ordinal[r], err) : be;
        if (!d->rep[r].be) return false;
    }
    return true;
}

static void sync_replicas(tg_train *t, bool states);

/* The replicas' stores and bindings, replica 0's parameters from the model's init copied to all. */
static bool build_stores(tg_train *t, tg_error *err) {
    dist_state *d = t->dp;
    d->rep[0].wb_dst = tg_alloc(sizeof(void *) * (size_t)(d->rep[0].ug->n_assigns + 1));
    if (!d->rep[0].wb_dst || !rt_alloc_store(t, err)) {
        if (!d->rep[0].wb_dst) tg_seterr(err, "out of memory for the write-back table");
        return false;
    }
    d->rep[0].param = t->param;
    d->rep[0].state = t->state;
    for (int r = 1; r < d->n; r++)
        if (!copy_state_layout(d->rep[r].grad->g, d->rep[r].ug, err) || !alloc_replica_store(t, &d->rep[r], err))
            return false;
    if (!alloc_host(t, err)) return false;
    if (!rt_init_params(t)) {
        tg_seterr(err, "out of memory initialising the parameters");
        return false;
    }
    for (int r = 0; r < d->n; r++) bind_replica(t, &d->rep[r]);
    sync_replicas(t, false);   /* the optimizer state is zero from allocation everywhere */
    return true;
}

tg_train *dist_train_build(const tg_train_spec *spec, tg_error *err) {
    dist_settings s;
    if (!dist_settings_resolve(spec, &s, err)) return NULL;
    const tg_backend *be = backend_find(spec->backend, err);
    tg_precision runs;
    if (!be || !rt_precision(be, spec->precision, &runs, err)) return NULL;
    tg_train *t = handle_new(spec, &s, err);
    if (!t) return NULL;
    dist_state *d = t->dp;
    tg_input_decl *local = NULL;
    bool ok = split_decls(d, spec, &local, err) && pick_backends(d, be, err);
    for (int r = 0; ok && r < d->n; r++) ok = build_replica(t, r, spec, local, runs, err);
    free(local);
    if (ok) {
        t->be = d->rep[0].be;
        t->loss = t->c.g->output;
        t->n_params = t->c.g->n_params;
        ok = copy_state_layout(t->c.g, d->rep[0].ug, err) && build_stores(t, err);
    }
    if (ok) ok = (d->comm = dist_comm_new(&s, d->rep[0].be, be->dp_step != NULL, fingerprint(t, d), err)) != NULL;
    if (ok && be->dp_step) ok = register_spans(t, err);
    if (!ok) {
        build_failed(t);
        return NULL;
    }
    return t;
}

/* ----- keeping replicas equal ----- */

/* Replica 0's parameters (and with `states` its optimizer state) to every other local replica,
 * through the host (another device's memory is not this one's to copy into directly): each
 * buffer read once and written to each replica. */
static void sync_replicas(tg_train *t, bool states) {
    dist_state *d = t->dp;
    const tg_graph *g = t->c.g;
    int n_bufs = d->n > 1 ? t->n_params + (states ? g->n_state : 0) : 0;
    for (int k = 0; k < n_bufs; k++) {
        int s = k - t->n_params;
        bool param = s < 0;
        size_t n = param ? (size_t)shape_numel(model_param(t->model, k)->shape) : (size_t)g->nodes[g->state_shape_node[s]].numel;
        d->rep[0].be->read(param ? t->param[k] : t->state[s], TG_FLOAT32, d->sync_buf, n);
        for (int r = 1; r < d->n; r++)
            d->rep[r].be->write(param ? d->rep[r].param[k] : d->rep[r].state[s], TG_FLOAT32, d->sync_buf, n);
    }
}

void dist_sync(tg_train *t) { sync_replicas(t, true); }

tg_status dist_replica_param(tg_train *t, int r, const char *name, float *dst, size_t n, tg_error *err) {
    tg_train *l = rt_lock_train(t);
    if (!l || !l->dp || r < 0 || r >= l->dp->n) {
        tg_seterr(err, "dist_replica_param: no replica %d", r);
        if (l) rt_unlock(l);
        return TG_FAILED;
    }
    int id = model_find(l->model, name);
    tg_status st = TG_FAILED;
    if (id < 0 || (size_t)shape_numel(model_param(l->model, id)->shape) != n) tg_seterr(err, "dist_replica_param: '%s'?", name);
    else if (!rt_read_floats(l->dp->rep[r].be, l->dp->rep[r].param[id], dst, n)) tg_seterr(err, "out of memory");
    else st = TG_OK;
    rt_unlock(l);
    return st;
}

/* ----- the step ----- */

/* A call's inputs, each replica's rows bound to its grad graph (none: the rows each still holds).
 * Counts are checked against the whole batch first (the message speaks of what the caller
 * passed); names, dtypes and missing inputs are rt_bind_inputs's to report. */
static bool bind_shares(tg_train *t, const tg_data *in, int n, tg_result *res) {
    dist_state *d = t->dp;
    if (n <= 0 || !in || n > d->n_inputs) return rt_bind_batch(&t->c, in, n, res->error, sizeof res->error);
    for (int k = 0; k < n; k++) {
        const tg_input_decl *decl = NULL;
        for (int i = 0; i < d->n_inputs && !decl; i++)
            if (in[k].name && strcmp(in[k].name, d->decls[i].name) == 0) decl = &d->decls[i];
        size_t want = decl ? (size_t)tg_numel(decl->shape) : 0;
        if (decl && in[k].dtype == decl->dtype && in[k].data && in[k].n != want) {
            char sh[96];
            *res = rt_failed("input '%s': expected %zu elements (shape %s, split over %d replica%s), got %zu", decl->name,
                             want, shape_str(decl->shape, sh), d->n, d->n == 1 ? "" : "s", in[k].n);
            return false;
        }
    }
    for (int r = 0; r < d->n; r++) {
        for (int k = 0; k < n; k++) {
            size_t each = in[k].n / (size_t)d->n;
            d->share[k] = in[k];
            d->share[k].n = each;
            if (in[k].data) d->share[k].data = (const char *)in[k].data + (size_t)r * each * 4;   /* f32 and i32: 4 bytes */
        }
        if (!rt_bind_inputs(d->rep[r].grad, d->share, n, res->error, sizeof res->error)) return false;
    }
    return true;
}

/* Each replica's scalars: the step's, with its own random seed (replica 0 of rank 0 keeps the
 * single-replica seed, so a job of one draws what one replica draws). */
static void replica_hypers(tg_train *t) {
    dist_state *d = t->dp;
    for (int r = 0; r < d->n; r++) {
        memcpy(d->rep[r].hyper, t->hyper, sizeof t->hyper);
        uint64_t g = (uint64_t)(d->s.rank * d->n + r);
        if (g) d->rep[r].hyper[HYPER_SEED] = (double)(rng_mix((uint64_t)t->hyper[HYPER_SEED] ^ rng_mix(g)) >> 11);
    }
}

/* Host path, averaging: the replicas' values added up, averaged over the job, rounded to f32
 * (what the grad graphs compute in; reference-f64 keeps doubles) and written back to every
 * replica. */
static bool host_average(tg_train *t, bool ok, tg_error *err) {
    dist_state *d = t->dp;
    for (int r = 0; ok && r < d->n; r++) {
        const compiled *c = d->rep[r].grad;
        size_t at = 0;
        for (int k = 0, node; (node = reduced_node(c->g, k)) >= 0; k++) {
            size_t m = (size_t)c->g->nodes[node].numel;
            rt_read_node(c, node, r == 0 ? d->acc + at : d->tmp);
            for (size_t i = 0; r > 0 && i < m; i++) d->acc[at + i] += d->tmp[i];
            at += m;
        }
    }
    if (!dist_comm_mean(d->comm, d->acc, d->red_total, ok, err)) return false;
    if (strcmp(t->be->name, "reference-f64") != 0)
        for (size_t i = 0; i < d->red_total; i++) d->acc[i] = (float)d->acc[i];
    for (int r = 0; r < d->n; r++) {
        const compiled *c = d->rep[r].grad;
        size_t at = 0;
        for (int k = 0, node; (node = reduced_node(c->g, k)) >= 0; k++) {
            size_t m = (size_t)c->g->nodes[node].numel;
            c->be->write(c->be->node_buf(c->exec, node), TG_FLOAT32, d->acc + at, m);
            at += m;
        }
    }
    return true;
}

/* Host path, updating: every replica's update graph, then its write-backs when the guard (the
 * same averaged values everywhere) is finite. A failure here would leave replicas unequal: the
 * handle refuses further steps. */
static bool host_update(tg_train *t, double *loss, double *guard, tg_error *err) {
    dist_state *d = t->dp;
    for (int r = 0; r < d->n; r++) {
        replica *rp = &d->rep[r];
        double l, gv;
        if (!rp->be->run(rp->update, t->hyper, err)) {
            snprintf(d->broken, sizeof d->broken, "replica %d's update failed (%.400s)", r, err->msg);
            return false;
        }
        rp->be->read(rp->be->node_buf(rp->update, rp->ug->output), TG_FLOAT32, &l, 1);
        rp->be->read(rp->be->node_buf(rp->update, rp->ug->guard), TG_FLOAT32, &gv, 1);
        if (r == 0) *loss = l, *guard = gv;
        if (!isfinite(gv)) *guard = gv;
    }
    for (int r = 0; r < d->n && isfinite(*guard); r++) {
        replica *rp = &d->rep[r];
        for (int k = 0; k < rp->ug->n_assigns; k++) {
            const tg_assign *a = &rp->ug->assigns[k];
            rp->be->copy(rp->wb_dst[k], rp->be->node_buf(rp->update, a->src), (size_t)rp->ug->nodes[a->dst].numel);
        }
    }
    return true;
}

static tg_result host_step(tg_train *t, bool ok, tg_result *res) {
    dist_state *d = t->dp;
    tg_error err = { { 0 } };
    for (int r = 0; ok && r < d->n; r++)
        if (!(ok = d->rep[r].be->run(d->rep[r].grad->exec, d->rep[r].hyper, &err))) *res = rt_failed("tg_step: %s", err.msg);
    if (!host_average(t, ok, &err)) {   /* every rank takes part, even one that failed, so none waits */
        if (!ok) return *res;           /* this process's own error */
        return rt_failed("tg_step: %s; the step was skipped on every rank and changed nothing%s", err.msg,
                         dist_comm_broken(d->comm) ? " (this handle cannot step again: destroy it)" : "");
    }
    double loss = 0, guard = 0;
    if (!host_update(t, &loss, &guard, &err)) return rt_failed("tg_step: %s", d->broken);
    return rt_step_finish(t, loss, guard);
}

static tg_result device_step(tg_train *t) {
    dist_state *d = t->dp;
    for (int r = 0; r < d->n; r++) {
        replica *rp = &d->rep[r];
        d->dpr[r] = (dp_replica){ .grad = rp->grad->exec, .update = rp->update, .hyper = rp->hyper, .loss = rp->ug->output,
                                  .guard = rp->ug->guard, .wb = rp->ug->assigns, .n_wb = rp->ug->n_assigns, .dst = rp->wb_dst };
    }
    dp_reduce red = dist_comm_reduce(d->comm);
    tg_error err;
    if (!t->be->dp_step(d->dpr, d->n, &red, &err))
        return rt_failed("tg_step: %s%s", err.msg,
                         dist_comm_broken(d->comm) ? "; parameters unchanged, and this handle cannot step again: destroy it" : "");
    double guard = d->dpr[0].guard_out;
    for (int r = 1; r < d->n; r++)
        if (!isfinite(d->dpr[r].guard_out)) guard = d->dpr[r].guard_out;
    return rt_step_finish(t, d->dpr[0].loss_out, guard);
}

tg_result dist_step(tg_train *t, const tg_data *inputs, int n_inputs) {
    dist_state *d = t->dp;
    const char *broken = d->broken[0] ? d->broken : dist_comm_broken(d->comm);
    if (broken)
        return rt_failed("tg_step: this data-parallel handle failed earlier (%s) and cannot step again: destroy it", broken);
    tg_result r;
    memset(&r, 0, sizeof r);
    r.status = TG_FAILED;
    bool ok = bind_shares(t, inputs, n_inputs, &r) && rt_step_hyper(t, &r);
    if (ok) replica_hypers(t);
    if (t->be->dp_step) return ok ? device_step(t) : r;   /* peers waiting on NCCL time out */
    return host_step(t, ok, &r);
}
