"""``Pack.verify``: every kernel of a pack run once on the GPU and checked against float64.

Each kernel runs one of the problems it serves (M capped at 256: the kernel's code path does not depend on M beyond
its tile) on random inputs with the class's layouts, the output poisoned with NaN first. The reference is the
float64 product of the same (rounded) inputs, plus bias, through the activation's float64 reference.
"""
from __future__ import annotations

from ..errors import NoGpuError
from .classes import TORCH

# Largest |error| allowed, relative to the largest |reference| value: a few units in the last place of the output.
TOLERANCE = {"float16": 3e-3, "bfloat16": 1.6e-2, "float32": 1e-4, "float64": 1e-10}
_M_CAP = 256


def _torch_dtype(torch, label: str):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "float64": torch.float64}[label]


def verify_pack(pack, *, device: int = 0, progress=None) -> list[dict]:
    try:
        import torch
    except ImportError:
        raise NoGpuError("Pack.verify runs kernels on a GPU through torch tensors; install torch") from None
    if not torch.cuda.is_available():
        raise NoGpuError("Pack.verify runs every kernel on a GPU; none is usable here")
    from ..epilogue.activations import reference as activation_reference
    from .launch import _gemm_arguments

    pack.check_device(device)
    generator = torch.Generator(device=f"cuda:{device}").manual_seed(0)
    rows = []
    for cls in pack.classes.values():
        call = cls.call
        served: dict = {}
        for entry in cls.entries.values():
            if entry.kernel != TORCH:
                served.setdefault(entry.kernel, []).append(entry)
        for kernel, entries in sorted(served.items()):
            entry = min(entries, key=lambda e: (e.problem[0] * e.problem[1] * e.problem[2], e.problem))
            m, n, k, _ = entry.problem
            m = min(m, _M_CAP)
            dtype = _torch_dtype(torch, call.a)
            cuda = f"cuda:{device}"

            def random(rows_, cols, layout):
                shape = (rows_, cols) if layout == "row" else (cols, rows_)
                t = torch.randn(shape, generator=generator, device=cuda, dtype=torch.float32).to(dtype)
                return t if layout == "row" else t.t()

            a, b = random(m, k, call.a_layout), random(k, n, call.b_layout)
            bias = torch.randn((n,), generator=generator, device=cuda).to(dtype) if call.bias == "column" else None
            out = torch.full((m, n), float("nan"), device=cuda, dtype=_torch_dtype(torch, call.d))
            operation = pack.operation(kernel)
            arguments = _gemm_arguments(operation, entry.knobs, (m, n, k), a, b, None, out, bias, 1.0,
                                        0.0, torch.cuda.current_stream(device).cuda_stream, pack.session)
            operation.run(arguments)
            torch.cuda.synchronize(device)
            expected = a.double() @ b.double()
            if bias is not None:
                expected += bias.double()
            # (clamp saturates at the output type's range, which these random values stay far inside)
            name = "identity" if call.epilogue in ("linear_combination", "clamp") else call.epilogue
            expected = activation_reference(name, expected.cpu().numpy())
            got = out.double().cpu().numpy()
            import numpy as np

            scale = float(np.abs(expected).max()) or 1.0
            error = float(np.abs(got - expected).max()) / scale if np.isfinite(got).all() else float("inf")
            tolerance = TOLERANCE.get(call.d, 1e-2)
            rows.append({"class": cls.name, "kernel": kernel, "problem": f"{m}x{n}x{k}", "rel_error": error,
                         "tolerance": tolerance, "ok": error <= tolerance})
            if progress is not None:
                progress(rows[-1])
    return rows
