/* What the library kernel files share: cpu_kernels.c (row kernels, per-thread scratch, the table
 * generated code calls), cpu_gemm.c (the product: packing, blocking, threads, the OpenBLAS path)
 * and cpu_gemm_x86.c (the product's AVX2 and AVX-512 register tiles). Not part of the backend's
 * interface (that is cpu.h). */
#ifndef TG_CPU_KERNELS_H
#define TG_CPU_KERNELS_H

#include "cpu/cpu.h"

#include <stddef.h>
#include <stdint.h>

/* Rows are spread over threads only when there is enough work to pay for waking them (a fork
 * and join costs about 3 us): PARALLEL_WORK elements for row-wise kernels. */
#define PARALLEL_WORK 32768

/* The x86-64 vector paths (AVX2 + FMA, AVX-512), compiled with target attributes. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_X86 1
#define TARGET_AVX2 __attribute__((target("avx2,fma,avx")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma,avx2,avx")))
#define TARGET_AVX512_BF16 __attribute__((target("avx512bf16,avx512f,avx512dq,avx512vl,avx512bw,fma,avx2,avx")))
#endif

/* ----- per-thread scratch (cpu_kernels.c) ----- */

/* At least n floats of this thread's scratch, 64-byte aligned, kept for the thread's life; NULL
 * when out of memory, which is then recorded (kernel_failed). */
float *kernel_scratch(size_t n);
/* The same for a product's packing buffers (a second buffer: a convolution's backward holds its
 * cols in scratch while the product packs); NULL is not recorded (the caller has a fallback). */
float *kernel_pack(size_t n);
/* A third: an operand packed once for every thread of a product to read (NULL: not recorded). */
float *kernel_panels(size_t n);
/* A fourth: one image of a convolution with its zero border (NULL: not recorded; the caller
 * has a fallback). */
float *kernel_image(size_t n);
/* Record that a kernel left its output wrong for want of memory (see TGK_FAILED). */
void kernel_failed(void);

/* One image's col2im: img [C, H, W] = the adjoint of im2col applied to cols [C*kh*kw, ho*wo]. */
void col2im_image(const float *cols, float *img, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t s,
                  int64_t pad);

/* ----- the product (cpu_gemm.c) ----- */

/* An operand read through im2col (the cols matrix [C*kh*kw, ho*wo] of one image x [C, H, W]),
 * never materialized: products pack it straight from the image. */
typedef struct {
    const float *x;
    int64_t C, H, W, kh, kw, s, pad, ho, wo;
} im2col_view;

/* Elements [j0, j0 + n) of row r of the cols matrix into dst. */
void im2col_segment(const im2col_view *v, int64_t r, int64_t j0, int64_t n, float *dst);

/* TGK_MATMUL (arguments in cpu_gemm.c). */
void k_matmul(const int64_t *a, void *const *p);
/* One product on the calling thread, at the run's ISA: C (+ when acc)= op(A) op(B), op(A) [M, K],
 * op(B) [K, N], row-major with row strides lda, ldb (as stored) and ldc (the attention kernels'
 * per-head products). */
void kernel_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                 float *C, int64_t ldc, int acc);

/* One instruction set's part of the packed product: the register tile's size, the cache blocks
 * sized for it, the tile itself and the few row helpers the driver needs. The driver and the
 * packing (cpu_gemm.c) are the same for every ISA. */
typedef struct {
    int mr, nr;        /* register tile: rows (A panel height), columns (B panel width) */
    int kc, mc, nc;    /* depth of a packed block, rows of a packed A block, columns of a packed B block */
    /* C[mr, nr] (+)= A panel (kc x MR, k-major) times B panel (kc x NR, k-major); unless acc, a
     * bias per row (brow[0..mr)) or per column (bcol[0..nr)) is added. mr <= MR, nr <= NR. */
    void (*tile)(int64_t kc, const float *ap, const float *bp, float *C, int64_t ldc, int64_t mr, int64_t nr, int acc,
                 const float *brow, const float *bcol);
    /* im2col_segment, as fast as this ISA makes it. */
    void (*segment)(const im2col_view *v, int64_t r, int64_t j0, int64_t n, float *dst);
    /* y[0..n) = y0[0..n) (or c0 everywhere when y0 is NULL) + a x[0..n); y0 may be y. */
    void (*axpy)(float *y, const float *y0, float c0, float a, const float *x, int64_t n);
    float (*dot)(const float *a, const float *b, int64_t n);
    /* NULL for f32 tiles. For a tile of bf16 operands: packed panels of width w (kc x w each,
     * covering n rows or columns) rounded to bf16 in place, depth paired (pair_panels in
     * cpu_gemm_x86.c); the tile then reads pairs, and skinny products go through it too. */
    void (*pairs)(float *panels, int64_t kc, int64_t n, int w);
} gemm_kernel;

#define GEMM_MR_MAX 8
#define GEMM_NR_MAX 32
#define GEMM_KC_MAX 512

#ifdef CPU_X86
extern const gemm_kernel gemm_kernel_avx2, gemm_kernel_avx512, gemm_kernel_avx512_bf16;   /* cpu_gemm_x86.c */
#endif

#endif
