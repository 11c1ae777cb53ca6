/* The runtime's private view of its handles, shared by the files of src/runtime/: a training
 * handle (train.c) owns the parameter store and a family lock; forwards (forward.c) attach to
 * it; each holds compiled graphs (compiled.c). Nothing here is public API. */
#ifndef TG_RUNTIME_H
#define TG_RUNTIME_H

#include "graph/graph.h"
#include "runtime/backend.h"
#include <pthread.h>
#include <stdatomic.h>

typedef struct dist_state dist_state;

/* async.c: queued calls on a worker thread per training handle. A job_fn runs one call for
 * `handle` of `family` (locking it, aborting when its model generation moved on); a run puts a
 * malloc'd copy of its output in *out. */
typedef struct async_queue async_queue;
typedef tg_result (*job_fn)(void *family, void *handle, const tg_data *in, int n, uint64_t generation, float **out);
async_queue *async_new(void);
tg_job *async_submit(async_queue *q, job_fn fn, void *family, void *handle, const tg_data *inputs, int n,
                     uint64_t generation);
/* Queued jobs (of `handle`, or all when NULL) resolve TG_ABORTED with `why`. */
void async_abort(async_queue *q, const void *handle, const char *why);
/* Aborts what is queued, lets the job in flight finish, joins the worker and frees q. */
void async_free(async_queue *q, const char *why);

/* A graph made ready to run: its plan, its executor and its input buffers. The first n_inputs
 * nodes of the graph are its INPUT nodes, in declaration order (patch sites add more later). */
typedef struct {
    const tg_backend *be;
    tg_graph *g;
    void *exec;
    tg_input_decl *decls;     /* names owned by the graph's INPUT nodes */
    int n_inputs;
    void **input_buf;
    bool holds_batch;         /* the input buffers hold a call's inputs (rt_bind_batch) */
} compiled;

#define MAX_SCHEDULE_CHAIN 8
#define DEFAULT_VARIANTS 8

/* One compiled form of a forward: for one value of its open dimensions (0 when it has none),
 * with or without patch sites selecting their values. */
typedef struct {
    int64_t size;
    bool patchable;
    compiled c;
    void **patch_buf;         /* per patch site of a patchable variant: its replacement buffer */
    uint64_t used;            /* the forward's call clock at its last use (LRU) */
} variant;

/* A patch set on a forward, by site name. */
typedef struct {
    char *site;
    tg_patch_mode mode;
    float *values;            /* TG_PATCH_VALUES */
    size_t n;
} patch_rule;

struct tg_forward {
    tg_train *train;
    tg_forward_fn fn;
    const void *ctx;
    tg_precision precision;   /* as asked (never DEFAULT) */
    tg_input_decl *decls;     /* as declared, TG_ANY kept; names owned */
    int n_inputs;
    bool open;
    int max_variants;
    variant **v;
    int n_v;
    variant *last;            /* the variant of the last call: output, captures, source */
    uint64_t clock;
    uint64_t generation;      /* the training handle's model generation its variants were traced for */
    patch_rule *patch;
    int n_patch;
    float *out;               /* the last output, and before rounding to float */
    double *host;
    int64_t out_cap;
    int64_t calls;            /* seeds randn/dropout: a new draw per call */
};

struct tg_train {
    pthread_mutex_t mu;       /* one lock for t and the forwards attached to it (they share buffers) */
    _Atomic uint64_t generation;  /* bumped when the model is replaced or t destroyed */
    async_queue *queue;       /* tg_step_submit / tg_run_submit */
    tg_model *model;
    const tg_backend *be;
    int n_params;
    void **param;             /* per model param id: backend buffers */
    void **state;             /* per optimizer state slot */
    compiled c;
    int loss;
    tg_optimizer opt;
    tg_precision precision;   /* as asked (forwards default to it); the graph has what runs */
    tg_schedule chain[MAX_SCHEDULE_CHAIN];  /* opt.lr and the schedules it points to, owned */
    int64_t sched_base;       /* the schedule's step 1 is step sched_base + 1 */
    int64_t step;
    double hyper[8];
    tg_forward **fwd;
    int n_fwd;
    tg_forward *eval;         /* the loss as a forward graph, for tg_eval_loss */
    void **wb_dst;            /* the backend's step hook: write-back targets by assign */
    tg_forward_fn loss_fn;
    const void *loss_ctx;
    /* Data parallel (src/dist/replicas.c): the other replicas, the communicator, the declared
     * inputs; NULL for one replica. Then c is replica 0's forward and backward, param and state
     * its buffers, and be its device's table. */
    dist_state *dp;
};

