/* Checkpoints: a run saved mid-way and resumed in a fresh handle continues with exactly the loss
 * sequence of the unbroken run (parameters, Adam/SGD state, step count and schedule position all
 * restored), on each backend; bad files are errors that change nothing. */
#include "check.h"
#include "tensorgrad.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static tg_linear l1, l2;
static tg_layernorm ln;

static tg_tensor loss_fn(const void *ctx, const tg_tensor *in) {
    tg_tensor h = tg_layernorm(&ln, tg_gelu(tg_linear(&l1, in[0])));
    return tg_cross_entropy(tg_linear(&l2, h), in[1], TG_MEAN);
}

#define B 8
static float xs[B * 5];
static int32_t ys[B];

static tg_model *new_model(int hidden) {
    tg_model *m = tg_model_new(11);
    l1 = tg_linear_new(m, "l1", 5, hidden, NULL);
    ln = tg_layernorm_new(m, "ln", hidden, 1e-5, 1);
    l2 = tg_linear_new(m, "l2", hidden, 3, NULL);
    return m;
}

static tg_train *compile(tg_model *m, const char *backend, tg_optimizer opt) {
    tg_error err;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss_fn, .optimizer = opt, .backend = backend,
                                               .inputs = (tg_input_decl[]){ TG_F32("x", B, 5), TG_I32("y", B) },
                                               .n_inputs = 2 }, &err);
    CHECK(t != NULL, "compile on %s: %s", backend, err.msg);
    return t;
}

/* One step on the batch of step s (the data depends on the step, as in real training). */
static float step(tg_train *t, int s) {
    check_rng = 1000 + (uint64_t)s;
    for (int i = 0; i < B * 5; i++) xs[i] = (float)check_uniform(-1, 1);
    for (int i = 0; i < B; i++) ys[i] = (int32_t)(check_next() % 3);
    tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xs, B * 5), tg_i32("y", ys, B) }, 2);
    CHECK(r.status == TG_OK, "step %d: %s", s, r.error);
    return r.loss;
}

static void resume_equals_unbroken(const char *backend, tg_optimizer opt, const char *label, const char *path) {
    enum { BEFORE = 6, AFTER = 6 };
    float unbroken[AFTER], resumed[AFTER];
    tg_model *m = new_model(7);
    tg_train *t = compile(m, backend, opt);
    if (!t) { tg_model_free(m); return; }
    for (int s = 0; s < BEFORE; s++) step(t, s);
    tg_error err;
    CHECK(tg_save(t, path, 1, &err) == TG_OK, "%s %s: save: %s", backend, label, err.msg);
    for (int s = 0; s < AFTER; s++) unbroken[s] = step(t, BEFORE + s);
    tg_destroy(t);

    t = compile(m, backend, opt);   /* fresh: init params, zero state, step 0 */
    if (!t) { tg_model_free(m); return; }
    CHECK(tg_load(t, path, 1, &err) == TG_OK, "%s %s: load: %s", backend, label, err.msg);
    CHECK(tg_train_step_count(t) == BEFORE, "%s %s: step count restored (%lld)", backend, label,
          (long long)tg_train_step_count(t));
    for (int s = 0; s < AFTER; s++) resumed[s] = step(t, BEFORE + s);
    int same = 0;
    for (int s = 0; s < AFTER; s++) same += unbroken[s] == resumed[s];
    CHECK(same == AFTER, "%s %s: resumed losses equal the unbroken run's (%d of %d; first %.9g vs %.9g)", backend,
          label, same, AFTER, unbroken[0], resumed[0]);
    tg_destroy(t);

    /* Without the optimizer state the parameters come back but the trajectory differs. */
    t = compile(m, backend, opt);
    CHECK(tg_load(t, path, 0, &err) == TG_OK, "%s %s: load params only: %s", backend, label, err.msg);
    CHECK(tg_train_step_count(t) == 0, "%s %s: a params-only load keeps the step count", backend, label);
    step(t, BEFORE);
    CHECK(step(t, BEFORE + 1) != unbroken[1], "%s %s: without optimizer state the run differs", backend, label);
    tg_destroy(t);
    tg_model_free(m);
}

