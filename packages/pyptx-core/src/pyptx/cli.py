"""The ``pyptx`` command: print a kernel's PTX, check it with ptxas, diagnose the install.

    pyptx ptx    FILE:NAME [name=value ...] [--kernel K] [--lineinfo] [-o OUT]
    pyptx check  FILE:NAME [name=value ...] [--kernel K]
    pyptx doctor
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import platform
import sys
import traceback
from collections.abc import Callable
from typing import Any

from . import __version__, ptxas
from .errors import PyptxError, ToolchainError
from .kernel import Kernel, Specialization

PACKAGES = ("pyptx-core", "pyptx-shim", "pyptx-torch", "pyptx-jax")
EXAMPLE = "examples/hopper/rms_norm.py:build_rms_norm B=2048 N=8192"

_TARGET_HELP = """\
FILE:NAME names a Python file (or an importable MODULE) and, in it, either a
Kernel or a builder function that returns one (or a tuple, list or dict of
Kernels). The file is imported as a module (not as __main__), with its
directory on sys.path.

Each name=value is parsed as an int, else a float, else True/False, else a
string. It goes to the builder when it names a builder parameter, and to the
kernel when it names one of the kernel's dims or template parameters (to both
when it names both).
"""


class TargetError(PyptxError):
    """A ``FILE:NAME`` target or a ``name=value`` argument the command cannot use."""


# ---------------------------------------------------------------- name=value pairs
def parse_value(text: str) -> Any:
    """``"8192"`` -> 8192, ``"1e-6"`` -> 1e-06, ``"True"`` -> True, anything else stays a str."""
    for convert in (lambda s: int(s, 0), int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def parse_pairs(items: list[str]) -> dict[str, Any]:
    """``["B=2048", "eps=1e-5"]`` -> ``{"B": 2048, "eps": 1e-05}``."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise TargetError(f"expected name=value (e.g. N=8192), got {item!r}")
        if name in out:
            raise TargetError(f"{name} is given twice")
        out[name] = parse_value(value)
    return out


# ---------------------------------------------------------------- FILE:NAME
def _raised(what: str, e: BaseException, path: str | None = None) -> TargetError:
    """The error of importing or calling the user's code, at the user's line: the innermost
    frame outside pyptx, or ``path`` itself when the file could not even be compiled."""
    from .source import _is_internal

    if isinstance(e, SyntaxError) and e.filename:  # the user's file, not importlib's frame
        return TargetError(f"{what} raised {type(e).__name__} at {e.filename}:{e.lineno}: "
                           f"{e.msg}")
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<frozen ") and not _is_internal(f.filename)]
    if not frames and path is not None:  # e.g. null bytes: the file is not Python source
        return TargetError(f"{path}: not a Python source file: importing it raised "
                           f"{type(e).__name__}: {getattr(e, 'msg', None) or e}")
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return TargetError(f"{what} raised {type(e).__name__}{at}: {e}")


def _import(source: str) -> Any:
    is_file = source.endswith(".py") or os.sep in source or "/" in source
    if not is_file:
        try:
            return importlib.import_module(source)
        except ModuleNotFoundError as e:
            if e.name and (source == e.name or source.startswith(e.name + ".")):
                raise TargetError(f"{source!r} is neither a .py file nor an importable module"
                                  ) from None
            raise _raised(f"importing {source}", e) from e
        except PyptxError:
            raise
        except Exception as e:
            raise _raised(f"importing {source}", e) from e
    path = os.path.abspath(source)
    if os.path.isdir(path):
        raise TargetError(f"{source} is a directory; expected a Python file, e.g. "
                          f"{os.path.join(source, 'kernels.py')}:NAME")
    if not os.path.isfile(path):
        raise TargetError(f"no such file: {source}")
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() else "_pyptx_target"
    prior = sys.modules.get(name)
    if prior is not None and getattr(prior, "__file__", None) != path:
        name = f"_pyptx_target_{stem if stem.isidentifier() else 'file'}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {source} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except PyptxError:
        raise
    except Exception as e:
        del sys.modules[name]
        raise _raised(f"importing {source}", e, path) from e
    return module


def _resolve(target: str) -> tuple[Any, str]:
    source, sep, attr = target.rpartition(":")
    if not sep or not source or not all(p.isidentifier() for p in attr.split(".")):
        raise TargetError(
            f"expected FILE:NAME, e.g. examples/hopper/rms_norm.py:build_rms_norm, got {target!r}")
    obj = _import(source)
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = [n for n, v in vars(obj).items() if not n.startswith("_")
                     and (isinstance(v, Kernel) or inspect.isfunction(v)
                          and v.__module__ == getattr(obj, "__name__", None))]
            raise TargetError(f"{source} has no attribute {attr!r}; kernels and functions there: "
                              f"{', '.join(found) or 'none'}")
        obj = getattr(obj, part)
    return obj, attr


