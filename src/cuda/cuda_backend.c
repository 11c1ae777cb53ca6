/* The CUDA backend. The driver API, NVRTC and cuBLAS are loaded at run time with dlopen, so the
 * library builds, and its CPU backends run, on machines without CUDA; tg_backend_available("cuda")
 * says whether it can run here and why not.
 *
 * A graph is scheduled and planned like on the CPU, turned into CUDA C (cuda_codegen.c) and
 * compiled by NVRTC for the device's own architecture (cubins cached on disk by a hash of the
 * source, the architecture and the NVRTC version). The first run captures the whole launch list
 * (hyper scalars upload, kernels, cuBLAS products) into a CUDA graph, replayed by every
 * later run. A training step's graph also holds the write-backs, guarded on the device by the
 * step's guard node (finite only when the loss and every gradient are), and one copy of the
 * loss and the write-back flag into pinned memory: one graph launch and one synchronisation per
 * step.
 *
 * Each device is set up at its first use (primary context, stream, cuBLAS). Data parallelism
 * (src/dist/) gets a backend table per device (cuda_on_device) and runs a step of every local
 * replica through dp_step: each replica's gradient graph, the communicator's NCCL all-reduce
 * (captured at the end of that graph when the process drives one GPU, else enqueued after the
 * graphs as one NCCL group), a wait the communicator's watchdog can cut short, then each
 * replica's update graph, which only runs once the average is complete.
 *
 * TG_CUDA_PROFILE=1 runs each step's launches one by one, synchronised, and prints the time spent
 * per op (the op of the node each launch writes) when the handle is released; TG_CUDA_PROFILE=graph
 * times each launch alone in a graph of copies of it instead (closer to the step graph's timing
 * for small kernels; the values it computes are wrong); either with "-all" after it (graph-all)
 * also lists every launch in order. TG_CUDA_SMALL_REDUCTIONS=0 sends every
 * product to cuBLAS and every sum to a kernel of its own (small ones are otherwise computed
 * inside the kernels that read them), so that the tests reach both ways. Products go through
 * cuBLASLt with an algorithm chosen per shape by timing (cuda_products.c; TG_CUDA_TUNE), or
 * through cublasGemmEx where cuBLASLt has none, or everywhere with TG_CUDA_LT=0. On sm_90 and
 * later our kernels are launched early (cuda_start); TG_CUDA_EARLY=0 launches them as usual.
 * "cuda-nvrtc" is a compile-only variant for tests on machines without a GPU: it generates and
 * NVRTC-compiles every kernel for sm_90a and runs nothing. */
#include "compile/expr.h"
#include "cuda/cuda.h"
#include "cuda/cuda_api.h"
#include "runtime/backend.h"
#include "io/cache.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

cuda_driver_api tg_cuda_driver;   /* filled by load_driver (cuda_api.h) */

typedef void *nvrtcProgram;
typedef void *cublasHandle_t;

static struct {
    int (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *);
    int (*CompileProgram)(nvrtcProgram, int, const char *const *);
    int (*GetProgramLogSize)(nvrtcProgram, size_t *);
    int (*GetProgramLog)(nvrtcProgram, char *);
    int (*GetCUBINSize)(nvrtcProgram, size_t *);
    int (*GetCUBIN)(nvrtcProgram, char *);
    int (*DestroyProgram)(nvrtcProgram *);
    int (*Version)(int *, int *);
} nvrtc;

static struct {
    int (*Create)(cublasHandle_t *);
    int (*SetStream)(cublasHandle_t, CUstream);
    int (*SetMathMode)(cublasHandle_t, int);
    int (*SetWorkspace)(cublasHandle_t, void *, size_t);
    int (*GemmEx)(cublasHandle_t, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
                  const void *, void *, int, int, int, int);
    int (*GemmStridedBatchedEx)(cublasHandle_t, int, int, int, int, int, const void *, const void *, int, int, long long,
                                const void *, int, int, long long, const void *, void *, int, int, long long, int, int, int);
} cublas;

