// Separate compilation (-rdc=true): extern device functions and variables, weak symbols.
extern __device__ float shared_scale;
extern __device__ float scale_fn(float x);
__device__ float local_bias = 0.25f;
__device__ __noinline__ float scale_fn_local(float x) { return x * 3.f + local_bias; }
__global__ void uses_extern(float* y, const float* x) {
    y[threadIdx.x] = scale_fn(x[threadIdx.x]) * shared_scale + scale_fn_local(x[threadIdx.x]);
}
