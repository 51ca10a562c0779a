"""``pyptx.ptx`` loads its helpers' submodules at first use (issue 46: a warm-cache launch
traces nothing, so it loads none of them), and every exported name still resolves."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_import_pyptx_loads_no_helper_module():
    loaded = _run("""
        import sys
        import pyptx
        print(sorted(m for m in sys.modules if m.startswith("pyptx.ptx")))
    """)
    assert loaded == "[]"


def test_import_pyptx_loads_no_tracing_module_until_used():
    assert _run("""
        import sys
        import pyptx
        print(sorted(m for m in ("pyptx.reg", "pyptx.smem", "pyptx.ptx", "pyptx.imm")
                     if m in sys.modules))
        from pyptx import reg, smem
        print(pyptx.ptx.inst is not None, reg.__name__, smem.__name__, pyptx.reg is reg)
    """).splitlines() == ["[]", "True pyptx.reg pyptx.smem True"]


def test_every_exported_name_resolves():
    from pyptx import ptx

    for name in ptx.__all__:
        assert getattr(ptx, name) is not None, name
    assert set(ptx.__all__) <= set(dir(ptx))
    from pyptx.ptx import _isa, tcgen05  # submodules by their own names
    assert tcgen05.__name__ == "pyptx.ptx.tcgen05" and _isa.__name__ == "pyptx.ptx._isa"


def test_a_submodule_import_does_not_shadow_the_function_of_its_name():
    assert _run("""
        import pyptx.ptx.control, pyptx.ptx.special, pyptx.ptx.inst  # inst: by control too
        from pyptx import ptx
        import types
        print(isinstance(ptx.inst, types.ModuleType), isinstance(ptx.special, types.ModuleType))
    """) == "False False"
