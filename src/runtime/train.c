/* Training handles: compiling a spec (trace, autograd, optimizer, backend), the parameter and
 * optimizer-state store a handle shares with its forwards, the step, live changes (learning
 * rate, schedule, reset, a new model) and destruction. */
#include "runtime/runtime.h"
#include "dist/dist.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

void rt_copy_schedule(tg_train *t, const tg_schedule *s) {
    int k = 0;
    for (const tg_schedule *p = s; p && k < MAX_SCHEDULE_CHAIN; p = p->after) t->chain[k++] = *p;
    for (int i = 0; i < k; i++) t->chain[i].after = i + 1 < k ? &t->chain[i + 1] : NULL;
    t->opt.lr = t->chain[0];
}

/* Persistent buffers for parameters (from the model's init) and optimizer state (zeros). */
bool rt_alloc_store(tg_train *t, tg_error *err) {
    const tg_graph *g = t->c.g;
    t->param = tg_alloc(sizeof(void *) * (size_t)(t->n_params + 1));
    t->state = tg_alloc(sizeof(void *) * (size_t)(g->n_state + 1));
    if (!t->param || !t->state) { tg_seterr(err, "out of memory for the parameter table"); return false; }
    for (int i = 0; i < t->n_params; i++) {
        t->param[i] = t->be->alloc((size_t)shape_numel(model_param(t->model, i)->shape));
        if (!t->param[i]) { tg_seterr(err, "out of memory for parameter '%s'", model_param(t->model, i)->name); return false; }
    }
    for (int i = 0; i < g->n_state; i++) {
        t->state[i] = t->be->alloc((size_t)g->nodes[g->state_shape_node[i]].numel);
        if (!t->state[i]) { tg_seterr(err, "out of memory for optimizer state"); return false; }
    }
    return true;
}

void rt_free_store(tg_train *t) {
    for (int i = 0; t->state && i < t->c.g->n_state; i++)
        if (t->state[i]) t->be->free(t->state[i]);
    free(t->state);
    for (int i = 0; t->param && i < t->n_params; i++)
        if (t->param[i]) t->be->free(t->param[i]);
    free(t->param);
    t->state = t->param = NULL;
}

/* The largest parameter's element count: the host buffer init and reset need. */
static size_t max_param_numel(const tg_train *t) {
    size_t max = 1;
    for (int i = 0; i < t->n_params; i++) {
        size_t n = (size_t)shape_numel(model_param(t->model, i)->shape);
        if (n > max) max = n;
    }
    return max;
}

/* Parameters from the model's init; false (nothing changed) when memory runs out. */
bool rt_init_params(tg_train *t) {
    double *v = tg_alloc(sizeof(double) * max_param_numel(t));
    if (!v) return false;
    for (int i = 0; i < t->n_params; i++) {
        size_t n = (size_t)shape_numel(model_param(t->model, i)->shape);
        model_init_param(t->model, i, v);
        t->be->write(t->param[i], TG_FLOAT32, v, n);
    }
    free(v);
    return true;
}

tg_graph *rt_trace_grads(const tg_train_spec *spec, const tg_input_decl *inputs, tg_precision runs, const tg_backend *be,
                         tg_error *err) {
    tg_graph *g = rt_trace(spec->model, spec->loss, spec->ctx, inputs, spec->n_inputs, false, rt_product_align(be, runs), err);
    if (!g) return NULL;
    g->precision = runs;
    g->group_products = rt_group_products(be, runs);
    int *wrt = tg_alloc(sizeof(int) * (size_t)(g->n_params + 1));
    int *grads = tg_alloc(sizeof(int) * (size_t)(g->n_params + 1));
    int n_wrt = 0;
    for (int i = 0; wrt && i < g->n_params; i++)
        if (g->param_node[i] >= 0) wrt[n_wrt++] = g->param_node[i];
    if (!wrt || !grads) ir_fail(g, TG_HERE, "out of memory deriving gradients");
    bool ok = ir_ok(g) && grad_build(g, g->output, wrt, n_wrt, grads);
    for (int i = 0, k = 0; ok && i < g->n_params; i++)
        if (g->param_node[i] >= 0) g->grad_of_param[i] = grads[k++];
    free(wrt);
    free(grads);
    if (!ok) {
        tg_seterr(err, "%s", g->error);
        ir_free(g);
        return NULL;
    }
    return g;
}

