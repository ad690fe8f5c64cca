"""Compiler backends: CUDA C++ source in, cubin out. Device code only, so no host compiler is ever involved.

Both backends produce the same kind of artifact (a cubin holding each operation's kernel and Params builder),
so the runtime's launch path is shared.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import CompilationError, ToolchainError
from . import toolchain

COMMON_DEFINES = ("-DNDEBUG",)  # without it CUTLASS keeps device asserts (and Hopper warns of slow wgmma)
_LOG_LIMIT = 20000


def clip_log(log: str) -> str:
    """Template errors are long: keep the first error (the head) and the end of the log."""
    if len(log) <= _LOG_LIMIT:
        return log
    half = _LOG_LIMIT // 2
    return f"{log[:half]}\n[... {len(log) - _LOG_LIMIT} characters omitted ...]\n{log[-half:]}"


class Backend:
    name = "backend"

    def flags(self, arch) -> list[str]:
        """``arch``: what follows "sm_" (90, "90", "90a")."""
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def compile(self, source: str, arch: int, unit_name: str) -> bytes:
        raise NotImplementedError

    def include_flags(self) -> list[str]:
        dirs = [*toolchain.cutlass_include_dirs(), *toolchain.cuda_include_dirs()]
        return [f"-I{d}" for d in dirs]


class NvccBackend(Backend):
    name = "nvcc"

    def __init__(self, extra_flags: tuple[str, ...] = ()):
        self.extra_flags = tuple(extra_flags)

    def flags(self, arch: int) -> list[str]:
        return ["-cubin", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-O3", *COMMON_DEFINES, "-std=c++17",
                "--expt-relaxed-constexpr", "-Xptxas=-warn-spills", *self.extra_flags]

    def version(self) -> str:
        return f"nvcc {toolchain.nvcc_version()}"

    def include_flags(self) -> list[str]:
        # Headers checked against nvcc's version (ToolchainError on a mismatch).
        return [f"-I{d}" for d in (*toolchain.cutlass_include_dirs(), *toolchain.nvcc_include_dirs())]

    def compile(self, source: str, arch: int, unit_name: str) -> bytes:
        nvcc = toolchain.nvcc_path()
        with tempfile.TemporaryDirectory(prefix="pycutlass-nvcc-") as tmp:
            src = Path(tmp) / f"{unit_name}.cu"
            out = Path(tmp) / f"{unit_name}.cubin"
            src.write_text(source)
            cmd = [str(nvcc), *self.flags(arch), *self.include_flags(), "-o", str(out), str(src)]
            # nvcc's own temporaries (tmpxft_*, ~12 MB each) go into this folder too: removed with it, and with the
            # compile worker's folder when an interrupt kills nvcc before it can remove them.
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TMPDIR": tmp})
            if proc.returncode != 0 or not out.is_file():
                raise CompilationError(f"nvcc failed (exit {proc.returncode}) compiling {unit_name} for sm_{arch}",
                                       log=clip_log(proc.stderr + proc.stdout), source=source)
            return out.read_bytes()


class NvrtcBackend(Backend):
    """NVRTC from pip: needs no nvcc and no host compiler.

    ``-default-device`` makes unannotated functions device functions (CUTLASS has some); NVRTC rejects
    ``--expt-relaxed-constexpr`` and does not need it with that flag.
    """

    name = "nvrtc"

    def __init__(self, extra_flags: tuple[str, ...] = ()):
        self.extra_flags = tuple(extra_flags)

    def flags(self, arch: int) -> list[str]:
        # --split-compile=0 runs NVVM's optimizer on all cores: several operations in one unit compile in
        # parallel (4 GEMMs: 5.0 s -> 4.0 s on 2 cores) while one compiles as fast as before.
        flags = [f"--gpu-architecture=sm_{arch}", "-std=c++17", "-default-device", "--split-compile=0",
                 *COMMON_DEFINES]
        if str(arch).endswith("a"):
            # CUTLASS 3.x tile schedulers divide 128-bit integers; without a native __int128 NVRTC compiles that
            # division to a trap (brkpt) that kills the context.
            flags += ["--device-int128", "-DCUTLASS_UINT128_NATIVE"]
        return [*flags, *self.extra_flags]

    def version(self) -> str:
        return f"nvrtc {toolchain.nvrtc_version()}"

    def include_flags(self) -> list[str]:
        # Headers checked against NVRTC's version (ToolchainError on a mismatch).
        dirs = [*toolchain.cutlass_include_dirs(), *toolchain.nvrtc_include_dirs()]
        try:  # CUTLASS's tools/util/include: SM90 convolution's collective includes cutlass/util/packed_stride.hpp
            dirs.append(toolchain.cutlass_util_include_dir())
        except toolchain.ToolchainError:
            pass
        return [f"-I{d}" for d in dirs]

    def compile(self, source: str, arch: int, unit_name: str) -> bytes:
        try:
            from cuda.bindings import nvrtc
        except ImportError as exc:
            raise ToolchainError("the NVRTC backend needs cuda-bindings and nvidia-cuda-nvrtc") from exc
        ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
        options = [o.encode() for o in (*self.flags(arch), *self.include_flags())]
        err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{unit_name}.cu".encode(), 0, [], [])
        if err != ok:
            raise CompilationError(f"nvrtcCreateProgram failed: {err!r}")
        try:
            (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
            _, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
            # NVRTC writes into this buffer: never let it be CPython's shared 1-byte bytes object.
            log = b" " * max(log_size, 2)
            nvrtc.nvrtcGetProgramLog(prog, log)
            if compile_err != ok:
                raise CompilationError(f"NVRTC failed ({compile_err.name}) compiling {unit_name} for sm_{arch}",
                                       log=clip_log(log.decode(errors="replace").rstrip("\x00 ")), source=source)
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            if err != ok or size == 0:
                raise CompilationError(f"NVRTC produced no cubin for {unit_name} (sm_{arch}): {err!r}")
            cubin = b" " * max(size, 2)
            (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
            if err != ok:
                raise CompilationError(f"nvrtcGetCUBIN failed: {err!r}")
            return bytes(cubin[:size])
        finally:
            nvrtc.nvrtcDestroyProgram(prog)


def backend_by_name(name: str, extra_flags: tuple[str, ...] = ()) -> Backend:
    if name == "nvcc":
        return NvccBackend(extra_flags)
    if name == "nvrtc":
        return NvrtcBackend(extra_flags)
    raise ValueError(f"unknown compiler backend {name!r}; choose 'nvcc' or 'nvrtc'")
