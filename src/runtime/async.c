/* Asynchronous calls: one worker thread per training handle runs the steps and runs submitted to
 * it, in submission order; the caller holds a tg_job and waits on it. Single flight, for live
 * previews, is a job that a newer one can displace while it still waits in the queue.
 *
 * One mutex guards every queue and job: jobs are whole steps, so it is never contended for
 * long, and a waiter can outlive the handle its job ran on. What a job does (locking the
 * handle, checking that the model was not replaced meanwhile) is the runtime's job_fn. */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct tg_job {
    job_fn fn;
    void *family, *handle;
    tg_data *inputs;          /* copies: the caller may reuse its buffers once submit returns */
    int n_inputs;
    uint64_t generation;      /* the family's model generation at submit */
    int state;
    tg_result r;
    float *out;               /* a run's output, owned; r.output points here */
    async_queue *q;
    tg_job *next;
};

struct async_queue {
    pthread_t worker;
    bool started, stop;
    pthread_cond_t work;
    tg_job *head, *tail;
};

struct tg_flight {
    tg_forward *f;
    tg_job *waiting;          /* the call that a newer one displaces, while it is still queued */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t finished = PTHREAD_COND_INITIALIZER;

static tg_result status_result(tg_status st, const char *why) {
    tg_result r;
    memset(&r, 0, sizeof r);
    r.status = st;
    snprintf(r.error, sizeof r.error, "%s", why);
    return r;
}

/* Under mu. */
static void finish(tg_job *j, tg_result r, float *out) {
    j->r = r;
    j->out = out;
    if (out) j->r.output = out;
    j->state = JOB_DONE;
    pthread_cond_broadcast(&finished);
}

static void *worker(void *arg) {
    async_queue *q = arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->work, &mu);
        tg_job *j = q->head;
        if (!j) break;   /* stopped, nothing left */
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&mu);
        float *out = NULL;
        tg_result r = j->fn(j->family, j->handle, j->inputs, j->n_inputs, j->generation, &out);
        pthread_mutex_lock(&mu);
        finish(j, r, out);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

async_queue *async_new(void) {
    async_queue *q = tg_alloc(sizeof *q);
    if (q) pthread_cond_init(&q->work, NULL);
    return q;
}

static void free_inputs(tg_data *in, int n) {
    for (int i = 0; in && i < n; i++) {
        free((char *)in[i].name);
        free((void *)in[i].data);
    }
    free(in);
}

/* Deep copies of a call's inputs into *out; what is malformed (NULL array, NULL data) stays so,
 * for the call itself to report. False when memory runs out. */
static bool copy_inputs(const tg_data *in, int n, tg_data **out) {
    *out = NULL;
    if (!in || n <= 0) return true;
    tg_data *c = *out = tg_alloc(sizeof(tg_data) * (size_t)n);
    if (!c) return false;
    bool ok = true;
    for (int i = 0; i < n; i++) {
        c[i] = in[i];
        c[i].name = c[i].data = NULL;
        if (in[i].name) ok &= (c[i].name = tg_strdup(in[i].name)) != NULL;
        if (in[i].data && in[i].n <= (SIZE_MAX - 1) / 4) {   /* f32 and i32 are both 4 bytes */
            void *d = tg_alloc(in[i].n * 4 + 1);
            if (d) memcpy(d, in[i].data, in[i].n * 4);
            ok &= (c[i].data = d) != NULL;
        }
    }
    return ok;
}

tg_job *async_submit(async_queue *q, job_fn fn, void *family, void *handle, const tg_data *inputs, int n,
                     uint64_t generation) {
    tg_job *j = tg_alloc(sizeof *j);
    if (!j) return NULL;
    j->fn = fn;
    j->family = family;
    j->handle = handle;
    bool copied = copy_inputs(inputs, n, &j->inputs);   /* NULL for a NULL array: the call reports it */
    j->n_inputs = n;
    j->generation = generation;
    j->q = q;
    pthread_mutex_lock(&mu);
    if (!copied) {
        finish(j, status_result(TG_FAILED, "out of memory copying the call's inputs"), NULL);
        pthread_mutex_unlock(&mu);
        return j;
    }
    if (!q->started && !q->stop) {
        q->started = pthread_create(&q->worker, NULL, worker, q) == 0;
        if (!q->started) {
            finish(j, status_result(TG_FAILED, "could not start the worker thread"), NULL);
            pthread_mutex_unlock(&mu);
            return j;
        }
    }
    if (q->stop) {
        finish(j, status_result(TG_ABORTED, "the training handle is being destroyed"), NULL);
    } else {
        j->state = JOB_QUEUED;
        if (q->tail) q->tail->next = j;
        else q->head = j;
        q->tail = j;
        pthread_cond_signal(&q->work);
    }
    pthread_mutex_unlock(&mu);
    return j;
}

/* Under mu: take queued job j out of its queue. */
static void unqueue(tg_job *j) {
    async_queue *q = j->q;
    tg_job **p = &q->head, *prev = NULL;
    while (*p && *p != j) {
        prev = *p;
        p = &(*p)->next;
    }
    if (!*p) return;
    *p = j->next;
    if (q->tail == j) q->tail = prev;
    j->next = NULL;
}

void async_abort(async_queue *q, const void *handle, const char *why) {
    if (!q) return;
    pthread_mutex_lock(&mu);
    for (tg_job *j = q->head, *next; j; j = next) {
        next = j->next;
        if (handle && j->handle != handle) continue;
        unqueue(j);
        finish(j, status_result(TG_ABORTED, why), NULL);
    }
    pthread_mutex_unlock(&mu);
}

