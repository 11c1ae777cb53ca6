/* Which instruction set the CPU backend uses: one decision for both halves of it, the library
 * kernels (cpu_kernels.c, cpu_gemm*.c: the packed products, row kernels) and the generated code
 * (built with this ISA's flags, cpu_backend.c). The library itself is built for baseline x86-64
 * (no -march flag): its AVX2 and AVX-512 functions carry target attributes and run only where
 * the CPU reports those features, so one binary runs fast on every x86-64.
 *
 * TG_CPU_ISA=avx512|avx2|portable forces a path; the default is the best this CPU runs. Asking
 * for more than the CPU has (or for a name we do not know) falls back to the best available,
 * with a note on stderr, once per process and value. Elsewhere than x86-64 there is only the
 * portable path. */
#include "cpu/cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[] = { "portable", "avx2", "avx512" };

const char *cpu_isa_name(cpu_isa isa) { return NAMES[isa]; }

/* Explicit flags rather than -march=native: the kernel cache is keyed by the compiler command,
 * so a shared object in the cache always names the instructions it contains, and a cache moved
 * to a CPU with fewer features misses instead of loading code that traps (SIGILL). Tuning is
 * left at the compiler's generic default for the same reason: the key then says everything the
 * code depends on. */
const char *cpu_isa_cflags(cpu_isa isa) {
    switch (isa) {
    case CPU_ISA_AVX512: return "-mavx512f -mavx512dq -mavx512vl -mavx512bw -mavx2 -mfma";
    case CPU_ISA_AVX2: return "-mavx2 -mfma";
    default: return "";
    }
}

/* The best path this CPU (and its operating system: __builtin_cpu_supports checks that the
 * vector state is enabled too) runs. */
cpu_isa cpu_isa_best(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    static atomic_int best = -1;
    int b = atomic_load(&best);
    if (b < 0) {
        __builtin_cpu_init();
        bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
        b = avx512 ? CPU_ISA_AVX512 : avx2 ? CPU_ISA_AVX2 : CPU_ISA_PORTABLE;
        atomic_store(&best, b);
    }
    return (cpu_isa)b;
#else
    return CPU_ISA_PORTABLE;
#endif
}

/* The note for a TG_CPU_ISA that cannot be had, once per distinct value (a process that compiles
 * many graphs says it once). */
static void note_fallback(const char *asked, const char *why, cpu_isa used) {
    static char said[64];
    static atomic_flag lock = ATOMIC_FLAG_INIT;
    while (atomic_flag_test_and_set(&lock)) {}
    bool new_value = strncmp(said, asked, sizeof said - 1) != 0;
    if (new_value) snprintf(said, sizeof said, "%s", asked);
    atomic_flag_clear(&lock);
    if (new_value)
        fprintf(stderr, "tensorgrad: TG_CPU_ISA=%s: %s; using %s\n", asked, why, cpu_isa_name(used));
}

cpu_isa cpu_isa_choose(void) {
    cpu_isa best = cpu_isa_best();
    const char *asked = getenv("TG_CPU_ISA");
    if (!asked || !asked[0]) return best;
    for (int i = 0; i <= CPU_ISA_AVX512; i++) {
        if (strcmp(asked, NAMES[i]) != 0) continue;
        if ((cpu_isa)i <= best) return (cpu_isa)i;
        note_fallback(asked, "this CPU does not have it", best);
        return best;
    }
    note_fallback(asked, "not one of avx512, avx2, portable", best);
    return best;
}

/* The library kernels' path: process-wide, set by each run to its graph's choice (runs of graphs
 * prepared under different TG_CPU_ISA values in concurrent threads may take each other's path,
 * which is as correct: both are paths this CPU runs). */
static atomic_int active = -1;

void cpu_kernels_select(cpu_isa isa) { atomic_store_explicit(&active, (int)isa, memory_order_relaxed); }

cpu_isa cpu_kernels_isa(void) {
    int a = atomic_load_explicit(&active, memory_order_relaxed);
    return a < 0 ? cpu_isa_best() : (cpu_isa)a;
}

bool cpu_isa_bf16(cpu_isa isa) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    static atomic_int has = -1;
    int h = atomic_load(&has);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512bf16") ? 1 : 0;
        atomic_store(&has, h);
    }
    return isa == CPU_ISA_AVX512 && h;
#else
    (void)isa;
    return false;
#endif
}
