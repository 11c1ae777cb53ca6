/* The buffers a kernel out of a `bench --kernels` dump (dump.py) takes, and a stream to time it on:
 * the arena A of `arena` floats, zeroed; the table B of bound leaves' pointers, all at one zeroed
 * 1 MB buffer; the hyper scalars H. Needs CK (the harness's error check). */
struct dump_buffers { cudaStream_t s; float *A; void **B; double *H; };

static dump_buffers dump_buffers_new(long long arena) {
    dump_buffers d;
    float *bound;
    CK(cudaStreamCreate(&d.s));
    CK(cudaMalloc(&d.A, arena * 4));
    CK(cudaMemset(d.A, 0, arena * 4));
    CK(cudaMalloc(&bound, 1 << 20));
    CK(cudaMemset(bound, 0, 1 << 20));
    static void *table[4096];
    for (int i = 0; i < 4096; i++) table[i] = bound;
    CK(cudaMalloc(&d.B, sizeof table));
    CK(cudaMemcpy(d.B, table, sizeof table, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d.H, 4096));
    CK(cudaMemset(d.H, 0, 4096));
    return d;
}
