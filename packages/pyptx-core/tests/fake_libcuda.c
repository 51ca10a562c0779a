/* A stand-in for libcuda with the entry points pyptx.driver binds, for test_driver_ctypes.py:
   each answers from fixed values or echoes its arguments, so the ctypes marshaling (argument
   types, out-parameters, 64-bit handles and addresses, error codes) is checked without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int init_result = 0;
static void* current = 0;
static int dyn_smem = 0;

void fake_set_init_result(int r) { init_result = r; }
int cuInit(unsigned flags) { return flags ? 1 : init_result; }
int cuGetErrorName(int err, const char** name) {
  switch (err) {
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 218: *name = "CUDA_ERROR_INVALID_PTX"; return 0;
    default: return 1;
  }
}
int cuDriverGetVersion(int* v) { *v = 12040; return 0; }
int cuDeviceGetCount(int* n) { *n = 2; return 0; }
int cuDeviceGet(int* dev, int ordinal) {
  if (ordinal < 0 || ordinal > 1) return 101;
  *dev = 10 + ordinal;
  return 0;
}
int cuDeviceGetAttribute(int* v, int attr, int dev) {
  switch (attr) {
    case 75: *v = 9; return 0;
    case 76: *v = 0; return 0;
    case 97: *v = 232448; return 0;
    case 16: *v = 132 + (dev - 10); return 0;
    default: return 1;
  }
}
int cuDeviceGetName(char* buf, int len, int dev) { snprintf(buf, len, "Fake GPU %d", dev - 10); return 0; }
int cuDeviceTotalMem_v2(size_t* bytes, int dev) { *bytes = (size_t)80 << 30; return dev == 10 || dev == 11 ? 0 : 101; }
int cuDevicePrimaryCtxRetain(void** ctx, int dev) { *ctx = (void*)(uintptr_t)(0x7f0000001000ull + dev); return 0; }
int cuCtxGetCurrent(void** ctx) { *ctx = current; return 0; }
int cuCtxSetCurrent(void* ctx) { current = ctx; return 0; }
int cuCtxGetDevice(int* dev) {
  if (!current) return 201;
  *dev = (int)((uintptr_t)current - 0x7f0000001000ull) - 10;
  return 0;
}
int cuModuleLoadData(void** mod, const void* image) {
  if (memcmp(image, "\177ELF", 4) != 0) return 200;
  *mod = (void*)(uintptr_t)0x7f0000002000ull;
  return 0;
}
int cuModuleLoadDataEx(void** mod, const void* image, unsigned n, int* opts, void** vals) {
  if (strstr((const char*)image, ".entry")) { *mod = (void*)(uintptr_t)0x7f0000002000ull; return 0; }
  for (unsigned i = 0; i + 1 < n; i += 2)
    if (opts[i] == 5 && opts[i + 1] == 6) snprintf((char*)vals[i], (size_t)(uintptr_t)vals[i + 1], "fake ptxas: no .entry");
  return 218;
}
int cuModuleGetFunction(void** fn, void* mod, const char* name) {
  if ((uintptr_t)mod != 0x7f0000002000ull || !*name) return 500;
  *fn = (void*)(uintptr_t)(0x7f0000003000ull + strlen(name));
  return 0;
}
int cuFuncGetAttribute(int* v, int attr, void* fn) {
  if (!fn) return 1;
  *v = attr == 8 ? dyn_smem : 0;
  return 0;
}
int cuFuncSetAttribute(void* fn, int attr, int value) {
  if (!fn || attr != 8 || value > 232448) return 1;
  dyn_smem = value;
  return 0;
}
int cuTensorMapEncodeTiled(void* map, int dt, unsigned rank, void* addr, const uint64_t* dims,
                           const uint64_t* strides, const uint32_t* box, const uint32_t* es,
                           int il, int sw, int l2, int oob) {
  if ((uintptr_t)map % 64 || rank < 1 || rank > 2) return 1;
  uint64_t out[16] = {0};
  int k = 0;
  out[k++] = dt; out[k++] = rank; out[k++] = (uintptr_t)addr;
  for (unsigned i = 0; i < rank; i++) out[k++] = dims[i];
  for (unsigned i = 0; i + 1 < rank; i++) out[k++] = strides[i];
  for (unsigned i = 0; i < rank; i++) out[k++] = box[i];
  for (unsigned i = 0; i < rank; i++) out[k++] = es[i];
  out[k++] = il; out[k++] = sw; out[k++] = l2; out[k++] = oob;
  memcpy(map, out, sizeof out);
  return 0;
}
