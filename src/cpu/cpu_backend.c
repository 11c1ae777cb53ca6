/* The compiled CPU backend: the graph is scheduled (fuse.c), planned (plan.c), turned into C
 * (cpu_codegen.c), built by the system C compiler into a shared object, cached on disk by a hash
 * of the source and the compiler command, and loaded with dlopen. A step is one call of the
 * generated entry point.
 *
 * Environment: TG_CC (compiler, default cc), TG_CFLAGS (default -O3; the chosen instruction set's
 * flags, cpu_isa.c, are added after it), TG_CPU_ISA (avx512, avx2 or portable), TG_CACHE_DIR
 * (default $XDG_CACHE_HOME/tensorgrad or ~/.cache/tensorgrad; one that cannot hold files makes
 * every build happen in a private temporary directory instead), TG_NO_FUSE=1 (every node gets
 * a kernel of its own: the unfused schedule, for tests), TG_FUSE_RECOMPUTE=1 (cheap values read
 * by several kernels recomputed in each, as the CUDA backend schedules them: for tests). */
#include "cpu/cpu.h"
#include "runtime/backend.h"
#include "io/cache.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void (*entry_fn)(float *A, void **B, const double *H, void *const *R);

typedef struct {
    const tg_graph *g;
    tg_plan plan;
    float *arena;
    void **bound;         /* per node: the buffer of a bound leaf */
    void *dl;
    entry_fn entry;
    char *source;
    bool *mat;            /* per node: has memory of its own (else inlined or absorbed by its consumer) */
    int *inplace;         /* per node: the PARAM/STATE leaf its kernel writes in place, or -1 */
    cpu_isa isa;          /* the generated code's instruction set, and the library kernels' at run */
    cpu_profile prof;     /* TG_CPU_PROFILE=1 (prof.seconds set): each node's calls timed, printed at release */
} cpu_exec;

/* ----- buffers: 64-byte aligned, float or int32 by dtype (both 4 bytes) ----- */

static void *cpu_alloc(size_t numel) {
    if (numel > (SIZE_MAX - 63) / 4) return NULL;
    size_t bytes = (numel * 4 + 63) / 64 * 64;
    void *p = tg_alloc_aligned64(bytes ? bytes : 64);
    if (p) memset(p, 0, bytes ? bytes : 64);
    return p;
}

static void cpu_free(void *buf) { free(buf); }

static void cpu_write(void *buf, tg_dtype dt, const double *src, size_t n) {
    if (dt == TG_INT32)
        for (size_t i = 0; i < n; i++) ((int32_t *)buf)[i] = (int32_t)src[i];
    else
        for (size_t i = 0; i < n; i++) ((float *)buf)[i] = (float)src[i];
}

static void cpu_read(const void *buf, tg_dtype dt, double *dst, size_t n) {
    if (dt == TG_INT32)
        for (size_t i = 0; i < n; i++) dst[i] = ((const int32_t *)buf)[i];
    else
        for (size_t i = 0; i < n; i++) dst[i] = ((const float *)buf)[i];
}

static void cpu_upload(void *buf, tg_dtype dt, const void *src, size_t n) { memcpy(buf, src, n * 4); }
/* A write-back whose kernel already wrote the leaf in place has dst == src. */
static void cpu_copy(void *dst, const void *src, size_t n) {
    if (dst != src) memcpy(dst, src, n * 4);
}

/* ----- the kernel cache ----- */

static void read_log(const char *path, char *buf, size_t len) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* Flags every kernel build gets (part of the cache key). -fwrapv: i32 arithmetic that overflows
 * wraps, as the reference computes it, rather than being undefined. -fno-trapping-math: nothing
 * here reads floating-point exception flags, and without it GCC cannot turn a select around a
 * multiply (relu's backward: g * (x > 0 ? 1 : 0)) into vector code except with AVX-512's masks:
 * on AVX2 such loops stayed scalar. Results are the same. */
#define FIXED_FLAGS "-fopenmp -fPIC -shared -fno-strict-aliasing -fno-math-errno -fno-trapping-math -fwrapv"

/* The compiler from TG_CC (default cc). */
static const char *compiler(void) {
    const char *cc = getenv("TG_CC");
    return cc && cc[0] ? cc : "cc";
}

/* What to say when the compiler is missing (with its name): the variable to set, and the backend
 * that still runs. */
#define NO_COMPILER                                                                                   \
    "the C compiler '%s' was not found; the compiled CPU backend builds its kernels with it at run " \
    "time: install one (apt-get install gcc) or set TG_CC to a C compiler; the 'reference' backend "  \
    "runs without one"

/* Whether the shell finds the compiler at all (exit 127: no such command). */
static bool cpu_available(tg_error *err) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s --version > /dev/null 2>&1", compiler());
    int rc = system(cmd);
    if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 127) {
        tg_seterr(err, NO_COMPILER, compiler());
        return false;
    }
    return true;
}

