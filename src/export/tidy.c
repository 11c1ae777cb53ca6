/* The CPU generator's standalone output made fit for a file that must compile on its own with
 * `cc -std=c99 -Wall -Wextra -Werror`. The expression engine defines a temporary for every
 * coordinate of an index it unravels, whether or not the expression reads it (the library builds
 * its kernels without warnings, so they cost nothing there); here they would be unused
 * variables. Every definition in a generated function is `[const] TYPE name = pure expression`,
 * so one that nothing reads can go, and the definitions it alone read after it, until none is
 * left; so do the prelude's helpers that no kernel calls (clang warns about unused static
 * functions). OpenMP pragmas are dropped unless the export keeps them (an unknown pragma is a
 * warning too). Line-based: the generator writes one statement per line. */
#include "export/export.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *s;       /* owned, without the newline */
    bool gone;
} line;

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Occurrences of the whole word name[0..n) in the lines [lo, hi) still present (2, as good as
 * many, for a name too long to look for). */
static int uses(const line *L, int lo, int hi, const char *name, size_t n) {
    char word[64];
    if (n >= sizeof word) return 2;
    memcpy(word, name, n);
    word[n] = 0;
    int count = 0;
    for (int i = lo; i < hi; i++) {
        if (L[i].gone) continue;
        for (const char *p = strstr(L[i].s, word); p; p = strstr(p + 1, word))
            count += (p == L[i].s || !ident_char(p[-1])) && !ident_char(p[n]);
    }
    return count;
}

#define MAX_DECLS 16

/* One declarator "name = expr" (or "*restrict name = expr") of a definition line: its text and
 * its name, as offsets into the line. */
typedef struct { size_t at, len, name, name_len; } declarator;

/* Does line s define variables: indent, optional "const ", one of the generator's types, then
 * declarators separated by commas outside parentheses, and a final ';'? Returns how many (0: not
 * such a line), with *head the length of everything before the first declarator. */
static int parse_definition(const char *s, size_t *head, declarator *d) {
    static const char *const types[] = { "float ", "double ", "int32_t ", "int64_t ", "uint32_t " };
    const char *p = s;
    while (*p == ' ') p++;
    if (strncmp(p, "const ", 6) == 0) p += 6;
    size_t t = 0;
    while (t < sizeof types / sizeof types[0] && strncmp(p, types[t], strlen(types[t])) != 0) t++;
    if (t == sizeof types / sizeof types[0]) return 0;
    p += strlen(types[t]);
    *head = (size_t)(p - s);
    for (int n = 0; n < MAX_DECLS; n++) {
        d[n].at = (size_t)(p - s);
        if (strncmp(p, "*restrict ", 10) == 0) p += 10;
        if (!isalpha((unsigned char)*p) && *p != '_') return 0;
        d[n].name = (size_t)(p - s);
        while (ident_char(*p)) p++;
        d[n].name_len = (size_t)(p - s) - d[n].name;
        if (strncmp(p, " = ", 3) != 0) return 0;
        int depth = 0;   /* the expression runs to a ',' or ';' outside parentheses and brackets */
        for (; *p && !(depth == 0 && (*p == ',' || *p == ';')); p++) {
            if (*p == '(' || *p == '[' || *p == '{') depth++;
            if (*p == ')' || *p == ']' || *p == '}') depth--;
        }
        if (!*p) return 0;
        d[n].len = (size_t)(p - s) - d[n].at;
        if (*p == ';') return p[1] == 0 ? n + 1 : 0;
        p++;
        while (*p == ' ') p++;
    }
    return 0;
}

/* Drops the declarators of line l that nothing in the function [lo, hi) reads; the line goes
 * when none is left. False when memory runs out. */
