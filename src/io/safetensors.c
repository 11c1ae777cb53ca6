/* safetensors reading and writing. safetensors.h describes the layout written and everything a read
 * validates. Self-contained (it needs only the public header), so the fuzzer links it alone.
 *
 * Reading never trusts the file: the header is parsed by a small non-recursive JSON parser for
 * exactly the format's shape, every number is range-checked before use, and tensor bytes are
 * only touched after the offsets have been validated against the data section's size. */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "io/safetensors.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */


static void set_msg(char *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_msg(char *msg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, TG_ERROR_LEN, fmt, ap);
    va_end(ap);
}

static void set_err(tg_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(tg_error *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

static bool host_is_le(void) {
    const uint32_t one = 1;
    unsigned char c;
    memcpy(&c, &one, 1);
    return c == 1;
}

/* Copy 4-byte elements between host order and little-endian (the same operation both ways). */
static void copy_le4(void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return;
    if (host_is_le()) { memcpy(dst, src, nbytes); return; }
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i + 4 <= nbytes; i += 4) {
        unsigned char a = s[i], b = s[i + 1], c = s[i + 2], e = s[i + 3];
        d[i] = e; d[i + 1] = c; d[i + 2] = b; d[i + 3] = a;
    }
}

static uint64_t get_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Length of the valid UTF-8 sequence at p (1 for ASCII), or 0 if it is not one: no overlong
 * forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_seq(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return n;
}

static bool utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    while (p < end) {
        size_t n = utf8_seq(p, end);
        if (!n) return false;
        p += n;
    }
    return true;
}

static size_t utf8_put(char *d, uint32_t cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) { d[0] = (char)(0xC0 | (cp >> 6)); d[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12)); d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18)); d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static void shape_fmt(const tg_shape *s, char *buf, size_t cap) {
    size_t k = 0;
    buf[k++] = '[';
    for (int i = 0; i < s->ndim && i < TG_MAX_DIMS; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? ",%" PRId64 : "%" PRId64, s->d[i]);
    snprintf(buf + k, cap - k, "]");
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Dtypes of the spec (huggingface/safetensors Dtype), so that an unsupported one is told apart
 * from a misspelt one. */
static const char *const KNOWN_DTYPES[] = {
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16",
    "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
};

/* ---------------------------------------------------------------------------------------------
 * Reading: a strict JSON parser for exactly the header's shape. Every function returns false
 * after writing the (first and only) message; nothing after a failure writes another.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *s, *p, *end;    /* the header: start, cursor, end */
    char *msg;                           /* TG_ERROR_LEN bytes */
} jp;

/* What st_parse / st_read build: the file plus each tensor's begin offset. */
typedef struct {
    st_file f;
    uint64_t *begin;
    int tcap, mcap;
} builder;

static bool jfail(jp *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool jfail(jp *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->msg, TG_ERROR_LEN, fmt, ap);
    va_end(ap);
    return false;
}

static size_t jpos(const jp *j) { return (size_t)(j->p - j->s); }

/* The byte at the cursor, for messages. */
static const char *jfound(const jp *j, char *buf, size_t cap) {
    if (j->p >= j->end) snprintf(buf, cap, "the end of the header");
    else if (*j->p >= 0x20 && *j->p < 0x7F) snprintf(buf, cap, "'%c'", *j->p);
    else snprintf(buf, cap, "byte 0x%02x", *j->p);
    return buf;
}

static void jws(jp *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

/* After whitespace: true (and consumed) if the next byte is c. */
static bool jeat(jp *j, unsigned char c) {
    jws(j);
    if (j->p < j->end && *j->p == c) { j->p++; return true; }
    return false;
}

static bool jexpect(jp *j, unsigned char c, const char *ctx) {
    if (jeat(j, c)) return true;
    char b[32];
    return jfail(j, "%s: expected '%c' at header offset %zu, found %s", ctx, c, jpos(j), jfound(j, b, sizeof b));
}

/* After a member of an object or an element of an array: true with *more set for ',', true
 * with *more clear for the closing bracket. */
static bool jnext(jp *j, unsigned char close, const char *ctx, bool *more) {
    if (jeat(j, ',')) { *more = true; return true; }
    if (jeat(j, close)) { *more = false; return true; }
    char b[32];
    return jfail(j, "%s: expected ',' or '%c' at header offset %zu, found %s", ctx, close, jpos(j),
                 jfound(j, b, sizeof b));
}

static bool hex4(const unsigned char *p, const unsigned char *end, uint32_t *out) {
    if (end - p < 4) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return false;
        v = v * 16 + d;
    }
    *out = v;
    return true;
}

