"""The examples: golden PTX, deterministic tracing, ptxas for sm_90a, and their ``__main__``.

Each case traces one builder of ``examples/`` with fixed parameters and
compares its PTX byte for byte with ``examples/tests/golden/<example>_<params>.ptx``.
After an intended change to an example or to the emitter, regenerate the
golden files and review their diff:

    PYPTX_UPDATE_GOLDEN=1 pytest examples/tests/test_examples.py
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from pathlib import Path

import pytest

from pyptx import ConfigError, SpecError

TESTS = Path(__file__).resolve().parent
EXAMPLES = TESTS.parent
ROOT = EXAMPLES.parent
GOLDEN = TESTS / "golden"
GUIDE = ROOT.parent / "shared" / "spec" / "torch_runtime_guide.txt"
UPDATE = os.environ.get("PYPTX_UPDATE_GOLDEN") == "1"

CASES = [
    ("hopper/rms_norm.py", "build_rms_norm", {"B": 16, "N": 512}),
    ("vector_add.py", "build_vector_add", {"N": 1000}),
    ("vector_add.py", "build_vector_add", {"N": 4096, "block": 128}),
    ("block_reduce.py", "build_block_sum", {"B": 8, "N": 1000}),
    ("block_reduce.py", "build_block_sum", {"B": 4, "N": 100_000, "threads": 1024}),
    ("transpose.py", "build_transpose", {"M": 100, "N": 70}),
    ("transpose.py", "build_transpose", {"M": 64, "N": 48, "tile": 16, "rows": 4}),
    ("hopper/tma_copy.py", "build_tma_copy", {"M": 100, "N": 72}),
    ("hopper/wgmma_tile.py", "build_wgmma_tile", {"N": 64, "K": 64}),
    ("hopper/grouped_gemm.py", "build_grouped_gemm", {"M": 300, "N": 136, "K": 200, "G": 4}),
]
IDS = [Path(rel).stem + "_" + "_".join(f"{k}{v}" for k, v in p.items()) for rel, _, p in CASES]

_modules: dict[str, object] = {}


def load(rel: str):
    """Import ``examples/<rel>`` by path (once)."""
    mod = _modules.get(rel)
    if mod is None:
        path = EXAMPLES / rel
        spec = importlib.util.spec_from_file_location(f"pyptx_example_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _modules[rel] = mod
    return mod


def build(rel: str, builder: str, params: dict):
    return getattr(load(rel), builder)(**params)


@pytest.mark.parametrize(("rel", "builder", "params"), CASES, ids=IDS)
def test_golden_ptx(rel, builder, params, request):
    text = build(rel, builder, params).ptx()
    path = GOLDEN / f"{request.node.callspec.id}.ptx"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_bytes(text.encode())
        return
    assert path.exists(), f"no golden file {path.name}; run with PYPTX_UPDATE_GOLDEN=1"
    want = path.read_bytes().decode()
    if text != want:
        diff = difflib.unified_diff(want.splitlines(), text.splitlines(), "golden", "traced",
                                    lineterm="")
        pytest.fail(f"PTX differs from {path.name}:\n" + "\n".join(list(diff)[:80]))


@pytest.mark.parametrize(("rel", "builder", "params"), CASES, ids=IDS)
def test_trace_is_deterministic(rel, builder, params):
    first = build(rel, builder, params)
    second = build(rel, builder, params)
    assert first is not second
    assert first.ptx() == second.ptx()
    assert first.ptx(lineinfo=True) == second.ptx(lineinfo=True)


@pytest.mark.parametrize(("rel", "builder", "params"), CASES, ids=IDS)
def test_ptxas_accepts(rel, builder, params, assemble):
    log = assemble(build(rel, builder, params).ptx())
    assert re.search(r"Used \d+ registers", log), log
    assert "0 bytes spill stores" in log, log


def test_wgmma_tile_assembles_for_every_layout(assemble):
    for sw in (128, 64, 32, None):
        for am in ("K", "MN"):
            for bm in ("K", "MN"):
                report = assemble(build("hopper/wgmma_tile.py", "build_wgmma_tile",
                                        dict(N=64, K=64, a_major=am, b_major=bm,
                                             swizzle=sw)).ptx())
                assert "0 bytes spill stores" in report


def test_wgmma_tile_3d_view(assemble):
    k = build("hopper/wgmma_tile.py", "build_wgmma_tile",
              dict(N=64, K=256, a_major="K", b_major="MN", a_view="3d"))
    text = k.ptx()
    assert text.count("cp.async.bulk.tensor.3d") == 1 and "cp.async.bulk.tensor.2d" in text
    assemble(text)


def test_tma_copy_assembles(assemble):
    log = assemble(build("hopper/tma_copy.py", "build_tma_copy", {"M": 100, "N": 68}).ptx())
    assert "tma_copy" in log


def test_seed_rms_norm_at_scale(assemble):
    spec = build("hopper/rms_norm.py", "build_rms_norm", {"B": 2048, "N": 8192}).specialize()
    assert (spec.grid, spec.block) == ((2048, 1, 1), (32, 1, 1))
    text = spec.ptx()
    assert text.count("ld.global.f32") == 2 * 8192 // 32
    assert text.count("st.global.f32") == 8192 // 32
    assemble(text)


def test_rms_norm_is_the_guide_seed():
    if not GUIDE.exists():
        pytest.skip("the Torch runtime guide (spec/, beside the repository) is not here")
    guide = GUIDE.read_text()
    start = guide.index("from pyptx import Tile")
    end = guide.index("    return rms_norm", start) + len("    return rms_norm")
    ns: dict = {}
    exec(compile(guide[start:end], str(GUIDE), "exec"), ns)
    example = load("hopper/rms_norm.py").build_rms_norm
    for B, N in ((16, 512), (3, 96)):
        assert ns["build_rms_norm"](B, N).ptx() == example(B, N).ptx()


@pytest.mark.parametrize(("rel", "builder", "params", "error"), [
    ("vector_add.py", "build_vector_add", {"N": 10, "block": 100}, ConfigError),
    ("block_reduce.py", "build_block_sum", {"B": 1, "N": 10, "threads": 2048}, ConfigError),
    ("transpose.py", "build_transpose", {"M": 8, "N": 8, "tile": 32, "rows": 5}, ConfigError),
    ("transpose.py", "build_transpose", {"M": 1 << 16, "N": 1 << 16}, SpecError),
    ("hopper/tma_copy.py", "build_tma_copy", {"M": 64, "N": 64, "box": 128}, ConfigError),
    ("hopper/grouped_gemm.py", "build_grouped_gemm", {"M": 64, "N": 64, "K": 64, "G": 2,
                                                       "BN": 32}, ConfigError),
])
def test_bad_parameters_are_refused(rel, builder, params, error):
    with pytest.raises(error, match=builder):
        build(rel, builder, params)


@pytest.mark.parametrize(("rel", "argv"), [
    ("hopper/rms_norm.py", ["4", "--N", "64"]),
    ("vector_add.py", ["1000"]),
    ("block_reduce.py", ["2", "300", "--threads", "64"]),
    ("transpose.py", ["40", "--N", "50"]),
    ("hopper/tma_copy.py", ["64", "--N", "40"]),
    ("hopper/wgmma_tile.py", ["KK128", "MNK64"]),
    ("hopper/grouped_gemm.py", ["--M", "100", "--N", "64", "--K", "64", "--G", "3"]),
])
def test_main_runs(rel, argv, capsys):
    assert load(rel).main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"grid \(\d+, \d+, \d+\), block", out) or "PASS" in out, out


def test_harness_reads_positional_and_flag_params():
    from pyptx.testing import parse_args

    assert parse_args("t", [], B=16, N=512) == {"B": 16, "N": 512}
    assert parse_args("t", ["4", "--N", "64"], B=16, N=512) == {"B": 4, "N": 64}
    assert parse_args("t", ["4", "8", "--B", "2"], B=16, N=512) == {"B": 2, "N": 8}
    assert parse_args("t", ["--eps", "1e-5"], eps=1e-6) == {"eps": 1e-5}


@pytest.mark.parametrize(("shift", "status", "verdict"), [(0.0, 0, "PASS"), (1e-3, 1, "FAIL")])
def test_harness_compares_with_reference(shift, status, verdict, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    import pyptx.testing as harness

    class Launched:
        out_specs = (None,)

        def __call__(self, a, b):
            return a + b + shift

    monkeypatch.setattr(harness, "_cuda_torch", lambda: torch)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    inputs = (torch.randn(100), torch.randn(100))
    got = harness.run_example(Launched(), lambda t: inputs, load("vector_add.py").reference,
                               atol=1e-6, rtol=1e-6)
    assert got == status
    assert capsys.readouterr().out.splitlines()[-1] == verdict


def test_examples_import_only_packages():
    """No example edits ``sys.path`` or imports a file beside it by name (issue 18): the row
    harness is ``pyptx.testing``."""
    paths = sorted(p for p in EXAMPLES.rglob("*.py") if TESTS not in p.parents)
    assert {p.relative_to(EXAMPLES).as_posix() for p in paths} >= {rel for rel, _, _ in CASES}
    for path in paths:
        text = path.read_text()
        assert "sys.path" not in text, path
        assert not re.search(r"^\s*(import|from) _(?!_future__)", text, re.M), path
        assert "pyptx.testing" in text or "def main" not in text, path
