// The CUDA driver, resolved at run time with dlopen so the shim builds and imports on a
// machine with no GPU and reports why it cannot launch there.

#include <dlfcn.h>

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
