"""Helpers for the modules that keep PyCUTLASS 2.11's import paths (``pycutlass.gemm_operation`` and friends)."""
from __future__ import annotations


def missing_names(module: str, replacements: dict[str, str]):
    """A module ``__getattr__`` that names the pycutlass spelling of what PyCUTLASS had and pycutlass has not."""
    def __getattr__(name: str):
        if name in replacements:
            raise AttributeError(f"{module}.{name} was part of PyCUTLASS 2.11 and does not exist in pycutlass: "
                                 f"{replacements[name]} (see docs/porting.md)")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
