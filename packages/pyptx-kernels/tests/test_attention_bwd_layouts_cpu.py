"""The attention backward reading ``(B, H, S, D)`` q, k, v in place (``layouts=``) on the
CPU: ``ptxsim`` runs the kernels of attention()'s eager plans and of the pair on q, k, v given
as ``(B, H, S, D)`` memory, their gradients bit for bit those of the ``(B, S, H, D)`` kernels
(only the tensor maps' coordinates differ) and within float64's tolerance; the host passes a
view's memory to the kernels without a copy (the launch recorded); ptxas assembles the
variants; bad layouts name the caller's line.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx.errors import ConfigError

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402
from test_sim_attention_fused import _reference  # noqa: E402
from test_tensorcore_sim import TOL, _f64  # noqa: E402

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
P = fab.BackwardPlan
BHSD = ("bhsd",) * 3


def _memory(x, lay):
    """``x`` ``(B, S, H, D)`` bits in memory order ``lay``."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if lay == "bhsd" else x


def _simulate(bwd, q, k, v, o, lse, do):
    """``(dq, dk, dv)`` bits of an ``AttentionBackward`` in the simulator (q, k, v in its
    layouts' memory order)."""
    if not bwd.atomic_dq:
        dq, stats = ptxsim.run(bwd.kernels[0].specialize(), [q, k, v, o, lse, do])
        dk, dv = ptxsim.run(bwd.kernels[1].specialize(), [q, k, v, do, stats])
        return dq, dk, dv
    prep, dkdv, *convert = bwd.kernels
    ordered, lead = "SEM" in dkdv.arg_names, "OUT" in dkdv.arg_names
    stats, acc, *sem = ptxsim.run(prep.specialize(), [o, lse, do],
                                  scratch=(0, 1) if lead else (1,) if ordered else ())
    extra = [o, lse] if lead else []
    got = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, *sem, *extra], inplace=True)
    if convert:
        (dq,) = ptxsim.run(convert[0].specialize(), [acc])
        return (dq, *got)
    dk, dv, dq = got
    return dq, dk, dv


@pytest.mark.parametrize("D,S,Sk,Hq,Hkv,causal,plan,layouts", [
    (64, 130, 130, 2, 1, True, "eager", BHSD),                  # fused, kv_split 2
    (128, 130, 130, 2, 2, True, "eager", BHSD),                 # lagged / converted
    (64, 100, 200, 4, 2, False, "pair", ("bhsd", "bshd", "bhsd")),
    (128, 70, 70, 2, 2, False, "pair", ("bshd", "bhsd", "bhsd")),
])
def test_bhsd_inputs_give_the_bshd_gradients(D, S, Sk, Hq, Hkv, causal, plan, layouts):
    """Every output poisoned; dQ, dK, dV bit for bit the (B, S, H, D) kernels' and within
    float64's tolerance."""
    inputs, grads = _reference(1, S, Sk, Hq, Hkv, D, causal, 11 * D + S)
    q, k, v, o, lse, do = (np.ascontiguousarray(x) for x in inputs)
    make = P.for_eager(D) if plan == "eager" else P()
    base = fab.build_attention_backward(1, S, Hq, Hkv, D, Sk=Sk, causal=causal, plan=make)
    bwd = fab.build_attention_backward(1, S, Hq, Hkv, D, Sk=Sk, causal=causal, plan=make,
                                       layouts=layouts)
    assert bwd.layouts == layouts and bwd.dkdv_kernel.name.endswith(
        "_" + "".join(x[1] for x in layouts))
    xs = [_memory(x, lay) for x, lay in zip((q, k, v), layouts)]
    got = _simulate(bwd, *xs, o, lse, do)
    want = _simulate(base, q, k, v, o, lse, do)
    for name, g, w, ref in zip(("dq", "dk", "dv"), got, want, grads):
        assert g.shape == w.shape and np.array_equal(g, w), name
        err = np.linalg.norm(_f64(g, "bf16") - ref) / np.linalg.norm(ref)
        assert err < TOL["bf16"], (name, err)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("plan", ["eager", "pair"])
