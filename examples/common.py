"""Helpers shared by the examples: which compute capability to build for, the no-GPU stop, the result check.

Not part of pycutlass; each example imports it as ``common`` (the examples directory is on sys.path when an
example runs as ``python examples/NAME.py``).
"""
from __future__ import annotations

import sys

import numpy as np

import pycutlass as cutlass
from pycutlass.compiler.target import detected_compute_capability

SUPPORTED = (80, 86, 89, 90)  # compute capabilities of CUTLASS 2.x (Sm80-family) operations


def gpu_available() -> bool:
    return detected_compute_capability() is not None


def compute_capability() -> int:
    """The GPU's compute capability (the seed's ``{compute_capability}``), or 90 (Hopper) without a GPU."""
    cc = detected_compute_capability()
    return cc if cc in SUPPORTED else 90


def stop_without_gpu(kernels) -> None:
    """Without a usable GPU: print what ``add_module`` produced and exit 0. Compiling needs no GPU; running does.

    ``kernels``: what ``pycutlass.compiler.add_module`` returned (a CompileReport: iterating it gives the kernels).
    """
    if gpu_available():
        return
    binaries = {k.sha256: len(k.binary) for k in kernels}  # operations of one unit share one cubin
    targets = sorted({k.target for k in kernels})
    names = [k.kernel_symbol for k in kernels]
    what = " + ".join(names) if len(names) <= 2 else f"{len(names)} operations"
    report = cutlass.compiler.last_report()
    how = "from the cache" if report.compiled == 0 else f"{report.seconds:.1f} s"
    arch = "/".join(targets)
    cubins = f"{len(binaries)} {arch} cubins" if len(binaries) > 1 else f"{arch} cubin"
    print(f"compiled {what} ({cubins}, {sum(binaries.values()) // 1024} KB, {kernels[0].backend}, {how}); "
          f"no GPU here, stopping before launch")
    sys.exit(0)


def nan_array(shape, dtype=np.float16) -> np.ndarray:
    """An output poisoned with NaN, so a kernel that writes nothing cannot pass the check."""
    return np.full(shape, np.nan, dtype=dtype)


TOLERANCE = 5e-3  # float16 outputs: rounding alone gives about 2e-4


def relative_error(got, reference: np.ndarray) -> float:
    """Frobenius-norm error of ``got`` (numpy or torch, any device) relative to a float64 reference."""
    if hasattr(got, "detach"):  # a torch tensor
        got = got.detach().cpu().double().numpy()
    got = np.asarray(got, dtype=np.float64)
    error = np.linalg.norm(got - reference) / max(np.linalg.norm(reference), 1e-30)
    return float(error) if np.isfinite(error) else float("inf")  # NaN left in the output fails


def check(label: str, got, reference: np.ndarray, tolerance: float = TOLERANCE) -> bool:
    """Print the relative error of ``got`` against a float64 reference, then PASS or FAIL."""
    error = relative_error(got, reference)
    ok = error < tolerance
    print(f"{label}: relative error {error:.2e} (tolerance {tolerance:.0e}) {'PASS' if ok else 'FAIL'}")
    return ok


def finish(results) -> None:
    """Exit 0 when every check passed, 1 otherwise."""
    results = list(results)
    sys.exit(0 if results and all(results) else 1)
