/* Data-parallel training (tg_train_spec.devices and .dist), everything that runs without a GPU:
 *  - the job's settings from the spec and the environment, and every error they can raise;
 *  - replicas in one process on the reference and cpu backends (the host backends' "devices"):
 *    a job of one replica trains exactly as a plain handle; two and four replicas give the loss
 *    of one replica at the whole batch within f32 reduction-order noise, and their parameters
 *    are identical after every step; the averaged gradient, clipping and the non-finite guard,
 *    uneven splits, checkpoints moving between replica counts, eval, forwards;
 *  - the TCP rendezvous and per-step sum between forked processes over the loopback: the id
 *    handed out, timeouts, mismatched jobs, a dead or hung peer, a peer that fails its share;
 *  - whole training runs of 2 processes (and 2 processes x 2 replicas), and a rank that dies
 *    mid-run making the other fail its step within the timeout;
 *  - NCCL loaded with dlopen where it is installed (its id, NCCL_NVLS_ENABLE), and the messages
 *    when it or a GPU is missing; the split graphs compiled by NVRTC (cuda-nvrtc) where NVRTC is.
 * The bound for "the same loss": |a - b| <= 2e-5 * max(1, |a|) per step over 8 Adam steps (the
 * observed difference is a few f32 ulps, 1e-7 relative; the same bound holds the parameters). */
#include "check.h"
#include "tensorgrad.h"
#include "dist/dist.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOISE 2e-5
#define STEPS 8
#define IN 5
#define CLASSES 3

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ----- the model ----- */

typedef struct { tg_linear l1, l2; tg_layernorm ln; } net;

static tg_tensor loss_fn(const void *ctx, const tg_tensor *in) {
    const net *n = ctx;
    tg_tensor h = tg_layernorm(&n->ln, tg_gelu(tg_linear(&n->l1, in[0])));
    return tg_cross_entropy(tg_linear(&n->l2, h), in[1], TG_MEAN);
}

static tg_tensor logits_fn(const void *ctx, const tg_tensor *in) {
    const net *n = ctx;
    return tg_linear(&n->l2, tg_layernorm(&n->ln, tg_gelu(tg_linear(&n->l1, in[0]))));
}

static tg_model *new_model(net *n) {
    tg_model *m = tg_model_new(7);
    n->l1 = tg_linear_new(m, "l1", IN, 6, NULL);
    n->ln = tg_layernorm_new(m, "ln", 6, 1e-5, 1);
    n->l2 = tg_linear_new(m, "l2", 6, CLASSES, NULL);
    return m;
}

static const char *const PARAMS[] = { "l1.W", "l1.b", "ln.g", "ln.b", "l2.W", "l2.b" };
static const int PARAM_N[] = { IN * 6, 6, 6, 6, 6 * CLASSES, CLASSES };
#define N_PARAMS 6
#define PARAM_TOTAL (IN * 6 + 6 + 6 + 6 + 6 * CLASSES + CLASSES)

typedef struct {
    const char *backend;
    int batch;                 /* declared first dimension */
    int n_dev;                 /* 0: no devices list */
    const tg_dist_spec *dist;
    double clip;
} setup;

static tg_train *make(net *n, tg_model *m, setup s, tg_error *err) {
    static const int devs[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    tg_optimizer opt = tg_adamw(2e-2, 0.05);
    opt.clip_norm = s.clip;
    return tg_compile(&(tg_train_spec){ .model = m, .loss = loss_fn, .ctx = n, .optimizer = opt,
                                        .backend = s.backend ? s.backend : "reference",
                                        .inputs = (tg_input_decl[]){ TG_F32("x", s.batch, IN), TG_I32("y", s.batch) },
                                        .n_inputs = 2, .devices = s.n_dev ? devs : NULL, .n_devices = s.n_dev,
                                        .dist = s.dist }, err);
}

/* The whole batch of step `step` (global rows; a process takes its rows from it). */
static void batch_of(int step, int rows, float *x, int32_t *y) {
    check_rng = 500 + (uint64_t)step;
    for (int i = 0; i < rows * IN; i++) x[i] = (float)check_uniform(-2, 2);
    for (int i = 0; i < rows; i++) y[i] = (int32_t)(check_next() % CLASSES);
}

/* One step on rows [first, first + rows) of step `step`'s batch of `total` rows. */
static tg_result step_rows(tg_train *t, int step, int total, int first, int rows) {
    float x[64 * IN];
    int32_t y[64];
    batch_of(step, total, x, y);
    return tg_step(t, (tg_data[]){ tg_f32("x", x + first * IN, (size_t)(rows * IN)), tg_i32("y", y + first, (size_t)rows) }, 2);
}

static void params_of(tg_train *t, float *out) {
    tg_error err;
    for (int k = 0, at = 0; k < N_PARAMS; at += PARAM_N[k], k++)
        CHECK(tg_download_param(t, PARAMS[k], out + at, (size_t)PARAM_N[k], &err) == TG_OK, "download %s: %s", PARAMS[k], err.msg);
}

static double max_rel_diff(const float *a, const float *b, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double m = fabs(a[i]) > 1 ? fabs(a[i]) : 1, d = fabs((double)a[i] - b[i]) / m;
        if (!(d <= worst)) worst = d;   /* NaN is the worst */
    }
    return worst;
}

/* Every local replica holds replica 0's parameters, bit for bit. */
static bool replicas_equal(tg_train *t, int n_rep) {
    bool same = true;
    tg_error err;
    for (int k = 0; k < N_PARAMS; k++) {
        float a[64], b[64];
        dist_replica_param(t, 0, PARAMS[k], a, (size_t)PARAM_N[k], &err);
        for (int r = 1; r < n_rep; r++) {
            CHECK(dist_replica_param(t, r, PARAMS[k], b, (size_t)PARAM_N[k], &err) == TG_OK, "replica %d: %s", r, err.msg);
            same &= memcmp(a, b, sizeof(float) * (size_t)PARAM_N[k]) == 0;
        }
    }
    return same;
}

