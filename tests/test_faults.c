/* Faults: a non-finite gradient behind a finite loss, an unusable kernel cache and allocation
 * failures. Each must come back as an error value naming the problem, change nothing it should
 * not, and leave the handle usable and destroyable (LeakSanitizer checks the frees under
 * `make sanitize`). Kernel compiler failures and a missing CUDA library are covered in
 * test_backend. */
#include "tensorgrad.h"
#include "internal.h"
#include "check.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }

/* ---------------------------------------------------------------------------------------------
 * Non-finite gradients. Parameters are declared b, W1, W2, S; the forward uses W2 before W1, so
 * "first in declaration order" differs from the trace order. With x = 0 in a row, sqrt(relu(0))
 * is 0 (finite loss) but its gradient is 0 * inf = NaN, which reaches W1 and W2 and not b.
 * S starts with a 0 element and enters as sum(sqrt(S)), whose gradient there is +inf.
 * ------------------------------------------------------------------------------------------- */
typedef struct { tg_param b, W1, W2, S; int use_s; } nf_model;

static tg_tensor nf_loss(const void *ctx, const tg_tensor *in) {
    const nf_model *m = ctx;
    tg_tensor x = in[0];
    tg_tensor two = tg_sum(tg_sqrt(tg_relu(tg_matmul(x, tg_p(m->W2)))), TG_ALL, 0);
    tg_tensor one = tg_sum(tg_sqrt(tg_relu(tg_matmul(x, tg_p(m->W1)))), TG_ALL, 0);
    tg_tensor loss = tg_add(tg_add(one, two), tg_sum(tg_square(tg_p(m->b)), TG_ALL, 0));
    return m->use_s ? tg_add(loss, tg_sum(tg_sqrt(tg_p(m->S)), TG_ALL, 0)) : loss;
}

static const float W_INIT[6] = { 0.5f, 0.25f, 0.75f, 1.0f, 0.125f, 0.5f };
static const float S_INIT[3] = { 1.0f, 0.0f, 4.0f };

static tg_model *nf_new(nf_model *nm, int use_s) {
    static const float b0[2] = { 0.5f, -0.5f };
    tg_model *m = tg_model_new(7);
    nm->b = tg_param_new(m, "head.b", TG_SHAPE(2), tg_init_literal(b0, 2));
    nm->W1 = tg_param_new(m, "l1.W", TG_SHAPE(3, 2), tg_init_literal(W_INIT, 6));
    nm->W2 = tg_param_new(m, "l2.W", TG_SHAPE(3, 2), tg_init_literal(W_INIT, 6));
    nm->S = tg_param_new(m, "scale", TG_SHAPE(3), tg_init_literal(use_s ? S_INIT : W_INIT, 3));
    nm->use_s = use_s;
    return m;
}

static tg_train *nf_compile(tg_model *m, nf_model *nm, const char *backend, tg_optimizer opt) {
    tg_error err = { "" };
    const tg_input_decl in[] = { TG_F32("x", 4, 3) };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = nf_loss, .ctx = nm, .inputs = in, .n_inputs = 1,
                                              .optimizer = opt, .backend = backend }, &err);
    CHECK(t != NULL, "%s: compile: %s", backend, err.msg);
    return t;
}

/* Every parameter and optimizer state value and the step count, as tg_save writes them. */
static unsigned char *snapshot(tg_train *t, const char *path, long *len) {
    tg_error err = { "" };
    *len = 0;
    if (tg_save(t, path, 1, &err) != TG_OK) { CHECK(0, "tg_save: %s", err.msg); return NULL; }
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
        data = malloc((size_t)*len);
        if (data && fread(data, 1, (size_t)*len, f) != (size_t)*len) { free(data); data = NULL; }
    }
    if (f) fclose(f);
    remove(path);
    CHECK(data != NULL, "reading back %s", path);
    return data;
}

static float X_GOOD[12], X_ZERO_ROW[12];

