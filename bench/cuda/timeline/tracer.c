/* A timeline of any CUDA program, ours or PyTorch's, with no profiler on the machine (the GPU
 * machines have Nsight Compute, which replays kernels one at a time, but no Nsight Systems): a
 * CUPTI injection library that writes every kernel's, memset's and copy's start and end on the
 * GPU clock to $TRACE_OUT, one line each ("K start end blocks threads registers stream name"; M
 * and C lines: bytes for blocks). Kernels inside a replayed CUDA graph are recorded as they run.
 * timeline.py reads it. Not part of the build:
 *
 *   CUPTI=/usr/local/cuda/targets/x86_64-linux   # cupti.h and libcupti.so
 *   KREC=$(grep -rhoE 'CUpti_ActivityKernel[0-9]+' $CUPTI/include | sort -V | tail -1)
 *   cc -shared -fPIC -O2 -DKREC=$KREC -I$CUPTI/include tracer.c -L$CUPTI/lib -lcupti -Wl,-rpath,$CUPTI/lib -o /tmp/libtracer.so
 *   CUDA_INJECTION64_PATH=/tmp/libtracer.so TRACE_OUT=trace.txt build/bench/bench --backend cuda --precision bf16 char_gpt
 *
 * (KREC: the newest kernel record of this CUPTI; its first fields are the same in every version.) */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *out;

static void CUPTIAPI buf_req(uint8_t **buf, size_t *size, size_t *maxrec) {
    *size = 16u << 20;
    *buf = aligned_alloc(8, *size);
    *maxrec = 0;
}

static void CUPTIAPI buf_done(CUcontext ctx, uint32_t sid, uint8_t *buf, size_t size, size_t valid) {
    CUpti_Activity *r = NULL;
    (void)ctx, (void)sid, (void)size;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            KREC *k = (KREC *)r;
            fprintf(out, "K %llu %llu %d %d %d %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->gridX * k->gridY * k->gridZ,
                    k->blockX * k->blockY * k->blockZ, (int)k->registersPerThread, (unsigned)k->streamId, k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)r;
            fprintf(out, "M %llu %llu %llu 0 0 %u memset\n", (unsigned long long)m->start, (unsigned long long)m->end, (unsigned long long)m->bytes,
                    (unsigned)m->streamId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)r;
            fprintf(out, "C %llu %llu %llu 0 0 %u memcpy\n", (unsigned long long)m->start, (unsigned long long)m->end, (unsigned long long)m->bytes,
                    (unsigned)m->streamId);
        }
    }
    free(buf);
}

static void flush(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
}

int InitializeInjection(void) {
    const char *p = getenv("TRACE_OUT");
    out = fopen(p ? p : "trace.txt", "w");
    if (!out) return 0;
    cuptiActivityRegisterCallbacks(buf_req, buf_done);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    atexit(flush);
    return 1;
}
