"""Helpers shared by the whole library: where the user's call is and its errors, the framework,
dtype names and rows of an array, device checks, and the lazily defined torch custom ops."""

from __future__ import annotations

import functools
import os
import sys
import threading

#: The package directory: every frame inside it is the library's, not the user's.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def where() -> str:
    """``file:line`` of the user's call into the library: the first frame outside this
    package, pyptx and the ``__init__`` a frozen dataclass generates (a ``<string>`` frame
    between the user's ``Config(...)`` and its ``__post_init__`` checks)."""
    from pyptx.source import _is_internal

    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not ((name == "<string>" and f.f_code.co_name == "__init__") or _is_internal(name)
                or os.path.abspath(name).startswith(PACKAGE_DIR + os.sep)):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>:0"


def framework(x) -> str:
    """``"torch"`` or ``"jax"``: the framework an array (or tracer) belongs to. An
    ``isinstance`` check that ``torch.compile`` traces; it never imports torch."""
    torch = sys.modules.get("torch")
    return "torch" if torch is not None and isinstance(x, torch.Tensor) else "jax"


def fail(cls, who: str, msg: str):
    """A ``cls`` (a ``PyptxError`` subclass) saying ``file:line: who: msg`` of the user's call.
    While ``torch.compile`` traces, frames cannot be walked: the place is ``<torch.compile>``
    (dynamo's error names the user's line)."""
    torch = sys.modules.get("torch")
    at = "<torch.compile>" if torch is not None and torch.compiler.is_compiling() else where()
    return cls(f"{at}: {who}: {msg}")


#: dtype names of the library (the ``pyptx.types`` spelling) by torch/JAX/numpy dtype name
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
                "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "int32": "s32",
                "bf16": "bf16", "f16": "f16", "f32": "f32", "e4m3": "e4m3", "e5m2": "e5m2"}


def dtype_name(dtype) -> str | None:
    """``"bf16"``, ``"f16"``, ``"f32"``, ``"e4m3"``, ... for a torch/JAX/numpy dtype or a name;
    None for a dtype the library has no name for."""
    name = str(getattr(dtype, "name", dtype)).removeprefix("torch.")
    return _DTYPE_NAMES.get(name)


def torch_dtype(name: str):
    """The torch dtype of a library dtype name (``"bf16"`` -> ``torch.bfloat16``)."""
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
            "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[name]


def lazy_exports(package: str, names: dict):
    """``(__getattr__, __dir__)`` for subpackage ``package`` whose ``names`` map each
    re-exported name to its module: a name is imported at its first use, then kept."""
    import importlib

    module = sys.modules[package]

    def __getattr__(name):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        setattr(module, name, value)
        return value

    def __dir__():
        return sorted(set(vars(module)) | set(names))

    return __getattr__, __dir__


def rows_of(x):
    """``(x2, lead)``: ``x`` as a 2-D ``(prod(lead), N)`` array and its leading shape."""
    lead = tuple(x.shape[:-1])
    return x.reshape(-1, x.shape[-1]), lead


def shaped(x, shape):
    """``x`` reshaped to ``shape`` (torch, JAX arrays), or a ``jax.ShapeDtypeStruct`` of that
    shape for one (for tracing kernels without arrays)."""
    if framework(x) == "jax" and not hasattr(x, "reshape"):
        import jax

        return jax.ShapeDtypeStruct(tuple(shape), x.dtype)
    return x.reshape(shape)


def symbolic(x) -> bool:
    """Whether ``x`` has no real storage to check: a meta/fake torch tensor, a tensor under
    ``torch.compile`` tracing, or a JAX tracer / shape struct."""
    if framework(x) == "torch":
        import torch

        if torch.compiler.is_compiling() or x.device.type == "meta":
            return True
        from torch._subclasses.fake_tensor import FakeTensor

        return isinstance(x, FakeTensor)
    return not hasattr(x, "devices")