static bool prune_line(line *L, int l, int lo, int hi, bool *changed) {
    declarator d[MAX_DECLS];
    size_t head;
    int n = parse_definition(L[l].s, &head, d);
    bool keep[MAX_DECLS];
    int kept = 0;
    for (int k = 0; k < n; k++) {
        keep[k] = uses(L, lo, hi, L[l].s + d[k].name, d[k].name_len) > 1;
        kept += keep[k];
    }
    if (kept == n) return true;
    *changed = true;
    if (kept == 0) {
        L[l].gone = true;
        return true;
    }
    size_t len = head + strlen(L[l].s) + 2;
    char *s = tg_alloc(len), *w = s;
    if (!s) return false;
    memcpy(w, L[l].s, head);
    w += head;
    for (int k = 0, first = 1; k < n; k++) {
        if (!keep[k]) continue;
        if (!first) {
            memcpy(w, ", ", 2);
            w += 2;
        }
        memcpy(w, L[l].s + d[k].at, d[k].len);
        w += d[k].len;
        first = 0;
    }
    strcpy(w, ";");
    free(L[l].s);
    L[l].s = s;
    return true;
}

/* Prunes the generated function on lines [lo, hi) until nothing more goes. */
static bool prune_function(line *L, int lo, int hi) {
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = lo; i < hi; i++)
            if (!L[i].gone && !prune_line(L, i, lo, hi, &changed)) return false;
    }
    return true;
}

/* Occurrences of the whole word `name` in the lines outside [lo, hi) still present. */
static int uses_outside(const line *L, int n, int lo, int hi, const char *name) {
    size_t len = strlen(name);
    return uses(L, 0, lo, name, len) + uses(L, hi, n, name, len);
}

/* Drops the prelude's helpers ("static inline T name(...)", to the end of the line or to a line
 * "}") that nothing else calls, until none is left (one helper may be all that calls another):
 * some compilers warn about unused static functions of a main file. False when memory runs out. */
static bool prune_helpers(line *L, int n) {
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < n; i++) {
            if (L[i].gone || strncmp(L[i].s, "static inline ", 14) != 0) continue;
            const char *paren = strchr(L[i].s, '('), *p = paren;
            while (p && p > L[i].s && ident_char(p[-1])) p--;
            if (!paren || p == paren || (size_t)(paren - p) >= 64) continue;
            char name[64];
            memcpy(name, p, (size_t)(paren - p));
            name[paren - p] = 0;
            int end = i;   /* the helper's last line */
            size_t len = strlen(L[i].s);
            if (len == 0 || L[i].s[len - 1] != '}')
                while (end + 1 < n && strcmp(L[end].s, "}") != 0) end++;
            if (uses_outside(L, n, i, end + 1, name) > 0) continue;
            for (int k = i; k <= end; k++) L[k].gone = true;
            changed = true;
        }
    }
    return true;
}

static int split_lines(const char *src, line **out) {
    int n = 1;
    for (const char *p = src; *p; p++) n += *p == '\n';
    line *L = tg_alloc(sizeof(line) * (size_t)n);
    if (!L) return -1;
    int k = 0;
    for (const char *p = src; k < n; k++) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        L[k].s = tg_alloc(len + 1);
        if (!L[k].s) {
            for (int j = 0; j < k; j++) free(L[j].s);
            free(L);
            return -1;
        }
        memcpy(L[k].s, p, len);
        p += len + (e ? 1 : 0);
    }
    *out = L;
    return n;
}

static bool is_omp_pragma(const char *s) {
    while (*s == ' ') s++;
    return strncmp(s, "#pragma omp", 11) == 0;
}

char *export_tidy(const char *source, bool keep_omp) {
    line *L;
    int n = split_lines(source, &L);
    if (n < 0) return NULL;
    bool ok = true;
    for (int i = 0; i < n; i++) L[i].gone = !keep_omp && is_omp_pragma(L[i].s);
    /* Generated functions (kernels, the entry) run from "static void ..." to a line "}"; the
     * prelude's helpers are "static inline", and go whole or stay. */
    for (int i = 0; ok && i < n; i++) {
        if (strncmp(L[i].s, "static void ", 12) != 0) continue;
        int end = i + 1;
        while (end < n && strcmp(L[end].s, "}") != 0) end++;
        ok = prune_function(L, i + 1, end);
        i = end;
    }
    ok = ok && prune_helpers(L, n);
    strbuf out = { 0 };
    for (int i = 0; i < n; i++) {
        if (ok && !L[i].gone) sb_printf(&out, "%s%s", L[i].s, i + 1 < n ? "\n" : "");
        free(L[i].s);
    }
    free(L);
    if (!ok) {
        free(out.s);
        return NULL;
    }
    return sb_take(&out);
}
