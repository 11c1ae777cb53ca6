/* NCCL, loaded at run time with dlopen like the driver, NVRTC and cuBLAS: the few types and
 * functions used are declared here, so building needs no NCCL or CUDA header and a machine
 * without NCCL still runs everything else (tg_distributed_available says why not).
 *
 * Communicators are created nonblocking (NCCL 2.14+): creation and every call return at once
 * and are waited for here, with a deadline, so a rank that never comes makes creation fail
 * rather than hang. While a step waits on its all-reduce, a watchdog thread polls each
 * communicator's asynchronous error (a peer that died or a network failure) and the deadline;
 * either aborts the communicators (ncclCommAbort), which ends the all-reduce kernels so the wait
 * returns, and the step fails with the reason. */
#include "dist/dist.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ----- the pieces of NCCL used, declared here so no header is needed ----- */

typedef struct { char internal[DIST_ID_BYTES]; } nccl_id;   /* ncclUniqueId, passed by value */
typedef void *nccl_comm;
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7, NCCL_FLOAT32 = 7, NCCL_AVG = 4 };
#define NCCL_MIN_VERSION 21400   /* NCCL_VERSION(2, 14, 0): nonblocking communicators */

/* ncclConfig_t as NCCL 2.14 laid it out. NCCL copies `size` bytes of it over its defaults and
 * reads only the fields `version` had, so this older layout stays valid on every later NCCL. */
typedef struct {
    size_t size;
    unsigned magic, version;
    int blocking, cga_cluster_size, min_ctas, max_ctas;
    const char *net_name;
} nccl_config;
#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_CONFIG_VERSION 21403
#define NCCL_UNDEF_INT (-2147483647 - 1)

static struct {
    int (*GetVersion)(int *);
    int (*GetUniqueId)(nccl_id *);
    int (*CommInitRankConfig)(nccl_comm *, int, nccl_id, int, nccl_config *);
    int (*CommGetAsyncError)(nccl_comm, int *);
    int (*CommAbort)(nccl_comm);
    int (*CommDestroy)(nccl_comm);
    int (*AllReduce)(const void *, void *, size_t, int, int, nccl_comm, void *);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    const char *(*GetErrorString)(int);
} nc;

static const char *const NCCL_NAMES[] = {
    "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommGetAsyncError", "ncclCommAbort",
    "ncclCommDestroy", "ncclAllReduce", "ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString",
};

/* ----- loading ----- */

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static bool loaded;
static int version;

/* Only success is remembered: a failed load is tried again at the next call (so that a test, or
 * a user fixing $TG_NCCL_LIB, sees the current state). */
