"""``@kernel`` and ``Kernel``: specs, launch geometry, specialization cache, PTX, dispatch.

A kernel body is traced once per specialization: the concrete dims of its
``Tile`` specs plus the values of its keyword-only (template) parameters and
its arch. ``Kernel.ptx(**dims)`` returns the PTX of one specialization;
calling the kernel on framework arrays hands it to a runtime plugin.
"""

from __future__ import annotations

import inspect
import itertools
import operator
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any

from ._dataclass import dataclass
from .arch import AUTO, DEFAULT_ARCH
from .emit import emit
from .errors import ConfigError, PyptxError, SpecError, TraceError
from .ir import Function, Module, Param
from .runtimes import launcher_for, runtime_for
from .source import Loc, fmt_loc, user_loc, where
from .specs import Layout, Tile, bind
from .trace import Trace, tracing
from .types import PtxType, b8, u64

_ARCH = re.compile(r"^sm_(\d+)([af]?)$")
_VERSION = re.compile(r"^\d+\.\d+$")
MAX_DYNAMIC_SMEM = 227 * 1024
#: CUDA launch limits: grid x, grid y/z, threads per block, block z, registers per block.
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
MAX_BLOCK_THREADS = 1024
MAX_BLOCK_Z = 64
REGISTERS_PER_BLOCK = 65536

__all__ = ["kernel", "Kernel", "Specialization", "default_version", "kernel_by_uid"]


def default_version(arch: str) -> str:
    """The lowest PTX ISA version that supports ``arch`` (and the features pyptx emits)."""
    m = _ARCH.match(arch)
    sm = int(m.group(1)) if m else 90
    if sm >= 120:
        return "8.7"
    if sm >= 100:
        return "8.6"
    if sm >= 90:
        return "8.0"
    return "7.8"


@dataclass
class Specialization:
    """One traced instance of a kernel: concrete dims, launch geometry and IR."""

    kernel: Kernel
    env: dict[str, int]
    template_kwargs: dict[str, Any]
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    smem: int
    module: Module
    static_smem: int
    scalar_params: list[tuple[str, PtxType, int | float]]
    #: ``(tensor argument index, pyptx.tma.TmaParams)`` of each tensor-map parameter.
    tma_maps: list[tuple[int, Any]] = field(default_factory=list)
    #: Launch with programmatic dependent launch (``@kernel(pdl=True)``).
    pdl: bool = False
    #: The target this specialization was traced for (``Kernel.arch`` unless ``arch=`` was given).
    arch: str = DEFAULT_ARCH
    #: The compiled-kernel record (``pyptx.registry.record_for``), made on the first launch.
    record: Any = None
    _text: dict[bool, tuple[str, list[Loc | None]]] = field(default_factory=dict)

    def ptx(self, lineinfo: bool = False) -> str:
        """The PTX text (``lineinfo=True`` adds ``.file``/``.loc`` directives)."""
        hit = self._text.get(lineinfo)
        return hit[0] if hit is not None else self.emit(lineinfo)[0]

    def emit(self, lineinfo: bool = False) -> tuple[str, list[Loc | None]]:
        """PTX text and its line -> Python ``(file, line)`` map, cached."""
        hit = self._text.get(lineinfo)
        if hit is None:
            hit = self._text[lineinfo] = emit(self.module, lineinfo)
        elif type(hit[1]) is _JsonLocs:   # from ``from_code``: the map is made when first read
            hit = self._text[lineinfo] = (hit[0], hit[1].locs())
        return hit

    @property
    def name(self) -> str:
        """The PTX entry name."""
        return self.module.functions[0].name

    def code(self) -> dict[str, Any]:
        """What ``Kernel.reuse`` takes of this specialization, as plain JSON-able data: the PTX
        (with and without line info, and the line map), the entry, the scalar parameters and
        the launch shape the code fixes. ``from_code`` makes a stand-in of it. A line map is
        kept compact (``{"files": [...], "n": lines, "lines": "i:line,,i:line"}``: a file table and one
        string, ~15x smaller than a list per PTX line, so reading it back is cheap)."""
        (text, locs), (text_li, locs_li) = self.emit(False), self.emit(True)
        return {"ptx": text, "locs": _compact_locs(locs), "ptx_lineinfo": text_li,
                "locs_lineinfo": _compact_locs(locs_li), "entry": self.name,
                "version": self.module.version, "arch": self.arch,
                "scalars": [[n, t.name, v] for n, t, v in self.scalar_params],
                "block": list(self.block), "cluster": list(self.cluster), "smem": self.smem,
                "static_smem": self.static_smem, "tma": [i for i, _ in self.tma_maps],
                "pdl": self.pdl}

    @classmethod
    def from_code(cls, data: Mapping[str, Any]) -> Specialization:
        """A stand-in specialization holding only ``code()``'s data (no IR, no kernel): what
        ``Kernel.reuse`` needs, e.g. from another process's disk cache."""
        from .types import from_name

        module = Module(data["version"], data["arch"], [Function(data["entry"])])

        return cls(
            kernel=None, env={}, template_kwargs={}, in_shapes=(), out_shapes=(),
            grid=(1, 1, 1), block=tuple(data["block"]), cluster=tuple(data["cluster"]),
            smem=data["smem"], module=module, static_smem=data["static_smem"],
            scalar_params=[(n, from_name(t), v) for n, t, v in data["scalars"]],
            tma_maps=[(i, None) for i in data["tma"]], pdl=data["pdl"], arch=data["arch"],
            _text={False: (data["ptx"], _JsonLocs(data["locs"])),
                   True: (data["ptx_lineinfo"], _JsonLocs(data["locs_lineinfo"]))})