/* Where a build went wrong: the compiler (its message in err), or the directory, which refused a
 * file (read-only, full, not a directory). */
typedef enum { BUILD_OK, BUILD_COMPILER, BUILD_DIR } build_status;

/* Compile the source into path_so; the compiler's own message comes back in err. */
static build_status compile(const char *cc, const char *flags, const char *path_c, const char *path_so, tg_error *err) {
    char tmp[1100], log[1100], cmd[4096];
    cache_tmp_name(tmp, sizeof tmp, path_so);
    snprintf(log, sizeof log, "%s.log", path_c);
    snprintf(cmd, sizeof cmd, "%s %s %s -o '%s' '%s' -lm > '%s' 2>&1", cc, flags, FIXED_FLAGS, tmp, path_c, log);
    int rc = system(cmd);
    if (rc != 0) {
        char out[300];
        read_log(log, out, sizeof out);
        if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127)   /* the shell found no such command */
            tg_seterr(err, "kernel compilation failed: " NO_COMPILER, cc);
        else
            tg_seterr(err, "kernel compilation failed (%s, exit %d): %s", cc, rc, out[0] ? out : "(no output)");
        unlink(tmp);
        return BUILD_COMPILER;
    }
    if (rename(tmp, path_so) != 0) {
        tg_seterr(err, "cannot move the compiled kernels into the cache %s: %s", path_so, strerror(errno));
        unlink(tmp);
        return BUILD_DIR;
    }
    unlink(log);
    return BUILD_OK;
}

typedef struct { const char *source, *cc, *flags; uint64_t hash; } build;

static void build_path(const char *dir, const build *b, const char *suffix, char *path, size_t len) {
    snprintf(path, len, "%s/%016llx%s", dir, (unsigned long long)b->hash, suffix);
}

/* Load the shared object for b from dir, building it there unless it is there already; a file
 * that fails to load (truncated, corrupt) is rebuilt once. */
static build_status load_in(const char *dir, const build *b, void **dl, tg_error *err) {
    char path_c[1000], path_so[1000];
    build_path(dir, b, ".c", path_c, sizeof path_c);
    build_path(dir, b, ".so", path_so, sizeof path_so);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (access(path_so, R_OK) != 0) {
            if (!cache_write(path_c, b->source, strlen(b->source), err)) return BUILD_DIR;
            build_status st = compile(b->cc, b->flags, path_c, path_so, err);
            if (st != BUILD_OK) return st;
        }
        *dl = dlopen(path_so, RTLD_NOW | RTLD_LOCAL);
        if (*dl) return BUILD_OK;
        tg_seterr(err, "cannot load compiled kernels %s: %s", path_so, dlerror());
        unlink(path_so);
    }
    return BUILD_COMPILER;
}

/* The kernel cache refused our files (read-only, full, not a directory): build in a private
 * temporary directory instead, and remove it once loaded (the library stays mapped). Training
 * works; only the time a cache saves is lost. */
static void *load_uncached(const build *b, const char *why, tg_error *err) {
    const char *tmp = getenv("TMPDIR");
    char dir[900], path[1000];
    snprintf(dir, sizeof dir, "%s/tensorgrad-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    void *dl = NULL;
    tg_error e = { "" };
    if (!mkdtemp(dir)) tg_seterr(&e, "cannot create %s: %s", dir, strerror(errno));
    else load_in(dir, b, &dl, &e);
    static const char *const left[] = { ".c", ".so", ".c.log" };
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        build_path(dir, b, left[i], path, sizeof path);
        unlink(path);
    }
    rmdir(dir);
    if (!dl) tg_seterr(err, "the kernel cache cannot be used (%.200s), and building in a temporary directory failed too: %.250s",
                       why, e.msg);
    return dl;
}

