/* A small stand-in for libFuzzer's driver, for CI machines without clang: linked with a harness
 * (LLVMFuzzerTestOneInput) and built by gcc with AddressSanitizer + UndefinedBehaviorSanitizer.
 *
 *   fuzz_NAME SECONDS CORPUS_DIR...
 *
 * replays every file of the corpus directories, then runs random mutations of them (bit flips,
 * byte changes, insertions, deletions, splices of two inputs, random tails; at most 4096 bytes)
 * until SECONDS have passed. The seed is TG_FUZZ_SEED, else the clock; it is printed, so a run
 * can be repeated. A crash (a sanitizer report, an abort, a fatal signal) writes the input that
 * caused it to NAME.crash in the current directory. There is no coverage feedback: this is a
 * regression and smoke test of the seeds' neighbourhood, while the libFuzzer build (make
 * fuzz-clang) does the exploring. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_LEN 4096

typedef struct { uint8_t *data; size_t len; } input;

static uint64_t rng_state;
static uint64_t rnd(void) {   /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The input being executed, written out only if it crashes (writing every input would cost
 * more than running it). */
static char crash_path[256];
static const uint8_t *current;
static size_t current_len;

static void save_crash(void) {   /* async-signal-safe */
    int fd = open(crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    if (current_len && write(fd, current, current_len) < 0) { /* nothing more to do while dying */ }
    close(fd);
}

static void on_signal(int sig) {
    save_crash();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* With a sanitizer, its report ends in this callback; without one (and for abort(), which the
 * sanitizers leave alone), signal handlers save the input. */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static void catch_crashes(void) {
    signal(SIGABRT, on_signal);
    if (__sanitizer_set_death_callback) {
        __sanitizer_set_death_callback(save_crash);
        return;
    }
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
}

static void execute(const uint8_t *data, size_t len) {
    current = data;
    current_len = len;
    LLVMFuzzerTestOneInput(data, len);
}

static int load_dir(const char *dir, input **corpus, int *n, int *cap) {
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "cannot open corpus directory %s\n", dir); return -1; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        uint8_t *buf = malloc(MAX_LEN);
        size_t len = buf ? fread(buf, 1, MAX_LEN, f) : 0;
        fclose(f);
        if (!buf) continue;
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            input *grown = realloc(*corpus, sizeof(input) * (size_t)*cap);
            if (!grown) { free(buf); break; }
            *corpus = grown;
        }
        (*corpus)[(*n)++] = (input){ buf, len };
    }
    closedir(d);
    return 0;
}

/* A mutation of corpus entry `base` (another entry `other` for splices) into out. */
static size_t mutate(const input *base, const input *other, uint8_t *out) {
    size_t len = base->len;
    memcpy(out, base->data, len);
    int rounds = 1 + (int)(rnd() % 8);
    for (int k = 0; k < rounds; k++) {
        size_t at = len ? rnd() % len : 0;
        switch (rnd() % 7) {
        case 0: if (len) out[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
        case 1: if (len) out[at] = (uint8_t)rnd(); break;
        case 2: if (len) out[at] = (uint8_t[]){ 0, 1, 0x7f, 0x80, 0xfe, 0xff }[rnd() % 6]; break;
        case 3: if (len < MAX_LEN) { memmove(out + at + 1, out + at, len - at); out[at] = (uint8_t)rnd(); len++; } break;
        case 4: if (len) { memmove(out + at, out + at + 1, len - at - 1); len--; } break;
        case 5: {   /* splice: the tail from another input */
            size_t from = other->len ? rnd() % other->len : 0, n = other->len - from;
            if (at + n > MAX_LEN) n = MAX_LEN - at;
            memcpy(out + at, other->data + from, n);
            len = at + n;
            break;
        }
        default: {   /* random tail */
            size_t n = rnd() % 64;
            for (size_t i = 0; i < n && len < MAX_LEN; i++) out[len++] = (uint8_t)rnd();
        }
        }
    }
    return len;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SECONDS CORPUS_DIR...\n", argv[0]);
        return 2;
    }
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    snprintf(crash_path, sizeof crash_path, "%s.crash", name);
    catch_crashes();
    double budget = atof(argv[1]);
    const char *seed_env = getenv("TG_FUZZ_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    rng_state = seed;
    input *corpus = NULL;
    int n = 0, cap = 0;
    for (int i = 2; i < argc; i++)
        if (load_dir(argv[i], &corpus, &n, &cap) != 0) return 2;
    double t0 = now();
    long execs = 0;
    for (int i = 0; i < n; i++, execs++) execute(corpus[i].data, corpus[i].len);
    long replays = execs;
    input empty = { NULL, 0 };
    uint8_t *buf = malloc(MAX_LEN);
    if (!buf) return 2;
    while (now() - t0 < budget) {
        const input *base = n ? &corpus[rnd() % (uint64_t)n] : &empty, *other = n ? &corpus[rnd() % (uint64_t)n] : &empty;
        size_t len = mutate(base, other, buf);
        execute(buf, len);
        execs++;
    }
    printf("%s: %ld executions (%ld corpus replays, %ld mutations) in %.1f s, seed %llu, 0 crashes\n", name, execs, replays,
           execs - replays, now() - t0, (unsigned long long)seed);
    for (int i = 0; i < n; i++) free(corpus[i].data);
    free(corpus);
    free(buf);
    return 0;
}