/* A JSON string into *out (malloc'd, NUL-terminated, valid UTF-8 without NUL characters). */
static bool jstring(jp *j, const char *ctx, char **out) {
    char b[32];
    jws(j);
    if (j->p >= j->end || *j->p != '"')
        return jfail(j, "%s: expected a string at header offset %zu, found %s", ctx, jpos(j), jfound(j, b, sizeof b));
    const unsigned char *start = j->p + 1, *q = start;
    while (q < j->end && *q != '"') {
        if (*q != '\\') q++;
        else if (j->end - q < 2) q = j->end;
        else q += 2;
    }
    if (q >= j->end) return jfail(j, "%s: unterminated string starting at header offset %zu", ctx, jpos(j));

    /* Every escape decodes to no more bytes than it takes, so the span bounds the result. */
    char *d = tg_alloc((size_t)(q - start) + 1);
    if (!d) return jfail(j, "%s: out of memory for a string at header offset %zu", ctx, jpos(j));
    size_t k = 0;
    const unsigned char *p = start;
    while (p < q) {
        unsigned c = *p;
        j->p = p;    /* for messages */
        if (c < 0x20) {
            free(d);
            return jfail(j, "%s: control character 0x%02x in a string at header offset %zu (must be escaped)", ctx, c,
                         jpos(j));
        }
        if (c >= 0x80) {
            size_t n = utf8_seq(p, q);
            if (!n) { free(d); return jfail(j, "%s: invalid UTF-8 in a string at header offset %zu", ctx, jpos(j)); }
            memcpy(d + k, p, n);
            k += n;
            p += n;
            continue;
        }
        if (c != '\\') { d[k++] = (char)c; p++; continue; }
        unsigned e = p[1];     /* the scan above put the closing quote after it */
        p += 2;
        switch (e) {
        case '"': d[k++] = '"'; break;
        case '\\': d[k++] = '\\'; break;
        case '/': d[k++] = '/'; break;
        case 'b': d[k++] = '\b'; break;
        case 'f': d[k++] = '\f'; break;
        case 'n': d[k++] = '\n'; break;
        case 'r': d[k++] = '\r'; break;
        case 't': d[k++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (!hex4(p, q, &cp)) {
                free(d);
                return jfail(j, "%s: bad \\u escape at header offset %zu (needs 4 hex digits)", ctx, jpos(j));
            }
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (q - p >= 6 && p[0] == '\\' && p[1] == 'u' && hex4(p + 2, q, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                } else {
                    free(d);
                    return jfail(j, "%s: unpaired surrogate \\u%04X at header offset %zu", ctx, (unsigned)cp, jpos(j));
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(d);
                return jfail(j, "%s: unpaired surrogate \\u%04X at header offset %zu", ctx, (unsigned)cp, jpos(j));
            }
            if (cp == 0) {
                free(d);
                return jfail(j, "%s: NUL character (\\u0000) in a string at header offset %zu", ctx, jpos(j));
            }
            k += utf8_put(d + k, cp);
            break;
        }
        default:
            free(d);
            if (e >= 0x20 && e < 0x7F)
                return jfail(j, "%s: invalid escape '\\%c' at header offset %zu", ctx, e, jpos(j));
            return jfail(j, "%s: invalid escape (byte 0x%02x) at header offset %zu", ctx, e, jpos(j));
        }
    }
    d[k] = 0;
    j->p = q + 1;
    *out = d;
    return true;
}

static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }

