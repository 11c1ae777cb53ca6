"""Edited copies of a harness (attention.py's output) to time with harness.cu on the GPU machine:
    python3 variants.py v.cu OUTDIR       # writes OUTDIR/NAME.cu and OUTDIR/NAME.flags per variant
(a tf32 harness gets the variants of V_TF32, below; a bf16 one these; b6, b7, b10 and bbulk edit dq
as the kernels added it before the thirtieth session, with atomics, and are left out of a later
dump, whose b0 is bbulk:)
b0/f0 as generated; b1 the backward at three blocks an SM (__launch_bounds__(128, 3)); b2 the
backward's k and v fragments read from shared memory at each query tile (ldmatrix) instead of
held in registers (a tile of v staged beside k's); b3 delta = d_out . out computed by a kernel of
its own before the backward (FlashAttention-2's and cuDNN's way) instead of by every key tile's
block; b4 = b2 + b3 at three blocks an SM; b5 = b2 at three blocks an SM; b6 dq's atomics as
plain stores, b7 no dq at all, b8 no memset zeroing dq before (all three wrong in dq: what each costs);
b10 dq deterministic: each query tile's key blocks add their share in turn (the diagonal's
first, key tile 0's last), ordered by a counter (no memset before: the first one stores); bbulk
dq by the copy engine's bulk reductions, a row a lane (cp.reduce.async.bulk, sm_90); f1 the
forward at three blocks an SM (it spills at four).
The flags are the launch sizes nvcc needs (-D's: shared memory, tiles, threads)."""
import os, re, sys

src, out = open(sys.argv[1]).read(), sys.argv[2]
os.makedirs(out, exist_ok=True)
TF32 = '#define TF32 1' in src   # a tf32 harness: its own shared-memory sizes and variants (V_TF32)
BASE = dict(FWD_SMEM=69632 if TF32 else 36864, FWD_TILES=4, FWD_THREADS=128, BWD_SMEM=105984 if TF32 else 64992, BWD_TILES=4,
            BWD_THREADS=128)

def sub(text, old, new, count=1):
    assert text.count(old) >= 1, old
    return text.replace(old, new, count)

def bounds(text, which, n):
    name = re.search(r'void (?:__launch_bounds__\([^)]*\) )?(attn_%s\w*)\(' % which, text)
    return text.replace(name.group(0), 'void __launch_bounds__(128, %d) %s(' % (n, name.group(1)))

# b2: k's and v's fragments from shared memory (v staged beside k once per block)
AFRAGS = r'''
/* A fragments (bf16) of rows [r0, r0 + 16) of a tile in shared memory (ld apart) by ldmatrix */
template <int W>
static __device__ void tgm_afrags_sm(unsigned (*a)[4], const unsigned short *s, int ld, int r0) {
    const int lane = threadIdx.x & 31, row = r0 + (lane & 7) + 8 * ((lane >> 3) & 1), col = 8 * (lane >> 4);
#pragma unroll
    for (int ks = 0; ks < W / 16; ks++) {
        const unsigned p = (unsigned)__cvta_generic_to_shared(s + row * ld + 16 * ks + col);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(a[ks][0]), "=r"(a[ks][1]), "=r"(a[ks][2]), "=r"(a[ks][3]) : "r"(p));
    }
}
'''

def frags_in_shared(t):
    t = sub(t, 'template <class M, int T, int S, int D, int E, bool CAUSAL, int OH, int H>\nstatic __device__ void tgk_attention_bwd_mma',
            AFRAGS + 'template <class M, int T, int S, int D, int E, bool CAUSAL, int OH, int H>\nstatic __device__ void tgk_attention_bwd_mma')
    t = sub(t, '    float *Ds = (float *)(Ks + 64 * LK);', '    X *Vk = Ks + 64 * LK;\n    float *Ds = (float *)(Vk + 64 * LV);')
    t = sub(t, '    unsigned ka[D / M::KS][4], va[E / M::KS][4];\n    tgm_frags<M, D, H * D>(ka, k, cw, S, g, t);\n    tgm_frags<M, E, H * E>(va, v, cw, S, g, t);\n', '')
    t = sub(t, '    tgm_tile<X, D, LK, H * D>(Ks, k, c0, S);\n', '    tgm_tile<X, D, LK, H * D>(Ks, k, c0, S);\n    tgm_tile<X, E, LV, H * E>(Vk, v, c0, S);\n')
    t = sub(t, '        tgm_gemm<M, D, 64>(st_, ka, Qs, LK);\n        tgm_gemm<M, E, 64>(dpt, va, Gs, LV);\n',
            '        {\n            unsigned ka[D / 16][4];\n            tgm_afrags_sm<D>(ka, Ks, LK, 16 * w);\n            tgm_gemm<M, D, 64>(st_, ka, Qs, LK);\n        }\n'
            '        {\n            unsigned va[E / 16][4];\n            tgm_afrags_sm<E>(va, Vk, LV, 16 * w);\n            tgm_gemm<M, E, 64>(dpt, va, Gs, LV);\n        }\n')
    return t

