// pyptx-shim: a process-local table `handle -> launch config` and a fast launch.
//
// Built as the CPython extension module `pyptx_shim._shim`. The same shared
// object also exports a C ABI (pyptx_shim_*) for callers that load it with
// ctypes or dlopen. The CUDA driver is resolved at run time with dlopen, so
// the module builds and imports on a machine with no GPU and reports why it
// cannot launch there. Every entry point validates its arguments and returns
// an error instead of crashing.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// ---------------------------------------------------------------- driver ABI
// The few driver types and entry points the shim uses, declared here so that
// building needs no CUDA headers. Layouts follow the CUDA driver API.
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

using PFN_cuInit = CUresult (*)(unsigned);
using PFN_cuLaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, CUstream, void**, void**);
using PFN_cuLaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using PFN_cuFuncSetAttribute = CUresult (*)(CUfunction, int, int);
using PFN_cuGetErrorName = CUresult (*)(CUresult, const char**);
using PFN_cuTensorMapReplaceAddress = CUresult (*)(void*, void*);

struct Driver {
  void* lib = nullptr;
  std::string error;
  PFN_cuLaunchKernel launch = nullptr;
  PFN_cuLaunchKernelEx launch_ex = nullptr;
  PFN_cuFuncSetAttribute set_attr = nullptr;
  PFN_cuGetErrorName error_name = nullptr;
  PFN_cuTensorMapReplaceAddress tmap_replace = nullptr;
};

Driver& driver() {
  static Driver d = [] {
    Driver d;
    d.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d.lib) d.lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!d.lib) {
      const char* e = dlerror();
      d.error = std::string("CUDA driver not found (libcuda.so.1): ") + (e ? e : "dlopen failed");
      return d;
    }
    auto init = reinterpret_cast<PFN_cuInit>(dlsym(d.lib, "cuInit"));
    d.launch = reinterpret_cast<PFN_cuLaunchKernel>(dlsym(d.lib, "cuLaunchKernel"));
    d.launch_ex = reinterpret_cast<PFN_cuLaunchKernelEx>(dlsym(d.lib, "cuLaunchKernelEx"));
    d.set_attr = reinterpret_cast<PFN_cuFuncSetAttribute>(dlsym(d.lib, "cuFuncSetAttribute"));
    d.error_name = reinterpret_cast<PFN_cuGetErrorName>(dlsym(d.lib, "cuGetErrorName"));
    d.tmap_replace =
        reinterpret_cast<PFN_cuTensorMapReplaceAddress>(dlsym(d.lib, "cuTensorMapReplaceAddress"));
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
  }();
  return d;
}

std::string cu_error(CUresult r) {
  const char* name = nullptr;
  Driver& d = driver();
  if (d.error_name && d.error_name(r, &name) == 0 && name) return name;
  return "CUresult " + std::to_string(r);
}

// ---------------------------------------------------------------- the table
constexpr int kMaxParams = 512;
constexpr int kTensorMapBytes = 128;

struct TmaSpec {
  int arg_index;                        // which pointer argument the map addresses
  alignas(64) unsigned char blob[kTensorMapBytes];  // the encoded CUtensorMap (host copy)
};

constexpr int kMaxDevices = 64;

struct Config {
  CUfunction fn = nullptr;
  CUfunction device_fn[kMaxDevices] = {};  // per-device overrides (modules load per context)
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned cluster[3] = {1, 1, 1};
  unsigned smem = 0;
  int n_ptrs = 0;                       // pointer params the launch must supply
  bool pdl = false;                     // programmatic dependent launch (griddepcontrol)
  std::vector<std::vector<unsigned char>> scalars;  // raw bytes of trailing scalar params
  std::vector<TmaSpec> tmas;                          // by-value tensor maps, after scalars
};

std::shared_mutex table_mutex;
std::unordered_map<uint64_t, std::shared_ptr<const Config>> table;
thread_local std::string last_error;

int fail(const std::string& msg) {
  last_error = msg;
  return -1;
}

std::shared_ptr<const Config> lookup(uint64_t handle) {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(handle);
  return it == table.end() ? nullptr : it->second;
}