int *rt_grad_keep(const tg_graph *g, const int *extra, int n_extra, int *n_keep) {
    int *first = tg_alloc(sizeof(int) * (size_t)(g->n_params + n_extra + 1)), n = 0;
    if (!first) return NULL;
    for (int i = 0; i < g->n_params; i++)
        if (g->grad_of_param[i] >= 0) first[n++] = g->grad_of_param[i];
    for (int k = 0; k < n_extra; k++) first[n++] = extra[k];
    int *keep = rt_keep_list(g, first, n, n_keep);
    free(first);
    return keep;
}

/* Everything of a training handle but its lock, queue and forwards: trace, gradients, optimizer,
 * compile, parameters initialized. NULL with err set on failure. */
static tg_train *train_build(const tg_train_spec *spec, tg_error *err) {
    const tg_backend *be = backend_find(spec->backend, err);
    tg_precision runs;
    if (!be || !rt_precision(be, spec->precision, &runs, err)) return NULL;
    tg_graph *g = rt_trace_grads(spec, spec->inputs, runs, be, err);
    if (!g) return NULL;
    if (!optim_build(g, &spec->optimizer, !be->checks_writebacks)) {
        tg_seterr(err, "%s", g->error);
        ir_free(g);
        return NULL;
    }
    tg_train *t = tg_alloc(sizeof *t);
    if (!t) {
        tg_seterr(err, "out of memory for the training handle");
        ir_free(g);
        return NULL;
    }
    t->model = spec->model;
    t->be = be;
    t->loss = g->output;
    t->loss_fn = spec->loss;
    t->loss_ctx = spec->ctx;
    t->opt = spec->optimizer;
    t->precision = spec->precision ? spec->precision : TG_PRECISION_F32;
    t->n_params = g->n_params;
    rt_copy_schedule(t, &spec->optimizer.lr);
    int extra[2] = { g->output, g->guard };   /* the guard is read after every step: kept to the end */
    int n_keep, *keep = rt_grad_keep(g, extra, 2, &n_keep);
    bool ok = keep && rt_compile_graph(&t->c, be, g, spec->n_inputs, keep, n_keep, err) && rt_alloc_store(t, err);
    if (!keep) {
        tg_seterr(err, "out of memory compiling the graph");
        t->c.g = g;   /* for compiled_free below */
    }
    free(keep);
    if (ok && !rt_init_params(t)) {
        tg_seterr(err, "out of memory initialising the parameters");
        ok = false;
    }
    if (!ok) {
        rt_free_store(t);
        rt_compiled_free(&t->c);
        free(t);
        return NULL;
    }
    rt_bind_params(&t->c, t->param);
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == OP_STATE) be->bind(t->c.exec, i, t->state[g->nodes[i].iarg[0]]);
    return t;
}

static void destroy_unregistered(tg_train *t);

tg_train *tg_compile(const tg_train_spec *spec, tg_error *err) {
    if (!spec) { tg_seterr(err, "tg_compile: no spec"); return NULL; }
    tg_train *t = dist_requested(spec) ? dist_train_build(spec, err) : train_build(spec, err);
    if (!t) return NULL;
    pthread_mutexattr_t attr;   /* recursive: tg_eval_loss attaches and runs under the lock it holds */
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&t->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    t->queue = async_new();   /* its worker thread starts at the first submit */
    if (!t->queue || !rt_registry_add(t)) {
        tg_seterr(err, "tg_compile: out of memory");
        destroy_unregistered(t);
        return NULL;
    }
    return t;
}

static void *leaf_storage(tg_train *t, const tg_node *n) {
    return n->op == OP_PARAM ? t->param[n->iarg[0]] : t->state[n->iarg[0]];
}

/* The random seed of one call: a function of the model's seed, the kind of handle and the call
 * number, kept below 2^53 so a double (the hyper slot) holds it exactly. */
