"""A small ragged attention backward for compute-sanitizer (memcheck, racecheck,
synccheck): GQA, causal and full, both head dims, every gradient checked."""
import sys
from pathlib import Path

import torch

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
fab = load_module(ROOT / "examples/hopper/flash_attention_bwd.py", "flash_attention_bwd_example")

fails = fab.check([(1, 150, 2, 1, 64, "bf16", True), (1, 77, 2, 2, 128, "f16", False)])
torch.cuda.synchronize()
print("FAIL" if fails else "all PASS")
sys.exit(1 if fails else 0)
