/* Data parallelism: the settings of a job (spec and environment), the TCP rendezvous and
 * messages between processes, NCCL loaded at run time, the communicator that averages values
 * over every replica of every process, and the data-parallel training handle built on them
 * (replicas.c). The runtime calls only the last group; nothing here is public API.
 *
 * Words used throughout: a *replica* holds the whole model and computes on its share of the
 * batch; a *process* (rank) drives one or more of them (its local replicas, one per device);
 * the job has world * n_local replicas, replica r of rank k being global replica k * n_local + r. */
#ifndef TG_DIST_H
#define TG_DIST_H

#include "runtime/runtime.h"

#define DIST_MAX_LOCAL 64          /* replicas in one process (virtual ones on the host backends) */
#define DIST_DEFAULT_PORT 29500     /* torchrun's */
#define DIST_DEFAULT_TIMEOUT 600.0  /* seconds, as PyTorch's NCCL default */

/* ----- settings.c: what a spec and the environment ask for ----- */

typedef struct {
    bool multi_process;            /* spec.dist was given */
    int rank, world, local_rank;
    char addr[256];
    int port;
    double timeout_s;
    int n_local;                   /* replicas in this process */
    int ordinal[DIST_MAX_LOCAL];   /* their devices */
} dist_settings;

/* Whether the spec asks for data parallelism at all (devices or dist set). */
bool dist_requested(const tg_train_spec *spec);
/* Resolve and check the spec's devices and dist fields and the environment; false with err set
 * ("TG_RANK='x' is not a whole number", "rank 2 is outside a world of 2 processes", ...). */
bool dist_settings_resolve(const tg_train_spec *spec, dist_settings *s, tg_error *err);

/* ----- net.c: TCP between processes, every wait bounded by the timeout ----- */

typedef struct {
    int rank, world;
    int *fd;                       /* rank 0: fd[k] to rank k (fd[0] unused); others: fd[0] to rank 0 */
    double timeout_s;
    uint64_t calls;                /* exchanges so far: both sides must agree */
} dist_net;

#define DIST_ID_BYTES 128          /* the payload rank 0 hands out (an NCCL unique id) */

/* Meet every other rank: rank 0 listens on s->port and waits for world - 1 connections, the
 * others connect to s->addr (retrying until rank 0 listens); each says its rank, world size, local
 * replica count and `fingerprint` (what the job is), and rank 0 checks them all, then sends
 * everyone its `payload` (rank 0: in, others: out) or the reason the job cannot start. */
bool net_rendezvous(dist_net *n, const dist_settings *s, uint64_t fingerprint, uint8_t payload[DIST_ID_BYTES],
                    tg_error *err);
/* Sum `count` doubles over every rank, in place, and agree on success: a rank passing ok = false
 * (it could not compute its share) makes every rank's call fail naming it, and the connections
 * stay usable. A rank that closed its connection, sent nothing within the timeout or broke the
 * protocol fails the call with *broken set: the connections are closed for good, so every other
 * rank notices at once. */
bool net_sum(dist_net *n, double *v, size_t count, bool ok, bool *broken, tg_error *err);
void net_close(dist_net *n);

/* ----- nccl.c: NCCL through dlopen ----- */

/* Load NCCL ($TG_NCCL_LIB, else libnccl.so.2) and check its version (2.14 or later: nonblocking
 * communicators, abortable); false with why. Sets NCCL_NVLS_ENABLE=0 unless the user set it. */
bool nccl_load(tg_error *err);
bool nccl_unique_id(uint8_t id[DIST_ID_BYTES], tg_error *err);
int nccl_version(void);            /* e.g. 22809, or 0 before nccl_load succeeded */

/* A contiguous run of f32 values a replica averages: a device pointer and its element count. */
typedef struct { void *ptr; size_t count; } dist_span;

/* This process's NCCL communicators (one per local device) and the watchdog that aborts them
 * when a wait outlives the timeout or NCCL reports an asynchronous error (a peer died). */
typedef struct nccl_group nccl_group;
/* Collective: create the communicators of global ranks first .. first + n - 1 of `total`, each
 * with set_device(ordinal[i]) current (NCCL uses the current device). */
nccl_group *nccl_group_new(const uint8_t id[DIST_ID_BYTES], int total, int first, int n, const int *ordinal,
                           bool (*set_device)(int ordinal, tg_error *err), double timeout_s, tg_error *err);
/* Enqueue the averaging (ncclAvg, in place) of every replica's spans on its stream, as one
 * group. */
bool nccl_group_reduce(nccl_group *g, void *const *streams, dist_span *const *spans, const int *n_spans,
                       tg_error *err);
void nccl_group_watch(nccl_group *g, bool on);
bool nccl_group_ok(nccl_group *g, tg_error *err);   /* false (why) once aborted */
void nccl_group_free(nccl_group *g);

/* ----- comm.c: averaging over every replica of the job ----- */

typedef struct dist_comm dist_comm;
/* The communicator of this process: meets the other ranks (world > 1) and, for a backend whose
 * replicas are devices (`device`), makes NCCL communicators when the job has several replicas. */
dist_comm *dist_comm_new(const dist_settings *s, const tg_backend *be, bool device, uint64_t fingerprint,
                         tg_error *err);
void dist_comm_free(dist_comm *c);
int dist_comm_total(const dist_comm *c);            /* replicas in the job */
/* Why the communicator can no longer be used (a peer failed), or NULL. */
const char *dist_comm_broken(const dist_comm *c);
/* Host backends: v holds this process's sum over its replicas; it becomes the mean over every
 * replica of the job. ok = false: this process could not compute its share. */
bool dist_comm_mean(dist_comm *c, double *v, size_t count, bool ok, tg_error *err);
/* Device backends: the buffers each local replica averages (kept by the communicator) and the
 * reduction the backend's dp_step runs. */
bool dist_comm_set_spans(dist_comm *c, int replica, const dist_span *spans, int n, tg_error *err);
dp_reduce dist_comm_reduce(dist_comm *c);

/* ----- replicas.c: the data-parallel training handle ----- */

/* tg_compile for a spec with devices or dist: every replica's graphs, the communicator, the
 * parameters (t's own buffers are replica 0's). NULL with err set. */
tg_train *dist_train_build(const tg_train_spec *spec, tg_error *err);
void dist_free(dist_state *d);
tg_result dist_step(tg_train *t, const tg_data *inputs, int n_inputs);
/* After t's parameters or optimizer state changed (upload, load, reset): every other local
 * replica takes replica 0's values (through a host buffer allocated at build: this cannot fail). */
void dist_sync(tg_train *t);
const tg_input_decl *dist_decls(const dist_state *d, int *n);   /* as declared (whole batch) */
/* The update graph's share of tg_train_planned_bytes and tg_train_launch_count (replica 0's). */
size_t dist_update_bytes(const dist_state *d);
int dist_update_launches(const dist_state *d);
/* Test hook: replica 0's update graph's generated kernels (NULL: none, or no such handle). */
const char *dist_update_source(const tg_train *t);
int dist_rank(const dist_state *d);
int dist_replicas(const dist_state *d);
/* Test hook: replica r's values of parameter `name` (n elements). */
tg_status dist_replica_param(tg_train *t, int replica, const char *name, float *dst, size_t n, tg_error *err);

#endif