/* ----- settings and their errors ----- */

static void expect_error(setup s, const char *want, const char *what) {
    net n;
    tg_model *m = new_model(&n);
    tg_error err = { { 0 } };
    tg_train *t = make(&n, m, s, &err);
    CHECK(!t && strstr(err.msg, want), "%s: wanted an error with '%s', got: %s", what, want, t ? "(compiled)" : err.msg);
    tg_destroy(t);
    tg_model_free(m);
}

static void settings_errors(void) {
    static const int dup[] = { 1, 1 }, neg[] = { -1 };
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    tg_train_spec base = { .model = m, .loss = loss_fn, .ctx = &n, .optimizer = tg_adam(1e-2), .backend = "reference",
                           .inputs = (tg_input_decl[]){ TG_F32("x", 4, IN), TG_I32("y", 4) }, .n_inputs = 2 };
    tg_train_spec s = base;
    s.devices = dup, s.n_devices = 2;
    CHECK(!tg_compile(&s, &err) && strstr(err.msg, "device 1 is listed twice"), "duplicate device: %s", err.msg);
    s.devices = neg, s.n_devices = 1;
    CHECK(!tg_compile(&s, &err) && strstr(err.msg, "negative"), "negative ordinal: %s", err.msg);
    s.devices = NULL, s.n_devices = 2;
    CHECK(!tg_compile(&s, &err) && strstr(err.msg, "no list"), "count without a list: %s", err.msg);
    s.n_devices = 100, s.devices = dup;
    CHECK(!tg_compile(&s, &err) && strstr(err.msg, "at most"), "too many devices: %s", err.msg);
    tg_model_free(m);

    expect_error((setup){ .batch = 6, .n_dev = 4 }, "does not split evenly over 4 devices", "uneven split");
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ .world_size = 2, .rank = 2 } }, "rank 2 is outside a world of 2",
                 "rank past the world");
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ .world_size = -1 } }, "world_size -1", "negative world");
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ .world_size = 2, .rank = 0, .master_port = 70000 } },
                 "not a TCP port", "port out of range");
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ .world_size = 1, .timeout_s = -2 } }, "timeout",
                 "negative timeout");
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ .world_size = 1, .master_addr = "" } }, "master address",
                 "empty address");
    setenv("TG_RANK", "one", 1);
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ 0 } }, "TG_RANK='one' is not a whole number", "bad TG_RANK");
    unsetenv("TG_RANK");
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "2", 1);
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ 0 } }, "rank 3 is outside a world of 2",
                 "torchrun's names, inconsistent");
    setenv("TG_WORLD_SIZE", "0", 1);
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ 0 } }, "TG_WORLD_SIZE=0 is out of range", "TG_ before torchrun's");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("TG_WORLD_SIZE");
    setenv("TG_MASTER_PORT", "http", 1);
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ 0 } }, "TG_MASTER_PORT='http'", "bad port variable");
    unsetenv("TG_MASTER_PORT");
    /* Under torchrun its agent's store holds MASTER_PORT: our rendezvous takes the next port. */
    dist_settings ds;
    const tg_train_spec dspec = { .dist = &(tg_dist_spec){ 0 } };
    setenv("MASTER_PORT", "29600", 1);
    CHECK(dist_settings_resolve(&dspec, &ds, &err) && ds.port == 29600, "MASTER_PORT alone: that port (%d)", ds.port);
    setenv("TORCHELASTIC_RUN_ID", "none", 1);
    CHECK(dist_settings_resolve(&dspec, &ds, &err) && ds.port == 29601, "MASTER_PORT under torchrun: the next port (%d)", ds.port);
    setenv("TG_MASTER_PORT", "29700", 1);
    CHECK(dist_settings_resolve(&dspec, &ds, &err) && ds.port == 29700, "TG_MASTER_PORT as given, even under torchrun (%d)",
          ds.port);
    unsetenv("TG_MASTER_PORT");
    unsetenv("TORCHELASTIC_RUN_ID");
    unsetenv("MASTER_PORT");
    setenv("TG_DIST_TIMEOUT", "soon", 1);
    expect_error((setup){ .batch = 6, .dist = &(tg_dist_spec){ 0 } }, "timeout soon", "bad timeout variable");
    unsetenv("TG_DIST_TIMEOUT");

    /* Nothing set: a job of one process, the same data-parallel path. */
    net n2;
    tg_model *m2 = new_model(&n2);
    tg_train *t = make(&n2, m2, (setup){ .batch = 6, .dist = &(tg_dist_spec){ 0 } }, &err);
    CHECK(t && tg_train_rank(t) == 0 && tg_train_replicas(t) == 1, "a job of one from an empty environment: %s",
          t ? "" : err.msg);
    CHECK(t && tg_replace_model(t, m2, NULL, &err) == TG_FAILED && strstr(err.msg, "data-parallel"),
          "tg_replace_model is refused: %s", err.msg);
    tg_destroy(t);
    CHECK(tg_train_rank(t) == -1 && tg_train_replicas(t) == -1, "dead handle");
    tg_model_free(m2);
}

/* ----- replicas in one process ----- */

/* A plain handle and a data-parallel one with n_dev replicas, both at the whole batch: the same
 * losses within NOISE, every replica equal after every step, the same parameters at the end
 * (exactly, with one replica on the reference backend). */