static void nonfinite_case(const char *backend, const char *opt_name, tg_optimizer opt, int use_s, const char *want_param,
                           const char *want_kind) {
    char label[96], path[128];
    snprintf(label, sizeof label, "%s/%s/%s", backend, opt_name, use_s ? "inf" : "nan");
    snprintf(path, sizeof path, "/tmp/tg_test_faults_%d.safetensors", (int)getpid());
    nf_model nm;
    tg_model *m = nf_new(&nm, use_s);
    tg_train *t = nf_compile(m, &nm, backend, opt), *fresh = nf_compile(m, &nm, backend, opt);
    if (!t || !fresh) { tg_destroy(t); tg_destroy(fresh); tg_model_free(m); return; }
    if (getenv("TG_CUDA_CHECK_PIECE")) {
        const char *src = tg_train_kernel_source(t);
        CHECK(src && strstr(src, "void kcheck0("), "%s: TG_CUDA_CHECK_PIECE=1 checks gradients in pieces", label);
    }
    const float *bad_x = use_s ? X_GOOD : X_ZERO_ROW;
    tg_data good[1] = { tg_f32("x", X_GOOD, 12) }, bad[1] = { tg_f32("x", bad_x, 12) };
    /* Two good steps first, so the optimizer state is not all zeros. (With S holding a 0 no step
     * is good: the first one is the bad one.) */
    for (int i = 0; i < (use_s ? 0 : 2); i++) {
        tg_result a = tg_step(t, good, 1), b = tg_step(fresh, good, 1);
        CHECK(a.status == TG_OK && b.status == TG_OK, "%s: good step %d: %s", label, i + 1, a.error);
    }
    long n_before, n_after;
    unsigned char *before = snapshot(t, path, &n_before);
    tg_result r = tg_step(t, bad, 1);
    unsigned char *after = snapshot(t, path, &n_after);
    if (getenv("TG_VERBOSE")) printf("%-24s %s\n", label, r.error);
    CHECK(r.status == TG_FAILED, "%s: the step with a non-finite gradient succeeded (loss %g)", label, r.loss);
    CHECK(has(r.error, want_param) && has(r.error, want_kind), "%s: message \"%s\" should name '%s' and %s", label,
          r.error, want_param, want_kind);
    CHECK(!has(r.error, "head.b"), "%s: message names the finite gradient of head.b: \"%s\"", label, r.error);
    CHECK(has(r.error, "unchanged"), "%s: message \"%s\"", label, r.error);
    CHECK(before && after && n_before == n_after && memcmp(before, after, (size_t)n_before) == 0,
          "%s: parameters or optimizer state changed by the failed step", label);
    CHECK(tg_train_step_count(t) == (use_s ? 0 : 2), "%s: step count %lld", label, (long long)tg_train_step_count(t));
    free(before);
    free(after);
    /* The handle goes on as if the failed step had never been asked for. */
    if (!use_s) {
        tg_result a = tg_step(t, good, 1), b = tg_step(fresh, good, 1);
        CHECK(a.status == TG_OK && b.status == TG_OK && a.loss == b.loss && a.step == 3,
              "%s: step after the failure: %s (loss %.9g vs fresh %.9g)", label, a.error, a.loss, b.loss);
        float pa[6], pb[6];
        CHECK(tg_download_param(t, "l1.W", pa, 6, NULL) == TG_OK && tg_download_param(fresh, "l1.W", pb, 6, NULL) == TG_OK &&
              memcmp(pa, pb, sizeof pa) == 0, "%s: l1.W differs from an unbroken run", label);
    }
    tg_destroy(t);
    tg_destroy(fresh);
    tg_model_free(m);
}