/* A non-negative JSON integer <= max (no sign, fraction, exponent or leading zero). */
static bool juint(jp *j, const char *ctx, const char *what, uint64_t max, uint64_t *out) {
    char b[32];
    jws(j);
    if (j->p < j->end && *j->p == '-')
        return jfail(j, "%s: %s is negative at header offset %zu", ctx, what, jpos(j));
    if (j->p >= j->end || !is_digit(*j->p))
        return jfail(j, "%s: %s: expected a non-negative integer at header offset %zu, found %s", ctx, what, jpos(j),
                     jfound(j, b, sizeof b));
    if (*j->p == '0' && j->end - j->p > 1 && is_digit(j->p[1]))
        return jfail(j, "%s: %s has a leading zero at header offset %zu", ctx, what, jpos(j));
    uint64_t v = 0;
    size_t at = jpos(j);
    while (j->p < j->end && is_digit(*j->p)) {
        unsigned d = *j->p - '0';
        if (v > (max - d) / 10) return jfail(j, "%s: %s is too large at header offset %zu", ctx, what, at);
        v = v * 10 + d;
        j->p++;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return jfail(j, "%s: %s is not an integer at header offset %zu", ctx, what, at);
    *out = v;
    return true;
}

static bool parse_dtype(jp *j, const char *ctx, st_tensor *t) {
    char *s = NULL;
    if (!jstring(j, ctx, &s)) return false;
    bool ok = true;
    if (!strcmp(s, "F32")) t->dtype = TG_FLOAT32;
    else if (!strcmp(s, "I32")) t->dtype = TG_INT32;
    else {
        bool known = false;
        for (size_t i = 0; i < sizeof KNOWN_DTYPES / sizeof KNOWN_DTYPES[0]; i++) known |= !strcmp(s, KNOWN_DTYPES[i]);
        if (known) jfail(j, "%s: dtype %s is not supported (only F32 and I32)", ctx, s);
        else jfail(j, "%s: unknown dtype \"%.40s\"", ctx, s);
        ok = false;
    }
    free(s);
    return ok;
}

static bool parse_shape(jp *j, const char *ctx, tg_shape *shape) {
    if (!jexpect(j, '[', ctx)) return false;
    shape->ndim = 0;
    if (jeat(j, ']')) return true;
    for (bool more = true; more;) {
        if (shape->ndim == TG_MAX_DIMS)
            return jfail(j, "%s: shape has more than %d dimensions", ctx, TG_MAX_DIMS);
        uint64_t v;
        if (!juint(j, ctx, "shape dimension", (uint64_t)INT64_MAX, &v)) return false;
        shape->d[shape->ndim++] = (int64_t)v;
        if (!jnext(j, ']', ctx, &more)) return false;
    }
    return true;
}

static bool parse_offsets(jp *j, const char *ctx, uint64_t off[2]) {
    if (!jexpect(j, '[', ctx)) return false;
    if (!juint(j, ctx, "data_offsets begin", UINT64_MAX, &off[0])) return false;
    if (!jeat(j, ','))
        return jfail(j, "%s: data_offsets must be [begin, end] (header offset %zu)", ctx, jpos(j));
    if (!juint(j, ctx, "data_offsets end", UINT64_MAX, &off[1])) return false;
    if (!jeat(j, ']'))
        return jfail(j, "%s: data_offsets must be [begin, end] (header offset %zu)", ctx, jpos(j));
    return true;
}

/* One tensor entry; takes ownership of name. */
static bool parse_tensor(jp *j, builder *b, char *name, uint64_t data_len) {
    if (b->f.n == b->tcap) {
        if (b->tcap > (1 << 29)) { free(name); return jfail(j, "too many tensors"); }
        int cap = b->tcap ? 2 * b->tcap : 16;
        st_tensor *t = tg_realloc(b->f.t, sizeof *b->f.t * (size_t)cap);
        if (t) b->f.t = t;
        uint64_t *begin = t ? tg_realloc(b->begin, sizeof *b->begin * (size_t)cap) : NULL;
        if (begin) b->begin = begin;
        if (!begin) { free(name); return jfail(j, "out of memory for %d tensors", cap); }
        b->tcap = cap;
    }
    st_tensor *t = &b->f.t[b->f.n];
    memset(t, 0, sizeof *t);
    t->name = name;
    b->begin[b->f.n] = 0;
    b->f.n++;

    char ctx[128];
    snprintf(ctx, sizeof ctx, "tensor '%.80s'", name);
    static const char *const KEYS[3] = { "dtype", "shape", "data_offsets" };
    bool seen[3] = { false, false, false };
    uint64_t off[2] = { 0, 0 };
    if (!jexpect(j, '{', ctx)) return false;
    if (!jeat(j, '}')) {
        for (bool more = true; more;) {
            char *k = NULL;
            if (!jstring(j, ctx, &k)) return false;
            int w = -1;
            for (int i = 0; i < 3; i++)
                if (!strcmp(k, KEYS[i])) w = i;
            if (w < 0) {
                jfail(j, "%s: unknown key \"%.40s\" (expected dtype, shape, data_offsets)", ctx, k);
                free(k);
                return false;
            }
            free(k);
            if (seen[w]) return jfail(j, "%s: duplicate key \"%s\"", ctx, KEYS[w]);
            seen[w] = true;
            if (!jexpect(j, ':', ctx)) return false;
            if (w == 0 ? !parse_dtype(j, ctx, t) : w == 1 ? !parse_shape(j, ctx, &t->shape) : !parse_offsets(j, ctx, off))
                return false;
            if (!jnext(j, '}', ctx, &more)) return false;
        }
    }
    for (int i = 0; i < 3; i++)
        if (!seen[i]) return jfail(j, "%s: missing \"%s\"", ctx, KEYS[i]);

    if (off[0] > off[1])
        return jfail(j, "%s: data_offsets [%" PRIu64 ", %" PRIu64 "] begin after they end", ctx, off[0], off[1]);
    if (off[1] > data_len)
        return jfail(j, "%s: data_offsets [%" PRIu64 ", %" PRIu64 "] reach past the data section (%" PRIu64 " bytes)", ctx,
                     off[0], off[1], data_len);
    uint64_t numel = 1;
    for (int i = 0; i < t->shape.ndim; i++) {
        uint64_t d = (uint64_t)t->shape.d[i];
        if (d && numel > UINT64_MAX / d) return jfail(j, "%s: the element count of the shape overflows", ctx);
        numel *= d;
    }
    if (numel > UINT64_MAX / 4) return jfail(j, "%s: the byte size of the shape overflows", ctx);
    if (numel * 4 != off[1] - off[0]) {
        char sh[160];
        shape_fmt(&t->shape, sh, sizeof sh);
        return jfail(j, "%s: shape %s of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
                     ctx, sh, t->dtype == TG_FLOAT32 ? "F32" : "I32", numel * 4, off[0], off[1], off[1] - off[0]);
    }
    if (off[1] - off[0] > SIZE_MAX) return jfail(j, "%s: too large for this machine", ctx);
    t->nbytes = (size_t)(off[1] - off[0]);
    b->begin[b->f.n - 1] = off[0];
    return true;
}

static bool parse_metadata(jp *j, builder *b) {
    static const char ctx[] = "__metadata__";
    jws(j);
    if (j->end - j->p >= 4 && !memcmp(j->p, "null", 4)) { j->p += 4; return true; }
    if (!jexpect(j, '{', ctx)) return false;
    if (jeat(j, '}')) return true;
    for (bool more = true; more;) {
        if (b->f.n_meta == b->mcap) {
            if (b->mcap > (1 << 29)) return jfail(j, "too many metadata entries");
            int cap = b->mcap ? 2 * b->mcap : 8;
            char **keys = tg_realloc(b->f.meta_keys, sizeof(char *) * (size_t)cap);
            if (keys) b->f.meta_keys = keys;
            char **vals = keys ? tg_realloc(b->f.meta_vals, sizeof(char *) * (size_t)cap) : NULL;
            if (vals) b->f.meta_vals = vals;
            if (!vals) return jfail(j, "out of memory for %d metadata entries", cap);
            b->mcap = cap;
        }
        char *k = NULL;
        if (!jstring(j, ctx, &k)) return false;
        int i = b->f.n_meta++;
        b->f.meta_keys[i] = k;
        b->f.meta_vals[i] = NULL;
        if (!jexpect(j, ':', ctx)) return false;
        jws(j);
        if (j->p >= j->end || *j->p != '"')
            return jfail(j, "%s: the value of \"%.80s\" is not a string (header offset %zu)", ctx, k, jpos(j));
        if (!jstring(j, ctx, &b->f.meta_vals[i])) return false;
        if (!jnext(j, '}', ctx, &more)) return false;
    }
    return true;
}

typedef struct { uint64_t begin, end; int idx; } span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Duplicate names and keys, and the tensors covering the data section exactly. */
static bool validate_file(builder *b, uint64_t data_len, char *msg) {
    st_file *f = &b->f;
    int m = f->n > f->n_meta ? f->n : f->n_meta;
    const char **names = tg_alloc(sizeof(char *) * (size_t)(m + 1));
    if (!names) { set_msg(msg, "out of memory checking %d names", m); return false; }
    bool ok = true;
    for (int i = 0; i < f->n; i++) names[i] = f->t[i].name;
    qsort(names, (size_t)f->n, sizeof *names, cmp_str);
    for (int i = 1; i < f->n && ok; i++)
        if (!strcmp(names[i - 1], names[i])) { set_msg(msg, "duplicate tensor name '%.80s'", names[i]); ok = false; }
    for (int i = 0; i < f->n_meta; i++) names[i] = f->meta_keys[i];
    qsort(names, (size_t)f->n_meta, sizeof *names, cmp_str);
    for (int i = 1; i < f->n_meta && ok; i++)
        if (!strcmp(names[i - 1], names[i])) { set_msg(msg, "duplicate __metadata__ key '%.80s'", names[i]); ok = false; }
    free(names);
    if (!ok) return false;

    span *sp = tg_alloc(sizeof *sp * (size_t)(f->n + 1));
    if (!sp) { set_msg(msg, "out of memory checking %d tensors", f->n); return false; }
    for (int i = 0; i < f->n; i++) sp[i] = (span){ b->begin[i], b->begin[i] + f->t[i].nbytes, i };
    qsort(sp, (size_t)f->n, sizeof *sp, cmp_span);
    uint64_t at = 0;
    for (int i = 0; i < f->n && ok; i++) {
        const char *name = f->t[sp[i].idx].name;
        if (sp[i].begin < at) {
            set_msg(msg, "tensor '%.80s' (data_offsets [%" PRIu64 ", %" PRIu64 "]) overlaps tensor '%.80s' (which ends at %" PRIu64 ")",
                    name, sp[i].begin, sp[i].end, f->t[sp[i - 1].idx].name, at);
            ok = false;
        } else if (sp[i].begin > at) {
            set_msg(msg, "bytes [%" PRIu64 ", %" PRIu64 ") of the data section belong to no tensor (a gap before tensor '%.80s')",
                    at, sp[i].begin, name);
            ok = false;
        }
        at = sp[i].end;
    }
    free(sp);
    if (ok && at != data_len) {
        set_msg(msg, "the data section has %" PRIu64 " bytes but the tensors cover only the first %" PRIu64, data_len, at);
        ok = false;
    }
    return ok;
}

/* The header h[0..n) of a file whose data section has data_len bytes: tensors (without data)
 * and metadata into b, validated. */
static bool parse_header(const unsigned char *h, size_t n, uint64_t data_len, builder *b, char *msg) {
    jp j = { h, h, h + n, msg };
    if (n == 0 || h[0] != '{') {
        char c[32];
        return jfail(&j, "the header must begin with '{', found %s", jfound(&j, c, sizeof c));
    }
    j.p++;
    bool seen_meta = false;
    if (!jeat(&j, '}')) {
        for (bool more = true; more;) {
            char *key = NULL;
            if (!jstring(&j, "header", &key)) return false;
            if (!jexpect(&j, ':', "header")) { free(key); return false; }
            if (!strcmp(key, "__metadata__")) {
                free(key);
                if (seen_meta) return jfail(&j, "header: duplicate key \"__metadata__\"");
                seen_meta = true;
                if (!parse_metadata(&j, b)) return false;
            } else if (!parse_tensor(&j, b, key, data_len)) {
                return false;
            }
            if (!jnext(&j, '}', "header", &more)) return false;
        }
    }
    jws(&j);
    if (j.p != j.end) {
        char c[32];
        return jfail(&j, "header: unexpected %s at header offset %zu after the closing '}'", jfound(&j, c, sizeof c), jpos(&j));
    }
    return validate_file(b, data_len, msg);
}

/* The 8-byte length n of a file of `total` bytes (p: its first 8 bytes when total >= 8). */
static bool check_length(uint64_t total, const unsigned char *p, uint64_t *n, char *msg) {
    if (total < 8) {
        set_msg(msg, "%" PRIu64 " bytes is too short for a safetensors file (the header length alone takes 8)", total);
        return false;
    }
    *n = get_le64(p);
    if (*n > ST_MAX_HEADER) {
        set_msg(msg, "header length %" PRIu64 " exceeds the limit of %u bytes", *n, ST_MAX_HEADER);
        return false;
    }
    if (*n > total - 8) {
        set_msg(msg, "header length %" PRIu64 " exceeds the %" PRIu64 " bytes that follow it (truncated file?)", *n, total - 8);
        return false;
    }
    return true;
}

static bool alloc_data(st_tensor *t, char *msg) {
    t->data = tg_alloc_aligned64(t->nbytes ? t->nbytes : 1);
    if (!t->data) set_msg(msg, "out of memory for tensor '%.80s' (%zu bytes)", t->name, t->nbytes);
    return t->data != NULL;
}

/* Hands the result to the caller: the file, or nothing and the error. */
static bool finish(builder *b, bool ok, st_file *out, tg_error *err, const char *prefix, const char *msg) {
    free(b->begin);
    if (ok && out) { *out = b->f; return true; }
    st_free(&b->f);
    if (out) memset(out, 0, sizeof *out);
    set_err(err, "%s: %s", prefix, msg);
    return false;
}

bool st_parse(const unsigned char *bytes, size_t len, st_file *out, tg_error *err) {
    char msg[TG_ERROR_LEN] = "no output file given";
    builder b;
    memset(&b, 0, sizeof b);
    uint64_t n = 0;
    bool ok = out != NULL;
    if (ok && !bytes && len) { set_msg(msg, "no bytes given"); ok = false; }
    ok = ok && check_length(len, bytes, &n, msg) && parse_header(bytes + 8, (size_t)n, len - 8 - n, &b, msg);
    for (int i = 0; ok && i < b.f.n; i++) {
        st_tensor *t = &b.f.t[i];
        ok = alloc_data(t, msg);
        if (ok) copy_le4(t->data, bytes + 8 + n + b.begin[i], t->nbytes);
    }
    return finish(&b, ok, out, err, "safetensors", msg);
}

bool st_read(const char *path, st_file *out, tg_error *err) {
    char msg[TG_ERROR_LEN] = "no output file given";
    builder b;
    memset(&b, 0, sizeof b);
    unsigned char *h = NULL;
    bool ok = false;
    FILE *f = NULL;
    if (!path) { set_err(err, "st_read: no path"); if (out) memset(out, 0, sizeof *out); return false; }
    if (!out) goto done;
    /* Opened non-blocking and checked before reading, so that a FIFO or device cannot hang us. */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) { set_msg(msg, "cannot open: %s", strerror(errno)); goto done; }
    struct stat sb;
    if (fstat(fd, &sb) != 0) { set_msg(msg, "cannot stat: %s", strerror(errno)); close(fd); goto done; }
    if (!S_ISREG(sb.st_mode)) { set_msg(msg, "not a regular file"); close(fd); goto done; }
    f = fdopen(fd, "rb");
    if (!f) { set_msg(msg, "cannot open: %s", strerror(errno)); close(fd); goto done; }
    uint64_t total = (uint64_t)sb.st_size, n = 0;
    unsigned char pre[8] = { 0 };
    if (total >= 8 && fread(pre, 1, 8, f) != 8) { set_msg(msg, "cannot read the header length"); goto done; }
    if (!check_length(total, pre, &n, msg)) goto done;
    h = tg_alloc(n ? (size_t)n : 1);
    if (!h) { set_msg(msg, "out of memory for the header (%" PRIu64 " bytes)", n); goto done; }
    if (fread(h, 1, (size_t)n, f) != (size_t)n) { set_msg(msg, "unexpected end of file in the header"); goto done; }
    if (!parse_header(h, (size_t)n, total - 8 - n, &b, msg)) goto done;
    for (int i = 0; i < b.f.n; i++) {
        st_tensor *t = &b.f.t[i];
        if (!alloc_data(t, msg)) goto done;
        if (!t->nbytes) continue;
        if (fseeko(f, (off_t)(8 + n + b.begin[i]), SEEK_SET) != 0 || fread(t->data, 1, t->nbytes, f) != t->nbytes) {
            set_msg(msg, "unexpected end of file in the data of tensor '%.80s'", t->name);
            goto done;
        }
        if (!host_is_le()) copy_le4(t->data, t->data, t->nbytes);   /* in place: each element read before written */
    }
    ok = true;
done:
    free(h);
    if (f) fclose(f);
    return finish(&b, ok, out, err, path, msg);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

const char *st_meta(const st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_vals[i];
    return NULL;
}

void st_free(st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) { free(f->t[i].name); free(f->t[i].data); }
    for (int i = 0; i < f->n_meta; i++) { free(f->meta_keys[i]); free(f->meta_vals[i]); }
    free(f->t);
    free(f->meta_keys);
    free(f->meta_vals);
    memset(f, 0, sizeof *f);
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

/* The header being written; when memory runs out it stops growing and sets oom. */
typedef struct { char *s; size_t n, cap; bool oom; } sbuf;

static void sb_add(sbuf *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *s = tg_realloc(b->s, cap);
        if (!s) { b->oom = true; return; }
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_cstr(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v) {
    char t[24];
    snprintf(t, sizeof t, "%" PRIu64, v);
    sb_cstr(b, t);
}

/* A JSON string as serde_json writes it: '"' and '\' escaped, control characters as \b \t \n
 * \f \r or \u00xx, everything else (UTF-8 included) as is. */
static void sb_json(sbuf *b, const char *s) {
    sb_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '"': sb_add(b, "\\\"", 2); break;
        case '\\': sb_add(b, "\\\\", 2); break;
        case '\b': sb_add(b, "\\b", 2); break;
        case '\t': sb_add(b, "\\t", 2); break;
        case '\n': sb_add(b, "\\n", 2); break;
        case '\f': sb_add(b, "\\f", 2); break;
        case '\r': sb_add(b, "\\r", 2); break;
        default:
            if (*p < 0x20) { snprintf(e, sizeof e, "\\u%04x", *p); sb_add(b, e, 6); }
            else sb_add(b, p, 1);
        }
    }
    sb_add(b, "\"", 1);
}