def _compact_locs(locs: Sequence[Loc | None]) -> dict[str, Any]:
    """``code()``'s form of a line map: the files, and ``"<file index>:<line>"`` per PTX line
    (empty for a line with no Python place), comma-separated."""
    files: dict[str, int] = {}
    parts = []
    for loc in locs:
        if loc:
            path, line = loc
            parts.append(f"{files.setdefault(path, len(files))}:{line}")
        else:
            parts.append("")
    return {"files": list(files), "n": len(parts), "lines": ",".join(parts)}


class _JsonLocs:
    """A line map as ``code()`` gives it (compact, or a list of ``[file, line]`` from older
    files), not yet made ``Loc``s: ``Specialization.emit`` converts it when first read (a
    launch from a disk cache reads only the PTX)."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def locs(self) -> list[Any]:
        raw = self.raw
        if isinstance(raw, dict):
            files = raw["files"]
            out: list[Any] = []
            for part in raw["lines"].split(",") if raw["n"] else ():
                if part:
                    i, _, line = part.partition(":")
                    out.append((files[int(i)], int(line)))
                else:
                    out.append(None)
            return out
        return [tuple(x) if x else None for x in raw]


def _three(value: Any, what: str, origin: str) -> tuple[int, int, int]:
    try:
        items = tuple(value)
        if len(items) != 3:
            raise TypeError
        out = tuple(operator.index(v) for v in items)
    except TypeError:
        raise ConfigError(
            f"{origin}: {what} must be three positive ints (x, y, z), got {value!r}"
        ) from None
    if any(v <= 0 for v in out):
        raise ConfigError(f"{origin}: {what} must be three positive ints (x, y, z), got {value!r}")
    return out  # type: ignore[return-value]


def _call_with(fn: Callable[..., Any], values: Mapping[str, Any], what: str, origin: str) -> Any:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn(**values)
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn(**values)
    kwargs = {}
    for p in params:
        if p.name in values:
            kwargs[p.name] = values[p.name]
        elif p.default is p.empty and p.kind is not p.VAR_POSITIONAL:
            raise ConfigError(
                f"{origin}: {what} callable needs {p.name!r}, which is neither a dim nor a "
                f"template parameter (have: {', '.join(values) or 'none'})"
            )
    return fn(**kwargs)


class Kernel:
    """A traced-on-demand PTX kernel made by ``@kernel``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        in_specs: Sequence[Tile],
        out_specs: Sequence[Tile],
        grid: Any,
        block: Any,
        cluster: Any,
        smem: int | Callable[..., int],
        arch: str,
        version: str | None,
        name: str | None,
        origin: str,
        maxnreg: int | None = None,
        tma: Mapping[str, Mapping[str, Any]] | None = None,
        pdl: bool = False,
    ) -> None:
        self.fn = fn
        self.origin = origin
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__wrapped__ = fn
        self._in_specs = tuple(self._check_specs(in_specs, "in_specs"))
        self._out_specs = tuple(self._check_specs(out_specs, "out_specs"))
        #: ``arch="auto"``: the launching GPU's arch, fixed at the first launch (``resolve_arch``)
        self._arch_auto = arch == AUTO
        if self._arch_auto:
            arch = DEFAULT_ARCH
        _check_arch_name(arch, origin)
        self._arch = arch
        if version is not None and (not isinstance(version, str) or not _VERSION.match(version)):
            raise ConfigError(f"{origin}: version must look like '8.0', got {version!r}")
        self._version_given = version
        self._version = version or default_version(arch)
        self._name = name or self.__name__
        if not self._name.isidentifier():
            raise ConfigError(f"{origin}: kernel name must be an identifier, got {self._name!r}")
        self._grid = grid if callable(grid) else _three(grid, "grid", origin)
        if not callable(grid):
            self._check_grid(self._grid, origin)
        self._block = block if callable(block) else _three(block, "block", origin)
        if not callable(block):
            self._check_block(self._block, origin)
        if maxnreg is not None and (isinstance(maxnreg, bool) or not isinstance(maxnreg, int)
                                    or not 24 <= maxnreg <= 255):
            raise ConfigError(f"{origin}: maxnreg must be an int in 24..255, got {maxnreg!r}")
        self._maxnreg = maxnreg
        if not callable(block):
            self._check_registers(self._block, origin)
        if not isinstance(pdl, bool):
            raise ConfigError(f"{origin}: pdl must be True or False, got {pdl!r}")
        self._pdl = pdl
        self._cluster = _three(cluster, "cluster", origin)
        self._check_arch_features(arch, origin)
        if self._cluster[0] * self._cluster[1] * self._cluster[2] > 16:
            raise ConfigError(f"{origin}: cluster {self._cluster} has more than 16 CTAs")
        if not callable(smem):
            self._check_smem(smem, origin)
        self._smem = smem
        self._tensor_names, self._template_params = self._signature(fn, origin)
        self._tma = self._check_tma(tma or {}, origin)
        self._cache: dict[Any, Specialization] = {}
        self._lock = threading.Lock()
        #: Each runtime's launcher for this kernel (its plans and caches die with the kernel),
        #: by runtime name and by the type of the first argument of a call.
        self._runtime_launchers: dict[str, Callable[..., Any]] = {}
        self._launchers: dict[type, Callable[..., Any]] = {}
        #: A process-unique string naming this kernel (``kernel_by_uid`` finds it again); graph
        #: tracers pass it where only plain values may go (a string is never made symbolic).
        self.uid = f"{self._name}#{next(_uids)}"
        _by_uid[self.uid] = self
        from .runtimes import preload

        preload()  # a first call traced by a framework compiler must not scan entry points

    # ------------------------------------------------------------------ metadata
    @property
    def in_specs(self) -> tuple[Tile, ...]:
        """Specs of the input tensors, in argument order."""
        return self._in_specs

    @property
    def out_specs(self) -> tuple[Tile, ...]:
        """Specs of the outputs the kernel writes."""
        return self._out_specs

    @property
    def grid(self) -> Any:
        """Grid as given: three ints or a callable of the dims."""
        return self._grid

    @property
    def block(self) -> Any:
        """Block as given: three ints or a callable of the dims."""
        return self._block

    @property
    def pdl(self) -> bool:
        """True if launches use programmatic dependent launch (see ``@kernel(pdl=...)``)."""
        return self._pdl

    @property
    def cluster(self) -> tuple[int, int, int]:
        """Cluster dims; (1, 1, 1) means no cluster."""
        return self._cluster

    @property
    def smem(self) -> Any:
        """Dynamic shared memory in bytes (or a callable of the dims)."""
        return self._smem

    @property
    def arch(self) -> str:
        """Target architecture, e.g. ``sm_90a``; for ``arch="auto"`` the launching GPU's once
        a launch resolved it (``resolve_arch``), ``sm_90a`` before."""
        return self._arch

    @property
    def arch_auto(self) -> bool:
        """True if the kernel was declared with ``arch="auto"``."""
        return self._arch_auto

    @property
    def version(self) -> str:
        """PTX ISA version written in ``.version``."""
        return self._version

    def resolve_arch(self, device: int | None = None) -> str:
        """For an ``arch="auto"`` kernel, fix the arch to GPU ``device``'s
        (``pyptx.detect_arch``) the first time a launch calls this; return the kernel's arch.
        Without a GPU the arch stays ``sm_90a`` (and the launch then fails as any launch
        without a GPU does). Runtimes call it before specializing (``pyptx.plan.bind``)."""
        if self._arch_auto:
            from .arch import detect_arch
            from .errors import RuntimeUnavailableError

            try:
                arch = detect_arch(device)
            except RuntimeUnavailableError:
                return self._arch
            with self._lock:
                if self._arch_auto:
                    self._check_arch_features(arch, f"{where()}: kernel {self._name!r} "
                                                    f"(arch='auto' resolved to {arch})")
                    self._arch = arch
                    self._version = self._version_given or default_version(arch)
                    self._arch_auto = False
        return self._arch

    def _check_arch_features(self, arch: str, origin: str) -> None:
        """``ConfigError`` if a launch option of this kernel needs a newer arch than ``arch``."""
        sm = int(_ARCH.match(arch).group(1))
        if self._pdl and sm < 90:
            raise ConfigError(f"{origin}: pdl (griddepcontrol) needs sm_90 or newer, arch is {arch}")
        if self._cluster != (1, 1, 1) and sm < 90:
            raise ConfigError(f"{origin}: thread-block clusters need sm_90 or newer, arch is {arch}")

    @property
    def name(self) -> str:
        """PTX entry name."""
        return self._name

    @property
    def arg_names(self) -> tuple[str, ...]:
        """Names of the tensor parameters: inputs then outputs."""
        return self._tensor_names

    @property
    def template_params(self) -> dict[str, Any]:
        """Keyword-only parameters of the body and their defaults (``inspect.Parameter.empty`` if none)."""
        return dict(self._template_params)

    @property
    def dims(self) -> tuple[str, ...]:
        """All symbolic dim names used by the specs."""
        names: dict[str, None] = {}
        for s in self._in_specs + self._out_specs:
            names.update(dict.fromkeys(s.symbols))
        return tuple(names)

    def __repr__(self) -> str:
        return (f"<pyptx.Kernel {self._name} in={list(self._in_specs)} out={list(self._out_specs)} "
                f"arch={self._arch}>")

    # ------------------------------------------------------------------ checks
    def _check_specs(self, specs: Any, what: str) -> list[Tile]:
        if isinstance(specs, Tile):  # ``in_specs=(Tile(...))``: the trailing comma is missing
            raise SpecError(
                f"{self.origin}: {what} must be a tuple of Tile specs, got the bare spec {specs!r}; "
                f"write {what}=({specs!r},) (note the trailing comma)"
            )
        if not isinstance(specs, (tuple, list)):
            raise SpecError(
                f"{self.origin}: {what} must be a sequence of Tile, e.g. "
                f"{what}=(Tile('M', f32),), got {type(specs).__name__} {specs!r}"
            )
        specs = list(specs)
        for i, s in enumerate(specs):
            if not isinstance(s, Tile):
                raise SpecError(f"{self.origin}: {what}[{i}] must be a Tile, got {s!r}")
        return specs

    @staticmethod
    def _check_block(block: tuple[int, int, int], origin: str) -> None:
        if block[0] * block[1] * block[2] > MAX_BLOCK_THREADS or block[2] > MAX_BLOCK_Z:
            raise ConfigError(
                f"{origin}: block {block} exceeds the CUDA limits (at most "
                f"{MAX_BLOCK_THREADS} threads, z <= {MAX_BLOCK_Z})"
            )

    @staticmethod
    def _check_grid(grid: tuple[int, int, int], origin: str) -> None:
        if grid[0] > MAX_GRID_X or grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
            raise ConfigError(
                f"{origin}: grid {grid} exceeds the CUDA limits (x <= {MAX_GRID_X}, "
                f"y and z <= {MAX_GRID_YZ})"
            )

    def _check_registers(self, block: tuple[int, int, int], origin: str) -> None:
        threads = block[0] * block[1] * block[2]
        if self._maxnreg is not None and self._maxnreg * threads > REGISTERS_PER_BLOCK:
            raise ConfigError(
                f"{origin}: maxnreg={self._maxnreg} x {threads} threads needs "
                f"{self._maxnreg * threads} registers per block, over the {REGISTERS_PER_BLOCK} "
                f"an SM has; lower maxnreg to {REGISTERS_PER_BLOCK // threads} or less"
            )

    @staticmethod
    def _check_smem(smem: Any, origin: str) -> int:
        if isinstance(smem, bool) or not isinstance(smem, int) or smem < 0:
            raise ConfigError(f"{origin}: smem must be a non-negative int of bytes, got {smem!r}")
        if smem > MAX_DYNAMIC_SMEM:
            raise ConfigError(
                f"{origin}: smem={smem} bytes exceeds the {MAX_DYNAMIC_SMEM}-byte dynamic shared "
                "memory limit of sm_90"
            )
        return smem

    def _signature(self, fn: Callable[..., Any], origin: str) -> tuple[tuple[str, ...], dict[str, Any]]:
        sig = inspect.signature(fn)
        tensors, templates = [], {}
        for p in sig.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                tensors.append(p.name)
            elif p.kind is p.KEYWORD_ONLY:
                templates[p.name] = p.default
            else:
                raise SpecError(
                    f"{origin}: kernel {fn.__name__} may not take *args or **kwargs; tensor "
                    "parameters are positional, template parameters keyword-only"
                )
        want = len(self._in_specs) + len(self._out_specs)
        if len(tensors) != want:
            raise SpecError(
                f"{origin}: kernel {fn.__name__} takes {len(tensors)} tensor parameters "
                f"({', '.join(tensors) or 'none'}), but in_specs + out_specs describe {want}"
            )
        clash = set(templates) & set(self.dims)
        if clash:
            raise SpecError(f"{origin}: {sorted(clash)} are both template parameters and dims")
        return tuple(tensors), templates

    _TMA_KEYS = frozenset({"box", "swizzle", "element_strides", "l2_promotion", "oob_fill",
                           "interleave", "view", "padding", "shape", "strides"})

    def _check_tma(self, tma: Mapping[str, Mapping[str, Any]], origin: str) -> dict:
        if not isinstance(tma, Mapping):
            raise ConfigError(f"{origin}: tma must map tensor names to dicts of TMA options, "
                              f"got {tma!r}")
        out = {}
        for name, opts in tma.items():
            if name not in self._tensor_names:
                raise ConfigError(f"{origin}: tma names {name!r}, which is not a tensor parameter "
                                  f"({', '.join(self._tensor_names)})")
            if not isinstance(opts, Mapping) or set(opts) - self._TMA_KEYS:
                raise ConfigError(f"{origin}: tma[{name!r}] must be a dict with keys from "
                                  f"{sorted(self._TMA_KEYS)}, got {opts!r}")
            view = opts.get("view", "2d")
            if view not in ("2d", "3d"):
                raise ConfigError(f"{origin}: tma[{name!r}] view must be '2d' or '3d', got {view!r}")
            if view == "2d" and "padding" in opts:
                raise ConfigError(f"{origin}: tma[{name!r}] padding needs view='3d' (the padded "
                                  f"72-element rows of pyptx.tma.tma_params_3d)")
            if view == "3d" and {"shape", "strides"} & set(opts):
                raise ConfigError(f"{origin}: tma[{name!r}] shape and strides need view='2d' "
                                  f"(a strided view of the tensor's memory)")
            if view == "3d":
                i = self._tensor_names.index(name)
                spec = (self._in_specs + self._out_specs)[i]
                if spec.rank != 2 or spec.layout is not Layout.ROW:
                    raise ConfigError(f"{origin}: tma[{name!r}] view='3d' needs a 2-D row-major "
                                      f"tensor, got {spec!r}")
                box = opts.get("box")
                if box is None or len(box) != 2:
                    raise ConfigError(f"{origin}: tma[{name!r}] view='3d' needs box=(rows, cols), "
                                      f"got {box!r}")
            out[name] = dict(opts)
        return out

    @property
    def tma(self) -> dict[str, dict[str, Any]]:
        """The tensor maps the kernel takes: tensor name -> ``pyptx.tma.tma_params`` options."""
        return {k: dict(v) for k, v in self._tma.items()}

    # ------------------------------------------------------------------ specialization
    def _split_kwargs(self, kwargs: Mapping[str, Any], at: str) -> tuple[dict[str, int], dict[str, Any]]:
        dims, templates = {}, {}
        known_dims = set(self.dims)
        for k, v in kwargs.items():
            if k in self._template_params:
                templates[k] = v
            elif k in known_dims:
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise SpecError(f"{at}: dim {k!r} must be a positive int, got {v!r}")
                dims[k] = v
            else:
                raise SpecError(
                    f"{at}: {self._name} got unknown keyword {k!r}; dims: "
                    f"{', '.join(sorted(known_dims)) or 'none'}; template parameters: "
                    f"{', '.join(self._template_params) or 'none'}"
                )
        for k, default in self._template_params.items():
            if k not in templates:
                if default is inspect.Parameter.empty:
                    raise SpecError(f"{at}: {self._name} needs template parameter {k}=...")
                templates[k] = default
        return dims, templates

    def specialize(self, _shapes: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> Specialization:
        """Trace (or fetch from cache) the specialization for these dims and template values.

        ``_shapes`` are the concrete input shapes when called by a runtime;
        keywords give symbolic dims and template parameters, and ``arch=`` (unless the
        body has a template parameter of that name) a target other than the kernel's.
        """
        at = where()
        arch = self._arch
        if "arch" in kwargs and "arch" not in self._template_params and "arch" not in self.dims:
            arch = kwargs.pop("arch")
            if arch == AUTO:
                from .arch import detect_arch

                arch = detect_arch()
            _check_arch_name(arch, at)
            if arch != self._arch:
                self._check_arch_features(arch, at)
        dims, templates = self._split_kwargs(kwargs, at)
        if _shapes is not None:
            if len(_shapes) != len(self._in_specs):
                raise SpecError(
                    f"{at}: {self._name} takes {len(self._in_specs)} inputs "
                    f"({', '.join(self._tensor_names[:len(self._in_specs)])}), got {len(_shapes)}"
                )
            try:
                dims = bind(self._in_specs, _shapes, self._tensor_names, dims)
            except SpecError as e:  # bind knows no location: name the caller's file:line
                raise type(e)(f"{at}: {e}") from None
        try:
            key = (tuple(sorted(dims.items())), tuple(sorted(templates.items())), arch)
            hash(key)
        except TypeError:
            raise SpecError(f"{at}: template parameter values must be hashable, got {templates!r}") from None
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._cache.get(key)
            if hit is None:
                hit = self._cache[key] = self._trace(dims, templates, at, arch)
        return hit

    def _geometry(self, env: dict[str, int], templates: dict[str, Any], at: str
                  ) -> tuple[tuple, tuple, tuple, tuple, int, str]:
        """``(in_shapes, out_shapes, grid, block, smem, origin)`` for these dims and template
        values: callables evaluated and checked; ``origin`` names the kernel for messages."""
        names = self._tensor_names
        n_in = len(self._in_specs)
        in_shapes = tuple(s.resolve(env, f"{at}: input {names[i]!r}")
                          for i, s in enumerate(self._in_specs))
        out_shapes = tuple(s.resolve(env, f"{at}: output {names[n_in + i]!r}")
                           for i, s in enumerate(self._out_specs))
        values = {**env, **templates}
        origin = f"kernel {self._name!r} defined at {self.origin}"
        grid = _three(_call_with(self._grid, values, "grid", origin) if callable(self._grid)
                      else self._grid, "grid", origin)
        self._check_grid(grid, origin)
        block = self._block
        if callable(block):
            block = _three(_call_with(block, values, "block", origin), "block", origin)
            self._check_block(block, origin)
            self._check_registers(block, origin)
        smem = self._smem
        if callable(smem):
            smem = self._check_smem(_call_with(smem, values, "smem", origin), origin)
        return in_shapes, out_shapes, grid, block, smem, origin

    def _trace(self, env: dict[str, int], templates: dict[str, Any], at: str,
               arch: str) -> Specialization:
        from .ptx.memory import TensorParam  # the tracing layer: loaded at the first trace

        names = self._tensor_names
        in_shapes, out_shapes, grid, block, smem, origin = self._geometry(env, templates, at)

        func = Function(self._name)
        trace = Trace(func, arch)
        version = self._version if arch == self._arch else self._version_given or default_version(arch)
        trace.version = version  # ptx.inst checks PTX ISA versions against it
        trace.maxnreg = self._maxnreg  # setmaxnreg needs a declared budget
        params = []
        tmap_params, tma_maps = [], []
        maps = dict(self._tma_maps(in_shapes + out_shapes))
        for i, (pname, shape) in enumerate(zip(names, in_shapes + out_shapes)):
            spec = (self._in_specs + self._out_specs)[i]
            func.params.append(Param(pname, u64))
            trace.unique(pname)  # reserve it: ptx.scalar_param(name="X") must not redeclare X
            tmap = None
            if i in maps:
                tma_maps.append((i, maps[i]))
                tmap = trace.unique(f"{pname}_tmap")
                tmap_params.append(Param(tmap, b8, align=64, count=128))
            params.append(TensorParam(pname, spec, shape, i, trace, tmap,
                                      tma_maps[-1][1] if tmap else None))
        func.params.extend(tmap_params)
        with tracing(trace):
            if self._pdl:  # nothing below may touch memory before the previous grid is done
                from .ptx.sync import grid_dependency_wait, launch_dependents

                grid_dependency_wait()
                trace.pdl_wait = trace.body[-1]  # ptx.pdl_prologue() code goes before it
                launch_dependents()
            try:
                self.fn(*params, **templates)
            except PyptxError:
                raise
            except RecursionError:
                raise
            except Exception as e:
                loc = _innermost_user_loc(e)
                raise TraceError(
                    f"{fmt_loc(loc)}: tracing kernel {self._name!r} raised "
                    f"{type(e).__name__}: {e}"
                ) from e
        _check_labels_placed(func, self._name)
        if trace.dynamic_smem and smem == 0:
            raise ConfigError(
                f"{trace.dynamic_smem}: smem.dynamic() in kernel {self._name!r}, which declares "
                f"no dynamic shared memory (smem=0); give @kernel(smem=<bytes>) at {self.origin}"
            )
        if tmap_params:  # launch order: pointers, scalars, then the by-value tensor maps
            func.params[:] = [p for p in func.params if p not in tmap_params] + tmap_params
        func.directives.append(".reqntid {}, {}, {}".format(*block))
        if self._maxnreg is not None:
            func.directives.append(f".maxnreg {self._maxnreg}")
        if self._cluster != (1, 1, 1):
            func.directives.append(".reqnctapercluster {}, {}, {}".format(*self._cluster))
        if trace.shared_bytes + smem > MAX_DYNAMIC_SMEM:
            raise ConfigError(
                f"{origin}: {trace.shared_bytes} static + {smem} dynamic shared bytes exceed "
                f"the {MAX_DYNAMIC_SMEM}-byte per-block limit"
            )
        module = Module(version, arch, [func], trace.shared)
        return Specialization(
            kernel=self, env=env, template_kwargs=templates, in_shapes=in_shapes,
            out_shapes=out_shapes, grid=grid, block=block, cluster=self._cluster, smem=smem,
            module=module, static_smem=trace.shared_bytes, scalar_params=trace.scalar_params,
            tma_maps=tma_maps, pdl=self._pdl, arch=arch,
        )

    def _tma_maps(self, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, Any]]:
        """``(tensor index, TmaParams)`` of each tensor-map parameter for these tensor shapes."""
        out = []
        specs = self._in_specs + self._out_specs
        for i, (pname, shape) in enumerate(zip(self._tensor_names, shapes)):
            if pname not in self._tma:
                continue
            from .tma import tma_params

            spec = specs[i]
            opts = dict(self._tma[pname])
            box = opts.pop("box", None)
            if opts.pop("view", "2d") == "3d":
                from .tma import tma_params_3d

                sw = opts.pop("swizzle", "128B")
                out.append((i, tma_params_3d(
                    shape[0], shape[1], spec.dtype, box[0], box[1],
                    swizzle_128b=sw not in (None, "none"), padding=opts.pop("padding", False),
                    **opts)))
            else:
                shape = opts.pop("shape", shape)   # a strided view of the tensor's memory
                out.append((i, tma_params(shape, spec.dtype, spec.layout, box, **opts)))
        return out

    def reuse(self, like: Specialization, scalars: Mapping[str, int | float],
              **kwargs: Any) -> Specialization:
        """This kernel's specialization for ``kwargs`` (as ``specialize``) built from the code
        of ``like`` without tracing: ``like`` is a specialization of a kernel of the same
        family, one whose PTX does not depend on the sizes the two kernels' specs differ in
        (the body reads them from scalar parameters). The tensor shapes, grid and tensor maps
        are this kernel's; the scalar parameters are ``like``'s, those named in ``scalars``
        taking the given values. Stored in this kernel's cache, so launches find it. The
        caller vouches for the family; ``ConfigError`` where the two visibly differ (entry
        name, block, cluster, shared memory, tensor maps, unknown scalar names)."""
        at = where()
        arch = kwargs.pop("arch", like.arch)
        dims, templates = self._split_kwargs(kwargs, at)
        key = (tuple(sorted(dims.items())), tuple(sorted(templates.items())), arch)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        in_shapes, out_shapes, grid, block, smem, _ = self._geometry(dims, templates, at)
        maps = self._tma_maps(in_shapes + out_shapes)
        differ = [what for what, mine, theirs in (
            ("entry name", self._name, like.name), ("block", block, like.block),
            ("cluster", self._cluster, like.cluster), ("shared memory", smem, like.smem),
            ("tensor maps", [i for i, _ in maps], [i for i, _ in like.tma_maps]),
            ("arch", arch, like.arch)) if mine != theirs]
        known = {n for n, _, _ in like.scalar_params}
        unknown = sorted(set(scalars) - known)
        if differ or unknown:
            raise ConfigError(
                f"{at}: kernel {self._name!r} cannot reuse the code of {like.name!r}: "
                + (f"they differ in {', '.join(differ)}" if differ else
                   f"it has no scalar parameter {', '.join(unknown)} "
                   f"(it has {', '.join(sorted(known)) or 'none'})"))
        spec = Specialization(
            kernel=self, env=dims, template_kwargs=templates, in_shapes=in_shapes,
            out_shapes=out_shapes, grid=grid, block=block, cluster=self._cluster, smem=smem,
            module=like.module, static_smem=like.static_smem,
            scalar_params=[(n, t, scalars.get(n, v)) for n, t, v in like.scalar_params],
            tma_maps=maps, pdl=like.pdl, arch=arch, _text=like._text)
        with self._lock:
            return self._cache.setdefault(key, spec)

    def ptx(self, lineinfo: bool = False, **kwargs: Any) -> str:
        """PTX text of the specialization for ``kwargs`` (dims and template parameters;
        ``arch="sm_80"`` emits for that target instead of the kernel's)."""
        return self.specialize(**kwargs).ptx(lineinfo)

    def check_dtypes(self, dtypes: Sequence[PtxType | None]) -> None:
        """Raise ``SpecError`` naming the argument if ``dtypes`` disagree with ``in_specs``."""
        names = self._tensor_names
        if len(dtypes) != len(self._in_specs):
            raise SpecError(
                f"{where()}: {self._name} takes {len(self._in_specs)} inputs "
                f"({', '.join(names[:len(self._in_specs)])}), got {len(dtypes)}"
            )
        for i, (spec, dt) in enumerate(zip(self._in_specs, dtypes)):
            if dt is not None and not isinstance(dt, PtxType):
                from .types import from_name

                try:
                    dt = from_name(dt) if isinstance(dt, str) else None
                except PyptxError:
                    dt = None
                if dt is None:
                    raise SpecError(
                        f"{where()}: argument {names[i]!r}: expected a pyptx type or its name "
                        f"for {spec!r}, got {dtypes[i]!r}")
            if dt is not spec.dtype:
                raise SpecError(
                    f"{where()}: argument {names[i]!r}: expected dtype {spec.dtype.name} for "
                    f"{spec!r}, got {dt.name if dt is not None else 'an unsupported dtype'}"
                )

    # ------------------------------------------------------------------ launch
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Launch on framework arrays through the runtime plugin that owns them."""
        launch = self._launchers.get(args[0].__class__) if args else None
        if launch is None:
            rt = runtime_for(args)
            launch = self._runtime_launchers.get(rt.name)
            if launch is None:
                tracing = getattr(rt, "tracing", None)
                if tracing is not None and tracing():  # a graph compiler runs this code:
                    return rt.launch(self, args, kwargs)  # make no per-kernel state in it
                launch = self.launcher(rt.name)
            self._launchers[args[0].__class__] = launch
        return launch(self, args, kwargs)

    def launcher(self, runtime: str) -> Callable[..., Any]:
        """This kernel's launcher of the named runtime: ``launch(kernel, args, kwargs)``,
        made once per kernel by the plugin (``Runtime.launcher``), holding its plans."""
        launch = self._runtime_launchers.get(runtime)
        if launch is None:
            from .runtimes import load

            launch = self._runtime_launchers.setdefault(runtime, launcher_for(load(runtime)))
        return launch


_uids = itertools.count(1)
_by_uid: weakref.WeakValueDictionary[str, Kernel] = weakref.WeakValueDictionary()


def kernel_by_uid(uid: str) -> Kernel:
    """The live kernel whose ``uid`` is ``uid`` (``KeyError`` if it was garbage-collected)."""
    return _by_uid[uid]


def _check_arch_name(arch: Any, origin: str) -> None:
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise ConfigError(f"{origin}: arch must look like 'sm_90a' or 'sm_80', got {arch!r} "
                          "(@kernel also takes arch='auto': the GPU of the first launch)")


def _check_labels_placed(func: Function, kernel_name: str) -> None:
    """``TraceError`` at the first branch whose target label was never placed."""
    from .ir import Instruction, Label, Raw

    placed = set()
    branches = []
    for st in func.body:
        cls = type(st)
        if cls is Instruction:
            if st.opcode[:3] == "bra" and st.operands:
                branches.append(st)
        elif cls is Label:
            placed.add(st.name)
        elif cls is Raw and st.line.rstrip().endswith(":"):
            placed.add(st.line.strip()[:-1])
    for st in branches:
        target = st.operands[-1]
        if target.startswith("$") and target not in placed:
            raise TraceError(
                f"{fmt_loc(st.loc)}: ptx.bra to label {target} in kernel {kernel_name!r}, "
                "which is never placed; call ptx.place(label) where the branch should land"
            )


def _innermost_user_loc(e: BaseException) -> Loc | None:
    tb = e.__traceback__
    loc = None
    from .source import _is_internal

    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        if not _is_internal(fname):
            loc = (fname, tb.tb_lineno)
        tb = tb.tb_next
    return loc


def kernel(
    in_specs: Sequence[Tile] = (),
    out_specs: Sequence[Tile] = (),
    *,
    grid: Any = (1, 1, 1),
    block: Any = (1, 1, 1),
    cluster: Any = (1, 1, 1),
    smem: int | Callable[..., int] = 0,
    arch: str = DEFAULT_ARCH,
    version: str | None = None,
    name: str | None = None,
    maxnreg: int | None = None,
    tma: Mapping[str, Mapping[str, Any]] | None = None,
    pdl: bool = False,
    **unknown: Any,
) -> Callable[[Callable[..., Any]], Kernel]:
    """Decorate a kernel body: positional parameters are tensors (inputs then outputs),
    keyword-only parameters are template parameters. A bare ``@kernel`` is ``@kernel()``.

    ``grid``/``block`` are three ints or a callable of the dims and template
    parameters returning three ints; ``smem`` is dynamic shared memory bytes;
    ``arch`` the target (``sm_90a``; ``"auto"``: the GPU of the first launch, see
    ``pyptx.detect_arch``; ``sm_90a`` until then); ``version`` the PTX ISA version;
    ``maxnreg`` caps registers per thread (``.maxnreg``; needed for ``setmaxnreg``);
    ``tma`` maps tensor names to TMA descriptor options (``box``, ``swizzle``, ...; ``view="3d"``
    with ``box=(rows, cols)`` and optional ``padding=True`` selects the 3-D view of
    ``pyptx.tma.tma_params_3d``: a 128-byte-swizzled K-major operand wider than one swizzle
    line in one copy, or 72-element padded rows for a bank-conflict-free epilogue;
    ``shape`` with ``strides``, element strides in the shape's axis order, maps a strided
    view of the tensor's memory, say a flat ``Tile(n)`` of the elements a caller's strided
    tensor spans): each gets a by-value tensor-map parameter, ``X.tmap`` in the body, built
    and patched with the tensor's address by the runtime at every launch.
    ``pdl=True`` launches with programmatic dependent launch (sm_90+): the kernel starts
    with ``griddepcontrol.wait`` (so it never reads what the previous kernel is still
    writing) and ``griddepcontrol.launch_dependents``, which lets the next PDL kernel in
    the stream be scheduled during this one's last wave instead of after it.
    """
    origin = fmt_loc(user_loc(2))
    if unknown:
        raise ConfigError(
            f"{origin}: @kernel got unknown option {', '.join(map(repr, unknown))}; it takes "
            "in_specs, out_specs, grid, block, cluster, smem, arch, version, name, maxnreg, "
            "tma and pdl")
    if inspect.isfunction(in_specs):  # a bare @kernel: the function came as in_specs
        fn, in_specs = in_specs, ()
        return Kernel(fn, in_specs=in_specs, out_specs=out_specs, grid=grid, block=block,
                      cluster=cluster, smem=smem, arch=arch, version=version, name=name,
                      origin=origin, maxnreg=maxnreg, tma=tma, pdl=pdl)

    def wrap(fn: Callable[..., Any]) -> Kernel:
        if not callable(fn):
            raise ConfigError(f"{origin}: @kernel decorates a function, got {fn!r}")
        return Kernel(fn, in_specs=in_specs, out_specs=out_specs, grid=grid, block=block,
                      cluster=cluster, smem=smem, arch=arch, version=version, name=name,
                      origin=origin, maxnreg=maxnreg, tma=tma, pdl=pdl)

    return wrap

