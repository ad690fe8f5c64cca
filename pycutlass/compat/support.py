"""Helpers for the modules that keep PyCUTLASS 2.11's import paths (``pycutlass.gemm_operation`` and friends)."""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import types

_HOME = "pycutlass.compat."

# PyCUTLASS 2.11's modules imported these at the top, and its scripts use them through ``from ... import *``
# without importing them (examples/40_cutlass_py/customizable/conv2d.py calls torch.* after
# ``from pycutlass.conv2d_operation import *``). They are imported only when such a name is asked for.
_LIBRARIES = ("torch", "rmm")

# rmm 23.06 dropped the top-level allocator names PyCUTLASS-era scripts call (``rmm.rmm_cupy_allocator``); they live
# in rmm.allocators now. The ``rmm`` handed out above is rmm itself with those names added back.
_RMM_MOVED = {"rmm_cupy_allocator": "rmm.allocators.cupy", "rmm_torch_allocator": "rmm.allocators.torch",
              "RMMNumbaManager": "rmm.allocators.numba"}


class _LegacyRmm(types.ModuleType):
    """``rmm`` as PyCUTLASS 2.11's namespaces carried it: every attribute of the installed rmm, plus the
    allocators it has since moved to submodules."""

    def __init__(self):
        super().__init__("rmm", "rmm, with the allocator names of rmm < 23.06 (see pycutlass.compat.support)")

    def __getattr__(self, name: str):
        if name in _RMM_MOVED:
            return getattr(importlib.import_module(_RMM_MOVED[name]), name)
        return getattr(importlib.import_module("rmm"), name)

    def __dir__(self):
        return sorted(set(dir(importlib.import_module("rmm"))) | set(_RMM_MOVED))


def library(name: str):
    """One of ``_LIBRARIES``, imported now."""
    return _LegacyRmm() if name == "rmm" else importlib.import_module(name)


def star_names(names: list[str]) -> list[str]:
    """``__all__`` for a PyCUTLASS 2.11 module: its names, plus the libraries above that are installed."""
    return names + [lib for lib in _LIBRARIES if importlib.util.find_spec(lib) is not None]


def missing_names(module: str, replacements: dict[str, str]):
    """A module ``__getattr__`` that names the pycutlass spelling of what PyCUTLASS had and pycutlass has not, and
    hands out the libraries PyCUTLASS's module namespaces carried (imported on first use)."""
    module = public_name(module)

    def __getattr__(name: str):
        if name in _LIBRARIES:
            return library(name)
        if name in replacements:
            raise AttributeError(f"{module}.{name} was part of PyCUTLASS 2.11 and does not exist in pycutlass: "
                                 f"{replacements[name]} (see docs/porting.md)")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def public_name(module: str) -> str:
    """The PyCUTLASS 2.11 path of a compat module: ``pycutlass.compat.library`` -> ``pycutlass.library``."""
    return "pycutlass." + module.removeprefix(_HOME) if module.startswith(_HOME) else module


def alias(name: str, module: types.ModuleType) -> None:
    """Make the module path ``name`` the very module ``module`` (and, for a package, each of its submodules), so
    ``import``, ``from ... import *``, attributes and monkeypatching behave as on ``module`` itself."""
    sys.modules[name] = module
    for found in pkgutil.iter_modules(getattr(module, "__path__", [])):
        sys.modules[f"{name}.{found.name}"] = importlib.import_module(f"{module.__name__}.{found.name}")
