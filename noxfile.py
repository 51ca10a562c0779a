"""Every test, lint, build and matrix session of the pyptx monorepo (run: ``nox -l``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "no"
nox.options.sessions = ["tests", "lint"]

ROOT = Path(__file__).resolve().parent
PACKAGES = ["pyptx-core", "pyptx-shim", "pyptx-torch", "pyptx-jax"]
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
CONSTRAINTS = ("-c", "constraints.txt")
WHEELHOUSE = ROOT / "dist" / "wheelhouse"


def _editable(*packages: str) -> list[str]:
    """Pip arguments installing each named directory of packages/ in editable mode."""
    return [arg for package in packages for arg in ("-e", f"packages/{package}")]


def _test_dirs(*packages: str) -> list[str]:
    """The tests/ directory of each named package."""
    return [f"packages/{package}/tests" for package in packages]


def _core_tests(session: nox.Session) -> None:
    """Install core and the shim editable, then run their tests (CPU only)."""
    session.install(*CONSTRAINTS, *_editable("pyptx-core[test]", "pyptx-shim"))
    session.run("pytest", *_test_dirs("pyptx-core", "pyptx-shim"), "-q", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Core and shim tests on the interpreter that runs nox."""
    _core_tests(session)


@nox.session(python=PYTHONS)
def matrix(session: nox.Session) -> None:
    """Core and shim tests on every supported Python."""
    _core_tests(session)


@nox.session(python="3.11")
def plugins(session: nox.Session) -> None:
    """All four packages with CPU torch and CPU JAX: plugin discovery, the custom op under
    fake tensors, JAX lowering, the error matrix (GPU tests skip here)."""
    session.install(*CONSTRAINTS, "torch==2.13.0")
    session.install(*CONSTRAINTS, *_editable("pyptx-core[test]", "pyptx-shim", "pyptx-torch",
                                             "pyptx-jax"))
    session.run("pytest", *_test_dirs(*PACKAGES), "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff over the packages, examples, benchmarks and this file."""
    session.install("ruff")
    paths = ["packages", "examples", "benchmarks", "noxfile.py"]
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


@nox.session(python="3.11")
def install(session: nox.Session) -> None:
    """The user's install: wheels into a wheelhouse, then `pip install "pyptx-core[torch]"`
    and `[jax]` in fresh virtualenvs, each checked to resolve its plugin."""
    tmp = Path(session.create_tmp()).resolve()
    wheelhouse = tmp / "wheelhouse"
    _build_wheels(session, wheelhouse)
    links = ["--find-links", str(wheelhouse)]
    if Path("/opt/wheels").is_dir():  # this workplace's local CPU torch wheel
        links += ["--find-links", "/opt/wheels"]
    for extra in ("torch", "jax"):
        venv = tmp / f"venv-{extra}"
        shutil.rmtree(venv, ignore_errors=True)
        session.run("python", "-m", "venv", str(venv))
        py = str(venv / "bin" / "python")
        session.run(py, "-m", "pip", "install", "-q", *CONSTRAINTS, *links,
                    f"pyptx-core[{extra}]", external=True)
        session.run(py, str(ROOT / "tools" / "install_check.py"), extra, external=True)


@nox.session
def demo(session: nox.Session) -> None:
    """Print the RMSNorm example's PTX and its ptxas report."""
    core = "pyptx-core" if shutil.which("ptxas") else "pyptx-core[ptxas]"
    session.install(*CONSTRAINTS, *_editable(core))
    session.run("pyptx", "check", "examples/hopper/rms_norm.py:build_rms_norm", "B=2048", "N=8192")
    session.run("pyptx", "ptx", "examples/hopper/rms_norm.py:build_rms_norm", "B=16", "N=512")


@nox.session
def benchmarks(session: nox.Session) -> None:
    """Time tracing and PTX emission (prints a table; never gates CI)."""
    session.install(*CONSTRAINTS, *_editable("pyptx-core"))
    session.run("python", "benchmarks/trace.py", *session.posargs)
    session.run("python", "benchmarks/parse.py")


#: The documentation toolchain, pinned: MkDocs + Material render the site, mkdocstrings
#: (griffe) reads the docstrings for the reference pages.
DOCS_DEPS = ("mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings[python]==1.0.8",
             "mkdocstrings-python==2.0.11", "griffelib==2.4.1", "pymdown-extensions==13.1")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (docs/, mkdocs.yml) into build/site with
    `mkdocs build --strict`, after checking that every public name has a docstring and a
    reference entry. The pages' code blocks run in the tests sessions (test_docs.py)."""
    session.install(*CONSTRAINTS, *DOCS_DEPS, "pytest", *_editable("pyptx-core"))
    session.install("--no-deps", *_editable("pyptx-torch", "pyptx-jax"))  # read, not run
    session.run("pytest", "packages/pyptx-core/tests/test_docs_reference.py", "-q")
    session.run("mkdocs", "build", "--strict", *session.posargs,
                env={"NO_MKDOCS_2_WARNING": "1"})