static bool load_locked(tg_error *err) {
    if (loaded) return true;
    const char *want = getenv("TG_NCCL_LIB");
    const char *names[] = { want && want[0] ? want : "libnccl.so.2", want && want[0] ? NULL : "libnccl.so", NULL };
    void *lib = NULL;
    for (int i = 0; names[i] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        tg_seterr(err, "NCCL is not installed (%s could not be loaded; set TG_NCCL_LIB to its path)", names[0]);
        return false;
    }
    void **slot = (void **)&nc;
    for (size_t i = 0; i < sizeof NCCL_NAMES / sizeof *NCCL_NAMES; i++)
        if (!(slot[i] = dlsym(lib, NCCL_NAMES[i]))) {
            tg_seterr(err, "NCCL (%s) has no %s: version 2.14 or later is needed", names[0], NCCL_NAMES[i]);
            dlclose(lib);
            return false;
        }
    int v = 0;
    if (nc.GetVersion(&v) != NCCL_SUCCESS || v < NCCL_MIN_VERSION) {
        tg_seterr(err, "NCCL %d.%d.%d is too old: 2.14 or later is needed", v / 10000, v / 100 % 100, v % 100);
        dlclose(lib);
        return false;
    }
    /* NVLink SHARP (multicast) stays off unless asked for: the machines we run on need it off,
     * and NCCL reads its environment when it first initialises, which is after this. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    version = v;
    loaded = true;
    return true;
}

bool nccl_load(tg_error *err) {
    pthread_mutex_lock(&load_mu);
    bool ok = load_locked(err);
    pthread_mutex_unlock(&load_mu);
    return ok;
}

int nccl_version(void) {
    pthread_mutex_lock(&load_mu);
    int v = loaded ? version : 0;
    pthread_mutex_unlock(&load_mu);
    return v;
}

static const char *nccl_error(int rc) {
    const char *s = nc.GetErrorString ? nc.GetErrorString(rc) : NULL;
    return s ? s : "unknown NCCL error";
}

bool nccl_unique_id(uint8_t id[DIST_ID_BYTES], tg_error *err) {
    if (!nccl_load(err)) return false;
    nccl_id u;
    int rc = nc.GetUniqueId(&u);
    if (rc != NCCL_SUCCESS) {
        tg_seterr(err, "ncclGetUniqueId failed: %s", nccl_error(rc));
        return false;
    }
    memcpy(id, u.internal, DIST_ID_BYTES);
    return true;
}

/* ----- communicators and their watchdog ----- */

struct nccl_group {
    int n;
    nccl_comm *comm;
    double timeout_s;
    pthread_t thread;
    bool has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool watching, quit, aborted, aborting;   /* aborting: NCCL's abort still running */
    struct timespec deadline;        /* CLOCK_REALTIME, for pthread_cond_timedwait */
    char why[TG_ERROR_LEN];
};

static struct timespec realtime_in(double s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = ts.tv_nsec + (long long)((s - (double)(long long)s) * 1e9);
    ts.tv_sec += (time_t)s + ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    return ts;
}

static bool before(struct timespec a, struct timespec b) {
    return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

/* Abort every communicator, once; the first reason is kept. Called with g->mu held, which is let
 * go while NCCL aborts: with a dead peer on the same host that can take long (or, with some NCCL
 * versions, never end), and a step polling nccl_group_ok must see the abort at once. */
static void abort_locked(nccl_group *g, const char *why) {
    if (g->aborted) return;
    g->aborted = g->aborting = true;
    snprintf(g->why, sizeof g->why, "%s", why);
    nccl_comm comm[DIST_MAX_LOCAL];
    for (int i = 0; i < g->n; i++) {
        comm[i] = g->comm[i];
        g->comm[i] = NULL;
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->n; i++)
        if (comm[i]) nc.CommAbort(comm[i]);
    pthread_mutex_lock(&g->mu);
    g->aborting = false;
}

/* A communicator's asynchronous error, as a reason, or NULL while all is well. */
static const char *async_error(nccl_group *g, char *buf, size_t len) {
    for (int i = 0; i < g->n; i++) {
        int st = NCCL_SUCCESS;
        int rc = g->comm[i] ? nc.CommGetAsyncError(g->comm[i], &st) : NCCL_SUCCESS;
        if (rc == NCCL_SUCCESS && (st == NCCL_SUCCESS || st == NCCL_IN_PROGRESS)) continue;
        snprintf(buf, len, "NCCL reported an error (%s): a rank died, or the network failed",
                 nccl_error(rc != NCCL_SUCCESS ? rc : st));
        return buf;
    }
    return NULL;
}

/* The watchdog: idle until a wait is watched, then every 100 ms checks for an asynchronous error
 * and for the deadline, and aborts on either. */
static void *watchdog(void *arg) {
    nccl_group *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->quit) {
        if (!g->watching || g->aborted) {
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        struct timespec tick = realtime_in(0.1), now = realtime_in(0);
        pthread_cond_timedwait(&g->cv, &g->mu, before(tick, g->deadline) ? &tick : &g->deadline);
        if (!g->watching || g->aborted || g->quit) continue;
        char buf[TG_ERROR_LEN];
        const char *why = async_error(g, buf, sizeof buf);
        now = realtime_in(0);
        if (!why && !before(now, g->deadline)) {
            snprintf(buf, sizeof buf, "the all-reduce did not finish within %g s: another rank hung, died or fell behind",
                     g->timeout_s);
            why = buf;
        }
        if (why) abort_locked(g, why);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

void nccl_group_watch(nccl_group *g, bool on) {
    pthread_mutex_lock(&g->mu);
    g->watching = on;
    if (on) g->deadline = realtime_in(g->timeout_s);
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

bool nccl_group_ok(nccl_group *g, tg_error *err) {
    pthread_mutex_lock(&g->mu);
    bool ok = !g->aborted;
    if (!ok) tg_seterr(err, "%s", g->why);
    pthread_mutex_unlock(&g->mu);
    return ok;
}

/* Wait until no communicator is in progress (nonblocking calls finish in the background), the
 * deadline passes or one reports an error; on the last two, abort them all. */
static bool settle(nccl_group *g, double timeout_s, const char *what, tg_error *err) {
    struct timespec deadline = realtime_in(timeout_s);
    for (;;) {
        bool busy = false;
        char buf[TG_ERROR_LEN];
        for (int i = 0; i < g->n && g->comm[i]; i++) {
            int st = NCCL_SUCCESS, rc = nc.CommGetAsyncError(g->comm[i], &st);
            if (rc != NCCL_SUCCESS || (st != NCCL_SUCCESS && st != NCCL_IN_PROGRESS)) {
                snprintf(buf, sizeof buf, "%s failed: %s", what, nccl_error(rc != NCCL_SUCCESS ? rc : st));
                pthread_mutex_lock(&g->mu);
                abort_locked(g, buf);
                pthread_mutex_unlock(&g->mu);
                tg_seterr(err, "%s", buf);
                return false;
            }
            busy |= st == NCCL_IN_PROGRESS;
        }
        if (!busy) return true;
        if (!before(realtime_in(0), deadline)) {
            snprintf(buf, sizeof buf, "%s did not finish within %g s: a rank did not come or hung", what, timeout_s);
            pthread_mutex_lock(&g->mu);
            abort_locked(g, buf);
            pthread_mutex_unlock(&g->mu);
            tg_seterr(err, "%s", buf);
            return false;
        }
        struct timespec pause = { 0, 200 * 1000 };
        nanosleep(&pause, NULL);
    }
}

/* An NCCL call's result: success, in progress (settled), or a failure that aborts the group. */
static bool checked(nccl_group *g, int rc, const char *what, tg_error *err) {
    if (rc == NCCL_SUCCESS || rc == NCCL_IN_PROGRESS) return settle(g, g->timeout_s, what, err);
    char buf[TG_ERROR_LEN];
    snprintf(buf, sizeof buf, "%s failed: %s", what, nccl_error(rc));
    pthread_mutex_lock(&g->mu);
    abort_locked(g, buf);
    pthread_mutex_unlock(&g->mu);
    tg_seterr(err, "%s", buf);
    return false;
}

void nccl_group_free(nccl_group *g) {
    if (!g) return;
    if (g->has_thread) {
        pthread_mutex_lock(&g->mu);
        g->quit = true;
        bool stuck = g->aborting;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
        if (stuck) {   /* the watchdog is inside NCCL's abort, which may not return: leave it the group */
            pthread_detach(g->thread);
            return;
        }
        pthread_join(g->thread, NULL);
    }
    for (int i = 0; i < g->n; i++)
        if (g->comm[i]) nc.CommDestroy(g->comm[i]);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->comm);
    free(g);
}

nccl_group *nccl_group_new(const uint8_t id[DIST_ID_BYTES], int total, int first, int n, const int *ordinal,
                           bool (*set_device)(int ordinal, tg_error *err), double timeout_s, tg_error *err) {
    if (!nccl_load(err)) return NULL;
    nccl_group *g = tg_alloc(sizeof *g);
    if (g) g->comm = tg_alloc(sizeof(nccl_comm) * (size_t)(n + 1));
    if (!g || !g->comm) {
        free(g);
        tg_seterr(err, "out of memory for the NCCL communicators");
        return NULL;
    }
    g->n = n;
    g->timeout_s = timeout_s;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    nccl_id uid;
    memcpy(uid.internal, id, DIST_ID_BYTES);
    bool ok = nc.GroupStart() == NCCL_SUCCESS;
    for (int i = 0; ok && i < n; i++) {   /* one group: a process with several devices creates them together */
        nccl_config cfg = { sizeof(nccl_config), NCCL_CONFIG_MAGIC, NCCL_CONFIG_VERSION, 0, NCCL_UNDEF_INT,
                            NCCL_UNDEF_INT, NCCL_UNDEF_INT, NULL };
        ok = set_device(ordinal[i], err);
        int rc = ok ? nc.CommInitRankConfig(&g->comm[i], total, uid, first + i, &cfg) : NCCL_SUCCESS;
        if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) {
            tg_seterr(err, "ncclCommInitRankConfig (rank %d of %d) failed: %s", first + i, total, nccl_error(rc));
            ok = false;
        }
    }
    int rc = nc.GroupEnd();
    ok = ok && checked(g, rc, "creating the NCCL communicators", err);
    if (ok && pthread_create(&g->thread, NULL, watchdog, g) == 0) g->has_thread = true;
    else if (ok) tg_seterr(err, "cannot start the NCCL watchdog thread");
    if (!g->has_thread) {
        pthread_mutex_lock(&g->mu);
        abort_locked(g, "creation failed");
        pthread_mutex_unlock(&g->mu);
        nccl_group_free(g);
        return NULL;
    }
    return g;
}

bool nccl_group_reduce(nccl_group *g, void *const *streams, dist_span *const *spans, const int *n_spans,
                       tg_error *err) {
    if (!nccl_group_ok(g, err)) return false;
    int rc = nc.GroupStart();
    for (int r = 0; r < g->n && rc == NCCL_SUCCESS; r++)
        for (int k = 0; k < n_spans[r] && (rc == NCCL_SUCCESS || rc == NCCL_IN_PROGRESS); k++)
            rc = nc.AllReduce(spans[r][k].ptr, spans[r][k].ptr, spans[r][k].count, NCCL_FLOAT32, NCCL_AVG, g->comm[r],
                              streams[r]);
    int end = nc.GroupEnd();
    if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) return checked(g, rc, "ncclAllReduce", err);
    return checked(g, end, "the gradients' all-reduce", err);
}
