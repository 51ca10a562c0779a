// The XLA typed-FFI handler JAX calls through jax.ffi.ffi_call("pyptx_launch").
//
// Built against the FFI C API header jaxlib ships (jax.ffi.include_dir(), found by the
// build hook when jaxlib is importable at build time); otherwise against xla_ffi_mirror.h,
// which copies that header's names and layouts for the fields the handler touches. The
// handler reports the API version it was built against to XLA's metadata query (not the
// version XLA offers).

#include <cstring>
#include <string>

#include "shim.h"

#if __has_include("xla/ffi/api/c_api.h")
#include "xla/ffi/api/c_api.h"
#define PYPTX_FFI_FROM_JAXLIB 1
#else
#define PYPTX_FFI_FROM_JAXLIB 0
#include "xla_ffi_mirror.h"
#endif

namespace {

using pyptx_shim::kMaxParams;

XLA_FFI_Error* error(const XLA_FFI_CallFrame* cf, const std::string& msg) {
  XLA_FFI_Error_Create_Args a{sizeof(XLA_FFI_Error_Create_Args), nullptr, msg.c_str(),
                              XLA_FFI_Error_Code_INTERNAL};
  return cf->api->XLA_FFI_Error_Create(&a);
}

bool read_handle(const XLA_FFI_CallFrame* cf, uint64_t* out) {
  for (int64_t i = 0; i < cf->attrs.size; ++i) {
    const XLA_FFI_ByteSpan* name = cf->attrs.names[i];
    if (name->len != 12 || std::memcmp(name->ptr, "cubin_handle", 12) != 0) continue;
    if (cf->attrs.types[i] != XLA_FFI_AttrType_SCALAR) return false;
    const auto* s = static_cast<const XLA_FFI_Scalar*>(cf->attrs.attrs[i]);
    switch (s->dtype) {
      case XLA_FFI_DataType_S32: *out = (uint64_t)*static_cast<const int32_t*>(s->value); return true;
      case XLA_FFI_DataType_S64: *out = (uint64_t)*static_cast<const int64_t*>(s->value); return true;
      case XLA_FFI_DataType_U32: *out = *static_cast<const uint32_t*>(s->value); return true;
      case XLA_FFI_DataType_U64: *out = *static_cast<const uint64_t*>(s->value); return true;
      default: return false;
    }
  }
  return false;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* PyptxLaunch(
    XLA_FFI_CallFrame* cf) {
  if (cf->extension_start && cf->extension_start->type == XLA_FFI_Extension_Metadata) {
    XLA_FFI_Metadata* m =
        reinterpret_cast<XLA_FFI_Metadata_Extension*>(cf->extension_start)->metadata;
    m->api_version.major_version = XLA_FFI_API_MAJOR;  // what this handler was built against
    m->api_version.minor_version = XLA_FFI_API_MINOR;
    m->traits = 0;
    return nullptr;
  }
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;
  uint64_t handle = 0;
  if (!read_handle(cf, &handle)) return error(cf, "pyptx_launch: missing int attribute cubin_handle");
  auto c = pyptx_shim::lookup_or_resolve(handle);  // a program exported elsewhere: by its hash
  if (!c)
    return error(cf, "pyptx_launch: unknown kernel handle " + std::to_string(handle) +
                         " (not registered in this process, and not found in pyptx's disk "
                         "cache by its content hash)");
  int64_t n = cf->args.size + cf->rets.size;
  if (n > kMaxParams / 2) return error(cf, "pyptx_launch: too many buffers");
  uint64_t ptrs[kMaxParams / 2];
  int k = 0;
  for (int64_t i = 0; i < cf->args.size; ++i) {
    if (cf->args.types[i] != XLA_FFI_ArgType_BUFFER) return error(cf, "pyptx_launch: non-buffer argument");
    ptrs[k++] = reinterpret_cast<uint64_t>(static_cast<XLA_FFI_Buffer*>(cf->args.args[i])->data);
  }
  for (int64_t i = 0; i < cf->rets.size; ++i) {
    if (cf->rets.types[i] != XLA_FFI_RetType_BUFFER) return error(cf, "pyptx_launch: non-buffer result");
    ptrs[k++] = reinterpret_cast<uint64_t>(static_cast<XLA_FFI_Buffer*>(cf->rets.rets[i])->data);
  }
  XLA_FFI_Stream_Get_Args sa{sizeof(XLA_FFI_Stream_Get_Args), nullptr, cf->ctx, nullptr};
  if (XLA_FFI_Error* e = cf->api->XLA_FFI_Stream_Get(&sa)) return e;
  int device = -1;
  if (cf->api->struct_size > offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get) &&
      cf->api->XLA_FFI_DeviceOrdinal_Get) {
    XLA_FFI_DeviceOrdinal_Get_Args da{sizeof(XLA_FFI_DeviceOrdinal_Get_Args), nullptr, cf->ctx, -1};
    if (XLA_FFI_Error* e = cf->api->XLA_FFI_DeviceOrdinal_Get(&da)) return e;
    device = da.device_ordinal;
  }
  if (pyptx_shim::do_launch(*c, sa.stream, ptrs, k, device) != 0)
    return error(cf, "pyptx_launch: " + pyptx_shim::last_error_message());
  return nullptr;
}

extern "C" __attribute__((visibility("default"))) void* pyptx_shim_ffi_handler() {
  return reinterpret_cast<void*>(&PyptxLaunch);
}

extern "C" __attribute__((visibility("default"))) void pyptx_shim_ffi_api_version(int* major,
                                                                                int* minor) {
  *major = XLA_FFI_API_MAJOR;
  *minor = XLA_FFI_API_MINOR;
}

extern "C" __attribute__((visibility("default"))) int pyptx_shim_ffi_from_jaxlib() {
  return PYPTX_FFI_FROM_JAXLIB;
}