def check_devices(who: str, *xs) -> None:
    """Raise ``ConfigError`` unless the torch tensors ``xs`` (None skipped) are all on one CUDA
    device; meta, fake and traced tensors pass (nothing launches on them)."""
    torch = sys.modules.get("torch")
    if torch is not None:   # the common case first: CUDA tensors of one device
        index, Tensor = None, torch.Tensor
        for x in xs:
            if x is None:
                continue
            if not (isinstance(x, Tensor) and x.is_cuda):
                break
            i = x.get_device()
            if index is None:
                index = i
            elif i != index:
                break
        else:
            return
    from pyptx.errors import ConfigError

    xs = [x for x in xs if x is not None and framework(x) == "torch"]
    if not xs:
        return
    devs = {str(x.device) for x in xs}
    if len(devs) > 1:
        raise fail(ConfigError, who, f"inputs are on different devices: {', '.join(sorted(devs))}")
    if symbolic(xs[0]):
        return
    if xs[0].device.type != "cuda":
        raise fail(ConfigError, who, f"inputs must be CUDA tensors (the kernels run on the GPU), "
                   f"got {xs[0].device.type} tensors")


def wants_grad(*xs) -> bool:
    """Whether torch autograd would record an op on ``xs`` (None skipped)."""
    import torch

    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


_TORCH_OPS: dict = {}
"""name -> the ``torch.library.custom_op`` defined for ``torch.ops.pyptx.<name>``."""

_PENDING: dict = {}
"""name -> ``(schema, impl, fake, backward, setup_context)`` of an op declared by a
``defines_ops`` function and not defined yet (``define_op`` defines it)."""

_DEFERRING = threading.local()
"""``depth`` > 0 while a ``defines_ops`` function runs on this thread: ``torch_op`` declares
instead of defining."""


def defines_ops(fn):
    """Mark ``fn``, which declares custom ops with ``torch_op``, as a constant for dynamo (what
    ``torch.compiler.assume_constant_result`` does): a first call of an op inside
    ``torch.compile`` then runs ``fn`` at trace time instead of breaking the graph. ``fn``
    takes no arguments, must be idempotent and return a constant (``True``); it runs once.
    The ops it declares are defined one at a time, when a call first goes through
    ``torch.ops.pyptx`` (``define_op``); plain eager calls never need them."""

    done: list = []

    @functools.wraps(fn)
    def declare():
        if done:
            return done[0]
        _DEFERRING.depth = getattr(_DEFERRING, "depth", 0) + 1
        try:
            result = fn()
        finally:
            _DEFERRING.depth -= 1
        done.append(result)
        return result

    declare._dynamo_marked_constant = True
    return declare


def torch_op(name: str, schema: str, impl, fake, backward=None, setup_context=None):
    """The torch custom op ``torch.ops.pyptx.<name>`` (``torch.library.custom_op`` with
    ``schema``, the fake impl ``fake`` and, given ``backward``, ``register_autograd``), and
    ``call_op``'s direct eager path for it. Inside a ``defines_ops`` function the op is only
    declared (None is returned; ``define_op`` defines it when first needed); elsewhere it is
    defined now and returned. Idempotent."""
    op = _TORCH_OPS.get(name)
    deferring = getattr(_DEFERRING, "depth", 0) > 0
    if op is not None or (deferring and name in _PENDING):
        return op
    register_eager(name, impl, backward, setup_context)
    _PENDING[name] = (schema, impl, fake, backward, setup_context)
    return None if deferring else _define_now(name)