static void test_nonfinite_gradients(void) {
    for (int i = 0; i < 12; i++) X_GOOD[i] = X_ZERO_ROW[i] = (float)check_uniform(0.5, 1.5);
    for (int j = 0; j < 3; j++) X_ZERO_ROW[6 + j] = 0;   /* row 2: pre-activations exactly 0 */
    tg_optimizer sgd = tg_sgd(0.05, 0.9, 0, 0), clipped = tg_adamw(0.01, 0.1);
    clipped.clip_norm = 1.0;
    const char *backends[] = { "reference", "cpu", "cuda", "cuda" };
    int n_backends = tg_backend_available("cuda", NULL, 0) ? 4 : 2;   /* CUDA where a GPU is */
    for (int b = 0; b < n_backends; b++) {
        /* the second time on CUDA, each gradient checked in a piece of its own as soon as it is
         * computed (cuda_codegen.c's grad_check_piece), the NaN found there */
        if (b == 3) setenv("TG_CUDA_CHECK_PIECE", "1", 1);
        nonfinite_case(backends[b], "adam", tg_adam(0.01), 0, "'l1.W'", "NaN");
        nonfinite_case(backends[b], "sgd", sgd, 0, "'l1.W'", "NaN");
        nonfinite_case(backends[b], "adamw-clip", clipped, 0, "'l1.W'", "NaN");
        nonfinite_case(backends[b], "adam", tg_adam(0.01), 1, "'scale'", "infinite");
    }
    unsetenv("TG_CUDA_CHECK_PIECE");
}

/* ---------------------------------------------------------------------------------------------
 * Allocation failures. tg__fail_allocs(n, k) lets n allocations through and fails the k after
 * them (k < 0: all later ones); sweeping n over a whole sequence (model, compile, step, attach,
 * run, download, save, export, destroy) fails each allocation of it in turn, once alone (the calls
 * after it must work again) and once for good (every cleanup path runs short of memory). Every
 * call must succeed or fail with a message that says memory ran out, a failed step must leave
 * the parameters as they were, and everything must still be freed (LeakSanitizer checks that
 * under `make sanitize`).
 * ------------------------------------------------------------------------------------------- */
typedef struct { tg_linear l1, l2; } oom_model;

static tg_tensor oom_loss(const void *ctx, const tg_tensor *in) {
    const oom_model *m = ctx;
    return tg_cross_entropy(tg_linear(&m->l2, tg_relu(tg_linear(&m->l1, in[0]))), in[1], TG_MEAN);
}

static tg_tensor oom_forward(const void *ctx, const tg_tensor *in) {
    const oom_model *m = ctx;
    return tg_softmax(tg_linear(&m->l2, tg_relu(tg_linear(&m->l1, in[0]))), -1);
}

typedef struct { int calls, failures, bad_messages; char first_bad[TG_ERROR_LEN]; } oom_tally;

/* A call's outcome: success, or a failure whose message mentions memory. */
static void tally(oom_tally *t, bool ok, const char *msg) {
    t->calls++;
    if (ok) return;
    t->failures++;
    if (getenv("TG_VERBOSE")) printf("  %s\n", msg ? msg : "(none)");
    if (!has(msg, "memory")) {
        if (!t->bad_messages++) snprintf(t->first_bad, sizeof t->first_bad, "%s", msg ? msg : "(none)");
    }
}