void async_free(async_queue *q, const char *why) {
    if (!q) return;
    async_abort(q, NULL, why);
    pthread_mutex_lock(&mu);
    q->stop = true;
    pthread_cond_signal(&q->work);
    bool started = q->started;
    pthread_mutex_unlock(&mu);
    if (started) pthread_join(q->worker, NULL);   /* its job in flight finishes (the runtime aborts it) */
    pthread_cond_destroy(&q->work);
    free(q);
}

tg_result tg_wait(tg_job *j) {
    if (!j) return status_result(TG_FAILED, "tg_wait: NULL job");
    pthread_mutex_lock(&mu);
    while (j->state != JOB_DONE) pthread_cond_wait(&finished, &mu);
    tg_result r = j->r;
    pthread_mutex_unlock(&mu);
    return r;
}

int tg_job_done(tg_job *j) {
    if (!j) return 1;
    pthread_mutex_lock(&mu);
    int done = j->state == JOB_DONE;
    pthread_mutex_unlock(&mu);
    return done;
}

void tg_job_free(tg_job *j) {
    if (!j) return;
    tg_wait(j);   /* a job is freed only once it is done */
    free_inputs(j->inputs, j->n_inputs);
    free(j->out);
    free(j);
}

/* ----- single flight ----- */

tg_flight *tg_flight_new(tg_forward *f) {
    if (!f) return NULL;
    tg_flight *fl = tg_alloc(sizeof *fl);
    if (fl) fl->f = f;
    return fl;
}

void tg_flight_free(tg_flight *fl) { free(fl); }

tg_result tg_flight_run(tg_flight *fl, const tg_data *inputs, int n_inputs, float *out, size_t out_len) {
    if (!fl) return status_result(TG_FAILED, "tg_flight_run: NULL flight");
    tg_job *j = tg_run_submit(fl->f, inputs, n_inputs);
    if (!j) return status_result(TG_FAILED, "tg_flight_run: NULL, destroyed or invalid forward handle, or out of memory");
    pthread_mutex_lock(&mu);
    if (fl->waiting && fl->waiting->state == JOB_QUEUED) {
        unqueue(fl->waiting);
        finish(fl->waiting, status_result(TG_ABORTED, "displaced by a newer call (single flight)"), NULL);
    }
    if (j->state == JOB_QUEUED) fl->waiting = j;
    pthread_mutex_unlock(&mu);
    tg_result r = tg_wait(j);
    pthread_mutex_lock(&mu);
    if (fl->waiting == j) fl->waiting = NULL;
    pthread_mutex_unlock(&mu);
    if (r.status == TG_OK) {
        if (!out || out_len < r.output_len) {
            r = status_result(TG_FAILED, "");
            snprintf(r.error, sizeof r.error, "tg_flight_run: the output has %zu elements, out holds %zu%s", j->r.output_len,
                     out_len, out ? "" : " (NULL)");
        } else {
            memcpy(out, r.output, sizeof(float) * r.output_len);
            r.output = out;
        }
    }
    tg_job_free(j);
    return r;
}

/* ----- async calls -----
 * A job runs under the family lock on the worker thread; one whose model generation moved on
 * before or while it ran resolves TG_ABORTED. */

static tg_result job_end(tg_train *t, uint64_t generation, tg_result r) {
    if (generation != atomic_load(&t->generation)) return rt_aborted("the model was replaced or the handle destroyed");
    return r;
}

static tg_result step_job(void *family, void *handle, const tg_data *in, int n, uint64_t generation, float **out) {
    tg_train *t = family;
    pthread_mutex_lock(&t->mu);
    tg_result r = generation == atomic_load(&t->generation) ? rt_step_locked(t, in, n) : rt_aborted("the model was replaced");
    r = job_end(t, generation, r);
    pthread_mutex_unlock(&t->mu);
    return r;
}

static tg_result run_job(void *family, void *handle, const tg_data *in, int n, uint64_t generation, float **out) {
    tg_train *t = family;
    pthread_mutex_lock(&t->mu);
    tg_result r;
    if (!rt_registry_has(handle)) r = rt_aborted("the forward handle was detached or destroyed");
    else r = job_end(t, generation, rt_run_locked(handle, in, n, false));
    if (r.status == TG_OK) {   /* the job's own copy: the handle's buffer belongs to its next call */
        *out = tg_alloc(sizeof(float) * (r.output_len + 1));
        if (*out) memcpy(*out, r.output, sizeof(float) * r.output_len);
        r = *out ? r : rt_failed("out of memory copying the output");
        r.output = *out;
    }
    pthread_mutex_unlock(&t->mu);
    return r;
}

/* Submitting takes no handle lock, so that it returns at once while a call runs. */
tg_job *tg_step_submit(tg_train *t, const tg_data *inputs, int n_inputs) {
    if (!rt_registry_has(t)) return NULL;
    return async_submit(t->queue, step_job, t, t, inputs, n_inputs, atomic_load(&t->generation));
}

tg_job *tg_run_submit(tg_forward *f, const tg_data *inputs, int n_inputs) {
    if (!rt_registry_has(f)) return NULL;
    tg_train *t = f->train;
    return async_submit(t->queue, run_job, t, f, inputs, n_inputs, atomic_load(&t->generation));
}

/* Everything of t once no call can reach it any more. */