/* Data order: F32 before I32 (the reference sorts by descending dtype), then by name. */
static int cmp_write_order(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->dtype != y->dtype) return x->dtype == TG_FLOAT32 ? -1 : 1;
    return strcmp(x->name, y->name);
}

typedef struct { const char *k, *v; } kv;
static int cmp_kv(const void *a, const void *b) { return strcmp(((const kv *)a)->k, ((const kv *)b)->k); }

/* The padded header into h and the tensors in data order into *order (malloc'd). */
static bool encode_header(const st_tensor *t, int n, const char *const *keys, const char *const *vals, int n_meta,
                          sbuf *h, const st_tensor ***order, uint64_t *data_len, char *msg) {
    if (n < 0 || n_meta < 0 || (n > 0 && !t) || (n_meta > 0 && (!keys || !vals))) {
        set_msg(msg, "bad arguments (n %d, n_meta %d)", n, n_meta);
        return false;
    }
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor *x = &t[i];
        char sh[160];
        if (!x->name) { set_msg(msg, "tensor %d has no name", i); return false; }
        if (!utf8_valid(x->name)) { set_msg(msg, "tensor %d: the name is not valid UTF-8", i); return false; }
        if (!strcmp(x->name, "__metadata__")) { set_msg(msg, "a tensor cannot be named \"__metadata__\""); return false; }
        if (x->dtype != TG_FLOAT32 && x->dtype != TG_INT32) {
            set_msg(msg, "tensor '%.80s': dtype %d is neither F32 nor I32", x->name, (int)x->dtype);
            return false;
        }
        if (x->shape.ndim < 0 || x->shape.ndim > TG_MAX_DIMS) {
            set_msg(msg, "tensor '%.80s': rank %d is outside 0..%d", x->name, x->shape.ndim, TG_MAX_DIMS);
            return false;
        }
        uint64_t numel = 1;
        for (int k = 0; k < x->shape.ndim; k++) {
            if (x->shape.d[k] < 0) { set_msg(msg, "tensor '%.80s': negative dimension", x->name); return false; }
            uint64_t d = (uint64_t)x->shape.d[k];
            if (d && numel > UINT64_MAX / d) { set_msg(msg, "tensor '%.80s': the shape overflows", x->name); return false; }
            numel *= d;
        }
        shape_fmt(&x->shape, sh, sizeof sh);
        if (numel > UINT64_MAX / 4 || numel * 4 != (uint64_t)x->nbytes) {
            set_msg(msg, "tensor '%.80s': nbytes %zu but shape %s needs %" PRIu64 " x 4", x->name, x->nbytes, sh, numel);
            return false;
        }
        if (x->nbytes && !x->data) { set_msg(msg, "tensor '%.80s': no data", x->name); return false; }
        if (total + x->nbytes < total) { set_msg(msg, "the tensors' total size overflows"); return false; }
        total += x->nbytes;
    }
    for (int i = 0; i < n_meta; i++) {
        if (!keys[i] || !vals[i]) { set_msg(msg, "metadata entry %d has no key or value", i); return false; }
        if (!utf8_valid(keys[i]) || !utf8_valid(vals[i])) {
            set_msg(msg, "metadata entry %d ('%.80s') is not valid UTF-8", i, keys[i]);
            return false;
        }
    }

    const char **names = tg_alloc(sizeof(char *) * (size_t)(n + 1));
    kv *meta = tg_alloc(sizeof *meta * (size_t)(n_meta + 1));
    const st_tensor **ord = tg_alloc(sizeof *ord * (size_t)(n + 1));
    if (!names || !meta || !ord) {
        set_msg(msg, "out of memory encoding the header of %d tensors", n);
        free(names);
        free(meta);
        free(ord);
        return false;
    }
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) {
            set_msg(msg, "duplicate tensor name '%.80s'", names[i]);
            free(names);
            free(meta);
            free(ord);
            return false;
        }
    free(names);
    for (int i = 0; i < n_meta; i++) meta[i] = (kv){ keys[i], vals[i] };
    qsort(meta, (size_t)n_meta, sizeof *meta, cmp_kv);
    for (int i = 1; i < n_meta; i++)
        if (!strcmp(meta[i - 1].k, meta[i].k)) {
            set_msg(msg, "duplicate metadata key '%.80s'", meta[i].k);
            free(meta);
            free(ord);
            return false;
        }

    for (int i = 0; i < n; i++) ord[i] = &t[i];
    qsort(ord, (size_t)n, sizeof *ord, cmp_write_order);

    sb_add(h, "{", 1);
    if (n_meta > 0) {
        sb_cstr(h, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i) sb_add(h, ",", 1);
            sb_json(h, meta[i].k);
            sb_add(h, ":", 1);
            sb_json(h, meta[i].v);
        }
        sb_cstr(h, n > 0 ? "}," : "}");
    }
    free(meta);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor *x = ord[i];
        if (i) sb_add(h, ",", 1);
        sb_json(h, x->name);
        sb_cstr(h, x->dtype == TG_FLOAT32 ? ":{\"dtype\":\"F32\",\"shape\":[" : ":{\"dtype\":\"I32\",\"shape\":[");
        for (int k = 0; k < x->shape.ndim; k++) {
            if (k) sb_add(h, ",", 1);
            sb_u64(h, (uint64_t)x->shape.d[k]);
        }
        sb_cstr(h, "],\"data_offsets\":[");
        sb_u64(h, at);
        sb_add(h, ",", 1);
        sb_u64(h, at + x->nbytes);
        sb_cstr(h, "]}");
        at += x->nbytes;
    }
    sb_add(h, "}", 1);
    while (h->n % 8 && !h->oom) sb_add(h, " ", 1);
    if (h->oom) {
        set_msg(msg, "out of memory encoding the header");
        free(ord);
        return false;
    }
    if (h->n > ST_MAX_HEADER) {
        set_msg(msg, "the header would take %zu bytes, over the limit of %u", h->n, ST_MAX_HEADER);
        free(ord);
        return false;
    }
    *order = ord;
    *data_len = total;
    return true;
}

