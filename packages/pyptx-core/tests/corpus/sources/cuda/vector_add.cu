// Elementwise kernels: the first thing every CUDA author writes.
extern "C" __global__ void vector_add(const float* __restrict__ x, const float* __restrict__ y,
                                      float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}

extern "C" __global__ void saxpy_grid_stride(float a, const float* x, float* y, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}

extern "C" __global__ void vec4_copy(const float4* __restrict__ in, float4* __restrict__ out, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = __ldg(in + i);
        v.x *= 2.f; v.y += 1.f; v.z = -v.z; v.w = fabsf(v.w);
        out[i] = v;
    }
}

template <typename T>
__global__ void axpby(T a, const T* x, T b, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b * y[i];
}
template __global__ void axpby<float>(float, const float*, float, float*, int);
template __global__ void axpby<double>(double, const double*, double, double*, int);
template __global__ void axpby<int>(int, const int*, int, int*, int);
