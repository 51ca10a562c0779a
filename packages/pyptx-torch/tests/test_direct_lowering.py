"""CPU tests of the direct launch under inductor (``pyptx_torch.direct``, the default;
``PYPTX_TORCH_DIRECT=0`` turns it off): the generated code calls ``torch.ops.pyptx._direct``
instead of the op (no per-call size assert), with the option off it calls the op, and the direct call of
a CPU tensor still reaches the op (pyptx's SpecError). Each case runs in a fresh process (the
option is read at import) with inductor's caches off (a cached graph would hide the lowering)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import torch
    from torch._inductor.utils import run_and_get_code
    from pyptx import Tile, kernel, ptx
    from pyptx.errors import SpecError
    from pyptx.types import f32
    import pyptx_torch.compiled  # noqa: F401

    @kernel(in_specs=(Tile(256, f32), Tile(256, f32)), out_specs=(Tile(256, f32),),
            grid=(1, 1, 1), block=(32, 1, 1))
    def k(X, W, Y):
        ptx.ret()

    @torch.compile(fullgraph=True, dynamic=False)
    def f(a, b):
        return k(k(a, b), b)

    try:
        run_and_get_code(f, torch.randn(256), torch.randn(256))
    except Exception as e:  # the CPU run fails inside the op; the code is in the log
        print("RAISED", type(e).__name__, "SpecError" in repr(e) or isinstance(e, SpecError))
""")


def _run(direct: bool | None) -> str:
    """The script's output with the option on (True), off (False) or unset (None)."""
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", TORCH_LOGS="output_code")
    env.pop("PYPTX_TORCH_DIRECT", None)
    if direct is not None:
        env["PYPTX_TORCH_DIRECT"] = "1" if direct else "0"
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    return p.stdout + p.stderr


@pytest.mark.parametrize("direct", [None, True], ids=["default", "PYPTX_TORCH_DIRECT=1"])
def test_direct_launch_calls_the_launcher_without_the_op_or_size_asserts(direct):
    out = _run(direct)
    calls = [ln for ln in out.splitlines() if "= torch.ops.pyptx._direct(" in ln]
    assert len(calls) == 2, out[-3000:]
    assert "torch.ops.pyptx.launch2.default(" not in out
    assert "'torch.ops.pyptx.launch2.default')" not in out  # no assert_size_stride on outputs
    assert "RAISED" in out and "True" in out.split("RAISED", 1)[1].splitlines()[0], out[-3000:]


def test_generated_code_calls_the_op_with_the_option_off():
    out = _run(False)
    assert out.count("= torch.ops.pyptx.launch2.default(") == 2, out[-3000:]
    assert "torch.ops.pyptx._direct(" not in out
    assert "RAISED" in out and "True" in out.split("RAISED", 1)[1].splitlines()[0], out[-3000:]


def test_direct_name_resolves_without_the_option():
    # code inductor cached with the option on must run in a process without it
    import torch

    import pyptx_torch.compiled  # noqa: F401
    from pyptx_torch import direct

    fn = eval(direct.DIRECT_NAME, {"torch": torch})  # noqa: S307 - the generated code's name
    assert callable(fn)


def test_eager_use_does_not_import_inductor():
    # importing torch._inductor costs seconds (9 s of a first call on the H100 in session
    # 11): the lowerings are registered when a graph is traced, never before
    code = textwrap.dedent("""
        import sys
        import torch
        import pyptx_torch.compiled  # noqa: F401
        import pyptx_torch.eager as eager
        eager.make_launcher()
        print("INDUCTOR", "torch._inductor.lowering" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYPTX_TORCH_DIRECT="1"), timeout=300)
    assert "INDUCTOR False" in out.stdout, out.stdout + out.stderr
