// pyptx-shim: declarations shared by the launcher's parts.
//
//   driver.cpp   the CUDA driver, opened at run time with dlopen (no CUDA headers needed)
//   table.cpp    the process-local table `handle -> launch config`, the launch, the C ABI
//   xla_ffi.cpp  the XLA typed-FFI handler JAX calls (jax.ffi.ffi_call("pyptx_launch"))
//   module.cpp   the CPython module pyptx_shim._shim
//
// Every entry point validates its arguments and returns an error instead of crashing.

#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pyptx_shim {

// ---------------------------------------------------------------- driver ABI
// The few driver types and entry points the shim uses; layouts follow the CUDA driver API.
using CUresult = int;
using CUfunction = void*;
using CUstream = void*;

struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char raw[64];
    struct {
      unsigned x, y, z;
    } clusterDim;
    int programmatic_serialization_allowed;
  } value;
};

struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};

constexpr int CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14;

using PFN_cuLaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, CUstream, void**, void**);
using PFN_cuLaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using PFN_cuFuncSetAttribute = CUresult (*)(CUfunction, int, int);
using PFN_cuGetErrorName = CUresult (*)(CUresult, const char**);
using PFN_cuTensorMapReplaceAddress = CUresult (*)(void*, void*);
using PFN_cuCtxGetDevice = CUresult (*)(int*);
using CUcontext = void*;
using PFN_cuCtxGetCurrent = CUresult (*)(CUcontext*);
using PFN_cuCtxSetCurrent = CUresult (*)(CUcontext);
using PFN_cuDeviceGet = CUresult (*)(int*, int);
using PFN_cuDevicePrimaryCtxRetain = CUresult (*)(CUcontext*, int);
using PFN_cuPointerGetAttribute = CUresult (*)(void*, int, uint64_t);
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;

struct Driver {
  void* lib = nullptr;  // null when the driver cannot be used; `error` says why
  std::string error;
  PFN_cuLaunchKernel launch = nullptr;
  PFN_cuLaunchKernelEx launch_ex = nullptr;
  PFN_cuFuncSetAttribute set_attr = nullptr;
  PFN_cuGetErrorName error_name = nullptr;
  PFN_cuTensorMapReplaceAddress tmap_replace = nullptr;
  PFN_cuCtxGetDevice ctx_device = nullptr;
  PFN_cuCtxGetCurrent ctx_get = nullptr;
  PFN_cuCtxSetCurrent ctx_set = nullptr;
  PFN_cuDeviceGet device_get = nullptr;
  PFN_cuDevicePrimaryCtxRetain primary_retain = nullptr;
  PFN_cuPointerGetAttribute pointer_attr = nullptr;
};

// The driver, opened (and cuInit'ed) on first use.
Driver& driver();
// Makes a context current on a thread that has none (a framework's worker thread, such as
// torch's autograd engine, launching before anything made one current there): the primary
// context of `device`, or else of the device that holds `ptr`. Returns a CUresult.
CUresult ensure_current_context(int device, uint64_t ptr);
// The driver's name for a CUresult ("CUDA_ERROR_INVALID_VALUE"), or its number.
std::string cu_error(CUresult r);

// ---------------------------------------------------------------- the table
constexpr int kMaxParams = 512;
constexpr int kTensorMapBytes = 128;
constexpr int kMaxTensorMaps = 8;
constexpr int kMaxDevices = 64;

struct TmaSpec {
  int arg_index;                                    // which pointer argument the map addresses
  alignas(64) unsigned char blob[kTensorMapBytes];  // the encoded CUtensorMap (host copy)
};

// One registered kernel. Configs are immutable once published: every change copies.
struct Config {
  CUfunction fn = nullptr;                 // the function of the first registered device
  CUfunction device_fn[kMaxDevices] = {};  // per-device functions (modules load per context)
  int n_device_fns = 0;                    // how many device_fn entries are set
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned cluster[3] = {1, 1, 1};
  unsigned smem = 0;
  int n_ptrs = 0;    // pointer params the launch must supply
  bool pdl = false;  // programmatic dependent launch (griddepcontrol)
  std::vector<std::vector<unsigned char>> scalars;  // raw bytes of trailing scalar params
  std::vector<TmaSpec> tmas;                          // by-value tensor maps, after scalars
};

// The config registered under `handle`, or null.
std::shared_ptr<const Config> lookup(uint64_t handle);
// Called with a handle nobody registered in this process (a graph saved elsewhere names it);
// registers it if it can (from the disk cache) and returns nonzero then.
using Resolver = int (*)(uint64_t handle);
void set_resolver(Resolver resolver);
// `lookup`, and on a miss one try of the resolver: how a program saved in another process
// finds its kernels. Later calls find the config without the resolver.
std::shared_ptr<const Config> lookup_or_resolve(uint64_t handle);
// Launch `c` on `stream` with `n` pointer arguments. `device` is the ordinal the caller runs
// on (XLA tells), or -1: then the current context's device picks among several functions.
int do_launch(const Config& c, CUstream stream, const uint64_t* ptrs, int n, int device = -1);
// Record `msg` as this thread's last error and return -1.
int fail(const std::string& msg);
// This thread's last error message.
const std::string& last_error_message();

}  // namespace pyptx_shim

// ---------------------------------------------------------------- C ABI
extern "C" {
const char* pyptx_shim_last_error();
const char* pyptx_shim_driver_error();
int pyptx_shim_register(uint64_t handle, void* fn, const unsigned* grid, const unsigned* block,
                        const unsigned* cluster, unsigned smem, int n_ptrs);
int pyptx_shim_add_scalar(uint64_t handle, const void* data, size_t n);
int pyptx_shim_add_tma(uint64_t handle, int arg_index, const void* blob);
int pyptx_shim_set_device_function(uint64_t handle, int device, void* fn);
int pyptx_shim_set_pdl(uint64_t handle, int on);
int pyptx_shim_unregister(uint64_t handle);
int pyptx_shim_launch_raw(uint64_t handle, void* stream, void** ptrs, int n);
// The address of the XLA typed-FFI handler PyptxLaunch (an XLA_FFI_Handler).
void* pyptx_shim_ffi_handler();
// The XLA FFI API version the handler was built against (what it reports to XLA).
void pyptx_shim_ffi_api_version(int* major, int* minor);
// 1 if the handler was built against jaxlib's FFI header, 0 if against the shim's own copy.
int pyptx_shim_ffi_from_jaxlib();
}
