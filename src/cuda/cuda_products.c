/* Matrix products through cuBLASLt, each with an algorithm chosen for its shape by timing.
 *
 * cuBLAS's own choice (cublasGemmEx: the first of cuBLASLt's heuristic list) is made for large
 * products. A step of a small model is mostly products with few output tiles and a long
 * reduction ([128, 784] x [784, 512] fills 4 of an H100's 132 SMs with 128 x 128 tiles), where
 * a variant that splits the reduction, or uses smaller tiles, runs several times faster. So each
 * distinct product (shape, transposes, batch, precision, operand alignment) runs the heuristic's
 * first LT_CANDIDATES algorithms on its own buffers before the step's graph is captured, and
 * keeps the fastest; the heuristic's first wins ties within 3%. Every cuBLASLt algorithm is
 * deterministic (a split reduction adds its parts in a fixed order), so a choice is a fixed
 * summation order; choices are remembered per process and kept in the kernel cache (checked
 * again with cublasLtMatmulAlgoCheck when read), so a process finds the same ones as the last.
 *
 * TG_CUDA_TUNE=0 takes the heuristic's first without timing; TG_CUDA_TUNE=verbose prints every
 * choice with the candidates' times. */
#include "cuda/cuda_api.h"
#include "io/cache.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {                                /* cublasLtMatmulHeuristicResult_t */
    lt_algo algo;
    size_t workspace;
    int state;
    float waves;
    int reserved[4];
} lt_heuristic;

static struct {
    int (*Create)(void **);
    size_t (*GetVersion)(void);
    int (*DescCreate)(void **, int, int);
    int (*DescDestroy)(void *);
    int (*DescSetAttribute)(void *, int, const void *, size_t);
    int (*LayoutCreate)(void **, int, uint64_t, uint64_t, int64_t);
    int (*LayoutDestroy)(void *);
    int (*LayoutSetAttribute)(void *, int, const void *, size_t);
    int (*PrefCreate)(void **);
    int (*PrefDestroy)(void *);
    int (*PrefSetAttribute)(void *, int, const void *, size_t);
    int (*GetHeuristic)(void *, void *, void *, void *, void *, void *, void *, int, lt_heuristic *, int *);
    int (*AlgoCheck)(void *, void *, void *, void *, void *, void *, const lt_algo *, lt_heuristic *);
    int (*ConfigGetAttribute)(const lt_algo *, int, void *, size_t, size_t *);
    int (*Matmul)(void *, void *, const void *, const void *, void *, const void *, void *, const void *, const void *, void *,
                  void *, void *, const lt_algo *, void *, size_t, CUstream);
} lt;

static const char *const LT_NAMES[] = {
    "cublasLtCreate", "cublasLtGetVersion", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
    "cublasLtMatrixLayoutSetAttribute", "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulAlgoCheck",
    "cublasLtMatmulAlgoConfigGetAttribute", "cublasLtMatmul",
};
static const char *const LT_LIBS[] = { "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so", NULL };

/* cublasLt.h's numbers for what is used here */
enum {
    LT_R_32F = 0, LT_R_16BF = 14, LT_COMPUTE_32F = 68, LT_COMPUTE_32F_FAST_TF32 = 77,
    LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4,
    LT_LAYOUT_BATCH_COUNT = 5, LT_LAYOUT_BATCH_STRIDE = 6,
    LT_PREF_MAX_WORKSPACE = 1, LT_PREF_ALIGN_A = 5,   /* _B, _C, _D: 6, 7, 8 */
    LT_CONFIG_ID = 0, LT_CONFIG_TILE = 1, LT_CONFIG_SPLITK = 2,
};

#define LT_CANDIDATES 8
#define LT_TIMED_RUNS 20

static struct {
    pthread_once_t once;
    bool ok;
    pthread_mutex_t mu;
    struct lt_memo { int device; lt_shape shape; lt_algo algo; size_t workspace; } *memo;
    int n_memo, cap_memo;
} g_lt = { .once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER };

static void load(void) {
    for (const char *const *name = LT_LIBS; *name && !g_lt.ok; name++) {
        void *lib = dlopen(*name, RTLD_NOW | RTLD_LOCAL);
        if (!lib) continue;
        g_lt.ok = true;
        for (size_t i = 0; i < sizeof LT_NAMES / sizeof *LT_NAMES && g_lt.ok; i++)
            g_lt.ok = (((void **)&lt)[i] = dlsym(lib, LT_NAMES[i])) != NULL;
    }
}

static bool lt_available(void) {
    pthread_once(&g_lt.once, load);
    return g_lt.ok;
}

void *lt_handle_new(void) {
    void *h = NULL;
    return lt_available() && lt.Create(&h) == 0 ? h : NULL;
}

/* ----- descriptors ----- */

static bool set_batch(void *layout, const lt_shape *s, int64_t stride) {
    int32_t count = (int32_t)s->batch;
    return s->batch <= 1 || (lt.LayoutSetAttribute(layout, LT_LAYOUT_BATCH_COUNT, &count, sizeof count) == 0 &&
                             lt.LayoutSetAttribute(layout, LT_LAYOUT_BATCH_STRIDE, &stride, sizeof stride) == 0);
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B. */
static bool describe(lt_product *p, const lt_shape *s) {
    int type = s->bf16 ? LT_R_16BF : LT_R_32F, compute = s->tf32 ? LT_COMPUTE_32F_FAST_TF32 : LT_COMPUTE_32F;
    int32_t ta = s->tb, tb = s->ta;
    int64_t c_stride = s->M * s->N;
    return lt.DescCreate(&p->desc, compute, LT_R_32F) == 0 &&
           lt.DescSetAttribute(p->desc, LT_DESC_TRANSA, &ta, sizeof ta) == 0 &&
           lt.DescSetAttribute(p->desc, LT_DESC_TRANSB, &tb, sizeof tb) == 0 &&
           lt.LayoutCreate(&p->layout[0], type, (uint64_t)(s->tb ? s->K : s->N), (uint64_t)(s->tb ? s->N : s->K),
                           s->tb ? s->K : s->N) == 0 &&
           lt.LayoutCreate(&p->layout[1], type, (uint64_t)(s->ta ? s->M : s->K), (uint64_t)(s->ta ? s->K : s->M),
                           s->ta ? s->M : s->K) == 0 &&
           lt.LayoutCreate(&p->layout[2], s->c_bf16 ? LT_R_16BF : LT_R_32F, (uint64_t)s->N, (uint64_t)s->M, s->N) == 0 &&
           set_batch(p->layout[0], s, s->b_stride) && set_batch(p->layout[1], s, s->a_stride) &&
           set_batch(p->layout[2], s, c_stride);
}

void lt_product_free(lt_product *p) {
    if (p->desc) lt.DescDestroy(p->desc);
    for (int i = 0; i < 3; i++)
        if (p->layout[i]) lt.LayoutDestroy(p->layout[i]);
    memset(p, 0, sizeof *p);
}

int lt_run(const lt_product *p, const lt_device *d, const void *A, const void *B, void *C) {
    const float one = 1, zero = 0;
    return lt.Matmul(d->handle, p->desc, &one, B, p->layout[0], A, p->layout[1], &zero, C, p->layout[2], C, p->layout[2],
                     &p->algo, (void *)d->workspace, d->workspace_bytes, d->stream);
}

/* The heuristic's candidates for this shape, best guess first; how many (0: none). */
static int candidates(const lt_product *p, const lt_device *d, const lt_shape *s, lt_heuristic *out) {
    void *pref = NULL;
    uint64_t ws = d->workspace_bytes;
    int n = 0;
    bool ok = lt.PrefCreate(&pref) == 0 && lt.PrefSetAttribute(pref, LT_PREF_MAX_WORKSPACE, &ws, sizeof ws) == 0;
    for (int k = 0; k < 4 && ok; k++) {   /* A, B, C, D: what our addresses are aligned to */
        uint32_t a = s->align[k == 0 ? 1 : k == 1 ? 0 : 2];
        ok = lt.PrefSetAttribute(pref, LT_PREF_ALIGN_A + k, &a, sizeof a) == 0;
    }
    if (ok && lt.GetHeuristic(d->handle, p->desc, p->layout[0], p->layout[1], p->layout[2], p->layout[2], pref, LT_CANDIDATES,
                              out, &n) != 0)
        n = 0;
    if (pref) lt.PrefDestroy(pref);
    int kept = 0;
    for (int i = 0; i < n && ok; i++)
        if (out[i].state == 0 && out[i].workspace <= d->workspace_bytes) out[kept++] = out[i];
    return ok ? kept : 0;
}

/* Milliseconds per run of candidate `h`, +inf if it fails. The runs are captured into a graph
 * and replayed, as the step's graph runs them: run eagerly, a small product's time would be the
 * host's, cuBLASLt's few microseconds of setup per call. */
static double time_one(lt_product *p, const lt_device *d, const lt_heuristic *h, const void *A, const void *B, void *C) {
    CUevent ev[2] = { NULL, NULL };
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    float ms = INFINITY;
    p->algo = h->algo;
    bool ran = lt_run(p, d, A, B, C) == 0, ok = ran && cu.StreamBeginCapture(d->stream, CU_CAPTURE_THREAD_LOCAL) == 0;
    for (int r = 0; r < LT_TIMED_RUNS && ok; r++) ok = lt_run(p, d, A, B, C) == 0;
    if (ran) ok = cu.StreamEndCapture(d->stream, &graph) == 0 && ok;   /* ends a capture even when a run failed */
    ok = ok && cu.GraphInstantiate(&exec, graph, 0) == 0 && cu.EventCreate(&ev[0], 0) == 0 && cu.EventCreate(&ev[1], 0) == 0 &&
         cu.GraphLaunch(exec, d->stream) == 0 && cu.EventRecord(ev[0], d->stream) == 0 && cu.GraphLaunch(exec, d->stream) == 0 &&
         cu.EventRecord(ev[1], d->stream) == 0 && cu.EventSynchronize(ev[1]) == 0 && cu.EventElapsedTime(&ms, ev[0], ev[1]) == 0;
    for (int i = 0; i < 2; i++)
        if (ev[i]) cu.EventDestroy(ev[i]);
    if (exec) cu.GraphExecDestroy(exec);
    if (graph) cu.GraphDestroy(graph);
    return ok ? ms / LT_TIMED_RUNS : INFINITY;
}

static unsigned config(const lt_algo *a, int attr) {
    uint32_t v = 0;
    size_t written = 0;
    lt.ConfigGetAttribute(a, attr, &v, sizeof v, &written);
    return v;
}

static void report(const lt_shape *s, const lt_heuristic *h, const double *ms, int n, int best) {
    fprintf(stderr, "tensorgrad: product [%lld x %lld] x [%lld x %lld]%s%s x%lld %s%s:", (long long)s->M, (long long)s->K,
            (long long)s->K, (long long)s->N, s->ta ? " (A^T)" : "", s->tb ? " (B^T)" : "", (long long)s->batch,
            s->bf16 ? "bf16" : s->tf32 ? "tf32" : "f32", s->c_bf16 ? " to bf16" : "");
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %s%.4f (algo %u tile %u split %u)", i == best ? "*" : "", ms ? ms[i] : NAN,
                config(&h[i].algo, LT_CONFIG_ID), config(&h[i].algo, LT_CONFIG_TILE), config(&h[i].algo, LT_CONFIG_SPLITK));
    fprintf(stderr, " ms\n");
}

