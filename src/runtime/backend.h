/* The table through which the runtime drives a backend, and the registry of backends. */
#ifndef TG_BACKEND_H
#define TG_BACKEND_H

#include "graph/graph.h"

/* Data parallel (src/dist/): the averaging a device backend's dp_step runs between its
 * replicas' two graphs, given by the communicator. */
typedef struct {
    void *ctx;
    /* Enqueue the averaging of every local replica's gradients; streams[r] is replica r's. */
    bool (*enqueue)(void *ctx, void *const *streams, int n, tg_error *err);
    bool in_graph;                    /* it may be captured inside the replica's CUDA graph */
    void (*watch)(void *ctx, bool on);   /* a watchdog over the wait for it (on before, off after) */
    bool (*ok)(void *ctx, tg_error *err);   /* during or after the wait: not aborted, else why */
} dp_reduce;

/* One local replica's part of a data-parallel step: its `grad` executor (forward and backward
 * at its share of the batch, loss and gradients kept) and its `update` executor (the optimizer
 * over leaves bound to grad's loss and gradients), with what `step` takes for the latter. */
typedef struct {
    void *grad, *update;
    const double *hyper;              /* its own random seed; the optimizer's scalars */
    int loss, guard;                  /* update's nodes */
    const tg_assign *wb;
    int n_wb;
    void *const *dst;
    double loss_out, guard_out;
} dp_replica;

/* A backend's profile, one entry a call (a launch, a kernel call): the node it computes (-1:
 * none, as a memset), its kind (a kernel's name, "gemm"), what it works on, its seconds summed
 * over `runs` steps. profile_print (profile.c) prints the time per op, then the 40 calls that took
 * most (all: then every call in order), per run. */
typedef struct {
    int node;
    const char *kind;
    char what[64];
    double seconds;
} profile_call;
void profile_print(const char *backend, const char *unit, const char *note, const tg_graph *g, const profile_call *calls, int n,
                   int runs, bool all);

/* A backend: where buffers live and how a planned graph runs. The runtime talks only to this
 * table, so the reference interpreter, the compiled CPU backend and CUDA plug in alike.
 * Buffers hold `numel` elements of the backend's own type (doubles in the reference; float or
 * int32 by the tensor's dtype in compiled backends); host transfers go through write/read
 * (doubles) or upload (the caller's f32/i32 data). */
