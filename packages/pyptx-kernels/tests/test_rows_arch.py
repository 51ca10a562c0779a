"""The row kernels per target and per row count, on the CPU.

* every op x arch (sm_80, sm_90a, sm_100a) x plan of its tuned table assembles with ptxas and
  does not spill; sm_80 refuses the plans that need the bulk copy engine (``ring``, ``bulk``)
  and its PTX has no PDL, bulk copies or mbarriers;
* the row count is a kernel parameter: the PTX of every plan (and of both backward stages) is
  the same for B = 1000, 1001 and others, and the simulator runs one such PTX correctly at
  several row counts;
* ``default_plan`` names plans of the tuned tables, follows the arch, and is what a default
  call settles on where no table ships (no timing); ``device_arch`` maps capabilities.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from pyptx_kernels._modules import kernel_module
from pyptx_kernels.rows import config as C
from pyptx_kernels.rows.config import RowConfig

from pyptx import ConfigError, PyptxError

OPS = {
    "rms_norm": ("rms_norm", "build_rms_norm_fast", C.RMS_NORM_CONFIGS, (1e-6,)),
    "layer_norm": ("layer_norm", "build_layer_norm", C.LAYER_NORM_CONFIGS, (1e-5,)),
    "softmax": ("softmax", "build_softmax_fast", C.SOFTMAX_CONFIGS, ()),
    "swiglu": ("swiglu", "build_swiglu", C.SWIGLU_CONFIGS, ()),
}
BACKWARD = (("rms_norm", "build_rms_norm_bwd"), ("layer_norm", "build_layer_norm_bwd"))
#: one ragged-ish and one benchmark-like row per dtype (few rows: the PTX does not depend on B)
SHAPES = ((5, 1000, "f32"), (3, 4096, "bf16"))
#: what sm_80 lacks
HOPPER_ONLY = ("griddepcontrol", "cp.async.bulk", "mbarrier")


@pytest.fixture(scope="module")
def sim():
    """Core's PTX simulator (``conftest`` puts its folder on the import path)."""
    import ptxsim

    return ptxsim


def builder(op):
    module, name, table, extra = OPS[op]
    return getattr(kernel_module(module), name), table, extra


def kernels_of(k):
    return list(k.kernels) if hasattr(k, "kernels") else [k]


@pytest.mark.parametrize("arch", C.ARCHS)
@pytest.mark.parametrize("op", OPS)
def test_every_plan_assembles_for_every_arch(op, arch, assemble):
    build, table, extra = builder(op)
    built = refused = 0
    for B, N, dt in SHAPES:
        for c in table:
            try:
                k = build(B, N, dt, *extra, config=c, arch=arch)
            except PyptxError as e:
                if arch == "sm_80" and c.plan in ("ring", "bulk"):
                    assert isinstance(e, ConfigError) and "sm_80 has no bulk copy" in str(e)
                    assert str(e).startswith(__file__), str(e)
                    refused += 1
                    continue
                assert "multiple of 16" in str(e) or "partial last chunk" in str(e), (c, e)
                continue
            for kk in kernels_of(k):
                text = kk.ptx()
                assert f".target {arch}" in text
                if arch == "sm_80":
                    assert not any(s in text for s in HOPPER_ONLY), (c, arch)
                elif c.pdl:
                    assert "griddepcontrol.wait" in text
                log = assemble(text, arch)
                assert "0 bytes spill stores" in log, (op, arch, c, log)
                built += 1
    assert built >= len(table)
    assert refused == (sum(c.plan in ("ring", "bulk") for c in table) * len(SHAPES)
                       if arch == "sm_80" else 0)


@pytest.mark.parametrize("arch", C.ARCHS)
def test_backward_kernels_assemble_for_every_arch(arch, assemble):
    for module, name in BACKWARD:
        build = getattr(kernel_module(module), name)
        for B, N, dt in SHAPES:
            for kk in build(B, N, dt, arch=arch).kernels:
                log = assemble(kk.ptx(), arch)
                assert "0 bytes spill stores" in log, (name, arch, log)


@pytest.mark.parametrize("op", OPS)
def test_ptx_does_not_depend_on_the_row_count(op):
    build, table, extra = builder(op)
    for N, dt in ((1000, "f32"), (8192, "bf16"), (24, "f32")):
        for c in table:
            texts = set()
            for B in (1000, 1001, 7, 65537):
                try:
                    texts.add(tuple(kk.ptx() for kk in kernels_of(
                        build(B, N, dt, *extra, config=c))))
                except PyptxError:
                    break
            assert len(texts) <= 1, (op, N, dt, c)


def test_backward_ptx_does_not_depend_on_the_row_count():
    for module, name in BACKWARD:
        build = getattr(kernel_module(module), name)
        for N, dt in ((1000, "f32"), (4096, "bf16")):
            # 50 rows: fewer groups than 264 CTAs; 10**5 rows: a larger grid, more partials
            ks = [build(B, N, dt) for B in (50, 1000, 1001, 100000)]
            grids = {k.kernels[0].specialize().grid for k in ks}
            assert len(grids) == 3
            for stage in range(2):
                assert len({k.kernels[stage].ptx() for k in ks}) == 1, (name, N, dt, stage)