def _as_kernels(value: Any, what: str) -> dict[str, Kernel]:
    from .autotune import TunedKernel

    if isinstance(value, TunedKernel):  # an autotuned builder: its first config (no device here)
        value = value.kernel
    if isinstance(value, Kernel):
        return {value.name: value}
    items: list[tuple[str, Any]]
    many = getattr(value, "kernels", None) if not isinstance(value, (dict, tuple, list)) else None
    if many is not None and not isinstance(many, (str, bytes)) and hasattr(many, "__iter__"):
        value = many  # a multi-kernel object (the attention backward: kernels run in sequence)
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (tuple, list)) or value is many:
        items = [(getattr(v, "name", str(i)), v) for i, v in enumerate(value)]
    else:
        items = []
    bad = [v for _, v in items if not isinstance(v, Kernel)]
    if not items or bad:
        got = type(bad[0] if bad else value).__name__
        got = got if bad or items else f"an empty {got}"
        inside = " in its .kernels" if value is many else ""
        raise TargetError(f"{what} returned {got}{inside}; expected a Kernel (made by "
                          "@pyptx.kernel), a tuple, list or dict of Kernels, or an object "
                          "whose .kernels holds Kernels")
    out: dict[str, Kernel] = {}
    for i, (label, k) in enumerate(items):
        out[label if label not in out else f"{label}#{i}"] = k
    return out


def _call_builder(fn: Callable[..., Any], attr: str, pairs: dict[str, Any]) -> tuple[Any, set[str]]:
    """Call ``fn`` with the pairs naming its parameters; return its result and its parameter names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    kwargs = {p.name: pairs[p.name] for p in named if p.name in pairs}
    missing = [p.name for p in named if p.default is p.empty and p.name not in kwargs]
    if missing:
        raise TargetError(f"builder {attr}({', '.join(p.name for p in named)}) needs "
                          + " ".join(f"{m}=..." for m in missing))
    for p in named:
        if p.name in kwargs:
            _check_annotated(attr, p, kwargs[p.name])
    try:
        result = fn(**kwargs)
    except PyptxError:
        raise
    except Exception as e:
        err = _raised(f"builder {attr}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})", e)
        words = [f"{k}={v!r}" for k, v in kwargs.items() if isinstance(v, str)]
        if isinstance(e, TypeError) and words:
            err = TargetError(f"{err}; {', '.join(words)} reached the builder as a string "
                              "(a name=value that is not a number stays a str): expected a number?")
        raise err from e
    return result, {p.name for p in named}


_NUMBER_ANNOTATIONS = {int: (int,), "int": (int,), float: (int, float), "float": (int, float)}


def _check_annotated(attr: str, p: inspect.Parameter, value: Any) -> None:
    """``TargetError`` naming the parameter if ``value`` contradicts its ``int``/``float``
    annotation (``N=abc`` for ``N: int``): caught before the builder compares it."""
    want = _NUMBER_ANNOTATIONS.get(p.annotation) if isinstance(p.annotation, (type, str)) else None
    if want is not None and (isinstance(value, bool) or not isinstance(value, want)):
        kind = "an int" if want == (int,) else "a number"
        raise TargetError(f"{p.name}={value!r}: builder {attr}'s parameter {p.name} is {kind}, "
                          f"got {type(value).__name__} {value!r}")


def _names(k: Kernel) -> set[str]:
    return set(k.dims) | set(k.template_params)


def load_kernels(target: str, pairs: dict[str, Any], pick: str | None = None
                 ) -> list[tuple[str, Specialization]]:
    """Resolve ``FILE:NAME`` with ``name=value`` pairs to ``[(label, specialization)]``."""
    obj, attr = _resolve(target)
    if isinstance(obj, Kernel):
        kernels, builder_params = {obj.name: obj}, set()
    elif callable(obj):
        result, builder_params = _call_builder(obj, attr, pairs)
        kernels = _as_kernels(result, f"builder {attr}")
    else:
        raise TargetError(f"{target} is a {type(obj).__name__}; expected a Kernel or a function "
                          "returning one")
    if pick is not None:
        if pick not in kernels:
            raise TargetError(f"--kernel {pick}: {attr} gives {', '.join(kernels)}")
        kernels = {pick: kernels[pick]}
    kernel_names = set().union(*map(_names, kernels.values()))
    unknown = set(pairs) - builder_params - kernel_names
    if unknown:
        raise TargetError(f"{', '.join(sorted(unknown))}: not a parameter of {attr} or of its "
                          f"kernel; accepted names: "
                          f"{', '.join(sorted(builder_params | kernel_names)) or 'none'}")
    out = []
    for label, k in kernels.items():
        kw = {n: v for n, v in pairs.items() if n in _names(k)}
        missing = [d for d in k.dims if d not in kw]
        missing += [t for t, d in k.template_params.items()
                    if d is inspect.Parameter.empty and t not in kw]
        if missing:
            raise TargetError(f"kernel {k.name} needs " + " ".join(f"{m}=..." for m in missing))
        for d in k.dims:
            if isinstance(kw[d], bool) or not isinstance(kw[d], int) or kw[d] <= 0:
                raise TargetError(f"dim {d} of kernel {k.name} must be a positive int, "
                                  f"got {d}={kw[d]!r}")
        out.append((label, k.specialize(**kw)))
    return out


# ---------------------------------------------------------------- commands
def write_output(path: str, text: str) -> None:
    """Write ``text`` to ``path``; ``TargetError`` saying why when it cannot be written."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TargetError(f"-o {path}: directory {folder} does not exist; create it first")
    if os.path.isdir(path):
        raise TargetError(f"-o {path} is a directory; expected a file name")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise TargetError(f"-o {path}: cannot write: {e.strerror or e}") from None


