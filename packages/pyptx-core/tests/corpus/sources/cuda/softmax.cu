#include <cfloat>
// Row softmax, one block per row, online max/sum.
template <int BLOCK>
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[BLOCK / 32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* orow = y + (size_t)blockIdx.x * cols;
    float m = -FLT_MAX;
    for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, row[c]);
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    m = red[0];
    #pragma unroll
    for (int w = 1; w < BLOCK / 32; ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) s += __expf(row[c] - m);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    s = 0.f;
    #pragma unroll
    for (int w = 0; w < BLOCK / 32; ++w) s += red[w];
    float inv = 1.f / s;
    for (int c = threadIdx.x; c < cols; c += BLOCK) orow[c] = __expf(row[c] - m) * inv;
}
template __global__ void softmax_rows<128>(const float*, float*, int);
template __global__ void softmax_rows<256>(const float*, float*, int);
template __global__ void softmax_rows<1024>(const float*, float*, int);
