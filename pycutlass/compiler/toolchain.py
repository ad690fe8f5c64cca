"""Where the compilers and headers are, and their versions (all part of the cache key).

Overrides: ``CUTLASS_PATH`` (a CUTLASS checkout or the headers' parent), ``CUDA_HOME``/``CUDA_PATH``.
Defaults: the pinned ``nvidia-cutlass`` wheel's headers (located, never imported) and the CUDA toolkit, or for
NVRTC without a toolkit, the header wheels nvidia-cuda-runtime and nvidia-cuda-cccl.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import ToolchainError


@functools.lru_cache(maxsize=None)
def cutlass_include_dirs() -> tuple[Path, ...]:
    root = os.environ.get("CUTLASS_PATH")
    if root:
        base = Path(root)
        include = base / "include" if (base / "include" / "cutlass").is_dir() else base
        if not (include / "cutlass" / "cutlass.h").is_file():
            raise ToolchainError(f"CUTLASS_PATH={root} holds no include/cutlass/cutlass.h")
        return (include,)
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("CUTLASS headers not found: install the pinned wheel (pip install "
                             "nvidia-cutlass==4.2.0.0 --no-deps) or set CUTLASS_PATH to a CUTLASS checkout")
    package = Path(list(spec.submodule_search_locations)[0])
    include = package / "source" / "include"
    if not (include / "cutlass" / "cutlass.h").is_file():
        raise ToolchainError(f"the cutlass_library package at {package} has no source/include/cutlass/cutlass.h")
    return (include,)


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    text = (cutlass_include_dirs()[0] / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


def cuda_home() -> Path | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    nvcc = shutil.which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    default = Path("/usr/local/cuda")
    return default if default.is_dir() else None


@functools.lru_cache(maxsize=None)
def cuda_include_dirs() -> tuple[Path, ...]:
    """CUDA headers for device compiles: the toolkit's, else the pip header wheels."""
    home = cuda_home()
    if home and (home / "include" / "cuda_runtime.h").is_file():
        dirs = [home / "include"]
        if (home / "include" / "cccl").is_dir():
            dirs.append(home / "include" / "cccl")
        return tuple(dirs)
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError as exc:
        raise ToolchainError("no CUDA toolkit found and cuda-pathfinder is not installed to find header wheels") \
            from exc
    dirs = []
    for lib in ("cudart", "cccl"):
        found = find_nvidia_header_directory(lib)
        if not found:
            raise ToolchainError(f"no CUDA toolkit found and no '{lib}' header wheel; install nvidia-cuda-runtime "
                                 f"and nvidia-cuda-cccl (13.0.x) or set CUDA_HOME")
        dirs.append(Path(found))
    return tuple(dict.fromkeys(dirs))


@functools.lru_cache(maxsize=None)
def nvcc_path() -> Path:
    home = cuda_home()
    candidates = [home / "bin" / "nvcc"] if home else []
    which = shutil.which("nvcc")
    if which:
        candidates.append(Path(which))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ToolchainError("nvcc not found (looked in $CUDA_HOME/bin and PATH); install the CUDA toolkit or switch "
                         "to the NVRTC backend with pycutlass.compiler.nvrtc()")


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    out = subprocess.run([str(nvcc_path()), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"V(\d+\.\d+\.\d+)", out)
    return match.group(1) if match else out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise ToolchainError("NVRTC needs cuda-bindings and nvidia-cuda-nvrtc (pip install)") from exc
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"nvrtcVersion failed: {err!r}")
    try:  # the API reports major.minor only; the wheel pins the patch level
        from importlib.metadata import version

        return f"{major}.{minor} (nvidia-cuda-nvrtc {version('nvidia-cuda-nvrtc')})"
    except Exception:
        return f"{major}.{minor}"


def fingerprint(backend_name: str) -> dict:
    """Everything about the toolchain that changes a binary, for cache keys."""
    compiler = nvcc_version() if backend_name == "nvcc" else nvrtc_version()
    return {"compiler": f"{backend_name} {compiler}", "cutlass": cutlass_version(),
            "cuda_headers": [str(d) for d in cuda_include_dirs()]}
