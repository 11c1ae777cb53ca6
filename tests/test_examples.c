/* test_examples: the sin and chargpt examples end to end in a short mode. Runs the built binaries
 * (BUILD/examples/NAME next to this test's BUILD/tests/, which `make test` builds first) and
 * checks their exit status, that the losses they print fall, and what --plot writes. sin runs on
 * the library's default backend; chargpt, the heavier one, on --backend cpu given explicitly
 * (which checks that --backend is passed on), training on a small file of a repeating phrase
 * written to a fresh /tmp directory. Then export: digits --export (MLP and CNN) and
 * examples/classify.c built against nothing but the exported file (tests run from the repo
 * root: the data set and classify.c are read from there), which must classify the held-out
 * rows as digits did. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "run_example.h"

/* The losses of the progress lines "step N/M  loss X ..."; returns how many were found. With
 * heldout non-NULL also the "held-out X" that follows (every chargpt progress line has one). */
static int progress_losses(double *loss, double *heldout, int max) {
    int n = 0, step, steps;
    for (const char *line = example_output; line && *line && n < max; line = next_line(line)) {
        if (sscanf(line, "step %d/%d loss %lf", &step, &steps, &loss[n]) != 3) continue;
        if (heldout) {
            const char *h = strstr(line, "held-out ");
            if (!h || h > strchr(line, '\n') || sscanf(h, "held-out %lf", &heldout[n]) != 1) continue;
        }
        n++;
    }
    return n;
}

/* Checks PREFIX.csv (the header, then `steps` rows "step,loss[,heldout]" numbered 1..steps, with
 * n_heldout held-out values) and PREFIX.svg (an <svg> document with a drawn line). */
static void check_plot(const char *prefix, const char *header, int steps, int n_heldout) {
    char path[4200], line[256];
    snprintf(path, sizeof path, "%s.csv", prefix);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s was not written", path);
    if (f) {
        int rows = 0, bad = 0, held = 0;
        CHECK(fgets(line, sizeof line, f) && strcmp(line, header) == 0, "%s: header %s", path, line);
        while (fgets(line, sizeof line, f)) {
            long long step;
            double loss, h;
            int k = 0;
            if (sscanf(line, "%lld,%lf%n", &step, &loss, &k) != 2 || step != rows + 1 || !(loss >= 0)) bad++;
            else if (line[k] == ',' && line[k + 1] != '\n' && sscanf(line + k + 1, "%lf", &h) == 1) held++;
            rows++;
        }
        fclose(f);
        CHECK(rows == steps && bad == 0, "%s: %d rows (%d unparsable), expected %d", path, rows, bad, steps);
        CHECK(held == n_heldout, "%s: %d held-out values, expected %d", path, held, n_heldout);
        remove(path);
    }
    snprintf(path, sizeof path, "%s.svg", prefix);
    f = fopen(path, "r");
    CHECK(f != NULL, "%s was not written", path);
    if (f) {
        static char svg[1 << 20];
        size_t n = fread(svg, 1, sizeof svg - 1, f);
        svg[n] = '\0';
        fclose(f);
        CHECK(strncmp(svg, "<svg", 4) == 0, "%s does not start with <svg", path);
        CHECK(strstr(svg, "<polyline") || strstr(svg, "<path"), "%s has no line", path);
        CHECK(strstr(svg, "</svg>") != NULL, "%s is not closed", path);
        remove(path);
    }
}

static void test_sin(const char *tmp) {
    char args[8600], prefix[4200];
    snprintf(prefix, sizeof prefix, "%s/sin", tmp);
    snprintf(args, sizeof args, "--steps 400 --plot '%s'", prefix);
    int rc = run_example("sin", args);
    double loss[64];
    int n = progress_losses(loss, NULL, 64);
    CHECK(rc == 0, "sin %s exited %d", args, rc);
    CHECK(n == 20, "sin: expected 20 progress lines, found %d", n);
    if (n == 20) {
        CHECK(loss[0] > 0.01 && loss[0] < 1.0, "sin: first loss %g", loss[0]);
        CHECK(loss[n - 1] < 0.05 * loss[0] && loss[n - 1] < 0.01, "sin: last loss %g vs first %g", loss[n - 1], loss[0]);
    }
    CHECK(strstr(example_output, "max abs error ") != NULL, "sin: no prediction table");
    if (rc != 0 || n != 20) fprintf(stderr, "--- sin output ---\n%s---\n", example_output);
    if (rc == 0) check_plot(prefix, "step,loss\n", 400, 0);

    rc = run_example("sin", "--backend no-such-backend");
    CHECK(rc == 1 && strstr(example_output, "no-such-backend"), "sin --backend no-such-backend exited %d\n%s", rc, example_output);
    snprintf(args, sizeof args, "--plot '%s/no-such-dir/sin'", tmp);
    rc = run_example("sin", args);   /* an unwritable --plot fails before training */
    CHECK(rc == 1 && strstr(example_output, "no-such-dir") && !strstr(example_output, "step "), "sin %s exited %d\n%s", args, rc, example_output);
    rc = run_example("sin", "--steps 0");
    CHECK(rc == 2 && strstr(example_output, "usage"), "sin --steps 0 exited %d\n%s", rc, example_output);
}