double rt_call_seed(const tg_model *m, uint64_t kind, int64_t call) {
    uint64_t z = rng_mix(tg_model_seed(m) * 2 + kind) ^ rng_mix((uint64_t)call);
    return (double)(z >> 11);
}

static int64_t sched_step(const tg_train *t) { return t->step + 1 - t->sched_base; }

double tg_train_lr(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    if (!l) return 0;
    double lr = tg_schedule_at(&l->opt.lr, sched_step(l));
    rt_unlock(l);
    return lr;
}

int64_t tg_train_step_count(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    if (!l) return 0;
    int64_t step = l->step;
    rt_unlock(l);
    return step;
}

/* A step whose guard was not finite changed nothing; its message names the first parameter, in
 * declaration order, whose gradient went non-finite (the gradients are kept nodes, still
 * readable after the run). */
static tg_result nonfinite_step(tg_train *t, double loss) {
    const tg_graph *g = t->c.g;
    const char *name = NULL, *what = NULL;
    for (int i = 0; i < t->n_params && !name; i++) {
        int node = g->grad_of_param[i];
        if (node < 0) continue;
        size_t n = (size_t)g->nodes[node].numel;
        double *v = tg_alloc(sizeof(double) * n);
        if (!v) break;   /* the step still fails; the message just names no parameter */
        rt_read_node(&t->c, node, v);
        for (size_t k = 0; k < n && !name; k++)
            if (!isfinite(v[k])) {
                name = model_param(t->model, i)->name;
                what = isnan(v[k]) ? "NaN" : "infinite";
            }
        free(v);
    }
    long long step = (long long)t->step + 1;
    if (!isfinite(loss) && name)
        return rt_failed("loss is %s at step %lld (first non-finite gradient: '%s'); parameters were left unchanged",
                      isnan(loss) ? "NaN" : "infinite", step, name);
    if (!isfinite(loss))
        return rt_failed("loss is %s at step %lld; parameters were left unchanged", isnan(loss) ? "NaN" : "infinite", step);
    return rt_failed("gradient of '%s' is not finite (%s) at step %lld; parameters were left unchanged", name ? name : "?",
                  what ? what : "NaN", step);
}

bool rt_step_hyper_at(tg_train *t, int64_t ahead, tg_result *r) {
    int64_t step = t->step + 1 + ahead;
    double lr = tg_schedule_at(&t->opt.lr, sched_step(t) + ahead);   /* tg_set_lr / tg_set_schedule take any double */
    if (!(lr >= 0 && isfinite(lr))) {
        *r = rt_failed("learning rate %g at step %lld is negative or not finite; nothing was changed", lr, (long long)step);
        return false;
    }
    optim_hyper(&t->opt, step, lr, t->hyper);
    t->hyper[HYPER_SEED] = rt_call_seed(t->model, 0, step);
    return true;
}

bool rt_step_hyper(tg_train *t, tg_result *r) { return rt_step_hyper_at(t, 0, r); }

tg_result rt_step_finish(tg_train *t, double loss, double guard) {
    if (!isfinite(guard)) return nonfinite_step(t, loss);
    t->step++;
    tg_result r;
    memset(&r, 0, sizeof r);
    r.status = TG_OK;
    r.loss = (float)loss;
    r.step = t->step;
    return r;
}

/* The write-back targets, in the graph's order (made at the first step). */
static bool wb_targets(tg_train *t) {
    const tg_graph *g = t->c.g;
    if (t->wb_dst) return true;
    t->wb_dst = tg_alloc(sizeof(void *) * (size_t)(g->n_assigns + 1));
    if (!t->wb_dst) return false;
    for (int k = 0; k < g->n_assigns; k++) t->wb_dst[k] = leaf_storage(t, &g->nodes[g->assigns[k].dst]);
    return true;
}

