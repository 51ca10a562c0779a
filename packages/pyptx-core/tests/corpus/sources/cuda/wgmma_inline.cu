#include <cstdint>
// Hopper warpgroup MMA in inline PTX: descriptors, fences, commit/wait, setmaxnreg (sm_90a only).
__device__ __forceinline__ uint64_t make_desc(const void* smem, int lbo, int sbo) {
    uint64_t addr = static_cast<uint64_t>(__cvta_generic_to_shared(smem));
    uint64_t d = 0;
    d |= (addr & 0x3FFFF) >> 4;
    d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
    d |= 1ull << 62;  // 128B swizzle
    return d;
}
__global__ void __launch_bounds__(128) wgmma_m64n64k16(const uint16_t* A, const uint16_t* B, float* C, int ktiles) {
    __shared__ __align__(1024) uint16_t sa[64 * 64];
    __shared__ __align__(1024) uint16_t sb[64 * 64];
    float d[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    for (int kt = 0; kt < ktiles; ++kt) {
        for (int i = threadIdx.x; i < 64 * 64; i += 128) { sa[i] = A[kt * 4096 + i]; sb[i] = B[kt * 4096 + i]; }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            uint64_t da = make_desc(sa + k * 16, 16, 1024), db = make_desc(sb + k * 16, 16, 1024);
            asm volatile(
                "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                "%32, %33, p, 1, 1, 0, 0;\n}\n"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                : "l"(da), "l"(db), "r"(kt > 0 || k > 0 ? 1 : 0));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 32; ++i) C[threadIdx.x * 32 + i] = d[i];
}
__global__ void __launch_bounds__(384, 1) warp_specialized(int* flag) {
    int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) atomicAdd(flag, 1);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        __nanosleep(100);
        atomicAdd(flag + wg, (int)threadIdx.x);
    }
}
