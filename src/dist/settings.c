/* What a data-parallel spec asks for: the local devices (tg_train_spec.devices) and the process's
 * place in a multi-process job (tg_train_spec.dist), each zero field of the latter taken from the
 * environment the way torchrun sets it (TG_RANK, else RANK, and so on). Every value is checked
 * here, so that a bad one is a tg_compile error naming the field or variable, never a rendezvous
 * that waits for a rank that cannot exist. */
#include "dist/dist.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool dist_requested(const tg_train_spec *spec) { return spec->devices || spec->n_devices || spec->dist; }

/* The value of $tg_name, else of $plain (torchrun's name), or NULL; *which names the one used. */
static const char *env_pair(const char *tg_name, const char *plain, const char **which) {
    const char *v = getenv(tg_name);
    *which = tg_name;
    if (v && v[0]) return v;
    v = plain ? getenv(plain) : NULL;
    *which = plain;
    return v && v[0] ? v : NULL;
}

/* An integer from the environment in [lo, hi]; *out unchanged when neither variable is set. */
static bool env_int(const char *tg_name, const char *plain, long lo, long hi, int *out, tg_error *err) {
    const char *which, *v = env_pair(tg_name, plain, &which);
    if (!v) return true;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v) {
        tg_seterr(err, "%s='%.40s' is not a whole number", which, v);
        return false;
    }
    if (x < lo || x > hi) {
        tg_seterr(err, "%s=%ld is out of range (%ld .. %ld)", which, x, lo, hi);
        return false;
    }
    *out = (int)x;
    return true;
}

static bool check_devices(const tg_train_spec *spec, dist_settings *s, tg_error *err) {
    if (spec->n_devices < 0 || (spec->n_devices > 0 && !spec->devices) || (spec->devices && spec->n_devices == 0)) {
        tg_seterr(err, "devices: %d given with %s list", spec->n_devices, spec->devices ? "a" : "no");
        return false;
    }
    if (spec->n_devices > DIST_MAX_LOCAL) {
        tg_seterr(err, "devices: %d given, at most %d per process", spec->n_devices, DIST_MAX_LOCAL);
        return false;
    }
    for (int i = 0; i < spec->n_devices; i++) {
        if (spec->devices[i] < 0) {
            tg_seterr(err, "devices: ordinal %d is negative", spec->devices[i]);
            return false;
        }
        for (int j = 0; j < i; j++)
            if (spec->devices[j] == spec->devices[i]) {
                tg_seterr(err, "devices: device %d is listed twice", spec->devices[i]);
                return false;
            }
        s->ordinal[i] = spec->devices[i];
    }
    s->n_local = spec->n_devices ? spec->n_devices : 1;
    if (!spec->n_devices) s->ordinal[0] = s->local_rank;   /* torchrun's convention: GPU = local rank */
    return true;
}

/* Rank, world size and local rank: from the spec when it gives a world size, else all three from
 * the environment (a job of one process when nothing is set). */
static bool ranks(const tg_dist_spec *d, dist_settings *s, tg_error *err) {
    if (d->world_size < 0) {
        tg_seterr(err, "dist: world_size %d is negative", d->world_size);
        return false;
    }
    if (d->world_size > 0) {
        s->world = d->world_size;
        s->rank = d->rank;
        s->local_rank = d->local_rank;
    } else if (!env_int("TG_WORLD_SIZE", "WORLD_SIZE", 1, 1 << 20, &s->world, err) ||
               !env_int("TG_RANK", "RANK", 0, 1 << 20, &s->rank, err) ||
               !env_int("TG_LOCAL_RANK", "LOCAL_RANK", 0, 1 << 20, &s->local_rank, err)) {
        return false;
    }
    if (s->rank < 0 || s->rank >= s->world) {
        tg_seterr(err, "dist: rank %d is outside a world of %d process%s", s->rank, s->world, s->world == 1 ? "" : "es");
        return false;
    }
    if (s->local_rank < 0) {
        tg_seterr(err, "dist: local_rank %d is negative", s->local_rank);
        return false;
    }
    return true;
}

/* Where rank 0 listens, and how long anyone waits. */
static bool rendezvous_point(const tg_dist_spec *d, dist_settings *s, tg_error *err) {
    const char *which, *addr = d->master_addr ? d->master_addr : env_pair("TG_MASTER_ADDR", "MASTER_ADDR", &which);
    if (!addr) addr = "127.0.0.1";
    if (!addr[0] || strlen(addr) >= sizeof s->addr) {
        tg_seterr(err, "dist: master address '%.60s' is empty or too long", addr);
        return false;
    }
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    s->port = DIST_DEFAULT_PORT;
    const char *port_from;
    if (d->master_port) s->port = d->master_port;
    else if (!env_int("TG_MASTER_PORT", "MASTER_PORT", 1, 65535, &s->port, err)) return false;
    /* Under torchrun (its agent sets TORCHELASTIC_RUN_ID), MASTER_PORT is the port of torchrun's
     * own store, which its agent already listens on: ours is the next one. TG_MASTER_PORT is
     * taken as given. */
    else if (env_pair("TG_MASTER_PORT", "MASTER_PORT", &port_from) && strcmp(port_from, "MASTER_PORT") == 0 &&
             getenv("TORCHELASTIC_RUN_ID") && s->port < 65535)
        s->port++;
    if (s->port < 1 || s->port > 65535) {
        tg_seterr(err, "dist: master port %d is not a TCP port (1 .. 65535)", s->port);
        return false;
    }
    s->timeout_s = DIST_DEFAULT_TIMEOUT;
    const char *t = d->timeout_s ? NULL : env_pair("TG_DIST_TIMEOUT", NULL, &which);
    double v = d->timeout_s;
    if (t) {
        char *end;
        v = strtod(t, &end);
        if (*end || end == t) v = -1;
    }
    if ((d->timeout_s || t) && !(v > 0 && isfinite(v))) {
        tg_seterr(err, "dist: timeout %s is not a positive number of seconds", t ? t : "given");
        return false;
    }
    if (d->timeout_s || t) s->timeout_s = v;
    return true;
}

bool dist_settings_resolve(const tg_train_spec *spec, dist_settings *s, tg_error *err) {
    memset(s, 0, sizeof *s);
    s->world = 1;
    s->timeout_s = DIST_DEFAULT_TIMEOUT;
    s->port = DIST_DEFAULT_PORT;
    snprintf(s->addr, sizeof s->addr, "127.0.0.1");
    if (spec->dist) {
        s->multi_process = true;
        if (!ranks(spec->dist, s, err) || !rendezvous_point(spec->dist, s, err)) return false;
    }
    return check_devices(spec, s, err);
}
