#include <cstdint>
#include <cuda.h>
// Hopper TMA and mbarrier in inline PTX; the tensor map is a __grid_constant__ parameter (sm_90a).
__device__ __forceinline__ uint32_t s32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__global__ void __cluster_dims__(2, 1, 1) tma_load_2d(const __grid_constant__ CUtensorMap tmap, float* out, int ktiles) {
    __shared__ __align__(128) float tile[2][64 * 64];
    __shared__ __align__(8) uint64_t bar[2];
    if (threadIdx.x == 0) {
        asm volatile("prefetch.tensormap [%0];" :: "l"(&tmap) : "memory");
        for (int i = 0; i < 2; ++i)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(s32(&bar[i])), "r"(1));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    float acc = 0.f;
    for (int kt = 0; kt < ktiles; ++kt) {
        int s = kt & 1; uint32_t phase = (kt >> 1) & 1;
        if (threadIdx.x == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(s32(&bar[s])), "r"(64 * 64 * 4) : "memory");
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                         :: "r"(s32(tile[s])), "l"(&tmap), "r"(kt * 64), "r"((int)blockIdx.x * 64), "r"(s32(&bar[s])) : "memory");
        }
        asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                     "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" :: "r"(s32(&bar[s])), "r"(phase) : "memory");
        acc += tile[s][threadIdx.x];
        __syncthreads();
    }
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc + rank;
}
__global__ void tma_store_2d(const __grid_constant__ CUtensorMap tmap, const float* in) {
    __shared__ __align__(128) float tile[32 * 32];
    tile[threadIdx.x] = in[threadIdx.x];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                     :: "l"(&tmap), "r"(0), "r"((int)blockIdx.x * 32), "r"(s32(tile)) : "memory");
        asm volatile("cp.async.bulk.commit_group;");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
}
__global__ void bulk_copy(const float4* src, float4* dst, int n) {
    __shared__ __align__(128) float4 buf[256];
    __shared__ __align__(8) uint64_t bar;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(s32(&bar)));
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(s32(&bar)), "r"(n * 16));
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(s32(buf)), "l"(src), "r"(n * 16), "r"(s32(&bar)) : "memory");
    }
    __syncthreads();
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(s32(&bar)));
    dst[threadIdx.x] = buf[threadIdx.x];
}
