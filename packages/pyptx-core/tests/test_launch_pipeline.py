"""CPU checks of issue 18 deliverables that no other test file owns (the checklist is
docs/dev/launch-pipeline.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_examples_and_benchmarks_load_examples_without_sys_path_edits():
    """Item 7: examples import like any package (``pyptx.testing.load_module`` for siblings);
    benchmarks load them the same way (their own ``_timing`` helper aside)."""
    offenders = []
    for path in sorted((ROOT / "examples").rglob("*.py")):
        if "tests" in path.relative_to(ROOT / "examples").parts:
            continue
        if "sys.path" in path.read_text(encoding="utf-8"):
            offenders.append(str(path.relative_to(ROOT)))
    for name in ("dispatch.py", "cold_start.py"):
        text = (ROOT / "benchmarks" / name).read_text(encoding="utf-8")
        edits = re.findall(r"sys\.path\.insert\(.*", text)
        if any("_timing" not in line for line in edits):
            offenders.append(f"benchmarks/{name}")
    assert not offenders, f"sys.path edits in {offenders}"


def test_the_checklist_names_only_tests_that_exist():
    """Every ``tests/<file>::<test>`` the checklist cites is a test function in that file."""
    doc = (ROOT / "docs" / "dev" / "launch-pipeline.md").read_text(encoding="utf-8")
    cited = re.findall(r"`(packages/[\w\-/]+/tests/\w+\.py)::(\w+)`", doc)
    assert len(cited) >= 10
    missing = []
    for file, test in cited:
        path = ROOT / file
        if not path.is_file() or not re.search(rf"^def {test}\(", path.read_text(encoding="utf-8"),
                                               re.MULTILINE):
            missing.append(f"{file}::{test}")
    assert not missing, missing


def test_plan_cache_is_a_bounded_lru():
    """Item 1: the plans of every runtime (torch, JAX, records found by hash) use one LRU."""
    from pyptx.plan import PlanCache

    cache = PlanCache()
    for i in range(3):
        assert cache.keep(i, f"v{i}", slots=3) == []
    assert cache.hit(0) == "v0" and cache.hit(9) is None  # 0 becomes the most recent
    assert cache.keep(3, "v3", slots=3) == ["v1"]  # 1 was the least recently used
    assert list(cache) == [2, 0, 3]
    assert cache.keep(2, "v2b", slots=2) == ["v0"]  # a rewrite is the most recent too
    assert list(cache.items()) == [(3, "v3"), (2, "v2b")]
