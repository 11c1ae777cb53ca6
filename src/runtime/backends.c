/* The backend registry: a backend by name. */
#include "runtime/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NULL picks $TG_BACKEND, else the compiled CPU backend. */
const tg_backend *backend_find(const char *name, tg_error *err) {
    if (!name) name = getenv("TG_BACKEND");
    if (!name || !name[0]) name = "cpu";
    if (strcmp(name, "reference") == 0) return &backend_reference;
    if (strcmp(name, "reference-f64") == 0) return &backend_reference_f64;
    if (strcmp(name, "cpu") == 0) return &backend_cpu;
    if (strcmp(name, "cuda") == 0) return &backend_cuda;
    if (strcmp(name, "cuda-nvrtc") == 0) return &backend_cuda_nvrtc;
    tg_seterr(err, "backend '%s' is not available (this build has: cpu, cuda, reference, reference-f64)", name);
    return NULL;
}

int tg_backend_available(const char *name, char *why, size_t len) {
    tg_error err = { { 0 } };
    const tg_backend *be = backend_find(name, &err);
    bool ok = be && (!be->available || be->available(&err));
    if (why && len) snprintf(why, len, "%s", ok ? "" : err.msg);
    return ok;
}