DELTA_OLD = '''            const int r = threadIdx.x >> 1, part = threadIdx.x & 1;
            float dsum = 0.0f;
            if (r0 + r < T)
                for (int e = 4 * part; e < E; e += 8) {
                    const float4 x = *(const float4 *)(o + (long long)(r0 + r) * OH * E + e);
                    const X *y = Gs + r * LV + e;
                    dsum += M::value(y[0]) * x.x + M::value(y[1]) * x.y + M::value(y[2]) * x.z + M::value(y[3]) * x.w;
                }
            dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
            if (part == 0) { Dl[r] = dsum; Ls[r] = r0 + r < T ? lse[r0 + r] * LOG2E : 0.0f; }
'''
DELTA_NEW = '''            const int r = threadIdx.x;
            if (r < 64) { Dl[r] = r0 + r < T ? g_delta[b * T + r0 + r] : 0.0f; Ls[r] = r0 + r < T ? lse[r0 + r] * LOG2E : 0.0f; }
'''
# the harness's layout: row (b, t) of head b % NH at ((b / NH * T + t) * NH + b % NH) * D; 8 threads a row
DELTA_KERNEL = r'''
__device__ float g_delta[64 * 6 * 256];
__global__ void __launch_bounds__(256) tg_delta(const float *o, const unsigned short *g) {
    const int i = blockIdx.x * 32 + threadIdx.x / 8, part = threadIdx.x % 8, b = i / 256, t = i % 256;
    const long long at = ((long long)(b / 6 * 256 + t) * 6 + b % 6) * 64 + 8 * part;
    const float4 x0 = *(const float4 *)(o + at), x1 = *(const float4 *)(o + at + 4);
    const uint4 y = *(const uint4 *)(g + at);
    auto lo = [](unsigned u) { return __uint_as_float(u << 16); };
    auto hi = [](unsigned u) { return __uint_as_float(u & 0xffff0000u); };
    float s = lo(y.x) * x0.x + hi(y.x) * x0.y + lo(y.y) * x0.z + hi(y.y) * x0.w + lo(y.z) * x1.x + hi(y.z) * x1.y + lo(y.w) * x1.z + hi(y.w) * x1.w;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    if (part == 0) g_delta[i] = s;
}
'''

def delta_apart(t):
    t = sub(t, 'template <class M, int T, int S, int D, int E, bool CAUSAL, int OH, int H>\nstatic __device__ void tgk_attention_bwd_mma',
            DELTA_KERNEL + 'template <class M, int T, int S, int D, int E, bool CAUSAL, int OH, int H>\nstatic __device__ void tgk_attention_bwd_mma')
    t = sub(t, DELTA_OLD, DELTA_NEW)
    return t.replace('#include "harness.cu"', '#define BWD_PRE tg_delta<<<64 * 6 * 256 / 32, 256>>>(A + o, (const unsigned short *)(A + g));\n#include "harness.cu"')

ATOMICS = """#pragma unroll
        for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
            for (int h = 0; h < 4; h += 2) {   /* a pair of columns a lane: one 8-byte atomic from sm_90 on */
                const int r = r0 + 16 * w + g + 4 * h, d = nd * 8 + 2 * t;
                if (!dq || r >= T) continue;
#if __CUDA_ARCH__ >= 900
                atomicAdd((float2 *)(dq + (long long)r * H * D + d), make_float2(dqa[nd][h], dqa[nd][h + 1]));
#else
                atomicAdd(dq + (long long)r * H * D + d, dqa[nd][h]);
                atomicAdd(dq + (long long)r * H * D + d + 1, dqa[nd][h + 1]);
#endif
            }
"""
IN_TURN = """        {   /* key tiles after this one add their share first; the first stores */
            const int j = c0 / 64, before = CAUSAL ? r0 / 64 - j : TILES - 1 - j;
            unsigned *sem = g_sem + b * ((T + 63) / 64) + r0 / 64;
            if (threadIdx.x == 0 && before > 0) {
                while (*(volatile unsigned *)sem != (unsigned)before) __nanosleep(64);
                __threadfence();
            }
            __syncthreads();
#pragma unroll
            for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
                for (int h = 0; h < 4; h += 2) {
                    const int r = r0 + 16 * w + g + 4 * h, d = nd * 8 + 2 * t;
                    if (!dq || r >= T) continue;
                    float2 *p = (float2 *)(dq + (long long)r * H * D + d);
                    float2 v = make_float2(dqa[nd][h], dqa[nd][h + 1]);
                    if (before > 0) { const float2 o = __ldcg(p); v.x = o.x + v.x; v.y = o.y + v.y; }
                    __stcg(p, v);
                }
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) *(volatile unsigned *)sem = j == 0 ? 0u : (unsigned)before + 1;
        }
"""

