/* What every handle-taking call shares: results that carry a status and a message, the registry
 * of live handles (a destroyed handle is refused, not read), and the one lock per family (a
 * training handle and the forwards attached to it). */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static tg_result result_of(tg_status st, const char *fmt, va_list ap) {
    tg_result r;
    memset(&r, 0, sizeof r);
    r.status = st;
    vsnprintf(r.error, sizeof r.error, fmt, ap);
    return r;
}

tg_result rt_failed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tg_result r = result_of(TG_FAILED, fmt, ap);
    va_end(ap);
    return r;
}

tg_result rt_aborted(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tg_result r = result_of(TG_ABORTED, fmt, ap);
    va_end(ap);
    return r;
}

/* ----- live handles -----
 * Every handle handed out is registered until it is destroyed, so that a call with a destroyed
 * (or never valid) handle is refused rather than reading freed memory. */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static const void **live;
static int n_live, cap_live;

bool rt_registry_add(const void *h) {
    pthread_mutex_lock(&registry_mu);
    if (n_live == cap_live) {
        const void **grown = tg_realloc(live, sizeof(void *) * (size_t)(cap_live ? 2 * cap_live : 16));
        if (grown) {
            live = grown;
            cap_live = cap_live ? 2 * cap_live : 16;
        }
    }
    bool ok = n_live < cap_live;
    if (ok) live[n_live++] = h;
    pthread_mutex_unlock(&registry_mu);
    return ok;
}

void rt_registry_remove(const void *h) {
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < n_live; i++)
        if (live[i] == h) live[i] = live[--n_live];
    pthread_mutex_unlock(&registry_mu);
}

bool rt_registry_has(const void *h) {
    if (!h) return false;
    pthread_mutex_lock(&registry_mu);
    bool found = false;
    for (int i = 0; i < n_live && !found; i++) found = live[i] == h;
    pthread_mutex_unlock(&registry_mu);
    return found;
}

/* A live handle's family, locked; NULL when the handle is NULL or not live. */
tg_train *rt_lock_train(const tg_train *t) {
    if (!rt_registry_has(t)) return NULL;
    pthread_mutex_lock(&((tg_train *)t)->mu);
    return (tg_train *)t;
}

tg_train *rt_lock_forward(const tg_forward *f) {
    if (!rt_registry_has(f)) return NULL;
    pthread_mutex_lock(&f->train->mu);
    return f->train;
}

void rt_unlock(tg_train *t) { pthread_mutex_unlock(&t->mu); }

/* Why a handle was refused, for messages: "NULL training handle", "destroyed or invalid ...". */
const char *rt_dead(const void *h) { return h ? "destroyed or invalid" : "NULL"; }
