"""Where the compilers and headers are, and their versions (all part of the cache key).

Overrides: ``CUTLASS_PATH`` (a CUTLASS checkout or the headers' parent), ``CUDA_HOME``/``CUDA_PATH``.
Defaults: the pinned ``nvidia-cutlass`` wheel's headers (located, never imported) and the CUDA toolkit, or for
NVRTC without a toolkit, the header wheels nvidia-cuda-runtime, nvidia-cuda-cccl and nvidia-cuda-crt.

The toolkit around an ``nvcc`` found on ``PATH`` is the one nvcc itself reports (``nvcc --dryrun``: its ``TOP``
and ``INCLUDES``), not the directory above the file on ``PATH``, which may be a wrapper script or a symlink farm
(``/usr/local/bin/nvcc`` -> ``/usr/local``). A compiler is only paired with CUDA headers of its own major.minor
version (``CUDART_VERSION`` in ``cuda_runtime_api.h``, ``CUDA_VERSION`` in ``cuda.h``): anything else raises
:class:`ToolchainError`; nvcc given headers of another installation of the same version warns.

Every fact is memoized; :func:`reset` forgets them all (after changing ``PATH``, ``CUDA_HOME`` or
``CUTLASS_PATH``). :func:`fingerprint` gathers what changes a compiled binary, for the cache key.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path

from ..errors import ToolchainError

# The header wheels that stand in for a toolkit for NVRTC (cuda.pathfinder library names).
_PIP_HEADER_LIBS = ("cudart", "cccl")
_PIP_HEADER_PACKAGES = ("nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt")
# The last place :func:`cuda_home` looks (tests point it elsewhere to simulate a machine without a toolkit).
DEFAULT_TOOLKIT = Path("/usr/local/cuda")


class ToolchainWarning(UserWarning):
    """The toolchain is usable but was assembled from parts of different installations."""


def _memoized(fn):
    """functools.lru_cache, registered so that :func:`reset` clears it."""
    cached = functools.lru_cache(maxsize=None)(fn)
    _MEMOIZED.append(cached)
    return cached


_MEMOIZED: list = []


def reset() -> None:
    """Forget every located tool, header directory and version (they are found again when next needed)."""
    for cached in _MEMOIZED:
        cached.cache_clear()


# ---- CUTLASS --------------------------------------------------------------------------------------------------


@_memoized
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


@_memoized
def cutlass_util_include_dir() -> Path:
    """CUTLASS's ``tools/util/include`` beside the headers: SM90 convolution needs ``cutlass/util/packed_stride.hpp``
    from it. Kept out of :func:`cutlass_include_dirs` (only that kind needs it on the include path); part of the
    headers checksum."""
    include = cutlass_include_dirs()[0]
    for candidate in (include.parent / "tools" / "util" / "include", include / "tools" / "util" / "include"):
        if (candidate / "cutlass" / "util" / "packed_stride.hpp").is_file():
            return candidate
    raise ToolchainError(f"no tools/util/include/cutlass/util/packed_stride.hpp beside the CUTLASS headers at "
                         f"{include}")


@_memoized
def cutlass_version() -> str:
    text = (cutlass_include_dirs()[0] / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


@_memoized
def cutlass_headers_checksum() -> str:
    """sha256 over the CUTLASS headers' contents: each file's relative path and the sha256 of its bytes (about 0.1 s
    for the ~800 files, 26 MB; memoized). Contents, not sizes and mtimes: the same wheel installed on two machines
    gets different mtimes, and a cache filled on one must serve the other (compile here, run there)."""
    digest = hashlib.sha256()
    roots = list(cutlass_include_dirs())
    try:
        roots.append(cutlass_util_include_dir())  # packed_stride.hpp, which the SM90 convolution includes
    except ToolchainError:
        pass
    for include in roots:
        for dirpath, dirnames, filenames in os.walk(include):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                digest.update(path.relative_to(include).as_posix().encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


# ---- the CUDA toolkit -----------------------------------------------------------------------------------------


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"could not run {' '.join(cmd)}: {exc}") from exc


@_memoized
def _nvcc_facts(nvcc: str) -> dict:
    """What ``nvcc`` says about itself: version, build, and the real toolkit (TOP, INCLUDES) it uses.

    ``--dryrun`` prints the driver's settings without compiling anything (so a wrapper script or a symlink
    in front of nvcc does not matter). Raises ToolchainError if it does not run as nvcc.
    """
    version = _run([nvcc, "--version"])
    if version.returncode != 0:
        raise ToolchainError(f"{nvcc} --version failed (exit {version.returncode}): "
                             f"{(version.stderr or version.stdout).strip()[:500]}")
    match = re.search(r"V(\d+\.\d+\.\d+)", version.stdout)
    if not match:
        raise ToolchainError(f"{nvcc} --version does not look like nvcc: {version.stdout.strip()[:500]}")
    build = re.search(r"^Build (\S+)", version.stdout, re.M)
    dry = _run([nvcc, "--dryrun", "-cubin", "-x", "cu", os.devnull])
    settings = dict(re.findall(r"^#\$ (\w+)=(.*)$", dry.stderr + dry.stdout, re.M))
    top = settings.get("TOP")
    includes: list[Path] = []
    for tokens in (shlex.split(settings.get("INCLUDES", "")), shlex.split(settings.get("SYSTEM_INCLUDES", ""))):
        for i, token in enumerate(tokens):
            if token.startswith("-I") and len(token) > 2:
                includes.append(Path(token[2:]))
            elif token in ("-I", "-isystem") and i + 1 < len(tokens):
                includes.append(Path(tokens[i + 1]))
    flat = [p.resolve() for p in includes]
    return {
        "version": match.group(1),
        "build": build.group(1) if build else "",
        "top": Path(top).resolve() if top else Path(nvcc).resolve().parent.parent,
        "includes": tuple(dict.fromkeys(p for p in flat if p.is_dir())),
    }


def cuda_home() -> Path | None:
    """``$CUDA_HOME``/``$CUDA_PATH``, else the toolkit of the nvcc on PATH (as nvcc reports it), else
    ``/usr/local/cuda``; None if there is none."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            return _nvcc_facts(nvcc)["top"]
        except ToolchainError:
            pass  # not a working nvcc: look further
    return DEFAULT_TOOLKIT if DEFAULT_TOOLKIT.is_dir() else None


