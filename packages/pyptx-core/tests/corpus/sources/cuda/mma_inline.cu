#include <cuda_fp16.h>
#include <cstdint>
// Ampere-style GEMM fragment code written in inline PTX: ldmatrix, mma.sync, cp.async.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__global__ void mma_m16n8k16(const half* __restrict__ A, const half* __restrict__ B, float* __restrict__ C, int K) {
    __shared__ __align__(128) half sa[2][16 * 32];
    __shared__ __align__(128) half sb[2][8 * 32];
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    int lane = threadIdx.x;
    for (int k0 = 0, s = 0; k0 < K; k0 += 32, s ^= 1) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_u32(&sa[s][lane * 8])), "l"(A + k0 + lane * 8));
        asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], 16, %2;\n" :: "r"(smem_u32(&sb[s][lane * 8])), "l"(B + k0 + lane * 8), "r"(lane < 16 ? 16 : 0));
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 0;\n" ::);
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            uint32_t a0, a1, a2, a3, b0, b1;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(smem_u32(&sa[s][(lane % 16) * 32 + kk * 16 + (lane / 16) * 8])));
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                         : "=r"(b0), "=r"(b1) : "r"(smem_u32(&sb[s][(lane % 8) * 32 + kk * 16])));
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
        __syncthreads();
    }
    int r = lane / 4, c = (lane % 4) * 2;
    C[r * 8 + c] = d[0]; C[r * 8 + c + 1] = d[1]; C[(r + 8) * 8 + c] = d[2]; C[(r + 8) * 8 + c + 1] = d[3];
}
__global__ void mma_int8(const int* a, const int* b, int* c) {
    int d0 = 0, d1 = 0, d2 = 0, d3 = 0;
    int lane = threadIdx.x;
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d0), "+r"(d1), "+r"(d2), "+r"(d3)
        : "r"(a[lane]), "r"(a[lane + 32]), "r"(a[lane + 64]), "r"(a[lane + 96]), "r"(b[lane]), "r"(b[lane + 32]));
    c[lane * 4] = d0; c[lane * 4 + 1] = d1; c[lane * 4 + 2] = d2; c[lane * 4 + 3] = d3;
}
