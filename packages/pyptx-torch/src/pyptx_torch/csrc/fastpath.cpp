// pyptx_torch._fastpath: a repeated launch of a pyptx kernel in one C++ call.
//
// A Plan holds what a repeat of one specialization needs (input shapes and
// dtypes, output shapes and dtypes, the shim handle, the device). Calling it
// with a tuple of tensors checks them, allocates the outputs through ATen's
// caching allocator, reads the current stream and launches through the
// shim's C entry point; anything that does not match returns None so the
// Python path (which validates and raises pyptx's errors) takes over. The
// same plans back the CUDA kernel of the pyptx::launch ops used under
// torch.compile: each kernel variant keeps the plans of every input signature
// it was called with (up to 8), so only a signature's first call goes to the
// Python implementation (the fallback); its repeats stay in C++.
//
// Built against the installed torch (ABI-specific): see fastpath_build.py.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#ifndef PYPTX_TORCH_VERSION
#define PYPTX_TORCH_VERSION "unknown"
#endif
#ifndef Py_TPFLAGS_HAVE_VECTORCALL
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL
#endif

namespace {

using LaunchRaw = int (*)(uint64_t, void*, void**, int);
constexpr int kMaxTensors = 64;

LaunchRaw g_launch = nullptr;      // pyptx_shim_launch_raw
bool g_poison = false;             // outputs must be poisoned: leave every call to Python
PyObject* g_fallback = nullptr;    // Python pyptx::launch implementation (owned)
std::atomic<uint64_t> g_fallback_calls{0};  // pyptx::launch calls no bound plan took

// What a repeat of one specialization needs; immutable once made, shared by the Python Plan
// object and the op's variant table (so a plan dropped from either stays valid while in use).
struct PlanData {
  uint64_t handle = 0;
  c10::DeviceIndex device = 0;
  std::vector<std::vector<int64_t>> in_shapes;
  std::vector<c10::ScalarType> in_dtypes;
  std::vector<std::vector<int64_t>> out_shapes;
  std::vector<c10::ScalarType> out_dtypes;

  // Same inputs accepted (a rebind of this signature replaces the plan).
  bool same_signature(const PlanData& o) const {
    return device == o.device && in_shapes == o.in_shapes && in_dtypes == o.in_dtypes;
  }
};
using PlanPtr = std::shared_ptr<const PlanData>;

struct PlanObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PlanPtr data;  // constructed in place by plan_new, destroyed by plan_dealloc
};

enum class Ran { kNoMatch, kLaunched, kFailed };

// Check `inputs` against the plan, allocate, launch. kNoMatch: the inputs are not the ones the
// plan was built for (another plan may take them); kFailed: they are, but the launch did not
// happen (the Python path repeats the call and reports why).
template <typename Get>
Ran run(const PlanData& p, size_t n, Get get, std::vector<at::Tensor>& outs) {
  if (n != p.in_dtypes.size()) return Ran::kNoMatch;
  void* ptrs[kMaxTensors];
  const size_t n_out = p.out_dtypes.size();
  if (n + n_out > kMaxTensors) return Ran::kNoMatch;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor* t = get(i);
    if (!t || !t->defined() || !t->is_cuda() || t->get_device() != p.device ||
        t->scalar_type() != p.in_dtypes[i] || t->sizes() != c10::IntArrayRef(p.in_shapes[i]) ||
        !t->is_contiguous())
      return Ran::kNoMatch;
    ptrs[i] = t->data_ptr();
  }
  if (c10::cuda::current_device() != p.device) return Ran::kNoMatch;
  if (!g_launch || g_poison) return Ran::kFailed;
  outs.clear();
  outs.reserve(n_out);
  for (size_t j = 0; j < n_out; ++j) {
    outs.push_back(at::empty(p.out_shapes[j],
                             at::TensorOptions().dtype(p.out_dtypes[j]).device(at::kCUDA, p.device)));
    ptrs[n + j] = outs.back().data_ptr();
  }
  void* stream = c10::cuda::getCurrentCUDAStream(p.device).stream();
  return g_launch(p.handle, stream, ptrs, static_cast<int>(n + n_out)) == 0 ? Ran::kLaunched
                                                                             : Ran::kFailed;
}