def _toolkit_include_dirs(home: Path) -> tuple[Path, ...] | None:
    """The header directories of the toolkit at ``home``: as its nvcc reports them, else ``include`` (+cccl)."""
    nvcc = home / "bin" / "nvcc"
    if nvcc.is_file() and os.access(nvcc, os.X_OK):
        try:
            dirs = _nvcc_facts(str(nvcc))["includes"]
        except ToolchainError:
            dirs = ()
        if dirs and (dirs[0] / "cuda_runtime.h").is_file():
            return dirs
    if (home / "include" / "cuda_runtime.h").is_file():
        dirs = [home / "include"]
        if (home / "include" / "cccl").is_dir():
            dirs.append(home / "include" / "cccl")
        return tuple(dirs)
    return None


@_memoized
def cuda_include_dirs() -> tuple[Path, ...]:
    """CUDA headers for device compiles: the toolkit's, else the pip header wheels."""
    return _cuda_headers()[0]


@_memoized
def _cuda_headers() -> tuple[tuple[Path, ...], str]:
    """(directories, where they come from: ``toolkit <home>`` or ``pip wheels <versions>``)."""
    home = cuda_home()
    if home:
        dirs = _toolkit_include_dirs(home)
        if dirs:
            return dirs, f"toolkit {home.resolve()}"
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError as exc:
        raise ToolchainError("no CUDA toolkit found and cuda-pathfinder is not installed to find header wheels") \
            from exc
    dirs = []
    for lib in _PIP_HEADER_LIBS:
        found = find_nvidia_header_directory(lib)
        if not found:
            raise ToolchainError(f"no CUDA toolkit found and no '{lib}' header wheel; install nvidia-cuda-runtime "
                                 f"and nvidia-cuda-cccl (13.0.x) or set CUDA_HOME")
        dirs.append(Path(found))
    packages = ", ".join(f"{name} {version}" for name, version in _package_versions(_PIP_HEADER_PACKAGES).items())
    return tuple(dict.fromkeys(dirs)), f"pip wheels ({packages or 'versions unknown'})"


def _package_versions(names) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def cuda_header_version(dirs: tuple[Path, ...] | None = None) -> tuple[int, int]:
    """(major, minor) of the CUDA headers in ``dirs`` (default: :func:`cuda_include_dirs`).

    Read from ``CUDART_VERSION`` (cuda_runtime_api.h) and ``CUDA_VERSION`` (cuda.h); the two must agree.
    """
    return _header_version(tuple(cuda_include_dirs() if dirs is None else dirs))


@_memoized
def _header_version(dirs: tuple[Path, ...]) -> tuple[int, int]:
    found: dict[str, int] = {}
    for header, macro in (("cuda_runtime_api.h", "CUDART_VERSION"), ("cuda.h", "CUDA_VERSION")):
        for directory in dirs:
            path = directory / header
            if path.is_file():
                match = re.search(rf"^\s*#\s*define\s+{macro}\s+(\d+)", path.read_text(errors="replace"), re.M)
                if match:
                    found[f"{path}: {macro}"] = int(match.group(1))
                break
    if not found:
        raise ToolchainError(f"no CUDA version in the CUDA headers at {', '.join(map(str, dirs))} "
                             "(cuda_runtime_api.h: CUDART_VERSION, cuda.h: CUDA_VERSION)")
    if len(set(found.values())) > 1:
        raise ToolchainError("the CUDA headers disagree about their version: "
                             + ", ".join(f"{where} {value}" for where, value in found.items()))
    value = next(iter(found.values()))
    return value // 1000, value % 1000 // 10


# ---- nvcc ----------------------------------------------------------------------------------------------------


@_memoized
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


@_memoized
def nvcc_version() -> str:
    return _nvcc_facts(str(nvcc_path()))["version"]