/* handles.c: results, live handles and the family lock. */
tg_result rt_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
tg_result rt_aborted(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool rt_registry_add(const void *h);       /* false when memory runs out */
void rt_registry_remove(const void *h);
bool rt_registry_has(const void *h);
/* A live handle's family, locked; NULL when the handle is NULL or not live. */
tg_train *rt_lock_train(const tg_train *t);
tg_train *rt_lock_forward(const tg_forward *f);
void rt_unlock(tg_train *t);
/* Why a handle was refused, for messages: "NULL" or "destroyed or invalid". */
const char *rt_dead(const void *h);

/* Runs `body` with t's family locked, or sets err and fails when t is not a live handle. */
#define WITH_TRAIN(what, t, err, body)                                                    \
    do {                                                                                  \
        tg_train *l_ = rt_lock_train(t);                                                     \
        if (!l_) { tg_seterr(err, "%s: %s training handle", what, rt_dead(t)); return TG_FAILED; } \
        tg_status st_ = body;                                                             \
        rt_unlock(l_);                                                                       \
        return st_;                                                                       \
    } while (0)


/* trace.c: trace fn over fresh INPUT nodes (node i is input i) into a new graph, with patch
 * sites selecting their values when `patchable` (tg_patch; graph->patchable) and products'
 * weights padded to rows of a multiple of `align` elements (graph->product_align; 0: never);
 * NULL with err set on failure, including the first shape error an op recorded. */
tg_graph *rt_trace(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *inputs, int n, bool patchable,
                   int align, tg_error *err);
/* The row alignment products on `be` want at precision `runs`: TG_PAD_PRODUCTS when set (tests
 * run the padded graph on every backend), else be->product_align at tf32 and bf16. */
int rt_product_align(const tg_backend *be, tg_precision runs);
/* Whether a training graph at precision `runs` groups sibling products' gradients
 * (graph->group_products): TG_GROUP_PRODUCTS=0|1, else be->group_products (NULL: never; the
 * probes, whose graphs every backend must share). */
bool rt_group_products(const tg_backend *be, tg_precision runs);
bool rt_check_decls(const tg_input_decl *in, int n, tg_error *err);
/* The precision a graph on backend `be` computes in when `want` is asked (DEFAULT: f32); false
 * with err set for a value that is no tg_precision. */
bool rt_precision(const tg_backend *be, tg_precision want, tg_precision *out, tg_error *err);

/* compiled.c */
bool rt_compile_graph(compiled *c, const tg_backend *be, tg_graph *g, int n_inputs, const int *keep, int n_keep,
                      tg_error *err);
void rt_compiled_free(compiled *c);   /* also after rt_compile_graph failed halfway */
void rt_bind_params(compiled *c, void **param);
void rt_read_node(const compiled *c, int node, double *dst);   /* the node's values as host doubles */
/* Check a call's data against the declared inputs (names, dtypes, element counts); bind also
 * copies it into the input buffers. rt_input_index: the declared input of that name, or -1. */
bool rt_check_inputs(const compiled *c, const tg_data *data, int n, char *err, size_t errlen);
bool rt_bind_inputs(compiled *c, const tg_data *data, int n, char *err, size_t errlen);
/* A training step's inputs: as rt_bind_inputs, or none (n 0) to run on the batch the buffers
 * still hold from an earlier call (false, with err, when there is none). */
bool rt_bind_batch(compiled *c, const tg_data *data, int n, char *err, size_t errlen);
int rt_input_index(const compiled *c, const char *name);
/* The nodes a compiled graph keeps readable after a run: `first` (outputs, gradients), then its
 * captures and, in a patchable graph, the values arriving at its patch sites. NULL when memory
 * runs out. */
int *rt_keep_list(const tg_graph *g, const int *first, int n_first, int *n_keep);

/* train.c */
tg_result rt_step_locked(tg_train *t, const tg_data *inputs, int n_inputs);
/* Trace spec's loss at `inputs` (precision `runs`, products padded for `be`) and append the
 * gradient of every parameter it uses (g->grad_of_param); NULL with err set. */
tg_graph *rt_trace_grads(const tg_train_spec *spec, const tg_input_decl *inputs, tg_precision runs, const tg_backend *be,
                         tg_error *err);
/* What a training graph keeps readable: its gradients in parameter order, then `extra`, then its
 * captures (rt_keep_list). NULL when memory runs out. */
int *rt_grad_keep(const tg_graph *g, const int *extra, int n_extra, int *n_keep);
/* The parts of a handle the data-parallel build shares: the parameter and state store (sized by
 * t->c.g), parameters from the model's init, the schedule copied in. */
bool rt_alloc_store(tg_train *t, tg_error *err);
void rt_free_store(tg_train *t);
bool rt_init_params(tg_train *t);
void rt_copy_schedule(tg_train *t, const tg_schedule *s);
/* The scalars (learning rate, bias corrections, seed) of the step `ahead` steps after the next
 * one into t->hyper; false with the error in r for a learning rate that is negative or not
 * finite. rt_step_hyper: the next step's. */
bool rt_step_hyper_at(tg_train *t, int64_t ahead, tg_result *r);
bool rt_step_hyper(tg_train *t, tg_result *r);
/* The end of a step: a non-finite guard fails it naming the first non-finite gradient (read from
 * t->c), else the step counts. */
tg_result rt_step_finish(tg_train *t, double loss, double guard);
/* The random seed of one call (kind 0: a step, 1: a forward call), below 2^53. */
double rt_call_seed(const tg_model *m, uint64_t kind, int64_t call);

/* forward.c */
tg_result rt_run_locked(tg_forward *f, const tg_data *inputs, int n_inputs, bool patchable);
void rt_forward_free(tg_forward *f);

/* patch.c */
bool rt_patch_any(const tg_forward *f);   /* a patch is set: calls need the patchable variant */
/* A patchable variant's per-call settings: each site's two hyper flags and, for replaced values,
 * its replacement buffer. */
bool rt_patch_apply(tg_forward *f, variant *v, double *hyper, char *err, size_t len);

/* params.c: a backend buffer of n values into the caller's floats; false when memory runs out. */
bool rt_read_floats(const tg_backend *be, const void *buf, float *dst, size_t n);

#endif