@pytest.mark.parametrize("kw", [{}, dict(ctas=3, pdl=False), dict(ctas=2, stages=2)])
def test_one_ptx_runs_at_several_row_counts_in_the_simulator(sim, kw):
    """The same PTX (asserted), launched with each row count's grid and ``nrows``, is right."""
    build, _, _ = builder("rms_norm")
    N = 24 if "stages" not in kw else 64
    texts = set()
    for B in (1, 5, 13):
        k = build(B, N, "f32", 1e-6, config=RowConfig(**kw))
        spec = k.specialize()
        texts.add(spec.ptx())
        rng = np.random.default_rng(B)
        x = rng.standard_normal((B, N)).astype(np.float32)
        w = (rng.standard_normal(N) * 0.1 + 1).astype(np.float32)
        (y,) = sim.run(spec, [x, w])
        y = y.view(np.float32)
        x64 = x.astype(np.float64)
        ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5, (B, kw)
    assert len(texts) == 1


def test_swiglu_one_ptx_runs_at_several_row_counts_in_the_simulator(sim):
    build, _, _ = builder("swiglu")
    texts = set()
    for B, kw in ((1, {}), (3, {}), (9, {}), (3, dict(bulk=True, threads=64)),
                  (9, dict(bulk=True, threads=64))):
        spec = build(B, 40, "f32", config=RowConfig(chunks=2, **kw)).specialize()
        texts.add((bool(kw), spec.ptx()))
        rng = np.random.default_rng(B)
        g, u = (rng.standard_normal((B, 40)).astype(np.float32) for _ in range(2))
        (y,) = sim.run(spec, [g, u])
        y = y.view(np.float32)
        g64 = g.astype(np.float64)
        ref = g64 / (1 + np.exp(-g64)) * u
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5, (B, kw)
    assert len(texts) == 2


def test_default_plan_names_a_plan_of_the_table_and_follows_the_arch():
    tables = {op: OPS[op][2] for op in OPS}
    for op, table in tables.items():
        for arch in C.ARCHS:
            for rows in (1, 300, 511, 512, 2048, 4095, 4096, 10**6):
                for N in (1, 96, 4096, 8192, 16384, 32768):
                    for dt in ("f32", "bf16"):
                        c = C.default_plan(op, rows, N, dt, arch)
                        assert c in table, (op, arch, rows, N, dt, c)
                        if arch == "sm_80":
                            assert not c.pdl and c.plan in ("row", "persistent")
                        if arch != "sm_90a":
                            assert c.plan != "persistent"  # its CTA count is an H100/H200's
    # the recorded winners it follows (docs/benchmarks/memory_bound.md)
    assert C.default_plan("rms_norm", 2048, 8192, "f32") == RowConfig(chunks=8)
    assert C.default_plan("rms_norm", 1024, 8192, "bf16") == RowConfig(ctas=264, pdl=False)
    assert C.default_plan("softmax", 8192, 8192, "bf16") == RowConfig()
    assert C.default_plan("swiglu", 1024, 8192, "bf16") == RowConfig(threads=128, pdl=False)


def test_a_default_call_settles_on_the_heuristic_without_timing(monkeypatch):
    monkeypatch.delenv("PYPTX_AUTOTUNE", raising=False)
    build, _, _ = builder("rms_norm")
    k = build(1024, 8192, "bf16", 1e-6)
    assert k.tuner.default is not None
    # a device with no shipped table: the heuristic's plan
    assert k.default_config("NVIDIA B200").kwargs == dict(ctas=264, pdl=False)
    k80 = build(1024, 8192, "bf16", 1e-6, arch="sm_80")
    assert k80.default_config("NVIDIA A100-SXM4-80GB").kwargs == dict(pdl=False)
    assert ".target sm_80" in k80.ptx()


def test_bad_arch_fails_at_the_callers_line():
    build, _, _ = builder("softmax")
    with pytest.raises(ConfigError, match=r"arch must be one of sm_80, sm_90a, sm_100a, got "
                                          r"'sm_70'") as e:
        build(4, 64, "f32", arch="sm_70")
    assert str(e.value).startswith(__file__)
    with pytest.raises(ConfigError, match="arch must be one of"):
        kernel_module("rms_norm").build_rms_norm_bwd(4, 64, "f32", arch="sm_89")


def test_device_arch_maps_capabilities(monkeypatch):
    torch = pytest.importorskip("torch")
    assert C.device_arch(torch.zeros(2)) == "sm_90a"
    assert C.device_arch(torch.zeros(2, device="meta")) == "sm_90a"
    assert C.device_arch(np.zeros(2)) == "sm_90a"
    for cap, arch in (((8, 0), "sm_80"), ((8, 9), "sm_80"), ((9, 0), "sm_90a"),
                      ((10, 0), "sm_100a"), ((12, 0), "sm_90a")):
        C._capability_arch.cache_clear()
        C._ARCH_OF_DEVICE.clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None, c=cap: c)
        fake = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda", index=0))
        assert C.device_arch(fake) == arch, cap
    C._capability_arch.cache_clear()
    C._ARCH_OF_DEVICE.clear()