def nvcc_toolkit() -> Path:
    """The toolkit the nvcc in use belongs to, as nvcc itself reports it (its ``TOP``)."""
    return _nvcc_facts(str(nvcc_path()))["top"]


@_memoized
def nvcc_include_dirs() -> tuple[Path, ...]:
    """:func:`cuda_include_dirs`, checked against nvcc: same CUDA major.minor, else ToolchainError.

    Headers of the same version from another place than nvcc's own toolkit (``CUDA_HOME`` pointing
    elsewhere, or pip wheels) warn with a :class:`ToolchainWarning`.
    """
    dirs, source = _cuda_headers()
    facts = _nvcc_facts(str(nvcc_path()))
    compiler = tuple(int(x) for x in facts["version"].split(".")[:2])
    headers = cuda_header_version(dirs)
    pairing = (f"nvcc {facts['version']} (at {nvcc_path()}, toolkit {facts['top']}) with CUDA "
               f"{headers[0]}.{headers[1]} headers from {source} ({', '.join(map(str, dirs))})")
    if compiler != headers:
        raise ToolchainError(f"version mismatch: {pairing}. Set CUDA_HOME to the toolkit of that nvcc "
                             f"({facts['top']}) or put the matching nvcc first on PATH")
    resolved = {d.resolve() for d in dirs}
    own = set(facts["includes"])
    if own and not resolved & own:
        warnings.warn(f"pairing {pairing}, not with nvcc's own headers ({', '.join(map(str, facts['includes']))})",
                      ToolchainWarning, stacklevel=2)
    return dirs


# ---- NVRTC ---------------------------------------------------------------------------------------------------


@_memoized
def _nvrtc_major_minor() -> tuple[int, int]:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise ToolchainError("NVRTC needs cuda-bindings and nvidia-cuda-nvrtc (pip install)") from exc
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"nvrtcVersion failed: {err!r}")
    return int(major), int(minor)


@_memoized
def nvrtc_version() -> str:
    major, minor = _nvrtc_major_minor()
    # The API reports major.minor only; the wheel pins the patch level.
    package = _package_versions(("nvidia-cuda-nvrtc",)).get("nvidia-cuda-nvrtc")
    return f"{major}.{minor} (nvidia-cuda-nvrtc {package})" if package else f"{major}.{minor}"


@_memoized
def nvrtc_include_dirs() -> tuple[Path, ...]:
    """:func:`cuda_include_dirs`, checked against NVRTC: same CUDA major.minor, else ToolchainError."""
    dirs, source = _cuda_headers()
    compiler = _nvrtc_major_minor()
    headers = cuda_header_version(dirs)
    if compiler != headers:
        raise ToolchainError(f"version mismatch: {describe('nvrtc')}. Install header wheels of CUDA "
                             f"{compiler[0]}.{compiler[1]} (nvidia-cuda-runtime, nvidia-cuda-cccl, nvidia-cuda-crt) "
                             f"or set CUDA_HOME to a CUDA {compiler[0]}.{compiler[1]} toolkit")
    return dirs


# ---- what was paired, and what changes a binary ----------------------------------------------------------------


def describe(backend_name: str) -> str:
    """One line: the compiler and the CUDA and CUTLASS headers it is paired with, and where each comes from."""
    dirs, source = _cuda_headers()
    major, minor = cuda_header_version(dirs)
    if backend_name == "nvcc":
        facts = _nvcc_facts(str(nvcc_path()))
        compiler = f"nvcc {facts['version']} (at {nvcc_path()}, toolkit {facts['top']})"
    elif backend_name == "nvrtc":
        compiler = f"nvrtc {nvrtc_version()}"
    else:
        raise ValueError(f"unknown compiler backend {backend_name!r}; choose 'nvcc' or 'nvrtc'")
    return (f"{compiler} with CUDA {major}.{minor} headers from {source} ({', '.join(map(str, dirs))}) and "
            f"CUTLASS {cutlass_version()} headers at {', '.join(map(str, cutlass_include_dirs()))}")


def fingerprint(backend_name: str) -> dict:
    """Everything about the toolchain of ``backend_name`` that changes a compiled binary (for the cache key).

    No absolute paths: the same toolchain installed elsewhere gives the same fingerprint. Raises
    ToolchainError where a part is missing or the compiler and headers disagree.
    """
    if backend_name == "nvcc":
        dirs = nvcc_include_dirs()
        facts = _nvcc_facts(str(nvcc_path()))
        compiler = {"name": "nvcc", "version": facts["version"], "build": facts["build"]}
    elif backend_name == "nvrtc":
        dirs = nvrtc_include_dirs()
        compiler = {"name": "nvrtc", "version": nvrtc_version()}
    else:
        raise ValueError(f"unknown compiler backend {backend_name!r}; choose 'nvcc' or 'nvrtc'")
    major, minor = cuda_header_version(dirs)
    _, source = _cuda_headers()
    return {
        "compiler": compiler,
        "cuda_headers": {"version": f"{major}.{minor}", "source": source.split(" ", 1)[0] if
                         source.startswith("toolkit") else source},
        "cutlass": {"version": cutlass_version(), "headers_sha256": cutlass_headers_checksum()},
    }
