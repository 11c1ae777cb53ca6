/* Small things every part uses: allocation that fails as a value (with fault injection for
 * tests), a growable string, error messages. */
#ifndef TG_UTIL_H
#define TG_UTIL_H

#include "tensorgrad.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable string; {0} is empty. When memory runs out it stops growing and sets oom (what was
 * written stays NUL-terminated, or s stays NULL); sb_take then frees it and gives NULL. */
typedef struct { char *s; size_t len, cap; bool oom; } strbuf;
void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *sb_take(strbuf *b);   /* the string, or NULL (freed) if memory ran out while building it */
static inline const char *sb_str(const strbuf *b) { return b->s ? b->s : ""; }   /* for "%s" */
/* Zero-filled allocation and realloc that return NULL when memory runs out (realloc then leaves
 * the block as it was); every caller turns NULL into an error value. tg_strdup too. */
void *tg_alloc(size_t n);
void *tg_realloc(void *p, size_t n);
char *tg_strdup(const char *s);
/* Test hook (fault injection): after the next `after` allocations through tg_alloc, tg_realloc,
 * tg_alloc_aligned64 and tg_strdup succeed, the `count` ones after them fail (count < 0: every
 * later one), until the hook is called again; after < 0 turns it off. tg__alloc_count:
 * allocations made so far (to size a sweep). */
void tg__fail_allocs(long after, long count);
long tg__alloc_count(void);
/* Allocations that failed on this thread so far. A generator that must not stop halfway (code
 * generation: it goes on with placeholders) compares the count before and after, and discards
 * its output if it grew. */
long alloc_failures(void);
void *tg_alloc_aligned64(size_t bytes);   /* 64-byte aligned, not zeroed, NULL on failure */
void tg_seterr(tg_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
