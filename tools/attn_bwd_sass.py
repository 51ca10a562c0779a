"""Dump the SASS of an attention-backward dK/dV kernel and print the lines at given offsets
(to read a compute-sanitizer report): ``python tools/attn_bwd_sass.py OUTDIR 0x940 0xf80
[--options dkdv_bq=32] [--case d64|d128]`` (the sanitizer script's two cases)."""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
fab = load_module(ROOT / "examples/hopper/flash_attention_bwd.py", "fab_sass")
args = sys.argv[1:]
opts = fab.parse_options(args[args.index("--options") + 1]) if "--options" in args else {}
case = args[args.index("--case") + 1] if "--case" in args else "d64"
out = Path(args[0])
offsets = [int(a, 16) for a in args[1:] if a.startswith("0x")]
if case == "d64":
    bwd = fab.build_attention_backward(1, 300, 2, 1, 64, dtype="bf16", causal=True, **opts)
else:
    bwd = fab.build_attention_backward(1, 550, 2, 2, 128, dtype="f16", causal=False, **opts)
k = bwd.dkdv_kernel
with tempfile.TemporaryDirectory() as d:
    src, cub = Path(d, "k.ptx"), Path(d, "k.cubin")
    src.write_text(k.ptx())
    subprocess.run(["ptxas", "--gpu-name", "sm_90a", str(src), "-o", str(cub)], check=True)
    sass = subprocess.run(["cuobjdump", "--dump-sass", str(cub)], capture_output=True,
                          text=True, check=True).stdout
(out / f"{k.name}.sass").write_text(sass)
(out / f"{k.name}.ptx").write_text(k.ptx())
lines = sass.splitlines()
at = {}
for i, ln in enumerate(lines):
    m = re.search(r"/\*([0-9a-f]{4,})\*/", ln)
    if m:
        at[int(m.group(1), 16)] = i
print(k.name)
for off in offsets:
    i = at.get(off)
    if i is None:
        print(f"{off:#x}: not found")
        continue
    print(f"--- {off:#x}")
    for ln in lines[max(0, i - 8):i + 3]:
        print(("=> " if ln is lines[i] else "   ") + " ".join(ln.split())[:160])