def _define_now(name: str):
    entry = _PENDING.pop(name, None)
    if entry is None:
        return _TORCH_OPS.get(name)
    import torch

    schema, impl, fake, backward, setup_context = entry
    op = torch.library.custom_op(f"pyptx::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(_registering_fallback(name, fake))
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    _TORCH_OPS[name] = op
    return op


def _registering_fallback(name: str, fake):
    """``fake``, which also registers op ``name`` with inductor as a fallback kernel when
    inductor is loaded (AOT autograd traces the fakes inside inductor's compile, before the
    graph is lowered; fakes run only while tracing, so the check costs no eager call)."""
    qualname = f"pyptx::{name}"

    @functools.wraps(fake)
    def traced(*args, **kwargs):
        inductor_fallback(qualname)
        return fake(*args, **kwargs)

    return traced


def inductor_fallback(qualname: str) -> bool:
    """Register the custom op ``qualname`` (``"pyptx::<name>"``) with inductor as a fallback
    kernel, with the layout constraint its implicit fallback would take, so inductor never
    takes that path: torch 2.11 formats every argument's IR there eagerly (for a log line),
    which grows exponentially with the depth of the graph (minutes for an 8-layer Llama).
    True once registered (or inductor already lowers the op); False while inductor is not
    loaded or lacks what this needs."""
    lowering = sys.modules.get("torch._inductor.lowering")
    if lowering is None:
        return False
    import torch

    ns, op_name = qualname.split("::")
    op = getattr(getattr(torch.ops, ns), op_name).default
    if op in lowering.lowerings:
        return True
    try:
        from torch._library.utils import get_layout_constraint_tag

        constraint = lowering.tag_to_layout_constraint(
            get_layout_constraint_tag(op, with_default=True))
        lowering.make_fallback(op, layout_constraint=constraint, warn=False)
    except (AttributeError, ImportError, TypeError):   # an inductor without these hooks
        return False
    return True


def define_op(name: str) -> bool:
    """Define the declared op ``torch.ops.pyptx.<name>`` and its ``<name>_backward`` if they
    are not yet (a constant for dynamo: a trace runs it, then finds the op). True."""
    if name in _PENDING:
        _define_now(name)
    if f"{name}_backward" in _PENDING:
        _define_now(f"{name}_backward")
    return True


define_op._dynamo_marked_constant = True


def define_ops() -> None:
    """Define every declared op now (for code that names ``torch.ops.pyptx.<name>`` itself,
    e.g. a process loading a saved program)."""
    for name in list(_PENDING):
        _define_now(name)


def register_eager(name: str, impl, backward=None, setup_context=None) -> None:
    """Let ``call_op`` run op ``name``'s ``impl`` (and its autograd) directly in plain eager
    calls; ``torch_op`` does this for the ops it defines."""
    _EAGER[name] = (impl, None if backward is None else _eager_function(name, impl, backward,
                                                                       setup_context))


EAGER_DEVICES = ("cuda",)
"""Device types whose tensors ``call_op`` hands to an op's implementation directly (CUDA
tensors always)."""

_EAGER: dict = {}
"""name -> (impl, ``torch.autograd.Function`` of its registered autograd or None): what
``call_op`` runs in plain eager calls."""


def _eager_function(name, impl, backward, setup_context):
    """A ``torch.autograd.Function`` running ``impl`` with the op's registered ``backward``
    and ``setup_context``: the op's autograd without the dispatcher."""
    import torch

    def forward(ctx, *args):
        out = impl(*args)
        outs = out if isinstance(out, tuple) else (out,)
        ints = [o for o in outs if isinstance(o, torch.Tensor) and not o.is_floating_point()]
        if ints:
            ctx.mark_non_differentiable(*ints)
        if setup_context is not None:
            setup_context(ctx, args, out)
        return out

    return type(f"{name}_eager", (torch.autograd.Function,),
                {"forward": staticmethod(forward),
                 "backward": staticmethod(lambda ctx, *grads: backward(ctx, *grads))})


def call_op(name: str, *args):
    """``torch.ops.pyptx.<name>(*args)``. A plain eager call (CUDA tensors, no trace) runs the
    op's implementation directly, through its registered autograd when an input requires
    grad: the same kernels and gradients without the dispatcher's tens of microseconds.
    Traced calls (``torch.compile``, ``torch.export``), meta, fake and subclassed tensors
    (other than ``nn.Parameter``) go through the op."""
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling():   # first: dynamo must not guard on _EAGER
        define_op(name)
        return getattr(torch.ops.pyptx, name)(*args)
    try:
        entry = _EAGER.get(name)
        if entry is not None:
            grad, plain = False, True
            Tensor, Parameter = torch.Tensor, torch.nn.Parameter
            for a in args:
                if isinstance(a, Tensor):
                    if (type(a) is not Tensor and type(a) is not Parameter
                            or not a.is_cuda and a.device.type not in EAGER_DEVICES):
                        plain = False
                        break
                    grad = grad or a.requires_grad
            if plain:
                impl, function = entry
                if not (grad and torch.is_grad_enabled()):
                    return impl(*args)
                if function is not None:
                    return function.apply(*args)
        if name in _PENDING or f"{name}_backward" in _PENDING:
            define_op(name)
        return getattr(torch.ops.pyptx, name)(*args)
    finally:
        if _AFTER_CALL:
            _run_after_call()


def direct_autograd(*args) -> bool:
    """Whether ``call_op`` would run ``args`` through an op's eager ``autograd.Function``: a
    plain eager call (no trace; plain tensors of ``EAGER_DEVICES``) with grad enabled and an
    input that requires grad. ``call_function`` then runs an ``register_eager`` op's."""
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return False
    grad = False
    Tensor, Parameter = torch.Tensor, torch.nn.Parameter
    for a in args:
        if isinstance(a, Tensor):
            if (type(a) is not Tensor and type(a) is not Parameter
                    or not a.is_cuda and a.device.type not in EAGER_DEVICES):
                return False
            grad = grad or a.requires_grad
    return grad


def call_function(name: str, *args):
    """The eager ``autograd.Function`` of ``register_eager`` op ``name`` applied to ``args``
    (for calls ``direct_autograd`` takes), as ``call_op`` runs it."""
    try:
        return _EAGER[name][1].apply(*args)
    finally:
        if _AFTER_CALL:
            _run_after_call()


_AFTER_CALL: list = []
"""Callbacks the next eager ``call_op`` runs when it returns (``after_call``)."""


def after_call(fn) -> None:
    """Run ``fn()`` once, when the eager ``call_op`` running now (or the next one) returns."""
    if fn not in _AFTER_CALL:
        _AFTER_CALL.append(fn)


def _run_after_call() -> None:
    while True:
        try:
            fn = _AFTER_CALL.pop()
        except IndexError:   # empty (another thread may have run it)
            return
        fn()


_ZEROED: dict = {}
"""(device, stream, words) -> a zeroed int32 tensor that every launch using it leaves
zeroed (``zeroed_words``)."""
_ZEROED_SLOTS = 64


def zeroed_words(like, n: int, jax_dtype: str = "int32"):
    """``n`` zeroed 32-bit words on ``like``'s device, for a kernel that leaves them zeroed
    when it ends (arrival counters, split-tail flags). Torch eager: one tensor per (device,
    stream, n), zeroed once and reused (launches on one stream run in order); a fresh
    ``torch.zeros`` while a CUDA graph is captured (the graph owns it and zeroes it at each
    replay, so graphs replayed on other streams never share it) or ``torch.compile`` traces.
    JAX: a fresh ``jnp.zeros`` of ``jax_dtype``."""
    if framework(like) != "torch":
        import jax.numpy as jnp

        return jnp.zeros((n,), getattr(jnp, jax_dtype))
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=like.device)
    key = (like.device, torch.cuda.current_stream(like.device).cuda_stream, n)
    words = _ZEROED.get(key)
    if words is None:
        if len(_ZEROED) >= _ZEROED_SLOTS:
            _ZEROED.clear()
        words = _ZEROED[key] = torch.zeros(n, dtype=torch.int32, device=like.device)
    return words


def device_arch(x) -> str:
    """The kernels' target for the device of array ``x``: ``sm_80`` for a CUDA tensor of
    capability 8.x, ``sm_90a`` for 9.x, ``sm_100a`` for 10.x (``sm_90a`` for CPU, meta and
    non-torch arrays, and for other capabilities). Cached per device (~0.5 us a call).
    While torch.compile traces: ``sm_90a`` (the capability query is not traceable; pass
    ``arch=`` to a public function to compile another family)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        return "sm_90a"
    dev = getattr(x, "device", None)
    try:
        return _ARCH_OF_DEVICE[dev]
    except (KeyError, TypeError):  # a device not seen yet (or not hashable)
        pass
    arch = _capability_arch(dev.index) if getattr(dev, "type", None) == "cuda" else "sm_90a"
    try:
        _ARCH_OF_DEVICE[dev] = arch
    except TypeError:
        pass
    return arch


#: device object -> target, filled by ``device_arch`` (it is on every call of the ops)
_ARCH_OF_DEVICE: dict = {}


@functools.cache
def _capability_arch(index) -> str:
    import torch

    major = torch.cuda.get_device_capability(index)[0]
    return {8: "sm_80", 9: "sm_90a", 10: "sm_100a"}.get(major, "sm_90a")
