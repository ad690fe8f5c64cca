"""Host cost of a bound pycutlass layer call alone and between torch's own ops (does launching next to torch's
kernels cost more than the same launch in a loop?). GPT-2's attention projection at 1x128: bf16, bias, residual.

    python benchmarks/launch_context.py [--rounds 15]

Prints host microseconds per call (median over interleaved rounds of queued calls) for: the pycutlass layer, its
PatchedLauncher alone, torch's F.linear + add, a LayerNorm, and each paired with the LayerNorm.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch
    import torch.nn.functional as F

    from pycutlass.torch.model_pass import CutlassLinear

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=50, help="calls per round")
    args = parser.parse_args()
    torch.manual_seed(0)
    device, dtype = "cuda", torch.bfloat16
    weight = torch.nn.Parameter(torch.randn(768, 768, device=device, dtype=dtype) * 0.02, requires_grad=False)
    bias = torch.nn.Parameter(torch.randn(768, device=device, dtype=dtype) * 0.02, requires_grad=False)
    layer = CutlassLinear(weight, bias, pattern="linear+residual")
    norm = torch.nn.LayerNorm(768, device=device, dtype=dtype)
    x = torch.randn(1, 128, 768, device=device, dtype=dtype)
    residual = torch.randn_like(x)
    with torch.no_grad():
        for _ in range(3):
            out = layer(x, residual)  # binds a kernel and a launch plan
        torch.cuda.synchronize()
        expected = F.linear(x.float(), weight.float(), bias.float()) + residual.float()
        error = ((out.float() - expected).norm() / expected.norm()).item()
        plan = next(iter(layer._plans.values()), None)
        if plan is None or plan.bound is None:
            raise SystemExit("the dispatch bound this call to torch: no kernel launch to time")
        launcher, stream = plan.bound.launcher, torch.cuda.current_stream().cuda_stream
        addresses = [0 if role < 0 else (x.data_ptr(), weight.data_ptr(), bias.data_ptr(), residual.data_ptr(),
                                         out.data_ptr())[role] for role in plan.bound.roles]
        cases = {
            "pycutlass layer": lambda: layer(x, residual),
            "PatchedLauncher.launch": lambda: launcher.launch(addresses, stream),
            "F.linear + add": lambda: F.linear(x, weight, bias) + residual,
            "F.linear": lambda: F.linear(x, weight, bias),
            "LayerNorm": lambda: norm(x),
            "LayerNorm, pycutlass layer": lambda: layer(norm(x), residual),
            "LayerNorm, PatchedLauncher.launch": lambda: (norm(x), launcher.launch(addresses, stream)),
            "LayerNorm, F.linear + add": lambda: F.linear(norm(x), weight, bias) + residual,
        }
        samples = {name: [] for name in cases}
        names = list(cases)
        for index in range(args.rounds):
            for name in names if index % 2 == 0 else reversed(names):
                fn = cases[name]
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                samples[name].append((time.perf_counter() - start) * 1e6 / args.calls)
        torch.cuda.synchronize()
    print(f"device {torch.cuda.get_device_name()}; layer rel err vs float32 {error:.2e}; kernel {plan.bound.loaded_op.name}")
    print("| call | host us per call (median of rounds) | min |")
    print("| --- | --- | --- |")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} |")


if __name__ == "__main__":
    main()