/* Open the first library of the list that loads; NULL if none. */
static void *open_any(const char *const *names) {
    for (; *names; names++) {
        void *h = dlopen(*names, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

/* Resolve each symbol into its slot; false (naming the symbol) if one is missing. */
static bool resolve(void *lib, void **slots, const char *const *names, int n, char *why, size_t len) {
    for (int i = 0; i < n; i++) {
        slots[i] = dlsym(lib, names[i]);
        if (!slots[i]) {
            snprintf(why, len, "symbol %s not found", names[i]);
            return false;
        }
    }
    return true;
}

static const char *const CU_NAMES[] = {
    "cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute", "cuDeviceGetName", "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemsetD32_v2",
    "cuMemsetD32Async", "cuModuleLoadData", "cuModuleUnload", "cuModuleGetFunction", "cuFuncSetAttribute",
    "cuLaunchKernel", "cuStreamCreate", "cuStreamSynchronize", "cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
    "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy", "cuGetErrorString", "cuPointerGetAttribute",
    "cuEventCreate", "cuEventRecord", "cuEventElapsedTime", "cuEventDestroy_v2", "cuEventSynchronize", "cuStreamQuery",
    "cuStreamWaitEvent",
};
static const char *const NVRTC_NAMES[] = {
    "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram", "nvrtcVersion",
};
static const char *const CUBLAS_NAMES[] = {
    "cublasCreate_v2", "cublasSetStream_v2", "cublasSetMathMode", "cublasSetWorkspace_v2", "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
};
static const char *const CUDA_LIBS[] = { "libcuda.so.1", "libcuda.so", NULL };
static const char *const NVRTC_LIBS[] = { "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL };
static const char *const CUBLAS_LIBS[] = { "libcublas.so.13", "libcublas.so.12", "libcublas.so", NULL };

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ----- process-wide state: the libraries loaded once, each device set up at first use ----- */

#define MAX_DEVICES 16

/* The most products that run at once, each on a stream of its own (together_plan) */
#define TOGETHER_MAX 3

/* One GPU: its primary context, the stream every handle on it enqueues on, its cuBLAS. */
typedef struct {
    bool tried, ok;
    char why[256];
    int ordinal;
    CUcontext ctx;
    CUstream stream;
    cublasHandle_t blas;
    lt_device lt;           /* cuBLASLt, sharing cuBLAS's workspace (one stream: never at once) */
    /* products run at once (together_plan): streams that fork from `stream` and join it again */
    CUstream side[TOGETHER_MAX - 1];
    CUevent fork, joined[TOGETHER_MAX - 1];
    CUstream beside;        /* the launches off the critical path (side_plan) */
    CUdeviceptr beside_ws;  /* the workspace of the products on it, which run one after another */
    char arch[16];          /* "sm_90a" */
    char name[128];
} cuda_device;

static struct {
    pthread_once_t nvrtc_once, driver_once;
    bool nvrtc_ok, driver_ok;
    char nvrtc_why[256], driver_why[256];
    int count;              /* devices the driver sees */
    pthread_mutex_t mu;     /* device setup */
    cuda_device dev[MAX_DEVICES];
    int n_ready, only;      /* devices set up; the one, while there is one */
} g_cuda = { .nvrtc_once = PTHREAD_ONCE_INIT, .driver_once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER };

static void load_nvrtc(void) {
    void *lib = open_any(NVRTC_LIBS);
    if (!lib) {
        snprintf(g_cuda.nvrtc_why, sizeof g_cuda.nvrtc_why, "NVRTC (libnvrtc.so) is not installed");
        return;
    }
    g_cuda.nvrtc_ok = resolve(lib, (void **)&nvrtc, NVRTC_NAMES, N_OF(NVRTC_NAMES), g_cuda.nvrtc_why, sizeof g_cuda.nvrtc_why);
}

static const char *cu_error(CUresult r) {
    const char *s = NULL;
    if (cu.GetErrorString) cu.GetErrorString(r, &s);
    return s ? s : "unknown CUDA error";
}

#define WHY(...) snprintf(g_cuda.driver_why, sizeof g_cuda.driver_why, __VA_ARGS__)

/* The driver, cuBLAS and the device count; no context yet (a process may use only device 3). */
static void load_driver(void) {
    pthread_once(&g_cuda.nvrtc_once, load_nvrtc);
    if (!g_cuda.nvrtc_ok) { WHY("%s", g_cuda.nvrtc_why); return; }
    void *lib = open_any(CUDA_LIBS);
    if (!lib) { WHY("the CUDA driver (libcuda.so.1) is not installed"); return; }
    if (!resolve(lib, (void **)&cu, CU_NAMES, N_OF(CU_NAMES), g_cuda.driver_why, sizeof g_cuda.driver_why)) return;
    *(void **)&cu.LaunchKernelEx = dlsym(lib, "cuLaunchKernelEx");
    *(void **)&cu.MemHostGetDevicePointer = dlsym(lib, "cuMemHostGetDevicePointer_v2");
    static const char *const graph_names[] = {   /* optional: cuda_counters.c checks them */
        "cuStreamGetCaptureInfo_v2", "cuGraphGetNodes", "cuGraphGetRootNodes", "cuGraphNodeGetType", "cuGraphMemsetNodeGetParams",
        "cuGraphNodeGetDependencies_v2", "cuGraphNodeGetDependentNodes_v2", "cuGraphAddDependencies_v2", "cuGraphDestroyNode",
    };
    void **graph_fns = (void **)&cu.StreamGetCaptureInfo;
    for (int i = 0; i < N_OF(graph_names); i++) graph_fns[i] = dlsym(lib, graph_names[i]);
    void *blas = open_any(CUBLAS_LIBS);
    if (!blas) { WHY("cuBLAS (libcublas.so) is not installed"); return; }
    if (!resolve(blas, (void **)&cublas, CUBLAS_NAMES, N_OF(CUBLAS_NAMES), g_cuda.driver_why, sizeof g_cuda.driver_why))
        return;
    CUresult r = cu.Init(0);
    if (r == 0) r = cu.DeviceGetCount(&g_cuda.count);
    if (r != 0 || g_cuda.count == 0) { WHY("no CUDA device (%s)", r ? cu_error(r) : "none found"); return; }
    g_cuda.driver_ok = true;
}

/* Context, stream and cuBLAS (with its own workspace, so nothing allocates during graph
 * capture) of device d; false with v->why. */
static bool setup_device(int d, cuda_device *v) {
    int major = 0, minor = 0, sms = 0;
    CUdevice dev;
    CUresult r;
    v->ordinal = d;
    if ((r = cu.DeviceGet(&dev, d)) || (r = cu.DeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, dev)) ||
        (r = cu.DeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, dev)) || (r = cu.DeviceGetAttribute(&sms, CU_ATTR_SMS, dev)) ||
        (r = cu.DeviceGetName(v->name, 127, dev)) ||
        (r = cu.DevicePrimaryCtxRetain(&v->ctx, dev)) || (r = cu.CtxSetCurrent(v->ctx)) || (r = cu.StreamCreate(&v->stream, 0)) ||
        (r = cu.StreamCreate(&v->beside, 0)) || (r = cu.EventCreate(&v->fork, CU_EVENT_DISABLE_TIMING))) {
        snprintf(v->why, sizeof v->why, "CUDA device %d setup failed: %s", d, cu_error(r));
        return false;
    }
    for (int k = 0; k < TOGETHER_MAX - 1; k++)
        if ((r = cu.StreamCreate(&v->side[k], 0)) || (r = cu.EventCreate(&v->joined[k], CU_EVENT_DISABLE_TIMING))) {
            snprintf(v->why, sizeof v->why, "CUDA device %d setup failed: %s", d, cu_error(r));
            return false;
        }
    /* sm_90 as sm_90a: Hopper's own instructions (warpgroup MMAs: attention), cubins for this device only */
    snprintf(v->arch, sizeof v->arch, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
    CUdeviceptr ws;
    if (cublas.Create(&v->blas) || cublas.SetStream(v->blas, v->stream) || cublas.SetMathMode(v->blas, 0) ||
        cu.MemAlloc(&ws, 32u << 20) || cublas.SetWorkspace(v->blas, (void *)ws, 32u << 20) || cu.MemAlloc(&v->beside_ws, 32u << 20)) {
        snprintf(v->why, sizeof v->why, "cuBLAS setup failed on device %d", d);
        return false;
    }
    /* our product kernel's shared memory, 12.5 KB a warp: up to 16 warps in an sm_90 block's 227 KB */
    const char *early = getenv("TG_CUDA_EARLY");
    v->lt = (lt_device){ d, v->name, lt_handle_new(), v->stream, ws, 32u << 20, major >= 9 ? 16 : 4, sms,
                         major >= 9 && cu.LaunchKernelEx && !(early && early[0] == '0') };
    return true;
}

/* cuLaunchKernelEx's configuration and one attribute (cuda.h's CUlaunchConfig, CUlaunchAttribute) */
typedef struct {
    int id;
    char pad[4];
    union { char bytes[64]; int allowed; void *align; } value;
} cu_launch_attribute;
typedef struct {
    unsigned grid[3], block[3], shared;
    CUstream stream;
    cu_launch_attribute *attrs;
    unsigned n_attrs;
} cu_launch_config;
#define CU_LAUNCH_PROGRAMMATIC_SERIALIZATION 6

/* A step of a small model is mostly short kernels, each waiting about 2 us for the one before it
 * to finish and its own blocks to be dispatched. Launched early (programmatic dependent launch),
 * a kernel is dispatched while the one before it runs, once every block of that one has passed
 * its tgk_prior, and its own blocks wait there for that kernel's results: the dispatch no longer
 * waits. Kernels of cuBLAS and the write-backs are launched as usual, and a kernel launched early
 * after one of them just starts when it ends. */
CUresult cuda_start(CUfunction f, const unsigned grid[3], unsigned block, unsigned shared, CUstream stream, void **args,
                     bool early) {
    if (!early || !cu.LaunchKernelEx)
        return cu.LaunchKernel(f, grid[0], grid[1], grid[2], block, 1, 1, shared, stream, args, NULL);
    cu_launch_attribute attr = { .id = CU_LAUNCH_PROGRAMMATIC_SERIALIZATION, .value.allowed = 1 };
    cu_launch_config config = { { grid[0], grid[1], grid[2] }, { block, 1, 1 }, shared, stream, &attr, 1 };
    return cu.LaunchKernelEx(&config, f, args, NULL);
}

static bool nvrtc_ready(tg_error *err) {
    pthread_once(&g_cuda.nvrtc_once, load_nvrtc);
    if (!g_cuda.nvrtc_ok) tg_seterr(err, "CUDA is not available: %s", g_cuda.nvrtc_why);
    return g_cuda.nvrtc_ok;
}

static bool driver_ready(tg_error *err) {
    pthread_once(&g_cuda.driver_once, load_driver);
    if (!g_cuda.driver_ok) tg_seterr(err, "CUDA is not available: %s", g_cuda.driver_why);
    return g_cuda.driver_ok;
}

/* Device d, set up at its first use and made current on the calling thread (which may be new);
 * NULL with err set. */
static cuda_device *device_at(int d, tg_error *err) {
    if (!driver_ready(err)) return NULL;
    if (d < 0 || d >= g_cuda.count || d >= MAX_DEVICES) {
        tg_seterr(err, "CUDA is not available: no device %d (this machine has %d%s)", d, g_cuda.count,
                  d >= MAX_DEVICES ? "; at most 16 are used" : "");
        return NULL;
    }
    pthread_mutex_lock(&g_cuda.mu);
    cuda_device *v = &g_cuda.dev[d];
    if (!v->tried) {
        v->tried = true;
        v->ok = setup_device(d, v);
        if (v->ok && g_cuda.n_ready++ == 0) g_cuda.only = d;
    }
    pthread_mutex_unlock(&g_cuda.mu);
    if (!v->ok) { tg_seterr(err, "CUDA is not available: %s", v->why); return NULL; }
    cu.CtxSetCurrent(v->ctx);
    return v;
}

/* Whether the backend can run here: the libraries and a device (set up when first used). */
static bool device_ready(tg_error *err) { return driver_ready(err); }

/* ----- compiling kernels ----- */

/* NVRTC-compile `source` for `arch`, through the disk cache; a malloc'd cubin or NULL. */
static void *compile_cubin(const char *source, const char *arch, size_t *len, tg_error *err) {
    if (!nvrtc_ready(err)) return NULL;
    int major = 0, minor = 0;
    nvrtc.Version(&major, &minor);
    char dir[900], path[1000], ver[32];
    tg_error ignore;
    /* NVRTC compiles in memory: a cache that cannot be used only costs time. */
    bool cached = cache_dir(dir, sizeof dir, &ignore);
    snprintf(ver, sizeof ver, "%s nvrtc %d.%d", arch, major, minor);
    uint64_t h = cache_hash(cache_hash(1469598103934665603ull, source, strlen(source)), ver, strlen(ver));
    snprintf(path, sizeof path, "%s/%016llx.cubin", cached ? dir : "(no cache)", (unsigned long long)h);
    void *cubin = cached ? cache_read(path, len) : NULL;
    if (cubin) return cubin;

    char src_path[1000], opt_arch[40];
    snprintf(src_path, sizeof src_path, "%s/%016llx.cu", cached ? dir : "(no cache)", (unsigned long long)h);
    if (cached) cache_write(src_path, source, strlen(source), &ignore);   /* for reading compile errors; optional */
    snprintf(opt_arch, sizeof opt_arch, "-arch=%s", arch);
    const char *opts[] = { opt_arch, "-std=c++17" };
    nvrtcProgram prog;
    if (nvrtc.CreateProgram(&prog, source, src_path, 0, NULL, NULL) != 0) { tg_seterr(err, "nvrtcCreateProgram failed"); return NULL; }
    int rc = nvrtc.CompileProgram(prog, 2, opts);
    if (rc != 0) {
        size_t n = 0;
        nvrtc.GetProgramLogSize(prog, &n);
        char *log = tg_alloc(n + 1);
        if (log) nvrtc.GetProgramLog(prog, log);
        tg_seterr(err, "CUDA kernel compilation failed (NVRTC, %s; source %s): %.400s", arch, src_path, log ? log : "(no memory for the log)");
        free(log);
        nvrtc.DestroyProgram(&prog);
        return NULL;
    }
    nvrtc.GetCUBINSize(prog, len);
    cubin = tg_alloc(*len);
    if (cubin) nvrtc.GetCUBIN(prog, cubin);
    nvrtc.DestroyProgram(&prog);
    if (!cubin) { tg_seterr(err, "out of memory for the compiled CUDA kernels (%zu bytes)", *len); return NULL; }
    if (cached) cache_write(path, cubin, *len, &ignore);   /* a cache that cannot be written only costs time */
    return cubin;
}

/* ----- compiling in parallel -----
 * NVRTC compiles a program on one thread, and a step's kernels are independent: the source is cut
 * into parts (the shared prelude, then a share of the kernels each), compiled on threads of their
 * own (each part through the cache) and loaded as modules of their own. The costliest kernels go
 * first, each to the part with the least so far, so that the part that takes longest is not much
 * longer than its longest kernel. */
#define MAX_PARTS 16   /* parts compile at once where the machine has the processors */

typedef struct {
    strbuf source;
    const char *arch;
    int cost;
    void *cubin;
    size_t len;
    tg_error err;
} cuda_part;

static void parts_free(cuda_part *parts, int n) {
    for (int p = 0; p < n; p++) {
        free(parts[p].source.s);
        free(parts[p].cubin);
    }
}

typedef struct { const char *at; int len, cost; } kernel_text;

/* What a kernel's text costs NVRTC, roughly, in hundredths of a second (NVRTC 13.0 on a 2-core VM;
 * the prelude alone 0.21 s): a generated kernel a unit per 2 KB (14 KB took 0.03 s, kcheck's 28 KB
 * 0.25, a whole optimizer update's 73 KB 0.32), an instance of a library template what it took,
 * the f32 attention backward (three TF32 products a product) 1.6 s, the other attention kernels
 * and our products 0.2 to 0.6 s. */
static int kernel_cost(const char *k, int len) {
    static const struct { const char *calls; int cost; } TEMPLATES[] = {
        { "tgk_attention_bwd_mma<tgm_f32x3", 160 }, { "tgk_attention", 50 }, { "tgk_gemm", 50 },
    };
    for (size_t t = 0; t < sizeof TEMPLATES / sizeof *TEMPLATES; t++)
        if (memmem(k, (size_t)len, TEMPLATES[t].calls, strlen(TEMPLATES[t].calls))) return TEMPLATES[t].cost;
    return 1 + len / 2048;
}

static int by_cost(const void *a, const void *b) {
    const kernel_text *x = a, *y = b;
    return y->cost != x->cost ? y->cost - x->cost : (x->at > y->at) - (x->at < y->at);
}

static void *compile_part(void *arg) {
    cuda_part *p = arg;
    if (p->source.oom) tg_seterr(&p->err, "out of memory cutting the CUDA source into parts");
    else p->cubin = compile_cubin(p->source.s, p->arch, &p->len, &p->err);
    return NULL;
}

static const char KERNEL[] = "extern \"C\" __global__ void ";

/* Where the text of the first kernel at or after `from` begins: at the functions only it calls
 * (CUDA_FUNCTIONS_MARK), else at the kernel itself; NULL past the last. */
static const char *kernel_start(const char *from) {
    const char *k = strstr(from, KERNEL), *f = strstr(from, CUDA_FUNCTIONS_MARK);
    return f && (!k || f < k) ? f : k;
}

/* The kernel whose text begins at `at`: its length, to the next one's start. */
static int kernel_len(const char *at) {
    const char *next = kernel_start(strstr(at, KERNEL) + 1);
    return (int)(next ? next - at : (long)strlen(at));
}

/* The kernels after the prelude shared out (see above); then every part compiled, on threads.
 * The number of parts (returned; 0 with err set on failure) grows with the cost, up to the
 * machine's processors. */
static int compile_parts(const char *source, size_t prelude, const char *arch, cuda_part *parts, tg_error *err) {
    int total = 0, n_k = 0;
    for (const char *k = kernel_start(source + prelude); k; k = kernel_start(k + kernel_len(k))) n_k++;
    kernel_text *ks = tg_alloc(sizeof *ks * (size_t)(n_k + 1));
    if (!ks) {
        tg_seterr(err, "out of memory cutting the CUDA source into parts");
        return 0;
    }
    n_k = 0;
    for (const char *k = kernel_start(source + prelude); k; k = kernel_start(k + kernel_len(k))) {
        int len = kernel_len(k);
        ks[n_k] = (kernel_text){ k, len, kernel_cost(k, len) };
        total += ks[n_k++].cost;
    }
    qsort(ks, (size_t)n_k, sizeof *ks, by_cost);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = 1 + total / 24;
    if (n > MAX_PARTS) n = MAX_PARTS;
    if (n > cpus) n = cpus > 1 ? (int)cpus : 1;
    for (int p = 0; p < n; p++) {
        parts[p] = (cuda_part){ .arch = arch };
        sb_printf(&parts[p].source, "%.*s", (int)prelude, source);
    }
    for (int q = 0; q < n_k; q++) {
        int best = 0;
        for (int p = 1; p < n; p++)
            if (parts[p].cost < parts[best].cost) best = p;
        parts[best].cost += ks[q].cost;
        sb_printf(&parts[best].source, "%.*s", ks[q].len, ks[q].at);
    }
    free(ks);
    pthread_t th[MAX_PARTS];
    bool started[MAX_PARTS] = { false };
    for (int p = 1; p < n; p++) started[p] = pthread_create(&th[p], NULL, compile_part, &parts[p]) == 0;
    compile_part(&parts[0]);
    for (int p = 1; p < n; p++) {
        if (started[p]) pthread_join(th[p], NULL);
        else compile_part(&parts[p]);   /* no thread to be had: here, in turn */
    }
    for (int p = 0; p < n; p++)
        if (!parts[p].cubin) {
            *err = parts[p].err;
            parts_free(parts, n);
            return 0;
        }
    return n;
}

/* ----- buffers ----- */

/* The device a buffer lives on, its context made current: every entry point does this first,
 * since the calling thread may be new (an async worker, a caller's own thread) and, with data
 * parallelism, buffers live on several devices. */
static cuda_device *device_of(CUdeviceptr p) {
    int d = g_cuda.only;
    if (g_cuda.n_ready > 1) cu.PointerGetAttribute(&d, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
    cuda_device *v = &g_cuda.dev[d >= 0 && d < MAX_DEVICES ? d : 0];
    cu.CtxSetCurrent(v->ctx);
    return v;
}

static void *cuda_alloc(int d, size_t numel) {
    cuda_device *v = device_at(d, NULL);
    CUdeviceptr p = 0;
    size_t bytes = (numel ? numel : 1) * 4;
    if (!v || cu.MemAlloc(&p, bytes) != 0) return NULL;
    cu.MemsetD32(p, 0, bytes / 4);
    return (void *)p;
}

static void cuda_free(void *buf) {
    device_of((CUdeviceptr)buf);
    cu.MemFree((CUdeviceptr)buf);
}

/* Host <-> device conversions go through a fixed buffer, chunk by chunk: no allocation, so
 * nothing to fail (write and read cannot report an error). */
#define XFER_CHUNK 4096

static void cuda_write(void *buf, tg_dtype dt, const double *src, size_t n) {
    device_of((CUdeviceptr)buf);
    union { float f[XFER_CHUNK]; int32_t i[XFER_CHUNK]; } tmp;
    for (size_t at = 0; at < n; at += XFER_CHUNK) {
        size_t k = n - at < XFER_CHUNK ? n - at : XFER_CHUNK;
        for (size_t i = 0; i < k; i++) {
            if (dt == TG_INT32) tmp.i[i] = (int32_t)src[at + i];
            else tmp.f[i] = (float)src[at + i];
        }
        cu.MemcpyHtoD((CUdeviceptr)buf + at * 4, &tmp, k * 4);
    }
}

static void cuda_read(const void *buf, tg_dtype dt, double *dst, size_t n) {
    cuda_device *v = device_of((CUdeviceptr)buf);
    union { float f[XFER_CHUNK]; int32_t i[XFER_CHUNK]; } tmp;
    cu.StreamSynchronize(v->stream);
    for (size_t at = 0; at < n; at += XFER_CHUNK) {
        size_t k = n - at < XFER_CHUNK ? n - at : XFER_CHUNK;
        cu.MemcpyDtoH(&tmp, (CUdeviceptr)buf + at * 4, k * 4);
        for (size_t i = 0; i < k; i++) dst[at + i] = dt == TG_INT32 ? tmp.i[i] : tmp.f[i];
    }
}

static void cuda_upload(void *buf, tg_dtype dt, const void *src, size_t n) {
    device_of((CUdeviceptr)buf);
    cu.MemcpyHtoD((CUdeviceptr)buf, src, n * 4);
}

static void cuda_copy(void *dst, const void *src, size_t n) {
    device_of((CUdeviceptr)dst);
    cu.MemcpyDtoD((CUdeviceptr)dst, (CUdeviceptr)src, n * 4);
}

/* ----- executors ----- */

typedef struct { const float *src; float *dst; long long n; } wb_entry;   /* = tgk_copy on the device */

/* tg_steps: steps queued without waiting for each. Slot s has its own step graph, which reads its
 * hyper scalars from `hyper` and leaves its loss and write-back flag in `loss` (both pinned); its
 * inputs are staged in pinned `inputs` and copied up on the stream before the graph; `done` is
 * recorded after it. A slot is reused only once its step was waited for. */
#define QUEUE_DEPTH 3
typedef struct {
    CUgraphExec graph;
    double *hyper;
    float *loss;             /* loss, flag */
    char *inputs;
    size_t in_cap;
    CUevent done;
} queue_slot;

/* What a launch reads and writes (side_plan): spans of device memory, each read or written; known
 * false where that is not known (nothing then runs beside it). */
typedef struct { CUdeviceptr lo, hi; bool write, scratch; } touch;   /* scratch: a product's workspace */
typedef struct { touch *a; int n; bool known; } touches;

typedef struct {
    cuda_device *dev;        /* where its buffers live and its launches run (NULL: cuda-nvrtc) */
    const tg_graph *g;       /* the graph it runs: the caller's, or `folded` */
    tg_graph *folded;        /* the caller's with products and their addends folded (cuda_fold_addends), or NULL */
    tg_plan plan;
    cuda_plan launches;
    char *source;
    CUmodule module[MAX_PARTS];   /* the kernels, compiled in parts (compile_parts) */
    int n_modules;
    CUfunction *fn;          /* per launch (CL_KERNEL) */
    CUfunction writeback, wb_check;
    /* hyper_dev: the hyper scalars, then HYPER_EXTRA slots: the write-back flag (zeroed by the
     * upload of every run, as the host's slot after the scalars is 0), the report (the loss and
     * the flag, read back in one copy) and the poison: set by a step that changed nothing, so
     * that the steps queued after it change nothing either (tg_steps stops at a failed step);
     * cleared before the next step that is not queued behind it (poisoned: it may be set), and
     * before the first queued step of a call. Generated kernels find them at H + flag_slot. */
    CUdeviceptr arena, table, hyper_dev, wb_table, wb_flag, wb_report, wb_poison;
    bool poisoned;
    queue_slot q[QUEUE_DEPTH];
    int q_head, q_count;
    void **bound;            /* host mirror of the device table of bound leaves */
    bool table_dirty;
    double *hyper_host;      /* pinned */
    int n_hyper;             /* slots of hyper_host and hyper_dev */
    float *loss_host;        /* pinned */
    CUgraphExec run_graph, step_graph;
    CUgraphExec dp_graph;    /* data parallel: the run, with the all-reduce captured after it when alone */
    int n_wb, n_inplace;     /* the step's write-backs copied by tg_writeback, and those replaced in place */
    /* TG_CUDA_PROFILE=1: every launch between two events, run eagerly; seconds per launch.
     * TG_CUDA_PROFILE=graph: each launch also timed alone, PROFILE_COPIES copies of it in a graph */
    double *profile;
    CUevent *marks;          /* n launches + 1 */
    int profiled_runs;
    bool profile_graph, profile_all;
    /* tf32, bf16: product operands rounded into two slots of scratch (rounded_operands) */
    CUfunction to_rounded;
    /* bf16: a product's addend that cuBLASLt does not add: its f32 sums into sums (sized by
     * products_ready), then tg_add_addend */
    CUfunction add_addend;
    CUfunction zero;         /* tg_zero: CL_MEMSET's launches */
    CUfunction begin, report;   /* tg_begin, tg_report: a graph's first and last kernels (graph_begin, report_loss) */
    CUdeviceptr sums;
    CUdeviceptr slot[2];
    int slot_holds[2];       /* the node each slot holds in this enqueue, or -1 */
    int conversions;         /* rounding launches per step */
    /* Per launch, a product's cuBLASLt descriptors and algorithm (desc NULL: through cublasGemmEx),
     * chosen before the first capture (products_ready). */
    lt_product *lt;
    bool lt_ready;
    int *together;           /* per launch: how many from it run at once, 1 alone, 0 a later one (together_plan) */
    touches *touched;        /* per launch: what it reads and writes (side_plan) */
    bool *side;              /* per launch: on the side stream */
    CUevent *side_done;      /* per launch on the side stream: recorded after it */
    /* per launch: a memset enqueued early, after launch `after` (-1: in place), on a stream of its own, once side
     * launch `wait` is done (-1: none) */
    struct early_clear { int after, wait; } *clear;
    CUfunction own[4];       /* our small-product kernel by (ta, tb) (f32 and tf32 graphs), else NULL */
    CUfunction x3[4];        /* our tensor-core f32 product kernel by (ta, tb) (f32 graphs), else NULL */
    CUfunction x3_sum;       /* and its split reductions' sum */
    cuda_counters counters;  /* cuBLASLt's counters: a window per call that has them, zeroed at the start (cuda_counters.c) */
} cuda_exec;

#define HYPER_EXTRA 3     /* device slots past them: the write-back flag, the report and the poison */

/* Where the time went (profile_print): each launch as the op of the node it writes (a product's
 * operand roundings count as matmul; a memset as none). */
static void print_profile(const cuda_exec *e) {
    profile_call *calls = tg_alloc(sizeof(profile_call) * (size_t)(e->launches.n + 1));
    for (int i = 0; i < e->launches.n && calls; i++) {
        const cuda_launch *l = &e->launches.launch[i];
        profile_call *c = &calls[i];
        c->node = l->kind == CL_MEMSET ? -1 : l->node;
        c->kind = l->kind == CL_GEMM ? "gemm" : l->kind == CL_MEMSET ? "memset" : l->name;
        c->seconds = e->profile[i];
        if (l->kind == CL_GEMM)
            snprintf(c->what, sizeof c->what, "[%lld x %lld x %lld%s%s, batch %lld]", (long long)l->M, (long long)l->N,
                     (long long)l->K, l->ta ? " ta" : "", l->tb ? " tb" : "", (long long)l->batch);
        else
            snprintf(c->what, sizeof c->what, "[%lld elements]", (long long)e->g->nodes[l->node].numel);
    }
    if (calls)
        profile_print("cuda", "launches",
                      e->profile_graph ? ", each timed alone in a graph of copies of it; the values computed are wrong" : "", e->g,
                      calls, e->launches.n, e->profiled_runs, e->profile_all);
    free(calls);
}

static void side_free(cuda_exec *e);

static void cuda_release(void *h) {
    cuda_exec *e = h;
    if (!e) return;
    cu.CtxSetCurrent(e->dev->ctx);
    if (e->profile) {
        print_profile(e);
        free(e->profile);
    }
    for (int i = 0; e->marks && i <= e->launches.n; i++)
        if (e->marks[i]) cu.EventDestroy(e->marks[i]);
    free(e->marks);
    if (e->run_graph) cu.GraphExecDestroy(e->run_graph);
    if (e->step_graph) cu.GraphExecDestroy(e->step_graph);
    if (e->dp_graph) cu.GraphExecDestroy(e->dp_graph);
    for (int m = 0; m < e->n_modules; m++) cu.ModuleUnload(e->module[m]);
    if (e->arena) cu.MemFree(e->arena);
    if (e->table) cu.MemFree(e->table);
    if (e->hyper_dev) cu.MemFree(e->hyper_dev);
    if (e->wb_table) cu.MemFree(e->wb_table);
    if (e->sums) cu.MemFree(e->sums);
    for (int k = 0; k < QUEUE_DEPTH; k++) {
        queue_slot *q = &e->q[k];
        if (q->graph) cu.GraphExecDestroy(q->graph);
        if (q->done) cu.EventDestroy(q->done);
        if (q->hyper) cu.MemFreeHost(q->hyper);
        if (q->loss) cu.MemFreeHost(q->loss);
        if (q->inputs) cu.MemFreeHost(q->inputs);
    }
    for (int k = 0; k < 2; k++)
        if (e->slot[k]) cu.MemFree(e->slot[k]);
    if (e->hyper_host) cu.MemFreeHost(e->hyper_host);
    if (e->loss_host) cu.MemFreeHost(e->loss_host);
    for (int i = 0; e->lt && i < e->launches.n; i++) lt_product_free(&e->lt[i]);
    free(e->lt);
    free(e->together);
    side_free(e);
    counters_free(&e->counters);
    cuda_plan_free(&e->launches);
    plan_free(&e->plan);
    cuda_fold_free(e->folded);
    free(e->fn);
    free(e->bound);
    free(e->source);
    free(e);
}

/* Parameters and optimizer state replaced in place (codegen_cuda): plan_inplace's candidates,
 * updates after every gradient, where kcheck can read each gradient the optimizer reads (f32, in
 * a buffer of the step's or, in data parallelism's update graph, a bound leaf: the averaged
 * values); NULL (every write-back copied at the end, its values checked) otherwise, or with
 * TG_CUDA_INPLACE=0 (A/B runs, tests of both). */
static int *inplace_candidates(const tg_graph *g, const tg_plan *plan, const int *keep, int n_keep, const bool *mat,
                               const int *alias) {
    const char *env = getenv("TG_CUDA_INPLACE");
    if (g->n_assigns == 0 || !g->grad_of_param || !g->param_node || (env && env[0] == '0')) return NULL;
    int after = -1;
    for (int i = 0; i < g->n_params; i++) {
        int gr = g->grad_of_param[i], h = gr >= 0 ? plan_home(plan, gr) : -1;
        if (g->param_node[i] < 0 || gr < 0) continue;
        if (g->nodes[gr].dtype != TG_FLOAT32 || (!cg_is_bound(g->nodes[h].op) && plan->offset[h] == PLAN_BOUND)) return NULL;
        if (gr > after) after = gr;
    }
    int *ok = tg_alloc(sizeof(int) * (size_t)(g->n + 1));
    if (ok && !plan_inplace(g, keep, n_keep, mat, alias, after, ok)) {
        free(ok);
        ok = NULL;
    }
    return ok;
}

static void hold_side_inputs(const tg_graph *g, const bool *mat, const int *alias, int *live_until);

/* Schedule, plan and generate; true with e->source set, false (err set) when memory runs out. */
static bool generate(cuda_exec *e, const tg_graph *g, const int *keep, int n_keep, const char *arch, tg_error *err) {
    const char *small = getenv("TG_CUDA_SMALL_REDUCTIONS");   /* =0: none computed inline (tests) */
    const bool inline_small = !(small && small[0] == '0');
    e->folded = cuda_fold_addends(g, keep, n_keep, inline_small);
    g = e->g = e->folded ? e->folded : g;
    bool *mat = tg_alloc(sizeof(bool) * (size_t)(g->n + 1)), *want = tg_alloc(sizeof(bool) * (size_t)(g->n + 1));
    bool *only = tg_alloc(sizeof(bool) * (size_t)(g->n + 1)), *want_t = tg_alloc(sizeof(bool) * (size_t)(g->n + 1));
    int *alias = tg_alloc(sizeof(int) * (size_t)(g->n + 1)), *runs = tg_alloc(sizeof(int) * (size_t)(g->n + 1));
    int *born = tg_alloc(sizeof(int) * (size_t)(g->n + 1));
    bool ok = mat && want && want_t && only && alias && runs && born;
    if (ok) {
        fuse_schedule(g, keep, n_keep, true, FUSE_RECOMPUTE | FUSE_SOFTMAX_INPUT | (inline_small ? FUSE_SMALL_REDUCTIONS : 0),
                      mat, alias);
        cuda_refine(g, keep, n_keep, mat);
        cuda_kernel_runs(g, mat, alias, runs);
        hold_side_inputs(g, mat, alias, runs);
        cuda_sums_early(g, mat, alias, born);
        cuda_shadow_wanted(g, atoi(arch + 3), mat, alias, keep, n_keep, want, want_t, only);
    }
    ok = ok && plan_build(g, keep, n_keep, mat, alias, runs, only, born, &e->plan);
    if (ok && g->precision != TG_PRECISION_F32) ok = plan_shadows(g, &e->plan, want, want_t, g->precision == TG_PRECISION_BF16 ? 2 : 4);
    int *inplace_ok = ok ? inplace_candidates(g, &e->plan, keep, n_keep, mat, alias) : NULL;
    free(want);
    free(want_t);
    free(only);
    free(alias);
    free(runs);
    free(born);
    int unsupported = -1;
    if (ok) e->source = codegen_cuda(g, mat, &e->plan, inplace_ok, &e->launches, atoi(arch + 3), &unsupported);
    free(inplace_ok);
    free(mat);
    if (unsupported >= 0)
        tg_seterr(err, "the CUDA backend has no kernel or buffer for op '%s' (node %d)", op_name(g->nodes[unsupported].op), unsupported);
    else if (!e->source)
        tg_seterr(err, "out of memory generating the CUDA kernels of %d nodes (or a plan past 2^60 elements)", g->n);
    return e->source != NULL;
}

#define TRY(call, what) do { CUresult r_ = (call); if (r_) { tg_seterr(err, "%s: %s", what, cu_error(r_)); goto fail; } } while (0)

/* Kernel `name` in whichever compiled part of the source it went to */
static CUresult module_function(const cuda_exec *e, const char *name, CUfunction *f) {
    CUresult r = CUDA_ERROR_NOT_FOUND;
    for (int m = 0; m < e->n_modules && r == CUDA_ERROR_NOT_FOUND; m++) r = cu.ModuleGetFunction(f, e->module[m], name);
    return r;
}

static void *cuda_prepare(int d, const tg_graph *g, const int *keep, int n_keep, tg_error *err) {
    cuda_device *dev = device_at(d, err);
    if (!dev) return NULL;
    cuda_exec *e = tg_alloc(sizeof *e);
    if (!e) { tg_seterr(err, "out of memory preparing the CUDA kernels"); return NULL; }
    e->dev = dev;
    cuda_part parts[MAX_PARTS];
    int n_parts = generate(e, g, keep, n_keep, dev->arch, err) ? compile_parts(e->source, e->launches.prelude, dev->arch, parts, err) : 0;
    if (!n_parts) goto fail;
    CUresult r = 0;
    for (; e->n_modules < n_parts && !r; e->n_modules++) r = cu.ModuleLoadData(&e->module[e->n_modules], parts[e->n_modules].cubin);
    if (r) e->n_modules--;   /* the one that failed holds nothing */
    parts_free(parts, n_parts);
    if (r) { tg_seterr(err, "loading the compiled kernels: %s", cu_error(r)); goto fail; }
    e->fn = tg_alloc(sizeof(CUfunction) * (size_t)(e->launches.n + 1));
    e->bound = tg_alloc(sizeof(void *) * (size_t)(g->n + 1));
    if (!e->fn || !e->bound) { tg_seterr(err, "out of memory preparing the CUDA kernels"); goto fail; }
    for (int i = 0; i < e->launches.n; i++) {
        const cuda_launch *l = &e->launches.launch[i];
        if (l->kind != CL_KERNEL) continue;
        TRY(module_function(e, l->name, &e->fn[i]), l->name);
        if (l->shared > 48 * 1024)   /* past the default limit only on request */
            TRY(cu.FuncSetAttribute(e->fn[i], CU_FUNC_MAX_DYNAMIC_SHARED, l->shared), "the kernel's shared memory (attention: head dimension too large?)");
    }
    for (int k = 0; k < 4; k++) {   /* our product kernels, by transposes: those the source has */
        if (strstr(e->source, CUDA_PRODUCT_NAMES[k])) {
            TRY(module_function(e, CUDA_PRODUCT_NAMES[k], &e->own[k]), CUDA_PRODUCT_NAMES[k]);
            if (cu.FuncSetAttribute(e->own[k], CU_FUNC_MAX_DYNAMIC_SHARED, dev->lt.own_warps * LT_OWN_WARP_BYTES))
                e->own[k] = NULL;   /* a GPU without that much shared memory a block: cuBLAS only */
        }
        if (strstr(e->source, CUDA_PRODUCT3_NAMES[k])) {   /* two blocks an SM want most of it as shared memory */
            TRY(module_function(e, CUDA_PRODUCT3_NAMES[k], &e->x3[k]), CUDA_PRODUCT3_NAMES[k]);
            cu.FuncSetAttribute(e->x3[k], CU_FUNC_SHARED_CARVEOUT, 100);   /* a preference: fewer blocks where refused */
            if (cu.FuncSetAttribute(e->x3[k], CU_FUNC_MAX_DYNAMIC_SHARED, LT_X3_BYTES)) e->x3[k] = NULL;   /* cuBLAS only */
        }
    }
    if (strstr(e->source, CUDA_PRODUCT3_SUM)) TRY(module_function(e, CUDA_PRODUCT3_SUM, &e->x3_sum), CUDA_PRODUCT3_SUM);
    if (g->precision != TG_PRECISION_F32) {   /* operand slots as large as the largest operand without a shadow */
        size_t most = 1;
        for (int i = 0; i < e->launches.n; i++) {
            const cuda_launch *l = &e->launches.launch[i];
            for (int k = 0; k < 2 && l->kind == CL_GEMM; k++) {
                int x = k ? l->b : l->a;
                if (e->plan.shadow[plan_home(&e->plan, x)] == PLAN_BOUND && (size_t)g->nodes[x].numel > most)
                    most = (size_t)g->nodes[x].numel;
            }
        }
        const char *fn = g->precision == TG_PRECISION_BF16 ? "tg_to_bf16" : "tg_to_tf32";
        size_t bytes = most * (g->precision == TG_PRECISION_BF16 ? 2 : 4);
        TRY(cu.ModuleGetFunction(&e->to_rounded, e->module[0], fn), fn);
        TRY(cu.MemAlloc(&e->slot[0], bytes), "allocating rounded operands");
        TRY(cu.MemAlloc(&e->slot[1], bytes), "allocating rounded operands");
    }
    TRY(cu.ModuleGetFunction(&e->writeback, e->module[0], "tg_writeback"), "tg_writeback");   /* every part has them */
    TRY(cu.ModuleGetFunction(&e->add_addend, e->module[0], "tg_add_addend"), "tg_add_addend");
    TRY(cu.ModuleGetFunction(&e->zero, e->module[0], "tg_zero"), "tg_zero");
    TRY(cu.ModuleGetFunction(&e->begin, e->module[0], "tg_begin"), "tg_begin");
    TRY(cu.ModuleGetFunction(&e->report, e->module[0], "tg_report"), "tg_report");
    TRY(cu.ModuleGetFunction(&e->wb_check, e->module[0], "tg_wb_check"), "tg_wb_check");
    size_t floats = e->launches.scratch_end > e->plan.arena ? e->launches.scratch_end : e->plan.arena;
    TRY(cu.MemAlloc(&e->arena, (floats ? floats : 1) * 4), "allocating the arena");
    if (e->launches.scratch_end)   /* the sums' counters start at zero */
        TRY(cu.MemsetD32(e->arena + e->launches.scratch_at * 4, 0, e->launches.scratch_end - e->launches.scratch_at),
            "clearing the sums' scratch");
    TRY(cu.MemAlloc(&e->table, sizeof(void *) * (size_t)(g->n + 1)), "allocating the buffer table");
    e->n_hyper = cuda_hyper_slots(g);
    TRY(cu.MemAlloc(&e->hyper_dev, sizeof(double) * (size_t)(e->n_hyper + HYPER_EXTRA)), "allocating hyper scalars");
    TRY(cu.MemsetD32(e->hyper_dev, 0, 2 * (size_t)(e->n_hyper + HYPER_EXTRA)), "clearing hyper scalars");
    e->wb_flag = e->hyper_dev + sizeof(double) * (size_t)e->n_hyper;
    e->wb_report = e->wb_flag + sizeof(double);
    e->wb_poison = e->wb_report + sizeof(double);
    TRY(cu.MemAllocHost((void **)&e->hyper_host, sizeof(double) * (size_t)(e->n_hyper + 1)), "allocating pinned memory");
    TRY(cu.MemAllocHost((void **)&e->loss_host, sizeof(float) * 2), "allocating pinned memory");
    memset(e->hyper_host, 0, sizeof(double) * (size_t)(e->n_hyper + 1));
    memset(e->loss_host, 0, sizeof(float) * 2);
    e->table_dirty = true;
    const char *prof = getenv("TG_CUDA_PROFILE");
    e->profile_graph = prof && strncmp(prof, "graph", 5) == 0;
    e->profile_all = prof && strstr(prof, "all");
    if (prof && (prof[0] == '1' || e->profile_graph)) {
        e->profile = tg_alloc(sizeof(double) * (size_t)(e->launches.n + 1));
        e->marks = tg_alloc(sizeof(CUevent) * (size_t)(e->launches.n + 1));
        if (!e->profile || !e->marks) {
            tg_seterr(err, "out of memory for the CUDA profile");
            goto fail;
        }
        for (int i = 0; i <= e->launches.n; i++) TRY(cu.EventCreate(&e->marks[i], 0), "creating profile events");
    }
    return e;
fail:
    cuda_release(e);
    return NULL;
}

static size_t cuda_planned_bytes(void *h) { return ((cuda_exec *)h)->plan.arena * sizeof(float); }

static void cuda_bind(void *h, int node, void *buf) {
    cuda_exec *e = h;
    e->bound[node] = buf;
    e->table_dirty = true;   /* kernels read the table at run time: no recapture needed */
}

static void *cuda_node_buf(void *h, int node) {
    cuda_exec *e = h;
    node = plan_home(&e->plan, node);
    if (e->launches.inplace && e->launches.inplace[node] >= 0) node = e->launches.inplace[node];   /* replaced in place */
    if (e->bound[node]) return e->bound[node];
    return e->plan.offset[node] == PLAN_BOUND ? NULL : (void *)(e->arena + e->plan.offset[node] * 4);
}

static CUdeviceptr node_ptr(cuda_exec *e, int node) { return (CUdeviceptr)cuda_node_buf(e, node); }
/* What a CL_MEMSET clears: its node's buffer, or scratch past the plan's arena */
static CUdeviceptr memset_ptr(cuda_exec *e, const cuda_launch *l) { return l->at >= 0 ? e->arena + 4 * (CUdeviceptr)l->at : node_ptr(e, l->node); }

/* cuBLAS's numbers for the element types and arithmetic of a product. */
enum { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77, CUBLAS_GEMM_DEFAULT = -1 };

/* tf32 and bf16 precision: the product reads its operands rounded exactly as the reference rounds
 * them (precision_round): bf16 values, or f32 values with a tf32 mantissa (which the tensor
 * cores then take as they are, whatever their own rounding). Most operands have a shadow, the
 * copy their kernel rounded as it wrote them (plan_shadows); the others (outputs of products,
 * sums, attention) are rounded here into the two scratch slots. An operand a slot already holds
 * this step is not converted again. */
static CUdeviceptr rounded_copy(const cuda_exec *e, const cuda_launch *l, int k) {   /* operand k's shadow, or 0 */
    int h = plan_home(&e->plan, k ? l->b : l->a);
    size_t copy = k == 1 && l->b_transposed ? e->plan.tshadow[h] : e->plan.shadow[h];
    return copy != PLAN_BOUND ? e->arena + copy * 4 : 0;
}

static bool rounded_operands(cuda_exec *e, const cuda_launch *l, const void **A, const void **B, tg_error *err) {
    int node[2] = { l->a, l->b }, slot[2] = { -1, -1 };
    const void **ptr[2] = { A, B };
    for (int k = 0; k < 2; k++) {
        CUdeviceptr copy = rounded_copy(e, l, k);
        if (copy) {
            *ptr[k] = (const void *)copy;
            slot[k] = 2;   /* no slot */
        }
        for (int s = 0; s < 2 && slot[k] < 2; s++)
            if (e->slot_holds[s] == node[k]) slot[k] = s;
    }
    for (int k = 0; k < 2; k++) {
        if (slot[k] < 0) {
            slot[k] = slot[1 - k] == 0 ? 1 : slot[1 - k] == 1 ? 0 : k;
            CUdeviceptr src = node_ptr(e, node[k]), dst = e->slot[slot[k]];
            long long n = e->g->nodes[node[k]].numel;
            void *args[] = { &src, &dst, &n };
            unsigned grid = (unsigned)(n / 1024 + 1 < 4096 ? n / 1024 + 1 : 4096);
            TRY(cu.LaunchKernel(e->to_rounded, grid, 1, 1, 256, 1, 1, 0, e->dev->stream, args, NULL), "operand rounding");
            e->slot_holds[slot[k]] = node[k];
            e->conversions++;
        }
        if (slot[k] < 2) *ptr[k] = (const void *)e->slot[slot[k]];
    }
    return true;
fail:
    return false;
}

/* Where a product writes: its f32 buffer, or only its bf16 copy (cs: 2) */
static char *product_output(cuda_exec *e, const cuda_launch *l, size_t *cs) {
    int h = plan_home(&e->plan, l->node);
    bool half = e->plan.offset[h] == PLAN_BOUND && e->plan.shadow && e->plan.shadow[h] != PLAN_BOUND;
    *cs = half ? 2 : 4;
    return half ? (char *)(e->arena + e->plan.shadow[h] * 4) : (char *)node_ptr(e, l->node);
}

/* A product's operands, in the graph's precision (f32, or rounded copies: rounded_operands), and
 * its output: f32, or only its bf16 copy (a bf16 activation that nothing reads in f32: unplaced,
 * cuda_shadow_wanted); es, cs: the operands' and the output's element bytes. */
static bool product_buffers(cuda_exec *e, const cuda_launch *l, const char **A, const char **B, char **C, size_t *es,
                            size_t *cs, tg_error *err) {
    const void *a = (const void *)node_ptr(e, l->a), *b = (const void *)node_ptr(e, l->b);
    if (e->g->precision != TG_PRECISION_F32 && !rounded_operands(e, l, &a, &b, err)) return false;
    *A = a;
    *B = b;
    *C = product_output(e, l, cs);
    *es = e->g->precision == TG_PRECISION_BF16 ? 2 : 4;
    return true;
}

/* Are a batch's operand offsets in arithmetic progression (one strided-batched call)? */
static bool strided_batch(const cuda_launch *l) {
    bool strided = l->batch > 1;
    for (int64_t i = 2; i < l->batch && strided; i++)
        strided = l->aoff[i] - l->aoff[i - 1] == l->aoff[1] - l->aoff[0] && l->boff[i] - l->boff[i - 1] == l->boff[1] - l->boff[0];
    return strided;
}

/* The largest power of two up to 256 that divides every address or-ed into `bits`. */
static uint32_t alignment(uintptr_t bits) {
    uintptr_t low = bits & (~bits + 1);
    return low == 0 || low > 256 ? 256 : (uint32_t)low;
}

/* What cuBLASLt is asked for: one strided call, or the batch's products one by one. */
static lt_shape product_shape(const cuda_exec *e, const cuda_launch *l, const char *A, const char *B, const char *C, size_t es,
                              size_t cs) {
    bool strided = strided_batch(l);
    lt_shape s = { .M = l->M, .N = l->N, .K = l->K, .batch = strided ? l->batch : 1,
                   .a_stride = strided ? l->aoff[1] - l->aoff[0] : 0, .b_stride = strided ? l->boff[1] - l->boff[0] : 0,
                   .ta = l->ta, .tb = l->tb, .bf16 = e->g->precision == TG_PRECISION_BF16,
                   .tf32 = e->g->precision == TG_PRECISION_TF32, .c_bf16 = cs == 2,
                   .bias = l->addend >= 0 && e->g->nodes[l->addend].numel == l->N,
                   .accumulate = l->addend >= 0 && e->g->nodes[l->addend].numel > l->N };
    uintptr_t bits[3] = { 0, 0, 0 };
    for (int64_t i = 0; i < l->batch; i++) {
        bits[0] |= (uintptr_t)(A + l->aoff[i] * es);
        bits[1] |= (uintptr_t)(B + l->boff[i] * es);
        bits[2] |= (uintptr_t)(C + i * l->M * l->N * cs);
    }
    for (int k = 0; k < 3; k++) s.align[k] = alignment(bits[k]);
    return s;
}

/* A product's addend (cuda_fold_addends): a bias's bf16 copy (kleaves rounds it from the leaf),
 * a matrix's bf16 copy where it has one, else its f32 values (*bf16 false); NULL for none. */
static const void *addend_at(cuda_exec *e, const cuda_launch *l, bool *bf16) {
    int h = l->addend < 0 ? -1 : plan_home(&e->plan, l->addend);
    *bf16 = h >= 0 && e->plan.shadow && e->plan.shadow[h] != PLAN_BOUND;
    return h < 0 ? NULL : *bf16 ? (const void *)(e->arena + e->plan.shadow[h] * 4) : (const void *)node_ptr(e, l->addend);
}

/* Where cuBLASLt does not add a product's addend: its f32 sums (in e->sums) plus the addend,
 * rounded once into C. */
static bool add_addend(cuda_exec *e, const cuda_launch *l, void *C, size_t cs, tg_error *err) {
    bool bf16;
    CUdeviceptr sums = e->sums, addend = (CUdeviceptr)addend_at(e, l, &bf16), c = (CUdeviceptr)C;
    long long n = l->M * l->N, cols = e->g->nodes[l->addend].numel;   /* a bias: N; a matrix: n */
    int addend_bf16 = bf16, c_bf16 = cs == 2;
    void *args[] = { &sums, &addend, &addend_bf16, &c, &n, &cols, &c_bf16 };
    unsigned grid = (unsigned)(n / 1024 + 1 < 4096 ? n / 1024 + 1 : 4096);
    TRY(cu.LaunchKernel(e->add_addend, grid, 1, 1, 256, 1, 1, 0, e->dev->stream, args, NULL), "a product's addend");
    return true;
fail:
    return false;
}

/* Room for the f32 sums of the largest product whose addend cuBLASLt does not add (add_addend). */
static bool sums_ready(cuda_exec *e, tg_error *err) {
    size_t most = 0;
    for (int i = 0; i < e->launches.n; i++) {
        const cuda_launch *l = &e->launches.launch[i];
        if (l->kind == CL_GEMM && l->addend >= 0 && !(e->lt && e->lt[i].desc) && (size_t)(l->M * l->N) > most)
            most = (size_t)(l->M * l->N);
    }
    if (most && !e->sums) TRY(cu.MemAlloc(&e->sums, most * 4), "allocating a product's sums");
    return true;
fail:
    return false;
}

/* The cuBLASLt calls launch l makes (gemm): one, or one per matrix of a batch not strided */
static int64_t product_calls(const cuda_launch *l) { return l->kind != CL_GEMM ? 0 : strided_batch(l) ? 1 : l->batch; }

static bool counters_ready(cuda_exec *e, tg_error *err) {
    int64_t *calls = tg_alloc(sizeof(int64_t) * (size_t)(e->launches.n + 1));
    for (int i = 0; calls && i < e->launches.n; i++) calls[i] = product_calls(&e->launches.launch[i]);
    counters_free(&e->counters);
    bool ok = calls && counters_init(&e->counters, e->launches.n, calls);
    free(calls);
    if (!ok) tg_seterr(err, "out of memory for cuBLASLt's counters");
    return ok;
}

/* ----- products run at once -----
 *
 * A small product (a transformer's q, k and v projections of 1,024 rows of 128; an input
 * gradient and the weight gradient of the same output gradient) fills a few SMs for a few
 * microseconds, most of it the latency of its kernel's start, loads and end, and cuBLAS's kernels
 * start only when the one before them has ended. Consecutive products none of which reads or
 * writes what another writes run at once instead, each on a stream of its own forked from the
 * device's and joined back before the next launch (in the captured graph: nodes with no edge
 * between them). A group's members are cuBLASLt calls with their operands in place (no rounding
 * into the shared slots), a workspace each (the window of their counters, cuda_counters.c, or
 * none), and at most TOGETHER_FLOP each (2^30: about 3 us at tf32's 400 TFLOP/s, the order of
 * a kernel's start and end): char_gpt's products of 4.8 GFLOP and more, each several waves of
 * tiles, ran 0.05-0.1 ms a step slower together at tf32 (bench/RESULTS.md).
 * TG_CUDA_TOGETHER=0: every launch in turn; =verbose: says which run at once, on stderr. */
#define TOGETHER_FLOP 1073741824.0

typedef struct { CUdeviceptr lo, hi; } extent;   /* bytes [lo, hi) of device memory */

static double product_flop(const cuda_launch *l) { return 2.0 * (double)l->M * (double)l->N * (double)l->K * (double)l->batch; }

static bool meets(extent a, extent b) { return a.lo < b.hi && b.lo < a.hi && a.lo < a.hi && b.lo < b.hi; }

/* What launch i reads (A, B, the addend) and writes (C, its workspace: our kernel's split parts go
 * to the shared one); false when it cannot run beside others (not one call of cuBLASLt or of our
 * kernel on operands in place). */
static bool product_extents(cuda_exec *e, int i, extent reads[3], extent writes[2]) {
    const cuda_launch *l = &e->launches.launch[i];
    const lt_product *p = e->lt ? &e->lt[i] : NULL;
    if (l->kind != CL_GEMM || !p || !p->desc || product_calls(l) != 1) return false;
    const bool f32 = e->g->precision == TG_PRECISION_F32;
    const size_t es = e->g->precision == TG_PRECISION_BF16 ? 2 : 4;
    CUdeviceptr A = f32 ? node_ptr(e, l->a) : rounded_copy(e, l, 0);
    CUdeviceptr B = f32 ? node_ptr(e, l->b) : rounded_copy(e, l, 1);
    if (!A || !B) return false;   /* rounded into a slot first */
    reads[0] = (extent){ A, A + (CUdeviceptr)(e->g->nodes[l->a].numel * es) };
    reads[1] = (extent){ B, B + (CUdeviceptr)(e->g->nodes[l->b].numel * es) };
    bool bf16;
    CUdeviceptr add = (CUdeviceptr)addend_at(e, l, &bf16);
    reads[2] = add ? (extent){ add, add + (CUdeviceptr)(e->g->nodes[l->addend].numel * (bf16 ? 2 : 4)) } : (extent){ 0, 0 };
    size_t cs;
    CUdeviceptr C = (CUdeviceptr)product_output(e, l, &cs);
    writes[0] = (extent){ C, C + (CUdeviceptr)(l->M * l->N * l->batch * (int64_t)cs) };
    CUdeviceptr ws = counters_window(&e->counters, i, 0);
    if (!ws) ws = e->side && e->side[i] ? e->dev->beside_ws : e->dev->lt.workspace;
    writes[1] = (extent){ ws, ws + (CUdeviceptr)(p->own ? e->dev->lt.workspace_bytes : p->workspace) };
    return C != 0;
}

/* Neither of two launches writes what the other reads or writes. */
static bool apart(const extent *ra, const extent *wa, const extent *rb, const extent *wb) {
    for (int w = 0; w < 2; w++) {
        for (int r = 0; r < 3; r++)
            if (meets(wa[w], rb[r]) || meets(wb[w], ra[r])) return false;
        for (int v = 0; v < 2; v++)
            if (meets(wa[w], wb[v])) return false;
    }
    return true;
}

/* ----- work beside the critical path -----
 * A launch whose results no later launch of the run reads (a parameter's gradient: a weight's
 * product, a bias's column sum, a layer norm's parameter sums; the update reads them after the
 * end) goes on a side stream, forked from the device's stream where it stands in the order: the
 * chain the next layer waits for goes on meanwhile, memory-bound sums beside products and
 * products beside row kernels, in the gaps either leaves. The device's stream waits for the side
 * launches (up to the latest such) before a launch that writes what one of them reads or writes,
 * or reads what one writes (a buffer the plan hands on once its last reader ran in order), before
 * a launch whose buffers are not known (cuda_launch's io: the leaves' kernel, the check, the
 * update in place), and at the end. Only launches that leave room on the GPU go (leaves_room); a
 * product only as one call on its operands in place, on the side stream's workspace (the side
 * launches run one after another, so one serves them all). TG_CUDA_SIDE=0: every launch on the
 * device's stream; =verbose: which go beside, on stderr. */

static bool touch_add(touches *l, CUdeviceptr lo, CUdeviceptr hi, bool write, bool scratch) {
    if (lo >= hi) return true;
    touch *grown = tg_realloc(l->a, sizeof *grown * (size_t)(l->n + 1));
    if (!grown) return false;
    l->a = grown;
    l->a[l->n++] = (touch){ lo, hi, write, scratch };
    return true;
}

/* What launch i reads and writes, into e->touched[i] (left unknown where it is not known) */
static bool touches_of(cuda_exec *e, int i) {
    const cuda_launch *l = &e->launches.launch[i];
    touches *a = &e->touched[i];
    bool ok = true;
    if (l->kind == CL_KERNEL && l->io) {
        for (int k = 0; k < l->n_io && ok; k++)
            ok = touch_add(a, e->arena + 4 * (CUdeviceptr)l->io[k][0], e->arena + 4 * (CUdeviceptr)l->io[k][1], l->io[k][2] != 0,
                           false);
    } else if (l->kind == CL_MEMSET) {
        ok = touch_add(a, memset_ptr(e, l), memset_ptr(e, l) + 4 * (CUdeviceptr)l->n, true, false);
    } else if (l->kind == CL_GEMM) {
        extent r[3], w[2];
        if (!product_extents(e, i, r, w)) return true;
        for (int k = 0; k < 3 && ok; k++) ok = touch_add(a, r[k].lo, r[k].hi, false, false);
        for (int k = 0; k < 2 && ok; k++) ok = touch_add(a, w[k].lo, w[k].hi, true, k == 1);
    } else {
        return true;
    }
    a->known = ok;
    return ok;
}

/* Does b write what a touches, or a write what b reads? (Both known.) */
static bool clash(const touches *a, const touches *b) {
    for (int x = 0; x < a->n; x++)
        for (int y = 0; y < b->n; y++)
            if ((a->a[x].write || b->a[y].write) && a->a[x].lo < b->a[y].hi && b->a[y].lo < a->a[x].hi) return true;
    return false;
}

/* Does b touch what a writes, its scratch aside? */
static bool reads_results(const touches *a, const touches *b) {
    for (int x = 0; x < a->n; x++)
        for (int y = 0; y < b->n; y++)
            if (a->a[x].write && !a->a[x].scratch && a->a[x].lo < b->a[y].hi && b->a[y].lo < a->a[x].hi) return true;
    return false;
}

/* Products of more than this many FLOP whose results no later launch reads run beside the critical
 * path (leaves_room): TG_CUDA_SIDE_FLOP, by default 2^30. */
static double side_flop(void) {
    const char *env = getenv("TG_CUDA_SIDE_FLOP");
    return env ? atof(env) : TOGETHER_FLOP;
}

/* A weight gradient's product beside the chain (side_plan) still reads its operands while the
 * chain goes on; where the plan handed their memory to the next kernel of the chain, that kernel
 * waited for the product: char_gpt's GELU backward started only when its layer's [1536 x 384]
 * weight gradient (35 us) had ended. So what such a product reads (one of more than side_flop()
 * FLOP, whose value is a parameter's gradient or holds several) stays live until the next product
 * of the chain: char_gpt's waits for the side stream 23 -> 17 a step, its plan 1,457 -> 1,507 MB, the step at
 * tf32 9.06 -> 8.86 ms, f32 21.3 -> 20.9, bf16 the same (H200); held until the second to fourth
 * product, no better. */
static void hold_side_inputs(const tg_graph *g, const bool *mat, const int *alias, int *live_until) {
    const char *env = getenv("TG_CUDA_SIDE");
    if ((env && env[0] == '0') || !g->grad_of_param) return;
    bool *grad = tg_alloc(sizeof(bool) * (size_t)(g->n + 1));
    if (!grad) return;   /* the plan as it was: the chain may wait */
    for (int p = 0; p < g->n_params; p++) {
        int k = g->grad_of_param[p];
        while (k >= 0 && alias[k] >= 0) k = alias[k];
        if (k >= 0 && g->nodes[k].op == OP_SLICE) k = g->nodes[k].src[0];   /* a part of a grouped one (grad.c's siblings) */
        while (k >= 0 && alias[k] >= 0) k = alias[k];
        if (k >= 0) grad[k] = g->nodes[k].op == OP_MATMUL && mat[k];
    }
    for (int i = 0; i < g->n; i++) {
        const tg_node *n = &g->nodes[i];
        if (!grad[i]) continue;
        const tg_shape *a = &g->nodes[n->src[0]].shape;
        const double K = (double)a->d[a->ndim - (n->iarg[0] ? 2 : 1)];
        if (2.0 * (double)n->numel * K <= side_flop()) continue;
        int next = i + 1;
        while (next < g->n && !(g->nodes[next].op == OP_MATMUL && mat[next] && alias[next] < 0 && !grad[next])) next++;
        if (live_until[i] < next) live_until[i] = next;
    }
    free(grad);
}

/* Is launch i worth running beside? A kernel of at most half the threads the SMs hold at once: at
 * char_gpt's size (its column sums a whole wave of 264 x 1024 threads) the sums beside the chain
 * made the bf16 step 4.70 -> 4.73 ms, where char_gpt_small's (1,024 rows) went 0.234 -> 0.222. A
 * product of more than side_flop() (TG_CUDA_SIDE_FLOP; 0 in tests: every product), on the side
 * stream's workspace: char_gpt's weight gradients (4.8 and 19 GFLOP, several waves of tiles) beside
 * the input gradients, layer norms and attention of the chain took its bf16 step 4.79 -> 4.65 ms,
 * tf32 9.04 -> 8.98, f32 21.4 -> 21.2 (H200). A smaller one only where it needs no workspace or
 * has a window of its own, never ours: with those on the side stream's workspace too
 * char_gpt_small's f32 step went 0.35 -> 0.40 ms. */
static bool leaves_room(cuda_exec *e, int i) {
    const cuda_launch *l = &e->launches.launch[i];
    if (l->kind == CL_GEMM) {
        if (product_flop(l) > side_flop()) return true;
        return !e->lt[i].own && (counters_window(&e->counters, i, 0) || !e->lt[i].workspace);
    }
    return l->kind == CL_KERNEL && (double)l->grid * (double)l->grid_y * l->block <= 1024.0 * e->dev->lt.sms;
}

static void side_free(cuda_exec *e) {
    for (int i = 0; e->touched && i < e->launches.n; i++) free(e->touched[i].a);
    for (int i = 0; e->side_done && i < e->launches.n; i++)
        if (e->side_done[i]) cu.EventDestroy(e->side_done[i]);
    free(e->touched);
    free(e->side);
    free(e->side_done);
    free(e->clear);
    e->clear = NULL;
    e->touched = NULL;
    e->side = NULL;
    e->side_done = NULL;
}

static bool writes_any(const touches *a) {
    for (int x = 0; x < a->n; x++)
        if (a->a[x].write) return true;
    return false;
}

/* Does a launch after i read its results (side_plan; those on the side stream too unless
 * `side`)? Launches whose touches are not known do not count: the device's stream waits for
 * the side stream before them (join_for). */
static bool read_later(const cuda_exec *e, int i, bool side) {
    for (int j = i + 1; j < e->launches.n; j++)
        if (e->touched[j].known && (side || !e->side[j]) && reads_results(&e->touched[i], &e->touched[j])) return true;
    return false;
}

/* Launch i onto the side stream, its touches again (a product's workspace is the side stream's). */
static bool put_beside(cuda_exec *e, int i, tg_error *err) {
    CUresult r = cu.EventCreate(&e->side_done[i], CU_EVENT_DISABLE_TIMING);
    if (r) {
        tg_seterr(err, "CUDA event for the side stream failed: %s", cu_error(r));
        return false;
    }
    e->side[i] = true;
    free(e->touched[i].a);
    e->touched[i] = (touches){ 0 };
    const char *env = getenv("TG_CUDA_SIDE");
    if (env && !strcmp(env, "verbose"))
        fprintf(stderr, "tensorgrad: cuda: beside: %s (node %d)\n",
                e->launches.launch[i].kind == CL_GEMM ? "product" : e->launches.launch[i].name, e->launches.launch[i].node);
    if (touches_of(e, i)) return true;
    tg_seterr(err, "out of memory planning the side stream");
    return false;
}

enum { CHAIN_MAX = 4 };   /* the most kernels reading a product beside it (side_plan) */

/* A buffer cleared for sums added up in memory (attention's dq) is cleared as soon as the last
 * launch touching its memory is done, on a stream of its own (the first together stream), over one
 * block an SM so that the launches in between keep the rest of each SM (enqueue_one); the device's
 * stream waits for it in its place, and it for the last side launch before then that touches its
 * memory. char_gpt bf16 (H200, one binary alternating): each dq cleared beside the product before
 * its attention backward, 4.143 -> 4.114 ms a step; over a block per 1,024 floats it filled every
 * SM first, and the product started only as it ended. TG_CUDA_CLEAR_EARLY=0: in place. */
static bool clear_early(cuda_exec *e, int i, tg_error *err) {
    const char *env = getenv("TG_CUDA_CLEAR_EARLY");
    if (!e->clear && !(e->clear = tg_alloc(sizeof *e->clear * (size_t)(e->launches.n + 1)))) {
        tg_seterr(err, "out of memory planning the side stream");
        return false;
    }
    e->clear[i] = (struct early_clear){ -1, -1 };
    if ((env && env[0] == '0') || e->launches.launch[i].kind != CL_MEMSET || e->side[i] || !e->touched[i].known) return true;
    int p = i - 1, w = -1;
    while (p >= 0 && e->touched[p].known && !clash(&e->touched[p], &e->touched[i])) p--;
    if (p < 0 || p == i - 1 || e->side[p]) return true;
    for (int j = 0; j < p; j++)
        if (e->side[j] && clash(&e->touched[j], &e->touched[i])) w = j;
    CUresult r = cu.EventCreate(&e->side_done[i], CU_EVENT_DISABLE_TIMING);
    if (r) {
        tg_seterr(err, "CUDA event for an early clear failed: %s", cu_error(r));
        return false;
    }
    e->clear[i] = (struct early_clear){ p, w };
    const char *side = getenv("TG_CUDA_SIDE");
    if (side && !strcmp(side, "verbose"))
        fprintf(stderr, "tensorgrad: cuda: cleared early: node %d, after launch %d of %d\n", e->launches.launch[i].node, p, i);
    return true;
}

/* e->side: which launches go beside (leaves_room, read_later, the chains below); e->touched, what
 * each reads and writes. */
static bool side_plan(cuda_exec *e, tg_error *err) {
    const char *env = getenv("TG_CUDA_SIDE");
    const int n = e->launches.n;
    side_free(e);
    if ((env && env[0] == '0') || e->profile) return true;
    e->touched = tg_alloc(sizeof *e->touched * (size_t)(n + 1));
    e->side = tg_alloc(sizeof *e->side * (size_t)(n + 1));
    e->side_done = tg_alloc(sizeof *e->side_done * (size_t)(n + 1));
    bool ok = e->touched && e->side && e->side_done;
    if (ok) {
        memset(e->touched, 0, sizeof *e->touched * (size_t)n);
        memset(e->side, 0, sizeof *e->side * (size_t)n);
        memset(e->side_done, 0, sizeof *e->side_done * (size_t)n);
    }
    for (int i = 0; i < n && ok; i++) ok = touches_of(e, i);
    if (!ok) tg_seterr(err, "out of memory planning the side stream");
    /* Launches that write nothing of the arena's (the pieces of the gradients' check: the step's
     * flag alone) first, so that what they read may go beside too: with the check's pieces on the
     * chain's reading list, char_gpt's weight gradients stayed on it, 4.145 -> 4.21 ms a step. */
    for (int i = 0; i < n && ok; i++)
        if (e->touched[i].known && e->touched[i].n > 0 && !writes_any(&e->touched[i]) && leaves_room(e, i)) ok = put_beside(e, i, err);
    for (int i = 0; i < n && ok; i++)
        if (!e->side[i] && e->touched[i].known && e->touched[i].n > 0 && leaves_room(e, i) && !read_later(e, i, false))
            ok = put_beside(e, i, err);
    /* A product whose results only a few small kernels read, and nothing reads theirs (a grouped
     * weight gradient, its parts copied out as the gradients kept: grad.c's siblings): all beside,
     * in order on the side stream (char_gpt at bf16: 33 us a layer off the critical path). */
    for (int i = 0; i < n && ok; i++) {
        if (e->side[i] || e->launches.launch[i].kind != CL_GEMM || !e->touched[i].known || !leaves_room(e, i)) continue;
        int readers[CHAIN_MAX], n_readers = 0;
        bool chain = true;
        for (int j = i + 1; j < n && chain; j++) {
            if (!e->touched[j].known || !reads_results(&e->touched[i], &e->touched[j])) continue;
            const cuda_launch *l = &e->launches.launch[j];
            chain = n_readers < CHAIN_MAX && l->kind == CL_KERNEL && !e->side[j] &&
                    (double)l->grid * (double)l->grid_y * l->block <= 4 * 1024.0 * e->dev->lt.sms && !read_later(e, j, false);
            if (chain) readers[n_readers++] = j;
        }
        if (!chain || n_readers == 0) continue;
        ok = put_beside(e, i, err);
        for (int r = 0; r < n_readers && ok; r++) ok = put_beside(e, readers[r], err);
    }
    for (int i = 0; i < n && ok; i++) ok = clear_early(e, i, err);
    if (!ok) side_free(e);
    return ok;
}

/* e->together: per launch, how many launches from it run at once (1: alone; 0: a later member). */
static bool together_plan(cuda_exec *e, tg_error *err) {
    const char *env = getenv("TG_CUDA_TOGETHER");
    int n = e->launches.n;
    free(e->together);
    if (!(e->together = tg_alloc(sizeof(int) * (size_t)(n + 1)))) {
        tg_seterr(err, "out of memory grouping the products");
        return false;
    }
    for (int i = 0; i < n; i++) e->together[i] = 1;
    if (env && env[0] == '0') return true;
    extent reads[TOGETHER_MAX][3], writes[TOGETHER_MAX][2];
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < TOGETHER_MAX && i + k < n && !(e->side && e->side[i + k]) && !e->lt[i + k].own &&
               product_extents(e, i + k, reads[k], writes[k]) && product_flop(&e->launches.launch[i + k]) <= TOGETHER_FLOP) {
            bool ok = true;
            for (int j = 0; j < k && ok; j++) ok = apart(reads[j], writes[j], reads[k], writes[k]);
            if (!ok) break;
            k++;
        }
        if (k < 2) continue;
        e->together[i] = k;
        for (int j = 1; j < k; j++) e->together[i + j] = 0;
        for (int j = 0; j < k && env && !strcmp(env, "verbose"); j++) {
            const cuda_launch *l = &e->launches.launch[i + j];
            fprintf(stderr, "%s node %d [%lld x %lld] x [%lld x %lld]%s", j ? "," : "tensorgrad: cuda: products run at once:", l->node,
                    (long long)l->M, (long long)l->K, (long long)l->K, (long long)l->N, j == k - 1 ? "\n" : "");
        }
        i += k - 1;
    }
    return true;
}

/* Each product's cuBLASLt algorithm, chosen on the step's own buffers before the first capture
 * (timing cannot run inside one); TG_CUDA_LT=0 keeps every product on cublasGemmEx. */
static bool products_ready(cuda_exec *e, tg_error *err) {
    const char *use = getenv("TG_CUDA_LT");
    if (e->lt_ready) return true;
    if (use && use[0] == '0') return sums_ready(e, err);
    if (!e->lt) e->lt = tg_alloc(sizeof(lt_product) * (size_t)(e->launches.n + 1));   /* kept from a failed try */
    if (!e->lt) { tg_seterr(err, "out of memory choosing the matrix products' algorithms"); return false; }
    e->slot_holds[0] = e->slot_holds[1] = -1;
    if (!counters_ready(e, err)) return false;
    for (int i = 0; i < e->launches.n; i++) {
        const cuda_launch *l = &e->launches.launch[i];
        const char *A, *B;
        char *C;
        size_t es, cs;
        if (l->kind != CL_GEMM) continue;
        if (!product_buffers(e, l, &A, &B, &C, &es, &cs, err)) return false;
        bool addend_bf16;
        const void *addend = addend_at(e, l, &addend_bf16);
        const bool f32_bias = addend && e->g->precision != TG_PRECISION_BF16 && cs == 4 && !addend_bf16 &&
                              e->g->nodes[l->addend].numel == l->N;
        if (addend && !(cs == 2 && addend_bf16) && !f32_bias) continue;   /* cuBLASLt adds bf16 to bf16, an f32 bias to f32; else tg_add_addend */
        const char *a = A + l->aoff[0] * es, *b = B + l->boff[0] * es;
        if (!e->lt[i].desc) {
            lt_shape s = product_shape(e, l, A, B, C, es, cs);
            const lt_ours ours = { e->own[l->ta * 2 + l->tb], e->x3[l->ta * 2 + l->tb], e->x3_sum };
            lt_product_init(&e->lt[i], &e->dev->lt, &s, ours, a, b, C, addend);   /* else cublasGemmEx */
        }
        if (e->lt[i].desc && !counters_learn(&e->counters, i, product_calls(l), &e->lt[i], &e->dev->lt, a, b, C)) {
            tg_seterr(err, "capturing a product alone failed (node %d)", l->node);
            return false;
        }
    }
    counters_place(&e->counters);   /* without memory for the windows, every product as before */
    e->lt_ready = sums_ready(e, err) && side_plan(e, err) && together_plan(e, err);
    return e->lt_ready;
}

/* One product (possibly batched), row-major C = op(A) op(B), in the graph's precision: f32, TF32
 * tensor cores, or bf16 operands; sums are f32 in every case, C f32 or rounded to bf16
 * (product_buffers). Through cuBLASLt with the algorithm products_ready chose, else
 * cublasGemmEx, by the column-major identity C^T = op(B)^T op(A)^T. */
static bool gemm(cuda_exec *e, int i, bool early, CUstream stream, tg_error *err) {
    const cuda_launch *l = &e->launches.launch[i];
    lt_device d = e->dev->lt;   /* on `stream`: the device's, one of a group's (together_plan), or the side stream */
    d.stream = stream;
    if (stream == e->dev->beside) d.workspace = e->dev->beside_ws;
    const float one = 1, zero = 0;
    const char *a, *b;
    char *C, *out;
    size_t es, cs, out_cs;
    if (!product_buffers(e, l, &a, &b, &out, &es, &out_cs, err)) return false;
    const lt_product *p = e->lt && e->lt[i].desc ? &e->lt[i] : NULL;
    const bool later = l->addend >= 0 && !p;   /* cuBLASLt does not add it: the sums first (one batch), then add_addend */
    C = later ? (char *)e->sums : out;
    cs = later ? 4 : out_cs;
    tg_precision prec = e->g->precision;
    int type = prec == TG_PRECISION_BF16 ? CUDA_R_16BF : CUDA_R_32F, ctype = cs == 2 ? CUDA_R_16BF : CUDA_R_32F;
    int compute = prec == TG_PRECISION_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    int m = (int)l->M, n = (int)l->N, k = (int)l->K, lda = l->ta ? m : k, ldb = l->tb ? k : n;
    int rc = 0;
    bool strided = strided_batch(l);
    if (strided && p) {
        rc = lt_run(p, &d, a + l->aoff[0] * es, b + l->boff[0] * es, C, early, counters_slice(&e->counters, i, p, 0, stream));
    } else if (strided) {
        rc = cublas.GemmStridedBatchedEx(e->dev->blas, l->tb, l->ta, n, m, k, &one, b + l->boff[0] * es, type, ldb,
                                         l->boff[1] - l->boff[0], a + l->aoff[0] * es, type, lda, l->aoff[1] - l->aoff[0],
                                         &zero, C, ctype, n, (long long)m * n, (int)l->batch, compute,
                                         CUBLAS_GEMM_DEFAULT);
    } else {
        for (int64_t j = 0; j < l->batch && rc == 0; j++)
            rc = p ? lt_run(p, &d, a + l->aoff[j] * es, b + l->boff[j] * es, C + j * m * n * cs, early,
                            counters_slice(&e->counters, i, p, j, stream))
                   : cublas.GemmEx(e->dev->blas, l->tb, l->ta, n, m, k, &one, b + l->boff[j] * es, type, ldb,
                                   a + l->aoff[j] * es, type, lda, &zero, C + j * m * n * cs, ctype, n, compute,
                                   CUBLAS_GEMM_DEFAULT);
    }
    if (rc) tg_seterr(err, "cuBLAS%s product failed (status %d) for node %d", p ? "Lt" : "", rc, l->node);
    return rc == 0 && (!later || add_addend(e, l, out, out_cs, err));
}

/* May a launch start early (cuda_start) right after launch `prev` on its stream? Where no
 * products run at once (whose streams it waits for) and no profile times launches one by one. */
static bool early_after(const cuda_exec *e, int prev) {
    return e->dev->lt.early && !e->profile && prev >= 0 && !(e->together && e->together[prev] != 1);
}

/* Enqueue launch i on `stream`; a kernel of ours early if so. */
static bool enqueue_one(cuda_exec *e, int i, CUstream stream, bool early, tg_error *err) {
    const cuda_launch *l = &e->launches.launch[i];
    CUdeviceptr table = e->table, hyper = e->hyper_dev;
    if (l->kind == CL_MEMSET) {
        CUdeviceptr at = memset_ptr(e, l);
        long long n = l->n;
        void *args[] = { &at, &n };
        unsigned grid[3] = { (unsigned)((n + 1023) / 1024) + (n == 0), 1, 1 };   /* four floats a thread */
        if (e->clear && e->clear[i].after >= 0 && grid[0] > (unsigned)e->dev->lt.sms)
            grid[0] = (unsigned)e->dev->lt.sms;   /* early (clear_early): a block an SM, beside the launches between */
        TRY(cuda_start(e->zero, grid, 256, 0, stream, args, early), "clearing a buffer");
    } else if (l->kind == CL_GEMM) {
        if (!gemm(e, i, early, stream, err)) return false;
    } else {
        cuda_kernel_args by_value = l->args;
        void *args[] = { &e->arena, &table, &hyper, l->takes_args ? &by_value : NULL };
        const unsigned grid[3] = { (unsigned)l->grid, (unsigned)l->grid_y, 1 };
        TRY(cuda_start(e->fn[i], grid, (unsigned)l->block, (unsigned)l->shared, stream, args, early), l->name);
    }
    return true;
fail:
    return false;
}

/* The side stream as the enqueue goes (side_plan): the device's stream moved on since it last
 * forked; the side launches from `open` on are not yet waited for, `last` the latest. */
typedef struct { bool moved; int open, last; } side_state;

/* Side launch i: forked from the device's stream where that moved on, then done's event. */
static bool enqueue_beside(cuda_exec *e, int i, side_state *s, tg_error *err) {
    cuda_device *v = e->dev;
    if (s->moved) {
        TRY(cu.EventRecord(v->fork, v->stream), "forking the side stream");
        TRY(cu.StreamWaitEvent(v->beside, v->fork, 0), "forking the side stream");
        s->moved = false;
    }
    if (!enqueue_one(e, i, v->beside, false, err)) return false;
    TRY(cu.EventRecord(e->side_done[i], v->beside), "joining the side stream");
    if (s->last < s->open) s->open = i;
    s->last = i;
    return true;
fail:
    return false;
}

/* Before launch i on the device's stream (i = n: the end): a wait for the side launches up to the
 * latest that i must follow (all for a launch not known); whether it waited. */
static bool join_for(cuda_exec *e, int i, side_state *s, bool *waited, tg_error *err) {
    *waited = false;
    if (!e->side || s->last < s->open) return true;
    const bool all = i == e->launches.n || !e->touched[i].known;
    int k = s->last;
    while (k >= s->open && !all && !(e->side[k] && clash(&e->touched[k], &e->touched[i]))) k--;
    if (k < s->open) return true;
    const char *env = getenv("TG_CUDA_SIDE");
    if (env && !strcmp(env, "verbose"))
        fprintf(stderr, "tensorgrad: cuda: %s (node %d) waits for the side stream (node %d)\n",
                i == e->launches.n ? "the end" : e->launches.launch[i].kind == CL_GEMM ? "product" : e->launches.launch[i].name,
                i == e->launches.n ? -1 : e->launches.launch[i].node, e->launches.launch[k].node);
    TRY(cu.StreamWaitEvent(e->dev->stream, e->side_done[k], 0), "joining the side stream");
    s->open = k + 1;
    while (s->open <= s->last && !e->side[s->open]) s->open++;
    *waited = true;
    return true;
fail:
    return false;
}

/* Launches [i, i + k) at once (together_plan): the later ones each on a side stream that forks
 * from the device's stream, which then waits for all of them. */
static bool enqueue_together(cuda_exec *e, int i, int k, bool early, tg_error *err) {
    cuda_device *v = e->dev;
    TRY(cu.EventRecord(v->fork, v->stream), "forking the stream");
    for (int j = 1; j < k; j++) {
        TRY(cu.StreamWaitEvent(v->side[j - 1], v->fork, 0), "forking the stream");
        if (!gemm(e, i + j, false, v->side[j - 1], err)) return false;
        TRY(cu.EventRecord(v->joined[j - 1], v->side[j - 1]), "joining the stream");
    }
    if (!gemm(e, i, early, v->stream, err)) return false;
    for (int j = 1; j < k; j++) TRY(cu.StreamWaitEvent(v->stream, v->joined[j - 1], 0), "joining the stream");
    return true;
fail:
    return false;
}

#define PROFILE_COPIES 20

/* TG_CUDA_PROFILE=graph: seconds per copy of launch i, run back to back in a graph as the step's
 * graph runs its launches (the eager profile also counts each launch's host-side start, which
 * dominates the smallest kernels). The copies recompute on the launch's own output. */
static bool time_in_graph(cuda_exec *e, int i, double *sec, tg_error *err) {
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    float ms = 0;
    TRY(cu.StreamBeginCapture(e->dev->stream, CU_CAPTURE_THREAD_LOCAL), "beginning graph capture");
    bool ok = true;
    for (int r = 0; r < PROFILE_COPIES && ok; r++) ok = enqueue_one(e, i, e->dev->stream, early_after(e, i - 1), err);
    CUresult rc = cu.StreamEndCapture(e->dev->stream, &graph);
    if (!ok) goto fail;
    TRY(rc, "ending graph capture");
    TRY(cu.GraphInstantiate(&exec, graph, 0), "instantiating the CUDA graph");
    TRY(cu.GraphLaunch(exec, e->dev->stream), "launching the CUDA graph");   /* warm */
    TRY(cu.EventRecord(e->marks[0], e->dev->stream), "profile event");
    TRY(cu.GraphLaunch(exec, e->dev->stream), "launching the CUDA graph");
    TRY(cu.EventRecord(e->marks[1], e->dev->stream), "profile event");
    TRY(cu.StreamSynchronize(e->dev->stream), "profile");
    TRY(cu.EventElapsedTime(&ms, e->marks[0], e->marks[1]), "profile event");
    *sec = 1e-3 * ms / PROFILE_COPIES;
    cu.GraphExecDestroy(exec);
    cu.GraphDestroy(graph);
    return true;
fail:
    if (exec) cu.GraphExecDestroy(exec);
    if (graph) cu.GraphDestroy(graph);
    return false;
}

/* The memsets to clear early after launches [first, last] (clear_early), each on the first
 * together stream, forked from the device's stream, its event recorded after it. */
static bool clears_after(cuda_exec *e, int first, int last, tg_error *err) {
    cuda_device *v = e->dev;
    bool forked = false;
    for (int m = last + 1; e->clear && m < e->launches.n; m++) {
        if (e->clear[m].after < first || e->clear[m].after > last) continue;
        if (!forked) {
            TRY(cu.EventRecord(v->fork, v->stream), "forking a stream for a clear");
            TRY(cu.StreamWaitEvent(v->side[0], v->fork, 0), "forking a stream for a clear");
            forked = true;
        }
        if (e->clear[m].wait >= 0) TRY(cu.StreamWaitEvent(v->side[0], e->side_done[e->clear[m].wait], 0), "an early clear's wait");
        if (!enqueue_one(e, m, v->side[0], false, err)) return false;
        TRY(cu.EventRecord(e->side_done[m], v->side[0]), "an early clear's event");
    }
    return true;
fail:
    return false;
}

/* Pinned host memory's address on the device (0 where the driver gives none) */
static CUdeviceptr host_on_device(void *p) {
    CUdeviceptr d = 0;
    return cu.MemHostGetDevicePointer && cu.MemHostGetDevicePointer(&d, p, 0) == 0 ? d : 0;
}

/* A graph's start: the hyper scalars uploaded (and the flag's zero after them), cuBLASLt's
 * counters zeroed. One kernel that reads the host's pinned memory (tg_begin) where the driver
 * maps it, else a copy and a memset: char_gpt's step had 22 us between its last kernel and the
 * next step's first, most of it the copy nodes (H200, bench/logs/gpu_h200_s43_*). */
static bool graph_begin(cuda_exec *e, tg_error *err) {
    CUdeviceptr hyper = host_on_device(e->hyper_host);
    CUdeviceptr zero = e->counters.base ? e->counters.base + e->counters.zero_from : 0;
    int n = e->n_hyper + 1, n_zero = e->counters.base ? (int)((e->counters.zero_to - e->counters.zero_from) / 4) : 0;
    if (hyper) {
        void *args[] = { &hyper, &e->hyper_dev, &n, &zero, &n_zero };
        TRY(cu.LaunchKernel(e->begin, 1, 1, 1, 256, 1, 1, 0, e->dev->stream, args, NULL), "hyper upload");
        return true;
    }
    TRY(cu.MemcpyHtoDAsync(e->hyper_dev, e->hyper_host, sizeof(double) * (size_t)n, e->dev->stream), "hyper upload");
    if (n_zero) TRY(cu.MemsetD32Async(zero, 0, (size_t)n_zero, e->dev->stream), "zeroing cuBLASLt's counters");
    return true;
fail:
    return false;
}

/* A graph's end: n floats from src into the host's pinned loss_host (tg_report, or a copy) */
static bool report_loss(cuda_exec *e, CUdeviceptr src, int n, tg_error *err) {
    CUdeviceptr dst = host_on_device(e->loss_host);
    if (dst) {
        void *args[] = { &src, &dst, &n };
        TRY(cu.LaunchKernel(e->report, 1, 1, 1, 32, 1, 1, 0, e->dev->stream, args, NULL), "reading the loss");
    } else {
        TRY(cu.MemcpyDtoHAsync(e->loss_host, src, sizeof(float) * (size_t)n, e->dev->stream), "reading the loss");
    }
    return true;
fail:
    return false;
}

/* Enqueue the whole launch list on the stream (captured by the caller; or, profiling, run with
 * an event between launches and the time of each added to its total). */
static bool enqueue(cuda_exec *e, tg_error *err) {
    e->slot_holds[0] = e->slot_holds[1] = -1;
    e->conversions = 0;
    if (!graph_begin(e, err)) return false;
    if (e->profile_graph) {
        for (int i = 0; i < e->launches.n; i++) {
            double sec;
            if (!enqueue_one(e, i, e->dev->stream, early_after(e, i - 1), err) || !time_in_graph(e, i, &sec, err)) return false;
            e->profile[i] += sec;
        }
        e->profiled_runs++;
        return true;
    }
    side_state side = { true, 0, -1 };
    bool waited, cleared = false;   /* cleared: the device's stream just waited for an early clear */
    for (int i = 0, prev = -1; i < e->launches.n; i++) {   /* prev: the last launch on the device's stream */
        const int k = e->together && !e->profile ? e->together[i] : 1;
        if (e->side && e->side[i]) {
            if (!enqueue_beside(e, i, &side, err)) return false;
            continue;
        }
        if (e->clear && e->clear[i].after >= 0) {
            TRY(cu.StreamWaitEvent(e->dev->stream, e->side_done[i], 0), "waiting for an early clear");
            cleared = true;
            continue;
        }
        waited = false;
        for (int j = i; j < i + k; j++) {   /* every product of a group: each may touch what a side launch does */
            bool w;
            if (!join_for(e, j, &side, &w, err)) return false;
            waited |= w;
        }
        const bool early = !waited && !cleared && early_after(e, prev);
        if (e->profile) TRY(cu.EventRecord(e->marks[i], e->dev->stream), "profile event");
        if (k > 1 && !enqueue_together(e, i, k, early, err)) return false;
        if (k == 1 && !enqueue_one(e, i, e->dev->stream, early, err)) return false;
        if (!clears_after(e, i, i + (k > 1 ? k - 1 : 0), err)) return false;
        i += k > 1 ? k - 1 : 0;
        prev = i;
        cleared = false;
        side.moved = true;
    }
    if (!join_for(e, e->launches.n, &side, &waited, err)) return false;
    if (e->profile) {   /* the events bracket each launch, without a host round trip between them */
        TRY(cu.EventRecord(e->marks[e->launches.n], e->dev->stream), "profile event");
        TRY(cu.StreamSynchronize(e->dev->stream), "profile");
        for (int i = 0; i < e->launches.n; i++) {
            float ms = 0;
            TRY(cu.EventElapsedTime(&ms, e->marks[i], e->marks[i + 1]), "profile event");
            e->profile[i] += 1e-3 * ms;
        }
        e->profiled_runs++;
    }
    return true;
fail:
    return false;
}

/* Capture the launch list (plus `tail`, for steps) into an instantiated graph. */
static bool capture(cuda_exec *e, CUgraphExec *out, bool (*tail)(cuda_exec *, void *, tg_error *), void *ctx, tg_error *err) {
    CUgraph graph = NULL;
    if (!products_ready(e, err)) return false;
    TRY(cu.StreamBeginCapture(e->dev->stream, CU_CAPTURE_THREAD_LOCAL), "beginning graph capture");
    counters_begin(&e->counters, e->dev->lt.workspace);
    bool ok = enqueue(e, err) && (!tail || tail(e, ctx, err));
    CUresult r = cu.StreamEndCapture(e->dev->stream, &graph);
    e->counters.capturing = false;   /* ended, failed or not */
    if (!ok) goto fail;
    TRY(r, "ending graph capture");
    counters_strip(&e->counters, graph);
    r = cu.GraphInstantiate(out, graph, 0);
    cu.GraphDestroy(graph);
    TRY(r, "instantiating the CUDA graph");
    return true;
fail:
    if (graph) cu.GraphDestroy(graph);
    return false;
}

static bool sync_table(cuda_exec *e, tg_error *err) {
    if (!e->table_dirty) return true;
    TRY(cu.MemcpyHtoD(e->table, e->bound, sizeof(void *) * (size_t)e->g->n), "uploading the buffer table");
    e->table_dirty = false;
    return true;
fail:
    return false;
}

/* Launch an instantiated graph with this call's hyper scalars; start_graph does not wait. */
static bool start_graph(cuda_exec *e, CUgraphExec graph, const double *hyper, tg_error *err) {
    int n = e->g->n_hyper > 1 ? e->g->n_hyper : 1;   /* forward graphs may have only the seed */
    memcpy(e->hyper_host, hyper, sizeof(double) * (size_t)n);
    TRY(cu.GraphLaunch(graph, e->dev->stream), "launching the CUDA graph");
    return true;
fail:
    return false;
}

static bool launch_graph(cuda_exec *e, CUgraphExec graph, const double *hyper, tg_error *err) {
    if (!start_graph(e, graph, hyper, err)) return false;
    TRY(cu.StreamSynchronize(e->dev->stream), "running the CUDA graph");
    return true;
fail:
    return false;
}

/* Profiling: the launch list run eagerly, launch by launch (see enqueue), then the tail. */
static bool run_eager(cuda_exec *e, const double *hyper, bool (*tail)(cuda_exec *, void *, tg_error *), void *ctx,
                      tg_error *err) {
    memcpy(e->hyper_host, hyper, sizeof(double) * (size_t)(e->g->n_hyper > 1 ? e->g->n_hyper : 1));
    if (!products_ready(e, err) || !enqueue(e, err) || (tail && !tail(e, ctx, err))) return false;
    return cu.StreamSynchronize(e->dev->stream) == 0;
}

static bool cuda_run(void *h, const double *hyper, tg_error *err) {
    cuda_exec *e = h;
    cu.CtxSetCurrent(e->dev->ctx);
    if (!sync_table(e, err)) return false;
    if (e->profile) return run_eager(e, hyper, NULL, NULL, err);
    if (!e->run_graph && !capture(e, &e->run_graph, NULL, NULL, err)) return false;
    return launch_graph(e, e->run_graph, hyper, err);
}

typedef struct { int loss; } step_ctx;

/* The end of a step's graph: the write-backs not replaced in place (codegen_cuda), copied only
 * when the loss and the flag are finite, then the loss and the flag into pinned memory. A small
 * step is a few dozen microseconds, and each node of the graph costs about two: the flag is
 * zeroed by the run's hyper upload rather than a memset, the poison cleared outside the graph
 * and only after a step may have set it (step_start), and the write-back kernel (or the kernels
 * that replace leaves in place) reports the loss and the flag side by side for one report_loss
 * rather than two (sin_mlp 0.055 ms a step with this tail as it was, 0.045 without any). */
static bool step_tail(cuda_exec *e, void *ctx, tg_error *err) {
    const step_ctx *c = ctx;
    CUdeviceptr loss_ptr = node_ptr(e, c->loss), flag = e->wb_flag, poison = e->wb_poison, table = e->wb_table;
    CUdeviceptr report = e->wb_report;
    if (e->n_wb == 0 && e->n_inplace > 0) return report_loss(e, report, 2, err);   /* the kernels that replaced leaves in place wrote it */
    if (e->n_wb == 0) return report_loss(e, loss_ptr, 1, err);   /* the flag stays 0, as does the host's copy of it */
    void *check[] = { &flag, &table }, *copy[] = { &loss_ptr, &flag, &poison, &table, &report };
    if (!e->launches.writebacks_checked && !e->launches.grads_checked)
        TRY(cu.LaunchKernel(e->wb_check, 64, (unsigned)e->n_wb, 1, 256, 1, 1, 0, e->dev->stream, check, NULL),
            "write-back check");
    TRY(cu.LaunchKernel(e->writeback, 64, (unsigned)e->n_wb, 1, 256, 1, 1, 0, e->dev->stream, copy, NULL), "write-backs");
    return report_loss(e, report, 2, err);
fail:
    return false;
}

/* The device table of a step's write-backs (node -> leaf), built at its first run. */
static bool writeback_table(cuda_exec *e, const tg_assign *wb, int n_wb, void *const *dst, tg_error *err) {
    wb_entry *t = tg_alloc(sizeof(wb_entry) * (size_t)(n_wb + 1));
    if (!t) { tg_seterr(err, "out of memory for the write-back table"); return false; }
    e->n_wb = e->n_inplace = 0;
    for (int k = 0; k < n_wb; k++) {
        const void *src = (const void *)node_ptr(e, wb[k].src);
        if (src == dst[k]) e->n_inplace++;   /* its kernel replaced the leaf in place */
        else t[e->n_wb++] = (wb_entry){ src, dst[k], (long long)e->g->nodes[wb[k].src].numel };
    }
    n_wb = e->n_wb;
    CUresult r = cu.MemAlloc(&e->wb_table, sizeof(wb_entry) * (size_t)(n_wb + 1));
    if (!r && n_wb) r = cu.MemcpyHtoD(e->wb_table, t, sizeof(wb_entry) * (size_t)n_wb);
    free(t);
    if (r) { tg_seterr(err, "write-back table: %s", cu_error(r)); return false; }
    return true;
}

/* A step started: its graph captured at the first call, then launched without waiting.
 * Profiling runs it eagerly (and waits) instead, keeping no graph. */
static bool step_capture(cuda_exec *e, int loss, const tg_assign *wb, int n_wb, void *const *dst, tg_error *err) {
    cu.CtxSetCurrent(e->dev->ctx);
    if (!sync_table(e, err)) return false;
    if (e->step_graph || e->profile) return true;
    step_ctx ctx = { loss };
    return writeback_table(e, wb, n_wb, dst, err) && capture(e, &e->step_graph, step_tail, &ctx, err);
}

static bool step_start(cuda_exec *e, const double *hyper, int loss, const tg_assign *wb, int n_wb, void *const *dst,
                       tg_error *err) {
    if (!step_capture(e, loss, wb, n_wb, dst, err)) return false;
    if (e->poisoned) {   /* a failed step, or a tg_steps call, before this one may have set it */
        TRY(cu.MemsetD32Async(e->wb_poison, 0, 1, e->dev->stream), "clearing the poison");
        e->poisoned = false;
    }
    if (e->profile) {
        step_ctx ctx = { loss };
        bool ok = writeback_table(e, wb, n_wb, dst, err) && run_eager(e, hyper, step_tail, &ctx, err);
        if (e->wb_table) cu.MemFree(e->wb_table);   /* rebuilt on the next step: profiling keeps no graph */
        e->wb_table = 0;
        return ok;
    }
    return start_graph(e, e->step_graph, hyper, err);
fail:
    return false;
}

/* A started step waited for: its loss, and the guard (non-finite when nothing was written). */
static bool step_finish(cuda_exec *e, double *loss_out, double *guard_out, tg_error *err) {
    cu.CtxSetCurrent(e->dev->ctx);
    TRY(cu.StreamSynchronize(e->dev->stream), "running the CUDA graph");
    *loss_out = e->loss_host[0];
    *guard_out = (double)e->loss_host[0] + e->loss_host[1];   /* the flag: 0 or NaN */
    e->poisoned |= !isfinite(*guard_out);
    return true;
fail:
    return false;
}

static bool cuda_step(void *h, const double *hyper, int loss, int guard, const tg_assign *wb, int n_wb, void *const *dst,
                      double *loss_out, double *guard_out, tg_error *err) {
    cuda_exec *e = h;
    return step_start(e, hyper, loss, wb, n_wb, dst, err) && step_finish(e, loss_out, guard_out, err);
}

/* ----- queued steps (tg_steps) ----- */

static int cuda_queue_depth(void *h) { return ((cuda_exec *)h)->profile ? 0 : QUEUE_DEPTH; }

/* Slot s set up at its first use: pinned memory, event, and its own capture of the step. */
static bool slot_ready(cuda_exec *e, queue_slot *s, int loss, tg_error *err) {
    if (s->graph) return true;
    void *hyper = NULL, *lossbuf = NULL;
    TRY(cu.MemAllocHost(&hyper, sizeof(double) * (size_t)(e->n_hyper + 1)), "allocating pinned memory");
    s->hyper = hyper;
    memset(s->hyper, 0, sizeof(double) * (size_t)(e->n_hyper + 1));
    TRY(cu.MemAllocHost(&lossbuf, sizeof(float) * 2), "allocating pinned memory");
    s->loss = lossbuf;
    memset(s->loss, 0, sizeof(float) * 2);
    TRY(cu.EventCreate(&s->done, 0), "creating an event");
    double *h = e->hyper_host;   /* the capture reads and writes the slot's pinned buffers */
    float *l = e->loss_host;
    e->hyper_host = s->hyper;
    e->loss_host = s->loss;
    step_ctx ctx = { loss };
    bool ok = capture(e, &s->graph, step_tail, &ctx, err);
    e->hyper_host = h;
    e->loss_host = l;
    return ok;
fail:
    return false;
}

/* One step queued behind the others: inputs through the slot's pinned memory, hyper scalars into
 * the slot, its graph launched, its event recorded; nothing waited for. `first`: the first step
 * of a tg_steps call, which clears the poison of an earlier one. */
static bool cuda_step_queue(void *h, const double *hyper, int loss, const tg_assign *wb, int n_wb, void *const *dst,
                            void *const *bufs, const void *const *data, const size_t *bytes, int n, bool first,
                            tg_error *err) {
    cuda_exec *e = h;
    if (e->q_count == QUEUE_DEPTH) { tg_seterr(err, "tg_steps: the step queue is full"); return false; }
    if (!step_capture(e, loss, wb, n_wb, dst, err)) return false;   /* the write-back table */
    queue_slot *s = &e->q[(e->q_head + e->q_count) % QUEUE_DEPTH];
    if (!slot_ready(e, s, loss, err)) return false;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (bytes[i] + 255) & ~(size_t)255;
    if (total > s->in_cap) {
        if (s->inputs) cu.MemFreeHost(s->inputs);
        void *p = NULL;
        s->inputs = cu.MemAllocHost(&p, total) ? NULL : p;
        s->in_cap = s->inputs ? total : 0;
        if (!s->inputs) { tg_seterr(err, "tg_steps: out of pinned memory for %zu bytes of inputs", total); return false; }
    }
    if (first) TRY(cu.MemsetD32Async(e->wb_poison, 0, 1, e->dev->stream), "clearing the poison");
    e->poisoned = true;   /* for the next step that is not queued */
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        memcpy(s->inputs + at, data[i], bytes[i]);
        TRY(cu.MemcpyHtoDAsync((CUdeviceptr)bufs[i], s->inputs + at, bytes[i], e->dev->stream), "uploading an input");
        at += (bytes[i] + 255) & ~(size_t)255;
    }
    memcpy(s->hyper, hyper, sizeof(double) * (size_t)(e->g->n_hyper > 1 ? e->g->n_hyper : 1));
    TRY(cu.GraphLaunch(s->graph, e->dev->stream), "launching the CUDA graph");
    TRY(cu.EventRecord(s->done, e->dev->stream), "recording an event");
    e->q_count++;
    return true;
fail:
    return false;
}

/* The oldest queued step waited for: its loss, and its guard (non-finite: nothing written). */
static bool cuda_step_wait(void *h, double *loss_out, double *guard_out, tg_error *err) {
    cuda_exec *e = h;
    if (e->q_count == 0) { tg_seterr(err, "tg_steps: no step queued"); return false; }
    queue_slot *s = &e->q[e->q_head];
    e->q_head = (e->q_head + 1) % QUEUE_DEPTH;
    e->q_count--;
    TRY(cu.EventSynchronize(s->done), "running the CUDA graph");
    *loss_out = s->loss[0];
    *guard_out = (double)s->loss[0] + s->loss[1];
    return true;
fail:
    return false;
}

/* ----- data parallel: several replicas' steps, NCCL between their two graphs ----- */

/* The all-reduce at the end of a replica's grad graph (one replica per process: NCCL's advice). */
static bool reduce_tail(cuda_exec *e, void *ctx, tg_error *err) {
    const dp_reduce *red = ctx;
    void *stream = e->dev->stream;
    return red->enqueue(red->ctx, &stream, 1, err);
}

/* Every replica's grad graph launched, the averaging with it or after it. */
static bool dp_grads(dp_replica *rep, int n, const dp_reduce *red, bool in_graph, void **streams, tg_error *err) {
    for (int r = 0; r < n; r++) {
        cuda_exec *e = rep[r].grad;
        streams[r] = e->dev->stream;
        cu.CtxSetCurrent(e->dev->ctx);
        if (!sync_table(e, err)) return false;
        if (e->profile) {
            if (!run_eager(e, rep[r].hyper, NULL, NULL, err)) return false;
            continue;
        }
        if (!e->dp_graph && !capture(e, &e->dp_graph, in_graph ? reduce_tail : NULL, (void *)red, err)) return false;
        if (!start_graph(e, e->dp_graph, rep[r].hyper, err)) return false;
    }
    return in_graph || red->enqueue(red->ctx, streams, n, err);
}

/* Wait for every replica's gradients and their averaging, under the communicator's watchdog
 * (which aborts NCCL when a peer dies or the timeout passes). The wait polls the streams rather
 * than blocking in cuStreamSynchronize, as NCCL advises: an abort from the watchdog's thread can
 * deadlock against a blocked synchronize, and the kernels of a dead peer's all-reduce may never
 * end. Once aborted the step fails without waiting further. */
static bool dp_wait(dp_replica *rep, int n, const dp_reduce *red, tg_error *err) {
    CUresult first = 0;
    red->watch(red->ctx, true);
    for (int r = 0; r < n; r++) {
        cuda_exec *e = rep[r].grad;
        cu.CtxSetCurrent(e->dev->ctx);
        CUresult rc;
        tg_error why;
        while ((rc = cu.StreamQuery(e->dev->stream)) == CUDA_ERROR_NOT_READY && red->ok(red->ctx, &why)) sched_yield();
        if (rc && rc != CUDA_ERROR_NOT_READY && !first) first = rc;
    }
    red->watch(red->ctx, false);
    if (!red->ok(red->ctx, err)) return false;
    if (first) tg_seterr(err, "computing the gradients: %s", cu_error(first));
    return first == 0;
}

static bool cuda_dp_step(dp_replica *rep, int n, const dp_reduce *red, tg_error *err) {
    void *streams[MAX_DEVICES];
    if (n > MAX_DEVICES) { tg_seterr(err, "%d replicas: at most %d devices per process", n, MAX_DEVICES); return false; }
    bool in_graph = red->in_graph && n == 1 && !((cuda_exec *)rep[0].grad)->profile;
    for (int r = 0; r < n; r++)   /* every update graph made before any runs: none may fail halfway */
        if (!step_capture(rep[r].update, rep[r].loss, rep[r].wb, rep[r].n_wb, rep[r].dst, err)) return false;
    if (!dp_grads(rep, n, red, in_graph, streams, err) || !dp_wait(rep, n, red, err)) return false;
    for (int r = 0; r < n; r++)   /* the averages are complete everywhere: the updates may run */
        if (!step_start(rep[r].update, rep[r].hyper, rep[r].loss, rep[r].wb, rep[r].n_wb, rep[r].dst, err)) return false;
    for (int r = 0; r < n; r++)
        if (!step_finish(rep[r].update, &rep[r].loss_out, &rep[r].guard_out, err)) return false;
    return true;
}

/* ----- the entry points: one thread at a time on the device -----
 * Every handle enqueues on one stream, and the first run of a graph captures that stream into a
 * CUDA graph: work that another thread enqueued meanwhile would land in the capture (or break
 * it). So each entry point that touches the device holds one process-wide lock; the device runs
 * one stream's work in order anyway. Recursive: a failed prepare releases what it made. */
static pthread_mutex_t device_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
#define LOCKED(type, call) { pthread_mutex_lock(&device_mu); type r_ = call; pthread_mutex_unlock(&device_mu); return r_; }
#define LOCKED_VOID(call) { pthread_mutex_lock(&device_mu); call; pthread_mutex_unlock(&device_mu); }

static void *locked_alloc(size_t numel) LOCKED(void *, cuda_alloc(0, numel))
static void locked_free(void *buf) LOCKED_VOID(cuda_free(buf))
static void locked_write(void *buf, tg_dtype dt, const double *src, size_t n) LOCKED_VOID(cuda_write(buf, dt, src, n))
static void locked_upload(void *buf, tg_dtype dt, const void *src, size_t n) LOCKED_VOID(cuda_upload(buf, dt, src, n))
static void locked_read(const void *buf, tg_dtype dt, double *dst, size_t n) LOCKED_VOID(cuda_read(buf, dt, dst, n))
static void locked_copy(void *dst, const void *src, size_t n) LOCKED_VOID(cuda_copy(dst, src, n))
static void *locked_prepare(const tg_graph *g, const int *keep, int n_keep, tg_error *err)
    LOCKED(void *, cuda_prepare(0, g, keep, n_keep, err))
static bool locked_run(void *h, const double *hyper, tg_error *err) LOCKED(bool, cuda_run(h, hyper, err))
static void locked_release(void *h) LOCKED_VOID(cuda_release(h))
static bool locked_step(void *h, const double *hyper, int loss, int guard, const tg_assign *wb, int n_wb, void *const *dst,
                        double *loss_out, double *guard_out, tg_error *err)
    LOCKED(bool, cuda_step(h, hyper, loss, guard, wb, n_wb, dst, loss_out, guard_out, err))
static bool locked_step_queue(void *h, const double *hyper, int loss, const tg_assign *wb, int n_wb, void *const *dst,
                              void *const *bufs, const void *const *data, const size_t *bytes, int n, bool first, tg_error *err)
    LOCKED(bool, cuda_step_queue(h, hyper, loss, wb, n_wb, dst, bufs, data, bytes, n, first, err))
static bool locked_step_wait(void *h, double *loss_out, double *guard_out, tg_error *err)
    LOCKED(bool, cuda_step_wait(h, loss_out, guard_out, err))
static bool locked_dp_step(dp_replica *rep, int n, const dp_reduce *red, tg_error *err) LOCKED(bool, cuda_dp_step(rep, n, red, err))
static bool locked_set_device(int d, tg_error *err) LOCKED(bool, device_at(d, err) != NULL)
static const char *cuda_source(void *exec) { return ((cuda_exec *)exec)->source; }
/* The launch list, the hyper-scalar upload, the zeroing of cuBLASLt's counters (cuda_counters.c),
 * the write-backs' check (unless the kernels check) and copy where a step copies any (step_tail),
 * and (tf32, bf16) the operand roundings of the last captured step. */
static int cuda_launches(void *exec) {
    const cuda_exec *e = exec;
    bool copies = e->n_wb > 0, checks = copies && !e->launches.writebacks_checked && !e->launches.grads_checked;
    return e->launches.n + 1 + copies + checks + e->conversions + (e->counters.base != 0);
}

static tg_precision cuda_precision(tg_precision want) { return want; }

static const tg_backend *cuda_on_device(int ordinal, tg_error *err);

/* Device 0's table; cuda_on_device gives every other device's. */
const tg_backend backend_cuda = {
    .name = "cuda", .alloc = locked_alloc, .free = locked_free, .write = locked_write, .upload = locked_upload,
    .read = locked_read, .copy = locked_copy, .prepare = locked_prepare, .planned_bytes = cuda_planned_bytes,
    .bind = cuda_bind, .run = locked_run, .node_buf = cuda_node_buf, .release = locked_release, .step = locked_step,
    .source = cuda_source, .checks_writebacks = true, .product_align = 8, .group_products = 1u << TG_PRECISION_BF16, .available = device_ready, .launches = cuda_launches,
    .precision = cuda_precision, .on_device = cuda_on_device, .set_device = locked_set_device, .dp_step = locked_dp_step,
    .queue_depth = cuda_queue_depth, .step_queue = locked_step_queue, .step_wait = locked_step_wait,
};

/* ----- a table per device -----
 * Data parallelism puts a replica on each device; the runtime holds a backend table per replica,
 * and the two entry points that create things (alloc, prepare) must know the device. The others
 * find it from the buffer or the executor. */
#define ON_DEVICE(D)                                                                                                   \
    static void *alloc_on_##D(size_t numel) LOCKED(void *, cuda_alloc(D, numel))                                        \
    static void *prepare_on_##D(const tg_graph *g, const int *keep, int n_keep, tg_error *err)                           \
        LOCKED(void *, cuda_prepare(D, g, keep, n_keep, err))
ON_DEVICE(0) ON_DEVICE(1) ON_DEVICE(2) ON_DEVICE(3) ON_DEVICE(4) ON_DEVICE(5) ON_DEVICE(6) ON_DEVICE(7)
ON_DEVICE(8) ON_DEVICE(9) ON_DEVICE(10) ON_DEVICE(11) ON_DEVICE(12) ON_DEVICE(13) ON_DEVICE(14) ON_DEVICE(15)
#define ON(D) { alloc_on_##D, prepare_on_##D }
static const struct {
    void *(*alloc)(size_t);
    void *(*prepare)(const tg_graph *, const int *, int, tg_error *);
} ON_DEVICES[MAX_DEVICES] = { ON(0), ON(1), ON(2), ON(3), ON(4), ON(5), ON(6), ON(7),
                              ON(8), ON(9), ON(10), ON(11), ON(12), ON(13), ON(14), ON(15) };
static tg_backend device_tables[MAX_DEVICES];

static const tg_backend *cuda_on_device(int ordinal, tg_error *err) {
    pthread_mutex_lock(&device_mu);
    bool ok = device_at(ordinal, err) != NULL;   /* set up now: a missing device fails tg_compile */
    if (ok && ordinal > 0 && !device_tables[ordinal].name) {
        device_tables[ordinal] = backend_cuda;
        device_tables[ordinal].alloc = ON_DEVICES[ordinal].alloc;
        device_tables[ordinal].prepare = ON_DEVICES[ordinal].prepare;
    }
    pthread_mutex_unlock(&device_mu);
    return !ok ? NULL : ordinal == 0 ? &backend_cuda : &device_tables[ordinal];
}

/* ----- compile-only variant: host buffers, NVRTC for sm_90a, nothing runs ----- */

static void *host_alloc(size_t numel) { return calloc(numel ? numel : 1, 4); }
static void host_write(void *buf, tg_dtype dt, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dt == TG_INT32) ((int32_t *)buf)[i] = (int32_t)src[i];
        else ((float *)buf)[i] = (float)src[i];
    }
}
static void host_read(const void *buf, tg_dtype dt, double *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dt == TG_INT32 ? ((const int32_t *)buf)[i] : ((const float *)buf)[i];
}
static void host_upload(void *buf, tg_dtype dt, const void *src, size_t n) { memcpy(buf, src, n * 4); }
static void host_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n * 4); }

