"""GPU checks of the Ampere-style tensor-core helpers the simulator does not model:
``ptx.ldmatrix``/``stmatrix`` (with ``.trans``), ``ptx.cp_async`` (zero-fill by ``src_size``)
and ``ptx.mma_sync`` (fragment layouts against a float64 reference).

    pytest -m gpu packages/pyptx-torch/tests/test_tensorcore_helpers_gpu.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pyptx import Tile, kernel, ptx, reg, smem  # noqa: E402
from pyptx.types import b32, bf16, f32, u8, u64  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CORE_TESTS = Path(__file__).resolve().parents[2] / "pyptx-core" / "tests"


def core_test_module():
    spec = importlib.util.spec_from_file_location(
        "core_tensorcore_helpers", CORE_TESTS / "test_tensorcore_helpers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mma_sync_tile_matches_float64():
    """cp.async tiles, ldmatrix fragments, two m16n8k16 bf16 mma.sync: C = A @ B^T."""
    k = core_test_module().mma_tile_kernel()
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(16, 32, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(8, 32, device="cuda", generator=g).to(torch.bfloat16)
        c = k(a, b)
        ref = a.double() @ b.double().T
        assert torch.allclose(c.double(), ref, rtol=1e-5, atol=1e-5), (c, ref)


def blockwise_transpose_kernel():
    """ldmatrix x4 of a 16x16 bf16 tile, stmatrix x4 .trans back: each 8x8 block transposed."""

    @kernel([Tile(16, 16, bf16)], [Tile(16, 16, bf16)], block=(32, 1, 1), name="blocks_t")
    def k(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        src = smem.alloc(bf16, (16, 16), align=128, name="src")
        dst = smem.alloc(bf16, (16, 16), align=128, name="dst")
        lane = ptx.special.laneid()
        off = reg.from_(lane * 16, u64)
        v = reg.array(b32, 4)
        ptx.inst.ld.global_.v4.b32(v, ptx.addr(px + off))
        ptx.inst.st.shared.v4.b32(ptx.addr(src.addr() + lane * 16), v)
        ptx.bar_sync(0)
        row_addr = (lane & 15) * 32 + (lane >> 4) * 16
        frag = ptx.ldmatrix(reg.array(b32, 4), ptx.addr(src.addr() + row_addr))
        ptx.stmatrix(ptx.addr(dst.addr() + row_addr), frag, trans=True)
        ptx.bar_sync(0)
        ptx.inst.ld.shared.v4.b32(v, ptx.addr(dst.addr() + lane * 16))
        ptx.inst.st.global_.v4.b32(ptx.addr(py + off), v)
        ptx.ret()

    return k


def test_ldmatrix_stmatrix_trans_round_trip():
    x = torch.randn(16, 16, device="cuda").to(torch.bfloat16)
    y = blockwise_transpose_kernel()(x)
    ref = x.reshape(2, 8, 2, 8).transpose(1, 3).reshape(16, 16)  # each 8x8 block transposed
    assert torch.equal(y, ref)


def zero_fill_kernel():
    """Lane t copies 16 bytes with src_size = t % 17: bytes past it arrive as zeros."""

    @kernel([Tile(128, f32)], [Tile(128, f32)], block=(32, 1, 1), name="zero_fill")
    def k(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        buf = smem.alloc(u8, 512, align=128, name="buf")
        lane = ptx.special.laneid()
        off = reg.from_(lane * 16, u64)
        keep = lane - (lane // 17) * 17
        ptx.cp_async.copy(ptx.addr(buf.addr() + lane * 16), ptx.addr(px + off), 16, src_size=keep)
        ptx.cp_async.commit_group()
        ptx.cp_async.wait_all()
        v = reg.array(b32, 4)
        ptx.inst.ld.shared.v4.b32(v, ptx.addr(buf.addr() + lane * 16))
        ptx.inst.st.global_.v4.b32(ptx.addr(py + off), v)
        ptx.ret()

    return k


def test_cp_async_src_size_zero_fills():
    x = torch.rand(128, device="cuda") + 1.0  # no zero bytes in the sign/exponent bytes
    y = zero_fill_kernel()(x)
    ref = x.clone().view(torch.uint8).reshape(32, 16)
    for t in range(32):
        ref[t, t % 17:] = 0
    assert torch.equal(y.view(torch.uint8), ref.reshape(512))
