#include <cstdio>
// printf (vprintf, string constants), __constant__ tables, __device__ globals with initializers.
__constant__ float c_coeffs[16] = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f, 16.f};
__constant__ int c_table[4];
__device__ int g_counter = 7;
__device__ float g_buf[1024];
__device__ unsigned long long g_mask[2] = {0xdeadbeefcafef00dull, 42ull};
struct Pair { int a; float b; };
__device__ Pair g_pairs[3] = {{1, 1.5f}, {2, 2.5f}, {3, 3.5f}};
__global__ void hello(int n) {
    if (threadIdx.x == 0) printf("hello from block %d of %d: %f %s\n", blockIdx.x, n, c_coeffs[blockIdx.x & 15], "ok");
    g_buf[threadIdx.x] = c_coeffs[threadIdx.x & 15] * c_table[threadIdx.x & 3] + g_pairs[threadIdx.x % 3].b;
    atomicAdd(&g_counter, (int)(g_mask[threadIdx.x & 1] & 1));
}
__global__ void assert_kernel(const int* x) {
    if (x[threadIdx.x] < 0) { printf("negative at %d\n", threadIdx.x); __trap(); }
    assert(x[threadIdx.x] != 12345);
}
