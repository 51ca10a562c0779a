"""Assemble every tuned GEMM configuration with ptxas (8192^3; M = 128 too for the 128x64
tile the tuner picks there), dump their SASS with cuobjdump and count HGMMA / spills; writes
OUT/gemm-sass.txt."""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gemm = load_module(ROOT / "examples/hopper/gemm.py", "gemm_example")
out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
lines = []
cases = [((8192, 8192, 8192), c.kwargs) for c in gemm.GEMM_CONFIGS]
cases += [((128, 8192, 8192), c.kwargs) for c in gemm.GEMM_CONFIGS
          if 64 in (c.kwargs.get("BM"), c.kwargs.get("BN"))]  # the skinny picks
for (M, N, K), cfg in cases:
    k = gemm.build_gemm(M, N, K, **cfg)
    with tempfile.TemporaryDirectory() as d:
        src, cub = Path(d, "k.ptx"), Path(d, "k.cubin")
        src.write_text(k.ptx())
        r = subprocess.run(["ptxas", "-v", "--gpu-name", "sm_90a", str(src), "-o", str(cub)],
                           capture_output=True, text=True)
        sass = subprocess.run(["cuobjdump", "--dump-sass", str(cub)], capture_output=True,
                              text=True).stdout
    hg = len(re.findall(r"HGMMA", sass))
    lines.append(f"{k.name}: {hg} HGMMA in SASS; ptxas: {' '.join(r.stderr.split())[-200:]}")
    (out / f"{k.name}.sass").write_text(sass)
print("\n".join(lines))
(out / "gemm-sass.txt").write_text("\n".join(lines) + "\n")
