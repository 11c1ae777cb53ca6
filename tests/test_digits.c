/* test_digits: the digits example end to end on the real data set (data/digits.csv.gz; tests run
 * from the repo root). Runs the built example binary (BUILD/examples/digits, which `make test`
 * builds first) and checks its exit status and the losses it prints, so the example and this
 * test cannot drift apart. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "run_example.h"

/* The mean losses of the "epoch N/M  loss X ..." lines; returns how many were found. */
static int epoch_losses(double *loss, int max) {
    int n = 0, epoch, epochs;
    for (const char *line = example_output; line && *line && n < max; line = next_line(line))
        if (sscanf(line, "epoch %d/%d loss %lf", &epoch, &epochs, &loss[n]) == 3) n++;
    return n;
}

static double test_accuracy_percent(void) {
    const char *s = strstr(example_output, "test accuracy ");
    double acc = -1;
    if (s) sscanf(s, "test accuracy %lf%%", &acc);
    return acc;
}

int main(int argc, char **argv) {
    example_dir_init(argv[0]);
    char example[4200];   /* path of the example binary */
    snprintf(example, sizeof example, "%s/digits", example_dir);
    int have = access(example, X_OK) == 0 && access("data/digits.csv.gz", R_OK) == 0;
    CHECK(have, "need %s (make builds it) and data/digits.csv.gz (run from the repo root)", example);
    if (!have) return check_report("test_digits");

    /* 10 epochs: the loss falls steadily and the held-out accuracy clears 90%. */
    int rc = run_example("digits", "--epochs 10 --min-acc 0.90");
    double loss[16];
    int n = epoch_losses(loss, 16);
    double acc = test_accuracy_percent();
    CHECK(rc == 0, "digits --epochs 10 --min-acc 0.90 exited %d", rc);
    CHECK(n == 10, "expected 10 epoch lines, found %d", n);
    if (n == 10) {
        CHECK(loss[0] > 1.0 && loss[0] < 3.0, "first epoch loss %g (an untrained 10-class model is near ln 10)", loss[0]);
        CHECK(loss[9] < 0.5 * loss[0], "last epoch loss %g is not well below the first %g", loss[9], loss[0]);
        for (int i = 1; i < n; i++) CHECK(loss[i] < loss[i - 1] * 1.05, "loss rose at epoch %d: %g -> %g", i + 1, loss[i - 1], loss[i]);
    }
    CHECK(acc >= 90.0, "test accuracy %g%% after 10 epochs", acc);
    if (rc != 0 || n != 10 || acc < 90.0) fprintf(stderr, "--- digits output ---\n%s---\n", example_output);

    /* The CNN variant trains too, and --save writes a safetensors checkpoint: an 8-byte
     * little-endian header length, then a JSON header naming the parameters. */
    rc = run_example("digits", "--cnn --epochs 3 --save /tmp/tg_test_digits.safetensors");
    CHECK(rc == 0 && strstr(example_output, "CNN"), "digits --cnn exited %d\n%s", rc, example_output);
    FILE *f = fopen("/tmp/tg_test_digits.safetensors", "rb");
    unsigned char head[8] = { 0 };
    char json[256] = { 0 };
    bool read_ok = f && fread(head, 1, 8, f) == 8 && fread(json, 1, sizeof json - 1, f) > 0;
    if (f) fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen * 256 + head[i];
    CHECK(read_ok && hlen > 0 && hlen < 100000 && json[0] == '{' && strstr(json, "c1.W"),
          "digits --save: header length %llu, header '%.60s'", (unsigned long long)hlen, json);
    remove("/tmp/tg_test_digits.safetensors");

    /* --min-acc gates the exit status. */
    rc = run_example("digits", "--epochs 1 --min-acc 1.01");
    CHECK(rc == 1, "digits --min-acc 1.01 exited %d, expected 1\n%s", rc, example_output);

    /* A missing data file is an error message and exit 1, not a crash. */
    rc = run_example("digits", "--data data/no-such-file.csv.gz");
    CHECK(rc == 1 && strstr(example_output, "no-such-file"), "digits --data <missing> exited %d\n%s", rc, example_output);

    return check_report("test_digits");
}
