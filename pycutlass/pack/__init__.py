"""Kernel packs: a tuning run's selected kernels compiled once, shipped as one file (or a wheel), and dispatched
with no compiler: ``pack = pycutlass.load_pack("llama.pack"); pack.gemm(a, b)``. See docs/packs.md.

    pycutlass pack build --db sweep.db --select 0.97 --target 90 llama.pack     # any machine, no GPU
    pycutlass pack info llama.pack
    pycutlass pack verify llama.pack                                            # GPU: every kernel vs float64
    pycutlass pack wheel llama.pack --name llama3-8b-h200                       # pip-installable
"""
from __future__ import annotations

from pathlib import Path

from ..errors import ArgumentError
from .classes import CallClass, CallQuery
from .format import (PackCoverageError, PackDamagedError, PackError, PackSourceError, PackTargetError,
                     emitter_digest)
from .pack import POLICIES, Pack

# Building and wheels are imported when first asked for: a serving process that loads a pack never needs them.
_LAZY = {"PackChoice": "build", "build_pack": "build", "write_pack": "build", "ENTRY_POINT_GROUP": "wheel",
         "build_wheel": "wheel", "installed_packs": "wheel"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_pack(path_or_name, *, session=None, policy: str = "nearest") -> Pack:
    """Open a pack: a ``.pack`` file, or the name of one installed as a wheel (``pycutlass.packs()``). Checks the
    manifest now and each kernel when it is first used; nothing is compiled."""
    if isinstance(path_or_name, Pack):
        return path_or_name
    if not isinstance(path_or_name, (str, Path)):
        raise ArgumentError(f"load_pack takes a .pack path or an installed pack's name, got "
                            f"{type(path_or_name).__name__}")
    path = Path(path_or_name)
    if not path.exists() and isinstance(path_or_name, str) and "/" not in path_or_name:
        from .wheel import installed_packs

        installed = installed_packs()
        if path_or_name in installed:
            path = installed[path_or_name]
        elif not path.suffix:
            raise ArgumentError(f"no pack file {path_or_name!r} and no installed pack of that name; installed: "
                                f"{sorted(installed) or 'none'}")
    return Pack(path, session=session, policy=policy)


__all__ = ["ENTRY_POINT_GROUP", "POLICIES", "CallClass", "CallQuery", "Pack", "PackCoverageError",
           "PackChoice", "PackDamagedError", "PackError", "PackSourceError", "PackTargetError", "build_pack",
           "build_wheel",
           "emitter_digest", "installed_packs", "load_pack", "write_pack"]
