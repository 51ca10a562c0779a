"""Shared fixtures of the torch tests: ``poison_outputs`` NaN-fills every output buffer of
a pyptx eager launch for the test's duration (``pyptx_torch.eager.set_poison``), so an
element a kernel never writes fails its comparison. Use it module-wide with
``pytestmark = [..., pytest.mark.usefixtures("poison_outputs")]``."""

from __future__ import annotations

import pytest


@pytest.fixture
def poison_outputs():
    """Poisoned (NaN) outputs for this test; the previous setting is restored after it."""
    import pyptx_torch.eager as eager

    saved = eager.POISON
    eager.set_poison(True)
    yield
    eager.set_poison(saved)