PyObject* wrap_outputs(std::vector<at::Tensor>& outs) {
  if (outs.size() == 1) return THPVariable_Wrap(std::move(outs[0]));
  PyObject* tup = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (!tup) return nullptr;
  for (size_t j = 0; j < outs.size(); ++j) {
    PyObject* o = THPVariable_Wrap(std::move(outs[j]));
    if (!o) {
      Py_DECREF(tup);
      return nullptr;
    }
    PyTuple_SET_ITEM(tup, static_cast<Py_ssize_t>(j), o);
  }
  return tup;
}

// plan(args: tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...] | None
PyObject* plan_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kw) {
  if (PyVectorcall_NARGS(nargsf) != 1 || kw || !PyTuple_CheckExact(args[0])) Py_RETURN_NONE;
  PyObject* tup = args[0];
  std::vector<at::Tensor> outs;
  try {
    auto get = [tup](size_t i) -> const at::Tensor* {
      PyObject* o = PyTuple_GET_ITEM(tup, static_cast<Py_ssize_t>(i));
      return THPVariable_CheckExact(o) ? &THPVariable_Unpack(o) : nullptr;
    };
    if (run(*reinterpret_cast<PlanObject*>(self)->data, static_cast<size_t>(PyTuple_GET_SIZE(tup)),
            get, outs) != Ran::kLaunched)
      Py_RETURN_NONE;
  } catch (const std::exception&) {
    Py_RETURN_NONE;  // the Python path repeats the call and reports the error properly
  }
  return wrap_outputs(outs);
}

void plan_dealloc(PyObject* self) {
  reinterpret_cast<PlanObject*>(self)->data.~PlanPtr();
  Py_TYPE(self)->tp_free(self);
}

bool read_shapes(PyObject* seq, const char* what, std::vector<std::vector<int64_t>>* out) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (!fast) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* dims = PySequence_Fast(PySequence_Fast_GET_ITEM(fast, i), what);
    if (!dims) {
      Py_DECREF(fast);
      return false;
    }
    std::vector<int64_t> shape;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(dims); ++k) {
      shape.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, k)));
    }
    Py_DECREF(dims);
    if (PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
    out->push_back(std::move(shape));
  }
  Py_DECREF(fast);
  return true;
}

bool read_dtypes(PyObject* seq, const char* what, std::vector<c10::ScalarType>* out) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (!fast) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* d = PySequence_Fast_GET_ITEM(fast, i);
    if (!THPDtype_Check(d)) {
      Py_DECREF(fast);
      PyErr_Format(PyExc_TypeError, "%s: expected torch.dtype items", what);
      return false;
    }
    out->push_back(reinterpret_cast<THPDtype*>(d)->scalar_type);
  }
  Py_DECREF(fast);
  return true;
}

PyObject* plan_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  unsigned long long handle;
  int device;
  PyObject *in_shapes, *in_dtypes, *out_shapes, *out_dtypes;
  static const char* names[] = {"handle", "device", "in_shapes", "in_dtypes", "out_shapes",
                                "out_dtypes", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KiOOOO", const_cast<char**>(names), &handle,
                                   &device, &in_shapes, &in_dtypes, &out_shapes, &out_dtypes))
    return nullptr;
  auto data = std::make_shared<PlanData>();
  data->handle = handle;
  data->device = static_cast<c10::DeviceIndex>(device);
  if (!read_shapes(in_shapes, "in_shapes", &data->in_shapes) ||
      !read_dtypes(in_dtypes, "in_dtypes", &data->in_dtypes) ||
      !read_shapes(out_shapes, "out_shapes", &data->out_shapes) ||
      !read_dtypes(out_dtypes, "out_dtypes", &data->out_dtypes))
    return nullptr;
  if (data->in_shapes.size() != data->in_dtypes.size() ||
      data->out_shapes.size() != data->out_dtypes.size() ||
      data->in_dtypes.size() + data->out_dtypes.size() > kMaxTensors) {
    PyErr_SetString(PyExc_ValueError, "Plan: shapes and dtypes disagree in length, or too many tensors");
    return nullptr;
  }
  PyObject* self = type->tp_alloc(type, 0);
  if (!self) return nullptr;
  auto* p = reinterpret_cast<PlanObject*>(self);
  p->vectorcall = plan_vectorcall;
  new (&p->data) PlanPtr(std::move(data));
  return self;
}

