#include <cuda_fp16.h>
// A small flash-attention style forward kernel (one query row per thread, online softmax).
template <int D>
__global__ void attn_fwd(const half* __restrict__ Q, const half* __restrict__ K, const half* __restrict__ V,
                         half* __restrict__ O, int seqlen, float scale) {
    __shared__ half ks[64][D], vs[64][D];
    int q = blockIdx.x * blockDim.x + threadIdx.x;
    float qr[D], acc[D];
    #pragma unroll
    for (int d = 0; d < D; ++d) { qr[d] = __half2float(Q[q * D + d]) * scale; acc[d] = 0.f; }
    float m = -1e30f, l = 0.f;
    for (int kb = 0; kb < seqlen; kb += 64) {
        for (int i = threadIdx.x; i < 64 * D; i += blockDim.x) { ks[i / D][i % D] = K[kb * D + i]; vs[i / D][i % D] = V[kb * D + i]; }
        __syncthreads();
        for (int j = 0; j < 64; ++j) {
            float s = 0.f;
            #pragma unroll
            for (int d = 0; d < D; ++d) s += qr[d] * __half2float(ks[j][d]);
            float mn = fmaxf(m, s), c = __expf(m - mn), p = __expf(s - mn);
            l = l * c + p;
            #pragma unroll
            for (int d = 0; d < D; ++d) acc[d] = acc[d] * c + p * __half2float(vs[j][d]);
            m = mn;
        }
        __syncthreads();
    }
    #pragma unroll
    for (int d = 0; d < D; ++d) O[q * D + d] = __float2half(acc[d] / l);
}
template __global__ void attn_fwd<64>(const half*, const half*, const half*, half*, int, float);
template __global__ void attn_fwd<128>(const half*, const half*, const half*, half*, int, float);
