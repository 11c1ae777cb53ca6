/* Text: the growable string the code generators write into, and error messages. */
#include "util/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void sb_printf(strbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    if (!b->s) {
        b->s = tg_alloc(256);
        if (!b->s) { b->oom = true; return; }
        b->cap = 256;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (k >= 0 && b->len + (size_t)k < b->cap) { b->len += (size_t)k; return; }
        size_t cap = b->cap * 2 + (size_t)(k > 0 ? k : 0) + 256;
        char *grown = tg_realloc(b->s, cap);
        if (!grown) {   /* keep what was written, NUL-terminated, and stop appending */
            b->s[b->len] = 0;
            b->oom = true;
            return;
        }
        b->s = grown;
        b->cap = cap;
    }
}

char *sb_take(strbuf *b) {
    if (!b->oom) return b->s;
    free(b->s);
    return NULL;
}

void tg_seterr(tg_error *e, const char *fmt, ...) {
    if (!e) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}