def _cmd_ptx(args: argparse.Namespace) -> int:
    specs = load_kernels(args.target, parse_pairs(args.pairs), args.kernel)
    if args.output and len(specs) > 1:
        raise TargetError(f"{args.target} gives {len(specs)} kernels "
                          f"({', '.join(label for label, _ in specs)}); pick one with --kernel")
    texts = [s.ptx(args.lineinfo) for _, s in specs]
    if args.output:
        write_output(args.output, texts[0])
        return 0
    for (label, _), text in zip(specs, texts):
        if len(specs) > 1:
            sys.stdout.write(f"// ---- kernel {label} ----\n")
        sys.stdout.write(text)
    return 0


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _cmd_check(args: argparse.Namespace) -> int:
    specs = load_kernels(args.target, parse_pairs(args.pairs), args.kernel)
    rows, warnings, exe = [], [], None
    for _, spec in specs:
        report = ptxas.check(spec)
        exe = report.ptxas
        lines = spec.ptx().count("\n")
        warnings += report.warnings
        for e in report.entries:
            rows.append([e.name, e.arch, str(e.registers), str(e.smem), str(spec.smem),
                         str(e.spill_stores), str(e.spill_loads), str(e.stack), str(e.barriers),
                         str(lines)])
    print(f"ptxas {ptxas.ptxas_version(exe)} ({exe}); sizes in bytes")
    print(_table(["entry", "arch", "registers", "smem static", "smem dynamic", "spill stores",
                  "spill loads", "stack", "barriers", "PTX lines"], rows))
    for w in warnings:
        print(w)
    return 0


# ---------------------------------------------------------------- doctor
def _cuda_driver() -> tuple[str, list[str]]:
    """(driver line, GPU lines) through ``pyptx.driver`` (the one driver binding, opened here
    only); imports no framework."""
    from . import driver

    if driver.cuda() is None:
        return f"unavailable ({driver.unavailable_reason()})", []
    v = driver.driver_version()
    line = f"CUDA {v // 1000}.{v % 1000 // 10}"
    gpus = []
    for i in range(driver.device_count()):
        major, minor = driver.device_capability(i)
        gpus.append(f"{i}: {driver.device_name(i)}, sm_{major}{minor}, "
                    f"{driver.multiprocessor_count(i)} SMs, "
                    f"{driver.device_total_memory(i) / 2**30:.1f} GiB")
    return line, gpus or ["none (the driver reports 0 devices)"]


Rows = list[tuple[str, str]]


def _driver_rows() -> Rows:
    driver, gpus = _cuda_driver()
    return [("cuda driver", driver)] + [("gpus" if i == 0 else "", g)
                                         for i, g in enumerate(gpus or ["none"])]


def _package_rows() -> Rows:
    import pyptx

    rows = [("pyptx", f"{__version__} ({os.path.dirname(pyptx.__file__)})")]
    for dist in PACKAGES:
        try:
            rows.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            rows.append((dist, "not installed"))
    return rows


def _runtime_rows() -> Rows:
    from .runtimes import available

    found = available()
    if not found:
        return [("runtimes", 'none (pip install "pyptx-core[torch]" or "pyptx-core[jax]")')]
    return [("runtimes" if i == 0 else "", f"{name} -> {ep.value}")
            for i, (name, ep) in enumerate(sorted(found.items()))]


def _ptxas_rows() -> Rows:
    exe = ptxas.find_ptxas()
    if exe is None:
        return [("ptxas", f"not found; install it with {ptxas.INSTALL_HINT} "
                          f"(or set ${ptxas.ENV_VAR})")]
    return [("ptxas", f"{exe} ({ptxas.ptxas_version(exe)})")]