PyTypeObject PlanType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ------------------------------------------------------------- pyptx::launch under torch.compile
// A variant (one kernel and its template kwargs) may be called with several input signatures
// (shapes, dtypes, device): in one compiled graph, or by graphs compiled for different shapes.
// Each signature keeps its own bound plan, so alternating signatures never leave C++.
constexpr size_t kPlansPerVariant = 8;
using PlanList = std::vector<PlanPtr>;  // newest first, at most kPlansPerVariant

std::mutex g_variants_mutex;
// "uid" or "uid|kwargs" (the variant string of pyptx::launch<n>) -> its bound plans. A list is
// never changed once published (bind copies it), so a caller holds it without the lock.
std::unordered_map<std::string, std::shared_ptr<const PlanList>> g_variants;

std::string variant_key(c10::string_view uid, c10::string_view kwargs) {
  std::string key(uid.data(), uid.size());
  if (!kwargs.empty()) {
    key.push_back('|');
    key.append(kwargs.data(), kwargs.size());
  }
  return key;
}

// The plans bound to a variant, or null.
std::shared_ptr<const PlanList> bound_plans(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_variants_mutex);
  auto it = g_variants.find(key);
  return it == g_variants.end() ? nullptr : it->second;
}

// Launch through the first bound plan built for these inputs; false when none takes them.
template <typename Get>
bool run_bound(const std::string& key, size_t n, Get get, std::vector<at::Tensor>& outs,
               size_t want_outs = 0) {
  auto plans = bound_plans(key);
  if (!plans) return false;
  for (const PlanPtr& p : *plans) {
    if (want_outs && p->out_dtypes.size() != want_outs) continue;
    Ran r = run(*p, n, get, outs);
    if (r == Ran::kLaunched) return true;
    if (r == Ran::kFailed) return false;
  }
  return false;
}

[[noreturn]] void throw_python_error() {
  python_error err;
  err.persist();  // keep the Python exception (a pyptx error class) for the caller
  throw err;
}

std::vector<at::Tensor> launch_fallback(at::TensorList inputs, c10::string_view uid,
                                        c10::string_view kwargs) {
  g_fallback_calls.fetch_add(1, std::memory_order_relaxed);
  pybind11::gil_scoped_acquire gil;
  if (!g_fallback) throw std::runtime_error("pyptx fast path: no Python fallback installed");
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(inputs.size()));
  if (!list) throw_python_error();
  for (size_t i = 0; i < inputs.size(); ++i)
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), THPVariable_Wrap(inputs[i]));
  PyObject* result = PyObject_CallFunction(g_fallback, "Os#s#", list, uid.data() ? uid.data() : "",
                                           static_cast<Py_ssize_t>(uid.size()),
                                           kwargs.data() ? kwargs.data() : "",
                                           static_cast<Py_ssize_t>(kwargs.size()));
  Py_DECREF(list);
  if (!result) throw_python_error();
  std::vector<at::Tensor> outs;
  PyObject* fast = PySequence_Fast(result, "pyptx::launch fallback result");
  Py_DECREF(result);
  if (!fast) throw_python_error();
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* o = PySequence_Fast_GET_ITEM(fast, i);
    if (!THPVariable_Check(o)) {
      Py_DECREF(fast);
      throw std::runtime_error("pyptx::launch fallback returned a non-tensor");
    }
    outs.push_back(THPVariable_Unpack(o));
  }
  Py_DECREF(fast);
  return outs;
}

std::vector<at::Tensor> launch_op(at::TensorList inputs, c10::string_view uid, c10::string_view kwargs) {
  std::vector<at::Tensor> outs;
  if (run_bound(variant_key(uid, kwargs), inputs.size(), [&](size_t i) { return &inputs[i]; }, outs))
    return outs;
  return launch_fallback(inputs, uid, kwargs);
}

