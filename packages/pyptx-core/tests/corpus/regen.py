#!/usr/bin/env python3
"""Regenerate the PTX corpus of the parser tests from the sources written here.

    python regen.py [--only nvcc|triton|pyptx|hand] [-j 2]

* ``nvcc``: every ``sources/cuda/*.cu`` for ``sm_80`` and ``sm_90a`` (Hopper-only
  sources for ``sm_90a`` alone), plus ``-lineinfo``, ``-G``, ``-rdc=true`` and
  ``--use_fast_math`` variants of some (see ``VARIANTS``). Needs ``nvcc`` on PATH.
* ``triton``: ``sources/triton/kernels.py`` compiled ahead of time for an sm_90
  target (``triton.compile`` with a ``GPUTarget``; no GPU is needed). Needs a
  Python with ``triton`` installed: ``--triton-python /path/to/python``.
* ``pyptx``: PTX printed by the pyptx DSL for the repository's examples (run with a
  Python where ``pyptx`` is installed).
* ``hand``: ``sources/hand/*.ptx`` are hand-written and copied as they are.

Output: ``<tool>_<source>_<arch>[_<variant>].ptx`` in this directory. nvcc runs
with relative paths from ``sources/cuda`` so ``.file`` lines are machine-independent.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CUDA = HERE / "sources" / "cuda"
TRITON = HERE / "sources" / "triton"
HAND = HERE / "sources" / "hand"
ROOT = HERE.parents[3]

# Sources that only build for Hopper (wgmma, TMA, clusters, fp8 conversions).
HOPPER_ONLY = {"wgmma_inline", "tma", "cluster_cg", "fp8_convert"}
ARCHS = ("sm_80", "sm_90a")
# (source stem, arch, variant name, extra nvcc flags)
VARIANTS = [
    ("vector_add", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("reduce", "sm_80", "lineinfo", ["-lineinfo"]),
    ("softmax", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("gemm_tiled", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("mma_inline", "sm_80", "lineinfo", ["-lineinfo"]),
    ("tma", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("wgmma_inline", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("cub_blocks", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("vector_add", "sm_80", "debug", ["-G"]),
    ("reduce", "sm_90a", "debug", ["-G"]),
    ("device_funcs", "sm_80", "debug", ["-G"]),
    ("device_funcs", "sm_90a", "rdc", ["-rdc=true"]),
    ("rdc_extern", "sm_80", "rdc", ["-rdc=true"]),
    ("rdc_extern", "sm_90a", "rdc", ["-rdc=true"]),
    ("printf_globals", "sm_90a", "rdc", ["-rdc=true"]),
    ("math_funcs", "sm_90a", "fastmath", ["--use_fast_math"]),
    ("softmax", "sm_80", "fastmath", ["--use_fast_math"]),
    ("gemm_tiled", "sm_80", "O1", ["-Xcicc", "-O1"]),
    ("layernorm", "sm_90a", "maxreg", ["-maxrregcount=64"]),
    ("atomics", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("printf_globals", "sm_80", "lineinfo", ["-lineinfo"]),
    ("math_funcs", "sm_80", "lineinfo", ["-lineinfo"]),
    ("flash_attn_small", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("cluster_cg", "sm_90a", "lineinfo", ["-lineinfo"]),
    ("texture_surface", "sm_80", "lineinfo", ["-lineinfo"]),
    ("half_math", "sm_90a", "debug", ["-G"]),
    ("bitonic_scan", "sm_90a", "O1", ["-Xcicc", "-O1"]),
    ("fp8_convert", "sm_89", "ada", []),
    ("vector_add", "sm_100a", "blackwell", []),
    ("reduce", "sm_120", "blackwell", []),
    ("gemm_naive", "sm_100a", "blackwell", []),
]


def nvcc_jobs() -> list[tuple[str, list[str]]]:
    jobs = []
    for src in sorted(CUDA.glob("*.cu")):
        stem = src.stem
        for arch in ARCHS:
            if stem in HOPPER_ONLY and arch != "sm_90a":
                continue
            jobs.append((f"nvcc_{stem}_{arch}.ptx", [src.name, f"-arch={arch}"]))
    for stem, arch, variant, flags in VARIANTS:
        jobs.append((f"nvcc_{stem}_{arch}_{variant}.ptx", [f"{stem}.cu", f"-arch={arch}", *flags]))
    return jobs


def run_nvcc(out: str, args: list[str]) -> str:
    cmd = ["nvcc", "-ptx", "-std=c++17", *args, "-o", str(HERE / out)]
    p = subprocess.run(cmd, cwd=CUDA, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return out


def regen_nvcc(workers: int) -> None:
    if shutil.which("nvcc") is None:
        sys.exit("nvcc not found on PATH")
    failed = []
    with cf.ThreadPoolExecutor(workers) as ex:
        futs = [ex.submit(run_nvcc, *j) for j in nvcc_jobs()]
        for f in futs:
            try:
                print("wrote", f.result(), flush=True)
            except RuntimeError as e:
                failed.append(str(e))
    if failed:
        sys.exit("\n".join(failed))


def regen_triton(python: str) -> None:
    subprocess.run([python, str(TRITON / "kernels.py"), str(HERE)], check=True)


def regen_pyptx() -> None:
    # the examples print their own PTX (examples/tests/corpus_ptx.py); the softmax file is kept
    # from before that example moved into pyptx_kernels
    subprocess.run([sys.executable, str(HERE.parents[3] / "examples" / "tests" / "corpus_ptx.py"),
                    str(HERE)], check=True)


def regen_hand() -> None:
    for src in sorted(HAND.glob("*.ptx")):
        shutil.copyfile(src, HERE / f"hand_{src.name}")
        print("wrote", f"hand_{src.name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["nvcc", "triton", "pyptx", "hand"])
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--triton-python", default=sys.executable)
    a = ap.parse_args()
    if a.only in (None, "nvcc"):
        regen_nvcc(a.j)
    if a.only in (None, "triton"):
        regen_triton(a.triton_python)
    if a.only in (None, "pyptx"):
        regen_pyptx()
    if a.only in (None, "hand"):
        regen_hand()


if __name__ == "__main__":
    main()
