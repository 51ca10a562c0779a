"""Assemble the default GEMM configurations with ptxas, dump their SASS with cuobjdump and
count HGMMA / spills; writes OUT/gemm-sass.txt."""
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
for (M, N, K) in [(8192, 8192, 8192), (128, 8192, 8192)]:
    cfg = gemm.GEMM_CONFIGS[0 if M > 128 else -1].kwargs
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
