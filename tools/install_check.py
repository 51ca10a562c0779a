"""Run inside a fresh virtualenv after ``pip install "pyptx-core[torch]"`` or ``[jax]``:
proves the user's install resolves the plugin through its entry point.

    python tools/install_check.py torch|jax
"""

from __future__ import annotations

import sys


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


if __name__ == "__main__":
    {"torch": check_torch, "jax": check_jax}[sys.argv[1]]()
