// 2D convolution with a constant-memory filter and a 3D 7-point stencil.
#define R 3
__constant__ float filt[(2 * R + 1) * (2 * R + 1)];
__global__ void conv2d(const float* __restrict__ in, float* __restrict__ out, int w, int h) {
    __shared__ float tile[16 + 2 * R][16 + 2 * R];
    int x = blockIdx.x * 16 + threadIdx.x, y = blockIdx.y * 16 + threadIdx.y;
    for (int dy = threadIdx.y; dy < 16 + 2 * R; dy += 16)
        for (int dx = threadIdx.x; dx < 16 + 2 * R; dx += 16) {
            int gx = min(max(blockIdx.x * 16 + dx - R, 0), w - 1), gy = min(max(blockIdx.y * 16 + dy - R, 0), h - 1);
            tile[dy][dx] = in[gy * w + gx];
        }
    __syncthreads();
    float acc = 0.f;
    #pragma unroll
    for (int i = 0; i <= 2 * R; ++i)
        #pragma unroll
        for (int j = 0; j <= 2 * R; ++j) acc += filt[i * (2 * R + 1) + j] * tile[threadIdx.y + i][threadIdx.x + j];
    if (x < w && y < h) out[y * w + x] = acc;
}
__global__ void stencil7(const double* u, double* v, int nx, int ny, int nz) {
    int i = blockIdx.x * blockDim.x + threadIdx.x + 1, j = blockIdx.y * blockDim.y + threadIdx.y + 1;
    for (int k = 1; k < nz - 1; ++k) {
        if (i < nx - 1 && j < ny - 1) {
            size_t c = ((size_t)k * ny + j) * nx + i;
            v[c] = -6.0 * u[c] + u[c - 1] + u[c + 1] + u[c - nx] + u[c + nx] + u[c - (size_t)nx * ny] + u[c + (size_t)nx * ny];
        }
    }
}
