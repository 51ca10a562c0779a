"""Driver JIT against ptxas on the tensor-core kernels: registers, stack and local-memory
instructions of each cubin (``cuobjdump``), so a kernel that the driver's compiler spills
while ptxas does not shows up. ``python tools/jit_check.py [--inject NAME...]``: with
``--inject``, the ptxas cubins of the named kernels (substring match) are written into the
pyptx disk cache under the driver JIT's key, so a later process runs them instead."""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pyptx import cache, driver, jit, ptxas
from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
H = ROOT / "examples/hopper"
fa = load_module(H / "flash_attention.py", "fa_jit")
fab = load_module(H / "flash_attention_bwd.py", "fab_jit")
gm = load_module(H / "gemm.py", "gemm_jit")
f8 = load_module(H / "fp8_gemm.py", "fp8_jit")
gg = load_module(H / "grouped_gemm.py", "grouped_jit")


def specs():
    for D in (64, 128):
        for causal in (False, True):
            yield fa.build_attention(32768 // 4096, 4096, 2048 // D, 2048 // D, D, causal=causal)
        yield fa.build_attention(8, 4096, 2048 // D, 2048 // D, D, BN=64)
        yield from fab.build_attention_backward(8, 4096, 2048 // D, 2048 // D, D).kernels
    for c in (1, 2):
        yield gm.build_gemm(8192, 8192, 8192, BN=256, cluster=c)
    yield gm.build_gemm(8192, 8192, 8192, BN=128, cluster=1)
    yield f8.build_fp8_gemm(8192, 8192, 8192, BN=128, cluster=1)
    yield f8.build_fp8_gemm(8192, 8192, 8192, scale="block", BN=128, cluster=2)
    yield gg.build_grouped(16384, 4096, 4096, 8)


def sass_stats(cubin: bytes) -> tuple[int, int, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run(["cuobjdump", "-res-usage", f.name], capture_output=True,
                             text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
    return sass.count("STL"), sass.count("LDL"), (f"R{m[1]} stack {m[2]} local {m[3]}" if m else res[:80])


inject = sys.argv[sys.argv.index("--inject") + 1:] if "--inject" in sys.argv else []
mod = driver.cuda()
driver.ensure_context(0)
print(f"driver {driver.driver_version()}, ptxas {ptxas.ptxas_version(ptxas.find_ptxas())}")
print(f"| kernel | JIT STL/LDL | JIT resources | ptxas STL/LDL | ptxas resources |")
print("|---|---|---|---|---|")
for spec in specs():
    ptx = spec.ptx()
    name = spec.name
    jc = jit._jit(mod, ptx, name)
    pc = ptxas.assemble(ptx, "sm_90a").cubin
    js, jl, jr = sass_stats(jc)
    ps, pl, pr = sass_stats(pc)
    print(f"| {name} | {js}/{jl} | {jr} | {ps}/{pl} | {pr} |", flush=True)
    if any(s in name for s in inject):
        key = cache.cache_key(ptx, "sm_90a", driver.driver_version())
        cache.store(key, pc)
        print(f"  injected the ptxas cubin of {name}")