/* The sequence; returns whether every call succeeded. */
static bool oom_sequence(const char *backend, oom_tally *t) {
    static float x[4 * 6];
    static const int32_t y[4] = { 0, 2, 1, 2 };
    for (int i = 0; i < 24; i++) x[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
    tg_model *m = tg_model_new(9);
    tally(t, m != NULL, "tg_model_new gave NULL: out of memory");
    if (!m) return false;
    oom_model om = { tg_linear_new(m, "l1", 6, 8, NULL), tg_linear_new(m, "l2", 8, 3, NULL) };
    tg_error err = { "" };
    const tg_input_decl in[] = { TG_F32("x", 4, 6), TG_I32("y", 4) };
    tg_train *tr = tg_compile(&(tg_train_spec){ .model = m, .loss = oom_loss, .ctx = &om, .inputs = in, .n_inputs = 2,
                                               .optimizer = tg_adamw(0.01, 0.01), .backend = backend }, &err);
    tally(t, tr != NULL, err.msg);
    bool all = tr != NULL;
    if (tr) {
        float before[48], after[48];
        bool have = tg_download_param(tr, "l1.W", before, 48, &err) == TG_OK;
        tally(t, have, err.msg);
        tg_result r = tg_step(tr, (tg_data[]){ tg_f32("x", x, 24), tg_i32("y", y, 4) }, 2);
        tally(t, r.status == TG_OK, r.error);
        if (r.status != TG_OK && have && tg_download_param(tr, "l1.W", after, 48, NULL) == TG_OK)
            CHECK(memcmp(before, after, sizeof before) == 0, "%s: a step that ran out of memory changed l1.W", backend);
        tg_forward *f = tg_attach(tr, &(tg_forward_spec){ .forward = oom_forward, .ctx = &om, .inputs = in, .n_inputs = 1 }, &err);
        tally(t, f != NULL, err.msg);
        if (f) {
            r = tg_run(f, (tg_data[]){ tg_f32("x", x, 24) }, 1);
            tally(t, r.status == TG_OK, r.error);
            all &= r.status == TG_OK;
        }
        char path[64];
        snprintf(path, sizeof path, "/tmp/tg_faults_oom_%d.safetensors", (int)getpid());
        tg_status st = tg_save(tr, path, 1, &err);
        tally(t, st == TG_OK, err.msg);
        remove(path);
        tg_status ex = TG_FAILED;
        if (f) {   /* the forward as a C file with external weights, written to a safetensors file */
            char c_path[64];
            snprintf(c_path, sizeof c_path, "/tmp/tg_faults_oom_%d.c", (int)getpid());
            ex = tg_export_c(f, c_path, &(tg_export_opts){ .external_weights = 1, .weights_path = path }, &err);
            tally(t, ex == TG_OK, err.msg);
            remove(c_path);
            remove(path);
        }
        all &= have && r.status == TG_OK && f && st == TG_OK && ex == TG_OK;
        tg_destroy(tr);
    }
    tg_model_free(m);
    return all;
}

static void oom_sweep(const char *backend, long fail_count) {
    /* The allocations of one clean run size the sweep. */
    oom_tally clean = { 0 };
    long n0 = tg__alloc_count();
    bool ok = oom_sequence(backend, &clean);
    long total = tg__alloc_count() - n0;
    CHECK(ok && clean.failures == 0, "%s: the sequence fails without fault injection", backend);
    oom_tally t = { 0 };
    int sequences = 0, failed_sequences = 0;
    for (long n = 0; n <= total; n++) {
        tg__fail_allocs(n, fail_count);
        int before = t.failures;
        oom_sequence(backend, &t);
        tg__fail_allocs(-1, 0);
        sequences++;
        failed_sequences += t.failures > before;
    }
    printf("test_faults: %s: %ld allocations in the sequence; %d sequences with allocation n (n = 0..%ld) %s: "
           "%d calls failed, all with an out-of-memory message: %s; %d sequences absorbed the failure (a fallback)\n",
           backend, total, sequences, total, fail_count < 0 ? "and all after it failing" : "alone failing", t.failures,
           t.bad_messages ? "NO" : "yes", sequences - 1 - failed_sequences);
    CHECK(t.bad_messages == 0, "%s: %d failures without an out-of-memory message, the first: \"%s\"", backend, t.bad_messages,
          t.first_bad);
    /* Every injected failure but the last (n = total: nothing left to fail) made some call fail
     * when memory stays short; a single failure may be absorbed by a fallback (a plainer
     * schedule, a strided read) that needs no memory. */
    if (fail_count < 0)
        CHECK(failed_sequences >= sequences - 1, "%s: %d of %d sequences saw no failure", backend,
              sequences - failed_sequences, sequences);
    /* And afterwards everything works again. */
    oom_tally after = { 0 };
    CHECK(oom_sequence(backend, &after) && after.failures == 0, "%s: the sequence after the sweep failed", backend);
}

/* ---------------------------------------------------------------------------------------------
 * The kernel cache and the disk. A cache directory that cannot hold files (not a directory, not
 * writable, a read-only file system) is not an error: the CPU backend builds its kernels in a
 * private temporary directory and removes it once they are loaded. A disk that is full
 * everywhere (simulated with RLIMIT_FSIZE: every write past a few bytes fails with EFBIG) is:
 * tg_compile fails with a message that says so, and tg_save fails leaving the previous
 * checkpoint intact.
 * ------------------------------------------------------------------------------------------- */
static int temp_dirs(void) {   /* private build directories left in /tmp */
    FILE *f = popen("ls -d /tmp/tensorgrad-?????? 2>/dev/null | wc -l", "r");
    int n = -1;
    if (f && fscanf(f, "%d", &n) != 1) n = -1;
    if (f) pclose(f);
    return n;
}

static tg_train *cache_compile(tg_model *m, nf_model *nm, tg_error *err) {
    const tg_input_decl in[] = { TG_F32("x", 4, 3) };
    /* Flags no other test uses: a cache miss, so the kernels are built here and now. */
    setenv("TG_CFLAGS", "-O1 -DTG_TEST_FAULTS_CACHE", 1);
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = nf_loss, .ctx = nm, .inputs = in, .n_inputs = 1,
                                              .optimizer = tg_adam(0.01), .backend = "cpu" }, err);
    unsetenv("TG_CFLAGS");
    return t;
}

