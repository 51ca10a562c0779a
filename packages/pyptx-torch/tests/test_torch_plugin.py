import subprocess
import sys
from importlib.metadata import entry_points

import pytest

torch = pytest.importorskip("torch")

import pyptx_torch
from pyptx.errors import SpecError
from pyptx_torch.runtime import TorchRuntime


def test_entry_point_loads_torch_runtime():
    (ep,) = [ep for ep in entry_points(group="pyptx.runtimes") if ep.name == "torch"]
    assert ep.value == "pyptx_torch.runtime:TorchRuntime"
    assert ep.load() is TorchRuntime
    assert TorchRuntime.name == "torch"


def test_import_does_not_import_torch():
    code = "import sys, pyptx_torch, pyptx_torch.runtime; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_is_torch_tensor():
    assert pyptx_torch.is_torch_tensor(torch.zeros(2))
    assert pyptx_torch.is_torch_tensor(torch.nn.Parameter(torch.zeros(2)))
    assert not pyptx_torch.is_torch_tensor([0.0, 0.0])
    assert not pyptx_torch.is_torch_tensor(None)


def test_any_torch_tensors():
    assert pyptx_torch.any_torch_tensors([1, torch.ones(3)])
    assert not pyptx_torch.any_torch_tensors([1, 2.0, "x"])
    assert not pyptx_torch.any_torch_tensors([])


def test_extract_input_shapes():
    x = torch.empty(16, 512)
    w = torch.empty(512)
    s = torch.tensor(3.0)
    assert pyptx_torch.extract_input_shapes([x, w, s]) == [(16, 512), (512,), ()]


def test_extract_input_shapes_rejects_non_tensor():
    with pytest.raises(SpecError, match="input 1"):
        pyptx_torch.extract_input_shapes([torch.empty(2), [1, 2]])


def test_owns():
    runtime = TorchRuntime()
    assert runtime.owns(torch.zeros(1))
    assert not runtime.owns(1.0)
    assert not runtime.owns(object())
