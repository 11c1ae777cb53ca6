/* Allocation that fails as a value, never an abort: every caller turns NULL into an error. Tests
 * make chosen allocations fail (tg__fail_allocs) to walk every such path. */
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

/* Fault injection: allocations to let through, then to fail (< 0: all), counted down. Atomic
 * because CPU kernels allocate scratch on OpenMP threads (a sweep runs single-threaded code;
 * the counts are only approximate if threads race). */
static _Atomic long pass_left = -1, fail_left, alloc_count;

void tg__fail_allocs(long after, long count) {
    fail_left = count;
    pass_left = after;
}
long tg__alloc_count(void) { return alloc_count; }

/* Whether the allocation being made may proceed. */
static bool alloc_allowed(void) {
    alloc_count++;
    if (pass_left < 0) return true;    /* no fault injection */
    if (pass_left > 0) { pass_left--; return true; }
    if (fail_left == 0) return true;   /* the failures were spent */
    if (fail_left > 0) fail_left--;
    return false;
}

static _Thread_local long failures;
long alloc_failures(void) { return failures; }

/* More bytes than a 64-bit machine's address space holds (2^47 on x86-64 and aarch64): refused
 * here, as malloc would, because AddressSanitizer aborts on such a size instead of returning NULL. */
#define ALLOC_MAX ((size_t)1 << 47)

void *tg_alloc(size_t n) {
    void *p = alloc_allowed() && n <= ALLOC_MAX ? calloc(1, n ? n : 1) : NULL;
    failures += !p;
    return p;
}

void *tg_alloc_aligned64(size_t bytes) {
    if (bytes > ALLOC_MAX) return NULL;
    bytes = bytes ? (bytes + 63) / 64 * 64 : 64;   /* aligned_alloc wants a multiple of the alignment */
    void *p = alloc_allowed() ? aligned_alloc(64, bytes) : NULL;
    failures += !p;
    return p;
}

void *tg_realloc(void *p, size_t n) {
    void *q = alloc_allowed() && n <= ALLOC_MAX ? realloc(p, n ? n : 1) : NULL;
    failures += !q;
    return q;
}

char *tg_strdup(const char *s) {
    size_t n = strlen(s ? s : "") + 1;
    char *d = tg_alloc(n);
    if (d) memcpy(d, s ? s : "", n);
    return d;
}
