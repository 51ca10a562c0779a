"""One trace per kernel family: a kernel of a new size reuses the code of the first kernel
traced for its family (``pyptx.Kernel.reuse``) instead of tracing its body again.

A family's trace is kept on disk too (``pyptx.cache``, files ``*.family.json``), keyed by the
family and a fingerprint of the installed pyptx and pyptx_kernels sources, so a new process
with a warm cache traces nothing either.

A family is everything a kernel's PTX depends on: dtypes, head dim, mask, layout and tile
plan, and whatever sizes the schedule does not read from kernel parameters. Its sizes (M,
batch, sequence lengths, row counts) are scalar parameters, so each builder names the family
(``key``) and gives the values of those parameters for its size (``scalars``); the tensor
shapes, grid and tensor maps come from the new kernel itself. The CPU tests check, per
family, that a reused specialization equals a fresh trace at several sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict

from pyptx.errors import ConfigError

SLOTS = 512
"""Families kept (least recently used dropped first); each holds one traced module."""

_families: OrderedDict = OrderedDict()
_lock = threading.Lock()
_stats = {"traced": 0, "reused": 0, "loaded": 0}


def specialized(kernel, key, scalars):
    """``kernel`` with its specialization in place: reused from family ``key``'s traced code
    with the scalar parameters ``scalars`` (a mapping of name to value) if this process or
    the disk cache holds the family, else traced now and kept as the family's (in memory and
    on disk). ``key`` must be hashable and name every input the PTX depends on; ``None``
    traces without sharing."""
    if key is None:
        kernel.specialize()
        return kernel
    with _lock:
        like = _families.get(key)
        if like is not None:
            _families.move_to_end(key)
    disk = None
    if like is None:
        disk = _disk_key(key, kernel.name)
        like = _load(disk)
        if like is not None:
            _stats["loaded"] += 1
            _keep(key, like)
    if like is not None:
        try:
            kernel.reuse(like, scalars)
            _stats["reused"] += 1
            return kernel
        except ConfigError:
            if disk is None:
                raise      # a family key that does not name what the code depends on
    spec = kernel.specialize()   # a new family, or a file that does not fit: trace, keep
    _stats["traced"] += 1
    _keep(key, spec)
    _store(disk, spec)
    return kernel


def _keep(key, spec):
    with _lock:
        _families[key] = spec
        while len(_families) > SLOTS:
            _families.popitem(last=False)


_fingerprint: list = []


def fingerprint() -> str:
    """A hash of the installed pyptx and pyptx_kernels sources (each file's path, size and
    modification time) and their versions: a family file written by other code is not read."""
    if not _fingerprint:
        import pyptx

        parts = [str(getattr(pyptx, "__version__", ""))]
        for root in (os.path.dirname(pyptx.__file__), os.path.dirname(__file__)):
            _stat_sources(root, parts)
        _fingerprint.append(hashlib.sha256("\0".join(parts).encode()).hexdigest())
    return _fingerprint[0]


def _stat_sources(folder, parts):
    """Append ``path:size:mtime`` of every ``.py`` file under ``folder`` to ``parts``, in a
    fixed order (``__pycache__`` skipped)."""
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        if e.name.endswith(".py"):
            st = e.stat()
            parts.append(f"{e.path}:{st.st_size}:{st.st_mtime_ns}")
        elif e.name != "__pycache__" and e.is_dir():
            _stat_sources(e.path, parts)


def _disk_key(key, entry):
    """The file key of family ``key``, or None where its text is not the same in every
    process (an object printed with its address)."""
    text = repr((key, entry))
    if " at 0x" in text:
        return None
    return hashlib.sha256(f"{text}\0{fingerprint()}".encode()).hexdigest()


_SUFFIX = ".family.json"


def _load(disk):
    from pyptx import cache
    from pyptx.kernel import Specialization

    raw = cache.load(disk, _SUFFIX) if disk else None
    if raw is None:
        return None
    try:
        return Specialization.from_code(json.loads(raw))
    except (ValueError, KeyError, TypeError):
        return None


def _store(disk, spec):
    from pyptx import cache

    if disk:
        cache.store(disk, json.dumps(spec.code()).encode(), _SUFFIX)


def stats() -> dict:
    """How many family traces, reuses and families read from disk this process made
    (``traced``, ``reused``, ``loaded``)."""
    return dict(_stats)


def clear() -> None:
    """Forget every family this process holds (the next kernel of each reads the disk cache,
    or traces)."""
    with _lock:
        _families.clear()


def assemble(kernel):
    """Assemble ``kernel``'s cubin into the disk cache (``pyptx.jit.cubin_for``), so its first
    launch loads it instead of running ptxas."""
    from pyptx import jit

    spec = getattr(kernel, "kernel", kernel).specialize()
    text, locs = spec.emit()
    jit.cubin_for(text, spec.arch, spec.name, locs=locs)


_jobs: list = []
_jobs_ready = threading.Condition()
_worker: list = []
_released = threading.Event()
_released.set()

HOLD_S = 0.5
"""Seconds queued background work waits, at most, for the call that queued it to return
(``_common.call_op`` tells it): the first call does not share the interpreter with its own
warm-up."""


def in_background(job):
    """Run ``job()`` on the library's one background thread (a daemon: it never holds up the
    process's exit), after the jobs queued before it and once the op call that queues it has
    returned (``HOLD_S`` at most); what it raises is dropped (the same work is done again, in
    the foreground, by the call that needs it). Only where a CUDA driver is loaded: a machine
    without a GPU compiles nothing ahead."""
    from pyptx import driver

    if driver.cuda() is None:
        return
    from pyptx_kernels import _common

    _released.clear()
    _common.after_call(_released.set)
    with _jobs_ready:
        _jobs.append(job)
        if not _worker:
            t = threading.Thread(target=_work, name="pyptx-warm", daemon=True)
            _worker.append(t)
            t.start()
        _jobs_ready.notify()


def _work():
    while True:
        with _jobs_ready:
            while not _jobs:
                _jobs_ready.wait()
            job = _jobs[0]
        _released.wait(HOLD_S)
        try:
            job()
        except Exception:  # noqa: BLE001  (a warm-up that fails leaves the work to the call)
            pass
        with _jobs_ready:
            _jobs.pop(0)
            _jobs_ready.notify_all()


def wait_idle(timeout=None):
    """Wait until the background thread has finished every job queued so far (``timeout``
    seconds at most; None: no limit); whether it has. A server calls it after its warm-up."""
    _released.set()   # the caller waits: nothing in the foreground to leave room for
    with _jobs_ready:
        return _jobs_ready.wait_for(lambda: not _jobs, timeout)