static void nvrtc_release(void *h);

static void *nvrtc_prepare(const tg_graph *g, const int *keep, int n_keep, tg_error *err) {
    cuda_exec *e = tg_alloc(sizeof *e);
    if (!e) { tg_seterr(err, "out of memory preparing the CUDA kernels"); return NULL; }
    cuda_part parts[MAX_PARTS];
    int n_parts = generate(e, g, keep, n_keep, "sm_90a", err) ? compile_parts(e->source, e->launches.prelude, "sm_90a", parts, err) : 0;
    parts_free(parts, n_parts);
    e->bound = tg_alloc(sizeof(void *) * (size_t)(g->n + 1));
    if (!n_parts || !e->bound) {
        if (n_parts && !e->bound) tg_seterr(err, "out of memory preparing the CUDA kernels");
        nvrtc_release(e);
        return NULL;
    }
    return e;
}

static void nvrtc_release(void *h) {
    cuda_exec *e = h;
    plan_free(&e->plan);
    cuda_plan_free(&e->launches);
    cuda_fold_free(e->folded);
    free(e->bound);
    free(e->source);
    free(e);
}

static bool nvrtc_run(void *h, const double *hyper, tg_error *err) {
    tg_seterr(err, "the cuda-nvrtc backend only compiles kernels; it runs nothing");
    return false;
}

static void *nvrtc_node_buf(void *h, int node) { return ((cuda_exec *)h)->bound[node]; }

const tg_backend backend_cuda_nvrtc = {
    .name = "cuda-nvrtc", .alloc = host_alloc, .free = free, .write = host_write, .upload = host_upload,
    .read = host_read, .copy = host_copy, .prepare = nvrtc_prepare, .planned_bytes = cuda_planned_bytes,
    .bind = cuda_bind, .run = nvrtc_run, .node_buf = nvrtc_node_buf, .release = nvrtc_release, .source = cuda_source,
    .checks_writebacks = true, .product_align = 8, .group_products = 1u << TG_PRECISION_BF16, .available = nvrtc_ready, .launches = cuda_launches,
    .precision = cuda_precision,
};

