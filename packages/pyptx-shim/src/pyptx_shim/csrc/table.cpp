// The process-local table `handle -> launch config`, the launch itself, and the C ABI that
// fills the table. Lookups take a shared lock; a config is never changed once published
// (changes copy it), so a launch holds its config without the lock.

#include <atomic>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "shim.h"

#define PYPTX_EXPORT __attribute__((visibility("default")))

namespace pyptx_shim {

namespace {
std::shared_mutex table_mutex;
std::unordered_map<uint64_t, std::shared_ptr<const Config>> table;
thread_local std::string last_error;

// Set the function attributes a config needs on `fn`: the dynamic shared memory opt-in and,
// past 8 CTAs, non-portable cluster sizes. Every device's function gets them.
int apply_attributes(CUfunction fn, unsigned smem, const unsigned cluster[3]) {
  Driver& d = driver();
  if (!d.lib) return fail(d.error);
  // Static and dynamic shared memory together past 48 KiB need the opt-in, and the static
  // size is not known here: opt in for every dynamic window (a no-op below the default).
  if (smem > 0) {
    CUresult r = d.set_attr(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem);
    if (r != 0)
      return fail("cannot raise dynamic shared memory to " + std::to_string(smem) +
                  " bytes: " + cu_error(r));
  }
  if (cluster[0] * cluster[1] * cluster[2] > 8) {
    CUresult r = d.set_attr(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
    if (r != 0) return fail("cannot allow a non-portable cluster size: " + cu_error(r));
  }
  return 0;
}

// Replace the config of `handle` with a changed copy; `change` returns 0 or fail(...).
template <typename Change>
int update(uint64_t handle, const char* what, Change change) {
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(handle);
  if (it == table.end()) return fail(std::string(what) + ": unknown handle " + std::to_string(handle));
  auto c = std::make_shared<Config>(*it->second);
  if (int r = change(*c)) return r;
  it->second = std::move(c);
  return 0;
}
}  // namespace

int fail(const std::string& msg) {
  last_error = msg;
  return -1;
}

const std::string& last_error_message() { return last_error; }

std::shared_ptr<const Config> lookup(uint64_t handle) {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(handle);
  return it == table.end() ? nullptr : it->second;
}

namespace {
std::atomic<Resolver> resolver{nullptr};
}  // namespace

void set_resolver(Resolver r) { resolver.store(r); }

std::shared_ptr<const Config> lookup_or_resolve(uint64_t handle) {
  auto c = lookup(handle);
  if (c) return c;
  Resolver r = resolver.load();
  if (!r || !r(handle)) return nullptr;
  return lookup(handle);
}

int do_launch(const Config& c, CUstream stream, const uint64_t* ptrs, int n, int device) {
  if (n != c.n_ptrs) {
    return fail("launch got " + std::to_string(n) + " pointer arguments, the kernel takes " +
                std::to_string(c.n_ptrs));
  }
  Driver& d = driver();
  if (!d.lib) return fail(d.error);
  if (CUresult r = ensure_current_context(device, n ? ptrs[0] : 0))
    return fail("no CUDA context on this thread, and making the primary one current failed: " +
                cu_error(r));
  void* args[kMaxParams];
  uint64_t vals[kMaxParams];
  alignas(64) unsigned char maps[kMaxTensorMaps][kTensorMapBytes];
  int k = 0;
  for (int i = 0; i < n; ++i) {
    vals[i] = ptrs[i];
    args[k++] = &vals[i];
  }
  for (const auto& s : c.scalars) args[k++] = const_cast<unsigned char*>(s.data());
  int m = 0;
  for (const auto& t : c.tmas) {
    if (m >= kMaxTensorMaps) return fail("at most 8 tensor maps per kernel");
    std::memcpy(maps[m], t.blob, kTensorMapBytes);
    if (!d.tmap_replace) return fail("CUDA driver lacks cuTensorMapReplaceAddress (needs 12.0+)");
    CUresult r = d.tmap_replace(maps[m], reinterpret_cast<void*>(ptrs[t.arg_index]));
    if (r != 0) return fail("cuTensorMapReplaceAddress failed: " + cu_error(r));
    args[k++] = maps[m++];
  }
  // Loaded on several devices and no device given (a framework launching on its current
  // device): the current context's device picks the function.
  if (device < 0 && c.n_device_fns > 1 && d.ctx_device) {
    int current = -1;
    if (d.ctx_device(&current) == 0) device = current;
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

}  // namespace pyptx_shim

using namespace pyptx_shim;

extern "C" {

PYPTX_EXPORT const char* pyptx_shim_last_error() { return last_error_message().c_str(); }

PYPTX_EXPORT int pyptx_shim_register(uint64_t handle, void* fn, const unsigned* grid,
                                     const unsigned* block, const unsigned* cluster,
                                     unsigned smem, int n_ptrs) {
  if (!fn) return fail("register: CUfunction is null");
  if (n_ptrs < 0 || n_ptrs > kMaxParams / 2) return fail("register: bad pointer count");
  for (int i = 0; i < 3; ++i) {
    if (!grid[i] || !block[i] || !cluster[i]) return fail("register: zero grid/block/cluster dim");
  }
  if (int r = apply_attributes(fn, smem, cluster)) return r;
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

PYPTX_EXPORT int pyptx_shim_add_scalar(uint64_t handle, const void* data, size_t n) {
  if (!data || n == 0 || n > 256) return fail("add_scalar: expected 1..256 bytes");
  return update(handle, "add_scalar", [&](Config& c) {
    if ((int)(c.n_ptrs + c.scalars.size() + c.tmas.size()) >= kMaxParams - 1)
      return fail("add_scalar: too many parameters");
    const auto* p = static_cast<const unsigned char*>(data);
    c.scalars.emplace_back(p, p + n);
    return 0;
  });
}

PYPTX_EXPORT int pyptx_shim_add_tma(uint64_t handle, int arg_index, const void* blob) {
  if (!blob) return fail("add_tma: tensor map is null");
  return update(handle, "add_tma", [&](Config& c) {
    if (arg_index < 0 || arg_index >= c.n_ptrs)
      return fail("add_tma: argument index " + std::to_string(arg_index) + " out of range");
    if (c.tmas.size() >= kMaxTensorMaps) return fail("add_tma: at most 8 tensor maps per kernel");
    TmaSpec t;
    t.arg_index = arg_index;
    std::memcpy(t.blob, blob, kTensorMapBytes);
    c.tmas.push_back(t);
    return 0;
  });
}

PYPTX_EXPORT int pyptx_shim_set_device_function(uint64_t handle, int device, void* fn) {
  if (!fn) return fail("set_device_function: CUfunction is null");
  if (device < 0 || device >= kMaxDevices)
    return fail("set_device_function: device ordinal " + std::to_string(device) + " out of range");
  std::shared_ptr<const Config> current = lookup(handle);
  if (!current) return fail("set_device_function: unknown handle " + std::to_string(handle));
  // The same attributes as the first device's function (cluster size, shared memory).
  if (int r = apply_attributes(fn, current->smem, current->cluster)) return r;
  return update(handle, "set_device_function", [&](Config& c) {
    if (!c.device_fn[device]) ++c.n_device_fns;
    c.device_fn[device] = fn;
    return 0;
  });
}

PYPTX_EXPORT int pyptx_shim_set_pdl(uint64_t handle, int on) {
  return update(handle, "set_pdl", [&](Config& c) {
    c.pdl = on != 0;
    return 0;
  });
}

PYPTX_EXPORT int pyptx_shim_unregister(uint64_t handle) {
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  return table.erase(handle) ? 0 : fail("unregister: unknown handle " + std::to_string(handle));
}

PYPTX_EXPORT int pyptx_shim_launch_raw(uint64_t handle, void* stream, void** ptrs, int n) {
  auto c = lookup(handle);
  if (!c) return fail("launch: unknown kernel handle " + std::to_string(handle));
  if (n < 0 || n > kMaxParams / 2 || (n && !ptrs)) return fail("launch: bad pointer array");
  return do_launch(*c, stream, reinterpret_cast<const uint64_t*>(ptrs), n);
}

}  // extern "C"