BULK = r"""        {   /* dq's share: each warp's 16 rows into its own rows of Ds (read by its dq product, done), then a bulk
             * reduction a row by the copy engine (sm_90) in place of 16 atomics a lane */
            float *Dw = Ds + 16 * w * LS;
            __syncwarp();
#pragma unroll
            for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
                for (int h = 0; h < 4; h += 2) *(float2 *)(Dw + (g + 4 * h) * LS + nd * 8 + 2 * t) = make_float2(dqa[nd][h], dqa[nd][h + 1]);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            const int lane = threadIdx.x & 31, r = r0 + 16 * w + lane;
            if (lane < 16 && dq && r < T) {
                const unsigned from = (unsigned)__cvta_generic_to_shared(Dw + lane * LS);
                asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                             :: "l"(dq + (long long)r * H * D), "r"(from), "r"(D * 4) : "memory");
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            }
            __syncwarp();
        }
"""

def bulk(t):
    t = sub(t, ATOMICS, BULK)
    return sub(t, '    tgm_landed();   /* (no copy outlives the block) */\n',
               '    tgm_landed();   /* (no copy outlives the block) */\n    asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory");\n')

def in_turn(t):
    t = sub(t, 'template <class M, int T, int S, int D, int E, bool CAUSAL, int OH, int H>\nstatic __device__ void tgk_attention_bwd_mma',
            '__device__ unsigned g_sem[64 * 6 * 4];\ntemplate <class M, int T, int S, int D, int E, bool CAUSAL, int OH, int H>\nstatic __device__ void tgk_attention_bwd_mma')
    t = sub(t, ATOMICS, IN_TURN)
    return t.replace('#include "harness.cu"', '#define NOMEMSET\n#include "harness.cu"')

B6 = lambda: sub(src, '                atomicAdd((float2 *)(dq + (long long)r * H * D + d), make_float2(dqa[nd][h], dqa[nd][h + 1]));',
                 '                *(float2 *)(dq + (long long)r * H * D + d) = make_float2(dqa[nd][h], dqa[nd][h + 1]);')
B7 = lambda: sub(src, '                if (!dq || r >= T) continue;', '                continue;')
# Each variant a function of the dump's text: one whose anchor a dump lacks (the kernels of another
# version: dq by atomics until the thirtieth session, by tgm_add_dq since) is left out, and says so.
V = {} if TF32 else {
    'b0': (lambda: src, {}),
    'b1': (lambda: bounds(src, 'bwd', 3), {}),
    'b2': (lambda: frags_in_shared(src), dict(BWD_SMEM=64992 + 64 * 72 * 2)),
    'b3': (lambda: delta_apart(src), {}),
    'b4': (lambda: bounds(delta_apart(frags_in_shared(src)), 'bwd', 3), dict(BWD_SMEM=64992 + 64 * 72 * 2)),
    'b5': (lambda: bounds(frags_in_shared(src), 'bwd', 3), dict(BWD_SMEM=64992 + 64 * 72 * 2)),
    'b6': (B6, {}),
    'b7': (B7, {}),
    'b8': (lambda: src.replace('#include "harness.cu"', '#define NOMEMSET\n#include "harness.cu"'), {}),
    'b10': (lambda: in_turn(src), {}),
    'bbulk': (lambda: bulk(src), {}),
    'f1': (lambda: bounds(src, 'bf16', 3), {}),
}

# tf32: f128 the forward's blocks of 8 warps on 128 query rows (each key and value tile read once for
# twice the rows; f128b2 bounded to two such blocks an SM), fnolo the forward's probabilities entering p v without their rest (p's hi only:
# wrong in the last bits; what the second product costs)
def rows128(t):
    t = sub(t, '    constexpr int TILES = (T + 63) / 64, DK = D / M::KS', '    constexpr int TILES = (T + 127) / 128, DK = D / M::KS')
    t = sub(t, '    const int r0 = (int)(blockIdx.x % TILES) * 64, rw = r0 + 16 * w;', '    const int r0 = (int)(blockIdx.x % TILES) * 128, rw = r0 + 16 * w;')
    return sub(t, '    const int c_end = CAUSAL ? (S < r0 + 64 ? S : r0 + 64) : S;', '    const int c_end = CAUSAL ? (S < r0 + 128 ? S : r0 + 128) : S;')

V_TF32 = {
    'b0': (lambda: src, {}),
    'b6': (B6, {}),
    'b7': (B7, {}),
    'bbulk': (lambda: bulk(src), {}),
    'f128': (lambda: rows128(src), dict(FWD_TILES=2, FWD_THREADS=256)),
    'f128b2': (lambda: rows128(src).replace('void attn_tf32', 'void __launch_bounds__(256, 2) attn_tf32'), dict(FWD_TILES=2, FWD_THREADS=256)),
    'fnolo': (lambda: sub(src, 'M::template gemm_t<64, E, true>(acc, pa, pr, Vs, LV);', 'M::template gemm_t<64, E, false>(acc, pa, pr, Vs, LV);'), {}),
}
for name, (make, over) in (V_TF32 if TF32 else V).items():
    try:
        text = make()
    except AssertionError as e:
        print('%s left out: the dump lacks %r' % (name, str(e)[:60]))
        continue
    open(os.path.join(out, name + '.cu'), 'w').write(text.replace('#include "harness.cu"', '#define VARIANT "%s"\n#include "harness.cu"' % name))
    flags = dict(BASE, **over)
    open(os.path.join(out, name + '.flags'), 'w').write(' '.join('-D%s=%d' % kv for kv in flags.items()))