int do_launch(const Config& c, CUstream stream, const uint64_t* ptrs, int n, int device = -1) {
  if (n != c.n_ptrs) {
    return fail("launch got " + std::to_string(n) + " pointer arguments, the kernel takes " +
                std::to_string(c.n_ptrs));
  }
  Driver& d = driver();
  if (!d.lib) return fail(d.error);
  void* args[kMaxParams];
  uint64_t vals[kMaxParams];
  alignas(64) unsigned char maps[8][kTensorMapBytes];
  int k = 0;
  for (int i = 0; i < n; ++i) {
    vals[i] = ptrs[i];
    args[k++] = &vals[i];
  }
  for (const auto& s : c.scalars) args[k++] = const_cast<unsigned char*>(s.data());
  int m = 0;
  for (const auto& t : c.tmas) {
    if (m >= 8) return fail("at most 8 tensor maps per kernel");
    std::memcpy(maps[m], t.blob, kTensorMapBytes);
    if (!d.tmap_replace) return fail("CUDA driver lacks cuTensorMapReplaceAddress (needs 12.0+)");
    CUresult r = d.tmap_replace(maps[m], reinterpret_cast<void*>(ptrs[t.arg_index]));
    if (r != 0) return fail("cuTensorMapReplaceAddress failed: " + cu_error(r));
    args[k++] = maps[m++];
  }
  CUfunction fn = c.fn;
  if (device >= 0 && device < kMaxDevices && c.device_fn[device]) fn = c.device_fn[device];
  if (!fn) return fail("no kernel function registered for device " + std::to_string(device));
  CUresult r;
  const bool clustered = c.cluster[0] * c.cluster[1] * c.cluster[2] != 1;
  if (!clustered && !c.pdl) {
    r = d.launch(fn, c.grid[0], c.grid[1], c.grid[2], c.block[0], c.block[1], c.block[2],
                 c.smem, stream, args, nullptr);
  } else {
    if (!d.launch_ex) return fail("CUDA driver lacks cuLaunchKernelEx (clusters and PDL need 12.0+)");
    CUlaunchAttribute attrs[2];
    std::memset(attrs, 0, sizeof(attrs));
    unsigned n_attrs = 0;
    if (clustered) {
      CUlaunchAttribute& a = attrs[n_attrs++];
      a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      a.value.clusterDim.x = c.cluster[0];
      a.value.clusterDim.y = c.cluster[1];
      a.value.clusterDim.z = c.cluster[2];
    }
    if (c.pdl) {
      CUlaunchAttribute& a = attrs[n_attrs++];
      a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      a.value.programmatic_serialization_allowed = 1;
    }
    CUlaunchConfig cfg{c.grid[0], c.grid[1],  c.grid[2], c.block[0], c.block[1],
                       c.block[2], c.smem, stream, attrs, n_attrs};
    r = d.launch_ex(&cfg, fn, args, nullptr);
  }
  if (r != 0) return fail("kernel launch failed: " + cu_error(r));
  return 0;
}

}  // namespace

