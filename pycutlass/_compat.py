"""Helpers for the modules that keep PyCUTLASS 2.11's import paths (``pycutlass.gemm_operation`` and friends)."""
from __future__ import annotations


import importlib
import importlib.util

# PyCUTLASS 2.11's modules imported these at the top, and its scripts use them through ``from ... import *``
# without importing them (examples/40_cutlass_py/customizable/conv2d.py calls torch.* after
# ``from pycutlass.conv2d_operation import *``). They are imported only when such a name is asked for.
_LIBRARIES = ("torch",)


def star_names(names: list[str]) -> list[str]:
    """``__all__`` for an alias module: its names, plus the libraries above that are installed."""
    return names + [lib for lib in _LIBRARIES if importlib.util.find_spec(lib) is not None]


def missing_names(module: str, replacements: dict[str, str]):
    """A module ``__getattr__`` that names the pycutlass spelling of what PyCUTLASS had and pycutlass has not, and
    hands out the libraries PyCUTLASS's module namespaces carried (imported on first use)."""
    def __getattr__(name: str):
        if name in _LIBRARIES:
            return importlib.import_module(name)
        if name in replacements:
            raise AttributeError(f"{module}.{name} was part of PyCUTLASS 2.11 and does not exist in pycutlass: "
                                 f"{replacements[name]} (see docs/porting.md)")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
