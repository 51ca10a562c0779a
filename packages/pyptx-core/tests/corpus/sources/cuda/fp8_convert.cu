#include <cuda_fp8.h>
#include <cuda_bf16.h>
// FP8 conversions and packed bf16x2 math on Hopper (cvt.rn.satfinite.e4m3x2.f32 etc.).
__global__ void quantize_e4m3(const float* x, __nv_fp8x2_e4m3* y, float scale, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __nv_fp8x2_e4m3(make_float2(x[2 * i] * scale, x[2 * i + 1] * scale));
}
__global__ void dequantize_e5m2(const __nv_fp8_e5m2* x, __nv_bfloat16* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(float(x[i]));
}
__global__ void bf16x2_fma(const __nv_bfloat162* a, const __nv_bfloat162* b, __nv_bfloat162* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = __hfma2(a[i], b[i], c[i]);
}
