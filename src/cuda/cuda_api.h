/* The pieces of the CUDA driver API this backend uses, declared here so that no CUDA header is
 * needed to build it: the types, and the table of entry points that cuda_backend.c fills with
 * dlsym when CUDA is first used (`cu.MemAlloc(...)` in the backend's files). */
#ifndef TG_CUDA_API_H
#define TG_CUDA_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec, *CUevent, *CUgraphNode;
/* cuda.h's CUDA_MEMSET_NODE_PARAMS */
typedef struct { CUdeviceptr dst; size_t pitch; unsigned value, element_size; size_t width, height; } cu_memset_params;

#define CU_ATTR_CC_MAJOR 75
#define CU_ATTR_CC_MINOR 76
#define CU_ATTR_SMS 16   /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
#define CU_CAPTURE_THREAD_LOCAL 1
#define CU_EVENT_DISABLE_TIMING 2
#define CU_FUNC_MAX_DYNAMIC_SHARED 8
#define CU_FUNC_SHARED_CARVEOUT 9   /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent */
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_GRAPH_NODE_TYPE_MEMSET 2
#define CU_CAPTURE_STATUS_ACTIVE 1
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600

typedef struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocHost)(void **, size_t);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*LaunchKernelEx)(const void *, CUfunction, void **, void **);   /* optional (CUDA 11.8 on): NULL without */
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);     /* optional: NULL without */
    /* optional (CUDA 12.3 on), all or none: a captured graph's nodes and edges (cuda_counters.c) */
    CUresult (*StreamGetCaptureInfo)(CUstream, int *, uint64_t *, CUgraph *, const CUgraphNode **, size_t *);
    CUresult (*GraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*GraphGetRootNodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*GraphNodeGetType)(CUgraphNode, int *);
    CUresult (*GraphMemsetNodeGetParams)(CUgraphNode, cu_memset_params *);
    CUresult (*GraphNodeGetDependencies)(CUgraphNode, CUgraphNode *, void *, size_t *);     /* edge data: NULL */
    CUresult (*GraphNodeGetDependentNodes)(CUgraphNode, CUgraphNode *, void *, size_t *);
    CUresult (*GraphAddDependencies)(CUgraph, const CUgraphNode *, const CUgraphNode *, const void *, size_t);
    CUresult (*GraphDestroyNode)(CUgraphNode);
} cuda_driver_api;
extern cuda_driver_api tg_cuda_driver;
#define cu tg_cuda_driver

/* Kernel f on the stream, grid[0] x grid[1] x grid[2] blocks of `block` threads. `early`: the
 * kernel begins with tgk_prior (every kernel of the generated source does), so it may start while
 * the kernel before it finishes (programmatic dependent launch: lt_device's `early`). */
CUresult cuda_start(CUfunction f, const unsigned grid[3], unsigned block, unsigned shared, CUstream stream, void **args,
                     bool early);

/* cuda_products.c: matrix products through cuBLASLt, each with an algorithm chosen by timing. */
typedef struct {
    int ordinal;
    const char *name;             /* the device's, which the kernel cache's choices are kept under */
    void *handle;                 /* cublasLtHandle_t; NULL: no cuBLASLt */
    CUstream stream;
    CUdeviceptr workspace;
    size_t workspace_bytes;
    int own_warps;                /* most warps a block of our small-product kernel may have (its shared memory) */
    int sms;                      /* multiprocessors */
    bool early;                   /* kernels may be launched early (sm_90 on, cuLaunchKernelEx, TG_CUDA_EARLY not 0) */
} lt_device;
#define LT_OWN_WARP_BYTES (3200 * 4)   /* the shared memory a warp of that kernel uses (its TGG_WARP floats) */
#define LT_X3_BYTES (3 * 2 * 4608 * 4)  /* a block of our tensor-core kernel's: three stages of two TG3_TILEs */
/* Row-major C[M, N] = op(A) op(B) summed in f32, batch times (operands a_stride, b_stride
 * elements apart; C M * N), C stored in f32 or rounded to bf16. No padding: shapes are compared
 * and hashed as bytes. */
