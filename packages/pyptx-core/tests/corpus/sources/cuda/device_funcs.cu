// Non-inlined device functions, recursion, function pointers (call prototypes), local arrays.
__device__ __noinline__ float poly(float x, const float* c, int n) {
    float r = 0.f;
    for (int i = n - 1; i >= 0; --i) r = r * x + c[i];
    return r;
}
__device__ __noinline__ int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
__device__ __noinline__ float2 sincos_pair(float x) { float s, c; __sincosf(x, &s, &c); return make_float2(s, c); }
typedef float (*unary_fn)(float);
__device__ float f_sq(float x) { return x * x; }
__device__ float f_neg(float x) { return -x; }
__device__ float f_exp(float x) { return __expf(x); }
__device__ unary_fn table[3] = {f_sq, f_neg, f_exp};
__global__ void call_everything(float* y, const float* x, int sel) {
    float local[8];
    for (int i = 0; i < 8; ++i) local[i] = x[(threadIdx.x + i) & 255];
    float v = poly(x[threadIdx.x], local, 8 - (sel & 3));
    float2 sc = sincos_pair(v);
    unary_fn f = table[sel % 3];
    y[threadIdx.x] = f(sc.x) + sc.y + fib(sel & 7);
}
struct Big { double a[6]; int tag; };
__device__ __noinline__ Big make_big(int t) { Big b; for (int i = 0; i < 6; ++i) b.a[i] = t * i; b.tag = t; return b; }
__global__ void struct_return(double* out) {
    Big b = make_big(threadIdx.x);
    out[threadIdx.x] = b.a[threadIdx.x % 6] + b.tag;
}
