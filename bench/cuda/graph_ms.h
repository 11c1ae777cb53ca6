/* The harnesses' timers. graph_ms: a launch as the step's CUDA graph runs it; f() enqueues one
 * launch on `stream`; 20 of them are captured in a graph, which is replayed `replays` times a
 * round; the best of 5 rounds, in ms a launch. replay_ms: a graph already instantiated. Need CK
 * (the harness's error check) and <algorithm>. */
/* Best of 5 rounds of `replays` launches of instantiated graph x, in ms per launch of a graph
 * divided by `per` (the launches each graph holds). */
static float replay_ms(cudaStream_t stream, cudaGraphExec_t x, int replays, int per) {
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
        best = std::min(best, ms / (per * replays));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return best;
}

template <class F> static float graph_ms(cudaStream_t stream, F f, int replays = 20) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; i++) f();
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    float best = replay_ms(stream, x, replays, 20);
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    return best;
}
