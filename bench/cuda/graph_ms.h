/* The harnesses' timer: a launch as the step's CUDA graph runs it. f() enqueues one launch on
 * `stream`; 20 of them are captured in a graph, which is replayed `replays` times a round; the
 * best of 5 rounds, in ms a launch. Needs CK (the harness's error check) and <algorithm>. */
template <class F> static float graph_ms(cudaStream_t stream, F f, int replays = 20) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; i++) f();
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphLaunch(x, stream));
    CK(cudaStreamSynchronize(stream));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(a, stream));
        for (int i = 0; i < replays; i++) CK(cudaGraphLaunch(x, stream));
        CK(cudaEventRecord(b, stream));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms / (20 * replays));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    return best;
}
