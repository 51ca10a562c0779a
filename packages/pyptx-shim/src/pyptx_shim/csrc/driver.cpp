// The CUDA driver, resolved at run time with dlopen so the shim builds and imports on a
// machine with no GPU and reports why it cannot launch there.

#include <dlfcn.h>

#include <mutex>

#include "shim.h"

namespace pyptx_shim {

namespace {
using PFN_cuInit = CUresult (*)(unsigned);

template <typename F>
F sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

Driver open_driver() {
  Driver d;
  d.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!d.lib) d.lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!d.lib) {
    const char* e = dlerror();
    d.error = std::string("CUDA driver not found (libcuda.so.1): ") + (e ? e : "dlopen failed");
    return d;
  }
  auto init = sym<PFN_cuInit>(d.lib, "cuInit");
  d.launch = sym<PFN_cuLaunchKernel>(d.lib, "cuLaunchKernel");
  d.launch_ex = sym<PFN_cuLaunchKernelEx>(d.lib, "cuLaunchKernelEx");
  d.set_attr = sym<PFN_cuFuncSetAttribute>(d.lib, "cuFuncSetAttribute");
  d.error_name = sym<PFN_cuGetErrorName>(d.lib, "cuGetErrorName");
  d.tmap_replace = sym<PFN_cuTensorMapReplaceAddress>(d.lib, "cuTensorMapReplaceAddress");
  d.ctx_device = sym<PFN_cuCtxGetDevice>(d.lib, "cuCtxGetDevice");
  d.ctx_get = sym<PFN_cuCtxGetCurrent>(d.lib, "cuCtxGetCurrent");
  d.ctx_set = sym<PFN_cuCtxSetCurrent>(d.lib, "cuCtxSetCurrent");
  d.device_get = sym<PFN_cuDeviceGet>(d.lib, "cuDeviceGet");
  d.primary_retain = sym<PFN_cuDevicePrimaryCtxRetain>(d.lib, "cuDevicePrimaryCtxRetain");
  d.pointer_attr = sym<PFN_cuPointerGetAttribute>(d.lib, "cuPointerGetAttribute");
  if (!init || !d.launch || !d.set_attr) {
    d.error = "CUDA driver is too old: cuInit/cuLaunchKernel/cuFuncSetAttribute missing";
    d.lib = nullptr;
    return d;
  }
  CUresult r = init(0);
  if (r != 0) {
    d.error = "cuInit failed with CUresult " + std::to_string(r) + " (no usable GPU?)";
    d.lib = nullptr;
  }
  return d;
}
}  // namespace

Driver& driver() {
  static Driver d = open_driver();
  return d;
}

CUresult ensure_current_context(int device, uint64_t ptr) {
  static std::mutex mutex;
  static CUcontext primary[kMaxDevices] = {};  // retained once per process, never released
  Driver& d = driver();
  CUcontext current = nullptr;
  if (!d.ctx_get || !d.ctx_set || !d.device_get || !d.primary_retain) return 0;  // the launch reports it
  if (d.ctx_get(&current) == 0 && current) return 0;
  if (device < 0 && ptr && d.pointer_attr) {
    int ordinal = -1;
    if (d.pointer_attr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) == 0) device = ordinal;
  }
  if (device < 0) device = 0;
  if (device >= kMaxDevices) return 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (!primary[device]) {
    int dev = 0;
    CUresult r = d.device_get(&dev, device);
    if (r == 0) r = d.primary_retain(&primary[device], dev);
    if (r != 0) return r;
  }
  return d.ctx_set(primary[device]);
}

std::string cu_error(CUresult r) {
  const char* name = nullptr;
  Driver& d = driver();
  if (d.error_name && d.error_name(r, &name) == 0 && name) return name;
  return "CUresult " + std::to_string(r);
}

}  // namespace pyptx_shim

extern "C" __attribute__((visibility("default"))) const char* pyptx_shim_driver_error() {
  pyptx_shim::Driver& d = pyptx_shim::driver();
  return d.lib ? nullptr : d.error.c_str();
}