static void versus_plain(const char *backend, int n_dev, double clip) {
    net a, b;
    tg_model *ma = new_model(&a), *mb = new_model(&b);
    tg_error err;
    tg_train *plain = make(&a, ma, (setup){ .backend = backend, .batch = 8, .clip = clip }, &err);
    tg_train *dp = make(&b, mb, (setup){ .backend = backend, .batch = 8, .n_dev = n_dev, .clip = clip }, &err);
    CHECK(plain && dp, "%s x%d: compile: %s", backend, n_dev, err.msg);
    if (!plain || !dp) goto done;
    CHECK(tg_train_replicas(dp) == n_dev && tg_train_rank(dp) == 0, "%s x%d: replicas %d", backend, n_dev, tg_train_replicas(dp));
    bool exact = n_dev == 1 && strcmp(backend, "reference") == 0;
    double worst = 0;
    int unequal = 0;
    for (int s = 0; s < STEPS; s++) {
        tg_result ra = step_rows(plain, s, 8, 0, 8), rb = step_rows(dp, s, 8, 0, 8);
        CHECK(ra.status == TG_OK && rb.status == TG_OK, "%s x%d step %d: %s %s", backend, n_dev, s, ra.error, rb.error);
        double d = fabs((double)ra.loss - rb.loss) / (fabs(ra.loss) > 1 ? fabs(ra.loss) : 1);
        if (!(d <= worst)) worst = d;
        if (exact) CHECK(ra.loss == rb.loss, "%s x1 step %d: %.9g vs %.9g (one replica is the plain handle)", backend, s, ra.loss, rb.loss);
        unequal += !replicas_equal(dp, n_dev);
        CHECK(rb.step == s + 1, "step count %lld", (long long)rb.step);
    }
    CHECK(worst <= NOISE, "%s x%d (clip %g): losses differ from one replica's at the whole batch by %.3g (bound %g)", backend,
          n_dev, clip, worst, NOISE);
    printf("test_dist: %s, %d replicas, clip %g: largest relative loss difference from one replica %.2g over %d steps\n", backend,
           n_dev, clip, worst, STEPS);
    CHECK(unequal == 0, "%s x%d: replicas differed after %d of %d steps", backend, n_dev, unequal, STEPS);
    /* no inputs: every replica steps on the rows of the last batch it still holds */
    tg_result ka = tg_step(plain, NULL, 0), kb = tg_step(dp, NULL, 0);
    CHECK(ka.status == TG_OK && kb.status == TG_OK && check_close(ka.loss, kb.loss, NOISE) && replicas_equal(dp, n_dev),
          "%s x%d: a step on the kept batch: %g vs %g %s", backend, n_dev, ka.loss, kb.loss, kb.error);
    float pa[PARAM_TOTAL], pb[PARAM_TOTAL];
    params_of(plain, pa);
    params_of(dp, pb);
    double pd = max_rel_diff(pa, pb, PARAM_TOTAL);
    CHECK(exact ? pd == 0 : pd <= NOISE, "%s x%d: parameters differ by %.3g", backend, n_dev, pd);
    /* The averaged gradient is the whole batch's. */
    float ga[IN * 6], gb[IN * 6];
    CHECK(tg_download_param_grad(plain, "l1.W", ga, IN * 6, &err) == TG_OK &&
              tg_download_param_grad(dp, "l1.W", gb, IN * 6, &err) == TG_OK, "gradients: %s", err.msg);
    CHECK(max_rel_diff(ga, gb, IN * 6) <= NOISE, "%s x%d: averaged gradient differs by %.3g", backend, n_dev,
          max_rel_diff(ga, gb, IN * 6));
    /* eval and an attached forward run on replica 0 at the declared shapes */
    float x[8 * IN];
    int32_t y[8];
    batch_of(99, 8, x, y);
    tg_data in[2] = { tg_f32("x", x, 8 * IN), tg_i32("y", y, 8) };
    tg_result ea = tg_eval_loss(plain, in, 2), eb = tg_eval_loss(dp, in, 2);
    CHECK(ea.status == TG_OK && eb.status == TG_OK && check_close(ea.loss, eb.loss, NOISE), "%s x%d eval: %g vs %g %s", backend,
          n_dev, ea.loss, eb.loss, eb.error);
    tg_forward *f = tg_attach(dp, &(tg_forward_spec){ .forward = logits_fn, .ctx = &b, .inputs = (tg_input_decl[]){ TG_F32("x", TG_ANY, IN) },
                                                      .n_inputs = 1 }, &err);
    tg_result fr = f ? tg_run(f, in, 1) : (tg_result){ 0 };
    CHECK(f && fr.status == TG_OK && fr.output_len == 8 * CLASSES, "%s x%d forward: %s", backend, n_dev, f ? fr.error : err.msg);
done:
    tg_destroy(plain);
    tg_destroy(dp);
    tg_model_free(ma);
    tg_model_free(mb);
}

/* Bad calls: counts in terms of the whole batch; a replica's share that goes non-finite fails the
 * step on every replica and changes nothing; the next good step trains. */