tg_result rt_step_locked(tg_train *t, const tg_data *inputs, int n_inputs) {
    if (t->dp) return dist_step(t, inputs, n_inputs);
    tg_result r;
    memset(&r, 0, sizeof r);
    if (!rt_bind_batch(&t->c, inputs, n_inputs, r.error, sizeof r.error)) { r.status = TG_FAILED; return r; }
    if (!rt_step_hyper(t, &r)) return r;
    tg_error err;
    double loss, guard;
    const tg_graph *g = t->c.g;
    if (t->be->step) {
        if (!wb_targets(t)) return rt_failed("tg_step: out of memory for the write-back table");
        if (!t->be->step(t->c.exec, t->hyper, t->loss, g->guard, g->assigns, g->n_assigns, t->wb_dst, &loss, &guard, &err))
            return rt_failed("tg_step: %s", err.msg);
    } else {
        if (!t->be->run(t->c.exec, t->hyper, &err)) return rt_failed("tg_step: %s", err.msg);
        rt_read_node(&t->c, t->loss, &loss);
        rt_read_node(&t->c, g->guard, &guard);
        for (int k = 0; k < g->n_assigns && isfinite(guard); k++) {
            const tg_node *dst = &g->nodes[g->assigns[k].dst];
            t->be->copy(leaf_storage(t, dst), t->be->node_buf(t->c.exec, g->assigns[k].src), (size_t)dst->numel);
        }
    }
    return rt_step_finish(t, loss, guard);
}

tg_result tg_step(tg_train *t, const tg_data *inputs, int n_inputs) {
    tg_train *l = rt_lock_train(t);
    if (!l) return rt_failed("tg_step: %s training handle", rt_dead(t));
    tg_result r = rt_step_locked(l, inputs, n_inputs);
    rt_unlock(l);
    return r;
}

/* ----- several steps per call (tg_steps) ----- */

/* Step s's share of the inputs: each holds n_steps batches back to back. */
static void step_slice(const tg_data *in, int n, int n_steps, int s, tg_data *out) {
    for (int k = 0; k < n; k++) {
        size_t per = in[k].n / (size_t)n_steps;
        out[k] = in[k];
        out[k].n = per;
        out[k].data = (const char *)in[k].data + (size_t)s * per * 4;   /* f32 and i32: 4 bytes */
    }
}

/* Steps from..n_steps-1 one at a time, stopping at the first that fails. */
static tg_result steps_in_turn(tg_train *t, const tg_data *in, int n, int n_steps, int from, float *losses, tg_data *slice) {
    tg_result r = { .status = TG_OK, .step = t->step };
    for (int s = from; s < n_steps && r.status == TG_OK; s++) {
        step_slice(in, n, n_steps, s, slice);
        r = rt_step_locked(t, slice, n);
        if (r.status == TG_OK && losses) losses[s] = r.loss;
        if (r.status != TG_OK) {   /* the step named */
            tg_result f = rt_failed("tg_steps: step %d of %d: %s", s + 1, n_steps, r.error);
            f.status = r.status;
            f.step = r.step;
            r = f;
        }
    }
    return r;
}

/* Steps queued on the device, up to its queue depth ahead of the one waited for, so that it runs
 * them back to back. A step whose guard fails makes the steps queued behind it change nothing
 * (the backend's poison); they are waited for and dropped, and the failed step is run again on
 * its own, which fails the same way (its parameters are unchanged) with its message naming the
 * first non-finite gradient, or, should it pass, goes on from there. */
