/* safetensors files (src/io/safetensors.c): byte-exact agreement with the reference writer's layout (the
 * test vectors of huggingface/safetensors' own tests, and a buffer laid out by hand as that
 * writer does), round trips through files with bitwise-equal values, names that need escaping,
 * and hostile input: every truncation, thousands of random byte flips, and a catalogue of
 * malformed headers, each of which must fail with a message (run under ASan + UBSan too).
 *
 * If tests/fixtures/python_reference.safetensors exists (tests/fixtures/make_python_fixture.py
 * writes it with the Python safetensors package), it is read, checked, and compared byte for
 * byte with what st_encode writes for the same tensors. */
#include "io/safetensors.h"
#include "check.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static tg_error err;
static char tmpdir[64];

static const char *tmp_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(b, 1, n, f); fclose(f); }
}

static bool shape_eq(tg_shape a, tg_shape b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

/* Every tensor of want (n of them) is in f with the same dtype, shape and bytes. */
static void check_same(const st_file *f, const st_tensor *want, int n, const char *what) {
    CHECK(f->n == n, "%s: %d tensors, want %d", what, f->n, n);
    for (int i = 0; i < n; i++) {
        const st_tensor *g = st_find(f, want[i].name);
        CHECK(g != NULL, "%s: tensor '%s' missing", what, want[i].name);
        if (!g) continue;
        CHECK(g->dtype == want[i].dtype, "%s: '%s' dtype", what, want[i].name);
        CHECK(shape_eq(g->shape, want[i].shape), "%s: '%s' shape", what, want[i].name);
        CHECK(g->nbytes == want[i].nbytes, "%s: '%s' nbytes %zu vs %zu", what, want[i].name, g->nbytes, want[i].nbytes);
        CHECK(g->data != NULL, "%s: '%s' has no data pointer", what, want[i].name);
        if (g->data && g->nbytes == want[i].nbytes && want[i].nbytes)
            CHECK(memcmp(g->data, want[i].data, g->nbytes) == 0, "%s: '%s' values differ", what, want[i].name);
    }
}

/* A file: the 8-byte length hlen, hn header bytes, then dn data bytes (a pattern). */
typedef struct { unsigned char *b; size_t n; } blob;
static blob raw(uint64_t hlen, const char *h, size_t hn, size_t dn) {
    blob x = { malloc(8 + hn + dn + 1), 8 + hn + dn };
    for (int i = 0; i < 8; i++) x.b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(x.b + 8, h, hn);
    for (size_t i = 0; i < dn; i++) x.b[8 + hn + i] = (unsigned char)(i * 37 + 11);
    return x;
}
static blob mk(const char *h, size_t dn) { return raw(strlen(h), h, strlen(h), dn); }

static bool parses(blob x, st_file *f) {
    err.msg[0] = 0;
    bool ok = st_parse(x.b, x.n, f, &err);
    return ok;
}

/* Parsing must fail, with a message containing needle, and leave *out empty. Frees x. */
static void expect_fail(blob x, const char *needle, const char *label) {
    st_file f;
    memset(&f, 0x5A, sizeof f);
    err.msg[0] = 0;
    bool ok = st_parse(x.b, x.n, &f, &err);
    CHECK(!ok, "%s: parsed but should fail", label);
    if (ok) st_free(&f);
    else CHECK(f.n == 0 && f.t == NULL && f.n_meta == 0 && f.meta_keys == NULL && f.meta_vals == NULL,
               "%s: out not cleared", label);
    CHECK(err.msg[0] && (!needle || strstr(err.msg, needle)), "%s: message \"%s\" lacks \"%s\"", label, err.msg,
          needle ? needle : "");
    free(x.b);
}

/* ---------------------------------------------------------------------------------------------
 * The reference implementation's own test vectors (huggingface/safetensors, tensor.rs tests:
 * test_empty, test_serialization, test_serialization_forced_alignement).
 * ------------------------------------------------------------------------------------------- */
static const unsigned char REF_EMPTY[] = { 8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32 };
static const unsigned char REF_EMPTY_META[] = {
    40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95, 95, 34, 58, 123, 34, 102, 114,
    97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112, 116, 34, 125, 125, 32, 32, 32, 32, 32,
};
static const unsigned char REF_ATTN_0[] = {
    64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100, 116, 121, 112, 101, 34, 58, 34,
    70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95,
    111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0,
    64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64,
};
static const unsigned char REF_ATTN0_ALIGNED[] = {
    72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116, 121, 112, 101, 34, 58, 34, 70,
    51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97,
    95, 111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 32, 32, 32, 32, 32, 32, 32, 0, 0,
    0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64,
};

static void check_encodes_to(const st_tensor *t, int n, const char *const *k, const char *const *v, int nm,
                             const unsigned char *want, size_t want_n, const char *what) {
    unsigned char *b = NULL;
    size_t len = 0;
    err.msg[0] = 0;
    bool ok = st_encode(t, n, k, v, nm, &b, &len, &err);
    CHECK(ok, "%s: encode: %s", what, err.msg);
    CHECK(ok && len == want_n && memcmp(b, want, len) == 0, "%s: %zu bytes, not the reference's %zu (header \"%.*s\")",
          what, len, want_n, ok && len > 8 ? (int)(b[0] | b[1] << 8) : 0, ok && len > 8 ? (const char *)b + 8 : "");
    free(b);
    st_file f;
    ok = st_parse(want, want_n, &f, &err);
    CHECK(ok, "%s: parsing the reference bytes: %s", what, err.msg);
    if (ok) check_same(&f, t, n, what);
    if (ok && nm) CHECK(f.n_meta == nm && st_meta(&f, k[0]) && !strcmp(st_meta(&f, k[0]), v[0]), "%s: metadata", what);
    if (ok) st_free(&f);
}

static void test_reference_vectors(void) {
    check_encodes_to(NULL, 0, NULL, NULL, 0, REF_EMPTY, sizeof REF_EMPTY, "empty");
    const char *k[] = { "framework" }, *v[] = { "pt" };
    check_encodes_to(NULL, 0, k, v, 1, REF_EMPTY_META, sizeof REF_EMPTY_META, "empty with metadata");
    float x[6] = { 0, 1, 2, 3, 4, 5 };
    st_tensor a = { "attn.0", TG_FLOAT32, TG_SHAPE(1, 2, 3), x, sizeof x };
    check_encodes_to(&a, 1, NULL, NULL, 0, REF_ATTN_0, sizeof REF_ATTN_0, "attn.0");
    st_tensor b = { "attn0", TG_FLOAT32, TG_SHAPE(1, 1, 2, 3), x, sizeof x };
    check_encodes_to(&b, 1, NULL, NULL, 0, REF_ATTN0_ALIGNED, sizeof REF_ATTN0_ALIGNED, "attn0 (padded)");
    /* The writer pads so that the data starts at a multiple of 8. */
    CHECK((8 + REF_ATTN0_ALIGNED[0]) % 8 == 0, "alignment");
}

/* ---------------------------------------------------------------------------------------------
 * A file laid out by hand exactly as the reference writer (Python save_file) lays it out:
 * "__metadata__" first, then the tensors in data order: descending dtype (F32 before I32), then
 * by name; compact JSON; header padded with spaces to a multiple of 8; data little-endian.
 * ------------------------------------------------------------------------------------------- */
static void test_hand_built(void) {
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
                       "\"ids\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[24,36]}}";
    size_t jn = strlen(json), hn = (jn + 7) / 8 * 8;
    unsigned char file[512] = { 0 };
    size_t len = 8 + hn + 36;
    file[0] = (unsigned char)hn;   /* < 256 */
    memcpy(file + 8, json, jn);
    memset(file + 8 + jn, ' ', hn - jn);
    /* little-endian f32 bits: bias {0.5, -2}, weight {1, 2, 3, 4}; i32 ids {7, -1, 65536} */
    static const unsigned char data[36] = {
        0, 0, 0, 0x3F, 0, 0, 0, 0xC0,
        0, 0, 0x80, 0x3F, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40,
        7, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 1, 0,
    };
    memcpy(file + 8 + hn, data, sizeof data);

    st_file f;
    bool ok = st_parse(file, len, &f, &err);
    CHECK(ok, "hand-built: %s", err.msg);
    if (!ok) return;
    CHECK(f.n == 3 && !strcmp(f.t[0].name, "bias") && !strcmp(f.t[1].name, "weight") && !strcmp(f.t[2].name, "ids"),
          "hand-built: tensors in header order");
    const st_tensor *b = st_find(&f, "bias"), *w = st_find(&f, "weight"), *id = st_find(&f, "ids");
    CHECK(b && b->dtype == TG_FLOAT32 && shape_eq(b->shape, TG_SHAPE(2)) && ((float *)b->data)[0] == 0.5f &&
          ((float *)b->data)[1] == -2.0f, "hand-built: bias");
    CHECK(w && shape_eq(w->shape, TG_SHAPE(2, 2)) && ((float *)w->data)[0] == 1 && ((float *)w->data)[3] == 4,
          "hand-built: weight");
    CHECK(id && id->dtype == TG_INT32 && ((int32_t *)id->data)[0] == 7 && ((int32_t *)id->data)[1] == -1 &&
          ((int32_t *)id->data)[2] == 65536, "hand-built: ids");
    CHECK(f.n_meta == 1 && st_meta(&f, "format") && !strcmp(st_meta(&f, "format"), "pt"), "hand-built: metadata");
    CHECK(st_meta(&f, "missing") == NULL && st_find(&f, "missing") == NULL, "hand-built: absent names");

    /* Our writer, given the same tensors in another order, writes exactly these bytes. */
    st_tensor in[3] = { *id, *w, *b };
    const char *k[] = { "format" }, *v[] = { "pt" };
    check_encodes_to(in, 3, k, v, 1, file, len, "hand-built");
    st_free(&f);

    /* The same content pretty-printed (as json.dumps(indent=2) would), members in another order,
     * escapes in names, header length not a multiple of 8 (so the data is unaligned). */
    const char *pretty = "{\n  \"w\\u00e9ight\": {\n    \"data_offsets\": [8, 24],\n\t\"shape\": [ 2 , 2 ],\r\n"
                         "    \"dtype\": \"F32\"\n  },\n  \"ids\\/\\ud83d\\ude00\": {\"dtype\": \"I32\", \"shape\": [3], "
                         "\"data_offsets\": [24, 36]},\n  \"__metadata__\": {\"a\\\"b\": \"\\\\\\n\"},\n"
                         "  \"bias\": {\"shape\": [2], \"dtype\": \"F32\", \"data_offsets\": [0, 8]}\n}\n\t \r";
    size_t pn = strlen(pretty);
    blob x = raw(pn, pretty, pn, 0);
    x.b = realloc(x.b, x.n + 36);
    memcpy(x.b + x.n, data, 36);
    x.n += 36;
    ok = parses(x, &f);
    CHECK(ok, "pretty: %s", err.msg);
    if (ok) {
        const st_tensor *w2 = st_find(&f, "w\xc3\xa9ight"), *id2 = st_find(&f, "ids/\xf0\x9f\x98\x80");
        CHECK(w2 && ((float *)w2->data)[2] == 3 && shape_eq(w2->shape, TG_SHAPE(2, 2)), "pretty: \\u00e9 name and data");
        CHECK(id2 && ((int32_t *)id2->data)[2] == 65536, "pretty: surrogate-pair name and data");
        CHECK(st_meta(&f, "a\"b") && !strcmp(st_meta(&f, "a\"b"), "\\\n"), "pretty: escaped metadata");
        st_free(&f);
    }
    free(x.b);

    /* Metadata may be empty or null; zero-size tensors may share an offset. */
    const char *z = "{\"__metadata__\":{},\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                    "\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
                    "\"e2\":{\"dtype\":\"I32\",\"shape\":[3,0,2],\"data_offsets\":[4,4]}}";
    x = mk(z, 4);
    ok = parses(x, &f);
    CHECK(ok && f.n == 3 && f.n_meta == 0, "empty metadata, zero-size tensors: %s", err.msg);
    if (ok) {
        const st_tensor *s = st_find(&f, "s"), *e2 = st_find(&f, "e2");
        CHECK(s && s->shape.ndim == 0 && s->nbytes == 4, "scalar");
        CHECK(e2 && e2->nbytes == 0 && e2->data != NULL && shape_eq(e2->shape, TG_SHAPE(3, 0, 2)), "zero-size");
        st_free(&f);
    }
    free(x.b);
    x = mk("{\"__metadata__\":null}", 0);
    CHECK(parses(x, &f) && f.n == 0 && f.n_meta == 0, "null metadata: %s", err.msg);
    st_free(&f);
    st_free(&f);   /* harmless twice */
    free(x.b);
}

/* ---------------------------------------------------------------------------------------------
 * Round trips through files
 * ------------------------------------------------------------------------------------------- */
static void test_roundtrip(void) {
    float a[6] = { 1.5f, -0.0f, 3.25e-39f, 1e30f, -7.0f, 0.1f };
    int32_t ids[5] = { 0, -1, INT32_MAX, INT32_MIN, 42 };
    float sc = 2.5f, r6[12];
    uint32_t big[1000];
    for (int i = 0; i < 12; i++) r6[i] = (float)i / 3;
    for (int i = 0; i < 1000; i++) big[i] = (uint32_t)check_next();   /* any bits: NaN payloads, infinities */
    big[0] = 0x7FC00001u;
    big[1] = 0xFF800000u;
    big[2] = 0x00000001u;
    st_tensor t[] = {
        { "layers.0.W", TG_FLOAT32, TG_SHAPE(2, 3), a, sizeof a },
        { "ids", TG_INT32, TG_SHAPE(5), ids, sizeof ids },
        { "scale", TG_FLOAT32, TG_SHAPE0, &sc, sizeof sc },
        { "empty", TG_FLOAT32, TG_SHAPE(0, 4), NULL, 0 },
        { "empty_i", TG_INT32, TG_SHAPE(3, 0), NULL, 0 },
        { "rank6", TG_FLOAT32, TG_SHAPE(1, 2, 1, 3, 1, 2), r6, sizeof r6 },
        { "big", TG_FLOAT32, TG_SHAPE(10, 100), big, sizeof big },
        { "big_i", TG_INT32, TG_SHAPE(1000), big, sizeof big },
    };
    int n = (int)(sizeof t / sizeof t[0]);
    const char *k[] = { "step", "format", "note" }, *v[] = { "1200", "pt", "trained with tensorgrad" };
    const char *path = tmp_path("model.safetensors");
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    err.msg[0] = 0;
    CHECK(st_write(path, t, n, k, v, 3, &err), "st_write: %s", err.msg);
    CHECK(!file_exists(tmp), "the temporary file is gone after the rename");
    st_file f;
    bool ok = st_read(path, &f, &err);
    CHECK(ok, "st_read: %s", err.msg);
    if (ok) {
        check_same(&f, t, n, "file round trip");
        CHECK(f.n_meta == 3, "3 metadata entries");
        for (int i = 0; i < 3; i++) CHECK(st_meta(&f, k[i]) && !strcmp(st_meta(&f, k[i]), v[i]), "metadata %s", k[i]);
        /* Data order: F32 by name, then I32 by name; metadata sorted by key. */
        static const char *const order[] = { "big", "empty", "layers.0.W", "rank6", "scale", "big_i", "empty_i", "ids" };
        for (int i = 0; i < n && i < f.n; i++)
            CHECK(!strcmp(f.t[i].name, order[i]), "order %d: %s, want %s", i, f.t[i].name, order[i]);
        CHECK(f.n_meta == 3 && !strcmp(f.meta_keys[0], "format") && !strcmp(f.meta_keys[1], "note") &&
              !strcmp(f.meta_keys[2], "step"), "metadata keys sorted");
        st_free(&f);
    }
    /* The file is exactly what st_encode produces, and its data starts 8-byte aligned. */
    size_t flen = 0, elen = 0;
    unsigned char *fb = slurp(path, &flen), *eb = NULL;
    CHECK(st_encode(t, n, k, v, 3, &eb, &elen, &err), "st_encode: %s", err.msg);
    CHECK(fb && eb && flen == elen && memcmp(fb, eb, flen) == 0, "file bytes == st_encode bytes");
    CHECK(fb && flen >= 8 && fb[0] % 8 == 0, "header length a multiple of 8");
    free(fb);
    free(eb);

    /* Overwriting replaces the file; a failing write leaves it alone. */
    float a2[6] = { 9, 8, 7, 6, 5, 4 };
    st_tensor one = { "only", TG_FLOAT32, TG_SHAPE(6), a2, sizeof a2 };
    CHECK(st_write(path, &one, 1, NULL, NULL, 0, &err), "overwrite: %s", err.msg);
    st_tensor dup[2] = { one, one };
    CHECK(!st_write(path, dup, 2, NULL, NULL, 0, &err) && strstr(err.msg, "duplicate"), "failing write: %s", err.msg);
    ok = st_read(path, &f, &err);
    CHECK(ok && f.n == 1 && f.n_meta == 0, "after overwrite: %s", err.msg);
    if (ok) { check_same(&f, &one, 1, "overwrite"); st_free(&f); }
    CHECK(!file_exists(tmp), "no temporary file left");

    /* Empty file with no metadata. */
    CHECK(st_write(path, NULL, 0, NULL, NULL, 0, &err), "empty write: %s", err.msg);
    ok = st_read(path, &f, &err);
    CHECK(ok && f.n == 0 && f.n_meta == 0 && f.t == NULL, "empty read: %s", err.msg);
    st_free(&f);
    remove(path);
}

/* Names and metadata that need escaping survive; the escaping is serde_json's. */
static void test_names(void) {
    static const char *const names[] = {
        "a\"b", "back\\slash", "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", "tab\there\nnl\r", "\001ctl\x1f\x7f",
        "slash/ok", "", "__metadata__x", "sp ace", "\b\f",
    };
    enum { N = sizeof names / sizeof names[0] };
    float vals[N];
    st_tensor t[N];
    for (int i = 0; i < N; i++) {
        vals[i] = (float)i;
        t[i] = (st_tensor){ (char *)names[i], i % 2 ? TG_INT32 : TG_FLOAT32, TG_SHAPE(1), &vals[i], 4 };
    }
    const char *k[] = { "k\"\\\n\xe2\x82\xac", "" }, *v[] = { "\xf0\x9f\x98\x80 \"v\"\t", "" };
    unsigned char *b = NULL;
    size_t len = 0;
    bool ok = st_encode(t, N, k, v, 2, &b, &len, &err);
    CHECK(ok, "encode names: %s", err.msg);
    if (!ok) return;
    const char *h = (const char *)b + 8;
    size_t hn = (size_t)b[0] | (size_t)b[1] << 8;
    char *hs = malloc(hn + 1);
    memcpy(hs, h, hn);
    hs[hn] = 0;
    static const char *const escaped[] = {
        "\"a\\\"b\":", "\"back\\\\slash\":", "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\":", "\"tab\\there\\nnl\\r\":",
        "\"\\u0001ctl\\u001f\x7f\":", "\"slash/ok\":", "\"\":{", "\"\\b\\f\":", "\"k\\\"\\\\\\n\xe2\x82\xac\":",
    };
    for (size_t i = 0; i < sizeof escaped / sizeof escaped[0]; i++)
        CHECK(strstr(hs, escaped[i]) != NULL, "header lacks %s: %s", escaped[i], hs);
    CHECK(strncmp(hs, "{\"__metadata__\":{\"\":\"\",", 23) == 0, "metadata first, keys sorted: %s", hs);
    free(hs);
    st_file f;
    ok = st_parse(b, len, &f, &err);
    CHECK(ok, "parse names: %s", err.msg);
    if (ok) {
        check_same(&f, t, N, "names");
        CHECK(st_meta(&f, k[0]) && !strcmp(st_meta(&f, k[0]), v[0]), "escaped metadata");
        CHECK(st_meta(&f, "") && !strcmp(st_meta(&f, ""), ""), "empty metadata key");
        st_free(&f);
    }
    free(b);
}

static void test_writer_errors(void) {
    float x[4] = { 0 };
    unsigned char *b = (unsigned char *)"sentinel";
    size_t len = 99;
    struct { st_tensor t; const char *needle; } bad[] = {
        { { "__metadata__", TG_FLOAT32, TG_SHAPE(4), x, 16 }, "__metadata__" },
        { { "w", TG_FLOAT32, TG_SHAPE(3), x, 16 }, "nbytes" },
        { { "w", TG_FLOAT32, { 7, { 1, 1, 1, 1, 1, 1 } }, x, 4 }, "rank" },
        { { "w", TG_FLOAT32, TG_SHAPE(-4), x, 16 }, "negative" },
        { { "w", TG_FLOAT32, TG_SHAPE(4), NULL, 16 }, "no data" },
        { { "\xff" "bad", TG_FLOAT32, TG_SHAPE(4), x, 16 }, "UTF-8" },
        { { "\xc0\xaf", TG_FLOAT32, TG_SHAPE(4), x, 16 }, "UTF-8" },
        { { "w", (tg_dtype)7, TG_SHAPE(4), x, 16 }, "dtype" },
        { { NULL, TG_FLOAT32, TG_SHAPE(4), x, 16 }, "no name" },
        { { "w", TG_FLOAT32, TG_SHAPE(INT64_MAX, INT64_MAX), x, 16 }, "overflow" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        bool ok = st_encode(&bad[i].t, 1, NULL, NULL, 0, &b, &len, &err);
        CHECK(!ok && strstr(err.msg, bad[i].needle) && b == NULL && len == 0, "bad tensor %zu: %s", i, err.msg);
        if (ok) free(b);
    }
    st_tensor two[2] = { { "w", TG_FLOAT32, TG_SHAPE(4), x, 16 }, { "w", TG_INT32, TG_SHAPE(4), x, 16 } };
    CHECK(!st_encode(two, 2, NULL, NULL, 0, &b, &len, &err) && strstr(err.msg, "duplicate tensor name"),
          "duplicate names of different dtypes: %s", err.msg);
    const char *k2[] = { "a", "a" }, *v2[] = { "1", "2" }, *kn[] = { NULL }, *vb[] = { "\xed\xa0\x80" };
    CHECK(!st_encode(two, 1, k2, v2, 2, &b, &len, &err) && strstr(err.msg, "duplicate metadata key"), "dup keys: %s", err.msg);
    CHECK(!st_encode(two, 1, kn, v2, 1, &b, &len, &err) && strstr(err.msg, "no key"), "NULL key: %s", err.msg);
    CHECK(!st_encode(two, 1, k2, vb, 1, &b, &len, &err) && strstr(err.msg, "UTF-8"), "surrogate in value: %s", err.msg);
    CHECK(!st_encode(two, -1, NULL, NULL, 0, &b, &len, &err), "negative count");

    const char *p = tmp_path("no/such/dir/m.safetensors");
    CHECK(!st_write(p, two, 1, NULL, NULL, 0, &err) && strstr(err.msg, "cannot create"), "unwritable: %s", err.msg);
    CHECK(!file_exists(p), "nothing written");
    p = tmp_path("bad.safetensors");
    CHECK(!st_write(p, &bad[1].t, 1, NULL, NULL, 0, &err) && strstr(err.msg, p), "message names the path: %s", err.msg);
    CHECK(!file_exists(p), "an invalid write creates nothing");
}

static void test_dtypes(void) {
    static const struct { const char *h; const char *needle; } cases[] = {
        { "{\"half\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", "tensor 'half': dtype F16 is not supported" },
        { "{\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", "tensor 'bf': dtype BF16" },
        { "{\"d\":{\"shape\":[1],\"data_offsets\":[0,8],\"dtype\":\"F64\"}}", "tensor 'd': dtype F64" },
        { "{\"l\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", "tensor 'l': dtype I64" },
        { "{\"u\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", "tensor 'u': dtype U8" },
        { "{\"q\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", "tensor 'q': unknown dtype \"F33\"" },
        { "{\"q\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "unknown dtype" },
        { "{\"q\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", "expected a string" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char label[32];
        snprintf(label, sizeof label, "dtype case %zu", i);
        const char *h = cases[i].h;
        size_t dn = strstr(h, "[0,8]") ? 8 : 4;
        expect_fail(mk(h, dn), cases[i].needle, label);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Hostile input
 * ------------------------------------------------------------------------------------------- */
static blob valid_file(void) {
    static float a[6] = { 1, 2, 3, 4, 5, 6 };
    static int32_t ids[3] = { 7, 8, 9 };
    static float sc = 3;
    st_tensor t[] = {
        { "w\"1", TG_FLOAT32, TG_SHAPE(2, 3), a, sizeof a },
        { "ids", TG_INT32, TG_SHAPE(3), ids, sizeof ids },
        { "s", TG_FLOAT32, TG_SHAPE0, &sc, sizeof sc },
        { "z", TG_FLOAT32, TG_SHAPE(0, 2), NULL, 0 },
    };
    const char *k[] = { "format", "\xc3\xa9" }, *v[] = { "pt", "x\ny" };
    blob x = { NULL, 0 };
    CHECK(st_encode(t, 4, k, v, 2, &x.b, &x.n, &err), "valid file: %s", err.msg);
    return x;
}

static void test_truncations(void) {
    blob x = valid_file();
    int fails = 0;
    for (size_t n = 0; n < x.n; n++) {
        st_file f;
        err.msg[0] = 0;
        /* A copy of exactly n bytes, so ASan flags any read past the prefix. */
        unsigned char *p = malloc(n ? n : 1);
        memcpy(p, x.b, n);
        bool ok = st_parse(p, n, &f, &err);
        if (ok) st_free(&f);
        fails += !ok && err.msg[0] && f.n == 0 && f.t == NULL;
        free(p);
    }
    CHECK(fails == (int)x.n, "%d of %zu truncated prefixes failed cleanly", fails, x.n);
    st_file f;
    CHECK(st_parse(x.b, x.n, &f, &err) && f.n == 4 && f.n_meta == 2, "the whole file parses: %s", err.msg);
    st_free(&f);

    /* The same through files on disk (st_read's own path through the header and the data). */
    const char *path = tmp_path("trunc.safetensors");
    size_t lens[] = { 0, 3, 7, 8, 9, 20, x.n / 2, x.n - 9, x.n - 4, x.n - 1 };
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        spit(path, x.b, lens[i]);
        err.msg[0] = 0;
        bool ok = st_read(path, &f, &err);
        CHECK(!ok && strstr(err.msg, path) && f.n == 0, "st_read of %zu of %zu bytes: %s", lens[i], x.n, err.msg);
        if (ok) st_free(&f);
    }
    spit(path, x.b, x.n);
    CHECK(st_read(path, &f, &err) && f.n == 4, "st_read whole: %s", err.msg);
    st_free(&f);
    remove(path);
    free(x.b);
}

/* Random byte flips: must never crash; what does parse must be self-consistent and re-encode. */
static void test_flips(void) {
    blob x = valid_file();
    size_t hn = 8 + (size_t)(x.b[0] | x.b[1] << 8);
    unsigned char *m = malloc(x.n);
    int parsed = 0, failed = 0, consistent = 0;
    const int N = 6000;
    for (int it = 0; it < N; it++) {
        memcpy(m, x.b, x.n);
        int flips = 1 + (int)(check_next() % 4);
        for (int k = 0; k < flips; k++) {
            uint64_t r = check_next();
            /* Mostly into the header, where the parser lives; sometimes anywhere. */
            size_t at = (r & 3) ? (size_t)((r >> 8) % hn) : (size_t)((r >> 8) % x.n);
            unsigned char v = (r >> 4 & 1) ? (unsigned char)(r >> 40) : (unsigned char)(m[at] ^ (1u << (r >> 50 & 7)));
            /* JSON-significant bytes make deeper mutations */
            static const char sig[] = "{}[]\":,\\u0123456789 -.eE";
            if ((r >> 56 & 7) == 0) v = (unsigned char)sig[(r >> 32) % (sizeof sig - 1)];
            m[at] = v;
        }
        st_file f;
        err.msg[0] = 0;
        if (st_parse(m, x.n, &f, &err)) {
            parsed++;
            bool ok = true;
            for (int i = 0; i < f.n; i++) {
                uint64_t numel = 1;
                for (int d = 0; d < f.t[i].shape.ndim; d++) numel *= (uint64_t)f.t[i].shape.d[d];
                ok &= f.t[i].data != NULL && numel * 4 == f.t[i].nbytes && f.t[i].nbytes <= x.n;
            }
            unsigned char *b2 = NULL;
            size_t n2 = 0;
            st_file g;
            ok = ok && st_encode(f.t, f.n, (const char *const *)f.meta_keys, (const char *const *)f.meta_vals, f.n_meta,
                                 &b2, &n2, &err) && st_parse(b2, n2, &g, &err);
            if (ok) {
                ok = g.n == f.n && g.n_meta == f.n_meta;
                for (int i = 0; ok && i < f.n; i++) {
                    const st_tensor *t = st_find(&g, f.t[i].name);
                    ok = t && t->dtype == f.t[i].dtype && shape_eq(t->shape, f.t[i].shape) && t->nbytes == f.t[i].nbytes &&
                         (!t->nbytes || !memcmp(t->data, f.t[i].data, t->nbytes));
                }
                st_free(&g);
            }
            consistent += ok;
            free(b2);
            st_free(&f);
        } else {
            failed += err.msg[0] != 0 && f.n == 0;
        }
    }
    CHECK(parsed + failed == N, "%d parsed + %d failed with a message != %d", parsed, failed, N);
    CHECK(consistent == parsed, "%d of %d accepted mutants re-encode identically", consistent, parsed);
    CHECK(failed > N / 2, "most mutants fail (%d of %d)", failed, N);
    printf("test_io: %d byte-flip mutants: %d parsed, %d rejected\n", N, parsed, failed);
    free(m);
    free(x.b);
}

#define T_F32(name, shape, b, e) "\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"

static void test_hostile(void) {
    /* The length field. */
    for (size_t n = 0; n < 8; n++) {
        blob x = { calloc(1, 8), n };
        expect_fail(x, "too short", "shorter than 8 bytes");
    }
    expect_fail(raw(UINT64_MAX, "{}", 2, 0), "exceeds the limit", "length 2^64-1");
    expect_fail(raw(100000001, "{}", 2, 0), "exceeds the limit", "length just over 100 MB");
    expect_fail(raw(100000000, "{}      ", 8, 0), "exceeds the 8 bytes", "length 100 MB, file short");
    expect_fail(raw(9, "{}      ", 8, 0), "exceeds the 8 bytes", "length one past the file");
    expect_fail(raw(1ull << 63, "{}", 2, 0), "exceeds the limit", "length 2^63");
    expect_fail(raw(0, "", 0, 0), "must begin with '{'", "empty header");
    expect_fail(raw(0, "{}", 2, 2), "must begin with '{'", "zero length, bytes after");
    expect_fail(raw(1, "{}", 2, 0), "expected a string", "header cut inside the object");

    /* Offsets and sizes. */
    expect_fail(mk("{" T_F32("a", "[2]", "0", "8") "}", 4), "reach past the data section (4 bytes)", "end past data");
    expect_fail(mk("{" T_F32("a", "[2]", "8", "0") "}", 8), "begin after they end", "begin > end");
    expect_fail(mk("{" T_F32("a", "[2]", "0", "18446744073709551615") "}", 8), "reach past", "end 2^64-1");
    expect_fail(mk("{" T_F32("a", "[2]", "18446744073709551615", "18446744073709551615") "}", 8), "reach past",
                "begin 2^64-1");
    expect_fail(mk("{" T_F32("a", "[2]", "0", "18446744073709551616") "}", 8), "too large", "end 2^64");
    expect_fail(mk("{" T_F32("a", "[2]", "0", "8") "," T_F32("b", "[2]", "4", "12") "}", 12), "overlaps", "overlap");
    expect_fail(mk("{" T_F32("a", "[2]", "0", "8") "," T_F32("b", "[2]", "0", "8") "}", 8), "overlaps", "same range");
    expect_fail(mk("{" T_F32("a", "[2]", "0", "8") "," T_F32("z", "[0]", "4", "4") "}", 8), "overlaps",
                "empty tensor inside another");
    expect_fail(mk("{" T_F32("a", "[1]", "0", "4") "," T_F32("b", "[1]", "8", "12") "}", 12), "belong to no tensor", "gap");
    expect_fail(mk("{" T_F32("a", "[1]", "4", "8") "}", 8), "bytes [0, 4)", "gap at the start");
    expect_fail(mk("{" T_F32("a", "[2]", "0", "8") "}", 16), "cover only the first 8", "trailing data");
    expect_fail(mk("{}", 4), "cover only the first 0", "data but no tensors");
    expect_fail(mk("{" T_F32("a", "[3]", "0", "8") "}", 8), "needs 12 bytes", "size mismatch");
    expect_fail(mk("{" T_F32("a", "[]", "0", "8") "}", 8), "needs 4 bytes", "scalar with 8 bytes");
    expect_fail(mk("{" T_F32("a", "[4294967296,4294967296,4294967296]", "0", "0") "}", 0), "overflows", "numel overflow");
    expect_fail(mk("{" T_F32("a", "[4611686018427387904]", "0", "0") "}", 0), "overflows", "byte size overflow");
    expect_fail(mk("{" T_F32("a", "[9223372036854775808]", "0", "0") "}", 0), "too large", "dim 2^63");

    /* Shapes. */
    expect_fail(mk("{" T_F32("a", "[-2]", "0", "8") "}", 8), "negative", "negative dim");
    expect_fail(mk("{" T_F32("a", "[2.0]", "0", "8") "}", 8), "not an integer", "fractional dim");
    expect_fail(mk("{" T_F32("a", "[2e0]", "0", "8") "}", 8), "not an integer", "exponent dim");
    expect_fail(mk("{" T_F32("a", "[\"2\"]", "0", "8") "}", 8), "expected a non-negative integer", "string dim");
    expect_fail(mk("{" T_F32("a", "[02]", "0", "8") "}", 8), "leading zero", "leading zero");
    expect_fail(mk("{" T_F32("a", "[true]", "0", "8") "}", 8), "expected a non-negative integer", "bool dim");
    expect_fail(mk("{" T_F32("a", "[1,1,1,1,1,1,2]", "0", "8") "}", 8), "more than 6 dimensions", "rank 7");
    expect_fail(mk("{" T_F32("a", "[2,]", "0", "8") "}", 8), "expected a non-negative integer", "trailing comma in shape");
    expect_fail(mk("{" T_F32("a", "[2 2]", "0", "8") "}", 8), "expected ',' or ']'", "missing comma in shape");
    expect_fail(mk("{" T_F32("a", "2", "0", "8") "}", 8), "expected '['", "shape not an array");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8), "must be [begin, end]",
                "three offsets");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8), "must be [begin, end]", "one offset");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,8]}}", 8), "negative", "negative offset");

    /* Structure of entries. */
    expect_fail(mk("{" T_F32("a", "[2]", "0", "8") "," T_F32("a", "[2]", "8", "16") "}", 16), "duplicate tensor name 'a'",
                "duplicate names");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
                "duplicate key \"dtype\"", "duplicate dtype key");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8), "missing \"shape\"", "missing shape");
    expect_fail(mk("{\"a\":{}}", 0), "missing \"dtype\"", "empty entry");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8), "unknown key \"x\"",
                "unknown key");
    expect_fail(mk("{\"a\":1}", 0), "tensor 'a': expected '{'", "entry not an object");
    expect_fail(mk("{\"a\":null}", 0), "expected '{'", "entry null");
    expect_fail(mk("{\"__metadata__\":{},\"__metadata__\":{}}", 0), "duplicate key \"__metadata__\"", "two metadata");
    expect_fail(mk("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0), "duplicate __metadata__ key 'k'", "dup meta key");
    expect_fail(mk("{\"__metadata__\":{\"k\":1}}", 0), "the value of \"k\" is not a string", "numeric meta value");
    expect_fail(mk("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0), "not a string", "nested meta value");
    expect_fail(mk("{\"__metadata__\":[\"k\"]}", 0), "expected '{'", "meta array");
    expect_fail(mk("{\"__metadata__\":nul}", 0), "expected '{'", "meta nul");

    /* JSON syntax. */
    expect_fail(mk("{\"a", 0), "unterminated string", "unterminated key");
    expect_fail(mk("{\"a\\\"}", 0), "unterminated string", "unterminated after escaped quote");
    expect_fail(mk("{\"a\\", 0), "unterminated string", "backslash at the end");
    expect_fail(mk("{\"a\\x\":{}}", 0), "invalid escape '\\x'", "bad escape");
    expect_fail(mk("{\"a\\u12G4\":{}}", 0), "bad \\u escape", "bad hex");
    expect_fail(mk("{\"a\\u12\":{}}", 0), "bad \\u escape", "short \\u");
    expect_fail(mk("{\"\\ud800\":{}}", 0), "unpaired surrogate", "lone high surrogate");
    expect_fail(mk("{\"\\ud800\\u0041\":{}}", 0), "unpaired surrogate", "high surrogate + non-low");
    expect_fail(mk("{\"\\udc00\":{}}", 0), "unpaired surrogate", "lone low surrogate");
    expect_fail(mk("{\"a\\u0000b\":{}}", 0), "NUL", "escaped NUL");
    expect_fail(mk("{\"a\tb\":{}}", 0), "control character 0x09", "raw tab in string");
    expect_fail(mk("{\"a\nb\":{}}", 0), "control character", "raw newline in string");
    expect_fail(raw(8, "{\"a\0\":{}", 8, 0), "control character 0x00", "raw NUL in string");
    expect_fail(mk("{\"\xff\":{}}", 0), "invalid UTF-8", "byte 0xff");
    expect_fail(mk("{\"\xc0\xaf\":{}}", 0), "invalid UTF-8", "overlong");
    expect_fail(mk("{\"\xed\xa0\x80\":{}}", 0), "invalid UTF-8", "UTF-8 surrogate");
    expect_fail(mk("{\"\xe2\x82\":{}}", 0), "invalid UTF-8", "truncated sequence");
    expect_fail(mk("{\"\xf4\x90\x80\x80\":{}}", 0), "invalid UTF-8", "above U+10FFFF");
    expect_fail(mk("{\"\x80\":{}}", 0), "invalid UTF-8", "lone continuation");
    expect_fail(mk("[]", 0), "must begin with '{'", "array header");
    expect_fail(mk("\"x\"", 0), "must begin with '{'", "string header");
    expect_fail(mk("42", 0), "must begin with '{'", "number header");
    expect_fail(mk("null", 0), "must begin with '{'", "null header");
    expect_fail(mk(" {}", 0), "must begin with '{'", "leading space");
    expect_fail(mk("{}x", 0), "unexpected 'x'", "trailing garbage");
    expect_fail(mk("{}{}", 0), "unexpected '{'", "two objects");
    expect_fail(raw(8, "{}  \0   ", 8, 0), "unexpected byte 0x00", "NUL padding");
    expect_fail(mk("{\"__metadata__\":{},}", 0), "expected a string", "trailing comma");
    expect_fail(mk("{\"__metadata__\":{} \"b\":{}}", 0), "expected ',' or '}'", "missing comma");
    expect_fail(mk("{\"__metadata__\" {}}", 0), "expected ':'", "missing colon");
    expect_fail(mk("{'a':{}}", 0), "expected a string", "single quotes");
    expect_fail(mk("{a:{}}", 0), "expected a string", "bare key");
    expect_fail(mk("{", 0), "expected a string", "lone brace");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\"", 0), "expected ',' or '}'", "cut after a member");
    expect_fail(mk("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8), "expected ',' or '}'",
                "missing the closing brace");

    /* Deep nesting: the parser is not recursive, so depth is just a syntax error. */
    size_t depth = 200000;
    char *deep = malloc(depth + 64);
    strcpy(deep, "{\"a\":");
    memset(deep + 5, '[', depth);
    deep[5 + depth] = 0;
    expect_fail(mk(deep, 0), "expected '{'", "deep arrays");
    memset(deep, '{', depth);
    deep[depth] = 0;
    expect_fail(mk(deep, 0), "expected a string", "deep objects");
    strcpy(deep, "{\"a\":{\"dtype\":\"F32\",\"shape\":");
    size_t k = strlen(deep);
    memset(deep + k, '[', depth / 2);
    deep[k + depth / 2] = 0;
    expect_fail(mk(deep, 0), "expected a non-negative integer", "deep shape");
    free(deep);

    /* A long header of many tensors is fine; the limit is on bytes, not entries. */
    size_t nt = 3000, cap = nt * 80 + 16, at = 0;
    char *h = malloc(cap);
    at += (size_t)snprintf(h + at, cap - at, "{");
    for (size_t i = 0; i < nt; i++)
        at += (size_t)snprintf(h + at, cap - at, "%s\"t%zu\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[%zu,%zu]}",
                               i ? "," : "", nt - 1 - i, 4 * (nt - 1 - i), 4 * (nt - i));
    snprintf(h + at, cap - at, "}");
    blob x = mk(h, 4 * nt);
    st_file f;
    bool ok = parses(x, &f);
    CHECK(ok && f.n == (int)nt, "3000 tensors in reverse offset order: %s", err.msg);
    if (ok) {
        const st_tensor *t = st_find(&f, "t1234");
        CHECK(t && t->nbytes == 4 && !memcmp(t->data, x.b + 8 + strlen(h) + 4 * 1234, 4), "t1234's bytes");
        st_free(&f);
    }
    free(x.b);
    free(h);
}

static void test_read_errors(void) {
    st_file f;
    const char *p = tmp_path("missing.safetensors");
    CHECK(!st_read(p, &f, &err) && strstr(err.msg, "cannot open") && strstr(err.msg, p) && f.n == 0, "missing: %s", err.msg);
    CHECK(!st_read(tmpdir, &f, &err) && (strstr(err.msg, "not a regular file") || strstr(err.msg, "cannot open")),
          "directory: %s", err.msg);
    p = tmp_path("fifo");
    if (mkfifo(p, 0600) == 0) {   /* would block a plain fopen until a writer came */
        CHECK(!st_read(p, &f, &err) && strstr(err.msg, "not a regular file"), "FIFO: %s", err.msg);
        remove(p);
    }
    CHECK(!st_read("/dev/null", &f, &err) && strstr(err.msg, "not a regular file"), "/dev/null: %s", err.msg);
    p = tmp_path("empty.safetensors");
    spit(p, "", 0);
    CHECK(!st_read(p, &f, &err) && strstr(err.msg, "too short"), "empty file: %s", err.msg);
    remove(p);
    CHECK(!st_parse(NULL, 0, &f, &err) && strstr(err.msg, "too short"), "NULL, 0: %s", err.msg);
    CHECK(!st_parse(REF_EMPTY, sizeof REF_EMPTY, NULL, &err), "NULL out");
    CHECK(st_parse(REF_EMPTY, sizeof REF_EMPTY, &f, NULL), "NULL err is fine");
    CHECK(!st_parse(REF_EMPTY, 3, &f, NULL) && f.n == 0, "NULL err on failure is fine");
    CHECK(st_find(NULL, "a") == NULL && st_meta(NULL, "a") == NULL, "lookups on NULL");
    st_free(NULL);
}

/* The fixture written by the Python safetensors package (make_python_fixture.py). */
static void test_python_fixture(void) {
    const char *path = "tests/fixtures/python_reference.safetensors";
    if (!file_exists(path)) {
        printf("test_io: %s not present (run tests/fixtures/make_python_fixture.py to create it); skipped\n", path);
        return;
    }
    st_file f;
    bool ok = st_read(path, &f, &err);
    CHECK(ok, "python fixture: %s", err.msg);
    if (!ok) return;
    float weight[6], bias[2] = { 1.5f, -2.25f }, scalar = 3.0f;
    for (int i = 0; i < 6; i++) weight[i] = (float)i / 4 - 0.5f;
    int32_t ids[4] = { 1, -2, INT32_MAX, INT32_MIN };
    st_tensor want[] = {
        { "weight", TG_FLOAT32, TG_SHAPE(2, 3), weight, sizeof weight },
        { "bias", TG_FLOAT32, TG_SHAPE(2), bias, sizeof bias },
        { "ids", TG_INT32, TG_SHAPE(2, 2), ids, sizeof ids },
        { "scalar", TG_FLOAT32, TG_SHAPE0, &scalar, sizeof scalar },
        { "empty", TG_FLOAT32, TG_SHAPE(0, 3), NULL, 0 },
    };
    check_same(&f, want, 5, "python fixture");
    CHECK(st_meta(&f, "format") && !strcmp(st_meta(&f, "format"), "np"), "python fixture metadata");
    st_free(&f);
    const char *k[] = { "format" }, *v[] = { "np" };
    size_t flen = 0;
    unsigned char *fb = slurp(path, &flen);
    check_encodes_to(want, 5, k, v, 1, fb, flen, "python fixture, byte for byte");
    free(fb);
}

int main(void) {
    strcpy(tmpdir, "/tmp/tg_test_io_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_reference_vectors();
    test_hand_built();
    test_roundtrip();
    test_names();
    test_writer_errors();
    test_dtypes();
    test_truncations();
    test_flips();
    test_hostile();
    test_read_errors();
    test_python_fixture();
    rmdir(tmpdir);
    return check_report("test_io");
}
