"""CPU test of ``tools/attn_bwd_trace.py``'s ``summarize`` on a made-up trace: two SMs, two
heads of two CTAs, one head started a whole CTA apart (its early CTA waited), a converter,
and a clock that wraps past 2**32 ns in the middle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[3]
tool = load_module(ROOT / "tools" / "attn_bwd_trace.py", "attn_bwd_trace_tool")


def test_summarize():
    base = 2**32 - 50_000                   # the clock wraps 50 µs in
    us = 1000
    rows = [  # start, end (µs from base), SM, wait (µs)
        (0, 100, 0, 0), (0, 100, 1, 0),     # head 0: started together
        (100, 300, 0, 90), (200, 300, 1, 0),  # head 1: 100 µs apart, the early one waited
        (300, 320, 1, 5),                   # a converter
    ]
    trace = np.array([[(base + a * us) % 2**32, (base + b * us) % 2**32, sm, w * us]
                      for a, b, sm, w in rows], dtype=np.int64).astype(np.uint32).view(np.int32)
    s = tool.summarize(trace, n_main=4, per_head=2)
    assert s["span"] == pytest.approx(320) and s["main_end"] == pytest.approx(300)
    assert s["dur_med"] == pytest.approx(100) and s["dur_max"] == pytest.approx(200)
    assert s["wait_sum"] == pytest.approx(90) and s["wait_share"] == pytest.approx(90 / 500)
    assert (s["far_heads"], s["far_head_wait"], s["near_head_wait"]) == (1, 90, 0)
    assert s["tail_idle"] == pytest.approx(20) and s["sms"] == 2   # SM 0 idle 300..320
    assert s["conv_after_main"] == pytest.approx(20) and s["conv_wait"] == pytest.approx(5)
    assert "converters from 300 to 320" in tool.report("x", s)
