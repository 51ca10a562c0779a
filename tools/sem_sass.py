"""SASS of the consumers' remote stage releases in a 2-CTA cluster: assembles the GEMM (128x256,
cluster 2) with each ``remote_sem`` and prints the count of MEMBAR instructions and the lines
before the first remote arrives (needs ptxas and cuobjdump). Session 18 (H100 host's CUDA):
``release.cta`` gives ``SYNCS.ARRIVE.TRANS64.RED`` right after the wgmma wait, no MEMBAR;
``relaxed.cluster`` needs PTX ISA 8.6, which the examples do not emit.

    python tools/sem_sass.py
"""
import re
import subprocess
import tempfile
from pathlib import Path

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gemm = load_module(ROOT / "examples/hopper/gemm.py", "gemm_sem")
for sem in ("release.cta", "release.cluster"):
    k = gemm.build_gemm(4096, 4096, 4096, remote_sem=sem)
    with tempfile.TemporaryDirectory() as d:
        src, cub = Path(d, "k.ptx"), Path(d, "k.cubin")
        src.write_text(k.ptx())
        subprocess.run(["ptxas", "--gpu-name", "sm_90a", str(src), "-o", str(cub)], check=True)
        sass = subprocess.run(["cuobjdump", "--dump-sass", str(cub)], capture_output=True,
                              text=True).stdout.splitlines()
    body = [ln.split("*/", 1)[-1].strip() for ln in sass if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    membars = sum("MEMBAR" in ln for ln in body)
    print(f"gemm 128x256 c2 {sem}: {len(body)} instructions, {membars} MEMBAR")
    for i in [i for i, ln in enumerate(body) if "SYNCS.ARRIVE" in ln and "RED" in ln][:2]:
        print("   " + " | ".join(body[max(0, i - 3):i + 1]))