static void bad_steps(void) {
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    tg_train *t = make(&n, m, (setup){ .batch = 8, .n_dev = 2 }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    if (!t) { tg_model_free(m); return; }
    float x[8 * IN] = { 0 };
    int32_t y[8] = { 0 };
    tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, 4 * IN), tg_i32("y", y, 8) }, 2);
    CHECK(r.status == TG_FAILED && strstr(r.error, "expected 40 elements") && strstr(r.error, "[8,5]") && strstr(r.error, "got 20"),
          "short input: %s", r.error);
    r = tg_step(t, (tg_data[]){ tg_f32("x", x, 8 * IN) }, 1);
    CHECK(r.status == TG_FAILED && strstr(r.error, "missing input 'y'"), "missing input: %s", r.error);
    r = tg_step(t, (tg_data[]){ tg_f32("x", x, 8 * IN), tg_i32("z", y, 8) }, 2);
    CHECK(r.status == TG_FAILED && strstr(r.error, "unknown input 'z'"), "unknown input: %s", r.error);
    CHECK(step_rows(t, 0, 8, 0, 8).status == TG_OK, "a good step");
    float before[PARAM_TOTAL], after[PARAM_TOTAL];
    params_of(t, before);
    batch_of(1, 8, x, y);
    x[6 * IN + 2] = NAN;   /* a row of replica 1's share */
    r = tg_step(t, (tg_data[]){ tg_f32("x", x, 8 * IN), tg_i32("y", y, 8) }, 2);
    CHECK(r.status == TG_FAILED && strstr(r.error, "NaN") && strstr(r.error, "unchanged"), "NaN in one share: %s", r.error);
    params_of(t, after);
    CHECK(memcmp(before, after, sizeof before) == 0 && replicas_equal(t, 2), "a failed step changes no replica");
    CHECK(tg_train_step_count(t) == 1, "the failed step does not count");
    CHECK(step_rows(t, 2, 8, 0, 8).status == TG_OK && replicas_equal(t, 2), "training goes on after a bad step");
    /* uploads and resets reach every replica */
    float w[IN * 6];
    for (int i = 0; i < IN * 6; i++) w[i] = 0.01f * (float)i;
    CHECK(tg_upload_params(t, (tg_data[]){ tg_f32("l1.W", w, IN * 6) }, 1, &err) == TG_OK && replicas_equal(t, 2), "upload");
    CHECK(tg_reset(t, 1, 1) == TG_OK && replicas_equal(t, 2) && tg_train_step_count(t) == 0, "reset");
    tg_destroy(t);
    tg_model_free(m);
}

/* Checkpoints move between replica counts: saved from 2 replicas, resumed on 2 (the unbroken
 * run's losses exactly) and on 1 (within NOISE); saved from 1, resumed on 2 (within NOISE). */
