#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
// Cooperative groups: tiled partitions, warp reductions, clusters with distributed shared memory.
__global__ void cg_tile_reduce(const int* x, int* out) {
    auto block = cg::this_thread_block();
    auto tile = cg::tiled_partition<16>(block);
    int v = x[block.thread_rank()];
    int s = cg::reduce(tile, v, cg::plus<int>());
    int m = cg::reduce(tile, v, cg::greater<int>());
    if (tile.thread_rank() == 0) atomicAdd(out, s + m);
}
__global__ void __cluster_dims__(4, 1, 1) cluster_dsmem(int* out) {
    __shared__ int local[128];
    auto cluster = cg::this_cluster();
    unsigned rank = cluster.block_rank();
    local[threadIdx.x] = rank * 1000 + threadIdx.x;
    cluster.sync();
    int* peer = cluster.map_shared_rank(local, (rank + 1) % cluster.num_blocks());
    out[blockIdx.x * 128 + threadIdx.x] = peer[threadIdx.x];
    cluster.sync();
}
__global__ void ballot_vote(const float* x, unsigned* out) {
    float v = x[threadIdx.x];
    unsigned b = __ballot_sync(0xffffffff, v > 0.f);
    int all = __all_sync(0xffffffff, v != 0.f), any = __any_sync(0xffffffff, v < -1.f);
    unsigned m = __match_any_sync(0xffffffff, __float_as_uint(v));
    unsigned lt = __activemask();
    if ((threadIdx.x & 31) == 0) out[threadIdx.x / 32] = b ^ (all << 1) ^ (any << 2) ^ m ^ lt ^ __popc(b) ^ __clz(m) ^ __ffs(b);
}