/* Load the shared object for `source`, built for `isa`, building it on a cache miss. The flags,
 * and so the cache key, name the instruction set. */
static void *load_kernels(const char *source, cpu_isa isa, tg_error *err) {
    const char *cc = compiler(), *opt = getenv("TG_CFLAGS");
    char flags[1200];
    snprintf(flags, sizeof flags, "%s %s", opt ? opt : "-O3", cpu_isa_cflags(isa));
    build b = { source, cc, flags, 1469598103934665603ull };
    b.hash = cache_hash(b.hash, source, strlen(source));
    b.hash = cache_hash(b.hash, cc, strlen(cc) + 1);
    b.hash = cache_hash(b.hash, flags, strlen(flags) + 1);
    b.hash = cache_hash(b.hash, FIXED_FLAGS, sizeof FIXED_FLAGS);
    char dir[900];
    void *dl = NULL;
    tg_error e = { "" }, cache_err = { "" };   /* err may be NULL */
    if (cache_dir(dir, sizeof dir, &cache_err)) {
        build_status st = load_in(dir, &b, &dl, &e);
        if (st != BUILD_DIR) {
            if (!dl) tg_seterr(err, "%s", e.msg);
            return dl;
        }
        cache_err = e;
    }
    return load_uncached(&b, cache_err.msg, err);
}

/* ----- the backend ----- */

/* Where the time went (profile_print), each call as the node whose mark ends it. */
static void print_profile(const cpu_exec *e) {
    profile_call *calls = tg_alloc(sizeof(profile_call) * (size_t)(e->g->n + 1));
    int n = 0;
    for (int i = 0; i < e->g->n && calls; i++) {
        if (e->prof.seconds[i] <= 0) continue;
        profile_call *c = &calls[n++];
        c->node = i;
        c->kind = "call";
        c->seconds = e->prof.seconds[i];
        snprintf(c->what, sizeof c->what, "k%d [%lld elements]", i, (long long)e->g->nodes[i].numel);
    }
    if (calls) profile_print("cpu", "calls", "", e->g, calls, n, e->prof.runs, false);
    free(calls);
}

static void cpu_release(void *h) {
    cpu_exec *e = h;
    if (!e) return;
    if (e->prof.seconds && e->prof.runs) print_profile(e);
    free(e->prof.seconds);
    if (e->dl) dlclose(e->dl);
    free(e->arena);
    free(e->bound);
    free(e->source);
    free(e->mat);
    free(e->inplace);
    plan_free(&e->plan);
    free(e);
}

static void *cpu_prepare(const tg_graph *g, const int *keep, int n_keep, tg_error *err) {
    cpu_blas_single_threaded();
    cpu_exec *e = tg_alloc(sizeof *e);
    if (!e) { tg_seterr(err, "out of memory preparing the CPU kernels"); return NULL; }
    e->g = g;
    size_t n = (size_t)g->n + 1;
    e->mat = tg_alloc(sizeof(bool) * n);
    e->inplace = tg_alloc(sizeof(int) * n);
    e->bound = tg_alloc(sizeof(void *) * n);
    int *alias = tg_alloc(sizeof(int) * n);
    const char *nofuse = getenv("TG_NO_FUSE"), *recompute = getenv("TG_FUSE_RECOMPUTE");
    bool fuse = !(nofuse && nofuse[0] == '1');
    /* Short of memory, scheduling degrades to a plainer valid schedule; the plan and the source
     * must be whole. */
    bool ok = e->mat && e->inplace && e->bound && alias;
    if (ok) {
        for (int i = 0; i < g->n; i++) e->inplace[i] = -1;
        fuse_schedule(g, keep, n_keep, fuse, recompute && recompute[0] == '1' ? FUSE_RECOMPUTE : 0, e->mat, alias);
        if (fuse) codegen_c_refine(g, keep, n_keep, e->mat, alias, e->inplace);
        ok = plan_build(g, keep, n_keep, e->mat, alias, NULL, NULL, NULL, &e->plan);
    }
    free(alias);
    int unsupported = -1;
    const char *profile = getenv("TG_CPU_PROFILE");
    if (ok && profile && profile[0] == '1') ok = (e->prof.seconds = tg_alloc(sizeof(double) * n)) != NULL;
    if (ok) e->source = codegen_c_inplace(g, e->mat, &e->plan, CPU_PARALLEL_MIN, e->inplace, e->prof.seconds != NULL, &unsupported);
    if (unsupported >= 0) {
        tg_seterr(err, "the CPU backend has no kernel or buffer for op '%s' (node %d)", op_name(g->nodes[unsupported].op), unsupported);
        cpu_release(e);
        return NULL;
    }
    if (!ok || !e->source) {
        tg_seterr(err, "out of memory generating the CPU kernels of %d nodes (or a plan past 2^60 elements)", g->n);
        cpu_release(e);
        return NULL;
    }
    e->arena = cpu_alloc(e->plan.arena);   /* before the compiler runs: the cheaper failure first */
    if (!e->arena) {
        tg_seterr(err, "out of memory for the %zu-float arena", e->plan.arena);
        cpu_release(e);
        return NULL;
    }
    e->isa = cpu_isa_choose();
    e->dl = load_kernels(e->source, e->isa, err);
    if (e->dl) {
        *(void **)&e->entry = dlsym(e->dl, "tg_entry");
        if (!e->entry) tg_seterr(err, "compiled kernels have no entry point: %s", dlerror());
    }
    if (!e->entry) {
        cpu_release(e);
        return NULL;
    }
    return e;
}