def test_bhsd_kernels_assemble(D, plan, assemble):
    make = P.for_eager(D) if plan == "eager" else P()
    bwd = fab.build_attention_backward(2, 300, 8, 2, D, causal=True, plan=make, layouts=BHSD)
    for k in bwd.kernels:
        assemble(k.specialize().ptx())


def test_default_layouts_keep_the_kernels():
    """``layouts`` left out or all ``"bshd"``: the same kernels (names, specs) as before."""
    a = fab.build_attention_backward(1, 200, 4, 2, 64, causal=True, plan=P.for_eager(64))
    b = fab.build_attention_backward(1, 200, 4, 2, 64, causal=True, plan=P.for_eager(64),
                                     layouts=("bshd",) * 3)
    assert [k.name for k in a.kernels] == [k.name for k in b.kernels]
    assert a.in_specs == b.in_specs and a.layouts == ("bshd",) * 3


@pytest.mark.parametrize("D,plan", [(64, "eager"), (128, "eager"), (128, "pair")])
def test_a_new_size_reuses_the_bhsd_family(D, plan, monkeypatch):
    """A (B, H, S, D) backward of a new size takes its family's trace (``_family``) and
    equals a fresh trace of that size in what a launch uses (PTX, scalars, grid, shapes,
    tensor maps)."""
    from pyptx_kernels import _family

    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")
    make = P.for_eager(D) if plan == "eager" else P()

    def specs(B, S):
        bwd = fab.build_attention_backward(B, S, 4, 2, D, causal=True, plan=make,
                                           layouts=BHSD)
        return [k.specialize() for k in bwd.kernels]

    def view(sp):
        return (sp.ptx(), [(n, t.name, v) for n, t, v in sp.scalar_params], sp.grid, sp.block,
                sp.cluster, sp.smem, sp.in_shapes, sp.out_shapes, sp.tma_maps, sp.name)
    build = importlib.import_module("pyptx_kernels.flash_attention.bwd_host")._build
    _family.clear()
    build.cache_clear()
    first = specs(2, 1000)
    before = _family.stats()["reused"]
    reused = specs(1, 1501)
    assert _family.stats()["reused"] > before
    _family.clear()
    build.cache_clear()
    fresh = specs(1, 1501)
    assert all(x.module is not y.module for x, y in zip(first, fresh) if x.module is not None)
    assert [view(x) for x in reused] == [view(x) for x in fresh]
    _family.clear()
    build.cache_clear()


@pytest.mark.parametrize("layouts", [("bsdh",) * 3, "bhsd", ("bhsd",) * 2])
def test_bad_layouts_name_the_callers_line(layouts):
    with pytest.raises(ConfigError, match=rf"{HERE.name}:\d+: .*layouts"):
        fab.build_attention_backward(1, 128, 2, 2, 64, layouts=layouts)


# ------------------------------------------------------------------ the host: no copies
torch = pytest.importorskip("torch")
api = importlib.import_module("pyptx_kernels.flash_attention.api")


class _Recorder:
    """A stand-in for the backward kernels: records what it is given, returns zeros."""

    def __init__(self, dims, layouts):
        self.dims, self.layouts, self.calls = dims, layouts, []

    def __call__(self, q, k, v, o, lse, do):
        self.calls.append((q, k, v, o, lse, do))
        B, S, Hq, Hkv, D, Sk, _ = self.dims[:7]
        return (torch.zeros(B, S, Hq, D, dtype=q.dtype), torch.zeros(B, Sk, Hkv, D, dtype=q.dtype),
                torch.zeros(B, Sk, Hkv, D, dtype=q.dtype))


