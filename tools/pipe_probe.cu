// Throughput of the instructions the attention softmax runs per element, per SM and clock:
// ex2.approx.ftz.f32 (MUFU), cvt.rn.bf16x2.f32 (the packing of P and dS), fma.f32, and
// ex2 + cvt mixed (the sum of the two alone if they shared a pipe; on the H100 it equals ex2
// alone: the packing runs beside the exponentials).
//   nvcc -arch=sm_90a -O3 -o /tmp/pipe_probe tools/pipe_probe.cu && /tmp/pipe_probe
#include <cstdio>
#include <cuda_runtime.h>

constexpr int ITERS = 4096, CHAINS = 8, THREADS = 1024;

template <int KIND>
__global__ void probe(float *out, long long *cycles) {
  float a[CHAINS];
  for (int c = 0; c < CHAINS; ++c) a[c] = 0.001f * (threadIdx.x + c);
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if (KIND == 0 || KIND == 3)
        asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(a[c]));
      if (KIND == 1 || KIND == 3)
        asm volatile("cvt.rn.bf16x2.f32 %0, %0, %0;" : "+r"(*reinterpret_cast<unsigned *>(&a[c])));
      if (KIND == 2)
        asm volatile("fma.rn.f32 %0, %0, %0, 0f3F000000;" : "+f"(a[c]));
    }
  }
  __syncthreads();
  long long t1 = clock64();
  float s = 0;
  for (int c = 0; c < CHAINS; ++c) s += a[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int KIND>
void run(const char *name, int sms, float *out, long long *cyc) {
  probe<KIND><<<sms, THREADS>>>(out, cyc);
  probe<KIND><<<sms, THREADS>>>(out, cyc);
  cudaDeviceSynchronize();
  long long h[1024];
  cudaMemcpy(h, cyc, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  long long best = h[0];
  for (int i = 1; i < sms; ++i) best = h[i] < best ? h[i] : best;
  double ops = double(THREADS) * ITERS * CHAINS;
  printf("%-10s %8.1f per clock per SM\n", name, ops / best);
}

int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float *out; long long *cyc;
  cudaMalloc(&out, sms * THREADS * sizeof(float));
  cudaMalloc(&cyc, sms * sizeof(long long));
  run<0>("ex2", sms, out, cyc);
  run<1>("cvt.bf16x2", sms, out, cyc);
  run<2>("fma", sms, out, cyc);
  run<3>("ex2+cvt", sms, out, cyc);   // counted per (ex2, cvt) pair
  return 0;
}
