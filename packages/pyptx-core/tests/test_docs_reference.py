"""Every public name of ``pyptx``, ``pyptx.ptx.*``, ``pyptx_torch`` and ``pyptx_jax`` has a
docstring and an entry in the API reference (``docs/reference/*.md``).

Public means listed in ``__all__`` (a module without ``__all__``: its own top-level
names not starting with ``_``). The objects are read the way the site reads them, with
griffe (mkdocstrings' loader), so a name passes only if its reference entry shows text.
Runs in the ``docs`` nox session, where griffe is installed; skipped elsewhere.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[3]
SRC = [ROOT / "packages" / p / "src" for p in ("pyptx-core", "pyptx-torch", "pyptx-jax")]
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: (?P<path>[\w.]+)\s*$(?P<opts>(?:\n[ \t]+.*)*)", re.M)
TOP = ("pyptx", "pyptx_torch", "pyptx_jax")

#: Public names whose docstring lives in a file the docs owner may not edit. Each entry is
#: a debt: add the docstring, then delete the line (the test fails on stale entries).
KNOWN_MISSING: dict[str, str] = {}


def _load():
    loader = griffe.GriffeLoader(search_paths=[str(p) for p in SRC])
    for name in TOP:
        loader.load(name)
    loader.resolve_aliases(implicit=False, external=False)
    return loader.modules_collection


def _submodules(mod):
    """Public submodules, recursively (``_operands`` and the like are implementation)."""
    for name, m in mod.modules.items():
        if not name.startswith("_"):
            yield m
            yield from _submodules(m)


def _target(obj):
    try:
        return obj.final_target if obj.is_alias else obj
    except Exception:  # noqa: BLE001 - an alias griffe cannot resolve
        return None


def _runtime_is_module(module_path: str, name: str) -> bool | None:
    """Whether the runtime attribute is a module (None when the module cannot be imported)."""
    try:
        mod = importlib.import_module(module_path)
    except ImportError:
        return None
    value = getattr(mod, name, None)
    return None if value is None else type(value).__name__ == "module"


def _resolve(mod, name: str):
    """The griffe object that ``mod.name`` is at run time."""
    obj = mod.members.get(name)
    target = _target(obj) if obj is not None else None
    if target is not None and target.is_module and name in target.members \
            and _runtime_is_module(mod.path, name) is False:
        # ``from .kernel import kernel``: the package attribute is the function, which
        # griffe shadows with the submodule of the same name
        target = _target(target.members[name])
    if target is None:  # provided by a module __getattr__: what its submodules bind to the name
        hits = {t.path: t for m in _submodules(mod) if name in m.members
                and (t := _target(m.members[name])) is not None}
        target = next(iter(hits.values())) if len(hits) == 1 else None
    return target


def _public(mod) -> list[str]:
    if mod.exports is not None:
        return [n for n in mod.exports if not (n.startswith("__") and n.endswith("__"))]
    return [n for n, o in mod.members.items() if not n.startswith("_") and not o.is_alias
            and not o.is_module]


def public_objects(mods) -> dict[str, object]:
    """``public name -> griffe object`` (None when it cannot be found)."""
    scope = [mods["pyptx"], mods["pyptx.ptx"], *_submodules(mods["pyptx.ptx"]),
             mods["pyptx_torch"], mods["pyptx_jax"]]
    return {f"{m.path}.{n}": _resolve(m, n) for m in scope for n in _public(m)}


def documented_paths(mods) -> set[str]:
    """Every path a ``::: path`` directive of the reference renders, with its members."""
    out: set[str] = set()
    for page in sorted(REFERENCE.glob("*.md")):
        for d in DIRECTIVE.finditer(page.read_text()):
            path, opts = d.group("path"), d.group("opts")
            out.add(path)
            obj = _target(mods.get_member(path)) if path in mods or "." in path else None
            if obj is None or not (obj.is_module or obj.is_class):
                continue
            listed = re.search(r"members:\s*((?:\n\s*- \w+)+)", opts)
            if re.search(r"members:\s*false", opts):
                continue
            names = re.findall(r"- (\w+)", listed.group(1)) if listed else _public(obj) \
                if obj.is_module else [n for n in obj.members if not n.startswith("_")]
            for n in names:
                member = obj.members.get(n)
                target = _target(member) if member is not None else None
                out.add(f"{path}.{n}")
                if target is not None:
                    out.add(target.path)
    return out


@pytest.fixture(scope="module")
def mods():
    return _load()


def test_every_public_name_has_a_docstring_and_a_reference_entry(mods):
    documented = documented_paths(mods)
    problems = {}
    for name, obj in public_objects(mods).items():
        if obj is None:
            problems[name] = "cannot be found"
            continue
        missing = []
        if not (obj.docstring and obj.docstring.value.strip()):
            missing.append(f"a docstring (defined at {obj.path})")
        if name not in documented and obj.path not in documented:
            missing.append(f"a reference entry (::: {obj.path} in docs/reference/)")
        if missing:
            problems[name] = "lacks " + " and ".join(missing)
    unexpected = {n: why for n, why in problems.items() if n not in KNOWN_MISSING}
    stale = sorted(n for n in KNOWN_MISSING if n not in problems)
    report = "\n".join(f"  {n}: {why}" for n, why in sorted(unexpected.items()))
    assert not unexpected, f"public names without docs:\n{report}"
    assert not stale, f"KNOWN_MISSING entries that are documented now (delete them): {stale}"


def test_the_check_sees_the_public_api(mods):
    names = public_objects(mods)
    for expected in ("pyptx.kernel", "pyptx.Tile", "pyptx.ptx.mbarrier.wait", "pyptx.ptx.tma.load_tile",
                     "pyptx_torch.differentiable_kernel", "pyptx_jax.call_kernel_via_ffi"):
        assert names.get(expected) is not None, expected
    assert names["pyptx.kernel"].is_function and names["pyptx.ptx.inst"].is_attribute
