/* Reads an exported model's weights from a safetensors file: the <prefix>_init(path) of a file
 * that tg_export_c wrote with external weights calls tgx_load with the model's table of tensors.
 * Plain C99 with stdio; no allocation: the JSON header is parsed as it streams past (a key
 * longer than TGX_NAME_MAX cannot be one of the model's tensors and is skipped), then the data
 * are read in file order, without seeking, straight into the model's static arrays.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
 * then the data section, which the offsets index. Tensors the model does not use are skipped,
 * so a checkpoint with optimizer state (tg_save(t, path, 1, &err)) loads as well. The bytes are
 * little-endian and converted on any host; float must be IEEE binary32.
 *
 * Embedded as text in exported files like portable_kernels.h, and not a header either. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { TGX_OK = 0, TGX_E_OPEN = -1, TGX_E_FORMAT = -2, TGX_E_MISSING = -3, TGX_E_SHAPE = -4, TGX_E_READ = -5 };

#define TGX_NAME_MAX 256
#define TGX_DEPTH_MAX 32

/* One of the model's tensors: where its values go and the shape the file must give it; begin,
 * end and found are filled in from the header. */
typedef struct {
    const char *name;
    float *data;
    int ndim;
    int64_t shape[6];
    uint64_t begin, end;
    int found;
} tgx_tensor;

/* The header as a stream: c is the current byte (-1 past its end), left the bytes after it. */
typedef struct {
    FILE *f;
    uint64_t left;
    int c;
} tgx_in;

static void tgx_next(tgx_in *in) {
    int c = EOF;
    if (in->left > 0) {
        in->left--;
        c = getc(in->f);
    }
    in->c = c == EOF ? -1 : c;
}

static void tgx_space(tgx_in *in) {
    while (in->c == ' ' || in->c == '\t' || in->c == '\n' || in->c == '\r') tgx_next(in);
}

/* Consumes ch after any white space; 0 when something else is there. */
static int tgx_eat(tgx_in *in, int ch) {
    tgx_space(in);
    if (in->c != ch) return 0;
    tgx_next(in);
    return 1;
}

static void tgx_put(char *buf, size_t len, size_t *n, int c, int *cut) {
    if (*n + 1 < len) buf[(*n)++] = (char)c;
    else *cut = 1;
}

/* A JSON string into buf, NUL-terminated (*cut set when it did not fit); \uXXXX escapes become
 * UTF-8. 0 on bad syntax. */
static int tgx_string(tgx_in *in, char *buf, size_t len, int *cut) {
    size_t n = 0;
    *cut = 0;
    if (!tgx_eat(in, '"')) return 0;
    for (;;) {
        int c = in->c;
        if (c < 0) return 0;
        tgx_next(in);
        if (c == '"') break;
        if (c == '\\') {
            c = in->c;
            tgx_next(in);
            if (c == 'b') c = '\b';
            else if (c == 'f') c = '\f';
            else if (c == 'n') c = '\n';
            else if (c == 'r') c = '\r';
            else if (c == 't') c = '\t';
            else if (c == 'u') {
                unsigned u = 0;
                for (int k = 0; k < 4; k++, tgx_next(in)) {
                    int h = in->c;
                    if (h >= '0' && h <= '9') u = u * 16 + (unsigned)(h - '0');
                    else if (h >= 'a' && h <= 'f') u = u * 16 + (unsigned)(h - 'a' + 10);
                    else if (h >= 'A' && h <= 'F') u = u * 16 + (unsigned)(h - 'A' + 10);
                    else return 0;
                }
                if (u >= 0x800) {
                    tgx_put(buf, len, &n, (int)(0xE0 | u >> 12), cut);
                    tgx_put(buf, len, &n, (int)(0x80 | (u >> 6 & 0x3F)), cut);
                } else if (u >= 0x80) {
                    tgx_put(buf, len, &n, (int)(0xC0 | u >> 6), cut);
                }
                c = u >= 0x80 ? (int)(0x80 | (u & 0x3F)) : (int)u;
            } else if (c != '"' && c != '\\' && c != '/') {
                return 0;
            }
        }
        tgx_put(buf, len, &n, c, cut);
    }
    buf[n] = 0;
    return 1;
}

