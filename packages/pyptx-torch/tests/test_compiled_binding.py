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