static tg_result steps_queued(tg_train *t, const tg_data *in, int n, int n_steps, float *losses, tg_data *slice) {
    const tg_graph *g = t->c.g;
    void **bufs = tg_alloc(sizeof(void *) * (size_t)(n + 1));   /* n 0: the batch kept on the device */
    const void **data = tg_alloc(sizeof(void *) * (size_t)(n + 1));
    size_t *bytes = tg_alloc(sizeof(size_t) * (size_t)(n + 1));
    tg_result r = { .status = TG_OK, .step = t->step };
    if (!bufs || !data || !bytes || !wb_targets(t)) r = rt_failed("tg_steps: out of memory");
    int queued = 0, done = 0, bad = r.status == TG_OK ? -1 : 0, depth = t->be->queue_depth(t->c.exec);
    tg_error err;
    while (done < queued || (bad < 0 && queued < n_steps)) {
        if (bad < 0 && queued < n_steps && queued - done < depth) {
            step_slice(in, n, n_steps, queued, slice);
            for (int k = 0; k < n; k++) {
                bufs[k] = t->c.input_buf[rt_input_index(&t->c, slice[k].name)];
                data[k] = slice[k].data;
                bytes[k] = slice[k].n * 4;
            }
            if (!rt_step_hyper_at(t, queued - done, &r)) {
                bad = queued;
            } else if (!t->be->step_queue(t->c.exec, t->hyper, t->loss, g->assigns, g->n_assigns, t->wb_dst, bufs, data,
                                          bytes, n, queued == 0, &err)) {
                r = rt_failed("tg_steps: %s", err.msg);
                bad = queued;
            } else {
                queued++;
                t->c.holds_batch |= n > 0;   /* the backend uploaded it: a later call may run on it again */
            }
            continue;
        }
        double loss, guard;
        if (!t->be->step_wait(t->c.exec, &loss, &guard, &err)) {
            if (r.status == TG_OK) r = rt_failed("tg_steps: %s", err.msg);
            if (bad < 0) bad = done;
        } else if (bad < 0 && isfinite(guard)) {
            r = rt_step_finish(t, loss, guard);
            if (losses) losses[done] = r.loss;
        } else if (bad < 0) {
            bad = done;   /* run again in turn, below */
        }
        done++;
    }
    free(bufs);
    free(data);
    free(bytes);
    if (bad >= 0 && r.status == TG_OK) r = steps_in_turn(t, in, n, n_steps, bad, losses, slice);
    return r;
}

tg_result tg_steps(tg_train *t, const tg_data *inputs, int n_inputs, int n_steps, float *losses) {
    tg_train *l = rt_lock_train(t);
    if (!l) return rt_failed("tg_steps: %s training handle", rt_dead(t));
    tg_result r = { .status = TG_OK };
    tg_data *slice = n_inputs > 0 ? tg_alloc(sizeof(tg_data) * (size_t)n_inputs) : NULL;
    if (n_steps < 1) r = rt_failed("tg_steps: n_steps is %d; at least 1", n_steps);
    else if (n_inputs < 0 || (n_inputs > 0 && !inputs)) r = rt_failed("tg_steps: inputs: %d given but no array", n_inputs);
    else if (n_inputs > 0 && !slice) r = rt_failed("tg_steps: out of memory");
    else if (n_inputs == 0 && !rt_bind_batch(&l->c, NULL, 0, r.error, sizeof r.error)) r.status = TG_FAILED;   /* none kept */
    for (int k = 0; k < n_inputs && r.status == TG_OK; k++) {
        int i = inputs[k].name ? rt_input_index(&l->c, inputs[k].name) : -1;
        size_t per = i >= 0 ? (size_t)l->c.g->nodes[i].numel : 0;
        if (i >= 0 && inputs[k].n != per * (size_t)n_steps)
            r = rt_failed("tg_steps: input '%s' holds %zu elements, not %d steps of %zu", inputs[k].name, inputs[k].n,
                          n_steps, per);
    }
    if (r.status == TG_OK && n_inputs > 0) {   /* names, dtypes and sizes, as one step has them */
        step_slice(inputs, n_inputs, n_steps, 0, slice);
        if (!rt_check_inputs(&l->c, slice, n_inputs, r.error, sizeof r.error)) r.status = TG_FAILED;
    }
    bool queue = l->be->queue_depth && !l->dp && l->be->queue_depth(l->c.exec) > 0;
    if (r.status == TG_OK)
        r = queue ? steps_queued(l, inputs, n_inputs, n_steps, losses, slice)
                  : steps_in_turn(l, inputs, n_inputs, n_steps, 0, losses, slice);
    free(slice);
    rt_unlock(l);
    return r;
}

/* ----- replacing the model ----- */

