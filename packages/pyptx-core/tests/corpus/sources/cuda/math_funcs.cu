// Library math: double-precision trig with argument reduction (local depot, constant tables), pow, erf.
__global__ void dmath(const double* x, double* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = sin(x[i]) + cos(2.0 * x[i]) * exp(-x[i]) + log1p(fabs(x[i])) + pow(x[i], 1.7) + erf(x[i]);
}
__global__ void fmath(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = sinf(x[i]) * cosf(x[i]) + tanf(x[i]) + expf(x[i]) + logf(x[i]) + powf(x[i], 2.5f) + erfcf(x[i]) + cbrtf(x[i]) + atan2f(x[i], 1.f);
}
__global__ void fast_math(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __sinf(x[i]) + __cosf(x[i]) + __expf(x[i]) + __logf(x[i]) + __fdividef(x[i], 3.f) + __frsqrt_rn(x[i]) + __saturatef(x[i]);
}
__global__ void int_math(const int* a, const unsigned* b, long long* c) {
    int i = threadIdx.x;
    c[i] = __mulhi(a[i], 3) + __umul64hi(b[i], 7ull) + __brev(b[i]) + __byte_perm(a[i], b[i], 0x5410) + __funnelshift_l(a[i], b[i], 5)
         + __dp4a(a[i], (int)b[i], 1) + __sad(a[i], (int)b[i], 2u) + a[i] / (int)(b[i] | 1) + a[i] % 13 + (long long)a[i] * b[i] / 1000003;
}