// ---------------------------------------------------------------- C ABI
extern "C" {

__attribute__((visibility("default"))) const char* pyptx_shim_last_error() {
  return last_error.c_str();
}

__attribute__((visibility("default"))) const char* pyptx_shim_driver_error() {
  Driver& d = driver();
  return d.lib ? nullptr : d.error.c_str();
}

__attribute__((visibility("default"))) int pyptx_shim_register(
    uint64_t handle, void* fn, const unsigned* grid, const unsigned* block,
    const unsigned* cluster, unsigned smem, int n_ptrs) {
  if (!fn) return fail("register: CUfunction is null");
  if (n_ptrs < 0 || n_ptrs > kMaxParams / 2) return fail("register: bad pointer count");
  for (int i = 0; i < 3; ++i) {
    if (!grid[i] || !block[i] || !cluster[i]) return fail("register: zero grid/block/cluster dim");
  }
  Driver& d = driver();
  if (!d.lib) return fail(d.error);
  // Static and dynamic shared memory together past 48 KiB need the opt-in, and the static
  // size is not known here: opt in for every dynamic window (a no-op below the default).
  if (smem > 0) {
    CUresult r = d.set_attr(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem);
    if (r != 0) return fail("cannot raise dynamic shared memory to " + std::to_string(smem) +
                            " bytes: " + cu_error(r));
  }
  if (cluster[0] * cluster[1] * cluster[2] > 8) {
    CUresult r = d.set_attr(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
    if (r != 0) return fail("cannot allow a non-portable cluster size: " + cu_error(r));
  }
  auto c = std::make_shared<Config>();
  c->fn = fn;
  std::memcpy(c->grid, grid, sizeof(c->grid));
  std::memcpy(c->block, block, sizeof(c->block));
  std::memcpy(c->cluster, cluster, sizeof(c->cluster));
  c->smem = smem;
  c->n_ptrs = n_ptrs;
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  table[handle] = std::move(c);
  return 0;
}

__attribute__((visibility("default"))) int pyptx_shim_add_scalar(uint64_t handle,
                                                                 const void* data, size_t n) {
  if (!data || n == 0 || n > 256) return fail("add_scalar: expected 1..256 bytes");
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(handle);
  if (it == table.end()) return fail("add_scalar: unknown handle " + std::to_string(handle));
  auto c = std::make_shared<Config>(*it->second);
  if ((int)(c->n_ptrs + c->scalars.size() + c->tmas.size()) >= kMaxParams - 1)
    return fail("add_scalar: too many parameters");
  const auto* p = static_cast<const unsigned char*>(data);
  c->scalars.emplace_back(p, p + n);
  it->second = std::move(c);
  return 0;
}

__attribute__((visibility("default"))) int pyptx_shim_add_tma(uint64_t handle, int arg_index,
                                                              const void* blob) {
  if (!blob) return fail("add_tma: tensor map is null");
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(handle);
  if (it == table.end()) return fail("add_tma: unknown handle " + std::to_string(handle));
  if (arg_index < 0 || arg_index >= it->second->n_ptrs)
    return fail("add_tma: argument index " + std::to_string(arg_index) + " out of range");
  if (it->second->tmas.size() >= 8) return fail("add_tma: at most 8 tensor maps per kernel");
  auto c = std::make_shared<Config>(*it->second);
  TmaSpec t;
  t.arg_index = arg_index;
  std::memcpy(t.blob, blob, kTensorMapBytes);
  c->tmas.push_back(t);
  it->second = std::move(c);
  return 0;
}

__attribute__((visibility("default"))) int pyptx_shim_set_device_function(uint64_t handle,
                                                                          int device, void* fn) {
  if (!fn) return fail("set_device_function: CUfunction is null");
  if (device < 0 || device >= kMaxDevices)
    return fail("set_device_function: device ordinal " + std::to_string(device) + " out of range");
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(handle);
  if (it == table.end()) return fail("set_device_function: unknown handle " + std::to_string(handle));
  auto c = std::make_shared<Config>(*it->second);
  c->device_fn[device] = fn;
  it->second = std::move(c);
  return 0;
}

__attribute__((visibility("default"))) int pyptx_shim_set_pdl(uint64_t handle, int on) {
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(handle);
  if (it == table.end()) return fail("set_pdl: unknown handle " + std::to_string(handle));
  auto c = std::make_shared<Config>(*it->second);
  c->pdl = on != 0;
  it->second = std::move(c);
  return 0;
}

__attribute__((visibility("default"))) int pyptx_shim_unregister(uint64_t handle) {
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  return table.erase(handle) ? 0 : fail("unregister: unknown handle " + std::to_string(handle));
}

__attribute__((visibility("default"))) int pyptx_shim_launch_raw(uint64_t handle, void* stream,
                                                                 void** ptrs, int n) {
  auto c = lookup(handle);
  if (!c) return fail("launch: unknown kernel handle " + std::to_string(handle));
  if (n < 0 || n > kMaxParams / 2 || (n && !ptrs)) return fail("launch: bad pointer array");
  return do_launch(*c, stream, reinterpret_cast<const uint64_t*>(ptrs), n);
}

}  // extern "C"


// ---------------------------------------------------------------- XLA typed FFI
// The handler JAX calls through jax.ffi.ffi_call("pyptx_launch"). The structs
// below mirror the stable C ABI of XLA's FFI (xla/ffi/api/c_api.h), declared
// here so building needs no XLA headers; only the fields the handler reads.
namespace xla_ffi {

struct ExtensionBase {
  size_t struct_size;
  int type;  // 1: metadata query
  ExtensionBase* next;
};
struct ApiVersion {
  size_t struct_size;
  ExtensionBase* extension_start;
  int major_version;
  int minor_version;
};
struct Metadata {
  size_t struct_size;
  ApiVersion api_version;
  uint32_t traits;
};
struct MetadataExtension {
  ExtensionBase base;
  Metadata* metadata;
};
struct Error;
struct ErrorCreateArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* message;
  int errc;
};
struct StreamGetArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  void* ctx;
  void* stream;
};
struct DeviceOrdinalGetArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  void* ctx;
  int32_t device_ordinal;
};
using Fn = void*;
struct Api {
  size_t struct_size;
  ExtensionBase* extension_start;
  ApiVersion api_version;
  const void* internal_api;
  Error* (*error_create)(ErrorCreateArgs*);
  Fn error_get_message, error_destroy, handler_register;
  Error* (*stream_get)(StreamGetArgs*);
  Fn type_register, execution_context_get, state_set, state_get, device_memory_allocate,
      device_memory_free, thread_pool_schedule, thread_pool_num_threads, future_create,
      future_set_available, future_set_error, run_id_get;
  Error* (*device_ordinal_get)(DeviceOrdinalGetArgs*);
};
struct Args {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  int* types;  // 1: buffer
  void** args;
};
struct ByteSpan {
  const char* ptr;
  size_t len;
};
struct Attrs {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  int* types;  // 3: scalar
  ByteSpan** names;
  void** attrs;
};
struct Scalar {
  int dtype;  // 4: s32, 5: s64, 8: u32, 9: u64
  void* value;
};
struct Buffer {
  size_t struct_size;
  ExtensionBase* extension_start;
  int dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
};
struct CallFrame {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Api* api;
  void* ctx;
  int stage;  // 3: execute
  Args args;
  Args rets;  // same layout as Args
  Attrs attrs;
};