tg_status tg_replace_model(tg_train *t, tg_model *m, const tg_optimizer *opt, tg_error *err) {
    if (!rt_registry_has(t)) { tg_seterr(err, "tg_replace_model: %s training handle", rt_dead(t)); return TG_FAILED; }
    /* Calls queued for the old model abort first: else the worker, draining the queue, could
     * keep the lock from this call until they all ran. */
    async_abort(t->queue, NULL, "the model was replaced");
    tg_train *l = rt_lock_train(t);
    if (!l) { tg_seterr(err, "tg_replace_model: %s training handle", rt_dead(t)); return TG_FAILED; }
    if (l->dp) {   /* its replicas and communicator are built for one model: compile a new handle */
        tg_seterr(err, "tg_replace_model: not supported on a data-parallel handle (devices or dist set); destroy it "
                       "and compile one for the new model");
        rt_unlock(l);
        return TG_FAILED;
    }
    tg_train_spec spec = { .model = m, .loss = l->loss_fn, .ctx = l->loss_ctx, .inputs = l->c.decls,
                           .n_inputs = l->c.n_inputs, .optimizer = opt ? *opt : l->opt, .backend = l->be->name,
                           .precision = l->precision };
    tg_error e;
    tg_train *n = m ? train_build(&spec, &e) : NULL;
    if (!n) {
        tg_seterr(err, "tg_replace_model: %s", m ? e.msg : "no model given");
        rt_unlock(l);
        return TG_FAILED;
    }
    /* Calls queued since, or in flight, belong to the old model: they abort too. */
    atomic_fetch_add(&l->generation, 1);
    async_abort(l->queue, NULL, "the model was replaced");
    rt_free_store(l);
    rt_compiled_free(&l->c);
    free(l->wb_dst);
    l->model = n->model;
    l->n_params = n->n_params;
    l->param = n->param;
    l->state = n->state;
    l->c = n->c;
    l->loss = n->loss;
    l->opt = n->opt;
    rt_copy_schedule(l, &n->opt.lr);
    l->sched_base = l->step = 0;
    l->wb_dst = NULL;
    free(n);
    rt_unlock(l);
    return TG_OK;
}

static void destroy_unregistered(tg_train *t) {
    async_free(t->queue, "the training handle was destroyed");
    for (int i = 0; i < t->n_fwd; i++) rt_forward_free(t->fwd[i]);
    free(t->fwd);
    rt_free_store(t);
    free(t->wb_dst);
    rt_compiled_free(&t->c);
    dist_free(t->dp);   /* last: NCCL's communicators outlive every CUDA graph that captured them */
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void tg_destroy(tg_train *t) {
    if (!rt_registry_has(t)) return;
    rt_registry_remove(t);
    atomic_fetch_add(&t->generation, 1);
    async_free(t->queue, "the training handle was destroyed");   /* outside the lock: its job in flight needs it */
    t->queue = NULL;
    pthread_mutex_lock(&t->mu);   /* a call another thread is making finishes first */
    for (int i = 0; i < t->n_fwd; i++) rt_registry_remove(t->fwd[i]);
    pthread_mutex_unlock(&t->mu);
    destroy_unregistered(t);
}

static tg_status reset(tg_train *t, int params, int optimizer) {
    /* All or nothing: the host buffers first (state slots have their parameters' shapes). */
    double *zeros = optimizer ? tg_alloc(sizeof(double) * max_param_numel(t)) : NULL;
    if ((optimizer && !zeros) || (params && !rt_init_params(t))) {
        free(zeros);
        return TG_FAILED;
    }
    if (optimizer) {
        const tg_graph *g = t->c.g;
        for (int i = 0; i < g->n_state; i++)
            t->be->write(t->state[i], TG_FLOAT32, zeros, (size_t)g->nodes[g->state_shape_node[i]].numel);
        t->step = 0;
        t->sched_base = 0;
    }
    free(zeros);
    if (t->dp) dist_sync(t);   /* data parallel: every replica */
    return TG_OK;
}

static void set_schedule(tg_train *t, const tg_schedule *s) {
    if (!s) return;
    rt_copy_schedule(t, s);
    t->sched_base = t->step;
}

tg_status tg_reset(tg_train *t, int params, int optimizer) {
    tg_train *l = rt_lock_train(t);
    if (!l) return TG_FAILED;
    tg_status st = reset(l, params, optimizer);
    rt_unlock(l);
    return st;
}

void tg_set_schedule(tg_train *t, const tg_schedule *s) {
    tg_train *l = rt_lock_train(t);
    if (!l) return;
    set_schedule(l, s);
    rt_unlock(l);
}

void tg_set_lr(tg_train *t, double lr) {
    tg_schedule s = tg_lr_constant(lr);
    tg_set_schedule(t, &s);
}
