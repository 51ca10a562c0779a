"""Every test, lint, build and matrix session of the pyptx monorepo (run: ``nox -l``)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "no"
nox.options.sessions = ["tests", "lint"]

ROOT = Path(__file__).resolve().parent
PACKAGES = ["pyptx-core", "pyptx-shim", "pyptx-torch", "pyptx-jax", "pyptx-kernels"]
#: The packages the CPU-only sessions (tests, matrix) install and test: no torch, no JAX
#: (their tests importorskip or are GPU-marked).
BASE = ["pyptx-core", "pyptx-shim", "pyptx-kernels"]
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
CONSTRAINTS = ("-c", "constraints.txt")
WHEELHOUSE = ROOT / "dist" / "wheelhouse"
RUFF = "ruff==0.17.6"


def _editable(*packages: str) -> list[str]:
    """Pip arguments installing each named directory of packages/ in editable mode."""
    return [arg for package in packages for arg in ("-e", f"packages/{package}")]


def _test_dirs(*packages: str) -> list[str]:
    """The tests/ directory of each named package, then the examples' (``examples/tests``)."""
    return [f"packages/{package}/tests" for package in packages] + ["examples/tests"]


def _base_tests(session: nox.Session, *selection: str) -> None:
    """Install core, the shim and the kernel library editable, then run their tests (CPU
    only; ``selection``: extra pytest arguments, e.g. ``-m "not slow"``)."""
    session.install(*CONSTRAINTS, *_editable("pyptx-core[test]", "pyptx-shim",
                                             "pyptx-kernels[test]"))
    session.run("pytest", *_test_dirs(*BASE), "-q", "-rs", "-p", "no:cacheprovider",
                *selection, *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Core, shim and kernel-library tests on the interpreter that runs nox, the long
    simulator cases (marker ``slow``) included: the one session that runs those."""
    _base_tests(session)


@nox.session(python=PYTHONS)
def matrix(session: nox.Session) -> None:
    """Core, shim and kernel-library tests on every supported Python, less the ``slow``
    simulator cases (the tests session runs them)."""
    _base_tests(session, "-m", "not slow")


@nox.session(python="3.11")
def plugins(session: nox.Session) -> None:
    """All five packages with CPU torch and CPU JAX: plugin discovery, the custom ops under
    fake tensors, JAX lowering, the error matrix, the kernel library's torch and JAX paths
    (GPU tests skip here; the ``slow`` simulator cases run in the tests session)."""
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, *_editable("pyptx-core[test]", "pyptx-shim", "pyptx-torch",
                                             "pyptx-jax", "pyptx-kernels[test]"))
    session.run("pytest", *_test_dirs(*PACKAGES), "-q", "-rs", "-p", "no:cacheprovider",
                "-m", "not slow", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff over the packages, examples, benchmarks, tools and this file."""
    session.install(RUFF)
    paths = ["packages", "examples", "benchmarks", "tools", "noxfile.py"]
    session.run("ruff", "check", *paths, *session.posargs)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build a wheel of every package into dist/wheelhouse."""
    _build_wheels(session, WHEELHOUSE)
    for wheel in sorted(WHEELHOUSE.glob("*.whl")):
        session.log(f"built {wheel.relative_to(ROOT)}")


def _build_wheels(session: nox.Session, wheelhouse: Path) -> None:
    session.install("hatch")
    shutil.rmtree(wheelhouse, ignore_errors=True)
    for package in PACKAGES:
        with session.chdir(ROOT / "packages" / package):
            session.run("hatch", "build", "-t", "wheel", str(wheelhouse))


#: The user's installs the install session proves, each in a fresh virtualenv: the extras
#: of pyptx-core, and the name tools/install_check.py checks them under.
INSTALLS = {"torch": "pyptx-core[torch]", "jax": "pyptx-core[jax]",
            "kernels": "pyptx-core[kernels,torch]"}


@nox.session(python="3.11")
def install(session: nox.Session) -> None:
    """The user's install: wheels into a wheelhouse, then `pip install "pyptx-core[torch]"`,
    `[jax]` and `[kernels,torch]` in fresh virtualenvs, each checked by
    tools/install_check.py from a directory outside the checkout."""
    tmp = Path(session.create_tmp()).resolve()
    wheelhouse = tmp / "wheelhouse"
    _build_wheels(session, wheelhouse)
    links = ["--find-links", str(wheelhouse)]
    if Path("/opt/wheels").is_dir():  # this workplace's local CPU torch wheel
        links += ["--find-links", "/opt/wheels"]
    outside = tempfile.mkdtemp(prefix="pyptx-install-check-")  # a cwd outside the checkout
    for check, requirement in INSTALLS.items():
        venv = tmp / f"venv-{check}"
        shutil.rmtree(venv, ignore_errors=True)
        session.run("python", "-m", "venv", str(venv))
        py = str(venv / "bin" / "python")
        session.run(py, "-m", "pip", "install", "-q", *CONSTRAINTS, *links, requirement,
                    external=True)
        with session.chdir(outside):
            session.run(py, str(ROOT / "tools" / "install_check.py"), check, external=True)
    shutil.rmtree(outside, ignore_errors=True)


DEMO = "examples/hopper/rms_norm.py:build_rms_norm"


@nox.session
def demo(session: nox.Session) -> None:
    """Print the RMSNorm example's PTX (a small row), then ptxas's report of the seed shape
    last, with what its register and spill figures mean."""
    core = "pyptx-core" if shutil.which("ptxas") else "pyptx-core[ptxas]"
    session.install(*CONSTRAINTS, *_editable(core))
    session.run("pyptx", "ptx", DEMO, "B=16", "N=512")
    session.log("The PTX above is RMSNorm for N=512 (16 values per lane). ptxas's report of the "
                "seed shape, B=2048 N=8192:")
    session.run("pyptx", "check", DEMO, "B=2048", "N=8192")
    session.log(
        "How to read it: at N=8192 each lane of the one-warp CTA holds its 256 row values in "
        "registers, more than the 255 a thread may have. ptxas gives it all 255 and spills the "
        "rest to local memory ('spill stores'/'spill loads' count those instructions, 'stack' "
        "is the local frame in bytes); a spill is a round trip through L1/L2, so a kernel "
        "meant to be bandwidth-bound should show 0 there. build_rms_norm_fast in the same "
        "file spreads a row over a whole CTA instead, so each thread holds a few values.")


@nox.session
def fuzz(session: nox.Session) -> None:
    """Fuzz the parser, the transpiler and the Reg sugar with 100,000 cases (tools/fuzz.py);
    prints the counts; fails if anything but a PyptxError escaped. `-- --cases N --seed S`."""
    session.install(*CONSTRAINTS, *_editable("pyptx-core"))
    session.run("python", "tools/fuzz.py", *(session.posargs or ["--cases", "100000"]))


@nox.session(venv_backend="none")
def dev(session: nox.Session) -> None:
    """Build .venv in the checkout: the five packages editable, torch (the pin of
    constraints.txt) and CPU JAX. torch comes from pip's configured index, or from the index
    named by $PYPTX_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu, where PyPI's
    torch would be the CUDA build); the session says which build it got. `nox -s dev --
    cuda` takes torch from pip's index (never $PYPTX_TORCH_INDEX) and fails unless that
    build has CUDA (for a GPU machine). Then: `. .venv/bin/activate && pytest packages examples/tests -q`."""
    cuda = "cuda" in session.posargs
    venv = ROOT / ".venv"
    session.run(sys.executable, "-m", "venv", str(venv), external=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q"]
    session.run(*pip, "--upgrade", "pip", external=True)
    index = os.environ.get("PYPTX_TORCH_INDEX")
    session.run(*pip, *CONSTRAINTS, *([] if cuda or not index else ["--index-url", index]),
                "torch", external=True)
    build = session.run(python, "-c", "import torch; print(torch.__version__, "
                        "torch.version.cuda or 'cpu')", external=True, silent=True).strip()
    session.log(f"torch {build}")
    if cuda and build.endswith(" cpu"):
        session.error(f"`dev -- cuda` asked for a CUDA torch, the index gave {build}")
    session.run(*pip, *CONSTRAINTS, "jax", "ruff", "nox",
                *_editable("pyptx-core[test]", "pyptx-shim", "pyptx-torch", "pyptx-jax",
                           "pyptx-kernels[test]"), external=True)
    session.log(f"ready: . {venv.relative_to(ROOT)}/bin/activate")


@nox.session
def benchmarks(session: nox.Session) -> None:
    """Time tracing and PTX emission (prints a table; never gates CI)."""
    session.install(*CONSTRAINTS, *_editable("pyptx-core"))
    session.run("python", "benchmarks/trace.py", *session.posargs)
    session.run("python", "benchmarks/parse.py")


#: The documentation toolchain, pinned: MkDocs + Material render the site, mkdocstrings
#: (griffe) reads the docstrings for the reference pages (ruff formats their signatures).
DOCS_DEPS = ("mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings[python]==1.0.8",
             "mkdocstrings-python==2.0.11", "griffelib==2.4.1", "pymdown-extensions==13.1",
             RUFF)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (docs/, mkdocs.yml) into build/site with
    `mkdocs build --strict`, after checking that every public name has a docstring and a
    reference entry. The pages' code blocks run in the tests sessions (test_docs.py)."""
    session.install(*CONSTRAINTS, *DOCS_DEPS, "pytest", *_editable("pyptx-core"))
    # read, not run
    session.install("--no-deps", *_editable("pyptx-torch", "pyptx-jax", "pyptx-kernels"))
    session.run("pytest", "packages/pyptx-core/tests/test_docs_reference.py", "-q")
    session.run("mkdocs", "build", "--strict", *session.posargs,
                env={"NO_MKDOCS_2_WARNING": "1"})
