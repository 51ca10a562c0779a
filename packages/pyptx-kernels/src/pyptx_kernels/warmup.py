"""``precompile``: ahead-of-time warm-up for servers that must not compile while serving.

Every kernel family a list of calls (or a model's forward, and backward) needs is traced,
assembled by ptxas, loaded and written to the disk cache (``PYPTX_CACHE_DIR``), each plan
chosen as a default call chooses it (a saved winner, else the shipped table's or the
heuristic's: nothing is timed), by running the calls once on zero-filled inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyptx.errors import ConfigError
from pyptx_kernels._common import fail


def precompile(work: Any, *example_inputs: Any, backward: bool = False,
               device: Any = "cuda") -> None:
    """Compile and load every kernel that ``work`` launches, without timing anything.

    ``work`` is either a torch ``nn.Module`` run once on ``example_inputs`` (tensors, or
    ``(shape, dtype)`` pairs allocated zero-filled on ``device``), or an iterable of calls
    ``(fn, *args)`` (``fn`` a ``pyptx_kernels`` function; a trailing dict holds keyword
    arguments; each arg a tensor, a ``(shape, dtype)`` pair, or a ``device="meta"`` tensor,
    which is allocated zero-filled with its strides on ``device``, or anything else passed
    as it is). Each kernel gets the plan a default call takes (a saved winner, else the
    shipped table's or the heuristic's; under ``PYPTX_AUTOTUNE=0`` the first), never timed,
    even under ``PYPTX_AUTOTUNE=1``; only those plans are built. ``backward=True`` also runs
    the backward of every floating output (inputs that are floating point get
    ``requires_grad``; a module's parameter gradients are left as they were). Returns when
    the device is idle and the plans the calls queued for their problems' other sizes are
    compiled (``docs/tuning.md``).

    A size whose bucket takes another plan is another family: the GEMM's and the row
    kernels' are compiled ahead by the background thread; for other ops precompile the
    shapes the server will see, or their buckets' representatives."""
    import torch

    from pyptx.autotune import PLAN, TUNE, mode, tuning

    with tuning(PLAN if mode() is TUNE else mode()):   # the plans the server's calls take
        if isinstance(work, torch.nn.Module):
            params = list(work.parameters())
            grads = [p.grad for p in params]
            _run(work, [_tensor(a, device) for a in example_inputs], {}, backward)
            for p, g in zip(params, grads):
                p.grad = g
        else:
            if example_inputs:
                raise fail(ConfigError, "precompile", "example inputs go with a module; a list "
                           "of calls holds its own arguments: [(fn, *args), ...]")
            if isinstance(work, (str, bytes)) or not isinstance(work, Iterable):
                raise fail(ConfigError, "precompile", f"work must be an nn.Module or a list of "
                           f"(fn, *args) calls, got {type(work).__name__}")
            for item in work:
                if not isinstance(item, (tuple, list)) or not item or not callable(item[0]):
                    raise fail(ConfigError, "precompile",
                               f"each call must be a tuple (fn, *args), got {item!r}")
                fn, *args = item
                kwargs = args.pop() if args and isinstance(args[-1], Mapping) else {}
                _run(fn, [_tensor(a, device) for a in args], dict(kwargs), backward)
    from pyptx_kernels import _family

    _family.wait_idle(300)   # a hung ptxas must not hang the server
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _tensor(a: Any, device: Any) -> Any:
    """``a`` as a launchable argument: a ``(shape, dtype)`` pair or a meta tensor becomes a
    zero-filled tensor on ``device`` (a meta tensor keeps its strides)."""
    import torch

    if isinstance(a, torch.Tensor):
        if a.device.type != "meta":
            return a
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=device).zero_()
    if (isinstance(a, tuple) and len(a) == 2 and isinstance(a[1], torch.dtype)
            and isinstance(a[0], (tuple, list, torch.Size))):
        return torch.zeros(tuple(a[0]), dtype=a[1], device=device)
    return a


def _run(fn: Callable[..., Any], args: list, kwargs: dict, backward: bool) -> None:
    """One call of ``fn``; with ``backward``, on inputs that require grad, then the backward
    of the sum of its floating outputs."""
    import torch

    if backward:
        args = [a.detach().requires_grad_() if isinstance(a, torch.Tensor)
                and a.is_floating_point() and a.dtype.itemsize > 1 else a for a in args]
    with torch.set_grad_enabled(backward):
        out = fn(*args, **kwargs)
        if backward:
            loss = [t.float().sum() for t in _tensors(out) if t.requires_grad]
            if loss:
                torch.stack(loss).sum().backward()


def _tensors(out: Any) -> list:
    """The tensors in ``out``: a tensor, a tuple/list/dict of them, or a model output object
    (a ``transformers`` ``ModelOutput`` is a dict)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []
