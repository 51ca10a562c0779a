"""On-disk cache of compiled kernels, so a new process does not JIT the same PTX again.

Entries are keyed by the PTX text's hash, the arch and the driver version,
and written atomically (temp file + rename) so concurrent processes never
read a torn file. ``PYPTX_CACHE_DIR`` moves it; ``PYPTX_CACHE_DIR=off``
turns it off.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

__all__ = ["cache_dir", "cache_key", "load", "store"]


def cache_dir() -> Path | None:
    """The cache folder (``$PYPTX_CACHE_DIR`` or ``~/.cache/pyptx``), or None when disabled."""
    env = os.environ.get("PYPTX_CACHE_DIR")
    if env is not None and env.strip().lower() in ("", "0", "off", "none"):
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pyptx"


def cache_key(ptx: str, arch: str, driver_version: int | str) -> str:
    """A hex key for one compiled artifact."""
    h = hashlib.sha256()
    h.update(ptx.encode())
    h.update(f"\0{arch}\0{driver_version}".encode())
    return h.hexdigest()


def load(key: str, suffix: str = ".cubin") -> bytes | None:
    """The cached bytes for ``key`` (files of another kind: another ``suffix``), or None."""
    d = cache_dir()
    if d is None:
        return None
    try:
        return (d / f"{key}{suffix}").read_bytes()
    except OSError:
        return None


def store(key: str, data: bytes, suffix: str = ".cubin") -> bool:
    """Write ``data`` under ``key`` (and ``suffix``) atomically; False (never an exception) if
    the disk refuses."""
    d = cache_dir()
    if d is None:
        return False
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, d / f"{key}{suffix}")
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return True
    except OSError:
        return False
