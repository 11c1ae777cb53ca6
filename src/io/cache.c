/* The on-disk kernel cache shared by the compiled backends: one directory, files named by a hash
 * of what produced them, written atomically so a reader never sees half a file. */
#include "io/cache.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t cache_hash(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

bool cache_dir(char *dir, size_t len, tg_error *err) {
    const char *env = getenv("TG_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && env[0]) snprintf(dir, len, "%s", env);
    else if (xdg && xdg[0]) snprintf(dir, len, "%s/tensorgrad", xdg);
    else snprintf(dir, len, "%s/.cache/tensorgrad", home && home[0] ? home : "/tmp");
    for (char *p = dir + 1; *p; p++) {   /* mkdir -p */
        if (*p != '/') continue;
        *p = 0;
        mkdir(dir, 0755);
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        tg_seterr(err, "cannot create the kernel cache directory %s: %s", dir, strerror(errno));
        return false;
    }
    return true;
}

/* A temporary name beside path, unique to this process and call: threads of one process may
 * write the same entry at once. */
void cache_tmp_name(char *tmp, size_t len, const char *path) {
    static _Atomic unsigned counter;
    snprintf(tmp, len, "%s.tmp.%d.%u", path, (int)getpid(), atomic_fetch_add(&counter, 1));
}

bool cache_write(const char *path, const void *data, size_t len, tg_error *err) {
    char tmp[1100];
    cache_tmp_name(tmp, sizeof tmp, path);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(data, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        tg_seterr(err, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    return ok;
}

void *cache_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *data = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n > 0 && fseek(f, 0, SEEK_SET) == 0) {
        data = tg_alloc((size_t)n);
        if (data && fread(data, 1, (size_t)n, f) != (size_t)n) {
            free(data);
            data = NULL;
        }
    }
    fclose(f);
    *len = data ? (size_t)n : 0;
    return data;
}
