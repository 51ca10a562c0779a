// Bitonic sort in shared memory and a Hillis-Steele scan; uses #pragma nounroll paths.
__global__ void bitonic_sort(unsigned* data) {
    __shared__ unsigned s[1024];
    unsigned t = threadIdx.x;
    s[t] = data[blockIdx.x * 1024 + t];
    __syncthreads();
    for (unsigned k = 2; k <= 1024; k <<= 1)
        for (unsigned j = k >> 1; j > 0; j >>= 1) {
            unsigned ixj = t ^ j;
            if (ixj > t) {
                bool up = (t & k) == 0;
                if ((s[t] > s[ixj]) == up) { unsigned tmp = s[t]; s[t] = s[ixj]; s[ixj] = tmp; }
            }
            __syncthreads();
        }
    data[blockIdx.x * 1024 + t] = s[t];
}
__global__ void scan_hs(const float* in, float* out, int n) {
    extern __shared__ float tmp[];
    int t = threadIdx.x, pout = 0, pin = 1;
    tmp[t] = t > 0 && t < n ? in[t - 1] : 0.f;
    __syncthreads();
    #pragma unroll 1
    for (int off = 1; off < n; off *= 2) {
        pout = 1 - pout; pin = 1 - pout;
        tmp[pout * n + t] = tmp[pin * n + t] + (t >= off ? tmp[pin * n + t - off] : 0.f);
        __syncthreads();
    }
    out[t] = tmp[pout * n + t];
}