// pyptx::launch<n>(Tensor t0, ..., str variant) -> Tensor: a single-output kernel with n tensor
// arguments; variant is "uid" or "uid|kwargs" (a kernel's uid never holds '|'). A fixed
// argument list and one Tensor back cost less on torch's Python->op path than a Tensor[].
at::Tensor launch_single(const at::Tensor* const* ins, size_t n, c10::string_view variant) {
  std::vector<at::Tensor> outs;
  if (run_bound(std::string(variant.data(), variant.size()), n, [&](size_t i) { return ins[i]; }, outs,
                1))
    return std::move(outs[0]);
  const size_t bar = variant.find('|');
  const c10::string_view uid = variant.substr(0, bar);
  // never a null data pointer: the fallback hands both strings to Python as s#
  const c10::string_view kwargs = variant.substr(bar == c10::string_view::npos ? variant.size() : bar + 1);
  std::vector<at::Tensor> args;
  args.reserve(n);
  for (size_t i = 0; i < n; ++i) args.push_back(*ins[i]);
  outs = launch_fallback(args, uid, kwargs);
  if (outs.size() != 1) throw std::runtime_error("pyptx::launch<n>: the kernel must have one output");
  return std::move(outs[0]);
}

at::Tensor launch1_op(const at::Tensor& a, c10::string_view v) {
  const at::Tensor* t[] = {&a};
  return launch_single(t, 1, v);
}
at::Tensor launch2_op(const at::Tensor& a, const at::Tensor& b, c10::string_view v) {
  const at::Tensor* t[] = {&a, &b};
  return launch_single(t, 2, v);
}
at::Tensor launch3_op(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                      c10::string_view v) {
  const at::Tensor* t[] = {&a, &b, &c};
  return launch_single(t, 3, v);
}
at::Tensor launch4_op(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                      const at::Tensor& d, c10::string_view v) {
  const at::Tensor* t[] = {&a, &b, &c, &d};
  return launch_single(t, 4, v);
}

// direct(t0, ..., variant) -> Tensor: what inductor's code calls for pyptx::launch<n> when
// PYPTX_TORCH_DIRECT=1 (pyptx_torch/direct.py): the variant's bound plans without the op call
// (no Python->op argument parsing, no dispatcher); anything they do not take goes to the
// Python fallback set by set_direct_fallback (which calls the op).
PyObject* g_direct_fallback = nullptr;  // owned

PyObject* py_direct(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  constexpr Py_ssize_t kMaxFixed = 4;
  if (nargs >= 2 && nargs - 1 <= kMaxFixed && PyUnicode_CheckExact(args[nargs - 1])) {
    const size_t n = static_cast<size_t>(nargs - 1);
    const at::Tensor* ins[kMaxFixed];
    bool tensors = true;
    for (size_t i = 0; i < n && tensors; ++i) {
      tensors = THPVariable_CheckExact(args[i]);
      if (tensors) ins[i] = &THPVariable_Unpack(args[i]);
    }
    Py_ssize_t len = 0;
    const char* v = tensors ? PyUnicode_AsUTF8AndSize(args[nargs - 1], &len) : nullptr;
    if (tensors && !v) return nullptr;
    if (v) {
      std::vector<at::Tensor> outs;
      try {
        if (run_bound(std::string(v, static_cast<size_t>(len)), n, [&](size_t i) { return ins[i]; },
                      outs, 1))
          return THPVariable_Wrap(std::move(outs[0]));
      } catch (const std::exception&) {
        // the op repeats the call below and reports the error properly
      }
    }
  }
  g_fallback_calls.fetch_add(1, std::memory_order_relaxed);
  if (!g_direct_fallback) {
    PyErr_SetString(PyExc_RuntimeError, "pyptx fast path: no direct fallback installed");
    return nullptr;
  }
  return PyObject_Vectorcall(g_direct_fallback, args, static_cast<size_t>(nargs), nullptr);
}

// set_direct_fallback(fn): what direct() calls when no bound plan takes its arguments.
PyObject* py_set_direct_fallback(PyObject*, PyObject* fn) {
  if (!PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "set_direct_fallback: expected a callable");
    return nullptr;
  }
  Py_INCREF(fn);
  Py_XSETREF(g_direct_fallback, fn);
  Py_RETURN_NONE;
}

