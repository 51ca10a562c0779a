#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
// Tensor-core GEMM through the WMMA API (16x16x16 fragments), one warp per 64x64 tile.
__global__ void wmma_gemm(const half* A, const half* B, float* C, int M, int N, int K) {
    int wm = (blockIdx.y * blockDim.y + threadIdx.y) * 64;
    int wn = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 64;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0.f);
    for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[4];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) wmma::load_matrix_sync(a[i], A + (wm + 16 * i) * K + k, K);
        #pragma unroll
        for (int j = 0; j < 4; ++j) wmma::load_matrix_sync(b[j], B + (wn + 16 * j) * K + k, K);
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            #pragma unroll
            for (int j = 0; j < 4; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            wmma::store_matrix_sync(C + (wm + 16 * i) * N + wn + 16 * j, acc[i][j], N, wmma::mem_row_major);
}
__global__ void wmma_tf32(const float* A, const float* B, float* C, int ld) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;
    wmma::fill_fragment(c, 0.f);
    wmma::load_matrix_sync(a, A, ld);
    wmma::load_matrix_sync(b, B, ld);
    for (int t = 0; t < a.num_elements; ++t) a.x[t] = wmma::__float_to_tf32(a.x[t]);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(C, c, ld, wmma::mem_col_major);
}
