"""Kernel packs from a model's tuning: the GEMM kernels ``optimize`` chose, written where a serving process loads
them (``use_pack``) and runs them without compiling."""
from __future__ import annotations

from pathlib import Path

from .calls import TORCH


def write_choices(path, choices, dispatch) -> Path | None:
    """Write the GEMM calls' chosen kernels (with their measured and torch times) to a pack at ``path``; None when
    no GEMM call chose a kernel."""
    from ..pack import PackChoice, write_pack
    from ..tune.db import operation_class

    groups: dict = {}
    classes: dict = {}  # the torch dispatch's call class -> the operation class of its kernels
    devices = set()
    kept_torch = []
    for choice in choices:
        if choice.call.op != "gemm" or choice.kernel == "-":
            continue
        m, n, k = choice.call.problem
        measured = {"us": choice.cutlass_us, "torch_us": choice.torch_us, "vs_torch": choice.speedup}
        if choice.kernel == TORCH:
            kept_torch.append((choice, measured))
            continue
        operation = dispatch.kernels().get(choice.kernel)
        params = dispatch._params.get(choice.kernel)
        if operation is None or not params:
            continue
        groups.setdefault(operation_class(operation), []).append(PackChoice((m, n, k, 1), operation, params, {},
                                                                           measured))
        classes[choice.call.cls] = operation_class(operation)
        devices.add(choice.call.device)
    if not groups:
        return None
    # where tuning kept torch, the pack says so for that shape (its class's other shapes keep their kernels)
    for choice, measured in kept_torch:
        op_class = classes.get(choice.call.cls)
        if op_class is not None:
            m, n, k = choice.call.problem
            groups[op_class].append(PackChoice((m, n, k, 1), None, None, {}, measured))
    import torch

    device = min(devices)
    major, minor = torch.cuda.get_device_capability(device)
    from ..tune.autotune import local_device_facts

    source = {"from": "pycutlass.torch.optimize", "device": local_device_facts(device)}
    return write_pack(path, groups, target=major * 10 + minor, source=source, session=dispatch.session)