/* Skips one JSON value of any kind, nested at most TGX_DEPTH_MAX deep. */
static int tgx_skip(tgx_in *in, int depth) {
    char key[8];
    int cut;
    tgx_space(in);
    if (depth > TGX_DEPTH_MAX) return 0;
    if (in->c == '"') return tgx_string(in, key, sizeof key, &cut);
    if (in->c == '{' || in->c == '[') {
        int close = in->c == '{' ? '}' : ']';
        tgx_next(in);
        if (tgx_eat(in, close)) return 1;
        do {
            if (close == '}' && (!tgx_string(in, key, sizeof key, &cut) || !tgx_eat(in, ':'))) return 0;
            if (!tgx_skip(in, depth + 1)) return 0;
        } while (tgx_eat(in, ','));
        return tgx_eat(in, close);
    }
    int n = 0;   /* a number, true, false or null */
    while (in->c == '-' || in->c == '+' || in->c == '.' || (in->c >= '0' && in->c <= '9') || (in->c >= 'a' && in->c <= 'z') ||
           (in->c >= 'A' && in->c <= 'Z')) {
        tgx_next(in);
        n++;
    }
    return n > 0;
}

/* An array of at most max non-negative integers into v (*n of them). */
static int tgx_uints(tgx_in *in, uint64_t *v, int max, int *n) {
    *n = 0;
    if (!tgx_eat(in, '[')) return 0;
    if (tgx_eat(in, ']')) return 1;
    do {
        uint64_t x = 0;
        int digits = 0;
        tgx_space(in);
        for (; in->c >= '0' && in->c <= '9'; tgx_next(in), digits++) {
            if (x > (UINT64_MAX - 9) / 10) return 0;
            x = x * 10 + (uint64_t)(in->c - '0');
        }
        if (!digits || *n == max) return 0;
        v[(*n)++] = x;
    } while (tgx_eat(in, ','));
    return tgx_eat(in, ']');
}

static void tgx_shape_str(const uint64_t *d, int n, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = 0;
    for (int k = 0; k < n && at + 24 < len; k++) at += (size_t)sprintf(buf + at, "%s%llu", k ? "," : "", (unsigned long long)d[k]);
}

/* The value of one of the model's tensors in the header: checked against t, its offsets kept. */
static int tgx_entry(tgx_in *in, tgx_tensor *t, char *msg, size_t len) {
    char key[16], dtype[8] = "", got[160], want[160];
    uint64_t shape[8] = { 0 }, off[2] = { 0 }, wanted[6] = { 0 }, bytes = 4;
    int nshape = -1, noff = -1, cut, dtype_cut = 0, k;
    if (!tgx_eat(in, '{')) return TGX_E_FORMAT;
    if (!tgx_eat(in, '}')) {
        do {
            int ok;
            if (!tgx_string(in, key, sizeof key, &cut) || !tgx_eat(in, ':')) return TGX_E_FORMAT;
            if (!cut && strcmp(key, "dtype") == 0) ok = tgx_string(in, dtype, sizeof dtype, &dtype_cut);
            else if (!cut && strcmp(key, "shape") == 0) ok = tgx_uints(in, shape, 8, &nshape);
            else if (!cut && strcmp(key, "data_offsets") == 0) ok = tgx_uints(in, off, 2, &noff);
            else ok = tgx_skip(in, 1);
            if (!ok) return TGX_E_FORMAT;
        } while (tgx_eat(in, ','));
        if (!tgx_eat(in, '}')) return TGX_E_FORMAT;
    }
    if (dtype_cut || strcmp(dtype, "F32") != 0) {
        snprintf(msg, len, "tensor '%s' has dtype %s, expected F32", t->name, dtype_cut ? "(too long)" : dtype);
        return TGX_E_SHAPE;
    }
    for (k = 0; k < t->ndim; k++) {
        wanted[k] = (uint64_t)t->shape[k];
        bytes *= wanted[k];
    }
    int same = nshape == t->ndim;
    for (k = 0; same && k < nshape; k++) same = shape[k] == wanted[k];
    if (!same) {
        tgx_shape_str(shape, nshape < 0 ? 0 : nshape, got, sizeof got);
        tgx_shape_str(wanted, t->ndim, want, sizeof want);
        snprintf(msg, len, "tensor '%s' has shape [%s], expected [%s]", t->name, got, want);
        return TGX_E_SHAPE;
    }
    if (noff != 2 || off[0] > off[1] || off[1] - off[0] != bytes) {
        snprintf(msg, len, "tensor '%s': data_offsets do not span its %llu bytes", t->name, (unsigned long long)bytes);
        return TGX_E_FORMAT;
    }
    t->begin = off[0];
    t->end = off[1];
    t->found = 1;
    return TGX_OK;
}

