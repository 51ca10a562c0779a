// Texture and surface objects.
__global__ void tex_sample(cudaTextureObject_t tex, float4* out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) {
        float u = (x + 0.5f) / w, v = (y + 0.5f) / h;
        float4 a = tex2D<float4>(tex, u, v), b = tex2DLod<float4>(tex, u, v, 1.f);
        out[y * w + x] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
}
__global__ void tex1d_fetch(cudaTextureObject_t tex, float* out) {
    out[threadIdx.x] = tex1Dfetch<float>(tex, threadIdx.x) + tex3D<float>(tex, 0.5f, 0.5f, 0.5f);
}
__global__ void surf_write(cudaSurfaceObject_t surf, int w) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    float v;
    surf2Dread(&v, surf, x * 4, 0);
    surf2Dwrite(v * 2.f, surf, x * 4, 1);
}
