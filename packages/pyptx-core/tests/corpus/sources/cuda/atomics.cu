#include <cuda_fp16.h>
// Atomics of every width, CAS loops, a shared-memory histogram.
__device__ double atomic_max_double(double* addr, double val) {
    unsigned long long* p = (unsigned long long*)addr;
    unsigned long long old = *p, assumed;
    do {
        assumed = old;
        old = atomicCAS(p, assumed, __double_as_longlong(fmax(val, __longlong_as_double(assumed))));
    } while (assumed != old);
    return __longlong_as_double(old);
}
extern "C" __global__ void histogram256(const unsigned char* data, unsigned* hist, int n) {
    __shared__ unsigned h[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) h[i] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) atomicAdd(&h[data[i]], 1u);
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) atomicAdd(&hist[i], h[i]);
}
extern "C" __global__ void atomics_zoo(int* i32, unsigned long long* u64, float* f, double* d, __half2* h2, double v) {
    atomicAdd(i32, 1); atomicSub(i32 + 1, 2); atomicExch(i32 + 2, 3); atomicMin(i32 + 3, -4);
    atomicMax(i32 + 4, 5); atomicAnd(i32 + 5, 6); atomicOr(i32 + 6, 7); atomicXor(i32 + 7, 8);
    atomicInc((unsigned*)i32 + 8, 9u); atomicDec((unsigned*)i32 + 9, 10u);
    atomicAdd(u64, 11ull); atomicCAS(u64 + 1, 12ull, 13ull);
    atomicAdd(f, 1.5f); atomicAdd(d, v); atomicAdd(h2, __floats2half2_rn(1.f, 2.f));
    atomicAdd_block(i32 + 10, 1); atomicAdd_system(i32 + 11, 1);
    atomic_max_double(d + 1, v);
}