@pytest.fixture
def recorded(monkeypatch):
    """``_backward_kernel`` replaced by ``_Recorder``s (kept in the returned list)."""
    made = []

    def fake(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, features=api.NO_FEATURES,
             layouts=("bshd",) * 3):
        made.append(_Recorder((B, S, Hq, Hkv, D, Sk, dtype), layouts))
        return made[-1]
    monkeypatch.setattr(api, "_backward_kernel", fake)
    return made


def _bhsd(B, H, S, D, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, S, D, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("kv_layout", ["bhsd", "bshd"])
def test_launch_backward_hands_bhsd_memory_over_in_place(recorded, kv_layout):
    """q as a (B, S, H, D) view of (B, H, S, D) memory, k, v either: the kernels get that
    memory (the same data pointers), o, lse, do (contiguous) as they are: nothing copied."""
    B, S, Hq, Hkv, D = 2, 40, 4, 2, 64
    qm = _bhsd(B, Hq, S, D, 1)
    if kv_layout == "bhsd":
        km, vm = _bhsd(B, Hkv, S, D, 2), _bhsd(B, Hkv, S, D, 3)
        k, v = km.transpose(1, 2), vm.transpose(1, 2)
    else:
        k = v = km = vm = _bhsd(B, S, Hkv, D, 2)
    q = qm.transpose(1, 2)
    o, do = (torch.zeros(B, S, Hq, D, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.zeros(B, Hq, S)
    dq, dk, dv = api._launch_backward(q, k, v, o, lse, do, True, 0.125)
    (rec,) = recorded
    assert rec.dims == (B, S, Hq, Hkv, D, S, "bf16")
    assert rec.layouts == ("bhsd", kv_layout, kv_layout)
    (args,) = rec.calls
    want = (qm, km, vm, o, lse, do)
    assert [x.data_ptr() for x in args] == [x.data_ptr() for x in want], "an input was copied"
    assert all(x.is_contiguous() and x.shape == w.shape for x, w in zip(args, want))
    assert dq.shape == (B, S, Hq, D) and dk.shape == (B, S, Hkv, D)


def test_other_strides_are_copied(recorded):
    """A slice of a packed (B, S, 3, H, D) projection is neither order: copied, as
    ``(B, S, H, D)``."""
    qkv = torch.zeros(1, 32, 3, 2, 64, dtype=torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o, do = torch.zeros_like(q).contiguous(), torch.zeros_like(q).contiguous()
    api._launch_backward(q, k, v, o, torch.zeros(1, 2, 32), do, False, 0.125)
    (rec,) = recorded
    assert rec.layouts == ("bshd",) * 3
    assert all(x.data_ptr() != qkv.data_ptr() and x.is_contiguous() for x in rec.calls[0][:3])


def test_autograd_of_a_bhsd_call_reads_the_callers_tensors(recorded, monkeypatch):
    """``attention(layout="bhsd")`` with gradients: the backward's kernels get the caller's
    (B, H, S, D) q, k, v memory (its data pointers); the gradients come back in the
    caller's shape."""
    monkeypatch.setattr(api._common, "check_devices", lambda who, *xs: None)

    def forward(q, k, v, causal, scale, features=api.NO_FEATURES):
        B, S, H, D = q.shape
        return q.contiguous() * 0.5, torch.zeros(B, H, S)
    monkeypatch.setattr(api, "_launch_forward", forward)
    B, S, Hq, Hkv, D = 1, 24, 4, 2, 128
    q, k, v = (_bhsd(B, h, S, D, i).requires_grad_() for i, h in enumerate((Hq, Hkv, Hkv)))
    out = api.attention(q, k, v, causal=True, layout="bhsd")
    assert out.shape == (B, Hq, S, D)
    out.backward(torch.ones_like(out))
    rec = recorded[-1]
    assert rec.layouts == BHSD
    assert [x.data_ptr() for x in rec.calls[0][:3]] == [x.data_ptr() for x in (q, k, v)]
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
