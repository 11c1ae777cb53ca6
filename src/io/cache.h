/* The on-disk kernel cache of the compiled backends. */
#ifndef TG_CACHE_H
#define TG_CACHE_H

#include "util/util.h"

/* cache.c: the on-disk kernel cache: $TG_CACHE_DIR, else $XDG_CACHE_HOME/tensorgrad, else
 * ~/.cache/tensorgrad (created); atomic writes; whole-file reads (NULL if absent). */
uint64_t cache_hash(uint64_t h, const void *data, size_t len);   /* FNV-1a; start h at 1469598103934665603 */
bool cache_dir(char *dir, size_t len, tg_error *err);
bool cache_write(const char *path, const void *data, size_t len, tg_error *err);
void cache_tmp_name(char *tmp, size_t len, const char *path);
void *cache_read(const char *path, size_t *len);

#endif
