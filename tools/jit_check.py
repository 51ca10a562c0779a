"""The two compile paths of ``pyptx.jit`` on the tensor-core kernels: the driver's
whole-program compile (PTX given to ``cuModuleLoadDataEx``) and ptxas, each kernel's
registers and local memory per thread as the driver reports them for the loaded function
(local memory > 0: spills). ``python tools/jit_check.py`` on a GPU machine. (The driver's
linker, ``cuLink*``, used before session 11, compiled PTX as relocatable code and spilled
the head-dim-128 attention kernels: ``ptxas -c`` shows the same.)"""
import sys
from pathlib import Path

from pyptx import driver, jit, ptxas
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


def resources(fn) -> str:
    mod = driver.cuda()
    a = mod.CUfunction_attribute
    regs = driver.call("cuFuncGetAttribute", a.CU_FUNC_ATTRIBUTE_NUM_REGS, fn)
    local = driver.call("cuFuncGetAttribute", a.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn)
    return f"R{regs} local {local}"


driver.ensure_context(0)
exe = ptxas.find_ptxas()
print(f"driver {driver.driver_version()}, ptxas {exe and ptxas.ptxas_version(exe)}, "
      f"pyptx compiles with {jit.compiler() or 'the driver'}")
print("| kernel | driver (whole program) | ptxas |")
print("|---|---|---|")
bad = 0
for spec in specs():
    ptx, name = spec.ptx(), spec.name
    fn_d, _ = jit.load_image(ptx, name)
    fn_p, _ = jit.load_image(ptxas.assemble(ptx, "sm_90a").cubin, name)
    rd, rp = resources(fn_d), resources(fn_p)
    bad += not (rd.endswith(" 0") and rp.endswith(" 0"))
    print(f"| {name} | {rd} | {rp} |", flush=True)
print("every kernel without local memory" if not bad else f"{bad} kernels use local memory")
sys.exit(1 if bad else 0)