static void test_cache_faults(void) {
    char dir[] = "/tmp/tg_test_faults_XXXXXX", path[200];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    const char *saved = getenv("TG_CACHE_DIR");
    char saved_copy[1000] = "";
    if (saved) snprintf(saved_copy, sizeof saved_copy, "%s", saved);
    nf_model nm;
    tg_model *m = nf_new(&nm, 0);
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    char under_file[220], readonly[220];
    snprintf(under_file, sizeof under_file, "%s/file/cache", dir);
    snprintf(readonly, sizeof readonly, "%s/ro", dir);
    mkdir(readonly, 0555);
    /* /proc/self refuses new files even to root; a 0555 directory only to other users. */
    const char *caches[] = { under_file, "/proc/self", readonly };
    const char *labels[] = { "a cache path under a regular file", "a cache in /proc/self", "a read-only cache directory" };
    int before = temp_dirs();
    for (int k = 0; k < (geteuid() == 0 ? 2 : 3); k++) {
        setenv("TG_CACHE_DIR", caches[k], 1);
        tg_error err = { "" };
        tg_train *t = cache_compile(m, &nm, &err);
        CHECK(t != NULL, "%s: compile failed instead of falling back: %s", labels[k], err.msg);
        if (t) {
            tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", X_GOOD, 12) }, 1);
            CHECK(r.status == TG_OK, "%s: step: %s", labels[k], r.error);
        }
        tg_destroy(t);
    }
    CHECK(temp_dirs() == before, "the private build directories were not removed (%d, was %d)", temp_dirs(), before);

    /* A full disk: writes past 16 bytes fail with EFBIG (SIGXFSZ ignored), for this process and
     * the compiler it runs. */
    setenv("TG_CACHE_DIR", dir, 1);
    tg_train *t = nf_compile(m, &nm, "reference", tg_adam(0.01));
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
    tg_error err = { "" };
    CHECK(t && tg_save(t, path, 1, &err) == TG_OK, "save before the disk fills: %s", err.msg);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 16;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        tg_train *c = cache_compile(m, &nm, &err);
        CHECK(c == NULL, "compile with a full disk succeeded");
        CHECK(has(err.msg, "too large") || has(err.msg, "space"), "compile with a full disk: \"%s\"", err.msg);
        if (getenv("TG_VERBOSE")) printf("full disk, compile: %s\n", err.msg);
        tg_destroy(c);
        tg_result r = t ? tg_step(t, (tg_data[]){ tg_f32("x", X_GOOD, 12) }, 1) : (tg_result){ 0 };
        tg_status st = t ? tg_save(t, path, 1, &err) : TG_FAILED;
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(st == TG_FAILED && has(err.msg, path) && has(err.msg, "too large"), "save with a full disk: \"%s\"", err.msg);
        if (getenv("TG_VERBOSE")) printf("full disk, save: %s\n", err.msg);
        CHECK(r.status == TG_OK, "a step needs no disk: %s", r.error);
        /* The checkpoint written before is whole: it loads. */
        CHECK(t && tg_load(t, path, 1, &err) == TG_OK, "the earlier checkpoint after a failed save: %s", err.msg);
    } else {
        CHECK(0, "setrlimit(RLIMIT_FSIZE): %s", strerror(errno));
    }
    signal(SIGXFSZ, old_handler);
    CHECK(temp_dirs() == before, "a failed build left a private directory behind");
    /* With room again, the CPU backend builds as usual. */
    tg_train *c = cache_compile(m, &nm, &err);
    CHECK(c != NULL, "compile after the disk has room again: %s", err.msg);
    tg_destroy(c);
    tg_destroy(t);
    tg_model_free(m);
    if (saved) setenv("TG_CACHE_DIR", saved_copy, 1);
    else unsetenv("TG_CACHE_DIR");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* A CPU kernel that finds no scratch memory in the middle of a step (a convolution's input
 * gradient: its product goes through per-thread scratch, then col2im): the step fails with a
 * message, the in-place optimizer updates are skipped, and the next step works. Runs first, so
 * that this process's threads have no scratch yet. */
