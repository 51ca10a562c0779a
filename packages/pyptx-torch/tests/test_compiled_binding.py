"""CPU test of what ``pyptx_torch.compiled`` keeps beside the C++ plans it binds: the record of
every plan the extension still holds per op variant (its cap), so a bound plan's handle stays
registered with the shim; the extension itself is exercised by test_fastpath_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

import pyptx_torch.compiled as compiled  # noqa: E402


class FakeFastpath:
    PLANS_PER_VARIANT = 3

    def __init__(self):
        self.bound = []

    def bind(self, kernel, kwargs, plan):
        self.bound.append((kernel, kwargs, plan))


def test_bound_plans_keep_their_records_up_to_the_extensions_cap(monkeypatch):
    fake = FakeFastpath()
    monkeypatch.setattr(compiled, "FASTPATH", fake)
    monkeypatch.setattr(compiled, "_bound_records", {})
    plans = [SimpleNamespace(handle=100 + i, index=0, record=object()) for i in range(5)]
    for p in plans[:3]:
        compiled._bind("k#1", "", p, f"fast{p.handle}")
    kept = compiled._bound_records[("k#1", "")]
    assert list(kept.values()) == [p.record for p in plans[:3]]
    compiled._bind("k#1", "", plans[0], "fast-again")  # rebinding a signature: newest again
    compiled._bind("k#1", "", plans[3], "fast103")  # past the cap: the oldest (101) goes
    kept = compiled._bound_records[("k#1", "")]
    assert [h for h, _ in kept] == [102, 100, 103]
    compiled._bind("k#1", "(('BLOCK', 64),)", plans[4], "fast104")  # another variant, own list
    assert list(compiled._bound_records[("k#1", "(('BLOCK', 64),)")]) == [(104, 0)]
    assert [b[2] for b in fake.bound][-2:] == ["fast103", "fast104"]


def build_diff_t():
    from pyptx import Tile, kernel, ptx, reg
    from pyptx.types import f32, u32

    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),),
            grid=lambda N, BLOCK: ((N + BLOCK - 1) // BLOCK, 1, 1),
            block=lambda BLOCK: (BLOCK, 1, 1))
    def diff_t(A, B, D, *, BLOCK=128):
        pa, pb, pd = ptx.global_ptrs(A, B, D)
        i = reg.from_(ptx.special.ctaid.x(), u32) * BLOCK + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < A.shape[0]):
            a, b = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(a, ptx.addr(pa + i * 4))
            ptx.inst.ld.global_.f32(b, ptx.addr(pb + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(pd + i * 4), a - b)
        ptx.ret()

    return diff_t


def test_template_kwargs_trace_fullgraph_as_op_variants():
    """``k(a, b, BLOCK=64)`` under torch.compile(fullgraph=True) records one op whose variant
    string carries the kwargs (Dynamo once refused the key's ``ast.literal_eval`` check)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    k = build_diff_t()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    mode = FakeTensorMode()
    with mode:
        a, b = torch.empty(3000, device="cuda"), torch.empty(3000, device="cuda")
    f = torch.compile(lambda a, b: (k(a, b, BLOCK=64) + 1.0, k(b, a, BLOCK=256)),
                      backend=backend, fullgraph=True, dynamic=False)
    with mode:
        x, y = f(a, b)
    assert tuple(x.shape) == tuple(y.shape) == (3000,)
    code = graphs[0].code
    assert f"\"{k.uid}|(('BLOCK', 64),)\"" in code and f"\"{k.uid}|(('BLOCK', 256),)\"" in code


@pytest.mark.parametrize("bad", [float("nan"), [1, 2], object()])
def test_template_kwargs_that_are_not_literals_are_refused(bad):
    from pyptx.errors import SpecError

    with pytest.raises(SpecError, match="must be Python literals"):
        compiled._kwargs_key({"BLOCK": bad})
    assert compiled._kwargs_key({"B": 2, "A": (1.5, "x", None, True)}) == \
        "(('A', (1.5, 'x', None, True)), ('B', 2))"
