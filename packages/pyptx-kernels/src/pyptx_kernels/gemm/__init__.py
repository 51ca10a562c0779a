"""Dense GEMM: ``matmul`` and ``linear`` (``api``); the kernel's plan (``config``), tile
scheduler (``scheduler``), main loops (``mainloop``), epilogue (``epilogue``), builder
(``kernel``), host plumbing (``host``) and float64 ``reference``. Names load at first use."""

_NAMES = {
    "matmul": "api", "linear": "api",
    "build_gemm": "kernel", "gemm_tuned": "kernel",
    "GemmConfig": "config", "GEMM_CONFIGS": "config",
    "reference": "reference",
}

__all__ = list(_NAMES)


def __getattr__(name):
    import importlib

    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    globals()[name] = value
    return value
