// The CPython module pyptx_shim._shim: Python access to the table and the launch.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "shim.h"

namespace {

using pyptx_shim::kMaxParams;
using pyptx_shim::kTensorMapBytes;

PyObject* ShimError = nullptr;

PyObject* raise_last() {
  PyErr_SetString(ShimError, pyptx_shim::last_error_message().c_str());
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
  return PyCapsule_New(pyptx_shim_ffi_handler(), nullptr, nullptr);
}

PyObject* py_ffi_api_version(PyObject*, PyObject*) {
  int major = 0, minor = 0;
  pyptx_shim_ffi_api_version(&major, &minor);
  return Py_BuildValue("(iiO)", major, minor, pyptx_shim_ffi_from_jaxlib() ? Py_True : Py_False);
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

PyObject* py_is_registered(PyObject*, PyObject* arg) {
  unsigned long long handle = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return PyBool_FromLong(pyptx_shim::lookup(handle) != nullptr);
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
  auto c = pyptx_shim::lookup(handle);
  if (!c) {
    PyErr_Format(ShimError, "launch: unknown kernel handle %llu", handle);
    return nullptr;
  }
  if (pyptx_shim::do_launch(*c, stream, ptrs, (int)n) != 0) return raise_last();
  Py_RETURN_NONE;
}

PyObject* resolver = nullptr;  // Python callable(handle) -> bool (owned), or null

// The C resolver the XLA handler calls on an unknown handle: runs the Python resolver with
// the GIL (taken on XLA's thread; the caller of the XLA program has released it).
int call_resolver(uint64_t handle) {
  if (!Py_IsInitialized()) return 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  int found = 0;
  if (resolver) {
    PyObject* r = PyObject_CallFunction(resolver, "K", (unsigned long long)handle);
    if (r) {
      found = PyObject_IsTrue(r) == 1;
      Py_DECREF(r);
    } else {
      PyErr_Clear();  // the handler reports the handle as unknown
    }
  }
  PyGILState_Release(gil);
  return found;
}

// set_resolver(fn | None): fn(handle) -> bool registers a handle the XLA handler does not know.
PyObject* py_set_resolver(PyObject*, PyObject* fn) {
  if (fn != Py_None && !PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "set_resolver: expected a callable or None");
    return nullptr;
  }
  Py_XINCREF(fn == Py_None ? nullptr : fn);
  Py_XSETREF(resolver, fn == Py_None ? nullptr : fn);
  pyptx_shim::set_resolver(resolver ? call_resolver : nullptr);
  Py_RETURN_NONE;
}

// resolve(handle) -> bool: what the XLA handler does with a handle: look it up, else ask the
// resolver once.
PyObject* py_resolve(PyObject*, PyObject* arg) {
  unsigned long long handle = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  std::shared_ptr<const pyptx_shim::Config> c;
  Py_BEGIN_ALLOW_THREADS  // the resolver takes the GIL itself, as on XLA's thread
  c = pyptx_shim::lookup_or_resolve(handle);
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(c != nullptr);
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
    {"is_registered", py_is_registered, METH_O,
     "is_registered(handle) -> bool: whether a launch config is stored under handle."},
    {"set_pdl", py_set_pdl, METH_VARARGS,
     "set_pdl(handle, on): launch with programmatic dependent launch (PDL) allowed."},
    {"set_device_function", py_set_device_function, METH_VARARGS,
     "set_device_function(handle, device_ordinal, cu_function): the function to launch on that "
     "device (given the first device's cluster and shared-memory attributes)."},
    {"ffi_handler", py_ffi_handler, METH_NOARGS,
     "A PyCapsule of the XLA typed-FFI handler PyptxLaunch (for jax.ffi.register_ffi_target)."},
    {"ffi_api_version", py_ffi_api_version, METH_NOARGS,
     "(major, minor, from_jaxlib): the XLA FFI API version the handler was built against, and "
     "whether that came from jaxlib's header (else the shim's own copy of it)."},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_launch)),
     METH_FASTCALL, "launch(handle, stream, *pointers): launch a registered kernel."},
    {"set_resolver", py_set_resolver, METH_O,
     "set_resolver(fn | None): fn(handle) -> bool registers a kernel the XLA handler was "
     "asked for but nobody registered (a program exported by another process)."},
    {"resolve", py_resolve, METH_O,
     "resolve(handle) -> bool: look a handle up as the XLA handler does (asking the resolver "
     "once on a miss)."},
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
