// The few declarations of XLA's FFI C API (xla/ffi/api/c_api.h) the handler uses, with the
// header's names and layouts, for builds without jaxlib's copy of it. Fields the handler
// never reads are declared as untyped pointers. Checked against jaxlib 0.10.2 (API 0.3);
// tests/test_shim.py compares every offset with jaxlib's header where it is installed.

#pragma once

#include <cstddef>
#include <cstdint>

#define XLA_FFI_API_MAJOR 0
#define XLA_FFI_API_MINOR 3

#ifdef __cplusplus
extern "C" {
#endif
typedef enum { XLA_FFI_Extension_Metadata = 1 } XLA_FFI_Extension_Type;
typedef struct XLA_FFI_Extension_Base {
  size_t struct_size;
  XLA_FFI_Extension_Type type;
  struct XLA_FFI_Extension_Base* next;
} XLA_FFI_Extension_Base;
typedef enum { XLA_FFI_Error_Code_INTERNAL = 13 } XLA_FFI_Error_Code;
typedef enum {
  XLA_FFI_DataType_S32 = 4,
  XLA_FFI_DataType_S64 = 5,
  XLA_FFI_DataType_U32 = 8,
  XLA_FFI_DataType_U64 = 9,
} XLA_FFI_DataType;
typedef enum { XLA_FFI_ArgType_BUFFER = 1 } XLA_FFI_ArgType;
typedef enum { XLA_FFI_RetType_BUFFER = 1 } XLA_FFI_RetType;
typedef enum { XLA_FFI_AttrType_SCALAR = 3 } XLA_FFI_AttrType;
typedef enum { XLA_FFI_ExecutionStage_EXECUTE = 3 } XLA_FFI_ExecutionStage;
typedef struct XLA_FFI_Error XLA_FFI_Error;
typedef struct XLA_FFI_ExecutionContext XLA_FFI_ExecutionContext;
typedef struct XLA_FFI_Api_Version {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int major_version;
  int minor_version;
} XLA_FFI_Api_Version;
typedef struct XLA_FFI_Metadata {
  size_t struct_size;
  XLA_FFI_Api_Version api_version;
  uint32_t traits;
} XLA_FFI_Metadata;
typedef struct XLA_FFI_Metadata_Extension {
  XLA_FFI_Extension_Base extension_base;
  XLA_FFI_Metadata* metadata;
} XLA_FFI_Metadata_Extension;
typedef struct XLA_FFI_Error_Create_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  const char* message;
  XLA_FFI_Error_Code errc;
} XLA_FFI_Error_Create_Args;
typedef struct XLA_FFI_Stream_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  void* stream;
} XLA_FFI_Stream_Get_Args;
typedef struct XLA_FFI_DeviceOrdinal_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  int32_t device_ordinal;
} XLA_FFI_DeviceOrdinal_Get_Args;
typedef void XLA_FFI_Unused;  // API entries the handler never calls
typedef struct XLA_FFI_Api {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Api_Version api_version;
  const void* internal_api;
  XLA_FFI_Error* (*XLA_FFI_Error_Create)(XLA_FFI_Error_Create_Args*);
  XLA_FFI_Unused *error_get_message, *error_destroy, *handler_register;
  XLA_FFI_Error* (*XLA_FFI_Stream_Get)(XLA_FFI_Stream_Get_Args*);
  XLA_FFI_Unused *type_register, *execution_context_get, *state_set, *state_get,
      *device_memory_allocate, *device_memory_free, *thread_pool_schedule,
      *thread_pool_num_threads, *future_create, *future_set_available, *future_set_error,
      *run_id_get;
  XLA_FFI_Error* (*XLA_FFI_DeviceOrdinal_Get)(XLA_FFI_DeviceOrdinal_Get_Args*);
} XLA_FFI_Api;
typedef struct XLA_FFI_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_ArgType* types;
  void** args;
} XLA_FFI_Args;
typedef struct XLA_FFI_Rets {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_RetType* types;
  void** rets;
} XLA_FFI_Rets;
typedef struct XLA_FFI_ByteSpan {
  const char* ptr;
  size_t len;
} XLA_FFI_ByteSpan;
typedef struct XLA_FFI_Scalar {
  XLA_FFI_DataType dtype;
  void* value;
} XLA_FFI_Scalar;
typedef struct XLA_FFI_Attrs {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_AttrType* types;
  XLA_FFI_ByteSpan** names;
  void** attrs;
} XLA_FFI_Attrs;
typedef struct XLA_FFI_Buffer {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_DataType dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
} XLA_FFI_Buffer;
typedef struct XLA_FFI_CallFrame {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  const XLA_FFI_Api* api;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_ExecutionStage stage;
  XLA_FFI_Args args;
  XLA_FFI_Rets rets;
  XLA_FFI_Attrs attrs;
} XLA_FFI_CallFrame;
#ifdef __cplusplus
}
#endif
