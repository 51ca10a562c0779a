"""PTX printed by pyptx itself for the repository's examples: the parser corpus's pyptx files
(``packages/pyptx-core/tests/corpus/regen.py`` runs it).

    python examples/tests/corpus_ptx.py OUT_DIR

Includes one ``lineinfo=True`` print (``.file``/``.loc`` pointing at the example).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("examples/vector_add.py", "build_vector_add", {"N": 1 << 20}, False),
    ("examples/vector_add.py", "build_vector_add", {"N": 1000, "block": 128}, True),
    ("examples/block_reduce.py", "build_block_sum", {"B": 1024, "N": 8192}, False),
    ("examples/transpose.py", "build_transpose", {"M": 4096, "N": 4096}, False),
    ("examples/transpose.py", "build_transpose", {"M": 1000, "N": 300}, False),
    ("examples/hopper/rms_norm.py", "build_rms_norm", {"B": 2048, "N": 8192}, False),
    ("examples/hopper/rms_norm.py", "build_rms_norm", {"B": 16, "N": 512}, False),
]


def _load(rel: str):
    return load_module(ROOT / rel, Path(rel).stem + "_corpus")


def main(out_dir: str) -> None:
    out = Path(out_dir)
    for rel, builder, params, lineinfo in CASES:
        k = getattr(_load(rel), builder)(**params)
        text = k.ptx(lineinfo=lineinfo)
        if lineinfo:  # keep the committed file machine-independent
            text = text.replace(str(ROOT) + "/", "")
        tag = "_".join(f"{k}{v}" for k, v in params.items()) + ("_lineinfo" if lineinfo else "")
        name = f"pyptx_{Path(rel).stem}_{tag}.ptx"
        (out / name).write_text(text)
        print("wrote", name)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
