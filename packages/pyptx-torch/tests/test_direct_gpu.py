"""GPU test of the direct launch under inductor (the default; ``PYPTX_TORCH_DIRECT=0`` is off,
``pyptx_torch.direct``), in a fresh process with inductor's caches off: a compiled fn
chaining a copy kernel with pointwise ops matches eager exactly (copies are exact) on fresh
random inputs, with outputs poisoned (NaN) on the first calls; repeats stay in C++
(``fallback_calls`` unchanged); a new shape and poisoning go through the op and stay exact."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SCRIPT = textwrap.dedent("""
    import torch
    from pyptx import Tile, kernel, ptx, reg
    from pyptx.types import f32, u32
    import pyptx_torch.eager as eager
    from pyptx_torch.fastpath import FASTPATH
    from torch._inductor.utils import run_and_get_code

    def build_copy(n):
        @kernel(in_specs=(Tile(n, f32),), out_specs=(Tile(n, f32),), grid=(n // 256, 1, 1),
                block=(256, 1, 1))
        def copy(X, Y):
            px, py = ptx.global_ptrs(X, Y)
            i = (reg.from_(ptx.special.ctaid.x(), u32) * 256
                 + reg.from_(ptx.special.tid.x(), u32)) * 4
            v = reg.scalar(f32)
            ptx.inst.ld.global_.f32(v, ptx.addr(px + i))
            ptx.inst.st.global_.f32(ptx.addr(py + i), v)
            ptx.ret()
        return copy

    ks = {n: build_copy(n) for n in (4096, 8192)}

    def f(a):
        k = ks[a.numel()]
        return k(k(a) * 2.0) + 1.0

    fc = torch.compile(f, fullgraph=True, dynamic=False)
    eager.set_poison(True)
    x = torch.randn(4096, device="cuda")
    out, (code,) = run_and_get_code(fc, x)
    assert code.count("torch.ops.pyptx._direct(") == 2, code
    assert torch.equal(out, x * 2.0 + 1.0)
    eager.set_poison(False)
    for _ in range(2):
        fc(torch.randn(4096, device="cuda"))
    before = FASTPATH.fallback_calls() if FASTPATH is not None else None
    for _ in range(5):
        x = torch.randn(4096, device="cuda")
        assert torch.equal(fc(x), x * 2.0 + 1.0)
    if FASTPATH is not None:
        assert hasattr(FASTPATH, "direct"), "extension built before direct()"
        assert FASTPATH.fallback_calls() == before, "repeats left C++"
    eager.set_poison(True)
    for n in (8192, 4096):
        x = torch.randn(n, device="cuda")
        assert torch.equal(fc(x), x * 2.0 + 1.0)
    print("DIRECT OK", FASTPATH is not None)
""")


def test_direct_launch_matches_eager_and_stays_in_cpp():
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", PYPTX_TORCH_DIRECT="1")
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=400)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "DIRECT OK" in out, out[-4000:]
    if os.environ.get("PYPTX_REQUIRE_FASTPATH") == "1":
        assert "DIRECT OK True" in out, out[-4000:]
