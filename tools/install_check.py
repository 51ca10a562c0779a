"""Run inside a fresh virtualenv after ``pip install "pyptx-core[torch]"``, ``[jax]`` or
``[kernels,torch]``, from a directory outside the checkout: proves the user's install
resolves the plugin through its entry point, or (``kernels``) that the installed kernel
library imports without torch, exposes the public functions and traces their kernels.

    python tools/install_check.py torch|jax|kernels

Exits non-zero naming every check that failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The public functions of ``pyptx_kernels`` (the API contract).
KERNEL_FUNCTIONS = ("matmul", "linear", "grouped_mm", "scaled_mm", "scaled_mm_blockwise",
                    "attention", "attention_varlen", "rms_norm", "layer_norm", "softmax",
                    "swiglu")
CHECKOUT = Path(__file__).resolve().parents[1]


def check_torch() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import pyptx
    import pyptx.torch_support as ts
    import pyptx_torch
    from pyptx import Tile, kernel, ptx
    from pyptx.runtimes import load
    from pyptx.types import f32

    assert type(load("torch")).__name__ == "TorchRuntime"
    for name in pyptx_torch.__all__:
        assert getattr(ts, name) is getattr(pyptx_torch, name), name
    assert pyptx.differentiable_kernel is pyptx_torch.differentiable_kernel

    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),), block=(32, 1, 1))
    def noop(X, Y):
        ptx.ret()

    from pyptx_torch.compiled import compiled_call

    with FakeTensorMode():
        out = compiled_call(noop, (torch.empty(7, device="cuda"),), {})
    assert tuple(out.shape) == (7,)
    assert hasattr(torch.ops.pyptx, "launch"), "custom op not registered"
    import pyptx_shim

    print(f"torch {torch.__version__}; plugin ok; custom op torch.ops.pyptx.launch registered; "
          f"shim available: {pyptx_shim.shim_is_available()} ({pyptx_shim.shim_load_error()})")


def check_jax() -> None:
    import jax

    import pyptx.jax_support as js
    import pyptx_jax
    from pyptx.runtimes import load

    assert type(load("jax")).__name__ == "JaxRuntime"
    for name in pyptx_jax.__all__:
        assert getattr(js, name) is getattr(pyptx_jax, name), name
    print(f"jax {jax.__version__}; plugin ok; ensure_ffi_registered() -> "
          f"{js.ensure_ffi_registered()}")


def _trace_args(torch):
    """Meta-tensor arguments of a small call of each public function."""
    def t(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    f8, f32, i32 = torch.float8_e4m3fn, torch.float32, torch.int32
    x = t(4, 512)
    return {
        "matmul": ((t(256, 512), t(512, 256)), {}),
        "linear": ((t(2, 128, 512), t(256, 512), t(256)), {}),
        "grouped_mm": ((t(512, 256), t(4, 256, 256), t(4, dtype=i32)), {}),
        "scaled_mm": ((t(256, 512, dtype=f8), t(256, 512, dtype=f8).t(), t((), dtype=f32),
                       t((), dtype=f32)), {"out_dtype": torch.bfloat16}),
        "scaled_mm_blockwise": ((t(256, 512, dtype=f8), t(256, 512, dtype=f8).t(),
                                 t(256, 4, dtype=f32), t(2, 4, dtype=f32)), {}),
        "attention": ((t(1, 256, 4, 128), t(1, 256, 2, 128), t(1, 256, 2, 128)), {}),
        "attention_varlen": ((t(256, 4, 128), t(256, 2, 128), t(256, 2, 128), t(3, dtype=i32),
                              t(3, dtype=i32), 128, 128), {}),
        "rms_norm": ((x, t(512)), {}),
        "layer_norm": ((x, t(512), t(512)), {}),
        "softmax": ((x,), {}),
        "swiglu": ((x, t(4, 512)), {}),
    }


def check_kernels() -> None:
    failed: list[str] = []
    import pyptx_kernels

    where = Path(pyptx_kernels.__file__).resolve()
    if CHECKOUT / "packages" in where.parents or "site-packages" not in where.parts:
        failed.append(f"pyptx_kernels was imported from {where}, not from an installed wheel")
    if "torch" in sys.modules:
        failed.append("`import pyptx_kernels` imported torch")
    functions = {}
    for name in KERNEL_FUNCTIONS:
        try:
            functions[name] = getattr(pyptx_kernels, name)
        except Exception as e:  # noqa: BLE001 - every missing name is reported
            failed.append(f"pyptx_kernels.{name}: {type(e).__name__}: {e}")
    print(f"pyptx_kernels from {where.parent}: {len(functions)} of {len(KERNEL_FUNCTIONS)} "
          f"public functions; torch imported by the lookups: {'torch' in sys.modules}")
    if not hasattr(pyptx_kernels, "ptx"):
        print("pyptx_kernels.ptx does not exist: kernel tracing not checked")
    else:
        import torch

        for name, (args, kwargs) in _trace_args(torch).items():
            if name not in functions:
                continue
            try:
                texts = pyptx_kernels.ptx(functions[name], *args, **kwargs)
                if not texts or not all(isinstance(v, str) and ".entry" in v
                                        for v in texts.values()):
                    raise AssertionError(f"no PTX entry in {sorted(texts or {})}")
                print(f"ptx({name}): {len(texts)} kernel(s) {', '.join(sorted(texts))}")
            except Exception as e:  # noqa: BLE001 - every failing function is reported
                failed.append(f"ptx({name}, meta tensors): {type(e).__name__}: {e}")
    if failed:
        raise SystemExit("install_check kernels FAILED:\n  " + "\n  ".join(failed))
    print("kernels: install ok")


if __name__ == "__main__":
    {"torch": check_torch, "jax": check_jax, "kernels": check_kernels}[sys.argv[1]]()
