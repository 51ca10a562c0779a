#include <cuda_fp16.h>
// LayerNorm / RMSNorm forward with vectorized half loads.
__global__ void __launch_bounds__(256) layernorm_fwd(const __half* __restrict__ x, const float* __restrict__ gamma,
        const float* __restrict__ beta, __half* __restrict__ y, float* mean_out, float* rstd_out, int n, float eps) {
    __shared__ float s_sum[8], s_sq[8];
    const __half2* xr = reinterpret_cast<const __half2*>(x + (size_t)blockIdx.x * n);
    float sum = 0.f, sq = 0.f;
    for (int i = threadIdx.x; i < n / 2; i += 256) {
        float2 v = __half22float2(xr[i]);
        sum += v.x + v.y; sq += v.x * v.x + v.y * v.y;
    }
    for (int o = 16; o; o >>= 1) { sum += __shfl_down_sync(~0u, sum, o); sq += __shfl_down_sync(~0u, sq, o); }
    if ((threadIdx.x & 31) == 0) { s_sum[threadIdx.x >> 5] = sum; s_sq[threadIdx.x >> 5] = sq; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; ++w) { s_sum[0] += s_sum[w]; s_sq[0] += s_sq[w]; }
    }
    __syncthreads();
    float mean = s_sum[0] / n, var = s_sq[0] / n - mean * mean, rstd = rsqrtf(var + eps);
    if (threadIdx.x == 0) { mean_out[blockIdx.x] = mean; rstd_out[blockIdx.x] = rstd; }
    __half2* yr = reinterpret_cast<__half2*>(y + (size_t)blockIdx.x * n);
    for (int i = threadIdx.x; i < n / 2; i += 256) {
        float2 v = __half22float2(xr[i]);
        v.x = (v.x - mean) * rstd * gamma[2 * i] + beta[2 * i];
        v.y = (v.y - mean) * rstd * gamma[2 * i + 1] + beta[2 * i + 1];
        yr[i] = __float22half2_rn(v);
    }
}
__global__ void __launch_bounds__(128, 4) rmsnorm(const float* x, const float* w, float* y, int n) {
    __shared__ float s[4];
    float acc = 0.f;
    const float* r = x + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += 128) acc += r[i] * r[i];
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = acc;
    __syncthreads();
    float inv = rsqrtf((s[0] + s[1] + s[2] + s[3]) / n + 1e-6f);
    for (int i = threadIdx.x; i < n; i += 128) y[(size_t)blockIdx.x * n + i] = r[i] * inv * w[i];
}
