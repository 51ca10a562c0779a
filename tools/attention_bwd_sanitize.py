"""A small ragged attention backward for compute-sanitizer (memcheck, racecheck,
synccheck): GQA, causal and full, both head dims, every gradient checked. Each case
runs more blocks than the rings have stages (4), so stages are refilled: the write-after-read
hazard racecheck found on a refilled dK/dV stage needs that. ``--options k=v,...`` runs
the opt-in options (e.g. ``dkdv_bq=32``; see the example's ``parse_options``)."""
import sys
from pathlib import Path

import torch

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
fab = load_module(ROOT / "examples/hopper/flash_attention_bwd.py", "flash_attention_bwd_example")

opts = fab.parse_options(sys.argv[sys.argv.index("--options") + 1]) if "--options" in sys.argv else {}
# dK/dV: 2 heads x 5 q blocks = 10 fills of 4 stages; dQ: up to 9 kv blocks
fails = fab.check([(1, 300, 2, 1, 64, "bf16", True), (1, 550, 2, 2, 128, "f16", False)],
                  **opts)
torch.cuda.synchronize()
print("FAIL" if fails else "all PASS")
sys.exit(1 if fails else 0)
