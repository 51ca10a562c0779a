"""``CubinRecord``: one immutable record per compiled kernel, and ``CubinRegistry``, their table.

A record holds everything a launch needs: the PTX, arch, cubin, launch
geometry, scalar parameters and tensor-map specs. Records made for a
specialization (``record_for``) are keyed by a content hash of all of that,
so two kernels with the same PTX and launch config share one record, and the
handle the shim knows it by is derived from the hash (the same in every
process). A record is registered with the shim once, when it is first loaded
on a device; every cache above it (torch plans, JAX handles) maps to it.
Such records are held weakly: when the last plan (and so the kernel) that
uses one is garbage-collected, the record is dropped from the shim too.
Records registered by hand with ``CubinRegistry.register`` live until
``clear()``.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import weakref
from dataclasses import field
from typing import Any

from ._dataclass import dataclass

__all__ = ["CubinRecord", "CubinRegistry", "get_cubin_registry", "record_for", "content_key",
           "handle_of_key", "persist", "find_record"]


@dataclass(frozen=True, eq=False)
class CubinRecord:
    """A compiled kernel and its launch config.

    ``cu_function`` is the CUfunction pointer as an int of the first device the
    record was loaded on (None where no driver is available); ``module`` keeps
    the loaded module alive, so the function pointer stays valid for as long as
    the record lives. Records of specializations also carry ``key`` (their
    content hash) and everything else the shim is told once: ``cluster``,
    ``num_pointers``, ``scalar_params`` (raw bytes, in order), ``tma_specs``
    (``(pointer index, pyptx.tma.TmaParams)``) and ``pdl``.
    """

    handle: int
    ptx_source: str
    kernel_name: str
    smem_bytes: int = 0
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    cu_function: int | None = None
    module: Any = None
    cubin_bytes: bytes | None = None
    key: str = ""
    arch: str = ""
    cluster: tuple[int, int, int] = (1, 1, 1)
    static_smem: int = 0
    num_pointers: int = 0
    scalar_params: tuple[bytes, ...] = ()
    tma_specs: tuple[tuple[int, Any], ...] = ()
    pdl: bool = False
    #: Shapes and PTX element type names of the inputs and outputs the kernel was built for.
    in_shapes: tuple[tuple[int, ...], ...] = ()
    in_types: tuple[str, ...] = ()
    out_shapes: tuple[tuple[int, ...], ...] = ()
    out_types: tuple[str, ...] = ()
    #: Names of the pointer parameters, inputs then outputs (for messages; they are in the PTX).
    arg_names: tuple[str, ...] = ()
    #: ordinal -> (CUfunction, its loaded image) of each device the record is loaded on.
    functions: dict[int, tuple[int, Any]] = field(default_factory=dict, repr=False)

    def function(self, ordinal: int) -> int:
        """The CUfunction of this kernel on device ``ordinal``, compiled and loaded on first
        use (in that device's primary context) and registered with the shim."""
        hit = self.functions.get(ordinal)
        if hit is not None:
            return hit[0]
        with _load_lock:
            hit = self.functions.get(ordinal)
            if hit is None:
                hit = self._load(ordinal)
        return hit[0]

    def _load(self, ordinal: int) -> tuple[int, Any]:
        from . import driver

        previous = driver.current_context()
        driver.ensure_context(ordinal)
        try:
            return self._load_here(ordinal)
        finally:
            if previous:  # leave the caller's (and its framework's) current device alone
                driver.set_current_context(previous)

    def _load_here(self, ordinal: int) -> tuple[int, Any]:
        from . import jit

        key = (self.ptx_source, self.arch, self.kernel_name, self.smem_bytes, ordinal)
        image = _images.get(key) if self.cubin_bytes is None else None
        if image is None:
            cubin = self.cubin_bytes if self.cubin_bytes is not None else jit.cubin_for(
                self.ptx_source, self.arch, self.kernel_name)
            image = _Image(cubin, *jit.load_image(self.ptx_source if cubin is None else cubin,
                                                  self.kernel_name, self.smem_bytes))
            if self.cubin_bytes is None:
                _images[key] = image
        cubin, fn, module = image.cubin, image.fn, image.module
        first = not self.functions
        if first:
            s = object.__setattr__  # the compiled artefacts of a frozen record, set once
            s(self, "cubin_bytes", cubin)
            s(self, "cu_function", fn)
            s(self, "module", module)
            self._register(fn)
            persist(self)
        from .launch import shim

        try:
            shim().set_device_function(self.handle, ordinal, fn)
        except (RuntimeError, ValueError) as e:
            from .errors import LaunchError

            raise LaunchError(f"shim set_device_function refused: {e}") from None
        hit = self.functions[ordinal] = (fn, image)
        return hit

    def _register(self, fn: int) -> None:
        from .launch import add_scalar_param_to_shim, add_tma_spec_to_shim, register_launch_config

        register_launch_config(self.handle, fn, self.grid, self.block, self.cluster,
                               self.smem_bytes, num_pointers=self.num_pointers, pdl=self.pdl)
        _in_shim.add(self.handle)
        for raw in self.scalar_params:
            add_scalar_param_to_shim(self.handle, raw)
        if self.tma_specs:
            from .launch import TMA_PLACEHOLDER_ADDRESS
            from .tma import encode

            for arg_index, params in self.tma_specs:
                add_tma_spec_to_shim(self.handle, arg_index,
                                     encode(params, TMA_PLACEHOLDER_ADDRESS))


class _Image:
    """A kernel image loaded on one device, shared by every record with the same PTX, arch,
    entry and shared memory (records that differ only in sizes, grid and scalar parameters:
    ``Kernel.reuse``), so such a record loads no module of its own; it lives while one of
    them does."""

    __slots__ = ("cubin", "fn", "module", "__weakref__")

    def __init__(self, cubin: bytes | None, fn: int, module: Any) -> None:
        self.cubin, self.fn, self.module = cubin, fn, module


#: (PTX, arch, entry, dynamic shared bytes, ordinal) -> its loaded ``_Image``, held weakly.
_images: weakref.WeakValueDictionary[tuple[Any, ...], _Image] = weakref.WeakValueDictionary()

_load_lock = threading.RLock()
#: Handles of records registered with the shim (their configs are dropped with the record).
_in_shim: set[int] = set()


def _release(handle: int) -> None:
    """Drop a garbage-collected record's launch config from the shim."""
    if handle in _in_shim:
        _in_shim.discard(handle)
        try:
            from pyptx_shim import native

            if native is not None:
                native.unregister(handle)
        except Exception:  # interpreter shutdown, or the shim never loaded
            pass


class CubinRegistry:
    """Thread-safe process-local table mapping handle -> ``CubinRecord``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[int, CubinRecord] = {}
        self._by_key: weakref.WeakValueDictionary[str, CubinRecord] = weakref.WeakValueDictionary()
        self._by_handle: weakref.WeakValueDictionary[int, CubinRecord] = (
            weakref.WeakValueDictionary())
        self._next = itertools.count(1)

    def register(
        self,
        ptx_source: str,
        kernel_name: str,
        cubin_bytes: bytes | None = None,
        smem_bytes: int = 0,
        grid: tuple[int, int, int] = (1, 1, 1),
        block: tuple[int, int, int] = (1, 1, 1),
        cu_function: int | None = None,
        module: Any = None,
    ) -> int:
        """Insert a compiled kernel record and return its process-local handle."""
        with self._lock:
            handle = next(self._next)
            self._records[handle] = CubinRecord(
                handle, ptx_source, kernel_name, smem_bytes, tuple(grid), tuple(block),
                cu_function, module, cubin_bytes,
            )
        return handle

    def get(self, handle: int) -> CubinRecord | None:
        """Look up a previously registered kernel handle."""
        rec = self._records.get(handle)
        return rec if rec is not None else self._by_handle.get(handle)

    def by_key(self, key: str) -> CubinRecord | None:
        """The live record whose content hash is ``key``, or None."""
        return self._by_key.get(key)

    def intern(self, record: CubinRecord) -> CubinRecord:
        """``record``, or the live record with the same key if there is one (held weakly)."""
        with self._lock:
            hit = self._by_key.get(record.key)
            if hit is not None:
                return hit
            self._by_key[record.key] = record
            self._by_handle[record.handle] = record
            weakref.finalize(record, _release, record.handle)
        return record

    def clear(self) -> None:
        """Drop all registered kernel records (records in use by kernels stay with them)."""
        with self._lock:
            self._records.clear()

    def __len__(self) -> int:
        return len(self._records) + len(self._by_key)


_registry = CubinRegistry()


def get_cubin_registry() -> CubinRegistry:
    """Return the process-local cubin registry singleton."""
    return _registry


def content_key(ptx: str, arch: str, launch: tuple[Any, ...]) -> str:
    """The content hash of a compiled kernel: its PTX, arch and launch config (a repr-stable
    tuple). The same in every process; the disk cache's cubin key hashes the same PTX and
    arch with the driver version."""
    h = hashlib.sha256()
    h.update(ptx.encode())
    h.update(f"\0{arch}\0{launch!r}".encode())
    return h.hexdigest()


def handle_of_key(key: str) -> int:
    """The shim handle of the record with content hash ``key`` (60 bits of the hash;
    hand-registered records count up from 1)."""
    return int(key[:15], 16) | (1 << 60)


def _launch_identity(rec: CubinRecord) -> tuple[Any, ...]:
    """Everything but the PTX and arch that a record's content hash covers."""
    return (rec.grid, rec.block, rec.cluster, rec.smem_bytes, rec.num_pointers,
            rec.scalar_params, rec.tma_specs, rec.pdl, rec.in_shapes, rec.in_types,
            rec.out_shapes, rec.out_types)


def record_for(spec: Any) -> CubinRecord:
    """The record of a ``Specialization`` (shared by every runtime and every kernel with the
    same content); not yet loaded on any device (see ``CubinRecord.function``)."""
    rec = spec.record
    if rec is not None:
        return rec
    from .launch import scalar_bytes

    kernel = spec.kernel
    rec = CubinRecord(
        0, spec.ptx(), spec.name, spec.smem, tuple(spec.grid), tuple(spec.block),
        arch=spec.arch, cluster=tuple(spec.cluster), static_smem=spec.static_smem,
        num_pointers=len(kernel.in_specs) + len(kernel.out_specs),
        scalar_params=tuple(scalar_bytes(value, t) for _, t, value in spec.scalar_params),
        tma_specs=tuple((i, p) for i, p in spec.tma_maps), pdl=spec.pdl,
        in_shapes=tuple(map(tuple, spec.in_shapes)),
        in_types=tuple(s.dtype.name for s in kernel.in_specs),
        out_shapes=tuple(map(tuple, spec.out_shapes)),
        out_types=tuple(s.dtype.name for s in kernel.out_specs), arg_names=kernel.arg_names,
    )
    rec = _keyed(rec)
    spec.record = rec  # the kernel's specialization keeps its record alive
    return rec


def _keyed(rec: CubinRecord) -> CubinRecord:
    """``rec`` with its key and handle set, or the live record with the same content."""
    key = content_key(rec.ptx_source, rec.arch, _launch_identity(rec))
    live = _registry.by_key(key)
    if live is not None:
        return live
    object.__setattr__(rec, "key", key)  # a new record: its identity, set once
    object.__setattr__(rec, "handle", handle_of_key(key))
    return _registry.intern(rec)


# ---------------------------------------------------------------- records on disk
# A record is written beside the cubins (``pyptx.cache``) when it is first loaded on a GPU, or
# when a graph that names it by hash is saved, so that another process finds it by its hash.
_RECORD_SUFFIX = ".record.json"


def _file_key(key_or_handle: str | int) -> str:
    if isinstance(key_or_handle, int):
        return f"{key_or_handle & ((1 << 60) - 1):015x}"
    return key_or_handle[:15]


def _tma_to_json(params: Any) -> dict[str, Any]:
    from dataclasses import fields

    out = {}
    for f in fields(params):
        if f.name != "axis_names":
            v = getattr(params, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else int(v)
    return out


def persist(rec: CubinRecord) -> bool:
    """Write ``rec`` (not its cubin) to the disk cache under its hash, unless a file is there
    already; False if the cache is off or the disk refuses. Only records of specializations
    (with a key) are written."""
    import json

    from . import cache

    if not rec.key:
        return False
    folder = cache.cache_dir()
    if folder is not None and (folder / f"{_file_key(rec.key)}{_RECORD_SUFFIX}").is_file():
        return True   # written by an earlier load (here or in another process): same content
    doc = {
        "key": rec.key, "name": rec.kernel_name, "arch": rec.arch, "ptx": rec.ptx_source,
        "grid": rec.grid, "block": rec.block, "cluster": rec.cluster, "smem": rec.smem_bytes,
        "static_smem": rec.static_smem, "num_pointers": rec.num_pointers,
        "scalar_params": [b.hex() for b in rec.scalar_params],
        "tma_specs": [[i, _tma_to_json(p)] for i, p in rec.tma_specs], "pdl": rec.pdl,
        "in_shapes": rec.in_shapes, "in_types": rec.in_types, "out_shapes": rec.out_shapes,
        "out_types": rec.out_types, "arg_names": rec.arg_names,
    }
    return cache.store(_file_key(rec.key), json.dumps(doc).encode(), _RECORD_SUFFIX)


def find_record(key_or_handle: str | int) -> CubinRecord | None:
    """The record with this content hash (or shim handle): the live one, else the one the disk
    cache holds (checked against its hash), else None."""
    live = (_registry.get(key_or_handle) if isinstance(key_or_handle, int)
            else _registry.by_key(key_or_handle))
    if live is not None:
        return live
    import json

    from . import cache

    raw = cache.load(_file_key(key_or_handle), _RECORD_SUFFIX)
    if raw is None:
        return None
    try:
        d = json.loads(raw)
        tmas: tuple[tuple[int, Any], ...] = ()
        if d["tma_specs"]:
            from .tma import TmaParams

            tmas = tuple((int(i), TmaParams(**p)) for i, p in d["tma_specs"])
        rec = CubinRecord(
            0, d["ptx"], d["name"], int(d["smem"]), tuple(d["grid"]), tuple(d["block"]),
            arch=d["arch"], cluster=tuple(d["cluster"]), static_smem=int(d["static_smem"]),
            num_pointers=int(d["num_pointers"]),
            scalar_params=tuple(bytes.fromhex(b) for b in d["scalar_params"]), tma_specs=tmas,
            pdl=bool(d["pdl"]), in_shapes=tuple(map(tuple, d["in_shapes"])),
            in_types=tuple(d["in_types"]), out_shapes=tuple(map(tuple, d["out_shapes"])),
            out_types=tuple(d["out_types"]), arg_names=tuple(d["arg_names"]),
        )
        key = d["key"]
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign file: as if absent
    if content_key(rec.ptx_source, rec.arch, _launch_identity(rec)) != key:
        return None  # edited, or written by a pyptx that hashes differently
    wanted = handle_of_key(key) if isinstance(key_or_handle, int) else key
    if wanted != key_or_handle:
        return None  # another kernel whose hash shares the file name
    return _keyed(rec)