typedef struct { tg_conv2d_layer c1, c2; } conv_net;
static tg_tensor conv_loss(const void *ctx, const tg_tensor *in) {
    const conv_net *n = ctx;
    return tg_mean(tg_square(tg_conv(&n->c2, tg_relu(tg_conv(&n->c1, in[0])))), TG_ALL, 0);
}

static void test_kernel_scratch(void) {
    conv_net n;
    tg_model *m = tg_model_new(5);
    n.c1 = tg_conv2d_new(m, "c1", 3, 8, 3, 1, 1, 1);
    n.c2 = tg_conv2d_new(m, "c2", 8, 8, 3, 1, 1, 1);
    tg_error err = { "" };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = conv_loss, .ctx = &n, .inputs = (tg_input_decl[]){ TG_F32("x", 4, 3, 16, 16) },
                                              .n_inputs = 1, .optimizer = tg_adam(0.01), .backend = "cpu" }, &err);
    CHECK(t != NULL, "conv compile: %s", err.msg);
    if (!t) { tg_model_free(m); return; }
    static float x[4 * 3 * 16 * 16];
    for (int i = 0; i < 4 * 3 * 16 * 16; i++) x[i] = (float)((i * 7919) % 200) / 100.0f - 1.0f;
    long len_before, len_after;
    unsigned char *before = snapshot(t, "/tmp/tg_faults_scratch_a.safetensors", &len_before);
    tg__fail_allocs(0, -1);   /* every allocation from here fails */
    tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, 4 * 3 * 16 * 16) }, 1);
    tg__fail_allocs(-1, 0);
    unsigned char *after = snapshot(t, "/tmp/tg_faults_scratch_b.safetensors", &len_after);
    CHECK(r.status == TG_FAILED && has(r.error, "scratch"), "step without kernel scratch: %s", r.error);
    CHECK(before && after && len_before == len_after && memcmp(before, after, (size_t)len_before) == 0,
          "parameters and optimizer state unchanged by the failed step");
    r = tg_step(t, (tg_data[]){ tg_f32("x", x, 4 * 3 * 16 * 16) }, 1);
    CHECK(r.status == TG_OK && r.step == 1, "the next step works: %s", r.error);
    free(before);
    free(after);
    tg_destroy(t);
    tg_model_free(m);
}

int main(void) {
    test_kernel_scratch();
    test_nonfinite_gradients();
    test_cache_faults();
    oom_sweep("reference", 1);
    oom_sweep("reference", -1);
    oom_sweep("cpu", 1);
    oom_sweep("cpu", -1);
    return check_report("test_faults");
}
