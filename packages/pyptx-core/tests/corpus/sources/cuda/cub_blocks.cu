#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_load.cuh>
#include <cub/block/block_store.cuh>
// CUB block primitives: heavily templated, mangled names, large unrolled bodies.
template <int BLOCK, int ITEMS>
__global__ void block_sort(const int* in, int* out) {
    using Load = cub::BlockLoad<int, BLOCK, ITEMS, cub::BLOCK_LOAD_TRANSPOSE>;
    using Sort = cub::BlockRadixSort<int, BLOCK, ITEMS>;
    using Store = cub::BlockStore<int, BLOCK, ITEMS, cub::BLOCK_STORE_TRANSPOSE>;
    __shared__ union { typename Load::TempStorage l; typename Sort::TempStorage s; typename Store::TempStorage st; } tmp;
    int keys[ITEMS];
    Load(tmp.l).Load(in + blockIdx.x * BLOCK * ITEMS, keys);
    __syncthreads();
    Sort(tmp.s).Sort(keys);
    __syncthreads();
    Store(tmp.st).Store(out + blockIdx.x * BLOCK * ITEMS, keys);
}
template __global__ void block_sort<128, 4>(const int*, int*);
template <int BLOCK>
__global__ void block_scan_reduce(const float* in, float* out, float* total) {
    using Scan = cub::BlockScan<float, BLOCK>;
    using Red = cub::BlockReduce<float, BLOCK>;
    __shared__ typename Scan::TempStorage ts;
    __shared__ typename Red::TempStorage tr;
    float v = in[blockIdx.x * BLOCK + threadIdx.x], s;
    Scan(ts).InclusiveSum(v, s);
    out[blockIdx.x * BLOCK + threadIdx.x] = s;
    float r = Red(tr).Reduce(v, ::cuda::maximum<>{});
    if (threadIdx.x == 0) total[blockIdx.x] = r;
}
template __global__ void block_scan_reduce<256>(const float*, float*, float*);
