/* The communicator of a data-parallel process: it averages values over every replica of the job
 * and remembers when that became impossible.
 *
 * Two transports, one contract (the mean over all world * n_local replicas):
 *  - device backends (CUDA): NCCL all-reduces the buffers each local replica registered
 *    (dist_comm_set_spans) on the replicas' streams, inside the backend's step (dp_reduce);
 *  - host backends (cpu, reference): the runtime adds its local replicas' values on the host and
 *    the processes sum those over TCP through rank 0 (net_sum).
 * A job of one replica needs neither and averages nothing, through the same calls: that is the
 * path every machine, CI included, runs. */
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_comm {
    dist_settings s;
    int total;                       /* replicas in the job */
    bool device;
    dist_net net;
    bool has_net;
    nccl_group *nccl;
    dist_span *spans[DIST_MAX_LOCAL];
    int n_spans[DIST_MAX_LOCAL];
    char broken[TG_ERROR_LEN];       /* empty while usable */
    const tg_backend *be;
};

int dist_comm_total(const dist_comm *c) { return c->total; }
const char *dist_comm_broken(const dist_comm *c) { return c->broken[0] ? c->broken : NULL; }

static void set_broken(dist_comm *c, const char *why) {
    if (!c->broken[0]) snprintf(c->broken, sizeof c->broken, "%s", why);
}

void dist_comm_free(dist_comm *c) {
    if (!c) return;
    nccl_group_free(c->nccl);
    if (c->has_net) net_close(&c->net);
    for (int r = 0; r < DIST_MAX_LOCAL; r++) free(c->spans[r]);
    free(c);
}

dist_comm *dist_comm_new(const dist_settings *s, const tg_backend *be, bool device, uint64_t fingerprint,
                         tg_error *err) {
    dist_comm *c = tg_alloc(sizeof *c);
    if (!c) {
        tg_seterr(err, "out of memory for the communicator");
        return NULL;
    }
    c->s = *s;
    c->be = be;
    c->device = device;
    c->total = s->world * s->n_local;
    bool nccl = device && c->total > 1;
    uint8_t id[DIST_ID_BYTES] = { 0 };
    bool ok = true;
    if (nccl && !be->set_device) {
        tg_seterr(err, "backend '%s' cannot choose a device for NCCL", be->name);
        ok = false;
    }
    if (ok && nccl) {   /* fail before meeting the others */
        tg_error e;
        ok = s->rank == 0 ? nccl_unique_id(id, &e) : nccl_load(&e);
        if (!ok) tg_seterr(err, "data-parallel training on several GPUs needs NCCL: %s", e.msg);
    }
    if (ok && s->world > 1) ok = c->has_net = net_rendezvous(&c->net, s, fingerprint, id, err);
    if (ok && nccl) {
        c->nccl = nccl_group_new(id, c->total, s->rank * s->n_local, s->n_local, s->ordinal, be->set_device, s->timeout_s,
                                 err);
        ok = c->nccl != NULL;
        if (c->has_net) net_close(&c->net);   /* NCCL carries everything from here on */
        c->has_net = false;
    }
    if (!ok) {
        dist_comm_free(c);
        return NULL;
    }
    return c;
}

bool dist_comm_mean(dist_comm *c, double *v, size_t count, bool ok, tg_error *err) {
    if (c->broken[0]) {
        tg_seterr(err, "%s", c->broken);
        return false;
    }
    if (!ok && c->s.world == 1) return false;   /* the caller's own error stands */
    if (c->s.world > 1) {
        bool broken = false;
        if (!net_sum(&c->net, v, count, ok, &broken, err)) {
            if (broken) set_broken(c, err->msg);
            return false;
        }
    }
    for (size_t i = 0; i < count; i++) v[i] /= c->total;
    return true;
}

/* Exactly adjacent runs become one (a flat gradient buffer would be one all-reduce); a buffer
 * listed twice is averaged once. */
static int merge_spans(dist_span *s, int n) {
    for (int i = 1; i < n; i++)   /* insertion sort by address: a few hundred at most */
        for (int j = i; j > 0 && (char *)s[j].ptr < (char *)s[j - 1].ptr; j--) {
            dist_span t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k > 0 && s[i].ptr == s[k - 1].ptr) {
            if (s[i].count > s[k - 1].count) s[k - 1].count = s[i].count;
        } else if (k > 0 && (char *)s[i].ptr == (char *)s[k - 1].ptr + s[k - 1].count * sizeof(float)) {
            s[k - 1].count += s[i].count;
        } else {
            s[k++] = s[i];
        }
    }
    return k;
}

bool dist_comm_set_spans(dist_comm *c, int replica, const dist_span *spans, int n, tg_error *err) {
    dist_span *copy = tg_alloc(sizeof(dist_span) * (size_t)(n + 1));
    if (!copy) {
        tg_seterr(err, "out of memory for the all-reduce list");
        return false;
    }
    memcpy(copy, spans, sizeof(dist_span) * (size_t)n);
    free(c->spans[replica]);
    c->spans[replica] = copy;
    c->n_spans[replica] = merge_spans(copy, n);
    return true;
}

/* ----- the reduction a device backend's dp_step runs ----- */

static bool reduce_enqueue(void *ctx, void *const *streams, int n, tg_error *err) {
    dist_comm *c = ctx;
    if (c->broken[0]) {
        tg_seterr(err, "%s", c->broken);
        return false;
    }
    if (!c->nccl) return true;   /* one replica in the job: its values are the mean */
    if (nccl_group_reduce(c->nccl, streams, c->spans, c->n_spans, err)) return true;
    set_broken(c, err->msg);
    return false;
}

static void reduce_watch(void *ctx, bool on) {
    dist_comm *c = ctx;
    if (c->nccl) nccl_group_watch(c->nccl, on);
}

static bool reduce_ok(void *ctx, tg_error *err) {
    dist_comm *c = ctx;
    if (!c->nccl || nccl_group_ok(c->nccl, err)) return true;
    set_broken(c, err->msg);
    return false;
}

dp_reduce dist_comm_reduce(dist_comm *c) {
    /* NCCL's advice: capture collectives in CUDA graphs only when a process drives one GPU (one
     * thread launching several devices' graphs can deadlock). TG_NCCL_GRAPH=0 keeps them out. */
    const char *g = getenv("TG_NCCL_GRAPH");
    bool in_graph = c->s.n_local == 1 && !(g && g[0] == '0');
    return (dp_reduce){ .ctx = c, .enqueue = reduce_enqueue, .in_graph = in_graph, .watch = reduce_watch, .ok = reduce_ok };
}

int tg_distributed_available(const char *name, char *why, size_t len) {
    tg_error err = { { 0 } }, e;
    const tg_backend *be = backend_find(name, &err);
    bool ok = be != NULL;
    if (ok && be->dp_step && !nccl_load(&e)) {   /* device replicas average through NCCL */
        tg_seterr(&err, "data-parallel training on '%s' needs NCCL: %s", be->name, e.msg);
        ok = false;
    }
    if (ok && be->available && !be->available(&err)) ok = false;
    if (why && len) snprintf(why, len, "%s", ok ? "" : err.msg);
    return ok;
}
