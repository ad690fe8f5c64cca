"""Where an optimized model's time goes, beside eager torch: host time to enqueue one forward, GPU busy time per
forward (torch.profiler's kernel times), the kernels and host calls that differ, stream synchronizations and
builder launches pycutlass made in the timed loop, and a cProfile of the optimized forward.

    python benchmarks/torch_diagnose.py --model gpt2 --shape 1x128 --shape 8x512 [--out diag.json]

Explains a gap that ``torch_models.py`` shows (is it host time, GPU time, or a synchronization?).
"""
from __future__ import annotations

import argparse
import cProfile
import copy
import io
import json
import pstats
import statistics
import time


def build(name: str):
    from models import GPT2Stack, MLPBlock

    if name == "gpt2":
        return GPT2Stack(12, 768, 12)
    if name == "mlp":
        return MLPBlock(1024)
    raise SystemExit(f"unknown model {name!r}")


def host_ms_per_forward(fn, forwards: int = 3, rounds: int = 20) -> float:
    """Host time to enqueue one forward: few forwards per round, so the launch queue never fills."""
    from common import host_submit_us

    return host_submit_us(fn, calls=forwards, batches=rounds) / 1e3


def wall_ms_per_forward(fn, forwards: int = 20) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(forwards):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / forwards


def profile(fn, forwards: int = 5) -> dict:
    """GPU busy time per forward, the top kernels and host calls (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    gpu_us = sum(e.self_device_time_total for e in kernels) / forwards
    top_kernels = sorted(kernels, key=lambda e: -e.self_device_time_total)[:12]
    host = [e for e in events if e.device_type.name == "CPU"]
    top_host = sorted(host, key=lambda e: -e.self_cpu_time_total)[:15]
    syncs = {e.key: e.count // forwards for e in host if "ynchronize" in e.key or "Memcpy" in e.key}
    return {"gpu_busy_ms": gpu_us / 1e3,
            "kernels": [{"name": e.key[:100], "per_forward": e.count / forwards,
                         "us_per_forward": e.self_device_time_total / forwards} for e in top_kernels],
            "host_calls": [{"name": e.key[:80], "per_forward": e.count / forwards,
                            "self_us_per_forward": e.self_cpu_time_total / forwards} for e in top_host],
            "syncs_and_copies_per_forward": syncs}


def graph_ms(fn, replays: int = 20) -> float | None:
    """GPU time of one forward replayed from a CUDA graph (no host work at all), or None if capture fails."""
    import torch

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / replays
    except Exception as error:  # noqa: BLE001
        print(f"    graph capture failed: {type(error).__name__}: {str(error)[:200]}")
        return None


def measure(fn) -> dict:
    from common import bench_ms

    for _ in range(5):
        fn()
    return {"host_ms": host_ms_per_forward(fn), "wall20_ms": wall_ms_per_forward(fn, 20),
            "wall100_ms": wall_ms_per_forward(fn, 100), "bench_ms": bench_ms(fn), "graph_ms": graph_ms(fn)}


def layer_host_us(module, x, repeats: int = 400) -> float:
    """Host microseconds per call of one layer (rounds of 20 calls, the GPU work queued, not awaited)."""
    import torch

    samples = []
    for _ in range(repeats // 20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            module(x)
        samples.append((time.perf_counter() - start) * 1e6 / 20)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    import threading

    import torch

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt2", choices=("gpt2", "mlp"))
    parser.add_argument("--shape", action="append", default=None, help="batch x sequence, e.g. 1x128")
    parser.add_argument("--profile", action="store_true", help="torch.profiler kernel/host tables and a cProfile")
    parser.add_argument("--keep-tuned", action="store_true",
                        help="optimize with end_to_end=False: the tuned placement, even where torch was faster")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in (args.shape or ["1x128", "8x512"])]

    from pycutlass.runtime import launch as launch_module
    from pycutlass.torch import optimize, report
    from pycutlass.torch.dispatch import Dispatch
    from pycutlass.torch.model_pass import CutlassLinear

    torch.manual_seed(0)
    model = build(args.model).to("cuda", torch.bfloat16).eval().requires_grad_(False)
    d_model = 768 if args.model == "gpt2" else 1024
    results = []
    for batch, seq in shapes:
        x = torch.randn(batch, seq, d_model, device="cuda", dtype=torch.bfloat16)
        row = {"model": args.model, "input": f"{batch}x{seq}x{d_model}"}
        with torch.no_grad():
            start = time.perf_counter()
            optimized = optimize(copy.deepcopy(model), (x,), tune=True, prefer_faster=True,
                                 end_to_end=not args.keep_tuned)
            row["optimize_s"] = time.perf_counter() - start
            rep = report(optimized)
            print(f"\n===== {args.model} {batch}x{seq} (optimize {row['optimize_s']:.1f} s)", flush=True)
            for r in rep.rows[:4]:
                print(f"  {r['layer']:20s} {r['shape']:30s} {r['kernel'][:70]:70s} {r.get('cutlass_us')} "
                      f"{r.get('torch_us')}")
            for note in rep.notes:
                if note.startswith("end-to-end"):
                    print("  " + note, flush=True)
            print("  threads:", [t.name for t in threading.enumerate()], flush=True)
            layers = [m for m in optimized.modules() if isinstance(m, CutlassLinear)]
            variants = {"eager": lambda: model(x), "pycutlass": lambda: optimized(x)}
            for name, fn in variants.items():
                row[name] = found = measure(fn)
                found["unbound"] = dict(Dispatch.current().unbound_calls)
                print(f"  {name:28s} " + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in found.items()), flush=True)
            # the model pass's own end-to-end timer on eager vs this result, as optimize() runs it
            from pycutlass.torch import model_pass

            for attempt in range(3):
                found = model_pass._time_interleaved(
                    {"eager": (lambda: None, lambda: model(x)), "optimized": (lambda: None, lambda: optimized(x))},
                    torch.cuda.synchronize)
                row.setdefault("check_timer", []).append(found)
                print(f"  end-to-end timer, attempt {attempt}: " +
                      ", ".join(f"{k} {v:.3f} ms" for k, v in found.items()), flush=True)
            # the same optimized model with every pycutlass launch skipped (wrong output; host cost and GPU share)
            original = launch_module.PatchedLauncher.launch
            launch_module.PatchedLauncher.launch = lambda self, addresses, stream: None
            try:
                row["pycutlass_no_launch"] = found = measure(lambda: optimized(x))
                print(f"  {'pycutlass, launches skipped':28s} " + "  ".join(
                    f"{k} {v:.3f}" for k, v in found.items() if isinstance(v, float)), flush=True)
            finally:
                launch_module.PatchedLauncher.launch = original
            # every layer back on torch's F.linear (the model pass's module structure only)
            saved = [set(m.eager_shapes) for m in layers]
            for m in layers:
                m.eager_shapes.add(torch.Size((batch, seq, m.in_features)))
            row["pycutlass_all_torch"] = found = measure(lambda: optimized(x))
            print(f"  {'pycutlass, all layers torch':28s} " + "  ".join(
                f"{k} {v:.3f}" for k, v in found.items() if isinstance(v, float)), flush=True)
            for m, shapes_before in zip(layers, saved):
                m.eager_shapes = shapes_before
            # one layer of each kind: host cost per call, torch's nn.Linear vs the swapped layer
            per_layer = []
            for m in layers[:4]:
                probe = torch.randn(batch, seq, m.in_features, device="cuda", dtype=torch.bfloat16)
                linear = torch.nn.Linear(m.in_features, m.out_features, device="cuda", dtype=torch.bfloat16)
                per_layer.append({"layer": m.layer, "torch_us": layer_host_us(linear, probe),
                                  "pycutlass_us": layer_host_us(m, probe),
                                  "on_torch": probe.shape in m.eager_shapes})
                print(f"  host per call {m.layer:20s} nn.Linear {per_layer[-1]['torch_us']:.1f} us, swapped layer "
                      f"{per_layer[-1]['pycutlass_us']:.1f} us (torch path: {per_layer[-1]['on_torch']})", flush=True)
            row["per_layer_host"] = per_layer
            if args.profile:
                for name, fn in variants.items():
                    found = profile(fn)
                    print(f"--- {name}: GPU busy {found['gpu_busy_ms']:.3f} ms")
                    for k in found["kernels"]:
                        print(f"    {k['us_per_forward']:9.1f} us  x{k['per_forward']:<5g} {k['name']}")
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(20):
                    optimized(x)
                torch.cuda.synchronize()
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
                print(text.getvalue()[:5000], flush=True)
        results.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
