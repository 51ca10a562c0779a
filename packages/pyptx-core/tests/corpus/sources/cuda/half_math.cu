#include <cuda_fp16.h>
#include <cuda_bf16.h>
// 16-bit and packed float arithmetic.
__global__ void hadd2_kernel(const __half2* a, const __half2* b, __half2* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = __hfma2(a[i], b[i], __float2half2_rn(0.5f));
}
__global__ void bf16_gelu(const __nv_bfloat16* x, __nv_bfloat16* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __bfloat162float(x[i]);
        float g = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
        y[i] = __float2bfloat16(g);
    }
}
__global__ void cast_f32_to_f16(const float* x, __half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rz(x[i]) ;
}
__global__ void bf162_relu(__nv_bfloat162* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __hmax2(x[i], __float2bfloat162_rn(0.f));
}