typedef struct {
    int64_t M, N, K, batch, a_stride, b_stride;
    int32_t ta, tb, bf16, tf32;   /* bf16 operands; f32 operands on TF32 tensor cores */
    uint32_t align[3];            /* bytes that every address of A, B and C is a multiple of (<= 256) */
    uint32_t c_bf16;              /* C in bf16 (a bf16 activation: graph_bf16_values) */
    uint32_t bias;                /* plus a bias per column of C's type (cuBLASLt's BIAS epilogue, or ours), */
    uint32_t accumulate;          /* or plus a bf16 matrix of C's shape (beta = 1; the struct has no padding bytes) */
} lt_shape;
typedef struct { uint64_t data[8]; } lt_algo;   /* cublasLtMatmulAlgo_t */
typedef struct {
    void *desc, *layout[3];       /* the operation; cuBLASLt's A (our B), B (our A) and C */
    lt_algo algo;
    size_t workspace;
    lt_shape shape;
    CUfunction own;               /* set: our kernel (tgk_gemm) runs this product instead, */
    int own_warps;                /* in blocks of this many warps; OWN_X3: tgk_gemm3 (three TF32 products), */
    CUfunction own_sum;           /* its split reduction's parts added by tg_gemm3_sum */
    const void *addend;           /* shape.accumulate: the matrix every run adds (C; the result goes to D) */
    const void *bias;             /* shape.bias: the vector every run adds (the epilogue's, or our kernels') */
} lt_product;
#define OWN_X3 1
typedef struct { CUfunction small, x3, x3_sum; } lt_ours;   /* our kernels for a product's transposes (NULL: none) */
void *lt_handle_new(void);        /* NULL without cuBLASLt */
/* Descriptors and the algorithm for shape s, the candidates timed on these buffers (whose
 * contents they overwrite: C; `addend`, s->bias's vector or s->accumulate's matrix, which every
 * run adds); `ours`, our kernels for s's transposes (CUDA_PRODUCT_KERNELS, CUDA_PRODUCT3_KERNELS),
 * more candidates where not NULL (never for bf16 operands). False (p cleared) when cuBLASLt is
 * missing or has none. */
bool lt_product_init(lt_product *p, const lt_device *d, const lt_shape *s, lt_ours ours, const void *A, const void *B,
                     void *C, const void *addend);
/* cuBLAS status; early: our kernel, where it runs p, may start early (cuda_start); ws: p->workspace
 * bytes of the caller's for cuBLASLt (a call's window, cuda_counters.c), 0: the device's */
int lt_run(const lt_product *p, const lt_device *d, const void *A, const void *B, void *C, bool early, CUdeviceptr ws);
void lt_product_free(lt_product *p);

/* cuda_counters.c: cuBLASLt's counters zeroed once at the start of a captured launch list, not
 * by a memset node before each product call. A window: where a call's workspace lies in `base`
 * (offset -1: the shared workspace), and where its counters lie in it. */
typedef struct { int64_t offset; size_t bytes, from, to; } counter_window;
/* a product call of the capture under way: its workspace, the capture's last nodes before it (more
 * than one where the call follows a join of streams; n_before 0: more than COUNTER_DEPS) */
enum { COUNTER_DEPS = 4 };
typedef struct { CUdeviceptr at; size_t bytes; CUgraphNode before[COUNTER_DEPS]; int n_before, window; } counter_call;
typedef struct {
    CUdeviceptr base;         /* every window; 0: none (TG_CUDA_COUNTERS=0, no counters, an older driver) */
    size_t zero_from, zero_to;   /* the bytes of base zeroed at the start: every window's counters */
    int *first;               /* per launch, the window of its first call, or -1 (not a product) */
    counter_window *window;   /* per call of a launch (gemm: one, or one per matrix of a batch) */
    counter_call *calls;      /* the calls of the capture under way or last ended, in order */
    int n_windows, n_calls, taken, kept;   /* taken, kept: memsets of the last graph stripped (kept: any left in it) */
    CUdeviceptr shared;       /* the device's workspace, where calls without a window run */
    bool capturing;
} cuda_counters;
/* Launch i makes calls[i] cuBLASLt calls (0: not a product); false when memory runs out */
bool counters_init(cuda_counters *c, int n_launches, const int64_t *calls);
void counters_begin(cuda_counters *c, CUdeviceptr shared);   /* a capture starts */
/* The workspace of launch's call number `call`, p->workspace bytes (0: the device's); recorded
 * with the capture's last node when capturing */
CUdeviceptr counters_slice(cuda_counters *c, int launch, const lt_product *p, int64_t call, CUstream stream);
/* Where call `call` of launch `launch` finds its workspace: its window, or 0 (the device's shared one) */
CUdeviceptr counters_window(const cuda_counters *c, int launch, int64_t call);
/* Whether the calls of launch (calls of them, product p on the device's buffers A, B, C) open with
 * a memset of counters: p captured alone once. False when the capture fails. */
bool counters_learn(cuda_counters *c, int launch, int64_t calls, const lt_product *p, const lt_device *d, const void *A,
                    const void *B, void *C);
/* The windows of the calls with counters placed and allocated (false: no memory; then none) */
bool counters_place(cuda_counters *c);
/* After a capture ends: the memsets that open their call taken out of g; how many */
int counters_strip(cuda_counters *c, CUgraph g);
void counters_free(cuda_counters *c);

#endif
