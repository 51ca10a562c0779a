"""``pyptx._dataclass.dataclass``: ``dataclasses.dataclass`` with its generated methods' code
kept compiled between processes (CPU)."""

from __future__ import annotations

import builtins
import dataclasses
import subprocess
import sys

import pytest

from pyptx import _dataclass


@pytest.fixture
def store(monkeypatch, tmp_path):
    path = tmp_path / "__pycache__" / "methods.marshal"
    monkeypatch.setattr(_dataclass, "_PATH", str(path))
    monkeypatch.setattr(_dataclass, "_codes", None)
    compiled = []

    def counting(*args, **kwargs):
        compiled.append(args[0])
        return builtins.compile(*args, **kwargs)

    monkeypatch.setattr(_dataclass, "compile", counting, raising=False)
    return path, compiled


def make(deco):
    @deco(frozen=True)
    class Point:
        """A point."""

        x: int
        y: int = 2
        tags: tuple = dataclasses.field(default_factory=tuple)

    return Point


def test_the_same_class_as_dataclasses_makes(store):
    path, compiled = store
    ours, theirs = make(_dataclass.dataclass), make(dataclasses.dataclass)
    assert compiled and path.is_file()
    a, b = ours(1), theirs(1)
    assert repr(a).replace("Point", "P") == repr(b).replace("Point", "P")
    assert a == ours(1, 2, ()) and a != ours(3) and hash(a) == hash(ours(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.x = 5
    assert [f.name for f in dataclasses.fields(ours)] == ["x", "y", "tags"]
    assert dataclasses.replace(a, y=7).y == 7 and dataclasses.asdict(a) == dataclasses.asdict(b)
    assert ours.__init__.__annotations__ == theirs.__init__.__annotations__   # not strings
    assert ours.__dataclass_params__.frozen and dataclasses.is_dataclass(ours)
    assert "exec" not in vars(dataclasses)   # dataclasses itself is left as it was


def test_a_new_process_compiles_nothing_it_has_seen(store):
    path, compiled = store
    make(_dataclass.dataclass)
    first = len(compiled)
    _dataclass._codes = None   # as a new process: the methods come from the file
    make(_dataclass.dataclass)
    assert len(compiled) == first

    @_dataclass.dataclass
    class Other:
        z: float = 0.5

    assert len(compiled) > first and Other().z == 0.5


def test_an_unwritable_or_torn_store_only_costs_time(store, monkeypatch, tmp_path):
    path, compiled = store
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not marshal")
    assert make(_dataclass.dataclass)(4).x == 4
    monkeypatch.setattr(_dataclass, "_PATH", str(tmp_path / "file" / "x.marshal"))
    (tmp_path / "file").write_text("a file where the folder would be")
    monkeypatch.setattr(_dataclass, "_codes", None)
    assert make(_dataclass.dataclass)(5).x == 5


def test_library_classes_are_plain_dataclasses():
    code = ("import dataclasses, pyptx.registry as r, pyptx.plan as p; "
            "print(dataclasses.is_dataclass(r.CubinRecord), p.ArgInfo((1,), 'float32', 'cpu'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "True ArgInfo(shape=(1,), dtype='float32', device='cpu', strides=None)"