/* The candidate to keep: the fastest, but the heuristic's first when within 3% of it. */
static int choose(const double *ms, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (ms[i] < ms[best]) best = i;
    return ms[0] <= 1.03 * ms[best] ? 0 : best;
}

/* ----- remembered choices: this process's, and the kernel cache's ----- */

static bool memo_find(int device, const lt_shape *s, lt_product *p) {
    bool found = false;
    pthread_mutex_lock(&g_lt.mu);
    for (int i = 0; i < g_lt.n_memo && !found; i++)
        if (g_lt.memo[i].device == device && memcmp(&g_lt.memo[i].shape, s, sizeof *s) == 0) {
            p->algo = g_lt.memo[i].algo;
            p->workspace = g_lt.memo[i].workspace;
            found = true;
        }
    pthread_mutex_unlock(&g_lt.mu);
    return found;
}

static void memo_add(int device, const lt_shape *s, const lt_product *p) {
    pthread_mutex_lock(&g_lt.mu);
    if (g_lt.n_memo == g_lt.cap_memo) {   /* out of memory: not remembered, only chosen again */
        int cap = g_lt.cap_memo ? 2 * g_lt.cap_memo : 64;
        struct lt_memo *m = realloc(g_lt.memo, sizeof *m * (size_t)cap);
        if (m) {
            g_lt.memo = m;
            g_lt.cap_memo = cap;
        }
    }
    if (g_lt.n_memo < g_lt.cap_memo) g_lt.memo[g_lt.n_memo++] = (struct lt_memo){ device, *s, p->algo, p->workspace };
    pthread_mutex_unlock(&g_lt.mu);
}