Error* error(const CallFrame* cf, const std::string& msg) {
  ErrorCreateArgs a{sizeof(ErrorCreateArgs), nullptr, msg.c_str(), 13 /* INTERNAL */};
  return cf->api->error_create(&a);
}

bool read_handle(const CallFrame* cf, uint64_t* out) {
  for (int64_t i = 0; i < cf->attrs.size; ++i) {
    const ByteSpan* name = cf->attrs.names[i];
    if (name->len != 12 || std::memcmp(name->ptr, "cubin_handle", 12) != 0) continue;
    if (cf->attrs.types[i] != 3) return false;
    const Scalar* s = static_cast<const Scalar*>(cf->attrs.attrs[i]);
    switch (s->dtype) {
      case 4: *out = (uint64_t)*static_cast<const int32_t*>(s->value); return true;
      case 5: *out = (uint64_t)*static_cast<const int64_t*>(s->value); return true;
      case 8: *out = *static_cast<const uint32_t*>(s->value); return true;
      case 9: *out = *static_cast<const uint64_t*>(s->value); return true;
      default: return false;
    }
  }
  return false;
}

}  // namespace xla_ffi

extern "C" __attribute__((visibility("default"))) xla_ffi::Error* PyptxLaunch(
    xla_ffi::CallFrame* cf) {
  using namespace xla_ffi;
  if (cf->extension_start && cf->extension_start->type == 1) {
    Metadata* m = reinterpret_cast<MetadataExtension*>(cf->extension_start)->metadata;
    m->api_version.major_version = cf->api ? cf->api->api_version.major_version : 0;
    m->api_version.minor_version = cf->api ? cf->api->api_version.minor_version : 1;
    m->traits = 0;
    return nullptr;
  }
  if (cf->stage != 3) return nullptr;
  uint64_t handle = 0;
  if (!read_handle(cf, &handle)) return error(cf, "pyptx_launch: missing int attribute cubin_handle");
  auto c = lookup(handle);
  if (!c) return error(cf, "pyptx_launch: unknown kernel handle " + std::to_string(handle));
  int64_t n = cf->args.size + cf->rets.size;
  if (n > kMaxParams / 2) return error(cf, "pyptx_launch: too many buffers");
  uint64_t ptrs[kMaxParams / 2];
  int k = 0;
  for (const Args* group : {&cf->args, &cf->rets}) {
    for (int64_t i = 0; i < group->size; ++i) {
      if (group->types[i] != 1) return error(cf, "pyptx_launch: non-buffer argument");
      ptrs[k++] = reinterpret_cast<uint64_t>(static_cast<Buffer*>(group->args[i])->data);
    }
  }
  StreamGetArgs sa{sizeof(StreamGetArgs), nullptr, cf->ctx, nullptr};
  if (Error* e = cf->api->stream_get(&sa)) return e;
  int device = -1;
  if (cf->api->struct_size > offsetof(Api, device_ordinal_get) && cf->api->device_ordinal_get) {
    DeviceOrdinalGetArgs da{sizeof(DeviceOrdinalGetArgs), nullptr, cf->ctx, -1};
    if (Error* e = cf->api->device_ordinal_get(&da)) return e;
    device = da.device_ordinal;
  }
  if (do_launch(*c, sa.stream, ptrs, k, device) != 0) return error(cf, "pyptx_launch: " + last_error);
  return nullptr;
}