static void test_chargpt(const char *tmp) {
    /* ~4 KB of one phrase: the model learns it within a few dozen steps. */
    char text[4200], args[8600], prefix[4200];
    snprintf(text, sizeof text, "%s/phrase.txt", tmp);
    snprintf(prefix, sizeof prefix, "%s/chargpt", tmp);
    FILE *f = fopen(text, "w");
    CHECK(f != NULL, "cannot write %s", text);
    if (!f) return;
    for (int i = 0; i < 90; i++) fputs("the quick brown fox jumps over the lazy dog. ", f);
    fclose(f);

    snprintf(args, sizeof args, "'%s' --backend cpu --steps 30 --lr 3e-3 --eval-every 10 --sample-every 0 --sample-len 40 "
             "--prompt 'the ' --plot '%s'", text, prefix);
    int rc = run_example("chargpt", args);
    double loss[16], held[16];
    int n = progress_losses(loss, held, 16);
    CHECK(rc == 0, "chargpt %s exited %d", args, rc);
    CHECK(n == 3, "chargpt: expected 3 progress lines, found %d", n);
    if (n == 3) {
        /* The first line averages steps 1..10, which start near ln(vocab 28) = 3.3. */
        CHECK(loss[0] > 2.0 && loss[0] < 4.0, "chargpt: first loss %g", loss[0]);
        CHECK(loss[2] < 0.75 * loss[0], "chargpt: last loss %g is not well below the first %g", loss[2], loss[0]);
        CHECK(held[2] < 0.75 * held[0], "chargpt: last held-out loss %g is not well below the first %g", held[2], held[0]);
    }
    CHECK(strstr(example_output, "--- sample at step 30") != NULL, "chargpt: no sample at the end");
    if (rc != 0 || n != 3) fprintf(stderr, "--- chargpt output ---\n%s---\n", example_output);
    if (rc == 0) check_plot(prefix, "step,loss,heldout\n", 30, 3);

    /* --save writes a checkpoint at every evaluation; --resume continues from its step. */
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/chargpt.safetensors", tmp);
    snprintf(args, sizeof args, "'%s' --backend cpu --steps 10 --lr 1e-2 --eval-every 10 --sample-every 0 "
             "--sample-len 10 --save '%s'", text, ckpt);
    rc = run_example("chargpt", args);
    n = progress_losses(loss, held, 16);
    CHECK(rc == 0 && n == 1, "chargpt --save exited %d with %d progress lines", rc, n);
    double saved_loss = n == 1 ? loss[0] : NAN;
    snprintf(args, sizeof args, "'%s' --backend cpu --steps 20 --lr 1e-2 --eval-every 10 --sample-every 0 "
             "--sample-len 10 --resume '%s'", text, ckpt);
    rc = run_example("chargpt", args);
    n = progress_losses(loss, held, 16);
    CHECK(rc == 0 && strstr(example_output, "resumed from") && strstr(example_output, "at step 11"),
          "chargpt --resume exited %d\n%s", rc, example_output);
    CHECK(n == 1 && loss[0] < saved_loss, "chargpt: steps 11-20 after resuming (loss %g) continue below steps 1-10 (%g)",
          n == 1 ? loss[0] : NAN, saved_loss);
    remove(ckpt);

    /* Bad input is a message and a non-zero exit, not a crash. */
    snprintf(args, sizeof args, "'%s/no-such-file.txt'", tmp);
    rc = run_example("chargpt", args);
    CHECK(rc == 1 && strstr(example_output, "no-such-file"), "chargpt <missing file> exited %d\n%s", rc, example_output);
    f = fopen(text, "w");
    if (f) { fputs("too short", f); fclose(f); }
    snprintf(args, sizeof args, "'%s'", text);
    rc = run_example("chargpt", args);
    CHECK(rc == 1 && strstr(example_output, "too short"), "chargpt <9-byte file> exited %d\n%s", rc, example_output);
    rc = run_example("chargpt", "");
    CHECK(rc == 2 && strstr(example_output, "usage"), "chargpt without a file exited %d\n%s", rc, example_output);
    remove(text);
}