/* The kernel cache's file for this shape on this device and cuBLASLt version; false if none. */
static bool cache_path(const lt_device *d, const lt_shape *s, char *path, size_t len) {
    char dir[900], key[300];
    tg_error ignore;
    if (!cache_dir(dir, sizeof dir, &ignore)) return false;
    snprintf(key, sizeof key, "cublasLt %zu %s", lt.GetVersion(), d->name);
    uint64_t h = cache_hash(cache_hash(1469598103934665603ull, key, strlen(key)), s, sizeof *s);
    snprintf(path, len, "%s/%016llx.lt", dir, (unsigned long long)h);
    return true;
}

static bool cached(lt_product *p, const lt_device *d, const char *path) {
    size_t len = 0;
    lt_algo *a = cache_read(path, &len);
    lt_heuristic check;
    bool ok = a && len == sizeof *a &&
              lt.AlgoCheck(d->handle, p->desc, p->layout[0], p->layout[1], p->layout[2], p->layout[2], a, &check) == 0 &&
              check.workspace <= d->workspace_bytes;
    if (ok) {
        p->algo = *a;
        p->workspace = check.workspace;
    }
    free(a);
    return ok;
}

/* ----- choosing ----- */

bool lt_product_init(lt_product *p, const lt_device *d, const lt_shape *s, const void *A, const void *B, void *C) {
    memset(p, 0, sizeof *p);
    if (!lt_available() || !d->handle || !describe(p, s)) goto fail;
    if (memo_find(d->ordinal, s, p)) return true;
    char path[1000];
    const char *tune = getenv("TG_CUDA_TUNE");
    bool timed = !(tune && tune[0] == '0'), verbose = tune && strcmp(tune, "verbose") == 0;
    bool on_disk = timed && cache_path(d, s, path, sizeof path);
    if (on_disk && cached(p, d, path)) {
        memo_add(d->ordinal, s, p);
        return true;
    }
    lt_heuristic h[LT_CANDIDATES];
    int n = candidates(p, d, s, h), best = 0;
    if (n == 0) goto fail;
    double ms[LT_CANDIDATES] = { 0 };
    for (int i = 0; i < n && timed && n > 1; i++) ms[i] = time_one(p, d, &h[i], A, B, C);
    if (timed && n > 1) best = choose(ms, n);
    if (timed && n > 1 && isinf(ms[best])) goto fail;   /* none ran */
    if (verbose) report(s, h, timed && n > 1 ? ms : NULL, n, best);
    p->algo = h[best].algo;
    p->workspace = h[best].workspace;
    if (timed) memo_add(d->ordinal, s, p);
    if (on_disk) {
        tg_error ignore;   /* a cache that cannot be written only costs time */
        cache_write(path, &p->algo, sizeof p->algo, &ignore);
    }
    return true;
fail:
    lt_product_free(p);
    return false;
}
