"""Issue 7's GPU check: three compiler-made kernels from the corpus, transpiled to pyptx
(default and --sugar), re-emitted, and run beside the original PTX on the same random
inputs; the outputs must be bitwise equal.

    python tools/transpile_gpu_check.py        (needs a GPU, torch and the shim)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pyptx import jit
from pyptx.launch import add_scalar_param_to_shim, register_launch_config, shim
from pyptx.registry import get_cubin_registry
from pyptx.transpile import transpile

CORPUS = Path(__file__).resolve().parents[1] / "packages/pyptx-core/tests/corpus"


def load(ptx: str, entry: str, grid, block, n_ptrs: int, scalars) -> int:
    fn, module = jit.compile_ptx_to_cubin(ptx, "sm_90a", entry)
    h = get_cubin_registry().register(ptx, entry, cu_function=fn, module=module)
    register_launch_config(h, fn, grid, block, (1, 1, 1), 0, num_pointers=n_ptrs)
    for value, t in scalars:
        add_scalar_param_to_shim(h, value, t)
    return h


def launch(handle: int, tensors) -> None:
    shim().launch(handle, torch.cuda.current_stream().cuda_stream, *[t.data_ptr() for t in tensors])


def build_from_python(source: str) -> str:
    ns: dict = {"__name__": "transpiled"}
    exec(compile(source, "<transpiled>", "exec"), ns)
    return ns["build"]().ptx()


CASES = [
    # file, entry, make(tensors), outputs index list, grid, block, scalars
    ("nvcc_vector_add_sm_90a.ptx", "vector_add",
     lambda: [torch.randn(100_003, device="cuda"), torch.randn(100_003, device="cuda"),
              torch.full((100_003,), float("nan"), device="cuda")],
     [2], ((100_003 + 255) // 256, 1, 1), (256, 1, 1), [(100_003, "s32")]),
    ("nvcc_gemm_naive_sm_90a.ptx", "gemm_naive",
     lambda: [torch.randn(70, 50, device="cuda"), torch.randn(50, 90, device="cuda"),
              torch.full((70, 90), float("nan"), device="cuda")],
     [2], ((90 + 15) // 16, (70 + 15) // 16, 1), (16, 16, 1),
     [(70, "s32"), (90, "s32"), (50, "s32")]),
    ("nvcc_transpose_sm_90a.ptx", "_Z15transpose_tiledPfPKfii",
     lambda: [torch.full((77, 100), float("nan"), device="cuda"), torch.randn(100, 77, device="cuda")],
     [0], ((77 + 31) // 32, (100 + 31) // 32, 1), (32, 8, 1), [(77, "s32"), (100, "s32")]),
]


def main() -> int:
    failures = 0
    for fname, entry, make, outs, grid, block, scalars in CASES:
        path = CORPUS / fname
        if not path.exists():
            print(f"SKIP {fname}: not in the corpus")
            continue
        original = path.read_text()
        if entry not in original:
            print(f"SKIP {fname}: entry {entry} not found")
            continue
        variants = {"original": original,
                    "transpiled": build_from_python(transpile(original)),
                    "transpiled --sugar": build_from_python(transpile(original, sugar=True))}
        torch.manual_seed(0)
        base = make()
        results = {}
        for name, ptx in variants.items():
            tensors = [t.clone() for t in base]
            n_ptrs = len(tensors)
            h = load(ptx, entry, grid, block, n_ptrs, scalars)
            launch(h, tensors)
            torch.cuda.synchronize()
            results[name] = [tensors[i] for i in outs]
        ref = results["original"]
        ok = all(not torch.isnan(r).any() for r in ref)
        for name, res in results.items():
            same = all(torch.equal(a, b) for a, b in zip(ref, res))
            ok &= same
            print(f"{fname:40s} {entry:32s} {name:20s} {'bitwise equal' if same else 'DIFFERS'}")
        failures += not ok
    print("PASS" if failures == 0 else f"FAIL ({failures} kernels)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
