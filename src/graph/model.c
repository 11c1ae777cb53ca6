/* The model: a tree of named parameters with init specs, and their seeded initial values. */
#include "graph/graph.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SCOPE_DEPTH 32

struct tg_model {
    uint64_t seed;
    tg_param_spec *params;
    int n, cap;
    char scope[512];                 /* "layers.0.attn" */
    size_t scope_len[MAX_SCOPE_DEPTH];
    int depth;
    char error[TG_ERROR_LEN];
};

tg_model *tg_model_new(uint64_t seed) {
    tg_model *m = tg_alloc(sizeof *m);
    if (m) m->seed = seed;
    return m;
}

void tg_model_free(tg_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        free(m->params[i].name);
        free((void *)m->params[i].init.data);
    }
    free(m->params);
    free(m);
}

uint64_t tg_model_seed(const tg_model *m) { return m ? m->seed : 0; }
const char *tg_model_error(const tg_model *m) { return m && m->error[0] ? m->error : NULL; }
int tg_model_n_params(const tg_model *m) { return m ? m->n : 0; }
const char *tg_model_param_name(const tg_model *m, int i) { return m && i >= 0 && i < m->n ? m->params[i].name : NULL; }
tg_shape tg_model_param_shape(const tg_model *m, int i) { return m && i >= 0 && i < m->n ? m->params[i].shape : TG_SHAPE0; }
const tg_param_spec *model_param(const tg_model *m, int id) { return &m->params[id]; }