static void checkpoints(const char *dir) {
    char path2[300], path1[300];
    snprintf(path2, sizeof path2, "%s/dp2.safetensors", dir);
    snprintf(path1, sizeof path1, "%s/dp1.safetensors", dir);
    enum { BEFORE = 3, AFTER = 4 };
    float unbroken2[AFTER], unbroken1[AFTER];
    tg_error err;
    for (int from = 1; from <= 2; from++) {
        net n;
        tg_model *m = new_model(&n);
        tg_train *t = make(&n, m, (setup){ .batch = 8, .n_dev = from == 2 ? 2 : 0 }, &err);
        for (int s = 0; t && s < BEFORE; s++) step_rows(t, s, 8, 0, 8);
        CHECK(t && tg_save(t, from == 2 ? path2 : path1, 1, &err) == TG_OK, "save from %d: %s", from, err.msg);
        for (int s = 0; t && s < AFTER; s++) (from == 2 ? unbroken2 : unbroken1)[s] = step_rows(t, BEFORE + s, 8, 0, 8).loss;
        tg_destroy(t);
        tg_model_free(m);
    }
    static const struct { int from, to; } moves[] = { { 2, 2 }, { 2, 1 }, { 1, 2 } };
    for (int k = 0; k < 3; k++) {
        net n;
        tg_model *m = new_model(&n);
        tg_train *t = make(&n, m, (setup){ .batch = 8, .n_dev = moves[k].to == 2 ? 2 : 0 }, &err);
        CHECK(t && tg_load(t, moves[k].from == 2 ? path2 : path1, 1, &err) == TG_OK, "load %d -> %d: %s", moves[k].from,
              moves[k].to, err.msg);
        if (t && moves[k].to == 2) CHECK(replicas_equal(t, 2), "a load reaches every replica");
        const float *want = moves[k].from == 2 ? unbroken2 : unbroken1;
        double worst = 0;
        int exact = 0;
        for (int s = 0; t && s < AFTER; s++) {
            float l = step_rows(t, BEFORE + s, 8, 0, 8).loss;
            double d = fabs((double)l - want[s]);
            if (!(d <= worst)) worst = d;
            exact += l == want[s];
        }
        if (moves[k].from == moves[k].to) CHECK(exact == AFTER, "2 -> 2: resumed losses equal the unbroken run's (%d of %d)", exact, AFTER);
        else CHECK(worst <= NOISE, "%d -> %d: resumed losses within %g of the unbroken run's (%.3g)", moves[k].from, moves[k].to, NOISE, worst);
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* The split graphs also compile for CUDA (NVRTC, sm_90) where NVRTC is installed. */
static void cuda_compile_only(void) {
    char why[TG_ERROR_LEN];
    if (!tg_backend_available("cuda-nvrtc", why, sizeof why)) {
        printf("test_dist: NVRTC not installed here, cuda-nvrtc part skipped (%s)\n", why);
        return;
    }
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    tg_train *t = make(&n, m, (setup){ .backend = "cuda-nvrtc", .batch = 8, .n_dev = 2, .clip = 1 }, &err);
    CHECK(t != NULL, "cuda-nvrtc, 2 replicas: the grad and update graphs compile: %s", err.msg);
    const char *update = t ? dist_update_source(t) : NULL;   /* reads the averaged gradients where they are */
    CHECK(update && strstr(update, "void kcheck(") && strstr(update, "= (float *)B["),
          "the update graph replaces parameters and state in place, after kcheck");
    tg_result r = t ? step_rows(t, 0, 8, 0, 8) : (tg_result){ 0 };
    CHECK(r.status == TG_FAILED && strstr(r.error, "runs nothing"), "cuda-nvrtc runs nothing: %s", r.error);
    tg_destroy(t);
    tg_model_free(m);
}

static long compile_allocs;   /* allocations tg_compile made in the last sequence */

/* Allocation failures anywhere in building, stepping and destroying a handle of 2 replicas: a
 * clean error that speaks of memory, never a crash or a leak (ASan runs this too). */
static int oom_sequence(const char **msg) {
    static char buf[TG_ERROR_LEN];
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    long a0 = tg__alloc_count();
    tg_train *t = m ? make(&n, m, (setup){ .batch = 8, .n_dev = 2 }, &err) : NULL;
    if (t) compile_allocs = tg__alloc_count() - a0;
    int failed = 0;
    if (!t) snprintf(buf, sizeof buf, "%s", m ? err.msg : "out of memory for the model"), failed = 1;
    for (int s = 0; t && s < 2 && !failed; s++) {
        tg_result r = step_rows(t, s, 8, 0, 8);
        if (r.status != TG_OK) snprintf(buf, sizeof buf, "%s", r.error), failed = 1;
    }
    tg_destroy(t);
    tg_model_free(m);
    *msg = buf;
    return failed;
}

static void allocation_failures(void) {
    const char *msg;
    long n0 = tg__alloc_count();
    CHECK(oom_sequence(&msg) == 0, "the sequence runs without failures: %s", msg);
    long total = tg__alloc_count() - n0;
    int failures = 0, bad = 0, absorbed_in_compile = 0;
    for (long k = 0; k <= total; k++) {
        tg__fail_allocs(k, -1);
        int f = oom_sequence(&msg);
        tg__fail_allocs(-1, 0);
        failures += f;
        absorbed_in_compile += !f && k < compile_allocs;
        if (f && !strstr(msg, "memory") && bad++ == 0) CHECK(0, "allocation %ld failing: \"%s\" does not say so", k, msg);
    }
    printf("test_dist: 2 replicas, %ld allocations in compile (%ld) + 2 steps; each failing (and all after it): %d "
           "sequences failed, %d without an out-of-memory message\n", total, compile_allocs, failures, bad);
    CHECK(compile_allocs > 50 && absorbed_in_compile == 0, "every allocation tg_compile makes, failing, fails it (%d did not)",
          absorbed_in_compile);
    CHECK(oom_sequence(&msg) == 0, "after the sweep: %s", msg);
}

/* ----- availability and NCCL ----- */

static void availability(void) {
    char why[TG_ERROR_LEN];
    CHECK(tg_distributed_available("reference", why, sizeof why) == 1 && tg_distributed_available("cpu", why, sizeof why) == 1,
          "host backends: always (%s)", why);
    CHECK(tg_distributed_available("nope", why, sizeof why) == 0 && strstr(why, "nope"), "unknown backend: %s", why);
    setenv("TG_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    int ok = tg_distributed_available("cuda", why, sizeof why);
    CHECK(!ok && strstr(why, "needs NCCL") && strstr(why, "/nonexistent/libnccl.so.2"), "NCCL missing: %s", why);
    tg_error err;
    CHECK(!nccl_load(&err) && strstr(err.msg, "TG_NCCL_LIB"), "nccl_load names the variable: %s", err.msg);
    unsetenv("TG_NCCL_LIB");
    bool have = nccl_load(&err);
    if (!have) {
        printf("test_dist: NCCL not installed here, its checks skipped (%s)\n", err.msg);
        CHECK(!tg_distributed_available("cuda", why, sizeof why) && strstr(why, "NCCL"), "no NCCL: %s", why);
        return;
    }
    CHECK(nccl_version() >= 21400, "NCCL version %d", nccl_version());
    uint8_t a[DIST_ID_BYTES] = { 0 }, b[DIST_ID_BYTES] = { 0 }, zero[DIST_ID_BYTES] = { 0 };
    CHECK(nccl_unique_id(a, &err) && nccl_unique_id(b, &err), "ncclGetUniqueId: %s", err.msg);
    CHECK(memcmp(a, zero, sizeof a) != 0 && memcmp(a, b, sizeof a) != 0, "unique ids are set and differ");
    /* NCCL present, no GPU: the reason is the GPU's. */
    ok = tg_distributed_available("cuda", why, sizeof why);
    if (!ok) CHECK(strstr(why, "CUDA") && !strstr(why, "NCCL"), "NCCL here, no GPU: %s", why);
}

/* NCCL_NVLS_ENABLE: 0 once NCCL is loaded, unless the user set it; in fresh processes, since a
 * loaded NCCL stays loaded. */
static void nvls_setting(void) {
    tg_error err;
    if (!nccl_load(&err)) return;   /* loaded in this process already, if installed */
    const char *v = getenv("NCCL_NVLS_ENABLE");
    CHECK(v && strcmp(v, "0") == 0, "NCCL_NVLS_ENABLE after loading: %s", v ? v : "(unset)");
    pid_t pid = fork();
    if (pid == 0) {   /* a fresh process with the variable set by the user: left alone */
        setenv("NCCL_NVLS_ENABLE", "1", 1);
        _exit(!(nccl_load(&err) && strcmp(getenv("NCCL_NVLS_ENABLE"), "1") == 0));
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a user's NCCL_NVLS_ENABLE is kept (status %d)", st);
}

/* ----- processes over the loopback ----- */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static dist_settings job(int rank, int world, int port, double timeout) {
    dist_settings s = { .multi_process = true, .rank = rank, .world = world, .port = port, .timeout_s = timeout, .n_local = 1 };
    snprintf(s.addr, sizeof s.addr, "127.0.0.1");
    return s;
}

/* What a child reports through its pipe: a status, a message, and numbers. */
typedef struct {
    int ok;
    char msg[TG_ERROR_LEN + 64];
    double seconds;
    float loss[STEPS];
    float params[PARAM_TOTAL];
    uint8_t id[DIST_ID_BYTES];
    double sum[4];
} report;

typedef void (*child_fn)(int rank, int port, report *out);

/* Run fn in `world` forked processes (rank 0 .. world-1), collect their reports. */
static void run_ranks(int world, int port, child_fn fn, report *out) {
    int fds[8][2];
    pid_t pid[8];
    for (int r = 0; r < world; r++) {
        if (pipe(fds[r]) != 0) return;
        pid[r] = fork();
        if (pid[r] == 0) {
            report rep;
            memset(&rep, 0, sizeof rep);
            fn(r, port, &rep);
            ssize_t w = write(fds[r][1], &rep, sizeof rep);
            _exit(w == (ssize_t)sizeof rep ? 0 : 1);
        }
        close(fds[r][1]);
    }
    for (int r = 0; r < world; r++) {
        memset(&out[r], 0, sizeof out[r]);
        size_t got = 0;
        ssize_t k;
        while (got < sizeof out[r] && (k = read(fds[r][0], (char *)&out[r] + got, sizeof out[r] - got)) > 0) got += (size_t)k;
        if (got != sizeof out[r]) snprintf(out[r].msg, sizeof out[r].msg, "rank %d reported nothing", r);
        close(fds[r][0]);
        int st;
        waitpid(pid[r], &st, 0);
    }
}

/* Rendezvous: rank 0's id reaches every rank; the job's rank count and fingerprint are checked. */
static uint64_t fingerprint_of_rank(int rank) { return rank == 2 ? 0xBADull : 0x600Dull; }

static void rendezvous_child(int rank, int port, report *out) {
    dist_settings s = job(rank, 3, port, 5);
    dist_net n;
    tg_error err;
    for (int i = 0; i < DIST_ID_BYTES; i++) out->id[i] = rank == 0 ? (uint8_t)(i * 7 + 1) : 0;
    double t0 = now();
    out->ok = net_rendezvous(&n, &s, 0x600Dull, out->id, &err);
    out->seconds = now() - t0;
    snprintf(out->msg, sizeof out->msg, "%s", out->ok ? "" : err.msg);
    if (!out->ok) return;
    /* sums: every rank adds rank + 1 and 10 * rank */
    out->sum[0] = rank + 1;
    out->sum[1] = 10.0 * rank;
    bool broken;
    out->ok = net_sum(&n, out->sum, 2, true, &broken, &err);
    /* a rank that cannot compute its share: every rank's call fails naming it, the next works */
    double v[2] = { 1, 2 };
    bool second = net_sum(&n, v, 2, rank != 1, &broken, &err);
    if (second || broken || !strstr(err.msg, "rank 1") ) out->ok = 0, snprintf(out->msg, sizeof out->msg, "failed share: %s", err.msg);
    v[0] = 1;
    v[1] = 2;
    if (!net_sum(&n, v, 2, true, &broken, &err) || v[0] != 3 || v[1] != 6) {
        out->ok = 0;
        snprintf(out->msg, sizeof out->msg, "after a failed share: %s (%g %g)", err.msg, v[0], v[1]);
    }
    out->sum[2] = v[0];
    net_close(&n);
}

static void mismatch_child(int rank, int port, report *out) {
    dist_settings s = job(rank, 3, port, 5);
    dist_net n;
    tg_error err;
    out->ok = net_rendezvous(&n, &s, fingerprint_of_rank(rank), out->id, &err);
    snprintf(out->msg, sizeof out->msg, "%s", out->ok ? "" : err.msg);
    if (out->ok) net_close(&n);
}

static void rendezvous(void) {
    report rep[3];
    int port = free_port();
    run_ranks(3, port, rendezvous_child, rep);
    for (int r = 0; r < 3; r++) {
        CHECK(rep[r].ok, "rank %d of 3: %s", r, rep[r].msg);
        bool same = true;
        for (int i = 0; i < DIST_ID_BYTES; i++) same &= rep[r].id[i] == (uint8_t)(i * 7 + 1);
        CHECK(same, "rank %d got rank 0's id", r);
        CHECK(rep[r].sum[0] == 6 && rep[r].sum[1] == 30 && rep[r].sum[2] == 3, "rank %d sums: %g %g %g", r, rep[r].sum[0],
              rep[r].sum[1], rep[r].sum[2]);
    }
    run_ranks(3, free_port(), mismatch_child, rep);
    CHECK(!rep[0].ok && strstr(rep[0].msg, "rank 2 runs another job"), "rank 0 names the odd rank: %s", rep[0].msg);
    CHECK(!rep[2].ok && strstr(rep[2].msg, "refused") && strstr(rep[2].msg, "rank 2 runs another job"),
          "the odd rank is told: %s", rep[2].msg);
    CHECK(!rep[1].ok, "the good rank fails too: %s", rep[1].msg);
}

/* Timeouts: nobody comes; rank 0 is not there. Both fail on time, saying who and where. */
static void rendezvous_timeouts(void) {
    tg_error err;
    dist_net n;
    uint8_t id[DIST_ID_BYTES] = { 0 };
    int port = free_port();
    dist_settings s = job(0, 3, port, 0.4);
    double t0 = now();
    CHECK(!net_rendezvous(&n, &s, 1, id, &err) && strstr(err.msg, "ranks 1, 2 did not join") && strstr(err.msg, "0.4 s"),
          "rank 0 alone: %s", err.msg);
    double took = now() - t0;
    CHECK(took >= 0.35 && took < 3, "rank 0 gave up after %.2f s (timeout 0.4)", took);
    s = job(1, 2, free_port(), 0.4);
    t0 = now();
    CHECK(!net_rendezvous(&n, &s, 1, id, &err) && strstr(err.msg, "could not reach rank 0 at 127.0.0.1") &&
              strstr(err.msg, "refused"), "no rank 0: %s", err.msg);
    took = now() - t0;
    CHECK(took >= 0.35 && took < 3, "rank 1 gave up after %.2f s (timeout 0.4)", took);
    s = job(1, 2, 1, 0.4);
    snprintf(s.addr, sizeof s.addr, "no-such-host.invalid");
    CHECK(!net_rendezvous(&n, &s, 1, id, &err) && strstr(err.msg, "cannot resolve") && strstr(err.msg, "no-such-host.invalid"),
          "unresolvable master: %s", err.msg);
    /* a port rank 0 cannot have */
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = in6addr_any };
    socklen_t len = sizeof a;
    int one = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        s = job(0, 2, ntohs(a.sin6_port), 0.4);
        CHECK(!net_rendezvous(&n, &s, 1, id, &err) && strstr(err.msg, "cannot listen on port"), "port in use: %s", err.msg);
    }
    if (fd >= 0) close(fd);
}

/* A peer that dies, hangs, or loses rank 0, after joining. */
static int peer_mode;   /* 0: dies, 1: hangs, 2: rank 0 dies */

static void failing_child(int rank, int port, report *out) {
    dist_settings s = job(rank, 2, port, 1.0);
    dist_net n;
    tg_error err;
    if (!net_rendezvous(&n, &s, 1, out->id, &err)) {
        snprintf(out->msg, sizeof out->msg, "join: %s", err.msg);
        return;
    }
    double v[3] = { 1, 2, 3 };
    bool broken = false;
    if ((peer_mode == 0 && rank == 1) || (peer_mode == 2 && rank == 0)) _exit(3);   /* dies: the kernel closes its socket */
    if (peer_mode == 1 && rank == 1) {
        struct timespec pause = { 3, 0 };
        nanosleep(&pause, NULL);   /* hangs past the timeout */
        return;
    }
    double t0 = now();
    out->ok = net_sum(&n, v, 3, true, &broken, &err);
    out->seconds = now() - t0;
    out->sum[0] = broken;
    snprintf(out->msg, sizeof out->msg, "%s", err.msg);
    bool again = net_sum(&n, v, 3, true, &broken, &err);
    if (again || !strstr(err.msg, "closed")) out->ok = 1, snprintf(out->msg, sizeof out->msg, "the next exchange: %s", err.msg);
    net_close(&n);
}

static void dead_peers(void) {
    report rep[2];
    peer_mode = 0;
    run_ranks(2, free_port(), failing_child, rep);
    CHECK(!rep[0].ok && rep[0].sum[0] == 1 && strstr(rep[0].msg, "rank 1 closed its connection"), "dead peer: %s", rep[0].msg);
    CHECK(rep[0].seconds < 0.9, "a dead peer is noticed at once (%.2f s, timeout 1 s)", rep[0].seconds);
    peer_mode = 1;
    run_ranks(2, free_port(), failing_child, rep);
    CHECK(!rep[0].ok && strstr(rep[0].msg, "rank 1 sent nothing within 1 s"), "hung peer: %s", rep[0].msg);
    CHECK(rep[0].seconds >= 0.95 && rep[0].seconds < 2.5, "a hung peer fails the step after the timeout (%.2f s)", rep[0].seconds);
    peer_mode = 2;
    run_ranks(2, free_port(), failing_child, rep);
    CHECK(!rep[1].ok && strstr(rep[1].msg, "rank 0 closed the connection"), "rank 0 died: %s", rep[1].msg);
}

/* ----- whole training runs across processes ----- */

static int train_world, train_local, train_die_at;

/* Rank `rank` of train_world processes, each with train_local replicas, on its rows of the
 * whole batch of 8; it reports its losses and parameters. train_die_at > 0: rank 1 exits before
 * that step. */
static void train_child(int rank, int port, report *out) {
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    tg_dist_spec d = { .world_size = train_world, .rank = rank, .local_rank = rank, .master_port = port, .timeout_s = 2 };
    int rows = 8 / train_world;
    tg_train *t = make(&n, m, (setup){ .batch = rows, .n_dev = train_local, .dist = &d }, &err);
    if (!t) {
        snprintf(out->msg, sizeof out->msg, "compile: %s", err.msg);
        return;
    }
    out->ok = tg_train_rank(t) == rank && tg_train_replicas(t) == train_world * (train_local ? train_local : 1);
    for (int s = 0; s < STEPS && out->ok; s++) {
        if (train_die_at && s == train_die_at && rank == 1) _exit(0);
        float before[PARAM_TOTAL];
        params_of(t, before);
        double t0 = now();
        tg_result r = step_rows(t, s, 8, rank * rows, rows);
        out->seconds = now() - t0;
        if (r.status != TG_OK) {
            snprintf(out->msg, sizeof out->msg, "step %d: %s", s, r.error);
            params_of(t, out->params);
            out->ok = memcmp(before, out->params, sizeof before) == 0 ? -1 : -2;   /* -1: failed, nothing changed */
            tg_result again = step_rows(t, s + 1, 8, rank * rows, rows);
            if (again.status == TG_OK || !strstr(again.error, "cannot step again")) out->ok = -3;
            break;
        }
        out->loss[s] = r.loss;
    }
    if (out->ok == 1) params_of(t, out->params);
    tg_destroy(t);
    tg_model_free(m);
}

static void multi_process_training(int world, int local) {
    /* the reference run: one replica at the whole batch */
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    tg_train *t = make(&n, m, (setup){ .batch = 8 }, &err);
    float want[STEPS], params[PARAM_TOTAL];
    for (int s = 0; t && s < STEPS; s++) want[s] = step_rows(t, s, 8, 0, 8).loss;
    if (t) params_of(t, params);
    tg_destroy(t);
    tg_model_free(m);

    report rep[4];
    train_world = world;
    train_local = local;
    train_die_at = 0;
    run_ranks(world, free_port(), train_child, rep);
    for (int r = 0; r < world; r++) {
        CHECK(rep[r].ok == 1, "%d processes x %d: rank %d: %s", world, local, r, rep[r].msg);
        if (rep[r].ok != 1) return;
        CHECK(memcmp(rep[r].loss, rep[0].loss, sizeof rep[0].loss) == 0, "rank %d reports rank 0's losses", r);
        CHECK(memcmp(rep[r].params, rep[0].params, sizeof params) == 0, "rank %d holds rank 0's parameters exactly", r);
    }
    double worst = 0;
    for (int s = 0; s < STEPS; s++)
        if (!(fabs((double)rep[0].loss[s] - want[s]) <= worst)) worst = fabs((double)rep[0].loss[s] - want[s]);
    CHECK(worst <= NOISE, "%d processes x %d: losses within %g of one replica's (%.3g)", world, local, NOISE, worst);
    printf("test_dist: %d processes x %d replicas: largest loss difference from one replica %.2g over %d steps\n", world,
           local ? local : 1, worst, STEPS);
    CHECK(max_rel_diff(rep[0].params, params, PARAM_TOTAL) <= NOISE, "%d processes x %d: parameters (%.3g)", world, local,
          max_rel_diff(rep[0].params, params, PARAM_TOTAL));
}

static void rank_dies_mid_run(void) {
    report rep[2];
    train_world = 2;
    train_local = 0;
    train_die_at = 3;
    double t0 = now();
    run_ranks(2, free_port(), train_child, rep);
    CHECK(rep[0].ok == -1 && strstr(rep[0].msg, "step 3") && strstr(rep[0].msg, "rank 1"),
          "rank 0 fails step 3 naming rank 1, parameters unchanged, no step after (%d): %s", rep[0].ok, rep[0].msg);
    CHECK(now() - t0 < 30, "and it did not hang");
    train_die_at = 0;
}

/* A rank that cannot compute its share (a bad input) fails the step on every rank; the next
 * step trains on both. */
static void share_fails_child(int rank, int port, report *out) {
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    tg_dist_spec d = { .world_size = 2, .rank = rank, .master_port = port, .timeout_s = 5 };
    tg_train *t = make(&n, m, (setup){ .batch = 4, .dist = &d }, &err);
    if (!t) {
        snprintf(out->msg, sizeof out->msg, "compile: %s", err.msg);
        tg_model_free(m);
        return;
    }
    float x[4 * IN] = { 0 };
    int32_t y[4] = { 0 };
    tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, rank == 1 ? 3 : 4 * IN), tg_i32("y", y, 4) }, 2);
    snprintf(out->msg, sizeof out->msg, "%s", r.error);
    tg_result next = step_rows(t, 0, 8, rank * 4, 4);
    out->ok = r.status == TG_FAILED && next.status == TG_OK && tg_train_step_count(t) == 1;
    if (next.status != TG_OK) snprintf(out->msg, sizeof out->msg, "next step: %s", next.error);
    tg_destroy(t);
    tg_model_free(m);
}

