/* The buffers a kernel out of a `bench --kernels` dump (dump.py) takes: the arena A of `arena`
 * floats, zeroed; the table B of bound leaves' pointers, all at one zeroed 1 MB buffer; the hyper
 * scalars H. Needs CK (the harness's error check). */
static void dump_buffers(long long arena, float **A, void ***B, double **H) {
    float *bound;
    CK(cudaMalloc(A, arena * 4));
    CK(cudaMemset(*A, 0, arena * 4));
    CK(cudaMalloc(&bound, 1 << 20));
    CK(cudaMemset(bound, 0, 1 << 20));
    static void *table[4096];
    for (int i = 0; i < 4096; i++) table[i] = bound;
    CK(cudaMalloc(B, sizeof table));
    CK(cudaMemcpy(*B, table, sizeof table, cudaMemcpyHostToDevice));
    CK(cudaMalloc(H, 4096));
    CK(cudaMemset(*H, 0, 4096));
}
