/* A tiny test harness: CHECK counts, prints failures with file:line, and main's return value
 * is the number of failures. Each test binary ends with "name: N passed, N failed". */
#ifndef TG_CHECK_H
#define TG_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdint.h>

static int check_passed, check_failed;

#define CHECK(cond, ...) do {                                                   \
    if (cond) check_passed++;                                                   \
    else { check_failed++; fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);\
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); }                 \
} while (0)

/* |a - b| <= tol * max(1, |a|, |b|)-style relative check that never passes NaN. */
static inline int check_close(double a, double b, double tol) {
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    if (m < 1) m = 1;
    return fabs(a - b) <= tol * m;
}
#define CHECK_CLOSE(a, b, tol, what) do { double a_ = (a), b_ = (b);             \
    CHECK(check_close(a_, b_, tol), "%s: %.10g vs %.10g (tol %g)", what, a_, b_, (double)(tol)); } while (0)

static inline int check_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

/* Deterministic test randomness (splitmix64): never all zeros. */
static uint64_t check_rng = 0x9E3779B97F4A7C15ull;
static inline uint64_t check_next(void) {
    uint64_t z = (check_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double check_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((check_next() >> 11) * (1.0 / 9007199254740992.0));
}
#endif
