/* safetensors files (the format PyTorch / Hugging Face tools read and write): an 8-byte
 * little-endian u64 N, N bytes of JSON header, then the raw little-endian tensor bytes:
 *
 *   {"__metadata__":{"key":"value"},"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}
 *
 * data_offsets are [begin, end) byte offsets into the data section (which starts right after
 * the header). Internal API, nothing here is public.
 *
 * Writing: F32 and I32 tensors and string metadata. The layout is the reference writer's
 * (huggingface/safetensors): tensors in data order F32 first, then I32, each group sorted by
 * name (bytewise); "__metadata__" first in the header with its keys sorted (bytewise; the
 * reference uses hash order); compact JSON escaped as serde_json does; the header padded with
 * spaces to a multiple of 8 so the data starts 8-byte aligned. With no metadata the
 * "__metadata__" entry is left out. For the same tensors (and at most one metadata key) the
 * bytes are identical to Python's safetensors save_file.
 *
 * Reading is strict and never trusts the file: every failure is an error message, never a
 * crash, hang or out-of-bounds read. Validated:
 *   - the file holds at least the 8-byte length; N <= 100,000,000 (the reference's limit) and
 *     N <= file size - 8;
 *   - the header starts with '{' (as the spec requires) and is exactly one JSON object followed
 *     only by JSON whitespace (the padding); JSON syntax is checked strictly (string escapes
 *     including \uXXXX surrogate pairs, no raw control characters, valid UTF-8, integers
 *     without leading zeros, signs, fractions or exponents); no nesting beyond the format's
 *     fixed shape (parsing is not recursive);
 *   - each tensor entry is an object with exactly the keys "dtype", "shape" and "data_offsets",
 *     each once; shape is an array of at most TG_MAX_DIMS (6) non-negative integers below
 *     2^63; data_offsets is an array of two integers, begin <= end <= the data section size;
 *   - end - begin == product(shape) * dtype size, with overflow checked;
 *   - the tensors, ordered by (begin, end), cover the data section exactly: no overlap, no gap,
 *     no trailing bytes (as the reference's validate());
 *   - no duplicate tensor names, no duplicate keys anywhere; "__metadata__" is an object of
 *     string values (or null);
 *   - names, keys and values contain no NUL character (they become C strings).
 * Dtypes: F32 and I32 are read. Any other dtype, known to the spec (F16, BF16, F64, I64, ...)
 * or not, fails the whole read at parse time with an error naming the tensor and the dtype
 * ("tensor 'w': dtype F16 is not supported (only F32 and I32)"): a file is loaded whole or not
 * at all.
 *
 * Each tensor's data is its own allocation (so suitably aligned for float / int32_t access),
 * converted to host byte order. */
#ifndef TG_IO_H
#define TG_IO_H

#include "tensorgrad.h"
#include <stdbool.h>
#include <stddef.h>

#define ST_MAX_HEADER 100000000u

typedef struct {
    char *name;
    tg_dtype dtype;      /* TG_FLOAT32 ("F32") or TG_INT32 ("I32") */
    tg_shape shape;
    void *data;          /* nbytes bytes, host byte order */
    size_t nbytes;       /* numel(shape) * 4 */
} st_tensor;

typedef struct {
    st_tensor *t;        /* in the order of the header */
    int n;
    char **meta_keys, **meta_vals;   /* in the order of the header */
    int n_meta;
} st_file;

/* Serialize to memory: *out (malloc'd, free with free()) and *len. false with err on invalid
 * input (dtype other than F32/I32, bad shape, nbytes != numel * 4, NULL data with nbytes > 0,
 * duplicate or invalid UTF-8 names or metadata keys, a tensor named "__metadata__"). */
bool st_encode(const st_tensor *t, int n, const char *const *meta_keys, const char *const *meta_vals,
               int n_meta, unsigned char **out, size_t *len, tg_error *err);
/* Write to a file atomically: to "path.tmp", flushed and fsync'd, then renamed over path. On
 * failure path is untouched and the temporary file removed. */
bool st_write(const char *path, const st_tensor *t, int n, const char *const *meta_keys,
              const char *const *meta_vals, int n_meta, tg_error *err);
/* Read and validate a whole file. On failure *out is empty ({0}) and err says why (prefixed
 * with the path). Only regular files are read (a FIFO or device is refused without blocking);
 * the header first, then each tensor's bytes straight into its own buffer. */
bool st_read(const char *path, st_file *out, tg_error *err);
/* The same from a buffer in memory (len bytes, the whole file). */
bool st_parse(const unsigned char *bytes, size_t len, st_file *out, tg_error *err);
/* Lookups: NULL when absent. */
const st_tensor *st_find(const st_file *f, const char *name);
const char *st_meta(const st_file *f, const char *key);
/* Frees everything st_read/st_parse allocated and zeroes *f (safe on a zeroed or freed file). */
void st_free(st_file *f);

#endif
