/* classify: recognise 8x8 handwritten digits with nothing but a model that digits.c trained and
 * exported: no tensorgrad, no BLAS, no OpenMP, no compiler at run time; libm only.
 *
 *   build/examples/digits --export /tmp/model            (or --cnn --export: the same API)
 *   cc -std=c99 -O2 -I/tmp/model examples/classify.c /tmp/model/digits_model.c -lm -o classify
 *   ./classify /tmp/model/digits_test.csv                 (or rows on standard input)
 *
 * Each line holds 64 pixels 0..16 separated by commas, as in the UCI data set (digits.c scales
 * them by 1/16 before the model sees them, and so does this), optionally followed by the label.
 * With labels it prints the accuracy; without, the predicted digit of each row. Either way it
 * prints how long the exported forward takes per sample, one row at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "digits_model.h"

#define MAX_ROWS 100000

static float pixels[MAX_ROWS][DIGITS_IN_X_SIZE];
static int labels[MAX_ROWS];   /* -1: none given */

/* The predicted digit: the largest of the model's 10 logits. */
static int predict(const float *x) {
    float logits[DIGITS_OUT_SIZE];
    digits_forward(x, logits);
    int best = 0;
    for (int c = 1; c < DIGITS_OUT_SIZE; c++)
        if (logits[c] > logits[best]) best = c;
    return best;
}

/* Parses one line: 64 pixels, then maybe a label (-1 if none). 0, or -1 after a message. */
static int parse_row(const char *line, int row, float *x, int *label) {
    const char *p = line;
    char *end;
    for (int k = 0; k < DIGITS_IN_X_SIZE; k++) {
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 16) {
            fprintf(stderr, "classify: row %d: pixel %d is not a number 0..16\n", row, k + 1);
            return -1;
        }
        x[k] = (float)v / 16.0f;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
    }
    long v = strtol(p, &end, 10);
    *label = end == p ? -1 : (int)v;
    if (end != p && (v < 0 || v > 9)) {
        fprintf(stderr, "classify: row %d: label %ld is not a digit\n", row, v);
        return -1;
    }
    while (*end == ' ' || *end == '\r' || *end == '\n') end++;
    if (*end) {
        fprintf(stderr, "classify: row %d: more than 64 pixels and a label\n", row);
        return -1;
    }
    return 0;
}

/* Reads every row; returns how many, or -1 after an error message. */
static int read_rows(FILE *f) {
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '\n') continue;
        if (n == MAX_ROWS) {
            fprintf(stderr, "classify: more than %d rows\n", MAX_ROWS);
            return -1;
        }
        if (parse_row(line, n + 1, pixels[n], &labels[n]) != 0) return -1;
        n++;
    }
    return n;
}

int main(int argc, char **argv) {
    FILE *f = argc > 1 ? fopen(argv[1], "r") : stdin;
    if (!f) { fprintf(stderr, "classify: cannot open %s\n", argv[1]); return 1; }
    int n = read_rows(f);
    if (f != stdin) fclose(f);
    if (n <= 0) { fprintf(stderr, "classify: %s\n", n == 0 ? "no rows" : "bad input"); return 1; }

    int correct = 0, labelled = 0;
    for (int i = 0; i < n; i++) {
        int p = predict(pixels[i]);
        if (labels[i] < 0) printf("row %d: %d\n", i + 1, p);
        labelled += labels[i] >= 0;
        correct += p == labels[i];
    }
    if (labelled) printf("classify: %d rows, accuracy %.2f%% (%d/%d)\n", n, 100.0 * correct / labelled, correct, labelled);

    /* Time: passes over all rows until a quarter of a second has gone by. */
    long calls = 0;
    volatile int sink = 0;
    clock_t t0 = clock();
    while (clock() - t0 < CLOCKS_PER_SEC / 4)
        for (int i = 0; i < n; i++, calls++) sink += predict(pixels[i]);
    double seconds = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("classify: %.2f us per sample (digits_forward, one row at a time, %ld calls)\n", 1e6 * seconds / (double)calls, calls);
    return 0;
}
