// Naive GEMM variants: row-major, with double accumulation, with a strided batch.
extern "C" __global__ void gemm_naive(const float* A, const float* B, float* C, int M, int N, int K) {
    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= M || c >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + c];
    C[r * N + c] = acc;
}
extern "C" __global__ void dgemm_batched(const double* A, const double* B, double* C, int M, int N, int K,
                                         long sa, long sb, long sc) {
    A += blockIdx.z * sa; B += blockIdx.z * sb; C += blockIdx.z * sc;
    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < M && c < N) {
        double acc = 0.0;
        #pragma unroll 4
        for (int k = 0; k < K; ++k) acc = fma(A[r * K + k], B[k * N + c], acc);
        C[r * N + c] = acc;
    }
}
