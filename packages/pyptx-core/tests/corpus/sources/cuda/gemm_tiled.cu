// Classic shared-memory tiled SGEMM with an 8x8 register tile (fully unrolled: large PTX).
template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN)) sgemm(int M, int N, int K, float alpha,
        const float* __restrict__ A, const float* __restrict__ B, float beta, float* __restrict__ C) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    const int nthreads = (BM / TM) * (BN / TN);
    A += blockIdx.y * BM * K; B += blockIdx.x * BN; C += blockIdx.y * BM * N + blockIdx.x * BN;
    float acc[TM][TN] = {};
    float ra[TM], rb[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        #pragma unroll
        for (int i = threadIdx.x; i < BM * BK; i += nthreads) As[i % BK][i / BK] = A[(i / BK) * K + i % BK];
        #pragma unroll
        for (int i = threadIdx.x; i < BK * BN; i += nthreads) Bs[i / BN][i % BN] = B[(i / BN) * N + i % BN];
        __syncthreads();
        A += BK; B += BK * N;
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            #pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = As[k][ty * TM + i];
            #pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = Bs[k][tx * TN + j];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) {
            float* c = &C[(ty * TM + i) * N + tx * TN + j];
            *c = alpha * acc[i][j] + beta * *c;
        }
}
template __global__ void sgemm<128, 128, 8, 8, 8>(int, int, int, float, const float*, const float*, float, float*);
template __global__ void sgemm<64, 64, 16, 4, 4>(int, int, int, float, const float*, const float*, float, float*);
template __global__ void sgemm<128, 128, 16, 8, 8>(int, int, int, float, const float*, const float*, float, float*);