static size_t cpu_planned_bytes(void *h) { return ((cpu_exec *)h)->plan.arena * sizeof(float); }
static void cpu_bind(void *h, int node, void *buf) { ((cpu_exec *)h)->bound[node] = buf; }

/* The library kernels generated code calls: cpu_kernels, or a test's table (cpu_set_kernel_table). */
static void *const *kernel_table;
void cpu_set_kernel_table(void *const *table) { kernel_table = table; }

static bool cpu_run(void *h, const double *hyper, tg_error *err) {
    cpu_exec *e = h;
    cpu_kernels_select(e->isa);
    void *const *table = kernel_table;
    const unsigned fp = fp_flush_denormals();   /* this thread's share of the step (cpu.h) */
    cpu_profile_begin(e->prof.seconds ? &e->prof : NULL);
    e->entry(e->arena, e->bound, hyper, table ? table : cpu_kernels);
    cpu_profile_begin(NULL);
    e->prof.runs += e->prof.seconds != NULL;
    fp_restore(fp);
    /* A kernel without scratch memory left its output wrong; the entry then skipped the in-place
     * updates (see codegen_c_inplace), and the runtime, seeing false, copies nothing back. */
    if (cpu_kernels_failed()) {
        tg_seterr(err, "out of memory for the CPU kernels' scratch buffers");
        return false;
    }
    return true;
}

/* A node's values live in its home buffer (plan_home), or in the leaf its kernel wrote in place. */
static void *cpu_node_buf(void *h, int node) {
    cpu_exec *e = h;
    node = plan_home(&e->plan, node);
    if (e->bound[node]) return e->bound[node];
    if (e->inplace[node] >= 0) return e->bound[e->inplace[node]];
    return e->plan.offset[node] == PLAN_BOUND ? NULL : e->arena + e->plan.offset[node];
}

static const char *cpu_source(void *h) { return ((cpu_exec *)h)->source; }

/* bf16 where the products have bf16 instructions (cpu_isa_bf16, for the ISA the graph's kernels
 * will run: TG_CPU_ISA's choice), else f32; never TF32, which is a GPU format. Whatever runs,
 * tg_train_precision says. */
static tg_precision cpu_precision(tg_precision want) {
    return want == TG_PRECISION_BF16 && cpu_isa_bf16(cpu_isa_choose()) ? TG_PRECISION_BF16 : TG_PRECISION_F32;
}

const tg_backend backend_cpu = {
    .name = "cpu", .alloc = cpu_alloc, .free = cpu_free, .write = cpu_write, .upload = cpu_upload, .read = cpu_read,
    .copy = cpu_copy, .prepare = cpu_prepare, .planned_bytes = cpu_planned_bytes, .bind = cpu_bind, .run = cpu_run,
    .node_buf = cpu_node_buf, .release = cpu_release, .source = cpu_source, .available = cpu_available,
    .precision = cpu_precision,
};
