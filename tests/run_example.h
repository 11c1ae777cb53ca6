/* Shared by the tests that run a built example end to end (test_digits.c, test_examples.c):
 * where the example binaries are, running one with its output captured, and walking that output
 * line by line. Header-only (static functions) because each tests/test_*.c is its own program.
 * Include after "check.h". */
#ifndef TG_RUN_EXAMPLE_H
#define TG_RUN_EXAMPLE_H
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

static char example_dir[4096];         /* the examples directory */
static char example_output[1 << 16];   /* what the last run printed (stdout and stderr) */

/* The examples sit next to the tests: BUILD/tests/test_x -> BUILD/tests/../examples, so a
 * sanitizer build (build-san/...) runs its own examples. Without a directory in argv[0] (run by
 * hand from the repo root), build/examples. */
static inline void example_dir_init(const char *argv0) {
    const char *slash = strrchr(argv0, '/');
    if (slash) snprintf(example_dir, sizeof example_dir, "%.*s/../examples", (int)(slash - argv0), argv0);
    else snprintf(example_dir, sizeof example_dir, "build/examples");
}

/* Runs a shell command, its output (stdout and stderr) kept in example_output; returns its exit
 * code, or -1 if it did not exit normally. */
static inline int run_command(const char *cmd) {
    example_output[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(example_output, 1, sizeof example_output - 1, p);
    example_output[n] = '\0';
    while (fgetc(p) != EOF) {}   /* drain anything past the buffer */
    int status = pclose(p);
    return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs example NAME with args; returns its exit code, or -1 if it did not exit normally. */
static inline int run_example(const char *name, const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/%s' %s 2>&1", example_dir, name, args);
    return run_command(cmd);
}

/* The line after `line` in the output, or NULL after the last:
 * for (const char *line = example_output; line && *line; line = next_line(line)) */
static inline const char *next_line(const char *line) {
    const char *nl = strchr(line, '\n');
    return nl ? nl + 1 : NULL;
}
#endif