bool st_encode(const st_tensor *t, int n, const char *const *meta_keys, const char *const *meta_vals, int n_meta,
               unsigned char **out, size_t *len, tg_error *err) {
    char msg[TG_ERROR_LEN] = "";
    sbuf h = { 0 };
    const st_tensor **order = NULL;
    uint64_t data_len = 0;
    if (!out || !len) { set_err(err, "st_encode: no output given"); return false; }
    *out = NULL;
    *len = 0;
    if (!encode_header(t, n, meta_keys, meta_vals, n_meta, &h, &order, &data_len, msg)) {
        free(h.s);
        set_err(err, "safetensors: %s", msg);
        return false;
    }
    unsigned char *buf = NULL;
    if (data_len <= SIZE_MAX - 8 - h.n) buf = tg_alloc((size_t)(8 + h.n + data_len));
    if (!buf) {
        set_err(err, "safetensors: out of memory for %" PRIu64 " bytes", (uint64_t)(8 + h.n) + data_len);
        free(h.s);
        free(order);
        return false;
    }
    put_le64(buf, h.n);
    memcpy(buf + 8, h.s, h.n);
    size_t at = 8 + h.n;
    for (int i = 0; i < n; i++) {
        copy_le4(buf + at, order[i]->data, order[i]->nbytes);
        at += order[i]->nbytes;
    }
    free(h.s);
    free(order);
    *out = buf;
    *len = at;
    return true;
}