static void share_fails(void) {
    report rep[2];
    run_ranks(2, free_port(), share_fails_child, rep);
    CHECK(rep[0].ok && strstr(rep[0].msg, "rank 1 could not compute its share") && strstr(rep[0].msg, "skipped on every rank"),
          "rank 0: %s", rep[0].msg);
    CHECK(rep[1].ok && strstr(rep[1].msg, "expected 20 elements"), "rank 1 reports its own error: %s", rep[1].msg);
}

/* A rank whose job differs (its inputs) is refused at tg_compile, on both sides. */
static void mismatched_jobs_child(int rank, int port, report *out) {
    net n;
    tg_model *m = new_model(&n);
    tg_error err;
    tg_dist_spec d = { .world_size = 2, .rank = rank, .master_port = port, .timeout_s = 5 };
    tg_train *t = make(&n, m, (setup){ .batch = rank ? 2 : 4, .dist = &d }, &err);
    out->ok = t != NULL;
    snprintf(out->msg, sizeof out->msg, "%s", t ? "" : err.msg);
    tg_destroy(t);
    tg_model_free(m);
}

static void mismatched_jobs(void) {
    report rep[2];
    run_ranks(2, free_port(), mismatched_jobs_child, rep);
    CHECK(!rep[0].ok && strstr(rep[0].msg, "rank 1 runs another job"), "rank 0: %s", rep[0].msg);
    CHECK(!rep[1].ok && strstr(rep[1].msg, "refused"), "rank 1: %s", rep[1].msg);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/tg_test_dist_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    /* Forks first: the children start from a process that has run nothing yet. */
    rendezvous();
    rendezvous_timeouts();
    dead_peers();
    multi_process_training(2, 0);
    multi_process_training(2, 2);
    multi_process_training(4, 0);
    rank_dies_mid_run();
    share_fails();
    mismatched_jobs();
    settings_errors();
    versus_plain("reference", 1, 0);
    versus_plain("reference", 2, 0);
    versus_plain("reference", 4, 0);
    versus_plain("reference", 2, 0.05);   /* clipping sees the averaged gradients */
    versus_plain("cpu", 2, 0.05);
    bad_steps();
    checkpoints(dir);
    allocation_failures();
    cuda_compile_only();
    availability();
    nvls_setting();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_report("test_dist");
}