static void model_fail(tg_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void model_fail(tg_model *m, const char *fmt, ...) {
    if (m->error[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->error, sizeof m->error, fmt, ap);
    va_end(ap);
}

void tg_model_push(tg_model *m, const char *fmt, ...) {
    if (!m) return;
    if (!fmt) { model_fail(m, "tg_model_push: NULL scope name"); return; }
    if (m->depth == MAX_SCOPE_DEPTH) { model_fail(m, "tg_model_push: scopes nested deeper than %d", MAX_SCOPE_DEPTH); return; }
    size_t len = strlen(m->scope);
    m->scope_len[m->depth++] = len;
    if (len && len + 1 < sizeof m->scope) m->scope[len++] = '.';
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(m->scope + len, sizeof m->scope - len, fmt, ap);
    va_end(ap);
    if (k < 0 || len + (size_t)k >= sizeof m->scope) model_fail(m, "tg_model_push: scope name too long");
}

void tg_model_pop(tg_model *m) {
    if (!m) return;
    if (m->depth == 0) { model_fail(m, "tg_model_pop: no scope is open"); return; }
    m->scope[m->scope_len[--m->depth]] = 0;
}

int model_find(const tg_model *m, const char *name) {
    for (int i = 0; m && name && i < m->n; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

static tg_param bad_param(tg_model *m) { tg_param p = { m, -1 }; return p; }

tg_param tg_param_new(tg_model *m, const char *name, tg_shape shape, tg_init init) {
    if (!m) return bad_param(m);
    char full[600];
    snprintf(full, sizeof full, "%s%s%s", m->scope, m->scope[0] ? "." : "", name ? name : "");
    if (!name || !name[0]) { model_fail(m, "tg_param_new: empty parameter name in scope '%s'", m->scope); return bad_param(m); }
    if (model_find(m, full) >= 0) { model_fail(m, "tg_param_new: duplicate parameter name '%s'", full); return bad_param(m); }
    tg_error e = { { 0 } };
    if (shape.ndim < 1 || shape.ndim > TG_MAX_DIMS) tg_seterr(&e, "rank %d is out of range (1..%d)", shape.ndim, TG_MAX_DIMS);
    for (int i = 0; i < shape.ndim && i < TG_MAX_DIMS && !e.msg[0]; i++)
        if (shape.d[i] <= 0 || shape.d[i] > (1ll << 31)) tg_seterr(&e, "dimension %d is %lld", i, (long long)shape.d[i]);
    int64_t numel = 1;   /* each dimension is at most 2^31, but their product can still overflow */
    for (int i = 0; i < shape.ndim && !e.msg[0]; i++)
        if (__builtin_mul_overflow(numel, shape.d[i], &numel) || numel > (1ll << 34)) tg_seterr(&e, "too many elements");
    if (!e.msg[0] && (init.kind < TG_INIT_RANDN || init.kind > TG_INIT_LITERAL)) tg_seterr(&e, "unknown init kind %d", (int)init.kind);
    if (!e.msg[0] && !isfinite(init.scale)) tg_seterr(&e, "init scale %g is not finite", init.scale);
    if (!e.msg[0] && init.kind == TG_INIT_LITERAL && (!init.data || (int64_t)init.n != numel))
        tg_seterr(&e, "literal init has %zu values for %lld elements", init.data ? init.n : 0, (long long)numel);
    if (e.msg[0]) { model_fail(m, "tg_param_new '%s': %s", full, e.msg); return bad_param(m); }

    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        tg_param_spec *grown = tg_realloc(m->params, sizeof(tg_param_spec) * (size_t)cap);
        if (!grown) { model_fail(m, "tg_param_new '%s': out of memory", full); return bad_param(m); }
        m->params = grown;
        m->cap = cap;
    }
    tg_param_spec *p = &m->params[m->n];
    p->name = tg_strdup(full);
    p->shape = shape;
    p->init = init;
    p->init.data = init.kind == TG_INIT_LITERAL && p->name ? tg_alloc(sizeof(float) * init.n) : NULL;
    if (!p->name || (init.kind == TG_INIT_LITERAL && !p->init.data)) {
        free(p->name);
        free((void *)p->init.data);
        model_fail(m, "tg_param_new '%s': out of memory", full);
        return bad_param(m);
    }
    if (p->init.data) memcpy((void *)p->init.data, init.data, sizeof(float) * init.n);
    bool decays_by_default = init.kind != TG_INIT_ZEROS && init.kind != TG_INIT_ONES;
    p->decay = init.decay < 0 ? decays_by_default : init.decay != 0;
    tg_param r = { m, m->n++ };
    return r;
}

/* ----- init specs ----- */

static tg_init make_init(tg_init_kind k, double scale) { tg_init i = { k, scale, NULL, 0, -1 }; return i; }
tg_init tg_init_randn(double std) { return make_init(TG_INIT_RANDN, std); }
tg_init tg_init_kaiming(double gain) { return make_init(TG_INIT_KAIMING, gain); }
tg_init tg_init_zeros(void) { return make_init(TG_INIT_ZEROS, 0); }
tg_init tg_init_ones(void) { return make_init(TG_INIT_ONES, 0); }
tg_init tg_init_literal(const float *data, size_t n) {
    tg_init i = make_init(TG_INIT_LITERAL, 0);
    i.data = data;
    i.n = n;
    return i;
}
tg_init tg_init_decay(tg_init init, int decay) { init.decay = decay < 0 ? -1 : decay != 0; return init; }

/* ----- seeded values: splitmix64 per parameter, keyed by the model seed and the name, so adding
 * a parameter never changes the values of the others. ----- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The stream's i-th standard normal (Box-Muller from its calls 2i + 1 and 2i + 2, two uniforms in
 * (0, 1]): splitmix64 is a counter (each call adds the constant first), so element i is computed
 * alone, and a large parameter is filled by several threads with the values one thread gives. */
static double normal_at(uint64_t state, int64_t i) {
    uint64_t s1 = state + 2 * (uint64_t)i * 0x9E3779B97F4A7C15ull, s2 = s1 + 0x9E3779B97F4A7C15ull;
    double u1 = ((splitmix64(&s1) >> 11) + 1) * (1.0 / 9007199254740992.0);
    double u2 = (splitmix64(&s2) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

typedef struct { double *dst; int64_t i0, i1; uint64_t state; double std; } normal_range;

static void *fill_range(void *arg) {
    const normal_range *r = arg;
    for (int64_t i = r->i0; i < r->i1; i++) r->dst[i] = (double)(float)(r->std * normal_at(r->state, i));
    return NULL;
}

/* dst[i] = std * the stream's i-th normal, rounded to f32; a large parameter (a transformer's
 * millions of weights: a second on one thread) on one thread per processor, up to 16. */
static void fill_normal(double *dst, int64_t n, uint64_t state, double std) {
    enum { MAX_THREADS = 16 };
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int k = n < 65536 || cpus < 2 ? 1 : cpus < MAX_THREADS ? (int)cpus : MAX_THREADS;
    normal_range part[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = { false };
    for (int t = 0; t < k; t++) {
        part[t] = (normal_range){ dst, n * t / k, n * (t + 1) / k, state, std };
        if (t > 0) started[t] = pthread_create(&th[t], NULL, fill_range, &part[t]) == 0;
    }
    fill_range(&part[0]);
    for (int t = 1; t < k; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else fill_range(&part[t]);   /* no thread to be had: here */
    }
}

void model_init_param(const tg_model *m, int id, double *dst) {
    const tg_param_spec *p = &m->params[id];
    int64_t n = shape_numel(p->shape);
    uint64_t state = m->seed ^ fnv1a(p->name);
    double std = 0;
    switch (p->init.kind) {
    case TG_INIT_ZEROS: for (int64_t i = 0; i < n; i++) dst[i] = 0; return;
    case TG_INIT_ONES: for (int64_t i = 0; i < n; i++) dst[i] = 1; return;
    case TG_INIT_LITERAL: for (int64_t i = 0; i < n; i++) dst[i] = p->init.data[i]; return;
    case TG_INIT_RANDN: std = p->init.scale > 0 ? p->init.scale : 0.02; break;
    case TG_INIT_KAIMING: std = (p->init.scale > 0 ? p->init.scale : sqrt(2.0)) / sqrt((double)p->shape.d[0]); break;
    }
    fill_normal(dst, n, state, std);
}
