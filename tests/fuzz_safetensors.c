/* libFuzzer entry point for the safetensors reader (src/io/safetensors.c).
 *
 * `make fuzz-clang` builds it with clang -fsanitize=fuzzer,address,undefined (with the library
 * sources) as build-fuzz/fuzz_safetensors and runs it FUZZ_TIME seconds over the seeds in
 * tests/fixtures/fuzz_safetensors with tests/fixtures/fuzz_safetensors.dict; new inputs go to
 * build-fuzz/corpus-fuzz_safetensors, so the checked-in seeds stay as they are. `make fuzz`
 * (CI) runs it without clang: gcc, ASan + UBSan and the driver tests/fuzz_main.c.
 *
 * Properties: st_parse never crashes, hangs or reads outside the input; a rejected input comes
 * with a message and an empty st_file; an accepted one is self-consistent (nbytes = numel * 4,
 * data within the input's size) and st_encode writes it to bytes that parse back to the same
 * tensors and metadata, which re-encode to the same bytes. */
#include "io/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool same_shape(tg_shape a, tg_shape b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "fuzz_safetensors: %s failed (line %d)\n", #c, __LINE__); abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file f;
    tg_error err = { "" };
    if (!st_parse(data, size, &f, &err)) {
        REQUIRE(err.msg[0] != 0);
        REQUIRE(f.n == 0 && f.t == NULL && f.n_meta == 0 && f.meta_keys == NULL && f.meta_vals == NULL);
        return 0;
    }
    for (int i = 0; i < f.n; i++) {
        const st_tensor *t = &f.t[i];
        uint64_t numel = 1;
        REQUIRE(t->shape.ndim >= 0 && t->shape.ndim <= TG_MAX_DIMS);
        for (int d = 0; d < t->shape.ndim; d++) { REQUIRE(t->shape.d[d] >= 0); numel *= (uint64_t)t->shape.d[d]; }
        REQUIRE(t->dtype == TG_FLOAT32 || t->dtype == TG_INT32);
        REQUIRE(numel * 4 == t->nbytes && t->nbytes <= size && t->data != NULL && t->name != NULL);
        REQUIRE(st_find(&f, t->name) == t);
    }
    for (int i = 0; i < f.n_meta; i++) REQUIRE(st_meta(&f, f.meta_keys[i]) == f.meta_vals[i]);

    unsigned char *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    st_file g;
    REQUIRE(st_encode(f.t, f.n, (const char *const *)f.meta_keys, (const char *const *)f.meta_vals, f.n_meta, &b1, &n1,
                      &err));
    REQUIRE(st_parse(b1, n1, &g, &err));
    REQUIRE(g.n == f.n && g.n_meta == f.n_meta);
    for (int i = 0; i < f.n; i++) {
        const st_tensor *t = st_find(&g, f.t[i].name);
        REQUIRE(t && t->dtype == f.t[i].dtype && same_shape(t->shape, f.t[i].shape) && t->nbytes == f.t[i].nbytes);
        REQUIRE(!t->nbytes || memcmp(t->data, f.t[i].data, t->nbytes) == 0);
    }
    for (int i = 0; i < f.n_meta; i++) {
        const char *v = st_meta(&g, f.meta_keys[i]);
        REQUIRE(v && strcmp(v, f.meta_vals[i]) == 0);
    }
    /* The writer's layout is canonical: writing what it read gives the same bytes. */
    REQUIRE(st_encode(g.t, g.n, (const char *const *)g.meta_keys, (const char *const *)g.meta_vals, g.n_meta, &b2, &n2,
                      &err));
    REQUIRE(n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
    st_free(&g);
    st_free(&f);
    return 0;
}
