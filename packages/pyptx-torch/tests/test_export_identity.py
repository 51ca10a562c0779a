"""A program saved with ``torch.export`` names each pyptx kernel by the content hash of its
compiled record, written to the disk cache; a fresh process finds it there (no builder, no
uid). On CPU the saved program is run under fake tensors (the op's fake implementation reads
the record); ``test_torch_gpu.py`` runs it for real."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from pyptx import Tile, kernel, ptx  # noqa: E402
from pyptx.registry import find_record  # noqa: E402
from pyptx.types import bf16, f32  # noqa: E402


@kernel(in_specs=(Tile("B", "N", f32), Tile("N", f32)),
        out_specs=(Tile("B", "N", f32), Tile("B", bf16)), grid=lambda B: (B, 1, 1),
        block=(32, 1, 1))
def export_me(X, W, Y, S):
    ptx.ret()


class Model(torch.nn.Module):
    def forward(self, x, w):
        y, s = export_me(x * 2.0, w)
        return y + 1.0, s


def export_to(path):
    with FakeTensorMode(allow_non_fake_inputs=True):
        x, w = torch.empty(4, 64, device="cuda"), torch.empty(64, device="cuda")
        ep = torch.export.export(Model(), (x, w))
    torch.export.save(ep, str(path))
    return ep


RUN_SAVED = textwrap.dedent("""
    import sys
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    import pyptx_torch.compiled  # defines the pyptx ops
    assert not any(m.startswith("test_") for m in sys.modules)
    ep = torch.export.load(sys.argv[1])
    with FakeTensorMode(allow_non_fake_inputs=True):
        y, s = ep.module()(torch.empty(4, 64, device="cuda"), torch.empty(64, device="cuda"))
    print(tuple(y.shape), y.dtype, tuple(s.shape), s.dtype)
""")


def test_export_names_the_kernel_by_content_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    ep = export_to(tmp_path / "model.pt2")
    rec = find_record(export_me.specialize(B=4, N=64).record.key)
    graph = str(ep.graph)
    assert f"sha:{rec.key}" in graph and export_me.uid not in graph
    assert list((tmp_path / "cache").glob(f"{rec.key[:15]}.record.json"))


def test_a_fresh_process_finds_the_kernel_in_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    export_to(tmp_path / "model.pt2")
    run = subprocess.run([sys.executable, "-c", RUN_SAVED, str(tmp_path / "model.pt2")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(4, 64) torch.float32 (4,) torch.bfloat16"


def test_without_the_record_the_fresh_process_says_which_hash_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    export_to(tmp_path / "model.pt2")
    key = export_me.specialize(B=4, N=64).record.key
    env = {**__import__("os").environ, "PYPTX_CACHE_DIR": str(tmp_path / "empty")}
    run = subprocess.run([sys.executable, "-c", RUN_SAVED, str(tmp_path / "model.pt2")],
                         capture_output=True, text=True, env=env)
    assert run.returncode != 0
    assert f"no pyptx kernel with content hash {key}" in run.stderr