def _compiler_rows() -> Rows:
    from . import driver, jit

    if driver.cuda() is None:
        return [("compiler", "none (no CUDA driver)")]
    comp = jit.compiler()
    if comp is not None:
        return [("compiler", f"ptxas {comp[1]} (cubins cached on disk)")]
    return [("compiler", "the CUDA driver, when a module loads (no ptxas no newer than the "
                         "driver; pyptx caches no cubins)")]


def _cmd_doctor(args: argparse.Namespace) -> int:
    probes: list[tuple[str, Callable[[], Rows]]] = [
        ("python", lambda: [("python", f"{platform.python_version()} ({sys.executable})"),
                            ("platform", platform.platform())]),
        ("packages", _package_rows),
        ("runtimes", _runtime_rows),
        ("ptxas", _ptxas_rows),
        ("cuda driver", _driver_rows),
        ("compiler", _compiler_rows),
    ]
    rows: Rows = []
    for label, probe in probes:
        try:
            rows += probe()
        except Exception as e:
            rows.append((label, f"probe failed: {type(e).__name__}: {e}"))
    width = max(len(label) for label, _ in rows) + 2
    for label, text in rows:
        print(f"{label:<{width}}{text}".rstrip())
    return 0


# ---------------------------------------------------------------- entry point
def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    top = argparse.ArgumentParser(
        prog="pyptx", formatter_class=fmt,
        description="Print, check and diagnose pyptx kernels.",
        epilog=f"examples:\n  pyptx ptx {EXAMPLE}\n  pyptx check {EXAMPLE}\n  pyptx doctor")
    top.add_argument("--version", action="version", version=f"pyptx {__version__}")
    sub = top.add_subparsers(dest="command", required=True,
                             metavar="{ptx,check,doctor,transpile}")

    def target_command(name: str, summary: str, details: str, example: str
                       ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=details + "\n\n" + _TARGET_HELP,
                           formatter_class=fmt, epilog=f"example:\n  {example}")
        p.add_argument("target", metavar="FILE:NAME", help="kernel or builder, e.g. kernels.py:build")
        p.add_argument("pairs", nargs="*", metavar="name=value",
                       help="builder arguments, kernel dims and template parameters")
        p.add_argument("--kernel", metavar="K",
                       help="when the builder returns several kernels, use only K (name or dict key)")
        return p

    p = target_command("ptx", "print the PTX of a kernel", "Print the PTX of a kernel.",
                       f"pyptx ptx {EXAMPLE} -o rms_norm.ptx")
    p.add_argument("--lineinfo", action="store_true",
                   help="add .file/.loc directives pointing at the Python source")
    p.add_argument("-o", "--output", metavar="OUT", help="write the PTX to OUT instead of stdout")
    p.set_defaults(func=_cmd_ptx)

    p = target_command(
        "check", "assemble with ptxas and print each entry's resources",
        "Assemble a kernel with ptxas (-v --gpu-name ARCH, the kernel's arch) and print, per\n"
        "entry: registers, static and dynamic shared memory, spill stores and loads, stack\n"
        "frame, barriers and the PTX line count. ptxas is found through $PYPTX_PTXAS, PATH,\n"
        "$CUDA_HOME, /usr/local/cuda or the nvidia-cuda-nvcc wheel.\n\n"
        "Exit status: 0 ok; 1 ptxas rejected the PTX (each error names the Python line\n"
        "that emitted it) or another error; 2 no ptxas: pip install \"pyptx-core[ptxas]\".",
        f"pyptx check {EXAMPLE}")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("doctor", formatter_class=fmt,
                       help="report Python, pyptx packages, plugins, ptxas, driver and GPUs",
                       description="Report Python, the pyptx packages and runtime plugins, "
                       "ptxas, and the CUDA driver\nand GPUs (no framework is imported).", epilog="example:\n  pyptx doctor")
    p.set_defaults(func=_cmd_doctor)

    from . import transpile as _transpile  # the parser and transpiler (pyptx.transpile)
    p = sub.add_parser("transpile", formatter_class=fmt, help="turn a PTX file into pyptx code",
                       description=_transpile.__doc__,
                       epilog="example:\n  pyptx transpile kernel.ptx --sugar -o kernel_ptx.py")
    _transpile.add_arguments(p)
    p.set_defaults(func=_transpile.run)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run the ``pyptx`` command; return its exit status."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "pairs") or any(x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.pairs += extra
    try:
        return args.func(args)
    except ToolchainError as e:
        print(f"pyptx: error: {e}", file=sys.stderr)
        return 2
    except PyptxError as e:
        print(f"pyptx: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``pyptx ptx ... | head``): silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:  # a bug in pyptx: one line, the traceback only on request
        if os.environ.get("PYPTX_DEBUG"):
            raise
        print(f"pyptx: internal error: {type(e).__name__}: {e} (PYPTX_DEBUG=1 shows the "
              "traceback; please report it)", file=sys.stderr)
        return 3
