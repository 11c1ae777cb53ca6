/* Inspection: the graph, the planned memory, the variants and the generated kernels of a handle,
 * and its place in a data-parallel job. */
#include "runtime/runtime.h"
#include "dist/dist.h"

const tg_graph *tg_train_graph(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    const tg_graph *g = l ? l->c.g : NULL;
    if (l) rt_unlock(l);
    return g;
}

/* A forward's graph and kernels are those of its last call's variant. */
const tg_graph *tg_forward_graph(const tg_forward *f) {
    tg_train *l = rt_lock_forward(f);
    const tg_graph *g = l && f->last ? f->last->c.g : NULL;
    if (l) rt_unlock(l);
    return g;
}

size_t tg_train_planned_bytes(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    size_t bytes = l ? l->be->planned_bytes(l->c.exec) + (l->dp ? dist_update_bytes(l->dp) : 0) : 0;
    if (l) rt_unlock(l);
    return bytes;
}

int tg_forward_n_variants(const tg_forward *f) {
    tg_train *l = rt_lock_forward(f);
    int n = l ? f->n_v : 0;
    if (l) rt_unlock(l);
    return n;
}

static const char *source_of(const compiled *c) { return c && c->be->source ? c->be->source(c->exec) : NULL; }

const char *tg_train_kernel_source(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    const char *src = l ? source_of(&l->c) : NULL;
    if (l) rt_unlock(l);
    return src;
}

int tg_train_launch_count(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    int n = l && l->be->launches ? l->be->launches(l->c.exec) + (l->dp ? dist_update_launches(l->dp) : 0) : -1;
    if (l) rt_unlock(l);
    return n;
}

tg_precision tg_train_precision(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    tg_precision p = l ? l->c.g->precision : TG_PRECISION_DEFAULT;
    if (l) rt_unlock(l);
    return p;
}

const char *tg_forward_kernel_source(const tg_forward *f) {
    tg_train *l = rt_lock_forward(f);
    const char *src = l && f->last ? source_of(&f->last->c) : NULL;
    if (l) rt_unlock(l);
    return src;
}

int tg_train_rank(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    int r = !l ? -1 : l->dp ? dist_rank(l->dp) : 0;
    if (l) rt_unlock(l);
    return r;
}

int tg_train_replicas(const tg_train *t) {
    tg_train *l = rt_lock_train(t);
    int n = !l ? -1 : l->dp ? dist_replicas(l->dp) : 1;
    if (l) rt_unlock(l);
    return n;
}