/* fwrite of 4-byte elements in little-endian order. */
static bool write_le4(FILE *f, const void *data, size_t nbytes) {
    if (!nbytes) return true;
    if (host_is_le()) return fwrite(data, 1, nbytes, f) == nbytes;
    unsigned char tmp[4096];
    for (size_t at = 0; at < nbytes; at += sizeof tmp) {
        size_t k = nbytes - at < sizeof tmp ? nbytes - at : sizeof tmp;
        copy_le4(tmp, (const unsigned char *)data + at, k);
        if (fwrite(tmp, 1, k, f) != k) return false;
    }
    return true;
}

bool st_write(const char *path, const st_tensor *t, int n, const char *const *meta_keys, const char *const *meta_vals,
              int n_meta, tg_error *err) {
    char msg[TG_ERROR_LEN] = "";
    sbuf h = { 0 };
    const st_tensor **order = NULL;
    uint64_t data_len = 0;
    if (!path) { set_err(err, "st_write: no path"); return false; }
    if (!encode_header(t, n, meta_keys, meta_vals, n_meta, &h, &order, &data_len, msg)) {
        free(h.s);
        set_err(err, "%s: %s", path, msg);
        return false;
    }
    size_t pl = strlen(path);
    char *tmp = tg_alloc(pl + 5);
    if (!tmp) {
        set_err(err, "%s: out of memory", path);
        free(h.s);
        free(order);
        return false;
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    bool ok = false;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        set_err(err, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    } else {
        unsigned char pre[8];
        put_le64(pre, h.n);
        errno = 0;
        ok = fwrite(pre, 1, 8, f) == 8 && fwrite(h.s, 1, h.n, f) == h.n;
        for (int i = 0; ok && i < n; i++) ok = write_le4(f, order[i]->data, order[i]->nbytes);
        ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
        int e = errno;
        if (fclose(f) != 0 && ok) { ok = false; e = errno; }
        if (!ok) set_err(err, "%s: writing %s failed: %s", path, tmp, e ? strerror(e) : "short write");
        else if (rename(tmp, path) != 0) {
            set_err(err, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
            ok = false;
        }
        if (!ok) remove(tmp);
    }
    free(tmp);
    free(h.s);
    free(order);
    return ok;
}