typedef struct tg_backend {
    const char *name;
    void *(*alloc)(size_t numel);                                    /* zero-filled, NULL on failure */
    void (*free)(void *buf);
    void (*write)(void *buf, tg_dtype dt, const double *src, size_t n);
    void (*upload)(void *buf, tg_dtype dt, const void *src, size_t n);
    void (*read)(const void *buf, tg_dtype dt, double *dst, size_t n);
    void (*copy)(void *dst, const void *src, size_t n);
    /* A graph made ready to run (the backend may keep a pointer to it). `keep` lists the nodes
     * whose values must stay readable after a run (outputs, gradients); the backend plans its
     * own buffers, since its fusion decides which nodes get memory at all. */
    void *(*prepare)(const tg_graph *g, const int *keep, int n_keep, tg_error *err);
    size_t (*planned_bytes)(void *exec);                             /* intermediate memory */
    void (*bind)(void *exec, int node, void *buf);                   /* INPUT/PARAM/STATE leaves */
    bool (*run)(void *exec, const double *hyper, tg_error *err);
    void *(*node_buf)(void *exec, int node);                         /* a node's values after run */
    void (*release)(void *exec);
    /* Optional: one whole training step kept on the device: run; then, only if the guard node
     * is finite (with checks_writebacks: the loss, and every value to write back), every
     * write-back dst[k] <- node wb[k].src; *loss_out and *guard_out get the loss and the guard
     * (non-finite when the write-backs were skipped) either way. NULL: the runtime does run,
     * read and copy itself. */
    bool (*step)(void *exec, const double *hyper, int loss, int guard, const tg_assign *wb, int n_wb, void *const *dst,
                 double *loss_out, double *guard_out, tg_error *err);
    const char *(*source)(void *exec);                               /* generated kernels, or NULL */
    /* Its step checks every value it writes back and fails the guard itself (one pass on the
     * device instead of a reduction per gradient): no guard node in the graph. */
    bool checks_writebacks;
    /* Products on tensor cores (tf32, bf16) want their weights' rows a multiple of this many
     * elements long (0: any length): the trace pads a weight of another width with zero columns
     * and narrows the product (tg_matmul in ops.c), since cuBLAS runs rows that are not 16-byte
     * aligned on much slower kernels there (f32's are not, and padding only adds memory).
     * TG_PAD_PRODUCTS=n overrides it at every precision (rt_product_align). */
    int product_align;
    /* The precisions (bits 1 << tg_precision) at which products of one left operand (a transformer's
     * q, k and v) have their gradients as one product each way (grad.c's find_siblings): one wide
     * product runs faster on a GPU than three narrow ones. TG_GROUP_PRODUCTS=0|1 overrides it
     * (rt_group_products). */
    unsigned group_products;
    /* Optional: whether it can run here (a device, a compiler), else false with the reason. */
    bool (*available)(tg_error *err);
    /* Optional: steps queued without waiting for each (tg_steps). queue_depth: how many may be
     * outstanding now (0: none; then the runtime steps one at a time). step_queue starts a step as
     * `step` does, its n inputs (host data[i], bytes[i], into device buffer bufs[i]) uploaded by
     * the backend in order with it, and returns at once; `first` marks the first of a tg_steps
     * call. step_wait waits for the oldest queued step: its loss and guard. Once a step's guard
     * fails, the steps queued behind it in the same call change nothing either. */
    int (*queue_depth)(void *exec);
    bool (*step_queue)(void *exec, const double *hyper, int loss, const tg_assign *wb, int n_wb, void *const *dst,
                       void *const *bufs, const void *const *data, const size_t *bytes, int n, bool first, tg_error *err);
    bool (*step_wait)(void *exec, double *loss_out, double *guard_out, tg_error *err);
    /* Optional: device launches per step (tg_train_launch_count). */
    int (*launches)(void *exec);
    /* Optional: the precision it runs when `want` (F32, TF32 or BF16) is asked; NULL: f32 only. */
    tg_precision (*precision)(tg_precision want);
    /* Optional, data parallel on devices. on_device: the table whose buffers and graphs live on
     * device `ordinal` (NULL: replicas share this table and run one after another, on the host).
     * set_device: make the device current on this thread (NCCL creates communicators there).
     * dp_step: one step of n local replicas: every grad graph, then red's averaging (inside the
     * graph when red->in_graph and n == 1), the wait for it under red's watchdog, then every
     * update as `step` runs it; loss_out and guard_out per replica. Without dp_step the runtime
     * runs the replicas itself and averages on the host. */
    const struct tg_backend *(*on_device)(int ordinal, tg_error *err);
    bool (*set_device)(int ordinal, tg_error *err);
    bool (*dp_step)(dp_replica *rep, int n, const dp_reduce *red, tg_error *err);
} tg_backend;

/* By name: "cpu" (the default; $TG_BACKEND overrides), "reference" (the interpreter, f32),
 * "reference-f64" (double, for gradient checks), "cuda", and "cuda-nvrtc" (a compile-only
 * variant: NVRTC for sm_90, runs nothing; tests use it on machines without a GPU). NULL with err
 * set for an unknown or unavailable backend. */
const tg_backend *backend_find(const char *name, tg_error *err);
extern const tg_backend backend_reference, backend_reference_f64;   /* reference/ref_backend.c */
extern const tg_backend backend_cpu;                                 /* cpu/cpu_backend.c */
extern const tg_backend backend_cuda, backend_cuda_nvrtc;            /* cuda/cuda_backend.c */

#endif
