// Reductions: shared memory tree, warp shuffles, atomics.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
extern "C" __global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float part[32];
    float acc = 0.f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc += x[i];
    acc = warp_sum(acc);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) part[wid] = acc;
    __syncthreads();
    if (wid == 0) {
        acc = lane < (blockDim.x >> 5) ? part[lane] : 0.f;
        acc = warp_sum(acc);
        if (lane == 0) atomicAdd(out, acc);
    }
}
extern "C" __global__ void tree_max(const int* x, int* out) {
    extern __shared__ int buf[];
    unsigned t = threadIdx.x;
    buf[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] = max(buf[t], buf[t + s]);
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}
extern "C" __global__ void redux_sync_sum(const unsigned* x, unsigned* out) {
    unsigned v = x[threadIdx.x];
    unsigned s = __reduce_add_sync(0xffffffffu, v);
    unsigned m = __reduce_max_sync(0xffffffffu, v);
    if ((threadIdx.x & 31) == 0) out[threadIdx.x >> 5] = s ^ m;
}
