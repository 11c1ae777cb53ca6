/* util.h: the small things every example needs besides tensorgrad.h: a seeded random stream
 * that gives the same numbers on every machine, a wall clock for the progress line, and the
 * --precision option. */
#ifndef EXAMPLES_UTIL_H
#define EXAMPLES_UTIL_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "tensorgrad.h"

/* splitmix64, and a uniform double in [0, 1) from its top 53 bits. */
static inline uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* Seconds on a monotonic clock. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --precision f32|tf32|bf16; 0 for a name that is none of them. */
static inline tg_precision parse_precision(const char *name) {
    return !strcmp(name, "f32") ? TG_PRECISION_F32 : !strcmp(name, "tf32") ? TG_PRECISION_TF32
         : !strcmp(name, "bf16") ? TG_PRECISION_BF16 : TG_PRECISION_DEFAULT;
}

#endif