/* The header object: the model's tensors found and checked, every other entry skipped. */
static int tgx_header(tgx_in *in, tgx_tensor *t, int n, char *msg, size_t len) {
    if (!tgx_eat(in, '{')) return TGX_E_FORMAT;
    if (tgx_eat(in, '}')) return TGX_OK;
    do {
        char name[TGX_NAME_MAX];
        int cut, k = n;
        if (!tgx_string(in, name, sizeof name, &cut) || !tgx_eat(in, ':')) return TGX_E_FORMAT;
        if (!cut)
            for (k = 0; k < n && strcmp(t[k].name, name) != 0; k++) {}
        if (k < n) {
            int rc = tgx_entry(in, &t[k], msg, len);
            if (rc != TGX_OK) return rc;
        } else if (!tgx_skip(in, 1)) {
            return TGX_E_FORMAT;
        }
    } while (tgx_eat(in, ','));
    return tgx_eat(in, '}') ? TGX_OK : TGX_E_FORMAT;
}

/* Discards n bytes of f. */
static int tgx_pass(FILE *f, uint64_t n) {
    unsigned char buf[512];
    while (n > 0) {
        size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
        if (fread(buf, 1, k, f) != k) return 0;
        n -= k;
    }
    return 1;
}

/* count little-endian binary32 values of f into dst. */
static int tgx_floats(FILE *f, float *dst, uint64_t count) {
    unsigned char buf[1024];
    while (count > 0) {
        size_t k = count < sizeof buf / 4 ? (size_t)count : sizeof buf / 4;
        if (fread(buf, 4, k, f) != k) return 0;
        for (size_t i = 0; i < k; i++) {
            const unsigned char *b = buf + 4 * i;
            uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
            memcpy(dst + i, &u, 4);
        }
        dst += k;
        count -= k;
    }
    return 1;
}

/* Every tensor of t[0..n) from the file at path: TGX_OK, or an error code with msg saying what
 * went wrong. On failure the tensors' values are unspecified (some may have been read). */
static int tgx_load(const char *path, tgx_tensor *t, int n, char *msg, size_t len) {
    unsigned char head[8];
    uint64_t header_len = 0, pos = 0;
    int rc = TGX_E_FORMAT, k;
    FILE *f = fopen(path, "rb");
    msg[0] = 0;
    if (!f) {
        snprintf(msg, len, "cannot open %s", path);
        return TGX_E_OPEN;
    }
    for (k = 0; k < n; k++) t[k].found = 0;
    if (fread(head, 1, 8, f) == 8) {
        tgx_in in;
        for (k = 7; k >= 0; k--) header_len = header_len << 8 | head[k];
        in.f = f;
        in.left = header_len;
        tgx_next(&in);
        rc = tgx_header(&in, t, n, msg, len);
        if (msg[0]) {   /* a tensor's own message: name the file too */
            char what[256];
            snprintf(what, sizeof what, "%s", msg);
            snprintf(msg, len, "%s: %s", path, what);
        }
        tgx_space(&in);   /* the padding, to the end of the header */
        if (rc == TGX_OK && in.c != -1) rc = TGX_E_FORMAT;
        if (rc == TGX_OK && in.left > 0) rc = TGX_E_FORMAT;
    }
    if (rc == TGX_E_FORMAT && !msg[0]) snprintf(msg, len, "%s is not a safetensors file (bad header)", path);
    for (k = 0; rc == TGX_OK && k < n; k++)
        if (!t[k].found) {
            snprintf(msg, len, "%s has no tensor '%s'", path, t[k].name);
            rc = TGX_E_MISSING;
        }
    while (rc == TGX_OK) {   /* the data in file order, each tensor at or after the end of the last */
        int next = -1;
        for (k = 0; k < n; k++)
            if (t[k].found == 1 && (next < 0 || t[k].begin < t[next].begin)) next = k;
        if (next < 0) break;
        t[next].found = 2;
        if (t[next].begin < pos) {
            snprintf(msg, len, "%s: tensor '%s' overlaps another", path, t[next].name);
            rc = TGX_E_FORMAT;
        } else if (!tgx_pass(f, t[next].begin - pos) || !tgx_floats(f, t[next].data, (t[next].end - t[next].begin) / 4)) {
            snprintf(msg, len, "%s ends inside tensor '%s'", path, t[next].name);
            rc = TGX_E_READ;
        }
        pos = t[next].end;
    }
    fclose(f);
    if (rc != TGX_OK && !msg[0]) snprintf(msg, len, "%s: cannot read the weights", path);
    return rc;
}