// ---------------------------------------------------------------- Python module
namespace {

PyObject* ShimError = nullptr;

PyObject* raise_last() {
  PyErr_SetString(ShimError, last_error.c_str());
  return nullptr;
}

bool read_dim3(PyObject* o, unsigned out[3], const char* what) {
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 3) {
    PyErr_Format(PyExc_TypeError, "%s must be a tuple of three ints", what);
    return false;
  }
  for (int i = 0; i < 3; ++i) {
    unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(o, i));
    if (PyErr_Occurred() || v == 0 || v > 0x7fffffffUL) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s[%d] must be a positive 32-bit int", what, i);
      return false;
    }
    out[i] = (unsigned)v;
  }
  return true;
}

// register(handle, cu_function, grid, block, cluster, smem, n_ptrs)
PyObject* py_register(PyObject*, PyObject* args) {
  unsigned long long handle, fn;
  PyObject *grid, *block, *cluster;
  unsigned smem;
  int n_ptrs;
  if (!PyArg_ParseTuple(args, "KKOOOIi", &handle, &fn, &grid, &block, &cluster, &smem, &n_ptrs))
    return nullptr;
  unsigned g[3], b[3], c[3];
  if (!read_dim3(grid, g, "grid") || !read_dim3(block, b, "block") ||
      !read_dim3(cluster, c, "cluster"))
    return nullptr;
  if (pyptx_shim_register(handle, reinterpret_cast<void*>(fn), g, b, c, smem, n_ptrs) != 0)
    return raise_last();
  Py_RETURN_NONE;
}

PyObject* py_add_scalar(PyObject*, PyObject* args) {
  unsigned long long handle;
  Py_buffer buf;
  if (!PyArg_ParseTuple(args, "Ky*", &handle, &buf)) return nullptr;
  int r = pyptx_shim_add_scalar(handle, buf.buf, (size_t)buf.len);
  PyBuffer_Release(&buf);
  if (r != 0) return raise_last();
  Py_RETURN_NONE;
}

PyObject* py_add_tma(PyObject*, PyObject* args) {
  unsigned long long handle;
  int arg_index;
  Py_buffer buf;
  if (!PyArg_ParseTuple(args, "Kiy*", &handle, &arg_index, &buf)) return nullptr;
  if (buf.len != kTensorMapBytes) {
    PyBuffer_Release(&buf);
    PyErr_Format(PyExc_ValueError, "a tensor map is %d bytes, got %zd", kTensorMapBytes, buf.len);
    return nullptr;
  }
  int r = pyptx_shim_add_tma(handle, arg_index, buf.buf);
  PyBuffer_Release(&buf);
  if (r != 0) return raise_last();
  Py_RETURN_NONE;
}

PyObject* py_set_device_function(PyObject*, PyObject* args) {
  unsigned long long handle, fn;
  int device;
  if (!PyArg_ParseTuple(args, "KiK", &handle, &device, &fn)) return nullptr;
  if (pyptx_shim_set_device_function(handle, device, reinterpret_cast<void*>(fn)) != 0)
    return raise_last();
  Py_RETURN_NONE;
}

PyObject* py_ffi_handler(PyObject*, PyObject*) {
  return PyCapsule_New(reinterpret_cast<void*>(&PyptxLaunch), nullptr, nullptr);
}