// bind(uid, kwargs, plan): pyptx::launch runs that kernel variant through `plan` when the inputs
// match it. It joins the variant's plans, replacing one built for the same inputs; past
// kPlansPerVariant the oldest is dropped (freed once no launch in flight holds it).
PyObject* py_bind(PyObject*, PyObject* args) {
  const char *uid, *kwargs;
  Py_ssize_t n_uid, n_kwargs;
  PyObject* plan;
  if (!PyArg_ParseTuple(args, "s#s#O!", &uid, &n_uid, &kwargs, &n_kwargs, &PlanType, &plan))
    return nullptr;
  std::string key = variant_key(c10::string_view(uid, n_uid), c10::string_view(kwargs, n_kwargs));
  const PlanPtr& data = reinterpret_cast<PlanObject*>(plan)->data;
  std::lock_guard<std::mutex> lock(g_variants_mutex);
  auto& slot = g_variants[key];
  auto list = std::make_shared<PlanList>();
  list->push_back(data);
  if (slot) {
    for (const PlanPtr& p : *slot) {
      if (list->size() == kPlansPerVariant) break;
      if (!p->same_signature(*data)) list->push_back(p);
    }
  }
  slot = std::move(list);
  Py_RETURN_NONE;
}

// bound_plans(uid, kwargs) -> int: how many plans are bound to that variant.
PyObject* py_bound_plans(PyObject*, PyObject* args) {
  const char *uid, *kwargs;
  Py_ssize_t n_uid, n_kwargs;
  if (!PyArg_ParseTuple(args, "s#s#", &uid, &n_uid, &kwargs, &n_kwargs)) return nullptr;
  auto plans = bound_plans(variant_key(c10::string_view(uid, n_uid), c10::string_view(kwargs, n_kwargs)));
  return PyLong_FromSize_t(plans ? plans->size() : 0);
}

// configure(launch_raw_address): the shim's C launch entry point.
PyObject* py_configure(PyObject*, PyObject* arg) {
  unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  g_launch = reinterpret_cast<LaunchRaw>(static_cast<uintptr_t>(addr));
  Py_RETURN_NONE;
}

// set_fallback(fn): the Python implementation pyptx::launch calls when no bound plan matches.
PyObject* py_set_fallback(PyObject*, PyObject* fn) {
  if (!PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "set_fallback: expected a callable");
    return nullptr;
  }
  Py_INCREF(fn);
  Py_XSETREF(g_fallback, fn);
  Py_RETURN_NONE;
}

// set_poison(flag): while set, plans decline every call (the Python path poisons outputs).
PyObject* py_set_poison(PyObject*, PyObject* flag) {
  int on = PyObject_IsTrue(flag);
  if (on < 0) return nullptr;
  g_poison = on != 0;
  Py_RETURN_NONE;
}

// fallback_calls() -> int: how many pyptx::launch calls went to the Python implementation.
PyObject* py_fallback_calls(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(g_fallback_calls.load(std::memory_order_relaxed));
}

PyMethodDef methods[] = {
    {"fallback_calls", py_fallback_calls, METH_NOARGS,
     "fallback_calls() -> int: pyptx::launch calls that no bound C++ plan took (Python ran them)."},
    {"set_poison", py_set_poison, METH_O,
     "set_poison(flag): while true, plans return None so the Python path poisons the outputs."},
    {"configure", py_configure, METH_O,
     "configure(launch_raw_address): the shim's C launch entry point."},
    {"set_fallback", py_set_fallback, METH_O,
     "set_fallback(fn): the Python implementation pyptx::launch calls when no plan matches."},
    {"direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_direct)),
     METH_FASTCALL,
     "direct(t0, ..., variant) -> Tensor: pyptx::launch<n> through the bound plans, no op call."},
    {"set_direct_fallback", py_set_direct_fallback, METH_O,
     "set_direct_fallback(fn): what direct() calls when no bound plan takes the arguments."},
    {"bind", py_bind, METH_VARARGS,
     "bind(uid, kwargs, plan): pyptx::launch runs that variant through plan when inputs match it."},
    {"bound_plans", py_bound_plans, METH_VARARGS,
     "bound_plans(uid, kwargs) -> int: how many plans are bound to that kernel variant."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_fastpath",
                          "Repeated pyptx launches from PyTorch in one C++ call.", -1, methods};

}  // namespace