static void bad_files(const char *dir) {
    char path[400], other[400];
    snprintf(path, sizeof path, "%s/good.safetensors", dir);
    snprintf(other, sizeof other, "%s/other.safetensors", dir);
    tg_model *m = new_model(7);
    tg_train *t = compile(m, "reference", tg_adam(1e-2));
    tg_error err;
    step(t, 0);
    CHECK(tg_save(t, path, 0, &err) == TG_OK, "save params only: %s", err.msg);
    float before[7 * 5], after[7 * 5];
    tg_download_param(t, "l1.W", before, 35, &err);

    /* params-only file, optimizer requested */
    CHECK(tg_load(t, path, 1, &err) == TG_FAILED && strstr(err.msg, "optimizer"), "optimizer state missing: %s", err.msg);

    /* a model of another width: shapes differ, named in the message */
    tg_model *m2 = new_model(4);
    tg_train *t2 = compile(m2, "reference", tg_adam(1e-2));
    CHECK(tg_save(t2, other, 1, &err) == TG_OK, "save other: %s", err.msg);
    CHECK(tg_load(t, other, 0, &err) == TG_FAILED && strstr(err.msg, "l1.W") && strstr(err.msg, "[5,4]") &&
              strstr(err.msg, "[5,7]"), "shape mismatch: %s", err.msg);
    tg_destroy(t2);
    tg_model_free(m2);

    /* truncated and garbage files, a missing file */
    FILE *f = fopen(path, "rb");
    char buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    for (size_t cut = 0; cut < n; cut += n / 7 + 1) {
        f = fopen(other, "wb");
        if (f) { fwrite(buf, 1, cut, f); fclose(f); }
        CHECK(tg_load(t, other, 0, &err) == TG_FAILED && err.msg[0], "truncated at %zu: %s", cut, err.msg);
    }
    snprintf(other, sizeof other, "%s/missing.safetensors", dir);
    CHECK(tg_load(t, other, 0, &err) == TG_FAILED && strstr(err.msg, "missing.safetensors"), "missing file: %s", err.msg);
    tg_download_param(t, "l1.W", after, 35, &err);
    CHECK(memcmp(before, after, sizeof before) == 0, "failed loads change no parameter");
    CHECK(tg_load(t, path, 0, &err) == TG_OK, "the good file still loads: %s", err.msg);
    CHECK(tg_save(t, "/nonexistent-dir/x.safetensors", 0, &err) == TG_FAILED && err.msg[0], "unwritable path: %s", err.msg);
    CHECK(tg_save(NULL, path, 0, &err) == TG_FAILED && tg_load(NULL, path, 0, &err) == TG_FAILED, "NULL handles");
    tg_destroy(t);
    tg_model_free(m);
}

/* A file written by PyTorch's safetensors writer (tests/fixtures/make_torch_checkpoint.py) with
 * this model's names loads, every value as written. */
static void torch_written_file(void) {
    tg_model *m = new_model(7);
    tg_train *t = compile(m, "reference", tg_adam(1e-2));
    tg_error err;
    CHECK(tg_load(t, "tests/fixtures/torch_checkpoint.safetensors", 0, &err) == TG_OK, "load the PyTorch file: %s", err.msg);
    static const char *const names[] = { "l1.W", "l1.b", "ln.g", "ln.b", "l2.W", "l2.b" };
    static const int sizes[] = { 35, 7, 7, 7, 21, 3 };
    int wrong = 0, total = 0;
    for (int k = 0; k < 6; k++) {
        float v[35];
        CHECK(tg_download_param(t, names[k], v, (size_t)sizes[k], &err) == TG_OK, "download %s: %s", names[k], err.msg);
        for (int i = 0; i < sizes[k]; i++, total++) {
            double want = (i + 1) * 0.01 * (k + 1) * (i % 2 ? -1 : 1);
            wrong += v[i] != (float)want;
        }
    }
    CHECK(wrong == 0, "PyTorch-written values: %d of %d differ", wrong, total);
    tg_destroy(t);
    tg_model_free(m);
}

int main(void) {
    char dir[] = "/tmp/tg_test_ckpt_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[300];
    snprintf(path, sizeof path, "%s/run.safetensors", dir);
    tg_optimizer adamw = tg_adamw(3e-2, 0.1);
    adamw.lr = tg_lr_cosine(3e-2, 1e-3, 12);   /* the schedule position must survive too */
    tg_optimizer sgd = tg_sgd(5e-2, 0.9, 1, 1e-3);
    static const char *const backends[] = { "reference", "cpu" };
    for (int b = 0; b < 2; b++) {
        resume_equals_unbroken(backends[b], adamw, "adamw+cosine", path);
        resume_equals_unbroken(backends[b], sgd, "sgd", path);
    }
    bad_files(dir);
    torch_written_file();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_report("test_checkpoint");
}