/* The number after `label` in the output (NAN if absent). */
static double number_after(const char *label) {
    const char *s = strstr(example_output, label);
    double v = NAN;
    if (s) sscanf(s + strlen(label), "%lf", &v);
    return v;
}

/* digits trains briefly and exports; classify, built with only the exported file and libm under
 * -std=c99 -Wall -Wextra -Werror, gets the same held-out accuracy (both take the largest logit; a
 * row may flip where two logits are within rounding of each other). */
static void test_export(const char *tmp, const char *model) {
    char args[8600], cmd[17000];
    snprintf(args, sizeof args, "%s --export '%s'", strcmp(model, "CNN") == 0 ? "--cnn --epochs 2" : "--epochs 3", tmp);
    int rc = run_example("digits", args);
    double acc = number_after("test accuracy "), bytes = number_after("digits_model.c (");
    CHECK(rc == 0 && strstr(example_output, model), "digits %s exited %d\n%s", args, rc, example_output);
    CHECK(bytes > 1000 && number_after("tg_run, one row at a time: ") > 0, "digits --export printed no size or time:\n%s",
          example_output);
    snprintf(cmd, sizeof cmd, "cc -std=c99 -O2 -Wall -Wextra -Werror -I'%s' examples/classify.c '%s/digits_model.c' -lm "
             "-o '%s/classify' 2>&1", tmp, tmp, tmp);
    rc = run_command(cmd);
    CHECK(rc == 0, "%s: %s", cmd, example_output);
    if (rc != 0) return;
    snprintf(cmd, sizeof cmd, "'%s/classify' '%s/digits_test.csv' 2>&1", tmp, tmp);
    rc = run_command(cmd);
    double got = number_after("accuracy "), per_row = 100.0 / 360;
    CHECK(rc == 0 && fabs(got - acc) <= per_row * 1.01, "%s classify: exit %d, accuracy %g%% vs digits' %g%%\n%s", model, rc,
          got, acc, example_output);
    double rows = NAN, us = NAN;
    for (const char *line = example_output; line && *line; line = next_line(line)) {
        double v;
        int end = 0;
        if (sscanf(line, "classify: %lf rows%n", &v, &end) == 1 && end) rows = v;
        end = 0;
        if (sscanf(line, "classify: %lf us per sample%n", &v, &end) == 1 && end) us = v;
    }
    CHECK(rows == 360 && us > 0, "classify read %g rows, took %g us per sample:\n%s", rows, us, example_output);
    /* Unlabelled rows on standard input: a prediction each; a bad row: a message and exit 1. */
    snprintf(cmd, sizeof cmd, "head -n 3 '%s/digits_test.csv' | cut -d, -f1-64 | '%s/classify' 2>&1", tmp, tmp);
    rc = run_command(cmd);
    CHECK(rc == 0 && strstr(example_output, "row 1: ") && strstr(example_output, "row 3: ") && !strstr(example_output, "accuracy"),
          "classify on unlabelled rows: exit %d\n%s", rc, example_output);
    snprintf(cmd, sizeof cmd, "echo '1,2,3' | '%s/classify' 2>&1", tmp);
    rc = run_command(cmd);
    CHECK(rc == 1 && strstr(example_output, "pixel 4"), "classify on a short row: exit %d\n%s", rc, example_output);
    static const char *const files[] = { "digits_model.c", "digits_model.h", "digits_test.csv", "classify" };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s", tmp, files[i]);
        remove(cmd);
    }
}

int main(int argc, char **argv) {
    example_dir_init(argv[0]);
    char sin_path[4200], gpt_path[4200];
    snprintf(sin_path, sizeof sin_path, "%s/sin", example_dir);
    snprintf(gpt_path, sizeof gpt_path, "%s/chargpt", example_dir);
    int have = access(sin_path, X_OK) == 0 && access(gpt_path, X_OK) == 0;
    CHECK(have, "need %s and %s (make builds them)", sin_path, gpt_path);
    char tmpl[] = "/tmp/tg_examples_XXXXXX";
    const char *tmp = have ? mkdtemp(tmpl) : NULL;
    CHECK(!have || tmp, "mkdtemp %s failed", tmpl);
    if (!tmp) return check_report("test_examples");

    test_sin(tmp);
    test_chargpt(tmp);
    bool data = access("data/digits.csv.gz", R_OK) == 0 && access("examples/classify.c", R_OK) == 0;
    CHECK(data, "need data/digits.csv.gz and examples/classify.c (run from the repo root)");
    if (data) {
        test_export(tmp, "MLP");
        test_export(tmp, "CNN");
    }
    rmdir(tmp);
    return check_report("test_examples");
}