// pyptx::launch's autograd kernel for CUDA tensors. A pyptx kernel is not differentiable
// unless wrapped in differentiable_kernel (an autograd.Function around the op), so, as
// in eager mode, its outputs never carry a grad_fn: step below autograd and redispatch.
// Unboxed, this replaces torch's boxed autograd fallback (~2 us per op call).
std::vector<at::Tensor> launch_autograd(c10::DispatchKeySet keys, at::TensorList inputs,
                                        c10::string_view uid, c10::string_view kwargs) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pyptx::launch", "")
          .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view, c10::string_view)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.redispatch(keys & c10::after_ADInplaceOrView_keyset, inputs, uid, kwargs);
}

// The same for pyptx::launch<n>: redispatch below autograd through the op's typed handle.
template <typename Sig>
c10::TypedOperatorHandle<Sig> typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using T = const at::Tensor&;
using V = c10::string_view;

at::Tensor launch1_autograd(c10::DispatchKeySet keys, T a, V v) {
  static const auto op = typed_op<at::Tensor(T, V)>("pyptx::launch1");
  at::AutoDispatchBelowADInplaceOrView below;
  return op.redispatch(keys & c10::after_ADInplaceOrView_keyset, a, v);
}
at::Tensor launch2_autograd(c10::DispatchKeySet keys, T a, T b, V v) {
  static const auto op = typed_op<at::Tensor(T, T, V)>("pyptx::launch2");
  at::AutoDispatchBelowADInplaceOrView below;
  return op.redispatch(keys & c10::after_ADInplaceOrView_keyset, a, b, v);
}
at::Tensor launch3_autograd(c10::DispatchKeySet keys, T a, T b, T c, V v) {
  static const auto op = typed_op<at::Tensor(T, T, T, V)>("pyptx::launch3");
  at::AutoDispatchBelowADInplaceOrView below;
  return op.redispatch(keys & c10::after_ADInplaceOrView_keyset, a, b, c, v);
}
at::Tensor launch4_autograd(c10::DispatchKeySet keys, T a, T b, T c, T d, V v) {
  static const auto op = typed_op<at::Tensor(T, T, T, T, V)>("pyptx::launch4");
  at::AutoDispatchBelowADInplaceOrView below;
  return op.redispatch(keys & c10::after_ADInplaceOrView_keyset, a, b, c, d, v);
}

TORCH_LIBRARY_IMPL(pyptx, CUDA, m) {
  m.impl("launch", TORCH_FN(launch_op));
  m.impl("launch1", TORCH_FN(launch1_op));
  m.impl("launch2", TORCH_FN(launch2_op));
  m.impl("launch3", TORCH_FN(launch3_op));
  m.impl("launch4", TORCH_FN(launch4_op));
}
TORCH_LIBRARY_IMPL(pyptx, AutogradCUDA, m) {
  m.impl("launch", TORCH_FN(launch_autograd));
  m.impl("launch1", TORCH_FN(launch1_autograd));
  m.impl("launch2", TORCH_FN(launch2_autograd));
  m.impl("launch3", TORCH_FN(launch3_autograd));
  m.impl("launch4", TORCH_FN(launch4_autograd));
}

PyMODINIT_FUNC PyInit__fastpath() {
  PlanType.tp_name = "pyptx_torch._fastpath.Plan";
  PlanType.tp_basicsize = sizeof(PlanObject);
  PlanType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  PlanType.tp_doc = "Plan(handle, device, in_shapes, in_dtypes, out_shapes, out_dtypes): call "
                    "with a tuple of tensors; returns the output(s), or None if they do not match.";
  PlanType.tp_new = plan_new;
  PlanType.tp_dealloc = plan_dealloc;
  PlanType.tp_call = PyVectorcall_Call;
  PlanType.tp_vectorcall_offset = offsetof(PlanObject, vectorcall);
  if (PyType_Ready(&PlanType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&PlanType);
  if (PyModule_AddObject(m, "Plan", reinterpret_cast<PyObject*>(&PlanType)) < 0 ||
      PyModule_AddStringConstant(m, "TORCH_VERSION", PYPTX_TORCH_VERSION) < 0 ||
      PyModule_AddIntConstant(m, "PLANS_PER_VARIANT", static_cast<long>(kPlansPerVariant)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
