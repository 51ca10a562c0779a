"""CPU tests of the host paths of the differentiable calls, with no-op launches
(``tools/host_overhead.py``): ``grouped_mm``'s cache of checked call signatures and the
torch autograd glue of ``differentiable_kernel`` launch the same kernels on the same
arguments as the checked path, give every input its gradient, and raise the same errors.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from pyptx.errors import ConfigError
from pyptx.testing import load_module

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
tool = load_module(ROOT / "tools" / "host_overhead.py", "host_overhead_tool")


@pytest.fixture
def launches(monkeypatch):
    """The launches of the test (kernel, args); launches are no-ops, undone afterwards."""
    record: list = []
    tool.install_noop_launches(monkeypatch, record)
    yield record
    for k, _ in record:  # the kernels made here forget the no-op launcher
        base = getattr(k, "kernel", k)
        for obj in {id(k): k, id(base): base}.values():
            for name in ("_launchers", "_runtime_launchers"):
                d = obj.__dict__.get(name)
                if isinstance(d, dict):
                    d.clear()


def _signature(record):
    return [(k.name, [(tuple(a.shape), a.stride(), a.dtype) for a in args]) for k, args in record]


@pytest.mark.parametrize("k_major", [False, True])
def test_grouped_mm_cached_call_launches_the_same(launches, k_major):
    gg = importlib.import_module("pyptx_kernels.grouped_gemm.host")
    gg._CALLS.clear()  # one module per process: start from an empty signature cache
    G, Mg, N, K = 3, 64, 32, 48
    a = torch.randn(G * Mg, K).to(torch.bfloat16).requires_grad_(True)
    if k_major:  # (G, N, K) storage read through its transpose
        b = torch.randn(G, N, K).to(torch.bfloat16).transpose(1, 2).requires_grad_(True)
    else:
        b = torch.randn(G, K, N).to(torch.bfloat16).requires_grad_(True)
    offs = torch.tensor([50, 100, 192], dtype=torch.int32)
    dy = torch.randn(G * Mg, N).to(torch.bfloat16)
    sigs = []
    for _ in range(3):
        launches.clear()
        a.grad = b.grad = None
        out = gg.grouped_mm(a, b, offs)
        out.backward(dy)
        assert out.shape == (G * Mg, N) and out.dtype == torch.bfloat16
        assert a.grad.shape == a.shape and b.grad.shape == b.shape
        sigs.append(_signature(launches))
    assert len(gg._CALLS) == 1, "the second call should come from the signature cache"
    assert (next(iter(gg._CALLS.values()))[0]) is k_major
    assert len(sigs[0]) == 3 and sigs[0] == sigs[1] == sigs[2]
    fwd_b = launches[0][1][1]
    assert fwd_b.is_contiguous() and tuple(fwd_b.shape) == ((G, N, K) if k_major else (G, K, N))


def test_grouped_mm_errors_unchanged_after_cached_calls(launches):
    gg = importlib.import_module("pyptx_kernels.grouped_gemm.host")
    gg._CALLS.clear()  # one module per process: start from an empty signature cache
    a = torch.randn(128, 64).to(torch.bfloat16)
    b = torch.randn(2, 64, 32).to(torch.bfloat16)
    offs = torch.tensor([64, 128], dtype=torch.int32)
    gg.grouped_mm(a, b, offs)
    gg.grouped_mm(a, b, offs)
    with pytest.raises(ConfigError, match=r"test_host_overhead_cpu\.py:\d+: .*offs must be int32"):
        gg.grouped_mm(a, b, offs.long())
    with pytest.raises(ConfigError, match="a must be bfloat16"):
        gg.grouped_mm(a.float(), b, offs)
    with pytest.raises(ConfigError, match="groups of"):
        gg.grouped_mm(a, b[:, :16], offs)
    # padding (N = 30 is not a multiple of 8) and explicit configs keep the checked path
    out = gg.grouped_mm(a, b[..., :30].contiguous(), offs)
    out2 = gg.grouped_mm(a, b, offs, config=gg.GroupedConfig(BM=128, BN=128))
    assert out.shape == (128, 30) and out2.shape == (128, 32)
    assert len(gg._CALLS) == 1


def test_attention_glue_saves_outputs_and_gives_three_gradients(launches):
    from pyptx_kernels.flash_attention import fwd_host as fa
    q, k, v = (torch.randn(1, 192, 2, 64).to(torch.bfloat16).requires_grad_(True)
               for _ in range(3))
    dy = torch.randn(1, 192, 2, 64).to(torch.bfloat16)
    o = fa.attention(q, k, v, True)
    o.backward(dy)
    assert o.shape == q.shape
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))
    # the backward got q, k, v, then the saved outputs o and lse, then the output gradients
    bwd_args = [args for kern, args in launches[1:]]
    assert bwd_args and tuple(bwd_args[0][0].shape) == tuple(q.shape)


def test_tool_runs_and_reports_each_step(capsys):
    # the tool itself patches for good; run it in a child process
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "tools/host_overhead.py"), "--cases", "grouped",
                        "--grouped-shapes", "2x64x32x64", "--iters", "5", "--rounds", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| grouped_mm 2x64x32x64")]
    assert [ln.split("|")[2].split("(")[0].strip() for ln in rows] == [
        "op lookup", "fwd kernel", "bwd kernels", "fwd", "fwd+bwd"]
    assert "(3 launches)" in rows[-1]