// set_pdl(handle, on): launch with programmatic stream serialization (the kernel must
// execute griddepcontrol.wait before touching memory an earlier kernel writes).
PyObject* py_set_pdl(PyObject*, PyObject* args) {
  unsigned long long handle;
  int on;
  if (!PyArg_ParseTuple(args, "Kp", &handle, &on)) return nullptr;
  if (pyptx_shim_set_pdl(handle, on) != 0) return raise_last();
  Py_RETURN_NONE;
}

PyObject* py_unregister(PyObject*, PyObject* arg) {
  unsigned long long handle = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  if (pyptx_shim_unregister(handle) != 0) return raise_last();
  Py_RETURN_NONE;
}

// launch(handle, stream, p0, p1, ...): the hot path, METH_FASTCALL, no allocation.
PyObject* py_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "launch(handle, stream, *pointers)");
    return nullptr;
  }
  unsigned long long handle = PyLong_AsUnsignedLongLong(args[0]);
  void* stream = PyLong_AsVoidPtr(args[1]);
  if (PyErr_Occurred()) return nullptr;
  Py_ssize_t n = nargs - 2;
  if (n > kMaxParams / 2) {
    PyErr_SetString(PyExc_ValueError, "too many pointer arguments");
    return nullptr;
  }
  uint64_t ptrs[kMaxParams / 2];
  for (Py_ssize_t i = 0; i < n; ++i) {
    ptrs[i] = PyLong_AsUnsignedLongLong(args[2 + i]);
    if (PyErr_Occurred()) return nullptr;
  }
  auto c = lookup(handle);
  if (!c) {
    PyErr_Format(ShimError, "launch: unknown kernel handle %llu", handle);
    return nullptr;
  }
  if (do_launch(*c, stream, ptrs, (int)n) != 0) return raise_last();
  Py_RETURN_NONE;
}

PyObject* py_driver_error(PyObject*, PyObject*) {
  const char* e = pyptx_shim_driver_error();
  if (!e) Py_RETURN_NONE;
  return PyUnicode_FromString(e);
}

PyObject* py_launch_raw_address(PyObject*, PyObject*) {
  return PyLong_FromVoidPtr(reinterpret_cast<void*>(&pyptx_shim_launch_raw));
}

PyMethodDef methods[] = {
    {"register", py_register, METH_VARARGS,
     "register(handle, cu_function, grid, block, cluster, smem, n_ptrs): store a launch config."},
    {"add_scalar", py_add_scalar, METH_VARARGS,
     "add_scalar(handle, data: bytes): append a by-value scalar parameter."},
    {"add_tma", py_add_tma, METH_VARARGS,
     "add_tma(handle, arg_index, tensor_map: 128 bytes): append a by-value tensor map whose "
     "address is patched to pointer argument arg_index at each launch."},
    {"unregister", py_unregister, METH_O, "unregister(handle): drop a launch config."},
    {"set_pdl", py_set_pdl, METH_VARARGS,
     "set_pdl(handle, on): launch with programmatic dependent launch (PDL) allowed."},
    {"set_device_function", py_set_device_function, METH_VARARGS,
     "set_device_function(handle, device_ordinal, cu_function): the function to launch when "
     "XLA runs the handle on that device."},
    {"ffi_handler", py_ffi_handler, METH_NOARGS,
     "A PyCapsule of the XLA typed-FFI handler PyptxLaunch (for jax.ffi.register_ffi_target)."},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_launch)),
     METH_FASTCALL, "launch(handle, stream, *pointers): launch a registered kernel."},
    {"driver_error", py_driver_error, METH_NOARGS,
     "Why the CUDA driver cannot be used, or None when it loaded."},
    {"launch_raw_address", py_launch_raw_address, METH_NOARGS,
     "Address of the C function pyptx_shim_launch_raw (for ctypes callers)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_shim",
                          "The pyptx C++ launcher: a handle -> launch config table.", -1,
                          methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__shim() {
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  ShimError = PyErr_NewException("pyptx_shim._shim.ShimError", PyExc_RuntimeError, nullptr);
  Py_INCREF(ShimError);
  if (PyModule_AddObject(m, "ShimError", ShimError) < 0) {
    Py_DECREF(ShimError);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
