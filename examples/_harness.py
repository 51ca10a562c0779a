"""Kept for examples outside this folder's own ones: the harness is ``pyptx.testing`` now.

Examples import ``from pyptx.testing import parse_args, run_example``.
"""

from pyptx.testing import _cuda_torch, load_module, parse_args, report, run_example

__all__ = ["parse_args", "run_example", "report", "load_module", "_cuda_torch"]
