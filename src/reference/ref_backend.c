/* The reference interpreter seen through the backend table: its buffers are arrays of doubles,
 * and the f32 variant rounds every f32 result to float. */
#include "reference/reference.h"
#include "runtime/backend.h"

#include <stdlib.h>
#include <string.h>

static void *ref_alloc(size_t numel) { return numel > SIZE_MAX / sizeof(double) ? NULL : tg_alloc(numel * sizeof(double)); }
static void ref_free(void *buf) { free(buf); }
static void ref_write(void *buf, tg_dtype dt, const double *src, size_t n) { memcpy(buf, src, n * sizeof(double)); }
static void ref_read(const void *buf, tg_dtype dt, double *dst, size_t n) { memcpy(dst, buf, n * sizeof(double)); }
static void ref_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n * sizeof(double)); }

static void ref_upload(void *buf, tg_dtype dt, const void *src, size_t n) {
    double *d = buf;
    if (dt == TG_FLOAT32)
        for (size_t i = 0; i < n; i++) d[i] = ((const float *)src)[i];
    else
        for (size_t i = 0; i < n; i++) d[i] = ((const int32_t *)src)[i];
}

/* The interpreter gives every node memory: it fuses nothing. */
typedef struct { ref_exec *exec; size_t arena; } ref_handle;

static void *prepare(const tg_graph *g, const int *keep, int n_keep, bool round_f32, tg_error *err) {
    tg_plan plan;
    if (!plan_build(g, keep, n_keep, NULL, NULL, NULL, NULL, NULL, &plan)) {
        tg_seterr(err, "cannot plan the buffers of %d nodes: out of memory, or past 2^60 elements", g->n);
        return NULL;
    }
    ref_handle *h = tg_alloc(sizeof *h);
    if (h) h->exec = ref_exec_new(g, &plan, round_f32);
    if (!h || !h->exec) {
        tg_seterr(err, "out of memory for the interpreter's arena (%zu values)", plan.arena);
        free(h);
        h = NULL;
    } else {
        h->arena = plan.arena;
    }
    plan_free(&plan);
    return h;
}
static void *ref_prepare_f32(const tg_graph *g, const int *keep, int n_keep, tg_error *err) { return prepare(g, keep, n_keep, true, err); }
static void *ref_prepare_f64(const tg_graph *g, const int *keep, int n_keep, tg_error *err) { return prepare(g, keep, n_keep, false, err); }
static size_t ref_planned_bytes(void *h) { return ((ref_handle *)h)->arena * sizeof(float); }
static void ref_bind(void *h, int node, void *buf) { ref_exec_bind(((ref_handle *)h)->exec, node, buf); }
static bool ref_run(void *h, const double *hyper, tg_error *err) { ref_exec_run(((ref_handle *)h)->exec, hyper); return true; }
static void *ref_node_buf(void *h, int node) { return ref_exec_value(((ref_handle *)h)->exec, node); }
static void ref_release(void *h) {
    ref_exec_free(((ref_handle *)h)->exec);
    free(h);
}

/* Every precision, emulated: products and attention round their operands as the hardware would. */
static tg_precision ref_precision(tg_precision want) { return want; }

#define REFERENCE_TABLE(NAME, PREPARE)                                                                              \
    { .name = NAME, .alloc = ref_alloc, .free = ref_free, .write = ref_write, .upload = ref_upload, .read = ref_read, \
      .copy = ref_copy, .prepare = PREPARE, .planned_bytes = ref_planned_bytes, .bind = ref_bind, .run = ref_run,   \
      .node_buf = ref_node_buf, .release = ref_release, .precision = ref_precision }
const tg_backend backend_reference = REFERENCE_TABLE("reference", ref_prepare_f32);
const tg_backend backend_reference_f64 = REFERENCE_TABLE("reference-f64", ref_prepare_f64);
